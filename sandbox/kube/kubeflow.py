"""The Kubeflow training operator of the sandbox: ``PyTorchJob`` (``kubeflow.org/v1``), with HyperPod's job
auto-resume.

It acts only where the ``pytorchjobs.kubeflow.org`` CRD is installed (the ``training-operator`` component).
Per job it makes ``<job>-master-0`` and ``<job>-worker-<i>`` from ``pytorchReplicaSpecs`` (labels
``training.kubeflow.org/job-name``, ``replica-type`` ``master``/``worker``, ``replica-index``; the template's
labels copied; env ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``, ``RANK`` — master 0, worker i -> i+1 —
and torchrun's ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK`` when ``nprocPerNode`` is set), each
replica's ``restartPolicy`` on its pods (``OnFailure``: the kubelet restarts a failed container in place).
Status: conditions ``Created``, ``Running``, ``Restarting``, ``Succeeded`` (the master succeeded),
``Failed`` (a pod failed for good), ``replicaStatuses`` {Master, Worker: active/succeeded/failed}, times.
``runPolicy.suspend`` deletes the pods (``Suspended``) and resuming recreates them; ``runPolicy.cleanPodPolicy``
(``None`` default, ``Running``, ``All``) applies once the job ended; ``runPolicy.backoffLimit`` fails the job
once its pods' containers restarted that many times.

HyperPod auto-resume: with ``sagemaker.amazonaws.com/enable-job-auto-resume: "true"``, a node fault (the
pod's node NotReady, gone or labelled unhealthy) restarts the whole job away from the faulty nodes
(``Restarting``, event ``NodeFault``), at most ``sagemaker.amazonaws.com/job-max-retry-count`` times; then the
job is ``Failed`` with a message naming that budget. The count so far is kept in the job's annotation
``sandbox.instantstart.io/auto-resume-count`` (where the real feature keeps it is not public).
"""

from __future__ import annotations

from typing import Any

from . import operator_support as ops
from .cluster import Cluster, WriteOptions, clone
from .errors import ApiError
from .resources import POD_KEY
from .store import Key, Loc, Obj

KEY: Key = ("kubeflow.org", "pytorchjobs")
KIND = "PyTorchJob"
MANAGER = "pytorchjob-controller"
AUTO_RESUME = "sagemaker.amazonaws.com/enable-job-auto-resume"
MAX_RETRY = "sagemaker.amazonaws.com/job-max-retry-count"
RESUMES = "sandbox.instantstart.io/auto-resume-count"
DEFAULT_PORT = 23456
_REPLICA_TYPES = ("Master", "Worker")


