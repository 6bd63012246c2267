"""Helpers for the training-operator tests: an in-process emulator on a fast clock, nodes, job manifests."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

import pytest

from sandbox.kube import Cluster, Emulator, WriteOptions
from sandbox.kube.components import install_component_crds
from sandbox.kube.resources import POD_KEY
from tests.kube.nodes import add_node

SPEED = 400.0  # simulated seconds per real second
NS = "hyperpod-ns-training"
TEST = WriteOptions(manager="test")
_names = itertools.count()


class FastClock:
    """Wall time sped up SPEED times, as the sandbox's sped-up clock runs."""

    def __init__(self) -> None:
        self.origin = time.time()

    def __call__(self) -> float:
        return self.origin + (time.time() - self.origin) * SPEED


@pytest.fixture
def emulator() -> Iterator[Emulator]:
    emu = Emulator(None, clock=FastClock())
    yield emu
    emu.close()


def training_cluster(emulator: Emulator, *components: str, nodes: int = 2) -> Cluster:
    cluster = emulator.ensure_cluster(f"train-{next(_names)}")
    for component in components:
        install_component_crds(cluster, component)
    cluster.create(cluster.builtin("", "namespaces"), None, {"metadata": {"name": NS}}, TEST)
    for i in range(nodes):
        add_node(cluster, f"hyperpod-i-{i:04d}", cpu="32", memory="128Gi", gpu=8,
                 labels={"sagemaker.amazonaws.com/node-health-status": "Schedulable"})
    return cluster


def trainer_container(command: list[str], env: dict[str, str] | None = None, name: str = "pytorch") -> dict[str, Any]:
    return {"name": name, "image": "public.ecr.aws/example/train:1", "command": command,
            "env": [{"name": k, "value": v} for k, v in {"SANDBOX_STEP_SECONDS": "1", **(env or {})}.items()],
            "resources": {"limits": {"nvidia.com/gpu": "8"}, "requests": {"nvidia.com/gpu": "8"}}}


def labels(job: str, recipe: str = "pytorch") -> dict[str, str]:
    return {"app.kubernetes.io/managed-by": "instantstart", "instantstart.io/job": job,
            "instantstart.io/recipe": recipe}


def create(cluster: Cluster, group: str, version: str, plural: str, body: dict[str, Any]) -> dict[str, Any]:
    return cluster.create(cluster.lookup(group, version, plural), NS, body, TEST).obj


def get(cluster: Cluster, key: tuple[str, str], name: str) -> dict[str, Any]:
    obj = cluster.store.get(key, (NS, name))
    assert obj is not None, name
    return obj


def pods_of(cluster: Cluster, job: str) -> list[dict[str, Any]]:
    return [p for _, p in cluster.store.items(POD_KEY, NS)
            if (p["metadata"].get("labels") or {}).get("instantstart.io/job") == job]


def conditions(obj: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in (obj.get("status") or {}).get("conditions") or []}


def log_text(cluster: Cluster, pod: str, container: str = "pytorch", previous: bool = False) -> str:
    return "\n".join(line.text for line in cluster.logs.read((NS, pod, container), previous=previous))
