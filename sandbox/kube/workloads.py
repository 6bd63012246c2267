"""The workload controllers of kube-controller-manager: ReplicaSet, Deployment, Job, DaemonSet, StatefulSet.

Each ``reconcile_*`` is level-based: it reads the object and the pods (or ReplicaSets) it controls
(controller owner references), creates or deletes what is missing or extra, and writes the status
fields clients read (``kubectl rollout status`` reads a Deployment's ``observedGeneration``,
``updatedReplicas``, ``replicas``, ``availableReplicas`` and its ``Progressing`` condition; a DaemonSet's
``desiredNumberScheduled`` / ``updatedNumberScheduled`` / ``numberAvailable``; a Job's ``Complete``
condition). Status is written only when it changed (timestamps kept), so a pass over a settled
workload writes nothing. A pod the API refuses (e.g. a missing ServiceAccount) becomes the
``ReplicaFailure`` / ``FailedCreate`` condition a real controller reports.

Simplifications (``sandbox/README.md``): a Deployment's rolling update scales the new ReplicaSet up at
once and the old ones down when it is fully available (Recreate: old ones first); no progress deadline;
Jobs do not fail (pods always succeed) and ignore the Indexed mode's indexes; orphan pods matching a
selector are not adopted. A ReplicaSet does release a pod of its own whose labels no longer match its selector
(its owner reference is removed, and a replacement is made), as the real ``ControllerRefManager`` does, and keeps
every pod that still matches however else it was relabelled. Scale-in deletes pods in the real controller's order
(``ActivePodsWithRanks``): unscheduled, pending, not ready, then the lower ``controller.kubernetes.io/pod-deletion-
cost``, then more restarts, then the newest.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from typing import Any

from . import deletion
from .cluster import Cluster, WriteOptions, clone
from .errors import ApiError
from .resources import POD_KEY
from .scheduling import TERMINAL, matches_node_selection, untolerated_taint
from .selectors import label_selector_from_match, labels_match, parse_label_selector
from .store import Key, Loc, Obj

MANAGER = WriteOptions(manager="kube-controller-manager")
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
HASH_LABEL = "pod-template-hash"
REVISION = "deployment.kubernetes.io/revision"
_SAFE = "bcdfghjklmnpqrstvwxz2456789"
RS_KEY: Key = ("apps", "replicasets")
DEPLOY_KEY: Key = ("apps", "deployments")
JOB_KEY: Key = ("batch", "jobs")
DS_KEY: Key = ("apps", "daemonsets")
STS_KEY: Key = ("apps", "statefulsets")
# What the DaemonSet controller adds to its pods' tolerations.
DAEMON_TOLERATIONS = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
)


# --- shared -----------------------------------------------------------------------------------------------


def owner_ref(obj: Obj) -> dict[str, Any]:
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}


def _controlled(cluster: Cluster, key: Key, owner: Obj) -> list[Obj]:
    uid = owner["metadata"]["uid"]
    out = []
    for dep_key, loc in cluster.store.dependents_of(uid):
        if dep_key != key:
            continue
        obj = cluster.store.get(key, loc)
        if obj is not None and any(r.get("uid") == uid and r.get("controller")
                                   for r in obj["metadata"].get("ownerReferences") or ()):
            out.append(obj)
    return out


def _active(pod: Obj) -> bool:
    return not pod["metadata"].get("deletionTimestamp") and (pod.get("status") or {}).get("phase") not in TERMINAL


def _ready(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in (pod.get("status") or {}).get("conditions")
        or [])


def _live(cluster: Cluster, key: Key, loc: Loc) -> Obj | None:
    obj = cluster.store.get(key, loc)
    if obj is None or obj["metadata"].get("deletionTimestamp"):
        return None
    return obj


def _pod_from_template(owner: Obj, template: dict[str, Any], extra_labels: dict[str, str],
                       name: str | None = None) -> Obj:
    meta = clone(template.get("metadata") or {})
    meta["labels"] = {**(meta.get("labels") or {}), **extra_labels}
    meta.pop("name", None)
    if name is None:
        meta["generateName"] = owner["metadata"]["name"] + "-"
    else:
        meta["name"] = name
    meta["ownerReferences"] = [owner_ref(owner)]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": clone(template.get("spec") or {})}


def _create_pod(cluster: Cluster, namespace: str, body: Obj) -> str | None:
    """Create a pod; the API's refusal message when it is refused."""
    try:
        cluster.create(cluster.builtin("", "pods"), namespace, body, MANAGER)
    except ApiError as exc:
        if exc.code == 409:  # a fixed name already taken: the next pass sees it
            return None
        return exc.message
    return None


