"""The dependencies stage of ``cluster.create`` and its teardown, against a sandbox EKS cluster with no nodes
(as in AWS before the HyperPod stage): every component applied once (CreateAddon once each, one server-side
apply per object), real workloads visible through the kubernetes client, add-ons DEGRADED for want of nodes
and the stage still done, a rerun that writes nothing, and a teardown that deletes the add-ons, roles and pod
identity associations it made (and nothing that is not ours)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from services.clusters.create_base import ClusterDeletePlan
from services.clusters.create_models import NetworkResult
from services.clusters.dependencies_stage import DependenciesStage, DependenciesTeardown, components_health
from services.clusters.iam_stage import PROPAGATION_SECONDS
from services.components import COMPONENTS, components_for
from services.components.addons import Addon
from services.components.base import Target
from services.components.families import (
    FSX_CSI_ROLE,
    HEALTH_AGENT,
    LBC_ROLE,
    NEURON_PLUGIN,
    NVIDIA_PLUGIN,
    S3_CSI_ROLE,
)
from services.components.manifests import APPLIED, Manifests
from services.operations import Status
from services.stages import Stage
from tests.create_support import Given, SandboxProduct, make_plan, run_stages, sandbox_product
from tests.ledger import CallLedger
from tests.sandbox_support import EKS_TRUST
from tests.support import wait_until

pytestmark = pytest.mark.slow
NAME = "deps"
PLAN = make_plan(NAME)  # ml.g5.8xlarge: NVIDIA + EFA; no FSx
ADDONS = [c.name for c in components_for(PLAN) if isinstance(c, Addon)]
MANIFESTS = [c for c in components_for(PLAN) if isinstance(c, Manifests)]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxProduct]:
    with sandbox_product(tmp_path_factory.mktemp("components")) as product:
        ec2, iam, eks = product.client("ec2"), product.client("iam"), product.client("eks")
        vpc = ec2.create_vpc(CidrBlock="10.30.0.0/16")["Vpc"]["VpcId"]
        subnets = [ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.30.{16 * i}.0/20", AvailabilityZone=f"us-west-2{z}")
                   ["Subnet"]["SubnetId"] for i, z in enumerate("ab")]
        role = iam.create_role(RoleName="deps-eks", AssumeRolePolicyDocument=EKS_TRUST)["Role"]["Arn"]
        eks.create_cluster(name=NAME, version="1.32", roleArn=role, resourcesVpcConfig={"subnetIds": subnets},
                           accessConfig={"authenticationMode": "API"})
        wait_until(lambda: eks.describe_cluster(name=NAME)["cluster"]["status"] == "ACTIVE", 60, "EKS ACTIVE")
        product.services.kube.register_eks(NAME)  # what the eks stage's registry row does
        yield product


def _vpc(product: SandboxProduct) -> str:
    """The world's VPC (the network stage's, for the load balancer controller's ``--aws-vpc-id``)."""
    vpcs = product.client("ec2").describe_vpcs(Filters=[{"Name": "cidr", "Values": ["10.30.0.0/16"]}])["Vpcs"]
    return str(vpcs[0]["VpcId"])


def _stages(product: SandboxProduct) -> list[Stage[Any]]:
    """The dependencies stage after a stand-in for the network stage that made the world's VPC."""
    subnets = [s["SubnetId"] for s in product.client("ec2").describe_subnets(
        Filters=[{"Name": "vpc-id", "Values": [_vpc(product)]}])["Subnets"]]
    network = NetworkResult(vpc_id=_vpc(product), public_subnets=[], private_subnets=subnets,
                            compute_subnet=subnets[0], security_group="sg-deps")
    return [Given("network", network.model_dump()), DependenciesStage(product.deps())]


def _objects(product: SandboxProduct) -> list[dict[str, object]]:
    target = Target(NAME, NAME, "us-west-2", PLAN.account, PLAN.tags, product.deps().aws, vpc_id=_vpc(product))
    return [o for c in MANIFESTS for o in c.objects(target)]


