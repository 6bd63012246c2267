"""Request and response models of managed inference endpoints (the HyperPod inference operator's
``InferenceEndpointConfig`` and ``JumpStartModel``): shared by REST, the pane and the MCP tools, so the field
descriptions below are what an agent reads. The fields map onto the CRD's (``crds/``); the renderer
(``managed_render.py``) writes them and the CRD's schema checks the result."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr

from services.inference.models import INFERENCE_NAMESPACE, NAME_PATTERN, NAMESPACE_PATTERN
from services.models import RequestModel, ResponseModel
from services.secrets import SecretRef


class EndpointKind(StrEnum):
    CONFIG = "InferenceEndpointConfig"
    JUMPSTART = "JumpStartModel"


class Routing(StrEnum):
    PREFIX_AWARE = "prefixaware"
    KV_AWARE = "kvaware"
    SESSION = "session"
    ROUND_ROBIN = "roundrobin"


class S3Source(RequestModel):
    type: Literal["s3"] = "s3"
    bucket: str = Field(..., min_length=3, max_length=63, pattern=r"^[a-z0-9][a-z0-9.-]+[a-z0-9]$",
                        description="the S3 bucket holding the weights")
    region: str = Field(..., pattern=r"^[a-z]{2}(-[a-z]+)+-\d$", description="the bucket's region, e.g. us-west-2")
    location: str = Field(..., min_length=1, max_length=1024, description="the weights' prefix in the bucket "
                          "(modelLocation), e.g. 'llama31_8b'")
    prefetch: bool = Field(False, description="pre-fetch the weights to RAM before the server loads them (when "
                           "they fit the instance's memory)")


class FsxSource(RequestModel):
    type: Literal["fsx"] = "fsx"
    file_system_id: str = Field(..., pattern=r"^fs-[0-9a-f]{8,17}$", description="the FSx for Lustre file system")
    dns_name: str | None = Field(None, max_length=253, description="its DNS name (default: the operator looks it up)")
    mount_name: str | None = Field(None, max_length=8, description="its mount name (default: looked up)")
    location: str = Field(..., min_length=1, max_length=1024, description="the weights' directory on the file "
                          "system (modelLocation)")


class HuggingFaceSource(RequestModel):
    type: Literal["huggingface"] = "huggingface"
    model_id: str = Field(..., pattern=r"^[a-zA-Z0-9_.-]+/[a-zA-Z0-9_.-]+$",
                          description="the Hugging Face Hub model in org/model form, e.g. "
                          "'meta-llama/Llama-3.1-8B-Instruct'")
    commit: str | None = Field(None, pattern=r"^[0-9a-f]{40}$", description="a full 40-character commit SHA "
                               "(default: the main branch)")
    hf_token: SecretStr | None = Field(None, description="a Hugging Face token for gated or private models: kept "
                                       "only in a Kubernetes Secret the operator's download step reads, never "
                                       "stored or shown")


class JumpStartSource(RequestModel):
    type: Literal["jumpstart"] = "jumpstart"
    model_id: str = Field(..., max_length=63, pattern=r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$",
                          description="the SageMaker JumpStart catalog id, e.g. 'deepseek-llm-r1-distill-qwen-1-5b'")
    version: str | None = Field(None, pattern=r"^\d{1,4}\.\d{1,4}\.\d{1,4}$", description="the catalog version, "
                                "e.g. '2.0.4' (default: the latest)")
    hub: str = Field("SageMakerPublicHub", max_length=63, description="the model hub (modelHubName)")
    accept_eula: bool = Field(False, description="set true only when the user accepted the model's end-user "
                              "license agreement (some catalog models refuse to deploy without it)")


Source = Annotated[S3Source | FsxSource | HuggingFaceSource | JumpStartSource, Field(discriminator="type")]


class Worker(RequestModel):
    """The model server's container (InferenceEndpointConfig only: a JumpStart model's comes from the catalog)."""

    image: str = Field(..., min_length=3, max_length=512, pattern=r"^[a-z0-9][a-zA-Z0-9./_:@-]+$",
                       description="the inference server image, e.g. 'lmcache/vllm-openai:v0.3.7'")
    args: list[str] = Field(default_factory=list, max_length=64, description="arguments to its entrypoint, e.g. "
                            "['/opt/ml/model', '--max-model-len', '4096']")
    port: int = Field(8080, ge=1, le=65535, description="the port the server answers on (modelInvocationPort)")
    gpus: int = Field(..., ge=0, le=64, description="nvidia.com/gpu per replica: always ask the user")
    cpu: str | None = Field(None, pattern=r"^\d+(\.\d+)?m?$", description="CPU request, e.g. '6'")
    memory: str | None = Field(None, pattern=r"^\d+(Ki|Mi|Gi|Ti)?$", description="memory request, e.g. '30Gi'")
    mount_path: str = Field("/opt/ml/model", pattern=r"^/[A-Za-z0-9._/-]*$", description="where the weights are "
                            "mounted in the container")
    api_model: str | None = Field(None, min_length=1, max_length=200, description="the model name requests must "
                                  "carry, for inference_endpoints_test (the server's --served-model-name; default: "
                                  "the value after --served-model-name in args, else args' first word when it is "
                                  "not a flag, as vLLM's model path, else model_name)")
    env: dict[str, str] = Field(default_factory=dict, max_length=50, description="plain environment variables "
                                "(never secrets: a Hugging Face token goes in source.hf_token)")


class KvCache(RequestModel):
    """Tiered KV cache: L1 offloads to CPU memory; L2 to a shared backend."""

    l1: bool = Field(True, description="L1: offload KV cache to the node's CPU memory (enableL1Cache)")
    l2_backend: Literal["redis", "tieredstorage"] | None = Field(None, description="L2 backend: 'redis' (needs "
                                                                  "l2_url) or 'tieredstorage' (HyperPod managed "
                                                                  "tiered storage); none: no L2")
    l2_url: str | None = Field(None, max_length=512, pattern=r"^[a-z][a-z0-9+.-]*://\S+$",
                               description="the L2 backend's URL, e.g. redis://redis.ns-team-a.svc.cluster.local:6379")


#: an Amazon Managed Service for Prometheus workspace, the only server the CRD's ``serverAddress`` accepts
AMP_WORKSPACE = r"^https://aps-workspaces\.[a-zA-Z0-9-]+(?:\.[a-zA-Z0-9-]+)*\.amazonaws\.com/workspaces/ws-[a-zA-Z0-9-]+$"
TRIGGER_NAME = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"


class PrometheusTrigger(RequestModel):
    """A Prometheus metric KEDA scales on (one entry of autoScalingSpec.prometheusTriggerList)."""

    name: str | None = Field(None, pattern=TRIGGER_NAME, description="the trigger's name (default: prometheus-<n>)")
    query: str = Field(..., min_length=1, max_length=2000, description="the PromQL query whose value scales the "
                       "pods, e.g. 'sum(vllm:num_requests_waiting{namespace=\"ns\"})'")
    target_value: float = Field(..., gt=0, description="the value per pod (metric_type Average) or in all "
                                "(Value) that one model pod should carry: KEDA asks for value / target_value pods")
    metric_type: Literal["Average", "Value"] = Field("Average", description="Average: the target is per pod; "
                                                     "Value: the query's whole value is compared with it")
    activation_target_value: float | None = Field(None, ge=0, description="scale from 0 to 1 pod only above this "
                                                  "value (needs min_replicas 0, as the CRD says)")
    server_address: str | None = Field(None, pattern=AMP_WORKSPACE, description="the Amazon Managed Service for "
                                       "Prometheus workspace to query, https://aps-workspaces.<region>.amazonaws.com"
                                       "/workspaces/ws-…: the only kind of server the CRD accepts (an in-cluster "
                                       "Prometheus cannot be named); left out, the operator's KEDA asks the one it "
                                       "is configured with")


class CloudWatchTrigger(RequestModel):
    """A CloudWatch metric KEDA scales on (one entry of autoScalingSpec.cloudWatchTriggerList)."""

    name: str | None = Field(None, pattern=TRIGGER_NAME, description="the trigger's name (default: cloudwatch-<n>)")
    metric_name: str = Field(..., min_length=1, max_length=255, description="the CloudWatch metric, e.g. "
                             "'Invocations'")
    namespace: str = Field(..., min_length=1, max_length=255, description="its CloudWatch namespace, e.g. "
                           "'AWS/SageMaker'")
    dimensions: dict[str, str] = Field(default_factory=dict, max_length=30, description="the metric's dimensions, "
                                       "name to value, e.g. {'EndpointName': 'llama'}")
    stat: Literal["Average", "Sum", "Minimum", "Maximum", "SampleCount"] = Field(
        "Average", description="the statistic KEDA asks CloudWatch for (metricStat): Average, Sum, Minimum, Maximum "
        "or SampleCount, the only ones KEDA's aws-cloudwatch scaler takes")
    target_value: float = Field(..., gt=0, description="the value per pod (metric_type Average) or in all (Value)")
    metric_type: Literal["Average", "Value"] = Field("Average", description="Average: the target is per pod; "
                                                     "Value: the metric's whole value is compared with it")
    activation_target_value: float | None = Field(None, ge=0, description="scale from 0 to 1 pod only above this "
                                                  "value (needs min_replicas 0, as the CRD says)")
    period: int | None = Field(None, ge=1, le=86400, description="the CloudWatch query's period in seconds "
                               "(metricCollectionPeriod; default 300): 1, 5, 10, 30, 60 or a multiple of 60 that "
                               "divides collection_time, as KEDA requires")
    collection_time: int | None = Field(None, ge=1, le=86400, description="how far back, in seconds, the CloudWatch "
                                        "query reads (metricCollectionStartTime; default 300): a multiple of period")


class Autoscaling(RequestModel):
    """The operator's autoscaling (autoScalingSpec): KEDA scales the model pods between the bounds on the
    triggers' metrics; without triggers the bounds only hold the replicas in."""

    min_replicas: int = Field(1, ge=0, le=100, description="fewest model pods (minReplicaCount)")
    max_replicas: int = Field(5, ge=1, le=100, description="most model pods (maxReplicaCount)")
    prometheus: list[PrometheusTrigger] = Field(default_factory=list, max_length=10, description="Prometheus "
                                                "metrics to scale on (prometheusTriggerList)")
    cloudwatch: list[CloudWatchTrigger] = Field(default_factory=list, max_length=10, description="CloudWatch "
                                                "metrics to scale on (cloudWatchTriggerList)")
    polling_interval: int | None = Field(None, ge=1, le=3600, description="seconds between KEDA's looks at the "
                                         "triggers (pollingInterval; default 30)")
    cooldown_period: int | None = Field(None, ge=0, le=86400, description="seconds after the last active trigger "
                                        "before scaling to 0 (cooldownPeriod; default 300; with min_replicas 0)")
    scale_up_stabilization: int | None = Field(None, ge=0, le=3600, description="the HPA's scale-up window in "
                                               "seconds (scaleUpStabilizationTime; default 0)")
    scale_down_stabilization: int | None = Field(None, ge=0, le=3600, description="the HPA's scale-down window in "
                                                 "seconds (scaleDownStabilizationTime; default 300)")


