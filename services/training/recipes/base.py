"""What every recipe shares: the parameter fields for placement and recovery, the checks of those against what
the cluster offers (each failure names the valid alternatives), the choice of custom-resource kind, and the
launcher line of the PyTorch kinds.

A recipe is a typed parameter model plus a pure ``build`` function from (parameters, context) to a
:class:`~services.training.manifests.RenderedJob`; nothing here reads the cluster: the caller passes what it read
in the :class:`~services.training.manifests.RenderContext`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from services.errors import Conflict, Invalid
from services.models import RequestModel
from services.training.manifests import (
    AGENT_PORT,
    HYPERPOD_LOG_DIR,
    HYPERPOD_PYTORCH_JOB,
    OPERATOR_HPTO,
    OPERATOR_KUBEFLOW,
    PYTORCH_JOB,
    InstanceFacts,
    Kind,
    LogRule,
    RecoveryBudget,
    RenderContext,
    RenderedJob,
)

#: a path the pods can read: under the shared bucket's mount
S3_PATH = r"^/s3/\S+$"
#: a model: a path under /s3 (downloaded there by the model-download job) or a Hub id org/name
MODEL_REF = r"^(/s3/\S+|[A-Za-z0-9][\w.-]*/[\w.-]+)$"


class PlacementParams(RequestModel):
    """Where the job runs and how many processes it starts."""

    instance_type: str | None = Field(None, description="instance type of the cluster's nodes to run on "
                                                        "(default: the cluster's only accelerated type)")
    replicas: int = Field(1, ge=1, le=512, description="nodes (one pod per node)")
    nproc_per_node: int | None = Field(None, ge=1, le=64,
                                       description="processes per node (default: the type's GPUs, or 1)")
    image: str | None = Field(None, min_length=3, max_length=512,
                              description="container image (default: the recipe's pinned image for the kind)")


class RecoveryParams(RequestModel):
    """The recovery budget of the PyTorch kinds and HyperPod's hang/slow-step detection."""

    max_retries: int = Field(5, ge=0, le=100, description="process-level retries before the job fails "
                                                          "(HyperPod jobMaxRetryCount; Kubeflow auto-resume)")
    restarts_before_full_restart: int = Field(3, ge=0, le=100,
                                              description="in-place restarts per period before a full job restart")
    eval_period_seconds: int = Field(21600, ge=60, le=7 * 86400,
                                     description="the window the restart limits count in, seconds")
    max_full_job_restarts: int = Field(1, ge=0, le=100, description="full job restarts before the job fails")
    start_timeout_seconds: int = Field(1800, ge=60, le=86400,
                                       description="hang rule: the first training step must be logged by then")
    hang_timeout_seconds: int = Field(1800, ge=60, le=86400,
                                      description="hang rule: longest silence between two logged steps")


class PyTorchParams(RecoveryParams, PlacementParams):
    """Placement and recovery: the fields every recipe on the PyTorch kinds takes."""


@dataclass(frozen=True)
class Images:
    """Pinned images per kind (each pinned where the recipe module says it comes from)."""

    hyperpod: str | None = None
    kubeflow: str | None = None
    ray: str | None = None

    def for_kind(self, kind: Kind) -> str:
        image = {"HyperPodPyTorchJob": self.hyperpod, "PyTorchJob": self.kubeflow, "RayJob": self.ray}[kind.kind]
        if image is None:
            raise Invalid(f"no pinned image for {kind.kind}; pass params.image")
        return image

    def as_dict(self) -> dict[str, str]:
        return {k: v for k, v in (("HyperPodPyTorchJob", self.hyperpod), ("PyTorchJob", self.kubeflow),
                                  ("RayJob", self.ray)) if v}


@dataclass(frozen=True)
class Recipe:
    id: str
    summary: str
    kind: str  # the preferred kind: HyperPodPyTorchJob (PyTorchJob without the operator) or RayJob
    params_model: type[BaseModel]
    images: Images
    build: Callable[[Any, RenderContext], RenderedJob]


def pick_type(params: PlacementParams, ctx: RenderContext) -> InstanceFacts:
    """The instance type to run on: the asked one (it must be in the cluster), else the only accelerated one."""
    types = dict(ctx.instance_types)
    if not types:
        raise Conflict(f"cluster {ctx.cluster} has no nodes with an instance type label: nothing can run a job")
    listed = ", ".join(f"{t} ({f.nodes} nodes, {f.gpus} GPUs each)" for t, f in types.items())
    if params.instance_type is None:
        accelerated = [f for f in types.values() if f.gpus or f.neuron_devices]
        if len(accelerated) == 1:
            return accelerated[0]
        if not accelerated and len(types) == 1:
            return next(iter(types.values()))
        raise Invalid(f"params.instance_type: choose one of the cluster's instance types: {listed}",
                      details={"fields": [{"field": "params.instance_type", "message": "required: several types",
                                           "type": "missing"}], "choices": sorted(types)})
    if params.instance_type not in types:
        raise Invalid(f"params.instance_type: cluster {ctx.cluster} has no {params.instance_type} nodes; "
                      f"it has: {listed}",
                      details={"fields": [{"field": "params.instance_type", "message": "not in the cluster",
                                           "type": "value_error"}], "choices": sorted(types)})
    return types[params.instance_type]


