"""The HyperPod simulator called directly with validated ``Call`` objects and a manual clock: status
sequences, nodes as Kubernetes Nodes with HyperPod's labels, health faults and recovery, capacity and
quota failures, pagination and persistence. The wire protocol is covered in ``test_hyperpod_e2e.py``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from sandbox.aws.base import AwsError, Call, FaultRegistry, ManualClock
from sandbox.aws.hyperpod import HyperPodSimulator
from sandbox.aws.hyperpod_state import Ids
from sandbox.kube.emulator import Emulator

ACCOUNT = "123456789012"
REGION = "us-west-2"
EKS_ARN = f"arn:aws:eks:{REGION}:{ACCOUNT}:cluster/demo"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/hp-exec"
VPC = {"SecurityGroupIds": ["sg-0123456789abcdef0"], "Subnets": ["subnet-0aaa", "subnet-0bbb"]}
HEALTH = "sagemaker.amazonaws.com/node-health-status"


class World:
    def __init__(self, quota: Callable[[str], int] | None = None) -> None:
        self.clock = ManualClock()
        self.faults = FaultRegistry()
        self.kube = Emulator()
        self.kube.ensure_cluster("demo")  # the ACTIVE EKS cluster's emulator cluster (HyperPod never creates it)
        self.sim = HyperPodSimulator(self.clock, self.faults, self.kube,
                                     lambda arn: "demo" if arn == EKS_ARN else None, quota,
                                     account=ACCOUNT, region=REGION)

    def call(self, operation: str, **params: Any) -> dict[str, Any]:
        return self.sim.handle(Call("sagemaker", operation, params, REGION, ACCOUNT))

    def advance(self, seconds: float, step: float = 30.0) -> None:
        end = self.clock.now() + seconds
        while self.clock.now() < end:
            self.clock.advance(min(step, end - self.clock.now()))
            self.sim.tick(self.clock.now())

    def k8s_nodes(self) -> dict[str, dict[str, Any]]:
        cluster = self.kube.ensure_cluster("demo")
        return {o["metadata"]["name"]: o for o in cluster.list(cluster.builtin("", "nodes"), None).items}

    def describe(self, name: str = "hp") -> dict[str, Any]:
        return self.call("DescribeCluster", ClusterName=name)

    def nodes(self, name: str = "hp", **params: Any) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            page = self.call("ListClusterNodes", ClusterName=name, **params, **({"NextToken": token} if token else {}))
            out += page["ClusterNodeSummaries"]
            token = page.get("NextToken")
            if not token:
                return out


def group(name: str, count: int, instance_type: str = "ml.g5.8xlarge", **extra: Any) -> dict[str, Any]:
    return {"InstanceGroupName": name, "InstanceType": instance_type, "InstanceCount": count,
            "ExecutionRole": ROLE, "LifeCycleConfig": {"SourceS3Uri": "s3://bucket/lcc/", "OnCreate": "on_create.sh"},
            **extra}


def create(w: World, *groups: dict[str, Any], name: str = "hp", **extra: Any) -> str:
    arn = w.call("CreateCluster", ClusterName=name, InstanceGroups=list(groups), VpcConfig=VPC,
                 Orchestrator={"Eks": {"ClusterArn": EKS_ARN}}, **extra)["ClusterArn"]
    return str(arn)


def test_create_status_sequence_nodes_and_kubernetes_labels() -> None:
    w = World()
    arn = create(w, group("workers", 2, OnStartDeepHealthChecks=["InstanceStress", "InstanceConnectivity"],
                          KubernetesConfig={"Labels": {"team": "ml"},
                                            "Taints": [{"Key": "gpu", "Value": "true", "Effect": "NoSchedule"}]}),
                 group("cpu", 1, "ml.m5.xlarge", ThreadsPerCore=2),
                 NodeRecovery="Automatic",
                 TieredStorageConfig={"Mode": "Enable", "InstanceMemoryAllocationPercentage": 20},
                 NodeProvisioningMode="Continuous", AutoScaling={"Mode": "Disable"})
    assert arn.startswith(f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:cluster/")
    d = w.describe()
    assert d["ClusterStatus"] == "Creating"
    assert d["TieredStorageConfig"] == {"Mode": "Enable", "InstanceMemoryAllocationPercentage": 20}
    assert d["NodeProvisioningMode"] == "Continuous" and d["AutoScaling"] == {"Mode": "Disable", "Status": "InService"}
    assert [g["Status"] for g in d["InstanceGroups"]] == ["Creating", "Creating"]
    assert d["InstanceGroups"][0]["TargetCount"] == 2 and d["InstanceGroups"][0]["CurrentCount"] == 0
    assert d["InstanceGroups"][0]["KubernetesConfig"]["DesiredLabels"] == {"team": "ml"}
    assert w.nodes() == []  # no instance ids yet
    assert len(w.nodes(IncludeNodeLogicalIds=True)) == 3

    w.advance(300 + 60)  # control plane set up, instances launched
    nodes = w.nodes()
    assert {n["InstanceStatus"]["Status"] for n in nodes} == {"Pending"}
    assert all(n["InstanceId"].startswith("i-") and len(n["InstanceId"]) == 19 for n in nodes)
    assert w.k8s_nodes() == {}

    w.advance(900)  # booted: the cpu node runs, the GPU nodes run deep health checks
    status = {n["InstanceGroupName"]: n["InstanceStatus"]["Status"] for n in w.nodes()}
    assert status == {"workers": "DeepHealthCheckInProgress", "cpu": "Running"}
    k8s = w.k8s_nodes()
    gpu = next(o for o in k8s.values() if o["metadata"]["labels"]["sagemaker.amazonaws.com/instance-group-name"]
               == "workers")
    labels = gpu["metadata"]["labels"]
    assert labels[HEALTH] == "Unschedulable"
    assert labels["sagemaker.amazonaws.com/deep-health-check-status"] == "InProgress"
    assert {"key": HEALTH, "value": "Unschedulable", "effect": "NoSchedule"} in gpu["spec"]["taints"]
    d = w.describe()  # Continuous: InService once the cluster's own resources are up, while groups fill
    assert d["ClusterStatus"] == "InService"
    assert [g["Status"] for g in d["InstanceGroups"]] == ["Creating", "InService"]

    w.advance(1080)
    d = w.describe()
    assert d["ClusterStatus"] == "InService"
    assert [(g["Status"], g["CurrentCount"]) for g in d["InstanceGroups"]] == [("InService", 2), ("InService", 1)]
    k8s = w.k8s_nodes()
    assert len(k8s) == 3
    for obj in k8s.values():
        labels = obj["metadata"]["labels"]
        assert labels[HEALTH] == "Schedulable"
        assert labels["sagemaker.amazonaws.com/cluster-name"] == "hp"
        assert labels["sagemaker.amazonaws.com/compute-type"] == "hyperpod"
        assert labels["topology.kubernetes.io/zone"].startswith(REGION)
        assert obj["spec"]["providerID"].endswith(obj["metadata"]["name"].removeprefix("hyperpod-"))
        ready = next(c for c in obj["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True"
    gpu = next(o for o in k8s.values() if o["metadata"]["labels"]["node.kubernetes.io/instance-type"]
               == "ml.g5.8xlarge")
    assert gpu["metadata"]["labels"]["sagemaker.amazonaws.com/deep-health-check-status"] == "Passed"
    assert gpu["metadata"]["labels"]["team"] == "ml"
    assert gpu["spec"]["taints"] == [{"key": "gpu", "value": "true", "effect": "NoSchedule"}]
    assert gpu["status"]["capacity"]["nvidia.com/gpu"] == "1" and gpu["status"]["capacity"]["cpu"] == "32"
    assert gpu["status"]["capacity"]["vpc.amazonaws.com/efa"] == "1"
    node = w.nodes()[0]
    detail = w.call("DescribeClusterNode", ClusterName=arn, NodeId=node["InstanceId"])["NodeDetails"]
    assert detail["PrivatePrimaryIp"].startswith("10.") and detail["PrivateDnsHostname"].startswith("ip-10-")
    assert detail["Placement"]["AvailabilityZone"].startswith(REGION) and detail["NodeLogicalId"]
    events = w.call("ListClusterEvents", ClusterName="hp", MaxResults=100)["Events"]
    assert any(e["Description"] == "Cluster is InService." for e in events)
    assert w.call("DescribeClusterEvent", ClusterName="hp", EventId=events[0]["EventId"])["EventDetails"]


def test_semantic_errors() -> None:
    w = World()
    with pytest.raises(AwsError) as err:
        w.call("DescribeCluster", ClusterName="nope")
    assert err.value.code == "ResourceNotFound"
    with pytest.raises(AwsError) as err:
        create(w, group("a", 1), group("a", 1))
    assert err.value.code == "ValidationException" and "unique" in err.value.message
    with pytest.raises(AwsError) as err:
        w.call("CreateCluster", ClusterName="x", InstanceGroups=[group("a", 1)], VpcConfig=VPC,
               Orchestrator={"Eks": {"ClusterArn": EKS_ARN.replace("demo", "missing")}})
    assert err.value.code == "ValidationException"
    create(w, group("a", 1))
    with pytest.raises(AwsError) as err:
        create(w, group("a", 1))
    assert err.value.code == "ResourceInUse"
    with pytest.raises(AwsError) as err:
        w.call("UpdateCluster", ClusterName="hp", InstanceGroups=[group("a", 2)])
    assert err.value.code == "ConflictException"  # still Creating
    w.advance(1300)
    with pytest.raises(AwsError) as err:
        w.call("UpdateCluster", ClusterName="hp", InstanceGroupsToDelete=["ghost"])
    assert err.value.code == "ValidationException"
    with pytest.raises(AwsError) as err:
        w.call("ListClusterEvents", ClusterName="hp")
    assert err.value.code == "ValidationException"  # only for Continuous provisioning


def test_list_clusters_and_nodes_pagination() -> None:
    w = World()
    for i in range(5):
        create(w, group("g", 3 if i == 0 else 0), name=f"c{i}")
        w.clock.advance(1)
    names: list[str] = []
    token: str | None = None
    while True:
        page = w.call("ListClusters", MaxResults=2, SortBy="NAME", SortOrder="Descending",
                      **({"NextToken": token} if token else {}))
        names += [s["ClusterName"] for s in page["ClusterSummaries"]]
        token = page.get("NextToken")
        if not token:
            break
    assert names == ["c4", "c3", "c2", "c1", "c0"]
    assert [s["ClusterName"] for s in w.call("ListClusters", NameContains="c1")["ClusterSummaries"]] == ["c1"]
    w.advance(1300)
    seen = [n["InstanceId"] for n in w.nodes("c0", MaxResults=1)]
    assert len(seen) == len(set(seen)) == 3


def test_update_scale_add_and_delete_groups() -> None:
    w = World()
    create(w, group("a", 1), group("b", 1))
    w.advance(1300)
    w.call("UpdateCluster", ClusterName="hp", InstanceGroups=[group("a", 3), group("c", 1, "ml.m5.2xlarge")],
           InstanceGroupsToDelete=["b"], NodeRecovery="None")
    d = w.describe()
    assert d["ClusterStatus"] == "Updating" and d["NodeRecovery"] == "None"
    assert {g["InstanceGroupName"]: g["Status"] for g in d["InstanceGroups"]} == \
        {"a": "Updating", "b": "Deleting", "c": "Creating"}
    w.advance(1300)
    d = w.describe()
    assert d["ClusterStatus"] == "InService"
    assert {g["InstanceGroupName"]: (g["Status"], g["CurrentCount"]) for g in d["InstanceGroups"]} == \
        {"a": ("InService", 3), "c": ("InService", 1)}
    assert len(w.k8s_nodes()) == 4
    w.call("UpdateCluster", ClusterName="hp", InstanceGroups=[group("a", 1)])
    w.advance(600)
    assert len([n for n in w.nodes() if n["InstanceGroupName"] == "a"]) == 1
    assert len(w.k8s_nodes()) == 2


def test_batch_reboot_replace_delete_and_add() -> None:
    w = World()
    create(w, group("a", 3), NodeProvisioningMode="Continuous")
    w.advance(1300)
    ids = [n["InstanceId"] for n in w.nodes()]
    out = w.call("BatchRebootClusterNodes", ClusterName="hp", NodeIds=[ids[0], "i-0000000000000dead"])
    assert out["Successful"] == [ids[0]] and out["Failed"][0]["ErrorCode"] == "InstanceIdNotFound"
    out = w.call("BatchReplaceClusterNodes", ClusterName="hp", NodeIds=[ids[1]])
    assert out["Successful"] == [ids[1]]
    out = w.call("BatchDeleteClusterNodes", ClusterName="hp", NodeIds=[ids[2]])
    assert out["Successful"] == [ids[2]]
    w.advance(30)
    status = {n["InstanceId"]: n["InstanceStatus"]["Status"] for n in w.nodes()}
    assert status[ids[0]] == "Pending" and status[ids[1]] == "ShuttingDown" and status[ids[2]] == "ShuttingDown"
    assert w.k8s_nodes()[f"hyperpod-{ids[0]}"]["metadata"]["labels"][HEALTH] == "UnschedulablePendingReboot"
    w.advance(1300)
    now_ids = {n["InstanceId"] for n in w.nodes()}
    assert ids[0] in now_ids and ids[1] not in now_ids and ids[2] not in now_ids and len(now_ids) == 2
    assert set(w.k8s_nodes()) == {f"hyperpod-{i}" for i in now_ids}
    assert w.describe()["InstanceGroups"][0]["TargetCount"] == 2
    added = w.call("BatchAddClusterNodes", ClusterName="hp", ClientToken="tok-12345",
                   NodesToAdd=[{"InstanceGroupName": "a", "IncrementTargetCountBy": 2},
                               {"InstanceGroupName": "zz", "IncrementTargetCountBy": 1}])
    assert len(added["Successful"]) == 2 and added["Failed"][0]["ErrorCode"] == "InstanceGroupNotFound"
    again = w.call("BatchAddClusterNodes", ClusterName="hp", ClientToken="tok-12345",
                   NodesToAdd=[{"InstanceGroupName": "a", "IncrementTargetCountBy": 2}])
    assert again == added
    assert w.describe()["ClusterStatus"] == "InService"  # Continuous: scaling keeps the cluster InService
    w.advance(1300)
    assert len(w.nodes()) == 4 and len(w.k8s_nodes()) == 4


def test_software_update_and_health_check() -> None:
    w = World()
    create(w, group("a", 2))
    w.advance(1300)
    w.call("UpdateClusterSoftware", ClusterName="hp", DeploymentConfig={
        "RollingUpdatePolicy": {"MaximumBatchSize": {"Type": "INSTANCE_COUNT", "Value": 1}},
        "WaitIntervalInSeconds": 60})
    d = w.describe()
    assert d["ClusterStatus"] == "SystemUpdating" and d["InstanceGroups"][0]["SoftwareUpdateStatus"] == "Pending"
    w.advance(30)
    assert sorted(n["InstanceStatus"]["Status"] for n in w.nodes()) == ["Running", "SystemUpdating"]
    assert w.describe()["InstanceGroups"][0]["SoftwareUpdateStatus"] == "InProgress"
    w.advance(2200)
    d = w.describe()
    assert d["ClusterStatus"] == "InService" and d["InstanceGroups"][0]["SoftwareUpdateStatus"] == "Succeeded"
    assert all("LastSoftwareUpdateTime" in n for n in w.nodes())
    node = w.nodes()[0]["InstanceId"]
    w.call("StartClusterHealthCheck", ClusterName="hp", DeepHealthCheckConfigurations=[
        {"InstanceGroupName": "a", "InstanceIds": [node], "DeepHealthChecks": ["InstanceStress"]}])
    w.advance(30)
    assert w.call("DescribeClusterNode", ClusterName="hp", NodeId=node)["NodeDetails"]["InstanceStatus"][
        "Status"] == "DeepHealthCheckInProgress"
    w.advance(700)
    labels = w.k8s_nodes()[f"hyperpod-{node}"]["metadata"]["labels"]
    assert labels["sagemaker.amazonaws.com/deep-health-check-status"] == "Passed" and labels[HEALTH] == "Schedulable"


def test_node_fault_automatic_replacement() -> None:
    w = World()
    create(w, group("a", 2))
    w.advance(1300)
    bad = w.nodes()[0]["InstanceId"]
    w.faults.inject("node_unhealthy", {"cluster": "hp", "node": bad})
    w.advance(30)
    obj = w.k8s_nodes()[f"hyperpod-{bad}"]
    assert obj["metadata"]["labels"][HEALTH] == "UnschedulablePendingReplacement"
    assert obj["metadata"]["labels"]["sagemaker.amazonaws.com/fault-types"]
    assert {"key": HEALTH, "value": "Unschedulable", "effect": "NoSchedule"} in obj["spec"]["taints"]
    assert w.faults.list() == []  # one-shot
    w.advance(1500)
    ids = {n["InstanceId"] for n in w.nodes()}
    assert bad not in ids and len(ids) == 2
    assert f"hyperpod-{bad}" not in w.k8s_nodes() and len(w.k8s_nodes()) == 2
    assert all(o["metadata"]["labels"][HEALTH] == "Schedulable" for o in w.k8s_nodes().values())


def test_node_fault_reboot_and_manual_recovery() -> None:
    w = World()
    create(w, group("a", 2), NodeRecovery="None")
    w.advance(1300)
    first, second = (n["InstanceId"] for n in w.nodes())
    w.faults.inject("node_unhealthy", {"cluster": "hp", "node": first, "recovery": "Reboot"})
    w.advance(3000)  # NodeRecovery=None: nothing happens by itself
    assert w.k8s_nodes()[f"hyperpod-{first}"]["metadata"]["labels"][HEALTH] == "UnschedulablePendingReboot"
    w.call("BatchRebootClusterNodes", ClusterName="hp", NodeIds=[first])
    w.advance(600)
    labels = w.k8s_nodes()[f"hyperpod-{first}"]["metadata"]["labels"]
    assert labels[HEALTH] == "Schedulable" and "sagemaker.amazonaws.com/fault-types" not in labels
    # The documented kubectl trigger needs NodeRecovery=Automatic.
    w.call("UpdateCluster", ClusterName="hp", NodeRecovery="Automatic")
    cluster = w.kube.ensure_cluster("demo")
    cluster.patch(cluster.builtin("", "nodes"), None, f"hyperpod-{second}", "merge",
                  {"metadata": {"labels": {HEALTH: "UnschedulablePendingReplacement"}}})
    w.advance(1500)
    ids = {n["InstanceId"] for n in w.nodes()}
    assert second not in ids and first in ids and len(ids) == 2


def test_capacity_fault_fails_creation_cleanly() -> None:
    w = World()
    w.faults.inject("insufficient_capacity", {"instance_type": "ml.p5.48xlarge"})
    create(w, group("gpu", 2, "ml.p5.48xlarge"), group("cpu", 1, "ml.m5.xlarge"))
    w.advance(1500)
    d = w.describe()
    assert d["ClusterStatus"] == "Failed"
    assert "sufficient capacity" in d["FailureMessage"] and "ml.p5.48xlarge" in d["FailureMessage"]
    assert all(g["Status"] == "Failed" and g["CurrentCount"] == 0 for g in d["InstanceGroups"])
    assert w.nodes(IncludeNodeLogicalIds=True) == [] and w.k8s_nodes() == {}
    w.call("DeleteCluster", ClusterName="hp")
    w.advance(700)
    assert w.call("ListClusters")["ClusterSummaries"] == []


def test_capacity_fault_during_update_rolls_back() -> None:
    w = World()
    create(w, group("a", 1))
    w.advance(1300)
    w.faults.inject("insufficient_capacity", {"instance_type": "ml.g5.8xlarge"})
    w.call("UpdateCluster", ClusterName="hp", InstanceGroups=[group("a", 3)])
    w.advance(60)
    assert w.describe()["ClusterStatus"] == "RollingBack"
    w.advance(600)
    d = w.describe()
    assert d["ClusterStatus"] == "InService" and "sufficient capacity" in d["FailureMessage"]
    assert d["InstanceGroups"][0]["TargetCount"] == 1 and len(w.nodes()) == 1


def test_quota_resource_limit_exceeded() -> None:
    w = World(quota=lambda t: 4 if t == "ml.g5.8xlarge" else 100)
    create(w, group("a", 3))
    with pytest.raises(AwsError) as err:
        create(w, group("b", 2), name="other")
    assert err.value.code == "ResourceLimitExceeded" and "ml.g5.8xlarge for cluster usage" in err.value.message
    w.advance(1300)
    with pytest.raises(AwsError) as err:
        w.call("UpdateCluster", ClusterName="hp", InstanceGroups=[group("a", 5)])
    assert err.value.code == "ResourceLimitExceeded"


def test_delete_cluster_removes_nodes() -> None:
    w = World()
    create(w, group("a", 2))
    w.advance(1300)
    w.call("DeleteCluster", ClusterName="hp")
    assert w.describe()["ClusterStatus"] == "Deleting"
    w.advance(60)
    assert {n["InstanceStatus"]["Status"] for n in w.nodes()} == {"ShuttingDown"}
    w.advance(600)
    with pytest.raises(AwsError):
        w.describe()
    assert w.k8s_nodes() == {}


def test_training_plans() -> None:
    w = World()
    offers = w.call("SearchTrainingPlanOfferings", InstanceType="ml.p5.48xlarge", InstanceCount=2, DurationHours=48,
                    TargetResources=["hyperpod-cluster"])["TrainingPlanOfferings"]
    assert len(offers) == 3
    arn = w.call("CreateTrainingPlan", TrainingPlanName="plan1",
                 TrainingPlanOfferingId=offers[0]["TrainingPlanOfferingId"])["TrainingPlanArn"]
    assert w.call("DescribeTrainingPlan", TrainingPlanName="plan1")["Status"] == "Pending"
    w.advance(7300, step=600)
    plan = w.call("DescribeTrainingPlan", TrainingPlanName=arn)
    assert plan["Status"] == "Active" and plan["TotalInstanceCount"] == 2
    assert [p["TrainingPlanName"] for p in w.call("ListTrainingPlans")["TrainingPlanSummaries"]] == ["plan1"]
    with pytest.raises(AwsError) as err:
        create(w, group("g", 1, TrainingPlanArn=arn))
    assert err.value.code == "ValidationException"  # type does not match the plan
    create(w, group("g", 1, "ml.p5.48xlarge", TrainingPlanArn=arn))
    assert w.describe()["InstanceGroups"][0]["TrainingPlanStatus"] == "Active"


def test_persistence_round_trip() -> None:
    w = World()
    create(w, group("a", 2, OnStartDeepHealthChecks=["InstanceStress"]))
    w.advance(1300)  # mid deep health check
    state = json.loads(json.dumps(w.sim.to_state()))
    restored = HyperPodSimulator(w.clock, w.faults, w.kube, lambda arn: "demo", None, account=ACCOUNT, region=REGION)
    restored.load_state(state)
    assert restored.handle(Call("sagemaker", "DescribeCluster", {"ClusterName": "hp"}, REGION, ACCOUNT)) == \
        w.describe()
    w.sim = restored
    w.advance(700)
    assert w.describe()["ClusterStatus"] == "InService" and len(w.k8s_nodes()) == 2
    create(w, group("b", 1), name="hp2")  # ids continue from the restored counter: no collisions
    w.advance(1300)
    all_ids = [n["InstanceId"] for c in ("hp", "hp2") for n in w.nodes(c)]
    assert len(all_ids) == len(set(all_ids)) == 3


def test_node_addresses_come_from_the_subnet_block_and_run_out() -> None:
    ids = Ids("seed")
    taken: set[str] = set()
    for _ in range(11):  # a /28 holds 16 addresses; AWS keeps .0-.3 and .15
        ip = ids.ip_in("10.9.8.16/28", taken)
        assert ip is not None and ip not in taken
        taken.add(ip)
    assert taken == {f"10.9.8.{n}" for n in range(20, 31)}
    assert ids.ip_in("10.9.8.16/28", taken) is None
