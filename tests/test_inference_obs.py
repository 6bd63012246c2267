"""Observability and hardening of self-managed inference against a real server in sandbox mode (one seeded world
and one vLLM deployment for the module): the deployment's detail carries its engines' time to first token and
tokens/s, read from their own ``/metrics`` through the Kubernetes API's pod proxy (what the sandbox's engine
counted for the requests it answered), at most once per few seconds and for a bounded number of pods; the engine's
log lines read through the logs noun (REST, MCP, the pane), reads only; the per-principal bound on concurrent
test calls; and a failed deploy's token Secret, kept for the update that fixes it."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import httpx2
import panel as pn
import pytest
from kubernetes import client as k8s
from prometheus_client.parser import text_string_to_metric_families

from panels.inference import InferencePane
from services.auth import Principal, Role
from services.aws import AwsClients
from services.clock import Clock
from services.inference.endpoint_metrics import FRESH_SECONDS, MAX_PODS, EndpointScraper, PodTarget
from services.kube import KubeClients
from tests.jobs_support import CLUSTER, JobWorld, job_world
from tests.ledger import CallLedger
from tests.mcp_support import bridge
from tests.support import wait_until

pytestmark = pytest.mark.slow
BASE = f"/api/v1/clusters/{CLUSTER}/inference/deployments"
NS = "hyperpod-ns-inference"
NAME = "obs"
VLLM = "vllm serve Qwen/Qwen2.5-0.5B-Instruct --max-model-len 4096 --served-model-name obs"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("inference-obs")


@pytest.fixture(scope="module")
def world(folder: Path) -> Iterator[JobWorld]:
    with job_world(folder, components=(), nodes=3) as made:  # obs, and a failing deploy with its fix
        started = made.live.post(BASE, {"name": NAME, "command": VLLM, "gpus": 1})
        assert started.status_code == 202, started.text
        assert made.finished(started.json()["operation"]["id"], timeout=180)["status"] == "succeeded"
        yield made


def describe(world: JobWorld) -> dict[str, Any]:
    shown = world.live.get(f"{BASE}/{NAME}")
    assert shown.status_code == 200, shown.text
    return dict(shown.json())


def metrics_reads(world: JobWorld, since: int) -> list[dict[str, Any]]:
    """The pod-proxy GETs since ``since`` (only the metrics scrapes go through the pod proxy)."""
    return [e for e in CallLedger(world.live).calls(service="kubernetes", since=since)
            if e.get("resource") == "pods" and e.get("subresource") == "proxy"]


def test_the_detail_shows_ttft_and_tokens_per_second_of_the_requests_the_engine_answered(world: JobWorld) -> None:
    pod = world.core.list_namespaced_pod(NS, label_selector=f"instantstart.io/inference={NAME}").items[0].metadata.name
    mark = CallLedger(world.live).mark()
    first = describe(world)["metrics"]
    assert (first["pods_ready"], first["pods_scraped"], first["window_seconds"]) == (1, 1, None), first
    assert first["tokens_per_second"] is None and "second scrape" in first["note"], first
    reads = metrics_reads(world, mark)
    assert {(e["verb"], e["namespace"], e["name"]) for e in reads} == {("get", NS, f"{pod}:8000")}, reads

    generated = 0
    for prompt in ("hello", "what is a GPU", "tell me about the sandbox in a few words"):
        answer = world.live.post(f"{BASE}/{NAME}/test", {"prompt": prompt, "max_tokens": 12})
        assert answer.status_code == 200 and answer.json()["status"] == 200, answer.text
        generated += answer.json()["answer"]["usage"]["completion_tokens"]

    def compared() -> dict[str, Any] | None:
        shown = describe(world)["metrics"]
        return shown if shown["window_seconds"] is not None and shown["requests"] else None
    shown = wait_until(compared, timeout=120, message="a scrape after the test calls", interval=0.5)
    assert shown["requests"] == 3, shown
    assert shown["tokens_per_second"] * shown["window_seconds"] == pytest.approx(generated, rel=0.01), shown
    # the sandbox engine's TTFT is 20 ms + 0.2 ms per prompt token: all three fall in its (0.02, 0.04] bucket
    assert 0.02 < shown["ttft_p50_seconds"] <= shown["ttft_p95_seconds"] <= 0.04, shown
    listed = world.live.get(BASE).json()["deployments"]
    assert [d["metrics"] for d in listed if d["name"] == NAME] == [None]  # a list scrapes nothing


def test_a_deployment_is_scraped_once_per_few_seconds_and_never_more_than_max_pods(world: JobWorld,
                                                                                   folder: Path) -> None:
    kube = KubeClients(AwsClients("us-west-2"), Clock(), ca_dir=folder / "ca")
    kube.register_kubeconfig(CLUSTER, folder / "kubeconfig")
    now = [1000.0]
    scraper = EndpointScraper(kube, clock=lambda: now[0])
    pod = describe(world)["pods"][0]["name"]
    ledger = CallLedger(world.live)
    mark = ledger.mark()
    for _ in range(5):
        scraper.read(CLUSTER, NS, NAME, "vllm", [PodTarget(NS, pod, 8000)])
    assert len(metrics_reads(world, mark)) == 1
    now[0] += FRESH_SECONDS
    again = scraper.read(CLUSTER, NS, NAME, "vllm", [PodTarget(NS, pod, 8000)])
    assert len(metrics_reads(world, mark)) == 2 and again.window_seconds == FRESH_SECONDS

    mark = ledger.mark()
    many = [PodTarget(NS, pod, 8000), *(PodTarget(NS, f"{NAME}-gone-{i}", 8000) for i in range(MAX_PODS + 3))]
    wide = scraper.read(CLUSTER, NS, "wide", "vllm", many)
    assert len(metrics_reads(world, mark)) == MAX_PODS
    assert (wide.pods_ready, wide.pods_scraped) == (MAX_PODS + 4, 1) and "did not answer" in wide.note, wide
    kube.forget(CLUSTER)


def test_the_engine_logs_read_through_rest_mcp_and_the_pane(world: JobWorld, tmp_path: Path) -> None:
    pod = world.core.list_namespaced_pod(NS, label_selector=f"instantstart.io/inference={NAME}").items[0].metadata.name
    ledger = CallLedger(world.live)
    mark = ledger.mark()
    read = world.live.get(f"{BASE}/{NAME}/logs", params={"grep": "uvicorn running"})
    assert read.status_code == 200, read.text
    lines = [line for line in read.text.splitlines() if not line.startswith("#")]
    assert len(lines) == 1 and f" {pod} " in lines[0] and "Uvicorn running on" in lines[0], read.text
    logged = [(e["verb"], e["name"], e["subresource"]) for e in ledger.calls(service="kubernetes", since=mark)
              if e["resource"] == "pods"]
    assert ("list", "", "") in logged and ("get", pod, "log") in logged, logged
    ledger.assert_no_writes(since=mark, service="kubernetes")
    newer = world.live.get(f"{BASE}/{NAME}/logs", params={"cursor": read.headers["X-Log-Cursor"]})
    assert newer.status_code == 200 and "Uvicorn running" not in newer.text, newer.text
    assert world.live.get(f"{BASE}/nope/logs").status_code == 404
    assert world.live.get(f"{BASE}/{NAME}/logs", params={"grep": "("}).status_code == 422

    async def agent() -> str:
        async with bridge(world.live.url, world.live.make_token("viewer"), "inference") as client:
            result = await client.call_tool("inference_logs", {"cluster": CLUSTER, "name": NAME, "grep": "startup"})
            assert not result.is_error, result
            return "".join(getattr(c, "text", "") for c in result.content)
    assert "Application startup complete" in anyio.run(agent)

    operator = Principal("obs-operator", Role.OPERATOR, "t-obs-op", "api")
    viewer = Principal("obs-viewer", Role.VIEWER, "t-obs-view", "api")  # reading metrics and logs needs no more
    with world.server.imported(tmp_path / "product", CLUSTER, operator) as services:
        pane = InferencePane(services.inference, services.clusters, services.bus, viewer)
        pn.panel(pane).get_root()
        wait_until(lambda: pane.state.reload() or not pane.table.value.empty, 60, "the pane's table")
        pane._on_selection(type("E", (), {"new": [0]})())
        pane.obs.state.grep = "uvicorn"
        asyncio.run(pane.obs.refresh_logs())
        assert "Uvicorn running on" in pane.obs.state.logs, pane.obs.state.logs
        asyncio.run(pane.obs.refresh_metrics())
        assert pane.obs.state.metrics.startswith(f"**{NAME}**: TTFT p50 "), pane.obs.state.metrics


def test_a_third_concurrent_test_call_of_one_principal_is_refused_while_two_are_in_flight(world: JobWorld) -> None:
    """The sandbox engine holds its answers: two test calls of one operator are in flight (the engine counts them
    running), a third of the same operator gets 429 before anything is sent, and once the answers go out the
    slots are free again."""
    pod = world.core.list_namespaced_pod(NS, label_selector=f"instantstart.io/inference={NAME}").items[0].metadata.name
    operator = world.live.make_token("operator")

    def engine(path: str) -> str:
        return str(world.core.connect_post_namespaced_pod_proxy_with_path(f"{pod}:8000", NS, path))

    def running() -> float:
        text = str(world.core.connect_get_namespaced_pod_proxy_with_path(f"{pod}:8000", NS, "metrics"))
        return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
                   if s.name == "vllm:num_requests_running")

    def test_call() -> httpx2.Response:
        return world.live.post(f"{BASE}/{NAME}/test", {"prompt": "held"}, token=operator)

    engine("sandbox/hold")
    try:
        with ThreadPoolExecutor(2) as pool:
            held = [pool.submit(test_call) for _ in range(2)]
            wait_until(lambda: running() == 2, 60, "two test calls held in the engine")
            mark = CallLedger(world.live).mark()
            third = test_call()
            assert third.status_code == 429, third.text
            assert third.json()["error"]["details"] == {"limit": 2, "open": 2}, third.text
            assert not metrics_reads(world, mark) and not [
                e for e in CallLedger(world.live).calls(service="kubernetes", since=mark)
                if e.get("resource") == "services" and e.get("subresource") == "proxy"]  # nothing was sent
            engine("sandbox/release")
            assert [f.result().status_code for f in held] == [200, 200]
    finally:
        engine("sandbox/release")
    assert test_call().status_code == 200


def test_a_failed_deploy_keeps_its_token_secret_so_the_fix_by_update_can_pull_the_gated_model(world: JobWorld) -> None:
    """The rollout of a gated model fails (a bad --max-model-len value: the engine exits); the operation failed,
    but the Deployment reads the request's token Secret, so it stays: the update that fixes the command keeps the
    token and the gated model loads. The delete removes the Secret (and only then)."""
    core = k8s.CoreV1Api(world.api)
    gated = "vllm serve meta-llama/Llama-3.1-8B-Instruct --max-model-len "
    started = world.live.post(BASE, {"name": "keeps", "command": gated + "32x", "gpus": 1,
                                     "hf_token": "hf_" + secrets.token_urlsafe(24)})
    assert started.status_code == 202, started.text
    op = world.finished(started.json()["operation"]["id"], timeout=180)
    assert op["status"] == "failed" and "32x" in op["error"]["message"], op

    def reads() -> str:
        env = k8s.AppsV1Api(world.api).read_namespaced_deployment("keeps", NS).spec.template.spec.containers[0].env
        return str(next(e for e in env if e.name == "HF_TOKEN").value_from.secret_key_ref.name)
    (kept,) = [s.metadata.name for s in core.list_namespaced_secret(
        NS, label_selector="instantstart.io/inference=keeps").items]
    assert reads() == kept

    fixed = httpx2.patch(world.live.url + f"{BASE}/keeps", json={"command": gated + "4096"},
                         headers=world.live.headers(), timeout=30)
    assert fixed.status_code == 202, fixed.text
    assert world.finished(fixed.json()["operation"]["id"], timeout=180)["status"] == "succeeded"
    assert reads() == kept and core.read_namespaced_secret(kept, NS).metadata.owner_references

    gone = httpx2.delete(world.live.url + f"{BASE}/keeps", headers=world.live.headers(), timeout=30)
    assert gone.status_code == 202, gone.text
    assert world.finished(gone.json()["operation"]["id"])["status"] == "succeeded"
    wait_until(lambda: not core.list_namespaced_secret(NS, label_selector="instantstart.io/inference=keeps").items,
               60, "the token Secret gone with its Deployment (owner reference)")
