"""Simulated container processes: a claimed container runs on the cluster's clock and ends with its exit
code; deleting the pod or losing its node kills it; unclaimed containers keep the kubelet's plain ways."""

from __future__ import annotations

from typing import Any

from sandbox.kube import Cluster, Emulator, WriteOptions, deletion
from sandbox.kube.processes import running
from tests.kube.training_support import NS, TEST, emulator, get, log_text, trainer_container, training_cluster
from tests.support import wait_until

__all__ = ["emulator"]


def pod(cluster: Cluster, name: str, command: list[str], restart: str = "Never") -> None:
    body = {"metadata": {"name": name}, "spec": {"restartPolicy": restart,
                                                 "containers": [trainer_container(command)]}}
    cluster.create(cluster.builtin("", "pods"), NS, body, TEST)


def status(cluster: Cluster, name: str) -> dict[str, Any]:
    return get(cluster, ("", "pods"), name).get("status") or {}


def test_a_bare_pod_runs_its_trainer_to_exit_0(emulator: Emulator) -> None:
    cluster = training_cluster(emulator)
    pod(cluster, "solo", ["torchrun", "--standalone", "--nproc-per-node=1", "train.py", "--max_steps", "3"])
    wait_until(lambda: status(cluster, "solo").get("phase") == "Succeeded", timeout=60)
    terminated = status(cluster, "solo")["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (0, "Completed")
    assert terminated["startedAt"] <= terminated["finishedAt"]
    assert "[rank0] step 3/3" in log_text(cluster, "solo")
    # the kubelet writes the Succeeded status, then forgets the process
    wait_until(lambda: running(cluster) == [], timeout=60, message="the ended process forgotten")


def test_unclaimed_containers_keep_the_plain_kubelet(emulator: Emulator) -> None:
    cluster = training_cluster(emulator)
    pod(cluster, "idle", ["sleep", "infinity"])
    wait_until(lambda: status(cluster, "idle").get("phase") == "Running", timeout=60)
    assert running(cluster) == [] and log_text(cluster, "idle", "pytorch") == ""


def test_deleting_the_pod_kills_its_process(emulator: Emulator) -> None:
    cluster = training_cluster(emulator)
    pod(cluster, "doomed", ["torchrun", "train.py", "--max_steps", "1000000"])
    wait_until(lambda: [p.pod for p in running(cluster)] == ["doomed"], timeout=60)
    deletion.delete(cluster, cluster.builtin("", "pods"), NS, "doomed")
    wait_until(lambda: running(cluster) == [], timeout=60)


def test_losing_the_node_kills_the_process_with_137(emulator: Emulator) -> None:
    cluster = training_cluster(emulator, nodes=1)
    pod(cluster, "stranded", ["torchrun", "train.py", "--max_steps", "1000000"], restart="OnFailure")
    wait_until(lambda: running(cluster), timeout=60)
    cluster.patch(cluster.builtin("", "nodes"), None, "hyperpod-i-0000", "merge",
                  {"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady"}]}},
                  WriteOptions(manager="node-controller"), "status")
    wait_until(lambda: status(cluster, "stranded").get("phase") == "Failed", timeout=60)
    final = status(cluster, "stranded")
    assert final["reason"] == "NodeLost"
    assert final["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 137
    assert final["containerStatuses"][0]["restartCount"] == 0  # no restart on a node that is gone


def test_processes_end_with_their_cluster(emulator: Emulator) -> None:
    cluster = training_cluster(emulator)
    pod(cluster, "orphan", ["torchrun", "train.py", "--max_steps", "1000000"])
    wait_until(lambda: running(cluster), timeout=60)
    emulator.delete_cluster(cluster.name)
    assert running(cluster) == []
