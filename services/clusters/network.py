"""The ``network`` stage of ``cluster.create``, and :func:`ensure_compute_subnet`, the one function every
capacity path uses for HyperPod nodes' subnet.

A new VPC gets what EKS and HyperPod need: DNS support and hostnames, an internet gateway, a public and a
private subnet in each of the plan's two zones, one NAT gateway (with its Elastic IP) in the public subnet of
the compute zone, a public and a private route table, an S3 gateway endpoint on the private one, the EFA
security group (all traffic to and from itself) and the compute subnet. An existing VPC gets only the
security group and the compute subnet: nothing of the user's is tagged or modified (the compute subnet is
associated with a route table of theirs that leads to a NAT gateway, which changes only our subnet).

Every resource is found by its tags before it is made (our two tags and a role tag in the create call's
``TagSpecifications``, never a separate tagging call), so a crash between a create and the next look never
makes a second VPC, NAT gateway or Elastic IP. The stage never sleeps: a NAT gateway that is not yet
``available`` is a :class:`~services.stages.Wait` with its reason.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Collection
from typing import Any, Literal, cast

from services.clusters.create_base import CreateStage, ec2_cluster_filters, ec2_tag_specs, owned
from services.clusters.create_models import ClusterCreatePlan, NetworkResult, PlannedResource
from services.clusters.intents import CIDR_BLOCK, ResourceIntents
from services.errors import Conflict, Invalid, Permanent, Transient
from services.stages import Done, Observed, StageContext, Wait

ROLE_TAG = "instantstart:network-role"  # public, private, compute, nat, vpc, igw, ...: which one of ours it is
#: on a compute subnet carved from a VPC CIDR block we added: that association's id (teardown removes it)
CIDR_TAG = "instantstart:cidr-association"
COMPUTE_PREFIX = 20
EKS_SUBNET_PREFIX = 24  # public and private subnets of a new VPC: EKS's ENIs and load balancers only
NAT_WAIT = 15.0  # AWS makes a NAT gateway available in 1-3 minutes
CIDR_WAIT = 2.0  # a new VPC CIDR block is associated within seconds
_ZONE_ID = re.compile(r"^[a-z]{3,4}\d-az\d+$")
_LIVE_NAT = ("pending", "available")
_ANY_IPV4 = "0.0.0.0/0"
# Where a secondary block is taken from, by the range of the VPC's primary block: AWS refuses another
# RFC 1918 range than the primary's, and accepts 100.64.0.0/10 beside any of them. 172.17.0.0/16 is left
# out: it is Docker's bridge network, which SageMaker and EKS nodes use themselves.
_SECONDARY_POOLS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("10.0.0.0/8", ("10.0.0.0/8", "100.64.0.0/10")),
    ("172.16.0.0/12", ("172.16.0.0/12", "100.64.0.0/10")),
    ("192.168.0.0/16", ("100.64.0.0/10",)),
)
_AVOID = (ipaddress.ip_network("172.17.0.0/16"),)


def _net(cidr: str) -> ipaddress.IPv4Network:
    return ipaddress.IPv4Network(cidr)


def _zone_keys(zone: str) -> tuple[str, str]:
    """The describe filter and the CreateSubnet parameter for a zone given by name or by zone id."""
    return ("availability-zone-id", "AvailabilityZoneId") if _ZONE_ID.match(zone) else \
        ("availability-zone", "AvailabilityZone")


def _role_filters(cluster: str, role: str, vpc_id: str | None = None) -> list[dict[str, Any]]:
    filters = [*ec2_cluster_filters(cluster), {"Name": f"tag:{ROLE_TAG}", "Values": [role]}]
    return filters + ([{"Name": "vpc-id", "Values": [vpc_id]}] if vpc_id else [])


def _tags(tags: dict[str, str], role: str, **extra: str) -> dict[str, str]:
    return {**tags, **extra, ROLE_TAG: role}


def free_block(blocks: list[str], taken: list[str], prefix: int) -> str | None:
    """The first ``/prefix`` inside ``blocks`` (in order) that overlaps none of ``taken``, or None."""
    used = [_net(c) for c in taken]
    for block in (_net(b) for b in blocks):
        if block.prefixlen > prefix:
            continue
        for candidate in block.subnets(new_prefix=prefix):
            if not any(candidate.overlaps(u) for u in used):
                return str(candidate)
    return None


def secondary_block(primary: str, blocks: list[str], routes: list[str]) -> str | None:
    """The first /16 AWS would accept as another CIDR block of a VPC whose primary block is ``primary``:
    in the primary's RFC 1918 range (or 100.64.0.0/10), overlapping none of its ``blocks`` nor any route
    destination of its route tables."""
    first = _net(primary)
    pools = next((p for r, p in _SECONDARY_POOLS if first.subnet_of(_net(r))), ("100.64.0.0/10",))
    used = [_net(c) for c in [*blocks, *routes] if c != _ANY_IPV4] + list(_AVOID)
    for pool in pools:
        for candidate in _net(pool).subnets(new_prefix=16):
            if not any(candidate.overlaps(u) for u in used):
                return str(candidate)
    return None


def find_compute_subnet(ec2: Any, vpc_id: str, zone: str, cluster: str) -> str | None:
    """The compute subnet ``cluster`` already has in ``zone`` of ``vpc_id`` (found by its tags), if any."""
    zone_filter, _ = _zone_keys(zone)
    found = [s for s in ec2.describe_subnets(Filters=[*_role_filters(cluster, "compute", vpc_id),
                                                      {"Name": zone_filter, "Values": [zone]}])["Subnets"]
             if owned(s.get("Tags"), cluster) and {"Key": ROLE_TAG, "Value": "compute"} in s.get("Tags", [])]
    return str(min(found, key=lambda s: s["SubnetId"])["SubnetId"]) if found else None


def _private_route_table(ec2: Any, vpc_id: str, zone: str, cluster: str) -> tuple[str | None, dict[str, str]]:
    """The route table a compute subnet in ``zone`` joins: the cluster's own private one, else one that
    sends 0.0.0.0/0 to a NAT gateway (one used by a subnet of the same zone first); and which route table
    each subnet of the VPC is explicitly associated with."""
    tables = ec2.all_pages("describe_route_tables", "RouteTables", Filters=[{"Name": "vpc-id", "Values": [vpc_id]}])
    associated = {a["SubnetId"]: t["RouteTableId"] for t in tables for a in t.get("Associations", [])
                  if a.get("SubnetId")}
    ours = [t for t in tables if owned(t.get("Tags"), cluster)
            and {"Key": ROLE_TAG, "Value": "private"} in t.get("Tags", [])]
    if ours:
        return str(ours[0]["RouteTableId"]), associated
    natted = [t for t in tables if any(r.get("DestinationCidrBlock") == _ANY_IPV4 and r.get("NatGatewayId")
                                       and r.get("State") != "blackhole" for r in t.get("Routes", []))]
    if not natted:
        return None, associated
    zone_filter, _ = _zone_keys(zone)
    in_zone = {s["SubnetId"] for s in ec2.all_pages("describe_subnets", "Subnets", Filters=[
        {"Name": "vpc-id", "Values": [vpc_id]}, {"Name": zone_filter, "Values": [zone]}])}
    natted.sort(key=lambda t: (not any(a.get("SubnetId") in in_zone for a in t.get("Associations", [])),
                               t["RouteTableId"]))
    return str(natted[0]["RouteTableId"]), associated


def ensure_compute_subnet(ec2: Any, vpc_id: str, zone: str, cluster: str, tags: dict[str, str],
                          prefix: int = COMPUTE_PREFIX, original: Collection[str] | None = None,
                          intents: ResourceIntents | None = None) -> str:
    """HyperPod nodes' subnet for ``cluster`` in ``zone`` (name or zone id) of ``vpc_id``: the one tagged for
    the cluster there, else a new ``/prefix`` in the first free range of the VPC's CIDR blocks, else (the VPC
    is full) in a CIDR block it adds to the VPC. Associated with the private route table
    (:func:`_private_route_table`; with none, the subnet keeps the VPC's main route table). Two calls make
    one subnet. Raises :class:`~services.errors.Transient` while a block it added is still associating (AWS
    answers ``associating``; the retry makes the subnet).

    ``original``: the association ids of the VPC's CIDR blocks when the caller first looked, kept by the
    caller across retries and crashes (the stage's persisted data). A subnet carved from a block not among
    them that holds no other subnet (one this call or an earlier, interrupted one added) carries that
    association's id (``CIDR_TAG``), so teardown removes the block from a user's VPC.

    ``intents``: the installation's record of what it is about to create (every caller in the product gives
    it). The block's CIDR is recorded there, in a transaction of its own, before ``AssociateVpcCidrBlock``,
    so a block a crashed call added is ours also for a brand-new operation (whose ``original`` already
    holds it) and for the teardown. Without either, only a block this very call saw associated is ours."""
    subnet_id = find_compute_subnet(ec2, vpc_id, zone, cluster)
    if subnet_id is None:
        subnet_id = _create_compute_subnet(ec2, vpc_id, zone, cluster, tags, prefix, original, intents)
    table, associated = _private_route_table(ec2, vpc_id, zone, cluster)
    if table is not None and subnet_id not in associated:
        ec2.associate_route_table(RouteTableId=table, SubnetId=subnet_id)
    return subnet_id


def block_ids(vpc: dict[str, Any]) -> list[str]:
    """The association ids of a VPC's IPv4 CIDR blocks that are (or are becoming) associated."""
    return sorted(str(a["AssociationId"]) for a in vpc.get("CidrBlockAssociationSet", [])
                  if a["CidrBlockState"]["State"] in ("associated", "associating"))


def _create_compute_subnet(ec2: Any, vpc_id: str, zone: str, cluster: str, tags: dict[str, str],
                           prefix: int, original: Collection[str] | None, intents: ResourceIntents | None) -> str:
    vpc = ec2.describe_vpcs(VpcIds=[vpc_id])["Vpcs"][0]
    blocks = [a for a in vpc.get("CidrBlockAssociationSet", [])
              if a["CidrBlockState"]["State"] in ("associated", "associating")]
    pending = [a["CidrBlock"] for a in blocks if a["CidrBlockState"]["State"] == "associating"]
    if pending:
        raise Transient(f"VPC {vpc_id}'s CIDR block {pending[0]} is still associating; the compute subnet "
                        "is made once it is associated", delay=CIDR_WAIT)
    subnets = ec2.all_pages("describe_subnets", "Subnets", Filters=[{"Name": "vpc-id", "Values": [vpc_id]}])
    extra: dict[str, str] = {}
    cidr = free_block([a["CidrBlock"] for a in blocks], [s["CidrBlock"] for s in subnets], prefix)
    if cidr is None:
        association = _add_block(ec2, vpc, [a["CidrBlock"] for a in blocks], cluster, intents)
        if association["CidrBlockState"]["State"] != "associated":
            raise Transient(f"VPC {vpc_id} is full; its new CIDR block {association['CidrBlock']} is associating",
                            delay=CIDR_WAIT)
        cidr = str(next(_net(association["CidrBlock"]).subnets(new_prefix=prefix)))
        extra[CIDR_TAG] = str(association["AssociationId"])
    else:  # a block an interrupted call added: recorded before its call, or empty and new since the first look
        recorded = {i.key for i in intents.recorded(cluster, CIDR_BLOCK, vpc_id)} if intents else set()
        added = [a for a in blocks if _net(cidr).subnet_of(_net(a["CidrBlock"])) and (
            a["CidrBlock"] in recorded or (original is not None and a["AssociationId"] not in original
                                           and not any(_net(s["CidrBlock"]).subnet_of(_net(a["CidrBlock"]))
                                                       for s in subnets)))]
        if added:
            extra[CIDR_TAG] = str(added[0]["AssociationId"])
    _, zone_param = _zone_keys(zone)
    name = f"{cluster}-compute-{zone}"
    created = ec2.create_subnet(VpcId=vpc_id, CidrBlock=cidr, **{zone_param: zone},
                                TagSpecifications=ec2_tag_specs("subnet", _tags(tags, "compute", **extra), name))
    return str(created["Subnet"]["SubnetId"])


def _add_block(ec2: Any, vpc: dict[str, Any], blocks: list[str], cluster: str,
               intents: ResourceIntents | None) -> dict[str, Any]:
    """Associate another /16 with a full VPC, its intent recorded first; answers the association as AWS did
    (``associating`` at first)."""
    tables = ec2.all_pages("describe_route_tables", "RouteTables",
                           Filters=[{"Name": "vpc-id", "Values": [vpc["VpcId"]]}])
    routes = [r["DestinationCidrBlock"] for t in tables for r in t.get("Routes", []) if r.get("DestinationCidrBlock")]
    block = secondary_block(vpc["CidrBlock"], blocks, routes)
    if block is None:
        raise Permanent(f"VPC {vpc['VpcId']} has no free /{COMPUTE_PREFIX} for HyperPod's nodes and no /16 "
                        "is left to add to it; give a VPC with room (or a larger CIDR)")
    if intents is not None:
        intents.intend(cluster, CIDR_BLOCK, vpc["VpcId"], block)
    answer = ec2.associate_vpc_cidr_block(VpcId=vpc["VpcId"], CidrBlock=block)
    added = cast(dict[str, Any], answer["CidrBlockAssociation"])
    if intents is not None:
        intents.created(cluster, CIDR_BLOCK, vpc["VpcId"], block, str(added["AssociationId"]))
    return added


def layout(vpc_cidr: str, zones: list[str]) -> dict[tuple[str, str], str]:
    """The public and private subnets of a new VPC: the first /24s of its CIDR, public then private, one
    per zone (the compute /20 goes in the first free range after them)."""
    block = _net(vpc_cidr)
    if block.prefixlen > EKS_SUBNET_PREFIX - 2:
        raise Invalid(f"VPC CIDR {vpc_cidr} is too small: a new VPC needs a /22 or larger (four /24 subnets "
                      f"for EKS and a /{COMPUTE_PREFIX} for HyperPod, added as a second block if it does not fit)")
    slots = block.subnets(new_prefix=EKS_SUBNET_PREFIX)
    return {(role, zone): str(next(slots)) for role in ("public", "private") for zone in zones}


class _Network:
    """One pass over the network a plan asks for: each piece observed by its tags, made if missing (or, with
    ``write`` False, reported missing by raising :class:`_Missing`). Ids go to ``data`` as they are known."""

    def __init__(self, ec2: Any, plan: ClusterCreatePlan, data: dict[str, Any], write: bool,
                 intents: ResourceIntents) -> None:
        self.ec2 = ec2
        self.intents = intents
        self.plan = plan
        self.data = data
        self.write = write
        self.cluster = plan.name

    def ours(self, items: list[dict[str, Any]], role: str | None = None) -> list[dict[str, Any]]:
        """What a tag-filtered describe found, checked again here (moto ignores some tag filters)."""
        return [i for i in items if owned(i.get("Tags"), self.cluster)
                and (role is None or {"Key": ROLE_TAG, "Value": role} in i.get("Tags", []))]

    def need(self, what: str) -> None:
        if not self.write:
            raise _Missing(what)

    def specs(self, kind: str, role: str, name: str, **extra: str) -> list[dict[str, Any]]:
        return ec2_tag_specs(kind, _tags(self.plan.tags, role, **extra), name)

    def run(self) -> Wait | None:
        plan = self.plan
        if plan.vpc_id is not None:
            vpc_id = self.existing_vpc(plan.vpc_id)
            self.data.update(public_subnets=[], private_subnets=list(plan.subnet_ids))
            self.security_group(vpc_id)
            self.compute_subnet(vpc_id)
            return None
        vpc_id = self.vpc()
        igw = self.internet_gateway(vpc_id)
        zones = [plan.zone, plan.second_zone]
        cidrs = layout(plan.vpc_cidr, zones)
        public = [self.subnet(vpc_id, "public", z, cidrs["public", z]) for z in zones]
        private = [self.subnet(vpc_id, "private", z, cidrs["private", z]) for z in zones]
        self.data.update(public_subnets=public, private_subnets=private)
        self.route_table(vpc_id, "public", public, igw_id=igw)
        nat_id, nat_state = self.nat_gateway(vpc_id, public[0])
        private_table = self.route_table(vpc_id, "private", private,
                                         nat_id=nat_id if nat_state == "available" else None)
        self.s3_endpoint(vpc_id, private_table)
        self.security_group(vpc_id)
        self.compute_subnet(vpc_id)
        if nat_state != "available":
            return Wait(NAT_WAIT, f"NAT gateway {nat_id} is {nat_state} (AWS takes 1-3 minutes); the private "
                                  "route to it follows")
        return None

    # ----- the pieces ----------------------------------------------------------------------------------

    def existing_vpc(self, vpc_id: str) -> str:
        vpc = self.ec2.describe_vpcs(VpcIds=[vpc_id])["Vpcs"][0]  # NotFound (InvalidVpcID.NotFound) if it is gone
        # its CIDR blocks at the stage's first look (saved before any act): a block added after is ours
        self.data.setdefault("vpc_blocks", block_ids(vpc))
        self.data["vpc_id"] = vpc_id
        return vpc_id

    def vpc(self) -> str:
        found = self.ours(self.ec2.describe_vpcs(Filters=ec2_cluster_filters(self.cluster))["Vpcs"])
        if len(found) > 1:
            raise Permanent(f"several VPCs carry cluster {self.cluster}'s tags: "
                            f"{', '.join(v['VpcId'] for v in found)}; delete the extra ones")
        if found:
            vpc_id = str(found[0]["VpcId"])
        else:
            self.need("VPC")
            vpc_id = str(self.ec2.create_vpc(CidrBlock=self.plan.vpc_cidr, TagSpecifications=self.specs(
                "vpc", "vpc", self.plan.names.vpc))["Vpc"]["VpcId"])
        self.data["vpc_id"] = vpc_id
        for attribute in ("EnableDnsSupport", "EnableDnsHostnames"):
            answer = self.ec2.describe_vpc_attribute(VpcId=vpc_id, Attribute=attribute[0].lower() + attribute[1:])
            if not answer[attribute]["Value"]:
                self.need(f"VPC attribute {attribute}")
                self.ec2.modify_vpc_attribute(VpcId=vpc_id, **{attribute: {"Value": True}})
        return vpc_id

    def internet_gateway(self, vpc_id: str) -> str:
        found = self.ours(self.ec2.describe_internet_gateways(
            Filters=_role_filters(self.cluster, "igw"))["InternetGateways"], "igw")
        if found:
            gateway = found[0]
        else:
            self.need("internet gateway")
            gateway = self.ec2.create_internet_gateway(TagSpecifications=self.specs(
                "internet-gateway", "igw", f"{self.cluster}-igw"))["InternetGateway"]
        igw = str(gateway["InternetGatewayId"])
        if not any(a.get("VpcId") == vpc_id for a in gateway.get("Attachments", [])):
            self.need("internet gateway attachment")
            self.ec2.attach_internet_gateway(InternetGatewayId=igw, VpcId=vpc_id)
        self.data["internet_gateway"] = igw
        return igw

    def subnet(self, vpc_id: str, role: str, zone: str, cidr: str) -> str:
        zone_filter, zone_param = _zone_keys(zone)
        found = self.ours(self.ec2.describe_subnets(Filters=[*_role_filters(self.cluster, role, vpc_id),
                                                             {"Name": zone_filter, "Values": [zone]}])["Subnets"],
                          role)
        elb = {"kubernetes.io/role/elb": "1"} if role == "public" else {"kubernetes.io/role/internal-elb": "1"}
        if found:
            subnet = found[0]
        else:
            self.need(f"{role} subnet in {zone}")
            subnet = self.ec2.create_subnet(VpcId=vpc_id, CidrBlock=cidr, **{zone_param: zone},
                                            TagSpecifications=self.specs("subnet", role, f"{self.cluster}-{role}-"
                                                                         f"{zone}", **elb))["Subnet"]
        subnet_id = str(subnet["SubnetId"])
        if role == "public" and not subnet.get("MapPublicIpOnLaunch"):
            self.need(f"public IPs on launch in {subnet_id}")
            self.ec2.modify_subnet_attribute(SubnetId=subnet_id, MapPublicIpOnLaunch={"Value": True})
        return subnet_id

    def nat_gateway(self, vpc_id: str, public_subnet: str) -> tuple[str, str]:
        """The NAT gateway in the compute zone's public subnet (and its Elastic IP): its id and state. A
        gateway that failed in this attempt stops the stage with AWS's reason; one that failed before it
        (a retried stage) is left for AWS to remove, and a new one is made."""
        found = self.ours(self.ec2.describe_nat_gateways(
            Filter=_role_filters(self.cluster, "nat", vpc_id))["NatGateways"], "nat")
        live = [n for n in found if n["State"] in _LIVE_NAT]
        failed = [n for n in found if n["State"] == "failed"
                  and n["NatGatewayId"] not in self.data.get("nat_failed_before", [])]
        if not live and failed and self.write:
            gone = failed[0]
            raise Permanent(f"NAT gateway {gone['NatGatewayId']} failed: {gone.get('FailureCode', '')}: "
                            f"{gone.get('FailureMessage', '')}; retry the stage to make another")
        if live:
            nat = live[0]
        else:
            self.need("NAT gateway")
            allocation = self.elastic_ip()
            nat = self.ec2.create_nat_gateway(SubnetId=public_subnet, AllocationId=allocation,
                                              ConnectivityType="public", TagSpecifications=self.specs(
                                                  "natgateway", "nat", f"{self.cluster}-nat"))["NatGateway"]
        self.data["nat_gateway"] = str(nat["NatGatewayId"])
        return str(nat["NatGatewayId"]), str(nat["State"])

    def elastic_ip(self) -> str:
        found = self.ours(self.ec2.describe_addresses(Filters=_role_filters(self.cluster, "nat"))["Addresses"], "nat")
        free = [a for a in found if not a.get("AssociationId")]
        if free:
            allocation = str(free[0]["AllocationId"])
        else:
            allocation = str(self.ec2.allocate_address(Domain="vpc", TagSpecifications=self.specs(
                "elastic-ip", "nat", f"{self.cluster}-nat"))["AllocationId"])
        self.data["elastic_ip"] = allocation
        return allocation

    def route_table(self, vpc_id: str, role: str, subnets: list[str], igw_id: str | None = None,
                    nat_id: str | None = None) -> str:
        found = self.ours(self.ec2.describe_route_tables(
            Filters=_role_filters(self.cluster, role, vpc_id))["RouteTables"], role)
        if found:
            table = found[0]
        else:
            self.need(f"{role} route table")
            table = self.ec2.create_route_table(VpcId=vpc_id, TagSpecifications=self.specs(
                "route-table", role, f"{self.cluster}-{role}-rt"))["RouteTable"]
        table_id = str(table["RouteTableId"])
        target = {"GatewayId": igw_id} if igw_id else {"NatGatewayId": nat_id} if nat_id else None
        if target is not None:
            route = next((r for r in table.get("Routes", []) if r.get("DestinationCidrBlock") == _ANY_IPV4), None)
            key, value = next(iter(target.items()))
            if route is None:
                self.need(f"{role} default route")
                self.ec2.create_route(RouteTableId=table_id, DestinationCidrBlock=_ANY_IPV4, **target)
            elif route.get(key) != value or route.get("State") == "blackhole":
                self.need(f"{role} default route")
                self.ec2.replace_route(RouteTableId=table_id, DestinationCidrBlock=_ANY_IPV4, **target)
        joined = {a.get("SubnetId") for a in table.get("Associations", [])}
        for subnet_id in subnets:
            if subnet_id not in joined:
                self.need(f"{role} route table association of {subnet_id}")
                self.ec2.associate_route_table(RouteTableId=table_id, SubnetId=subnet_id)
        self.data[f"{role}_route_table"] = table_id
        return table_id

    def s3_endpoint(self, vpc_id: str, table_id: str) -> None:
        service = f"com.amazonaws.{self.plan.region}.s3"
        found = [e for e in self.ours(self.ec2.describe_vpc_endpoints(Filters=[
            *_role_filters(self.cluster, "s3-endpoint", vpc_id),
            {"Name": "service-name", "Values": [service]}])["VpcEndpoints"], "s3-endpoint")
            if e.get("State", "").lower() not in ("deleted", "deleting", "failed")]
        if not found:
            self.need("S3 gateway endpoint")
            endpoint = self.ec2.create_vpc_endpoint(
                VpcId=vpc_id, ServiceName=service, VpcEndpointType="Gateway", RouteTableIds=[table_id],
                TagSpecifications=self.specs("vpc-endpoint", "s3-endpoint", f"{self.cluster}-s3"))["VpcEndpoint"]
        else:
            endpoint = found[0]
            if table_id not in endpoint.get("RouteTableIds", []):
                self.need("S3 endpoint route")
                self.ec2.modify_vpc_endpoint(VpcEndpointId=endpoint["VpcEndpointId"], AddRouteTableIds=[table_id])
        self.data["s3_endpoint"] = str(endpoint["VpcEndpointId"])

    def security_group(self, vpc_id: str) -> str:
        """The EFA security group: all traffic in from and out to itself (EFA's rule), and out anywhere."""
        name = self.plan.names.security_group
        found = self.ec2.describe_security_groups(Filters=[{"Name": "vpc-id", "Values": [vpc_id]},
                                                           {"Name": "group-name", "Values": [name]}])["SecurityGroups"]
        if found and not owned(found[0].get("Tags"), self.cluster):
            raise Conflict(f"VPC {vpc_id} already has a security group named {name} ({found[0]['GroupId']}) that "
                           f"is not cluster {self.cluster}'s; rename or delete it")
        if found:
            group = found[0]
        else:
            self.need("security group")
            group_id = self.ec2.create_security_group(
                GroupName=name, VpcId=vpc_id, Description=f"InstantStart {self.cluster}: HyperPod nodes, all "
                                                          "traffic within the group (EFA)",
                TagSpecifications=self.specs("security-group", "security-group", name))["GroupId"]
            group = {"GroupId": group_id, "IpPermissions": [], "IpPermissionsEgress": [
                {"IpProtocol": "-1", "IpRanges": [{"CidrIp": _ANY_IPV4}]}]}  # what CreateSecurityGroup adds
        group_id = str(group["GroupId"])
        self.data["security_group"] = group_id
        rule_tags = self.specs("security-group-rule", "security-group", name)
        myself = {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group_id}]}
        if not _allows(group.get("IpPermissions", []), group_id=group_id):
            self.need("security group ingress from itself")
            self.ec2.authorize_security_group_ingress(GroupId=group_id, IpPermissions=[myself],
                                                      TagSpecifications=rule_tags)
        egress = group.get("IpPermissionsEgress", [])
        wanted = [] if _allows(egress, group_id=group_id) else [myself]
        if not _allows(egress, cidr=_ANY_IPV4):
            wanted.append({"IpProtocol": "-1", "IpRanges": [{"CidrIp": _ANY_IPV4}]})
        if wanted:
            self.need("security group egress")
            self.ec2.authorize_security_group_egress(GroupId=group_id, IpPermissions=wanted,
                                                     TagSpecifications=rule_tags)
        return group_id

    def compute_subnet(self, vpc_id: str) -> None:
        zone = self.plan.zone
        if not self.write:
            subnet_id = find_compute_subnet(self.ec2, vpc_id, zone, self.cluster)
            if subnet_id is None:
                raise _Missing("compute subnet")
            table, associated = _private_route_table(self.ec2, vpc_id, zone, self.cluster)
            if table is not None and subnet_id not in associated:
                raise _Missing("compute subnet's route table association")
        else:
            subnet_id = ensure_compute_subnet(self.ec2, vpc_id, zone, self.cluster, self.plan.tags,
                                              original=self.data.get("vpc_blocks"), intents=self.intents)
        self.data["compute_subnet"] = subnet_id