def _delete(cluster: Cluster, key: Key, obj: Obj) -> None:
    rt = next(rt for rt in cluster.resource_types() if rt.key == key)
    with contextlib.suppress(ApiError):
        deletion.delete(cluster, rt, obj["metadata"].get("namespace"), obj["metadata"]["name"])


def _set_status(cluster: Cluster, key: Key, obj: Obj, status: dict[str, Any]) -> None:
    """Write ``status`` unless it is what is stored (conditions compared without their timestamps)."""
    if _comparable(status) == _comparable(obj.get("status") or {}):
        return
    rt = next(rt for rt in cluster.resource_types() if rt.key == key)
    meta = obj["metadata"]
    with contextlib.suppress(ApiError):
        cluster.replace(rt, meta.get("namespace"), meta["name"], {**obj, "status": status}, MANAGER, "status")


def _comparable(status: dict[str, Any]) -> str:
    conditions = [{k: v for k, v in c.items() if k not in ("lastTransitionTime", "lastUpdateTime", "lastProbeTime")}
                  for c in status.get("conditions") or []]
    return json.dumps({**status, "conditions": conditions}, sort_keys=True)


def _condition(obj: Obj, ctype: str, status: str, reason: str, message: str, now: str, *,
               update_time: bool = True) -> dict[str, Any]:
    old = next((c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == ctype), None)
    same = old is not None and old.get("status") == status
    cond: dict[str, Any] = {"type": ctype, "status": status}
    if update_time:
        cond["lastUpdateTime"] = old.get("lastUpdateTime", now) if same and old and \
            old.get("reason") == reason and old.get("message") == message else now
    cond["lastTransitionTime"] = old.get("lastTransitionTime", now) if same and old else now
    cond.update(reason=reason, message=message)
    return cond


def _nonzero(status: dict[str, Any], *keep: str) -> dict[str, Any]:
    """Drop the zero counters the API omits (``omitempty``), except ``keep``."""
    return {k: v for k, v in status.items() if v not in (0, None, []) or k in keep}


# --- ReplicaSet --------------------------------------------------------------------------------------------


def reconcile_replicaset(cluster: Cluster, loc: Loc) -> None:
    rs = _live(cluster, RS_KEY, loc)
    if rs is None:
        return
    spec = rs.get("spec") or {}
    want = int(spec.get("replicas", 1))
    selector = parse_label_selector(label_selector_from_match(spec.get("selector")))
    pods = [p for p in _controlled(cluster, POD_KEY, rs) if _active(p)
            and (labels_match(selector, p["metadata"].get("labels")) or not _release(cluster, rs, p))]
    failure = None
    if len(pods) < want:
        for _ in range(want - len(pods)):
            failure = _create_pod(cluster, loc[0], _pod_from_template(rs, spec.get("template") or {}, {})) or failure
            if failure:
                break
    elif len(pods) > want:
        pods.sort(key=_deletion_rank)
        for pod in pods[:len(pods) - want]:
            _delete(cluster, POD_KEY, pod)
    pods = [p for p in _controlled(cluster, POD_KEY, rs) if _active(p)]
    ready = sum(1 for p in pods if _ready(p))
    now = cluster.now_iso()
    status: dict[str, Any] = _nonzero({
        "replicas": len(pods), "fullyLabeledReplicas": len(pods), "readyReplicas": ready,
        "availableReplicas": ready, "observedGeneration": rs["metadata"].get("generation", 1)}, "replicas")
    if failure:
        status["conditions"] = [_condition(rs, "ReplicaFailure", "True", "FailedCreate", failure, now,
                                           update_time=False)]
    _set_status(cluster, RS_KEY, rs, status)


