"""The three training custom resources the product submits, built from decisions a recipe has already made.

A builder takes a :class:`PodPlan` (image, command, env, the instance type's GPU/EFA facts) and a
:class:`RenderContext` (cluster, namespace, job name, what the cluster offers) and returns the manifest as a plain
dict: ``HyperPodPyTorchJob`` (HyperPod training operator, with its recovery budget and log-monitoring rules),
Kubeflow ``PyTorchJob`` (with HyperPod's auto-resume annotations) and KubeRay ``RayJob``. Every resource and every
pod template in it carries the contract's labels, mounts the shared claim at ``/s3`` and runs as the training
service account. Builders never read the cluster and never raise on a decision: checking inputs is the recipes'
job (``services/training/recipes``), checking the result is ``validate.py``'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, Field

from services.models import TRAINING_SERVICE_ACCOUNT

MANAGED_BY = "app.kubernetes.io/managed-by"
JOB_LABEL = "instantstart.io/job"
RECIPE_LABEL = "instantstart.io/recipe"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
HEALTH_LABEL = "sagemaker.amazonaws.com/node-health-status"
DEEP_HEALTH_LABEL = "sagemaker.amazonaws.com/deep-health-check-status"
GPU = "nvidia.com/gpu"
EFA = "vpc.amazonaws.com/efa"
NEURON = "aws.amazon.com/neurondevice"
SHARED_MOUNT = "/s3"
HYPERPOD_LOG_DIR = "/tmp/hyperpod"
AGENT_PORT = 8080  # the HyperPod elastic agent's server (hyperpodrun --server-port)
AUTO_RESUME = "sagemaker.amazonaws.com/enable-job-auto-resume"
AUTO_RESUME_RETRIES = "sagemaker.amazonaws.com/job-max-retry-count"

OPERATOR_HPTO = "hyperpod-training-operator"
OPERATOR_KUBEFLOW = "kubeflow"
OPERATOR_KUBERAY = "kuberay"


@dataclass(frozen=True)
class Kind:
    kind: str
    api_version: str
    plural: str

    @property
    def group(self) -> str:
        return self.api_version.split("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.split("/")[1]


HYPERPOD_PYTORCH_JOB = Kind("HyperPodPyTorchJob", "sagemaker.amazonaws.com/v1", "hyperpodpytorchjobs")
PYTORCH_JOB = Kind("PyTorchJob", "kubeflow.org/v1", "pytorchjobs")
RAY_JOB = Kind("RayJob", "ray.io/v1", "rayjobs")
KINDS: dict[str, Kind] = {k.kind: k for k in (HYPERPOD_PYTORCH_JOB, PYTORCH_JOB, RAY_JOB)}


@dataclass(frozen=True)
class InstanceFacts:
    """What one instance type of the cluster offers a pod, read from its nodes' advertised capacity (what the
    device plugins report, the same capacity the nodes service shows), so no per-type table lives here."""

    instance_type: str
    nodes: int = 0
    schedulable: int = 0
    gpus: int = 0
    efa: int = 0
    neuron_devices: int = 0

    @staticmethod
    def from_nodes(nodes: Iterable[Mapping[str, Any]]) -> dict[str, InstanceFacts]:
        """The facts per instance type of Kubernetes node objects (as the API or the watch cache holds them):
        node counts, how many are Schedulable (HyperPod's health label; a node without it counts when Ready),
        and the largest GPU / EFA / Neuron capacity a node of the type advertises."""
        seen: dict[str, dict[str, int]] = {}
        for node in nodes:
            labels = (node.get("metadata") or {}).get("labels") or {}
            name = labels.get(INSTANCE_TYPE_LABEL)
            if not name:
                continue
            capacity = (node.get("status") or {}).get("capacity") or {}
            row = seen.setdefault(name, {"nodes": 0, "schedulable": 0, "gpus": 0, "efa": 0, "neuron": 0})
            row["nodes"] += 1
            row["schedulable"] += 1 if _schedulable(node, labels) else 0
            row["gpus"] = max(row["gpus"], _int(capacity.get(GPU)))
            row["efa"] = max(row["efa"], _int(capacity.get(EFA)))
            row["neuron"] = max(row["neuron"], _int(capacity.get(NEURON)))
        return {name: InstanceFacts(name, r["nodes"], r["schedulable"], r["gpus"], r["efa"], r["neuron"])
                for name, r in sorted(seen.items())}


def _int(value: Any) -> int:
    try:
        return int(str(value or 0))
    except ValueError:
        return 0


def _schedulable(node: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    if HEALTH_LABEL in labels:
        return labels[HEALTH_LABEL] == "Schedulable"
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


@dataclass(frozen=True)
class RenderContext:
    """Where a job is rendered for: the caller (the jobs verb, the preview verb) reads the cluster once and
    passes what it found. ``operators``: ``hyperpod-training-operator``, ``kubeflow``, ``kuberay`` (the CRDs
    installed). ``mlflow_env``: the tracking variables to inject (empty: no tracking server)."""

    cluster: str
    namespace: str
    job_name: str
    instance_types: Mapping[str, InstanceFacts]
    operators: frozenset[str] | set[str] = frozenset()
    mlflow_env: Mapping[str, str] = field(default_factory=dict)
    service_account: str = TRAINING_SERVICE_ACCOUNT
    claim: str = "shared-s3"

    @property
    def job_dir(self) -> str:
        return f"{SHARED_MOUNT}/jobs/{self.job_name}"


class RenderedJob(BaseModel):
    """A rendered job: the custom resource to create, and what the caller should know about it."""

    kind: str = Field(..., description="HyperPodPyTorchJob, PyTorchJob or RayJob")
    api_version: str
    plural: str
    manifest: dict[str, Any] = Field(..., description="the custom resource, as it will be created")
    companions: list[dict[str, Any]] = Field(
        default_factory=list, description="objects the resource needs, to create first in the job's namespace "
                                          "(a recipe's ConfigMap); deleted with the job")
    warnings: list[str] = Field(default_factory=list, description="choices made for the caller, and why")


@dataclass(frozen=True)
class RecoveryBudget:
    """HyperPodPyTorchJob's restart limits (the incumbent's defaults: at most 5 process-level retries, 3 in-place
    restarts per 6 h window before a full job restart, 1 full job restart)."""

    max_retries: int = 5
    restarts_before_full_restart: int = 3
    eval_period_seconds: int = 21600
    max_full_job_restarts: int = 1

    def run_policy(self) -> dict[str, Any]:
        return {"jobMaxRetryCount": self.max_retries,
                "restartPolicy": {"numRestartBeforeFullJobRestart": self.restarts_before_full_restart,
                                  "evalPeriodSeconds": self.eval_period_seconds,
                                  "maxFullJobRestarts": self.max_full_job_restarts}}


@dataclass(frozen=True)
class LogRule:
    """One ``logMonitoringConfiguration`` rule of the HyperPod training operator (aws-facts §8)."""

    name: str
    log_pattern: str
    start_cutoff_seconds: int | None = None
    recurring_seconds: int | None = None
    metric_threshold: int | None = None
    operator: str | None = None
    data_points: int | None = None

    def spec(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "logPattern": self.log_pattern}
        for key, value in (("expectedStartCutOffInSeconds", self.start_cutoff_seconds),
                           ("expectedRecurringFrequencyInSeconds", self.recurring_seconds),
                           ("metricThreshold", self.metric_threshold), ("operator", self.operator),
                           ("metricEvaluationDataPoints", self.data_points)):
            if value is not None:
                out[key] = value
        return out


@dataclass(frozen=True)
class PodPlan:
    """The decisions a recipe made for the pods: what runs, where, with what."""

    recipe: str
    image: str
    command: list[str]
    facts: InstanceFacts
    replicas: int
    nproc_per_node: int
    env: Mapping[str, str] = field(default_factory=dict)
    config_map: str | None = None  # mounted read-only at config_mount when set
    config_mount: str = "/etc/instantstart/recipe"


def labels(ctx: RenderContext, recipe: str) -> dict[str, str]:
    return {MANAGED_BY: "instantstart", JOB_LABEL: ctx.job_name, RECIPE_LABEL: recipe}


def metadata(ctx: RenderContext, recipe: str, annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": ctx.job_name, "namespace": ctx.namespace, "labels": labels(ctx, recipe)}
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def env(ctx: RenderContext, plan: PodPlan) -> list[dict[str, str]]:
    """The main container's env: NCCL/EFA settings, the job's data contract, MLflow's, then the recipe's."""
    values: dict[str, str] = {"NCCL_DEBUG": "INFO"}
    if plan.facts.efa:
        values["FI_PROVIDER"] = "efa"
    values["INSTANTSTART_JOB"] = ctx.job_name
    values["INSTANTSTART_JOB_DIR"] = ctx.job_dir
    values.update(ctx.mlflow_env)
    values.update(plan.env)
    return [{"name": k, "value": v} for k, v in values.items()]


def resources(facts: InstanceFacts) -> dict[str, Any]:
    """Requests = limits for the devices the type has (a device is not shared, so both must be equal)."""
    wanted: dict[str, str] = {}
    for name, count in ((GPU, facts.gpus), (NEURON, facts.neuron_devices), (EFA, facts.efa)):
        if count:
            wanted[name] = str(count)
    return {"requests": dict(wanted), "limits": dict(wanted)} if wanted else {}


def affinity() -> dict[str, Any]:
    """Only Schedulable nodes; prefer those whose deep health check passed (HyperPod's recommendation)."""
    return {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": HEALTH_LABEL, "operator": "In", "values": ["Schedulable"]}]}]},
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "preference": {"matchExpressions": [
            {"key": DEEP_HEALTH_LABEL, "operator": "In", "values": ["Passed"]}]}}]}}


