"""The two throughput paths answer from memory: the status summary reads no SQLite (the engine's in-memory
index of counts, active operations and failures, kept in step with every write and rebuilt at start), and
a cluster detail read served on the event loop makes no AWS call there (a stale AWS entry is answered at
once and refreshed by a background worker)."""

from __future__ import annotations

import asyncio
import functools
import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import httpx2
import kubernetes.client as k8s
import pytest
import tornado.web

from app.bootstrap import Services
from app.edge import record_answer, use_access_log
from app.fast_reads import use_fast_reads
from app.rest import rest_patterns
from app.routes import ROUTES
from app.server import SecurityHeaders
from services.auth import Role
from services.clusters.models import GROUP_LABEL, HEALTH_LABEL, ClusterImport
from services.operation_views import ACTIVE, OperationQuery, Status
from services.operations import Engine
from services.tokens import TokenCreate
from tests.conftest import ADMIN, OPERATOR, VIEWER
from tests.create_support import SandboxProduct, sandbox_product
from tests.kinds import ThingRequest, World
from tests.support import ROOT, free_port, wait_until


def _sql_counts(services: Services) -> dict[str, int]:
    rows = services.db.query("SELECT status, COUNT(*) AS n FROM operations GROUP BY status")
    return {r["status"]: r["n"] for r in rows}


def _statements(services: Services) -> list[str]:
    """Start recording the SQL this thread's connection runs (the list fills as statements run)."""
    seen: list[str] = []
    services.db.connection().set_trace_callback(seen.append)
    return seen


def test_status_counts_and_lists_come_from_memory_and_match_the_database(
        services: Services, engine: Engine, world: World) -> None:
    done = [engine.submit("thing.create", ThingRequest(name=f"ok{i}"), OPERATOR)[0] for i in range(3)]
    for op in done:
        engine.run_until_idle(op.id)
        services.clock.advance(10)  # type: ignore[attr-defined]
        engine.run_until_idle(op.id)
    world.update(faults=["permanent", "permanent"])
    failed = [engine.submit("thing.create", ThingRequest(name=f"bad{i}"), OPERATOR)[0] for i in range(2)]
    for op in failed:
        engine.run_until_idle(op.id)
    engine.run_until_idle(engine.submit("thing.create", ThingRequest(name="slow"), OPERATOR)[0].id)
    pending = engine.submit("thing.create", ThingRequest(name="queued"), OPERATOR)[0]
    engine.cancel(failed[0].id, OPERATOR)  # failed -> cancelled leaves the failure list
    services.bus.drain()

    expected = _sql_counts(services)
    assert expected["failed"] == 1 and expected["cancelled"] == 1 and expected["pending"] == 1
    assert expected.get("succeeded", 0) + expected.get("waiting", 0) == 4
    seen = _statements(services)
    summary = services.operations.summary(VIEWER, wait=0)
    assert seen == [], f"the status summary ran SQL: {seen}"
    assert summary.operations == expected
    assert [o.id for o in summary.active] == [o.id for o in engine.list(OperationQuery(active=True))]
    assert pending.id in {o.id for o in summary.active}
    assert [o.id for o in summary.recent_failures] == [failed[1].id]
    assert [o.model_dump() for o in summary.active] == \
        [engine.get(o.id).model_dump() for o in summary.active], "the views are current, not the first ones"

    engine.retry(failed[1].id, OPERATOR)  # failed -> pending: back in the active list, out of the failures
    summary = services.operations.summary(VIEWER, wait=0)
    assert summary.operations == _sql_counts(services) and "failed" not in summary.operations
    assert summary.operations["pending"] == 2
    assert summary.recent_failures == []
    assert failed[1].id in [o.id for o in summary.active]

    rebuilt = Engine(services.db, services.bus, services.audit, services.clock)  # what a restart sees
    assert rebuilt.counts() == _sql_counts(services) == services.engine.counts()
    assert [o.id for o in rebuilt.active()] == [o.id for o in services.engine.active()]
    assert all(o.status in ACTIVE for o in rebuilt.active())


