"""EKS reads IAM as AWS's does: the cluster role, pod identity roles and access entry principals."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError

from sandbox.aws import AwsWorld
from sandbox.aws.eks import CLUSTER_CREATE_SECONDS
from sandbox.aws.facts import iam_principal

from .conftest import ACCOUNT, CREATOR, POD_ROLE, ROLE, Clients, ensure_role, error_code, subnets

ASSUME_FAILED = "could not be assumed because it does not exist or the trusted entity is not correct"


def refused(call: Callable[[], object], code: str = "InvalidParameterException") -> str:
    with pytest.raises(ClientError) as info:
        call()
    assert error_code(info.value) == code, info.value
    return str(info.value.response["Error"]["Message"])


def active(world: AwsWorld, aws: Clients, name: str) -> Any:
    eks = aws("eks")
    eks.create_cluster(name=name, roleArn=ROLE, resourcesVpcConfig={"subnetIds": subnets(aws("ec2"))},
                       accessConfig={"authenticationMode": "API"})
    world.advance(CLUSTER_CREATE_SECONDS)
    return eks


def test_the_cluster_role_must_exist_and_trust_eks(world: AwsWorld, aws: Clients,
                                                   unique: Callable[[str], str]) -> None:
    eks, nets = aws("eks"), subnets(aws("ec2"))
    missing = f"arn:aws:iam::{ACCOUNT}:role/{unique('missing')}"
    message = refused(lambda: eks.create_cluster(name=unique("eks"), roleArn=missing,
                                                 resourcesVpcConfig={"subnetIds": nets}))
    assert message == f"Role with arn: {missing}, {ASSUME_FAILED}"
    ec2_role = ensure_role(world, unique("ec2-role"), "ec2.amazonaws.com")
    assert ASSUME_FAILED in refused(lambda: eks.create_cluster(name=unique("eks"), roleArn=ec2_role,
                                                               resourcesVpcConfig={"subnetIds": nets}))
    name = unique("eks")
    assert eks.create_cluster(name=name, roleArn=ROLE, resourcesVpcConfig={"subnetIds": nets})["cluster"][
        "roleArn"] == ROLE
    assert name in eks.list_clusters()["clusters"]


def test_pod_identity_needs_a_role_trusting_pods_eks_with_tag_session(world: AwsWorld, aws: Clients,
                                                                      unique: Callable[[str], str]) -> None:
    name = unique("eks")
    eks = active(world, aws, name)
    missing = f"arn:aws:iam::{ACCOUNT}:role/{unique('missing')}"
    assert refused(lambda: eks.create_pod_identity_association(
        clusterName=name, namespace="ns", serviceAccount="sa", roleArn=missing)) == (
        "Role provided in the request does not exist")
    no_tag = ensure_role(world, unique("no-tag"), "pods.eks.amazonaws.com")  # sts:AssumeRole only
    wrong = ensure_role(world, unique("ec2"), "ec2.amazonaws.com", "sts:AssumeRole", "sts:TagSession")
    for role in (no_tag, wrong):
        assert refused(lambda r=role: eks.create_pod_identity_association(  # type: ignore[misc]
            clusterName=name, namespace="ns", serviceAccount="sa", roleArn=r)) == (
            "Trust policy of the role provided is invalid")
    for dep in ("cert-manager", "eks-pod-identity-agent"):
        eks.create_addon(clusterName=name, addonName=dep)
    assert refused(lambda: eks.create_addon(
        clusterName=name, addonName="amazon-sagemaker-hyperpod-training-operator",
        podIdentityAssociations=[{"serviceAccount": "hp-training-operator-controller-manager", "roleArn": no_tag}]
    )) == "Trust policy of the role provided is invalid"
    assert "amazon-sagemaker-hyperpod-training-operator" not in eks.list_addons(clusterName=name)["addons"]
    assert eks.list_pod_identity_associations(clusterName=name)["associations"] == []
    made = eks.create_pod_identity_association(clusterName=name, namespace="ns", serviceAccount="sa",
                                               roleArn=POD_ROLE)["association"]
    assert made["roleArn"] == POD_ROLE


def test_the_creator_entry_is_the_callers_iam_principal(world: AwsWorld, aws: Clients,
                                                       unique: Callable[[str], str]) -> None:
    name = unique("eks")
    eks = active(world, aws, name)
    caller = aws("sts").get_caller_identity()["Arn"]
    assert iam_principal(caller) == CREATOR == world.eks.creator_arn
    assert eks.list_access_entries(clusterName=name)["accessEntries"] == [CREATOR]
    entry = eks.describe_access_entry(clusterName=name, principalArn=CREATOR)["accessEntry"]
    assert entry["accessEntryArn"].startswith(f"arn:aws:eks:us-west-2:{ACCOUNT}:access-entry/{name}/user/")
    assert world.eks.admits(name, CREATOR) and not world.eks.admits(name, f"arn:aws:iam::{ACCOUNT}:root")


def test_access_entries_refuse_what_eks_refuses(world: AwsWorld, aws: Clients, unique: Callable[[str], str]) -> None:
    name = unique("eks")
    eks = active(world, aws, name)

    def create(principal: str, **extra: Any) -> Any:
        return eks.create_access_entry(clusterName=name, principalArn=principal, **extra)

    role = ensure_role(world, unique("ops"), "ec2.amazonaws.com")
    session = f"arn:aws:sts::{ACCOUNT}:assumed-role/{role.rpartition('/')[2]}/alice"
    assert "is an STS session" in refused(lambda: create(session))
    for bad in ("arn:aws:iam::123456789012:group/admins", "arn:aws:s3:::bucket", "ops-role",
                f"arn:aws:iam::{ACCOUNT}:role/"):
        assert "is not a valid IAM principal ARN" in refused(lambda b=bad: create(b))  # type: ignore[misc]
    linked = f"arn:aws:iam::{ACCOUNT}:role/aws-service-role/sagemaker.amazonaws.com/AWSServiceRoleForSageMaker"
    assert "is a service-linked role" in refused(lambda: create(linked))
    assert "access entry type 'ROBOT' is not valid" in refused(lambda: create(role, type="ROBOT"))
    user = f"arn:aws:iam::{ACCOUNT}:user/{unique('nobody')}"
    assert "does not exist in IAM" in refused(lambda: create(user))
    assert "does not exist in IAM" in refused(lambda: create(f"arn:aws:iam::{ACCOUNT}:role/{unique('gone')}"))
    dev = aws("iam").create_user(UserName=unique("dev"))["User"]["Arn"]
    assert "take an IAM role of account" in refused(lambda: create(dev, type="EC2_LINUX"))
    assert eks.list_access_entries(clusterName=name)["accessEntries"] == [CREATOR], "nothing refused was made"

    assert create(role)["accessEntry"]["principalArn"] == role
    node_role = ensure_role(world, unique("node"), "ec2.amazonaws.com")
    assert create(node_role, type="EC2_LINUX")["accessEntry"]["type"] == "EC2_LINUX"
    other_account = "arn:aws:iam::210987654321:role/cross-account-admin"  # another account's IAM is not ours
    assert create(other_account)["accessEntry"]["principalArn"] == other_account
    assert create(dev)["accessEntry"]["accessEntryArn"].split("/")[2] == "user"
