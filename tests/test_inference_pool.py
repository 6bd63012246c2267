"""Model pools against a real server in sandbox mode, on a seeded, imported cluster of three ml.g5.8xlarge nodes (one
GPU each) where the sandbox's simulated vLLM runs the pods' commands: the preview's Deployment labels its pods
business=unassigned and leaves business out of its selector; bad requests are refused before any operation or
Kubernetes write; a pool of three deploys, a service claims one pod and answers from it, then is reassigned to the
two others and answers only from them, while every pod keeps its uid, restart count and owner (the ReplicaSet made no
replacement); a scale below the pods services hold is refused with zero writes, a scale to what they hold removes the
unassigned pod; a pod changed between the assign's read and its relabel (409 on the stale resourceVersion) is judged
again, and an assign that loses a pod to a rival fails naming it and gives back what it had claimed (its other
unsuccessful ends: test_inference_pool_undo.py); a router create and a release of all its service's pods refuse each
other while in flight (the pool's delete is refused naming the create), and a release's stage refuses on live objects
to leave a fronted service no pod; a scale-in is refused while a held pod is not Ready; the Inference pane's model-
pool board shows a row per pod and releases, tests and assigns the selected pod; a router, KEDA autoscaling or a
managed endpoint of its name is refused naming the pool, with no write; a router for one pool service routes to the
pods it holds and gains a worker when the service is assigned another pod; the board's router form previews and
creates a router for the selected pod's service, and while it runs releasing all the service's pods is refused naming
it (some stay releasable); an agent reads and tests the pool through a real MCP client; the pool's delete takes its
services' Services."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import panel as pn
import pytest
from kubernetes import client as k8s

from panels.inference import InferencePane
from panels.inference_pool import PoolBoard
from services.auth import Principal, Role
from services.clusters.storage_stage import MANAGED_LABEL
from services.errors import Conflict
from services.inference.pool_models import PoolAssign, PoolRelease
from services.inference.pool_stages import CLAIMED_BY
from services.inference.router_manifest import FOR_ANNOTATION, ROUTER_LABEL, SERVICE_ANNOTATION
from services.inference.router_models import RouterRequest
from services.operations import OperationQuery
from tests.jobs_support import CLUSTER, JobWorld, job_world
from tests.ledger import CallLedger
from tests.mcp_support import bridge, call
from tests.support import wait_until

pytestmark = pytest.mark.slow
BASE = f"/api/v1/clusters/{CLUSTER}/inference/pools"
NS = "hyperpod-ns-inference"
VLLM = "vllm serve Qwen/Qwen2.5-0.5B-Instruct --max-model-len 4096"
POOL = {"name": "warm", "command": VLLM, "gpus": 1, "replicas": 3}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JobWorld]:
    with job_world(tmp_path_factory.mktemp("pool"), components=(), nodes=3) as made:
        yield made


def finished(world: JobWorld, response: Any) -> dict[str, Any]:
    assert response.status_code == 202, response.text
    return world.finished(response.json()["operation"]["id"], timeout=180)


def pods(world: JobWorld) -> dict[str, Any]:
    return {p.metadata.name: p for p in world.core.list_namespaced_pod(
        NS, label_selector="instantstart.io/inference=warm").items if p.metadata.deletion_timestamp is None}


def answered_by(world: JobWorld, service: str, times: int = 6) -> set[str]:
    seen = set()
    for _ in range(times):
        answer = world.live.post(f"{BASE}/warm/services/{service}/test", {"max_tokens": 4})
        assert answer.status_code == 200 and answer.json()["status"] == 200, answer.text
        seen.add(answer.json()["headers"]["x-sandbox-pod"])
    return seen


def identity(pod: Any) -> tuple[Any, ...]:
    refs = [(r.kind, r.name, r.uid) for r in pod.metadata.owner_references or []]
    return pod.metadata.uid, sum(c.restart_count for c in pod.status.container_statuses or []), refs


def test_the_preview_labels_pods_unassigned_and_bad_requests_write_nothing(world: JobWorld) -> None:
    shown = world.live.post(f"{BASE}/preview", POOL)
    assert shown.status_code == 200, shown.text
    (deployment,) = shown.json()["manifests"]
    assert deployment["spec"]["template"]["metadata"]["labels"]["business"] == "unassigned"
    assert "business" not in deployment["spec"]["selector"]["matchLabels"]
    ledger = CallLedger(world.live)
    mark = ledger.mark()
    too_big = world.live.post(BASE, {**POOL, "command": "vllm serve m/x -tp 4", "gpus": 4})
    assert too_big.status_code == 409 and "no node type of the cluster has 4 GPUs" in too_big.text, too_big.text
    both = world.live.post(f"{BASE}/warm/assign", {"service": "chat", "count": 1, "pods": ["x"]})
    assert both.status_code == 422 and "exactly one of count or pods" in both.text, both.text
    missing = world.live.post(f"{BASE}/warm/scale", {"replicas": 1})
    assert missing.status_code == 404 and "inference_pool_list" in missing.text, missing.text
    ledger.assert_no_writes(since=mark, service="kubernetes")
    assert world.live.get("/api/v1/operations?kind=inference.pool.create").json() == []


def test_reassignment_moves_traffic_without_restarts_and_scale_in_keeps_held_pods(world: JobWorld) -> None:
    assert finished(world, world.live.post(BASE, POOL))["status"] == "succeeded"
    wait_until(lambda: len(ps := world.live.get(f"{BASE}/warm").json()["pods"]) == 3 and all(p["ready"] for p in ps),
               60, "the pool's three pods Ready in the product's view")
    before = pods(world)
    assert len(before) == 3 and all(p.metadata.labels["business"] == "unassigned" for p in before.values())
    first, *others = sorted(before)
    assert finished(world, world.live.post(f"{BASE}/warm/assign", {"service": "chat", "pods": [first]}))[
        "status"] == "succeeded"
    assert answered_by(world, "chat") == {first}
    assert finished(world, world.live.post(f"{BASE}/warm/release", {"service": "chat"}))["status"] == "succeeded"
    keyed = world.live.post(f"{BASE}/warm/assign", {"service": "chat", "pods": others},
                            headers={"Idempotency-Key": "reassign-chat"})
    assert finished(world, keyed)["status"] == "succeeded"
    assert answered_by(world, "chat", times=12) == set(others)
    after = pods(world)
    assert sorted(after) == sorted(before), "the ReplicaSet made a replacement for a relabelled pod"
    assert {n: identity(p) for n, p in after.items()} == {n: identity(p) for n, p in before.items()}
    assert {n: p.metadata.labels["business"] for n, p in after.items()} == \
        {first: "unassigned", **{n: "chat" for n in others}}
    detail = world.live.get(f"{BASE}/warm").json()
    assert (detail["assigned"], detail["unassigned"]) == (2, 1)
    assert detail["services"] == [{"name": "chat", "port": 8000, "pods": others}]

    ledger = CallLedger(world.live)
    mark = ledger.mark()
    refused = world.live.post(f"{BASE}/warm/scale", {"replicas": 1})
    assert refused.status_code == 409 and "chat: 2" in refused.text, refused.text
    busy = world.live.post(f"{BASE}/warm/assign", {"service": "code", "pods": [others[0]]})
    assert busy.status_code == 409 and "held by the service chat" in busy.text, busy.text
    again = world.live.post(f"{BASE}/warm/assign", {"service": "chat", "pods": others},
                            headers={"Idempotency-Key": "reassign-chat"})
    assert again.status_code == 202 and again.json()["operation"]["id"] == keyed.json()["operation"]["id"]
    taken = world.live.post(f"/api/v1/clusters/{CLUSTER}/inference/deployments", {"name": "warm", "command": VLLM,
                                                                                   "gpus": 1})
    assert taken.status_code == 409 and "model pool 'warm'" in taken.text, taken.text
    ledger.assert_no_writes(since=mark, service="kubernetes")
    assert world.live.get("/api/v1/operations?kind=inference.pool.scale").json() == []

    assert finished(world, world.live.post(f"{BASE}/warm/scale", {"replicas": 2}))["status"] == "succeeded"
    wait_until(lambda: sorted(pods(world)) == others, 60, "the unassigned pod to go on scale-in")
    assert {n: identity(p) for n, p in pods(world).items()} == {n: identity(before[n]) for n in others}
    assert answered_by(world, "chat") <= set(others)


def test_the_board_shows_pod_rows_and_releases_tests_and_assigns_the_selection(world: JobWorld, tmp_path: Path) -> None:
    operator = Principal("board-operator", Role.OPERATOR, "t-op", "api")
    viewer = Principal("board-viewer", Role.VIEWER, "t-view", "api")
    with world.server.imported(tmp_path / "product", CLUSTER, operator) as services:
        assert PoolBoard(services.pools, services.clusters, services.bus, viewer).assign_button.disabled
        pane = InferencePane(services.inference, services.clusters, services.bus, operator, pools=services.pools)
        pn.panel(pane).get_root()  # renders alone, as in a notebook
        board = pane.pool_board
        assert board is not None
        wait_until(lambda: board.state.reload() or len(board.table.value) == 2, 60, "the board's two pod rows")
        assert set(board.table.value["service"]) == {"chat"} and set(board.table.value["pool"]) == {"warm"}
        board.state.service = "chat"
        board._on_selection(type("E", (), {"new": [0]})())
        (_, pod), = board.state.selected
        asyncio.run(board._test(None))
        assert board.state.message.startswith("HTTP 200") and " from " in board.state.message, board.state.message

        def settle(what: str) -> None:
            op_id = board.state.message.rsplit("(", 1)[-1].rstrip(")")
            assert services.engine.run_until_idle(op_id).status == "succeeded", f"the board's {what}"
            wait_until(lambda: board.state.reload() or pod in set(board.table.value.query(
                "service == '(unassigned)'" if what == "release" else "service == 'chat'")["pod"]), 60, what)

        asyncio.run(board._release(None))
        assert board.state.message.startswith(f"release warm: {pod}"), board.state.message
        settle("release")
        asyncio.run(board._assign(None))
        assert board.state.message.startswith(f"assign warm: {pod}"), board.state.message
        settle("assign")


def pod_patches(ledger: CallLedger, since: int, pod: str) -> list[int]:
    return [e["status"] for e in ledger.writes(since=since, service="kubernetes")
            if e.get("resource") == "pods" and e.get("name") == pod and e.get("verb") == "patch"]


def test_a_pod_changed_between_read_and_relabel_is_judged_again_and_a_lost_one_leaves_no_partial_claim(
        world: JobWorld, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rival writer changes a pod after the assign read it and before its patch: the API server refuses the
    stale resourceVersion (409). A harmless change is read again and the pod claimed; a rival claim of the pod
    fails the assign naming it, and the pod it had already relabelled goes back to the pool (all or nothing)."""
    assert finished(world, world.live.post(f"{BASE}/warm/scale", {"replicas": 3}))["status"] == "succeeded"
    chat = sorted(n for n, p in pods(world).items() if p.metadata.labels["business"] == "chat")
    assert finished(world, world.live.post(f"{BASE}/warm/release", {"service": "chat", "pods": chat[1:]}))[
        "status"] == "succeeded"  # chat keeps one pod: two are free
    wait_until(lambda: (d := world.live.get(f"{BASE}/warm").json())["unassigned"] == 2 and all(
        p["ready"] for p in d["pods"]), 120, "two new unassigned pods Ready")
    free = sorted(n for n, p in pods(world).items() if p.metadata.labels["business"] == "unassigned")
    first, second = free
    operator = Principal("race-operator", Role.OPERATOR, "t-op", "api")
    ledger = CallLedger(world.live)
    with world.server.imported(tmp_path / "product", CLUSTER, operator) as services:
        rest = services.kube.api_client(CLUSTER).rest_client
        real, rival = rest.request, {}

        def request(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            if method == "PATCH" and url.endswith(f"/pods/{second}") and rival:  # after the stage's read
                world.core.patch_namespaced_pod(second, NS, {"metadata": rival.pop("patch")})
            return real(method, url, *args, **kwargs)
        monkeypatch.setattr(rest, "request", request)

        def assign() -> tuple[Any, int]:
            mark = ledger.mark()
            op, _ = services.pools.assign(operator, CLUSTER, "warm", PoolAssign(service="code", pods=[first, second]))
            return wait_until(lambda: (v := services.engine.run_until_idle(op.id)).status.terminal and v, 60,
                              "the assign to end"), mark

        rival["patch"] = {"annotations": {"example.com/audited": "yes"}}
        done, mark = assign()
        assert done.status == "succeeded", done
        assert pod_patches(ledger, mark, second) == [200, 409, 200]  # the rival's, the stale one, the retry on fresh
        assert {n: p.metadata.labels["business"] for n, p in pods(world).items() if n in free} == \
            {first: "code", second: "code"}
        released, _ = services.pools.release(operator, CLUSTER, "warm", PoolRelease(service="code"))
        assert services.engine.run_until_idle(released.id).status == "succeeded"

        rival["patch"] = {"labels": {"business": "other"}}  # another writer claims the pod first
        board = PoolBoard(services.pools, services.clusters, services.bus, operator)
        board.state.cluster = CLUSTER
        lost, mark = assign()
        wait_until(lambda: second in board.state.message, 30, "the board to say why the assign failed")
        assert board.state.message.startswith(f"assign failed ({lost.id})"), board.state.message
        assert lost.status == "failed" and lost.error is not None, lost
        assert f"{second} is held by the service other now" in lost.error["message"], lost.error
        assert f"{first} went back to the pool" in lost.error["message"], lost.error
        assert pod_patches(ledger, mark, second) == [200, 409]
        assert pod_patches(ledger, mark, first) == [200, 200]  # claimed, then given back
        now = {n: p.metadata.labels["business"] for n, p in pods(world).items() if n in free}
        assert now == {first: "unassigned", second: "other"}, now
        assert "code" not in {s.metadata.name for s in world.core.list_namespaced_service(NS).items}
        world.core.patch_namespaced_pod(second, NS, {"metadata": {"labels": {"business": "unassigned"}}})


def test_a_scale_in_is_refused_while_a_held_pod_is_not_ready(world: JobWorld) -> None:
    """The ReplicaSet removes pods that are not Ready first, whatever their deletion cost: while a pod a service
    holds is not Ready, a scale-in is refused (409 naming it) before any write."""
    held = sorted(n for n, p in pods(world).items() if p.metadata.labels["business"] == "chat")
    assert len(pods(world)) == 3 and len(held) == 1
    sick = held[0]
    world.core.patch_namespaced_pod_status(sick, NS, {"status": {"conditions": [
        {"type": "Ready", "status": "False", "reason": "ReadinessProbeFailed"}]}})
    wait_until(lambda: not next(p for p in world.live.get(f"{BASE}/warm").json()["pods"] if p["name"] == sick)[
        "ready"], 60, "the held pod not Ready in the product's view")
    scales = len(world.live.get("/api/v1/operations?kind=inference.pool.scale").json())
    ledger = CallLedger(world.live)
    mark = ledger.mark()
    refused = world.live.post(f"{BASE}/warm/scale", {"replicas": 2})
    assert refused.status_code == 409 and sick in refused.text and "not Ready" in refused.text, refused.text
    assert refused.json()["error"]["details"]["not_ready"] == [sick]
    ledger.assert_no_writes(since=mark, service="kubernetes")
    assert len(world.live.get("/api/v1/operations?kind=inference.pool.scale").json()) == scales
    world.core.patch_namespaced_pod_status(sick, NS, {"status": {"conditions": [
        {"type": "Ready", "status": "True"}]}})
    wait_until(lambda: all(p["ready"] for p in world.live.get(f"{BASE}/warm").json()["pods"]), 60,
               "the pod Ready again")


def test_a_router_for_a_pool_service_routes_to_the_pods_it_holds_and_follows_reassignment(world: JobWorld) -> None:
    """The router discovers the pool's pods the service holds (pool selector + business=<service>): requests
    sharing a prefix land on the service's pod, and assigning it another pod gives the router a second worker.
    An unknown pool or service is refused (404) before any write."""
    routers = f"/api/v1/clusters/{CLUSTER}/inference/routers"
    ledger = CallLedger(world.live)
    mark = ledger.mark()
    for body, said in (({"deployment": "nope", "pool_service": "chat"}, "inference_pool_list"),
                       ({"deployment": "warm", "pool_service": "nope"}, "inference_pool_assign")):
        refused = world.live.post(routers, {"name": "chat-router", **body})
        assert refused.status_code == 404 and said in refused.text, refused.text
    ledger.assert_no_writes(since=mark, service="kubernetes")
    assert world.live.get("/api/v1/operations?kind=inference.router.create").json() == []
    shown = world.live.post(f"{routers}/preview", {"name": "chat-router", "deployment": "warm",
                                                   "pool_service": "chat"})
    assert shown.status_code == 200 and shown.json()["selector"] == "instantstart.io/inference=warm,business=chat"
    assert finished(world, world.live.post(routers, {"name": "chat-router", "deployment": "warm",
                                                     "pool_service": "chat"}))["status"] == "succeeded"
    held = {n for n, p in pods(world).items() if p.metadata.labels["business"] == "chat"}
    prefix = "You are a careful assistant for the InstantStart docs. Question: "
    served = set()
    for question in ("what is a pool?", "what is a service?", "what is a pod?"):
        answer = world.live.post(f"{routers}/chat-router/test", {"prompt": prefix + question, "max_tokens": 4})
        assert answer.status_code == 200 and answer.json()["status"] == 200, answer.text
        served.add(answer.json()["headers"]["x-sandbox-pod"])
    assert len(held) == 1 and served == held, served
    extra = sorted(n for n, p in pods(world).items() if p.metadata.labels["business"] == "unassigned")[0]
    assert finished(world, world.live.post(f"{BASE}/warm/assign", {"service": "chat", "pods": [extra]}))[
        "status"] == "succeeded"
    wait_until(lambda: world.live.get(f"{routers}/chat-router").json()["active_workers"] == 2, 60,
               "the router to discover the service's second pod")
    described = world.live.get(f"{routers}/chat-router").json()
    assert {w["pod"] for w in described["workers"]} == held | {extra}, described
    assert described["pool_service"] == "chat", described
    mark = ledger.mark()
    fronted = httpx2.delete(world.live.url + f"{BASE}/warm", headers=world.live.headers(), timeout=30)
    assert fronted.status_code == 409 and "inference_routers_delete chat-router" in fronted.text, fronted.text
    ledger.assert_no_writes(since=mark, service="kubernetes")
    gone = httpx2.delete(world.live.url + f"{routers}/chat-router", headers=world.live.headers(), timeout=30)
    assert finished(world, gone)["status"] == "succeeded"


def test_the_board_routes_a_service_and_releasing_all_its_pods_is_refused_while_a_router_fronts_it(
        world: JobWorld, tmp_path: Path) -> None:
    """The board's router form previews and creates a router for the selected pod's service (the router verbs);
    while it runs, releasing every pod of the service is refused (409 naming the router) with no write, and
    releasing some of them stays allowed."""
    operator = Principal("board-router", Role.OPERATOR, "t-op", "api")
    with world.server.imported(tmp_path / "product", CLUSTER, operator) as services:
        pane = InferencePane(services.inference, services.clusters, services.bus, operator, pools=services.pools,
                             routers=services.inference_routers)
        board = pane.pool_board
        assert board is not None and board.router_form is not None
        form = board.router_form
        wait_until(lambda: board.state.reload() or "chat" in set(board.table.value["service"]), 60,
                   "the board's rows of chat")
        rows = list(board.table.value["service"])
        board._on_selection(type("E", (), {"new": [rows.index("(unassigned)")]})())
        assert "serve no service" in form.preview()
        board._on_selection(type("E", (), {"new": [rows.index("chat")]})())
        form.router_name.value, form.cache_threshold.value = "board-router", 0.5
        shown = form.preview()
        assert "`instantstart.io/inference=warm,business=chat`" in shown and "--cache-threshold 0.5" in shown, shown
        asyncio.run(form._create(None))
        assert form.message.object.startswith("routing warm/chat through board-router ("), form.message.object
        op_id = str(form.message.object).rsplit("(", 1)[-1].rstrip(")")
        made = wait_until(lambda: (v := services.engine.run_until_idle(op_id)).status.terminal and v, 120,
                          "the board's router create to end")
        assert made.status == "succeeded", made
    routers = f"/api/v1/clusters/{CLUSTER}/inference/routers"
    wait_until(lambda: "board-router" in {r["name"] for r in world.live.get(routers).json()["routers"]}, 60,
               "the router in the server's list")
    chat = sorted(n for n, p in pods(world).items() if p.metadata.labels["business"] == "chat")
    assert len(chat) == 2, chat
    ledger = CallLedger(world.live)
    mark = ledger.mark()
    for body in ({"service": "chat"}, {"service": "chat", "pods": chat}):
        refused = world.live.post(f"{BASE}/warm/release", body)
        assert refused.status_code == 409 and "inference_routers_delete board-router" in refused.text, refused.text
    ledger.assert_no_writes(since=mark, service="kubernetes")
    assert finished(world, world.live.post(f"{BASE}/warm/release", {"service": "chat", "pods": chat[1:]}))[
        "status"] == "succeeded"
    gone = httpx2.delete(world.live.url + f"{routers}/board-router", headers=world.live.headers(), timeout=30)
    assert finished(world, gone)["status"] == "succeeded"


def test_a_router_create_and_a_release_of_all_its_services_pods_refuse_each_other_while_in_flight(
        world: JobWorld, tmp_path: Path) -> None:
    """A release of every pod of a service deletes its Service: while one is in flight, a router create for the
    service is refused naming it; while a router create for the service is in flight, releasing all its pods is
    refused, and so is the pool's delete, both naming the create's operation (the router cannot be deleted before
    its create ends: cancel it, or wait and delete the router). No refusal writes anything."""
    operator = Principal("race-router", Role.OPERATOR, "t-op", "api")
    ledger = CallLedger(world.live)
    with world.server.imported(tmp_path / "product", CLUSTER, operator) as services:
        wait_until(lambda: any(s.name == "chat" and s.pods for s in services.pools.describe_pool(
            operator, CLUSTER, "warm").services), 60, "the product to see chat's pods")
        releasing, _ = services.pools.release(operator, CLUSTER, "warm", PoolRelease(service="chat"))
        mark = ledger.mark()
        with pytest.raises(Conflict, match=rf"being released \(operation {releasing.id}\)"):
            services.inference_routers.create_router(operator, CLUSTER, RouterRequest(
                name="late-router", deployment="warm", pool_service="chat"))
        ledger.assert_no_writes(since=mark, service="kubernetes")
        assert services.engine.cancel(releasing.id, operator).status == "cancelled"

        creating, _ = services.inference_routers.create_router(operator, CLUSTER, RouterRequest(
            name="early-router", deployment="warm", pool_service="chat"))
        mark = ledger.mark()
        named = rf"the router early-router is being created for the service chat of the pool warm \(operation " \
            rf"{creating.id}\): cancel it \(operations_cancel {creating.id}\), or wait"
        with pytest.raises(Conflict, match=named + ".* then release them") as releasing_all:
            services.pools.release(operator, CLUSTER, "warm", PoolRelease(service="chat"))
        with pytest.raises(Conflict, match=named + ".* then the pool") as deleting:
            services.pools.delete_pool(operator, CLUSTER, "warm")
        for refused in (releasing_all, deleting):
            assert refused.value.details == {"routers": ["early-router"], "service": "chat", "operation": creating.id}
        ledger.assert_no_writes(since=mark, service="kubernetes")
        assert services.engine.list(OperationQuery(kind="inference.pool.delete")) == []
        # the create's Service reaches the cache before its Deployment: the list says it is being made
        world.core.create_namespaced_service(NS, {"metadata": {"name": "early-router", "labels": {
            **MANAGED_LABEL, ROUTER_LABEL: "early-router"}}, "spec": {"ports": [{"port": 8080}]}})

        def row() -> Any:
            return next((r for r in services.inference_routers.list_routers(operator, CLUSTER).routers
                         if r.name == "early-router"), None)
        shown = wait_until(row, 30, "the router's Service in the product's list")
        assert (shown.phase, shown.message) == ("Progressing", f"being created (operation {creating.id})"), shown
        assert services.engine.cancel(creating.id, operator).status == "cancelled"
        assert row().phase == "Orphaned"
        world.core.delete_namespaced_service("early-router", NS)


def test_a_release_that_would_leave_a_fronted_service_no_pod_fails_on_live_objects(
        world: JobWorld, tmp_path: Path) -> None:
    """The release's submit reads the caches: a release of some of a service's pods passes it, and when another
    writer has released the rest meanwhile, the stage (on live objects) fails naming the router that fronts the
    service, before any patch."""
    operator = Principal("late-release", Role.OPERATOR, "t-op", "api")
    first, second = sorted(n for n, p in pods(world).items() if p.metadata.labels["business"] == "unassigned")
    apps = k8s.AppsV1Api(world.api)
    router = {"metadata": {"name": "fronting-router", "labels": {ROUTER_LABEL: "fronting-router"},
                           "annotations": {FOR_ANNOTATION: "warm", SERVICE_ANNOTATION: "code"}},
              "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "fronting-router"}},
                       "template": {"metadata": {"labels": {"app": "fronting-router"}},
                                    "spec": {"containers": [{"name": "router", "image": "busybox"}]}}}}
    ledger = CallLedger(world.live)
    with world.server.imported(tmp_path / "product", CLUSTER, operator) as services:
        assigned, _ = services.pools.assign(operator, CLUSTER, "warm", PoolAssign(service="code", pods=[first, second]))
        assert services.engine.run_until_idle(assigned.id).status == "succeeded"
        apps.create_namespaced_deployment(NS, router)
        wait_until(lambda: len(next(s for s in services.pools.describe_pool(operator, CLUSTER, "warm").services
                                    if s.name == "code").pods) == 2, 60, "the product to see code's two pods")
        releasing, _ = services.pools.release(operator, CLUSTER, "warm", PoolRelease(service="code", pods=[first]))
        world.core.patch_namespaced_pod(second, NS, {"metadata": {"labels": {"business": "unassigned"},
                                                                  "annotations": {CLAIMED_BY: None}}})
        mark = ledger.mark()
        failed = services.engine.run_until_idle(releasing.id)
        assert failed.status == "failed" and failed.error is not None, failed
        assert "the router fronting-router fronts the service code" in failed.error["message"], failed.error
        assert pod_patches(ledger, mark, first) == []
        assert pods(world)[first].metadata.labels["business"] == "code"
    apps.delete_namespaced_deployment("fronting-router", NS)
    world.core.patch_namespaced_pod(first, NS, {"metadata": {"labels": {"business": "unassigned"},
                                                             "annotations": {CLAIMED_BY: None}}})
    world.core.delete_namespaced_service("code", NS)