def test_the_failure_list_refills_from_the_database_when_one_leaves_it(
        services: Services, engine: Engine, world: World) -> None:
    world.update(faults=["permanent"] * 7)
    failed = [engine.submit("thing.create", ThingRequest(name=f"bad{i}"), OPERATOR)[0] for i in range(7)]
    for op in failed:
        engine.run_until_idle(op.id)
    newest = [o.id for o in engine.list(OperationQuery(status=[Status.FAILED], limit=5))]
    assert [o.id for o in engine.recent_failures()] == newest
    engine.cancel(newest[0], OPERATOR)
    assert [o.id for o in engine.recent_failures()] == \
        [o.id for o in engine.list(OperationQuery(status=[Status.FAILED], limit=5))]
    assert engine.counts()["failed"] == 6 and engine.counts()["cancelled"] == 1


@pytest.fixture(scope="module")
def product(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxProduct]:
    with sandbox_product(tmp_path_factory.mktemp("throughput")) as made:
        seed = subprocess.run([sys.executable, "-m", "app.cli", "sandbox", "seed", "--name", "fast", "--nodes", "2",
                               "--data-dir", str(made.live.data_dir)], cwd=ROOT, capture_output=True, text=True,
                              timeout=300)
        assert seed.returncode == 0, seed.stderr
        view, _ = made.services.clusters.import_cluster(
            OPERATOR, ClusterImport(eks_cluster="fast", hyperpod_cluster="fast"), None)
        done = made.services.operations.wait_operation(OPERATOR, view.id, 120)
        assert done.status == Status.SUCCEEDED, (done.error, done.stages)
        yield made


def _record_aws_threads(services: Services) -> list[tuple[str, str]]:
    """(thread name, API operation) of every AWS call the product's EKS and SageMaker clients make."""
    calls: list[tuple[str, str]] = []

    def seen(model: Any, **_: Any) -> None:
        calls.append((threading.current_thread().name, model.name))

    for service in ("eks", "sagemaker"):
        services.aws.client(service).meta.events.register("before-call", seen)
    return calls


def test_a_cluster_read_on_the_loop_never_calls_aws_there(product: SandboxProduct) -> None:
    services = product.services
    services.clusters.cache.invalidate()  # nothing cached: the first read must load in a worker
    services.clusters.cache.ttl = 0.0  # and what it loads is stale at once: every later read revalidates
    calls = _record_aws_threads(services)
    token = services.tokens.create(TokenCreate(name="reader", role=Role.VIEWER), "test").token
    port, loop, started = free_port(), asyncio.new_event_loop(), threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        tornado.web.Application(rest_patterns(services)).listen(port, "127.0.0.1")
        started.set()
        loop.run_forever()

    def get(path: str) -> dict[str, Any]:
        r = httpx2.get(f"http://127.0.0.1:{port}{path}", headers={"Authorization": f"Bearer {token}"}, timeout=60)
        assert r.status_code == 200, r.text
        return dict(r.json())

    thread = threading.Thread(target=run, name="the-loop", daemon=True)
    thread.start()
    try:
        assert started.wait(60)
        first = get("/api/v1/clusters/fast")  # not cached yet: answered by a worker that read AWS
        assert first["eks_status"] == "ACTIVE" and first["hyperpod_status"] == "InService", first
        assert first["loading"] is False and first["nodes"] == 2
        loaded = {op for _, op in calls}
        assert {"DescribeCluster"} <= loaded
        before = len(calls)
        for _ in range(5):
            again = get("/api/v1/clusters/fast")
            assert again["eks_status"] == "ACTIVE" and again["loading"] is False
            assert get("/api/v1/status")["registered"][0]["eks_status"] == "ACTIVE"
        wait_until(lambda: any(t.startswith("aws-revalidate") for t, _ in calls[before:]), 30,
                   "a background refresh of the stale entries")
        assert get("/api/v1/clusters/fast?refresh=true")["eks_status"] == "ACTIVE"
        assert [t for t, _ in calls if t == "the-loop"] == [], f"AWS was called on the event loop: {calls}"
    finally:
        services.clusters.cache.ttl = 15.0
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def test_a_memory_only_read_of_an_uncached_cluster_loads_it_in_the_background(product: SandboxProduct) -> None:
    services = product.services
    services.clusters.cache.invalidate()
    calls = _record_aws_threads(services)
    here = threading.current_thread().name
    detail = services.clusters.describe_cluster(VIEWER, "fast", wait=0)
    assert detail.loading is True and detail.eks_status is None, "nothing read on the caller's thread"
    wait_until(lambda: not services.clusters.describe_cluster(VIEWER, "fast", wait=0).loading, 30,
               "the background load of the EKS and HyperPod descriptions")
    assert services.clusters.describe_cluster(VIEWER, "fast", wait=0).hyperpod_status == "InService"
    assert calls and all(t != here for t, _ in calls), calls

    node = services.clusters.describe_cluster(VIEWER, "fast", wait=0).nodes_by_group["workers"][0].name

    def pods_on_node() -> int:
        groups = services.clusters.describe_cluster(VIEWER, "fast", wait=0).nodes_by_group
        return next(n.pods for n in groups["workers"] if n.name == node)

    # the seed runs the device plugins' DaemonSet pods on every node: those are counted first
    before = wait_until(pods_on_node, 30, "the device plugins' pods counted on their node")
    k8s.CoreV1Api(services.kube.api_client("fast")).create_namespaced_pod("default", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "counted"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}})
    wait_until(lambda: pods_on_node() == before + 1, 30, "the pod to be counted on its node, from the pods' informer")


