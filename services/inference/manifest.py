"""The Deployment and Service a self-managed inference deployment is, built from decisions already made.

The Deployment runs the user's serve command unchanged (``command.py`` checked it) in the engine's pinned
image, with the user's GPU count as requests = limits (never inferred from the parallel sizes), EFA when asked,
the node affinity training uses (only Schedulable HyperPod nodes, deep-health-checked ones preferred), the
shared bucket's claim at ``/s3`` (models downloaded by ``downloads_start`` are under ``/s3/models``), shared
memory for the engine's workers, the Hugging Face token only as ``HF_TOKEN`` from a ``secretKeyRef``, and
probes on ``/health``: a startup probe whose budget (failureThreshold x period) covers loading the weights,
then readiness and liveness. The Service selects the pods on the engine's port: ClusterIP inside the cluster,
or a LoadBalancer the AWS Load Balancer Controller makes an NLB of (internal unless asked otherwise, with
``loadBalancerSourceRanges``). Builders never read the cluster and never raise: checks are the verbs'.
"""

from __future__ import annotations

import math
import re
from typing import Any

from services.clusters.storage_stage import MANAGED_LABEL, S3_CLAIM
from services.inference.command import IMAGES, ServeCommand
from services.inference.models import Exposure, ServiceSpec
from services.secrets import SecretRef
from services.training.manifests import EFA, GPU, INSTANCE_TYPE_LABEL, SHARED_MOUNT, affinity

INFERENCE_LABEL = "instantstart.io/inference"
ENGINE_LABEL = "instantstart.io/engine"
#: on a model pool's Deployment (``pool.py``): not a deployment the deployment verbs list or change
POOL_LABEL = "instantstart.io/pool"
MODEL_ANNOTATION = "instantstart.io/model"
API_MODEL_ANNOTATION = "instantstart.io/api-model"
GPUS_ANNOTATION = "instantstart.io/gpus"
#: the deploy-time decisions an update renders the Deployment again with (on the Deployment, not its pods)
INSTANCE_TYPE_ANNOTATION = "instantstart.io/instance-type"
EFA_ANNOTATION = "instantstart.io/efa"
MODEL_GB_ANNOTATION = "instantstart.io/model-size-gb"
CONTAINER = "engine"
PORT_NAME = "http"
PROBE_PERIOD = 10
#: loading time: a fixed start (image, CUDA, the engine's own warm-up) plus the weights at a conservative
#: 100 MB/s (S3 through Mountpoint, or the Hub)
LOAD_BASE_SECONDS = 300
LOAD_SECONDS_PER_GB = 10
DEFAULT_MODEL_GB = 16.0
LB_TYPE = "service.beta.kubernetes.io/aws-load-balancer-type"
LB_SCHEME = "service.beta.kubernetes.io/aws-load-balancer-scheme"
LB_TARGETS = "service.beta.kubernetes.io/aws-load-balancer-nlb-target-type"
_PARAMS = re.compile(r"(?<![0-9.])(\d+(?:\.\d+)?)[bB](?![a-zA-Z])")


def labels(name: str) -> dict[str, str]:
    return {**MANAGED_LABEL, INFERENCE_LABEL: name}


def estimated_gb(model: str) -> float:
    """The weights' size in bf16 from the parameter count in the model's name (``Qwen2.5-7B`` -> 14 GB)."""
    found = _PARAMS.findall(model.rsplit("/", 1)[-1])
    return max(float(found[-1]) * 2, 1.0) if found else DEFAULT_MODEL_GB


def startup_failures(model_gb: float) -> int:
    """The startup probe's failureThreshold: failureThreshold x period >= the expected load time."""
    return math.ceil((LOAD_BASE_SECONDS + model_gb * LOAD_SECONDS_PER_GB) / PROBE_PERIOD)


def deployment(*, name: str, namespace: str, serve: ServeCommand, gpus: int, replicas: int, efa: int,
               instance_type: str | None, image: str | None, model_gb: float, token: SecretRef | None,
               shared_storage: bool, model_size_gb: float | None = None) -> dict[str, Any]:
    """``model_size_gb``: the size the user gave (recorded; an estimate is not, so it follows a new model)."""
    meta = {"labels": {**labels(name), ENGINE_LABEL: serve.engine.value},
            "annotations": {MODEL_ANNOTATION: serve.model, API_MODEL_ANNOTATION: serve.api_model,
                            GPUS_ANNOTATION: str(gpus)}}
    wanted = {GPU: str(gpus), **({EFA: str(efa)} if efa else {})}
    env: list[dict[str, Any]] = [{"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"}]
    if token is not None:
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": token.name, "key": token.key}}})
    probe = {"httpGet": {"path": "/health", "port": PORT_NAME}, "periodSeconds": PROBE_PERIOD, "timeoutSeconds": 5}
    mounts: list[dict[str, Any]] = [{"name": "shm", "mountPath": "/dev/shm"}]
    volumes: list[dict[str, Any]] = [{"name": "shm", "emptyDir": {"medium": "Memory"}}]
    if shared_storage:
        mounts.append({"name": "shared", "mountPath": SHARED_MOUNT})
        volumes.append({"name": "shared", "persistentVolumeClaim": {"claimName": S3_CLAIM}})
    container = {
        "name": CONTAINER, "image": image or IMAGES[serve.engine], "command": list(serve.argv), "env": env,
        "ports": [{"containerPort": serve.port, "name": PORT_NAME, "protocol": "TCP"}],
        "resources": {"requests": dict(wanted), "limits": dict(wanted)},
        "startupProbe": {**probe, "failureThreshold": startup_failures(model_gb)},
        "readinessProbe": {**probe, "failureThreshold": 3},
        "livenessProbe": {**probe, "failureThreshold": 6},
        "volumeMounts": mounts}
    pod_spec: dict[str, Any] = {"affinity": affinity(), "containers": [container], "volumes": volumes,
                                "tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}]}
    if instance_type:
        pod_spec["nodeSelector"] = {INSTANCE_TYPE_LABEL: instance_type}
    decided = {EFA_ANNOTATION: str(efa), **({INSTANCE_TYPE_ANNOTATION: instance_type} if instance_type else {}),
               **({MODEL_GB_ANNOTATION: str(model_size_gb)} if model_size_gb is not None else {})}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace, "labels": meta["labels"],
                         "annotations": {**meta["annotations"], **decided}},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels(name)},
                     "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
                     "template": {"metadata": meta, "spec": pod_spec}}}


def service(*, name: str, namespace: str, serve: ServeCommand, spec: ServiceSpec) -> dict[str, Any]:
    port = {"name": PORT_NAME, "port": spec.port or serve.port, "targetPort": serve.port, "protocol": "TCP"}
    body: dict[str, Any] = {"selector": labels(name), "ports": [port]}
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels(name)}
    if spec.exposure is Exposure.CLUSTER:
        body["type"] = "ClusterIP"
    else:
        body["type"] = "LoadBalancer"
        body["loadBalancerClass"] = "service.k8s.aws/nlb"
        meta["annotations"] = {LB_TYPE: "external", LB_TARGETS: "ip",
                               LB_SCHEME: "internet-facing" if spec.internet_facing else "internal"}
        if spec.source_ranges:
            body["loadBalancerSourceRanges"] = list(spec.source_ranges)
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": body}
