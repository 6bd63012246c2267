"""The three custom-resource kinds a training job can be, and how each one reads: pure functions over the
objects the Kubernetes API (or the watch cache) returns, so the verbs and stages never branch on kind.

For each kind: its API identity and CRD, the feature that installs it, where its suspend flag and recovery
budget live, how its status maps onto one phase vocabulary (Pending, Running, Suspended, Restarting,
Succeeded, Failed), where its failure reason is, and how a pod's rank is read from the operator's labels
and names. Nothing here calls an API.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from services.errors import Invalid
from services.training.manifests import SHARED_MOUNT

MANAGED_BY = "app.kubernetes.io/managed-by"
JOB_LABEL = "instantstart.io/job"
RECIPE_LABEL = "instantstart.io/recipe"
MANAGED = "instantstart"
AUTO_RESUME = "sagemaker.amazonaws.com/enable-job-auto-resume"
MAX_RETRY = "sagemaker.amazonaws.com/job-max-retry-count"
PHASES = ("Pending", "Running", "Suspended", "Restarting", "Succeeded", "Failed")
TERMINAL = ("Succeeded", "Failed")


@dataclass(frozen=True)
class JobKind:
    kind: str
    group: str
    version: str
    plural: str
    #: what installs the CRD, named the way the user turns it on
    installed_by: str
    #: the pod containers that run the workload (env is injected there; the first is the log's default)
    main_containers: tuple[str, ...]

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    @property
    def crd(self) -> str:
        return f"{self.plural}.{self.group}"


KINDS: dict[str, JobKind] = {k.kind: k for k in (
    JobKind("HyperPodPyTorchJob", "sagemaker.amazonaws.com", "v1", "hyperpodpytorchjobs",
            "the hyperpod_training_operator feature (PATCH /api/v1/clusters/{cluster}/features)", ("pytorch",)),
    JobKind("PyTorchJob", "kubeflow.org", "v1", "pytorchjobs",
            "the Kubeflow training operator of the cluster's dependencies (reconcile the cluster's dependencies)",
            ("pytorch",)),
    JobKind("RayJob", "ray.io", "v1", "rayjobs",
            "the kuberay_operator feature (PATCH /api/v1/clusters/{cluster}/features)", ("ray-head", "ray-worker")),
)}
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def dns_label(value: str, what: str, limit: int = 63) -> str:
    if not _DNS_LABEL.match(value) or len(value) > limit:
        raise Invalid(f"{what} {value!r} is not a DNS-1123 label: lower-case letters, digits and '-', starting and "
                      f"ending with a letter or digit, at most {limit} characters", details={"value": value})
    return value


def kind_of(manifest: dict[str, Any]) -> JobKind:
    """The manifest's kind, if it is one of ours and its apiVersion matches; else 422 naming the valid ones."""
    kind = KINDS.get(str(manifest.get("kind") or ""))
    valid = ", ".join(f"{k.kind} ({k.api_version})" for k in KINDS.values())
    if kind is None:
        raise Invalid(f"a job manifest's kind is one of {valid}, not {manifest.get('kind')!r}",
                      details={"valid": list(KINDS)})
    if manifest.get("apiVersion") != kind.api_version:
        raise Invalid(f"a {kind.kind} has apiVersion {kind.api_version}, not {manifest.get('apiVersion')!r}")
    if not isinstance(manifest.get("spec"), dict):
        raise Invalid(f"the {kind.kind} manifest has no spec object")
    return kind