def _port(template: dict[str, Any]) -> int:
    for container in (template.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == "pytorchjob-port":
                return int(port["containerPort"])
    return DEFAULT_PORT


def _desired(job: Obj, attempt: str, avoid: list[str]) -> list[Obj]:
    name = job["metadata"]["name"]
    spec = job.get("spec") or {}
    replicas = spec.get("pytorchReplicaSpecs") or {}
    counts = {t: int((replicas.get(t) or {}).get("replicas", 1 if t == "Master" else 0)) for t in _REPLICA_TYPES
              if t in replicas}
    world = sum(counts.values())
    master_tpl = (replicas.get("Master") or {}).get("template") or {}
    nproc = spec.get("nprocPerNode")
    pods = []
    for rtype, count in counts.items():
        rspec = replicas[rtype]
        for i in range(count):
            rank = i if rtype == "Master" else i + counts.get("Master", 0)
            lower = rtype.lower()
            labels = {"training.kubeflow.org/job-name": name, "training.kubeflow.org/operator-name": MANAGER,
                      "training.kubeflow.org/replica-type": lower, "training.kubeflow.org/replica-index": str(i)}
            if rtype == "Master":
                labels["training.kubeflow.org/job-role"] = "master"
            body = ops.pod_body(job, rspec.get("template") or {}, f"{name}-{lower}-{i}", labels, {ops.ATTEMPT: attempt})
            pod_spec = body["spec"]
            pod_spec["restartPolicy"] = rspec.get("restartPolicy") or "Never"
            pod_spec.setdefault("hostname", body["metadata"]["name"])
            ops.avoid_nodes(pod_spec, avoid)
            env = {"MASTER_ADDR": f"{name}-master-0" if "Master" in counts else "localhost",
                   "MASTER_PORT": str(_port(master_tpl)), "WORLD_SIZE": str(world), "RANK": str(rank),
                   "PYTHONUNBUFFERED": "1"}
            if nproc is not None:
                env.update({"PET_NNODES": str(world), "PET_NPROC_PER_NODE": str(nproc), "PET_NODE_RANK": str(rank),
                            "PET_MASTER_ADDR": env["MASTER_ADDR"], "PET_MASTER_PORT": env["MASTER_PORT"]})
            for container in pod_spec.get("containers") or []:
                ops.set_env(container, env)
            pods.append(body)
    return pods


def _finished(job: Obj) -> bool:
    return ops.has(job, "Succeeded") or ops.has(job, "Failed")


def reconcile(cluster: Cluster, loc: Loc) -> None:
    job = cluster.store.get(KEY, loc)
    if job is None or job["metadata"].get("deletionTimestamp") or cluster.find_kind("kubeflow.org/v1", KIND) is None:
        return
    now = cluster.now_iso()
    name = loc[1]
    spec = job.get("spec") or {}
    run_policy = spec.get("runPolicy") or {}
    status = clone(job.get("status") or {})
    conditions = {c["type"]: c for c in status.get("conditions") or []}
    pods = ops.owned_pods(cluster, job)
    if _finished(job):
        status["replicaStatuses"] = _replica_statuses(pods)  # the other replicas still finish
        ops.write_status(cluster, KEY, job, status, MANAGER)
        _clean(cluster, run_policy, pods)
        return
    if "Created" not in conditions:
        conditions["Created"] = ops.condition(job, "Created", ops.TRUE, "PyTorchJobCreated",
                                              f"PyTorchJob {name} is created.", now)
    status.setdefault("startTime", now)
    if run_policy.get("suspend"):
        for pod in pods:
            ops.delete(cluster, POD_KEY, pod)
        conditions.pop("Running", None)
        conditions["Suspended"] = ops.condition(job, "Suspended", ops.TRUE, "PyTorchJobSuspended",
                                                f"PyTorchJob {name} is suspended.", now)
        status["conditions"] = list(conditions.values())
        ops.write_status(cluster, KEY, job, status, MANAGER)
        return
    if "Suspended" in conditions:
        conditions["Suspended"] = ops.condition(job, "Suspended", "False", "PyTorchJobResumed",
                                                f"PyTorchJob {name} is resumed.", now)
    annotations = job["metadata"].get("annotations") or {}
    attempt = annotations.get(RESUMES, "0")
    stale = [p for p in pods if (p["metadata"].get("annotations") or {}).get(ops.ATTEMPT) != attempt]
    current = [p for p in pods if p not in stale]
    faulty = ops.faulty_nodes(cluster)
    faults = {p["metadata"]["name"]: why for p in current if (why := ops.pod_fault(cluster, p, faulty))}
    if faults and annotations.get(AUTO_RESUME) == "true":
        _auto_resume(cluster, job, status, conditions, faults, int(attempt), now)
        return
    for pod in stale:
        ops.delete(cluster, POD_KEY, pod)
    desired = _desired(job, attempt, sorted(faulty))
    names = {p["metadata"]["name"] for p in current}
    if not stale:
        for body in desired:
            if body["metadata"]["name"] not in names:
                message = ops.create(cluster, POD_KEY, loc[0], body, MANAGER)
                if message:
                    ops.event(cluster, job, "FailedCreate", message, MANAGER, "Warning")
    _progress(job, status, conditions, current, desired, now)
    ops.write_status(cluster, KEY, job, status, MANAGER)


def _replica_statuses(pods: list[Obj]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for pod in pods:
        rtype = (pod["metadata"].get("labels") or {}).get("training.kubeflow.org/replica-type", "").capitalize()
        entry = out.setdefault(rtype, {"active": 0, "succeeded": 0, "failed": 0})
        ph = ops.phase(pod)
        entry["succeeded" if ph == "Succeeded" else "failed" if ph == "Failed" else "active"] += 1
    if "Worker" in out and pods:
        job = (pods[0]["metadata"].get("labels") or {}).get("training.kubeflow.org/job-name", "")
        out["Worker"]["selector"] = (f"training.kubeflow.org/job-name={job},training.kubeflow.org/operator-name="
                                     f"{MANAGER},training.kubeflow.org/replica-type=worker")
    return out


def _progress(job: Obj, status: dict[str, Any], conditions: dict[str, dict[str, Any]], pods: list[Obj],
              desired: list[Obj], now: str) -> None:
    name = job["metadata"]["name"]
    status["replicaStatuses"] = _replica_statuses(pods)
    status["lastReconcileTime"] = status.get("lastReconcileTime") or now
    by_name = {p["metadata"]["name"]: p for p in pods}
    master = by_name.get(f"{name}-master-0")
    failed = [p for p in pods if ops.phase(p) == "Failed"]
    restarts = sum(int(c.get("restartCount") or 0) for p in pods
                   for c in (p.get("status") or {}).get("containerStatuses") or [])
    limit = ((job.get("spec") or {}).get("runPolicy") or {}).get("backoffLimit")
    if limit is not None and restarts >= int(limit) and not (master and ops.phase(master) == "Succeeded"):
        _end(job, conditions, "Failed", "PyTorchJobFailed",
             f"PyTorchJob {name} has failed because it has reached the specified backoff limit", now)
        status["completionTime"] = now
    elif failed:
        kinds = sorted({(p["metadata"].get("labels") or {}).get("training.kubeflow.org/replica-type", "")
                        .capitalize() for p in failed})
        message = f"PyTorchJob {name} is failed because {len(failed)} {'/'.join(kinds)} replica(s) failed."
        _end(job, conditions, "Failed", "PyTorchJobFailed", message, now)
        status["completionTime"] = now
    elif master is not None and ops.phase(master) == "Succeeded":
        _end(job, conditions, "Succeeded", "PyTorchJobSucceeded", f"PyTorchJob {name} is successfully completed.",
             now)
        status["completionTime"] = now
    elif len(pods) == len(desired) and desired and all(ops.phase(p) == "Running" for p in pods):
        conditions.pop("Restarting", None)
        conditions["Running"] = ops.condition(job, "Running", ops.TRUE, "PyTorchJobRunning",
                                              f"PyTorchJob {name} is running.", now)
    status["conditions"] = list(conditions.values())


def _end(job: Obj, conditions: dict[str, dict[str, Any]], ctype: str, reason: str, message: str, now: str) -> None:
    if "Running" in conditions:
        conditions["Running"] = ops.condition(job, "Running", "False", reason, message, now)
    conditions.pop("Restarting", None)
    conditions[ctype] = ops.condition(job, ctype, ops.TRUE, reason, message, now)


def _auto_resume(cluster: Cluster, job: Obj, status: dict[str, Any], conditions: dict[str, dict[str, Any]],
                 faults: dict[str, str], done: int, now: str) -> None:
    name = job["metadata"]["name"]
    annotations = job["metadata"].get("annotations") or {}
    try:
        budget = int(annotations.get(MAX_RETRY, "1"))
    except ValueError:
        budget = 1
    why = "; ".join(f"pod {pod}: {reason}" for pod, reason in sorted(faults.items()))
    if done >= budget:
        message = f"job-max-retry-count ({budget}) exhausted after {done} auto-resumes: {why}"
        _end(job, conditions, "Failed", "PyTorchJobFailed", message, now)
        status["conditions"] = list(conditions.values())
        status["completionTime"] = now
        if ops.write_status(cluster, KEY, job, status, MANAGER):
            ops.event(cluster, job, "NodeFault", f"{why}; no auto-resume left", MANAGER, "Warning")
        return
    conditions.pop("Running", None)
    conditions["Restarting"] = ops.condition(job, "Restarting", ops.TRUE, "PyTorchJobRestarting",
                                             f"PyTorchJob {name} is restarting ({done + 1}/{budget}): {why}", now)
    status["conditions"] = list(conditions.values())
    rt = cluster.lookup("kubeflow.org", "v1", "pytorchjobs")
    try:  # the count first: a crash between the two writes must not lose a spent retry
        cluster.patch(rt, job["metadata"]["namespace"], name, "merge",
                      {"metadata": {"annotations": {RESUMES: str(done + 1)},
                                    "resourceVersion": job["metadata"]["resourceVersion"]}},
                      WriteOptions(manager=MANAGER))
    except ApiError:
        return  # changed meanwhile: reconciled again on its event
    fresh = cluster.store.get(KEY, (job["metadata"]["namespace"], name)) or job
    ops.write_status(cluster, KEY, fresh, status, MANAGER)
    ops.event(cluster, job, "NodeFault", f"{why}; restarting the job on other nodes", MANAGER, "Warning")


def _clean(cluster: Cluster, run_policy: dict[str, Any], pods: list[Obj]) -> None:
    policy = str(run_policy.get("cleanPodPolicy") or "None")
    for pod in pods:
        if policy == "All" or (policy == "Running" and ops.phase(pod) in ("Pending", "Running")):
            ops.delete(cluster, POD_KEY, pod)
