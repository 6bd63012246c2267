"""The ``network`` stage of ``cluster.create``, its teardown, and ``ensure_compute_subnet``, against one
sandbox world (each test uses its own cluster name and VPC CIDR, so they share it without seeing each other).

What the tests assert is what EC2 saw: the call ledger ("created once", "no writes") and boto3 describes."""

from __future__ import annotations

import ipaddress
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from services.clusters.create_base import ClusterDeletePlan, cluster_tags, owned
from services.clusters.create_models import NetworkResult
from services.clusters.network import (
    CIDR_TAG,
    NetworkStage,
    block_ids,
    ensure_compute_subnet,
    free_block,
    secondary_block,
)
from services.clusters.network_teardown import LBC_TAG, NetworkTeardown
from services.errors import Transient
from services.operations import OperationView
from tests.conftest import ADMIN
from tests.create_support import SandboxProduct, held_answers, leftovers, make_plan, run_stages, sandbox_product
from tests.ledger import CallLedger
from tests.support import ROOT, wait_until

CREATES = ("CreateVpc", "CreateSubnet", "CreateInternetGateway", "AllocateAddress", "CreateNatGateway",
           "CreateRouteTable", "CreateVpcEndpoint", "CreateSecurityGroup", "AssociateVpcCidrBlock")


@pytest.fixture(scope="module")
def product(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxProduct]:
    with sandbox_product(Path(tmp_path_factory.mktemp("network"))) as p:
        yield p


@pytest.fixture(scope="module")
def ec2(product: SandboxProduct) -> Any:
    return product.client("ec2")


def _stage_ec2(product: SandboxProduct) -> Any:
    """The product's own EC2 client, as a stage has it (classified errors, no retries)."""
    return product.deps().aws.client("ec2")


def _vpc(ec2: Any, cidr: str) -> str:
    return str(ec2.create_vpc(CidrBlock=cidr)["Vpc"]["VpcId"])


def _subnet(ec2: Any, subnet_id: str) -> dict[str, Any]:
    return dict(ec2.describe_subnets(SubnetIds=[subnet_id])["Subnets"][0])


def _tags(resource: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in resource.get("Tags", [])}


def _creates(ledger: CallLedger, since: int) -> list[str]:
    return [e["operation"] for e in ledger.writes(since=since, service="ec2") if e["operation"] in CREATES]


# ----- ensure_compute_subnet ----------------------------------------------------------------------------


def test_free_block_skips_taken_ranges_and_blocks_too_small() -> None:
    assert free_block(["10.1.0.0/16"], ["10.1.0.0/20", "10.1.32.0/24"], 20) == "10.1.16.0/20"
    assert free_block(["10.1.0.0/16"], ["10.1.16.0/24"], 20) == "10.1.0.0/20"
    assert free_block(["10.2.0.0/22", "10.3.0.0/16"], [], 20) == "10.3.0.0/20", "a /22 holds no /20"
    assert free_block(["10.4.0.0/20"], ["10.4.0.0/24"], 20) is None
    assert secondary_block("10.4.0.0/20", ["10.4.0.0/20"], ["10.0.0.0/16"]) == "10.1.0.0/16", "routes are taken"
    assert secondary_block("172.31.0.0/16", ["172.31.0.0/16"], []) == "172.16.0.0/16"
    assert secondary_block("172.16.0.0/16", ["172.16.0.0/16"], []) == "172.18.0.0/16", "Docker's 172.17 is left"
    assert secondary_block("192.168.0.0/16", ["192.168.0.0/16"], []) == "100.64.0.0/16"


def test_compute_subnet_takes_the_first_free_20_and_a_second_call_reuses_it(
        product: SandboxProduct, ec2: Any) -> None:
    ledger = CallLedger(product.live)
    vpc_id = _vpc(ec2, "10.50.0.0/16")
    ec2.create_subnet(VpcId=vpc_id, CidrBlock="10.50.0.0/20", AvailabilityZone="us-west-2a")
    ec2.create_subnet(VpcId=vpc_id, CidrBlock="10.50.32.0/24", AvailabilityZone="us-west-2b")
    mark = ledger.mark()
    tags = cluster_tags("unit-a", {"team": "ml"})
    first = ensure_compute_subnet(_stage_ec2(product), vpc_id, "us-west-2a", "unit-a", tags)
    subnet = _subnet(ec2, first)
    assert subnet["CidrBlock"] == "10.50.16.0/20" and subnet["AvailabilityZone"] == "us-west-2a"
    assert owned(subnet["Tags"], "unit-a") and _tags(subnet)["Name"] == "unit-a-compute-us-west-2a"
    assert _tags(subnet)["team"] == "ml"
    again = ensure_compute_subnet(_stage_ec2(product), vpc_id, "us-west-2a", "unit-a", tags)
    assert again == first
    assert _creates(ledger, mark) == ["CreateSubnet"], "two calls make one subnet"
    created = ledger.once("ec2", "CreateSubnet", since=mark)
    assert "TagSpecification" in str(created.get("request")), created  # tagged in the create call itself
    other_zone = ensure_compute_subnet(_stage_ec2(product), vpc_id, "usw2-az1", "unit-a", tags)  # a zone id
    assert _subnet(ec2, other_zone)["CidrBlock"] == "10.50.48.0/20", "the next free /20, past the taken /24"
    foreign = ensure_compute_subnet(_stage_ec2(product), vpc_id, "us-west-2a", "unit-b", cluster_tags("unit-b"))
    assert foreign not in (first, other_zone), "another cluster's subnet is never reused"