def test_the_plan_picks_components_by_hardware(world: SandboxProduct) -> None:
    names = [c.name for c in components_for(PLAN)]
    assert "nvidia-device-plugin" in names and "aws-efa-k8s-device-plugin" in names
    assert "neuron-device-plugin" not in names and "aws-fsx-csi-driver" not in names
    trn = [c.name for c in components_for(make_plan(NAME, instance_type="ml.trn1.32xlarge",
                                                    accelerator="AWS Trainium", efa=False,
                                                    fsx={"mode": "new"}))]
    assert "neuron-device-plugin" in trn and "aws-fsx-csi-driver" in trn
    assert "nvidia-device-plugin" not in trn and "aws-efa-k8s-device-plugin" not in trn
    assert "health-monitoring-agent" in names and "health-monitoring-agent" in trn
    cpu = [c.name for c in components_for(make_plan(NAME, instance_type="ml.m5.2xlarge", accelerator=None,
                                                    efa=False))]
    assert "health-monitoring-agent" not in cpu and "nvidia-device-plugin" not in cpu, "no node would run them"
    planned = DependenciesStage(world.deps()).resources(PLAN)
    assert {r.name for r in planned if r.action == "apply"} == set(names)
    assert {r.name for r in planned if r.type == "AWS::IAM::Role"} == {f"{NAME}-s3-csi-role", f"{NAME}-lbc-role"}


def test_component_arns_are_in_the_region_s_partition(world: SandboxProduct) -> None:
    target = Target(NAME, NAME, "cn-north-1", PLAN.account, PLAN.tags, world.deps().aws, bucket="shared")
    assert LBC_ROLE.role_arn(target) == f"arn:aws-cn:iam::{PLAN.account}:role/{NAME}-lbc-role"
    assert FSX_CSI_ROLE.policy_arns(target) == ["arn:aws-cn:iam::aws:policy/AmazonFSxFullAccess"]
    assert S3_CSI_ROLE.inline is not None
    resources = [r for st in S3_CSI_ROLE.inline(target)["Statement"] for r in st["Resource"]]
    assert resources == ["arn:aws-cn:s3:::shared", "arn:aws-cn:s3:::shared/*"]


