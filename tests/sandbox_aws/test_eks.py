"""EKS: status sequences on a manual clock, the emulator cluster behind the endpoint, add-ons, access, pod identity."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from sandbox.aws import AwsWorld
from sandbox.aws.eks import ADDON_SECONDS, CLUSTER_CREATE_SECONDS, CLUSTER_DELETE_SECONDS
from tests.kube.nodes import add_node
from tests.sandbox_aws.conftest import CREATOR, POD_ROLE, ROLE, Clients, ensure_role, error_code, subnets
from tests.support import wait_until

POLICY = "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"


def active_cluster(world: AwsWorld, aws: Clients, name: str, mode: str = "API") -> Any:
    eks = aws("eks")
    eks.create_cluster(name=name, version="1.32", roleArn=ROLE, resourcesVpcConfig={"subnetIds": subnets(aws("ec2"))},
                       accessConfig={"authenticationMode": mode})
    world.advance(CLUSTER_CREATE_SECONDS)
    return eks


def addon_status(world: AwsWorld, eks: Any, cluster: str, addon: str, want: str) -> dict[str, Any]:
    """The add-on once it reached ``want`` (its health follows its pods, which the emulator runs meanwhile)."""
    def reached() -> dict[str, Any] | None:
        world.advance(1)
        got: dict[str, Any] = eks.describe_addon(clusterName=cluster, addonName=addon)["addon"]
        return got if got["status"] == want else None
    return wait_until(reached, message=f"{addon} {want}")


def test_cluster_lifecycle_and_emulator_endpoint(world: AwsWorld, aws: Clients,
                                                 unique: Callable[[str], str]) -> None:
    name = unique("eks")
    eks = aws("eks")
    created = eks.create_cluster(name=name, version="1.32", roleArn=ROLE,
                                 resourcesVpcConfig={"subnetIds": subnets(aws("ec2"))},
                                 accessConfig={"authenticationMode": "API_AND_CONFIG_MAP"})["cluster"]
    assert created["status"] == "CREATING" and "endpoint" not in created
    world.advance(CLUSTER_CREATE_SECONDS - 1)
    assert eks.describe_cluster(name=name)["cluster"]["status"] == "CREATING"
    world.advance(1)
    cluster = eks.describe_cluster(name=name)["cluster"]
    assert cluster["status"] == "ACTIVE"
    assert cluster["accessConfig"] == {"authenticationMode": "API_AND_CONFIG_MAP",
                                       "bootstrapClusterCreatorAdminPermissions": True}
    assert base64.b64decode(cluster["certificateAuthority"]["data"]).startswith(b"-----BEGIN CERTIFICATE-----")
    assert cluster["identity"]["oidc"]["issuer"].startswith("https://oidc.eks.us-west-2.amazonaws.com/id/")
    assert cluster["endpoint"].endswith(f"/k8s/clusters/{name}")
    assert world.kube is not None
    api = k8s_config.new_client_from_config_dict(world.kube.kubeconfig(name, cluster["endpoint"].split("/k8s/")[0]))
    namespaces = {ns.metadata.name for ns in k8s.CoreV1Api(api).list_namespace().items}
    assert {"default", "kube-system"} <= namespaces
    assert name in eks.list_clusters()["clusters"]

    assert eks.delete_cluster(name=name)["cluster"]["status"] == "DELETING"
    world.advance(CLUSTER_DELETE_SECONDS)
    with pytest.raises(ClientError) as info:
        eks.describe_cluster(name=name)
    assert error_code(info.value) == "ResourceNotFoundException"
    assert name not in world.kube.clusters


def test_cluster_errors(world: AwsWorld, aws: Clients, unique: Callable[[str], str]) -> None:
    name = unique("eks")
    eks = active_cluster(world, aws, name)
    with pytest.raises(ClientError) as info:
        eks.create_cluster(name=name, roleArn=ROLE, resourcesVpcConfig={"subnetIds": subnets(aws("ec2"))})
    assert error_code(info.value) == "ResourceInUseException"
    with pytest.raises(ClientError) as info:
        eks.create_cluster(name=unique("eks"), version="1.20", roleArn=ROLE,
                           resourcesVpcConfig={"subnetIds": subnets(aws("ec2"))})
    assert error_code(info.value) == "InvalidParameterException"
    with pytest.raises(ClientError) as info:
        eks.create_cluster(name=unique("eks"), roleArn=ROLE, resourcesVpcConfig={"subnetIds": ["subnet-0", "sub"]})
    assert error_code(info.value) == "InvalidParameterException"
    eks.create_nodegroup(clusterName=name, nodegroupName="system", subnets=subnets(aws("ec2")), nodeRole=ROLE)
    world.advance(300)
    assert eks.describe_nodegroup(clusterName=name, nodegroupName="system")["nodegroup"]["status"] == "ACTIVE"
    with pytest.raises(ClientError) as info:
        eks.delete_cluster(name=name)
    assert error_code(info.value) == "ResourceInUseException"


def test_update_cluster_config_moves_through_updating(world: AwsWorld, aws: Clients,
                                                      unique: Callable[[str], str]) -> None:
    name = unique("eks")
    eks = active_cluster(world, aws, name, mode="CONFIG_MAP")
    update = eks.update_cluster_config(name=name, accessConfig={"authenticationMode": "API_AND_CONFIG_MAP"})["update"]
    assert eks.describe_cluster(name=name)["cluster"]["status"] == "UPDATING"
    world.advance(600)
    assert eks.describe_update(name=name, updateId=update["id"])["update"]["status"] == "Successful"
    cluster = eks.describe_cluster(name=name)["cluster"]
    assert cluster["status"] == "ACTIVE" and cluster["accessConfig"]["authenticationMode"] == "API_AND_CONFIG_MAP"


def test_addon_versions_are_realistic(aws: Clients) -> None:
    addons = aws("eks").describe_addon_versions(kubernetesVersion="1.32")["addons"]
    by_name = {a["addonName"]: a for a in addons}
    hpto = by_name["amazon-sagemaker-hyperpod-training-operator"]
    assert hpto["defaultNamespace"] == "aws-hyperpod"
    assert hpto["addonVersions"][0]["compatibilities"][0]["defaultVersion"] is True
    assert by_name["kube-proxy"]["addonVersions"][0]["addonVersion"].startswith("v1.32.")
    inference = aws("eks").describe_addon_versions(addonName="amazon-sagemaker-hyperpod-inference")["addons"][0]
    assert "v1.3.0-eksbuild.1" in [v["addonVersion"] for v in inference["addonVersions"]]


def test_addon_becoming_active_installs_crds_and_controller(world: AwsWorld, aws: Clients,
                                                           unique: Callable[[str], str]) -> None:
    name = unique("eks")
    eks = active_cluster(world, aws, name)
    assert world.kube is not None
    add_node(world.kube.cluster(name), "worker")  # where the add-ons' controllers run
    for addon in ("cert-manager", "eks-pod-identity-agent"):
        eks.create_addon(clusterName=name, addonName=addon)
    created = eks.create_addon(clusterName=name, addonName="amazon-sagemaker-hyperpod-training-operator",
                               configurationValues='{"hpTrainingControllerManager": {"nodeSelector": {"a": "b"}}}',
                               podIdentityAssociations=[{"serviceAccount": "hp-training-operator-controller-manager",
                                                         "roleArn": POD_ROLE}])["addon"]
    assert created["status"] == "CREATING" and created["addonVersion"] == "v1.2.0-eksbuild.1"
    world.advance(ADDON_SECONDS)
    addon = addon_status(world, eks, name, "amazon-sagemaker-hyperpod-training-operator", "ACTIVE")
    assert addon["configurationValues"].startswith('{"hpTrainingControllerManager"')
    assert sorted(eks.list_addons(clusterName=name)["addons"]) == [
        "amazon-sagemaker-hyperpod-training-operator", "cert-manager", "eks-pod-identity-agent"]
    assert world.kube is not None
    cluster = world.kube.cluster(name)
    crds = {c["metadata"]["name"] for c in cluster.list(cluster.builtin("apiextensions.k8s.io",
                                                                        "customresourcedefinitions"), None).items}
    assert "hyperpodpytorchjobs.sagemaker.amazonaws.com" in crds
    deployment = cluster.get(cluster.builtin("apps", "deployments"), "aws-hyperpod",
                             "hp-training-operator-controller-manager")
    assert deployment["metadata"]["labels"]["eks.amazonaws.com/addon"] == "amazon-sagemaker-hyperpod-training-operator"
    associations = eks.list_pod_identity_associations(clusterName=name)["associations"]
    assert [(a["namespace"], a["serviceAccount"]) for a in associations] == [
        ("aws-hyperpod", "hp-training-operator-controller-manager")]
    assert associations[0]["ownerArn"] == addon["addonArn"]

    eks.delete_addon(clusterName=name, addonName="amazon-sagemaker-hyperpod-training-operator")
    world.advance(ADDON_SECONDS)
    assert eks.list_addons(clusterName=name)["addons"] == ["cert-manager", "eks-pod-identity-agent"]
    assert eks.list_pod_identity_associations(clusterName=name)["associations"] == []


def test_addon_failures(world: AwsWorld, aws: Clients, unique: Callable[[str], str]) -> None:
    name = unique("eks")
    eks = active_cluster(world, aws, name)
    with pytest.raises(ClientError) as info:
        eks.create_addon(clusterName=name, addonName="coredns", configurationValues="[1, 2]")
    assert error_code(info.value) == "InvalidParameterException"
    with pytest.raises(ClientError) as info:
        eks.create_addon(clusterName=name, addonName="coredns", addonVersion="v0.0.1-eksbuild.1")
    assert error_code(info.value) == "InvalidParameterException"
    with pytest.raises(ClientError) as info:
        eks.create_addon(clusterName=name, addonName="no-such-addon")
    assert error_code(info.value) == "ResourceNotFoundException"

    eks.create_addon(clusterName=name, addonName="amazon-sagemaker-hyperpod-inference")  # needs cert-manager
    world.advance(ADDON_SECONDS)
    failed = eks.describe_addon(clusterName=name, addonName="amazon-sagemaker-hyperpod-inference")["addon"]
    assert failed["status"] == "CREATE_FAILED"
    assert failed["health"]["issues"][0]["code"] == "ConfigurationConflict"

    assert world.kube is not None
    add_node(world.kube.cluster(name), "worker")
    eks.create_addon(clusterName=name, addonName="coredns")
    world.advance(ADDON_SECONDS)
    addon_status(world, eks, name, "coredns", "ACTIVE")
    fault = world.faults.inject("addon_degraded", {"cluster": name, "addon": "coredns"})
    world.advance(1)
    degraded = eks.describe_addon(clusterName=name, addonName="coredns")["addon"]
    assert degraded["status"] == "DEGRADED"
    assert degraded["health"]["issues"][0]["code"] == "InsufficientNumberOfReplicas"
    world.faults.clear(fault.id)
    addon_status(world, eks, name, "coredns", "ACTIVE")

    world.faults.inject("addon_degraded", {"cluster": name, "addon": "metrics-server"})
    eks.create_addon(clusterName=name, addonName="metrics-server")
    world.advance(ADDON_SECONDS)
    assert eks.describe_addon(clusterName=name, addonName="metrics-server")["addon"]["status"] == "CREATE_FAILED"


def test_access_entries_and_policies(world: AwsWorld, aws: Clients, unique: Callable[[str], str]) -> None:
    name = unique("eks")
    eks = active_cluster(world, aws, name)
    principal = ensure_role(world, "hyperpod-exec", "sagemaker.amazonaws.com")
    assert eks.list_access_entries(clusterName=name)["accessEntries"] == [CREATOR]
    entry = eks.create_access_entry(clusterName=name, principalArn=principal, kubernetesGroups=["ops"])["accessEntry"]
    assert entry["type"] == "STANDARD" and entry["username"] == principal
    with pytest.raises(ClientError) as info:
        eks.create_access_entry(clusterName=name, principalArn=principal)
    assert error_code(info.value) == "ResourceInUseException"
    eks.associate_access_policy(clusterName=name, principalArn=principal, policyArn=POLICY,
                                accessScope={"type": "namespace", "namespaces": ["team-a"]})
    listed = eks.list_associated_access_policies(clusterName=name, principalArn=principal)
    assert [(p["policyArn"], p["accessScope"]["namespaces"]) for p in listed["associatedAccessPolicies"]] == [
        (POLICY, ["team-a"])]
    with pytest.raises(ClientError) as info:
        eks.associate_access_policy(clusterName=name, principalArn=principal, policyArn=POLICY + "X",
                                    accessScope={"type": "cluster"})
    assert error_code(info.value) == "ResourceNotFoundException"
    with pytest.raises(ClientError) as info:
        eks.associate_access_policy(clusterName=name, principalArn=principal, policyArn=POLICY,
                                    accessScope={"type": "everything"})
    assert error_code(info.value) == "ValidationException"
    eks.delete_access_entry(clusterName=name, principalArn=principal)
    with pytest.raises(ClientError) as info:
        eks.describe_access_entry(clusterName=name, principalArn=principal)
    assert error_code(info.value) == "ResourceNotFoundException"


def test_access_entries_need_api_authentication(world: AwsWorld, aws: Clients,
                                                unique: Callable[[str], str]) -> None:
    name = unique("eks")
    eks = active_cluster(world, aws, name, mode="CONFIG_MAP")
    with pytest.raises(ClientError) as info:
        eks.create_access_entry(clusterName=name, principalArn="arn:aws:iam::123456789012:role/x")
    assert error_code(info.value) == "InvalidRequestException"


def test_pod_identity_associations(world: AwsWorld, aws: Clients, unique: Callable[[str], str]) -> None:
    name = unique("eks")
    eks = active_cluster(world, aws, name)
    assoc = eks.create_pod_identity_association(clusterName=name, namespace="kubeflow", serviceAccount="trainer",
                                                roleArn=POD_ROLE)["association"]
    assert assoc["associationId"].startswith("a-")
    with pytest.raises(ClientError) as info:
        eks.create_pod_identity_association(clusterName=name, namespace="kubeflow", serviceAccount="trainer",
                                            roleArn=POD_ROLE)
    assert error_code(info.value) == "ResourceInUseException"
    described = eks.describe_pod_identity_association(clusterName=name, associationId=assoc["associationId"])
    assert described["association"]["roleArn"] == POD_ROLE
    assert len(eks.list_pod_identity_associations(clusterName=name, namespace="kubeflow")["associations"]) == 1
    eks.delete_pod_identity_association(clusterName=name, associationId=assoc["associationId"])
    assert eks.list_pod_identity_associations(clusterName=name)["associations"] == []


def test_tags_on_simulated_resources(world: AwsWorld, aws: Clients, unique: Callable[[str], str]) -> None:
    name = unique("eks")
    eks = active_cluster(world, aws, name)
    arn = eks.describe_cluster(name=name)["cluster"]["arn"]
    eks.tag_resource(resourceArn=arn, tags={"SageMaker": "true"})
    assert eks.list_tags_for_resource(resourceArn=arn)["tags"] == {"SageMaker": "true"}
    eks.untag_resource(resourceArn=arn, tagKeys=["SageMaker"])
    assert eks.list_tags_for_resource(resourceArn=arn)["tags"] == {}


def test_csi_driver_addons_register_their_csidriver(world: AwsWorld, aws: Clients,
                                                    unique: Callable[[str], str]) -> None:
    name = unique("eks")
    eks = active_cluster(world, aws, name)
    for addon in ("aws-mountpoint-s3-csi-driver", "aws-fsx-csi-driver"):
        eks.create_addon(clusterName=name, addonName=addon)
    world.advance(ADDON_SECONDS)
    assert world.kube is not None
    cluster = world.kube.cluster(name)
    drivers = {d["metadata"]["name"] for d in cluster.list(cluster.builtin("storage.k8s.io", "csidrivers"), None).items}
    assert drivers == {"s3.csi.aws.com", "fsx.csi.aws.com"}
    assert cluster.get(cluster.builtin("apps", "deployments"), "kube-system", "fsx-csi-controller")
