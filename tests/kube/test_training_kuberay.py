"""The sandbox's KubeRay operator: a RayJob's RayCluster (head and workers), its submitter Job running the
entrypoint as the driver, statuses, backoffLimit retries, shutdownAfterJobFinishes and suspend."""

from __future__ import annotations

from typing import Any

from sandbox.kube import Cluster, Emulator, WriteOptions
from sandbox.kube.kuberay import CLUSTER_KEY, KEY
from tests.kube.training_support import NS, create, emulator, get, labels, log_text, pods_of, training_cluster
from tests.support import wait_until

__all__ = ["emulator"]

VERL = ("python3 -m verl.trainer.main_ppo data.train_files=/s3/data/gsm8k/train.parquet "
        "trainer.nnodes=2 trainer.n_gpus_per_node=8 trainer.total_training_steps=6")


def rayjob(name: str, entrypoint: str, step_seconds: int = 1, **spec: Any) -> dict[str, Any]:
    """``step_seconds``: simulated seconds per training step (the cluster's clock runs 400 times real time)."""
    def template(container: str) -> dict[str, Any]:
        return {"metadata": {"labels": labels(name, "verl")},
                "spec": {"containers": [{"name": container, "image": "public.ecr.aws/example/verl:1",
                                         "env": [{"name": "SANDBOX_STEP_SECONDS", "value": str(step_seconds)}],
                                         "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}

    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": name, "labels": labels(name, "verl")},
            "spec": {"entrypoint": entrypoint, "shutdownAfterJobFinishes": True, **spec,
                     "rayClusterSpec": {"rayVersion": "2.9.0",
                                        "headGroupSpec": {"rayStartParams": {"dashboard-host": "0.0.0.0"},
                                                          "template": template("ray-head")},
                                        "workerGroupSpecs": [{"groupName": "gpu", "replicas": 1, "minReplicas": 0,
                                                              "maxReplicas": 1, "rayStartParams": {},
                                                              "template": template("ray-worker")}]}}}


def status(cluster: Cluster, name: str) -> dict[str, Any]:
    return get(cluster, KEY, name).get("status") or {}


def test_rayjob_runs_the_driver_on_its_raycluster_then_shuts_it_down(emulator: Emulator) -> None:
    cluster = training_cluster(emulator, "kuberay")
    # 6 steps of 200 simulated seconds: RUNNING for about 3 s of real time, long enough to be seen
    create(cluster, "ray.io", "v1", "rayjobs", rayjob("grpo", VERL, step_seconds=200))
    wait_until(lambda: status(cluster, "grpo").get("jobStatus") == "RUNNING", timeout=60)
    rc = get(cluster, CLUSTER_KEY, "grpo-raycluster")
    assert rc["status"]["state"] == "ready" and status(cluster, "grpo")["rayClusterName"] == "grpo-raycluster"
    names = {p["metadata"]["name"]: p for p in pods_of(cluster, "grpo")}
    assert {"grpo-raycluster-head", "grpo-raycluster-gpu-worker-0"} <= set(names)
    assert names["grpo-raycluster-head"]["metadata"]["labels"]["ray.io/node-type"] == "head"
    assert names["grpo-raycluster-gpu-worker-0"]["metadata"]["labels"]["ray.io/group"] == "gpu"
    wait_until(lambda: status(cluster, "grpo").get("jobDeploymentStatus") == "Complete", timeout=60)
    final = status(cluster, "grpo")
    assert (final["jobStatus"], final["succeeded"], final["failed"]) == ("SUCCEEDED", 1, 0)
    assert final["startTime"] and final["endTime"]
    driver = next(p for p in pods_of(cluster, "grpo") if p["metadata"]["name"].startswith("grpo-")
                  and "ray.io/node-type" not in p["metadata"]["labels"])
    text = log_text(cluster, driver["metadata"]["name"], "ray-job-submitter")
    assert "step:6 - actor/pg_loss:" in text and "perf/throughput:" in text
    wait_until(lambda: cluster.store.get(CLUSTER_KEY, (NS, "grpo-raycluster")) is None, timeout=60)


def test_failed_entrypoint_is_retried_within_backoff_limit_then_fails(emulator: Emulator) -> None:
    cluster = training_cluster(emulator, "kuberay")
    create(cluster, "ray.io", "v1", "rayjobs", rayjob("typo", VERL + " trainr.save_freq=5", backoffLimit=1))
    wait_until(lambda: status(cluster, "typo").get("jobDeploymentStatus") == "Failed", timeout=60)
    final = status(cluster, "typo")
    assert (final["jobStatus"], final["failed"]) == ("FAILED", 2)
    assert final["message"].startswith("Job entrypoint command failed with exit code 1; "
                                       "the driver's log is in pod typo-")
    driver = final["message"].rsplit(" ", 1)[-1]
    assert log_text(cluster, driver, "ray-job-submitter").splitlines()[0] == "Could not override 'trainr.save_freq'."


def test_suspend_stops_the_job_and_resume_starts_over(emulator: Emulator) -> None:
    cluster = training_cluster(emulator, "kuberay")
    create(cluster, "ray.io", "v1", "rayjobs", rayjob("hold", VERL.replace("=6", "=100000")))
    wait_until(lambda: status(cluster, "hold").get("jobStatus") == "RUNNING", timeout=60)
    rt = cluster.lookup("ray.io", "v1", "rayjobs")
    cluster.patch(rt, NS, "hold", "merge", {"spec": {"suspend": True}}, WriteOptions(manager="test"))
    wait_until(lambda: status(cluster, "hold").get("jobDeploymentStatus") == "Suspended" and
               cluster.store.get(CLUSTER_KEY, (NS, "hold-raycluster")) is None, timeout=60)
    assert status(cluster, "hold")["jobStatus"] == "STOPPED"
    cluster.patch(rt, NS, "hold", "merge", {"spec": {"suspend": False}}, WriteOptions(manager="test"))
    wait_until(lambda: status(cluster, "hold").get("jobStatus") == "RUNNING", timeout=60)
