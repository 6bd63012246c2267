"""The four PATCH flavours the API server speaks, applied to plain dicts.

* JSON merge patch (RFC 7386): ``application/merge-patch+json``.
* JSON patch (RFC 6902): ``application/json-patch+json``.
* Strategic merge patch: ``application/strategic-merge-patch+json``. Lists of the well-known
  associative fields are merged by their key (containers and env by ``name``, volumeMounts by
  ``mountPath``, ports by ``containerPort`` or ``port`` ...), ``$patch`` / ``$setElementOrder`` /
  ``$deleteFromPrimitiveList`` / ``$retainKeys`` directives are honoured or stripped, other lists replace.
* Server-side apply (``application/apply-patch+yaml``) lives in :mod:`.apply`.

Functions never mutate their inputs; they return new structures.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from .errors import ApiError, bad_request

# Lists with a patch merge key in the real API's strategic merge patch; any other list (e.g. a PodSpec's
# tolerations, which has no merge key) is replaced whole.
MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "imagePullSecrets": "name",
    "hostAliases": "ip",
    "conditions": "type",
    "ownerReferences": "uid",
    "topologySpreadConstraints": "topologyKey",
    "resourceClaims": "name",
}
SET_LISTS = frozenset({"finalizers"})


def merge_key_for(field: str, items: list[Any]) -> str | None:
    """The merge key of an associative list, or None when the list is atomic."""
    if field == "ports":
        dicts = [i for i in items if isinstance(i, dict)]
        if dicts and all("containerPort" in i for i in dicts):
            return "containerPort"
        return "port"
    return MERGE_KEYS.get(field)


# --- JSON merge patch -------------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# --- JSON patch -------------------------------------------------------------------------------------------


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise bad_request(f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc: Any, parts: list[str], path: str) -> Any:
    cur = doc
    for p in parts:
        if isinstance(cur, dict) and p in cur:
            cur = cur[p]
        elif isinstance(cur, list) and p.isdigit() and int(p) < len(cur):
            cur = cur[int(p)]
        else:
            raise ApiError(422, "Invalid", f"the server rejected our request due to an error in our request: "
                           f"jsonpatch: path {path!r} does not exist")
    return cur


def _add(doc: Any, path: str, value: Any, replace: bool) -> Any:
    parts = _pointer(path)
    if not parts:
        return value
    parent = _walk(doc, parts[:-1], path)
    last = parts[-1]
    if isinstance(parent, dict):
        if replace and last not in parent:
            _walk(doc, parts, path)
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-":
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent) - (1 if replace else 0):
            if replace:
                parent[int(last)] = value
            else:
                parent.insert(int(last), value)
        else:
            raise bad_request(f"jsonpatch: index out of range in {path!r}")
    else:
        raise bad_request(f"jsonpatch: cannot add to a scalar at {path!r}")
    return doc


def _remove(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    parent = _walk(doc, parts[:-1], path)
    _walk(doc, parts, path)
    if isinstance(parent, dict):
        del parent[parts[-1]]
    else:
        del parent[int(parts[-1])]
    return parent


def json_patch(target: Any, ops: Any) -> Any:
    if not isinstance(ops, list):
        raise bad_request("json patch body must be a list of operations")
    doc = copy.deepcopy(target)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise bad_request(f"invalid json patch operation {op!r}")
        kind, path = op["op"], op["path"]
        if kind == "add":
            doc = _add(doc, path, copy.deepcopy(op.get("value")), replace=False)
        elif kind == "replace":
            doc = _add(doc, path, copy.deepcopy(op.get("value")), replace=True)
        elif kind == "remove":
            _remove(doc, path)
        elif kind in ("move", "copy"):
            value = copy.deepcopy(_walk(doc, _pointer(op["from"]), op["from"]))
            if kind == "move":
                _remove(doc, op["from"])
            doc = _add(doc, path, value, replace=False)
        elif kind == "test":
            if _walk(doc, _pointer(path), path) != op.get("value"):
                raise ApiError(422, "Invalid", f"the server rejected our request: testing value {path} failed")
        else:
            raise bad_request(f"unknown json patch operation {kind!r}")
    return doc


# --- strategic merge patch --------------------------------------------------------------------------------


def strategic_merge(original: Any, patch: Any, field: str = "") -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return _strip(patch)
    if patch.get("$patch") == "delete":
        return None
    result = dict(original) if isinstance(original, dict) else {}
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            result[name] = [v for v in result.get(name) or [] if v not in (value or [])]
            continue
        if key.startswith("$"):
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            merged = strategic_merge(result.get(key), value, key)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list):
            result[key] = _merge_list(result.get(key), value, key)
        else:
            result[key] = value
    return result


def _merge_list(original: Any, patch: list[Any], field: str) -> list[Any]:
    if any(isinstance(i, dict) and i.get("$patch") == "replace" for i in patch):
        return [_strip(i) for i in patch if not (isinstance(i, dict) and i.get("$patch") == "replace")]
    if not isinstance(original, list):
        return [_strip(i) for i in patch if not (isinstance(i, dict) and i.get("$patch") == "delete")]
    if field in SET_LISTS:
        return list(original) + [v for v in patch if v not in original]
    mkey = merge_key_for(field, original + patch)
    if mkey is None or not all(isinstance(i, dict) for i in original + patch):
        return [_strip(i) for i in patch]
    result = [dict(i) for i in original]
    for item in patch:
        idx = next((n for n, cur in enumerate(result) if cur.get(mkey) == item.get(mkey)), None)
        if item.get("$patch") == "delete":
            if idx is not None:
                del result[idx]
        elif idx is None:
            result.append(_strip(item))
        else:
            result[idx] = strategic_merge(result[idx], item, field)
    return result


def _strip(value: Any) -> Any:
    """Drop patch directives from a value that is inserted as is."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if not k.startswith("$")}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


PATCH_TYPES = {
    "application/merge-patch+json": "merge",
    "application/json-patch+json": "json",
    "application/strategic-merge-patch+json": "strategic",
    "application/apply-patch+yaml": "apply",
    "application/apply-patch+json": "apply",
}


def apply_patch(kind: str, target: dict[str, Any], body: Any) -> dict[str, Any]:
    """Apply a merge/json/strategic patch; server-side apply is handled by :mod:`.apply`."""
    if kind == "merge":
        result = merge_patch(target, body)
    elif kind == "json":
        result = json_patch(target, body)
    elif kind == "strategic":
        result = strategic_merge(target, body)
    else:
        raise bad_request(f"unsupported patch type {kind}")
    if not isinstance(result, dict):
        raise bad_request(f"patch produced a non-object: {json.dumps(result)[:200]}")
    return result
