"""Device plugins gate what a node advertises (``Emulator(device_plugins=True)``): a GPU node's
``nvidia.com/gpu`` and ``vpc.amazonaws.com/efa`` appear only once their plugin DaemonSet's pod runs on it,
so a GPU pod stays unschedulable until then, and go again with the plugin."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sandbox.kube import Cluster, Emulator, WriteOptions
from sandbox.kube.deletion import delete
from tests.support import wait_until

from .nodes import add_node


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    emulator = Emulator(device_plugins=True)
    yield emulator.ensure_cluster("gpu")
    emulator.close()


def _allocatable(cluster: Cluster, node: str) -> dict[str, str]:
    found: dict[str, str] = cluster.get(cluster.builtin("", "nodes"), None, node)["status"]["allocatable"]
    return found


def _plugin(name: str, image: str) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": {"name": name}}, "template": {
                "metadata": {"labels": {"name": name}},
                "spec": {"containers": [{"name": "plugin", "image": image}]}}}}


def test_gpus_appear_only_where_the_device_plugin_runs(cluster: Cluster) -> None:
    node = add_node(cluster, "p5", gpu=8)
    cluster.patch(cluster.builtin("", "nodes"), None, "p5", "merge", {"status": {
        "capacity": {"vpc.amazonaws.com/efa": "32"}, "allocatable": {"vpc.amazonaws.com/efa": "32"}}},
        WriteOptions(manager="kubelet"), subresource="status")
    assert "nvidia.com/gpu" not in node["status"]["allocatable"]
    assert "vpc.amazonaws.com/efa" not in _allocatable(cluster, "p5")
    pods = cluster.builtin("", "pods")
    cluster.create(pods, "default", {"metadata": {"name": "train"}, "spec": {"containers": [
        {"name": "m", "image": "pytorch:2", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}})
    wait_until(lambda: "1 Insufficient nvidia.com/gpu" in next(
        c["message"] for c in cluster.get(pods, "default", "train")["status"].get("conditions", [])
        if c["type"] == "PodScheduled"))
    daemonsets = cluster.builtin("apps", "daemonsets")
    cluster.create(daemonsets, "kube-system", _plugin("nvidia-device-plugin",
                                                      "nvcr.io/nvidia/k8s-device-plugin:v0.16.1"))
    wait_until(lambda: _allocatable(cluster, "p5").get("nvidia.com/gpu") == "8", message="the GPUs advertised")
    assert "vpc.amazonaws.com/efa" not in _allocatable(cluster, "p5")  # its own plugin is not there yet
    wait_until(lambda: cluster.get(pods, "default", "train")["status"]["phase"] == "Running")
    cluster.create(daemonsets, "kube-system", _plugin(
        "efa", "602401143452.dkr.ecr.us-west-2.amazonaws.com/eks/aws-efa-k8s-device-plugin:v0.5.20"))
    wait_until(lambda: _allocatable(cluster, "p5").get("vpc.amazonaws.com/efa") == "32")
    delete(cluster, daemonsets, "kube-system", "nvidia-device-plugin")
    wait_until(lambda: "nvidia.com/gpu" not in _allocatable(cluster, "p5"), message="the GPUs withdrawn")


def test_without_the_gate_nodes_advertise_what_they_are_written_with() -> None:
    emulator = Emulator()
    try:
        cluster = emulator.ensure_cluster("plain")
        assert add_node(cluster, "p5", gpu=8)["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    finally:
        emulator.close()