def check_replicas(replicas: int, facts: InstanceFacts, warnings: list[str]) -> None:
    if replicas > facts.nodes:
        raise Invalid(f"params.replicas: {replicas} pods need {replicas} {facts.instance_type} nodes; the cluster "
                      f"has {facts.nodes} (use replicas <= {facts.nodes}, or add nodes to the group first)",
                      details={"fields": [{"field": "params.replicas", "message": f"at most {facts.nodes}",
                                           "type": "less_than_equal"}], "max": facts.nodes})
    if replicas > facts.schedulable:
        warnings.append(f"only {facts.schedulable} of {facts.nodes} {facts.instance_type} nodes are Schedulable "
                        f"now: {replicas - facts.schedulable} pod(s) wait until nodes recover")


def nproc(params: PlacementParams, facts: InstanceFacts) -> int:
    devices = facts.gpus or facts.neuron_devices
    if params.nproc_per_node is not None and devices and params.nproc_per_node > devices:
        raise Invalid(f"params.nproc_per_node: {facts.instance_type} has {devices} devices per node; "
                      f"use nproc_per_node <= {devices}",
                      details={"fields": [{"field": "params.nproc_per_node", "message": f"at most {devices}",
                                           "type": "less_than_equal"}]})
    return params.nproc_per_node or devices or 1


def pytorch_kind(ctx: RenderContext, warnings: list[str]) -> Kind:
    """HyperPodPyTorchJob when HyperPod's training operator is installed, else Kubeflow's PyTorchJob."""
    if OPERATOR_HPTO in ctx.operators:
        return HYPERPOD_PYTORCH_JOB
    if OPERATOR_KUBEFLOW in ctx.operators:
        warnings.append("the HyperPod training operator is not installed on this cluster: rendered as a Kubeflow "
                        "PyTorchJob with HyperPod auto-resume (turn on the hyperpod_training_operator feature for "
                        "the recovery budget and hang detection)")
        return PYTORCH_JOB
    raise Conflict(f"cluster {ctx.cluster} has no PyTorch training operator: turn on the "
                   "hyperpod_training_operator feature (or install the Kubeflow training operator)",
                   details={"feature": "hyperpod_training_operator"})


def mlflow_warning(ctx: RenderContext, warnings: list[str]) -> None:
    if not ctx.mlflow_env:
        warnings.append(f"cluster {ctx.cluster} has no MLflow tracking server: the job is rendered without "
                        "MLFLOW_* variables and its metrics are not tracked")


def launcher(kind: Kind, replicas: int, nproc_per_node: int) -> list[str]:
    """``hyperpodrun`` (HyperPod's elastic agent; torchrun's flags plus its own) on HyperPodPyTorchJob, else
    ``torchrun`` (Kubeflow injects the rendezvous settings as PET_* variables, which torchrun reads)."""
    common = [f"--nnodes={replicas}", f"--nproc-per-node={nproc_per_node}"]
    if kind is HYPERPOD_PYTORCH_JOB:
        return ["hyperpodrun", *common, "--server-host=0.0.0.0", f"--server-port={AGENT_PORT}", "--tee=3",
                f"--log_dir={HYPERPOD_LOG_DIR}"]
    return ["torchrun", *common]


def budget(params: RecoveryParams) -> RecoveryBudget:
    return RecoveryBudget(params.max_retries, params.restarts_before_full_restart, params.eval_period_seconds,
                          params.max_full_job_restarts)


def hang_rules(params: RecoveryParams, step_pattern: str) -> list[LogRule]:
    """A start rule (first step within the start timeout) and a hang rule (no silence between steps longer than
    the hang timeout), both on the recipe's per-step log line."""
    return [LogRule("JobStart", step_pattern, start_cutoff_seconds=params.start_timeout_seconds),
            LogRule("JobHangingDetection", step_pattern, recurring_seconds=params.hang_timeout_seconds)]


_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def check_names(ctx: RenderContext) -> None:
    for field, value, limit in (("name", ctx.job_name, 52), ("namespace", ctx.namespace, 63)):
        if len(value) > limit or not _DNS1123.match(value):
            raise Invalid(f"{field}: {value!r} must be lowercase letters, digits and '-', start and end with a "
                          f"letter or digit, at most {limit} characters (pod names add a suffix)",
                          details={"fields": [{"field": field, "message": "not a DNS-1123 label",
                                               "type": "value_error"}]})