def test_a_full_vpc_gets_a_second_cidr_block_once_and_the_retry_after_associating_records_it(
        product: SandboxProduct, ec2: Any) -> None:
    """AWS answers AssociateVpcCidrBlock with ``associating``: the call stops (Transient) and its retry, which
    makes the subnet, still knows the block is ours from the VPC's blocks at the caller's first look."""
    ledger = CallLedger(product.live)
    vpc_id = _vpc(ec2, "10.60.0.0/20")
    ec2.create_subnet(VpcId=vpc_id, CidrBlock="10.60.0.0/24", AvailabilityZone="us-west-2a")
    mark = ledger.mark()
    tags = cluster_tags("unit-full")
    original = block_ids(ec2.describe_vpcs(VpcIds=[vpc_id])["Vpcs"][0])
    with pytest.raises(Transient, match="associating"):
        ensure_compute_subnet(_stage_ec2(product), vpc_id, "us-west-2a", "unit-full", tags, original=original)
    assert not _creates(ledger, mark)[1:], "no subnet before the block is associated"
    subnet_id = ensure_compute_subnet(_stage_ec2(product), vpc_id, "us-west-2a", "unit-full", tags,
                                      original=original)
    association = ledger.once("ec2", "AssociateVpcCidrBlock", since=mark)
    blocks = {a["CidrBlock"]: a for a in ec2.describe_vpcs(VpcIds=[vpc_id])["Vpcs"][0]["CidrBlockAssociationSet"]}
    assert set(blocks) == {"10.60.0.0/20", "10.0.0.0/16"}, association
    subnet = _subnet(ec2, subnet_id)
    assert subnet["CidrBlock"] == "10.0.0.0/20"
    assert _tags(subnet)[CIDR_TAG] == blocks["10.0.0.0/16"]["AssociationId"], "the subnet says which block we added"
    assert ensure_compute_subnet(_stage_ec2(product), vpc_id, "us-west-2a", "unit-full", tags) == subnet_id
    assert _creates(ledger, mark) == ["AssociateVpcCidrBlock", "CreateSubnet"]
    assert f"ec2 CIDR block 10.0.0.0/16 ({blocks['10.0.0.0/16']['AssociationId']}) on VPC {vpc_id}" in leftovers(
        product.client, ledger.calls(since=mark), "unit-full"), "the block we added is a leftover while associated"


# ----- the stage ----------------------------------------------------------------------------------------


def _run(product: SandboxProduct, stage: Any, plan: Any) -> OperationView:
    return run_stages(product.services, [stage], plan)


