"""The cluster create/delete faces against a real server in sandbox mode: the CLI's ``kube-token`` exec
plugin that kubectl runs, REST (dry-run plan, prechecks, create, delete, kubeconfig) and the CLI over it.

A cluster made by ``sandbox seed`` (as a user's own would be) stands for one that exists; the sandbox
emulator accepts an EKS token only when it is signed with this installation's sandbox key and its identity
has an access entry, exactly as EKS does.
"""

from __future__ import annotations

import asyncio
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
import yaml

from panels.cluster_create import ClusterCreatePane
from services.auth import Principal, Role
from tests.ledger import CallLedger
from tests.sandbox_support import SeededServer, seeded_server
from tests.support import ROOT, LiveServer, clean_env, wait_until

pytestmark = pytest.mark.slow

KUBECTL = shutil.which("kubectl")
EKS = "faces-eks"
CREATE_STAGES = ["network", "iam", "eks", "dependencies", "hyperpod", "storage", "verify"]
ASK = {"name": "faces-new", "zone": "us-west-2a", "instance_type": "ml.g5.8xlarge", "count": 2}


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeededServer]:
    """The seeded cluster, imported (registered here but not created here)."""
    with seeded_server(tmp_path_factory.mktemp("faces"), EKS, nodes=1) as server:
        accepted = server.live.post("/api/v1/clusters/import", {"eks_cluster": EKS, "hyperpod_cluster": EKS})
        assert accepted.status_code == 202, accepted.text
        done = server.live.get(f"/api/v1/operations/{accepted.json()['operation']['id']}/wait?timeout=120").json()
        assert done["status"] == "succeeded", done
        yield server


def creates(live: LiveServer) -> list[dict[str, Any]]:
    return list(live.get("/api/v1/operations?kind=cluster.create").json())


def delete(live: LiveServer, cluster: str, body: Any = None, token: str | None = None) -> httpx2.Response:
    return httpx2.request("DELETE", f"{live.url}/api/v1/clusters/{cluster}", json=body if body is not None else {},
                          headers=live.headers(token), timeout=30)


def cli(server: SeededServer, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=clean_env(INSTANTSTART_URL=server.live.url,
                                                     INSTANTSTART_TOKEN=server.live.admin_token, **(env or {})))


def exec_kubeconfig(sandbox_config: str, data_dir: Path) -> dict[str, Any]:
    """The sandbox cluster's kubeconfig with its embedded token replaced by the ``kube-token`` exec plugin."""
    config = yaml.safe_load(sandbox_config)
    config["users"] = [{"name": "exec", "user": {"exec": {
        "apiVersion": "client.authentication.k8s.io/v1beta1", "command": sys.executable,
        "args": ["-m", "app.cli", "kube-token", "--cluster-name", EKS, "--data-dir", str(data_dir)],
        "interactiveMode": "Never"}}}]
    for context in config["contexts"]:
        context["context"]["user"] = "exec"
    return dict(config)


def test_kube_token_prints_an_exec_credential_the_cluster_accepts(seeded: SeededServer, tmp_path: Path) -> None:
    data_dir = seeded.live.data_dir
    minted = cli(seeded, "kube-token", "--cluster-name", EKS, "--data-dir", str(data_dir))
    assert minted.returncode == 0, minted.stderr
    credential = json.loads(minted.stdout)
    assert credential["kind"] == "ExecCredential"
    assert credential["apiVersion"] == "client.authentication.k8s.io/v1beta1"
    assert credential["status"]["token"].startswith("k8s-aws-v1.") and credential["status"]["expirationTimestamp"]
    assert minted.stderr == "", "stderr is shown by kubectl on every call"

    if KUBECTL is None:
        pytest.skip("kubectl is not installed")
    sandbox_config = cli(seeded, "kubeconfig", EKS, "--data-dir", str(data_dir))
    assert sandbox_config.returncode == 0, sandbox_config.stderr
    path = tmp_path / "exec.yaml"
    path.write_text(yaml.safe_dump(exec_kubeconfig(sandbox_config.stdout, data_dir)))
    nodes = subprocess.run([KUBECTL, "--kubeconfig", str(path), "get", "nodes", "-o", "name"], capture_output=True,
                           text=True, timeout=60, env=clean_env())
    assert nodes.returncode == 0, nodes.stderr
    assert len(nodes.stdout.split()) == 1 and nodes.stdout.startswith("node/"), nodes.stdout

    # a token for another cluster is refused by this one: the signature covers the cluster's name
    other = exec_kubeconfig(sandbox_config.stdout, data_dir)
    other["users"][0]["user"]["exec"]["args"][4] = "someone-else"
    path.write_text(yaml.safe_dump(other))
    refused = subprocess.run([KUBECTL, "--kubeconfig", str(path), "get", "nodes"], capture_output=True, text=True,
                             timeout=60, env=clean_env())
    assert refused.returncode != 0 and "Unauthorized" in refused.stderr, (refused.stdout, refused.stderr)