class EndpointRequest(RequestModel):
    """Deploy a model as a managed endpoint of the HyperPod inference operator."""

    name: str = Field(..., pattern=NAME_PATTERN, description="the endpoint's name: a DNS label of at most 40 "
                      "characters; the operator's Deployment and Service get it too")
    namespace: str = Field(INFERENCE_NAMESPACE, pattern=NAMESPACE_PATTERN,
                           description="the Kubernetes namespace (made if missing)")
    source: Source = Field(..., description="where the model comes from: {'type': 's3', ...}, {'type': 'fsx', ...}, "
                           "{'type': 'huggingface', ...} (an InferenceEndpointConfig with a worker), or "
                           "{'type': 'jumpstart', ...} (a JumpStartModel: the catalog picks the server)")
    model_name: str | None = Field(None, max_length=63, pattern=r"^[a-zA-Z0-9](-*[a-zA-Z0-9.]){0,62}$",
                                   description="the model's name (modelName; default: the endpoint's name)")
    worker: Worker | None = Field(None, description="the model server's container: required for s3, fsx and "
                                  "huggingface sources, refused for jumpstart")
    instance_types: list[str] = Field(default_factory=list, max_length=8,
                                      description="instance types in order of preference, e.g. ['ml.g5.8xlarge', "
                                      "'ml.g5.12xlarge'] (the operator takes the first with capacity); a JumpStart "
                                      "model needs exactly one")
    avoid_labels: dict[str, list[str]] = Field(
        default_factory=dict, max_length=8,
        description="keep the pods off nodes with these label values, e.g. the label that marks Spot capacity "
        "(a requiredDuringScheduling node affinity, NotIn); the CRD makes nodeAffinity exclusive with "
        "instanceTypes, so with both the instance types become the affinity's In term")
    replicas: int = Field(1, ge=0, le=100, description="model pods to start with (spec.replicas)")
    autoscaling: Autoscaling | None = Field(None, description="let the operator's KEDA scale between min and max "
                                            "replicas on Prometheus or CloudWatch metrics (prometheus, cloudwatch)")
    kv_cache: KvCache | None = Field(None, description="tiered KV cache (InferenceEndpointConfig only)")
    routing: Routing | None = Field(None, description="intelligent routing strategy: prefixaware, kvaware, session "
                                    "or roundrobin. Only when the endpoint is first deployed: the operator rejects "
                                    "adding it to an existing one")
    invocation_path: str = Field("v1/chat/completions", pattern=r"^[A-Za-z0-9._/-]{1,200}$",
                                 description="the server's invocation path (invocationEndpoint)")