def test_network_stage_builds_the_vpc_once_and_a_rerun_writes_nothing(product: SandboxProduct, ec2: Any) -> None:
    ledger = CallLedger(product.live)
    plan = make_plan("net-a", vpc_cidr="10.70.0.0/16", tags=cluster_tags("net-a", {"cost-center": "42"}))
    mark = ledger.mark()
    view = _run(product, NetworkStage(product.deps()), plan)
    assert view.status == "succeeded", view
    result = NetworkResult.model_validate(view.stages[0].result)
    creates = _creates(ledger, mark)
    assert sorted(creates) == sorted(["CreateVpc", "CreateInternetGateway", "CreateSubnet", "CreateSubnet",
                                      "CreateSubnet", "CreateSubnet", "CreateSubnet", "AllocateAddress",
                                      "CreateNatGateway", "CreateRouteTable", "CreateRouteTable",
                                      "CreateVpcEndpoint", "CreateSecurityGroup"]), creates
    for entry in ledger.writes(since=mark, service="ec2"):
        if entry["operation"] in CREATES and entry["operation"] != "AssociateVpcCidrBlock":
            assert "TagSpecification" in str(entry.get("request")), entry

    vpc = ec2.describe_vpcs(VpcIds=[result.vpc_id])["Vpcs"][0]
    assert vpc["CidrBlock"] == "10.70.0.0/16" and owned(vpc["Tags"], "net-a") and _tags(vpc)["cost-center"] == "42"
    for attribute in ("enableDnsSupport", "enableDnsHostnames"):
        answer = ec2.describe_vpc_attribute(VpcId=result.vpc_id, Attribute=attribute)
        assert answer[attribute[0].upper() + attribute[1:]]["Value"] is True
    igw = ec2.describe_internet_gateways(Filters=[{"Name": "attachment.vpc-id", "Values": [result.vpc_id]}])
    assert len(igw["InternetGateways"]) == 1 and owned(igw["InternetGateways"][0]["Tags"], "net-a")
    public = [_subnet(ec2, s) for s in result.public_subnets]
    private = [_subnet(ec2, s) for s in result.private_subnets]
    assert [s["AvailabilityZone"] for s in public] == [plan.zone, plan.second_zone]
    assert [s["AvailabilityZone"] for s in private] == [plan.zone, plan.second_zone]
    assert all(s["MapPublicIpOnLaunch"] for s in public) and not any(s["MapPublicIpOnLaunch"] for s in private)
    nat = ec2.describe_nat_gateways(Filter=[{"Name": "vpc-id", "Values": [result.vpc_id]}])["NatGateways"]
    assert [(n["State"], n["SubnetId"]) for n in nat] == [("available", result.public_subnets[0])]
    tables = {t["RouteTableId"]: t for t in ec2.describe_route_tables(
        Filters=[{"Name": "vpc-id", "Values": [result.vpc_id]}])["RouteTables"]}

    def table_of(subnet_id: str) -> dict[str, Any]:
        return next(t for t in tables.values() if any(a.get("SubnetId") == subnet_id for a in t["Associations"]))

    def default_route(table: dict[str, Any]) -> dict[str, Any]:
        return next(r for r in table["Routes"] if r.get("DestinationCidrBlock") == "0.0.0.0/0")

    igw_id = igw["InternetGateways"][0]["InternetGatewayId"]
    assert all(default_route(table_of(s))["GatewayId"] == igw_id for s in result.public_subnets)
    private_table = table_of(result.private_subnets[0])
    assert default_route(private_table)["NatGatewayId"] == nat[0]["NatGatewayId"]
    assert table_of(result.private_subnets[1]) == private_table == table_of(result.compute_subnet)
    endpoints = ec2.describe_vpc_endpoints(Filters=[{"Name": "vpc-id", "Values": [result.vpc_id]}])["VpcEndpoints"]
    assert [(e["ServiceName"], e["RouteTableIds"]) for e in endpoints] == [
        ("com.amazonaws.us-west-2.s3", [private_table["RouteTableId"]])]
    group = ec2.describe_security_groups(GroupIds=[result.security_group])["SecurityGroups"][0]
    assert group["GroupName"] == plan.names.security_group and owned(group["Tags"], "net-a")

    def to_self(rules: list[dict[str, Any]]) -> bool:
        return any(r["IpProtocol"] == "-1" and any(p["GroupId"] == result.security_group
                                                   for p in r["UserIdGroupPairs"]) for r in rules)

    assert to_self(group["IpPermissions"]) and to_self(group["IpPermissionsEgress"]), group
    assert any(r["IpProtocol"] == "-1" and {"CidrIp": "0.0.0.0/0"} in r["IpRanges"]
               for r in group["IpPermissionsEgress"])
    compute = _subnet(ec2, result.compute_subnet)
    assert compute["CidrBlock"] == "10.70.16.0/20" and compute["AvailabilityZone"] == plan.zone

    again = ledger.mark()
    second = _run(product, NetworkStage(product.deps()), plan)
    assert second.status == "succeeded" and second.stages[0].result == view.stages[0].result
    ledger.assert_no_writes(since=again)


def test_a_retry_that_lost_its_data_makes_no_second_vpc(product: SandboxProduct, ec2: Any) -> None:
    """The first operation dies after CreateVpc (the internet gateway is refused); a new operation, with no
    memory of the first, finds the VPC by its tags and makes only the rest."""
    ledger = CallLedger(product.live)
    plan = make_plan("net-crash", vpc_cidr="10.80.0.0/16")
    fault = product.live.post("/api/v1/sandbox/faults", {"kind": "access_denied", "count": 1,
                                                          "target": {"service": "ec2",
                                                                     "action": "CreateInternetGateway"}})
    assert fault.status_code == 201, fault.text
    mark = ledger.mark()
    failed = _run(product, NetworkStage(product.deps()), plan)
    assert failed.status == "failed" and "CreateInternetGateway" in str(failed.error), failed
    retried = _run(product, NetworkStage(product.deps()), plan)
    assert retried.status == "succeeded", retried
    ledger.once("ec2", "CreateVpc", since=mark)
    ledger.once("ec2", "CreateNatGateway", since=mark)
    ledger.once("ec2", "AllocateAddress", since=mark)
    vpcs = ec2.describe_vpcs(Filters=[{"Name": "tag:instantstart:cluster", "Values": ["net-crash"]}])["Vpcs"]
    assert [v["VpcId"] for v in vpcs] == [retried.stages[0].result["vpc_id"]]