def _release(cluster: Cluster, rs: Obj, pod: Obj) -> bool:
    """Drop ``rs``'s owner reference from a pod whose labels left its selector (the pod then lives on as an
    orphan, and the ReplicaSet makes a replacement); False when the pod changed meanwhile (the next pass sees it)."""
    meta = pod["metadata"]
    kept = [r for r in meta.get("ownerReferences") or [] if r.get("uid") != rs["metadata"]["uid"]]
    body = {**pod, "metadata": {**meta, "ownerReferences": kept}}
    try:
        cluster.replace(cluster.builtin("", "pods"), meta.get("namespace"), meta["name"], body, MANAGER)
    except ApiError:
        return False
    return True


def _deletion_cost(pod: Obj) -> int:
    try:
        return int((pod["metadata"].get("annotations") or {}).get(DELETION_COST) or 0)
    except ValueError:  # the controller ignores a value that is not an integer (cost 0)
        return 0


def _restarts(pod: Obj) -> int:
    return sum(int(c.get("restartCount") or 0) for c in (pod.get("status") or {}).get("containerStatuses") or [])


def _deletion_rank(pod: Obj) -> tuple[Any, ...]:
    """The real controller's scale-in order, first deleted first: unscheduled before scheduled, Pending before
    Running, not ready before ready, the lower pod-deletion-cost, more restarts, then the newest."""
    return (bool((pod.get("spec") or {}).get("nodeName")), (pod.get("status") or {}).get("phase") == "Running",
            _ready(pod), _deletion_cost(pod), -_restarts(pod),
            [-ord(ch) for ch in pod["metadata"].get("creationTimestamp", "")])


# --- Deployment --------------------------------------------------------------------------------------------


def template_hash(template: dict[str, Any], collisions: int = 0) -> str:
    """A stable ``pod-template-hash`` for ``template``: a 32-bit hash rendered as the controller does
    (``rand.SafeEncodeString`` of its decimal digits)."""
    digest = hashlib.sha256((json.dumps(template, sort_keys=True) + str(collisions)).encode()).digest()
    number = int.from_bytes(digest[:4], "big")
    return "".join(_SAFE[ord(ch) % len(_SAFE)] for ch in str(number))


