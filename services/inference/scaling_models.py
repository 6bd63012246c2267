"""Request and response models of KEDA autoscaling for self-managed inference deployments: shared by REST, the pane
and the MCP tools, so the field descriptions below are what an agent reads."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from services.models import RequestModel, ResponseModel


class ScalingRequest(RequestModel):
    """Autoscale a self-managed vLLM / SGLang deployment with KEDA on its engine's own Prometheus metrics."""

    min_replicas: int = Field(1, ge=1, le=64, description="replicas kept when idle (KEDA minReplicaCount); at "
                              "least 1: an engine takes minutes to load its model, so it never scales to zero")
    max_replicas: int = Field(..., ge=1, le=64, description="the most replicas KEDA may run (maxReplicaCount); "
                              "each needs the deployment's GPUs on a node of its own type: ask the user")
    request_rate: float | None = Field(None, gt=0, le=100000, description="request-rate trigger: completed "
                                       "requests per second one replica should serve (threshold of "
                                       "sum(rate(vllm:request_success_total[1m])), SGLang: "
                                       "sglang:num_requests_total); replicas = ceil(rate / this)")
    queue_depth: float | None = Field(None, gt=0, le=100000, description="queue-depth trigger: requests waiting "
                                      "in the engine's queue per replica (threshold of the sum of "
                                      "vllm:num_requests_waiting, SGLang: sglang:num_queue_reqs)")
    polling_interval: int = Field(30, ge=5, le=600, description="seconds between KEDA's evaluations of the "
                                  "triggers (pollingInterval)")
    cooldown_period: int = Field(300, ge=0, le=3600, description="seconds KEDA waits after the last active "
                                 "trigger before scaling down (cooldownPeriod; the HPA's own stabilization also "
                                 "applies)")


class ScalingPlan(RequestModel):
    """What an ``inference.scaling.set`` operation stores: where to install KEDA and Prometheus, and the
    rendered ScaledObject."""

    cluster: str
    eks_cluster: str
    region: str
    account: str
    name: str
    namespace: str
    scaled_object: dict[str, Any] = Field(..., description="the ScaledObject, applied server-side")
    requested_by: str


class ScalingRef(RequestModel):
    """What an ``inference.scaling.remove`` operation stores."""

    cluster: str
    name: str
    namespace: str
    uid: str = Field(..., description="the ScaledObject's uid when the removal was asked: only that object goes")
    requested_by: str


class TriggerView(ResponseModel):
    kind: str = Field(..., description="'request_rate' or 'queue_depth'")
    query: str = Field(..., description="the PromQL query KEDA sends to the cluster's Prometheus")
    threshold: float = Field(..., description="the query's value one replica should carry")


class ComponentView(ResponseModel):
    name: str
    version: str
    status: str = Field(..., description="ABSENT (installed on the first autoscaling), Applied, or Ready")
    healthy: bool
    detail: str = ""


class ScalingView(ResponseModel):
    """A deployment's autoscaling as KEDA and the HPA report it."""

    cluster: str
    name: str
    namespace: str
    enabled: bool = Field(..., description="whether a ScaledObject of ours scales the deployment")
    min_replicas: int | None = None
    max_replicas: int | None = None
    polling_interval: int | None = None
    cooldown_period: int | None = None
    triggers: list[TriggerView] = Field(default_factory=list)
    ready: bool | None = Field(None, description="KEDA's Ready condition (False: it refused the ScaledObject, "
                               "see message)")
    active: bool | None = Field(None, description="KEDA's Active condition: a trigger is above its activation "
                                "threshold")
    message: str = ""
    replicas: int = Field(..., description="the Deployment's replicas now")
    desired_replicas: int | None = Field(None, description="the HPA's desired replicas")
    current_replicas: int | None = Field(None, description="the HPA's current replicas")
    metrics: list[str] = Field(default_factory=list, description="the HPA's current metric values, per trigger")
    components: list[ComponentView] = Field(default_factory=list, description="KEDA and Prometheus on the cluster")


class ScalingPreview(ResponseModel):
    """What a set would do; nothing is created."""

    scaled_object: dict[str, Any]
    install: list[str] = Field(default_factory=list, description="components the operation installs first "
                               "(KEDA, Prometheus), empty when they are there")
    warnings: list[str] = Field(default_factory=list)