def test_an_existing_vpc_gets_only_the_security_group_and_the_compute_subnet(
        product: SandboxProduct, ec2: Any) -> None:
    ledger = CallLedger(product.live)
    vpc_id = _vpc(ec2, "10.90.0.0/16")
    eks = [ec2.create_subnet(VpcId=vpc_id, CidrBlock=c, AvailabilityZone=z)["Subnet"]["SubnetId"]
           for c, z in (("10.90.0.0/24", "us-west-2a"), ("10.90.1.0/24", "us-west-2b"))]
    eip = ec2.allocate_address(Domain="vpc")["AllocationId"]  # the user's NAT, and their private route table
    nat = ec2.create_nat_gateway(SubnetId=eks[1], AllocationId=eip)["NatGateway"]["NatGatewayId"]
    table = ec2.create_route_table(VpcId=vpc_id)["RouteTable"]["RouteTableId"]
    ec2.create_route(RouteTableId=table, DestinationCidrBlock="0.0.0.0/0", NatGatewayId=nat)
    ec2.associate_route_table(RouteTableId=table, SubnetId=eks[0])
    plan = make_plan("net-own", vpc_id=vpc_id, subnet_ids=eks)
    mark = ledger.mark()
    view = _run(product, NetworkStage(product.deps()), plan)
    assert view.status == "succeeded", view
    assert sorted(_creates(ledger, mark)) == ["CreateSecurityGroup", "CreateSubnet"]
    writes = {e["operation"] for e in ledger.writes(since=mark, service="ec2")}
    assert writes <= {"CreateSecurityGroup", "CreateSubnet", "AuthorizeSecurityGroupIngress",
                      "AuthorizeSecurityGroupEgress", "AssociateRouteTable"}, writes
    result = NetworkResult.model_validate(view.stages[0].result)
    assert result.vpc_id == vpc_id and result.private_subnets == eks and result.public_subnets == []
    assert _subnet(ec2, result.compute_subnet)["CidrBlock"] == "10.90.16.0/20"
    assert all(not _subnet(ec2, s).get("Tags") for s in eks), "the user's subnets are not tagged"
    assert not ec2.describe_vpcs(VpcIds=[vpc_id])["Vpcs"][0].get("Tags"), "nor is their VPC"
    joined = ec2.describe_route_tables(Filters=[{"Name": "association.subnet-id",
                                                 "Values": [result.compute_subnet]}])["RouteTables"]
    assert [t["RouteTableId"] for t in joined] == [table], "the compute subnet goes out through the user's NAT"
    assert not joined[0].get("Tags"), "their route table is not tagged"


def test_plan_rows_name_every_resource(product: SandboxProduct) -> None:
    stage = NetworkStage(product.deps())
    rows = stage.resources(make_plan("net-plan"))
    kinds = [r.type for r in rows]
    assert kinds.count("AWS::EC2::Subnet") == 5 and kinds.count("AWS::EC2::RouteTable") == 2
    assert {"AWS::EC2::VPC", "AWS::EC2::NatGateway", "AWS::EC2::EIP", "AWS::EC2::VPCEndpoint",
            "AWS::EC2::SecurityGroup", "AWS::EC2::InternetGateway"} <= set(kinds)
    assert all(r.action == "create" and r.stage == "network" for r in rows)
    existing = stage.resources(make_plan("net-plan", vpc_id="vpc-0123456789abcdef0",
                                         subnet_ids=["subnet-01234567", "subnet-89abcdef"]))
    assert [(r.type, r.action) for r in existing] == [
        ("AWS::EC2::VPC", "reuse"), ("AWS::EC2::Subnet", "reuse"), ("AWS::EC2::Subnet", "reuse"),
        ("AWS::EC2::SecurityGroup", "create"), ("AWS::EC2::Subnet", "create")]


# ----- teardown -----------------------------------------------------------------------------------------


def _delete_plan(name: str) -> ClusterDeletePlan:
    return ClusterDeletePlan(name=name, region="us-west-2", account="123456789012", eks_cluster=name,
                             bucket="instantstart-shared-123456789012-us-west-2", requested_by="tester")


