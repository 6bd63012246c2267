"""Job metrics through every face, against a sandbox cluster and the real MLflow server: the run is found
through the job's custom resource (env injected into its pod template), REST answers the logged values
exactly and only new points after ``since``, compares runs, refuses unknown jobs and jobs without a run; a
real MCP client reads the same; the live pane (no browser) streams new points into its Buffers; ``latest``
gives the digest ``jobs watch`` prints."""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import panel as pn
import pytest
from kubernetes import client as k8s
from mcp import Client, StdioServerParameters
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from app.bootstrap import Services
from panels.metrics import ComparePane, MetricsPane
from sandbox.kube import load_component_crds
from services.auth import Principal, Role
from services.mlflow.metrics import DEFAULT_NAMESPACE
from tests.node_support import kube, node_cluster
from tests.sandbox_support import SeededServer
from tests.support import ROOT, clean_env, wait_until

pytestmark = pytest.mark.slow
VIEWER = Principal("metrics-viewer", Role.VIEWER, "t-view", "api")
T0 = 1_764_000_000_000


def pytorchjob(name: str, env: dict[str, str]) -> dict[str, Any]:
    """A job naming its run, suspended: the sandbox's Kubeflow operator makes no pods for it, so no simulated
    trainer logs into the run and the test alone decides what the run holds."""
    labels = {"app.kubernetes.io/managed-by": "instantstart", "instantstart.io/job": name,
              "instantstart.io/recipe": "pytorch"}
    container = {"name": "pytorch", "image": "public.ecr.aws/docker/library/python:3.11",
                 "command": ["torchrun", "train.py"], "env": [{"name": k, "value": v} for k, v in env.items()]}
    template = {"metadata": {"labels": labels}, "spec": {"containers": [container]}}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": name, "namespace": DEFAULT_NAMESPACE, "labels": labels},
            "spec": {"runPolicy": {"suspend": True},
                     "pytorchReplicaSpecs": {"Master": {"replicas": 1, "restartPolicy": "OnFailure",
                                                        "template": template}}}}


class World:
    def __init__(self, seeded: SeededServer, services: Services, url: str, runs: dict[str, str]) -> None:
        self.seeded, self.services, self.url, self.runs = seeded, services, url, runs

    def log(self, job: str, step: int, loss: float, tps: float, timestamp: int | None = None) -> None:
        MlflowClient(self.url).log_batch(self.runs[job], metrics=[
            Metric("loss", loss, timestamp or T0 + step, step), Metric("tokens_per_second", tps, timestamp or T0 + step,
                                                                       step)])


@contextmanager
def metrics_world(folder: Path, mlflow_url: str) -> Iterator[World]:
    """A sandbox server with cluster ``hp-eks`` imported, the Kubeflow CRD, and PyTorchJobs ``run-a``/``run-b``
    naming MLflow runs with 5 steps logged (and ``no-run`` naming none); plus the product in-process."""
    with node_cluster(folder, 1) as seeded:
        api = kube(seeded, folder)
        crds = k8s.ApiextensionsV1Api(api)
        for crd in load_component_crds("training-operator"):  # as `kubectl apply` would, if not there yet
            try:
                crds.create_custom_resource_definition(crd)
            except k8s.ApiException as exc:
                assert exc.status == 409, exc
        try:
            k8s.CoreV1Api(api).create_namespace({"metadata": {"name": DEFAULT_NAMESPACE}})
        except k8s.ApiException as exc:
            assert exc.status == 409, exc
        client = MlflowClient(mlflow_url)
        experiment = client.create_experiment(f"{DEFAULT_NAMESPACE}-{uuid.uuid4().hex[:6]}")
        runs = {}
        objects = k8s.CustomObjectsApi(api)
        for job in ("run-a", "run-b"):
            runs[job] = client.create_run(experiment, run_name=job).info.run_id
            objects.create_namespaced_custom_object("kubeflow.org", "v1", DEFAULT_NAMESPACE, "pytorchjobs",
                                                    pytorchjob(job, {"MLFLOW_TRACKING_URI": mlflow_url,
                                                                     "MLFLOW_RUN_ID": runs[job],
                                                                     "MLFLOW_EXPERIMENT_NAME": DEFAULT_NAMESPACE}))
        objects.create_namespaced_custom_object("kubeflow.org", "v1", DEFAULT_NAMESPACE, "pytorchjobs",
                                                pytorchjob("no-run", {}))
        with seeded.imported(folder / "product" / "data", "hp-eks", Principal(
                "metrics-admin", Role.ADMIN, "t-adm", "api")) as services:
            world = World(seeded, services, mlflow_url, runs)
            for step in range(1, 6):
                world.log("run-a", step, 2.5 / step, 10_000.0 + step * 0.125)
                world.log("run-b", step, 3.5 / step, 8_000.0 + step)
            yield world


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, mlflow_url: str) -> Iterator[World]:
    with metrics_world(tmp_path_factory.mktemp("metrics-faces"), mlflow_url) as made:
        yield made


