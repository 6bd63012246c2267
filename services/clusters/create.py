"""The precheck of ``cluster.create``: from the user's decisions to a complete :class:`ClusterCreatePlan`, or
a refusal (422/409) that names the valid alternatives, before any operation row or AWS write exists.

Cheap checks come first (the name and the names derived from it, tags, choices that contradict each other,
the registry), then the facts of :class:`~services.clusters.options.OptionsReader` (the same cached read
the create form shows): the zone, whether it offers the instance type, the cluster-usage quota, the VPC and
Elastic IP quotas, EKS and HyperPod clusters of that name, our identity. Every computed value (the second
zone, CIDRs, the Kubernetes version, the shared bucket) is fixed here, once, and stored with the operation.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from services.aws import AwsClients
from services.clusters.checks import access_entry_principal
from services.clusters.create_base import cluster_tags, owned
from services.clusters.create_models import (
    INSTANCE_GROUP,
    CapacityType,
    ClusterCreate,
    ClusterCreatePlan,
    DerivedNames,
)
from services.clusters.options import ClusterOptions, InstanceTypeOption, OptionsQuery, OptionsReader
from services.clusters.registry import ClusterRegistry
from services.components.families import FSX_CSI_ROLE, LBC_ROLE, S3_CSI_ROLE
from services.errors import Conflict, Invalid, NotFound, ServiceError
from services.settings import Settings

DEFAULT_VPC_CIDR = "10.192.0.0/16"
RESERVED_TAG_PREFIXES = ("aws:", "instantstart:")
IAM_ROLE_MAX = 64
HYPERPOD_NAME_MAX = 63
#: the names whose limits bind, as (what, limit, name)
NameRule = tuple[str, int, str]
COMPONENT_ROLES = (S3_CSI_ROLE, FSX_CSI_ROLE, LBC_ROLE)  # the components' own roles, <name>-<suffix>
IAM_PRINCIPAL = r"^arn:aws[a-z-]*:iam::\d{12}:(user|role)/([\w+=,.@-]+/)*[\w+=,.@-]+$"


def derive_names(name: str) -> DerivedNames:
    return DerivedNames(eks_cluster=name, hyperpod_cluster=name, vpc=f"{name}-vpc", security_group=f"{name}-efa",
                        eks_role=f"{name}-eks-cluster-role", execution_role=f"{name}-hyperpod-exec-role",
                        instance_group=INSTANCE_GROUP, lifecycle_prefix=f"instantstart/{name}/lifecycle/")


def role_names(name: str, names: DerivedNames) -> list[str]:
    """Every IAM role a create makes: the cluster's two and each component's."""
    return [names.eks_role, names.execution_role, *(f"{name}-{role.suffix}" for role in COMPONENT_ROLES)]


def name_rules(name: str, names: DerivedNames) -> list[NameRule]:
    roles = role_names(name, names)
    return [("HyperPod cluster name", HYPERPOD_NAME_MAX, names.hyperpod_cluster),
            *(("IAM role name", IAM_ROLE_MAX, role) for role in roles)]


def check_name(name: str) -> DerivedNames:
    """The derived names, or a refusal naming each one a service would reject and the longest name that fits."""
    names = derive_names(name)
    rules = name_rules(name, names)
    broken = [f"{what} {value!r} is {len(value)} characters (at most {limit})"
              for what, limit, value in rules if len(value) > limit]
    if broken:
        slack = min(limit - len(value) for what, limit, value in rules)
        fits = len(name) + slack
        raise Invalid(f"the name {name!r} is too long for the resources it names: " + "; ".join(broken)
                      + f". Use at most {fits} characters.", details={"max_name_length": fits,
                                                                       "derived_names": names.model_dump()})
    return names


class CreatePlanner:
    """Prechecks a :class:`ClusterCreate` and computes its plan (see the module docstring)."""

    def __init__(self, aws: AwsClients, options: OptionsReader, registry: ClusterRegistry, settings: Settings) -> None:
        self.aws = aws
        self.options = options
        self.registry = registry
        self.settings = settings

    def plan(self, request: ClusterCreate, requested_by: str, reserved: frozenset[str], *, fresh: bool = True
             ) -> tuple[ClusterCreatePlan, list[str]]:
        """The plan and its warnings, or Invalid/Conflict before anything is written anywhere. ``fresh``: decide
        on facts read now (a create); a dry run may use the options cache of the create form (15 s)."""
        self._check_request(request, reserved)
        names = check_name(request.name)
        admins = self._check_principals(request.admin_principals)
        region = request.region or self.settings.region
        facts = self.options.read(OptionsQuery(region=region, refresh=fresh))
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
        version = self._version(region, request.kubernetes_version)
        self._check_existing(request, region, names, bucket)
        plan = ClusterCreatePlan(
            name=request.name, region=region, account=account, zone=zone.name, zone_id=zone.zone_id,
            second_zone=others[0] if others else zone.name, instance_type=request.instance_type,
            count=request.count, capacity_type=request.capacity_type, training_plan_arn=request.training_plan_arn,
            deep_health_checks=list(request.deep_health_checks),
            kubernetes_version=version,
            vpc_cidr=request.vpc_cidr or DEFAULT_VPC_CIDR, vpc_id=request.vpc_id, subnet_ids=request.subnet_ids,
            endpoint_public_access_cidrs=request.endpoint_public_access_cidrs or ["0.0.0.0/0"],
            ebs_volume_gib=request.ebs_volume_gib, bucket=bucket, fsx=request.fsx, efa=itype.efa_interfaces > 0,
            accelerator=itype.accelerator, control_plane_principal=facts.identity,
            admin_principals=admins, tags=cluster_tags(request.name, request.tags), names=names,
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

    def _version(self, region: str, asked: str | None) -> str:
        """The asked Kubernetes version if EKS offers it, else EKS's default."""
        eks = self.aws.client("eks", region)
        if asked is None:
            versions = eks.describe_cluster_versions(defaultOnly=True)["clusterVersions"]
            if not versions:
                raise Invalid(f"EKS in {region} names no default Kubernetes version: give kubernetes_version")
            return str(versions[0]["clusterVersion"])
        offered = [str(v["clusterVersion"]) for v in eks.all_pages("describe_cluster_versions", "clusterVersions")]
        if asked not in offered:
            raise Invalid(f"EKS in {region} does not create Kubernetes {asked}; it offers {', '.join(offered)}",
                          details={"kubernetes_versions": offered})
        return asked

    @staticmethod
    def _check_principals(principals: Sequence[str]) -> list[str]:
        """Admin principals as access entries can name them: IAM users and roles, never STS sessions."""
        for arn in principals:
            mapped = access_entry_principal(arn)
            if mapped != arn:
                raise Invalid(f"access entries cannot name the STS session {arn}: give its IAM principal {mapped}",
                              details={"principal": arn, "use": mapped})
            if re.fullmatch(IAM_PRINCIPAL, arn) is None:
                raise Invalid(f"{arn} is not an IAM user or role ARN (arn:aws:iam::<account>:role/<name>)",
                              details={"principal": arn})
        return list(dict.fromkeys(principals))

    def _check_existing(self, request: ClusterCreate, region: str, names: DerivedNames, bucket: str) -> None:
        """What the create would reuse or make, read now: the user's VPC and subnets, an existing FSx, the
        training plan, the role names (someone else's?) and the shared bucket (someone else's?)."""
        ec2 = self.aws.client("ec2", region)
        if request.vpc_id is not None:
            try:
                ec2.describe_vpcs(VpcIds=[request.vpc_id])
                subnets = ec2.describe_subnets(SubnetIds=request.subnet_ids)["Subnets"]
            except NotFound as exc:
                raise Invalid(f"the existing network you named is not there: {exc.message}") from None
            elsewhere = sorted(s["SubnetId"] for s in subnets if s["VpcId"] != request.vpc_id)
            if elsewhere:
                raise Invalid(f"subnets {elsewhere} are not in {request.vpc_id}", details={"subnets": elsewhere})
            if len({s["AvailabilityZone"] for s in subnets}) < 2:
                raise Invalid("EKS needs subnet_ids in at least two Availability Zones",
                              details={"zones": sorted({s["AvailabilityZone"] for s in subnets})})
        if request.fsx is not None and request.fsx.file_system_id is not None:
            self._check_file_system(request, region)
        if request.training_plan_arn is not None:
            plan_name = request.training_plan_arn.rsplit("/", 1)[-1]
            try:
                found = self.aws.client("sagemaker", region).describe_training_plan(TrainingPlanName=plan_name)
            except NotFound:
                raise Invalid(f"no training plan {request.training_plan_arn} in {region}") from None
            if found.get("Status") not in ("Active", "Scheduled", "Pending"):
                raise Invalid(f"training plan {plan_name} is {found.get('Status')}: its capacity cannot be used")
        iam = self.aws.client("iam", region)
        for role in role_names(request.name, names):
            try:
                tags = iam.list_role_tags(RoleName=role).get("Tags", [])
            except NotFound:
                continue
            if not owned(tags, request.name):
                raise Conflict(f"an IAM role named {role} exists and is not this cluster's: choose another name",
                               details={"role": role})
        try:
            self.aws.client("s3", region).head_bucket(Bucket=bucket)
        except ServiceError as exc:
            if isinstance(exc, NotFound) or (exc.details or {}).get("http_status") == 404:
                return  # the iam stage makes it
            raise Invalid(f"the shared bucket {bucket} is not usable by this control plane ({exc.message}): name "
                          "a bucket of this account (setting shared_bucket, or the bucket field)",
                          details={"bucket": bucket}) from None

    def _check_file_system(self, request: ClusterCreate, region: str) -> None:
        assert request.fsx is not None and request.fsx.file_system_id is not None
        if request.vpc_id is None:
            raise Invalid("an existing FSx file system lives in an existing VPC: give that vpc_id (and its "
                          "subnet_ids) too, or choose fsx mode=new", details={"fsx": request.fsx.file_system_id})
        try:
            found: dict[str, Any] = self.aws.client("fsx", region).describe_file_systems(
                FileSystemIds=[request.fsx.file_system_id])["FileSystems"][0]
        except ServiceError as exc:
            if isinstance(exc, NotFound) or (exc.details or {}).get("aws_code") == "FileSystemNotFound":
                raise Invalid(f"no FSx file system {request.fsx.file_system_id} in {region}") from None
            raise
        if found.get("FileSystemType") != "LUSTRE" or found.get("Lifecycle") != "AVAILABLE":
            raise Invalid(f"{request.fsx.file_system_id} is a {found.get('FileSystemType')} file system in state "
                          f"{found.get('Lifecycle')}: an AVAILABLE Lustre one is needed")
        if found.get("VpcId") != request.vpc_id:
            raise Invalid(f"{request.fsx.file_system_id} is in {found.get('VpcId')}, not {request.vpc_id}")


def plan_matches(request: ClusterCreate, plan: dict[str, Any]) -> bool:
    """Whether a stored plan is what ``request`` asks (an Idempotency-Key replay): every decision the request
    made is the plan's; what it left to be computed may be anything."""
    asked = request.model_dump(mode="json", exclude_unset=True)
    for key, value in asked.items():
        if key == "zone":
            if value not in (plan.get("zone"), plan.get("zone_id")):
                return False
        elif key == "tags":
            if any(plan.get("tags", {}).get(k) != v for k, v in value.items()):
                return False
        elif plan.get(key) != value:
            return False
    return True
