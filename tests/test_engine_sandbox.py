"""The hardened engine against the sandbox's AWS endpoint, with a test kind that tags a real (sandbox) EKS
cluster at cluster- and group-level targets: conflicts by target, deadlines, the engine's own backoff on an
injected ``throttle`` fault, and an unclassified bug failing at once as ``internal``.

The sandbox runs in its own ``instantstart serve``; the engine under test runs here, on its own state
database and a fake clock, so waits and backoff take no real time. Assertions are on what AWS saw (the
cluster's tags, the fault's remaining count) and on the stored stages."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx2
import pytest
from botocore.config import Config

from services.audit import AuditLog
from services.aws import AwsClients
from services.clock import FakeClock
from services.db import Database
from services.errors import Conflict
from services.events import EventBus
from services.operations import Engine, OperationView, Status
from tests.conftest import OPERATOR
from tests.kinds import TagRequest, tag_kind
from tests.sandbox_support import EKS_TRUST
from tests.support import LiveServer, free_port, start_server, wait_until

pytestmark = pytest.mark.slow
CLUSTER = "eng-eks"


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, str]]:
    aws_port = free_port()
    live = start_server(tmp_path_factory.mktemp("engine-sandbox") / "data",
                        env={"INSTANTSTART_SANDBOX_SPEED": "3000", "INSTANTSTART_SANDBOX_AWS_PORT": str(aws_port)})
    endpoint = f"http://127.0.0.1:{aws_port}"
    kw: dict[str, Any] = {"endpoint_url": endpoint, "region_name": "us-west-2", "aws_access_key_id": "AKIAENGINE",
                          "aws_secret_access_key": "x", "config": Config(retries={"total_max_attempts": 1})}
    ec2, eks, iam = (boto3.client(s, **kw) for s in ("ec2", "eks", "iam"))
    vpc = ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    subnets = [ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.9.{i}.0/24", AvailabilityZone=f"us-west-2{z}")
               ["Subnet"]["SubnetId"] for i, z in ((1, "a"), (2, "b"))]
    role = iam.create_role(RoleName="eng-eks-role", AssumeRolePolicyDocument=EKS_TRUST)["Role"]["Arn"]
    eks.create_cluster(name=CLUSTER, roleArn=role, resourcesVpcConfig={"subnetIds": subnets})
    yield live, endpoint
    live.stop()


@pytest.fixture
def aws(sandbox: tuple[LiveServer, str]) -> AwsClients:
    session = boto3.Session(aws_access_key_id="AKIAENGINE", aws_secret_access_key="x", region_name="us-west-2")
    return AwsClients("us-west-2", sandbox[1], session=session)


@pytest.fixture
def engine(tmp_path: Path, aws: AwsClients, clock: FakeClock) -> Iterator[Engine]:
    db = Database(tmp_path / "state.db")
    made = Engine(db, EventBus(), AuditLog(db, clock), clock, workers=1)
    made.register(tag_kind(aws, deadline=90))
    yield made
    db.close()


def tags(aws: AwsClients) -> dict[str, str]:
    eks = aws.client("eks")
    return dict(eks.list_tags_for_resource(resourceArn=eks.describe_cluster(name=CLUSTER)["cluster"]["arn"])["tags"])


def submit(engine: Engine, **fields: Any) -> OperationView:
    return engine.submit("test.eks.tag", TagRequest(cluster=CLUSTER, **fields), OPERATOR)[0]


def drive(engine: Engine, clock: FakeClock, op_id: str, rounds: int = 50) -> OperationView:
    """Run the operation, moving the fake clock to each due time, until it ends."""
    for _ in range(rounds):
        view = engine.run_until_idle(op_id)
        if view.status.terminal:
            return view
        clock.advance(30)
    raise AssertionError(f"{op_id} did not end: {engine.get(op_id)}")


def test_a_cluster_mutation_while_a_group_one_runs_is_refused_naming_it_and_two_groups_proceed(
        engine: Engine, clock: FakeClock, aws: AwsClients) -> None:
    group_a = submit(engine, group="a", value="conflicts", wait_for="release-a")
    assert engine.run_until_idle(group_a.id).status == Status.WAITING  # tagged, now waiting for its release
    with pytest.raises(Conflict) as refused:
        submit(engine, value="conflicts")
    assert refused.value.http_status == 409
    assert refused.value.details["operation_id"] == group_a.id
    assert refused.value.details["status_tool"] == "operations_get"
    assert group_a.id in refused.value.message and "operations_get" in refused.value.message
    assert tags(aws).get("cluster") != "conflicts"  # refused before any row, so nothing reached AWS

    group_b = submit(engine, group="b", value="conflicts")  # another group: no conflict
    assert drive(engine, clock, group_b.id).status == Status.SUCCEEDED
    # an identical request joins the running operation instead of conflicting with it
    assert submit(engine, group="a", value="conflicts", wait_for="release-a").id == group_a.id

    eks = aws.client("eks")
    eks.tag_resource(resourceArn=eks.describe_cluster(name=CLUSTER)["cluster"]["arn"], tags={"release-a": "1"})
    assert drive(engine, clock, group_a.id).status == Status.SUCCEEDED
    cluster = submit(engine, value="conflicts")  # the group is done: the cluster level may go now
    assert drive(engine, clock, cluster.id).status == Status.SUCCEEDED
    seen = tags(aws)
    assert (seen["group-a"], seen["group-b"], seen["cluster"]) == ("conflicts", "conflicts", "conflicts")


def test_a_stage_past_its_deadline_fails_naming_the_stage_what_it_waited_for_and_how_long(
        engine: Engine, clock: FakeClock, aws: AwsClients) -> None:
    op = submit(engine, group="late", value="deadline", wait_for="never-set")
    failed = drive(engine, clock, op.id)
    assert failed.status == Status.FAILED
    assert failed.error is not None and failed.error["stage"] == "tag"
    reason = next(c for c in failed.conditions if c.type == "Succeeded").reason
    assert reason == "DeadlineExceeded"
    message = failed.error["message"]
    assert "stage tag" in message and f"tag never-set on EKS cluster {CLUSTER}" in message
    assert "after 90.0s" in message and "deadline of 90.0s" in message
    assert failed.error["details"]["waited_seconds"] == 90 and failed.stages[0].status == "failed"
    assert tags(aws)["group-late"] == "deadline"  # it acted; the deadline ends the wait, not the evidence


def test_an_injected_throttle_is_retried_by_the_engine_and_the_operation_succeeds(
        sandbox: tuple[LiveServer, str], engine: Engine, clock: FakeClock, aws: AwsClients) -> None:
    live, _ = sandbox
    injected = live.post("/api/v1/sandbox/faults", {"kind": "throttle", "count": 3,
                                                    "target": {"service": "eks", "operation": "TagResource"}})
    assert injected.status_code == 201, injected.text
    op = submit(engine, group="throttled", value="backoff")
    first = engine.run_until_idle(op.id)
    assert first.status == Status.WAITING and first.stages[0].retries == 1
    assert "ThrottlingException" in first.stages[0].message
    done = drive(engine, clock, op.id)
    assert done.status == Status.SUCCEEDED, done.error
    stage = done.stages[0]
    # one TagResource per engine step (botocore's retries are off for stages): three throttles, three retries
    assert stage.retries == 3 and stage.backoff_seconds > 0 and stage.attempts == 4
    assert tags(aws)["group-throttled"] == "backoff"
    assert not [f for f in live.get("/api/v1/sandbox/faults").json() if f["id"] == injected.json()["id"]]
    assert 'instantstart_stage_retries_total{kind="test.eks.tag",stage="tag"} 3.0' in engine.metrics.render()


def test_an_injected_access_denial_fails_the_stage_at_once_naming_the_action(
        sandbox: tuple[LiveServer, str], engine: Engine, aws: AwsClients) -> None:
    live, _ = sandbox
    injected = live.post("/api/v1/sandbox/faults", {"kind": "access_denied",
                                                    "target": {"service": "eks", "action": "TagResource"}})
    assert injected.status_code == 201, injected.text
    try:
        op = submit(engine, group="denied", value="never")
        failed = engine.run_until_idle(op.id)  # no clock advance: a refusal is not waited out
        assert failed.status == Status.FAILED and failed.error is not None, failed
        assert failed.error["code"] == "forbidden" and failed.stages[0].retries == 0
        assert "TagResource" in failed.error["message"], failed.error
        assert "group-denied" not in tags(aws)
    finally:
        httpx2.delete(f"{live.url}/api/v1/sandbox/faults/{injected.json()['id']}", headers=live.headers(),
                      timeout=30)


def test_a_key_error_inside_the_adapter_fails_the_stage_at_once_as_internal(
        engine: Engine, caplog: pytest.LogCaptureFixture) -> None:
    op = submit(engine, group="buggy", misread=True)
    with caplog.at_level(logging.ERROR, logger="services.operation_stepper"):
        failed = engine.run_until_idle(op.id)  # no clock advance: it must not be waiting for a retry
    assert failed.status == Status.FAILED
    assert failed.error is not None and failed.error["code"] == "internal" and failed.error["stage"] == "tag"
    assert "KeyError" in failed.error["message"] and failed.stages[0].retries == 0
    logged = wait_until(lambda: [r for r in caplog.records if r.exc_info and r.exc_info[0] is KeyError], 60,
                        "the traceback logged")
    assert "noSuchField" in str(logged[0].exc_info[1])
