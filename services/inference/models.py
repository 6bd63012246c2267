"""Request and response models of self-managed inference deployments (vLLM / SGLang as Kubernetes Deployments):
shared by REST, the pane and the MCP tools, so the field descriptions below are what an agent reads."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import Field, SecretStr

from services.inference.obs_models import EndpointMetrics
from services.models import RequestModel, ResponseModel
from services.secrets import SecretRef

NAME_PATTERN = r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$"
NAMESPACE_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
#: where deployments live unless the user picks another namespace (made when missing, like training's)
INFERENCE_NAMESPACE = "hyperpod-ns-inference"
IMAGE_PATTERN = r"^[a-z0-9][a-z0-9./_-]{0,200}:[A-Za-z0-9_.-]{1,128}$"


class Engine(StrEnum):
    VLLM = "vllm"
    SGLANG = "sglang"


class Exposure(StrEnum):
    CLUSTER = "cluster"
    EXTERNAL = "external"


class ServiceSpec(RequestModel):
    """How the deployment is reached."""

    exposure: Exposure = Field(Exposure.CLUSTER, description="'cluster': a ClusterIP Service reachable inside the "
                               "cluster (and by deployments_test through the Kubernetes API); 'external': a "
                               "LoadBalancer Service the AWS Load Balancer Controller turns into a Network Load "
                               "Balancer (internal to the VPC unless internet_facing)")
    internet_facing: bool = Field(False, description="external only: an internet-facing NLB instead of an internal "
                                  "one; needs source_ranges")
    source_ranges: list[str] = Field(default_factory=list, max_length=20,
                                     description="external only: the IPv4 CIDRs allowed to reach the load "
                                     "balancer (loadBalancerSourceRanges), e.g. ['203.0.113.0/24']; required when "
                                     "internet_facing")
    confirm_open_to_world: bool = Field(False, description="set true only when the user explicitly agreed to "
                                        "open the endpoint to the whole internet (0.0.0.0/0 in source_ranges, or "
                                        "ranges adding up to more than a /8); refused otherwise")
    port: int | None = Field(None, ge=1, le=65535, description="the Service's port (default: the engine's port)")


class DeploymentRequest(RequestModel):
    """Deploy a model with vLLM or SGLang as a Kubernetes Deployment and Service on the cluster's GPU nodes."""

    name: str = Field(..., pattern=NAME_PATTERN, description="the deployment's name: a DNS label of at most 40 "
                      "characters, also its Service's name")
    command: str = Field(..., min_length=1, max_length=4000,
                         description="the serve command exactly as the user would run it, e.g. 'vllm serve "
                         "Qwen/Qwen2.5-0.5B-Instruct --max-model-len 4096' or 'python3 -m sglang.launch_server "
                         "--model-path /s3/models/Qwen--Qwen2.5-0.5B-Instruct --tp-size 2'; the engine, model, "
                         "port and parallel sizes are read from it and every flag is checked against the engine's")
    gpus: int = Field(..., ge=1, le=64, description="GPUs per replica (nvidia.com/gpu): always ask the user, never "
                      "infer it; must be at least tensor-parallel x pipeline-parallel size and fit one node type")
    replicas: int = Field(1, ge=1, le=64, description="how many copies of the engine run behind the Service")
    namespace: str = Field(INFERENCE_NAMESPACE, pattern=NAMESPACE_PATTERN,
                           description="the Kubernetes namespace (made if missing, with the shared-s3 claim)")
    instance_type: str | None = Field(None, pattern=r"^ml\.[a-z0-9]+\.[a-z0-9]+$",
                                      description="pin the pods to this instance type (default: any node type of "
                                      "the cluster with enough GPUs)")
    efa: int = Field(0, ge=0, le=32, description="EFA interfaces per pod (vpc.amazonaws.com/efa), for multi-node "
                     "engines; usually 0")
    image: str | None = Field(None, pattern=IMAGE_PATTERN, description="another tag of the engine's image (default: "
                              "the pinned vllm/vllm-openai or lmsysorg/sglang release)")
    model_size_gb: float | None = Field(None, gt=0, le=2000, description="the weights' size in GB, to size the "
                                        "startup probe for loading (default: estimated from the model name's "
                                        "parameter count, e.g. 7B -> 14 GB)")
    hf_token: SecretStr | None = Field(None, description="a Hugging Face token for gated or private models; kept only "
                                       "in a Kubernetes Secret given to the engine as HF_TOKEN, never stored or "
                                       "shown")
    service: ServiceSpec = Field(default_factory=ServiceSpec, description="how the deployment is reached")