def _allows(permissions: list[dict[str, Any]], group_id: str | None = None, cidr: str | None = None) -> bool:
    """Whether a rule list already has an all-traffic rule for ``group_id`` or ``cidr``."""
    for rule in permissions:
        if rule.get("IpProtocol") != "-1":
            continue
        if group_id and any(p.get("GroupId") == group_id for p in rule.get("UserIdGroupPairs", [])):
            return True
        if cidr and any(r.get("CidrIp") == cidr for r in rule.get("IpRanges", [])):
            return True
    return False


class _Missing(Exception):
    """Raised by a read-only pass at the first piece that is not there yet."""


class NetworkStage(CreateStage):
    """``network``: the VPC and everything in it (or, with an existing VPC, only our security group and
    compute subnet). Observe is a read-only pass; act and poll are the same pass with writes, so whatever
    exists is found by its tags and only what is missing is made."""

    name = "network"
    expected_seconds = 180.0  # the NAT gateway: 1-3 minutes in AWS

    def _ec2(self, plan: ClusterCreatePlan) -> Any:
        return self.deps.aws.client("ec2", plan.region)

    def _pass(self, ctx: StageContext[ClusterCreatePlan], write: bool) -> _Network:
        return _Network(self._ec2(ctx.request), ctx.request, ctx.data, write,
                        ResourceIntents(self.deps.registry.db, self.deps.clock))

    def observe(self, ctx: StageContext[ClusterCreatePlan]) -> Observed:
        ctx.data["nat_failed_before"] = sorted(
            str(n["NatGatewayId"]) for n in self._ec2(ctx.request).describe_nat_gateways(
                Filter=_role_filters(ctx.request.name, "nat"))["NatGateways"] if n["State"] == "failed")
        try:
            waiting = self._pass(ctx, write=False).run()
        except _Missing:
            return Observed.ABSENT
        return Observed.DONE if waiting is None else Observed.IN_PROGRESS

    def act(self, ctx: StageContext[ClusterCreatePlan]) -> None:
        self._pass(ctx, write=True).run()

    def poll(self, ctx: StageContext[ClusterCreatePlan]) -> Done | Wait:
        waiting = self._pass(ctx, write=True).run()
        return Done() if waiting is None else waiting

    def result(self, ctx: StageContext[ClusterCreatePlan]) -> dict[str, Any]:
        d = ctx.data
        return NetworkResult(vpc_id=d["vpc_id"], public_subnets=d["public_subnets"],
                             private_subnets=d["private_subnets"], compute_subnet=d["compute_subnet"],
                             security_group=d["security_group"]).model_dump()

    def resources(self, plan: ClusterCreatePlan) -> list[PlannedResource]:
        def row(kind: str, name: str, detail: str = "",
                action: Literal["create", "reuse", "apply"] = "create") -> PlannedResource:
            return PlannedResource(stage=self.name, type=f"AWS::EC2::{kind}", name=name, action=action, detail=detail)

        compute = row("Subnet", f"{plan.name}-compute-{plan.zone}",
                      f"a free /{COMPUTE_PREFIX} in {plan.zone} (HyperPod's nodes); a second VPC CIDR block is "
                      "added if none is free")
        group = row("SecurityGroup", plan.names.security_group, "all traffic within the group (EFA), out anywhere")
        if plan.vpc_id is not None:
            return [row("VPC", plan.vpc_id, "existing", "reuse"),
                    *(row("Subnet", s, "existing, for EKS", "reuse") for s in plan.subnet_ids), group, compute]
        zones = [plan.zone, plan.second_zone]
        cidrs = layout(plan.vpc_cidr, zones)
        return [row("VPC", plan.names.vpc, f"{plan.vpc_cidr}, DNS support and hostnames"),
                row("InternetGateway", f"{plan.name}-igw", "attached to the VPC"),
                *(row("Subnet", f"{plan.name}-{role}-{z}", f"{cidrs[role, z]} in {z}"
                      + (", public IPs on launch" if role == "public" else ", EKS control plane"))
                  for role in ("public", "private") for z in zones),
                row("EIP", f"{plan.name}-nat", "for the NAT gateway"),
                row("NatGateway", f"{plan.name}-nat", f"in the public subnet of {plan.zone}"),
                row("RouteTable", f"{plan.name}-public-rt", "0.0.0.0/0 to the internet gateway"),
                row("RouteTable", f"{plan.name}-private-rt", "0.0.0.0/0 to the NAT gateway"),
                row("VPCEndpoint", f"{plan.name}-s3", f"S3 gateway endpoint (com.amazonaws.{plan.region}.s3) on "
                                                      "the private route table"),
                group, compute]