def test_a_memory_only_read_is_reused_until_what_it_was_derived_from_changes(product: SandboxProduct) -> None:
    services = product.services

    def read() -> Any:
        return services.clusters.describe_cluster(VIEWER, "fast", wait=0)

    wait_until(lambda: not read().loading, 30, "the cluster's AWS and Kubernetes parts in the caches")
    first, again = read(), read()
    assert again.nodes_by_group is first.nodes_by_group, "the second read was derived again, not reused"
    assert again.cache_age_seconds is not None and first.cache_age_seconds is not None
    assert again.cache_age_seconds >= first.cache_age_seconds, "a reused answer still carries the cache's age"
    status = [services.operations.summary(VIEWER).registered for _ in range(2)]
    assert status[0][0] is status[1][0], "the status summary's cluster row was derived again"

    node = first.nodes_by_group["workers"][0]
    core = k8s.CoreV1Api(services.kube.api_client("fast"))
    relabel = {"metadata": {"labels": {"node.kubernetes.io/instance-type": "ml.relabelled"}}}
    core.patch_node(node.name, relabel)
    try:
        def shown() -> str | None:
            return next(n.instance_type for n in read().nodes_by_group["workers"] if n.name == node.name)

        wait_until(lambda: shown() == "ml.relabelled", 30, "the relabelled node in a memory-only read")
        assert services.operations.summary(VIEWER).registered[0] is not status[0][0], \
            "the summary row outlived a change of the nodes it counts"
    finally:
        relabel["metadata"]["labels"]["node.kubernetes.io/instance-type"] = node.instance_type or "ml.g5.8xlarge"
        core.patch_node(node.name, relabel)
    wait_until(lambda: next(n.instance_type for n in read().nodes_by_group["workers"] if n.name == node.name)
               == node.instance_type, 30, "the label put back")


