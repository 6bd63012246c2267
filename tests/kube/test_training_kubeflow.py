"""The sandbox's Kubeflow PyTorchJob operator: master/worker pods, conditions and replicaStatuses, in-place
restarts by the kubelet, HyperPod auto-resume on node faults within job-max-retry-count, suspend."""

from __future__ import annotations

from typing import Any

from sandbox.kube import Cluster, Emulator, WriteOptions
from sandbox.kube.kubeflow import KEY
from sandbox.kube.operator_support import events_of
from tests.kube.training_support import (
    NS,
    conditions,
    create,
    emulator,
    get,
    labels,
    log_text,
    pods_of,
    trainer_container,
    training_cluster,
)
from tests.support import wait_until

__all__ = ["emulator"]

OPERATOR = "training-operator"


def ptj(name: str, command: list[str], *, workers: int = 1, env: dict[str, str] | None = None,
        restart: str = "OnFailure", annotations: dict[str, str] | None = None,
        run_policy: dict[str, Any] | None = None) -> dict[str, Any]:
    def replica(count: int) -> dict[str, Any]:
        return {"replicas": count, "restartPolicy": restart,
                "template": {"metadata": {"labels": labels(name)},
                             "spec": {"containers": [trainer_container(command, env)]}}}

    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": name, "labels": labels(name), "annotations": annotations or {}},
            "spec": {"nprocPerNode": "8", "pytorchReplicaSpecs": {"Master": replica(1), "Worker": replica(workers)},
                     "runPolicy": run_policy or {}}}


def torchrun(steps: int, *extra: str) -> list[str]:
    return ["torchrun", *extra, "/s3/train.py", "--max_steps", str(steps)]


def job(cluster: Cluster, name: str) -> dict[str, Any]:
    return get(cluster, KEY, name)


def submit(cluster: Cluster, body: dict[str, Any]) -> None:
    create(cluster, "kubeflow.org", "v1", "pytorchjobs", body)


def test_pytorchjob_runs_master_and_workers_to_success(emulator: Emulator) -> None:
    cluster = training_cluster(emulator, OPERATOR, nodes=3)
    submit(cluster, ptj("ddp", torchrun(6), workers=2))
    wait_until(lambda: conditions(job(cluster, "ddp")).get("Succeeded") == "True", timeout=60)
    assert conditions(job(cluster, "ddp"))["Created"] == "True"
    wait_until(lambda: job(cluster, "ddp")["status"]["replicaStatuses"]["Worker"].get("succeeded") == 2, timeout=60)
    status = job(cluster, "ddp")["status"]
    assert status["replicaStatuses"]["Master"]["succeeded"] == 1 and status["completionTime"]
    pods = {p["metadata"]["name"]: p for p in pods_of(cluster, "ddp")}
    assert set(pods) == {"ddp-master-0", "ddp-worker-0", "ddp-worker-1"}
    worker = pods["ddp-worker-1"]
    assert worker["metadata"]["labels"]["training.kubeflow.org/replica-type"] == "worker"
    assert worker["metadata"]["labels"]["training.kubeflow.org/replica-index"] == "1"
    env = {e["name"]: e["value"] for e in worker["spec"]["containers"][0]["env"]}
    assert (env["RANK"], env["WORLD_SIZE"], env["MASTER_ADDR"], env["PET_NPROC_PER_NODE"]) == \
        ("2", "3", "ddp-master-0", "8")
    assert "[rank16] step 6/6" in log_text(cluster, "ddp-worker-1")  # node rank 2 x 8 processes


def test_failed_container_restarts_in_place_then_backoff_limit_fails_the_job(emulator: Emulator) -> None:
    cluster = training_cluster(emulator, OPERATOR)
    submit(cluster, ptj("crashy", torchrun(5), workers=0, env={"SANDBOX_FAIL_AT_STEP": "2"},
                        run_policy={"backoffLimit": 2}))
    wait_until(lambda: conditions(job(cluster, "crashy")).get("Failed") == "True", timeout=60)
    master = get(cluster, ("", "pods"), "crashy-master-0")
    container = master["status"]["containerStatuses"][0]
    assert container["restartCount"] == 2
    assert container["lastState"]["terminated"]["exitCode"] == 1
    assert "RuntimeError: CUDA error" in log_text(cluster, "crashy-master-0", previous=True)
    failed = next(c for c in job(cluster, "crashy")["status"]["conditions"] if c["type"] == "Failed")
    assert failed["message"] == "PyTorchJob crashy has failed because it has reached the specified backoff limit"


