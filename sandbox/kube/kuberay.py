"""The KubeRay operator of the sandbox: ``RayJob`` and the ``RayCluster`` it runs on (``ray.io/v1``).

It acts only where the KubeRay CRDs are installed (the ``kuberay`` component). A RayJob gets a RayCluster
``<job>-raycluster`` (its head pod ``<job>-raycluster-head``, workers ``<job>-raycluster-<group>-worker-<i>``,
labels ``ray.io/cluster``, ``ray.io/node-type`` head/worker, ``ray.io/group`` and the templates' labels);
once the cluster is ready, the submitter Job ``<job>`` whose pod runs
``ray job submit --address http://<head>:8265 --submission-id <id> -- <entrypoint>`` — a recognised training
entrypoint (e.g. ``python3 -m verl.trainer.main_ppo ...``) runs as the simulated trainer, so the driver's log
is that pod's log. ``status.jobStatus`` PENDING -> RUNNING -> SUCCEEDED | FAILED (STOPPED when suspended),
``jobDeploymentStatus`` Initializing -> Running -> Complete | Failed (Retrying between attempts, Suspended),
``failed``/``succeeded``, ``message``, ``startTime``/``endTime``, ``rayClusterName``, ``jobId``,
``dashboardURL`` and ``rayClusterStatus``. ``backoffLimit`` failed attempts are retried, each on a new
RayCluster and submitter; ``shutdownAfterJobFinishes`` deletes the RayCluster once the job ended;
``suspend`` deletes the cluster and the submitter and resuming starts over.

Not simulated: the head service and dashboard (the URL is named, nothing answers it), ``ttlSecondsAfterFinished``
(the cluster goes as soon as the job ended), autoscaling, ``submissionMode`` other than the K8s Job, and the
ray processes in the head and worker containers (they just run).
"""

from __future__ import annotations

import hashlib
from typing import Any

from . import operator_support as ops
from .cluster import Cluster, WriteOptions, clone
from .errors import ApiError
from .resources import POD_KEY
from .store import Key, Loc, Obj

KEY: Key = ("ray.io", "rayjobs")
CLUSTER_KEY: Key = ("ray.io", "rayclusters")
JOB_KEY: Key = ("batch", "jobs")
KIND, CLUSTER_KIND = "RayJob", "RayCluster"
MANAGER = "ray-operator"
DASHBOARD_PORT = 8265
SUBMITTER = "ray-job-submitter"


def _installed(cluster: Cluster) -> bool:
    return cluster.find_kind("ray.io/v1", KIND) is not None


# --- RayCluster ---------------------------------------------------------------------------------------------


def _ray_pods(rc: Obj) -> list[Obj]:
    name = rc["metadata"]["name"]
    spec = rc.get("spec") or {}
    head = spec.get("headGroupSpec") or {}
    common = {"ray.io/cluster": name, "ray.io/is-ray-node": "yes", "app.kubernetes.io/created-by": "kuberay-operator",
              "app.kubernetes.io/name": "kuberay"}
    pods = [ops.pod_body(rc, head.get("template") or {}, f"{name}-head",
                         {**common, "ray.io/node-type": "head", "ray.io/group": "headgroup"}, {})]
    for group in spec.get("workerGroupSpecs") or []:
        gname = str(group.get("groupName", "workergroup"))
        count = 0 if group.get("suspend") else int(group.get("replicas", group.get("minReplicas", 0)) or 0)
        for i in range(count):
            pods.append(ops.pod_body(rc, group.get("template") or {}, f"{name}-{gname}-worker-{i}",
                                     {**common, "ray.io/node-type": "worker", "ray.io/group": gname}, {}))
    for pod in pods:
        pod["spec"].setdefault("restartPolicy", "Always")
        for container in pod["spec"].get("containers") or []:
            ops.set_env(container, {"RAY_CLUSTER_NAME": name, "RAY_ADDRESS": f"{name}-head-svc:6379"})
    return pods


