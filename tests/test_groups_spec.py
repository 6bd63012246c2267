"""``services/groups/spec.py``: DescribeCluster's group details -> UpdateCluster's group specification, checked
against botocore's own model of both shapes (the one the product's clients load)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

import botocore.session

from sandbox.aws.eks_nodegroups import node_config
from services.groups.nodegroups import eks_taints, nodegroup_update
from services.groups.spec import SPEC_MEMBERS, comparable, full_group_list, group_spec, patch_date, update_groups

MODEL = botocore.session.get_session().get_service_model("sagemaker")


def members(shape: str) -> set[str]:
    return set(MODEL.shape_for(shape).members)


DETAILS: dict[str, Any] = {
    "CurrentCount": 3, "TargetCount": 4, "MinCount": 2, "InstanceGroupName": "gpu", "InstanceType": "ml.p5.48xlarge",
    "LifeCycleConfig": {"SourceS3Uri": "s3://b/lifecycle/", "OnCreate": "on_create.sh"},
    "ExecutionRole": "arn:aws:iam::123456789012:role/exec", "ThreadsPerCore": 2,
    "InstanceStorageConfigs": [{"EbsVolumeConfig": {"VolumeSizeInGB": 500}}],
    "OnStartDeepHealthChecks": ["InstanceStress"], "Status": "Updating",
    "TrainingPlanArn": "arn:aws:sagemaker:us-west-2:123456789012:training-plan/p", "TrainingPlanStatus": "Active",
    "OverrideVpcConfig": {"SecurityGroupIds": ["sg-1"], "Subnets": ["subnet-1"]},
    "ScheduledUpdateConfig": {"ScheduleExpression": "cron(0 4 ? * SUN *)"},
    "AutoPatchConfig": {"PatchingStrategy": "DrainFirst", "CurrentPatchSchedule": {"NextPatchDate": 1},
                        "DesiredPatchSchedule": {"NextPatchDate": 2}, "IdleWaitWindowInSeconds": 3600,
                        "DrainPolicy": {"DrainTimeoutInSeconds": 60, "OnDrainTimeout": "Skip"}},
    "CurrentImageId": "ami-old", "DesiredImageId": "ami-new", "CurrentImageReleaseVersion": "1.0.0",
    "DesiredImageReleaseVersion": "1.1.0", "ImageVersionStatus": "UpdateAvailable", "ActiveOperations": {"Scaling": 1},
    "KubernetesConfig": {"CurrentLabels": {"a": "1"}, "DesiredLabels": {"a": "2"},
                         "CurrentTaints": [], "DesiredTaints": [{"Key": "k", "Effect": "NoSchedule"}]},
    "CapacityRequirements": {"OnDemand": {}}, "TargetStateCount": 3, "SoftwareUpdateStatus": "InProgress",
    "NetworkInterface": {"InterfaceType": "efa-only"},
}


def test_spec_members_are_exactly_the_models() -> None:
    assert set(SPEC_MEMBERS) == members("ClusterInstanceGroupSpecification")


def test_details_become_a_spec_with_only_spec_members_and_the_desired_values() -> None:
    assert set(DETAILS) <= members("ClusterInstanceGroupDetails"), "the fixture uses only real detail members"
    spec = group_spec(DETAILS)
    assert set(spec) <= members("ClusterInstanceGroupSpecification")
    for shape in ("Status", "CurrentCount", "TargetCount", "ActiveOperations", "TrainingPlanStatus"):
        assert shape not in spec
    assert spec["InstanceCount"] == 4 and spec["MinInstanceCount"] == 2
    assert spec["ImageId"] == "ami-new" and spec["ImageReleaseVersion"] == "1.1.0"
    assert spec["KubernetesConfig"] == {"Labels": {"a": "2"}, "Taints": [{"Key": "k", "Effect": "NoSchedule"}]}
    assert spec["AutoPatchConfig"] == {"PatchingStrategy": "DrainFirst", "PatchSchedule": {"NextPatchDate": 2},
                                       "IdleWaitWindowInSeconds": 3600,
                                       "DrainPolicy": {"DrainTimeoutInSeconds": 60, "OnDrainTimeout": "Skip"}}
    assert spec["NetworkInterface"] == {"InterfaceType": "efa-only"}
    # every member the details carry a value for is carried over: nothing dropped
    assert set(spec) == set(SPEC_MEMBERS) - {"InstanceRequirements", "SlurmConfig"}
    assert DETAILS["KubernetesConfig"]["CurrentLabels"] == {"a": "1"}, "the details are not modified"


def test_flexible_types_replace_the_single_type() -> None:
    details = {**DETAILS, "InstanceRequirements": {"CurrentInstanceTypes": ["ml.p5.48xlarge"],
                                                   "DesiredInstanceTypes": ["ml.p5.48xlarge", "ml.p5e.48xlarge"]}}
    spec = group_spec(details)
    assert spec["InstanceRequirements"] == {"InstanceTypes": ["ml.p5.48xlarge", "ml.p5e.48xlarge"]}
    assert "InstanceType" not in spec


def test_the_full_list_keeps_every_other_group_and_replaces_one() -> None:
    other = {**DETAILS, "InstanceGroupName": "cpu", "TargetCount": 1}
    cluster = {"InstanceGroups": [other, DETAILS]}
    changed = {**group_spec(DETAILS), "InstanceCount": 0, "MinInstanceCount": 0}
    sent = full_group_list(cluster, replace=changed)
    assert sent == [group_spec(other), changed]
    added = full_group_list(cluster, replace={"InstanceGroupName": "new", "InstanceCount": 1})
    assert [g["InstanceGroupName"] for g in added] == ["cpu", "gpu", "new"]
    assert full_group_list(cluster, without="gpu") == [group_spec(other)]


class _Cluster:
    """A HyperPod cluster's group list as UpdateCluster sets it (the AWS side of update_groups), and the payloads
    it was sent, in order."""

    def __init__(self, groups: list[dict[str, Any]]) -> None:
        self.groups, self.sent = groups, []  # type: list[dict[str, Any]]

    def describe_cluster(self) -> dict[str, Any]:
        return {"ClusterStatus": "Updating", "InstanceGroups": [dict(g) for g in self.groups]}

    def update_cluster(self, ClusterName: str, InstanceGroups: list[dict[str, Any]]) -> None:
        self.sent.append({g["InstanceGroupName"]: g["InstanceCount"] for g in InstanceGroups})
        self.groups = [dict(g, TargetCount=g["InstanceCount"]) for g in InstanceGroups]


def test_sibling_group_updates_do_not_lose_each_others_change() -> None:
    """B starts while A holds the describe->update window: B's payload carries A's change (it described after
    A's UpdateCluster), and A's carries nothing stale of B's."""
    aws = _Cluster([{"InstanceGroupName": "a", "TargetCount": 1}, {"InstanceGroupName": "b", "TargetCount": 1}])
    b_built = threading.Event()

    def build_b(cluster: dict[str, Any]) -> dict[str, Any]:
        b_built.set()
        return {"InstanceGroups": full_group_list(cluster, replace={"InstanceGroupName": "b", "InstanceCount": 5})}

    def run_b() -> None:
        update_groups("r", "c", aws.describe_cluster, aws.update_cluster, build_b)

    second = threading.Thread(target=run_b)

    def build_a(cluster: dict[str, Any]) -> dict[str, Any]:
        second.start()
        b_built.wait(2)  # without the lock B describes the old list meanwhile; with it B waits for A's update
        return {"InstanceGroups": full_group_list(cluster, replace={"InstanceGroupName": "a", "InstanceCount": 3})}

    update_groups("r", "c", aws.describe_cluster, aws.update_cluster, build_a)
    second.join(30)
    assert aws.sent == [{"a": 3, "b": 1}, {"a": 3, "b": 5}]
    assert {g["InstanceGroupName"]: g["TargetCount"] for g in aws.groups} == {"a": 3, "b": 5}


def test_a_sent_clear_and_a_patch_date_compare_equal_to_what_describe_reads_back() -> None:
    sent = {"InstanceGroupName": "g", "InstanceCount": 0, "KubernetesConfig": {"Labels": {}, "Taints": []},
            "AutoPatchConfig": {"PatchingStrategy": "WhenIdle",
                                "PatchSchedule": {"NextPatchDate": "2026-12-24T05:00:00+02:00"}}}
    details = {"InstanceGroupName": "g", "KubernetesConfig": {"DesiredLabels": {}, "DesiredTaints": []},
               "AutoPatchConfig": {"PatchingStrategy": "WhenIdle", "DesiredPatchSchedule": {
                   "NextPatchDate": datetime(2026, 12, 24, 3, 0, tzinfo=UTC)}}}
    assert comparable(group_spec(details)) == comparable(sent)
    assert patch_date("2026-12-24T03:00:00Z") == patch_date(datetime(2026, 12, 24, 3, 0, 0, 500, tzinfo=UTC))
    assert comparable({**sent, "KubernetesConfig": {"Labels": {"a": "1"}, "Taints": []}}) != comparable(sent)


def test_a_node_groups_update_carries_only_the_difference() -> None:
    group = {"scalingConfig": {"minSize": 1, "maxSize": 2, "desiredSize": 1}, "labels": {"a": "1", "b": "2"},
             "taints": [{"key": "x", "value": "v", "effect": "NO_SCHEDULE"}, {"key": "y", "effect": "NO_EXECUTE"}]}
    assert nodegroup_update(group, {"desiredSize": 1}, {"a": "1", "b": "2"}, list(group["taints"])) == {}
    assert nodegroup_update(group, None, None, None) == {}
    wanted = eks_taints([{"key": "x", "value": "v", "effect": "PreferNoSchedule"},
                         {"key": "z", "effect": "NoSchedule"}])
    assert nodegroup_update(group, {"desiredSize": 2}, {"a": "9", "c": "3"}, wanted) == {
        "scalingConfig": {"desiredSize": 2},
        "labels": {"addOrUpdateLabels": {"a": "9", "c": "3"}, "removeLabels": ["b"]},
        # a taint is its key and effect: x with another effect is another taint (added, and the old one goes)
        "taints": {"addOrUpdateTaints": wanted, "removeTaints": [{"key": "x", "value": "v", "effect": "NO_SCHEDULE"},
                                                                 {"key": "y", "effect": "NO_EXECUTE"}]}}


def test_a_node_groups_taint_diff_lands_as_the_sandbox_applies_it() -> None:
    """The diff and the sandbox's UpdateNodegroupConfig agree: what is sent makes the group's taints the asked
    set, whether a taint's value, its effect or its presence changes."""
    group = {"taints": [{"key": "x", "value": "v", "effect": "NO_SCHEDULE"}, {"key": "y", "effect": "NO_EXECUTE"},
                        {"key": "x", "effect": "NO_EXECUTE"}]}
    for asked in ([{"key": "x", "value": "w", "effect": "NoSchedule"}, {"key": "x", "effect": "NoExecute"}],
                  [{"key": "x", "value": "v", "effect": "PreferNoSchedule"}, {"key": "y", "effect": "NoExecute"}],
                  [{"key": "x", "effect": "NoExecute"}, {"key": "z", "value": "1", "effect": "NoSchedule"}], []):
        wanted = eks_taints(asked)
        after = {"taints": [dict(t) for t in group["taints"]]}
        params = nodegroup_update(group, None, None, wanted)
        node_config(after, params)
        assert sorted(map(str, after["taints"])) == sorted(map(str, wanted)), asked
        assert nodegroup_update(after, None, None, wanted) == {}
    same_value = nodegroup_update(group, None, None, eks_taints([{"key": "x", "value": "w", "effect": "NoSchedule"},
                                                                 {"key": "x", "effect": "NoExecute"},
                                                                 {"key": "y", "effect": "NoExecute"}]))
    # a value changes: only added (it replaces the value of that key and effect), the key's other taint stays
    assert same_value == {"taints": {"addOrUpdateTaints": [{"key": "x", "value": "w", "effect": "NO_SCHEDULE"}]}}
