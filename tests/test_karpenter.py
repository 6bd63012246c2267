"""Managed Karpenter against the sandbox: the preflight names each missing prerequisite and each ineligible
group by its rule; enabling makes the cluster role (trusting hyperpod.sagemaker.amazonaws.com, scoped to this
cluster), sends UpdateCluster with only AutoScaling + ClusterRole, and applies our HyperpodNodeClass and NodePool
naming only the chosen groups, never touching a NodePool we did not make; a re-apply writes nothing; pending pods
make HyperPod's Karpenter add nodes to the eligible group they fit (DescribeCluster and the Kubernetes API show
them), within the NodePool's node limit, and remove them once empty; disabling removes exactly what we made. On
a slower world: an enable HyperPod fails (``autoscaling_failed``) is a failure naming HyperPod's reason, not a
wait, and disabling waits out AutoScaling ``Deleting`` before it deletes the role."""

from __future__ import annotations

import copy
import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from pydantic import ValidationError

from sandbox.aws.hyperpod_karpenter import SCALING_SECONDS
from services.auth import Principal, Role
from services.clusters.models import ClusterRecord, Ownership
from services.components.families import HEALTH_AGENT, HYPERPOD_RBAC, NVIDIA_PLUGIN
from services.components.karpenter import (
    MIN_HMA,
    OBJECT_NAME,
    PREREQUISITES,
    KarpenterSettings,
    ManagedKarpenter,
)
from services.errors import Conflict, Permanent
from services.groups.models import GroupPatch
from services.operations import OperationQuery
from tests.scale_support import ScaleWorld, remove, scale_world, settle
from tests.support import wait_until

pytestmark = pytest.mark.slow
NAME = "scaler"
GROUPS: list[tuple[str, int, dict[str, Any]]] = [
    ("gpu", 0, {}), ("cpu", 0, {"InstanceType": "ml.m5.2xlarge"}), ("warm", 1, {"InstanceType": "ml.c5.xlarge"})]
KARPENTER = "karpenter.sh"
NODECLASS = "karpenter.sagemaker.amazonaws.com"
THEIRS = {"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "theirs"}, "spec": {"template": {
    "spec": {"nodeClassRef": {"group": NODECLASS, "kind": "HyperpodNodeClass", "name": "theirs"},
             "requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "Exists"}]}}}}


SLOW = 100.0  # AutoScaling is Creating and Deleting for SCALING_SECONDS (600 simulated): 6 real seconds here


@pytest.fixture(scope="module")
def slow_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScaleWorld]:
    with scale_world(tmp_path_factory.mktemp("karpenter-slow"), "failing", [("gpu", 0, {})], speed=SLOW) as made:
        yield made


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScaleWorld]:
    with scale_world(tmp_path_factory.mktemp("karpenter"), NAME, GROUPS) as made:
        wait_until(lambda: made.describe()["InstanceGroups"][2]["CurrentCount"] == 1, 60, "warm group's node up")
        made.product.services.clusters.registry.add(ClusterRecord(  # the instance-groups verbs find it
            name=NAME, region="us-west-2", eks_name=NAME, hyperpod_name=NAME, ownership=Ownership.IMPORTED,
            eks_arn=made.product.client("eks").describe_cluster(name=NAME)["cluster"]["arn"], created_at="",
            created_by="tester"), 0.0)
        yield made


def _api(world: ScaleWorld) -> Any:
    return world.product.services.kube.api_client(NAME)


def _writes(world: ScaleWorld, since: int) -> Counter[str]:
    out: Counter[str] = Counter()
    for e in world.ledger.writes(since):
        out[f"{e['service']}:{e['operation']}" if e.get("kind") == "aws" else
            f"k8s:{e['verb']}:{e['resource']}"] += 1
    return out