def reconcile_raycluster(cluster: Cluster, loc: Loc) -> None:
    rc = cluster.store.get(CLUSTER_KEY, loc)
    if rc is None or rc["metadata"].get("deletionTimestamp") or not _installed(cluster):
        return
    now = cluster.now_iso()
    pods = {p["metadata"]["name"]: p for p in ops.owned_pods(cluster, rc)}
    desired = _ray_pods(rc)
    if not (rc.get("spec") or {}).get("suspend"):
        for body in desired:
            name = body["metadata"]["name"]
            if name not in pods:
                ops.create(cluster, POD_KEY, loc[0], body, MANAGER)
            elif ops.phase(pods[name]) in ("Failed", "Succeeded"):
                ops.delete(cluster, POD_KEY, pods[name])  # a ray node that ended is replaced
    else:
        for pod in pods.values():
            ops.delete(cluster, POD_KEY, pod)
    workers = [p for n, p in pods.items() if (p["metadata"].get("labels") or {}).get("ray.io/node-type") == "worker"]
    head = pods.get(f"{loc[1]}-head")
    running = [p for p in pods.values() if ops.phase(p) == "Running"]
    ready = bool(desired) and len(running) == len(desired) and (rc.get("spec") or {}).get("suspend") is not True
    status = clone(rc.get("status") or {})
    want = len(desired) - 1
    status.update({"desiredWorkerReplicas": want, "minWorkerReplicas": want, "maxWorkerReplicas": want,
                   "availableWorkerReplicas": sum(1 for p in workers if ops.phase(p) == "Running"),
                   "readyWorkerReplicas": sum(1 for p in workers if ops.phase(p) == "Running"),
                   "endpoints": {"client": "10001", "dashboard": str(DASHBOARD_PORT), "gcs-server": "6379",
                                 "metrics": "8080"},
                   "head": {"podName": f"{loc[1]}-head", "serviceName": f"{loc[1]}-head-svc",
                            **({"podIP": head["status"]["podIP"]} if head and (head.get("status") or {}).get("podIP")
                               else {})},
                   "observedGeneration": rc["metadata"].get("generation", 1)})
    state = "suspended" if (rc.get("spec") or {}).get("suspend") else "ready" if ready else ""
    if state:
        status["state"] = state
    elif "state" in status and status["state"] != "ready":
        status.pop("state")
    if state == "ready" and "ready" not in (status.get("stateTransitionTimes") or {}):
        status["stateTransitionTimes"] = {**(status.get("stateTransitionTimes") or {}), "ready": now}
    status["conditions"] = [
        _ray_condition(rc, "HeadPodReady", bool(head and ops.phase(head) == "Running"), "HeadPodRunningAndReady",
                       now),
        _ray_condition(rc, "RayClusterProvisioned", ready, "AllPodRunningAndReadyFirstTime", now)]
    ops.write_status(cluster, CLUSTER_KEY, rc, status, MANAGER)


def _ray_condition(obj: Obj, ctype: str, ok: bool, reason: str, now: str) -> dict[str, Any]:
    cond = ops.condition(obj, ctype, ops.TRUE if ok else "False", reason if ok else "Pending", "", now)
    cond.pop("lastUpdateTime", None)
    return cond


# --- RayJob -------------------------------------------------------------------------------------------------


def _cluster_name(job: Obj) -> str:
    return f"{job['metadata']['name']}-raycluster"


def _job_id(job: Obj, attempt: int) -> str:
    digest = hashlib.sha256(f"{job['metadata']['uid']}/{attempt}".encode()).hexdigest()[:5]
    return f"{job['metadata']['name']}-{digest}"


def _raycluster_body(job: Obj, attempt: int) -> Obj:
    spec = clone((job.get("spec") or {}).get("rayClusterSpec") or {})
    body = ops.pod_body(job, {"metadata": {"labels": {"ray.io/originated-from-crd": KIND}}}, _cluster_name(job),
                        {"ray.io/originated-from-cr-name": job["metadata"]["name"]}, {ops.ATTEMPT: str(attempt)})
    return {"apiVersion": "ray.io/v1", "kind": CLUSTER_KIND, "metadata": body["metadata"], "spec": spec}