def container(ctx: RenderContext, plan: PodPlan, name: str, *, agent_port: bool = False,
              command: list[str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "image": plan.image, "command": list(command or plan.command),
                           "env": env(ctx, plan)}
    if agent_port:
        out["ports"] = [{"containerPort": AGENT_PORT, "name": "hp-agent"}]
    limits = resources(plan.facts)
    if limits:
        out["resources"] = limits
    mounts: list[dict[str, Any]] = [{"name": "shared", "mountPath": SHARED_MOUNT},
                                    {"name": "shm", "mountPath": "/dev/shm"}]
    if plan.config_map:
        mounts.append({"name": "recipe-config", "mountPath": plan.config_mount, "readOnly": True})
    out["volumeMounts"] = mounts
    return out


def volumes(ctx: RenderContext, plan: PodPlan) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"name": "shared", "persistentVolumeClaim": {"claimName": ctx.claim}},
                                 {"name": "shm", "emptyDir": {"medium": "Memory"}}]
    if plan.config_map:
        out.append({"name": "recipe-config", "configMap": {"name": plan.config_map}})
    return out


def pod_template(ctx: RenderContext, plan: PodPlan, containers: list[dict[str, Any]],
                 restart_policy: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"serviceAccountName": ctx.service_account,
                            "nodeSelector": {INSTANCE_TYPE_LABEL: plan.facts.instance_type},
                            "affinity": affinity(), "containers": containers, "volumes": volumes(ctx, plan)}
    if restart_policy:
        spec["restartPolicy"] = restart_policy
    return {"metadata": {"labels": labels(ctx, plan.recipe)}, "spec": spec}


