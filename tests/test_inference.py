"""Self-managed inference against a real server in sandbox mode, on a seeded, imported cluster of ml.g5.8xlarge
nodes (one GPU each) with the cluster's shared-s3 volume, where the sandbox's simulated vLLM and SGLang servers
run the pods' commands: previews for both engines pass the API server's dry run; bad input is refused before any
operation or Kubernetes write; through REST a deployment is made, listed, answers a test through the service
proxy with its pod's name, rolls out a new command and is deleted, with a planted token in no record, response
or log; an engine that cannot start fails the deploy naming its pod and last log line, and an update to a command
that works then rolls out past the old pod's crash loop; an agent follows ``skills/deploy-model.md`` through a real
MCP client for an SGLang deployment of a model on shared storage; and, once the load balancer controller feature
is on, an external deployment gets one internal NLB (its DNS name the deployment's address) that its delete
removes with its target groups and security group."""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import panel as pn
import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from panels.inference import InferencePane
from services.auth import Principal, Role
from services.operations import OperationQuery
from tests.jobs_support import CLUSTER, JobWorld, cli, job_world
from tests.ledger import CallLedger
from tests.mcp_support import bridge, call, follow, playbook_tools
from tests.node_support import aws
from tests.support import wait_until

pytestmark = pytest.mark.slow
BASE = f"/api/v1/clusters/{CLUSTER}/inference/deployments"
NS = "hyperpod-ns-inference"
VLLM = "vllm serve Qwen/Qwen2.5-0.5B-Instruct --max-model-len 4096"
PLAYBOOK = Path(__file__).resolve().parents[1] / "skills" / "deploy-model.md"
SGLANG = "python3 -m sglang.launch_server --model-path /s3/models/Qwen--Qwen2.5-0.5B-Instruct --tp-size 1"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JobWorld]:
    with job_world(tmp_path_factory.mktemp("inference"), components=()) as made:
        made.core.create_namespaced_persistent_volume_claim("default", {  # the claim the storage stage binds
            "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "shared-s3"},
            "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "",
                     "volumeName": f"instantstart-{CLUSTER}-shared-s3",
                     "resources": {"requests": {"storage": "1200Gi"}}}})
        yield made


def body(name: str = "chat", command: str = VLLM, **extra: Any) -> dict[str, Any]:
    return {"name": name, "command": command, "gpus": 1, **extra}


def test_previews_for_both_engines_pass_the_dry_run_and_create_nothing(world: JobWorld) -> None:
    for command, engine, image, port in ((VLLM, "vllm", "vllm/vllm-openai:", 8000),
                                          (SGLANG, "sglang", "lmsysorg/sglang:", 30000)):
        shown = world.live.post(f"{BASE}/preview", body(command=command))
        assert shown.status_code == 200, shown.text
        preview = shown.json()
        assert (preview["engine"], preview["port"]) == (engine, port)
        deployment, service = preview["manifests"]
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        assert container["image"].startswith(image)
        assert container["resources"]["limits"] == {"nvidia.com/gpu": "1"}
        assert service["spec"]["type"] == "ClusterIP" and service["spec"]["ports"][0]["targetPort"] == port
        assert any("ml.g5.8xlarge" in w for w in preview["warnings"])
    assert world.live.get("/api/v1/operations?kind=inference.deploy").json() == []
    with pytest.raises(ApiException) as absent:
        k8s.AppsV1Api(world.api).read_namespaced_deployment("chat", NS)
    assert absent.value.status == 404