def _submitter_body(job: Obj, attempt: int) -> Obj:
    spec = job.get("spec") or {}
    name = job["metadata"]["name"]
    url = f"http://{_cluster_name(job)}-head-svc.{job['metadata']['namespace']}.svc.cluster.local:{DASHBOARD_PORT}"
    command = f"ray job submit --address {url} --submission-id {_job_id(job, attempt)} -- {spec.get('entrypoint', '')}"
    template = clone(spec.get("submitterPodTemplate") or {})
    if not template:
        head = (((spec.get("rayClusterSpec") or {}).get("headGroupSpec") or {}).get("template") or {})
        head_container = ((head.get("spec") or {}).get("containers") or [{}])[0]
        template = {"metadata": {"labels": (head.get("metadata") or {}).get("labels") or {}},
                    "spec": {"restartPolicy": "Never", "containers": [{
                        "name": SUBMITTER, "image": head_container.get("image", "rayproject/ray:2.9.0"),
                        "env": clone(head_container.get("env") or []),
                        "resources": {"requests": {"cpu": "500m", "memory": "200Mi"}}}]}}
    template.setdefault("spec", {})["restartPolicy"] = "Never"
    template.setdefault("metadata", {}).setdefault("labels", {})
    for container in template["spec"].get("containers") or []:
        container["command"] = ["/bin/sh", "-c", command]
        container.pop("args", None)
        ops.set_env(container, {"RAY_DASHBOARD_ADDRESS": url, "RAY_JOB_SUBMISSION_ID": _job_id(job, attempt)})
    meta = ops.pod_body(job, {}, name, {"ray.io/originated-from-cr-name": name}, {ops.ATTEMPT: str(attempt)})
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta["metadata"],
            "spec": {"backoffLimit": 0, "template": template}}


def _attempt_of(obj: Obj | None) -> str | None:
    return None if obj is None else (obj["metadata"].get("annotations") or {}).get(ops.ATTEMPT)


def reconcile_rayjob(cluster: Cluster, loc: Loc) -> None:
    job = cluster.store.get(KEY, loc)
    if job is None or job["metadata"].get("deletionTimestamp") or not _installed(cluster):
        return
    now = cluster.now_iso()
    spec = job.get("spec") or {}
    status = clone(job.get("status") or {})
    deployment = status.get("jobDeploymentStatus", "")
    attempt = int(status.get("failed") or 0)
    rc = cluster.store.get(CLUSTER_KEY, (loc[0], _cluster_name(job)))
    submitter = cluster.store.get(JOB_KEY, loc)
    if deployment in ("Complete", "Failed"):
        if spec.get("shutdownAfterJobFinishes") and rc is not None:
            ops.delete(cluster, CLUSTER_KEY, rc)
        return
    if spec.get("suspend"):
        for obj, key in ((rc, CLUSTER_KEY), (submitter, JOB_KEY)):
            if obj is not None:
                ops.delete(cluster, key, obj)
        status.update({"jobDeploymentStatus": "Suspended", "jobStatus": "STOPPED",
                       "message": f"RayJob {loc[1]} is suspended."})
        status.pop("rayClusterStatus", None)
        ops.write_status(cluster, KEY, job, status, MANAGER)
        return
    stale = [(o, k) for o, k in ((rc, CLUSTER_KEY), (submitter, JOB_KEY)) if o is not None and
             (_attempt_of(o) != str(attempt) or deployment in ("Suspended", "Retrying"))]
    if stale:  # a previous attempt's (or the suspended run's) objects go before the next ones are made
        for obj, key in stale:
            ops.delete(cluster, key, obj)
        return
    if deployment in ("", "Suspended", "Retrying", "New"):
        status.update({"jobDeploymentStatus": "Initializing", "jobStatus": "PENDING", "message": "",
                       "rayClusterName": _cluster_name(job), "jobId": _job_id(job, attempt),
                       "dashboardURL": f"{_cluster_name(job)}-head-svc.{loc[0]}.svc.cluster.local:{DASHBOARD_PORT}"})
        status.setdefault("startTime", now)
        status.setdefault("failed", 0)
        status.setdefault("succeeded", 0)
        ops.write_status(cluster, KEY, job, status, MANAGER)
        return
    if rc is None:
        message = ops.create(cluster, CLUSTER_KEY, loc[0], _raycluster_body(job, attempt), MANAGER)
        if message:
            ops.event(cluster, job, "FailedToCreateRayCluster", message, MANAGER, "Warning")
        return
    status["rayClusterStatus"] = {k: v for k, v in (rc.get("status") or {}).items() if k != "stateTransitionTimes"}
    if (rc.get("status") or {}).get("state") != "ready":
        ops.write_status(cluster, KEY, job, status, MANAGER)
        return
    if submitter is None:
        message = ops.create(cluster, JOB_KEY, loc[0], _submitter_body(job, attempt), MANAGER)
        if message:
            ops.event(cluster, job, "FailedToCreateSubmitterJob", message, MANAGER, "Warning")
        else:
            ops.event(cluster, job, "Created", f"Created Kubernetes Job {loc[1]}", MANAGER)
        status["jobDeploymentStatus"] = "Running"
        ops.write_status(cluster, KEY, job, status, MANAGER)
        return
    _follow_submitter(cluster, job, status, submitter, now)