def _agent(world: ScaleWorld) -> None:
    """HyperPod's health-monitoring agent (its namespace comes with the HyperPod RBAC component) and the NVIDIA
    device plugin, as the dependencies stage installs them on a GPU cluster."""
    for component in (HYPERPOD_RBAC, HEALTH_AGENT, NVIDIA_PLUGIN):
        settle(component, world.target())


def _group(world: ScaleWorld, name: str) -> dict[str, Any]:
    return next(g for g in world.describe()["InstanceGroups"] if g["InstanceGroupName"] == name)


def _scaling_or_deleting_a_karpenter_group_is_refused(world: ScaleWorld) -> None:
    """Our node class names gpu and cpu: the instance-groups verbs refuse to scale or delete either in their
    precheck, naming the node class and what to do first, before any operation row or write."""
    groups = world.product.services.groups
    operator, admin = Principal("tester", Role.OPERATOR, "t-op", "api"), Principal("root", Role.ADMIN, "t-adm", "api")
    mark = world.ledger.mark()
    rows = len(world.product.services.engine.list(OperationQuery()))
    with pytest.raises(Conflict, match=f"HyperpodNodeClass {OBJECT_NAME} names it") as scaled:
        groups.update_group(operator, NAME, "gpu", GroupPatch(count=2))
    assert "Remove it from autoscaling first" in scaled.value.message and "then scale it" in scaled.value.message
    assert scaled.value.details["node_class_groups"] == ["gpu", "cpu"]
    with pytest.raises(Conflict, match="managed_karpenter: false") as deleted:
        groups.delete_group(admin, NAME, "cpu")
    assert "not Ready" in deleted.value.message and deleted.value.details["rule"] == "karpenter-managed-group"
    world.ledger.assert_no_writes(since=mark)
    assert len(world.product.services.engine.list(OperationQuery())) == rows, "refused before any operation row"


def test_settings_refuse_ec2_capacity_and_too_many_groups() -> None:
    assert PREREQUISITES == ("health-monitoring-agent",)
    with pytest.raises(ValidationError, match="HyperPod instance groups only"):
        KarpenterSettings(instance_groups=["gpu"], capacity="ec2")
    with pytest.raises(ValidationError):
        KarpenterSettings(instance_groups=[f"g{i}" for i in range(11)])
    with pytest.raises(ValidationError, match="twice"):
        KarpenterSettings(instance_groups=["gpu", "gpu"])


