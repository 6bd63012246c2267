"""The HyperPod training operator of the sandbox: ``HyperPodPyTorchJob`` (``sagemaker.amazonaws.com/v1``).

It acts only where its CRD is installed (the ``hyperpod-training-operator`` component), as the real operator
is there only once its add-on is. Per job it makes the pods of ``replicaSpecs`` (``<job>-<spec name>-<i>``,
the global rank being the index in ``replicaSpecs`` order; the template's labels and ``NNODES``,
``NPROC_PER_NODE``, ``RANK``/``NODE_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` in every container) and keeps
``status``: conditions ``Created`` -> ``PodsRunning`` -> ``Running`` -> ``Completed`` | ``Failed``,
``restartCount``, ``restartStatus`` {restartCount, fullJobRestartCount, currentEvalPeriod}, ``startTime``,
``completionTime``, ``masterAddr``/``masterPort`` and ``latestFaultyPodInstanceList``.

The recovery budget (``runPolicy``): when a training process fails, the HyperPod elastic agent in its pod
asks the operator (:func:`request_restart`): a process-level restart in place while fewer than
``restartPolicy.numRestartBeforeFullJobRestart`` happened in the current ``evalPeriodSeconds`` window, else a
full job restart (every pod recreated) while fewer than ``maxFullJobRestarts`` happened, and never more
restarts in all than ``jobMaxRetryCount``. A node fault (the pod's node NotReady or gone, or labelled
``node-health-status`` Unschedulable / UnschedulablePendingReplacement / UnschedulablePendingReboot) and a
pod that failed with no agent to restart it go straight to a full job restart, recreating the pods away from
the faulty nodes; event reason ``NodeFault`` for a node fault. An exhausted budget ends the job ``Failed``
with a message naming the budget. ``runPolicy.suspend`` deletes the pods and resuming recreates them;
``cleanPodPolicy`` (``All`` default, ``OnlyComplete``, ``None``) says which pods go once the job ended.
Pods run with ``restartPolicy: Never``: restarts are the operator's and the agent's, not the kubelet's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import operator_support as ops
from .cluster import Cluster, clone
from .resources import POD_KEY
from .store import Key, Loc, Obj

if TYPE_CHECKING:
    from .processes import Process

KEY: Key = ("sagemaker.amazonaws.com", "hyperpodpytorchjobs")
KIND = "HyperPodPyTorchJob"
MANAGER = "hp-training-operator"
MASTER_PORT = "23456"
# The reconstructed schema has no defaults for the budget; these follow the operator's documented examples.
DEFAULT_RESTARTS_BEFORE_FULL = 3
DEFAULT_EVAL_PERIOD = 21600
DEFAULT_FULL_RESTARTS = 1


def _terminal(job: Obj) -> bool:
    return ops.has(job, "Completed") or ops.has(job, "Failed")


def _budget(job: Obj) -> tuple[int, int, int, int | None]:
    run = (job.get("spec") or {}).get("runPolicy") or {}
    rp = run.get("restartPolicy") or {}
    max_retry = run.get("jobMaxRetryCount")
    return (int(rp.get("numRestartBeforeFullJobRestart", DEFAULT_RESTARTS_BEFORE_FULL)),
            int(rp.get("evalPeriodSeconds", DEFAULT_EVAL_PERIOD)) or DEFAULT_EVAL_PERIOD,
            int(rp.get("maxFullJobRestarts", DEFAULT_FULL_RESTARTS)),
            int(max_retry) if max_retry is not None else None)


def _window(cluster: Cluster, job: Obj, period: int) -> int:
    """The index of the current evalPeriodSeconds window since the job started."""
    start = (job.get("status") or {}).get("startTime")
    began = ops.parse_time(start) if start else cluster.clock()
    return int(max(cluster.clock() - began, 0) // period)


def _decide(cluster: Cluster, job: Obj, status: dict[str, Any], *, in_place: bool, why: str) -> str:
    """Spend the budget on one failure: ``"process"`` (restart in place), ``"job"`` (full job restart) or
    ``"failed"``; ``status`` is updated (counters, and the Failed condition when exhausted)."""
    before_full, period, max_full, max_retry = _budget(job)
    rs = dict(status.get("restartStatus") or {})
    window = _window(cluster, job, period)
    if rs.get("currentEvalPeriod") != window:
        rs["currentEvalPeriod"], rs["restartCount"] = window, 0
    rs.setdefault("restartCount", 0)
    rs.setdefault("fullJobRestartCount", 0)
    total = int(status.get("restartCount") or 0) + int(rs["fullJobRestartCount"])
    now = cluster.now_iso()
    if max_retry is not None and total >= max_retry:
        outcome, message = "failed", f"jobMaxRetryCount ({max_retry}) exhausted after {total} restarts: {why}"
    elif in_place and int(rs["restartCount"]) < before_full:
        rs["restartCount"] = int(rs["restartCount"]) + 1
        status["restartCount"] = int(status.get("restartCount") or 0) + 1
        outcome, message = "process", ""
    elif int(rs["fullJobRestartCount"]) < max_full:
        rs["fullJobRestartCount"] = int(rs["fullJobRestartCount"]) + 1
        rs["restartCount"] = 0  # the new pods start with the whole process-level allowance
        outcome, message = "job", ""
    elif in_place:
        outcome, message = "failed", (f"maxFullJobRestarts ({max_full}) exhausted after {before_full} process-level "
                                      f"restarts within evalPeriodSeconds ({period}): {why}")
    else:
        outcome, message = "failed", f"maxFullJobRestarts ({max_full}) exhausted: {why}"
    status["restartStatus"] = rs
    if outcome == "failed":
        _set_terminal(job, status, "Failed", "RestartBudgetExhausted", message, now)
    return outcome


def _set_terminal(job: Obj, status: dict[str, Any], ctype: str, reason: str, message: str, now: str) -> None:
    others = [c for c in status.get("conditions") or [] if c.get("type") not in (ctype, "Running", "PodsRunning")]
    status["conditions"] = [*others, ops.condition(job, "Running", "False", reason, message, now),
                            ops.condition(job, ctype, ops.TRUE, reason, message, now)]
    status.setdefault("completionTime", now)


def request_restart(proc: Process, exit_code: int) -> bool:
    """The elastic agent in ``proc``'s pod reports its training process failed: True when the operator grants
    a process-level restart in place (else the agent exits and the operator restarts or fails the job)."""
    cluster = proc.cluster
    with cluster.store.lock:
        pod = cluster.store.get(POD_KEY, (proc.namespace, proc.pod))
        ref = next((r for r in (pod or {}).get("metadata", {}).get("ownerReferences") or []
                    if r.get("kind") == KIND and r.get("controller")), None)
        if pod is None or ref is None:
            return False
        job = cluster.store.get(KEY, (proc.namespace, ref["name"]))
        if job is None or job["metadata"]["uid"] != ref.get("uid") or _terminal(job):
            return False
        status = clone(job.get("status") or {})
        attempt = str((status.get("restartStatus") or {}).get("fullJobRestartCount", 0))
        if (pod["metadata"].get("annotations") or {}).get(ops.ATTEMPT) != attempt:
            return False
        why = f"pod {proc.pod} exited with code {exit_code}"
        outcome = _decide(cluster, job, status, in_place=True, why=why)
        if outcome == "job":
            status["latestFaultyPodInstanceList"] = {"restartType": "JLR", "faultyPodList": [proc.pod]}
        elif outcome == "process":
            status["latestFaultyPodInstanceList"] = {"restartType": "PLR", "faultyPodList": [proc.pod]}
        ops.write_status(cluster, KEY, job, status, MANAGER)
    if outcome == "process":
        ops.event(cluster, job, "ProcessLevelRestart", f"Restarting the training processes of {why}", MANAGER)
    elif outcome == "job":
        ops.event(cluster, job, "JobLevelRestart", f"Restarting all pods of the job: {why}", MANAGER, "Warning")
    else:
        ops.event(cluster, job, "Failed", status["conditions"][-1]["message"], MANAGER, "Warning")
    return outcome == "process"


def _desired(job: Obj, attempt: str, avoid: list[str]) -> list[Obj]:
    """The pods of the job's current attempt, in rank order."""
    spec = job.get("spec") or {}
    name = job["metadata"]["name"]
    specs = spec.get("replicaSpecs") or []
    nnodes = sum(int(s.get("replicas") or 0) for s in specs)
    master = f"{name}-{specs[0].get('name')}-0" if specs else ""
    pods: list[Obj] = []
    for rs in specs:
        for i in range(int(rs.get("replicas") or 0)):
            rank = len(pods)
            body = ops.pod_body(job, rs.get("template") or {}, f"{name}-{rs.get('name')}-{i}",
                                {"sagemaker.amazonaws.com/job-name": name, "replica-type": str(rs.get("name"))},
                                {ops.ATTEMPT: attempt})
            pod_spec = body["spec"]
            pod_spec["restartPolicy"] = "Never"
            pod_spec.setdefault("hostname", body["metadata"]["name"])
            ops.avoid_nodes(pod_spec, avoid)
            for container in pod_spec.get("containers") or []:
                ops.set_env(container, {"NNODES": str(nnodes), "NPROC_PER_NODE": _nproc(spec, container),
                                        "RANK": str(rank), "NODE_RANK": str(rank), "MASTER_ADDR": master,
                                        "MASTER_PORT": MASTER_PORT, "JOB_NAME": name})
            pods.append(body)
    return pods