def test_bad_input_is_refused_before_any_operation_or_write(world: JobWorld) -> None:
    ledger = CallLedger(world.live)
    mark = ledger.mark()
    flag = world.live.post(BASE, body(command="vllm serve m/x --tensor-paralel-size 1"))
    assert flag.status_code == 422 and "did you mean --tensor-parallel-size" in flag.text, flag.text
    parallel = world.live.post(BASE, body(command="vllm serve m/x --tensor-parallel-size 2 -pp 2"))
    assert parallel.status_code == 422 and "4 GPUs" in parallel.text, parallel.text
    no_gpus = world.live.post(BASE, {"name": "chat", "command": VLLM})
    assert no_gpus.status_code == 422 and "gpus" in no_gpus.text, no_gpus.text
    world_open = world.live.post(BASE, body(service={"exposure": "external", "internet_facing": True,
                                                     "source_ranges": ["0.0.0.0/0"]}))
    assert world_open.status_code == 422 and "whole internet" in world_open.text, world_open.text
    secret_flag = world.live.post(BASE, body(command="vllm serve m/x --hf-token hf_x"))
    assert secret_flag.status_code == 422 and "hf_token" in secret_flag.text
    too_many = world.live.post(BASE, body(command="vllm serve m/x -tp 4", gpus=4))
    assert too_many.status_code == 409 and "no node type of the cluster has 4 GPUs" in too_many.text, too_many.text
    no_lbc = world.live.post(BASE, body(service={"exposure": "external"}))
    assert no_lbc.status_code == 409 and "aws-load-balancer-controller" in no_lbc.text, no_lbc.text
    unknown_field = world.live.post(BASE, {**body(), "gpu": 1})
    assert unknown_field.status_code == 422 and "gpus" in unknown_field.text
    ledger.assert_no_writes(since=mark, service="kubernetes")
    assert world.live.get("/api/v1/operations?kind=inference.deploy").json() == []


def finished(world: JobWorld, op_id: str) -> dict[str, Any]:
    return world.finished(op_id, timeout=180)


