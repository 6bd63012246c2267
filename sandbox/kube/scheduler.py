"""The scheduler and the kubelets of an emulated cluster: bind pending pods, run bound ones.

:func:`schedule_pending` binds every unbound pod (highest priority, then oldest first) to the fitting
Ready node with the fewest pods, counting the requests of the pods already bound; a pod that fits
nowhere gets ``PodScheduled=False``, reason ``Unschedulable``, with the scheduler's ``0/N nodes are
available: ...`` message (:mod:`.scheduling` decides), and is retried whenever nodes or capacity change.
:func:`run_pod` is the kubelet: a bound pod starts (``Running``, every container ready, pod and host IP) once
the ConfigMaps its volumes mount exist (until then a ``FailedMount`` warning) and the Secrets and keys its
containers' ``secretKeyRef`` name exist (until then ``CreateContainerConfigError``);
a container a simulated program claims (:mod:`.processes`) then runs that program, which ends it with its
exit code; any other Job pod completes (``Succeeded``, exit code 0) as soon as it started. Pods of a
deleted node are deleted (the pod garbage collector).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections import Counter
from decimal import Decimal
from typing import Any

from . import deletion, probes, processes, volumes
from . import operator_support as ops
from .cluster import Cluster, WriteOptions
from .errors import ApiError
from .resources import POD_KEY
from .scheduling import (
    TERMINAL,
    Resources,
    add_usage,
    affinity_node_name,
    free_resources,
    is_ready,
    misfit,
    pod_requests,
    unschedulable_message,
)
from .store import Loc, Obj

SCHEDULER = WriteOptions(manager="default-scheduler")
KUBELET = WriteOptions(manager="kubelet")


def _unbound(pod: Obj) -> bool:
    spec = pod.get("spec") or {}
    return not spec.get("nodeName") and not pod["metadata"].get("deletionTimestamp") and \
        (pod.get("status") or {}).get("phase", "Pending") == "Pending" and \
        spec.get("schedulerName", "default-scheduler") == "default-scheduler"


def schedule_pending(cluster: Cluster) -> None:
    pods = [obj for _, obj in cluster.store.items(POD_KEY)]
    pending = [p for p in pods if _unbound(p)]
    if not pending:
        return
    nodes = {obj["metadata"]["name"]: obj for _, obj in cluster.store.items(("", "nodes"))}
    used: dict[str, Resources] = {}
    counts: Counter[str] = Counter()
    for pod in pods:
        add_usage(used, pod)
        node = (pod.get("spec") or {}).get("nodeName")
        if node and (pod.get("status") or {}).get("phase") not in TERMINAL:
            counts[node] += 1
    free = {name: free_resources(node, used.get(name)) for name, node in nodes.items()}
    pending.sort(key=lambda p: (-int((p.get("spec") or {}).get("priority") or 0),
                                p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"]))
    for pod in pending:
        spec = pod.get("spec") or {}
        blocked = volumes.claims_block(cluster, pod)
        if blocked is not None:  # the VolumeBinding PreFilter: no node is even considered
            n = len(nodes)
            _mark_unschedulable(cluster, pod, f"0/{n} nodes are available: {blocked}. preemption: 0/{n} nodes are "
                                              f"available: {n} Preemption is not helpful for scheduling.")
            continue
        requests = pod_requests(pod)
        only = affinity_node_name(spec)
        # The least loaded first, so the first node that fits is the choice; only a pod that fits nowhere
        # is checked against every node (its message counts them all).
        candidates = [only] if only is not None else sorted(nodes, key=lambda n: (counts[n], n))
        reasons: Counter[str] = Counter()
        resolvable = 0
        chosen: str | None = None
        for name in candidates:
            node = nodes.get(name)
            if node is None:
                continue
            why, can_preempt = misfit(spec, requests, node, free[name])
            if not why:
                chosen = name
                break
            reasons.update(why)
            resolvable += can_preempt
        if only is not None and only not in nodes:
            reasons["node(s) didn't match Pod's node affinity/selector"] += len(nodes)
        if chosen is not None:
            delayed = volumes.unbound_delayed_claims(cluster, pod)
            if delayed:  # provisioned for the chosen node first; the pod binds once its claims are bound
                volumes.select_node(cluster, delayed, chosen)
                continue
            if _bind(cluster, pod, chosen):
                counts[chosen] += 1
                for name, q in requests.items():
                    free[chosen][name] = free[chosen].get(name, Decimal(0)) - q
        else:
            _mark_unschedulable(cluster, pod, unschedulable_message(len(nodes), reasons, resolvable))


def _condition(pod: Obj, ctype: str, status: str, now: str, **extra: str) -> dict[str, Any]:
    """A pod condition, keeping its transition time while its status does not change."""
    old = next((c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == ctype), None)
    since = old["lastTransitionTime"] if old and old.get("status") == status and old.get("lastTransitionTime") \
        else now
    return {"type": ctype, "status": status, "lastProbeTime": None, "lastTransitionTime": since, **extra}


def _write_status(cluster: Cluster, pod: Obj, status: dict[str, Any], opts: WriteOptions) -> None:
    meta = pod["metadata"]
    body = {**pod, "metadata": {**meta}, "status": status}
    with contextlib.suppress(ApiError):  # deleted or changed meanwhile: its event brings it back
        cluster.replace(cluster.builtin("", "pods"), meta["namespace"], meta["name"], body, opts, "status")


def _bind(cluster: Cluster, pod: Obj, node: str) -> bool:
    """POST pods/binding: set ``spec.nodeName`` (only on a still unbound pod) and ``PodScheduled=True``."""
    meta = pod["metadata"]
    rt = cluster.builtin("", "pods")
    with cluster.store.lock:
        current = cluster.store.get(POD_KEY, (meta["namespace"], meta["name"]))
        if current is None or current["metadata"]["uid"] != meta["uid"] or not _unbound(current):
            return False
        cluster.patch(rt, meta["namespace"], meta["name"], "merge", {"spec": {"nodeName": node}}, SCHEDULER)
        bound = cluster.get(rt, meta["namespace"], meta["name"])
    status = dict(bound.get("status") or {})
    others = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
    status["conditions"] = [*others, _condition(bound, "PodScheduled", "True", cluster.now_iso())]
    _write_status(cluster, bound, status, SCHEDULER)
    return True


def _mark_unschedulable(cluster: Cluster, pod: Obj, message: str) -> None:
    status = dict(pod.get("status") or {})
    old = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), None)
    if old and old.get("status") == "False" and old.get("message") == message:
        return  # unchanged: no write, no event, no loop
    status["phase"] = "Pending"
    status["conditions"] = [_condition(pod, "PodScheduled", "False", cluster.now_iso(), reason="Unschedulable",
                                       message=message)]
    _write_status(cluster, pod, status, SCHEDULER)


# --- the kubelet -------------------------------------------------------------------------------------------


def _owned_by_job(pod: Obj) -> bool:
    return any(ref.get("kind") == "Job" and ref.get("controller") for ref in pod["metadata"].get("ownerReferences")
               or ())


def _pod_ip(uid: str) -> str:
    digest = hashlib.sha256(uid.encode()).digest()
    return f"10.1.{digest[0]}.{digest[1] % 254 + 1}"


def _host_ip(node: Obj) -> str:
    addresses = (node.get("status") or {}).get("addresses") or []
    return next((a["address"] for a in addresses if a.get("type") == "InternalIP"), "10.0.0.1")


def run_pod(cluster: Cluster, loc: Loc) -> None:
    """Start a bound pod, and end a started Job pod's run."""
    pod = cluster.store.get(POD_KEY, loc)
    if pod is None or pod["metadata"].get("deletionTimestamp"):
        processes.pod_gone(cluster, loc)
        return
    processes.pod_gone(cluster, loc, pod["metadata"]["uid"])  # an earlier pod of the same name
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    node_name = spec.get("nodeName")
    if not node_name:
        return
    node = cluster.store.get(("", "nodes"), ("", node_name))
    if node is None or not is_ready(node):
        return
    phase = status.get("phase", "Pending")
    if phase == "Pending" and (missing := volumes.missing_config_maps(cluster, pod)):
        volumes.mount_failed(cluster, pod, missing)  # started once the ConfigMap exists (.controllers)
    elif phase == "Pending" and (refused := _config_errors(cluster, pod)):
        _refuse(cluster, pod, refused)  # started once they resolve
    elif phase == "Pending":
        _write_status(cluster, pod, _running(cluster, pod, node), KUBELET)
    elif phase == "Running" and processes.run(cluster, pod, probes.run):
        return  # its simulated programs end it
    elif phase == "Running" and cluster.downloads.simulates(cluster, loc, pod):
        return  # a model download runs as its simulated `hf download` and ends the pod itself (.downloader)
    elif phase == "Running" and _owned_by_job(pod) and spec.get("restartPolicy") != "Always":
        _write_status(cluster, pod, _succeeded(cluster, pod), KUBELET)
        for container in spec.get("containers") or []:
            cluster.logs.terminate((loc[0], loc[1], container.get("name", "")))


