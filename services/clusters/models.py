"""Request and response models of the ``clusters`` noun: shared by REST, panes and MCP tools, so the field
descriptions below are what an agent reads."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from services.models import RequestModel, ResponseModel, ReusedResponse

NAME_PATTERN = r"^[a-zA-Z0-9][a-zA-Z0-9-]{0,99}$"  # EKS cluster names (eks CreateCluster `name`)
HEALTH_LABEL = "sagemaker.amazonaws.com/node-health-status"
GROUP_LABEL = "sagemaker.amazonaws.com/instance-group-name"


class Ownership(StrEnum):
    MANAGED = "managed"  # this control plane created it
    IMPORTED = "imported"  # it existed before; only what a user asks is changed, it is never deleted


class ClusterImport(RequestModel):
    """Register an existing EKS cluster (and the HyperPod cluster that runs on it) with this control plane."""

    eks_cluster: str = Field(..., pattern=NAME_PATTERN, description="name of the existing EKS cluster")
    region: str | None = Field(None, pattern=r"^[a-z]{2}(-[a-z]+)+-\d$",
                               description="its AWS region (default: the server's region)")
    hyperpod_cluster: str | None = Field(
        None, pattern=r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$",
        description="name of the HyperPod cluster orchestrated by that EKS cluster, if any")
    name: str | None = Field(None, pattern=NAME_PATTERN,
                             description="name to know it by here (default: the EKS cluster's name)")


class ClusterQuery(RequestModel):
    refresh: bool = Field(False, description="read AWS and Kubernetes again instead of the caches")


class ClusterDetailQuery(ClusterQuery):
    group: str | None = Field(None, max_length=63, description="only the nodes of this instance group")
    health: str | None = Field(None, max_length=64,
                               description="only nodes with this health label value, e.g. Unschedulable")
    after: str | None = Field(None, max_length=253, description="page on: only nodes whose name sorts after this "
                                                                "(the previous answer's next_after)")
    limit: int = Field(200, ge=1, le=5000, description="at most this many nodes in the answer")


class ClusterRecord(ResponseModel):
    """A registry row: what this control plane knows the cluster by."""

    name: str
    region: str
    eks_name: str
    eks_arn: str
    hyperpod_name: str | None = None
    hyperpod_arn: str | None = None
    ownership: Ownership
    created_at: str = Field(..., description="when it was registered (ISO 8601)")
    created_by: str = Field(..., description="who registered it")


class InstanceGroupView(ResponseModel):
    name: str
    instance_type: str
    current_count: int
    target_count: int
    status: str


class NodeView(ResponseModel):
    name: str
    instance_group: str | None = Field(None, description="HyperPod instance group (label), if a HyperPod node")
    instance_type: str | None = None
    health: str | None = Field(None, description="sagemaker.amazonaws.com/node-health-status label")
    ready: bool
    gpus: int = Field(0, description="nvidia.com/gpu capacity")
    efa: int = Field(0, description="vpc.amazonaws.com/efa capacity")
    allocatable: dict[str, str] = Field(default_factory=dict)
    pods: int = Field(0, description="pods scheduled on the node")


class ClusterSummary(ReusedResponse):
    name: str
    ownership: Ownership
    region: str
    eks_status: str | None = None
    kubernetes_version: str | None = None
    hyperpod_status: str | None = None
    nodes: int = 0
    health: dict[str, int] = Field(default_factory=dict, description="node count per health label value")
    error: str | None = Field(None, description="why part of the state could not be read")
    loading: bool = Field(False, description="part of the state has not been read yet and is being read now "
                                             "(a first read, or one after a change): ask again shortly")


class ClusterDetail(ClusterSummary):
    eks_name: str
    hyperpod_name: str | None = None
    node_recovery: str | None = None
    instance_groups: list[InstanceGroupView] = Field(default_factory=list)
    nodes_by_group: dict[str, list[NodeView]] = Field(
        default_factory=dict, description="nodes by instance group ('' for nodes outside HyperPod groups)")
    cache_age_seconds: float | None = Field(None, description="age of the Kubernetes cache this was read from")
    nodes_shown: int = Field(0, description="nodes in nodes_by_group (after group/health/after/limit)")
    next_after: str | None = Field(None, description="more nodes match: ask again with after=<this>")


class ClusterImportPlan(RequestModel):
    """What ``cluster.import`` carries out: the request with the facts its precheck established."""

    name: str
    region: str
    eks_cluster: str
    eks_arn: str
    hyperpod_cluster: str | None = None
    hyperpod_arn: str | None = None
    requested_by: str = Field(..., description="who asked (the registry's created_by)")
