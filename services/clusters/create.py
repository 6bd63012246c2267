"""The precheck of ``cluster.create``: from the user's decisions to a complete :class:`ClusterCreatePlan`, or
a refusal (422/409) that names the valid alternatives, before any operation row or AWS write exists.

Cheap checks come first (the name and the names derived from it, tags, choices that contradict each other,
the registry), then the facts of :class:`~services.clusters.options.OptionsReader` (the same cached read
the create form shows): the zone, whether it offers the instance type, the cluster-usage quota, the VPC and
Elastic IP quotas, EKS and HyperPod clusters of that name, our identity. Every computed value (the second
zone, CIDRs, the Kubernetes version, the shared bucket) is fixed here, once, and stored with the operation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from services.aws import AwsClients
from services.clusters.create_base import cluster_tags
from services.clusters.create_models import (
    INSTANCE_GROUP,
    CapacityType,
    ClusterCreate,
    ClusterCreatePlan,
    DerivedNames,
)
from services.clusters.options import ClusterOptions, InstanceTypeOption, OptionsQuery, OptionsReader
from services.clusters.registry import ClusterRegistry
from services.errors import Conflict, Invalid
from services.settings import Settings

DEFAULT_VPC_CIDR = "10.192.0.0/16"
RESERVED_TAG_PREFIXES = ("aws:", "instantstart:")
IAM_ROLE_MAX = 64
HYPERPOD_NAME_MAX = 63
#: the names whose limits bind, as (what, limit, name); more (the components' roles) are added by callers
NameRule = tuple[str, int, str]


def derive_names(name: str) -> DerivedNames:
    return DerivedNames(eks_cluster=name, hyperpod_cluster=name, vpc=f"{name}-vpc", security_group=f"{name}-efa",
                        eks_role=f"{name}-eks-cluster-role", execution_role=f"{name}-hyperpod-exec-role",
                        instance_group=INSTANCE_GROUP, lifecycle_prefix=f"instantstart/{name}/lifecycle/")


def name_rules(names: DerivedNames, extra_roles: Sequence[str] = ()) -> list[NameRule]:
    roles = [names.eks_role, names.execution_role, *extra_roles]
    return [("HyperPod cluster name", HYPERPOD_NAME_MAX, names.hyperpod_cluster),
            *(("IAM role name", IAM_ROLE_MAX, role) for role in roles)]


def check_name(name: str, extra_roles: Callable[[str], Sequence[str]] = lambda _: ()) -> DerivedNames:
    """The derived names, or a refusal naming each one a service would reject and the longest name that fits."""
    names = derive_names(name)
    broken = [f"{what} {value!r} is {len(value)} characters (at most {limit})"
              for what, limit, value in name_rules(names, extra_roles(name)) if len(value) > limit]
    if broken:
        slack = min(limit - len(value) for what, limit, value in name_rules(names, extra_roles(name)))
        fits = len(name) + slack
        raise Invalid(f"the name {name!r} is too long for the resources it names: " + "; ".join(broken)
                      + f". Use at most {fits} characters.", details={"max_name_length": fits,
                                                                       "derived_names": names.model_dump()})
    return names


class CreatePlanner:
    """Prechecks a :class:`ClusterCreate` and computes its plan (see the module docstring)."""

    def __init__(self, aws: AwsClients, options: OptionsReader, registry: ClusterRegistry, settings: Settings,
                 extra_roles: Callable[[str], Sequence[str]] = lambda _: ()) -> None:
        self.aws = aws
        self.options = options
        self.registry = registry
        self.settings = settings
        self.extra_roles = extra_roles

    def plan(self, request: ClusterCreate, requested_by: str, reserved: frozenset[str]) -> tuple[
            ClusterCreatePlan, list[str]]:
        """The plan and its warnings, or Invalid/Conflict before anything is written anywhere."""
        self._check_request(request, reserved)
        names = check_name(request.name, self.extra_roles)
        region = request.region or self.settings.region
        facts = self.options.read(OptionsQuery(region=region, refresh=True))  # a create decides on fresh facts
        self._check_names_free(request.name, facts)
        zone = next((z for z in facts.zones if request.zone in (z.name, z.zone_id)), None)
        if zone is None:
            raise Invalid(f"{region} has no Availability Zone {request.zone!r}; its zones: "
                          + ", ".join(f"{z.name} ({z.zone_id})" for z in facts.zones),
                          details={"zones": [z.name for z in facts.zones]})
        others = sorted(z.name for z in facts.zones if z.name != zone.name and z.state in ("available", ""))
        if not others and request.vpc_id is None:
            raise Invalid(f"EKS needs subnets in two Availability Zones and {region} offers only {zone.name}")
        itype = self._instance_type(request, facts, zone.name)
        warnings = self._check_quotas(request, facts, itype)
        account = facts.identity.split(":")[4]
        bucket = request.bucket or self.settings.shared_bucket or f"instantstart-shared-{account}-{region}"
        plan = ClusterCreatePlan(
            name=request.name, region=region, account=account, zone=zone.name, zone_id=zone.zone_id,
            second_zone=others[0] if others else zone.name, instance_type=request.instance_type,
            count=request.count, capacity_type=request.capacity_type, training_plan_arn=request.training_plan_arn,
            deep_health_checks=list(request.deep_health_checks),
            kubernetes_version=request.kubernetes_version or self._default_version(region),
            vpc_cidr=request.vpc_cidr or DEFAULT_VPC_CIDR, vpc_id=request.vpc_id, subnet_ids=request.subnet_ids,
            endpoint_public_access_cidrs=request.endpoint_public_access_cidrs or ["0.0.0.0/0"],
            ebs_volume_gib=request.ebs_volume_gib, bucket=bucket, fsx=request.fsx, efa=itype.efa_interfaces > 0,
            accelerator=itype.accelerator, control_plane_principal=facts.identity,
            admin_principals=request.admin_principals, tags=cluster_tags(request.name, request.tags), names=names,
            requested_by=requested_by)
        return plan, warnings

    # ----- checks --------------------------------------------------------------------------------------

    def _check_request(self, request: ClusterCreate, reserved: frozenset[str]) -> None:
        if request.name in reserved:
            raise Invalid(f"{request.name!r} names a route under /api/v1/clusters/, not a cluster: choose another "
                          "name", details={"reserved": sorted(reserved)})
        bad_tags = sorted(k for k in request.tags if k.lower().startswith(RESERVED_TAG_PREFIXES))
        if bad_tags:
            raise Invalid(f"tag keys {bad_tags} are reserved (aws: is AWS's, instantstart: is ours)",
                          details={"reserved_prefixes": list(RESERVED_TAG_PREFIXES)})
        planned = request.capacity_type is CapacityType.TRAINING_PLAN
        if planned != (request.training_plan_arn is not None):
            raise Invalid("training_plan_arn goes with capacity_type=training-plan, and only with it"
                          if not planned else "capacity_type=training-plan needs training_plan_arn: the plan "
                          "whose reserved capacity the nodes use (aws sagemaker list-training-plans)")
        if request.subnet_ids and request.vpc_id is None:
            raise Invalid("subnet_ids name subnets of an existing VPC: give its vpc_id too")
        if request.vpc_id is not None and len(request.subnet_ids) < 2:
            raise Invalid("with an existing vpc_id, give subnet_ids for EKS in at least two Availability Zones")
        if request.fsx is not None and (request.fsx.mode == "existing") != (request.fsx.file_system_id is not None):
            raise Invalid("fsx.file_system_id goes with fsx.mode=existing, and only with it")
        known = self.registry.find(request.name)
        if known is not None:
            raise Conflict(f"a cluster named {request.name!r} is registered here already ({known.ownership.value}, "
                           f"{known.eks_arn}); choose another name, or retry its failed create operation",
                           details={"cluster": request.name, "status_tool": "operations_list"})

    def _check_names_free(self, name: str, facts: ClusterOptions) -> None:
        for cluster in facts.clusters:
            if cluster.name == name:
                raise Conflict(f"{facts.region} has a{'n EKS' if cluster.kind == 'eks' else ' HyperPod'} cluster "
                               f"named {name!r} already ({cluster.ownership}); choose another name"
                               + (", or import it (POST /api/v1/clusters/import)" if cluster.ownership == "foreign"
                                  else ""), details={"existing": cluster.model_dump()})

    def _instance_type(self, request: ClusterCreate, facts: ClusterOptions, zone: str) -> InstanceTypeOption:
        itype = next((t for t in facts.instance_types if t.instance_type == request.instance_type), None)
        if itype is None:
            raise Invalid(f"{request.instance_type} is not a HyperPod instance type any zone of {facts.region} offers",
                          details={"instance_types": [t.instance_type for t in facts.instance_types]})
        if zone not in itype.zones:
            here = [t.instance_type for t in facts.instance_types if zone in t.zones]
            raise Invalid(f"{zone} does not offer {request.instance_type}; it is offered in "
                          f"{', '.join(itype.zones)}. Types {zone} offers: {', '.join(here) or 'none'}",
                          details={"zones": itype.zones, "instance_types": here})
        return itype

    def _check_quotas(self, request: ClusterCreate, facts: ClusterOptions, itype: InstanceTypeOption) -> list[str]:
        warnings: list[str] = []
        if itype.quota is None:
            warnings.append(f"the cluster-usage quota of {itype.instance_type} could not be read")
        elif itype.in_use + request.count > itype.quota:
            free = max(int(itype.quota) - itype.in_use, 0)
            raise Invalid(f"{request.count} x {itype.instance_type} exceeds the quota '{itype.instance_type} for "
                          f"cluster usage' of {itype.quota} ({itype.in_use} in use, {free} free): ask for at most "
                          f"{free}, or request a quota increase", details={"quota": itype.quota,
                                                                           "in_use": itype.in_use, "free": free})
        needs = {"VPCs per Region": 0 if request.vpc_id else 1, "EC2-VPC Elastic IPs": 0 if request.vpc_id else 1}
        for quota in facts.quotas:
            want = needs.get(quota.name, 0)
            if not want:
                continue
            if quota.limit is None:
                warnings.append(f"the quota {quota.name!r} could not be read")
            elif quota.in_use + want > quota.limit:
                raise Invalid(f"the quota {quota.name!r} is {quota.limit:g} and {quota.in_use} are in use: a new "
                              "cluster needs one more. Give an existing vpc_id, free one, or request an increase",
                              details={"quota": quota.name, "limit": quota.limit, "in_use": quota.in_use})
        return warnings

    def _default_version(self, region: str) -> str:
        versions = self.aws.client("eks", region).describe_cluster_versions(defaultOnly=True)["clusterVersions"]
        if not versions:
            raise Invalid(f"EKS in {region} names no default Kubernetes version: give kubernetes_version")
        return str(versions[0]["clusterVersion"])