class EndpointUpdate(RequestModel):
    """Change a managed endpoint: the operator rolls its Deployment (a new image or args), or rescales it."""

    replicas: int | None = Field(None, ge=0, le=100, description="a new replica count (without autoscaling)")
    autoscaling: Autoscaling | None = Field(None, description="autoscaling changes: only the fields given change "
                                            "(new bounds keep the triggers; prometheus: [] removes them); the "
                                            "operator's KEDA follows")
    image: str | None = Field(None, min_length=3, max_length=512, pattern=r"^[a-z0-9][a-zA-Z0-9./_:@-]+$",
                              description="a new server image (InferenceEndpointConfig only)")
    args: list[str] | None = Field(None, max_length=64, description="new server arguments (InferenceEndpointConfig "
                                   "only)")
    routing: Routing | None = Field(None, description="refused when the endpoint has no intelligent routing: the "
                                    "operator rejects adding it to an existing deployment (delete and deploy again)")


class EndpointPlan(RequestModel):
    """What a ``managed.deploy`` / ``managed.update`` operation stores: the rendered resource, no secret."""

    cluster: str
    name: str
    namespace: str
    kind: EndpointKind
    manifest: dict[str, Any] = Field(..., description="the custom resource, applied server-side")
    token: SecretRef | None = Field(None, description="where the Hugging Face token is kept (never its value)")
    install: list[str] = Field(default_factory=list, description="the components the operation installs first "
                                                                 "(KEDA, for triggers on a cluster without it)")
    requested_by: str


