"""The one endpoint: routing to simulators or moto, AWS error shapes, throttling faults."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError

from sandbox.aws import AwsWorld
from sandbox.aws.protocol import Request, find_operation, service_for_signing_name
from tests.sandbox_aws.conftest import Clients, error_code


def test_moto_services_are_forwarded(aws: Clients) -> None:
    assert aws("sts").get_caller_identity()["Account"] == "123456789012"
    s3 = aws("s3")
    s3.create_bucket(Bucket="sandbox-data-front", CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    s3.put_object(Bucket="sandbox-data-front", Key="a/b.txt", Body=b"hello")
    assert s3.get_object(Bucket="sandbox-data-front", Key="a/b.txt")["Body"].read() == b"hello"
    assert s3.head_object(Bucket="sandbox-data-front", Key="a/b.txt")["ContentLength"] == 5


def test_aws_managed_policies_exist(aws: Clients) -> None:
    iam = aws("iam")
    iam.create_role(RoleName="hp-exec", AssumeRolePolicyDocument='{"Version": "2012-10-17", "Statement": []}')
    iam.attach_role_policy(RoleName="hp-exec",
                           PolicyArn="arn:aws:iam::aws:policy/AmazonSageMakerClusterInstanceRolePolicy")
    attached = iam.list_attached_role_policies(RoleName="hp-exec")["AttachedPolicies"]
    assert [p["PolicyName"] for p in attached] == ["AmazonSageMakerClusterInstanceRolePolicy"]


def test_rest_operations_sharing_a_path_are_told_apart_by_their_required_headers() -> None:
    def operation(headers: dict[str, str]) -> str | None:
        found = find_operation("s3", Request("PUT", "/bucket/a/b.sh", {}, headers, b"x"))
        return found.name if found is not None else None

    assert operation({"Content-Length": "1"}) == "PutObject"  # the call ledger names what was called
    assert operation({"X-Amz-Copy-Source": "/bucket/other"}) == "CopyObject"


def test_signing_names_map_to_botocore_services() -> None:
    assert service_for_signing_name("servicequotas") == "service-quotas"
    assert service_for_signing_name("eks") == "eks"
    assert service_for_signing_name("monitoring") == "cloudwatch"


@pytest.mark.parametrize(("kwargs", "fragment"), [
    ({"name": "bad name!"}, "at 'name' failed to satisfy constraint: Member must satisfy regular expression pattern"),
    ({"name": "x" * 101}, "Member must have length less than or equal to 100"),
    ({"name": "ok", "accessConfig": {"authenticationMode": "SOMETIMES"}},
     "at 'accessConfig.authenticationMode' failed to satisfy constraint: Member must satisfy enum value set: "
     "[API, API_AND_CONFIG_MAP, CONFIG_MAP]"),
])
def test_invalid_input_gets_validation_exception(aws: Clients, kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(ClientError) as info:
        aws("eks").create_cluster(roleArn="arn:aws:iam::123456789012:role/r",
                                  resourcesVpcConfig={"subnetIds": ["subnet-1"]}, **kwargs)
    assert error_code(info.value) == "ValidationException"
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert fragment in info.value.response["Error"]["Message"]


def test_json_protocol_validation(aws: Clients) -> None:
    with pytest.raises(ClientError) as info:
        aws("service-quotas").get_service_quota(ServiceCode="sagemaker", QuotaCode="bad code!")
    assert error_code(info.value) == "ValidationException"
    assert info.value.response["Error"]["Message"].startswith("1 validation error detected: Value 'bad code!' at "
                                                              "'quotaCode'")


def test_not_found_uses_the_modelled_status(aws: Clients) -> None:
    with pytest.raises(ClientError) as info:
        aws("eks").describe_cluster(name="nope")
    assert error_code(info.value) == "ResourceNotFoundException"
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


def test_throttle_fault_counts_calls_for_simulated_and_forwarded_services(world: AwsWorld, aws: Clients) -> None:
    world.faults.inject("throttle", {"service": "eks", "operation": "ListClusters"}, remaining=2)
    eks = aws("eks")
    for _ in range(2):
        with pytest.raises(ClientError) as info:
            eks.list_clusters()
        assert error_code(info.value) == "ThrottlingException"
    assert "clusters" in eks.list_clusters()
    world.faults.inject("throttle", {"service": "sts"}, remaining=1)
    with pytest.raises(ClientError) as info:
        aws("sts").get_caller_identity()
    assert error_code(info.value) == "Throttling"
    assert aws("sts").get_caller_identity()["Account"] == "123456789012"
    assert world.faults.list() == []


def test_botocore_retries_absorb_a_short_throttle(world: AwsWorld) -> None:
    import boto3

    world.faults.inject("throttle", {"service": "service-quotas"}, remaining=1)
    client = boto3.client("service-quotas", endpoint_url=world.endpoint_url, region_name="us-west-2",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    response = client.list_services()
    assert response["ResponseMetadata"]["RetryAttempts"] == 1
    assert {"ServiceCode": "sagemaker", "ServiceName": "Amazon SageMaker"} in response["Services"]


def test_front_mounts_under_a_prefix_in_another_application(world: AwsWorld) -> None:
    import asyncio
    import threading

    import boto3
    from tornado.httpserver import HTTPServer
    from tornado.netutil import bind_sockets
    from tornado.web import Application

    from tests.sandbox_aws.conftest import NO_RETRIES

    loop = asyncio.new_event_loop()
    ready = threading.Event()
    ports: list[int] = []

    def serve() -> None:
        asyncio.set_event_loop(loop)

        async def listen() -> None:
            server = HTTPServer(Application(world.front.url_patterns("/aws")))
            sockets = bind_sockets(0, "127.0.0.1")
            server.add_sockets(sockets)
            ports.append(sockets[0].getsockname()[1])

        loop.run_until_complete(listen())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(60), "the front listening"
    try:
        endpoint = f"http://127.0.0.1:{ports[0]}/aws"
        eks = boto3.client("eks", endpoint_url=endpoint, region_name="us-west-2", aws_access_key_id="testing",
                           aws_secret_access_key="testing", config=NO_RETRIES)
        assert "clusters" in eks.list_clusters()
        sts = boto3.client("sts", endpoint_url=endpoint, region_name="us-west-2", aws_access_key_id="testing",
                           aws_secret_access_key="testing", config=NO_RETRIES)
        assert sts.get_caller_identity()["Account"] == "123456789012"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
