"""LLaMA-Factory's training YAML as its pods see it: the kubelet mounts the ConfigMap (a pod whose ConfigMap does
not exist yet waits with a ``FailedMount`` warning and starts once it does), and the simulated
``llamafactory-cli`` reads the YAML through the mount, merges the command's ``key=value`` overrides over it and
refuses an unknown key as ``HfArgumentParser.parse_dict`` does."""

from __future__ import annotations

from typing import Any

import yaml

from sandbox.kube import Cluster, Emulator
from tests.kube.training_support import NS, TEST, emulator, get, log_text, trainer_container, training_cluster
from tests.support import wait_until

__all__ = ["emulator"]
CONFIG = {"model_name_or_path": "/s3/models/Qwen--Qwen3-0.6B", "stage": "sft", "do_train": True,
          "finetuning_type": "lora", "dataset": "alpaca_en_demo", "template": "qwen3",
          "output_dir": "/s3/jobs/lf/checkpoints", "max_steps": 3, "logging_steps": 1}


def config_map(cluster: Cluster, name: str, config: dict[str, Any]) -> None:
    body = {"metadata": {"name": name}, "data": {"train.yaml": yaml.safe_dump(config)}}
    cluster.create(cluster.builtin("", "configmaps"), NS, body, TEST)


def pod(cluster: Cluster, name: str, config: str, *overrides: str, sub_path: bool = False) -> None:
    """``sub_path``: the file alone mounted at ``/config/train.yaml`` (``subPath: train.yaml``)."""
    mount = {"name": "config", "mountPath": "/config/train.yaml", "subPath": "train.yaml"} if sub_path else \
        {"name": "config", "mountPath": "/config"}
    container = {**trainer_container(["llamafactory-cli", "train", "/config/train.yaml", *overrides]),
                 "volumeMounts": [mount]}
    body = {"metadata": {"name": name}, "spec": {"restartPolicy": "Never", "containers": [container],
                                                  "volumes": [{"name": "config", "configMap": {"name": config}}]}}
    cluster.create(cluster.builtin("", "pods"), NS, body, TEST)


def phase(cluster: Cluster, name: str) -> str:
    return str((get(cluster, ("", "pods"), name).get("status") or {}).get("phase", "Pending"))


def events(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    return [e for _, e in cluster.store.items(("", "events"), NS) if e["involvedObject"]["name"] == name]


def test_the_yaml_and_its_overrides_run_and_steps_come_from_them(emulator: Emulator) -> None:
    cluster = training_cluster(emulator)
    config_map(cluster, "lf-config", CONFIG)
    pod(cluster, "lf", "lf-config", "max_steps=2")
    wait_until(lambda: phase(cluster, "lf") == "Succeeded", timeout=60)
    text = log_text(cluster, "lf")
    assert "Total optimization steps = 2" in text and "Training completed: 2 steps" in text, text[-1500:]
    pod(cluster, "lf-file", "lf-config", sub_path=True)
    wait_until(lambda: phase(cluster, "lf-file") == "Succeeded", timeout=60)
    assert "Training completed: 3 steps" in log_text(cluster, "lf-file")


def test_an_unknown_key_in_the_yaml_fails_as_the_argument_parser_does(emulator: Emulator) -> None:
    cluster = training_cluster(emulator)
    config_map(cluster, "lf-bad", {**CONFIG, "learning_rat": 1e-4})
    pod(cluster, "lf-bad", "lf-bad")
    wait_until(lambda: phase(cluster, "lf-bad") == "Failed", timeout=60)
    assert "ValueError: Some keys are not used by the HfArgumentParser: ['learning_rat']" in \
        log_text(cluster, "lf-bad")


def test_a_pod_waits_for_its_config_map_then_starts(emulator: Emulator) -> None:
    cluster = training_cluster(emulator)
    pod(cluster, "lf-wait", "lf-later")
    warning = wait_until(lambda: next((e for e in events(cluster, "lf-wait") if e["reason"] == "FailedMount"), None),
                         timeout=60)
    assert warning["type"] == "Warning" and warning["source"]["component"] == "kubelet"
    assert warning["message"] == 'MountVolume.SetUp failed for volume "config" : configmap "lf-later" not found'
    assert phase(cluster, "lf-wait") == "Pending" and log_text(cluster, "lf-wait") == ""
    config_map(cluster, "lf-later", CONFIG)
    wait_until(lambda: phase(cluster, "lf-wait") == "Succeeded", timeout=60)
    assert "Training completed: 3 steps" in log_text(cluster, "lf-wait")  # max_steps from the YAML