def test_kube_token_refuses_a_data_dir_with_no_sandbox_running(seeded: SeededServer, tmp_path: Path) -> None:
    refused = cli(seeded, "kube-token", "--cluster-name", EKS, "--data-dir", str(tmp_path / "nothing-here"),
                  env={"INSTANTSTART_SANDBOX": "true"})
    assert refused.returncode == 1 and "no sandbox is running on" in refused.stderr, refused.stderr
    assert refused.stdout == ""


def test_a_dry_run_answers_the_plan_and_makes_nothing(seeded: SeededServer) -> None:
    live, ledger = seeded.live, CallLedger(seeded.live)
    mark = ledger.mark()
    dry = live.post("/api/v1/clusters?dry_run=true", ASK)
    assert dry.status_code == 200, dry.text
    view = dry.json()
    assert view["plan"]["names"]["eks_cluster"] == "faces-new" and view["plan"]["zone"] == "us-west-2a"
    assert view["stages"] == CREATE_STAGES
    assert set(view["expected_seconds"]) == set(view["stages"])
    assert {r["stage"] for r in view["resources"]} <= set(view["stages"])
    operator = live.post("/api/v1/clusters?dry_run=true", ASK, token=live.make_token("operator"))
    assert operator.status_code == 200 and operator.json()["resources"] == view["resources"], operator.text
    ledger.assert_no_writes(since=mark)
    assert creates(live) == [], "a dry run records no operation"


def test_a_bad_choice_is_refused_at_once_with_the_valid_ones(seeded: SeededServer) -> None:
    live, ledger = seeded.live, CallLedger(seeded.live)
    mark = ledger.mark()
    for path in ("/api/v1/clusters", "/api/v1/clusters?dry_run=true"):
        wrong_zone = live.post(path, {**ASK, "zone": "us-west-2z"})
        assert wrong_zone.status_code == 422, wrong_zone.text
        assert "us-west-2a" in json.dumps(wrong_zone.json()["error"]["details"])
    unknown = live.post("/api/v1/clusters", {**ASK, "vpc_cidrs": "10.0.0.0/16"})
    assert unknown.status_code == 422 and "vpc_cidr" in unknown.text, unknown.text
    taken = live.post("/api/v1/clusters", {**ASK, "name": EKS})
    assert taken.status_code in (409, 422) and EKS in taken.json()["error"]["message"], taken.text
    viewer = live.post("/api/v1/clusters", ASK, token=live.make_token("viewer"))
    assert viewer.status_code == 403, viewer.text
    ledger.assert_no_writes(since=mark)
    assert creates(live) == []