def test_deploy_list_test_and_delete_with_the_token_nowhere(world: JobWorld) -> None:
    token = "hf_" + secrets.token_urlsafe(24)
    seen: list[str] = []
    started = world.live.post(BASE, body(command=VLLM + " --served-model-name chat", hf_token=token, replicas=1,
                                         instance_type="ml.g5.8xlarge", model_size_gb=40))
    seen.append(started.text)
    assert started.status_code == 202, started.text
    op = finished(world, started.json()["operation"]["id"])
    seen.append(str(op))
    assert op["status"] == "succeeded", op
    assert op["target"] == f"cluster/{CLUSTER}/inference/chat"

    apps, core = k8s.AppsV1Api(world.api), k8s.CoreV1Api(world.api)
    dep = apps.read_namespaced_deployment("chat", NS)
    assert dep.metadata.labels["app.kubernetes.io/managed-by"] == "instantstart"
    container = dep.spec.template.spec.containers[0]
    hf = next(e for e in container.env if e.name == "HF_TOKEN")
    token_secret = hf.value_from.secret_key_ref.name
    assert hf.value is None and token_secret.startswith("chat-hf-token-")
    secret = core.read_namespaced_secret(token_secret, NS)
    assert [o.kind for o in secret.metadata.owner_references] == ["Deployment"]
    assert secret.metadata.labels == {"app.kubernetes.io/managed-by": "instantstart",
                                      "instantstart.io/inference": "chat"}
    assert core.read_namespaced_service("chat", NS).spec.type == "ClusterIP"

    def listed() -> dict[str, Any] | None:
        rows = world.live.get(BASE).json()["deployments"]
        row = next((r for r in rows if r["name"] == "chat"), None)
        return row if row is not None and row["phase"] == "Available" and row["pods"] else None
    row = wait_until(listed, 60, "the deployment listed Available with its pods")
    seen.append(str(row))
    assert row["engine"] == "vllm" and row["gpus"] == 1 and row["service"]["type"] == "ClusterIP"
    assert all(p["node"] for p in row["pods"])
    one = world.live.get(f"{BASE}/chat")
    seen.append(one.text)
    assert one.status_code == 200 and one.json()["model"] == "Qwen/Qwen2.5-0.5B-Instruct"

    answer = world.live.post(f"{BASE}/chat/test", {"prompt": "hello"})
    seen.append(answer.text)
    assert answer.status_code == 200, answer.text
    result = answer.json()
    assert result["path"] == f"/api/v1/namespaces/{NS}/services/chat:8000/proxy/v1/chat/completions"
    assert result["status"] == 200, result
    assert result["headers"]["x-sandbox-pod"] in {p["name"] for p in row["pods"]}, result
    assert result["text"] and result["answer"]["model"] == "chat", result
    listed_cli = cli(world, "inference", "list", CLUSTER)
    assert listed_cli.returncode == 0, listed_cli.stderr
    assert any(line.startswith(f"{NS}/chat ") and "Available" in line and "1/1 available" in line
               for line in listed_cli.stdout.splitlines()), listed_cli.stdout
    described = cli(world, "inference", "describe", CLUSTER, "chat")
    assert described.returncode == 0 and f"pod {row['pods'][0]['name']}" in described.stdout, described.stdout
    tested = cli(world, "inference", "test", CLUSTER, "chat", "--prompt", "hi", "--json")
    assert tested.returncode == 0 and json.loads(tested.stdout)["status"] == 200, tested.stderr
    missing = world.live.post(f"{BASE}/nope/test", {})
    assert missing.status_code == 404

    def pods() -> set[str]:
        return {p.metadata.uid for p in core.list_namespaced_pod(NS, label_selector="instantstart.io/inference=chat")
                .items if p.metadata.deletion_timestamp is None}
    before = pods()
    for replicas in (2, 1):  # replicas only: the scale subresource, no new ReplicaSet, no engine restarted
        scaled = httpx2.patch(world.live.url + f"{BASE}/chat", json={"replicas": replicas},
                              headers=world.live.headers(), timeout=30)
        assert scaled.status_code == 202, scaled.text
        assert finished(world, scaled.json()["operation"]["id"])["status"] == "succeeded"
        now = apps.read_namespaced_deployment("chat", NS)
        assert now.spec.replicas == replicas and now.spec.template == dep.spec.template
        assert len(apps.list_namespaced_replica_set(NS, label_selector="instantstart.io/inference=chat").items) == 1
        assert before < pods() if replicas == 2 else len(pods()) == 1
    change = {"command": VLLM + " --served-model-name chat --enforce-eager", "image": "vllm/vllm-openai:v0.11.1"}
    keyed = {**world.live.headers(), "Idempotency-Key": "roll-chat"}
    rolled = httpx2.patch(world.live.url + f"{BASE}/chat", json=change, headers=keyed, timeout=30)
    assert rolled.status_code == 202, rolled.text
    assert finished(world, rolled.json()["operation"]["id"])["status"] == "succeeded"
    again = httpx2.patch(world.live.url + f"{BASE}/chat", json=change, headers=keyed, timeout=30)
    assert again.status_code == 202 and again.json()["operation"]["id"] == rolled.json()["operation"]["id"]
    pod_spec = apps.read_namespaced_deployment("chat", NS).spec.template.spec
    template = pod_spec.containers[0]
    assert template.command[-1] == "--enforce-eager" and template.env == container.env
    assert template.image == "vllm/vllm-openai:v0.11.1"
    assert pod_spec.node_selector == dep.spec.template.spec.node_selector == {
        "node.kubernetes.io/instance-type": "ml.g5.8xlarge"}
    assert template.resources == container.resources and template.startup_probe == container.startup_probe
    sets = k8s.AppsV1Api(world.api).list_namespaced_replica_set(NS, label_selector="instantstart.io/inference=chat")
    assert len(sets.items) == 2  # the rolling update made a new ReplicaSet
    port_change = httpx2.patch(world.live.url + f"{BASE}/chat", json={"command": VLLM + " --port 9000"},
                               headers=world.live.headers(), timeout=30)
    assert port_change.status_code == 422 and "port" in port_change.text

    keyed = {**world.live.headers(), "Idempotency-Key": "delete-chat"}
    gone = httpx2.delete(world.live.url + f"{BASE}/chat", headers=keyed, timeout=30)
    assert gone.status_code == 202, gone.text
    deleted = finished(world, gone.json()["operation"]["id"])
    assert deleted["status"] == "succeeded", deleted
    replayed = httpx2.delete(world.live.url + f"{BASE}/chat", headers=keyed, timeout=30)
    assert replayed.status_code == 202 and replayed.json()["operation"]["id"] == deleted["id"], replayed.text
    with pytest.raises(ApiException) as absent:
        apps.read_namespaced_deployment("chat", NS)
    assert absent.value.status == 404
    with pytest.raises(ApiException) as no_service:
        core.read_namespaced_service("chat", NS)
    assert no_service.value.status == 404

    assert token_secrets(world, "chat") == []  # the delete stage deleted it

    seen.append(world.live.get("/api/v1/operations?kind=inference.deploy").text)
    seen.append(world.live.get("/api/v1/audit?limit=500").text)
    seen.append(str(world.api.sanitize_for_serialization(dep)))
    seen.append(world.live.log())
    for path in world.live.data_dir.glob("state.db*"):
        seen.append(path.read_bytes().decode("latin-1"))
    encoded = base64.b64encode(token.encode()).decode()
    for text in seen:
        assert token not in text and encoded not in text