class EndpointRef(RequestModel):
    """What a ``managed.delete`` operation stores."""

    cluster: str
    name: str
    namespace: str
    kind: EndpointKind
    uid: str = Field(..., description="the resource's uid when the delete was asked: only that object goes")
    requested_by: str


class EndpointPreview(ResponseModel):
    """What a deploy would create, checked against the CRD's schema and by the API server (dry run)."""

    kind: EndpointKind
    manifest: dict[str, Any]
    install: list[str] = Field(default_factory=list, description="the components the deploy would install first "
                                                                 "(KEDA when triggers are given and the cluster "
                                                                 "has none of ours)")
    warnings: list[str] = Field(default_factory=list)


class EndpointCondition(ResponseModel):
    type: str
    status: str
    reason: str | None = None
    message: str | None = None


class EndpointView(ResponseModel):
    """One managed endpoint as every face shows it, read back from the resource's status."""

    name: str
    namespace: str
    cluster: str
    kind: EndpointKind
    model: str | None = None
    source: str | None = Field(None, description="s3, fsx, huggingface or jumpstart")
    instance_types: list[str] = Field(default_factory=list)
    state: str | None = Field(None, description="the operator's state: DeploymentPending, DeploymentInProgress, "
                              "DeploymentComplete, DeploymentFailed, Deletion*")
    message: str = ""
    replicas: int = Field(0, description="model pods the operator's Deployment has (status.replicas)")
    available: int = Field(0, description="of them available (deploymentStatus)")
    desired: int = Field(0, description="spec.replicas")
    scaled_to: int | None = Field(None, description="the replicas the operator's Deployment asks for now (its "
                                  "spec.replicas: what the autoscaler chose), none before it exists")
    autoscaling: Autoscaling | None = None
    routing: str | None = None
    kv_cache: str | None = Field(None, description="'L1', 'L1+L2 (redis)', … or none")
    service: str | None = Field(None, description="the operator's Service, name:port (what inference_endpoints_test "
                                "calls through)")
    conditions: list[EndpointCondition] = Field(default_factory=list)
    created: str | None = None


class EndpointList(ResponseModel):
    cluster: str
    operator: bool = Field(..., description="the cluster serves the operator's CRDs (the hyperpod_inference_operator "
                           "feature is on)")
    endpoints: list[EndpointView]