def hyperpod_pytorch_job(ctx: RenderContext, plan: PodPlan, budget: RecoveryBudget,
                         rules: list[LogRule]) -> dict[str, Any]:
    """A ``HyperPodPyTorchJob``: one replica spec ``pods`` (pods ``<job>-pods-<i>``, rank = index); the command
    must start training with ``hyperpodrun`` (the agent listens on 8080). Pods are kept when the job ends
    (``cleanPodPolicy: None``) so their logs stay readable until the job is deleted."""
    run_policy = {**budget.run_policy(), "cleanPodPolicy": "None"}
    if rules:
        run_policy["logMonitoringConfiguration"] = [r.spec() for r in rules]
    template = pod_template(ctx, plan, [container(ctx, plan, "pytorch", agent_port=True)])
    return {"apiVersion": HYPERPOD_PYTORCH_JOB.api_version, "kind": HYPERPOD_PYTORCH_JOB.kind,
            "metadata": metadata(ctx, plan.recipe),
            "spec": {"nprocPerNode": str(plan.nproc_per_node),
                     "replicaSpecs": [{"name": "pods", "replicas": plan.replicas, "template": template}],
                     "runPolicy": run_policy}}


def pytorch_job(ctx: RenderContext, plan: PodPlan, max_retries: int) -> dict[str, Any]:
    """A Kubeflow ``PyTorchJob``: a Master and ``replicas - 1`` Workers restarting OnFailure, with HyperPod's
    job auto-resume annotations carrying the retry budget."""
    def replica(count: int) -> dict[str, Any]:
        return {"replicas": count, "restartPolicy": "OnFailure",
                "template": pod_template(ctx, plan, [container(ctx, plan, "pytorch")])}

    specs: dict[str, Any] = {"Master": replica(1)}
    if plan.replicas > 1:
        specs["Worker"] = replica(plan.replicas - 1)
    annotations = {AUTO_RESUME: "true", AUTO_RESUME_RETRIES: str(max_retries)}
    return {"apiVersion": PYTORCH_JOB.api_version, "kind": PYTORCH_JOB.kind,
            "metadata": metadata(ctx, plan.recipe, annotations),
            "spec": {"nprocPerNode": str(plan.nproc_per_node), "pytorchReplicaSpecs": specs,
                     "runPolicy": {"backoffLimit": max_retries, "cleanPodPolicy": "None"}}}