def _tagged(ec2: Any, name: str) -> list[str]:
    """Everything EC2 still has with the cluster's tag (NAT gateways: not deleted)."""
    f = [{"Name": "tag:instantstart:cluster", "Values": [name]}]
    left = [v["VpcId"] for v in ec2.describe_vpcs(Filters=f)["Vpcs"]]
    left += [s["SubnetId"] for s in ec2.describe_subnets(Filters=f)["Subnets"]]
    left += [g["InternetGatewayId"] for g in ec2.describe_internet_gateways(Filters=f)["InternetGateways"]]
    left += [n["NatGatewayId"] for n in ec2.describe_nat_gateways(Filter=f)["NatGateways"]  # moto: no tag filter
             if n["State"] != "deleted" and {"Key": "instantstart:cluster", "Value": name} in n.get("Tags", [])]
    left += [a["AllocationId"] for a in ec2.describe_addresses(Filters=f)["Addresses"]]
    left += [e["VpcEndpointId"] for e in ec2.describe_vpc_endpoints(Filters=f)["VpcEndpoints"]
             if e["State"].lower() != "deleted"]
    left += [t["RouteTableId"] for t in ec2.describe_route_tables(Filters=f)["RouteTables"]]
    left += [g["GroupId"] for g in ec2.describe_security_groups(Filters=f)["SecurityGroups"]]
    return left


def test_teardown_removes_every_tagged_resource_and_leaves_the_rest(product: SandboxProduct, ec2: Any) -> None:
    ledger = CallLedger(product.live)
    created = _run(product, NetworkStage(product.deps()), make_plan("net-del", vpc_cidr="10.100.0.0/16"))
    assert created.status == "succeeded", created
    result = NetworkResult.model_validate(created.stages[0].result)
    eni = ec2.create_network_interface(SubnetId=result.private_subnets[0],
                                       Description="ELB net/k8s-default-web/0123456789abcdef")["NetworkInterface"]
    bystander = _vpc(ec2, "10.110.0.0/16")  # untagged: never ours
    ec2.create_tags(Resources=[bystander], Tags=[{"Key": "instantstart:cluster", "Value": "net-del"}])
    assert _tagged(ec2, "net-del")
    mark = ledger.mark()
    view = _run(product, NetworkTeardown(product.deps()), _delete_plan("net-del"))
    assert view.status == "succeeded", view
    assert _tagged(ec2, "net-del") == [bystander], "only the VPC with one of our two tags is left"
    assert not ec2.describe_network_interfaces(Filters=[{"Name": "network-interface-id",
                                                         "Values": [eni["NetworkInterfaceId"]]}])["NetworkInterfaces"]
    deleted = {e["operation"] for e in ledger.writes(since=mark, service="ec2")}
    assert {"DeleteNatGateway", "ReleaseAddress", "DeleteVpcEndpoints", "DetachInternetGateway",
            "DeleteInternetGateway", "DeleteSubnet", "DeleteRouteTable", "DeleteSecurityGroup",
            "DeleteVpc"} <= deleted, deleted
    again = ledger.mark()
    assert _run(product, NetworkTeardown(product.deps()), _delete_plan("net-del")).status == "succeeded"
    ledger.assert_no_writes(since=again)


def test_teardown_in_an_existing_vpc_removes_only_ours_and_the_block_we_added(
        product: SandboxProduct, ec2: Any) -> None:
    vpc_id = _vpc(ec2, "10.120.0.0/22")  # too small for a /20: the compute subnet needs a block of its own
    eks = [ec2.create_subnet(VpcId=vpc_id, CidrBlock=c, AvailabilityZone=z)["Subnet"]["SubnetId"]
           for c, z in (("10.120.0.0/24", "us-west-2a"), ("10.120.1.0/24", "us-west-2b"))]
    created = _run(product, NetworkStage(product.deps()), make_plan("net-mixed", vpc_id=vpc_id, subnet_ids=eks))
    assert created.status == "succeeded", created
    blocks = [a["CidrBlock"] for a in ec2.describe_vpcs(VpcIds=[vpc_id])["Vpcs"][0]["CidrBlockAssociationSet"]
              if a["CidrBlockState"]["State"] == "associated"]
    assert len(blocks) == 2, blocks
    view = _run(product, NetworkTeardown(product.deps()), _delete_plan("net-mixed"))
    assert view.status == "succeeded", view
    assert _tagged(ec2, "net-mixed") == []
    left = ec2.describe_vpcs(VpcIds=[vpc_id])["Vpcs"][0]
    assert [a["CidrBlock"] for a in left["CidrBlockAssociationSet"]
            if a["CidrBlockState"]["State"] == "associated"] == ["10.120.0.0/22"], "the block we added went"
    assert {s["SubnetId"] for s in ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpc_id]}])["Subnets"]} \
        == set(eks), "the user's subnets stay"


