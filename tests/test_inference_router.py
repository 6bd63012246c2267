"""The SGLang router against a real server in sandbox mode, on a seeded, imported cluster of three one-GPU nodes
running a three-replica SGLang deployment, where the sandbox's simulated router runs the router pod's command:
bad knobs, an unknown deployment and a taken name are refused before any operation or Kubernetes write; a
cache-aware router sends every request sharing a prefix to one worker pod and different prefixes to more than
one, its Prometheus metrics count them per worker; an agent switches it to round_robin through MCP and requests
then go to every worker in turn; the pane shows the router, its workers and counts, and its delete removes the
router's objects only (the workers stay). While a router fronts the deployment, the deployment's delete and a
self-managed deploy of the router's name are refused before any write; a pending router create and a pending
deployment delete refuse each other, and so do a pending router create and a deploy of its name (one operation
target per name); the router pod's metrics are read once per few seconds however often it is described; a router
whose Deployment was deleted out of band is listed and described Orphaned with what it left, and is still deleted
whole (found by its Service, or by its ServiceAccount alone). The router's flag data is held equal to the
sandbox's, and the simulated router refuses what the real one refuses."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import panel as pn
import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from app.bootstrap import Services
from panels.inference import InferencePane
from sandbox.kube import sglang_router
from services.auth import Principal, Role
from services.errors import Conflict
from services.inference import router_manifest
from services.inference.endpoint_metrics import FRESH_SECONDS
from services.inference.models import DeploymentRequest
from services.inference.router_metrics import RouterMetricsReader
from services.inference.router_models import RouterKnobs, RouterRequest, router_flags
from tests.jobs_support import CLUSTER, JobWorld, cli, job_world
from tests.ledger import CallLedger
from tests.mcp_support import bridge, call, follow, playbook_tools
from tests.support import wait_until

pytestmark = pytest.mark.slow
DEPLOYMENTS = f"/api/v1/clusters/{CLUSTER}/inference/deployments"
BASE = f"/api/v1/clusters/{CLUSTER}/inference/routers"
NS = "hyperpod-ns-inference"
SGLANG = "python3 -m sglang.launch_server --model-path Qwen/Qwen2.5-0.5B-Instruct --tp-size 1"
ROOT = Path(__file__).resolve().parents[1]
PREFIX = "You are a careful assistant for the InstantStart docs. Answer in one sentence. Question: "


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JobWorld]:
    """Three SGLang workers, one per node."""
    with job_world(tmp_path_factory.mktemp("router"), components=(), nodes=3) as made:
        started = made.live.post(DEPLOYMENTS, {"name": "qwen", "command": SGLANG, "gpus": 1, "replicas": 3})
        assert started.status_code == 202, started.text
        op = made.finished(started.json()["operation"]["id"], timeout=240)
        assert op["status"] == "succeeded", op
        yield made


def test_the_flag_data_is_the_sandbox_s_and_the_simulated_router_refuses_what_the_real_one_does() -> None:
    product = yaml.safe_load((ROOT / "services/inference/router_flags.yaml").read_text())
    sandbox = yaml.safe_load((ROOT / "sandbox/kube/engines/sglang_router.yaml").read_text())
    assert product == sandbox
    with pytest.raises(sglang_router.RouterError) as unknown:
        sglang_router.parse(["--policy", "cache_aware", "--cache-treshold", "0.5"])
    assert unknown.value.exit_code == 2 and "unrecognized arguments: --cache-treshold" in unknown.value.lines[-1]
    with pytest.raises(sglang_router.RouterError) as choice:
        sglang_router.parse(["--policy", "least_loaded"])
    assert "invalid choice: 'least_loaded'" in choice.value.lines[-1]
    with pytest.raises(sglang_router.RouterError) as ambiguous:
        sglang_router.parse(["--balance", "3"])
    assert "ambiguous option" in ambiguous.value.lines[-1]
    parsed = sglang_router.parse(["--policy=round_robin", "--selector", "a=b", "c=d", "--service-discovery"])
    assert parsed["--selector"] == ["a=b", "c=d"] and parsed["--service-discovery"] is True
    assert parsed["--cache-threshold"] == 0.3 and parsed["--host"] == "127.0.0.1"  # the router's defaults


def test_bad_knobs_unknown_deployments_and_taken_names_are_refused_before_any_write(world: JobWorld) -> None:
    ledger = CallLedger(world.live)
    mark = ledger.mark()
    for knob, value in (("cache_threshold", 1.5), ("balance_rel_threshold", 0.5), ("policy", "least_loaded"),
                        ("max_tree_size", 0), ("eviction_interval_secs", 0)):
        refused = world.live.post(BASE, {"name": "r", "deployment": "qwen", knob: value})
        assert refused.status_code == 422 and knob in refused.text, refused.text
    missing = world.live.post(BASE, {"name": "r", "deployment": "nope"})
    assert missing.status_code == 404 and "inference_list" in missing.text, missing.text
    taken = world.live.post(BASE, {"name": "qwen", "deployment": "qwen"})  # the workers' Service has that name
    assert taken.status_code == 409 and "not this router's" in taken.text, taken.text
    ledger.assert_no_writes(since=mark, service="kubernetes")
    assert world.live.get("/api/v1/operations?kind=inference.router.create").json() == []


def ask(world: JobWorld, router: str, prompt: str) -> str:
    answer = world.live.post(f"{BASE}/{router}/test", {"prompt": prompt, "max_tokens": 8})
    assert answer.status_code == 200, answer.text
    result = answer.json()
    assert result["status"] == 200, result
    assert result["path"] == f"/api/v1/namespaces/{NS}/services/{router}:30000/proxy/v1/chat/completions"
    return str(result["headers"]["x-sandbox-pod"])


def test_cache_aware_routing_metrics_mcp_update_pane_and_delete(world: JobWorld, tmp_path: Path) -> None:
    workers = {p.metadata.name for p in world.core.list_namespaced_pod(
        NS, label_selector="instantstart.io/inference=qwen").items}
    assert len(workers) == 3
    shown = world.live.post(f"{BASE}/preview", {"name": "qwen-router", "deployment": "qwen"})
    assert shown.status_code == 200, shown.text
    assert shown.json()["selector"] == "instantstart.io/inference=qwen" and shown.json()["worker_port"] == 30000
    assert [m["kind"] for m in shown.json()["manifests"]] == ["ServiceAccount", "Role", "RoleBinding", "Deployment",
                                                               "Service"]
    request, key = {"name": "qwen-router", "deployment": "qwen", "cache_threshold": 0.5}, {"Idempotency-Key": "r-1"}
    started = world.live.post(BASE, request, headers=key)
    assert started.status_code == 202, started.text
    again = world.live.post(BASE, request, headers=key)  # a retried request: the same operation, nothing new
    assert again.json()["operation"]["id"] == started.json()["operation"]["id"], again.text
    assert len(world.live.get("/api/v1/operations?kind=inference.router.create").json()) == 1
    op = world.finished(started.json()["operation"]["id"], timeout=180)
    assert op["status"] == "succeeded", op
    assert op["target"] == f"cluster/{CLUSTER}/inference/qwen-router"  # the name space every inference path shares
    ledger = CallLedger(world.live)
    mark = ledger.mark()
    fronted = httpx2.delete(world.live.url + f"{DEPLOYMENTS}/qwen", headers=world.live.headers(), timeout=30)
    assert fronted.status_code == 409 and "qwen-router" in fronted.text, fronted.text
    assert "inference_routers_delete" in fronted.text, fronted.text
    clash = world.live.post(DEPLOYMENTS, {"name": "qwen-router", "namespace": "team-a", "command": SGLANG, "gpus": 1})
    assert clash.status_code == 409 and "inference router 'qwen-router'" in clash.text, clash.text
    ledger.assert_no_writes(since=mark, service="kubernetes")
    assert world.live.get("/api/v1/operations?kind=inference.delete").json() == []
    command = k8s.AppsV1Api(world.api).read_namespaced_deployment("qwen-router", NS).spec.template.spec \
        .containers[0].command
    assert command[:3] == ["python3", "-m", "sglang_router.launch_router"]
    assert command[command.index("--selector") + 1] == "instantstart.io/inference=qwen"

    same = {ask(world, "qwen-router", PREFIX + question) for question in
            ("what is a cluster?", "what is a node?", "what is a job?", "what is a router?", "what is a pod?")}
    assert len(same) == 1 and same <= workers, same  # every request sharing the prefix: one worker
    spread = {ask(world, "qwen-router", prompt) for prompt in
              ("Translate to French: good morning", "Write a haiku about GPUs", "List three prime numbers")}
    assert len(same | spread) > 1, spread  # different prefixes: other workers too

    described = world.live.get(f"{BASE}/qwen-router").json()
    assert described["metrics_error"] is None, described
    counts = {w["pod"]: w["requests"] for w in described["workers"] if w["ready"]}
    assert set(counts) == workers and sum(counts.values()) == 8, counts
    assert counts[next(iter(same))] >= 5
    assert described["cache_hits"] >= 4 and described["knobs"]["policy"] == "cache_aware"
    assert described["requests_total"] >= 8
    listed_cli = cli(world, "inference", "routers", "list", CLUSTER)
    assert listed_cli.returncode == 0, listed_cli.stderr
    assert listed_cli.stdout.startswith(f"{NS}/qwen-router ") and "for qwen (3/3 workers running)" in \
        listed_cli.stdout, listed_cli.stdout
    described_cli = cli(world, "inference", "routers", "describe", CLUSTER, "qwen-router")
    assert described_cli.returncode == 0 and f"worker {next(iter(same))}" in described_cli.stdout, described_cli.stdout

    used: list[str] = []

    async def agent() -> dict[str, Any]:
        async with bridge(world.live.url, world.live.admin_token, "inference,operations") as client:
            listed = await call(client, "inference_routers_list", {"cluster": CLUSTER}, used)
            assert [r["name"] for r in listed["routers"]] == ["qwen-router"]
            bad = await client.call_tool("inference_routers_update", {"cluster": CLUSTER, "name": "qwen-router",
                                                                       "cache_threshold": 2})
            assert bad.is_error
            changed = await call(client, "inference_routers_update", {"cluster": CLUSTER, "name": "qwen-router",
                                                                       "policy": "round_robin"}, used)
            return await follow(client, changed["operation"]["id"], used)
    updated = anyio.run(agent)
    assert updated["status"] == "succeeded", updated
    playbook = playbook_tools(ROOT / "skills/deploy-model.md")
    assert set(used) <= playbook, f"tools outside the playbook: {set(used) - playbook}"
    turns = [ask(world, "qwen-router", PREFIX + "what is a cluster?") for _ in range(3)]
    assert set(turns) == workers, turns  # round_robin: every worker in turn, whatever the prefix

    operator = Principal("pane-operator", Role.OPERATOR, "t-op", "api")
    ledger = CallLedger(world.live)
    with world.server.imported(tmp_path / "product", CLUSTER, operator) as services:
        pane = InferencePane(services.inference, services.clusters, services.bus, operator,
                             routers=services.inference_routers)
        assert pane.routers is not None
        pn.panel(pane).get_root()  # renders alone, as in a notebook, with its router section
        wait_until(lambda: pane.routers.load() or not pane.routers.table.value.empty, 60, "the router listed")
        row = pane.routers.table.value.iloc[0]
        assert (row["name"], row["deployment"], row["policy"], row["workers"]) == \
            ("qwen-router", "qwen", "round_robin", "3/3 running")
        pane.routers._on_selection(type("E", (), {"new": [0]})())
        asyncio.run(pane.routers._counts(None))
        text = pane.routers.counts.object  # a new router pod since the update: the three round-robin requests
        assert "3 requests" in text and all(f"`{pod}` (ready): 1 requests" in text for pod in workers), text
        _metrics_are_read_once_per_few_seconds(world, services)
        mark = ledger.mark()
        asyncio.run(pane.routers._delete(None))
        said = str(pane.routers.message.object)
        assert said.startswith("deleting router qwen-router (op-"), said
        op_id = said.rsplit("(", 1)[1].rstrip(")")
        wait_until(lambda: services.engine.run_until_idle(op_id).status == "succeeded", 60, "the pane's delete")
        assert _absent(world)
        _delete_and_router_create_exclude_each_other(services, operator)
    writes = ledger.writes(since=mark, service="kubernetes")
    assert {e.get("name") for e in writes} == {"qwen-router"}, writes  # the router's objects only
    rbac = "rbac.authorization.k8s.io"
    assert {e.get("resource") for e in writes if e.get("verb") == "delete"} == {
        "deployments.apps", "services", f"rolebindings.{rbac}", f"roles.{rbac}", "serviceaccounts"}, writes
    assert k8s.AppsV1Api(world.api).read_namespaced_deployment("qwen", NS).status.available_replicas == 3
    assert world.core.read_namespaced_service("qwen", NS).spec.type == "ClusterIP"


def _delete_and_router_create_exclude_each_other(services: Services, operator: Principal) -> None:
    """This product's engine runs only when asked: a router create and a deployment delete stay pending, and the
    other verb sees them."""
    wait_until(lambda: not services.inference_routers.list_routers(operator, CLUSTER).routers, 60, "the router gone")
    creating, _ = services.inference_routers.create_router(operator, CLUSTER, RouterRequest(name="r2",
                                                                                            deployment="qwen"))
    with pytest.raises(Conflict) as busy:
        services.inference.delete_deployment(operator, CLUSTER, "qwen")
    assert str(busy.value).startswith(f"the router r2 is being created for qwen (operation {creating.id}): cancel "
                                      f"it (operations_cancel {creating.id})"), busy.value
    assert busy.value.details == {"routers": ["r2"], "operation": creating.id}
    services.engine.cancel(creating.id, operator)
    assert services.engine.run_until_idle(creating.id).status == "cancelled"
    deleting, _ = services.inference.delete_deployment(operator, CLUSTER, "qwen")
    with pytest.raises(Conflict) as gone:
        services.inference_routers.create_router(operator, CLUSTER, RouterRequest(name="r3", deployment="qwen"))
    assert f"being deleted (operation {deleting.id})" in str(gone.value)
    services.engine.cancel(deleting.id, operator)
    assert services.engine.run_until_idle(deleting.id).status == "cancelled"
    # one name, one operation target: a create of another path's name in flight refuses it, both ways
    creating, _ = services.inference_routers.create_router(operator, CLUSTER, RouterRequest(name="r4",
                                                                                            deployment="qwen"))
    with pytest.raises(Conflict) as taken:
        services.inference.deploy(operator, CLUSTER, DeploymentRequest(name="r4", command=SGLANG, gpus=1))
    assert f"operation {creating.id}" in str(taken.value), taken.value
    services.engine.cancel(creating.id, operator)
    assert services.engine.run_until_idle(creating.id).status == "cancelled"
    deploying, _ = services.inference.deploy(operator, CLUSTER, DeploymentRequest(name="r5", command=SGLANG, gpus=1))
    with pytest.raises(Conflict) as deployed:
        services.inference_routers.create_router(operator, CLUSTER, RouterRequest(name="r5", deployment="qwen"))
    assert f"operation {deploying.id}" in str(deployed.value), deployed.value
    services.engine.cancel(deploying.id, operator)
    assert services.engine.run_until_idle(deploying.id).status == "cancelled"


def _metrics_are_read_once_per_few_seconds(world: JobWorld, services: Services) -> None:
    pod = next(p.metadata.name for p in world.core.list_namespaced_pod(
        NS, label_selector=f"{router_manifest.ROUTER_LABEL}=qwen-router").items
        if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or []))
    now = [1000.0]
    reader = RouterMetricsReader(services.kube, clock=lambda: now[0])
    ledger = CallLedger(world.live)
    mark = ledger.mark()

    def reads() -> int:
        return len([e for e in ledger.calls(service="kubernetes", since=mark)
                    if e.get("resource") == "pods" and e.get("subresource") == "proxy"])
    texts = {reader.text(CLUSTER, NS, pod) for _ in range(3)}
    assert reads() == 1 and len(texts) == 1 and "sgl_router_requests_total" in texts.pop()
    now[0] += FRESH_SECONDS
    reader.text(CLUSTER, NS, pod)
    assert reads() == 2


def _absent(world: JobWorld, name: str = "qwen-router") -> bool:
    rbac = k8s.RbacAuthorizationV1Api(world.api)
    for read in (k8s.AppsV1Api(world.api).read_namespaced_deployment, world.core.read_namespaced_service,
                 world.core.read_namespaced_service_account, rbac.read_namespaced_role,
                 rbac.read_namespaced_role_binding):
        try:
            read(name, NS)
        except ApiException as exc:
            assert exc.status == 404
            continue
        return False
    return True


def test_a_router_whose_deployment_went_out_of_band_is_listed_orphaned_and_deleted_whole(world: JobWorld) -> None:
    started = world.live.post(BASE, {"name": "orphan", "deployment": "qwen"})
    assert started.status_code == 202, started.text
    assert world.finished(started.json()["operation"]["id"], timeout=180)["status"] == "succeeded"
    k8s.AppsV1Api(world.api).delete_namespaced_deployment("orphan", NS)
    wait_until(lambda: {(r["name"], r["phase"]) for r in world.live.get(BASE).json()["routers"]} == {
        ("orphan", "Orphaned")}, 60, "the router listed Orphaned once its Deployment is gone from the cache")
    (listed,) = world.live.get(BASE).json()["routers"]
    assert listed["left"] == ["Service"] and "inference_routers_delete" in listed["message"], listed
    ledger = CallLedger(world.live)
    rbac = "rbac.authorization.k8s.io"
    for name, left in (("orphan", {"services", f"rolebindings.{rbac}", f"roles.{rbac}", "serviceaccounts"}),
                       ("stray", {"serviceaccounts"})):
        if name == "stray":  # a ServiceAccount alone (no Service in the cache): found by a live read
            world.core.create_namespaced_service_account(NS, {"metadata": {
                "name": "stray", "labels": router_manifest.labels("stray")}})
        mark = ledger.mark()
        shown = world.live.get(f"{BASE}/{name}").json()
        assert shown["phase"] == "Orphaned" and len(shown["left"]) == len(left), shown
        assert f"left: {', '.join(shown['left'])}" in shown["message"], shown
        ledger.assert_no_writes(since=mark, service="kubernetes")
        gone = httpx2.delete(world.live.url + f"{BASE}/{name}", headers=world.live.headers(), timeout=30)
        assert gone.status_code == 202, gone.text
        assert world.finished(gone.json()["operation"]["id"], timeout=120)["status"] == "succeeded"
        assert _absent(world, name)
        deleted = {e.get("resource") for e in ledger.writes(since=mark, service="kubernetes")
                   if e.get("verb") == "delete" and e.get("name") == name}
        assert deleted == left, deleted


def test_the_router_manifest_uses_only_known_flags() -> None:
    flags = router_flags()
    known = set(flags["switch"]) | set(flags["value"]) | set(flags["values"])
    objects = router_manifest.objects(name="r", namespace="n", deployment="d",
                                      knobs=RouterKnobs(), worker_port=8000)
    argv = objects[3]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert {w for w in argv if w.startswith("--")} <= known
    assert sglang_router.parse(argv[3:])["--service-discovery-port"] == 8000


def test_the_simulated_router_needs_the_rbac_grant_to_discover_workers(world: JobWorld) -> None:
    """A router pod whose ServiceAccount may not list pods exits as the real one does, with the API server's 403."""
    body = router_manifest.router_deployment(name="unbound", namespace=NS, deployment="qwen", knobs=RouterKnobs(),
                                             worker_port=30000)
    body["spec"]["template"]["spec"]["serviceAccountName"] = "default"
    apps = k8s.AppsV1Api(world.api)
    apps.create_namespaced_deployment(NS, body)
    try:
        def refused() -> str:
            pods: list[Any] = world.core.list_namespaced_pod(
                NS, label_selector=f"{router_manifest.ROUTER_LABEL}=unbound").items
            restarted = bool(pods[0].status.container_statuses and pods[0].status.container_statuses[0].restart_count)
            log = world.core.read_namespaced_pod_log(pods[0].metadata.name, NS, container="router", previous=restarted)
            return str(log) if "forbidden" in str(log) else ""
        log = wait_until(refused, 60, "the router pod to be refused its pod list")
        assert 'User "system:serviceaccount:hyperpod-ns-inference:default" cannot list resource "pods"' in log, log
    finally:
        apps.delete_namespaced_deployment("unbound", NS)