class DeploymentUpdate(RequestModel):
    """Change a running deployment: a rolling update (a new ReplicaSet) for a new command or image."""

    command: str | None = Field(None, min_length=1, max_length=4000, description="a new serve command (same "
                                "rules as on deploy)")
    image: str | None = Field(None, pattern=IMAGE_PATTERN, description="a new tag of the engine's image")
    replicas: int | None = Field(None, ge=0, le=64, description="a new replica count (0 stops the engine, keeps "
                                 "the Service)")


class DeploymentPlan(RequestModel):
    """What an ``inference.deploy``/``inference.update`` operation stores: the rendered objects, no secret."""

    cluster: str
    name: str
    namespace: str
    engine: Engine
    model: str
    api_model: str
    gpus: int
    replicas: int
    exposure: Exposure
    manifests: list[dict[str, Any]] = Field(..., description="the Deployment and Service, applied server-side")
    token: SecretRef | None = Field(None, description="where the Hugging Face token is kept (never its value)")
    update: bool = False
    scale: bool = Field(False, description="replicas only: the Deployment's scale subresource, its pods untouched")
    requested_by: str


class DeploymentRef(RequestModel):
    """What an ``inference.delete`` operation stores."""

    cluster: str
    name: str
    namespace: str
    uid: str = Field(..., description="the Deployment's uid when the delete was asked: only that object goes")
    requested_by: str


class Preview(ResponseModel):
    """What a deploy would create, checked by the API server (dry run); nothing is created."""

    engine: Engine
    model: str
    api_model: str = Field(..., description="the model name requests must carry (--served-model-name, else the model)")
    port: int
    tensor_parallel: int
    pipeline_parallel: int
    image: str
    manifests: list[dict[str, Any]]
    warnings: list[str] = Field(default_factory=list)


class PodView(ResponseModel):
    name: str
    node: str | None = None
    phase: str | None = None
    restarts: int = 0


class ServiceView(ResponseModel):
    type: str
    port: int
    cluster_ip: str | None = None
    address: str | None = Field(None, description="the load balancer's DNS name once AWS made it (external only)")
    scheme: str | None = Field(None, description="internal or internet-facing (external only)")


class DeploymentView(ResponseModel):
    """One self-managed deployment as every face shows it."""

    name: str
    namespace: str
    cluster: str
    engine: str | None = None
    model: str | None = None
    image: str | None = None
    gpus: int | None = None
    replicas: int = 0
    ready: int = 0
    available: int = 0
    updated: int = 0
    phase: Literal["Available", "Progressing", "Stopped", "Failed"] = "Progressing"
    message: str = ""
    pods: list[PodView] = Field(default_factory=list)
    service: ServiceView | None = None
    created: str | None = None
    metrics: EndpointMetrics | None = Field(None, description="time to first token and tokens/s from the engines' "
                                                              "own metrics (describe only; lists leave it out)")


class DeploymentList(ResponseModel):
    cluster: str
    deployments: list[DeploymentView]


class EndpointTest(RequestModel):
    """One OpenAI-compatible request to a deployment, through the control plane."""

    prompt: str = Field("Say hello in one short sentence.", min_length=1, max_length=4000,
                        description="the user message (chat) or the prompt (completion)")
    api: Literal["chat", "completion"] = Field("chat", description="'chat': /v1/chat/completions; 'completion': "
                                              "/v1/completions")
    max_tokens: int = Field(32, ge=1, le=512, description="the answer's length cap in tokens")
    via: Literal["service_proxy", "load_balancer"] = Field(
        "service_proxy", description="'service_proxy': through the Kubernetes API to the Service (any deployment); "
        "'load_balancer': to an external deployment's load balancer address, as its users reach it (the control "
        "plane must have a network path to it)")


class EndpointTestResult(ResponseModel):
    """The engine's answer to one test request."""

    status: int = Field(..., description="the engine's HTTP status")
    text: str | None = Field(None, description="the generated text, when the answer has one")
    answer: Any = Field(None, description="the engine's JSON answer (cut at the size cap)")
    headers: dict[str, str] = Field(default_factory=dict, description="the answer's content-type and x-* headers")
    truncated: bool = Field(False, description="the answer was longer than the cap and was cut")
    elapsed_ms: int
    path: str = Field(..., description="where the request went: the Kubernetes API's service-proxy path, or the "
                      "load balancer's URL")