def test_teardown_never_deletes_an_interface_it_does_not_know_and_says_which_holds_it(
        product: SandboxProduct, ec2: Any) -> None:
    created = _run(product, NetworkStage(product.deps()), make_plan("net-held", vpc_cidr="10.130.0.0/16"))
    assert created.status == "succeeded", created
    result = NetworkResult.model_validate(created.stages[0].result)
    eni = ec2.create_network_interface(SubnetId=result.compute_subnet, Description="someone's debugging box")
    eni_id = eni["NetworkInterface"]["NetworkInterfaceId"]
    held = _run(product, NetworkTeardown(product.deps()), _delete_plan("net-held"))
    assert held.status == "failed" and eni_id in str(held.error) and "debugging box" in str(held.error), held
    assert ec2.describe_network_interfaces(NetworkInterfaceIds=[eni_id])["NetworkInterfaces"], "never deleted"
    assert ec2.describe_subnets(SubnetIds=[result.compute_subnet])["Subnets"], "its subnet waits for it"
    ec2.delete_network_interface(NetworkInterfaceId=eni_id)
    resumed = _run(product, NetworkTeardown(product.deps()), _delete_plan("net-held"))
    assert resumed.status == "succeeded", resumed
    assert _tagged(ec2, "net-held") == []


def test_a_create_interrupted_after_adding_a_block_still_tags_it_and_teardown_removes_it(
        product: SandboxProduct, ec2: Any) -> None:
    """The crash shape: the block is associated, the subnet not made (CreateSubnet refused once, the
    operation fails and what the step knew in memory is lost); the retried operation makes the subnet
    with the block's id, and the teardown disassociates the block from the user's VPC."""
    ledger = CallLedger(product.live)
    vpc_id = _vpc(ec2, "10.140.0.0/22")
    eks = [ec2.create_subnet(VpcId=vpc_id, CidrBlock=c, AvailabilityZone=z)["Subnet"]["SubnetId"]
           for c, z in (("10.140.0.0/24", "us-west-2a"), ("10.140.1.0/24", "us-west-2b"))]
    fault = product.live.post("/api/v1/sandbox/faults", {"kind": "access_denied", "count": 1,
                                                          "target": {"service": "ec2", "action": "CreateSubnet"}})
    assert fault.status_code == 201, fault.text
    mark = ledger.mark()
    failed = _run(product, NetworkStage(product.deps()), make_plan("net-cut", vpc_id=vpc_id, subnet_ids=eks))
    assert failed.status == "failed" and "CreateSubnet" in str(failed.error), failed
    added = ledger.once("ec2", "AssociateVpcCidrBlock", since=mark)
    assert not ledger.succeeded("ec2", "CreateSubnet", since=mark), "the crash shape: no subnet yet"
    product.services.engine.retry(failed.id, ADMIN)
    done = wait_until(lambda: (v := product.services.engine.get(failed.id)).status in ("succeeded", "failed") and v,
                      180, "the retried operation finishes")
    assert done.status == "succeeded", done
    ledger.once("ec2", "AssociateVpcCidrBlock", since=mark)
    subnet = _subnet(ec2, done.stages[0].result["compute_subnet"])
    block = next(a for a in ec2.describe_vpcs(VpcIds=[vpc_id])["Vpcs"][0]["CidrBlockAssociationSet"]
                 if a["CidrBlock"] == added["request"]["CidrBlock"])
    assert _tags(subnet).get(CIDR_TAG) == block["AssociationId"], subnet
    view = _run(product, NetworkTeardown(product.deps()), _delete_plan("net-cut"))
    assert view.status == "succeeded", view
    assert leftovers(product.client, ledger.calls(since=mark), "net-cut") == []
    assert [a["CidrBlock"] for a in ec2.describe_vpcs(VpcIds=[vpc_id])["Vpcs"][0]["CidrBlockAssociationSet"]
            if a["CidrBlockState"]["State"] == "associated"] == ["10.140.0.0/22"]


def _killed_after_associating(product: SandboxProduct, ec2: Any, cidr: str,
                              cluster: str) -> tuple[str, list[str], int]:
    """A product process SIGKILLed exactly between AssociateVpcCidrBlock (made, in the ledger, its answer
    held by the sandbox) and the compute subnet's create; answers the user's VPC, its EKS subnets and the
    ledger's mark before the product's first call."""
    ledger = CallLedger(product.live)
    vpc_id = _vpc(ec2, cidr)  # a /22 holds no /20: the compute subnet needs a block of its own
    base = cidr.rsplit(".", 2)[0]
    eks = [ec2.create_subnet(VpcId=vpc_id, CidrBlock=f"{base}.{i}.0/24", AvailabilityZone=z)["Subnet"]["SubnetId"]
           for i, z in ((0, "us-west-2a"), (1, "us-west-2b"))]
    fault = product.live.post("/api/v1/sandbox/faults", {"kind": "hold_response", "count": 1, "target": {
        "service": "ec2", "operation": "AssociateVpcCidrBlock"}})
    assert fault.status_code == 201, fault.text
    mark = ledger.mark()
    proc = subprocess.Popen([sys.executable, "-m", "tests.compute_subnet_worker",
                             str(product.services.settings.data_dir), str(product.aws_port), str(product.kube_port),
                             vpc_id, "us-west-2a", cluster], cwd=ROOT)
    fault_id = fault.json()["id"]
    try:
        wait_until(lambda: ledger.succeeded("ec2", "AssociateVpcCidrBlock", since=mark)
                   and held_answers(product.live, fault_id) == 1, 120, "the block associated, its answer held")
    finally:
        proc.kill()
        proc.wait(20)
    wait_until(lambda: held_answers(product.live, fault_id) == 0, 60, "the held answer dropped with its caller")
    released = httpx2.delete(f"{product.live.url}/api/v1/sandbox/faults/{fault_id}",
                             headers=product.live.headers(), timeout=30)
    assert released.status_code == 200, released.text  # used up, still releasable: its hold is what it names
    assert not ledger.succeeded("ec2", "CreateSubnet", since=mark), "the crash shape: the block and no subnet"
    assert len(block_ids(ec2.describe_vpcs(VpcIds=[vpc_id])["Vpcs"][0])) == 2
    return vpc_id, eks, mark


