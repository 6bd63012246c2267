"""The AWS Load Balancer Controller in the emulator: a LoadBalancer Service becomes an ELBv2 network load balancer
in the sandbox's AWS world (scheme, source ranges, tags, subnets, a target group and listener per port, the DNS
name as the Service's ingress), held by a finalizer until it is deleted; without the controller it stays
pending."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from sandbox.aws import AwsWorld
from tests.kube.nodes import add_node
from tests.sandbox_aws.conftest import Clients
from tests.sandbox_aws.test_eks import active_cluster
from tests.support import wait_until

# what the real controller writes (and the product's cluster teardown looks for)
FINALIZER = "service.k8s.aws/resources"
SCHEME = "service.beta.kubernetes.io/aws-load-balancer-scheme"
CLUSTER_TAG, STACK_TAG, RESOURCE_TAG = "elbv2.k8s.aws/cluster", "service.k8s.aws/stack", "service.k8s.aws/resource"


def _kube(world: AwsWorld, aws: Clients, name: str) -> k8s.ApiClient:
    endpoint = aws("eks").describe_cluster(name=name)["cluster"]["endpoint"]
    assert world.kube is not None
    return k8s_config.new_client_from_config_dict(world.kube.kubeconfig(name, endpoint.split("/k8s/")[0]))


def _controller(world: AwsWorld, api: k8s.ApiClient, name: str) -> None:
    """The controller's Deployment as its manifest makes it (its --cluster-name), running on a node."""
    assert world.kube is not None
    add_node(world.kube.cluster(name), "worker")
    labels = {"app.kubernetes.io/name": "aws-load-balancer-controller"}
    k8s.AppsV1Api(api).create_namespaced_deployment("kube-system", {
        "metadata": {"name": "aws-load-balancer-controller"},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"containers": [{"name": "aws-load-balancer-controller", "args": [
                f"--cluster-name={name}", "--aws-region=us-west-2", "--ingress-class=alb"],
                "image": "public.ecr.aws/eks/aws-load-balancer-controller:v2.13.2"}]}}}})


def _service(name: str, ports: list[int], annotations: dict[str, str] | None = None,
             ranges: list[str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "annotations": annotations or {}},
            "spec": {"type": "LoadBalancer", "selector": {"app": name}, "loadBalancerSourceRanges": ranges,
                     "ports": [{"name": f"p{p}", "port": p, "targetPort": 8000} for p in ports]}}


def _ingress(svc: Any) -> list[Any]:
    return list((svc.status and svc.status.load_balancer and svc.status.load_balancer.ingress) or [])


def _hostname(world: AwsWorld, core: k8s.CoreV1Api, name: str) -> str:
    def ingress() -> str | None:
        world.advance(1)
        ingress = _ingress(core.read_namespaced_service(name, "default"))
        return ingress[0].hostname if ingress else None
    return wait_until(ingress, 60, f"Service {name}'s load balancer")


def _tags(elb: Any, arn: str) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in elb.describe_tags(ResourceArns=[arn])["TagDescriptions"][0]["Tags"]}


