"""Test helpers: Nodes as a kubelet registers them, written through the emulator's in-process API."""

from __future__ import annotations

from typing import Any

from sandbox.kube import Cluster, WriteOptions


def add_node(cluster: Cluster, name: str, *, cpu: str = "4", memory: str = "16Gi", gpu: int = 0,
             labels: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None,
             ready: bool = True) -> dict[str, Any]:
    allocatable = {"cpu": cpu, "memory": memory, "pods": "110"}
    if gpu:
        allocatable["nvidia.com/gpu"] = str(gpu)
    body = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            "spec": {"taints": taints or []},
            "status": {"capacity": allocatable, "allocatable": allocatable,
                       "addresses": [{"type": "InternalIP", "address": "10.0.0.7"}],
                       "conditions": [{"type": "Ready", "status": "True" if ready else "Unknown",
                                       "reason": "KubeletReady"}]}}
    return cluster.create(cluster.builtin("", "nodes"), None, body, WriteOptions(manager="kubelet")).obj


def set_taints(cluster: Cluster, name: str, taints: list[dict[str, str]]) -> None:
    cluster.patch(cluster.builtin("", "nodes"), None, name, "merge", {"spec": {"taints": taints}},
                  WriteOptions(manager="test"))