def _running(cluster: Cluster, pod: Obj, node: Obj) -> dict[str, Any]:
    now = cluster.now_iso()
    spec = pod.get("spec") or {}
    host_ip = _host_ip(node)
    pod_ip = host_ip if spec.get("hostNetwork") else _pod_ip(pod["metadata"]["uid"])
    containers = []
    for index, container in enumerate(spec.get("containers") or []):
        ident = hashlib.sha256(f"{pod['metadata']['uid']}/{index}".encode()).hexdigest()
        image = str(container.get("image"))
        probed = processes.probed(pod, container)  # ready once its probes pass (.probes)
        containers.append({
            "name": container.get("name"), "image": image,
            "imageID": f"{image}@sha256:{hashlib.sha256(image.encode()).hexdigest()}",
            "containerID": f"containerd://{ident}", "ready": not probed,
            "started": not (probed and container.get("startupProbe")), "restartCount": 0,
            "state": {"running": {"startedAt": now}}})
    conditions = [_condition(pod, ctype, "True", now) for ctype in
                  ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")]
    status: dict[str, Any] = {
        "phase": "Running", "conditions": conditions, "hostIP": host_ip, "hostIPs": [{"ip": host_ip}],
        "podIP": pod_ip, "podIPs": [{"ip": pod_ip}], "startTime": now, "containerStatuses": containers}
    status["conditions"] = processes.ready_conditions(status, now)
    if "qosClass" in (pod.get("status") or {}):
        status["qosClass"] = pod["status"]["qosClass"]
    return status


def _config_error(cluster: Cluster, namespace: str, container: dict[str, Any]) -> str:
    """Why the kubelet cannot build the container's environment: a ``secretKeyRef`` (not ``optional``) to a
    Secret or key that does not exist ("" when it can)."""
    for item in container.get("env") or []:
        ref = (item.get("valueFrom") or {}).get("secretKeyRef")
        if not isinstance(ref, dict) or ref.get("optional"):
            continue
        name, key = str(ref.get("name", "")), str(ref.get("key", ""))
        secret = cluster.store.get(("", "secrets"), (namespace, name))
        if secret is None:
            return f'secret "{name}" not found'
        if key not in {**(secret.get("data") or {}), **(secret.get("stringData") or {})}:
            return f"couldn't find key {key} in Secret {namespace}/{name}"
    return ""


def _config_errors(cluster: Cluster, pod: Obj) -> dict[str, str]:
    namespace, spec = pod["metadata"]["namespace"], pod.get("spec") or {}
    errors = {str(c.get("name")): _config_error(cluster, namespace, c)
              for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]}
    return {name: why for name, why in errors.items() if why}


