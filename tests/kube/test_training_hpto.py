"""The sandbox's HyperPod training operator: pods per replicaSpecs, the simulated trainer, the recovery budget
(process-level restarts, full job restarts, jobMaxRetryCount), node faults and suspend."""

from __future__ import annotations

from typing import Any

from sandbox.kube import Cluster, Emulator, WriteOptions
from sandbox.kube.hpto import KEY
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

__all__ = ["emulator"]  # the fixture

HPTO = "hyperpod-training-operator"
HEALTH = "sagemaker.amazonaws.com/node-health-status"


def hppj(name: str, command: list[str], *, replicas: int = 2, env: dict[str, str] | None = None,
         run_policy: dict[str, Any] | None = None) -> dict[str, Any]:
    template = {"metadata": {"labels": labels(name)},
                "spec": {"containers": [trainer_container(command, {"NCCL_DEBUG": "INFO", **(env or {})})]}}
    return {"apiVersion": "sagemaker.amazonaws.com/v1", "kind": "HyperPodPyTorchJob",
            "metadata": {"name": name, "labels": labels(name)},
            "spec": {"nprocPerNode": "8",
                     "replicaSpecs": [{"name": "pods", "replicas": replicas, "template": template}],
                     "runPolicy": {"cleanPodPolicy": "None", **(run_policy or {})}}}


def launch(steps: int, *extra: str, script_args: str = "") -> list[str]:
    return ["bash", "-c", "hyperpodrun --nnodes=$NNODES --nproc-per-node=$NPROC_PER_NODE --server-host=0.0.0.0 "
            f"--server-port=8080 --tee=3 --log_dir=/tmp/hyperpod {' '.join(extra)} /s3/train.py --max_steps {steps} "
            f"{script_args}"]


def job(cluster: Cluster, name: str) -> dict[str, Any]:
    return get(cluster, KEY, name)


def reasons(cluster: Cluster, name: str) -> list[str]:
    return [e["reason"] for e in events_of(cluster, job(cluster, name))]


def test_job_runs_to_completion_with_its_pods_env_and_logs(emulator: Emulator) -> None:
    cluster = training_cluster(emulator, HPTO)
    create(cluster, "sagemaker.amazonaws.com", "v1", "hyperpodpytorchjobs", hppj("llama", launch(8)))
    wait_until(lambda: conditions(job(cluster, "llama")).get("Completed") == "True", timeout=60)
    status = job(cluster, "llama")["status"]
    assert conditions(job(cluster, "llama"))["Created"] == "True"
    assert status["startTime"] and status["completionTime"] and status["masterAddr"] == "llama-pods-0"
    pods = sorted(pods_of(cluster, "llama"), key=lambda p: p["metadata"]["name"])
    assert [p["metadata"]["name"] for p in pods] == ["llama-pods-0", "llama-pods-1"]
    for rank, pod in enumerate(pods):
        assert pod["metadata"]["labels"]["instantstart.io/recipe"] == "pytorch"
        env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
        assert (env["NNODES"], env["NPROC_PER_NODE"], env["RANK"], env["MASTER_ADDR"]) == \
            ("2", "8", str(rank), "llama-pods-0")
        assert pod["status"]["phase"] == "Succeeded"
        assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    assert {p["spec"]["nodeName"] for p in pods} == {"hyperpod-i-0000", "hyperpod-i-0001"}
    text = log_text(cluster, "llama-pods-0")
    assert "NCCL INFO comm 0x5581f3c0 rank 0 nranks 16" in text
    assert "[rank0] step 8/8 | loss " in text and "tokens/s" in text
    assert "Saving model checkpoint to /s3/jobs/llama/checkpoints/checkpoint-2" in text
    assert text.splitlines()[-1] == "Training completed: 8 steps; outputs in /s3/jobs/llama/outputs"
    assert "[rank8] step 8/8" in log_text(cluster, "llama-pods-1")
    # the operator writes the Completed condition, then its Completed event
    wait_until(lambda: "Completed" in reasons(cluster, "llama"), timeout=60, message="the Completed event")


def test_unknown_flag_fails_the_workload_and_then_the_job(emulator: Emulator) -> None:
    cluster = training_cluster(emulator, HPTO)
    create(cluster, "sagemaker.amazonaws.com", "v1", "hyperpodpytorchjobs",
           hppj("typo", launch(5, "--max-retries=3"), replicas=1,
                run_policy={"restartPolicy": {"maxFullJobRestarts": 1, "evalPeriodSeconds": 3600,
                                              "numRestartBeforeFullJobRestart": 3}}))
    wait_until(lambda: conditions(job(cluster, "typo")).get("Failed") == "True", timeout=60)
    pod = pods_of(cluster, "typo")[0]
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (pod["status"]["phase"], terminated["exitCode"], terminated["reason"]) == ("Failed", 2, "Error")
    assert log_text(cluster, "typo-pods-0").splitlines()[-1] == \
        "hyperpodrun: error: unrecognized arguments: --max-retries=3"
    status = job(cluster, "typo")["status"]
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["message"].startswith("maxFullJobRestarts (1) exhausted: pod typo-pods-0 failed")
    assert status["restartStatus"]["fullJobRestartCount"] == 1  # the one full restart was spent first


