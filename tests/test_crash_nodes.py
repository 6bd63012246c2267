"""SIGKILL of the product between a node-action batch call and the save of its result: a replace of 30 nodes
is two BatchReplaceClusterNodes calls (25 + 5); the sandbox answers the first and holds the second's answer
(a ``hold_response`` fault with ``after``), so the product dies with the first batch saved (each batch's outcome
is saved before the next call) and the second unrecorded. After a restart the operation observes the world for
what it has no record of before sending again, finishes, and the ledger shows each node id sent exactly once.
The same for a Continuous-mode delete by NodeLogicalId whose only call's answer is lost: the resumed stage sees
the node going (by its logical id) and sends nothing again."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.bootstrap import Services
from services.auth import Principal, Role
from services.db import loads
from services.operations import TERMINAL, OperationView
from tests.create_support import held_answers
from tests.ledger import CallLedger
from tests.node_support import SPEED, aws, node_cluster
from tests.sandbox_support import SeededServer
from tests.support import ROOT, wait_until

pytestmark = pytest.mark.slow
NODES = 30
ADMIN = Principal("crash-tester", Role.ADMIN, "t-crash", "api")


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeededServer]:
    with node_cluster(tmp_path_factory.mktemp("crash-nodes"), NODES) as server:
        yield server


def worker(seeded: SeededServer, data: Path, *submit: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.crash_create_worker", str(data), str(seeded.aws_port),
                             str(seeded.kube_port), str(SPEED), *submit], cwd=ROOT, stdout=subprocess.PIPE, text=True)


def killed_while_held(seeded: SeededServer, data: Path, operation: str, after: int, *submit: str) -> str:
    """Submit through a worker, hold the answer of the ``after``-th (0-based) ``operation`` call, SIGKILL the worker
    while it waits for that answer; the operation id."""
    live, ledger = seeded.live, CallLedger(seeded.live)
    mark = ledger.mark()
    hold = live.post("/api/v1/sandbox/faults", {"kind": "hold_response", "count": 1, "target": {
        "service": "sagemaker", "operation": operation, "after": after}})
    assert hold.status_code == 201, hold.text
    fault_id = hold.json()["id"]
    proc = worker(seeded, data, *submit)
    try:
        assert proc.stdout is not None
        op_id = proc.stdout.readline().strip()
        assert op_id.startswith("op-"), op_id
        wait_until(lambda: len(ledger.succeeded("sagemaker", operation, since=mark)) == after + 1
                   and held_answers(live, fault_id) == 1, 120, f"{after + 1} {operation} sent, the last answer held")
    finally:
        proc.kill()  # SIGKILL between the batch call and the save of its result
        proc.wait(10)
    wait_until(lambda: held_answers(live, fault_id) == 0, 60, "the answer dropped with the product")
    return op_id


def resumed(seeded: SeededServer, reader: Services, data: Path, op_id: str) -> OperationView:
    proc = worker(seeded, data)  # a fresh process resumes the operation
    try:
        final = wait_until(lambda: (v := reader.engine.get(op_id)).status in TERMINAL and v, 300,
                           "the resumed operation")
    finally:
        proc.terminate()
        proc.wait(20)
    return final


def test_a_replace_killed_between_a_batch_call_and_its_save_sends_each_node_once(
        seeded: SeededServer, tmp_path: Path) -> None:
    live = seeded.live
    data = tmp_path / "product"
    with seeded.imported(data, "hp-eks", ADMIN) as reader:
        reader.informers.stop()  # it only reads what the workers write
        before = {n["InstanceId"] for n in aws(seeded, "sagemaker").list_cluster_nodes(
            ClusterName="hp-eks", MaxResults=100)["ClusterNodeSummaries"]}
        assert len(before) == NODES
        ledger = CallLedger(live)
        mark = ledger.mark()
        request = {"selector": "sagemaker.amazonaws.com/instance-group-name=workers", "confirm": True}
        op_id = killed_while_held(seeded, data, "BatchReplaceClusterNodes", 1, "replace", "hp-eks",
                                  json.dumps(request))
        saved = loads(reader.db.query_one("SELECT data FROM stages WHERE operation_id=?", (op_id,))["data"])
        first_batch = ledger.succeeded("sagemaker", "BatchReplaceClusterNodes", since=mark)[0]["request"]
        assert saved["sent"] == saved["accepted"] == first_batch["NodeIds"] and not saved.get("sent_all"), \
            "the answered batch was saved before the next call; the held one was not"
        final = resumed(seeded, reader, data, op_id)
        assert final.status == "succeeded", (final.error, [(s.name, s.status, s.message) for s in final.stages])
        calls = ledger.succeeded("sagemaker", "BatchReplaceClusterNodes", since=mark)
        sent = [i for c in calls for i in c["request"]["NodeIds"]]
        assert len(calls) == 2 and sorted(sent) == sorted(before), f"each node sent exactly once: {sent}"
        assert not ledger.calls(service="sagemaker", operation="BatchReplaceClusterNodes", since=calls[-1]["seq"])
        assert sorted(final.stages[0].result["accepted"]) == sorted(before), "the resumed stage knows all 30"
        after = {n["InstanceId"] for n in aws(seeded, "sagemaker").list_cluster_nodes(
            ClusterName="hp-eks", MaxResults=100)["ClusterNodeSummaries"]}
        assert len(after) == NODES and not after & before, "every node replaced by a new instance"


def test_a_delete_by_logical_id_whose_answer_was_lost_is_not_sent_again(seeded: SeededServer, tmp_path: Path) -> None:
    live, sagemaker = seeded.live, aws(seeded, "sagemaker")
    sagemaker.update_cluster(ClusterName="hp-eks", NodeProvisioningMode="Continuous")  # NodeLogicalIds need it
    wait_until(lambda: sagemaker.describe_cluster(ClusterName="hp-eks")["ClusterStatus"] == "InService", 60,
               "the update applied")
    data = tmp_path / "product"
    with seeded.imported(data, "hp-eks", ADMIN) as reader:
        reader.informers.stop()  # it only reads what the workers write
        running = [n for n in sagemaker.list_cluster_nodes(ClusterName="hp-eks", MaxResults=100,
                                                           IncludeNodeLogicalIds=True)["ClusterNodeSummaries"]
                   if n["InstanceStatus"]["Status"] == "Running"]
        logical = running[0]["NodeLogicalId"]
        ledger = CallLedger(live)
        mark = ledger.mark()
        op_id = killed_while_held(seeded, data, "BatchDeleteClusterNodes", 0, "delete", "hp-eks",
                                  json.dumps({"logical_ids": [logical], "confirm": True}))
        final = resumed(seeded, reader, data, op_id)
        assert final.status == "succeeded", (final.error, [(s.name, s.status, s.message) for s in final.stages])
        calls = ledger.succeeded("sagemaker", "BatchDeleteClusterNodes", since=mark)
        assert [c["request"].get("NodeLogicalIds") for c in calls] == [[logical]], "sent once, never resent"
        assert not ledger.calls(service="sagemaker", operation="BatchDeleteClusterNodes", since=calls[-1]["seq"])
        assert final.stages[0].result["accepted"] == [logical], "the resumed stage counts it as deleted"
        left = {n["NodeLogicalId"]: n["InstanceStatus"]["Status"] for n in sagemaker.list_cluster_nodes(
            ClusterName="hp-eks", MaxResults=100, IncludeNodeLogicalIds=True)["ClusterNodeSummaries"]}
        assert left.get(logical, "ShuttingDown") == "ShuttingDown", "HyperPod deletes the node"
