"""Deletion: preconditions, finalizers, ``deletionTimestamp``, garbage collection and namespace cascade.

Real clusters split this between the API server and controllers (garbage collector, namespace
controller) that act a moment later. The emulator does the same work synchronously inside the delete
call, so a client sees a consistent state as soon as its request returns, and watchers still get every
intermediate event (MODIFIED with ``deletionTimestamp``, then DELETED) in order.

* An object with finalizers is only marked: ``deletionTimestamp`` is set and it goes when the last
  finalizer is removed by an update (see :meth:`.Cluster._update`).
* ``propagationPolicy``: ``Background`` (default) deletes the owner, then every dependent whose owners
  are all gone; ``Foreground`` marks the owner with the ``foregroundDeletion`` finalizer, deletes the
  dependents and removes the owner when none are left; ``Orphan`` strips the owner reference from the
  dependents instead.
* Deleting a namespace marks it ``Terminating``, deletes its content and removes it once empty.
* Deleting a CRD deletes every object of its kinds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import ApiError, conflict, not_found
from .resources import CRD_KEY, NAMESPACE_KEY, POD_KEY, ResourceType
from .store import Key, Loc, Obj

if TYPE_CHECKING:
    from .cluster import Cluster

PROTECTED_NAMESPACES = ("default", "kube-system", "kube-public")
FOREGROUND = "foregroundDeletion"


def _type_for_key(cluster: Cluster, key: Key) -> ResourceType | None:
    return next((rt for rt in cluster.resource_types() if rt.key == key), None)


def delete(cluster: Cluster, rt: ResourceType, namespace: str | None, name: str, *,
           propagation: str | None = None, preconditions: dict[str, Any] | None = None,
           dry_run: bool = False) -> tuple[Obj, bool]:
    """Delete one object; returns it and whether it is gone (False: waiting for finalizers)."""
    with cluster.store.lock:
        loc: Loc = ((namespace or "default") if rt.namespaced else "", name)
        obj = cluster.store.get(rt.key, loc)
        if obj is None:
            raise not_found(rt.plural, rt.group, name)
        meta = obj["metadata"]
        pre = preconditions or {}
        if pre.get("uid") and pre["uid"] != meta.get("uid"):
            raise conflict(rt.plural, rt.group, name, f"Precondition failed: UID in precondition: {pre['uid']}, "
                           f"UID in object meta: {meta.get('uid')}")
        if pre.get("resourceVersion") and pre["resourceVersion"] != meta.get("resourceVersion"):
            raise conflict(rt.plural, rt.group, name, "Precondition failed: ResourceVersion in precondition: "
                           f"{pre['resourceVersion']}, ResourceVersion in object meta: {meta.get('resourceVersion')}")
        if rt.key == NAMESPACE_KEY and name in PROTECTED_NAMESPACES:
            raise ApiError(403, "Forbidden", f'namespaces "{name}" is forbidden: this namespace may not be deleted')
        if dry_run:
            return cluster.out(rt, obj), True
        if rt.key == NAMESPACE_KEY:
            return _delete_namespace(cluster, rt, loc, obj)
        policy = propagation or "Background"
        if policy == "Orphan":
            _orphan_dependents(cluster, meta.get("uid", ""))
        finalizers = list(meta.get("finalizers") or [])
        if policy == "Foreground" and cluster.store.dependents_of(meta.get("uid", "")) \
                and FOREGROUND not in finalizers:
            finalizers.append(FOREGROUND)
        if finalizers:
            marked = _mark(cluster, rt, loc, obj, finalizers)
            if FOREGROUND in finalizers:
                for dep_key, dep_loc in cluster.store.dependents_of(meta.get("uid", "")):
                    _delete_dependent(cluster, dep_key, dep_loc, "Foreground")
                _check_foreground(cluster, meta.get("uid", ""))
            current = cluster.store.get(rt.key, loc)
            return cluster.out(rt, current or marked), current is None
        final = finalize(cluster, rt, loc)
        return cluster.out(rt, final or obj), True


def delete_collection(cluster: Cluster, rt: ResourceType, namespace: str | None, label_selector: str | None,
                      field_selector: str | None, propagation: str | None, dry_run: bool) -> list[Obj]:
    listed = cluster.list(rt, namespace, label_selector=label_selector, field_selector=field_selector)
    deleted = []
    for obj in listed.items:
        meta = obj["metadata"]
        try:
            out, _ = delete(cluster, rt, meta.get("namespace"), meta["name"], propagation=propagation,
                            dry_run=dry_run)
        except ApiError as exc:
            if exc.code != 404:
                raise
            continue
        deleted.append(out)
    return deleted


def _mark(cluster: Cluster, rt: ResourceType, loc: Loc, obj: Obj, finalizers: list[str]) -> Obj:
    meta = obj["metadata"]
    if meta.get("deletionTimestamp") and list(meta.get("finalizers") or []) == finalizers:
        return obj
    new_meta = {**meta, "finalizers": finalizers, "deletionGracePeriodSeconds": 0}
    new_meta.setdefault("deletionTimestamp", cluster.now_iso())
    return cluster.store.put(rt.key, loc, {**obj, "metadata": new_meta}, "MODIFIED")


def finalize(cluster: Cluster, rt: ResourceType, loc: Loc) -> Obj | None:
    """Remove the object now and run everything that follows a removal."""
    with cluster.store.lock:
        final = cluster.store.remove(rt.key, loc)
        if final is None:
            return None
        _after_removed(cluster, rt.key, loc, final)
        return final


def _after_removed(cluster: Cluster, key: Key, loc: Loc, final: Obj) -> None:
    meta = final["metadata"]
    uid = meta.get("uid", "")
    if key == CRD_KEY:
        cluster.unregister_crd(final)
    if key == POD_KEY:
        cluster.logs.pod_deleted(loc[0], loc[1])
    for dep_key, dep_loc in cluster.store.dependents_of(uid):
        dep = cluster.store.get(dep_key, dep_loc)
        if dep is None:
            continue
        alive = [r for r in dep["metadata"].get("ownerReferences") or []
                 if cluster.store.locate_uid(r.get("uid", "")) is not None]
        if not alive:
            _delete_dependent(cluster, dep_key, dep_loc, "Background")
    for ref in meta.get("ownerReferences") or []:
        _check_foreground(cluster, ref.get("uid", ""))
    if loc[0]:
        try_finish_namespace(cluster, loc[0])


def _delete_dependent(cluster: Cluster, key: Key, loc: Loc, policy: str) -> None:
    rt = _type_for_key(cluster, key)
    if rt is None or cluster.store.get(key, loc) is None:
        return
    try:
        delete(cluster, rt, loc[0] or None, loc[1], propagation=policy)
    except ApiError as exc:
        if exc.code != 404:
            raise


def _orphan_dependents(cluster: Cluster, uid: str) -> None:
    for key, loc in cluster.store.dependents_of(uid):
        dep = cluster.store.get(key, loc)
        if dep is None:
            continue
        refs = [r for r in dep["metadata"].get("ownerReferences") or [] if r.get("uid") != uid]
        new_meta = {k: v for k, v in dep["metadata"].items() if k != "ownerReferences"}
        if refs:
            new_meta["ownerReferences"] = refs
        cluster.store.put(key, loc, {**dep, "metadata": new_meta}, "MODIFIED")


def _check_foreground(cluster: Cluster, uid: str) -> None:
    """Remove the foreground finalizer from a marked owner once it has no dependents left."""
    found = cluster.store.locate_uid(uid)
    if found is None:
        return
    key, loc = found
    owner = cluster.store.get(key, loc)
    if owner is None or FOREGROUND not in (owner["metadata"].get("finalizers") or []):
        return
    if cluster.store.dependents_of(uid):
        return
    rest = [f for f in owner["metadata"]["finalizers"] if f != FOREGROUND]
    rt = _type_for_key(cluster, key)
    if rt is None:
        return
    if rest:
        cluster.store.put(key, loc, {**owner, "metadata": {**owner["metadata"], "finalizers": rest}}, "MODIFIED")
    else:
        finalize(cluster, rt, loc)


def _delete_namespace(cluster: Cluster, rt: ResourceType, loc: Loc, obj: Obj) -> tuple[Obj, bool]:
    name = loc[1]
    if not obj["metadata"].get("deletionTimestamp"):
        meta = {**obj["metadata"], "deletionTimestamp": cluster.now_iso(), "deletionGracePeriodSeconds": 0}
        obj = cluster.store.put(rt.key, loc, {**obj, "metadata": meta, "status": {"phase": "Terminating"}},
                                "MODIFIED")
    for key in list(cluster.store.objects):
        for item_loc in [item_loc for item_loc in list(cluster.store.objects[key]) if item_loc[0] == name]:
            _delete_dependent(cluster, key, item_loc, "Background")
    try_finish_namespace(cluster, name)
    current = cluster.store.get(rt.key, loc)
    return cluster.out(rt, current or obj), current is None


def try_finish_namespace(cluster: Cluster, namespace: str) -> None:
    """Remove a Terminating namespace once it is empty and has no finalizers left."""
    ns = cluster.store.get(NAMESPACE_KEY, ("", namespace))
    if ns is None or not ns["metadata"].get("deletionTimestamp"):
        return
    for objs in cluster.store.objects.values():
        if any(loc[0] == namespace for loc in objs):
            return
    if ns["metadata"].get("finalizers"):
        return
    rt = _type_for_key(cluster, NAMESPACE_KEY)
    if rt is not None:
        finalize(cluster, rt, ("", namespace))