def _without_hash(template: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = clone(template)
    labels = (out.get("metadata") or {}).get("labels")
    if isinstance(labels, dict):
        labels.pop(HASH_LABEL, None)
    return out


def _percent_or_int(value: Any, total: int, round_up: bool) -> int:
    if isinstance(value, str) and value.endswith("%"):
        scaled = int(value[:-1] or 0) * total
        return -(-scaled // 100) if round_up else scaled // 100
    return int(value or 0)


def reconcile_deployment(cluster: Cluster, loc: Loc) -> None:
    deploy = _live(cluster, DEPLOY_KEY, loc)
    if deploy is None:
        return
    spec = deploy.get("spec") or {}
    want = int(spec.get("replicas", 1))
    template = spec.get("template") or {}
    owned = _controlled(cluster, RS_KEY, deploy)
    new = next((rs for rs in owned if _without_hash((rs.get("spec") or {}).get("template") or {}) == template), None)
    olds = [rs for rs in owned if rs is not new]
    revisions = [int((rs["metadata"].get("annotations") or {}).get(REVISION, "0") or 0) for rs in owned]
    recreate = (spec.get("strategy") or {}).get("type") == "Recreate"
    old_pods = sum(int((rs.get("status") or {}).get("replicas", 0)) for rs in olds)
    if new is None and not spec.get("paused") and not (recreate and old_pods):
        new = _create_replicaset(cluster, deploy, template, max(revisions, default=0) + 1,
                                 0 if recreate and any((rs.get("spec") or {}).get("replicas") for rs in olds)
                                 else want)
    if new is not None and not spec.get("paused"):
        _scale(cluster, new, want)
        new_available = int((new.get("status") or {}).get("availableReplicas", 0))
        for rs in olds:
            if recreate or new_available >= want:
                _scale(cluster, rs, 0)
    _cleanup_history(cluster, deploy, olds)
    owned = _controlled(cluster, RS_KEY, deploy)
    new = next((rs for rs in owned if _without_hash((rs.get("spec") or {}).get("template") or {}) == template), None)
    _deployment_status(cluster, deploy, new, owned, want, recreate)


def _create_replicaset(cluster: Cluster, deploy: Obj, template: dict[str, Any], revision: int,
                       replicas: int) -> Obj | None:
    meta = deploy["metadata"]
    spec = deploy.get("spec") or {}
    pod_hash = template_hash(template)
    labels = {**((template.get("metadata") or {}).get("labels") or {}), HASH_LABEL: pod_hash}
    rs_template = clone(template)
    rs_template.setdefault("metadata", {})["labels"] = labels
    selector = clone(spec.get("selector") or {})
    selector.setdefault("matchLabels", {})[HASH_LABEL] = pod_hash
    body = {"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": f"{meta['name']}-{pod_hash}", "namespace": meta["namespace"], "labels": labels,
                         "annotations": {REVISION: str(revision),
                                         "deployment.kubernetes.io/desired-replicas": str(spec.get("replicas", 1)),
                                         "deployment.kubernetes.io/max-replicas": str(spec.get("replicas", 1))},
                         "ownerReferences": [owner_ref(deploy)]},
            "spec": {"replicas": replicas, "minReadySeconds": spec.get("minReadySeconds", 0), "selector": selector,
                     "template": rs_template}}
    try:
        return cluster.create(cluster.builtin("apps", "replicasets"), meta["namespace"], body, MANAGER).obj
    except ApiError:
        return None


def _scale(cluster: Cluster, rs: Obj, replicas: int) -> None:
    if int((rs.get("spec") or {}).get("replicas", 1)) == replicas:
        return
    meta = rs["metadata"]
    with contextlib.suppress(ApiError):
        cluster.patch(cluster.builtin("apps", "replicasets"), meta["namespace"], meta["name"], "merge",
                      {"spec": {"replicas": replicas}}, MANAGER)


def _cleanup_history(cluster: Cluster, deploy: Obj, olds: list[Obj]) -> None:
    limit = int((deploy.get("spec") or {}).get("revisionHistoryLimit", 10))
    idle = [rs for rs in olds if not (rs.get("spec") or {}).get("replicas") and not (rs.get("status") or {})
            .get("replicas")]
    idle.sort(key=lambda rs: int((rs["metadata"].get("annotations") or {}).get(REVISION, "0") or 0))
    for rs in idle[:max(len(idle) - limit, 0)]:
        _delete(cluster, RS_KEY, rs)


def _deployment_status(cluster: Cluster, deploy: Obj, new: Obj | None, owned: list[Obj], want: int,
                       recreate: bool) -> None:
    spec = deploy.get("spec") or {}

    def total(field: str, sets: list[Obj]) -> int:
        return sum(int((rs.get("status") or {}).get(field, 0)) for rs in sets)

    replicas, available = total("replicas", owned), total("availableReplicas", owned)
    updated = total("replicas", [new]) if new is not None else 0
    max_unavailable = 0 if recreate else _percent_or_int(
        ((spec.get("strategy") or {}).get("rollingUpdate") or {}).get("maxUnavailable", "25%"), want, False)
    now = cluster.now_iso()
    conditions = [
        _condition(deploy, "Available", "True", "MinimumReplicasAvailable", "Deployment has minimum availability.",
                   now) if available >= want - max_unavailable else
        _condition(deploy, "Available", "False", "MinimumReplicasUnavailable",
                   "Deployment does not have minimum availability.", now)]
    if new is not None:
        name = new["metadata"]["name"]
        done = updated == want and replicas == updated and total("availableReplicas", [new]) == want
        conditions.append(
            _condition(deploy, "Progressing", "True", "NewReplicaSetAvailable",
                       f'ReplicaSet "{name}" has successfully progressed.', now) if done else
            _condition(deploy, "Progressing", "True", "ReplicaSetUpdated", f'ReplicaSet "{name}" is progressing.', now))
    status = _nonzero({
        "observedGeneration": deploy["metadata"].get("generation", 1), "replicas": replicas,
        "updatedReplicas": updated, "readyReplicas": total("readyReplicas", owned), "availableReplicas": available,
        "unavailableReplicas": max(want - available, 0), "conditions": conditions})
    _set_status(cluster, DEPLOY_KEY, deploy, status)
    revision = (new["metadata"].get("annotations") or {}).get(REVISION) if new is not None else None
    if revision and (deploy["metadata"].get("annotations") or {}).get(REVISION) != revision:
        meta = deploy["metadata"]
        with contextlib.suppress(ApiError):
            cluster.patch(cluster.builtin("apps", "deployments"), meta["namespace"], meta["name"], "merge",
                          {"metadata": {"annotations": {REVISION: revision}}}, MANAGER)


# --- Job ---------------------------------------------------------------------------------------------------


def reconcile_job(cluster: Cluster, loc: Loc) -> None:
    job = _live(cluster, JOB_KEY, loc)
    if job is None:
        return
    spec = job.get("spec") or {}
    old_status = job.get("status") or {}
    complete = any(c.get("type") == "Complete" and c.get("status") == "True" for c in old_status.get("conditions")
                   or [])
    pods = _controlled(cluster, POD_KEY, job)
    active = [p for p in pods if _active(p)]
    succeeded = max(sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Succeeded"),
                    int(old_status.get("succeeded", 0)))
    failed = sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Failed")
    completions = spec.get("completions")
    parallelism = int(spec.get("parallelism", 1))
    now = cluster.now_iso()
    suspended = bool(spec.get("suspend"))
    failure = None
    # backoffLimit: past it the Job fails and starts no pod again (a Job already Failed stays so)
    backoff_failed = any(c.get("type") == "Failed" and c.get("status") == "True"
                         for c in old_status.get("conditions") or []) or failed > int(spec.get("backoffLimit", 6))
    if (backoff_failed and not complete) or suspended:
        for pod in active:
            _delete(cluster, POD_KEY, pod)
        active = []
    elif not complete:
        remaining = parallelism if completions is None else int(completions) - succeeded
        missing = min(parallelism, remaining) - len(active)
        if completions is None and succeeded:
            missing = 0  # a work queue Job starts no new pod once one has succeeded
        for _ in range(max(missing, 0)):
            failure = _create_pod(cluster, loc[0], _pod_from_template(job, spec.get("template") or {}, {}))
            if failure:
                break
        active = [p for p in _controlled(cluster, POD_KEY, job) if _active(p)]
    done = complete or (not suspended and not active and (
        succeeded >= int(completions) if completions is not None else succeeded > 0))
    status: dict[str, Any] = {k: v for k, v in old_status.items() if k in ("startTime", "completionTime")}
    conditions: list[dict[str, Any]] = []
    if suspended:
        conditions.append(_condition(job, "Suspended", "True", "JobSuspended", "Job suspended", now,
                                     update_time=False) | {"lastProbeTime": now})
        status.pop("startTime", None)
    else:
        status.setdefault("startTime", now)
    if done:
        message = "Reached expected number of succeeded pods"
        for ctype in ("SuccessCriteriaMet", "Complete"):
            conditions.append(_condition(job, ctype, "True", "CompletionsReached", message, now, update_time=False)
                              | {"lastProbeTime": now})
        status.setdefault("completionTime", now)
    if backoff_failed and not complete:
        message = "Job has reached the specified backoff limit"
        for ctype in ("FailureTarget", "Failed"):
            conditions.append(_condition(job, ctype, "True", "BackoffLimitExceeded", message, now, update_time=False)
                              | {"lastProbeTime": now})
    if failure:
        conditions.append(_condition(job, "FailedCreate", "True", "FailedCreate", failure, now, update_time=False))
    status.update(_nonzero({"active": len(active), "succeeded": succeeded, "failed": failed}))
    status.update({"ready": sum(1 for p in active if _ready(p)), "terminating": 0, "uncountedTerminatedPods": {}})
    if conditions:
        for cond in conditions:  # probe times follow transitions, so a settled Job compares equal
            old = next((c for c in old_status.get("conditions") or [] if c.get("type") == cond["type"]), None)
            if old is not None and "lastProbeTime" in old and old.get("status") == cond["status"]:
                cond["lastProbeTime"] = old["lastProbeTime"]
        status["conditions"] = conditions
    _set_status(cluster, JOB_KEY, job, status)


# --- DaemonSet ---------------------------------------------------------------------------------------------


def daemon_pod_spec(template_spec: dict[str, Any], node: str) -> dict[str, Any]:
    """The pod spec the DaemonSet controller creates for ``node``: pinned by required node affinity on
    ``metadata.name``, with the daemon tolerations added."""
    spec: dict[str, Any] = clone(template_spec)
    tolerations = list(spec.get("tolerations") or [])
    extra = list(DAEMON_TOLERATIONS)
    if spec.get("hostNetwork"):
        extra.append({"key": "node.kubernetes.io/network-unavailable", "operator": "Exists", "effect": "NoSchedule"})
    for tol in extra:
        if tol not in tolerations:
            tolerations.append(dict(tol))
    spec["tolerations"] = tolerations
    affinity = spec.setdefault("affinity", {})
    affinity.setdefault("nodeAffinity", {})["requiredDuringSchedulingIgnoredDuringExecution"] = {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}
    return spec


def _daemon_node(pod: Obj) -> str | None:
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return str(spec["nodeName"])
    terms = (((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or [{}]
    fields = terms[0].get("matchFields") or [{}]
    values = fields[0].get("values") or [None]
    return str(values[0]) if values[0] is not None else None


def reconcile_daemonset(cluster: Cluster, loc: Loc) -> None:
    ds = _live(cluster, DS_KEY, loc)
    if ds is None:
        return
    template = (ds.get("spec") or {}).get("template") or {}
    tspec = daemon_pod_spec(template.get("spec") or {}, "")
    generation = str(ds["metadata"].get("generation", 1))
    nodes = {obj["metadata"]["name"]: obj for _, obj in cluster.store.items(("", "nodes"))}
    eligible = {name for name, node in nodes.items()
                if matches_node_selection(template.get("spec") or {}, node) and untolerated_taint(tspec, node) is None}
    by_node: dict[str, list[Obj]] = {}
    for pod in _controlled(cluster, POD_KEY, ds):
        if _active(pod):
            by_node.setdefault(_daemon_node(pod) or "", []).append(pod)
    failure = None
    for name, pods in by_node.items():
        outdated = [p for p in pods if (p["metadata"].get("labels") or {}).get("pod-template-generation") != generation]
        extra = pods[1:] if name in eligible else pods
        for pod in {id(p): p for p in [*outdated, *extra]}.values():
            _delete(cluster, POD_KEY, pod)
    hash_value = template_hash(template)
    for name in sorted(eligible):
        current = [p for p in by_node.get(name, []) if (p["metadata"].get("labels") or {}).get(
            "pod-template-generation") == generation]
        if current:
            continue
        body = _pod_from_template(ds, template, {"controller-revision-hash": hash_value,
                                                  "pod-template-generation": generation})
        body["spec"] = daemon_pod_spec(template.get("spec") or {}, name)
        failure = _create_pod(cluster, loc[0], body) or failure
    pods = [p for p in _controlled(cluster, POD_KEY, ds) if _active(p)]
    scheduled = {_daemon_node(p) for p in pods if (p.get("spec") or {}).get("nodeName")}
    updated = [p for p in pods if (p["metadata"].get("labels") or {}).get("pod-template-generation") == generation
               and (p.get("spec") or {}).get("nodeName")]
    ready = sum(1 for p in pods if _ready(p))
    status = _nonzero({
        "currentNumberScheduled": len(scheduled & eligible), "desiredNumberScheduled": len(eligible),
        "numberMisscheduled": len(scheduled - eligible), "numberReady": ready, "numberAvailable": ready,
        "numberUnavailable": max(len(eligible) - ready, 0), "updatedNumberScheduled": len(updated),
        "observedGeneration": ds["metadata"].get("generation", 1)},
        "currentNumberScheduled", "desiredNumberScheduled", "numberMisscheduled", "numberReady")
    if failure:
        status["conditions"] = [_condition(ds, "FailedCreate", "True", "FailedCreate", failure, cluster.now_iso(),
                                           update_time=False)]
    _set_status(cluster, DS_KEY, ds, status)


# --- StatefulSet -------------------------------------------------------------------------------------------


def reconcile_statefulset(cluster: Cluster, loc: Loc) -> None:
    """Pods ``<name>-0..N-1`` with stable names; ``OrderedReady`` starts ordinal i+1 only once i is Ready, and
    each ``volumeClaimTemplates`` entry gets its claim ``<template>-<name>-<ordinal>``."""
    sts = _live(cluster, STS_KEY, loc)
    if sts is None:
        return
    spec = sts.get("spec") or {}
    want = int(spec.get("replicas", 1))
    template = spec.get("template") or {}
    revision = f"{loc[1]}-{template_hash(template)}"
    ordered = spec.get("podManagementPolicy", "OrderedReady") == "OrderedReady"
    pods = {p["metadata"]["name"]: p for p in _controlled(cluster, POD_KEY, sts) if _active(p)}
    failure = None
    for ordinal in range(want):
        name = f"{loc[1]}-{ordinal}"
        pod = pods.get(name)
        if pod is not None:
            if (pod["metadata"].get("labels") or {}).get("controller-revision-hash") != revision:
                _delete(cluster, POD_KEY, pod)  # a template change: replaced (the next pass creates it anew)
                break
            if ordered and not _ready(pod):
                break
            continue
        for claim in spec.get("volumeClaimTemplates") or []:
            failure = _ensure_claim(cluster, sts, claim, ordinal) or failure
        labels = {"controller-revision-hash": revision, "statefulset.kubernetes.io/pod-name": name,
                  "apps.kubernetes.io/pod-index": str(ordinal)}
        body = _pod_from_template(sts, template, labels, name)
        body["spec"]["hostname"] = name
        if spec.get("serviceName"):
            body["spec"]["subdomain"] = spec["serviceName"]
        volumes = body["spec"].setdefault("volumes", [])
        for claim in spec.get("volumeClaimTemplates") or []:
            claim_name = claim.get("metadata", {}).get("name", "")
            volumes.append({"name": claim_name, "persistentVolumeClaim": {"claimName": f"{claim_name}-{name}"}})
        failure = _create_pod(cluster, loc[0], body) or failure
        if ordered or failure:
            break
    for name, pod in pods.items():
        ordinal = name.rsplit("-", 1)[-1]
        if not ordinal.isdigit() or int(ordinal) >= want:
            _delete(cluster, POD_KEY, pod)
    pods = {p["metadata"]["name"]: p for p in _controlled(cluster, POD_KEY, sts) if _active(p)}
    ready = sum(1 for p in pods.values() if _ready(p))
    current = sum(1 for p in pods.values() if (p["metadata"].get("labels") or {}).get("controller-revision-hash")
                  == revision)
    status: dict[str, Any] = _nonzero({
        "observedGeneration": sts["metadata"].get("generation", 1), "replicas": len(pods), "readyReplicas": ready,
        "currentReplicas": current, "updatedReplicas": current, "availableReplicas": ready,
        "currentRevision": revision, "updateRevision": revision, "collisionCount": 0},
        "replicas", "availableReplicas", "collisionCount")
    if failure:
        status["conditions"] = [_condition(sts, "FailedCreate", "True", "FailedCreate", failure, cluster.now_iso(),
                                           update_time=False)]
    _set_status(cluster, STS_KEY, sts, status)


def _ensure_claim(cluster: Cluster, sts: Obj, claim: dict[str, Any], ordinal: int) -> str | None:
    meta = sts["metadata"]
    name = f"{(claim.get('metadata') or {}).get('name', '')}-{meta['name']}-{ordinal}"
    if cluster.store.get(("", "persistentvolumeclaims"), (meta["namespace"], name)) is not None:
        return None
    labels = {**((sts.get("spec") or {}).get("selector") or {}).get("matchLabels", {}),
              **((claim.get("metadata") or {}).get("labels") or {})}
    body = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": meta["namespace"], "labels": labels},
            "spec": clone(claim.get("spec") or {})}
    try:
        cluster.create(cluster.builtin("", "persistentvolumeclaims"), meta["namespace"], body, MANAGER)
    except ApiError as exc:
        return None if exc.code == 409 else exc.message
    return None