def test_a_router_autoscaling_or_an_endpoint_on_the_pool_is_refused_naming_the_pool(world: JobWorld) -> None:
    """A pool's services are what clients call: a router over the whole pool (no pool_service), KEDA (which would
    fight the pool's scale-in guard) and a managed endpoint of the pool's name are refused (409 naming the pool),
    with no write."""
    world.install("inference-operator")  # the managed path's CRDs, so its name check is reached
    wait_until(lambda: world.live.get(f"/api/v1/clusters/{CLUSTER}/inference/endpoints").json()["operator"], 60,
               "the operator's CRDs in the cache")
    ledger = CallLedger(world.live)
    mark = ledger.mark()
    routers = f"/api/v1/clusters/{CLUSTER}/inference/routers"
    for path in (f"{routers}/preview", routers):
        refused = world.live.post(path, {"name": "front", "deployment": "warm"})
        assert refused.status_code == 409 and "warm is a model pool" in refused.text, refused.text
        assert "give pool_service" in refused.text, refused.text
    scaled = httpx2.put(world.live.url + f"/api/v1/clusters/{CLUSTER}/inference/deployments/warm/scaling",
                        json={"max_replicas": 3, "request_rate": 1.0}, headers=world.live.headers(), timeout=60)
    assert scaled.status_code == 409 and "model pool" in scaled.text and "inference_pool_scale" in scaled.text, \
        scaled.text
    endpoint = {"name": "warm", "instance_types": ["ml.g5.8xlarge"],
                "source": {"type": "s3", "bucket": "models-bucket", "region": "us-west-2", "location": "qwen"},
                "worker": {"image": "lmcache/vllm-openai:v0.3.7", "args": ["/opt/ml/model"], "port": 8000, "gpus": 1}}
    named = world.live.post(f"/api/v1/clusters/{CLUSTER}/inference/endpoints", endpoint)
    assert named.status_code == 409 and "already has a model pool 'warm'" in named.text, named.text
    assert "inference_pool_delete" in named.text, named.text
    ledger.assert_no_writes(since=mark, service="kubernetes")
    for kind in ("inference.router.create", "inference.scaling.set", "managed.deploy"):  # the router of chat aside
        made = world.live.get(f"/api/v1/operations?kind={kind}").json()
        assert [o for o in made if o["target"] != f"cluster/{CLUSTER}/inference/chat-router"] == [], kind


