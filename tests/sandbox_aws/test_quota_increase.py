"""Quota increases in the sandbox: requested through Service Quotas as in AWS, approved at once, and then
honoured by HyperPod (a cluster larger than the default quota can be made)."""

from __future__ import annotations

from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from sandbox.aws import AwsWorld
from sandbox.aws.quotas import quota_code, quota_name
from sandbox.kube import BackgroundServer
from tests.sandbox_aws.conftest import Clients, error_code, make_client, new_world

M5 = quota_code(quota_name("ml.m5.large"))  # default 10; raised by this module only


def test_an_increase_is_approved_at_once_and_applied(world: AwsWorld, aws: Clients) -> None:
    sq = aws("service-quotas")
    before = sq.get_service_quota(ServiceCode="sagemaker", QuotaCode=M5)["Quota"]["Value"]
    asked = sq.request_service_quota_increase(ServiceCode="sagemaker", QuotaCode=M5, DesiredValue=before + 990)
    request = asked["RequestedQuota"]
    assert (request["Status"], request["QuotaName"], request["DesiredValue"]) == \
        ("APPROVED", "ml.m5.large for cluster usage", before + 990)
    assert sq.get_service_quota(ServiceCode="sagemaker", QuotaCode=M5)["Quota"]["Value"] == before + 990
    assert sq.get_aws_default_service_quota(ServiceCode="sagemaker", QuotaCode=M5)["Quota"]["Value"] == 10.0
    assert world.quotas.limit("ml.m5.large") == before + 990, "HyperPod's create and scale checks see it"
    assert sq.get_requested_service_quota_change(RequestId=request["Id"])["RequestedQuota"] == request


def test_an_increase_must_be_an_increase_of_a_known_quota(aws: Clients) -> None:
    sq = aws("service-quotas")
    current = sq.get_service_quota(ServiceCode="sagemaker", QuotaCode=M5)["Quota"]["Value"]
    with pytest.raises(ClientError) as info:
        sq.request_service_quota_increase(ServiceCode="sagemaker", QuotaCode=M5, DesiredValue=current)
    assert error_code(info.value) == "IllegalArgumentException"
    with pytest.raises(ClientError) as info:
        sq.request_service_quota_increase(ServiceCode="sagemaker", QuotaCode="L-00000000", DesiredValue=5)
    assert error_code(info.value) == "NoSuchResourceException"
    with pytest.raises(ClientError) as info:
        sq.request_service_quota_increase(ServiceCode="ec2", QuotaCode=M5, DesiredValue=5000)
    assert error_code(info.value) == "NoSuchResourceException"
    with pytest.raises(ClientError) as info:
        sq.get_requested_service_quota_change(RequestId="0123456789abcdef")
    assert error_code(info.value) == "NoSuchResourceException"
    assert sq.get_service_quota(ServiceCode="sagemaker", QuotaCode=M5)["Quota"]["Value"] == current


def test_an_approved_increase_survives_a_restart(kube: BackgroundServer, tmp_path: Path) -> None:
    code = quota_code(quota_name("ml.c5.large"))
    first = new_world(kube, tmp_path)
    try:
        request_id = make_client(first, "service-quotas").request_service_quota_increase(
            ServiceCode="sagemaker", QuotaCode=code, DesiredValue=1000)["RequestedQuota"]["Id"]
    finally:
        first.stop()
    second = new_world(kube, tmp_path)
    try:
        assert second.quotas.limit("ml.c5.large") == 1000
        got = make_client(second, "service-quotas").get_requested_service_quota_change(RequestId=request_id)
        assert got["RequestedQuota"]["Status"] == "APPROVED"
    finally:
        second.stop()