def _refuse(cluster: Cluster, pod: Obj, refused: dict[str, str]) -> None:
    """The pod whose containers the kubelet cannot create yet: it stays ``Pending``, each refused container
    (init containers too) waiting in ``CreateContainerConfigError`` (a ``Failed`` warning names why), the others
    ``ContainerCreating`` (``PodInitializing`` behind a refused init container); it starts once every reference
    resolves (a Secret written wakes it, :mod:`.controllers`)."""
    now = cluster.now_iso()
    spec, status = pod.get("spec") or {}, dict(pod.get("status") or {})
    blocked = [str(c.get("name")) for c in spec.get("initContainers") or [] if str(c.get("name")) in refused]

    def statuses(containers: list[dict[str, Any]], other: str) -> list[dict[str, Any]]:
        return [{"name": str(c.get("name")), "image": str(c.get("image")), "imageID": "", "ready": False,
                 "started": False, "restartCount": 0, "state": {"waiting": {
                     "reason": "CreateContainerConfigError", "message": refused[str(c.get("name"))]}
                     if str(c.get("name")) in refused else {"reason": other}}} for c in containers]

    inits = statuses(spec.get("initContainers") or [], "PodInitializing")
    containers = statuses(spec.get("containers") or [], "PodInitializing" if blocked else "ContainerCreating")
    if status.get("containerStatuses") == containers and (status.get("initContainerStatuses") or []) == inits:
        return  # unchanged: no write, no event, no loop
    for why in refused.values():
        ops.event(cluster, pod, "Failed", f"Error: {why}", "kubelet", "Warning")
    status["containerStatuses"] = containers
    if inits:
        status["initContainerStatuses"] = inits
    initialized = _condition(pod, "Initialized", "False", now, reason="ContainersNotInitialized",
                             message=f"containers with incomplete status: [{' '.join(blocked)}]") if blocked \
        else _condition(pod, "Initialized", "True", now)
    conditions = [_condition(pod, "PodReadyToStartContainers", "True", now), initialized,
                  _condition(pod, "Ready", "False", now), _condition(pod, "ContainersReady", "False", now),
                  *(c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled")]
    status["conditions"] = processes.ready_conditions({**status, "conditions": conditions}, now)
    _write_status(cluster, pod, status, KUBELET)


def _succeeded(cluster: Cluster, pod: Obj) -> dict[str, Any]:
    now = cluster.now_iso()
    status = dict(pod.get("status") or {})
    status["phase"] = "Succeeded"
    status["conditions"] = [
        _condition(pod, c["type"], "False", now, reason="PodCompleted")
        if c.get("type") in ("Ready", "ContainersReady", "PodReadyToStartContainers") else c
        for c in status.get("conditions") or []]
    status["containerStatuses"] = [
        {**c, "ready": False, "started": False,
         "state": {"terminated": {"exitCode": 0, "reason": "Completed", "containerID": c.get("containerID"),
                                  "startedAt": ((c.get("state") or {}).get("running") or {}).get("startedAt", now),
                                  "finishedAt": now}}}
        for c in status.get("containerStatuses") or []]
    return status


def collect_pods_of_removed_nodes(cluster: Cluster, nodes: set[str]) -> None:
    """The pod garbage collector: pods bound to a node that no longer exists are deleted."""
    rt = cluster.builtin("", "pods")
    for loc, pod in cluster.store.items(POD_KEY):
        if (pod.get("spec") or {}).get("nodeName") in nodes and cluster.store.get(
                ("", "nodes"), ("", pod["spec"]["nodeName"])) is None:
            with contextlib.suppress(ApiError):
                deletion.delete(cluster, rt, loc[0], loc[1])