def _net_of(cidr: str) -> ipaddress.IPv4Network:
    return ipaddress.IPv4Network(cidr)


def _blocks(ec2: Any, vpc_id: str) -> list[str]:
    return [a["CidrBlock"] for a in ec2.describe_vpcs(VpcIds=[vpc_id])["Vpcs"][0]["CidrBlockAssociationSet"]
            if a["CidrBlockState"]["State"] in ("associated", "associating")]


def test_a_block_added_right_before_a_crash_is_ours_for_a_new_operation_and_for_teardown(
        product: SandboxProduct, ec2: Any) -> None:
    """Killed between the association and the subnet; then a brand-new create operation (not a retry: its
    first look already sees the block) reuses the block, marks the subnet with its id, and teardown
    removes it; without a subnet ever made, a delete alone removes it too (the intent recorded first)."""
    ledger = CallLedger(product.live)
    vpc_id, eks, mark = _killed_after_associating(product, ec2, "10.144.0.0/22", "net-kill-a")
    view = _run(product, NetworkStage(product.deps()), make_plan("net-kill-a", vpc_id=vpc_id, subnet_ids=eks))
    assert view.status == "succeeded", view
    ledger.once("ec2", "AssociateVpcCidrBlock", since=mark)
    subnet = _subnet(ec2, view.stages[0].result["compute_subnet"])
    block = next(a for a in ec2.describe_vpcs(VpcIds=[vpc_id])["Vpcs"][0]["CidrBlockAssociationSet"]
                 if a["CidrBlock"] != "10.144.0.0/22")
    assert _tags(subnet).get(CIDR_TAG) == block["AssociationId"], subnet
    assert _net_of(subnet["CidrBlock"]).subnet_of(_net_of(block["CidrBlock"])), "the subnet is in the block we added"
    deleted = _run(product, NetworkTeardown(product.deps()), _delete_plan("net-kill-a"))
    assert deleted.status == "succeeded", (deleted.error, [(s.name, s.message) for s in deleted.stages])
    assert _blocks(ec2, vpc_id) == ["10.144.0.0/22"], "the block we added went"

    vpc_b, _, mark = _killed_after_associating(product, ec2, "10.148.0.0/22", "net-kill-b")
    assert len(_blocks(ec2, vpc_b)) == 2
    deleted = _run(product, NetworkTeardown(product.deps()), _delete_plan("net-kill-b"))
    assert deleted.status == "succeeded", (deleted.error, [(s.name, s.message) for s in deleted.stages])
    assert _blocks(ec2, vpc_b) == ["10.148.0.0/22"], "no subnet named it: the intent did"
    assert not product.services.db.query("SELECT * FROM resource_intents WHERE cluster IN (?, ?)",
                                         ("net-kill-a", "net-kill-b")), "the intents of what is gone are dropped"
    assert leftovers(product.client, ledger.calls(since=mark), "net-kill-b") == []