def _nproc(spec: dict[str, Any], container: dict[str, Any]) -> str:
    value = str(spec.get("nprocPerNode") or "auto")
    if value.isdigit():
        return value
    resources = container.get("resources") or {}
    gpus = (resources.get("limits") or {}).get("nvidia.com/gpu") or (resources.get("requests") or {}).get(
        "nvidia.com/gpu")
    return str(gpus) if value in ("auto", "gpu") and gpus else "1"


def reconcile(cluster: Cluster, loc: Loc) -> None:
    job = cluster.store.get(KEY, loc)
    if job is None or job["metadata"].get("deletionTimestamp") or cluster.find_kind(
            "sagemaker.amazonaws.com/v1", KIND) is None:
        return
    now = cluster.now_iso()
    status = clone(job.get("status") or {})
    spec = job.get("spec") or {}
    pods = ops.owned_pods(cluster, job)
    if _terminal(job):
        _clean(cluster, job, pods)
        return
    conditions = {c["type"]: c for c in status.get("conditions") or []}
    if "Created" not in conditions:
        conditions["Created"] = ops.condition(job, "Created", ops.TRUE, "JobCreated",
                                              f"{KIND} {loc[1]} is created.", now)
    if (spec.get("runPolicy") or {}).get("suspend"):
        for pod in pods:
            ops.delete(cluster, POD_KEY, pod)
        conditions["Suspended"] = ops.condition(job, "Suspended", ops.TRUE, "JobSuspended", "Job suspended", now)
        for ctype in ("PodsRunning", "Running"):
            conditions.pop(ctype, None)
        status["conditions"] = list(conditions.values())
        ops.write_status(cluster, KEY, job, status, MANAGER)
        return
    if "Suspended" in conditions:
        conditions["Suspended"] = ops.condition(job, "Suspended", "False", "JobResumed", "Job resumed", now)
    status["conditions"] = list(conditions.values())
    status.setdefault("startTime", now)
    attempt = str((status.get("restartStatus") or {}).get("fullJobRestartCount", 0))
    stale = [p for p in pods if (p["metadata"].get("annotations") or {}).get(ops.ATTEMPT) != attempt]
    current = [p for p in pods if p not in stale]
    faulty = ops.faulty_nodes(cluster)
    faults = {p["metadata"]["name"]: why for p in current if (why := ops.pod_fault(cluster, p, faulty))}
    failed = [p for p in current if ops.phase(p) == "Failed" and p["metadata"]["name"] not in faults]
    if faults or failed:
        _restart_job(cluster, job, status, faults, failed, faulty)
        return
    for pod in stale:
        ops.delete(cluster, POD_KEY, pod)
    if stale:  # the new attempt's pods take the same names: they wait until the old ones are gone
        ops.write_status(cluster, KEY, job, status, MANAGER)
        return
    names = {p["metadata"]["name"] for p in current}
    desired = _desired(job, attempt, sorted(faulty))
    for body in desired:
        if body["metadata"]["name"] not in names:
            message = ops.create(cluster, POD_KEY, loc[0], body, MANAGER)
            if message:
                ops.event(cluster, job, "FailedCreate", message, MANAGER, "Warning")
    _progress(cluster, job, status, current, desired, now)


