"""Request and response models of model pools: warm vLLM / SGLang workers (one Deployment) whose pods model
services claim by label. Shared by REST, the pane and the MCP tools: the field descriptions are what an agent
reads."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, SecretStr, StringConstraints, model_validator

from services.inference.models import IMAGE_PATTERN, INFERENCE_NAMESPACE, NAME_PATTERN, NAMESPACE_PATTERN
from services.models import RequestModel, ResponseModel

#: the value of the ``business`` label on a pool pod no service holds
UNASSIGNED = "unassigned"
#: the pod label naming the service that holds a pool pod (``unassigned``: none)
BUSINESS = "business"
PodName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([-.a-z0-9]{0,251}[a-z0-9])?$")]


class PoolRequest(RequestModel):
    """Start a model pool: ``replicas`` warm engine pods of one serve command, each labelled
    ``business=unassigned`` until a service claims it (inference_pool_assign)."""

    name: str = Field(..., pattern=NAME_PATTERN, description="the pool's name: a DNS label of at most 40 characters "
                      "(its Deployment's name; unique among the cluster's inference deployments and pools)")
    command: str = Field(..., min_length=1, max_length=4000,
                         description="the serve command exactly as the user would run it, e.g. 'vllm serve "
                         "Qwen/Qwen2.5-0.5B-Instruct --max-model-len 4096'; checked like inference_deploy's")
    gpus: int = Field(..., ge=1, le=64, description="GPUs per pool pod (nvidia.com/gpu): always ask the user, "
                      "never infer it; at least tensor-parallel x pipeline-parallel size")
    replicas: int = Field(..., ge=1, le=64, description="how many warm engine pods the pool keeps")
    namespace: str = Field(INFERENCE_NAMESPACE, pattern=NAMESPACE_PATTERN,
                           description="the Kubernetes namespace (made if missing)")
    instance_type: str | None = Field(None, pattern=r"^ml\.[a-z0-9]+\.[a-z0-9]+$",
                                      description="pin the pods to this instance type (default: any node type of "
                                      "the cluster with enough GPUs)")
    image: str | None = Field(None, pattern=IMAGE_PATTERN, description="another tag of the engine's image")
    model_size_gb: float | None = Field(None, gt=0, le=2000, description="the weights' size in GB, to size the "
                                        "startup probe (default: estimated from the model name)")
    hf_token: SecretStr | None = Field(None, description="a Hugging Face token for gated models; kept only in a "
                                       "Kubernetes Secret given to the engine as HF_TOKEN, never stored or shown")


class PoolScale(RequestModel):
    """Change how many warm pods the pool keeps (the Deployment's scale subresource: no engine restarts)."""

    replicas: int = Field(..., ge=0, le=64, description="the new pod count; never below the pods services hold "
                          "(409 naming them: release first); on scale-in unassigned pods go first")


class PoolAssign(RequestModel):
    """Give pool pods to a model service: they are relabelled ``business=<service>``, so the service's Kubernetes
    Service sends them traffic at once — the engines keep running, nothing restarts or reloads."""

    service: str = Field(..., pattern=NAME_PATTERN, description="the model service's name (also its Kubernetes "
                         "Service's name in the pool's namespace); made on its first assignment")
    count: int | None = Field(None, ge=1, le=64, description="claim this many Ready unassigned pods (any); give "
                              "count or pods")
    pods: list[PodName] | None = Field(None, min_length=1, max_length=64,
                                       description="claim exactly these pods (names from inference_pool_get; each "
                                       "must be Ready and unassigned); give count or pods")

    @model_validator(mode="after")
    def _one(self) -> PoolAssign:
        if (self.count is None) == (self.pods is None):
            raise ValueError("give exactly one of count or pods")
        return self


class PoolRelease(RequestModel):
    """Give a service's pods back to the pool (``business=unassigned``): they stop receiving its traffic and keep
    running warm. Releasing every pod of a service deletes its Kubernetes Service."""

    service: str = Field(..., pattern=NAME_PATTERN, description="the model service whose pods go back")
    pods: list[PodName] | None = Field(None, min_length=1, max_length=64,
                                       description="only these pods (default: every pod the service holds)")


class PoolClaim(RequestModel):
    """What an ``inference.pool.assign`` / ``inference.pool.release`` operation stores."""

    cluster: str
    pool: str
    namespace: str
    uid: str = Field(..., description="the pool Deployment's uid: the service's owner, so the pool's delete takes it")
    service: str
    port: int
    pods: list[str] = Field(..., description="the pods relabelled, chosen by the verb's precheck")
    release: bool = False
    drop_service: bool = Field(False, description="release: no pod of the service is left, its Service goes")
    requested_by: str


class PoolPodView(ResponseModel):
    name: str
    uid: str
    node: str | None = None
    phase: str | None = None
    ready: bool = False
    restarts: int = 0
    assigned_to: str | None = Field(None, description="the service holding the pod (None: unassigned, warm)")


class PoolServiceView(ResponseModel):
    name: str
    port: int | None = Field(None, description="the Kubernetes Service's port (None: the Service is not there)")
    pods: list[str] = Field(default_factory=list)


class PoolView(ResponseModel):
    """One model pool as every face shows it."""

    name: str
    namespace: str
    cluster: str
    engine: str | None = None
    model: str | None = None
    gpus: int | None = None
    replicas: int = 0
    ready: int = 0
    assigned: int = Field(0, description="pods services hold: the pool cannot scale below this")
    unassigned: int = 0
    services: list[PoolServiceView] = Field(default_factory=list)
    pods: list[PoolPodView] = Field(default_factory=list)
    created: str | None = None


class PoolList(ResponseModel):
    cluster: str
    pools: list[PoolView]


class PoolPreview(ResponseModel):
    """What a pool create would make (checked by the API server's dry run); nothing is created."""

    engine: str
    model: str
    api_model: str
    port: int
    manifests: list[dict[str, Any]]
    warnings: list[str] = Field(default_factory=list)
