"""The simulators' read-only view of moto's world: roles and their trust, security groups, buckets."""

from __future__ import annotations

import json
from collections.abc import Callable

from sandbox.aws import AwsWorld

from .conftest import Clients

TRUST_SAGEMAKER = {"Version": "2012-10-17", "Statement": [
    {"Effect": "Allow", "Principal": {"Service": "sagemaker.amazonaws.com"}, "Action": "sts:AssumeRole"}]}
TRUST_PODS = {"Version": "2012-10-17", "Statement": [
    {"Effect": "Allow", "Principal": {"Service": "pods.eks.amazonaws.com"},
     "Action": ["sts:AssumeRole", "sts:TagSession"]}]}


def test_a_role_is_read_with_its_trust_and_policies(world: AwsWorld, aws: Clients,
                                                     unique: Callable[[str], str]) -> None:
    iam = aws("iam")
    name = unique("exec")
    arn = iam.create_role(RoleName=name, Path="/service/",
                          AssumeRolePolicyDocument=json.dumps(TRUST_SAGEMAKER))["Role"]["Arn"]
    iam.attach_role_policy(RoleName=name, PolicyArn="arn:aws:iam::aws:policy/AmazonSageMakerClusterInstanceRolePolicy")
    role = world.facts.role(arn)
    assert role is not None and role.arn == arn
    assert role.trusts("sagemaker.amazonaws.com") and not role.trusts("ec2.amazonaws.com")
    assert role.attached_policies == ("arn:aws:iam::aws:policy/AmazonSageMakerClusterInstanceRolePolicy",)
    pods = unique("pods")
    iam.create_role(RoleName=pods, AssumeRolePolicyDocument=json.dumps(TRUST_PODS))
    found = world.facts.role(pods)
    assert found is not None and found.trusts("pods.eks.amazonaws.com", "sts:AssumeRole", "sts:TagSession")
    assert world.facts.role("arn:aws:iam::123456789012:role/" + unique("missing")) is None


def test_security_groups_buckets_and_subnets(world: AwsWorld, aws: Clients, unique: Callable[[str], str]) -> None:
    ec2 = aws("ec2")
    vpc = ec2.create_vpc(CidrBlock="10.30.0.0/16")["Vpc"]["VpcId"]
    group = ec2.create_security_group(GroupName=unique("sg"), Description="d", VpcId=vpc)["GroupId"]
    ec2.authorize_security_group_ingress(GroupId=group, IpPermissions=[
        {"IpProtocol": "tcp", "FromPort": 988, "ToPort": 988, "UserIdGroupPairs": [{"GroupId": group}]}])
    found = world.facts.security_group(group)
    assert found is not None and found.vpc == vpc
    assert found.allows(988) and not found.allows(22)
    assert world.facts.security_group("sg-0000000000000dead") is None
    bucket = unique("sagemaker-bucket")
    aws("s3").create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    assert world.facts.bucket_exists(bucket) and not world.facts.bucket_exists(unique("nobucket"))
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.30.0.0/20", AvailabilityZone="us-west-2a")["Subnet"]
    assert world.facts.subnet(subnet["SubnetId"]).vpc == vpc  # type: ignore[union-attr]