def test_a_reused_read_is_encoded_once_and_a_change_shows_in_the_next_encoding(
        product: SandboxProduct) -> None:
    """What the REST face writes (``encoded()``): the JSON of the read as it is now (its current cache age
    spliced into the encoding made once for the state), the same text while the state and the age stay, and
    a change of the inputs in the next one."""
    services = product.services

    def read() -> Any:
        return services.clusters.describe_cluster(VIEWER, "fast", wait=0)

    wait_until(lambda: not read().loading, 30, "the cluster's AWS and Kubernetes parts in the caches")
    texts = [read().encoded() for _ in range(3)]
    ages = set()
    for text in texts:
        body = json.loads(text)
        ages.add(body.pop("cache_age_seconds"))
        assert body == json.loads(read().model_dump_json(exclude={"cache_age_seconds"})), "spliced JSON differs"
    first = read()
    assert json.loads(first.encoded()) == json.loads(first.model_dump_json()), "the age written in is the model's"
    wait_until(lambda: read().cache_age_seconds != first.cache_age_seconds, 30, "the next 10 ms of cache age")
    assert read().encoded() != first.encoded() and first.encoded() is first.encoded()

    status = services.operations.summary(VIEWER)
    assert services.operations.summary(VIEWER) is status, "an unchanged status summary was made again"
    assert status.encoded() is status.encoded()
    node = first.nodes_by_group["workers"][0]
    core = k8s.CoreV1Api(services.kube.api_client("fast"))
    core.patch_node(node.name, {"metadata": {"labels": {HEALTH_LABEL: "Unknown"}}})
    try:
        def health() -> dict[str, int]:
            return dict(json.loads(read().encoded())["health"])

        wait_until(lambda: health().get("Unknown") == 1, 30, "the relabelled node's health")
        wait_until(lambda: json.loads(services.operations.summary(VIEWER).encoded())["registered"][0]["health"]
                   .get("Unknown") == 1, 30, "the change in the status summary's JSON")
    finally:
        core.patch_node(node.name, {"metadata": {"labels": {HEALTH_LABEL: node.health}}})
    wait_until(lambda: "Unknown" not in health(), 30, "the health label put back")


def test_a_group_named_like_the_age_field_does_not_move_where_the_age_is_written(product: SandboxProduct) -> None:
    """The age is spliced into the stored encoding at the top-level key: a node whose group label is that very
    word puts the same text earlier in the JSON (a key of nodes_by_group), and the answer must stay whole."""
    services = product.services

    def read() -> Any:
        return services.clusters.describe_cluster(VIEWER, "fast", wait=0)

    wait_until(lambda: not read().loading, 30, "the cluster's AWS and Kubernetes parts in the caches")
    node = read().nodes_by_group["workers"][0]
    core = k8s.CoreV1Api(services.kube.api_client("fast"))
    core.patch_node(node.name, {"metadata": {"labels": {GROUP_LABEL: "cache_age_seconds"}}})
    try:
        def regrouped() -> Any:
            detail = read()
            return detail if "cache_age_seconds" in detail.nodes_by_group else None

        first = wait_until(regrouped, 30, "the node in its odd group")
        # a later read of the same state, with an older age: the age is spliced into the first one's encoding
        def aged() -> Any:
            detail = read()
            return detail if detail.cache_age_seconds != first.cache_age_seconds else None

        got = wait_until(aged, 30, "the next 10 ms of cache age")
        assert got.nodes_by_group is first.nodes_by_group, "the later read was derived again, not reused"
        body = json.loads(got.encoded())
        assert body["cache_age_seconds"] == got.cache_age_seconds
        assert [n["name"] for n in body["nodes_by_group"]["cache_age_seconds"]] == [node.name]
        assert body == json.loads(got.model_dump_json())
    finally:
        core.patch_node(node.name, {"metadata": {"labels": {GROUP_LABEL: "workers"}}})
    wait_until(lambda: "cache_age_seconds" not in read().nodes_by_group, 30, "the group label put back")


def _answered_200(services: Services) -> float:
    """``instantstart_http_requests_total{method="GET",code="200"}`` as ``GET /metrics`` shows it."""
    for line in services.operations.metrics_text(VIEWER).splitlines():
        if line.startswith("instantstart_http_requests_total{") and 'method="GET"' in line and 'code="200"' in line:
            return float(line.rpartition(" ")[2])
    return 0.0


