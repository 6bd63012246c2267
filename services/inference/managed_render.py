"""Renders a managed endpoint request as the operator's custom resource, and checks it against the CRD.

Pure functions: nothing here calls an API. The request-only rules come first (a worker for S3/FSx/Hugging Face
sources and none for the JumpStart catalog; one instance type for a JumpStart model; L2 redis needs its URL;
autoscaling's bounds and triggers: ``managed_scaling.py``), then the rendered ``InferenceEndpointConfig`` /
``JumpStartModel`` is validated against the served ``v1`` openAPIV3Schema of the CRDs shipped in ``crds/`` (422
naming the schema's path), so a resource the API server would refuse never reaches an operation.
"""

from __future__ import annotations

from typing import Any

from services.errors import Invalid
from services.inference import managed_scaling
from services.inference.managed_models import (
    EndpointKind,
    EndpointRequest,
    FsxSource,
    HuggingFaceSource,
    JumpStartSource,
    S3Source,
)
from services.inference.manifest import API_MODEL_ANNOTATION, labels
from services.secrets import SecretRef
from services.training.manifests import INSTANCE_TYPE_LABEL
from services.training.validate import crd_schema, errors_against, refuse_errors

GROUP = "inference.sagemaker.aws.amazon.com"
VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"
PLURALS = {EndpointKind.CONFIG: "inferenceendpointconfigs", EndpointKind.JUMPSTART: "jumpstartmodels"}
CRDS = {kind: f"inference/crds/{GROUP}_{plural}.yaml" for kind, plural in PLURALS.items()}
#: the CRD's own words on adding intelligent routing to a deployed endpoint (spec.intelligentRoutingSpec)
ROUTING_RULE = ("This feature is currently not supported for existing deployments. Adding this configuration to an "
                "existing deployment will be rejected.")


def crd_name(kind: EndpointKind) -> str:
    return f"{PLURALS[kind]}.{GROUP}"


def check_request(request: EndpointRequest) -> None:
    """The rules the schema cannot say, before anything is rendered or asked."""
    jumpstart = isinstance(request.source, JumpStartSource)
    if jumpstart:
        for field, given in (("worker", request.worker), ("kv_cache", request.kv_cache), ("routing", request.routing),
                             ("avoid_labels", request.avoid_labels or None)):
            if given is not None:
                raise Invalid(f"{field} applies to an InferenceEndpointConfig (s3, fsx or huggingface source); a "
                              "JumpStart model's server comes from the catalog", details={"field": field})
        if len(request.instance_types) != 1:
            raise Invalid("a JumpStart model runs on exactly one instance type (server.instanceType): give "
                          "instance_types one entry", details={"field": "instance_types"})
    elif request.worker is None:
        raise Invalid(f"a {request.source.type} model needs worker (the server image, port and GPUs)",
                      details={"field": "worker"})
    if request.kv_cache is not None and request.kv_cache.l2_backend == "redis" and not request.kv_cache.l2_url:
        raise Invalid("an L2 cache on redis needs kv_cache.l2_url (e.g. redis://redis.<ns>.svc.cluster.local:6379)",
                      details={"field": "kv_cache.l2_url"})
    if request.autoscaling is not None:
        managed_scaling.check(request.autoscaling)
    for value in request.instance_types:
        if not value.startswith("ml.") or len(value) > 40:
            raise Invalid(f"instance_types: {value!r} is not a HyperPod instance type such as ml.g5.8xlarge",
                          details={"field": "instance_types"})


def kind_of(request: EndpointRequest) -> EndpointKind:
    return EndpointKind.JUMPSTART if isinstance(request.source, JumpStartSource) else EndpointKind.CONFIG


def render(request: EndpointRequest, token: SecretRef | None) -> dict[str, Any]:
    """The custom resource for ``request`` (``token``: the Secret holding its Hugging Face token)."""
    kind = kind_of(request)
    meta: dict[str, Any] = {"name": request.name, "namespace": request.namespace, "labels": labels(request.name)}
    if kind is EndpointKind.CONFIG:
        meta["annotations"] = {API_MODEL_ANNOTATION: api_model(request)}
    spec = _jumpstart(request) if kind is EndpointKind.JUMPSTART else _config(request, token)
    if request.autoscaling is not None:
        spec["autoScalingSpec"] = managed_scaling.spec_of(request.autoscaling)
    return {"apiVersion": API_VERSION, "kind": kind.value, "metadata": meta, "spec": spec}


