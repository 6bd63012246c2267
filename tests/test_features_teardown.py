"""A feature turned on for a cluster created here is removed by that cluster's delete: the delete's dependencies
stage walks the component registry, the optional HyperPod operators included, so nothing a feature made (its
add-on, its IAM role, its pod identity association) outlives the cluster."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import httpx2
import pytest

from app.sandbox import SANDBOX_ACCESS_KEY
from tests.create_support import leftovers
from tests.ledger import CallLedger
from tests.support import LiveServer, free_port, start_server, wait_until

pytestmark = pytest.mark.slow
NAME = "feat"
REQUEST = {"name": NAME, "zone": "us-west-2a", "instance_type": "ml.g5.8xlarge", "count": 1}


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, int]]:
    aws_port = free_port()
    server = start_server(tmp_path_factory.mktemp("features-teardown") / "data",
                          env={"INSTANTSTART_SANDBOX_SPEED": "1000", "INSTANTSTART_SANDBOX_AWS_PORT": str(aws_port)})
    yield server, aws_port
    server.stop()


def aws(live: LiveServer, aws_port: int, service: str) -> Any:
    secret = (live.data_dir / "sandbox" / "aws-secret-key").read_text().strip()
    return boto3.client(service, endpoint_url=f"http://127.0.0.1:{aws_port}", region_name="us-west-2",
                        aws_access_key_id=SANDBOX_ACCESS_KEY, aws_secret_access_key=secret)


def finished(live: LiveServer, op_id: str, timeout: float = 600) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        view = live.get(f"/api/v1/operations/{op_id}", params={"wait": 30}).json()
        return view if view["status"] in ("succeeded", "failed", "cancelled") else None

    view = wait_until(done, timeout, f"operation {op_id} to end")
    assert view["status"] == "succeeded", json.dumps(view["error"] or view["stages"], indent=1)[:4000]
    return view


def test_a_feature_enabled_on_a_created_cluster_goes_with_its_delete(live: tuple[LiveServer, int]) -> None:
    server, aws_port = live
    ledger = CallLedger(server)
    mark = ledger.mark()
    created = server.post("/api/v1/clusters", REQUEST)
    assert created.status_code == 202, created.text
    finished(server, created.json()["operation"]["id"])
    listed = {f["name"]: f for f in server.get(f"/api/v1/clusters/{NAME}/features").json()["features"]}
    assert listed["cert_manager"]["enabled"] and not listed["cert_manager"]["foreign"], "made by the create"
    assert not listed["hyperpod_training_operator"]["enabled"], "an optional feature is never installed at create"

    sent = httpx2.patch(f"{server.url}/api/v1/clusters/{NAME}/features", json={"hyperpod_training_operator": True},
                        headers=server.headers(), timeout=70)
    assert sent.status_code == 202, sent.text
    toggled = finished(server, sent.json()["operation"]["id"])
    assert [s["name"] for s in toggled["stages"]] == ["pod_identity_agent", "cert_manager",
                                                      "hyperpod_training_operator"]
    assert [s["acted"] for s in toggled["stages"]] == [False, False, True], "the create's prerequisites are used"
    role = f"{NAME}-hp-training-operator-role"
    aws(server, aws_port, "iam").get_role(RoleName=role)

    deleted = httpx2.request("DELETE", f"{server.url}/api/v1/clusters/{NAME}", json={"confirm": NAME},
                             headers=server.headers(), timeout=30)
    assert deleted.status_code == 202, deleted.text
    gone = finished(server, deleted.json()["operation"]["id"])
    teardown = next(s for s in gone["stages"] if s["name"] == "dependencies")["result"]["deleted"]
    assert any(d.startswith("amazon-sagemaker-hyperpod-training-operator: ") for d in teardown), teardown
    assert f"amazon-sagemaker-hyperpod-training-operator: role:{role}" in teardown
    assert leftovers(lambda s: aws(server, aws_port, s), ledger.calls(since=mark), NAME) == []