def test_the_fast_path_answers_as_the_handler_does_and_leaves_every_refusal_to_it(product: SandboxProduct) -> None:
    """Two servers on one loop and the same services: the handler alone, and with app/fast_reads.py ahead of
    it as ``instantstart serve`` has it. Each request gets the same status, headers and body bytes from both
    (but the cache's age, written to 10 ms, which may differ between two reads, with the Content-Length and
    Date that follow from it). The fast server's 200s are counted by the access log policy without a
    RequestHandler; no token (401), a revoked token (401), a viewer on an admin route (403), an unknown
    cluster or path (404), a bad query (422) and a token's first request (not signed in yet) are the
    handler's."""
    services = product.services
    wait_until(lambda: not services.clusters.describe_cluster(VIEWER, "fast", wait=0).loading, 30,
               "the cluster's AWS and Kubernetes parts in the caches")
    plain_port, fast_port, loop, started = free_port(), free_port(), asyncio.new_event_loop(), threading.Event()
    handled: list[str] = []  # what a RequestHandler answered on the fast server (Tornado's log_function)

    def run() -> None:
        asyncio.set_event_loop(loop)
        settings: dict[str, Any] = {"transforms": [SecurityHeaders], "cookie_secret": "fast-path-test"}
        tornado.web.Application(rest_patterns(services), **settings).listen(plain_port, "127.0.0.1")
        fast = tornado.web.Application(rest_patterns(services), **settings)
        use_access_log(fast, services.engine.metrics)
        policy = fast.settings["log_function"]

        def log_handled(handler: tornado.web.RequestHandler) -> None:
            handled.append(f"{handler.get_status()} {handler.request.uri}")
            policy(handler)

        fast.settings["log_function"] = log_handled
        use_fast_reads(fast, services, ROUTES, functools.partial(record_answer, services.engine.metrics))
        fast.listen(fast_port, "127.0.0.1")
        started.set()
        loop.run_forever()

    def both(path: str, token: str | None) -> tuple[int, dict[str, str], bytes]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        answers = [httpx2.get(f"http://127.0.0.1:{port}{path}", headers=headers, timeout=60)
                   for port in (fast_port, plain_port)]  # the fast one first: a new token's first request
        assert all(a.headers["content-length"] == str(len(a.content)) for a in answers)
        fast, plain = [(a.status_code, {k: v for k, v in a.headers.items() if k not in ("date", "content-length")},
                        re.sub(rb'"cache_age_seconds":[0-9.e+-]+', b'"cache_age_seconds":0', a.content))
                       for a in answers]
        assert fast == plain, f"{path}: the fast server answered differently"
        return plain

    viewer = services.tokens.create(TokenCreate(name="fast-reader", role=Role.VIEWER), "test")
    revoked = services.tokens.create(TokenCreate(name="fast-revoked", role=Role.VIEWER), "test")
    thread = threading.Thread(target=run, name="the-loop", daemon=True)
    thread.start()
    try:
        assert started.wait(60)
        assert both("/api/v1/status", viewer.token)[0] == 200  # its first request signs it in: the handler's
        wait_until(lambda: "200 /api/v1/status" in handled, 30, "the first sign-in answered by the handler")
        assert both("/api/v1/status", revoked.token)[0] == 200
        counted = _answered_200(services)
        fast_reads = ["/api/v1/status", "/api/v1/clusters/fast", "/api/v1/clusters/fast?limit=1",
                      "/api/v1/whoami"]
        for path in fast_reads:
            status, headers, body = both(path, viewer.token)
            assert status == 200 and headers["content-security-policy"] and headers["cache-control"] == "no-store"
            assert json.loads(body), body
        services.token_verbs.revoke_token(ADMIN, revoked.id)
        refusals = {"/api/v1/status": (401, None), "/api/v1/clusters/fast?refresh=": (401, revoked.token),
                    "/api/v1/tokens": (403, viewer.token), "/api/v1/clusters/nowhere": (404, viewer.token),
                    "/api/v1/clusters/fast?limit=0": (422, viewer.token)}
        for path, (code, token) in refusals.items():
            assert both(path, token)[0] == code, path
        last = "/api/v1/nothing-here"
        assert both(last, viewer.token)[0] == 404
        wait_until(lambda: f"404 {last}" in handled, 30, "the last request's log")  # so all before it are in
        for path, (code, _) in refusals.items():
            assert f"{code} {path}" in handled, f"{path} was not answered by the handler: {handled}"
        assert [h for h in handled if h.startswith("200 ")] == ["200 /api/v1/status"] * 2, \
            f"only the two first sign-ins may have reached a handler with a 200: {handled}"
        assert _answered_200(services) == counted + len(fast_reads), "the fast answers were not counted"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