def token_secrets(world: JobWorld, name: str) -> list[str]:
    found = k8s.CoreV1Api(world.api).list_namespaced_secret(NS, label_selector=f"instantstart.io/inference={name}")
    return sorted(s.metadata.name for s in found.items)


def secret_writes(ledger: CallLedger, since: int) -> list[tuple[str, str]]:
    return [(e["verb"], e["name"]) for e in ledger.writes(since, service="kubernetes")
            if e.get("resource") == "secrets" and e["status"] < 400]


def test_each_deploy_request_has_its_own_token_secret(world: JobWorld) -> None:
    """A deploy refused while another runs deletes only its own Secret; a later deploy's apply deletes the older
    one; the delete deletes the rest, an unowned one too. Three replicas on two one-GPU nodes: the rollout
    keeps waiting."""
    ledger = CallLedger(world.live)
    apps = k8s.AppsV1Api(world.api)

    def deploy(token: str) -> httpx2.Response:
        return world.live.post(BASE, body(name="held", hf_token=token, replicas=3))

    def applied(secret: str) -> bool:
        reads = apps.read_namespaced_deployment("held", NS).spec.template.spec.containers[0].env
        owned = k8s.CoreV1Api(world.api).read_namespaced_secret(secret, NS).metadata.owner_references
        return bool(owned) and any(e.value_from and e.value_from.secret_key_ref.name == secret for e in reads)

    def cancel(op_id: str) -> None:
        assert world.live.post(f"/api/v1/operations/{op_id}/cancel", {}).status_code == 200
        assert finished(world, op_id)["status"] == "cancelled"

    first = deploy("hf_" + secrets.token_urlsafe(24))
    assert first.status_code == 202, first.text
    (one,) = token_secrets(world, "held")
    wait_until(lambda: applied(one), 60, "the first deploy to apply its Deployment")
    mark = ledger.mark()
    loser = deploy("hf_" + secrets.token_urlsafe(24))
    assert loser.status_code == 409, loser.text
    made = secret_writes(ledger, mark)
    assert [verb for verb, _ in made] == ["create", "delete"] and made[1][1].startswith("held-hf-token-"), made
    assert made[1][1] != one  # a create's ledger entry names no object: the loser deleted the one it made
    assert token_secrets(world, "held") == [one] and applied(one)
    cancel(first.json()["operation"]["id"])
    assert token_secrets(world, "held") == [one]  # the Deployment reads it: a cancel keeps it

    again = deploy("hf_" + secrets.token_urlsafe(24))
    assert again.status_code == 202, again.text
    two = next(n for n in token_secrets(world, "held") if n != one)
    wait_until(lambda: token_secrets(world, "held") == [two], 60, "the apply to delete the older token Secret")
    assert applied(two)
    cancel(again.json()["operation"]["id"])
    orphan = "held-hf-token-crashd"  # what a crash between a deploy's Secret and its operation leaves: no owner
    k8s.CoreV1Api(world.api).create_namespaced_secret(NS, {"metadata": {"name": orphan, "labels": {
        "app.kubernetes.io/managed-by": "instantstart", "instantstart.io/inference": "held"}}})
    mark = ledger.mark()
    gone = httpx2.delete(world.live.url + f"{BASE}/held", headers=world.live.headers(), timeout=30)
    assert finished(world, gone.json()["operation"]["id"])["status"] == "succeeded"
    assert ("delete", orphan) in secret_writes(ledger, mark) and token_secrets(world, "held") == []