def test_delete_is_admin_only_confirmed_and_never_of_an_imported_cluster(seeded: SeededServer) -> None:
    live, ledger = seeded.live, CallLedger(seeded.live)
    mark = ledger.mark()
    operator = delete(live, EKS, {"confirm": EKS}, token=live.make_token("operator"))
    assert operator.status_code == 403, operator.text
    imported = delete(live, EKS, {"confirm": EKS})
    assert imported.status_code == 409 and "forget" in imported.json()["error"]["message"].lower(), imported.text
    mistyped = delete(live, EKS, {"confirm": "faces-ek"})
    assert mistyped.status_code in (409, 422), mistyped.text
    missing = delete(live, "no-such-cluster", {})
    assert missing.status_code == 404, missing.text
    ledger.assert_no_writes(since=mark)
    assert live.get("/api/v1/operations?kind=cluster.delete").json() == []
    refused = cli(seeded, "clusters", "delete", EKS)
    assert refused.returncode == 1 and "pass --yes" in refused.stderr, refused.stderr


def test_create_answers_its_operation_and_a_replay_the_same_one(seeded: SeededServer) -> None:
    live = seeded.live
    body = {**ASK, "name": "faces-op", "count": 1}  # it runs: the seeded 2 + this 1 + the pane's 1 fill the quota
    first = live.post("/api/v1/clusters", body, headers={"Idempotency-Key": "faces-op-1"})
    assert first.status_code == 202, first.text
    accepted = first.json()
    op = accepted["operation"]
    assert op["kind"] == "cluster.create" and op["target"] == "cluster/faces-op"
    assert [s["name"] for s in op["stages"]] == CREATE_STAGES
    assert first.headers["Location"] == accepted["status_url"] == f"/api/v1/operations/{op['id']}"
    assert "operations_get" in accepted["message"] and accepted["created"] is True
    again = live.post("/api/v1/clusters", body, headers={"Idempotency-Key": "faces-op-1"})
    assert again.status_code == 202 and again.json()["operation"]["id"] == op["id"], again.text
    assert again.json()["created"] is False
    assert [o["id"] for o in creates(live)] == [op["id"]]


def test_the_kubeconfig_holds_no_token_and_kubectl_reads_the_cluster_with_it(seeded: SeededServer,
                                                                             tmp_path: Path) -> None:
    live = seeded.live
    answer = live.get(f"/api/v1/clusters/{EKS}/kubeconfig", token=live.make_token("viewer"))
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/yaml"), answer.text
    config = yaml.safe_load(answer.text)
    user = config["users"][0]["user"]
    assert set(user) == {"exec"} and user["exec"]["command"] == "instantstart"
    assert user["exec"]["args"][:3] == ["kube-token", "--cluster-name", EKS]
    assert "k8s-aws-v1" not in answer.text and "token" not in user
    path = tmp_path / f"{EKS}.yaml"
    written = cli(seeded, "clusters", "kubeconfig", EKS, "-o", str(path))
    assert written.returncode == 0 and path.read_text() == answer.text, written.stderr
    if KUBECTL is None:
        pytest.skip("kubectl is not installed")
    # kubectl runs `instantstart kube-token` from PATH; the data directory names the sandbox it signs for
    env = clean_env(PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
                    INSTANTSTART_DATA_DIR=str(live.data_dir))
    nodes = subprocess.run([KUBECTL, "--kubeconfig", str(path), "get", "nodes", "-o", "name"], capture_output=True,
                           text=True, timeout=60, env=env)
    assert nodes.returncode == 0, nodes.stderr
    assert len(nodes.stdout.split()) == 1 and nodes.stdout.startswith("node/"), nodes.stdout


def test_the_cli_shows_the_plan_and_starts_nothing(seeded: SeededServer) -> None:
    shown = cli(seeded, "clusters", "create", "--name", "faces-cli", "--zone", "us-west-2a", "--instance-type",
                "ml.g5.8xlarge", "--count", "2", "--dry-run")
    assert shown.returncode == 0, shown.stderr
    assert "plan for faces-cli" in shown.stdout and "nothing was made" in shown.stdout
    assert "eks_cluster        faces-cli" in shown.stdout and "expected: about" in shown.stdout
    refused = cli(seeded, "clusters", "create", "--name", "faces-cli", "--zone", "us-west-2z", "--instance-type",
                  "ml.g5.8xlarge", "--count", "2")
    assert refused.returncode == 1 and "422" in refused.stderr, refused.stderr
    assert [o for o in creates(seeded.live) if o["target"] == "cluster/faces-cli"] == []


