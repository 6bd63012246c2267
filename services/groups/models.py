"""Request and response models of the ``instance_groups`` noun (REST bodies, pane forms, MCP tool schemas):
the field descriptions below are what an agent reads."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, Field

from services.clusters.create_models import CapacityType
from services.models import RequestModel, ResponseModel

GROUP_NAME = r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$"  # ClusterInstanceGroupName
ZONE = r"^[a-z]{2}(-[a-z]+)+-\d[a-z]$|^[a-z]{3,4}\d-az\d+$"
DeepHealthCheck = Literal["InstanceStress", "InstanceConnectivity", "MultiNodeTrainingValidation"]
#: ClusterKubernetesLabelKey / TaintKey and LabelValue / TaintValue (sagemaker 2017-07-24)
_KEY = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
LabelKey = Annotated[str, Field(min_length=1, max_length=317, pattern=_KEY)]
LabelValue = Annotated[str, Field(min_length=1, max_length=63, pattern=_VALUE)]
Labels = dict[LabelKey, LabelValue]
MAX_LABELS = MAX_TAINTS = 50  # ClusterKubernetesLabels / ClusterKubernetesTaints
__all__ = ["CapacityType", "GroupAction"]


class GroupAction(StrEnum):
    ADD = "add"
    UPDATE = "update"
    DELETE = "delete"
    SOFTWARE = "software-update"


class Taint(RequestModel):
    key: str = Field(..., min_length=1, max_length=317, pattern=_KEY)
    value: str | None = Field(None, min_length=1, max_length=63, pattern=_VALUE)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class AutoPatch(RequestModel):
    """HyperPod ``AutoPatchConfig``."""

    strategy: Literal["WhenIdle", "WhenAllIdle", "DrainFirst"] = Field(
        ..., description="WhenIdle: each node once it runs no pods; WhenAllIdle: once no node does; DrainFirst")
    next_patch_date: AwareDatetime | None = Field(
        None, description="move the next patch to this time (ISO 8601 with its offset, e.g. 2026-12-24T03:00:00Z)")
    idle_wait_seconds: int | None = Field(None, ge=3600, le=2160000,
                                          description="wait this long for idleness")
    drain_timeout_seconds: int | None = Field(None, ge=0, le=5400, description="DrainFirst: drain time limit")
    on_drain_timeout: Literal["Force", "Skip"] | None = Field(None, description="DrainFirst: on timeout")


class GroupAdd(RequestModel):
    """A new HyperPod instance group. With a training plan, the zone and instance type come from the plan's
    reservation (leave them out, or give the plan's)."""

    name: str = Field(..., min_length=1, max_length=63, pattern=GROUP_NAME, description="unique in the cluster")
    instance_type: str | None = Field(None, pattern=r"^ml\.[a-z0-9.-]+$",
                                      description="a type clusters_options lists for the zone (the plan's with a plan)")
    count: int = Field(..., ge=0, le=6758, description="instances (0: an empty group)")
    zone: str | None = Field(None, pattern=ZONE, description="Availability Zone (name or id); the plan's with a plan")
    capacity_type: CapacityType = Field(CapacityType.ON_DEMAND, description="fixed for the group's life")
    training_plan: str | None = Field(None, min_length=1, max_length=2048,
                                      description="training plan ARN or name")
    reservation: str | None = Field(None, description="ReservedCapacityArn, when the plan holds several")
    efa_only: bool = Field(False, description="EFA-only interfaces (types with >1 EFA interface); fixed")
    ebs_volume_gib: int = Field(500, ge=1, le=16384, description="EBS volume per node")
    deep_health_checks: list[DeepHealthCheck] = Field(default_factory=list,
                                                      description="run on each new node")
    threads_per_core: Literal[1, 2] | None = Field(None, description="default: the type's")
    labels: Labels = Field(default_factory=dict, max_length=MAX_LABELS, description="node labels")
    taints: list[Taint] = Field(default_factory=list, max_length=MAX_TAINTS, description="node taints")


class GroupPatch(RequestModel):
    """Only the fields to change (an absent field is untouched)."""

    count: int | None = Field(None, ge=0, le=6758, description="instances (0 empties the group)")
    labels: Labels | None = Field(None, max_length=MAX_LABELS, description="node labels (the whole set)")
    taints: list[Taint] | None = Field(None, max_length=MAX_TAINTS, description="node taints (the whole set)")
    auto_patch: AutoPatch | None = Field(None, description="automatic patching")
    auto_patch_off: bool = Field(False, description="stop automatic patching")
    capacity_type: CapacityType | None = Field(None, description="fixed: only the current value")
    efa_only: bool | None = Field(None, description="fixed: only the current value")


class SoftwareUpdate(RequestModel):
    image_release: str | None = Field(None, pattern=r"^\d+\.\d+\.\d+$",
                                      description="HyperPod AMI release (MAJOR.MINOR.PATCH); default: the latest")


class GroupChange(RequestModel):
    """What a group operation carries out: the checked request, with the facts its precheck established."""

    cluster: str
    region: str
    hyperpod_cluster: str
    group: str
    action: GroupAction
    spec: dict[str, Any] | None = Field(None, description="add: the new group's specification")
    patch: dict[str, Any] | None = Field(None, description="update: the spec members to set (None: remove)")
    zone: str | None = None
    vpc_id: str | None = None
    security_groups: list[str] = Field(default_factory=list)
    image_release: str | None = None
    eks_cluster: str | None = Field(None, description="set for an EKS managed node group (not HyperPod's)")
    scaling: dict[str, int] | None = Field(None, description="an EKS node group's new scalingConfig")
    nodegroup_labels: dict[str, str] | None = Field(None, description="an EKS node group's labels (the whole set)")
    nodegroup_taints: list[dict[str, str]] | None = Field(
        None, description="an EKS node group's taints (the whole set; key, value, effect as EKS spells it)")
    requested_by: str


class GroupView(ResponseModel):
    name: str
    kind: Literal["hyperpod", "eks-nodegroup"] = "hyperpod"
    instance_type: str | None = None
    status: str
    current_count: int
    target_count: int
    min_count: int | None = None
    capacity_type: str = Field(..., description="on-demand, spot or training-plan")
    training_plan: str | None = None
    training_plan_status: str | None = None
    efa_only: bool = False
    threads_per_core: int | None = None
    ebs_volume_gib: int | None = None
    deep_health_checks: list[str] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    taints: list[dict[str, Any]] = Field(default_factory=list)
    auto_patch: dict[str, Any] | None = None
    image_release: str | None = None
    image_status: str | None = None
    software_update_status: str | None = None
    subnets: list[str] = Field(default_factory=list, description="the group's own subnets (OverrideVpcConfig); "
                                                                 "empty: the cluster's")
