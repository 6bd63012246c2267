"""SIGKILL of the product between a node-action batch call and the save of its result: a replace of 30 nodes
is two BatchReplaceClusterNodes calls (25 + 5); the sandbox answers the first and holds the second's answer
(a ``hold_response`` fault with ``after``), so the product dies with the first batch saved (each batch's outcome
is saved before the next call) and the second unrecorded. After a restart the operation observes the world for
what it has no record of before sending again, finishes, and the ledger shows each node id sent exactly once."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.auth import Principal, Role
from services.clusters.models import ClusterImport
from services.db import loads
from services.operations import TERMINAL
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


def test_a_replace_killed_between_a_batch_call_and_its_save_sends_each_node_once(
        seeded: SeededServer, tmp_path: Path) -> None:
    live = seeded.live
    data = tmp_path / "product"
    reader = seeded.product(data)  # never started: imports the cluster, then reads what the workers write
    try:
        imported, _ = reader.clusters.import_cluster(ADMIN, ClusterImport(eks_cluster="hp-eks",
                                                                          hyperpod_cluster="hp-eks"))
        wait_until(lambda: reader.engine.run_until_idle(imported.id).status == "succeeded", 60, "the import")
        reader.informers.stop()
        before = {n["InstanceId"] for n in aws(seeded, "sagemaker").list_cluster_nodes(
            ClusterName="hp-eks", MaxResults=100)["ClusterNodeSummaries"]}
        assert len(before) == NODES
        ledger = CallLedger(live)
        mark = ledger.mark()
        hold = live.post("/api/v1/sandbox/faults", {"kind": "hold_response", "count": 1, "target": {
            "service": "sagemaker", "operation": "BatchReplaceClusterNodes", "after": 1}})
        assert hold.status_code == 201, hold.text
        fault_id = hold.json()["id"]
        request = {"selector": "sagemaker.amazonaws.com/instance-group-name=workers", "confirm": True}
        proc = worker(seeded, data, "replace", "hp-eks", json.dumps(request))
        try:
            assert proc.stdout is not None
            op_id = proc.stdout.readline().strip()
            assert op_id.startswith("op-"), op_id
            wait_until(lambda: len(ledger.succeeded("sagemaker", "BatchReplaceClusterNodes", since=mark)) == 2
                       and held_answers(live, fault_id) == 1, 120, "both batches sent, the second's answer held")
            proc.kill()  # SIGKILL between the batch call and the save of its result
            proc.wait(10)
            saved = loads(reader.db.query_one("SELECT data FROM stages WHERE operation_id=?", (op_id,))["data"])
            first_batch = ledger.succeeded("sagemaker", "BatchReplaceClusterNodes", since=mark)[0]["request"]
            assert saved["sent"] == saved["accepted"] == first_batch["NodeIds"] and not saved.get("sent_all"), \
                "the answered batch was saved before the next call; the held one was not"
            wait_until(lambda: held_answers(live, fault_id) == 0, 60, "the answer dropped with the product")
            proc = worker(seeded, data)  # a fresh process resumes the operation
            final = wait_until(lambda: (v := reader.engine.get(op_id)).status in TERMINAL and v, 300, "the replace")
        finally:
            proc.terminate()
            proc.wait(20)
        assert final.status == "succeeded", (final.error, [(s.name, s.status, s.message) for s in final.stages])
        calls = ledger.succeeded("sagemaker", "BatchReplaceClusterNodes", since=mark)
        sent = [i for c in calls for i in c["request"]["NodeIds"]]
        assert len(calls) == 2 and sorted(sent) == sorted(before), f"each node sent exactly once: {sent}"
        assert not ledger.calls(service="sagemaker", operation="BatchReplaceClusterNodes", since=calls[-1]["seq"])
        assert sorted(final.stages[0].result["accepted"]) == sorted(before), "the resumed stage knows all 30"
        after = {n["InstanceId"] for n in aws(seeded, "sagemaker").list_cluster_nodes(
            ClusterName="hp-eks", MaxResults=100)["ClusterNodeSummaries"]}
        assert len(after) == NODES and not after & before, "every node replaced by a new instance"
    finally:
        reader.stop()