def test_process_failures_restart_in_place_then_the_job_then_fail(emulator: Emulator) -> None:
    cluster = training_cluster(emulator, HPTO)
    create(cluster, "sagemaker.amazonaws.com", "v1", "hyperpodpytorchjobs",
           hppj("flaky", launch(6), replicas=1, env={"SANDBOX_FAIL_AT_STEP": "3"},
                run_policy={"jobMaxRetryCount": 10, "restartPolicy": {
                    "numRestartBeforeFullJobRestart": 2, "evalPeriodSeconds": 86400, "maxFullJobRestarts": 1}}))
    wait_until(lambda: conditions(job(cluster, "flaky")).get("Failed") == "True", timeout=60)
    status = job(cluster, "flaky")["status"]
    assert status["restartCount"] == 4  # 2 in place, a full restart, 2 in place again
    assert status["restartStatus"]["fullJobRestartCount"] == 1
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["message"].startswith("maxFullJobRestarts (1) exhausted after 2 process-level restarts within "
                                        "evalPeriodSeconds (86400): pod flaky-pods-0 exited with code 1")
    assert reasons(cluster, "flaky").count("JobLevelRestart") == 1
    text = log_text(cluster, "flaky-pods-0")
    assert text.count("[HyperPodElasticAgent] process-level restart") == 2
    assert "Resuming training from checkpoint /s3/jobs/flaky/checkpoints/checkpoint-2" in text


def test_job_max_retry_count_caps_every_restart(emulator: Emulator) -> None:
    cluster = training_cluster(emulator, HPTO)
    create(cluster, "sagemaker.amazonaws.com", "v1", "hyperpodpytorchjobs",
           hppj("capped", launch(6), replicas=1, env={"SANDBOX_FAIL_AT_STEP": "2"},
                run_policy={"jobMaxRetryCount": 1, "restartPolicy": {
                    "numRestartBeforeFullJobRestart": 5, "evalPeriodSeconds": 3600, "maxFullJobRestarts": 5}}))
    wait_until(lambda: conditions(job(cluster, "capped")).get("Failed") == "True", timeout=60)
    status = job(cluster, "capped")["status"]
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["message"].startswith("jobMaxRetryCount (1) exhausted after 1 restarts")
    assert status["restartCount"] == 1


def test_node_fault_restarts_the_job_away_from_the_node(emulator: Emulator) -> None:
    cluster = training_cluster(emulator, HPTO, nodes=3)
    create(cluster, "sagemaker.amazonaws.com", "v1", "hyperpodpytorchjobs",
           hppj("resilient", launch(2000, script_args="--save_steps 100"), replicas=1,
                env={"SANDBOX_STEP_SECONDS": "2"}))
    wait_until(lambda: "checkpoint-100" in log_text(cluster, "resilient-pods-0"), timeout=60)
    first = pods_of(cluster, "resilient")[0]
    bad = first["spec"]["nodeName"]
    cluster.patch(cluster.builtin("", "nodes"), None, bad, "merge",
                  {"metadata": {"labels": {HEALTH: "UnschedulablePendingReplacement"}}},
                  WriteOptions(manager="sagemaker-hyperpod"))
    wait_until(lambda: any(p["metadata"]["uid"] != first["metadata"]["uid"] and p["spec"].get("nodeName")
                           for p in pods_of(cluster, "resilient")), timeout=60)
    new = pods_of(cluster, "resilient")[0]
    assert new["spec"]["nodeName"] != bad
    terms = new["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": [bad]} in \
        terms["nodeSelectorTerms"][0]["matchExpressions"]
    wait_until(lambda: conditions(job(cluster, "resilient")).get("Completed") == "True", timeout=120)
    status = job(cluster, "resilient")["status"]
    assert status["restartStatus"]["fullJobRestartCount"] == 1
    assert status["latestFaultyPodInstanceList"]["faultyPodList"] == ["resilient-pods-0"]
    fault = next(e for e in events_of(cluster, job(cluster, "resilient")) if e["reason"] == "NodeFault")
    assert fault["type"] == "Warning" and bad in fault["message"]
    assert "UnschedulablePendingReplacement" in fault["message"]
    assert "Resuming training from checkpoint /s3/jobs/resilient/checkpoints/checkpoint-" in \
        log_text(cluster, "resilient-pods-0")


def test_suspend_deletes_pods_and_resume_recreates_them(emulator: Emulator) -> None:
    cluster = training_cluster(emulator, HPTO)
    create(cluster, "sagemaker.amazonaws.com", "v1", "hyperpodpytorchjobs", hppj("paused", launch(100000)))
    wait_until(lambda: conditions(job(cluster, "paused")).get("Running") == "True", timeout=60)
    assert conditions(job(cluster, "paused"))["PodsRunning"] == "True"
    rt = cluster.lookup("sagemaker.amazonaws.com", "v1", "hyperpodpytorchjobs")
    cluster.patch(rt, NS, "paused", "merge", {"spec": {"runPolicy": {"suspend": True}}}, WriteOptions(manager="test"))
    wait_until(lambda: not pods_of(cluster, "paused"), timeout=60)
    assert conditions(job(cluster, "paused")).get("Suspended") == "True"
    assert "Running" not in conditions(job(cluster, "paused"))
    cluster.patch(rt, NS, "paused", "merge", {"spec": {"runPolicy": {"suspend": False}}}, WriteOptions(manager="test"))
    wait_until(lambda: conditions(job(cluster, "paused")).get("Running") == "True", timeout=60)
    assert conditions(job(cluster, "paused"))["Suspended"] == "False"
    assert len([p for p in pods_of(cluster, "paused") if p["status"].get("phase") == "Running"]) == 2