def _progress(cluster: Cluster, job: Obj, status: dict[str, Any], pods: list[Obj], desired: list[Obj],
              now: str) -> None:
    conditions = {c["type"]: c for c in status.get("conditions") or []}
    phases = [ops.phase(p) for p in pods]
    complete = len(pods) == len(desired) > 0 and all(ph == "Succeeded" for ph in phases)
    running = len(pods) == len(desired) > 0 and all(ph in ("Running", "Succeeded") for ph in phases)
    if desired:
        status["masterAddr"], status["masterPort"] = desired[0]["metadata"]["name"], MASTER_PORT
    if complete:
        status["conditions"] = [c for t, c in conditions.items() if t not in ("PodsRunning", "Running")]
        _set_terminal(job, status, "Completed", "JobCompleted", f"{KIND} {job['metadata']['name']} completed.", now)
        if ops.write_status(cluster, KEY, job, status, MANAGER):
            ops.event(cluster, job, "Completed", f"{KIND} {job['metadata']['name']} completed successfully.",
                      MANAGER)
        return
    if running:
        for ctype, reason in (("PodsRunning", "AllPodsRunning"), ("Running", "JobRunning")):
            conditions[ctype] = ops.condition(job, ctype, ops.TRUE, reason, f"{KIND} {job['metadata']['name']} "
                                              f"{'pods are' if ctype == 'PodsRunning' else 'is'} running.", now)
    status["conditions"] = list(conditions.values())
    ops.write_status(cluster, KEY, job, status, MANAGER)