def test_rest_answers_the_logged_values_exactly_and_only_new_points(world: World) -> None:
    live = world.seeded.live
    got = live.get("/api/v1/clusters/hp-eks/jobs/run-a/metrics")
    assert got.status_code == 200, got.text
    body = got.json()
    assert body["run_id"] == world.runs["run-a"] and body["recipe"] == "pytorch" and body["cursor"] == 5
    series = {s["name"]: s for s in body["series"]}
    assert [(p["step"], p["value"]) for p in series["loss"]["points"]] == [(s, 2.5 / s) for s in range(1, 6)]
    assert [p["value"] for p in series["throughput"]["points"]] == [10_000.0 + s * 0.125 for s in range(1, 6)]
    assert series["throughput"]["source"] == "tokens_per_second" and series["throughput"]["unit"] == "tokens/s"

    newer = live.get("/api/v1/clusters/hp-eks/jobs/run-a/metrics?since=4").json()
    assert {s["name"]: [p["step"] for p in s["points"]] for s in newer["series"]} == \
        {"loss": [5], "throughput": [5]}

    compared = live.get("/api/v1/clusters/hp-eks/metrics/compare?jobs=run-a,run-b&points=false")
    assert compared.status_code == 200, compared.text
    assert [(j["job"], j["last"]["loss"]) for j in compared.json()["jobs"]] == [("run-a", 0.5), ("run-b", 0.7)]

    missing = live.get("/api/v1/clusters/hp-eks/jobs/nope/metrics")
    assert missing.status_code == 404 and "no training job 'nope'" in missing.json()["error"]["message"]
    bare = live.get("/api/v1/clusters/hp-eks/jobs/no-run/metrics")
    assert bare.status_code == 404 and "without a tracking server" in bare.json()["error"]["message"]
    assert live.get("/api/v1/clusters/hp-eks/metrics/compare?jobs=").status_code == 422


def test_a_real_mcp_client_reads_the_metrics(world: World) -> None:
    async def main() -> dict[str, Any]:
        params = StdioServerParameters(command=sys.executable,
                                       args=["-m", "app.cli", "mcp", "--url", world.seeded.live.url,
                                             "--toolsets", "metrics"],
                                       env={**clean_env(), "INSTANTSTART_TOKEN": world.seeded.live.admin_token},
                                       cwd=str(ROOT))
        async with Client(params) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert {"metrics_get", "metrics_compare"} <= set(tools)
            hints = tools["metrics_get"].annotations
            assert hints is not None and hints.read_only_hint is True
            result = await client.call_tool("metrics_get", {"cluster": "hp-eks", "job": "run-b", "since": 3})
            text = "".join(getattr(c, "text", "") for c in result.content)
            assert not result.is_error, text
            return dict(result.structured_content or json.loads(text))

    answer = anyio.run(main)
    series = {s["name"]: s["points"] for s in answer["series"]}
    assert [(p["step"], p["value"]) for p in series["loss"]] == [(4, 3.5 / 4), (5, 3.5 / 5)]


def test_the_live_pane_streams_new_points_into_its_buffers(world: World) -> None:
    services = world.services
    pane = MetricsPane(services.training_metrics, services.metrics_live, services.bus, VIEWER,
                       cluster="hp-eks", job="run-b")
    pn.panel(pane).get_root()  # renders alone, as in a notebook
    assert pane.state.message.startswith("run-b: MLflow run"), pane.state.message
    loss = pane.buffers["loss"]
    assert list(loss.data["step"]) == [1, 2, 3, 4, 5] and list(loss.data["value"]) == [3.5 / s for s in range(1, 6)]
    poller = services.metrics_live.poller(pane.run)  # type: ignore[arg-type]
    assert poller is not None and poller.followers == 1

    now = int(time.time() * 1000)
    world.log("run-b", 6, 0.42, 8_123.5, timestamp=now)

    throughput = pane.buffers["throughput"]

    def arrived() -> bool:  # the server may show one metric of the batch a poll before the other
        services.bus.drain()
        return list(loss.data["step"])[-1] == 6 and list(throughput.data["step"])[-1] == 6

    wait_until(arrived, 30, "the new point in the loss and throughput Buffers")
    assert list(loss.data["step"]) == [1, 2, 3, 4, 5, 6]  # the earlier points were not sent again
    assert list(throughput.data["step"]) == [1, 2, 3, 4, 5, 6]
    assert list(throughput.data["value"])[-1] == 8_123.5
    pane.state.job = "run-a"  # another job: the first run's poller stops, the chart restarts
    assert services.metrics_live.poller(poller.run) is None
    assert list(loss.data["value"]) == [2.5 / s for s in range(1, 6)]
    pane.close()
    assert services.metrics_live.pollers() == 0


def test_compare_pane_and_latest_digest(world: World) -> None:
    services = world.services
    pane = ComparePane(services.training_metrics, VIEWER, cluster="hp-eks", jobs="run-a,run-b")
    pn.panel(pane).get_root()
    assert list(pane.table.value["job"]) == ["run-a", "run-b"] and len(pane.plots.objects) == 2
    digest = services.training_metrics.latest(VIEWER, "hp-eks", "run-a")
    assert (digest.step, digest.loss, digest.tokens_per_second) == (5, 0.5, 10_000.625)
    assert digest.run_status == "RUNNING" and digest.timestamp == T0 + 5