def test_an_engine_that_cannot_start_fails_the_deploy_naming_its_pod_and_an_update_fixes_it(world: JobWorld) -> None:
    started = world.live.post(BASE, body(name="gated", command="vllm serve meta-llama/Llama-3.1-8B"))
    assert started.status_code == 202, started.text
    op = finished(world, started.json()["operation"]["id"])
    assert op["status"] == "failed", op
    said = op["error"]["message"]
    assert said.startswith("gated cannot start: gated-") and "Please log in." in said, said
    fixed = httpx2.patch(world.live.url + f"{BASE}/gated", json={"command": VLLM}, headers=world.live.headers(),
                         timeout=30)  # the old ReplicaSet's pod still crash-loops: only the new one's count
    assert fixed.status_code == 202, fixed.text
    assert finished(world, fixed.json()["operation"]["id"])["status"] == "succeeded"
    # someone replaced the Service with one of their own: the delete leaves it alone
    core = k8s.CoreV1Api(world.api)
    core.delete_namespaced_service("gated", NS)
    wait_until(lambda: "gated" not in [s.metadata.name for s in core.list_namespaced_service(NS).items], 60,
               "our Service gone")
    core.create_namespaced_service(NS, {"metadata": {"name": "gated"}, "spec": {
        "selector": {"app": "theirs"}, "ports": [{"port": 80}]}})
    gone = httpx2.delete(world.live.url + f"{BASE}/gated", headers=world.live.headers(), timeout=30)
    assert finished(world, gone.json()["operation"]["id"])["status"] == "succeeded"
    assert core.read_namespaced_service("gated", NS).spec.selector == {"app": "theirs"}
    core.delete_namespaced_service("gated", NS)


def test_an_agent_deploys_tests_and_deletes_an_sglang_model_from_shared_storage(world: JobWorld) -> None:
    operator = world.live.make_token("operator")
    playbook = playbook_tools(PLAYBOOK)
    used: list[str] = []
    request = {"cluster": CLUSTER, "name": "agent-chat", "command": SGLANG, "gpus": 1}

    async def agent() -> dict[str, Any]:
        async with bridge(world.live.url, operator, "inference,clusters,operations,system") as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert tools["inference_delete"].annotations and tools["inference_delete"].annotations.destructive_hint
            assert tools["inference_list"].annotations and tools["inference_list"].annotations.read_only_hint
            preview = await call(client, "inference_preview", request, used)
            started = await call(client, "inference_deploy", request, used)
            deployed = await follow(client, started["operation"]["id"], used, timeout=180)
            listed = await call(client, "inference_list", {"cluster": CLUSTER}, used)
            detail = await call(client, "inference_get", {"cluster": CLUSTER, "name": "agent-chat"}, used)
            answer = await call(client, "inference_test", {"cluster": CLUSTER, "name": "agent-chat",
                                                           "api": "completion", "prompt": "Once upon"}, used)
            deleting = await call(client, "inference_delete", {"cluster": CLUSTER, "name": "agent-chat"}, used)
            deleted = await follow(client, deleting["operation"]["id"], used, timeout=180)
            return {"preview": preview, "deployed": deployed, "listed": listed, "detail": detail, "answer": answer,
                    "deleted": deleted}

    seen = anyio.run(agent)
    assert seen["preview"]["engine"] == "sglang" and seen["preview"]["port"] == 30000
    assert seen["deployed"]["status"] == "succeeded", seen["deployed"]
    assert "agent-chat" in {d["name"] for d in seen["listed"]["deployments"]}
    assert seen["detail"]["engine"] == "sglang" and seen["detail"]["phase"] == "Available"
    assert seen["answer"]["status"] == 200, seen["answer"]
    assert seen["answer"]["headers"]["x-sandbox-pod"] in {p["name"] for p in seen["detail"]["pods"]}
    assert seen["answer"]["path"].endswith("/services/agent-chat:30000/proxy/v1/completions")
    assert seen["deleted"]["status"] == "succeeded"
    assert set(used) <= playbook, f"tools outside the playbook: {set(used) - playbook}"
    audit = world.live.get("/api/v1/audit", params={"limit": 100}).json()
    actions = {e["action"] for e in (audit["items"] if isinstance(audit, dict) else audit)}
    assert {"inference.deploy", "inference.test", "inference.delete"} <= actions