def test_a_load_balancer_service_gets_a_network_load_balancer_only_where_the_controller_runs(
        world: AwsWorld, aws: Clients, unique: Callable[[str], str]) -> None:
    name = unique("lbc")
    active_cluster(world, aws, name)
    vpc = aws("eks").describe_cluster(name=name)["cluster"]["resourcesVpcConfig"]
    api = _kube(world, aws, name)
    core, elb, ec2 = k8s.CoreV1Api(api), aws("elbv2"), aws("ec2")
    core.create_namespaced_service("default", _service("early", [80]))
    world.advance(5)  # no controller: pending, as on EKS without one
    early = core.read_namespaced_service("early", "default")
    assert not _ingress(early)
    assert FINALIZER not in (early.metadata.finalizers or [])

    _controller(world, api, name)
    hostname = _hostname(world, core, "early")  # the controller picks up what waited for it
    core.create_namespaced_service("default", _service(
        "public", [80, 443], {SCHEME: "internet-facing"}, ranges=["203.0.113.0/24", "198.51.100.7/32"]))
    public_host = _hostname(world, core, "public")

    balancers = {b["DNSName"]: b for b in elb.describe_load_balancers()["LoadBalancers"]}
    internal, public = balancers[hostname], balancers[public_host]
    assert (internal["Type"], internal["Scheme"], public["Scheme"]) == ("network", "internal", "internet-facing")
    assert public["LoadBalancerName"].startswith("k8s-default-public-") and len(public["LoadBalancerName"]) <= 32
    assert sorted(z["SubnetId"] for z in public["AvailabilityZones"]) == sorted(vpc["subnetIds"])
    assert public["VpcId"] == vpc["vpcId"]
    assert _tags(elb, public["LoadBalancerArn"]) == {CLUSTER_TAG: name, STACK_TAG: "default/public",
                                                     RESOURCE_TAG: "LoadBalancer"}
    listeners = elb.describe_listeners(LoadBalancerArn=public["LoadBalancerArn"])["Listeners"]
    assert sorted((li["Protocol"], li["Port"]) for li in listeners) == [("TCP", 80), ("TCP", 443)]
    groups = {g["TargetGroupArn"]: g for g in elb.describe_target_groups(
        LoadBalancerArn=public["LoadBalancerArn"])["TargetGroups"]}
    assert {li["DefaultActions"][0]["TargetGroupArn"] for li in listeners} == set(groups)
    assert sorted(_tags(elb, arn)[RESOURCE_TAG] for arn in groups) == ["default/public:443", "default/public:80"]
    assert {_tags(elb, arn)[CLUSTER_TAG] for arn in groups} == {name}
    (group,) = ec2.describe_security_groups(GroupIds=public["SecurityGroups"])["SecurityGroups"]
    assert {(r["FromPort"], c["CidrIp"]) for r in group["IpPermissions"] for c in r["IpRanges"]} == {
        (p, cidr) for p in (80, 443) for cidr in ("203.0.113.0/24", "198.51.100.7/32")}
    (internal_group,) = ec2.describe_security_groups(GroupIds=internal["SecurityGroups"])["SecurityGroups"]
    assert {c["CidrIp"] for r in internal_group["IpPermissions"] for c in r["IpRanges"]} == {"10.20.0.0/16"}
    assert {"Key": CLUSTER_TAG, "Value": name} in group["Tags"]
    public_svc = core.read_namespaced_service("public", "default")
    assert FINALIZER in public_svc.metadata.finalizers

    # deleting the Service deletes its load balancer, target groups and security group first
    core.delete_namespaced_service("public", "default")

    def gone() -> bool:
        world.advance(1)
        return not [s for s in core.list_namespaced_service("default").items if s.metadata.name == "public"]
    wait_until(gone, 60, "the Service public deleted")
    assert [b["DNSName"] for b in elb.describe_load_balancers()["LoadBalancers"]
            if b["VpcId"] == vpc["vpcId"]] == [hostname]
    assert not [g for g in elb.describe_target_groups()["TargetGroups"] if g["TargetGroupArn"] in groups]
    assert not ec2.describe_security_groups(Filters=[{"Name": "group-id", "Values": [group["GroupId"]]}])[
        "SecurityGroups"]


def test_a_changed_scheme_replaces_the_load_balancer(world: AwsWorld, aws: Clients,
                                                     unique: Callable[[str], str]) -> None:
    name = unique("lbc")
    active_cluster(world, aws, name)
    api = _kube(world, aws, name)
    core, elb = k8s.CoreV1Api(api), aws("elbv2")
    _controller(world, api, name)
    core.create_namespaced_service("default", _service("web", [8080]))
    first = _hostname(world, core, "web")
    core.patch_namespaced_service("web", "default", {"metadata": {"annotations": {SCHEME: "internet-facing"}}})

    def replaced() -> str | None:
        host = _hostname(world, core, "web")
        return host if host != first else None
    second = wait_until(replaced, 60, "a new load balancer")
    schemes = {b["DNSName"]: b["Scheme"] for b in elb.describe_load_balancers()["LoadBalancers"]}
    assert first not in schemes and schemes[second] == "internet-facing"


    # an IPv6 source range on a load balancer that is not dual-stack: the controller builds nothing, and says why
    count = len(elb.describe_load_balancers()["LoadBalancers"])
    core.create_namespaced_service("default", _service("six", [80], ranges=["2001:db8::/32"]))

    def refused() -> str | None:
        world.advance(1)
        events = [e for e in core.list_namespaced_event("default").items if e.involved_object.name == "six"]
        return next((str(e.message) for e in events if e.reason == "FailedBuildModel"), None)
    message = wait_until(refused, 60, "the controller's FailedBuildModel event")
    assert message == "Failed build model due to unsupported v6 cidr 2001:db8::/32 when lb is not dualstack"
    assert not _ingress(core.read_namespaced_service("six", "default"))
    assert len(elb.describe_load_balancers()["LoadBalancers"]) == count
