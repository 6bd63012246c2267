"""The tracking server as a managed resource of a cluster, driven through the real server's REST API and a real
MCP client, against the sandbox: made once (its role, then CreateMlflowTrackingServer), idempotent by name,
refused before any write when the request cannot be met; the job's identity and the job's MLflow run per the
issue-13 contract, idempotent on retry."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client, StdioServerParameters

from app.sandbox import aws_session
from services.auth import Principal, Role
from services.mlflow.client import tracking_client
from services.models import RequestModel
from services.settings import Settings
from services.stages import OperationKind
from tests.ledger import CallLedger
from tests.sandbox_support import SeededServer
from tests.support import ROOT, LiveServer, clean_env, free_port, start_server, wait_until

pytestmark = pytest.mark.slow
CLUSTER = "ml-eks"
BASE = f"/api/v1/clusters/{CLUSTER}/mlflow"
ADMIN = Principal("tester", Role.ADMIN)


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory, mlflow_url: str) -> Iterator[SeededServer]:
    folder = tmp_path_factory.mktemp("mlflow-tracking")
    aws_port, kube_port = free_port(), free_port()
    live = start_server(folder / "data", env={"INSTANTSTART_SANDBOX_SPEED": "3000",
                                              "INSTANTSTART_SANDBOX_AWS_PORT": str(aws_port),
                                              "INSTANTSTART_SANDBOX_KUBE_PORT": str(kube_port),
                                              "INSTANTSTART_SANDBOX_MLFLOW_URL": mlflow_url})
    try:
        seed = subprocess.run([sys.executable, "-m", "app.cli", "sandbox", "seed", "--name", CLUSTER, "--nodes", "1",
                               "--data-dir", str(live.data_dir)], cwd=ROOT, capture_output=True, text=True,
                              timeout=300)
        assert seed.returncode == 0, seed.stderr
        made = live.post("/api/v1/clusters/import", {"eks_cluster": CLUSTER, "hyperpod_cluster": CLUSTER})
        assert made.status_code == 202, made.text
        done = live.get(f"/api/v1/operations/{made.json()['operation']['id']}/wait?timeout=120").json()
        assert done["status"] == "succeeded", done
        yield SeededServer(live, aws_port, kube_port)
    finally:
        live.stop()


def _end(live: LiveServer, op_id: str) -> dict[str, Any]:
    for _ in range(20):
        view = live.get(f"/api/v1/operations/{op_id}/wait?timeout=120").json()
        if view["status"] in ("succeeded", "failed", "cancelled"):
            return dict(view)
    raise AssertionError(f"{op_id} did not end")


@pytest.fixture(scope="module")
def created(seeded: SeededServer) -> dict[str, Any]:
    """The tracking server, made through REST once; what the ledger saw while it was made."""
    live = seeded.live
    ledger = CallLedger(live)
    assert live.get(BASE).json()["status"] == "Absent"
    mark = ledger.mark()
    answer = live.post(BASE, {"size": "Small"})
    assert answer.status_code == 202, answer.text
    view = _end(live, answer.json()["operation"]["id"])
    assert view["status"] == "succeeded", view
    return {"mark": mark, "operation": view, "ledger": ledger}


def test_create_makes_the_role_then_the_server_once(seeded: SeededServer, created: dict[str, Any]) -> None:
    live, ledger, mark = seeded.live, created["ledger"], created["mark"]
    role = ledger.once("iam", "CreateRole", mark, target=f"{CLUSTER}-mlflow")
    trust = json.loads(role["request"]["AssumeRolePolicyDocument"])
    assert trust["Statement"][0]["Principal"] == {"Service": "sagemaker.amazonaws.com"}
    made = ledger.once("sagemaker", "CreateMlflowTrackingServer", mark, target=f"{CLUSTER}-mlflow")
    assert made["request"]["ArtifactStoreUri"] == (f"s3://instantstart-shared-123456789012-us-west-2/instantstart/"
                                                   f"{CLUSTER}/mlflow/")
    assert made["request"]["RoleArn"] == f"arn:aws:iam::123456789012:role/{CLUSTER}-mlflow"
    assert made["seq"] > role["seq"]
    view = live.get(BASE).json()
    assert (view["status"], view["ready"], view["size"]) == ("Created", True, "Small")
    assert view["arn"] == f"arn:aws:sagemaker:us-west-2:123456789012:mlflow-tracking-server/{CLUSTER}-mlflow"

    mark = ledger.mark()  # before the post: a fast worker may act before the 202 is read
    again = live.post(BASE, {})  # idempotent by name: an operation that changes nothing
    assert again.status_code == 202, again.text
    assert _end(live, again.json()["operation"]["id"])["status"] == "succeeded"
    ledger.assert_no_writes(mark, service="sagemaker")
    ledger.assert_no_writes(mark, service="iam")


def test_refusals_come_before_any_write(seeded: SeededServer, created: dict[str, Any]) -> None:
    live, ledger = seeded.live, created["ledger"]
    mark = ledger.mark()
    other_size = live.post(BASE, {"size": "Large"})
    assert other_size.status_code == 409, other_size.text
    assert "Small" in other_size.json()["error"]["message"]
    bad = live.post(BASE, {"size": "Huge"})
    assert bad.status_code == 422, bad.text
    viewer = live.make_token("viewer")
    assert live.post(BASE, {}, token=viewer).status_code == 403
    assert live.post(f"{BASE}/presigned-url", {}, token=viewer).status_code == 403
    assert live.get("/api/v1/clusters/nope/mlflow").status_code == 404
    ledger.assert_no_writes(mark)


def test_the_presigned_link_is_answered_and_logged_nowhere(seeded: SeededServer, created: dict[str, Any]) -> None:
    live = seeded.live
    answer = live.post(f"{BASE}/presigned-url", {})
    assert answer.status_code == 200, answer.text
    url = answer.json()["url"]
    token = url.partition("authToken=")[2]
    assert token and answer.json()["expires_in_seconds"] == 300
    for path in live.data_dir.rglob("*"):
        if path.is_file() and path.suffix in (".log", ".jsonl", ".json", ".db", ".sqlite3"):
            assert token not in path.read_text(errors="replace"), path


def _services(seeded: SeededServer, tmp_path: Path) -> Any:
    return seeded.imported(tmp_path / "product", CLUSTER, ADMIN)


def test_job_identity_and_the_jobs_run(seeded: SeededServer, created: dict[str, Any], tmp_path: Path) -> None:
    ledger = created["ledger"]
    with _services(seeded, tmp_path) as services:
        mark = ledger.mark()
        identity = services.mlflow.job_identity(ADMIN, CLUSTER, "hyperpod-ns-training")
        assert identity.role_name == f"{CLUSTER}-jobs-hyperpod-ns-training"
        role = ledger.once("iam", "CreateRole", mark, target=identity.role_name)
        assert json.loads(role["request"]["AssumeRolePolicyDocument"])["Statement"][0]["Principal"] == {
            "Service": "pods.eks.amazonaws.com"}
        policy = json.loads(ledger.once("iam", "PutRolePolicy", mark)["request"]["PolicyDocument"])
        mlflow_statement = next(s for s in policy["Statement"] if s["Action"] == ["sagemaker-mlflow:*"])
        assert mlflow_statement["Resource"] == services.mlflow.describe_tracking(ADMIN, CLUSTER).arn
        again = ledger.mark()
        services.mlflow.job_identity(ADMIN, CLUSTER, "hyperpod-ns-training")
        ledger.assert_no_writes(again, service="iam")

        first = services.mlflow.open_run(ADMIN, CLUSTER, "hyperpod-ns-training", "llama-sft", "llama-factory")
        second = services.mlflow.open_run(ADMIN, CLUSTER, "hyperpod-ns-training", "llama-sft", "llama-factory")
        assert first.created and not second.created and second.run_id == first.run_id
        arn = services.mlflow.describe_tracking(ADMIN, CLUSTER).arn
        assert first.env == {"MLFLOW_TRACKING_URI": arn, "MLFLOW_RUN_ID": first.run_id,
                             "MLFLOW_EXPERIMENT_NAME": "hyperpod-ns-training"}
        settings = Settings(data_dir=tmp_path / "product", sandbox=True, sandbox_aws_port=seeded.aws_port,
                            sandbox_kube_port=seeded.kube_port)
        with tracking_client(arn, aws_session(settings)) as mlflow:
            run = mlflow.get_run(first.run_id)
            experiment = mlflow.get_experiment(run.info.experiment_id)
        assert experiment.name == "hyperpod-ns-training" and run.info.run_name == "llama-sft"
        wanted = {"instantstart.job": "llama-sft", "instantstart.cluster": CLUSTER,
                  "instantstart.recipe": "llama-factory"}
        assert {k: run.data.tags[k] for k in wanted} == wanted
        relayed = ledger.calls(service="sagemaker-mlflow")
        assert relayed and {c["target"] for c in relayed} == {arn}


def test_mlflow_tools_through_a_real_mcp_client(seeded: SeededServer, created: dict[str, Any]) -> None:
    live = seeded.live
    operator = live.make_token("operator")
    params = StdioServerParameters(command=sys.executable, args=["-m", "app.cli", "mcp", "--url", live.url,
                                                                       "--toolsets", "mlflow"],
                                   env={**clean_env(), "INSTANTSTART_TOKEN": operator}, cwd=str(ROOT))

    async def agent() -> tuple[set[str], dict[str, Any], dict[str, Any]]:
        async with Client(params) as client:
            tools = {t.name for t in (await client.list_tools()).tools}
            got = await client.call_tool("mlflow_get", {"cluster": CLUSTER})
            link = await client.call_tool("mlflow_presigned_url", {"cluster": CLUSTER})
            return tools, dict(got.structured_content or {}), dict(link.structured_content or {})

    tools, view, link = anyio.run(agent)
    assert {"mlflow_get", "mlflow_create", "mlflow_presigned_url"} <= tools
    assert "mlflow_delete" not in tools  # admin only: an operator's bridge does not offer it
    assert view["status"] == "Created" and view["arn"].endswith(f"/{CLUSTER}-mlflow")
    assert "authToken=" in link["url"]


class JobRequest(RequestModel):
    """What ``job.submit`` carries that the MLflow stages read (the jobs developer's request has these fields)."""

    cluster: str
    namespace: str
    name: str
    recipe: str


def test_the_job_stages_run_in_the_engine(seeded: SeededServer, created: dict[str, Any], tmp_path: Path) -> None:
    ledger = created["ledger"]
    with _services(seeded, tmp_path) as services:
        kind = OperationKind("test.job_submit", JobRequest, services.mlflow.job_stages(),
                             target=lambda r: f"cluster/{r.cluster}/job/{r.namespace}/{r.name}")
        services.engine.register(kind)
        mark = ledger.mark()
        request = JobRequest(cluster=CLUSTER, namespace="hyperpod-ns-stages", name="pt-1", recipe="pytorch")
        view, _ = services.engine.submit("test.job_submit", request, ADMIN)
        done = wait_until(lambda: (v := services.engine.run_until_idle(view.id)).status.value == "succeeded" and v,
                          60, "the job stages to finish")
        identity, run = (s.result or {} for s in done.stages)
        assert identity["role_name"] == f"{CLUSTER}-jobs-hyperpod-ns-stages" and identity["association_id"]
        ledger.once("eks", "CreatePodIdentityAssociation", mark)
        assert run["env"]["MLFLOW_RUN_ID"] == run["run_id"] and run["created"]
        assert run["env"]["MLFLOW_EXPERIMENT_NAME"] == "hyperpod-ns-stages"


def test_the_pane_shows_the_server_and_hands_out_the_ui_link(seeded: SeededServer, created: dict[str, Any],
                                                             tmp_path: Path) -> None:
    from panels.mlflow import MlflowPane

    with _services(seeded, tmp_path) as services:
        pane = MlflowPane(services.mlflow, services.clusters, services.operations, ADMIN)
        assert pane.state.cluster == CLUSTER and pane.state.view is not None and pane.state.view.ready
        assert "Created" in pane.status.object and f"{CLUSTER}-mlflow" in pane.status.object
        assert pane.create_button.disabled and not pane.link_button.disabled
        link, error = pane.state.sign_in()
        assert not error and "authToken=" in link
        viewer = MlflowPane(services.mlflow, services.clusters, services.operations, Principal("v", Role.VIEWER))
        assert viewer.link_button.disabled and viewer.create_button.disabled
        assert "refused (forbidden)" in viewer.state.sign_in()[1]


def test_delete_is_admin_only_and_takes_the_role_with_it(seeded: SeededServer, created: dict[str, Any],
                                                         tmp_path: Path) -> None:
    live, ledger = seeded.live, created["ledger"]
    operator = live.make_token("operator")
    assert httpx2.delete(live.url + BASE, headers=live.headers(operator), timeout=30).status_code == 403
    mark = ledger.mark()
    answer = httpx2.delete(live.url + BASE, headers=live.headers(), timeout=30)
    assert answer.status_code == 202, answer.text
    assert _end(live, answer.json()["operation"]["id"])["status"] == "succeeded"
    ledger.once("sagemaker", "DeleteMlflowTrackingServer", mark, target=f"{CLUSTER}-mlflow")
    ledger.once("iam", "DeleteRole", mark, target=f"{CLUSTER}-mlflow")
    assert live.get(BASE).json()["status"] == "Absent"
    gone = httpx2.delete(live.url + BASE, headers=live.headers(), timeout=30)
    assert gone.status_code == 404, gone.text
    with _services(seeded, tmp_path) as services:  # no tracking server: a job gets no run and is told why
        mark = ledger.mark()
        run = services.mlflow.open_run(ADMIN, CLUSTER, "hyperpod-ns-training", "later", "pytorch")
        assert (run.env, run.run_id) == ({}, "") and "no MLflow tracking server" in run.note
        assert not ledger.calls(service="sagemaker-mlflow", since=mark)