def test_an_agent_reads_and_tests_the_pool_and_its_delete_takes_the_services(world: JobWorld) -> None:
    operator = world.live.make_token("operator")
    used: list[str] = []

    async def agent() -> dict[str, Any]:
        async with bridge(world.live.url, operator, "inference,operations") as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert tools["inference_pool_delete"].annotations and \
                tools["inference_pool_delete"].annotations.destructive_hint
            listed = await call(client, "inference_pool_list", {"cluster": CLUSTER}, used)
            answer = await call(client, "inference_pool_test", {"cluster": CLUSTER, "name": "warm",
                                                                "service": "chat", "max_tokens": 4}, used)
            return {"listed": listed, "answer": answer}

    seen = anyio.run(agent)
    (pool,) = seen["listed"]["pools"]
    held = {p["name"] for p in pool["pods"] if p["assigned_to"] == "chat"}
    assert seen["answer"]["status"] == 200 and seen["answer"]["headers"]["x-sandbox-pod"] in held
    assert "warm" not in {d["name"] for d in world.live.get(
        f"/api/v1/clusters/{CLUSTER}/inference/deployments").json()["deployments"]}
    gone = httpx2.delete(world.live.url + f"{BASE}/warm", headers=world.live.headers(), timeout=30)
    assert finished(world, gone)["status"] == "succeeded"
    wait_until(lambda: "chat" not in {s.metadata.name for s in world.core.list_namespaced_service(NS).items}, 60,
               "the service's Service to go with its pool")
    with pytest.raises(k8s.ApiException):
        k8s.AppsV1Api(world.api).read_namespaced_deployment("warm", NS)