def test_the_create_pane_offers_inspected_choices_plans_before_create_and_follows_its_operation(
        seeded: SeededServer, tmp_path: Path) -> None:
    """The dashboard's form without a browser, on a second installation of the product against the sandbox."""
    services = seeded.product(tmp_path / "product")
    admin = Principal("pane-admin", Role.ADMIN, "t-adm", "ui")
    try:
        pane = ClusterCreatePane(services.clusters, services.operations, services.bus, admin)  # no loop: reads here
        state = pane.state
        options = services.clusters.cluster_options(admin)
        zones = [z.name for z in options.zones if z.state == "available"]
        assert state.param.zone.objects == zones and state.zone == zones[0]
        narrow = next(z for z in zones if not any(t.instance_type == "ml.g5.8xlarge" and z in t.zones
                                                  for t in options.instance_types))
        state.zone = narrow
        assert sorted(state.param.instance_type.objects.values()) == sorted(
            t.instance_type for t in options.instance_types if narrow in t.zones)
        state.param.update(zone="us-west-2a", instance_type="ml.g5.8xlarge", cluster_name="pane-new", count=1)
        option = state.type_option()
        assert option is not None and option.quota is not None, option
        state.count = option.quota - option.in_use + 1
        assert state.quota_note.startswith("Quota:") and f"{option.quota - option.in_use} free" in state.quota_note
        state.count = 1
        assert state.quota_note == ""

        asyncio.run(state.create())
        assert state.operation is None and "Plan first" in state.message
        asyncio.run(state.make_plan())
        assert state.plan is not None and state.plan.plan.names.eks_cluster == "pane-new", state.message
        assert not pane.create_button.disabled and "Plan for pane-new" in str(pane.plan_view.object)
        state.count = 2  # a changed decision drops the plan: Create follows only what was shown
        assert state.plan is None and pane.create_button.disabled
        state.count = 1

        async def changed_while_planned() -> None:
            planning = asyncio.ensure_future(state.make_plan())
            await asyncio.sleep(0)  # the plan's first step ran: it is read in the executor, not landed
            state.count = 2  # the user changes a decision meanwhile
            await planning

        asyncio.run(changed_while_planned())
        assert state.plan is None and pane.create_button.disabled, "a plan of what the form no longer says"
        state.count = 1
        asyncio.run(state.make_plan())

        asyncio.run(state.create())
        op = state.operation
        assert op is not None and op.kind == "cluster.create" and op.target == "cluster/pane-new", state.message
        elsewhere = ClusterCreatePane(services.clusters, services.operations, services.bus, admin)  # another tab
        assert elsewhere.state.operation is None
        services.start()  # the engine runs it; its events bring every later version to the pane
        done = services.operations.wait_operation(admin, op.id, timeout=60)
        assert done.status.terminal, done
        # the row ends before its last event is published: wait for that event to reach both tabs
        ended = f"class='op-status'>{done.status.value}<"

        def both_show_the_end() -> bool:
            ours, theirs = state.operation, elsewhere.state.operation
            return (ours is not None and ours.status == done.status and theirs is not None
                    and theirs.status == done.status and ended in str(pane.progress.object))

        wait_until(both_show_the_end, 60, "the operation's last event in both tabs")
        assert elsewhere.state.operation is not None and elsewhere.state.operation.id == op.id, "not adopted"
        assert elsewhere.state.operation.status == done.status
        shown = str(pane.progress.object)
        assert f"<code>{op.id}</code>" in shown and ended in shown
        assert all(f"data-stage='{s.name}' data-status='{s.status}'" in shown for s in done.stages)

        state.target = "pane-new"
        state.confirm = "pane-ne"
        assert pane.delete_button.disabled
        asyncio.run(state.delete())
        assert "Type the cluster's name" in state.message
        assert [o.kind for o in services.operations.list_operations(admin)] == ["cluster.create"]
    finally:
        services.stop()
