"""Server-side apply and ``metadata.managedFields`` bookkeeping.

What is modelled (enough for ``kubectl apply --server-side`` and ``DynamicClient.server_side_apply``):

* apply creates the object when it does not exist (the caller answers 201);
* the applied configuration is merged into the live object; associative lists (containers, env,
  ports ...) merge by key, other lists are replaced atomically;
* each field manager's set of owned fields is recorded in ``managedFields`` as ``FieldsV1``
  (``f:``/``k:`` keys), with ``operation: Apply`` or ``Update``;
* a field the same manager applied before and omits now is removed, unless another manager owns it;
* changing a value another *Apply* manager owns is a 409 ``Conflict`` unless ``force=true``, which
  moves the ownership. Conflicts against ``Update`` managers are not raised (a simplification: the
  real server does, which mostly bites people who mix ``kubectl edit`` and apply).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from .errors import ApiError
from .patch import merge_key_for

Path = tuple[str, ...]
_SYSTEM_META = {"name", "namespace", "resourceVersion", "uid", "creationTimestamp", "generation", "managedFields",
                "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"}


def now_iso(now: float) -> str:
    """``now`` (epoch seconds, the cluster's clock) as a Kubernetes timestamp."""
    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def field_paths(obj: Any, skip_status: bool = False) -> set[Path]:
    """Leaf paths of ``obj`` in FieldsV1 notation (``f:spec``, ``k:{"name":"c"}``)."""
    out: set[Path] = set()

    def walk(value: Any, prefix: Path, field: str) -> None:
        if isinstance(value, dict) and value:
            for k, v in value.items():
                if not prefix and k in ("apiVersion", "kind"):
                    continue
                if not prefix and skip_status and k == "status":
                    continue
                if prefix == ("f:metadata",) and k in _SYSTEM_META:
                    continue
                walk(v, (*prefix, f"f:{k}"), k)
        elif isinstance(value, list) and value and all(isinstance(i, dict) for i in value) \
                and (mkey := merge_key_for(field, value)) is not None:
            for item in value:
                item_key = f"k:{json.dumps({mkey: item.get(mkey)}, separators=(',', ':'))}"
                walk({k: v for k, v in item.items()}, (*prefix, item_key), field)
        elif prefix:
            out.add(prefix)

    walk(obj, (), "")
    return out


def to_fields_v1(paths: set[Path]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for path in sorted(paths):
        node = tree
        for part in path:
            node = node.setdefault(part, {})
    return tree


def from_fields_v1(tree: dict[str, Any], prefix: Path = ()) -> set[Path]:
    out: set[Path] = set()
    for key, sub in tree.items():
        if key == ".":
            continue
        if isinstance(sub, dict) and any(k != "." for k in sub):
            out |= from_fields_v1(sub, (*prefix, key))
        else:
            out.add((*prefix, key))
    return out


def _get(obj: Any, path: Path) -> tuple[bool, Any]:
    cur = obj
    for part in path:
        if part.startswith("f:") and isinstance(cur, dict) and part[2:] in cur:
            cur = cur[part[2:]]
        elif part.startswith("k:") and isinstance(cur, list):
            (mkey, mval), = json.loads(part[2:]).items()
            match = [i for i in cur if isinstance(i, dict) and i.get(mkey) == mval]
            if not match:
                return False, None
            cur = match[0]
        else:
            return False, None
    return True, cur


def _delete(obj: Any, path: Path) -> None:
    found, parent = _get(obj, path[:-1])
    if not found:
        return
    last = path[-1]
    if last.startswith("f:") and isinstance(parent, dict):
        parent.pop(last[2:], None)
    elif last.startswith("k:") and isinstance(parent, list):
        (mkey, mval), = json.loads(last[2:]).items()
        parent[:] = [i for i in parent if not (isinstance(i, dict) and i.get(mkey) == mval)]


def _merge(live: Any, applied: Any, field: str = "") -> Any:
    if isinstance(applied, dict) and isinstance(live, dict):
        out = dict(live)
        for k, v in applied.items():
            out[k] = _merge(live.get(k), v, k)
        return out
    if isinstance(applied, list) and isinstance(live, list) \
            and all(isinstance(i, dict) for i in live + applied) \
            and (mkey := merge_key_for(field, live + applied)) is not None:
        out_list = [dict(i) for i in live]
        for item in applied:
            idx = next((n for n, cur in enumerate(out_list) if cur.get(mkey) == item.get(mkey)), None)
            if idx is None:
                out_list.append(item)
            else:
                out_list[idx] = _merge(out_list[idx], item, field)
        return out_list
    return applied


def managers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return list(obj.get("metadata", {}).get("managedFields") or [])


def record_update(obj: dict[str, Any], manager: str, changed: Any, skip_status: bool, now: str) -> None:
    """Record that ``manager`` wrote the fields in ``changed`` with a non-apply operation at ``now``."""
    paths = field_paths(changed, skip_status)
    _set_entry(obj, manager, "Update", paths, obj.get("apiVersion", ""), merge=True, now=now)


def _set_entry(obj: dict[str, Any], manager: str, operation: str, paths: set[Path], api_version: str,
               merge: bool, now: str) -> None:
    entries = managers(obj)
    existing = next((e for e in entries if e.get("manager") == manager and e.get("operation") == operation
                     and not e.get("subresource")), None)
    if existing is not None and merge:
        paths = paths | from_fields_v1(existing.get("fieldsV1") or {})
    entries = [e for e in entries if e is not existing]
    # Other managers lose the fields this one now owns.
    for e in entries:
        theirs = from_fields_v1(e.get("fieldsV1") or {}) - paths
        e["fieldsV1"] = to_fields_v1(theirs)
    entries = [e for e in entries if e.get("fieldsV1")]
    if paths:
        entries.append({
            "manager": manager,
            "operation": operation,
            "apiVersion": api_version,
            "time": now,
            "fieldsType": "FieldsV1",
            "fieldsV1": to_fields_v1(paths),
        })
    obj.setdefault("metadata", {})["managedFields"] = entries


def server_side_apply(live: dict[str, Any] | None, applied: dict[str, Any], manager: str, force: bool,
                      skip_status: bool, describe: str, now: str) -> dict[str, Any]:
    """The object after ``manager`` applies ``applied`` to ``live`` (None: create) at ``now``."""
    new_paths = field_paths(applied, skip_status)
    if skip_status:
        applied = {k: v for k, v in applied.items() if k != "status"}
    if live is None:
        obj: dict[str, Any] = json.loads(json.dumps(applied))
        _set_entry(obj, manager, "Apply", new_paths, applied.get("apiVersion", ""), merge=False, now=now)
        return obj
    conflicts = []
    for entry in managers(live):
        if entry.get("manager") == manager or entry.get("operation") != "Apply":
            continue
        for path in from_fields_v1(entry.get("fieldsV1") or {}) & new_paths:
            _, mine = _get(applied, path)
            _, theirs = _get(live, path)
            if mine != theirs:
                conflicts.append((entry["manager"], path))
    if conflicts and not force:
        causes = [{"reason": "FieldManagerConflict",
                   "message": f'conflict with "{m}"', "field": ".".join(p[2:] for p in path)}
                  for m, path in conflicts]
        fields = ", ".join(f'{c["field"]} (owned by "{m}")' for c, (m, _) in zip(causes, conflicts, strict=True))
        raise ApiError(409, "Conflict", f"Apply failed with {len(conflicts)} conflict(s): {fields}",
                       {"name": describe, "causes": causes})
    previous: set[Path] = set()
    others: set[Path] = set()
    for entry in managers(live):
        owned = from_fields_v1(entry.get("fieldsV1") or {})
        if entry.get("manager") == manager and entry.get("operation") == "Apply":
            previous = owned
        else:
            others |= owned
    obj = json.loads(json.dumps(_merge(live, applied)))
    assert isinstance(obj, dict)
    for path in sorted(previous - new_paths - others, key=len, reverse=True):
        _delete(obj, path)
    _set_entry(obj, manager, "Apply", new_paths, applied.get("apiVersion", ""), merge=False, now=now)
    return obj
