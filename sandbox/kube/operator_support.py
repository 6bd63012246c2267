"""What the sandbox's training operators (:mod:`.hpto`, :mod:`.kubeflow`, :mod:`.kuberay`) share: events on
their jobs, node-fault detection as HyperPod shows faults on nodes, pods kept off faulty nodes, env
injection and status writes through the status subresource."""

from __future__ import annotations

import contextlib
import hashlib
import json
from datetime import UTC, datetime
from typing import Any

from .cluster import Cluster, WriteOptions, clone
from .errors import ApiError
from .resources import POD_KEY
from .scheduling import is_ready
from .store import Key, Obj
from .workloads import _controlled, _delete

NODE_KEY: Key = ("", "nodes")
HEALTH_LABEL = "sagemaker.amazonaws.com/node-health-status"
UNHEALTHY = frozenset({"Unschedulable", "UnschedulablePendingReplacement", "UnschedulablePendingReboot"})
ATTEMPT = "sandbox.instantstart.io/attempt"  # which (re)start of its job a pod belongs to
TRUE = "True"


def parse_time(stamp: str) -> float:
    """Epoch seconds of an RFC 3339 UTC timestamp as the emulator writes them."""
    return datetime.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC).timestamp()


def owned_pods(cluster: Cluster, job: Obj) -> list[Obj]:
    return _controlled(cluster, POD_KEY, job)


def delete(cluster: Cluster, key: Key, obj: Obj) -> None:
    _delete(cluster, key, obj)


def phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase", "Pending"))


def faulty_nodes(cluster: Cluster) -> dict[str, str]:
    """Nodes that cannot run training now, with why: not Ready, or HyperPod's health label says so."""
    out: dict[str, str] = {}
    for (_, name), node in cluster.store.items(NODE_KEY):
        health = (node["metadata"].get("labels") or {}).get(HEALTH_LABEL, "")
        if health in UNHEALTHY:
            out[name] = f"{HEALTH_LABEL}={health}"
        elif not is_ready(node):
            out[name] = "NotReady"
    return out


def pod_fault(cluster: Cluster, pod: Obj, faulty: dict[str, str]) -> str | None:
    """Why ``pod``'s node failed it (None: no node fault)."""
    node = (pod.get("spec") or {}).get("nodeName")
    if not node or phase(pod) == "Succeeded":
        return None
    if (pod.get("status") or {}).get("reason") == "NodeLost":
        return f"node {node} was lost"
    if node in faulty:
        return f"node {node} is unhealthy ({faulty[node]})"
    if cluster.store.get(NODE_KEY, ("", node)) is None:
        return f"node {node} is gone"
    return None