@dataclass(frozen=True)
class RayPlan:
    """What a RayJob adds to the pods' plan: the driver's entrypoint and runtime environment."""

    entrypoint: str
    runtime_env_yaml: str
    ray_version: str
    max_retries: int = 0
    ttl_seconds_after_finished: int = 3600


def ray_job(ctx: RenderContext, plan: PodPlan, ray: RayPlan) -> dict[str, Any]:
    """A KubeRay ``RayJob``: a head and one worker group ``gpu`` (``replicas - 1`` pods, each a training node
    like the head), the entrypoint run by a submitter Job ``<job>`` whose pod carries the driver's log; the
    cluster is shut down when the job finishes and the RayJob removed ``ttlSecondsAfterFinished`` later."""
    head = pod_template(ctx, plan, [_ray_container(ctx, plan, "ray-head", [6379, 8265, 10001])])
    worker = pod_template(ctx, plan, [_ray_container(ctx, plan, "ray-worker", [])])
    workers = plan.replicas - 1
    submitter = {"metadata": {"labels": labels(ctx, plan.recipe)},
                 "spec": {"serviceAccountName": ctx.service_account, "restartPolicy": "Never",
                          "containers": [{"name": "ray-job-submitter", "image": plan.image,
                                          "resources": {"requests": {"cpu": "500m", "memory": "512Mi"},
                                                        "limits": {"cpu": "1", "memory": "1Gi"}}}]}}
    return {"apiVersion": RAY_JOB.api_version, "kind": RAY_JOB.kind, "metadata": metadata(ctx, plan.recipe),
            "spec": {"entrypoint": ray.entrypoint, "runtimeEnvYAML": ray.runtime_env_yaml,
                     "shutdownAfterJobFinishes": True, "ttlSecondsAfterFinished": ray.ttl_seconds_after_finished,
                     "backoffLimit": ray.max_retries, "submitterPodTemplate": submitter,
                     "rayClusterSpec": {
                         "rayVersion": ray.ray_version,
                         "headGroupSpec": {"rayStartParams": {"dashboard-host": "0.0.0.0"}, "template": head},
                         "workerGroupSpecs": [{"groupName": "gpu", "replicas": workers, "minReplicas": workers,
                                               "maxReplicas": workers, "rayStartParams": {},
                                               "template": worker}]}}}


def _ray_container(ctx: RenderContext, plan: PodPlan, name: str, ports: list[int]) -> dict[str, Any]:
    out = container(ctx, plan, name)
    del out["command"]  # KubeRay starts `ray start` itself in head and worker containers
    if ports:
        names = {6379: "gcs", 8265: "dashboard", 10001: "client"}
        out["ports"] = [{"containerPort": p, "name": names[p]} for p in ports]
    return out