def test_the_preflight_names_each_missing_prerequisite_and_each_ineligible_group(world: ScaleWorld) -> None:
    target = world.target()
    feature = ManagedKarpenter(KarpenterSettings(instance_groups=["gpu", "warm", "dhc", "planned", "nope"]))
    described = copy.deepcopy(world.describe())
    described.pop("NodeProvisioningMode")
    described["NodeRecovery"] = "None"
    described["InstanceGroups"] += [
        {"InstanceGroupName": "dhc", "InstanceType": "ml.g5.8xlarge", "CurrentCount": 0, "TargetCount": 0,
         "OnStartDeepHealthChecks": ["InstanceStress"]},
        {"InstanceGroupName": "planned", "InstanceType": "ml.g5.8xlarge", "CurrentCount": 0, "TargetCount": 0,
         "TrainingPlanArn": "arn:aws:sagemaker:us-west-2:123456789012:training-plan/p"}]
    ext = k8s.ApiextensionsV1Api(_api(world))
    ext.create_custom_resource_definition({  # a self-managed Karpenter of the v1beta1 era
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "nodeclaims.karpenter.sh"},
        "spec": {"group": KARPENTER, "scope": "Cluster", "names": {"plural": "nodeclaims", "kind": "NodeClaim"},
                 "versions": [{"name": "v1beta1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                     "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}})
    mark = world.ledger.mark()
    try:
        problems = feature.problems(target, described)
        world.ledger.assert_no_writes(since=mark)
    finally:
        ext.delete_custom_resource_definition("nodeclaims.karpenter.sh")
    text = "\n".join(problems)
    for expected in ("NodeProvisioningMode=Continuous", "NodeRecovery=None", f"needs {MIN_HMA} or later",
                     "nodeclaims.karpenter.sh CRD serves v1beta1, not v1",
                     "instance group warm has 1 node(s): managed Karpenter needs groups that start at 0",
                     "instance group dhc runs deep health checks on start (InstanceStress)",
                     "instance group planned uses training plan", "has no instance group nope"):
        assert expected in text, (expected, problems)
    assert "instance group gpu" not in text
    assert len(problems) == 8, problems

    nothing = ManagedKarpenter().problems(target)
    assert any("eligible: gpu, cpu)" in p for p in nothing), nothing


def test_an_ineligible_group_is_refused_before_anything_is_written(world: ScaleWorld) -> None:
    _agent(world)
    feature = ManagedKarpenter(KarpenterSettings(instance_groups=["gpu", "warm"]))
    mark = world.ledger.mark()
    observed = feature.observe(world.target())
    assert observed.failed is not None and "instance group warm has 1 node(s)" in observed.failed
    assert "gpu" not in observed.failed
    with pytest.raises(Permanent, match="start at 0"):
        feature.apply(world.target(), observed)
    world.ledger.assert_no_writes(since=mark)


def test_enable_scale_for_pending_pods_then_disable(world: ScaleWorld) -> None:
    target = world.target()
    api = _api(world)
    custom = k8s.CustomObjectsApi(api)
    _agent(world)
    feature = ManagedKarpenter(KarpenterSettings(instance_groups=["gpu", "cpu"], max_nodes=3))

    mark = world.ledger.mark()
    settle(feature, target)
    writes = _writes(world, mark)
    assert writes == Counter({"iam:CreateRole": 1, "iam:PutRolePolicy": 1, "sagemaker:UpdateCluster": 1,
                              "k8s:patch:hyperpodnodeclasses.karpenter.sagemaker.amazonaws.com": 1,
                              "k8s:patch:nodepools.karpenter.sh": 1}), writes
    update = world.ledger.once("sagemaker", "UpdateCluster", since=mark)["request"]
    role_arn = f"arn:aws:iam::123456789012:role/{NAME}-karpenter"
    assert update == {"ClusterName": NAME, "AutoScaling": {"Mode": "Enable", "AutoScalerType": "Karpenter"},
                      "ClusterRole": role_arn}
    created = world.ledger.once("iam", "CreateRole", since=mark)["request"]
    assert json.loads(created["AssumeRolePolicyDocument"])["Statement"][0]["Principal"] == {
        "Service": ["hyperpod.sagemaker.amazonaws.com"]}
    policy = json.loads(world.ledger.once("iam", "PutRolePolicy", since=mark)["request"]["PolicyDocument"])
    assert policy["Statement"][0]["Resource"] == world.describe()["ClusterArn"]
    assert world.describe()["AutoScaling"]["Mode"] == "Enable"

    node_class = custom.get_cluster_custom_object(NODECLASS, "v1", "hyperpodnodeclasses", OBJECT_NAME)
    assert node_class["spec"]["instanceGroups"] == ["gpu", "cpu"]
    pool = custom.get_cluster_custom_object(KARPENTER, "v1", "nodepools", OBJECT_NAME)
    assert pool["spec"]["template"]["spec"]["requirements"][0]["values"] == ["ml.g5.8xlarge", "ml.m5.2xlarge"]
    assert pool["spec"]["limits"] == {"nodes": 3}
    assert "warm" not in json.dumps(node_class) + json.dumps(pool)

    custom.create_cluster_custom_object(KARPENTER, "v1", "nodepools", THEIRS)  # someone else's
    theirs = custom.get_cluster_custom_object(KARPENTER, "v1", "nodepools", "theirs")["metadata"]["resourceVersion"]

    mark = world.ledger.mark()
    again = feature.observe(target)
    assert again.settled and feature.diff(again) == [] and again.settings["instance_groups"] == ["gpu", "cpu"]
    world.ledger.assert_no_writes(since=mark)

    _scaling_or_deleting_a_karpenter_group_is_refused(world)

    # pending pods: two that need a GPU each (one per ml.g5.8xlarge), one that no group can run
    core = k8s.CoreV1Api(api)
    for name, gpus in (("train-0", 1), ("train-1", 1), ("huge", 8)):
        core.create_namespaced_pod("default", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                                               "spec": {"containers": [{"name": "c", "image": "busybox", "resources": {
                                                   "limits": {"nvidia.com/gpu": str(gpus)}}}]}})
    wait_until(lambda: _group(world, "gpu")["CurrentCount"] == 2, 120, "Karpenter scaled gpu to 2 nodes")
    nodes = core.list_node(label_selector="sagemaker.amazonaws.com/instance-group-name=gpu").items
    assert len(nodes) == 2
    wait_until(lambda: all(core.read_namespaced_pod(p, "default").spec.node_name for p in ("train-0", "train-1")),
               60, "the pods bound to the new nodes")
    assert core.read_namespaced_pod("huge", "default").spec.node_name is None
    assert _group(world, "cpu")["TargetCount"] == 0 and _group(world, "gpu")["TargetCount"] == 2
    assert _group(world, "warm")["TargetCount"] == 1, "a group outside our node class is never scaled"

    # the limit: 3 nodes in all, so of two more GPU pods only one gets a node
    for name in ("train-2", "train-3"):
        core.create_namespaced_pod("default", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                                               "spec": {"containers": [{"name": "c", "image": "busybox", "resources": {
                                                   "limits": {"nvidia.com/gpu": "1"}}}]}})
    bound = wait_until(lambda: [p for p in ("train-2", "train-3")
                                if core.read_namespaced_pod(p, "default").spec.node_name], 120, "a third pod bound")
    assert len(bound) == 1 and _group(world, "gpu")["TargetCount"] == 3
    assert len(core.list_node(label_selector="sagemaker.amazonaws.com/instance-group-name=gpu").items) == 3

    # narrowing the groups: gpu has nodes now, but it is past its start (in our node class): still eligible
    narrowed = feature.configured(KarpenterSettings(instance_groups=["gpu"], max_nodes=3))
    mark = world.ledger.mark()
    observed = settle(narrowed, target)
    assert observed.settings["instance_groups"] == ["gpu"]
    assert _writes(world, mark) == Counter({"k8s:patch:hyperpodnodeclasses.karpenter.sagemaker.amazonaws.com": 1,
                                            "k8s:patch:nodepools.karpenter.sh": 1})
    pool = custom.get_cluster_custom_object(KARPENTER, "v1", "nodepools", OBJECT_NAME)
    assert pool["spec"]["template"]["spec"]["requirements"][0]["values"] == ["ml.g5.8xlarge"]

    for name in ("train-0", "train-1", "train-2", "train-3", "huge"):
        core.delete_namespaced_pod(name, "default")
    # the work is done: Karpenter consolidates the empty nodes (the pool's consolidateAfter) down to zero
    wait_until(lambda: _group(world, "gpu")["TargetCount"] == 0 and not core.list_node(
        label_selector="sagemaker.amazonaws.com/instance-group-name=gpu").items, 120, "gpu scaled back to 0")
    assert _group(world, "warm")["CurrentCount"] == 1, "a node outside our node class is never consolidated"

    mark = world.ledger.mark()
    remove(feature, target)
    writes = _writes(world, mark)
    assert writes == Counter({"k8s:delete:nodepools.karpenter.sh": 1,
                              "k8s:delete:hyperpodnodeclasses.karpenter.sagemaker.amazonaws.com": 1,
                              "sagemaker:UpdateCluster": 1, "iam:DeleteRolePolicy": 1, "iam:DeleteRole": 1}), writes
    assert world.ledger.once("sagemaker", "UpdateCluster", since=mark)["request"]["AutoScaling"] == {"Mode": "Disable"}
    assert custom.get_cluster_custom_object(KARPENTER, "v1", "nodepools", "theirs")["metadata"][
        "resourceVersion"] == theirs, "their NodePool untouched"
    assert feature.leftover(target).gone
    custom.delete_cluster_custom_object(KARPENTER, "v1", "nodepools", "theirs")


