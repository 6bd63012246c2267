"""IAM and STS as strict as AWS: AssumeRole needs a role whose trust admits the caller; IAM policy documents
must be JSON; IAM's inputs are checked against its botocore model (query protocol) before moto sees them."""

from __future__ import annotations

import json
from collections.abc import Callable

import boto3
import pytest
from botocore.exceptions import ClientError

from sandbox.aws import AwsWorld

from .conftest import ACCOUNT, CREATOR, NO_RETRIES, Clients, error_code, trust


def refused(call: Callable[[], object]) -> ClientError:
    with pytest.raises(ClientError) as info:
        call()
    return info.value


def aws_trust(*principals: str, effect: str = "Allow") -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": effect, "Principal": {"AWS": list(principals)}, "Action": "sts:AssumeRole"}]})


def test_assume_role_refuses_a_missing_role_and_one_that_trusts_only_a_service(aws: Clients,
                                                                              unique: Callable[[str], str]) -> None:
    iam, sts = aws("iam"), aws("sts")
    missing = f"arn:aws:iam::{ACCOUNT}:role/{unique('missing')}"
    error = refused(lambda: sts.assume_role(RoleArn=missing, RoleSessionName="s1"))
    assert error_code(error) == "AccessDenied"
    assert error.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert error.response["Error"]["Message"] == (
        f"User: {CREATOR} is not authorized to perform: sts:AssumeRole on resource: {missing}")
    ec2_only = iam.create_role(RoleName=unique("ec2-only"), AssumeRolePolicyDocument=trust("ec2.amazonaws.com"))
    error = refused(lambda: sts.assume_role(RoleArn=ec2_only["Role"]["Arn"], RoleSessionName="s1"))
    assert error_code(error) == "AccessDenied" and ec2_only["Role"]["Arn"] in error.response["Error"]["Message"]


def test_assume_role_follows_the_trust_policy(world: AwsWorld, aws: Clients, unique: Callable[[str], str]) -> None:
    iam, sts = aws("iam"), aws("sts")
    account_wide = iam.create_role(RoleName=unique("acct"), AssumeRolePolicyDocument=aws_trust(
        f"arn:aws:iam::{ACCOUNT}:root"))["Role"]["Arn"]
    creds = sts.assume_role(RoleArn=account_wide, RoleSessionName="ops")["Credentials"]
    assert creds["AccessKeyId"]
    named = iam.create_role(RoleName=unique("named"), AssumeRolePolicyDocument=aws_trust(CREATOR))["Role"]["Arn"]
    assert sts.assume_role(RoleArn=named, RoleSessionName="ops")["AssumedRoleUser"]["Arn"].endswith("/ops")
    other = iam.create_role(RoleName=unique("other"), AssumeRolePolicyDocument=aws_trust(
        f"arn:aws:iam::{ACCOUNT}:user/someone-else"))["Role"]["Arn"]
    assert error_code(refused(lambda: sts.assume_role(RoleArn=other, RoleSessionName="ops"))) == "AccessDenied"
    denied = iam.create_role(RoleName=unique("deny"), AssumeRolePolicyDocument=json.dumps({"Statement": [
        {"Effect": "Allow", "Principal": {"AWS": ACCOUNT}, "Action": "sts:AssumeRole"},
        {"Effect": "Deny", "Principal": {"AWS": CREATOR}, "Action": "sts:*"}]}))["Role"]["Arn"]
    assert error_code(refused(lambda: sts.assume_role(RoleArn=denied, RoleSessionName="ops"))) == "AccessDenied"
    # the session's own credentials: a role trusting that role admits its sessions
    session = world.facts.caller(creds["AccessKeyId"])
    assert session.startswith(f"arn:aws:sts::{ACCOUNT}:assumed-role/")
    chained = iam.create_role(RoleName=unique("chain"), AssumeRolePolicyDocument=aws_trust(
        account_wide))["Role"]["Arn"]
    sts_session = boto3.client("sts", endpoint_url=world.endpoint_url, region_name="us-west-2",
                               aws_access_key_id=creds["AccessKeyId"], aws_secret_access_key=creds["SecretAccessKey"],
                               aws_session_token=creds["SessionToken"], config=NO_RETRIES)
    assert sts_session.assume_role(RoleArn=chained, RoleSessionName="hop")["Credentials"]["AccessKeyId"]
    error = refused(lambda: sts_session.assume_role(RoleArn=other, RoleSessionName="hop"))
    assert error.response["Error"]["Message"].startswith(f"User: {session} is not authorized")


