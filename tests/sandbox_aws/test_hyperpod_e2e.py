"""HyperPod end to end: a real boto3 SageMaker client against the sandbox AWS endpoint, the nodes seen
through the official Kubernetes client and ``kubectl get nodes -L ...`` against the emulator: in their
subnets' zones and CIDR blocks, with the EKS cluster's kubelet version, on the same clock as AWS."""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from kubernetes import client, config

from sandbox.aws import AwsWorld
from sandbox.kube import BackgroundServer
from sandbox.kube.tables import human_duration

from .conftest import ROLE as EKS_ROLE
from .conftest import Clients, error_code, subnets

ROLE = "arn:aws:iam::123456789012:role/hp-exec"
HEALTH = "sagemaker.amazonaws.com/node-health-status"


def test_boto3_create_cluster_nodes_visible_in_kubernetes(world: AwsWorld, aws: Clients, kube: BackgroundServer,
                                                          unique: Any, tmp_path: Path) -> None:
    ec2, eks, sm = aws("ec2"), aws("eks"), aws("sagemaker")
    nets = subnets(ec2)
    eks_name = unique("hpe2e")
    eks_arn = eks.create_cluster(name=eks_name, version="1.31", roleArn=EKS_ROLE,
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

    # realism: the subnet's zone and CIDR block, the EKS version's kubelet, and one clock for AWS and Kubernetes
    by_subnet = {s["SubnetId"]: s for s in ec2.describe_subnets(SubnetIds=nets)["Subnets"]}
    by_name = {n.metadata.name: n for n in nodes}
    now = world.clock.now()
    ages = {line.split()[0]: line.split()[3] for line in lines[1:]}  # NAME STATUS ROLES AGE VERSION ...
    for instance_id in ids:
        details = sm.describe_cluster_node(ClusterName="hp", NodeId=instance_id)["NodeDetails"]
        node = by_name[f"hyperpod-{instance_id}"]
        subnet = next(s for s in by_subnet.values()
                      if s["AvailabilityZone"] == details["Placement"]["AvailabilityZone"])
        addresses = {a.type: a.address for a in node.status.addresses}
        assert addresses["InternalIP"] == details["PrivatePrimaryIp"]
        assert ipaddress.ip_address(details["PrivatePrimaryIp"]) in ipaddress.ip_network(subnet["CidrBlock"])
        assert details["Placement"]["AvailabilityZoneId"] == subnet["AvailabilityZoneId"]
        assert node.metadata.labels["topology.kubernetes.io/zone"] == subnet["AvailabilityZone"]
        assert node.status.node_info.kubelet_version.startswith("v1.31.")
        created = node.metadata.creation_timestamp.timestamp()
        assert details["LaunchTime"].timestamp() <= created <= now, "the Node joins after its launch, on one clock"
        assert ages[node.metadata.name] == human_duration(now - created)
    assert len({by_name[n].status.addresses[0].address for n in by_name}) == 3
    assert all(" v1.31." in line for line in lines[1:])
    control_plane_up = datetime.strptime(kube.emulator.cluster(eks_name).store.get(("", "namespaces"), ("", "default"))
                                         ["metadata"]["creationTimestamp"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    created_at = eks.describe_cluster(name=eks_name)["cluster"]["createdAt"]
    assert created_at.timestamp() + 600 <= control_plane_up.timestamp() + 1 <= created_at.timestamp() + 1801


def test_a_full_subnet_fails_the_launch(world: AwsWorld, aws: Clients, unique: Any) -> None:
    """A /28 (AWS's smallest subnet) holds 11 usable addresses: the twelfth node cannot launch."""
    ec2, eks, sm = aws("ec2"), aws("eks"), aws("sagemaker")
    vpc = ec2.create_vpc(CidrBlock="10.30.0.0/16")["Vpc"]["VpcId"]
    tiny, other = (ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.30.{i}.0/28", AvailabilityZone=f"us-west-2{z}")
                   ["Subnet"]["SubnetId"] for i, z in ((0, "a"), (1, "b")))
    arn = eks.create_cluster(name=unique("tiny"), roleArn=EKS_ROLE,
                             resourcesVpcConfig={"subnetIds": [tiny, other]})["cluster"]["arn"]
    world.advance(1800)
    name = unique("hp-tiny")
    sm.create_cluster(ClusterName=name, Orchestrator={"Eks": {"ClusterArn": arn}},
                      VpcConfig={"SecurityGroupIds": ["sg-0123456789abcdef0"], "Subnets": [tiny]},
                      InstanceGroups=[{"InstanceGroupName": f"g{i}", "InstanceType": kind, "InstanceCount": 6,
                                       "ExecutionRole": ROLE}
                                      for i, kind in enumerate(("ml.m5.xlarge", "ml.c5.xlarge"))])
    for _ in range(10):
        world.advance(300)
    described = sm.describe_cluster(ClusterName=name)
    assert described["ClusterStatus"] == "Failed"
    assert f"not enough free addresses in subnet {tiny} (10.30.0.0/28)" in described["FailureMessage"]
