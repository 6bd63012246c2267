"""The simulated trainer logs its recipe's metrics to the run the manifest injected, on a real MLflow
tracking server, from global rank 0 only, one batch per step: read back exactly what the trainer printed."""

from __future__ import annotations

import ast
import itertools
import re
from typing import Any

from mlflow.tracking import MlflowClient

from sandbox.kube import Cluster, Emulator
from sandbox.kube.hpto import KEY
from tests.kube.training_support import NS, TEST, conditions, create, emulator, get, labels, log_text, trainer_container
from tests.kube.training_support import training_cluster as make_cluster
from tests.support import wait_until

__all__ = ["emulator"]

TORCH_LINE = re.compile(r"\[rank0\] step (\d+)/\d+ \| loss ([\d.]+) \| lr ([\d.e+-]+) \| ([\d.]+) tokens/s \| "
                        r"([\d.]+) s/step")


def submit(cluster: Cluster, name: str, recipe: str, command: list[str], env: dict[str, str],
           config_map: str | None = None) -> None:
    """``config_map``: mounted at ``/s3/cfg`` (the training YAML a LLaMA-Factory command names)."""
    container = trainer_container(command, env)
    spec: dict[str, Any] = {"containers": [container]}
    if config_map is not None:
        container["volumeMounts"] = [{"name": "cfg", "mountPath": "/s3/cfg"}]
        spec["volumes"] = [{"name": "cfg", "configMap": {"name": config_map}}]
    template = {"metadata": {"labels": labels(name, recipe)}, "spec": spec}
    create(cluster, "sagemaker.amazonaws.com", "v1", "hyperpodpytorchjobs", {
        "apiVersion": "sagemaker.amazonaws.com/v1", "kind": "HyperPodPyTorchJob",
        "metadata": {"name": name, "labels": labels(name, recipe)},
        "spec": {"nprocPerNode": "8", "replicaSpecs": [{"name": "pods", "replicas": 2, "template": template}],
                 "runPolicy": {"cleanPodPolicy": "None"}}})


def new_run(client: MlflowClient, name: str) -> str:
    experiment = client.get_experiment_by_name("hyperpod-ns-training")
    experiment_id = experiment.experiment_id if experiment else client.create_experiment("hyperpod-ns-training")
    return str(client.create_run(experiment_id, run_name=name, tags={"instantstart.job": name}).info.run_id)


def history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_metrics_reach_the_injected_run_exactly(emulator: Emulator, mlflow_url: str) -> None:
    client = MlflowClient(tracking_uri=mlflow_url)
    cluster = make_cluster(emulator, "hyperpod-training-operator", nodes=4)
    lmf_run, torch_run = new_run(client, "lmf"), new_run(client, "torch")
    untouched = new_run(client, "untouched")
    lmf = "llamafactory-cli train /s3/cfg/sft.yaml max_steps=5 logging_steps=2"
    cluster.create(cluster.builtin("", "configmaps"), NS, {"metadata": {"name": "lmf-config"}, "data": {
        "sft.yaml": "stage: sft\ndo_train: true\nmax_steps: 50\nreport_to: mlflow\n"}}, TEST)
    submit(cluster, "lmf", "llama-factory", ["bash", "-c", lmf],
           {"MLFLOW_TRACKING_URI": mlflow_url, "MLFLOW_RUN_ID": lmf_run,
            "MLFLOW_EXPERIMENT_NAME": "hyperpod-ns-training"}, config_map="lmf-config")
    submit(cluster, "torch", "pytorch", ["hyperpodrun", "--nnodes=2", "/s3/train.py", "--max_steps", "4"],
           {"MLFLOW_TRACKING_URI": mlflow_url, "MLFLOW_RUN_ID": torch_run})
    for job in ("lmf", "torch"):
        wait_until(lambda job=job: conditions(get(cluster, KEY, job)).get("Completed") == "True", timeout=120)

    printed = [ast.literal_eval(line) for line in log_text(cluster, "lmf-pods-0").splitlines()
               if line.startswith("{'loss'")]
    assert len(printed) == 3  # logging_steps=2: steps 2, 4 and the last, 5
    for key in ("loss", "grad_norm", "learning_rate", "epoch", "num_input_tokens_seen"):
        assert history(client, lmf_run, key) == [(step, float(p[key])) for step, p in zip((2, 4, 5), printed,
                                                                                          strict=True)], key
    final: dict[str, Any] = next(ast.literal_eval(line) for line in log_text(cluster, "lmf-pods-0").splitlines()
                                 if line.startswith("{'train_runtime'"))
    for key in ("train_runtime", "train_samples_per_second", "train_steps_per_second"):
        assert history(client, lmf_run, key) == [(5, final[key])], key
    tokens = client.get_metric_history(lmf_run, "num_input_tokens_seen")
    assert all(a.timestamp <= b.timestamp for a, b in itertools.pairwise(tokens))
    assert tokens[-1].value == 5 * 4096 * 16  # 16 ranks: 2 nodes x 8 processes

    lines = [TORCH_LINE.match(line) for line in log_text(cluster, "torch-pods-0").splitlines()]
    steps = [m for m in lines if m]
    assert [int(m[1]) for m in steps] == [1, 2, 3, 4]
    assert history(client, torch_run, "loss") == [(int(m[1]), float(m[2])) for m in steps]
    assert [v for _, v in history(client, torch_run, "tokens_per_second")] == [float(m[4]) for m in steps]
    assert set(client.get_run(torch_run).data.metrics) == {"loss", "learning_rate", "grad_norm", "tokens_per_second",
                                                           "step_time_seconds"}
    assert client.get_run(untouched).data.metrics == {}
