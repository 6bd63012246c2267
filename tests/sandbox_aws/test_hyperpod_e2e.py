"""HyperPod end to end: a real boto3 SageMaker client against the sandbox AWS endpoint, the nodes seen
through the official Kubernetes client and ``kubectl get nodes -L ...`` against the emulator."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from kubernetes import client, config

from sandbox.aws import AwsWorld
from sandbox.kube import BackgroundServer

from .conftest import Clients, error_code, subnets

ROLE = "arn:aws:iam::123456789012:role/hp-exec"
HEALTH = "sagemaker.amazonaws.com/node-health-status"


def test_boto3_create_cluster_nodes_visible_in_kubernetes(world: AwsWorld, aws: Clients, kube: BackgroundServer,
                                                          unique: Any, tmp_path: Path) -> None:
    ec2, eks, sm = aws("ec2"), aws("eks"), aws("sagemaker")
    nets = subnets(ec2)
    eks_name = unique("hpe2e")
    eks_arn = eks.create_cluster(name=eks_name, roleArn="arn:aws:iam::123456789012:role/eks",
                                 resourcesVpcConfig={"subnetIds": nets})["cluster"]["arn"]
    with pytest.raises(ClientError) as info:
        sm.create_cluster(ClusterName="hp-bad", NodeRecovery="Sometimes")
    assert error_code(info.value) == "ValidationException"
    with pytest.raises(ClientError) as info:  # EKS still CREATING
        sm.create_cluster(ClusterName="hp", Orchestrator={"Eks": {"ClusterArn": eks_arn}},
                          VpcConfig={"SecurityGroupIds": ["sg-0123456789abcdef0"], "Subnets": nets})
    assert error_code(info.value) == "ValidationException"
    world.advance(1800)
    sm.create_cluster(
        ClusterName="hp", Orchestrator={"Eks": {"ClusterArn": eks_arn}}, NodeRecovery="Automatic",
        VpcConfig={"SecurityGroupIds": ["sg-0123456789abcdef0"], "Subnets": nets},
        InstanceGroups=[{"InstanceGroupName": "workers", "InstanceType": "ml.g5.8xlarge", "InstanceCount": 3,
                         "ExecutionRole": ROLE, "ThreadsPerCore": 1}])
    assert sm.describe_cluster(ClusterName="hp")["ClusterStatus"] == "Creating"
    for _ in range(50):
        world.advance(30)
    described = sm.describe_cluster(ClusterName="hp")
    assert described["ClusterStatus"] == "InService"
    assert described["InstanceGroups"][0]["CurrentCount"] == 3
    pages = sm.get_paginator("list_cluster_nodes").paginate(ClusterName="hp", PaginationConfig={"PageSize": 2})
    ids = [n["InstanceId"] for p in pages for n in p["ClusterNodeSummaries"]]
    assert len(ids) == len(set(ids)) == 3
    node = sm.describe_cluster_node(ClusterName="hp", NodeId=ids[0])["NodeDetails"]
    assert node["InstanceStatus"]["Status"] == "Running" and node["Placement"]["AvailabilityZone"]

    kubeconfig = kube.emulator.write_kubeconfig(eks_name, kube.base_url, tmp_path / "kubeconfig")
    api = config.new_client_from_config(str(kubeconfig))
    try:
        nodes = client.CoreV1Api(api).list_node(label_selector="sagemaker.amazonaws.com/cluster-name=hp").items
    finally:
        api.close()
    assert sorted(n.metadata.name for n in nodes) == sorted(f"hyperpod-{i}" for i in ids)
    assert all(n.metadata.labels[HEALTH] == "Schedulable" for n in nodes)
    assert all(n.status is not None and (n.status.capacity or {})["nvidia.com/gpu"] == "1" for n in nodes)

    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl is not on PATH: this test checks `kubectl get nodes -L` against the emulator (install "
                    "kubectl; the check must not be skipped)")
    out = subprocess.run([kubectl, "--kubeconfig", str(kubeconfig), "--cache-dir", str(tmp_path / "cache"),
                          "get", "nodes", "-L", HEALTH], capture_output=True, text=True, timeout=60, check=True)
    lines = out.stdout.strip().splitlines()
    assert "NODE-HEALTH-STATUS" in lines[0]
    assert len(lines) == 4 and all("Schedulable" in line for line in lines[1:])