def test_the_pane_previews_deploys_tests_and_deletes(world: JobWorld, tmp_path: Path) -> None:
    operator = Principal("pane-operator", Role.OPERATOR, "t-op", "api")
    viewer = Principal("pane-viewer", Role.VIEWER, "t-view", "api")
    token = "hf_" + secrets.token_urlsafe(24)
    with world.server.imported(tmp_path / "product", CLUSTER, operator) as services:
        assert InferencePane(services.inference, services.clusters, services.bus, viewer).deploy_button.disabled
        pane = InferencePane(services.inference, services.clusters, services.bus, operator)
        pn.panel(pane).get_root()  # renders alone, as in a notebook
        assert pane.picker.value == CLUSTER
        pane.state.deployment, pane.state.command = "pane-chat", "vllm serve m/x --tensor-paralel-size 1"
        asyncio.run(pane._preview(None))
        assert "did you mean --tensor-parallel-size" in pane.state.message and pane.state.preview == ""
        pane.state.command = VLLM
        asyncio.run(pane._preview(None))
        assert "vllm serving Qwen/Qwen2.5-0.5B-Instruct on port 8000" in pane.state.message, pane.state.message
        assert "kind: Deployment" in pane.state.preview and "kind: Service" in pane.state.preview
        pane.token.value = token
        asyncio.run(pane._deploy(None))
        assert pane.token.value == "" and "deploying pane-chat" in pane.state.message, pane.state.message
        op = services.engine.list(OperationQuery(kind="inference.deploy", limit=1))[0]
        wait_until(lambda: services.engine.run_until_idle(op.id).status == "succeeded", 120, "the pane's deploy")
        # its events re-read the pane on the bus's thread (no loop): let those reads land before the table's own,
        # so none read before the pods were ready lands after the wait below and shows 0/1 again
        services.bus.drain()
        wait_until(lambda: pane.state.reload() or (not pane.table.value.empty and
                                                   pane.table.value.iloc[0]["phase"] == "Available"),
                   60, "the table to show the deployment Available")
        row = pane.table.value.iloc[0]
        assert row["name"] == "pane-chat" and row["replicas"] == "1/1" and row["service"].startswith("ClusterIP")
        pane._on_selection(type("E", (), {"new": [0]})())
        asyncio.run(pane._test(None))
        assert pane.state.message.startswith("HTTP 200"), pane.state.message
        assert pane.state.answer
        asyncio.run(pane._delete(None))
        assert "deleting pane-chat" in pane.state.message, pane.state.message
        gone = services.engine.list(OperationQuery(kind="inference.delete", limit=1))[0]
        wait_until(lambda: services.engine.run_until_idle(gone.id).status == "succeeded", 60, "the pane's delete")
        assert token not in pane.table.value.to_csv() + pane.state.message + pane.state.preview


def _scale_controller(world: JobWorld, replicas: int) -> None:
    """The load balancer controller's Deployment at ``replicas``, waited on until it has that many available
    (at 0 it reconciles nothing: a Service waits for its load balancer, a finalizer holds a deleted one)."""
    apps = k8s.AppsV1Api(world.api)
    apps.patch_namespaced_deployment("aws-load-balancer-controller", "kube-system", {"spec": {"replicas": replicas}})
    wait_until(lambda: int(apps.read_namespaced_deployment("aws-load-balancer-controller", "kube-system").status
                           .available_replicas or 0) == replicas, 60, f"the controller at {replicas} replicas")


def _stage_waits(world: JobWorld, op_id: str, name: str, says: str) -> None:
    def waiting() -> bool:
        stage = world.stage(op_id, name)
        return stage["status"] == "running" and says in (stage["message"] or "")
    wait_until(waiting, 120, f"operation {op_id}'s stage {name} waiting: {says}")


