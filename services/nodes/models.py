"""Request and response models of the ``nodes`` noun: shared by REST, panes and MCP tools, so the field
descriptions below are what an agent reads."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field, StringConstraints, model_validator

from services.models import RequestModel, ResponseModel

SELECTOR_HELP = ("a Kubernetes label selector choosing the nodes (e.g. 'sagemaker.amazonaws.com/instance-group-name"
                 "=workers' or 'sagemaker.amazonaws.com/node-health-status in (UnschedulablePendingReplacement)')")
LogicalId = Annotated[str, StringConstraints(min_length=1, max_length=128,  # ClusterNodeLogicalId in the API
                                             pattern=r"^[a-zA-Z0-9][a-zA-Z0-9\-]*[a-zA-Z0-9]$")]
DEEP_HEALTH_CHECKS = ("InstanceStress", "InstanceConnectivity", "MultiNodeTrainingValidation")  # botocore's enum


class NodeAction(StrEnum):
    REBOOT = "reboot"
    REPLACE = "replace"
    DELETE = "delete"


class NodeQuery(RequestModel):
    group: str | None = Field(None, max_length=63, description="only the nodes of this instance group")
    health: str | None = Field(None, max_length=64, description="only nodes with this health (the node-health-status "
                                                                "label, e.g. UnschedulablePendingReplacement)")
    selector: str | None = Field(None, max_length=1000, description="only nodes matching " + SELECTOR_HELP)
    after: str | None = Field(None, max_length=253, description="page on: only nodes whose name sorts after this "
                                                                "(the previous answer's next_after)")
    limit: int = Field(200, ge=1, le=5000, description="at most this many nodes in the answer")


class NodeItem(ResponseModel):
    name: str = Field(..., description="the Kubernetes node name")
    instance_id: str | None = Field(None, description="the HyperPod (EC2) instance id; None for nodes outside HyperPod")
    instance_group: str | None = None
    instance_type: str | None = None
    zone: str | None = None
    health: str = Field(..., description="node-health-status label (Schedulable, Unschedulable, "
                                         "UnschedulablePendingReboot, UnschedulablePendingReplacement), or "
                                         "Ready/NotReady for a node without it")
    deep_health_check: str | None = Field(None, description="deep-health-check-status label: InProgress, Passed, "
                                                            "Failed (None: never checked)")
    fault_types: list[str] = Field(default_factory=list, description="fault-types label set by the health agent")
    fault_reasons: list[str] = Field(default_factory=list, description="fault-reasons label set by the health agent")
    ready: bool
    cordoned: bool = Field(False, description="spec.unschedulable: no new pods are placed on it")
    gpus: int = 0
    efa: int = 0
    pods: int = Field(0, description="pods on the node that have not ended")


class NodeList(ResponseModel):
    cluster: str
    nodes: list[NodeItem] = Field(default_factory=list)
    matched: int = Field(0, description="nodes matching the filters (before paging)")
    health: dict[str, int] = Field(default_factory=dict, description="matching nodes per health value")
    next_after: str | None = Field(None, description="more nodes match: ask again with after=<this>")
    cache_age_seconds: float | None = Field(None, description="age of the watch cache this was read from")


class PodOnNode(ResponseModel):
    namespace: str
    name: str
    phase: str | None = None
    owner: str | None = Field(None, description="kind/name of the pod's controller (Job, ReplicaSet, "
                                                "HyperPodPyTorchJob...), if any")


class NodeDetail(NodeItem):
    labels: dict[str, str] = Field(default_factory=dict)
    taints: list[dict[str, str]] = Field(default_factory=list)
    conditions: list[dict[str, str]] = Field(default_factory=list, description="node conditions (a fault shows as a "
                                                                              "condition named by its fault type)")
    pod_list: list[PodOnNode] = Field(default_factory=list, description="pods on the node")
    hyperpod: dict[str, object] = Field(default_factory=dict, description="HyperPod's DescribeClusterNode answer "
                                                                          "(status, image, placement, capacity type)")
    error: str | None = Field(None, description="why part of the detail could not be read")


class NodeSelection(RequestModel):
    """Which nodes: named, or by label selector (bulk)."""

    nodes: list[str] = Field(default_factory=list, max_length=5000,
                             description="node names (nodes_list) or HyperPod instance ids")
    selector: str | None = Field(None, max_length=1000, description="instead of nodes: " + SELECTOR_HELP)

    @model_validator(mode="after")
    def _one_way(self) -> NodeSelection:
        named = bool(self.nodes) or bool(getattr(self, "logical_ids", None))
        if named == bool(self.selector):
            raise ValueError("name the nodes (nodes) or choose them with a label selector (selector), not both "
                             "and not neither")
        return self


class NodeDestroy(NodeSelection):
    confirm: bool = Field(False, description="must be true: the user has read what is destroyed (root and "
                                             "secondary volumes wiped, pods on the nodes evicted)")


class NodeDelete(NodeDestroy):
    logical_ids: list[LogicalId] = Field(default_factory=list, max_length=1000,
                                   description="NodeLogicalIds of nodes that have not joined Kubernetes yet "
                                               "(NodeProvisioningMode=Continuous only)")


class DrainRequest(NodeSelection):
    dry_run: bool = Field(False, description="true: answer the plan (pods and jobs affected, the disruption budgets "
                                             "that cover them) and change nothing")


class HealthCheckRequest(NodeSelection):
    checks: list[str] = Field(default_factory=lambda: list(DEEP_HEALTH_CHECKS[:2]), min_length=1, max_length=3,
                              description="deep health checks to run: InstanceStress, InstanceConnectivity, "
                                          "MultiNodeTrainingValidation (default the first two; the nodes are "
                                          "unschedulable while they run, 10-30 minutes)")


class NodeRef(RequestModel):
    name: str
    instance_id: str | None = None
    group: str | None = None


class NodePlan(RequestModel):
    """What a node operation carries out: the chosen nodes, resolved at submit time."""

    cluster: str
    region: str
    hyperpod_cluster: str | None = None
    nodes: list[NodeRef]
    requested_by: str
    checks: list[str] = Field(default_factory=list)


class AffectedPod(PodOnNode):
    node: str
    budgets: list[str] = Field(default_factory=list, description="PodDisruptionBudgets (namespace/name) covering it")
    blocked: bool = Field(False, description="a budget allows no disruption now: the eviction will wait for it")


class DrainPlan(ResponseModel):
    nodes: list[str]
    pods: list[AffectedPod] = Field(default_factory=list, description="pods that will be evicted")
    jobs: list[str] = Field(default_factory=list, description="jobs and workloads (kind/namespace/name) affected")
    skipped: list[str] = Field(default_factory=list, description="pods left in place (DaemonSet pods, mirror pods)")
    blocked_by: list[str] = Field(default_factory=list, description="budgets that allow no disruption now")