def test_a_failed_enable_names_hyperpods_reason_and_a_disable_waits_out_deleting(slow_world: ScaleWorld) -> None:
    world, reason = slow_world, "Karpenter could not be installed: the account's limit of NodePools is reached."
    target = world.target()
    _agent(world)
    feature = ManagedKarpenter(KarpenterSettings(instance_groups=["gpu"]))
    injected = world.product.live.post("/api/v1/sandbox/faults", {"kind": "autoscaling_failed", "target": {
        "cluster": world.name, "message": reason}})
    assert injected.status_code == 201, injected.text
    mark = world.ledger.mark()

    def ended() -> Any:
        observed = feature.observe(target)
        if observed.failed:
            return observed
        if feature.diff(observed):
            feature.apply(target, observed)
        return None
    failed = wait_until(ended, 120, "the enable to end")
    assert world.describe()["AutoScaling"]["Status"] == "Failed"
    enabled = [e for e in world.ledger.writes(mark) if e.get("kind") == "aws"]
    assert [f"{e['service']}:{e['operation']}" for e in enabled] == [
        "iam:CreateRole", "iam:PutRolePolicy", "sagemaker:UpdateCluster"], "one enable, then a wait through "\
        "Creating without sending it again"
    assert enabled[-1]["request"]["AutoScaling"]["Mode"] == "Enable"
    history = world.product.client("sagemaker").list_cluster_events(  # HyperPod's times: the simulated clock
        ClusterName=world.name, SortOrder="Descending", MaxResults=100)["Events"]
    failure = next(e["EventTime"] for e in history if e["Description"] == f"Autoscaling failed: {reason}")
    asked = next(e["EventTime"] for e in history if e["Description"] == "Cluster update requested."
                 and e["EventTime"] <= failure)
    assert (failure - asked).total_seconds() >= SCALING_SECONDS, "it failed after a whole Creating period"
    assert reason in failed.failed and reason in failed.detail and not failed.healthy and not failed.settled
    mark = world.ledger.mark()
    with pytest.raises(Permanent, match="the account's limit of NodePools"):
        feature.apply(target, failed)
    world.ledger.assert_no_writes(since=mark)

    mark = world.ledger.mark()

    def gone() -> bool:
        left = feature.leftover(target)
        if "autoscaling" in left.going:
            before = world.ledger.mark()
            feature.delete(target, left)
            world.ledger.assert_no_writes(since=before)  # the role waits while HyperPod is Deleting
        elif left.to_delete:
            feature.delete(target, left)
        return left.gone
    wait_until(gone, 120, "managed Karpenter gone")
    made = [e for e in world.ledger.writes(mark) if e.get("kind") == "aws"]
    writes = [f"{e['service']}:{e['operation']}" for e in made]
    assert writes == ["sagemaker:UpdateCluster", "iam:DeleteRolePolicy", "iam:DeleteRole"], writes
    # the sandbox's clock runs SLOW times wall time, so the ledger's stamps say how much simulated time passed;
    # half the Deleting period is the bound (a role deleted without waiting follows its UpdateCluster at once)
    assert (made[1]["time"] - made[0]["time"]) * SLOW >= SCALING_SECONDS / 2, "the role waited out Deleting"
    assert world.describe()["AutoScaling"] == {"Mode": "Disable", "Status": "InService"}
