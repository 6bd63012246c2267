"""Test helpers for the nodes noun: a sandbox server with a seeded, imported cluster of N nodes (automatic node
recovery off), boto3 against its AWS endpoint and a Kubernetes client for its emulator."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import boto3
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from app.sandbox import SANDBOX_ACCESS_KEY
from tests.sandbox_support import SeededServer
from tests.support import ROOT, free_port, start_server

SPEED = 500  # a reboot (7 simulated minutes) is about a second; the sandbox ticks every 0.2 s


@contextmanager
def node_cluster(folder: Path, nodes: int, *, recovery: str = "None", speed: int = SPEED) -> Iterator[SeededServer]:
    """A sandbox server with a seeded cluster of ``nodes`` ml.g5.8xlarge (the account's quota raised first, as a
    user would), imported; automatic node recovery off unless ``recovery`` is ``Automatic``."""
    aws_port, kube_port = free_port(), free_port()
    live = start_server(folder / "data", env={"INSTANTSTART_SANDBOX_SPEED": str(speed),
                                              "INSTANTSTART_SANDBOX_AWS_PORT": str(aws_port),
                                              "INSTANTSTART_SANDBOX_KUBE_PORT": str(kube_port)})
    server = SeededServer(live, aws_port, kube_port)
    try:
        quotas = aws(server, "service-quotas")
        quota = next(q for q in quotas.list_service_quotas(ServiceCode="sagemaker", MaxResults=100)["Quotas"]
                     if q["QuotaName"] == "ml.g5.8xlarge for cluster usage")
        if quota["Value"] < nodes:
            quotas.request_service_quota_increase(ServiceCode="sagemaker", QuotaCode=quota["QuotaCode"],
                                                  DesiredValue=float(nodes))
        seed = subprocess.run([sys.executable, "-m", "app.cli", "sandbox", "seed", "--name", "hp-eks", "--nodes",
                               str(nodes), "--data-dir", str(live.data_dir)], cwd=ROOT, capture_output=True,
                              text=True, timeout=300)
        assert seed.returncode == 0, seed.stderr
        made = live.post("/api/v1/clusters/import", {"eks_cluster": "hp-eks", "hyperpod_cluster": "hp-eks"})
        assert made.status_code == 202, made.text
        done = live.get(f"/api/v1/operations/{made.json()['operation']['id']}/wait?timeout=120").json()
        assert done["status"] == "succeeded", done
        if recovery != "Automatic":  # as a user may run it: faults wait for an operator
            aws(server, "sagemaker").update_cluster(ClusterName="hp-eks", NodeRecovery=recovery)
        yield server
    finally:
        live.stop()


def aws(server: SeededServer, service: str) -> Any:
    secret = (server.live.data_dir / "sandbox" / "aws-secret-key").read_text().strip()
    return boto3.client(service, endpoint_url=f"http://127.0.0.1:{server.aws_port}", region_name="us-west-2",
                        aws_access_key_id=SANDBOX_ACCESS_KEY, aws_secret_access_key=secret)


def kube(server: SeededServer, folder: Path, cluster: str = "hp-eks") -> k8s.ApiClient:
    path = folder / "kubeconfig"
    written = subprocess.run([sys.executable, "-m", "app.cli", "kubeconfig", cluster, "--data-dir",
                              str(server.live.data_dir)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert written.returncode == 0, written.stderr
    path.write_text(written.stdout)
    return k8s_config.new_client_from_config(str(path))
