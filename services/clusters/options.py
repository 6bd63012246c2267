"""Inspect before create: what a region offers for a HyperPod cluster, read from the APIs (never a list
written here), so a create form offers only valid choices and a create precheck can name the alternatives.

* Regions and Availability Zones (names and zone ids): EC2 ``DescribeRegions``/``DescribeAvailabilityZones``.
* Instance types: the values HyperPod accepts are the botocore ``ClusterInstanceType`` enum of the client's
  own model; which zones offer each and its accelerator, GPU memory, vCPU, memory and EFA facts come from EC2
  ``DescribeInstanceTypeOfferings``/``DescribeInstanceTypes`` for the same type without its ``ml.`` prefix.
* Quotas: Service Quotas ``<type> for cluster usage`` (SageMaker) with the instances HyperPod clusters of the
  region already run of that type; VPCs per region and EC2-VPC Elastic IPs, with what is in use.
* Existing VPCs (ours by the ``instantstart:managed-by`` tag, else foreign) and clusters (registered here as
  managed or imported, else foreign); HyperPod's service-linked role; the caller's identity and, where IAM's
  policy simulator answers, whether it may perform the actions a create needs.

One call of :meth:`OptionsReader.read` makes every read once; its result is cached per (region, zone) on
the short-TTL AWS cache, and a ``refresh`` reads again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from pydantic import Field

from services.aws import AwsClients
from services.awscache import AwsCache
from services.clusters.checks import access_entry_principal
from services.clusters.registry import ClusterRegistry
from services.errors import Invalid, NotFound, ServiceError
from services.models import RequestModel, ResponseModel

MANAGED_TAG = "instantstart:managed-by"
CLUSTER_TAG = "instantstart:cluster"
SERVICE_LINKED_ROLE = "AWSServiceRoleForSageMakerHyperPod"
VPC_QUOTA = ("vpc", "L-F678F1CE")  # VPCs per Region
EIP_QUOTA = ("ec2", "L-0263D0A3")  # EC2-VPC Elastic IPs
#: what creating a cluster calls, checked with IAM's policy simulator where it answers
CREATE_ACTIONS = ("ec2:CreateVpc", "ec2:CreateSubnet", "ec2:CreateNatGateway", "ec2:AllocateAddress",
                  "iam:CreateRole", "iam:PassRole", "eks:CreateCluster", "eks:CreateAccessEntry",
                  "eks:CreateAddon", "sagemaker:CreateCluster", "s3:CreateBucket", "fsx:CreateFileSystem")


class OptionsQuery(RequestModel):
    region: str | None = Field(None, pattern=r"^[a-z]{2}(-[a-z]+)+-\d$",
                               description="AWS region to inspect (default: the server's region)")
    zone: str | None = Field(None, pattern=r"^[a-z]{2}(-[a-z]+)+-\d[a-z]$|^[a-z]{3,4}\d-az\d+$",
                             description="only instance types this Availability Zone offers (name or zone id)")
    refresh: bool = Field(False, description="read AWS again instead of the short-lived cache")


class ZoneOption(ResponseModel):
    name: str
    zone_id: str
    state: str


class InstanceTypeOption(ResponseModel):
    instance_type: str = Field(..., description="the HyperPod type, e.g. ml.p5.48xlarge")
    zones: list[str] = Field(..., description="Availability Zones of the region that offer it")
    vcpus: int | None = None
    memory_gib: float | None = None
    accelerator: str | None = Field(None, description="e.g. NVIDIA H100, AWS Trainium")
    accelerators: int = 0
    accelerator_memory_gib: float | None = Field(None, description="memory of all its accelerators together")
    efa_interfaces: int = Field(0, description="EFA interfaces it supports (0: no EFA)")
    # facts a precheck reads (instance groups' ThreadsPerCore), left out of the answer to keep it small
    threads_per_core: list[int] = Field(default_factory=list, exclude=True,
                                        description="the ThreadsPerCore values it accepts (EC2's "
                                                    "ValidThreadsPerCore; empty: unknown)")
    default_threads_per_core: int | None = Field(None, exclude=True,
                                                 description="its default threads per core (EC2)")
    quota: int | None = Field(None, description="'<type> for cluster usage' quota (None: not readable)")
    in_use: int = Field(0, description="instances of this type the region's HyperPod clusters run now")


class QuotaOption(ResponseModel):
    name: str
    limit: float | None = Field(None, description="None: the quota could not be read")
    in_use: int


class VpcOption(ResponseModel):
    vpc_id: str
    cidr: str
    name: str = ""
    ours: bool = Field(..., description="created by an InstantStart control plane (its managed-by tag)")
    cluster: str | None = Field(None, description="the cluster its instantstart:cluster tag names")


class ExistingCluster(ResponseModel):
    name: str
    kind: str = Field(..., description="eks or hyperpod")
    status: str | None = Field(None, description="HyperPod's cluster status (EKS clusters are listed by name)")
    ownership: str = Field(..., description="managed or imported (registered here), else foreign")


class ClusterOptions(ResponseModel):
    """What a HyperPod cluster can be made of in a region, and what is already there."""

    region: str
    regions: list[str]
    zones: list[ZoneOption]
    instance_types: list[InstanceTypeOption] = Field(
        ..., description="types HyperPod accepts that at least one zone (or the asked zone) offers")
    quotas: list[QuotaOption] = Field(..., description="VPCs per region and Elastic IPs, with what is in use")
    vpcs: list[VpcOption]
    clusters: list[ExistingCluster]
    service_linked_role: bool | None = Field(
        None, description=f"whether {SERVICE_LINKED_ROLE} exists (HyperPod makes it on first use if allowed)")
    identity: str = Field(..., description="the IAM principal this control plane acts as")
    missing_permissions: list[str] | None = Field(
        None, description="create actions IAM's simulator denies this principal (None: the simulator did not "
                          "answer; the create's own calls will tell)")
    notes: list[str] = Field(default_factory=list, description="reads that failed, and why")
    cache_age_seconds: float = 0.0


def _chunks(items: list[str], size: int) -> Iterable[list[str]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


class OptionsReader:
    """Reads :class:`ClusterOptions` for a region (and optionally one zone)."""

    def __init__(self, aws: AwsClients, cache: AwsCache, registry: ClusterRegistry, default_region: str) -> None:
        self.aws = aws
        self.cache = cache
        self.registry = registry
        self.default_region = default_region

    def read(self, query: OptionsQuery) -> ClusterOptions:
        region = query.region or self.default_region
        regions, _ = self.cache.get(("options", "regions", self.default_region, "*"), self._regions,
                                    refresh=query.refresh)
        if region not in regions:
            raise Invalid(f"no AWS region {region!r} is enabled for this account; regions: " + ", ".join(regions),
                          details={"regions": regions})
        key = ("options", "inspect", region, query.zone or "*")
        options, age = self.cache.get(key, lambda: self._load(region, query.zone, regions), refresh=query.refresh)
        return options.model_copy(update={"cache_age_seconds": round(age, 3)})  # type: ignore[no-any-return]

    def _regions(self) -> list[str]:
        regions = self.aws.client("ec2", self.default_region).describe_regions()["Regions"]
        return sorted(r["RegionName"] for r in regions)

    def _load(self, region: str, zone: str | None, regions: list[str]) -> ClusterOptions:
        notes: list[str] = []

        def attempt(what: str, read: Callable[[], Any], default: Any) -> Any:
            try:
                return read()
            except ServiceError as exc:  # one unreadable fact must not hide the others
                notes.append(f"{what}: {exc.message}")
                return default

        ec2 = self.aws.client("ec2", region)
        zones = [ZoneOption(name=z["ZoneName"], zone_id=z["ZoneId"], state=z.get("State", ""))
                 for z in ec2.describe_availability_zones()["AvailabilityZones"]]
        if zone is not None and zone not in {z.name for z in zones} | {z.zone_id for z in zones}:
            raise Invalid(f"{region} has no Availability Zone {zone!r}; its zones: "
                          + ", ".join(f"{z.name} ({z.zone_id})" for z in zones),
                          details={"zones": [z.name for z in zones]})
        wanted_zone = next((z.name for z in zones if zone in (z.name, z.zone_id)), None)
        hyperpod = attempt("HyperPod clusters", lambda: self._hyperpod_clusters(region), [])
        in_use: dict[str, int] = {}
        for cluster in hyperpod:
            for group in cluster.get("InstanceGroups", []):
                kind = group["InstanceType"]
                in_use[kind] = in_use.get(kind, 0) + int(group.get("CurrentCount", 0))
        quotas = attempt("SageMaker cluster-usage quotas", lambda: self._cluster_quotas(region), {})
        types = self._instance_types(ec2, wanted_zone, quotas, in_use)
        vpcs = [self._vpc(v) for v in ec2.all_pages("describe_vpcs", "Vpcs")]
        addresses = attempt("Elastic IPs", lambda: ec2.describe_addresses()["Addresses"], [])
        vpc_limit = attempt("VPC quota", lambda: self._quota(region, *VPC_QUOTA), None)
        eip_limit = attempt("Elastic IP quota", lambda: self._quota(region, *EIP_QUOTA), None)
        limits = [QuotaOption(name="VPCs per Region", limit=vpc_limit, in_use=len(vpcs)),
                  QuotaOption(name="EC2-VPC Elastic IPs", limit=eip_limit, in_use=len(addresses))]
        clusters = self._clusters(region, hyperpod, notes)
        identity = access_entry_principal(self.aws.client("sts", region).get_caller_identity()["Arn"])
        slr = attempt("service-linked role", lambda: self._role_exists(region, SERVICE_LINKED_ROLE), None)
        missing = attempt("IAM policy simulator", lambda: self._missing(region, identity), None)
        return ClusterOptions(region=region, regions=regions, zones=zones, instance_types=types, quotas=limits,
                              vpcs=vpcs, clusters=clusters, service_linked_role=slr, identity=identity,
                              missing_permissions=missing, notes=notes)

    def _hyperpod_clusters(self, region: str) -> list[dict[str, Any]]:
        sagemaker = self.aws.client("sagemaker", region)
        summaries = sagemaker.all_pages("list_clusters", "ClusterSummaries")
        return [sagemaker.describe_cluster(ClusterName=s["ClusterName"]) for s in summaries]

    def _cluster_quotas(self, region: str) -> dict[str, float]:
        quotas = self.aws.client("service-quotas", region).all_pages("list_service_quotas", "Quotas",
                                                                     ServiceCode="sagemaker")
        suffix = " for cluster usage"
        return {q["QuotaName"][:-len(suffix)]: float(q["Value"]) for q in quotas
                if str(q.get("QuotaName", "")).endswith(suffix)}

    def _quota(self, region: str, service: str, code: str) -> float:
        quota = self.aws.client("service-quotas", region).get_service_quota(ServiceCode=service, QuotaCode=code)
        return float(quota["Quota"]["Value"])

    def _instance_types(self, ec2: Any, zone: str | None, quotas: dict[str, float],
                        in_use: dict[str, int]) -> list[InstanceTypeOption]:
        accepted: list[str] = list(self.aws.client("sagemaker").meta.service_model
                                   .shape_for("ClusterInstanceType").enum)
        ec2_names = {t.removeprefix("ml."): t for t in accepted}
        offered: dict[str, list[str]] = {}
        facts: dict[str, dict[str, Any]] = {}
        for chunk in _chunks(sorted(ec2_names), 100):
            for offer in ec2.all_pages("describe_instance_type_offerings", "InstanceTypeOfferings",
                                LocationType="availability-zone",
                                Filters=[{"Name": "instance-type", "Values": chunk}]):
                offered.setdefault(offer["InstanceType"], []).append(offer["Location"])
            for described in ec2.all_pages("describe_instance_types", "InstanceTypes",
                                    Filters=[{"Name": "instance-type", "Values": chunk}]):
                facts[described["InstanceType"]] = described
        out = []
        for name in sorted(offered):
            zones = sorted(offered[name])
            if zone is not None and zone not in zones:
                continue
            out.append(_type_option(ec2_names[name], zones, facts.get(name, {}), quotas, in_use))
        return out

    @staticmethod
    def _vpc(vpc: dict[str, Any]) -> VpcOption:
        tags = {t["Key"]: t["Value"] for t in vpc.get("Tags", [])}
        return VpcOption(vpc_id=vpc["VpcId"], cidr=vpc.get("CidrBlock", ""), name=tags.get("Name", ""),
                         ours=MANAGED_TAG in tags, cluster=tags.get(CLUSTER_TAG))

    def _clusters(self, region: str, hyperpod: list[dict[str, Any]], notes: list[str]) -> list[ExistingCluster]:
        registered = {r.eks_name: r.ownership.value for r in self.registry.list() if r.region == region}
        registered_hp = {r.hyperpod_name: r.ownership.value for r in self.registry.list()
                         if r.region == region and r.hyperpod_name}
        out = []
        try:
            for name in self.aws.client("eks", region).all_pages("list_clusters", "clusters"):
                out.append(ExistingCluster(name=name, kind="eks", ownership=registered.get(name, "foreign")))
        except ServiceError as exc:
            notes.append(f"EKS clusters: {exc.message}")
        for cluster in hyperpod:
            name = cluster["ClusterName"]
            out.append(ExistingCluster(name=name, kind="hyperpod", status=cluster.get("ClusterStatus", ""),
                                       ownership=registered_hp.get(name, "foreign")))
        return out

    def _role_exists(self, region: str, name: str) -> bool:
        try:
            self.aws.client("iam", region).get_role(RoleName=name)
        except NotFound:
            return False
        return True

    def _missing(self, region: str, identity: str) -> list[str]:
        results = self.aws.client("iam", region).simulate_principal_policy(
            PolicySourceArn=identity, ActionNames=list(CREATE_ACTIONS))["EvaluationResults"]
        return sorted(r["EvalActionName"] for r in results if r.get("EvalDecision") != "allowed")


def _type_option(instance_type: str, zones: list[str], facts: dict[str, Any], quotas: dict[str, float],
                 in_use: dict[str, int]) -> InstanceTypeOption:
    gpu = facts.get("GpuInfo") or {}
    neuron = facts.get("NeuronInfo") or {}
    devices = gpu.get("Gpus") or neuron.get("NeuronDevices") or []
    first = devices[0] if devices else {}
    total_mib = gpu.get("TotalGpuMemoryInMiB") or neuron.get("TotalNeuronDeviceMemoryInMiB")
    efa = (facts.get("NetworkInfo") or {}).get("EfaInfo") or {}
    quota = quotas.get(instance_type)
    return InstanceTypeOption(
        instance_type=instance_type, zones=zones,
        vcpus=(facts.get("VCpuInfo") or {}).get("DefaultVCpus"),
        memory_gib=round(facts["MemoryInfo"]["SizeInMiB"] / 1024, 1) if facts.get("MemoryInfo") else None,
        accelerator=" ".join(p for p in (first.get("Manufacturer"), first.get("Name")) if p) or None,
        accelerators=sum(int(d.get("Count", 0)) for d in devices),
        accelerator_memory_gib=round(total_mib / 1024, 1) if total_mib else None,
        efa_interfaces=int(efa.get("MaximumEfaInterfaces", 0)),
        threads_per_core=[int(t) for t in (facts.get("VCpuInfo") or {}).get("ValidThreadsPerCore") or []],
        default_threads_per_core=(facts.get("VCpuInfo") or {}).get("DefaultThreadsPerCore"),
        quota=int(quota) if quota is not None else None, in_use=in_use.get(instance_type, 0))