def test_teardown_deletes_the_load_balancer_controllers_leftovers_in_our_vpc_only(
        product: SandboxProduct, ec2: Any) -> None:
    ledger = CallLedger(product.live)
    created = _run(product, NetworkStage(product.deps()), make_plan("net-lb", vpc_cidr="10.150.0.0/16"))
    assert created.status == "succeeded", created
    result = NetworkResult.model_validate(created.stages[0].result)
    elb = product.client("elbv2")
    lbc = [{"Key": LBC_TAG, "Value": "net-lb"}]

    def controller_group(vpc_id: str, name: str) -> str:
        return str(ec2.create_security_group(GroupName=name, Description="k8s", VpcId=vpc_id, TagSpecifications=[
            {"ResourceType": "security-group", "Tags": lbc}])["GroupId"])

    def balancer(subnets: list[str], group: str, name: str) -> str:
        return str(elb.create_load_balancer(Name=name, Subnets=subnets, SecurityGroups=[group], Type="application",
                                            Tags=lbc)["LoadBalancers"][0]["LoadBalancerArn"])

    frontend = controller_group(result.vpc_id, "k8s-default-web-frontend")
    ours = balancer(result.public_subnets, frontend, "k8s-default-web")
    target = elb.create_target_group(Name="k8s-default-web-tg", Protocol="HTTP", Port=80, VpcId=result.vpc_id,
                                     TargetType="ip", Tags=lbc)["TargetGroups"][0]["TargetGroupArn"]
    other_vpc = _vpc(ec2, "10.160.0.0/16")  # the same tag elsewhere (another EKS cluster of that name): never ours
    other = [ec2.create_subnet(VpcId=other_vpc, CidrBlock=c, AvailabilityZone=z)["Subnet"]["SubnetId"]
             for c, z in (("10.160.0.0/24", "us-west-2a"), ("10.160.1.0/24", "us-west-2b"))]
    other_group = controller_group(other_vpc, "k8s-other")
    theirs = balancer(other, other_group, "k8s-other-web")
    mark = ledger.mark()
    view = _run(product, NetworkTeardown(product.deps()), _delete_plan("net-lb"))
    assert view.status == "succeeded", view
    assert [b["LoadBalancerArn"] for b in elb.describe_load_balancers()["LoadBalancers"]
            if b["LoadBalancerArn"] in (ours, theirs)] == [theirs]
    assert target not in {g["TargetGroupArn"] for g in elb.describe_target_groups()["TargetGroups"]}
    groups = {g["GroupId"] for g in ec2.describe_security_groups(
        Filters=[{"Name": f"tag:{LBC_TAG}", "Values": ["net-lb"]}])["SecurityGroups"]}
    assert frontend not in groups and other_group in groups
    assert _tagged(ec2, "net-lb") == []
    order = [e["operation"] for e in ledger.writes(since=mark) if e["status"] < 400]
    assert order.index("DeleteLoadBalancer") < order.index("DeleteTargetGroup") < order.index("DeleteSubnet"), order


def test_leftovers_count_untagged_ec2_creates_and_blocks_still_associated(product: SandboxProduct, ec2: Any) -> None:
    ledger = CallLedger(product.live)
    mark = ledger.mark()
    vpc_id = str(ec2.create_vpc(CidrBlock="10.170.0.0/16", TagSpecifications=[{"ResourceType": "vpc", "Tags": [
        {"Key": "instantstart:cluster", "Value": "net-left"}]}])["Vpc"]["VpcId"])  # one of our two tags only
    association = ec2.associate_vpc_cidr_block(VpcId=vpc_id, CidrBlock="10.171.0.0/16")["CidrBlockAssociation"]
    left = leftovers(product.client, ledger.calls(since=mark), "net-left")
    assert any(line.startswith("untagged create: ec2 CreateVpc") for line in left), left
    assert f"ec2 CIDR block 10.171.0.0/16 ({association['AssociationId']}) on VPC {vpc_id}" in left, left
    ec2.disassociate_vpc_cidr_block(AssociationId=association["AssociationId"])
    left = leftovers(product.client, ledger.calls(since=mark), "net-left")
    assert not any("CIDR block" in line for line in left), left
    ec2.delete_vpc(VpcId=vpc_id)
    assert [line.split(" #")[0] for line in leftovers(product.client, ledger.calls(since=mark), "net-left")] == [
        "untagged create: ec2 CreateVpc"], "an untagged create stays a leftover: the test cannot see it went"


# ----- the network quotas the create form reads --------------------------------------------------------


def test_options_read_the_vpc_and_elastic_ip_quotas(product: SandboxProduct) -> None:
    options = product.live.get("/api/v1/clusters/options")
    assert options.status_code == 200, options.text
    quotas = {q["name"]: q for q in options.json()["quotas"]}
    assert quotas["VPCs per Region"]["limit"] == 5.0 and quotas["EC2-VPC Elastic IPs"]["limit"] == 5.0, quotas
    sq = product.client("service-quotas")
    vpc = sq.get_service_quota(ServiceCode="vpc", QuotaCode="L-F678F1CE")["Quota"]
    assert vpc["QuotaName"] == "VPCs per Region" and vpc["Adjustable"] is True
    raised = sq.request_service_quota_increase(ServiceCode="ec2", QuotaCode="L-0263D0A3", DesiredValue=10)
    assert raised["RequestedQuota"]["ServiceCode"] == "ec2"
    assert sq.get_service_quota(ServiceCode="ec2", QuotaCode="L-0263D0A3")["Quota"]["Value"] == 10.0
    with pytest.raises(sq.exceptions.NoSuchResourceException):
        sq.get_service_quota(ServiceCode="vpc", QuotaCode="L-0263D0A3")  # the EIP quota is EC2's, not VPC's
