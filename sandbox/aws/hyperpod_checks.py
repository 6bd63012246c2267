"""What HyperPod's CreateCluster and UpdateCluster refuse beyond the botocore model: prerequisites in the
account (roles, network, buckets, the EKS cluster's authentication mode) and rules across fields.

The front has already checked enums, patterns and ranges. These checks read the world (IAM roles and their
trust, EC2 subnets and security groups, S3 buckets, through :class:`~sandbox.aws.facts.MotoFacts`; the EKS
cluster through the EKS simulator's own API) and raise :class:`~sandbox.aws.base.AwsError` with the error
code AWS answers, before the handler records anything: a refused request leaves no trace. Without a
``facts`` source (the simulator used alone, in unit tests) the checks that need one are skipped; the
cross-field rules always apply. Nothing here writes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from .base import AwsError
from .facts import Role, SecurityGroup
from .hyperpod_instances import instance_resources
from .moto_backend import Subnet

SAGEMAKER = "sagemaker.amazonaws.com"
HYPERPOD = "hyperpod.sagemaker.amazonaws.com"  # the autoscaling ClusterRole's trust principal (aws-facts §5)
TIERED_MIN_PERCENT = 20  # the setup guide's documented range is 20-100 (aws-facts §6)
PLAN_USABLE = ("Scheduled", "Active")

EksCall = Callable[[str, dict[str, Any]], dict[str, Any]]  # (operation, params) -> the EKS simulator's answer


class WorldFacts(Protocol):
    """The read-only questions the checks ask about the account (``MotoFacts`` answers them)."""

    def role(self, name_or_arn: str) -> Role | None: ...

    def security_group(self, group_id: str) -> SecurityGroup | None: ...

    def bucket_exists(self, bucket: str) -> bool: ...

    def subnet(self, subnet_id: str) -> Subnet | None: ...


def invalid(message: str) -> AwsError:
    return AwsError("ValidationException", message)


def instance_types(spec: dict[str, Any]) -> list[str]:
    if spec.get("InstanceType"):
        return [str(spec["InstanceType"])]
    return [str(t) for t in (spec.get("InstanceRequirements") or {}).get("InstanceTypes") or []]


def capacity_type(spec: dict[str, Any]) -> str:
    """``Spot`` or ``OnDemand``: the presence of ``CapacityRequirements.Spot`` selects Spot."""
    return "Spot" if "Spot" in (spec.get("CapacityRequirements") or {}) else "OnDemand"


def interface_type(spec: dict[str, Any]) -> str:
    """The group's network interface mode; a spec without ``NetworkInterface`` gets ``efa`` (EFA with ENA)."""
    return str((spec.get("NetworkInterface") or {}).get("InterfaceType") or "efa")


def bucket_of(uri: str) -> str:
    return uri.removeprefix("s3://").split("/", 1)[0]


# --- rules across fields (no world needed) ---------------------------------------------------------------


def check_cluster_rules(config: dict[str, Any]) -> None:
    """Cluster-level rules over the configuration as it will be (create: the request; update: merged)."""
    orchestrator = config.get("Orchestrator") or {}
    autoscaling = (config.get("AutoScaling") or {}).get("Mode") == "Enable"
    if autoscaling and config.get("NodeProvisioningMode") != "Continuous":
        raise invalid("AutoScaling can be enabled only for clusters with NodeProvisioningMode set to Continuous.")
    tiered = config.get("TieredStorageConfig") or {}
    if tiered.get("Mode") == "Enable":
        if "Slurm" in orchestrator or "Eks" not in orchestrator:
            raise invalid("TieredStorageConfig is only supported for clusters orchestrated by Amazon EKS.")
        percent = tiered.get("InstanceMemoryAllocationPercentage")
        if percent is not None and int(percent) < TIERED_MIN_PERCENT:
            raise invalid(f"InstanceMemoryAllocationPercentage must be between {TIERED_MIN_PERCENT} and 100; "
                          f"got {percent}.")


def check_group_rules(spec: dict[str, Any], config: dict[str, Any]) -> None:
    """Rules within one instance group spec, given the cluster configuration it will run under."""
    name = spec["InstanceGroupName"]
    for instance_type in instance_types(spec):
        resources = instance_resources(instance_type)
        if interface_type(spec) == "efa-only" and resources.efa == 0:
            raise invalid(f"Instance group {name}: InterfaceType efa-only is not supported for instance type "
                          f"{instance_type}, which does not support Elastic Fabric Adapter (EFA).")
        if int(spec.get("ThreadsPerCore", 1)) == 2 and resources.arch == "arm64":
            raise invalid(f"Instance group {name}: instance type {instance_type} does not support multithreading; "
                          "ThreadsPerCore must be 1.")
    if spec.get("TrainingPlanArn") and capacity_type(spec) == "Spot":
        raise invalid(f"Instance group {name}: TrainingPlanArn cannot be used together with Spot capacity "
                      "(CapacityRequirements.Spot).")
    if (config.get("AutoScaling") or {}).get("Mode") == "Enable" and spec.get("OnStartDeepHealthChecks"):
        raise invalid(f"Instance group {name}: OnStartDeepHealthChecks is not supported on clusters with "
                      "AutoScaling enabled.")


