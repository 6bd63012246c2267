"""EKS add-ons as strict as EKS: health follows the add-on's pods (DEGRADED, InsufficientNumberOfReplicas,
while they cannot schedule), DescribeAddonConfiguration serves each add-on's schema, and
``configurationValues`` are validated against it (unknown keys refused)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from botocore.exceptions import ClientError

from sandbox.aws import AwsWorld
from sandbox.aws.eks import ADDON_SECONDS
from tests.kube.nodes import add_node
from tests.sandbox_aws.conftest import Clients, error_code
from tests.sandbox_aws.test_eks import active_cluster, addon_status


def test_addon_is_degraded_until_its_pods_can_schedule(world: AwsWorld, aws: Clients,
                                                      unique: Callable[[str], str]) -> None:
    name = unique("eks")
    eks = active_cluster(world, aws, name)
    eks.create_addon(clusterName=name, addonName="metrics-server")
    world.advance(ADDON_SECONDS)
    degraded = addon_status(world, eks, name, "metrics-server", "DEGRADED")  # no node: its pod is unschedulable
    assert degraded["health"]["issues"] == [{
        "code": "InsufficientNumberOfReplicas", "resourceIds": [],
        "message": "The add-on is unhealthy because it doesn't have the desired number of replicas."}]
    assert world.kube is not None
    add_node(world.kube.cluster(name), "worker")
    healthy = addon_status(world, eks, name, "metrics-server", "ACTIVE")
    assert healthy["health"]["issues"] == []


def test_describe_addon_configuration_serves_a_schema(aws: Clients) -> None:
    eks = aws("eks")
    got = eks.describe_addon_configuration(addonName="amazon-sagemaker-hyperpod-training-operator",
                                           addonVersion="v1.2.0-eksbuild.1")
    schema = json.loads(got["configurationSchema"])
    assert schema["additionalProperties"] is False and "hpTrainingControllerManager" in schema["properties"]
    assert got["podIdentityConfiguration"][0]["serviceAccount"] == "hp-training-operator-controller-manager"
    with pytest.raises(ClientError) as info:
        eks.describe_addon_configuration(addonName="no-such-addon", addonVersion="v1.0.0-eksbuild.1")
    assert error_code(info.value) == "ResourceNotFoundException"
    with pytest.raises(ClientError) as info:
        eks.describe_addon_configuration(addonName="coredns", addonVersion="v0.0.1-eksbuild.1")
    assert error_code(info.value) == "InvalidParameterException"


def test_configuration_values_are_validated_against_the_schema(world: AwsWorld, aws: Clients,
                                                             unique: Callable[[str], str]) -> None:
    name = unique("eks")
    eks = active_cluster(world, aws, name)
    with pytest.raises(ClientError) as info:  # a Helm chart's key, not the add-on's
        eks.create_addon(clusterName=name, addonName="coredns", configurationValues='{"replicas": 2}')
    assert error_code(info.value) == "InvalidParameterException"
    assert info.value.response["Error"]["Message"] == (
        "ConfigurationValue provided in request is not supported: Json schema validation failed with error: "
        "[$.replicas: is not defined in the schema and the schema does not allow additional properties]")
    with pytest.raises(ClientError) as info:
        eks.create_addon(clusterName=name, addonName="coredns", configurationValues="replicaCount: two")
    assert "$.replicaCount: string found, integer expected" in info.value.response["Error"]["Message"]
    assert eks.list_addons(clusterName=name)["addons"] == []
    created = eks.create_addon(clusterName=name, addonName="coredns", configurationValues="replicaCount: 2")
    assert created["addon"]["configurationValues"] == "replicaCount: 2"
    world.advance(ADDON_SECONDS)
    addon_status(world, eks, name, "coredns", "DEGRADED")  # no node here: updatable, not CREATING any more
    with pytest.raises(ClientError) as info:
        eks.update_addon(clusterName=name, addonName="coredns",
                         configurationValues='{"nodeSelector": {"a": "b"}, "controller": {}}')
    assert "$.controller: is not defined in the schema" in info.value.response["Error"]["Message"]
    eks.update_addon(clusterName=name, addonName="coredns", configurationValues='{"nodeSelector": {"a": "b"}}')


def test_a_component_the_configuration_switches_off_installs_no_crds(world: AwsWorld, aws: Clients,
                                                                     unique: Callable[[str], str]) -> None:
    """The inference add-on with ``keda.enabled`` false installs the operator's CRDs but not KEDA's."""
    name = unique("eks")
    eks = active_cluster(world, aws, name)
    assert world.kube is not None
    add_node(world.kube.cluster(name), "worker")
    eks.create_addon(clusterName=name, addonName="cert-manager")
    addon_status(world, eks, name, "cert-manager", "ACTIVE")
    eks.create_addon(clusterName=name, addonName="amazon-sagemaker-hyperpod-inference",
                     configurationValues=json.dumps({"keda": {"enabled": False}}))
    addon_status(world, eks, name, "amazon-sagemaker-hyperpod-inference", "ACTIVE")
    cluster = world.kube.cluster(name)
    crds = {o["metadata"]["name"] for o in cluster.list(
        cluster.builtin("apiextensions.k8s.io", "customresourcedefinitions"), None).items}
    assert "inferenceendpointconfigs.inference.sagemaker.aws.amazon.com" in crds, sorted(crds)
    assert not {c for c in crds if c.endswith(".keda.sh")}, sorted(crds)
