"""Test helpers for the jobs noun: a sandbox server with a seeded, imported cluster (two nodes unless a test asks
for more) whose Kubernetes API has job CRDs and the cluster's shared-s3 volume in ``default`` (as the storage
stage makes it); the sandbox's operators (HyperPod training operator, Kubeflow, KubeRay) run what is submitted
there, their simulated trainers running the jobs' commands. Manifests a user writes, with the knobs a test needs:
how long the job trains, a flag the real launcher refuses, the sandbox's crash knob."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from sandbox.kube import load_component_crds
from tests.node_support import kube, node_cluster
from tests.sandbox_support import SeededServer
from tests.support import ROOT, LiveServer, clean_env, wait_until

CLUSTER = "hp-eks"
BASE = f"/api/v1/clusters/{CLUSTER}/jobs"
NS = "hyperpod-ns-training"
BUCKET = "instantstart-shared-test"
GROUPS = {"HyperPodPyTorchJob": ("sagemaker.amazonaws.com", "v1", "hyperpodpytorchjobs"),
          "PyTorchJob": ("kubeflow.org", "v1", "pytorchjobs"), "RayJob": ("ray.io", "v1", "rayjobs")}
TERMINAL = ("succeeded", "failed", "cancelled")


@dataclass
class JobWorld:
    server: SeededServer
    api: k8s.ApiClient

    @property
    def live(self) -> LiveServer:
        return self.server.live

    @property
    def custom(self) -> k8s.CustomObjectsApi:
        return k8s.CustomObjectsApi(self.api)

    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.api)

    def install(self, component: str) -> None:
        """The component's CRDs, as its add-on or chart would install them."""
        ext = k8s.ApiextensionsV1Api(self.api)
        for crd in load_component_crds(component):
            ext.create_custom_resource_definition(_typed(crd))

    def job(self, kind: str, name: str, namespace: str = NS) -> dict[str, Any]:
        group, version, plural = GROUPS[kind]
        found: Any = self.custom.get_namespaced_custom_object(group, version, namespace, plural, name)
        return dict(found)

    def nodes(self) -> list[str]:
        return sorted(n.metadata.name for n in self.core.list_node().items)

    def finished(self, op_id: str, timeout: float = 120) -> dict[str, Any]:
        def done() -> dict[str, Any] | None:
            view = self.live.get(f"/api/v1/operations/{op_id}", params={"wait": 20}).json()
            return dict(view) if view["status"] in TERMINAL else None
        return dict(wait_until(done, timeout, f"operation {op_id} to end"))

    def stage(self, op_id: str, name: str) -> dict[str, Any]:
        view = self.live.get(f"/api/v1/operations/{op_id}").json()
        return dict(next(s for s in view["stages"] if s["name"] == name))


def cli(world: JobWorld, *args: str) -> subprocess.CompletedProcess[str]:
    """``instantstart ARGS`` against the world's server, as an admin."""
    return subprocess.run([sys.executable, "-m", "app.cli", *args, "--url", world.live.url, "--token",
                           world.live.admin_token], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=clean_env())


def _typed(value: Any) -> Any:
    """Without the reconstructed schema's documentation keys (``x-documented-values``), which the typed client's
    model of a CRD refuses (``x-kubernetes-*`` stay)."""
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()
                if not (k.startswith("x-") and not k.startswith("x-kubernetes-"))}
    if isinstance(value, list):
        return [_typed(v) for v in value]
    return value


def default_volume(cluster: str) -> dict[str, Any]:
    """The cluster's shared-s3 PersistentVolume in ``default`` as ``services/clusters/storage_stage.py`` applies it."""
    return {"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": f"instantstart-{cluster}-shared-s3",
                         "labels": {"app.kubernetes.io/managed-by": "instantstart", "instantstart/cluster": cluster}},
            "spec": {"capacity": {"storage": "1200Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                     "persistentVolumeReclaimPolicy": "Retain",
                     "claimRef": {"namespace": "default", "name": "shared-s3"},
                     "mountOptions": ["allow-delete", "allow-other", "region us-west-2",
                                      f"prefix instantstart/{cluster}/data/"],
                     "csi": {"driver": "s3.csi.aws.com", "volumeHandle": f"instantstart-{cluster}-s3",
                             "volumeAttributes": {"bucketName": BUCKET}}}}


@contextmanager
def job_world(folder: Path, components: tuple[str, ...] = ("hyperpod-training-operator", "training-operator"),
              nodes: int = 2) -> Iterator[JobWorld]:
    with node_cluster(folder, nodes) as server:
        world = JobWorld(server, kube(server, folder))
        for component in components:
            world.install(component)
        world.core.create_persistent_volume(default_volume(CLUSTER))
        yield world


LONG = 1_000_000  # steps: at the tests' clock speed a job trains for about an hour, i.e. until the test stops it


def hppj(image: str = "public.ecr.aws/hpc/pytorch:2.5", replicas: int = 2, *, steps: int = LONG,
         launcher_flags: tuple[str, ...] = (), env: dict[str, str] | None = None, max_full_restarts: int = 1
         ) -> dict[str, Any]:
    """A HyperPodPyTorchJob a user wrote (no name or namespace: the submit request names them), training
    ``steps`` steps under ``hyperpodrun`` with ``launcher_flags``; ``env`` adds container variables (the
    sandbox's ``SANDBOX_*`` knobs)."""
    variables = {"NCCL_DEBUG": "INFO", **(env or {})}
    template = {"spec": {"containers": [{"name": "pytorch", "image": image,
                                         "command": ["hyperpodrun", f"--nnodes={replicas}", *launcher_flags, "train.py",
                                                     "--max_steps", str(steps)],
                                         "env": [{"name": k, "value": v} for k, v in variables.items()],
                                         "volumeMounts": [{"name": "shared", "mountPath": "/s3"}]}],
                         "volumes": [{"name": "shared", "persistentVolumeClaim": {"claimName": "shared-s3"}}]}}
    return {"apiVersion": "sagemaker.amazonaws.com/v1", "kind": "HyperPodPyTorchJob",
            "metadata": {"labels": {"team": "research"}},
            "spec": {"nprocPerNode": "1",
                     "replicaSpecs": [{"name": "worker", "replicas": replicas, "template": template}],
                     "runPolicy": {"jobMaxRetryCount": 5, "cleanPodPolicy": "None",
                                   "restartPolicy": {"numRestartBeforeFullJobRestart": 3, "evalPeriodSeconds": 21600,
                                                     "maxFullJobRestarts": max_full_restarts}}}}


def rayjob(overrides: tuple[str, ...] = ()) -> dict[str, Any]:
    """A RayJob running VERL's PPO trainer with Hydra ``overrides``."""
    def group(container: str) -> dict[str, Any]:
        return {"spec": {"containers": [{"name": container, "image": "rayproject/ray:2.41.0"}]}}
    return {"apiVersion": "ray.io/v1", "kind": "RayJob",
            "spec": {"entrypoint": " ".join(["python3 -m verl.trainer.main_ppo", *overrides]), "backoffLimit": 2,
                     "rayClusterSpec": {"headGroupSpec": {"rayStartParams": {}, "template": group("ray-head")},
                                        "workerGroupSpecs": [{"groupName": "gpu", "replicas": 1, "minReplicas": 1,
                                                              "maxReplicas": 1, "rayStartParams": {},
                                                              "template": group("ray-worker")}]}}}
