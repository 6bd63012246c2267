"""Observability and hardening of self-managed inference against a real server in sandbox mode (one seeded world
and one vLLM deployment for the module): the deployment's detail carries its engines' time to first token and
tokens/s, read from their own ``/metrics`` through the Kubernetes API's pod proxy (what the sandbox's engine
counted for the requests it answered), at most once per few seconds and for a bounded number of pods."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.aws import AwsClients
from services.clock import Clock
from services.inference.endpoint_metrics import FRESH_SECONDS, MAX_PODS, EndpointScraper, PodTarget
from services.kube import KubeClients
from tests.jobs_support import CLUSTER, JobWorld, job_world
from tests.ledger import CallLedger
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
    with job_world(folder, components=()) as made:
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