def check_unchanged(name: str, old: dict[str, Any], new: dict[str, Any]) -> None:
    """What an UpdateCluster may not change in an existing group: fixed for the group's life."""
    if new.get("InstanceType") and old.get("InstanceType") and new["InstanceType"] != old["InstanceType"]:
        raise invalid(f"Instance group {name}: InstanceType cannot be changed from {old['InstanceType']} to "
                      f"{new['InstanceType']}.")
    if capacity_type(new) != capacity_type(old):
        raise invalid(f"Instance group {name}: the capacity type cannot be changed from {capacity_type(old)} to "
                      f"{capacity_type(new)} (CapacityRequirements is fixed when the group is created).")
    if interface_type(new) != interface_type(old):
        raise invalid(f"Instance group {name}: NetworkInterface InterfaceType cannot be changed from "
                      f"{interface_type(old)} to {interface_type(new)} (fixed when the group is created).")


# --- prerequisites in the account ------------------------------------------------------------------------


def check_role(facts: WorldFacts, arn: str, principal: str) -> None:
    role = facts.role(arn)
    if role is None or not role.trusts(principal):
        raise invalid(f"Could not assume role {arn}. Please ensure that the role exists and allows principal "
                      f"'{principal}' to assume the role.")


def check_network(facts: WorldFacts, vpc: dict[str, Any], vpc_id: str | None, where: str) -> str | None:
    """Subnets and security groups exist and share one VPC (``vpc_id`` when known: the EKS cluster's).
    Returns that VPC."""
    for subnet_id in vpc.get("Subnets") or []:
        subnet = facts.subnet(subnet_id)
        if subnet is None:
            raise invalid(f"{where}: the subnet ID '{subnet_id}' does not exist.")
        if vpc_id is None:
            vpc_id = subnet.vpc
        elif subnet.vpc != vpc_id:
            raise invalid(f"{where}: subnet {subnet_id} belongs to VPC {subnet.vpc}, not to {vpc_id}. All subnets "
                          "and security groups must be in the VPC of the cluster.")
    for group_id in vpc.get("SecurityGroupIds") or []:
        group = facts.security_group(group_id)
        if group is None:
            raise invalid(f"{where}: the security group '{group_id}' does not exist.")
        if vpc_id is not None and group.vpc != vpc_id:
            raise invalid(f"{where}: security group {group_id} belongs to VPC {group.vpc}, not to {vpc_id}. All "
                          "subnets and security groups must be in the VPC of the cluster.")
    return vpc_id


def check_groups_in_world(facts: WorldFacts, specs: Iterable[dict[str, Any]], vpc_id: str | None) -> None:
    for spec in specs:
        name = spec["InstanceGroupName"]
        check_role(facts, spec["ExecutionRole"], SAGEMAKER)
        uri = (spec.get("LifeCycleConfig") or {}).get("SourceS3Uri")
        if uri and not facts.bucket_exists(bucket_of(uri)):
            raise invalid(f"Instance group {name}: the S3 bucket {bucket_of(uri)} of LifeCycleConfig.SourceS3Uri "
                          f"{uri} does not exist.")
        if spec.get("OverrideVpcConfig"):
            check_network(facts, spec["OverrideVpcConfig"], vpc_id, f"Instance group {name} OverrideVpcConfig")


def check_eks_access(cluster: dict[str, Any]) -> None:
    mode = (cluster.get("accessConfig") or {}).get("authenticationMode", "CONFIG_MAP")
    if mode not in ("API", "API_AND_CONFIG_MAP"):
        raise invalid(f"The Amazon EKS cluster {cluster['arn']} uses authentication mode {mode}. SageMaker HyperPod "
                      "requires authentication mode API or API_AND_CONFIG_MAP.")


# --- training plans --------------------------------------------------------------------------------------


def check_plan(spec: dict[str, Any], plan: dict[str, Any], zone_of: Callable[[str], str], subnets: list[str],
               in_use: int) -> None:
    """A group on a training plan: the plan is usable, the group sits in the plan's zone, and the plan's
    instances (``in_use`` held by other groups) cover the group's count."""
    name, arn = spec["InstanceGroupName"], plan["TrainingPlanArn"]
    if plan["Status"] not in PLAN_USABLE:
        raise invalid(f"Instance group {name}: training plan {arn} is in {plan['Status']} status; it must be "
                      "Scheduled or Active.")
    summary = plan["ReservedCapacitySummaries"][0]
    zone = summary["AvailabilityZone"]
    outside = [s for s in subnets if zone_of(s) != zone]
    if outside:
        raise invalid(f"Instance group {name}: subnet {outside[0]} is in {zone_of(outside[0])}, but training plan "
                      f"{arn} reserves capacity in {zone}. Use subnets in {zone} (OverrideVpcConfig).")
    total = int(plan["TotalInstanceCount"])
    if in_use + int(spec["InstanceCount"]) > total:
        raise invalid(f"Instance group {name}: InstanceCount {spec['InstanceCount']} exceeds the capacity of "
                      f"training plan {arn}: {total} instances reserved, {in_use} in use by other instance groups.")