def _follow_submitter(cluster: Cluster, job: Obj, status: dict[str, Any], submitter: Obj, now: str) -> None:
    """The job's state from its submitter's pod: running, succeeded, or failed (retried within backoffLimit)."""
    pods = ops.owned_pods(cluster, submitter)
    ended = next((p for p in pods if ops.phase(p) in ("Succeeded", "Failed")), None)
    name = job["metadata"]["name"]
    status["jobDeploymentStatus"] = "Running"
    if ended is None:
        if any(ops.phase(p) == "Running" for p in pods):
            status["jobStatus"] = "RUNNING"
            status.setdefault("rayJobInfo", {"startTime": now})
        ops.write_status(cluster, KEY, job, status, MANAGER)
        return
    if not (submitter.get("spec") or {}).get("suspend"):  # no further submitter pods: this attempt is over
        _suspend_submitter(cluster, submitter)
    if ops.phase(ended) == "Succeeded":
        status.update({"jobStatus": "SUCCEEDED", "jobDeploymentStatus": "Complete", "endTime": now,
                       "succeeded": int(status.get("succeeded") or 0) + 1,
                       "message": "Job finished successfully.",
                       "rayJobInfo": {**(status.get("rayJobInfo") or {"startTime": now}), "endTime": now}})
        if ops.write_status(cluster, KEY, job, status, MANAGER):
            ops.event(cluster, job, "Completed", f"RayJob {name} has succeeded", MANAGER)
        return
    terminated = next((c.get("state", {}).get("terminated") for c in (ended.get("status") or {}).get(
        "containerStatuses") or [] if "terminated" in (c.get("state") or {})), None) or {}
    failed = int(status.get("failed") or 0) + 1
    message = (f"Job entrypoint command failed with exit code {terminated.get('exitCode', 1)}; "
               f"the driver's log is in pod {ended['metadata']['name']}")
    status.update({"failed": failed, "message": message, "jobStatus": "FAILED"})
    limit = int((job.get("spec") or {}).get("backoffLimit") or 0)
    if failed <= limit:
        status["jobDeploymentStatus"] = "Retrying"
        if ops.write_status(cluster, KEY, job, status, MANAGER):
            ops.event(cluster, job, "Retrying", f"RayJob {name} attempt {failed} failed; retrying "
                      f"({failed}/{limit})", MANAGER, "Warning")
        return
    status.update({"jobDeploymentStatus": "Failed", "endTime": now, "reason": "AppFailed"})
    if ops.write_status(cluster, KEY, job, status, MANAGER):
        ops.event(cluster, job, "Failed", message, MANAGER, "Warning")


def _suspend_submitter(cluster: Cluster, submitter: Obj) -> None:
    """Stop the submitter Job making pods (the ended pod and its log stay)."""
    meta = submitter["metadata"]
    try:
        cluster.patch(cluster.builtin(*JOB_KEY), meta["namespace"], meta["name"], "merge", {"spec": {"suspend": True}},
                      WriteOptions(manager=MANAGER))
    except ApiError:
        return

