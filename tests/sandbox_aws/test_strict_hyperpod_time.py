"""HyperPod behaviour over time, driven by the sandbox's manual clock through boto3: continuous provisioning
(InService while groups fill, MinInstanceCount rollback after 3 hours), training plans (usable status, zone,
launch when Active, at most the plan's count), and the deep-health-check and Spot faults."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, get_args

import pytest

from app.cli_sandbox import FAULT_KINDS as CLI_FAULT_KINDS
from sandbox.aws import FAULT_KINDS, AwsWorld
from sandbox.aws.hyperpod_karpenter import SCALING_SECONDS
from sandbox.aws.hyperpod_lifecycle import BOOT_SECONDS, CHECK_SECONDS, DETECT, REBOOT_SECONDS, SETUP
from services.sandbox_control import FaultInject, FaultKind

from .conftest import make_client
from .hyperpod_prereqs import Prereqs, cleaned_sagemaker, fresh, groups, in_service, prereqs, refused, role

DHC_LABEL = "sagemaker.amazonaws.com/deep-health-check-status"
HEALTH = "sagemaker.amazonaws.com/node-health-status"


@pytest.fixture(scope="module")
def env(shared_world: AwsWorld) -> Prereqs:
    return prereqs(shared_world, lambda service: make_client(shared_world, service), fresh)


@pytest.fixture
def sm(world: AwsWorld) -> Iterator[Any]:
    yield from cleaned_sagemaker(world)


def nodes(sm: Any, name: str, **params: Any) -> list[dict[str, Any]]:
    return list(sm.list_cluster_nodes(ClusterName=name, **params)["ClusterNodeSummaries"])


def kube_labels(world: AwsWorld, env: Prereqs, instance_id: str) -> dict[str, str]:
    assert world.kube is not None
    cluster = world.kube.clusters[env.eks_name]
    node = cluster.get(cluster.builtin("", "nodes"), None, f"hyperpod-{instance_id}")
    return dict(node["metadata"]["labels"])


def events(sm: Any, name: str) -> list[str]:
    """The latest 100 cluster events, newest first."""
    return [e["Description"] for e in sm.list_cluster_events(ClusterName=name, MaxResults=100,
                                                             SortOrder="Descending")["Events"]]


# --- continuous provisioning (gap 4) ----------------------------------------------------------------------


def test_continuous_cluster_is_in_service_while_groups_fill(world: AwsWorld, sm: Any, env: Prereqs) -> None:
    name = fresh("hp")
    world.faults.inject("insufficient_capacity", {"instance_type": "ml.r6i.large"})
    sm.create_cluster(**env.cluster(name, env.group("workers", 2, "ml.r6i.large"), NodeProvisioningMode="Continuous"))
    assert sm.describe_cluster(ClusterName=name)["ClusterStatus"] == "Creating"
    world.advance(4 * 3600)  # four hours without capacity: the cluster is up, the group still waits for it
    described = sm.describe_cluster(ClusterName=name)
    assert described["ClusterStatus"] == "InService"
    assert [(g["Status"], g["CurrentCount"], g["TargetCount"]) for g in described["InstanceGroups"]] == [
        ("Creating", 0, 2)]
    pending = nodes(sm, name, IncludeNodeLogicalIds=True)
    assert [n["InstanceStatus"]["Status"] for n in pending] == ["Pending", "Pending"]
    assert "sufficient capacity" in pending[0]["InstanceStatus"]["Message"]
    sm.update_cluster(ClusterName=name, InstanceGroups=[env.group("workers", 2, "ml.r6i.large"),
                                                        env.group("cpu", 1, "ml.r7i.large")])  # no ConflictException
    world.faults.clear()
    described = in_service(world, sm, name, SETUP + BOOT_SECONDS + 600)
    assert [(g["Status"], g["CurrentCount"]) for g in described["InstanceGroups"]] == [("InService", 2),
                                                                                      ("InService", 1)]


def test_a_new_group_short_of_min_count_after_3_hours_rolls_back_to_zero(world: AwsWorld, sm: Any,
                                                                         env: Prereqs) -> None:
    name = fresh("hp")
    world.faults.inject("insufficient_capacity", {"instance_type": "ml.m7i.large"})
    sm.create_cluster(**env.cluster(name, env.group("workers", 3, "ml.m7i.large", MinInstanceCount=2),
                                    NodeProvisioningMode="Continuous"))
    world.advance(3 * 3600 - 60)
    assert [(g["Status"], g["TargetCount"]) for g in sm.describe_cluster(ClusterName=name)["InstanceGroups"]] == [
        ("Creating", 3)]
    world.advance(120)
    group = groups(sm, name)["workers"]
    assert (group["TargetCount"], group["CurrentCount"]) == (0, 0)
    assert nodes(sm, name, IncludeNodeLogicalIds=True) == []
    assert ("Instance group workers did not reach MinInstanceCount 2 within 3 hours (0 running); rolled back to zero "
            "instances.") in events(sm, name)


def test_a_group_that_reaches_min_count_in_time_stays(world: AwsWorld, sm: Any, env: Prereqs) -> None:
    name = fresh("hp")
    world.faults.inject("insufficient_capacity", {"instance_type": "ml.m7i.xlarge"}, remaining=1)  # one launch fails
    sm.create_cluster(**env.cluster(name, env.group("workers", 3, "ml.m7i.xlarge", MinInstanceCount=2),
                                    NodeProvisioningMode="Continuous"))
    world.advance(SETUP + BOOT_SECONDS + 60)
    group = groups(sm, name)["workers"]
    assert (group["Status"], group["CurrentCount"]) == ("InService", 2)  # MinInstanceCount reached
    world.advance(4 * 3600)
    group = groups(sm, name)["workers"]
    assert (group["TargetCount"], group["CurrentCount"]) == (3, 3)  # the retry found capacity; no rollback


def test_an_updated_group_short_of_min_count_rolls_back_to_its_previous_spec(world: AwsWorld, sm: Any,
                                                                             env: Prereqs) -> None:
    name = fresh("hp")
    first = env.group("workers", 1, "ml.m7i.2xlarge")
    sm.create_cluster(**env.cluster(name, first, NodeProvisioningMode="Continuous"))
    in_service(world, sm, name)
    world.faults.inject("insufficient_capacity", {"instance_type": "ml.m7i.2xlarge"})
    sm.update_cluster(ClusterName=name, InstanceGroups=[{**first, "InstanceCount": 4, "MinInstanceCount": 4}])
    world.advance(3 * 3600 + 60)
    group = groups(sm, name)["workers"]
    assert (group["TargetCount"], group["CurrentCount"]) == (1, 1) and "MinCount" not in group
    assert len(nodes(sm, name, IncludeNodeLogicalIds=True)) == 1


# --- training plans (gap 7) -------------------------------------------------------------------------------


def plan(world: AwsWorld, sm: Any, count: int, instance_type: str) -> dict[str, Any]:
    offering = sm.search_training_plan_offerings(InstanceType=instance_type, InstanceCount=count, DurationHours=24,
                                                 TargetResources=["hyperpod-cluster"])["TrainingPlanOfferings"][0]
    arn = sm.create_training_plan(TrainingPlanName=fresh("plan"),
                                  TrainingPlanOfferingId=offering["TrainingPlanOfferingId"])["TrainingPlanArn"]
    return dict(sm.describe_training_plan(TrainingPlanName=arn.rsplit("/", 1)[-1]))


@pytest.fixture
def p5_quota(world: AwsWorld) -> Iterator[str]:
    """ml.p5.4xlarge (reservable, quota 0 by default) with an approved cluster-usage quota of 3."""
    world.quotas.set_limit("ml.p5.4xlarge", 3)
    yield "ml.p5.4xlarge"
    world.quotas.set_limit("ml.p5.4xlarge", 0)


def test_training_plan_rules_and_launch_when_active(world: AwsWorld, sm: Any, env: Prereqs, p5_quota: str) -> None:
    reserved = plan(world, sm, 2, p5_quota)
    arn, zone = reserved["TrainingPlanArn"], reserved["ReservedCapacitySummaries"][0]["AvailabilityZone"]
    assert reserved["Status"] == "Pending" and zone == "us-west-2a"
    in_zone = {"SecurityGroupIds": [env.security_group], "Subnets": [env.subnets[0]]}  # the a-zone subnet
    good = env.group("reserved", 2, p5_quota, TrainingPlanArn=arn, OverrideVpcConfig=in_zone)
    name = fresh("hp")
    message = refused(sm.create_cluster, **env.cluster(name, good, NodeProvisioningMode="Continuous"))
    assert message == (f"Instance group reserved: training plan {arn} is in Pending status; it must be Scheduled "
                       "or Active.")
    world.advance(300)
    assert sm.describe_training_plan(TrainingPlanName=reserved["TrainingPlanName"])["Status"] == "Scheduled"
    wrong_zone = {k: v for k, v in good.items() if k != "OverrideVpcConfig"}  # the cluster's subnets span a and b
    message = refused(sm.create_cluster, **env.cluster(name, wrong_zone))
    assert message.startswith(f"Instance group reserved: subnet {env.subnets[1]} is in us-west-2b, but training "
                              f"plan {arn} reserves capacity in us-west-2a.")
    message = refused(sm.create_cluster, **env.cluster(name, {**good, "CapacityRequirements": {"Spot": {}}}))
    assert message == ("Instance group reserved: TrainingPlanArn cannot be used together with Spot capacity "
                       "(CapacityRequirements.Spot).")
    message = refused(sm.create_cluster, **env.cluster(name, {**good, "InstanceCount": 3}))
    assert message.startswith(f"Instance group reserved: InstanceCount 3 exceeds the capacity of training plan {arn}: "
                              "2 instances reserved")
    sm.create_cluster(**env.cluster(name, good, NodeProvisioningMode="Continuous"))
    world.advance(SETUP + BOOT_SECONDS)
    waiting = nodes(sm, name, IncludeNodeLogicalIds=True)
    assert [n["InstanceStatus"]["Status"] for n in waiting] == ["Pending", "Pending"]
    assert all("InstanceId" not in n for n in waiting)
    assert waiting[0]["InstanceStatus"]["Message"] == (f"Waiting for training plan {reserved['TrainingPlanName']} "
                                                       "to become Active.")
    start = sm.describe_training_plan(TrainingPlanName=reserved["TrainingPlanName"])["StartTime"].timestamp()
    world.advance(start - world.clock.now() + BOOT_SECONDS + 60)
    assert sm.describe_training_plan(TrainingPlanName=reserved["TrainingPlanName"])["Status"] == "Active"
    running = nodes(sm, name)
    assert [n["InstanceStatus"]["Status"] for n in running] == ["Running", "Running"]
    launched = {sm.describe_cluster_node(ClusterName=name, NodeId=n["InstanceId"])["NodeDetails"]["Placement"][
        "AvailabilityZone"] for n in running}
    assert launched == {"us-west-2a"}
    sm.batch_add_cluster_nodes(ClusterName=name, NodesToAdd=[{"InstanceGroupName": "reserved",
                                                              "IncrementTargetCountBy": 1}])
    world.advance(BOOT_SECONDS * 2)
    statuses = sorted(n["InstanceStatus"]["Status"] for n in nodes(sm, name, IncludeNodeLogicalIds=True))
    assert statuses == ["Pending", "Running", "Running"]  # the plan reserves two: the third never launches
    third = next(n for n in nodes(sm, name, IncludeNodeLogicalIds=True) if n["InstanceStatus"]["Status"] == "Pending")
    assert third["InstanceStatus"]["Message"] == (f"All 2 instances of training plan {reserved['TrainingPlanName']} "
                                                  "are in use.")


# --- deep health checks and Spot (gap 8) ------------------------------------------------------------------


def dhc_cluster(world: AwsWorld, sm: Any, env: Prereqs, instance_type: str, count: int = 1) -> str:
    name = fresh("hp")
    sm.create_cluster(**env.cluster(name, env.group("checked", count, instance_type,
                                                    OnStartDeepHealthChecks=["InstanceConnectivity"]),
                                    NodeProvisioningMode="Continuous", NodeRecovery="Automatic"))
    world.advance(SETUP + BOOT_SECONDS + 1)  # booted: the deep health checks run now
    assert {n["InstanceStatus"]["Status"] for n in nodes(sm, name)} == {"DeepHealthCheckInProgress"}
    return name


def test_update_is_refused_while_deep_health_checks_run(world: AwsWorld, sm: Any, env: Prereqs) -> None:
    name = dhc_cluster(world, sm, env, "ml.c6i.2xlarge")
    spec = env.group("checked", 2, "ml.c6i.2xlarge", OnStartDeepHealthChecks=["InstanceConnectivity"])
    message = refused(sm.update_cluster, ClusterName=name, InstanceGroups=[spec])
    assert message == ("Instance group checked cannot be updated while deep health checks are in progress on its "
                       "instances.")
    assert groups(sm, name)["checked"]["TargetCount"] == 1
    world.advance(CHECK_SECONDS["InstanceConnectivity"])
    sm.update_cluster(ClusterName=name, InstanceGroups=[spec])
    assert groups(sm, name)["checked"]["TargetCount"] == 2


def test_a_reboot_during_deep_health_checks_leaves_no_in_progress_label(world: AwsWorld, sm: Any,
                                                                        env: Prereqs) -> None:
    name = dhc_cluster(world, sm, env, "ml.c6i.4xlarge")
    node = nodes(sm, name)[0]["InstanceId"]
    assert kube_labels(world, env, node)[DHC_LABEL] == "InProgress"
    assert sm.batch_reboot_cluster_nodes(ClusterName=name, NodeIds=[node])["Successful"] == [node]
    world.advance(REBOOT_SECONDS + CHECK_SECONDS["InstanceConnectivity"])
    assert nodes(sm, name)[0]["InstanceStatus"]["Status"] == "Running"
    labels = kube_labels(world, env, node)
    assert labels[HEALTH] == "Schedulable" and DHC_LABEL not in labels


def test_deep_health_check_failed_fault_replaces_the_node(world: AwsWorld, sm: Any, env: Prereqs) -> None:
    name = dhc_cluster(world, sm, env, "ml.c6i.8xlarge")
    failing = nodes(sm, name)[0]["InstanceId"]
    world.faults.inject("deep_health_check_failed", {"cluster": name, "check": "InstanceConnectivity"})
    world.advance(CHECK_SECONDS["InstanceConnectivity"])
    labels = kube_labels(world, env, failing)
    assert labels[DHC_LABEL] == "Failed" and labels[HEALTH] == "UnschedulablePendingReplacement"
    world.advance(DETECT + 1)
    assert failing not in {n["InstanceId"] for n in nodes(sm, name) if n["InstanceStatus"]["Status"] != "ShuttingDown"}
    world.advance(BOOT_SECONDS + CHECK_SECONDS["InstanceConnectivity"] + 600)
    replaced = [n for n in nodes(sm, name) if n["InstanceId"] != failing]
    assert [n["InstanceStatus"]["Status"] for n in replaced] == ["Running"]  # the fault was one-shot: it passes
    assert kube_labels(world, env, replaced[0]["InstanceId"])[DHC_LABEL] == "Passed"


def test_spot_reclaimed_fault_takes_spot_nodes_only_and_they_are_replaced(world: AwsWorld, sm: Any,
                                                                          env: Prereqs) -> None:
    name = fresh("hp")
    sm.create_cluster(**env.cluster(name, env.group("spot", 1, "ml.c6i.12xlarge", CapacityRequirements={"Spot": {}}),
                                    env.group("steady", 1, "ml.c6i.16xlarge"), NodeProvisioningMode="Continuous"))
    in_service(world, sm, name)
    before = {n["InstanceGroupName"]: n["InstanceId"] for n in nodes(sm, name)}
    world.faults.inject("spot_reclaimed", {"cluster": name})
    world.advance(1)
    status = {n["InstanceId"]: n["InstanceStatus"]["Status"] for n in nodes(sm, name)}
    assert status[before["spot"]] == "ShuttingDown" and status[before["steady"]] == "Running"
    assert "EC2 reclaimed the Spot instance (Spot interruption); a replacement is being launched." in events(sm, name)
    world.advance(BOOT_SECONDS + 600)
    after = {n["InstanceGroupName"]: n["InstanceId"] for n in nodes(sm, name) if n["InstanceStatus"]["Status"] ==
             "Running"}
    assert after["steady"] == before["steady"] and after["spot"] != before["spot"]
    assert world.faults.list() == []  # one-shot: used up by the one Spot node


def test_autoscaling_goes_creating_to_in_service_or_failed_and_deleting_when_disabled(
        world: AwsWorld, sm: Any, env: Prereqs) -> None:
    """AutoScaling.Status takes the API's four values: Creating after an enable, then InService, or Failed with
    the FailureMessage an ``autoscaling_failed`` fault names (a failed autoscaling scales nothing); Deleting
    after a disable (Mode reads Disable at once), then InService."""
    name = fresh("hp")
    scaler = role(lambda service: make_client(world, service), fresh("scaler"), "hyperpod.sagemaker.amazonaws.com")
    sm.create_cluster(**env.cluster(name, env.group("g", 0, "ml.t3.medium"), NodeProvisioningMode="Continuous"))
    assert "AutoScaling" not in in_service(world, sm, name)
    enable = {"ClusterName": name, "ClusterRole": scaler, "AutoScaling": {"Mode": "Enable", "AutoScalerType":
                                                                            "Karpenter"}}
    sm.update_cluster(**enable)
    assert sm.describe_cluster(ClusterName=name)["AutoScaling"] == {"Mode": "Enable", "AutoScalerType": "Karpenter",
                                                                   "Status": "Creating"}
    world.advance(SCALING_SECONDS)
    assert sm.describe_cluster(ClusterName=name)["AutoScaling"]["Status"] == "InService"

    sm.update_cluster(ClusterName=name, AutoScaling={"Mode": "Disable"})
    assert sm.describe_cluster(ClusterName=name)["AutoScaling"] == {"Mode": "Disable", "Status": "Deleting"}
    world.advance(SCALING_SECONDS)
    assert sm.describe_cluster(ClusterName=name)["AutoScaling"] == {"Mode": "Disable", "Status": "InService"}

    world.faults.inject("autoscaling_failed", {"cluster": name, "message": "Karpenter setup failed: quota."})
    sm.update_cluster(**enable)
    world.advance(SCALING_SECONDS)
    scaling = sm.describe_cluster(ClusterName=name)["AutoScaling"]
    assert scaling["Status"] == "Failed" and scaling["FailureMessage"] == "Karpenter setup failed: quota."
    assert world.faults.list() == [], "one-shot: used up by this enable"
    assert "Autoscaling failed: Karpenter setup failed: quota." in events(sm, name)
    sm.update_cluster(ClusterName=name, AutoScaling={"Mode": "Disable"})  # a failed autoscaling can be disabled
    assert sm.describe_cluster(ClusterName=name)["AutoScaling"]["Status"] == "Deleting"
    world.advance(SCALING_SECONDS)
    assert sm.describe_cluster(ClusterName=name)["AutoScaling"] == {"Mode": "Disable", "Status": "InService"}


def test_the_sandbox_api_and_cli_offer_every_fault_kind_with_its_target() -> None:
    assert set(get_args(FaultKind)) == set(FAULT_KINDS) == set(CLI_FAULT_KINDS)
    dhc = FaultInject.model_validate({"kind": "deep_health_check_failed",
                                      "target": {"cluster": "hp", "check": "InstanceStress"}})
    assert dhc.target_keys() == {"cluster": "hp", "check": "InstanceStress"}
    spot = FaultInject.model_validate({"kind": "spot_reclaimed", "target": {"cluster": "hp", "instance_group": "g"}})
    assert spot.target_keys() == {"cluster": "hp", "instance_group": "g"}
    with pytest.raises(ValueError, match="spot_reclaimed needs target keys"):
        FaultInject.model_validate({"kind": "spot_reclaimed", "target": {"node": "i-0123456789abcdef0"}})
    with pytest.raises(ValueError):
        FaultInject.model_validate({"kind": "deep_health_check_failed", "target": {"cluster": "hp", "check": "Ping"}})
    failing = FaultInject.model_validate({"kind": "autoscaling_failed", "target": {"cluster": "hp"}})
    assert failing.target_keys() == {"cluster": "hp"}