def _restart_job(cluster: Cluster, job: Obj, status: dict[str, Any], faults: dict[str, str], failed: list[Obj],
                 faulty: dict[str, str]) -> None:
    """A node fault or a pod that failed with no agent to restart it: a full job restart, or Failed."""
    why = "; ".join(f"pod {pod}: {reason}" for pod, reason in sorted(faults.items())) or "; ".join(
        f"pod {p['metadata']['name']} failed" for p in failed)
    outcome = _decide(cluster, job, status, in_place=False, why=why)
    bad_pods = sorted(faults) or [p["metadata"]["name"] for p in failed]
    if outcome == "job":
        status["latestFaultyPodInstanceList"] = {
            "restartType": "JLR", "faultyPodList": bad_pods,
            "faultyInstanceIdList": sorted({n for n in faulty if any(
                (p.get("spec") or {}).get("nodeName") == n for p in ops.owned_pods(cluster, job))})}
    if not ops.write_status(cluster, KEY, job, status, MANAGER):
        return
    if faults:
        ops.event(cluster, job, "NodeFault", f"{why}; " + ("restarting the job on other nodes" if outcome == "job"
                                                           else "no restart left"), MANAGER, "Warning")
    if outcome == "job":
        ops.event(cluster, job, "JobLevelRestart", f"Restarting all pods of the job: {why}", MANAGER, "Warning")
    else:
        ops.event(cluster, job, "Failed", status["conditions"][-1]["message"], MANAGER, "Warning")


def _clean(cluster: Cluster, job: Obj, pods: list[Obj]) -> None:
    policy = str((job.get("spec") or {}).get("runPolicy", {}).get("cleanPodPolicy") or "All")
    for pod in pods:
        ended = ops.phase(pod) in ("Succeeded", "Failed")
        if policy == "All" or (policy == "OnlyComplete" and ops.phase(pod) == "Succeeded") or \
                (policy != "None" and not ended):
            ops.delete(cluster, POD_KEY, pod)
