"""Errors are classified in the adapters, never at call sites: boto3 clients from ``services/aws.py`` and
``ApiClient``s from ``services/kube.py`` raise the taxonomy, by ``Error.Code`` and by HTTP status."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from kubernetes import client as k8s

from sandbox.kube import BackgroundServer, Emulator
from services.aws import AwsClients
from services.clock import Clock
from services.errors import (
    Conflict,
    Forbidden,
    Invalid,
    NotFound,
    Permanent,
    ServiceError,
    Transient,
    classify_aws,
    classify_kube,
)
from services.kube import KubeClients
from tests.support import free_port


@pytest.mark.parametrize(("code", "status", "kind"), [
    ("ThrottlingException", 400, Transient), ("Throttling", 400, Transient), ("RequestLimitExceeded", 503, Transient),
    ("TooManyRequestsException", 429, Transient), ("SlowDown", 503, Transient),
    ("InternalServerError", 500, Transient), ("ServiceUnavailableException", 503, Transient),
    ("SomethingNew", 502, Transient), ("SomethingNew", 429, Transient),
    ("ValidationException", 400, Invalid), ("InvalidParameterValue", 400, Invalid),
    ("InvalidParameterCombination", 400, Invalid), ("InvalidParameterException", 400, Invalid),
    ("AccessDenied", 403, Forbidden), ("AccessDeniedException", 403, Forbidden),
    ("UnauthorizedOperation", 403, Forbidden),
    ("ResourceNotFound", 400, NotFound), ("ResourceNotFoundException", 404, NotFound), ("NoSuchEntity", 404, NotFound),
    ("InvalidVpcID.NotFound", 400, NotFound),
    ("ResourceInUse", 400, Conflict), ("ResourceInUseException", 409, Conflict), ("ConflictException", 409, Conflict),
    ("ResourceLimitExceeded", 400, Permanent), ("ServiceQuotaExceededException", 402, Permanent),
    ("LimitExceededException", 400, Permanent), ("SomethingNew", 400, Permanent),
])
def test_aws_error_codes_map_to_the_taxonomy(code: str, status: int, kind: type[ServiceError]) -> None:
    err = classify_aws(code, "AWS says why", status, "sagemaker:CreateCluster")
    assert type(err) is kind and err.details["aws_code"] == code
    if kind is Transient:
        assert isinstance(err, Transient) and err.delay > 0
    if kind is Forbidden:
        assert "sagemaker:CreateCluster" in err.message  # names the action the policy must allow
    if kind is Permanent and ("Limit" in code or "Quota" in code):
        assert "AWS says why" in err.message  # AWS's message says which quota


def test_kubernetes_statuses_map_to_the_taxonomy_with_422_causes_and_retry_after() -> None:
    body = {"message": "bad", "details": {"causes": [{"field": "spec.replicas", "reason": "FieldValueInvalid",
                                                      "message": "must be >= 0"}]}}
    invalid = classify_kube(422, "Unprocessable Entity", body, "POST /apis/apps/v1/deployments")
    assert type(invalid) is Invalid and "spec.replicas: must be >= 0" in invalid.message
    assert invalid.details["causes"][0]["field"] == "spec.replicas"
    throttled = classify_kube(429, "Too Many Requests", None, retry_after=7)
    assert isinstance(throttled, Transient) and throttled.delay == 7
    for status, kind in ((404, NotFound), (409, Conflict), (403, Forbidden), (500, Transient), (503, Transient),
                         (0, Transient), (418, Permanent)):
        assert type(classify_kube(status, "r", None)) is kind


def test_aws_clients_raise_the_taxonomy_and_stage_clients_make_one_attempt() -> None:
    session = boto3.Session(aws_access_key_id="AKIATEST", aws_secret_access_key="x", region_name="us-west-2")
    aws = AwsClients("us-west-2", f"http://127.0.0.1:{free_port()}", session=session)  # nothing listens there
    stages = aws.for_stages()
    assert stages.client("eks").meta.config.retries["total_max_attempts"] == 1
    assert aws.client("eks").meta.config.retries["total_max_attempts"] > 1  # reads keep botocore's retries
    assert stages is aws.for_stages()
    with pytest.raises(Transient) as unreachable:
        stages.client("eks").describe_cluster(name="x")
    assert unreachable.value.details["action"] == "eks:DescribeCluster"
    with pytest.raises(Transient):
        list(stages.client("eks").get_paginator("list_clusters").paginate())
    with pytest.raises(Invalid):
        stages.client("eks").describe_cluster()  # botocore's own parameter check


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[k8s.CoreV1Api]:
    emulator = Emulator(tmp_path / "kube")
    server = BackgroundServer(emulator).start()
    emulator.ensure_cluster("c1")
    clients = KubeClients(AwsClients("us-west-2"), Clock(), ca_dir=tmp_path / "ca")
    clients.register_kubeconfig("c1", emulator.write_kubeconfig("c1", server.base_url, tmp_path / "kubeconfig"))
    yield k8s.CoreV1Api(clients.api_client("c1"))
    clients.forget("c1")
    server.stop()
    emulator.close()


def test_kubernetes_clients_raise_the_taxonomy_naming_the_request(kube: k8s.CoreV1Api) -> None:
    with pytest.raises(NotFound) as missing:
        kube.read_namespaced_config_map("nope", "default")
    assert missing.value.details["action"] == "GET /k8s/clusters/c1/api/v1/namespaces/default/configmaps/nope"
    kube.create_namespaced_config_map("default", {"metadata": {"name": "a"}})
    with pytest.raises(Conflict):
        kube.create_namespaced_config_map("default", {"metadata": {"name": "a"}})
    with pytest.raises(Invalid) as invalid:
        kube.create_namespaced_config_map("default", {"metadata": {"name": "Bad_Name"}})
    assert [c["field"] for c in invalid.value.details["causes"]] == ["metadata.name"]
