"""Validation as AWS's services do it, straight against the botocore model (no server)."""

from __future__ import annotations

import pytest

from sandbox.aws import AwsError, validate, violations
from sandbox.aws.protocol import service_model
from sandbox.aws.validation import java_regex

GROUP = {"InstanceGroupName": "workers", "InstanceCount": 1, "ExecutionRole": "arn:aws:iam::123456789012:role/x",
         "InstanceType": "ml.g5.8xlarge"}


def create_cluster(**params: object) -> list[str]:
    return violations(service_model("sagemaker").operation_model("CreateCluster"), {"ClusterName": "ok", **params})


def test_valid_input_has_no_violations() -> None:
    assert create_cluster(InstanceGroups=[GROUP], NodeRecovery="Automatic") == []


def test_every_violation_is_reported_in_aws_wording() -> None:
    bad_group = {**GROUP, "InstanceType": "ml.zz9.huge", "ThreadsPerCore": 3}
    errors = violations(service_model("sagemaker").operation_model("CreateCluster"),
                        {"ClusterName": "bad_name!", "NodeRecovery": "Sometimes", "InstanceGroups": [bad_group]})
    assert errors[0] == ("Value 'bad_name!' at 'clusterName' failed to satisfy constraint: Member must satisfy "
                         "regular expression pattern: [a-zA-Z0-9](-*[a-zA-Z0-9])*")
    assert any(e.startswith("Value 'ml.zz9.huge' at 'instanceGroups.1.member.instanceType' failed to satisfy "
                            "constraint: Member must satisfy enum value set: [ml.p4d.24xlarge, ") for e in errors)
    assert ("Value '3' at 'instanceGroups.1.member.threadsPerCore' failed to satisfy constraint: Member must have "
            "value less than or equal to 2") in errors
    assert ("Value 'Sometimes' at 'nodeRecovery' failed to satisfy constraint: Member must satisfy enum value set: "
            "[Automatic, None]") in errors
    assert len(errors) == 4


def test_validate_raises_one_validation_exception() -> None:
    with pytest.raises(AwsError) as info:
        validate(service_model("sagemaker").operation_model("CreateCluster"), {"ClusterName": "x" * 64})
    assert info.value.code == "ValidationException"
    assert info.value.message == ("1 validation error detected: Value '" + "x" * 64 + "' at 'clusterName' failed to "
                                 "satisfy constraint: Member must have length less than or equal to 63")


def test_required_members_and_list_lengths() -> None:
    errors = create_cluster(InstanceGroups=[{"InstanceGroupName": "g", "InstanceCount": 1}] * 101)
    assert "Value null at 'instanceGroups.1.member.executionRole' failed to satisfy constraint: Member must not " \
           "be null" in errors
    assert any("at 'instanceGroups' failed to satisfy constraint: Member must have length less than or equal to 100"
               in e for e in errors)


def test_uri_members_use_their_wire_name() -> None:
    errors = violations(service_model("eks").operation_model("ListAddons"), {"clusterName": "no spaces"})
    assert errors == ["Value 'no spaces' at 'name' failed to satisfy constraint: Member must satisfy regular "
                      "expression pattern: ^[0-9A-Za-z][A-Za-z0-9\\-_]*"]


@pytest.mark.parametrize(("pattern", "good", "bad"), [
    (r"([\p{L}\p{Z}\p{N}_.:/=+\-@]*)", "Zürich team 1", "semi;colon"),
    (r"arn:[\p{Alnum}\-]+:lambda:[\p{Alnum}\-]+:[0-9]{12}:function:.*", "arn:aws:lambda:us-west-2:123456789012:"
                                                                        "function:f", "arn:aws:lambda:x:1:function:f"),
    (r"^(?i)(true|false)$", "TRUE", "yes"),
    (r"([\p{L}\p{Z}\p{N}_.:\/=+\-@]*)${1,128}", "a:b", "a;b"),
    (r"[\u0020-\uD7FF\uE000-\uFFFD\uD800\uDC00-\uDBFF\uDFFF\t]*", "emoji \U0001F600 ok", "bell \x07"),
])
def test_java_patterns_are_translated(pattern: str, good: str, bad: str) -> None:
    assert java_regex(pattern).fullmatch(good)
    assert not java_regex(pattern).fullmatch(bad)
