"""The sandbox's SageMaker managed MLflow: tracking servers as SageMaker describes them, and the product's MLflow
client reaching the real tracking server behind one through the ``sagemaker-mlflow`` plugin (the ARN as the
tracking URI, SigV4, the tracking-server header), exactly as against AWS."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from mlflow.entities import Metric

from app.sandbox import Sandbox, aws_session, mlflow_endpoint, use_sandbox_mlflow
from sandbox.aws.base import Call, ManualClock
from sandbox.aws.mlflow import CREATE_SECONDS, MlflowTrackingServers
from services.mlflow.client import tracking_client
from services.settings import Settings
from tests.sandbox_support import client, sandbox_settings, start_sandbox
from tests.support import wait_until

SAGEMAKER_TRUST = json.dumps({"Version": "2012-10-17", "Statement": [
    {"Effect": "Allow", "Principal": {"Service": "sagemaker.amazonaws.com"}, "Action": "sts:AssumeRole"}]})
EC2_TRUST = json.dumps({"Version": "2012-10-17", "Statement": [
    {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]})
ACCOUNT = "123456789012"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, mlflow_url: str) -> Iterator[tuple[Settings, Sandbox]]:
    settings = sandbox_settings(tmp_path_factory.mktemp("mlflow-sandbox") / "data")
    sandbox = start_sandbox(settings)
    iam, s3 = client(settings, "iam"), client(settings, "s3")
    iam.create_role(RoleName="tracking", AssumeRolePolicyDocument=SAGEMAKER_TRUST)
    iam.create_role(RoleName="not-sagemaker", AssumeRolePolicyDocument=EC2_TRUST)
    s3.create_bucket(Bucket="artifacts", CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    try:
        yield settings, sandbox
    finally:
        sandbox.stop()


def _created(settings: Settings, name: str) -> dict[str, Any]:
    sagemaker = client(settings, "sagemaker")
    sagemaker.create_mlflow_tracking_server(TrackingServerName=name, ArtifactStoreUri="s3://artifacts/mlflow/",
                                            RoleArn=f"arn:aws:iam::{ACCOUNT}:role/tracking")
    return dict(wait_until(lambda: (s := sagemaker.describe_mlflow_tracking_server(TrackingServerName=name))[
        "TrackingServerStatus"] == "Created" and s, 60, f"{name} Created"))


def test_creating_checks_the_role_and_the_bucket_as_sagemaker_does(world: tuple[Settings, Sandbox]) -> None:
    settings, sandbox = world
    sagemaker = client(settings, "sagemaker")
    for role, uri, words in [("missing", "s3://artifacts/x", "Could not assume role"),
                             ("not-sagemaker", "s3://artifacts/x", "sagemaker.amazonaws.com"),
                             ("tracking", "s3://no-such-bucket/x", "no-such-bucket")]:
        with pytest.raises(ClientError) as refused:
            sagemaker.create_mlflow_tracking_server(TrackingServerName="refused", ArtifactStoreUri=uri,
                                                    RoleArn=f"arn:aws:iam::{ACCOUNT}:role/{role}")
        assert refused.value.response["Error"]["Code"] == "ValidationException"
        assert words in refused.value.response["Error"]["Message"]
    with pytest.raises(ClientError) as bad_size:  # the botocore model's enum, checked by the front
        sagemaker.create_mlflow_tracking_server(TrackingServerName="refused", ArtifactStoreUri="s3://artifacts/x",
                                                RoleArn=f"arn:aws:iam::{ACCOUNT}:role/tracking",
                                                TrackingServerSize="Huge")
    assert bad_size.value.response["Error"]["Code"] == "ValidationException"
    with pytest.raises(ClientError) as absent:
        sagemaker.describe_mlflow_tracking_server(TrackingServerName="refused")
    assert absent.value.response["Error"]["Code"] == "ResourceNotFound"
    attempts = [c for c in sandbox.calls(operation="CreateMlflowTrackingServer") if c["target"] == "refused"]
    assert [c["status"] for c in attempts] == [400, 400, 400, 400]  # each refused, none made anything


def test_the_product_client_logs_and_reads_a_metric_through_the_plugin(world: tuple[Settings, Sandbox]) -> None:
    settings, sandbox = world
    server = _created(settings, "e2e")
    arn = server["TrackingServerArn"]
    assert arn == f"arn:aws:sagemaker:us-west-2:{ACCOUNT}:mlflow-tracking-server/e2e"
    assert server["TrackingServerUrl"].endswith(".us-west-2.experiments.sagemaker.aws")
    assert server["IsActive"] == "Active"
    listed = client(settings, "sagemaker").list_mlflow_tracking_servers()["TrackingServerSummaries"]
    assert [(s["TrackingServerName"], s["TrackingServerStatus"]) for s in listed if s["TrackingServerName"] == "e2e"] \
        == [("e2e", "Created")]

    use_sandbox_mlflow(settings)
    metrics = [Metric("loss", 2.0 - step / 10, 1_700_000_000_000 + step * 1000, step) for step in range(4)]
    with tracking_client(arn, aws_session(settings)) as mlflow:
        experiment = mlflow.create_experiment("plugin-check")
        run = mlflow.create_run(experiment, run_name="r1")
        mlflow.log_batch(run.info.run_id, metrics=metrics)
    with tracking_client(arn, aws_session(settings)) as mlflow:
        history = mlflow.get_metric_history(run.info.run_id, "loss")
    assert [(m.step, m.value, m.timestamp) for m in history] == [(m.step, m.value, m.timestamp) for m in metrics]
    relayed = sandbox.calls(service="sagemaker-mlflow")
    assert {c["target"] for c in relayed} == {arn}  # every call named its tracking server
    assert any(c["operation"].endswith("runs/log-batch") and c["status"] == 200 for c in relayed)
    made = [c for c in sandbox.calls(operation="CreateMlflowTrackingServer") if c["target"] == "e2e"]
    assert [c["status"] for c in made] == [200]


def _raw(settings: Settings, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(f"{mlflow_endpoint(settings)}/api/2.0/mlflow/experiments/search",
                                     data=b'{"max_results": 1}', method="POST",
                                     headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


SIGNED = ("AWS4-HMAC-SHA256 Credential=AKIAEXAMPLE/20260101/us-west-2/sagemaker-mlflow/aws4_request, "
          "SignedHeaders=host;x-amz-date, Signature=" + "0" * 64)


def test_the_front_refuses_what_sagemaker_refuses(world: tuple[Settings, Sandbox]) -> None:
    settings, _ = world
    arn = _created(settings, "gate")["TrackingServerArn"]
    status, body = _raw(settings, {"x-mlflow-sm-tracking-server-arn": arn})
    assert (status, body["error_code"]) == (403, "MissingAuthenticationToken")
    status, body = _raw(settings, {"Authorization": SIGNED.replace("sagemaker-mlflow", "s3"),
                                   "x-mlflow-sm-tracking-server-arn": arn})
    assert (status, body["error_code"]) == (403, "InvalidSignatureException")
    status, body = _raw(settings, {"Authorization": SIGNED, "x-mlflow-sm-tracking-server-arn": arn + "-gone"})
    assert (status, body["error_code"]) == (404, "RESOURCE_DOES_NOT_EXIST")
    status, body = _raw(settings, {"Authorization": SIGNED, "x-mlflow-sm-tracking-server-arn": arn})
    assert status == 200 and "experiments" in body
    sagemaker = client(settings, "sagemaker")
    sagemaker.stop_mlflow_tracking_server(TrackingServerName="gate")
    wait_until(lambda: sagemaker.describe_mlflow_tracking_server(TrackingServerName="gate")[
        "TrackingServerStatus"] == "Stopped", 60, "gate Stopped")
    status, body = _raw(settings, {"Authorization": SIGNED, "x-mlflow-sm-tracking-server-arn": arn})
    assert (status, body["error_code"]) == (400, "INVALID_STATE")
    assert "Stopped" in body["message"]


def test_a_presigned_link_signs_in_once(world: tuple[Settings, Sandbox]) -> None:
    settings, _ = world
    _created(settings, "ui")
    url = client(settings, "sagemaker").create_presigned_mlflow_tracking_server_url(
        TrackingServerName="ui", ExpiresInSeconds=300)["AuthorizedUrl"]
    assert url.startswith(f"{mlflow_endpoint(settings)}/auth?authToken=")

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    with pytest.raises(urllib.error.HTTPError) as first:
        opener.open(url, timeout=30)
    assert first.value.code == 302
    with pytest.raises(urllib.error.HTTPError) as second:
        opener.open(url, timeout=30)
    assert second.value.code == 403  # used up


def test_statuses_move_on_the_sandbox_clock(tmp_path: Path) -> None:
    clock = ManualClock()
    servers = MlflowTrackingServers(clock, None, account=ACCOUNT, region="us-west-2")

    def call(operation: str, **params: Any) -> dict[str, Any]:
        return servers.handle(Call("sagemaker", operation, params, "us-west-2", ACCOUNT))

    call("CreateMlflowTrackingServer", TrackingServerName="t", ArtifactStoreUri="s3://b/p",
         RoleArn=f"arn:aws:iam::{ACCOUNT}:role/r")
    assert call("DescribeMlflowTrackingServer", TrackingServerName="t")["TrackingServerStatus"] == "Creating"
    assert servers.serving(f"arn:aws:sagemaker:us-west-2:{ACCOUNT}:mlflow-tracking-server/t")[0] is False
    clock.advance(CREATE_SECONDS - 1)
    servers.tick(clock.now())
    assert call("DescribeMlflowTrackingServer", TrackingServerName="t")["TrackingServerStatus"] == "Creating"
    clock.advance(1)
    servers.tick(clock.now())
    assert call("DescribeMlflowTrackingServer", TrackingServerName="t")["TrackingServerStatus"] == "Created"
    saved = json.loads(json.dumps(servers.to_state()))
    again = MlflowTrackingServers(clock, None, account=ACCOUNT, region="us-west-2")
    again.load_state(saved)
    assert again.serving(f"arn:aws:sagemaker:us-west-2:{ACCOUNT}:mlflow-tracking-server/t") == (True, "")
    call("DeleteMlflowTrackingServer", TrackingServerName="t")
    clock.advance(600)
    servers.tick(clock.now())
    assert call("ListMlflowTrackingServers")["TrackingServerSummaries"] == []
