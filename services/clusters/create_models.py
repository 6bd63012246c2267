"""Models of ``cluster.create`` and ``cluster.delete``: the user's decisions (:class:`ClusterCreate`), the plan
the precheck computes from them (:class:`ClusterCreatePlan`, what the stages carry out, every name derived
once), and the typed results each stage hands to the next (``ctx.results[<stage>]``).

A user answers only decisions (name, region, zone, instance type, count, capacity type, storage, deep
health checks); everything else is computed and may be overridden (CIDRs, Kubernetes version, EBS size, an
existing VPC and subnets, endpoint access CIDRs, user tags, extra admin principals).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field, field_validator

from services.models import RequestModel, ResponseModel

#: the name feeds every resource: lowercase (S3 keys, Kubernetes names), no ``_`` (HyperPod), no trailing
#: ``-``; the length limit that binds (IAM role names of 64 with our longest suffix) is checked by the
#: precheck with the derived names in the message
CREATE_NAME_PATTERN = r"^[a-z][a-z0-9-]*[a-z0-9]$"
CIDR_PATTERN = r"^\d{1,3}(\.\d{1,3}){3}/\d{1,2}$"
ARN_PATTERN = r"^arn:aws[a-z-]*:[a-z0-9-]+:[a-z0-9-]*:\d{0,12}:.+$"
DEEP_HEALTH_CHECKS = ("InstanceStress", "InstanceConnectivity")
INSTANCE_GROUP = "workers"  # the first instance group of a created cluster


class CapacityType(StrEnum):
    ON_DEMAND = "on-demand"
    SPOT = "spot"
    TRAINING_PLAN = "training-plan"


class FsxChoice(RequestModel):
    """FSx for Lustre beside the shared bucket: a new file system, or an existing one by id."""

    mode: Literal["new", "existing"] = Field(..., description="create a new file system, or use an existing one")
    file_system_id: str | None = Field(None, pattern=r"^fs-[0-9a-f]{8,21}$",
                                       description="the existing file system (mode=existing)")
    storage_capacity_gib: int = Field(1200, ge=1200, le=2_400_000,
                                      description="size of a new file system (1200 or a multiple of 2400)")

    @field_validator("storage_capacity_gib")
    @classmethod
    def _lustre_size(cls, value: int) -> int:
        if value != 1200 and value % 2400:
            raise ValueError(f"FSx for Lustre (SCRATCH_2/PERSISTENT) is 1200 GiB or a multiple of 2400 GiB, not "
                             f"{value}: e.g. {max(2400, round(value / 2400) * 2400)}")
        return value


class ClusterCreate(RequestModel):
    """Create a HyperPod cluster on a new EKS cluster: decisions first, then overrides of computed values."""

    name: str = Field(..., min_length=2, max_length=63, pattern=CREATE_NAME_PATTERN,
                      description="names the cluster and every resource it owns (lowercase letters, digits, '-')")
    region: str | None = Field(None, pattern=r"^[a-z]{2}(-[a-z]+)+-\d$",
                               description="AWS region (default: the server's region)")
    zone: str = Field(..., pattern=r"^[a-z]{2}(-[a-z]+)+-\d[a-z]$|^[a-z]{3,4}\d-az\d+$",
                      description="Availability Zone of the compute nodes (name or zone id); see clusters options")
    instance_type: str = Field(..., pattern=r"^ml\.[a-z0-9-]+\.[a-z0-9]+$",
                               description="HyperPod instance type, e.g. ml.g5.8xlarge; see clusters options")
    count: int = Field(..., ge=1, le=6758, description="nodes in the first instance group")
    capacity_type: CapacityType = Field(CapacityType.ON_DEMAND, description="on-demand, spot or training-plan")
    training_plan_arn: str | None = Field(None, pattern=ARN_PATTERN,
                                          description="the training plan whose reserved capacity to use "
                                                      "(capacity_type=training-plan)")
    deep_health_checks: list[Literal["InstanceStress", "InstanceConnectivity"]] = Field(
        default_factory=list, description="deep health checks run on each new node before it takes work")
    bucket: str | None = Field(None, pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$",
                               description="S3 bucket mounted as shared storage (default: the installation's "
                                           "shared bucket)")
    fsx: FsxChoice | None = Field(None, description="FSx for Lustre as well (new or existing); none by default")
    # ----- overrides of computed values --------------------------------------------------------------
    kubernetes_version: str | None = Field(None, pattern=r"^1\.\d{2}$",
                                           description="EKS Kubernetes version (default: the newest EKS offers)")
    vpc_cidr: str | None = Field(None, pattern=CIDR_PATTERN, description="CIDR of a new VPC (default 10.192.0.0/16)")
    vpc_id: str | None = Field(None, pattern=r"^vpc-[0-9a-f]{8,17}$",
                               description="use this existing VPC instead of creating one")
    subnet_ids: list[str] = Field(default_factory=list, max_length=16,
                                  description="with vpc_id: existing subnets for EKS (two zones at least)")
    endpoint_public_access_cidrs: list[str] = Field(
        default_factory=list, max_length=40, description="who may reach the EKS API endpoint (default: anyone)")
    ebs_volume_gib: int = Field(500, ge=1, le=16384, description="extra EBS volume per node (GiB)")
    admin_principals: list[str] = Field(default_factory=list, max_length=20,
                                        description="IAM user or role ARNs to give cluster-admin access entries")
    tags: dict[str, str] = Field(default_factory=dict, max_length=40,
                                 description="extra tags on every resource (keys may not start with aws: "
                                             "or instantstart:)")


class DerivedNames(ResponseModel):
    """Every name the create derives from the cluster name (shown in the plan, used by every stage)."""

    eks_cluster: str
    hyperpod_cluster: str
    vpc: str
    security_group: str
    eks_role: str
    execution_role: str
    instance_group: str
    lifecycle_prefix: str = Field(..., description="S3 key prefix of the lifecycle scripts in the shared bucket")
    fsx: str | None = None


class ClusterCreatePlan(RequestModel):
    """What ``cluster.create`` carries out: every decision and computed value, fixed at submit time."""

    name: str
    region: str
    account: str
    zone: str = Field(..., description="Availability Zone name of the compute subnet")
    zone_id: str
    second_zone: str = Field(..., description="the other zone EKS needs (two zones at least)")
    instance_type: str
    count: int
    capacity_type: CapacityType
    training_plan_arn: str | None = None
    deep_health_checks: list[str]
    kubernetes_version: str
    vpc_cidr: str
    vpc_id: str | None = Field(None, description="an existing VPC to use (None: the network stage creates one)")
    subnet_ids: list[str] = Field(default_factory=list)
    endpoint_public_access_cidrs: list[str]
    ebs_volume_gib: int
    bucket: str = Field(..., description="the shared bucket (ensured, never deleted)")
    fsx: FsxChoice | None = None
    efa: bool = Field(..., description="the instance type supports EFA (security group rules, device plugin)")
    accelerator: str | None = Field(None, description="e.g. NVIDIA H100, AWS Trainium: which device plugin")
    control_plane_principal: str = Field(..., description="IAM principal of this control plane (access entry)")
    admin_principals: list[str]
    tags: dict[str, str] = Field(..., description="every resource's tags, ours included")
    names: DerivedNames
    requested_by: str


class PlannedResource(ResponseModel):
    stage: str
    type: str = Field(..., description="e.g. AWS::EC2::VPC, AWS::EKS::Cluster, Kubernetes Deployment")
    name: str
    action: Literal["create", "reuse", "apply"] = "create"
    detail: str = ""


class CreatePlanView(ResponseModel):
    """``POST /api/v1/clusters?dry_run=true``: what a create would make, nothing made."""

    plan: ClusterCreatePlan
    resources: list[PlannedResource]
    stages: list[str]
    expected_seconds: dict[str, float] = Field(..., description="expected duration of each stage (AWS's)")
    warnings: list[str] = Field(default_factory=list)


# ----- typed stage results (ctx.results[<stage name>]) ---------------------------------------------------


class NetworkResult(ResponseModel):
    vpc_id: str
    public_subnets: list[str]
    private_subnets: list[str] = Field(..., description="the EKS control plane's subnets (two zones)")
    compute_subnet: str = Field(..., description="HyperPod's nodes' subnet (ensure_compute_subnet)")
    security_group: str


class IamResult(ResponseModel):
    eks_role_arn: str
    execution_role_arn: str
    bucket: str


class EksResult(ResponseModel):
    eks_arn: str
    endpoint: str
    oidc_issuer: str
    oidc_provider_arn: str | None = None
    cluster_security_group: str | None = None
    replaced_failure: str | None = Field(None, description="EKS's health issues of the FAILED control plane this "
                                                           "attempt deleted and created again, if any")


class ComponentState(ResponseModel):
    name: str
    kind: Literal["addon", "manifest"]
    version: str
    status: str
    detail: str = ""
    healthy: bool = Field(False, description="ready to serve now (add-on ACTIVE, workloads' pods ready)")


class DependenciesResult(ResponseModel):
    components: list[ComponentState]


class HyperpodResult(ResponseModel):
    hyperpod_arn: str
    status: str
    groups: dict[str, int] = Field(default_factory=dict, description="running nodes per instance group")


class StorageResult(ResponseModel):
    claims: list[str] = Field(..., description="namespace/name of each PersistentVolumeClaim made")
    fsx_file_system_id: str | None = None


class VerifyResult(ResponseModel):
    nodes_ready: int
    components_healthy: int
    claims_bound: int


class ClusterDelete(RequestModel):
    """Delete a cluster this control plane created, and everything tagged with it (the shared bucket stays)."""

    confirm: str | None = Field(None, description="the cluster's name again (the dashboard asks for it)")