def api_model(request: EndpointRequest) -> str:
    """The model name the server answers to (what a test request carries)."""
    worker = request.worker
    assert worker is not None
    if worker.api_model:
        return worker.api_model
    args = list(worker.args)
    if "--served-model-name" in args[:-1]:
        return args[args.index("--served-model-name") + 1]
    if args and not args[0].startswith("-"):
        return args[0]
    return request.model_name or request.name


def _jumpstart(request: EndpointRequest) -> dict[str, Any]:
    source = request.source
    assert isinstance(source, JumpStartSource)
    model: dict[str, Any] = {"modelId": source.model_id, "modelHubName": source.hub, "acceptEula": source.accept_eula}
    if source.version:
        model["modelVersion"] = source.version
    return {"model": model, "server": {"instanceType": request.instance_types[0]}, "replicas": request.replicas}


def _source(request: EndpointRequest, token: SecretRef | None) -> dict[str, Any]:
    source = request.source
    if isinstance(source, S3Source):
        return {"modelSourceType": "s3", "s3Storage": {"bucketName": source.bucket, "region": source.region},
                "modelLocation": source.location, "prefetchEnabled": source.prefetch}
    if isinstance(source, FsxSource):
        fsx = {"fileSystemId": source.file_system_id, **({"dnsName": source.dns_name} if source.dns_name else {}),
               **({"mountName": source.mount_name} if source.mount_name else {})}
        return {"modelSourceType": "fsx", "fsxStorage": fsx, "modelLocation": source.location}
    assert isinstance(source, HuggingFaceSource)
    hf: dict[str, Any] = {"modelId": source.model_id}
    if source.commit:
        hf["commitSHA"] = source.commit
    if token is not None:
        hf["tokenSecretRef"] = {"name": token.name, "key": token.key}
    return {"modelSourceType": "huggingface", "huggingFaceModel": hf}


def _config(request: EndpointRequest, token: SecretRef | None) -> dict[str, Any]:
    worker = request.worker
    assert worker is not None
    requests: dict[str, Any] = {"nvidia.com/gpu": str(worker.gpus)} if worker.gpus else {}
    if worker.cpu:
        requests["cpu"] = worker.cpu
    if worker.memory:
        requests["memory"] = worker.memory
    limits = {"nvidia.com/gpu": str(worker.gpus)} if worker.gpus else {}
    spec: dict[str, Any] = {
        "modelName": request.model_name or request.name, "replicas": request.replicas,
        "invocationEndpoint": request.invocation_path, "modelSourceConfig": _source(request, token),
        "worker": {"image": worker.image, "args": list(worker.args),
                   "modelInvocationPort": {"containerPort": worker.port, "name": "http"},
                   "modelVolumeMount": {"name": "model-weights", "mountPath": worker.mount_path},
                   "resources": {"limits": limits, "requests": requests},
                   "environmentVariables": [{"name": k, "value": v} for k, v in sorted(worker.env.items())]}}
    if request.avoid_labels:
        expressions = [{"key": key, "operator": "NotIn", "values": list(values)}
                       for key, values in sorted(request.avoid_labels.items())]
        if request.instance_types:
            expressions.append({"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": list(request.instance_types)})
        spec["nodeAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": expressions}]}}
    elif len(request.instance_types) == 1:
        spec["instanceType"] = request.instance_types[0]
    elif request.instance_types:
        spec["instanceTypes"] = list(request.instance_types)
    if request.kv_cache is not None:
        cache: dict[str, Any] = {"enableL1Cache": request.kv_cache.l1,
                                 "enableL2Cache": request.kv_cache.l2_backend is not None}
        if request.kv_cache.l2_backend is not None:
            cache["l2CacheSpec"] = {"l2CacheBackend": request.kv_cache.l2_backend,
                                    **({"l2CacheLocalUrl": request.kv_cache.l2_url} if request.kv_cache.l2_url
                                       else {})}
        spec["kvCacheSpec"] = cache
    if request.routing is not None:
        spec["intelligentRoutingSpec"] = {"enabled": True, "routingStrategy": request.routing.value}
    return spec


def check_schema(manifest: dict[str, Any]) -> None:
    """422 naming each path where ``manifest`` breaks its kind's CRD schema (the shipped copy, served ``v1``)."""
    kind = EndpointKind(str(manifest.get("kind")))
    refuse_errors(manifest, errors_against(crd_schema(CRDS[kind], VERSION), manifest))


def routing_of(spec: dict[str, Any]) -> str | None:
    routing = spec.get("intelligentRoutingSpec") or {}
    return str(routing.get("routingStrategy") or "prefixaware") if routing.get("enabled") else None