def avoid_nodes(pod_spec: dict[str, Any], nodes: list[str]) -> None:
    """Add ``kubernetes.io/hostname NotIn nodes`` to every required node-affinity term of ``pod_spec``."""
    if not nodes:
        return
    expr = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": sorted(nodes)}
    required = pod_spec.setdefault("affinity", {}).setdefault("nodeAffinity", {}).setdefault(
        "requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.setdefault("nodeSelectorTerms", [])
    if not terms:
        terms.append({})
    for term in terms:
        term.setdefault("matchExpressions", []).append(expr)


def set_env(container: dict[str, Any], values: dict[str, str]) -> None:
    """Set env vars on ``container`` (the operator's values win over the template's)."""
    env = [e for e in container.get("env") or [] if e.get("name") not in values]
    container["env"] = env + [{"name": k, "value": v} for k, v in values.items()]


def pod_body(job: Obj, template: dict[str, Any], name: str, labels: dict[str, str],
             annotations: dict[str, str]) -> Obj:
    """A pod from ``template``, named ``name`` and controlled by ``job``."""
    meta = clone(template.get("metadata") or {})
    meta["name"] = name
    meta["labels"] = {**(meta.get("labels") or {}), **labels}
    meta["annotations"] = {**(meta.get("annotations") or {}), **annotations}
    meta["ownerReferences"] = [{"apiVersion": job["apiVersion"], "kind": job["kind"],
                                "name": job["metadata"]["name"], "uid": job["metadata"]["uid"],
                                "controller": True, "blockOwnerDeletion": True}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": clone(template.get("spec") or {})}


def create(cluster: Cluster, key: Key, namespace: str, body: Obj, manager: str) -> str | None:
    """Create an object; the API's refusal message (None: created, or the name is still taken)."""
    rt = next(rt for rt in cluster.resource_types() if rt.key == key)
    try:
        cluster.create(rt, namespace, body, WriteOptions(manager=manager))
    except ApiError as exc:
        return None if exc.code == 409 else exc.message
    return None


def condition(obj: Obj, ctype: str, status: str, reason: str, message: str, now: str) -> dict[str, Any]:
    """A job condition keeping its transition time while its status does not change."""
    old = next((c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == ctype), None)
    same = old is not None and old.get("status") == status
    since = old.get("lastTransitionTime", now) if old is not None and same else now
    return {"type": ctype, "status": status, "reason": reason, "message": message, "lastTransitionTime": since,
            "lastUpdateTime": old.get("lastUpdateTime", now) if same and old is not None
            and old.get("message") == message else now}


def has(obj: Obj, ctype: str) -> bool:
    return any(c.get("type") == ctype and c.get("status") == TRUE for c in (obj.get("status") or {}).get("conditions")
               or [])


def write_status(cluster: Cluster, key: Key, obj: Obj, status: dict[str, Any], manager: str) -> bool:
    """Write ``status`` through the status subresource unless it is what is stored; whether it was written."""
    if _comparable(status) == _comparable(obj.get("status") or {}):
        return False
    rt = next(rt for rt in cluster.resource_types() if rt.key == key)
    meta = obj["metadata"]
    try:
        cluster.replace(rt, meta.get("namespace"), meta["name"], {**obj, "status": status},
                        WriteOptions(manager=manager), "status")
    except ApiError:
        return False  # changed meanwhile: its event brings it back
    return True


def _comparable(status: dict[str, Any]) -> str:
    conditions = [{k: v for k, v in c.items() if k not in ("lastTransitionTime", "lastUpdateTime", "lastProbeTime")}
                  for c in status.get("conditions") or []]
    return json.dumps({**status, "conditions": conditions}, sort_keys=True)


def event(cluster: Cluster, obj: Obj, reason: str, message: str, component: str, kind: str = "Normal") -> None:
    """Record a core/v1 Event on ``obj`` (a repeat of the same reason and message bumps its count)."""
    meta = obj["metadata"]
    ns = meta.get("namespace") or "default"
    digest = hashlib.sha256(f"{meta['uid']}/{reason}/{message}".encode()).hexdigest()[:16]
    name = f"{meta['name']}.{digest}"
    rt = cluster.builtin("", "events")
    now = cluster.now_iso()
    with contextlib.suppress(ApiError):
        old = cluster.store.get(rt.key, (ns, name))
        if old is not None:
            cluster.patch(rt, ns, name, "merge", {"count": int(old.get("count") or 1) + 1, "lastTimestamp": now},
                          WriteOptions(manager=component))
            return
        cluster.create(rt, ns, {
            "apiVersion": "v1", "kind": "Event", "metadata": {"name": name, "namespace": ns},
            "involvedObject": {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": meta["name"],
                               "namespace": ns, "uid": meta["uid"]},
            "reason": reason, "message": message, "type": kind, "count": 1, "firstTimestamp": now,
            "lastTimestamp": now, "source": {"component": component}, "reportingComponent": component},
            WriteOptions(manager=component))


def events_of(cluster: Cluster, obj: Obj) -> list[Obj]:
    """The events recorded on ``obj`` (for tests and the README's examples)."""
    uid = obj["metadata"]["uid"]
    return [e for _, e in cluster.store.items(("", "events"), obj["metadata"].get("namespace"))
            if (e.get("involvedObject") or {}).get("uid") == uid]