def test_iam_refuses_what_its_model_and_policy_grammar_refuse(aws: Clients, unique: Callable[[str], str]) -> None:
    iam = aws("iam")
    error = refused(lambda: iam.create_role(RoleName="r" * 65, AssumeRolePolicyDocument=trust("ec2.amazonaws.com")))
    assert error_code(error) == "ValidationError"
    assert error.response["Error"]["Message"] == (
        f"1 validation error detected: Value '{'r' * 65}' at 'roleName' failed to satisfy constraint: Member must "
        "have length less than or equal to 64")
    error = refused(lambda: iam.create_role(RoleName=unique("bad-json"), AssumeRolePolicyDocument="{not json"))
    assert error_code(error) == "MalformedPolicyDocument"
    assert error.response["Error"]["Message"] == "This policy contains invalid Json"
    name = unique("ok")
    role = iam.create_role(RoleName=name, AssumeRolePolicyDocument=trust("ec2.amazonaws.com"),
                           Tags=[{"Key": "team", "Value": "ml"}])["Role"]
    assert role["RoleName"] == name
    error = refused(lambda: iam.update_assume_role_policy(RoleName=name, PolicyDocument="[1, 2"))
    assert error_code(error) == "MalformedPolicyDocument"
    error = refused(lambda: iam.put_role_policy(RoleName=name, PolicyName="p:bad", PolicyDocument="{}"))
    assert error_code(error) == "ValidationError" and "at 'policyName'" in error.response["Error"]["Message"]
    iam.put_role_policy(RoleName=name, PolicyName="inline", PolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "*"}]}))
    assert iam.list_role_policies(RoleName=name)["PolicyNames"] == ["inline"]


def test_a_role_is_named_by_its_exact_arn(world: AwsWorld, aws: Clients, unique: Callable[[str], str]) -> None:
    name = unique("pathed")
    arn = aws("iam").create_role(RoleName=name, Path="/team/", AssumeRolePolicyDocument=aws_trust(ACCOUNT))[
        "Role"]["Arn"]
    assert arn == f"arn:aws:iam::{ACCOUNT}:role/team/{name}"
    assert world.facts.role(arn) is not None and world.facts.role(name) is not None
    for wrong in (f"arn:aws:iam::{ACCOUNT}:role/{name}", f"arn:aws:iam::210987654321:role/team/{name}"):
        assert world.facts.role(wrong) is None
        error = refused(lambda w=wrong: aws("sts").assume_role(RoleArn=w, RoleSessionName="s1"))  # type: ignore[misc]
        assert error_code(error) == "AccessDenied"
    assert aws("sts").assume_role(RoleArn=arn, RoleSessionName="s1")["Credentials"]["AccessKeyId"]


def test_the_policy_simulator_answers_for_known_principals_and_follows_access_denied_faults(
        world: AwsWorld, aws: Clients, unique: Callable[[str], str]) -> None:
    iam = aws("iam")
    own = CREATOR.replace(":sts::", ":iam::")
    actions = ["ec2:CreateVpc", "iam:PassRole"]
    results = iam.simulate_principal_policy(PolicySourceArn=own, ActionNames=actions)["EvaluationResults"]
    assert [(r["EvalActionName"], r["EvalDecision"]) for r in results] == [(a, "allowed") for a in actions]
    fault = world.faults.inject("access_denied", {"service": "iam", "action": "PassRole"})
    role = iam.create_role(RoleName=unique("sim"), AssumeRolePolicyDocument=trust("ec2.amazonaws.com"))["Role"]
    for _ in range(2):  # simulating never uses the fault up
        decisions = {r["EvalActionName"]: r["EvalDecision"] for r in iam.simulate_principal_policy(
            PolicySourceArn=role["Arn"], ActionNames=actions)["EvaluationResults"]}
        assert decisions == {"ec2:CreateVpc": "allowed", "iam:PassRole": "implicitDeny"}
    world.faults.clear(fault.id)
    missing = refused(lambda: iam.simulate_principal_policy(
        PolicySourceArn=f"arn:aws:iam::{ACCOUNT}:role/{unique('nobody')}", ActionNames=actions))
    assert error_code(missing) == "NoSuchEntity"


def test_eks_lists_the_versions_it_creates_and_flags_its_default(aws: Clients) -> None:
    eks = aws("eks")
    default = eks.describe_cluster_versions(defaultOnly=True)["clusterVersions"]
    assert [v["clusterVersion"] for v in default] == ["1.33"] and default[0]["defaultVersion"] is True
    every = [v["clusterVersion"] for v in eks.describe_cluster_versions()["clusterVersions"]]
    assert "1.28" in every and "1.33" in every and every == sorted(every, reverse=True)
