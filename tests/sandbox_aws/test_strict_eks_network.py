"""Network checks as AWS makes them: EKS cluster subnets and security groups, FSx for Lustre's security groups
(TCP 988) and its Lustre version per deployment type."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError

from sandbox.aws.fsx import PORT_MESSAGE

from .conftest import ROLE, Clients, error_code


def refused(call: Callable[[], object], code: str) -> str:
    with pytest.raises(ClientError) as info:
        call()
    assert error_code(info.value) == code, info.value
    return str(info.value.response["Error"]["Message"])


def vpc_with_subnets(ec2: Any, second: int, zones: str = "ab") -> tuple[str, list[str]]:
    vpc = ec2.create_vpc(CidrBlock=f"10.{second}.0.0/16")["Vpc"]["VpcId"]
    return vpc, [ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.{second}.{16 * i}.0/20",
                                   AvailabilityZone=f"us-west-2{zone}")["Subnet"]["SubnetId"]
                 for i, zone in enumerate(zones)]


def test_eks_subnets_in_two_zones_of_one_vpc_and_groups_of_that_vpc(aws: Clients,
                                                                    unique: Callable[[str], str]) -> None:
    ec2, eks = aws("ec2"), aws("eks")

    def create(subnet_ids: list[str], groups: list[str] | None = None) -> Any:
        return eks.create_cluster(name=unique("net"), roleArn=ROLE, resourcesVpcConfig={
            "subnetIds": subnet_ids, "securityGroupIds": groups or []})

    vpc, same_zone = vpc_with_subnets(ec2, 71, "aa")
    assert refused(lambda: create(same_zone), "InvalidParameterException") == (
        "Subnets specified must be in at least two different AZs")
    other_vpc, elsewhere = vpc_with_subnets(ec2, 72)
    message = refused(lambda: create([same_zone[0], elsewhere[1]]), "InvalidParameterException")
    assert message.startswith("Subnets specified must belong to the same VPC") and other_vpc in message
    assert refused(lambda: create([same_zone[0], "subnet-0000000000000dead"]), "InvalidParameterException") == (
        "The subnet ID 'subnet-0000000000000dead' does not exist")
    _, good = vpc_with_subnets(ec2, 73)
    good_vpc = ec2.describe_subnets(SubnetIds=good)["Subnets"][0]["VpcId"]
    assert refused(lambda: create(good, ["sg-0000000000000dead"]), "InvalidParameterException") == (
        "The security group 'sg-0000000000000dead' does not exist")
    foreign = ec2.create_security_group(GroupName=unique("foreign"), Description="d", VpcId=vpc)["GroupId"]
    assert refused(lambda: create(good, [foreign]), "InvalidParameterException") == (
        f"Security group(s) [{foreign}] are not in the same VPC as the subnets. Please specify a security group "
        f"that is associated with the VPC: {good_vpc}.")
    own = ec2.create_security_group(GroupName=unique("own"), Description="d", VpcId=good_vpc)["GroupId"]
    cluster = create(good, [own])["cluster"]
    assert cluster["resourcesVpcConfig"]["vpcId"] == good_vpc
    assert cluster["resourcesVpcConfig"]["securityGroupIds"] == [own]


def lustre(fsx: Any, subnet: str, **extra: Any) -> Any:
    return fsx.create_file_system(FileSystemType="LUSTRE", StorageCapacity=1200, SubnetIds=[subnet], **extra)


def test_fsx_security_groups_must_admit_lustre_traffic_on_988(aws: Clients, unique: Callable[[str], str]) -> None:
    ec2, fsx = aws("ec2"), aws("fsx")
    vpc, (subnet, _) = vpc_with_subnets(ec2, 74)
    closed = ec2.create_security_group(GroupName=unique("closed"), Description="d", VpcId=vpc)["GroupId"]
    ec2.authorize_security_group_ingress(GroupId=closed, IpPermissions=[
        {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "IpRanges": [{"CidrIp": "10.0.0.0/8"}]}])
    assert refused(lambda: lustre(fsx, subnet, SecurityGroupIds=[closed]), "InvalidNetworkSettings") == PORT_MESSAGE
    _, (elsewhere, _) = vpc_with_subnets(ec2, 75)
    assert "is not in the VPC" in refused(lambda: lustre(fsx, elsewhere, SecurityGroupIds=[closed]),
                                          "InvalidNetworkSettings")
    assert "does not exist" in refused(lambda: lustre(fsx, subnet, SecurityGroupIds=["sg-0000000000000dead"]),
                                       "InvalidNetworkSettings")
    lnet = ec2.create_security_group(GroupName=unique("lnet"), Description="d", VpcId=vpc)["GroupId"]
    ec2.authorize_security_group_ingress(GroupId=lnet, IpPermissions=[
        {"IpProtocol": "tcp", "FromPort": 988, "ToPort": 988, "UserIdGroupPairs": [{"GroupId": lnet}]}])
    made = lustre(fsx, subnet, SecurityGroupIds=[closed, lnet])["FileSystem"]
    assert made["VpcId"] == vpc
    # no group named: the VPC's default group, which admits all traffic from itself, as AWS's does
    assert lustre(fsx, subnet)["FileSystem"]["Lifecycle"] == "CREATING"


def test_fsx_lustre_versions_per_deployment_type(aws: Clients) -> None:
    ec2, fsx = aws("ec2"), aws("fsx")
    _, (subnet, _) = vpc_with_subnets(ec2, 76)
    persistent_2 = {"DeploymentType": "PERSISTENT_2", "PerUnitStorageThroughput": 125}
    message = refused(lambda: lustre(fsx, subnet, FileSystemTypeVersion="2.10", LustreConfiguration=persistent_2),
                      "BadRequest")
    assert "2.10" in message and "PERSISTENT_2" in message
    with_metadata = {**persistent_2, "MetadataConfiguration": {"Mode": "AUTOMATIC"}}
    assert "2.12" in refused(lambda: lustre(fsx, subnet, FileSystemTypeVersion="2.12",
                                            LustreConfiguration=with_metadata), "BadRequest")
    assert lustre(fsx, subnet, LustreConfiguration=persistent_2)["FileSystem"]["FileSystemTypeVersion"] == "2.12"
    assert lustre(fsx, subnet, LustreConfiguration=with_metadata)["FileSystem"]["FileSystemTypeVersion"] == "2.15"
    assert lustre(fsx, subnet, FileSystemTypeVersion="2.15", LustreConfiguration=persistent_2)["FileSystem"][
        "FileSystemTypeVersion"] == "2.15"
    scratch = lustre(fsx, subnet, FileSystemTypeVersion="2.10", LustreConfiguration={"DeploymentType": "SCRATCH_2"})
    assert scratch["FileSystem"]["FileSystemTypeVersion"] == "2.10"
    assert lustre(fsx, subnet)["FileSystem"]["FileSystemTypeVersion"] == "2.10"  # SCRATCH_1's default
