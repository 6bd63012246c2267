"""Label selectors, field selectors and the small JSONPath subset printer columns and ``/scale`` use.

Label selectors follow ``k8s.io/apimachinery/pkg/labels``: comma-separated requirements, each one of
``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``, ``k notin (a,b)``, ``k`` (exists) and ``!k`` (does not exist).
A malformed selector is a 400, never "match everything" (the bug the PyPI mocks have).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .errors import bad_request

Requirement = tuple[str, str, frozenset[str]]

_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_SET_RE = re.compile(rf"^\s*({_KEY})\s+(in|notin)\s+\(([^)]*)\)\s*$")
_EQ_RE = re.compile(rf"^\s*({_KEY})\s*(==|=|!=)\s*([-A-Za-z0-9_.]*)\s*$")
_EXISTS_RE = re.compile(rf"^\s*(!?)\s*({_KEY})\s*$")


def _split_terms(selector: str) -> list[str]:
    terms: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    terms.append("".join(cur))
    return [t for t in terms if t.strip()]


def parse_label_selector(selector: str | None) -> list[Requirement]:
    reqs: list[Requirement] = []
    for term in _split_terms(selector or ""):
        if m := _SET_RE.match(term):
            values = frozenset(v.strip() for v in m[3].split(",") if v.strip())
            reqs.append((m[1], m[2], values))
        elif m := _EQ_RE.match(term):
            reqs.append((m[1], "!=" if m[2] == "!=" else "=", frozenset([m[3]])))
        elif m := _EXISTS_RE.match(term):
            reqs.append((m[2], "!" if m[1] else "exists", frozenset()))
        else:
            raise bad_request(f"unable to parse requirement: found '{term.strip()}', expected a label selector")
    return reqs


def labels_match(reqs: list[Requirement], labels: dict[str, str] | None) -> bool:
    labels = labels or {}
    for key, op, values in reqs:
        present = key in labels
        if op == "=" and (not present or labels[key] not in values):
            return False
        if op == "!=" and present and labels[key] in values:
            return False
        if op == "in" and (not present or labels[key] not in values):
            return False
        if op == "notin" and present and labels[key] in values:
            return False
        if op == "exists" and not present:
            return False
        if op == "!" and present:
            return False
    return True


def label_selector_from_match(selector: dict[str, Any] | None) -> str:
    """Render a ``LabelSelector`` object (``matchLabels``/``matchExpressions``) as a selector string."""
    if not selector:
        return ""
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        op, key, values = expr.get("operator"), expr.get("key"), expr.get("values") or []
        if op in ("In", "NotIn"):
            parts.append(f"{key} {op.lower()} ({','.join(values)})")
        elif op == "Exists":
            parts.append(key)
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
    return ",".join(parts)


FieldRequirement = tuple[str, bool, str]  # (path, equal?, value)


def parse_field_selector(selector: str | None) -> list[FieldRequirement]:
    reqs: list[FieldRequirement] = []
    for term in _split_terms(selector or ""):
        m = re.match(r"^\s*([A-Za-z0-9_.]+)\s*(==|=|!=)\s*(.*?)\s*$", term)
        if not m:
            raise bad_request(f"invalid field selector: '{term.strip()}'")
        reqs.append((m[1], m[2] != "!=", m[3]))
    return reqs


def field_value(obj: dict[str, Any], path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return "" if cur is None else str(cur)


def fields_match(reqs: list[FieldRequirement], obj: dict[str, Any]) -> bool:
    return all((field_value(obj, path) == value) == equal for path, equal, value in reqs)


def object_matcher(label_selector: str | None, field_selector: str | None) -> Callable[[dict[str, Any]], bool]:
    """Compile both selectors once; the returned predicate runs per object (and per watch event)."""
    lreqs = parse_label_selector(label_selector)
    freqs = parse_field_selector(field_selector)

    def match(obj: dict[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        return labels_match(lreqs, meta.get("labels")) and fields_match(freqs, obj)

    return match


# --- JSONPath subset -------------------------------------------------------------------------------------

_TOKEN_RE = re.compile(r"\.([A-Za-z0-9_\-/]+)|\[(-?\d+|\*|-?\d*:-?\d*)\]"
                       r"|\[\?\(@\.([A-Za-z0-9_.]+)\s*==\s*['\"]([^'\"]*)['\"]\)\]"
                       r"|\[['\"]([^'\"]+)['\"]\]")


def jsonpath_tokens(path: str) -> list[tuple[str, Any]]:
    p = path.strip()
    if p.startswith("{") and p.endswith("}"):
        p = p[1:-1]
    p = p.removeprefix("$")
    if p and not p.startswith((".", "[")):
        p = "." + p
    tokens: list[tuple[str, Any]] = []
    pos = 0
    while pos < len(p):
        m = _TOKEN_RE.match(p, pos)
        if not m:
            raise ValueError(f"unsupported JSONPath {path!r}")
        if m[1] is not None:
            tokens.append(("key", m[1]))
        elif m[2] is not None:
            tokens.append(("index", m[2]))
        elif m[3] is not None:
            tokens.append(("filter", (m[3], m[4])))
        else:
            tokens.append(("key", m[5]))
        pos = m.end()
    return tokens


def jsonpath_get(obj: Any, path: str) -> list[Any]:
    """All values ``path`` selects (``.a.b``, ``.a[0]``, ``.a[*].b``, ``.a[?(@.type=="Ready")].status``)."""
    current = [obj]
    for kind, arg in jsonpath_tokens(path):
        nxt: list[Any] = []
        for value in current:
            if kind == "key" and isinstance(value, dict) and arg in value:
                nxt.append(value[arg])
            elif kind == "index" and isinstance(value, list):
                if arg == "*":
                    nxt.extend(value)
                elif ":" in arg:  # a slice, e.g. [-1:] (the last element), as kubectl's JSONPath allows
                    start, _, stop = arg.partition(":")
                    nxt.extend(value[int(start) if start else None:int(stop) if stop else None])
                elif -len(value) <= int(arg) < len(value):
                    nxt.append(value[int(arg)])
            elif kind == "filter" and isinstance(value, list):
                fpath, fval = arg
                nxt.extend(v for v in value if field_value(v, fpath) == fval if isinstance(v, dict))
        current = nxt
    return current


def jsonpath_set(obj: dict[str, Any], path: str, value: Any) -> None:
    """Set a plain dotted path (``.spec.replicas``), creating intermediate objects."""
    keys = [arg for kind, arg in jsonpath_tokens(path) if kind == "key"]
    cur = obj
    for key in keys[:-1]:
        nxt = cur.get(key)
        if not isinstance(nxt, dict):
            nxt = cur[key] = {}
        cur = nxt
    cur[keys[-1]] = value