def test_the_stage_applies_every_component_once_and_completes_without_nodes(world: SandboxProduct) -> None:
    ledger = CallLedger(world.live)
    mark = ledger.mark()
    view = run_stages(world.services, _stages(world), PLAN)
    assert view.status == Status.SUCCEEDED, view.error

    created = Counter(e["request"]["addonName"] for e in ledger.succeeded("eks", "CreateAddon", since=mark))
    assert created == Counter(ADDONS)
    s3 = next(e["request"] for e in ledger.succeeded("eks", "CreateAddon", since=mark)
              if e["request"]["addonName"] == "aws-mountpoint-s3-csi-driver")
    assert s3["podIdentityAssociations"] == [{"serviceAccount": "s3-csi-driver-sa",
                                             "roleArn": f"arn:aws:iam::123456789012:role/{NAME}-s3-csi-role"}]
    assert s3["tags"]["instantstart:cluster"] == NAME and s3["resolveConflicts"] == "OVERWRITE"
    roles = Counter(e["request"]["RoleName"] for e in ledger.succeeded("iam", "CreateRole", since=mark))
    assert roles == Counter([f"{NAME}-s3-csi-role", f"{NAME}-lbc-role"])
    assoc_entry = ledger.once("eks", "CreatePodIdentityAssociation", since=mark)
    assoc = assoc_entry["request"]
    assert (assoc["namespace"], assoc["serviceAccount"]) == ("kube-system", "aws-load-balancer-controller")
    # EKS is handed each new role only once IAM has had its propagation time (as AWS saw the calls)
    made = {e["request"]["RoleName"]: e["time"] for e in ledger.succeeded("iam", "CreateRole", since=mark)}
    s3_entry = next(e for e in ledger.succeeded("eks", "CreateAddon", since=mark)
                    if e["request"]["addonName"] == "aws-mountpoint-s3-csi-driver")
    assert s3_entry["time"] - made[f"{NAME}-s3-csi-role"] >= PROPAGATION_SECONDS
    assert assoc_entry["time"] - made[f"{NAME}-lbc-role"] >= PROPAGATION_SECONDS

    applied = Counter((e["resource"], e.get("namespace"), e["name"])
                      for e in ledger.writes(since=mark, cluster=NAME, verb="patch"))
    assert all(n == 1 for n in applied.values()), applied
    assert len(applied) == len(_objects(world)), (len(applied), len(_objects(world)))
    assert not ledger.writes(since=mark, cluster=NAME, verb="create")  # server-side apply only

    api = world.services.kube.api_client(NAME)
    apps = k8s.AppsV1Api(api)
    daemonsets = {(d.metadata.namespace, d.metadata.name) for d in apps.list_daemon_set_for_all_namespaces().items}
    assert {("kube-system", "nvidia-device-plugin-daemonset"), ("kube-system", "aws-efa-k8s-device-plugin-daemonset"),
            ("aws-hyperpod", "health-monitoring-agent")} <= daemonsets
    deployments = {(d.metadata.namespace, d.metadata.name)
                   for d in apps.list_deployment_for_all_namespaces().items}
    assert {("kubeflow", "training-operator"), ("kuberay-operator", "kuberay-operator"),
            ("kube-system", "aws-load-balancer-controller"), ("kube-system", "coredns")} <= deployments
    crds = {c.metadata.name for c in k8s.ApiextensionsV1Api(api).list_custom_resource_definition().items}
    assert {"pytorchjobs.kubeflow.org", "rayjobs.ray.io", "rayclusters.ray.io", "rayservices.ray.io"} <= crds
    lbc = apps.read_namespaced_deployment("aws-load-balancer-controller", "kube-system")
    assert {f"--aws-vpc-id={_vpc(world)}", "--aws-region=us-west-2", f"--cluster-name={NAME}"} <= set(
        lbc.spec.template.spec.containers[0].args)
    # the controller's CRDs, its webhooks and their serving certificate (applied once cert-manager serves its API)
    assert {"targetgroupbindings.elbv2.k8s.aws", "ingressclassparams.elbv2.k8s.aws",
            "certificates.cert-manager.io", "issuers.cert-manager.io"} <= crds
    admission = k8s.AdmissionregistrationV1Api(api)
    mutating = admission.read_mutating_webhook_configuration("aws-load-balancer-webhook")
    validating = admission.read_validating_webhook_configuration("aws-load-balancer-webhook")
    policies = {w.name: w.failure_policy for w in mutating.webhooks + validating.webhooks}
    assert policies == {"mpod.elbv2.k8s.aws": "Fail", "mservice.elbv2.k8s.aws": "Ignore",
                        "mtargetgroupbinding.elbv2.k8s.aws": "Fail", "vingressclassparams.elbv2.k8s.aws": "Fail",
                        "vtargetgroupbinding.elbv2.k8s.aws": "Fail", "vingress.elbv2.k8s.aws": "Fail"}, policies
    assert {w.client_config.service.name for w in mutating.webhooks + validating.webhooks} == {
        "aws-load-balancer-webhook-service"}
    assert mutating.metadata.annotations["cert-manager.io/inject-ca-from"] == \
        "kube-system/aws-load-balancer-serving-cert"
    certificate = k8s.CustomObjectsApi(api).get_namespaced_custom_object(
        "cert-manager.io", "v1", "kube-system", "certificates", "aws-load-balancer-serving-cert")
    assert certificate["spec"]["secretName"] == "aws-load-balancer-tls"
    assert "aws-load-balancer-webhook-service.kube-system.svc" in certificate["spec"]["dnsNames"]
    assert certificate["spec"]["issuerRef"]["name"] == k8s.CustomObjectsApi(api).get_namespaced_custom_object(
        "cert-manager.io", "v1", "kube-system", "issuers", "aws-load-balancer-selfsigned-issuer")["metadata"]["name"]
    volumes = lbc.spec.template.spec.volumes
    assert [(v.name, v.secret.secret_name) for v in volumes] == [("cert", "aws-load-balancer-tls")]
    assert k8s.CoreV1Api(api).read_namespaced_service("aws-load-balancer-webhook-service", "kube-system").spec.ports[
        0].port == 443
    role = k8s.RbacAuthorizationV1Api(api).read_cluster_role("hyperpod-patching")
    assert role.metadata.labels["app.kubernetes.io/managed-by"] == "instantstart"
    assert [(f.manager, f.operation) for f in role.metadata.managed_fields] == [("instantstart", "Apply")]

    # no node yet: coredns cannot run, EKS says DEGRADED, yet the stage counted it as applied
    assert view.result is not None
    states = {s["name"]: s for s in view.result["dependencies"]["components"]}
    assert set(states) == {c.name for c in components_for(PLAN)}
    assert states["coredns"]["status"] == "DEGRADED" and "no node yet" in states["coredns"]["detail"]
    health = {s.name: s for s in components_health(world.deps(), PLAN, _vpc(world))}
    assert health["coredns"].status == "DEGRADED" and not health["coredns"].healthy
    assert "InsufficientNumberOfReplicas" in health["coredns"].detail
    assert health["kube-proxy"].healthy  # nothing of it has to schedule in the sandbox
    assert not health["nvidia-device-plugin"].healthy and "no node" in health["nvidia-device-plugin"].detail
    assert health["hyperpod-rbac"].healthy and health["kuberay-operator"].status == "Applied"


