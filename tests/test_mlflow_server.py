"""The sandbox's MLflow tracking server is a real one: what a client logs reads back exactly."""

from __future__ import annotations

from pathlib import Path

from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from sandbox.mlflow_server import MlflowServer, healthy


def test_the_session_server_keeps_what_a_client_logs(mlflow_url: str) -> None:
    client = MlflowClient(tracking_uri=mlflow_url)
    experiment = client.create_experiment("server-check")
    run = client.create_run(experiment, run_name="r1")
    metrics = [Metric("loss", 2.0 - step / 10, 1_700_000_000_000 + step * 1000, step) for step in range(5)]
    client.log_batch(run.info.run_id, metrics=metrics)
    history = client.get_metric_history(run.info.run_id, "loss")
    assert [(m.step, m.value, m.timestamp) for m in history] == [(m.step, m.value, m.timestamp) for m in metrics]


def test_a_sandbox_uses_the_session_server_instead_of_starting_its_own(mlflow_url: str, tmp_path: Path) -> None:
    server = MlflowServer(tmp_path / "mlflow")
    assert server.url() == mlflow_url
    assert healthy(server.url())
    assert not (tmp_path / "mlflow").exists()  # nothing was started or written
    server.stop()
    assert healthy(mlflow_url)  # stopping a borrowed server leaves it running
