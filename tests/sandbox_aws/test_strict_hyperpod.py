"""HyperPod CreateCluster/UpdateCluster refuse what AWS refuses, through boto3 against the sandbox world.

Each rule: the wrong request gets AWS's error code and message, leaves nothing behind (no cluster, no
access entry), and the right one still succeeds. Prerequisites (roles, network, bucket, EKS) are made the
way a user makes them (``hyperpod_prereqs``). Every cluster a test makes is deleted at its end, so the
shared world's cluster-usage quotas stay free for the other tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sandbox.aws import AwsWorld
from sandbox.aws.hyperpod_access import SLR_USERNAME

from .conftest import make_client
from .hyperpod_prereqs import (
    EKS_ROLE,
    Prereqs,
    cleaned_sagemaker,
    fresh,
    groups,
    in_service,
    names,
    network,
    prereqs,
    refused,
    role,
)


@pytest.fixture(scope="module")
def env(shared_world: AwsWorld) -> Prereqs:
    return prereqs(shared_world, lambda service: make_client(shared_world, service), fresh)


@pytest.fixture
def sm(world: AwsWorld) -> Iterator[Any]:
    yield from cleaned_sagemaker(world)


def entries(world: AwsWorld, eks_name: str) -> set[str]:
    return set(make_client(world, "eks").list_access_entries(clusterName=eks_name)["accessEntries"])


# --- prerequisites (gap 2) and access entries ------------------------------------------------------------


def test_eks_cluster_in_config_map_mode_is_refused(world: AwsWorld, sm: Any, env: Prereqs) -> None:
    aws = lambda service: make_client(world, service)  # noqa: E731
    eks = aws("eks")
    legacy = fresh("cfgmap")
    arn = eks.create_cluster(name=legacy, roleArn=EKS_ROLE, resourcesVpcConfig={"subnetIds": env.subnets},
                             accessConfig={"authenticationMode": "CONFIG_MAP"})["cluster"]["arn"]
    world.advance(1800)
    name = fresh("hp")
    params = {**env.cluster(name, env.group("g", 1, "ml.t3.medium")), "Orchestrator": {"Eks": {"ClusterArn": arn}}}
    message = refused(lambda: sm.create_cluster(**params))
    assert "authentication mode CONFIG_MAP" in message and "API or API_AND_CONFIG_MAP" in message
    assert name not in names(sm)
    eks.update_cluster_config(name=legacy, accessConfig={"authenticationMode": "API_AND_CONFIG_MAP"})
    world.advance(1800)
    assert sm.create_cluster(**params)["ClusterArn"]


def test_execution_role_must_exist_and_trust_sagemaker(world: AwsWorld, sm: Any, env: Prereqs) -> None:
    aws = lambda service: make_client(world, service)  # noqa: E731
    missing = "arn:aws:iam::123456789012:role/strict-nobody"
    ec2_only = role(aws, fresh("ec2-role"), "ec2.amazonaws.com")
    for bad in (missing, ec2_only):
        name = fresh("hp")
        message = refused(sm.create_cluster, **env.cluster(name, env.group("g", 1, "ml.t3.medium",
                                                                            ExecutionRole=bad)))
        assert message == (f"Could not assume role {bad}. Please ensure that the role exists and allows principal "
                           "'sagemaker.amazonaws.com' to assume the role.")
        assert name not in names(sm)
        assert bad not in entries(world, env.eks_name)


def test_autoscaling_cluster_role_must_trust_hyperpod(world: AwsWorld, sm: Any, env: Prereqs) -> None:
    aws = lambda service: make_client(world, service)  # noqa: E731
    wrong = role(aws, fresh("scaler"), "sagemaker.amazonaws.com")
    right = role(aws, fresh("scaler"), "hyperpod.sagemaker.amazonaws.com")
    name = fresh("hp")
    params = env.cluster(name, env.group("g", 0, "ml.t3.medium"), NodeProvisioningMode="Continuous",
                         AutoScaling={"Mode": "Enable", "AutoScalerType": "Karpenter"})
    message = refused(lambda: sm.create_cluster(**params, ClusterRole=wrong))
    assert message.startswith(f"Could not assume role {wrong}.")
    assert "'hyperpod.sagemaker.amazonaws.com'" in message
    assert sm.create_cluster(**params, ClusterRole=right)["ClusterArn"]


def test_subnets_and_security_groups_must_exist_in_the_clusters_vpc(world: AwsWorld, sm: Any, env: Prereqs) -> None:
    aws = lambda service: make_client(world, service)  # noqa: E731
    _, other_nets, other_sg = network(aws, cidr="10.41")
    cases = {
        "the subnet ID 'subnet-0123456789abcdef0' does not exist": {
            "Subnets": ["subnet-0123456789abcdef0"], "SecurityGroupIds": [env.security_group]},
        f"subnet {other_nets[0]} belongs to VPC": {
            "Subnets": [env.subnets[0], other_nets[0]], "SecurityGroupIds": [env.security_group]},
        "the security group 'sg-0123456789abcdef0' does not exist": {
            "Subnets": env.subnets, "SecurityGroupIds": ["sg-0123456789abcdef0"]},
        f"security group {other_sg} belongs to VPC": {"Subnets": env.subnets, "SecurityGroupIds": [other_sg]},
    }
    for expected, vpc in cases.items():
        name = fresh("hp")
        message = refused(sm.create_cluster, **{**env.cluster(name, env.group("g", 1, "ml.t3.medium")),
                                                "VpcConfig": vpc})
        assert expected in message, message
        assert name not in names(sm)
    override = {"SecurityGroupIds": [other_sg], "Subnets": other_nets[:1]}  # OverrideVpcConfig: the same rule
    message = refused(lambda: sm.create_cluster(**env.cluster(fresh("hp"), env.group(
        "g", 1, "ml.t3.medium", OverrideVpcConfig=override))))
    assert message.startswith("Instance group g OverrideVpcConfig: subnet") and "belongs to VPC" in message


def test_lifecycle_script_bucket_must_exist(world: AwsWorld, sm: Any, env: Prereqs) -> None:
    name = fresh("hp")
    lcc = {"SourceS3Uri": "s3://strict-no-such-bucket/lifecycle/", "OnCreate": "on_create.sh"}
    message = refused(lambda: sm.create_cluster(**env.cluster(name, env.group("g", 1, "ml.t3.medium",
                                                                               LifeCycleConfig=lcc))))
    assert message == ("Instance group g: the S3 bucket strict-no-such-bucket of LifeCycleConfig.SourceS3Uri "
                       "s3://strict-no-such-bucket/lifecycle/ does not exist.")
    assert name not in names(sm)


def test_create_writes_access_entries_for_the_service_linked_role_and_execution_role(
        world: AwsWorld, sm: Any, env: Prereqs) -> None:
    eks = make_client(world, "eks")
    node_role = role(lambda service: make_client(world, service), fresh("hp-exec"), "sagemaker.amazonaws.com")
    slr = "arn:aws:iam::123456789012:role/aws-service-role/hyperpod.sagemaker.amazonaws.com/" \
          "AWSServiceRoleForSageMakerHyperPod"
    before = entries(world, env.eks_name)
    assert node_role not in before
    sm.create_cluster(**env.cluster(fresh("hp"), env.group("g", 1, "ml.t3.medium", ExecutionRole=node_role)))
    after = entries(world, env.eks_name)
    assert node_role in after and slr in after and after - before <= {node_role, slr}
    node_entry = eks.describe_access_entry(clusterName=env.eks_name, principalArn=node_role)["accessEntry"]
    assert node_entry["type"] == "HYPERPOD_LINUX"
    service_entry = eks.describe_access_entry(clusterName=env.eks_name, principalArn=slr)["accessEntry"]
    assert service_entry["username"] == SLR_USERNAME and service_entry["type"] == "STANDARD"
    second = fresh("hp")
    sm.create_cluster(**env.cluster(second, env.group("g", 1, "ml.t3.medium", ExecutionRole=node_role),
                                    NodeProvisioningMode="Continuous"))
    assert entries(world, env.eks_name) == after  # a second cluster with the same roles: nothing new
    world.advance(600)
    other_role = role(lambda service: make_client(world, service), fresh("hp-exec"), "sagemaker.amazonaws.com")
    sm.update_cluster(ClusterName=second, InstanceGroups=[env.group("g2", 0, "ml.t3.medium", ExecutionRole=other_role)])
    assert entries(world, env.eks_name) == after | {other_role}  # a group with a new role: its entry


# --- UpdateCluster takes each group's spec as sent (gap 3) -------------------------------------------------


def test_update_takes_the_spec_as_sent_and_leaves_omitted_groups_alone(world: AwsWorld, sm: Any,
                                                                       env: Prereqs) -> None:
    name = fresh("hp")
    labels = {"Labels": {"team": "ml"}}
    checked = env.group("checked", 1, "ml.c5.large", OnStartDeepHealthChecks=["InstanceConnectivity"],
                        KubernetesConfig=labels)
    other = env.group("other", 1, "ml.c5.large", KubernetesConfig=labels)
    sm.create_cluster(**env.cluster(name, checked, other))
    in_service(world, sm, name)
    scaled = {k: v for k, v in checked.items() if k not in ("OnStartDeepHealthChecks", "KubernetesConfig")}
    sm.update_cluster(ClusterName=name, InstanceGroups=[{**scaled, "InstanceCount": 2}])
    now = groups(sm, name)
    assert "OnStartDeepHealthChecks" not in now["checked"] and "KubernetesConfig" not in now["checked"]
    assert now["checked"]["TargetCount"] == 2
    assert now["other"]["KubernetesConfig"]["DesiredLabels"] == {"team": "ml"} and now["other"]["TargetCount"] == 1
    in_service(world, sm, name)
    nodes = sm.list_cluster_nodes(ClusterName=name)["ClusterNodeSummaries"]
    assert sorted(n["InstanceGroupName"] for n in nodes) == ["checked", "checked", "other"]
    sm.update_cluster(ClusterName=name, InstanceGroupsToDelete=["other"])
    in_service(world, sm, name)
    assert set(groups(sm, name)) == {"checked"}


def test_update_refuses_a_new_capacity_type_interface_mode_or_instance_type(world: AwsWorld, sm: Any,
                                                                            env: Prereqs) -> None:
    name = fresh("hp")
    spot = env.group("spot", 1, "ml.c5.xlarge", CapacityRequirements={"Spot": {}})
    efa = env.group("efa", 1, "ml.c5n.9xlarge", NetworkInterface={"InterfaceType": "efa-only"})
    sm.create_cluster(**env.cluster(name, spot, efa))
    in_service(world, sm, name)
    forgot_spot = {k: v for k, v in spot.items() if k != "CapacityRequirements"}
    message = refused(lambda: sm.update_cluster(ClusterName=name, InstanceGroups=[{**forgot_spot, "InstanceCount": 2}]))
    assert message.startswith("Instance group spot: the capacity type cannot be changed from Spot to OnDemand")
    forgot_efa = {k: v for k, v in efa.items() if k != "NetworkInterface"}
    message = refused(lambda: sm.update_cluster(ClusterName=name, InstanceGroups=[{**forgot_efa, "InstanceCount": 2}]))
    assert message.startswith("Instance group efa: NetworkInterface InterfaceType cannot be changed from efa-only to "
                              "efa")
    message = refused(lambda: sm.update_cluster(ClusterName=name, InstanceGroups=[
        {**spot, "InstanceType": "ml.c5.2xlarge"}]))
    assert message == "Instance group spot: InstanceType cannot be changed from ml.c5.xlarge to ml.c5.2xlarge."
    assert {g: d["TargetCount"] for g, d in groups(sm, name).items()} == {"spot": 1, "efa": 1}
    sm.update_cluster(ClusterName=name, InstanceGroups=[{**spot, "InstanceCount": 2}, {**efa, "InstanceCount": 2}])
    assert {g: d["TargetCount"] for g, d in groups(sm, name).items()} == {"spot": 2, "efa": 2}


# --- cross-field rules (gap 8) ----------------------------------------------------------------------------


def test_cross_field_rules_on_create(world: AwsWorld, sm: Any, env: Prereqs) -> None:
    aws = lambda service: make_client(world, service)  # noqa: E731
    scaler = role(aws, fresh("scaler"), "hyperpod.sagemaker.amazonaws.com")
    g = env.group
    cases: list[tuple[dict[str, Any], str]] = [
        (env.cluster(fresh("hp"), g("g", 1, "ml.m5.xlarge", NetworkInterface={"InterfaceType": "efa-only"})),
         "Instance group g: InterfaceType efa-only is not supported for instance type ml.m5.xlarge, which does not "
         "support Elastic Fabric Adapter (EFA)."),
        (env.cluster(fresh("hp"), g("g", 1, "ml.c7g.xlarge", ThreadsPerCore=2)),
         "Instance group g: instance type ml.c7g.xlarge does not support multithreading; ThreadsPerCore must be 1."),
        (env.cluster(fresh("hp"), g("g", 1, "ml.m5.xlarge"),
                     TieredStorageConfig={"Mode": "Enable", "InstanceMemoryAllocationPercentage": 10}),
         "InstanceMemoryAllocationPercentage must be between 20 and 100; got 10."),
        ({**env.cluster(fresh("hp"), g("g", 1, "ml.m5.xlarge"), TieredStorageConfig={"Mode": "Enable"}),
          "Orchestrator": {"Slurm": {"SlurmConfigStrategy": "Managed"}}, "VpcConfig": env.vpc_config},
         "TieredStorageConfig is only supported for clusters orchestrated by Amazon EKS."),
        (env.cluster(fresh("hp"), g("g", 0, "ml.m5.xlarge"), ClusterRole=scaler,
                     AutoScaling={"Mode": "Enable", "AutoScalerType": "Karpenter"}),
         "AutoScaling can be enabled only for clusters with NodeProvisioningMode set to Continuous."),
        (env.cluster(fresh("hp"), g("g", 0, "ml.m5.xlarge", OnStartDeepHealthChecks=["InstanceStress"]),
                     ClusterRole=scaler, NodeProvisioningMode="Continuous",
                     AutoScaling={"Mode": "Enable", "AutoScalerType": "Karpenter"}),
         "Instance group g: OnStartDeepHealthChecks is not supported on clusters with AutoScaling enabled."),
    ]
    for params, expected in cases:
        assert refused(sm.create_cluster, **params) == expected
        assert params["ClusterName"] not in names(sm)
    fine = env.cluster(fresh("hp"), g("efa", 1, "ml.c5n.9xlarge", NetworkInterface={"InterfaceType": "efa-only"},
                                      ThreadsPerCore=2), g("arm", 1, "ml.c7g.xlarge", ThreadsPerCore=1),
                       TieredStorageConfig={"Mode": "Enable", "InstanceMemoryAllocationPercentage": 20})
    assert sm.create_cluster(**fine)["ClusterArn"]


def test_batch_limits(world: AwsWorld, sm: Any, env: Prereqs) -> None:
    name = fresh("hp")
    sm.create_cluster(**env.cluster(name, env.group("a", 0, "ml.m6i.large"), env.group("b", 0, "ml.m6i.large"),
                                    NodeProvisioningMode="Continuous"))
    in_service(world, sm, name, 600)
    message = refused(lambda: sm.batch_add_cluster_nodes(ClusterName=name, NodesToAdd=[
        {"InstanceGroupName": "a", "IncrementTargetCountBy": 30},
        {"InstanceGroupName": "b", "IncrementTargetCountBy": 21}]))
    assert message == ("The total number of nodes to add across all instance groups cannot exceed 50; the request "
                       "adds 51.")
    assert {g: d["TargetCount"] for g, d in groups(sm, name).items()} == {"a": 0, "b": 0}
    ids = [f"i-{n:017x}" for n in range(30)]
    logical = [f"a-{n:012x}" for n in range(21)]
    message = refused(lambda: sm.batch_delete_cluster_nodes(ClusterName=name, NodeIds=ids, NodeLogicalIds=logical))
    assert message.startswith("You can specify at most 50 NodeIds and NodeLogicalIds combined")
    answer = sm.batch_delete_cluster_nodes(ClusterName=name, NodeIds=ids, NodeLogicalIds=logical[:20])
    assert len(answer["Failed"]) == 30 and len(answer["FailedNodeLogicalIds"]) == 20  # unknown nodes, per node
    assert len(sm.batch_delete_cluster_nodes(ClusterName=name, NodeIds=[f"i-{n:017x}" for n in range(99)])[
        "Failed"]) == 99  # NodeIds alone: up to 99
