"""Requests the front forwards to moto are checked as AWS checks them before moto sees them: the botocore model
(query and JSON protocols), EC2's tagging rules. A refused request changes nothing in moto."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from botocore.exceptions import ClientError

from sandbox.aws import AwsWorld
from sandbox.aws.forwarded import query_params
from sandbox.aws.protocol import service_model

from .conftest import Clients, error_code

RESERVED = "Tag keys starting with 'aws:' are reserved for internal use"


def refused(call: Callable[[], object]) -> ClientError:
    with pytest.raises(ClientError) as info:
        call()
    return info.value


def test_query_fields_read_back_into_the_input_structure() -> None:
    create_role = service_model("iam").operation_model("CreateRole")
    assert query_params(create_role, {"Action": "CreateRole", "RoleName": "r", "Tags.member.1.Key": "a",
                                      "Tags.member.1.Value": "b", "Tags.member.2.Key": "c",
                                      "Tags.member.2.Value": "d", "MaxSessionDuration": "3600"}) == {
        "RoleName": "r", "MaxSessionDuration": 3600, "Tags": [{"Key": "a", "Value": "b"}, {"Key": "c", "Value": "d"}]}
    create_vpc = service_model("ec2").operation_model("CreateVpc")
    assert query_params(create_vpc, {"CidrBlock": "10.0.0.0/16", "TagSpecification.1.ResourceType": "vpc",
                                     "TagSpecification.1.Tag.1.Key": "Name",
                                     "TagSpecification.1.Tag.1.Value": "x", "AmazonProvidedIpv6CidrBlock": "true"}) == {
        "CidrBlock": "10.0.0.0/16", "AmazonProvidedIpv6CidrBlock": True,
        "TagSpecifications": [{"ResourceType": "vpc", "Tags": [{"Key": "Name", "Value": "x"}]}]}


def test_ec2_tag_specifications_must_name_what_the_call_creates(world: AwsWorld, aws: Clients) -> None:
    ec2 = aws("ec2")
    before = len(ec2.describe_vpcs()["Vpcs"])
    error = refused(lambda: ec2.create_vpc(CidrBlock="10.61.0.0/16", TagSpecifications=[
        {"ResourceType": "subnet", "Tags": [{"Key": "Name", "Value": "x"}]}]))
    assert error_code(error) == "InvalidParameterValue"
    assert error.response["Error"]["Message"] == "'subnet' is not a valid taggable resource type for this operation."
    assert len(ec2.describe_vpcs()["Vpcs"]) == before, "a refused request never reaches moto"
    vpc = ec2.create_vpc(CidrBlock="10.61.0.0/16", TagSpecifications=[
        {"ResourceType": "vpc", "Tags": [{"Key": "Name", "Value": "x"}]}])["Vpc"]
    assert vpc["Tags"] == [{"Key": "Name", "Value": "x"}]
    subnet = ec2.create_subnet(VpcId=vpc["VpcId"], CidrBlock="10.61.0.0/20", TagSpecifications=[
        {"ResourceType": "subnet", "Tags": [{"Key": "Name", "Value": "s"}]}])["Subnet"]
    assert subnet["Tags"] == [{"Key": "Name", "Value": "s"}]


def test_ec2_refuses_aws_prefixed_tag_keys(aws: Clients) -> None:
    ec2 = aws("ec2")
    error = refused(lambda: ec2.create_vpc(CidrBlock="10.62.0.0/16", TagSpecifications=[
        {"ResourceType": "vpc", "Tags": [{"Key": "aws:cloudformation:stack-name", "Value": "x"}]}]))
    assert error_code(error) == "InvalidParameterValue"
    assert error.response["Error"]["Message"] == (
        f"Value ( aws:cloudformation:stack-name ) for parameter key is invalid. {RESERVED}")
    vpc = ec2.create_vpc(CidrBlock="10.62.0.0/16")["Vpc"]["VpcId"]
    error = refused(lambda: ec2.create_tags(Resources=[vpc], Tags=[{"Key": "AWS:x", "Value": "y"}]))
    assert error_code(error) == "InvalidParameterValue" and RESERVED in error.response["Error"]["Message"]
    ec2.create_tags(Resources=[vpc], Tags=[{"Key": "awsome", "Value": "y"}])
    assert ec2.describe_vpcs(VpcIds=[vpc])["Vpcs"][0]["Tags"] == [{"Key": "awsome", "Value": "y"}]


def test_json_protocol_requests_for_moto_are_validated_too(aws: Clients) -> None:
    logs = aws("logs")
    error = refused(lambda: logs.create_log_group(logGroupName="g" * 513))
    assert error_code(error) == "ValidationException"
    assert error.response["Error"]["Message"].startswith(
        f"1 validation error detected: Value '{'g' * 513}' at 'logGroupName' failed to satisfy constraint: Member "
        "must have length less than or equal to 512")
    logs.create_log_group(logGroupName="/strict/forwarded")
    groups = logs.describe_log_groups(logGroupNamePrefix="/strict/forwarded")["logGroups"]
    assert [g["logGroupName"] for g in groups] == ["/strict/forwarded"]


def test_sts_inputs_are_validated_before_the_trust_is(aws: Clients) -> None:
    error = refused(lambda: aws("sts").assume_role(RoleArn="arn:aws:iam::123456789012:role/x",
                                                   RoleSessionName="has space"))
    assert error_code(error) == "ValidationError" and "at 'roleSessionName'" in error.response["Error"]["Message"]
