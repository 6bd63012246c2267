"""A feature turned on for a cluster created here is removed by that cluster's delete: the delete's dependencies
stage walks the component registry, the optional HyperPod operators included, so nothing a feature made (its
add-on, its IAM role, its pod identity association) outlives the cluster."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest

from tests.create_support import leftovers, live_aws, live_sandbox, operation_end
from tests.ledger import CallLedger
from tests.support import LiveServer

pytestmark = pytest.mark.slow
NAME = "feat"
REQUEST = {"name": NAME, "zone": "us-west-2a", "instance_type": "ml.g5.8xlarge", "count": 1}


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, int]]:
    with live_sandbox(tmp_path_factory.mktemp("features-teardown"), 1000) as server:
        yield server


def aws(live: LiveServer, aws_port: int, service: str) -> Any:
    return live_aws(live, aws_port, service)


def finished(live: LiveServer, op_id: str, timeout: float = 600) -> dict[str, Any]:
    view = operation_end(live, op_id, timeout)
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
