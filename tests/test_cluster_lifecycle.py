"""Create → verify → delete through REST against a real server in sandbox mode, as a user would: the dry run
lists what will be made, the create runs every stage, `kubectl` (with the exported exec-plugin kubeconfig)
shows the components as running workloads, the nodes with HyperPod labels and the bound claim; the delete
leaves nothing of what the ledger saw created, and the shared bucket stays."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.create_support import leftovers, live_aws, live_sandbox, operation_end
from tests.ledger import CallLedger
from tests.support import LiveServer, wait_until

pytestmark = pytest.mark.slow
NAME = "life"
REQUEST = {"name": NAME, "zone": "us-west-2a", "instance_type": "ml.g5.8xlarge", "count": 2}


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, int]]:
    with live_sandbox(tmp_path_factory.mktemp("lifecycle"), 200) as server:
        yield server


def aws(live: LiveServer, aws_port: int, service: str) -> Any:
    return live_aws(live, aws_port, service)


def finished(live: LiveServer, op_id: str, timeout: float = 600) -> dict[str, Any]:
    return operation_end(live, op_id, timeout)


def kubectl(live: LiveServer, kubeconfig: Path, *args: str) -> Any:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
           "INSTANTSTART_DATA_DIR": str(live.data_dir)}
    out = subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), *args, "-o", "json"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is on the machine image")
def test_create_verify_delete_through_rest(live: tuple[LiveServer, int], tmp_path: Path) -> None:
    server, aws_port = live
    ledger = CallLedger(server)
    mark = ledger.mark()
    dry = server.post("/api/v1/clusters?dry_run=true", REQUEST)
    assert dry.status_code == 200, dry.text
    planned = dry.json()
    assert {r["stage"] for r in planned["resources"]} >= {"network", "iam", "eks", "dependencies", "hyperpod",
                                                          "storage"}
    assert planned["plan"]["names"]["execution_role"] == f"{NAME}-hyperpod-exec-role"
    ledger.assert_no_writes(since=mark)

    created = server.post("/api/v1/clusters", REQUEST)
    assert created.status_code == 202, created.text
    view = finished(server, created.json()["operation"]["id"])
    assert view["status"] == "succeeded", json.dumps(view["error"] or view["stages"], indent=1)[:4000]
    assert [s["name"] for s in view["stages"]] == ["network", "iam", "eks", "dependencies", "hyperpod", "storage",
                                                   "verify"]
    expected = {s["name"]: s["expected_seconds"] for s in view["stages"]}
    assert expected["eks"] == planned["expected_seconds"]["eks"] / 200, "the sandbox's own duration: AWS's, scaled"

    detail = server.get(f"/api/v1/clusters/{NAME}").json()
    assert detail["ownership"] == "managed" and detail["nodes"] == 2, detail
    config = server.get(f"/api/v1/clusters/{NAME}/kubeconfig")
    assert config.status_code == 200, config.text
    assert "token:" not in config.text and "kube-token" in config.text, "an exec plugin, never a token"
    kubeconfig = tmp_path / "life.yaml"
    kubeconfig.write_text(config.text)
    nodes = kubectl(server, kubeconfig, "get", "nodes")["items"]
    assert len(nodes) == 2
    assert all(n["metadata"]["labels"]["sagemaker.amazonaws.com/instance-group-name"] == "workers" for n in nodes)
    workloads = kubectl(server, kubeconfig, "get", "deployments,daemonsets", "-A")["items"]
    names = {w["metadata"]["name"] for w in workloads}
    assert len(names) >= 5, names
    claims = kubectl(server, kubeconfig, "get", "pvc", "-A")["items"]
    assert claims and all(c["status"]["phase"] == "Bound" for c in claims), claims

    bucket = view["stages"][1]["result"]["bucket"]
    deleted = httpx2.request("DELETE", f"{server.url}/api/v1/clusters/{NAME}", json={"confirm": NAME},
                             headers=server.headers(), timeout=30)
    assert deleted.status_code == 202, deleted.text
    gone = finished(server, deleted.json()["operation"]["id"])
    assert gone["status"] == "succeeded", json.dumps(gone["error"] or gone["stages"], indent=1)[:4000]
    left = leftovers(lambda s: aws(server, aws_port, s), ledger.calls(since=mark), NAME)
    assert left == [], left
    aws(server, aws_port, "s3").head_bucket(Bucket=bucket)  # the shared bucket and its data stay
    assert server.get(f"/api/v1/clusters/{NAME}").status_code == 404


def test_a_cancelled_create_is_deleted_without_leftovers(live: tuple[LiveServer, int]) -> None:
    server, aws_port = live
    ledger = CallLedger(server)
    mark = ledger.mark()
    name = "halfway"
    created = server.post("/api/v1/clusters", {**REQUEST, "name": name})
    assert created.status_code == 202, created.text
    op_id = created.json()["operation"]["id"]

    def in_eks() -> bool:
        stages = {s["name"]: s for s in server.get(f"/api/v1/operations/{op_id}").json()["stages"]}
        return stages["eks"]["status"] in ("running", "waiting", "succeeded")

    wait_until(in_eks, 300, "the create to reach its eks stage")
    cancel = server.post(f"/api/v1/operations/{op_id}/cancel")
    assert cancel.status_code in (200, 202), cancel.text
    assert finished(server, op_id)["status"] == "cancelled"
    deleted = httpx2.request("DELETE", f"{server.url}/api/v1/clusters/{name}", headers=server.headers(), timeout=30)
    assert deleted.status_code == 202, deleted.text
    gone = finished(server, deleted.json()["operation"]["id"])
    assert gone["status"] == "succeeded", json.dumps(gone["error"] or gone["stages"], indent=1)[:4000]
    assert leftovers(lambda s: aws(server, aws_port, s), ledger.calls(since=mark), name) == []


def test_deleting_a_cluster_never_created_here_is_a_404(live: tuple[LiveServer, int]) -> None:
    server, _ = live
    missing = httpx2.request("DELETE", f"{server.url}/api/v1/clusters/nothing-here", headers=server.headers(),
                             timeout=30)
    assert missing.status_code == 404, missing.text
