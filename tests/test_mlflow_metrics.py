"""The metrics reader and the live poller against a real MLflow tracking server (the ``mlflow_url`` fixture):
what each recipe logs reads back exactly, normalised; HF-Trainer throughput is derived from token deltas;
``since`` returns only new points; one poller per run publishes only new points and stops with its last
follower; an idle tick costs one MLflow call."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from services.errors import NotFound
from services.events import Event, EventBus
from services.mlflow.live import TOPIC, MetricsLive
from services.mlflow.metrics import JobRun, RunReader, run_of
from tests.support import wait_until

pytestmark = pytest.mark.slow  # the session's MLflow server takes a few seconds to start


def new_run(url: str, recipe: str) -> str:
    client = MlflowClient(url)
    name = f"ns-{uuid.uuid4().hex[:8]}"
    experiment = client.create_experiment(name)
    return str(client.create_run(experiment, run_name=f"{recipe}-job", tags={"instantstart.recipe": recipe})
               .info.run_id)


def log(url: str, run_id: str, step: int, timestamp: int, **values: float) -> None:
    MlflowClient(url).log_batch(run_id, metrics=[Metric(k.replace("__", "/"), v, timestamp, step)
                                                 for k, v in values.items()])


def job(url: str, run_id: str) -> JobRun:
    return JobRun("c1", "hyperpod-ns-training", "j1", "pytorch", url, run_id)


T0 = 1_764_000_000_000  # ms


def test_pytorch_metrics_read_back_exactly_and_since_returns_only_new_points(mlflow_url: str) -> None:
    run_id = new_run(mlflow_url, "pytorch")
    logged = [(step, 2.0 / step + 0.123456789012345, 1e-4 * step, 12345.678901 + step, 0.4123456 + step / 1000)
              for step in range(1, 21)]
    for step, loss, lr, tps, st in logged:
        log(mlflow_url, run_id, step, T0 + step * 412, loss=loss, learning_rate=lr, grad_norm=0.87,
            tokens_per_second=tps, step_time_seconds=st)
    reader = RunReader()
    read = reader.read(mlflow_url, run_id)
    assert read.sources == {"throughput": "tokens_per_second", "loss": "loss", "step_time": "step_time_seconds",
                            "learning_rate": "learning_rate"}
    assert [(p.step, p.value) for p in read.series["loss"]] == [(s, loss) for s, loss, *_ in logged]
    assert [p.value for p in read.series["throughput"]] == [tps for *_, tps, _st in logged]
    assert [p.value for p in read.series["step_time"]] == [st for *_, st in logged]
    assert [p.value for p in read.series["learning_rate"]] == [lr for _s, _l, lr, _t, _st in logged]
    assert read.series["loss"][0].timestamp == T0 + 412
    assert read.calls == 1 + 4  # GetRun, then one history per key read

    later = reader.read(mlflow_url, run_id, since=dict.fromkeys(read.series, 18))
    assert {name: [p.step for p in points] for name, points in later.series.items()} == \
        {key: [19, 20] for key in read.series}


def test_hf_trainer_throughput_is_derived_from_token_deltas(mlflow_url: str) -> None:
    run_id = new_run(mlflow_url, "llama-factory")
    # every 5 steps: 40,960 tokens in 2.5 s -> 16,384 tokens/s, 0.5 s/step; the last interval is slower
    seen = [(5, T0, 40960), (10, T0 + 2500, 81920), (15, T0 + 5000, 122880), (20, T0 + 9000, 163840)]
    for step, ts, tokens in seen:
        log(mlflow_url, run_id, step, ts, loss=1.2345 - step / 100, learning_rate=2e-05, grad_norm=0.87,
            epoch=step / 40, num_input_tokens_seen=tokens)
    log(mlflow_url, run_id, 20, T0 + 9100, train_runtime=9.1, train_samples_per_second=17.5,
        train_steps_per_second=2.2)
    read = RunReader().read(mlflow_url, run_id)
    assert read.sources["throughput"] == read.sources["step_time"] == "derived from num_input_tokens_seen deltas"
    assert [(p.step, p.value) for p in read.series["throughput"]] == [(10, 16384.0), (15, 16384.0),
                                                                       (20, 40960 / 4.0)]
    assert [(p.step, p.value) for p in read.series["step_time"]] == [(10, 0.5), (15, 0.5), (20, 0.8)]
    assert [p.value for p in read.series["loss"]] == [1.2345 - s / 100 for s, _, _ in seen]
    assert "train_runtime" in read.keys


def test_verl_names_are_normalised(mlflow_url: str) -> None:
    run_id = new_run(mlflow_url, "verl")
    for step in (1, 2, 3):
        log(mlflow_url, run_id, step, T0 + step * 1000, actor__pg_loss=-0.01 * step, actor__lr=1e-6,
            perf__throughput=850.5 + step, timing_s__step=31.2, critic__score__mean=0.3)
    read = RunReader().read(mlflow_url, run_id)
    assert read.sources == {"throughput": "perf/throughput", "loss": "actor/pg_loss", "step_time": "timing_s/step",
                            "learning_rate": "actor/lr"}
    assert [p.value for p in read.series["throughput"]] == [851.5, 852.5, 853.5]
    assert [p.value for p in read.series["loss"]] == [-0.01, -0.02, -0.03]


def test_an_unknown_run_is_not_found(mlflow_url: str) -> None:
    with pytest.raises(NotFound):
        RunReader().read(mlflow_url, uuid.uuid4().hex)


def test_the_run_is_named_by_the_first_container_of_the_pod_templates() -> None:
    def container(env: dict[str, str]) -> dict[str, Any]:
        return {"name": "pytorch", "image": "x", "env": [{"name": k, "value": v} for k, v in env.items()]}

    ray = {"metadata": {"name": "r1", "namespace": "ns", "labels": {"instantstart.io/recipe": "verl"}},
           "spec": {"entrypoint": "python main.py", "rayClusterSpec": {
               "headGroupSpec": {"template": {"spec": {"containers": [
                   container({"MLFLOW_TRACKING_URI": "arn:aws:sagemaker:us-west-2:1:mlflow-tracking-server/c-mlflow",
                              "MLFLOW_RUN_ID": "abc"}), container({"MLFLOW_RUN_ID": "sidecar"})]}}},
               "workerGroupSpecs": [{"template": {"spec": {"containers": [container({})]}}}]}}}
    run = run_of(ray, "c")
    assert (run.job, run.namespace, run.recipe, run.run_id) == ("r1", "ns", "verl", "abc")
    assert run.tracking_uri.startswith("arn:aws:sagemaker:")
    bare = {"metadata": {"name": "p1", "namespace": "ns"}, "spec": {"replicaSpecs": [
        {"name": "pod", "template": {"spec": {"containers": [container({"OTHER": "1"})]}}}]}}
    with pytest.raises(NotFound, match="submitted without a tracking server"):
        run_of(bare, "c")


@pytest.fixture
def bus() -> Iterator[EventBus]:
    yield EventBus()


def collect(bus: EventBus) -> list[Event]:
    seen: list[Event] = []
    bus.subscribe(seen.append, topic=TOPIC)
    return seen


def test_one_poller_per_run_publishes_only_new_points_and_stops_with_its_last_follower(
        mlflow_url: str, bus: EventBus) -> None:
    run_id = new_run(mlflow_url, "pytorch")
    for step in (1, 2):
        log(mlflow_url, run_id, step, T0 + step, loss=3.0 - step, tokens_per_second=1000.0 + step)
    seen = collect(bus)
    live = MetricsLive(RunReader(), bus, interval=3600)  # one tick at start; the test ticks by hand after that
    run = job(mlflow_url, run_id)
    first, second = live.follow(run), live.follow(run)
    poller = live.poller(run)
    assert poller is not None and live.pollers() == 1 and poller.followers == 2

    def published() -> int:  # the poller counts its points before it publishes them: wait for the event too
        bus.drain()
        return poller.published if seen else 0

    wait_until(lambda: published() == 4, 30, "the first tick to publish the 4 points logged before")
    assert [e.data["series"]["loss"] for e in seen] == [[{"step": 1, "value": 2.0, "timestamp": T0 + 1},
                                                         {"step": 2, "value": 1.0, "timestamp": T0 + 2}]]
    assert seen[0].data["job"] == "j1" and seen[0].data["run"] == run.key

    calls = poller.calls
    assert poller.tick() == 0 and poller.calls == calls + 1  # nothing new: one GetRun, no history read
    log(mlflow_url, run_id, 3, T0 + 3, loss=0.5, tokens_per_second=1003.5)
    assert poller.tick() == 2 and poller.calls == calls + 1 + 3
    bus.drain()
    assert seen[-1].data["series"] == {"loss": [{"step": 3, "value": 0.5, "timestamp": T0 + 3}],
                                       "throughput": [{"step": 3, "value": 1003.5, "timestamp": T0 + 3}]}
    assert len(seen) == 2

    first.close()
    first.close()  # idempotent: still one follower
    assert live.poller(run) is poller and not poller._stop.is_set()
    second.close()
    assert live.pollers() == 0
    wait_until(lambda: not poller.alive, 30, "the poller thread to end with its last follower")
    assert live.calls == poller.calls


def test_a_point_logged_arrives_from_a_running_poller(mlflow_url: str, bus: EventBus) -> None:
    run_id = new_run(mlflow_url, "pytorch")
    seen = collect(bus)
    live = MetricsLive(RunReader(), bus, interval=0.2)
    follow = live.follow(job(mlflow_url, run_id))
    try:
        now = int(time.time() * 1000)
        MlflowClient(mlflow_url).log_metric(run_id, "loss", 0.25, timestamp=now, step=7)
        event = wait_until(lambda: bus.drain() and seen and seen[-1], 30, "the pushed point")
        assert event.data["series"] == {"loss": [{"step": 7, "value": 0.25, "timestamp": now}]}
    finally:
        follow.close()


def test_a_sagemaker_arn_reads_through_the_plugin(mlflow_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real path: the tracking URI is the server's ARN; ``sagemaker-mlflow`` signs and routes from the
    process-wide tracking URI, and honours ``SAGEMAKER_MLFLOW_CUSTOM_ENDPOINT`` (here: the sandbox server)."""
    import mlflow

    monkeypatch.setenv("SAGEMAKER_MLFLOW_CUSTOM_ENDPOINT", mlflow_url)
    for key, value in {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "not-a-secret",
                       "AWS_DEFAULT_REGION": "us-west-2"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run_id = new_run(mlflow_url, "pytorch")
    log(mlflow_url, run_id, 1, T0, loss=1.5, tokens_per_second=900.25)
    arn = "arn:aws:sagemaker:us-west-2:123456789012:mlflow-tracking-server/c1-mlflow"
    read = RunReader().read(arn, run_id)
    assert [p.value for p in read.series["loss"]] == [1.5] and read.series["throughput"][0].value == 900.25
    assert not mlflow.tracking.is_tracking_uri_set()  # the process-wide URI is left as it was