def test_a_rerun_applies_nothing(world: SandboxProduct) -> None:
    ledger = CallLedger(world.live)
    mark = ledger.mark()
    view = run_stages(world.services, _stages(world), PLAN)
    assert view.status == Status.SUCCEEDED, view.error
    ledger.assert_no_writes(since=mark)
    assert not ledger.succeeded("eks", "CreateAddon", since=mark)
    assert not view.stages[1].acted


def test_a_changed_object_is_applied_again_alone(world: SandboxProduct) -> None:
    apps = k8s.AppsV1Api(world.services.kube.api_client(NAME))
    apps.patch_namespaced_deployment("kuberay-operator", "kuberay-operator",
                                     {"metadata": {"annotations": {APPLIED: "edited"}}})
    ledger = CallLedger(world.live)
    mark = ledger.mark()
    view = run_stages(world.services, _stages(world), PLAN)
    assert view.status == Status.SUCCEEDED, view.error
    assert [(e["resource"], e["name"]) for e in ledger.writes(since=mark)] == [("deployments.apps", "kuberay-operator")]


def test_our_role_with_another_trust_gets_ours_back(world: SandboxProduct) -> None:
    iam = world.client("iam")
    iam.update_assume_role_policy(RoleName=f"{NAME}-lbc-role", PolicyDocument=EKS_TRUST)  # edited since
    ledger = CallLedger(world.live)
    mark = ledger.mark()
    view = run_stages(world.services, _stages(world), PLAN)
    assert view.status == Status.SUCCEEDED, view.error
    assert ledger.once("iam", "UpdateAssumeRolePolicy", since=mark)["request"]["RoleName"] == f"{NAME}-lbc-role"
    trust = iam.get_role(RoleName=f"{NAME}-lbc-role")["Role"]["AssumeRolePolicyDocument"]
    assert trust["Statement"][0]["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    assert not ledger.succeeded("iam", "CreateRole", since=mark)


def _affinity_types(component: Manifests, target: Target) -> set[str]:
    return {value for obj in component.objects(target) if obj["kind"] == "DaemonSet"
            for term in obj["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            for expr in term["matchExpressions"] if expr["key"] == "node.kubernetes.io/instance-type"
            for value in expr["values"]}


def test_the_device_plugins_select_every_type_of_their_family(world: SandboxProduct) -> None:
    accepted = world.client("sagemaker").meta.service_model.shape_for("ClusterInstanceType").enum
    target = Target(NAME, NAME, "us-west-2", PLAN.account, PLAN.tags, world.deps().aws)
    nvidia = {t for t in accepted if t.split(".")[1][0] in "gp"}
    neuron = {t for t in accepted if t.split(".")[1].startswith(("trn", "inf"))}
    assert {"ml.g4dn.xlarge", "ml.g5.8xlarge", "ml.p5.48xlarge"} <= nvidia and "ml.trn1.32xlarge" in neuron
    assert _affinity_types(NVIDIA_PLUGIN, target) == nvidia
    assert _affinity_types(NEURON_PLUGIN, target) == neuron
    assert _affinity_types(HEALTH_AGENT, target) == nvidia | neuron


def test_verify_needs_a_ready_device_plugin_pod_per_node(world: SandboxProduct) -> None:
    api = world.services.kube.api_client(NAME)
    core = k8s.CoreV1Api(api)
    core.create_node({"metadata": {"name": "gpu-1", "labels": {"node.kubernetes.io/instance-type": "ml.g5.8xlarge"}},
                      "status": {"conditions": [{"type": "Ready", "status": "True"}],
                                 "capacity": {"cpu": "32", "memory": "128Gi", "pods": "110"},
                                 "allocatable": {"cpu": "32", "memory": "128Gi", "pods": "110"}}})
    try:
        apps = k8s.AppsV1Api(api)
        wait_until(lambda: (apps.read_namespaced_daemon_set("nvidia-device-plugin-daemonset", "kube-system")
                            .status.number_ready or 0) == 1, 60, "the NVIDIA plugin's pod ready on gpu-1")
        two = {s.name: s for s in components_health(world.deps(), PLAN, _vpc(world))}  # PLAN has count=2
        assert not two["nvidia-device-plugin"].healthy and "1/2" in two["nvidia-device-plugin"].detail
        assert two["nvidia-device-plugin"].status == "Applied"
        one = {s.name: s for s in components_health(world.deps(), make_plan(NAME, count=1), _vpc(world))}
        assert one["nvidia-device-plugin"].healthy, one["nvidia-device-plugin"]
    finally:
        core.delete_node("gpu-1")


def _load_balanced(api: k8s.ApiClient) -> tuple[k8s.CoreV1Api, k8s.NetworkingV1Api]:
    """A user's Service of type LoadBalancer and Ingress, each held by the controller's finalizer, and a plain
    Service; returns the clients."""
    core, net = k8s.CoreV1Api(api), k8s.NetworkingV1Api(api)
    core.create_namespace({"metadata": {"name": "web"}})
    port = [{"port": 80, "targetPort": 8080}]
    core.create_namespaced_service("web", {"metadata": {"name": "front", "finalizers": ["service.k8s.aws/resources"]},
                                           "spec": {"type": "LoadBalancer", "ports": port}})
    core.create_namespaced_service("web", {"metadata": {"name": "plain"}, "spec": {"ports": port}})
    net.create_namespaced_ingress("web", {"metadata": {"name": "site", "finalizers": ["ingress.k8s.aws/resources"]},
                                          "spec": {"ingressClassName": "alb", "defaultBackend": {
                                              "service": {"name": "front", "port": {"number": 80}}}}})
    return core, net


def test_teardown_deletes_ours_and_keeps_what_is_not(world: SandboxProduct) -> None:
    eks, iam = world.client("eks"), world.client("iam")
    eks.create_addon(clusterName=NAME, addonName="aws-ebs-csi-driver")  # a user's add-on: not ours
    api = world.services.kube.api_client(NAME)
    core, net = _load_balanced(api)
    controller_there: list[bool] = []

    def load_balancer_controller() -> None:  # what the real controller does: delete the LBs, drop its finalizers
        wait_until(lambda: core.read_namespaced_service("front", "web").metadata.deletion_timestamp is not None
                   and net.read_namespaced_ingress("site", "web").metadata.deletion_timestamp is not None,
                   60, "the load-balanced objects marked for deletion")
        controller_there.append(bool(k8s.AppsV1Api(api).list_namespaced_deployment(
            "kube-system", field_selector="metadata.name=aws-load-balancer-controller").items))
        core.patch_namespaced_service("front", "web", {"metadata": {"finalizers": None}})
        net.patch_namespaced_ingress("site", "web", {"metadata": {"finalizers": None}})

    controller = threading.Thread(target=load_balancer_controller, daemon=True)
    controller.start()
    ledger = CallLedger(world.live)
    mark = ledger.mark()
    plan = ClusterDeletePlan(name=NAME, region="us-west-2", account=PLAN.account, eks_cluster=NAME,
                             bucket=PLAN.bucket, requested_by="tester")
    view = run_stages(world.services, [DependenciesTeardown(world.deps())], plan)
    controller.join(60)
    assert view.status == Status.SUCCEEDED, view.error
    assert controller_there == [True]  # the controller was still there to delete its load balancers
    assert [s.metadata.name for s in core.list_namespaced_service("web").items] == ["plain"]
    assert not net.list_ingress_for_all_namespaces().items
    order = [(e["resource"], e["name"]) for e in ledger.writes(since=mark, cluster=NAME, verb="delete")]
    assert order.index(("deployments.apps", "aws-load-balancer-controller")) > max(
        order.index(("services", "front")), order.index(("ingresses.networking.k8s.io", "site")))

    deleted = Counter(e["request"]["addonName"] for e in ledger.succeeded("eks", "DeleteAddon", since=mark))
    assert deleted == Counter(ADDONS)
    assert eks.list_addons(clusterName=NAME)["addons"] == ["aws-ebs-csi-driver"]
    for role in (f"{NAME}-s3-csi-role", f"{NAME}-lbc-role"):
        with pytest.raises(iam.exceptions.NoSuchEntityException):
            iam.get_role(RoleName=role)
    assert eks.list_pod_identity_associations(clusterName=NAME)["associations"] == []
    apps = k8s.AppsV1Api(api)
    ours = "app.kubernetes.io/managed-by=instantstart"
    assert not apps.list_daemon_set_for_all_namespaces(label_selector=ours).items
    assert not apps.list_deployment_for_all_namespaces(label_selector=ours).items
    assert not k8s.ApiextensionsV1Api(api).list_custom_resource_definition(label_selector=ours).items
    assert view.result is not None
    deleted_names = {line.partition(":")[0] for line in view.result["dependencies"]["deleted"]}
    ours_deleted = {c.name for c in COMPONENTS if c.name in {*ADDONS, *(m.name for m in MANIFESTS)}}
    assert deleted_names == {"load balancers"} | ours_deleted

    mark = ledger.mark()
    again = run_stages(world.services, [DependenciesTeardown(world.deps())], plan)
    assert again.status == Status.SUCCEEDED, again.error
    ledger.assert_no_writes(since=mark)


def test_a_foreign_role_with_our_name_stops_the_stage_before_any_write(world: SandboxProduct) -> None:
    iam = world.client("iam")
    iam.create_role(RoleName=f"{NAME}-lbc-role", AssumeRolePolicyDocument=EKS_TRUST)  # not ours: no tags
    ledger = CallLedger(world.live)
    mark = ledger.mark()
    view = run_stages(world.services, _stages(world), PLAN)
    assert view.status == Status.FAILED and view.error is not None
    assert f"{NAME}-lbc-role" in view.error["message"] and "not deps's" in view.error["message"]
    ledger.assert_no_writes(since=mark)
    assert not iam.list_attached_role_policies(RoleName=f"{NAME}-lbc-role")["AttachedPolicies"]