def test_an_external_deployment_gets_an_internal_nlb_that_its_delete_removes(world: JobWorld) -> None:
    """Last in the module: the controller it turns on stays for the module's world. The deploy waits for the
    load balancer's DNS name and the delete for the controller's finalizer: each is seen waiting while the
    controller is scaled to zero, and finishing once it is back."""
    lbc = httpx2.patch(world.live.url + f"/api/v1/clusters/{CLUSTER}/features",
                       json={"load_balancer_controller": True}, headers=world.live.headers(), timeout=70)
    assert lbc.status_code == 202, lbc.text
    assert world.finished(lbc.json()["operation"]["id"], timeout=300)["status"] == "succeeded"
    _scale_controller(world, 0)
    started = world.live.post(BASE, body(name="ext-chat", command=VLLM + " --served-model-name chat",
                                         service={"exposure": "external"}))
    assert started.status_code == 202, started.text
    _stage_waits(world, started.json()["operation"]["id"], "load_balancer",
                 "waiting for the AWS Load Balancer Controller")
    _scale_controller(world, 1)
    op = finished(world, started.json()["operation"]["id"])
    assert op["status"] == "succeeded", op
    assert [s["name"] for s in op["stages"]] == ["namespace", "apply", "rollout", "load_balancer"]
    waited = world.stage(op["id"], "load_balancer")
    address = waited["result"]["address"]
    assert address and waited["message"] == f"ext-chat: load balancer {address}", waited

    elb, ec2 = aws(world.server, "elbv2"), aws(world.server, "ec2")
    arns = [b["LoadBalancerArn"] for b in elb.describe_load_balancers()["LoadBalancers"]]
    tags = {d["ResourceArn"]: {t["Key"]: t["Value"] for t in d["Tags"]}
            for d in (elb.describe_tags(ResourceArns=arns)["TagDescriptions"] if arns else [])}
    ours = [b for b in elb.describe_load_balancers()["LoadBalancers"]
            if tags[b["LoadBalancerArn"]].get("service.k8s.aws/stack") == f"{NS}/ext-chat"]
    assert len(ours) == 1, ours
    (nlb,) = ours
    assert (nlb["Type"], nlb["Scheme"], nlb["DNSName"]) == ("network", "internal", address)
    eks = aws(world.server, "sagemaker").describe_cluster(ClusterName=CLUSTER)["Orchestrator"]["Eks"]["ClusterArn"]
    assert tags[nlb["LoadBalancerArn"]] == {"elbv2.k8s.aws/cluster": eks.rsplit("/", 1)[1],
                                            "service.k8s.aws/stack": f"{NS}/ext-chat",
                                            "service.k8s.aws/resource": "LoadBalancer"}
    groups = [g["TargetGroupArn"] for g in elb.describe_target_groups(
        LoadBalancerArn=nlb["LoadBalancerArn"])["TargetGroups"]]
    assert len(groups) == 1
    security_groups = list(nlb["SecurityGroups"])
    (group,) = ec2.describe_security_groups(GroupIds=security_groups)["SecurityGroups"]
    cidr = ec2.describe_vpcs(VpcIds=[nlb["VpcId"]])["Vpcs"][0]["CidrBlock"]
    assert {(r["FromPort"], c["CidrIp"]) for r in group["IpPermissions"] for c in r["IpRanges"]} == {(8000, cidr)}

    row = world.live.get(f"{BASE}/ext-chat").json()
    assert row["service"]["type"] == "LoadBalancer" and row["service"]["scheme"] == "internal", row
    assert row["service"]["address"] == address, row
    listed = world.live.get(BASE).json()["deployments"]
    assert next(r for r in listed if r["name"] == "ext-chat")["service"]["address"] == address
    answer = world.live.post(f"{BASE}/ext-chat/test", {"prompt": "hello"})
    assert answer.status_code == 200 and answer.json()["status"] == 200, answer.text
    assert answer.json()["path"] == f"/api/v1/namespaces/{NS}/services/ext-chat:8000/proxy/v1/chat/completions"

    _scale_controller(world, 0)
    gone = httpx2.delete(world.live.url + f"{BASE}/ext-chat", headers=world.live.headers(), timeout=30)
    assert gone.status_code == 202, gone.text
    _stage_waits(world, gone.json()["operation"]["id"], "delete", "finalizers: service.k8s.aws/resources")
    _scale_controller(world, 1)
    assert finished(world, gone.json()["operation"]["id"])["status"] == "succeeded"
    apps, core = k8s.AppsV1Api(world.api), k8s.CoreV1Api(world.api)
    for read in (apps.read_namespaced_deployment, core.read_namespaced_service):
        with pytest.raises(ApiException) as absent:
            read("ext-chat", NS)
        assert absent.value.status == 404
    # the delete waited for the Service, so the controller's finalizer has run: nothing of it is left in AWS
    assert nlb["LoadBalancerArn"] not in {b["LoadBalancerArn"] for b in elb.describe_load_balancers()["LoadBalancers"]}
    assert not set(groups) & {g["TargetGroupArn"] for g in elb.describe_target_groups()["TargetGroups"]}
    left = ec2.describe_security_groups(Filters=[{"Name": "group-id", "Values": security_groups}])["SecurityGroups"]
    assert left == [], left
