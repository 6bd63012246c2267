"""What a HyperPod cluster needs in the account before CreateCluster succeeds, made through boto3 as a user
would: a VPC with subnets in distinct zones, a security group of that VPC, an execution role trusting
``sagemaker.amazonaws.com``, a lifecycle-script bucket and an ACTIVE EKS cluster with API authentication."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from botocore.exceptions import ClientError

from sandbox.aws import AwsWorld

from .conftest import ROLE, Clients, make_client, standard_roles

EKS_ROLE = ROLE  # the conftest's EKS cluster role


def trust(service: str) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}]})


@dataclass(frozen=True)
class Prereqs:
    vpc: str
    subnets: list[str]
    security_group: str
    role: str
    bucket: str
    eks_name: str
    eks_arn: str

    @property
    def vpc_config(self) -> dict[str, Any]:
        return {"SecurityGroupIds": [self.security_group], "Subnets": self.subnets}

    @property
    def lifecycle(self) -> dict[str, str]:
        return {"SourceS3Uri": f"s3://{self.bucket}/lifecycle/", "OnCreate": "on_create.sh"}

    def group(self, name: str, count: int, instance_type: str = "ml.m5.xlarge", **extra: Any) -> dict[str, Any]:
        return {"InstanceGroupName": name, "InstanceType": instance_type, "InstanceCount": count,
                "ExecutionRole": self.role, "LifeCycleConfig": self.lifecycle, **extra}

    def cluster(self, name: str, *groups: dict[str, Any], **extra: Any) -> dict[str, Any]:
        """CreateCluster parameters for an EKS-orchestrated cluster on these prerequisites."""
        return {"ClusterName": name, "Orchestrator": {"Eks": {"ClusterArn": self.eks_arn}},
                "VpcConfig": self.vpc_config, "InstanceGroups": list(groups), **extra}


def role(aws: Clients, name: str, service: str) -> str:
    return str(aws("iam").create_role(RoleName=name, AssumeRolePolicyDocument=trust(service))["Role"]["Arn"])


def network(aws: Clients, cidr: str = "10.40", zones: str = "ab") -> tuple[str, list[str], str]:
    """A VPC ``<cidr>.0.0/16`` with one /20 subnet per zone letter and a security group admitting itself."""
    ec2 = aws("ec2")
    vpc = ec2.create_vpc(CidrBlock=f"{cidr}.0.0/16")["Vpc"]["VpcId"]
    nets = [ec2.create_subnet(VpcId=vpc, CidrBlock=f"{cidr}.{16 * i}.0/20", AvailabilityZone=f"us-west-2{z}")
            ["Subnet"]["SubnetId"] for i, z in enumerate(zones)]
    sg = ec2.create_security_group(GroupName=f"nodes-{vpc}", Description="HyperPod nodes", VpcId=vpc)["GroupId"]
    ec2.authorize_security_group_ingress(GroupId=sg, IpPermissions=[{"IpProtocol": "-1",
                                                                     "UserIdGroupPairs": [{"GroupId": sg}]}])
    return vpc, nets, sg


def prereqs(world: AwsWorld, aws: Clients, unique: Callable[[str], str], *, mode: str = "API",
            version: str = "1.32", zones: str = "ab") -> Prereqs:
    standard_roles(world)  # EKS_ROLE, trusting eks.amazonaws.com
    vpc, nets, sg = network(aws, zones=zones)
    exec_role = role(aws, unique("hp-exec"), "sagemaker.amazonaws.com")
    bucket = unique("sagemaker-lcc")
    aws("s3").create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    eks_name = unique("hp-eks")
    eks = aws("eks")
    arn = eks.create_cluster(name=eks_name, version=version, roleArn=EKS_ROLE, resourcesVpcConfig={"subnetIds": nets},
                             accessConfig={"authenticationMode": mode})["cluster"]["arn"]
    world.advance(1800)
    assert eks.describe_cluster(name=eks_name)["cluster"]["status"] == "ACTIVE"
    return Prereqs(vpc, nets, sg, exec_role, bucket, eks_name, str(arn))


_ids = itertools.count()


def fresh(prefix: str) -> str:
    """A name no other strict test uses (``strict-`` clusters are deleted after each test)."""
    return f"strict-{prefix}-{next(_ids)}"


def cleaned_sagemaker(world: AwsWorld) -> Iterator[Any]:
    """A SageMaker client; afterwards every ``strict-`` cluster is deleted, so the shared world's cluster-usage
    quotas stay free for the other tests."""
    client = make_client(world, "sagemaker")
    yield client
    for summary in client.list_clusters(NameContains="strict-", MaxResults=100)["ClusterSummaries"]:
        if summary["ClusterStatus"] != "Deleting":
            client.delete_cluster(ClusterName=summary["ClusterName"])


def refused(call: Callable[..., Any], code: str = "ValidationException", **params: Any) -> str:
    """The message of the AWS error (``code``) that ``call(**params)`` must fail with."""
    with pytest.raises(ClientError) as info:
        call(**params)
    error = info.value.response["Error"]
    assert error["Code"] == code, error
    return str(error["Message"])


def names(sm: Any) -> set[str]:
    return {c["ClusterName"] for c in sm.list_clusters(MaxResults=100)["ClusterSummaries"]}


def groups(sm: Any, name: str) -> dict[str, dict[str, Any]]:
    return {g["InstanceGroupName"]: g for g in sm.describe_cluster(ClusterName=name)["InstanceGroups"]}


def in_service(world: AwsWorld, sm: Any, name: str, seconds: float = 3600) -> dict[str, Any]:
    world.advance(seconds)
    described: dict[str, Any] = sm.describe_cluster(ClusterName=name)
    assert described["ClusterStatus"] == "InService", described.get("FailureMessage")
    return described