def pod_templates(kind: JobKind, manifest: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(replica or group name, pod template) of every pod the job will make, in rank order."""
    spec = manifest.get("spec") or {}
    out: list[tuple[str, dict[str, Any]]] = []
    if kind.kind == "HyperPodPyTorchJob":
        out = [(str(r.get("name", "")), r["template"]) for r in spec.get("replicaSpecs") or []
               if isinstance(r, dict) and isinstance(r.get("template"), dict)]
    elif kind.kind == "PyTorchJob":
        replicas = spec.get("pytorchReplicaSpecs") or {}
        out = [(name.lower(), replicas[name]["template"]) for name in sorted(replicas, key=lambda n: n != "Master")
               if isinstance(replicas[name], dict) and isinstance(replicas[name].get("template"), dict)]
    else:
        cluster = spec.get("rayClusterSpec") or {}
        head = cluster.get("headGroupSpec") or {}
        if isinstance(head.get("template"), dict):
            out.append(("head", head["template"]))
        out += [(str(g.get("groupName", "")), g["template"]) for g in cluster.get("workerGroupSpecs") or []
                if isinstance(g, dict) and isinstance(g.get("template"), dict)]
        if isinstance(spec.get("submitterPodTemplate"), dict):
            out.append(("submitter", spec["submitterPodTemplate"]))
    return out


def renamed_job(value: Any, old: str, new: str) -> Any:
    """``value`` (a spec, a ConfigMap's data) with job ``old``'s folder ``/s3/jobs/<old>`` and its
    ``INSTANTSTART_JOB`` variable renamed for job ``new``: a clone's checkpoints and outputs are its own."""
    folder = re.compile(rf"{re.escape(SHARED_MOUNT)}/jobs/{re.escape(old)}(?![a-z0-9-])")
    if isinstance(value, str):
        return folder.sub(f"{SHARED_MOUNT}/jobs/{new}", value)
    if isinstance(value, list):
        return [renamed_job(v, old, new) for v in value]
    if isinstance(value, dict):
        if value.get("name") == "INSTANTSTART_JOB" and value.get("value") == old:
            return {**value, "value": new}
        return {k: renamed_job(v, old, new) for k, v in value.items()}
    return value


def config_map_refs(kind: JobKind, manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """Every reference to a ConfigMap by name in the pod templates (mutable: renaming one renames the reference):
    ``configMap`` volumes, ``projected`` volumes' ``configMap`` sources, and each container's ``envFrom``
    ``configMapRef`` and ``env`` ``valueFrom.configMapKeyRef``, init containers too."""
    refs: list[dict[str, Any]] = []
    for _, template in pod_templates(kind, manifest):
        spec = template.get("spec") or {}
        for volume in spec.get("volumes") or []:
            if not isinstance(volume, dict):
                continue
            refs += [volume["configMap"]] if isinstance(volume.get("configMap"), dict) else []
            refs += [source["configMap"] for source in (volume.get("projected") or {}).get("sources") or []
                     if isinstance(source, dict) and isinstance(source.get("configMap"), dict)]
        for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
            refs += [e["configMapRef"] for e in container.get("envFrom") or []
                     if isinstance(e, dict) and isinstance(e.get("configMapRef"), dict)]
            refs += [e["valueFrom"]["configMapKeyRef"] for e in container.get("env") or []
                     if isinstance(e, dict) and isinstance((e.get("valueFrom") or {}).get("configMapKeyRef"), dict)]
    return refs


def our_labels(name: str, recipe: str) -> dict[str, str]:
    return {MANAGED_BY: MANAGED, JOB_LABEL: name, RECIPE_LABEL: recipe}


def prepare_manifest(manifest: dict[str, Any], name: str, namespace: str, recipe: str,
                     service_account: str) -> tuple[JobKind, dict[str, Any]]:
    """A copy of ``manifest`` made ours: metadata reduced to name, namespace, labels and annotations (ours
    added), our labels and the job's service account on every pod template. 422 when it is no job of ours
    or has no pod template."""
    kind = kind_of(manifest)
    meta = manifest.get("metadata") or {}
    if meta.get("namespace") not in (None, namespace):
        raise Invalid(f"the manifest says namespace {meta['namespace']!r} but the job is submitted to {namespace!r}: "
                      "drop metadata.namespace or pass namespace")
    labels = {**{str(k): str(v) for k, v in (meta.get("labels") or {}).items()}, **our_labels(name, recipe)}
    out: dict[str, Any] = {"apiVersion": kind.api_version, "kind": kind.kind,
                           "metadata": {"name": name, "namespace": namespace, "labels": labels},
                           "spec": _copy(manifest["spec"])}
    if meta.get("annotations"):
        out["metadata"]["annotations"] = {str(k): str(v) for k, v in meta["annotations"].items()}
    templates = pod_templates(kind, out)
    if not templates:
        raise Invalid(f"the {kind.kind} manifest has no pod template (spec's replica or group specs)")
    for _, template in templates:
        tmeta = template.setdefault("metadata", {})
        tmeta["labels"] = {**(tmeta.get("labels") or {}), **our_labels(name, recipe)}
        template.setdefault("spec", {}).setdefault("serviceAccountName", service_account)
    return kind, out


def inject_env(kind: JobKind, manifest: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """A copy with ``env`` set in the main container(s) of every pod template (an existing variable of the
    same name is replaced): how the MLflow run's settings reach the workload."""
    if not env:
        return manifest
    out: dict[str, Any] = _copy(manifest)
    for _, template in pod_templates(kind, out):
        containers = (template.get("spec") or {}).get("containers") or []
        main = [c for c in containers if c.get("name") in kind.main_containers] or containers[:1]
        for container in main:
            kept = [e for e in container.get("env") or [] if e.get("name") not in env]
            container["env"] = kept + [{"name": k, "value": v} for k, v in sorted(env.items())]
    return out


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


# ----- reading a job object ------------------------------------------------------------------------------


def suspend_patch(kind: JobKind, suspend: bool) -> dict[str, Any]:
    if kind.kind == "RayJob":
        return {"spec": {"suspend": suspend}}
    return {"spec": {"runPolicy": {"suspend": suspend}}}


def suspended(kind: JobKind, obj: dict[str, Any]) -> bool:
    spec = obj.get("spec") or {}
    flag = spec.get("suspend") if kind.kind == "RayJob" else (spec.get("runPolicy") or {}).get("suspend")
    return bool(flag)


def _conditions(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in (obj.get("status") or {}).get("conditions") or [] if isinstance(c, dict)]


def _true(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {str(c.get("type")): c for c in _conditions(obj) if str(c.get("status")) == "True"}


def phase(kind: JobKind, obj: dict[str, Any]) -> str:
    """One phase for every kind, from the operator's status (Pending until the operator says more)."""
    status = obj.get("status") or {}
    if kind.kind == "RayJob":
        deployment = str(status.get("jobDeploymentStatus") or "")
        job_status = str(status.get("jobStatus") or "")
        if deployment == "Failed" or job_status in ("FAILED", "STOPPED"):
            return "Failed"
        if deployment == "Complete" or job_status == "SUCCEEDED":
            return "Succeeded"
        if deployment in ("Suspended", "Suspending"):
            return "Suspended"
        if deployment == "Retrying":
            return "Restarting"
        if deployment == "Running" or job_status == "RUNNING":
            return "Running"
        return "Suspended" if suspended(kind, obj) else "Pending"
    true = _true(obj)
    for types, name in ((("Failed",), "Failed"), (("Succeeded", "Completed", "Complete"), "Succeeded"),
                        (("Suspended",), "Suspended"), (("Restarting",), "Restarting"),
                        (("Running", "PodsRunning"), "Running")):
        if any(t in true for t in types):
            return name
    return "Suspended" if suspended(kind, obj) else "Pending"


def failure_reason(kind: JobKind, obj: dict[str, Any]) -> str | None:
    """Why the job failed (or is failing): its Failed condition, or a RayJob's ``status.message``."""
    status = obj.get("status") or {}
    if kind.kind == "RayJob":
        if phase(kind, obj) != "Failed":
            return None
        text = " ".join(str(status.get(k)) for k in ("reason", "message") if status.get(k))
        return text or f"jobDeploymentStatus {status.get('jobDeploymentStatus')}, jobStatus {status.get('jobStatus')}"
    failed = _true(obj).get("Failed")
    if failed is None:
        return None
    return ": ".join(str(failed[k]) for k in ("reason", "message") if failed.get(k)) or "Failed"


def conditions(obj: dict[str, Any]) -> list[dict[str, str]]:
    return [{k: str(c.get(k) or "") for k in ("type", "status", "reason", "message", "lastTransitionTime")}
            for c in _conditions(obj)]


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def budget(kind: JobKind, obj: dict[str, Any], pod_restarts: int = 0) -> dict[str, Any]:
    """Restarts used against the job's recovery budget, and where each number comes from.

    HyperPodPyTorchJob: ``status.restartCount`` against ``runPolicy.jobMaxRetryCount``, and full-job
    restarts (``status.restartStatus.fullJobRestartCount``) against ``restartPolicy.maxFullJobRestarts``.
    Kubeflow PyTorchJob: HyperPod auto-resume's ``job-max-retry-count`` annotation; used is the most any
    of its pods' containers restarted (the operator restarts them in place, OnFailure). RayJob: retries
    against ``spec.backoffLimit`` (KubeRay retries a failed attempt while ``status.failed`` <= backoffLimit, so
    retries used = ``status.failed``, at most the limit: a job that failed its last try used them all)."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    if kind.kind == "HyperPodPyTorchJob":
        run = spec.get("runPolicy") or {}
        restart = status.get("restartStatus") or {}
        used = _int(status.get("restartCount"))
        return {"used": used if used is not None else _int(restart.get("restartCount")) or 0,
                "limit": _int(run.get("jobMaxRetryCount")),
                "full_job_restarts_used": _int(restart.get("fullJobRestartCount")) or 0,
                "full_job_restarts_limit": _int((run.get("restartPolicy") or {}).get("maxFullJobRestarts")),
                "source": "status.restartCount / spec.runPolicy.jobMaxRetryCount"}
    if kind.kind == "PyTorchJob":
        on = str(annotations.get(AUTO_RESUME, "")).lower() == "true"
        return {"used": pod_restarts, "limit": _int(annotations.get(MAX_RETRY)) if on else None,
                "source": f"pod container restarts / annotation {MAX_RETRY}" if on
                else "pod container restarts (HyperPod auto-resume is off: no budget)"}
    failed, limit = _int(status.get("failed")) or 0, _int(spec.get("backoffLimit"))
    return {"used": failed if limit is None else min(failed, limit), "limit": limit,
            "source": "status.failed (retries, at most the limit) / spec.backoffLimit"}


def rank_of(kind: JobKind, job: dict[str, Any], pod: dict[str, Any]) -> tuple[str | None, int | None]:
    """(replica or group, global rank) of one of the job's pods, from the operator's labels and names."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    name = str((pod.get("metadata") or {}).get("name") or "")
    job_name = str((job.get("metadata") or {}).get("name") or "")
    if kind.kind == "PyTorchJob":
        replica = labels.get("training.kubeflow.org/replica-type")
        index = _int(labels.get("training.kubeflow.org/replica-index"))
        if replica is None or index is None:
            return replica, None
        return replica, index if replica == "master" else index + 1
    if kind.kind == "HyperPodPyTorchJob":
        offset = 0
        for spec in (job.get("spec") or {}).get("replicaSpecs") or []:
            replica = str(spec.get("name", ""))
            prefix = f"{job_name}-{replica}-"
            index = _int(name[len(prefix):]) if name.startswith(prefix) else None
            if index is not None:
                return replica, offset + index
            offset += _int(spec.get("replicas")) or 0
        return None, None
    node_type = labels.get("ray.io/node-type")
    if node_type == "head":
        return "head", 0
    if node_type == "worker":
        return labels.get("ray.io/group"), None
    return "submitter", None
