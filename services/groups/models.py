"""Request and response models of the ``instance_groups`` noun (REST bodies, pane forms, MCP tool schemas):
the field descriptions below are what an agent reads."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import Field

from services.clusters.create_models import CapacityType
from services.models import RequestModel, ResponseModel

GROUP_NAME = r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$"  # ClusterInstanceGroupName
ZONE = r"^[a-z]{2}(-[a-z]+)+-\d[a-z]$|^[a-z]{3,4}\d-az\d+$"
DeepHealthCheck = Literal["InstanceStress", "InstanceConnectivity"]
__all__ = ["CapacityType", "GroupAction"]


class GroupAction(StrEnum):
    ADD = "add"
    UPDATE = "update"
    DELETE = "delete"
    SOFTWARE = "software-update"


class Taint(RequestModel):
    key: str = Field(..., min_length=1, max_length=317, description="taint key, e.g. dedicated")
    value: str | None = Field(None, max_length=63, description="taint value (optional)")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = Field(..., description="what the taint does")


class AutoPatch(RequestModel):
    """Scheduled automatic patching of the group's AMI (HyperPod ``AutoPatchConfig``)."""

    strategy: Literal["WhenIdle", "WhenAllIdle", "DrainFirst"] = Field(
        ..., description="WhenIdle: patch each node once it runs no pods; WhenAllIdle: once none of the group's "
                         "nodes run pods; DrainFirst: drain each node, then patch it")
    next_patch_date: str | None = Field(None, description="reschedule the next patch to this time (ISO 8601); "
                                                          "HyperPod sets it itself when a patch is released")
    idle_wait_seconds: int | None = Field(None, ge=3600, le=2160000,
                                          description="how long to wait for idleness before patching anyway")
    drain_timeout_seconds: int | None = Field(None, ge=0, le=5400, description="DrainFirst: how long a drain "
                                                                               "may take")
    on_drain_timeout: Literal["Force", "Skip"] | None = Field(None, description="DrainFirst: what to do when "
                                                                                "the drain times out")


class GroupAdd(RequestModel):
    """A new HyperPod instance group. With a training plan, the zone and instance type come from the plan's
    reservation (leave them out, or give the plan's)."""

    name: str = Field(..., pattern=GROUP_NAME, description="instance group name, unique in the cluster")
    instance_type: str | None = Field(None, pattern=r"^ml\.[a-z0-9.-]+$",
                                      description="HyperPod instance type (instance_groups_options lists those the "
                                                  "zone offers); taken from the reservation with a training plan")
    count: int = Field(..., ge=0, le=6758, description="instances (0: an empty group, e.g. for autoscaling)")
    zone: str | None = Field(None, pattern=ZONE, description="Availability Zone (name or id) of the group's "
                                                             "subnet; taken from the reservation with a plan")
    capacity_type: CapacityType = Field(CapacityType.ON_DEMAND, description="on-demand, spot, or training-plan "
                                        "(fixed for the group's life)")
    training_plan: str | None = Field(None, min_length=1, max_length=2048,
                                      description="training plan ARN or name (capacity_type training-plan)")
    reservation: str | None = Field(None, description="the plan's reserved capacity to use (its "
                                    "ReservedCapacityArn), when the plan holds several")
    efa_only: bool = Field(False, description="EFA-only network interfaces (no ENA): only for types with more "
                                              "than one EFA interface; fixed for the group's life")
    ebs_volume_gib: int = Field(500, ge=1, le=16384, description="secondary EBS volume per node, GiB")
    deep_health_checks: list[DeepHealthCheck] = Field(default_factory=list,
                                                      description="deep health checks each new node runs first")
    threads_per_core: Literal[1, 2] | None = Field(None, description="1 disables hyperthreading; default: the "
                                                                    "type's own default")
    labels: dict[str, str] = Field(default_factory=dict, description="Kubernetes labels on the group's nodes")
    taints: list[Taint] = Field(default_factory=list, description="Kubernetes taints on the group's nodes")


class GroupPatch(RequestModel):
    """Only the fields to change (an absent field is untouched)."""

    count: int | None = Field(None, ge=0, le=6758, description="new instance count (0 empties the group)")
    labels: dict[str, str] | None = Field(None, description="the group's Kubernetes labels (replaces them all)")
    taints: list[Taint] | None = Field(None, description="the group's Kubernetes taints (replaces them all)")
    auto_patch: AutoPatch | None = Field(None, description="scheduled automatic patching")
    auto_patch_off: bool = Field(False, description="true: stop automatic patching")
    capacity_type: CapacityType | None = Field(None, description="fixed for the group's life: only its current "
                                                                 "value is accepted")
    efa_only: bool | None = Field(None, description="fixed for the group's life: only its current value is "
                                                    "accepted")


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