def test_unknown_flag_fails_a_never_restarting_job(emulator: Emulator) -> None:
    cluster = training_cluster(emulator, OPERATOR)
    submit(cluster, ptj("typo", torchrun(5, "--nnode=1", "--rdzv-bogus=x"), workers=0, restart="Never"))
    wait_until(lambda: conditions(job(cluster, "typo")).get("Failed") == "True", timeout=60)
    state = get(cluster, ("", "pods"), "typo-master-0")["status"]["containerStatuses"][0]["state"]
    assert state["terminated"]["exitCode"] == 2
    assert log_text(cluster, "typo-master-0").splitlines()[-1] == \
        "torchrun: error: unrecognized arguments: --rdzv-bogus=x"


def test_auto_resume_restarts_on_node_faults_up_to_the_retry_count(emulator: Emulator) -> None:
    cluster = training_cluster(emulator, OPERATOR, nodes=3)
    submit(cluster, ptj("resume", torchrun(100000), workers=0, annotations={
        "sagemaker.amazonaws.com/enable-job-auto-resume": "true", "sagemaker.amazonaws.com/job-max-retry-count": "1"}))
    lost = {"status": {"conditions": [{"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}]}}

    def master() -> dict[str, Any]:
        return get(cluster, ("", "pods"), "resume-master-0")

    for round_ in (1, 2):
        wait_until(lambda: conditions(job(cluster, "resume")).get("Running") == "True" and
                   master()["status"].get("phase") == "Running", timeout=60)
        node = master()["spec"]["nodeName"]
        cluster.patch(cluster.builtin("", "nodes"), None, node, "merge", lost, WriteOptions(manager="node-controller"),
                      "status")
        if round_ == 1:
            wait_until(lambda bad=node: master()["spec"].get("nodeName") not in (None, bad), timeout=60)
            annotations = job(cluster, "resume")["metadata"]["annotations"]
            assert annotations["sandbox.instantstart.io/auto-resume-count"] == "1"
    # the operator writes the Failed condition, then the second NodeFault event (no auto-resume left): wait for both
    wait_until(lambda: conditions(job(cluster, "resume")).get("Failed") == "True" and [
        e["reason"] for e in events_of(cluster, job(cluster, "resume"))].count("NodeFault") == 2, timeout=60,
               message="Failed, with the second NodeFault event")
    failed = next(c for c in job(cluster, "resume")["status"]["conditions"] if c["type"] == "Failed")
    assert failed["message"].startswith("job-max-retry-count (1) exhausted after 1 auto-resumes: pod resume-master-0:")


def test_suspend_and_resume(emulator: Emulator) -> None:
    cluster = training_cluster(emulator, OPERATOR)
    submit(cluster, ptj("hold", torchrun(100000)))
    wait_until(lambda: conditions(job(cluster, "hold")).get("Running") == "True", timeout=60)
    rt = cluster.lookup("kubeflow.org", "v1", "pytorchjobs")
    cluster.patch(rt, NS, "hold", "merge", {"spec": {"runPolicy": {"suspend": True}}}, WriteOptions(manager="test"))
    wait_until(lambda: not pods_of(cluster, "hold") and conditions(job(cluster, "hold")).get("Suspended") == "True",
               timeout=60)
    cluster.patch(rt, NS, "hold", "merge", {"spec": {"runPolicy": {"suspend": False}}}, WriteOptions(manager="test"))
    wait_until(lambda: conditions(job(cluster, "hold")).get("Running") == "True", timeout=60)
    assert len(pods_of(cluster, "hold")) == 2 and conditions(job(cluster, "hold"))["Suspended"] == "False"
