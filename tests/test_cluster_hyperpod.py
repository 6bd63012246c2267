"""The hyperpod, storage and verify stages of ``cluster.create`` and their teardowns, against the sandbox.

The earlier stages' work (VPC, subnets, security group, roles, bucket, an EKS cluster registered as managed)
is built with boto3 as a user would, and handed to the stages under test with ``Given``. Assertions are on
what AWS and Kubernetes saw: the call ledger, the emulator's nodes and claims, the bucket's objects.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx2
import pytest
from kubernetes import client as k8s

from services.clusters.create_base import ClusterDeletePlan
from services.clusters.create_models import (
    CapacityType,
    ClusterCreatePlan,
    EksResult,
    FsxChoice,
    IamResult,
    NetworkResult,
)
from services.clusters.dependencies_stage import DependenciesStage, components_health
from services.clusters.hyperpod_stage import HyperpodStage, HyperpodTeardown, lifecycle_scripts
from services.clusters.models import ClusterRecord, Ownership
from services.clusters.storage_stage import (
    FSX_CLAIM,
    S3_CLAIM,
    StorageStage,
    StorageTeardown,
    s3_prefix,
    volume_name,
)
from services.clusters.verify_stage import VerifyStage
from services.operations import TERMINAL, OperationView
from services.stages import Done, OperationKind, Stage, StageContext
from tests.conftest import ADMIN
from tests.create_support import Given, SandboxProduct, make_plan, run_stages, sandbox_product
from tests.ledger import CallLedger
from tests.support import wait_until

SPEED = 300.0  # a HyperPod create (300 s setup + 900 s boot) takes ~4 s; the stage's deadline ~48 s
# each test uses its own instance type or stays within the sandbox account's default quota of 4 ml.g5.8xlarge
BUCKET = "instantstart-shared-123456789012-us-west-2"
PLAN_ARN = "arn:aws:sagemaker:us-west-2:123456789012:training-plan/reserved-a"


def _trust(service: str) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}]})


@dataclass
class World:
    product: SandboxProduct
    network: NetworkResult
    iam: IamResult
    ledger: CallLedger

    def eks(self, plan: ClusterCreatePlan) -> EksResult:
        """An EKS cluster for ``plan`` (API authentication), ACTIVE and registered as managed."""
        eks = self.product.client("eks")
        made = eks.create_cluster(
            name=plan.names.eks_cluster, roleArn=self.iam.eks_role_arn,
            resourcesVpcConfig={"subnetIds": self.network.private_subnets,
                                "securityGroupIds": [self.network.security_group]},
            accessConfig={"authenticationMode": "API", "bootstrapClusterCreatorAdminPermissions": True},
            tags=plan.tags)["cluster"]
        active = wait_until(lambda: (c := eks.describe_cluster(name=plan.names.eks_cluster)["cluster"])["status"]
                            == "ACTIVE" and c, 60, "EKS cluster ACTIVE")
        self.product.services.clusters.registry.add(ClusterRecord(
            name=plan.name, region=plan.region, eks_name=plan.names.eks_cluster, eks_arn=made["arn"],
            ownership=Ownership.MANAGED, created_at="", created_by="tester"), 0.0)
        return EksResult(eks_arn=made["arn"], endpoint=active["endpoint"], oidc_issuer=active["identity"]["oidc"]
                         ["issuer"])

    def given(self, plan: ClusterCreatePlan, eks: EksResult | None = None) -> list[Stage[Any]]:
        """Stand-ins for the network, iam and eks stages (a new EKS cluster unless ``eks`` is given)."""
        return [Given("network", self.network.model_dump()), Given("iam", self.iam.model_dump()),
                Given("eks", (eks or self.eks(plan)).model_dump())]

    def core(self, plan: ClusterCreatePlan) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.product.services.kube.api_client(plan.name))

    def create_stages(self) -> list[Stage[Any]]:
        deps = self.product.deps()
        return [DependenciesStage(deps), HyperpodStage(deps), StorageStage(deps), VerifyStage(deps)]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with sandbox_product(tmp_path_factory.mktemp("hyperpod"), speed=SPEED) as product:
        ec2, iam, s3 = product.client("ec2"), product.client("iam"), product.client("s3")
        vpc = ec2.create_vpc(CidrBlock="10.192.0.0/16")["Vpc"]["VpcId"]
        subnets = [ec2.create_subnet(VpcId=vpc, CidrBlock=cidr, AvailabilityZone=zone)["Subnet"]["SubnetId"]
                   for cidr, zone in (("10.192.0.0/20", "us-west-2a"), ("10.192.16.0/20", "us-west-2b"),
                                      ("10.192.128.0/18", "us-west-2a"))]
        sg = ec2.create_security_group(GroupName="nodes", VpcId=vpc, Description="all traffic within")["GroupId"]
        ec2.authorize_security_group_ingress(GroupId=sg, IpPermissions=[
            {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": sg}]}])
        roles = {svc: iam.create_role(RoleName=name, AssumeRolePolicyDocument=_trust(svc))["Role"]["Arn"]
                 for svc, name in (("eks.amazonaws.com", "eks-cluster-role"),
                                   ("sagemaker.amazonaws.com", "hyperpod-exec-role"))}
        s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
        network = NetworkResult(vpc_id=vpc, public_subnets=subnets[:2], private_subnets=subnets[:2],
                                compute_subnet=subnets[2], security_group=sg)
        yield World(product, network, IamResult(eks_role_arn=roles["eks.amazonaws.com"],
                                                execution_role_arn=roles["sagemaker.amazonaws.com"], bucket=BUCKET),
                    CallLedger(product.live))


def _succeeded(view: OperationView) -> OperationView:
    assert view.status == "succeeded", (view.error, [(s.name, s.status, s.message) for s in view.stages])
    return view


def test_create_runs_nodes_join_claims_bind_and_a_rerun_makes_nothing(world: World) -> None:
    plan = make_plan("hp-make")
    mark = world.ledger.mark()
    view = _succeeded(run_stages(world.product.services, world.given(plan) + world.create_stages(), plan))

    created = world.ledger.once("sagemaker", "CreateCluster", since=mark)["request"]
    assert created["NodeProvisioningMode"] == "Continuous" and created["NodeRecovery"] == "Automatic"
    group = created["InstanceGroups"][0]
    assert group["InstanceGroupName"] == "workers" and group["InstanceCount"] == 2
    assert group["ExecutionRole"] == world.iam.execution_role_arn
    assert group["InstanceStorageConfigs"] == [{"EbsVolumeConfig": {"VolumeSizeInGB": 500}}]
    assert group["CapacityRequirements"] == {"OnDemand": {}}
    assert group["LifeCycleConfig"] == {"SourceS3Uri": f"s3://{BUCKET}/instantstart/hp-make/lifecycle/",
                                        "OnCreate": "on_create.sh"}
    assert created["VpcConfig"] == {"SecurityGroupIds": [world.network.security_group],
                                    "Subnets": [world.network.compute_subnet]}
    assert {"Key": "instantstart:cluster", "Value": "hp-make"} in created["Tags"]
    body = world.product.client("s3").get_object(Bucket=BUCKET, Key="instantstart/hp-make/lifecycle/on_create.sh")
    assert body["Body"].read() == lifecycle_scripts()["on_create.sh"]  # the shipped script, byte for byte

    deps = world.product.deps()
    vpc = world.network.vpc_id

    def node_lists(since: int) -> int:
        return sum(1 for e in world.ledger.calls(service="kubernetes", verb="list", cluster="hp-make", since=since)
                   if e["resource"] == "nodes")

    components = world.ledger.mark()
    components_health(deps, plan, vpc)  # the components' own health reads (what verify checks beside its nodes)
    by_components = node_lists(components)
    ctx = StageContext(view.id, view.kind, plan.name, plan, {}, {s.name: s.result for s in view.stages if s.result},
                       world.product.services.clock, 1)
    polled = world.ledger.mark()
    assert VerifyStage(deps).poll(ctx) == Done() and ctx.data["found"]["nodes"] == 2
    assert node_lists(polled) == by_components, "verify reads its nodes from the nodes informer, not a list per poll"
    nodes = world.core(plan).list_node(label_selector="sagemaker.amazonaws.com/instance-group-name=workers").items
    assert len(nodes) == 2
    assert {n.metadata.labels["sagemaker.amazonaws.com/node-health-status"] for n in nodes} == {"Schedulable"}
    claim = world.core(plan).read_namespaced_persistent_volume_claim(S3_CLAIM, "default")
    assert claim.status.phase == "Bound" and claim.spec.volume_name == volume_name("hp-make", S3_CLAIM)
    pv = world.core(plan).read_persistent_volume(volume_name("hp-make", S3_CLAIM))
    assert pv.spec.csi.driver == "s3.csi.aws.com" and pv.spec.csi.volume_attributes == {"bucketName": BUCKET}
    assert f"prefix {s3_prefix('hp-make')}" in pv.spec.mount_options
    hyperpod = next(s for s in view.stages if s.name == "hyperpod").result
    arn = hyperpod["hyperpod_arn"]
    assert hyperpod["groups"] == {"workers": 2}
    verified = next(s for s in view.stages if s.name == "verify").result
    assert verified["nodes_ready"] == 2 and verified["claims_bound"] == 1 and verified["components_healthy"] > 0
    assert world.product.services.clusters.registry.get("hp-make").hyperpod_arn == arn

    again = world.ledger.mark()
    eks = EksResult.model_validate(view.stages[2].result)
    _succeeded(run_stages(world.product.services, world.given(plan, eks) + world.create_stages(), plan))
    assert world.ledger.succeeded("sagemaker", "CreateCluster", since=again) == []
    assert world.ledger.succeeded("s3", "PutObject", since=again) == []
    world.ledger.assert_no_writes(since=again, service="kubernetes")


def test_a_cluster_of_that_name_without_our_tags_is_refused(world: World) -> None:
    plan = make_plan("hp-foreign")
    eks = world.eks(plan)
    sagemaker = world.product.client("sagemaker")
    theirs = sagemaker.create_cluster(  # someone else's cluster, by the name the plan derived
        ClusterName="hp-foreign", Orchestrator={"Eks": {"ClusterArn": eks.eks_arn}},
        VpcConfig={"SecurityGroupIds": [world.network.security_group], "Subnets": [world.network.compute_subnet]},
        InstanceGroups=[{"InstanceGroupName": "workers", "InstanceType": "ml.m5.2xlarge", "InstanceCount": 1,
                         "ExecutionRole": world.iam.execution_role_arn,
                         "LifeCycleConfig": {"SourceS3Uri": f"s3://{BUCKET}/theirs/", "OnCreate": "on_create.sh"}}]
    )["ClusterArn"]
    mark = world.ledger.mark()
    view = run_stages(world.product.services, [*world.given(plan, eks), HyperpodStage(world.product.deps())], plan)
    assert view.status == "failed" and "was not made by this control plane" in str(view.error)
    assert world.ledger.writes(since=mark, service="sagemaker") == []
    assert world.ledger.writes(since=mark, service="s3") == []

    # deleting that failed create: the same-named cluster is not ours, nothing to delete; the teardown goes on
    teardown = _delete_plan("hp-foreign", hyperpod_cluster="hp-foreign")
    done = _succeeded(run_stages(world.product.services, [HyperpodTeardown(world.product.deps())], teardown))
    noted = next(s for s in done.stages if s.name == "hyperpod").result["not_ours"]
    assert noted["hyperpod_arn"] == theirs and "not ours, nothing to delete" in noted["message"]
    assert world.ledger.writes(since=mark, service="sagemaker") == []
    assert world.product.client("sagemaker").describe_cluster(ClusterName="hp-foreign")["ClusterStatus"] != "Deleting"


def _delete_plan(name: str, hyperpod_cluster: str | None = None) -> ClusterDeletePlan:
    return ClusterDeletePlan(name=name, region="us-west-2", account="123456789012", eks_cluster=name,
                             hyperpod_cluster=hyperpod_cluster, bucket=BUCKET, requested_by="tester")


def test_scripts_uploaded_before_a_refused_create_call_are_removed_by_the_teardown(world: World) -> None:
    plan = make_plan("hp-refused", instance_type="ml.m5.xlarge", count=1)
    fake = EksResult(eks_arn="arn:aws:eks:us-west-2:123456789012:cluster/hp-refused", endpoint="https://x",
                     oidc_issuer="x")
    s3 = world.product.client("s3")
    s3.put_object(Bucket=BUCKET, Key="instantstart/hp-refused/lifecycle/notes.txt", Body=b"a user's file")
    s3.put_object(Bucket=BUCKET, Key="instantstart/hp-refused/data/on_create.sh", Body=b"a user's data")
    denied = world.product.live.post("/api/v1/sandbox/faults", {"kind": "access_denied", "target": {
        "service": "sagemaker", "action": "CreateCluster"}})
    assert denied.status_code in (200, 201), denied.text
    try:
        view = run_stages(world.product.services, [*world.given(plan, fake), HyperpodStage(world.product.deps())],
                          plan)
    finally:
        httpx2.delete(f"{world.product.live.url}/api/v1/sandbox/faults/{denied.json()['id']}",
                      headers=world.product.live.headers(), timeout=30)
    assert view.status == "failed"
    prefix = "instantstart/hp-refused/lifecycle/"
    uploaded = {o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix)["Contents"]}
    assert {prefix + f for f in lifecycle_scripts()} <= uploaded  # the upload came before the refusal

    mark = world.ledger.mark()  # the registry has no HyperPod cluster: CreateCluster never made one
    _succeeded(run_stages(world.product.services, [HyperpodTeardown(world.product.deps())],
                          _delete_plan("hp-refused")))
    world.ledger.once("s3", "DeleteObjects", since=mark)
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="instantstart/hp-refused/")["Contents"]}
    assert keys == {prefix + "notes.txt", "instantstart/hp-refused/data/on_create.sh"}  # only shipped names went


def test_storage_teardown_after_the_eks_cluster_was_deleted_elsewhere_skips_kubernetes(world: World) -> None:
    plan = make_plan("hp-eks-gone")
    world.eks(plan)  # registered as managed
    eks = world.product.client("eks")
    eks.delete_cluster(name=plan.names.eks_cluster)

    def gone() -> bool:
        try:
            eks.describe_cluster(name=plan.names.eks_cluster)
        except eks.exceptions.ResourceNotFoundException:
            return True
        return False

    wait_until(gone, 60, "EKS cluster deleted")
    mark = world.ledger.mark()
    _succeeded(run_stages(world.product.services, [StorageTeardown(world.product.deps())],
                          _delete_plan("hp-eks-gone")))
    world.ledger.assert_no_writes(since=mark)


def test_a_failed_cluster_of_ours_is_replaced_when_the_stage_is_retried(world: World) -> None:
    plan = make_plan("hp-failed", instance_type="ml.c5.2xlarge", count=1)
    eks = world.eks(plan)
    capacity = world.product.live.post("/api/v1/sandbox/faults", {"kind": "insufficient_capacity",
                                                                  "target": {"instance_type": "ml.c5.2xlarge"}})
    assert capacity.status_code in (200, 201), capacity.text
    sagemaker = world.product.client("sagemaker")
    ctx = StageContext("op", "k", "t", plan, {}, {"network": world.network.model_dump(),
                                                   "iam": world.iam.model_dump(), "eks": eks.model_dump()},
                       world.product.services.clock, 1)
    request = HyperpodStage(world.product.deps()).create_request(ctx)
    del request["NodeProvisioningMode"]  # an earlier attempt's cluster, all-or-nothing: it fails on capacity
    failed = sagemaker.create_cluster(**request)["ClusterArn"]
    wait_until(lambda: sagemaker.describe_cluster(ClusterName="hp-failed")["ClusterStatus"] == "Failed", 60,
               "the earlier cluster Failed")
    reason = str(sagemaker.describe_cluster(ClusterName="hp-failed").get("FailureMessage"))
    httpx2.delete(f"{world.product.live.url}/api/v1/sandbox/faults/{capacity.json()['id']}",
                  headers=world.product.live.headers(), timeout=30)

    mark = world.ledger.mark()
    op = _submit(world, [*world.given(plan, eks), HyperpodStage(world.product.deps())], plan)
    engine = world.product.services.engine

    def evidence() -> str | None:
        message = next(s for s in engine.get(op).stages if s.name == "hyperpod").message or ""
        return message if failed in message and reason in message else None

    wait_until(evidence, 60, "the stage naming the failed cluster and AWS's reason while it replaces it")
    _succeeded(wait_until(lambda: (v := engine.get(op)).status in TERMINAL and v, 120, "operation done"))
    world.ledger.once("sagemaker", "DeleteCluster", since=mark)
    made = world.ledger.once("sagemaker", "CreateCluster", since=mark)["request"]
    assert made["NodeProvisioningMode"] == "Continuous"
    now = sagemaker.describe_cluster(ClusterName="hp-failed")
    assert now["ClusterArn"] != failed and now["ClusterStatus"] == "InService"
    assert world.product.services.clusters.registry.get("hp-failed").hyperpod_arn == now["ClusterArn"]


def _submit(world: World, stages: list[Stage[Any]], plan: ClusterCreatePlan) -> str:
    kind = f"test.hyperpod.{plan.name}"
    engine = world.product.services.engine
    engine.register(OperationKind(kind, ClusterCreatePlan, tuple(stages), target=lambda r: f"test/{kind}"))
    view, _ = engine.submit(kind, plan, ADMIN)
    return view.id


def test_a_capacity_shortfall_is_reported_and_the_group_fills_once_capacity_returns(world: World) -> None:
    plan = make_plan("hp-short", instance_type="ml.g5.4xlarge", count=1, efa=False)
    live = world.product.live
    fault = live.post("/api/v1/sandbox/faults", {"kind": "insufficient_capacity",
                                                  "target": {"instance_type": "ml.g5.4xlarge"}})
    assert fault.status_code in (200, 201), fault.text
    op = _submit(world, world.given(plan) + world.create_stages(), plan)
    engine = world.product.services.engine

    def short() -> str | None:
        stage = next(s for s in engine.get(op).stages if s.name == "hyperpod")
        message = stage.message or ""
        return message if "InService" in message and "sufficient capacity" in message else None

    # continuous provisioning: AWS calls the cluster InService while the group is short; the stage waits on
    message = wait_until(short, 60, "the hyperpod stage reporting AWS's capacity reason while InService")
    assert "0/1 nodes of workers Running" in message and "ml.g5.4xlarge in us-west-2a" in message
    assert engine.get(op).status not in TERMINAL
    # recorded while still short, so deleting a create that fails here would delete its HyperPod cluster too
    assert (world.product.services.clusters.registry.get("hp-short").hyperpod_arn or "").startswith("arn:aws:sagemaker")
    cleared = httpx2.delete(f"{live.url}/api/v1/sandbox/faults/{fault.json()['id']}", headers=live.headers(),
                            timeout=30)
    assert cleared.status_code == 200, cleared.text
    view = _succeeded(wait_until(lambda: (v := engine.get(op)).status in TERMINAL and v, 120, "operation done"))
    assert next(s for s in view.stages if s.name == "hyperpod").result["groups"] == {"workers": 1}


def test_a_failed_create_call_is_retried_without_uploading_the_scripts_again(world: World) -> None:
    plan = make_plan("hp-retry", instance_type="ml.m5.2xlarge", count=1)
    live = world.product.live
    throttled = live.post("/api/v1/sandbox/faults", {"kind": "throttle", "count": 1, "target": {
        "service": "sagemaker", "operation": "CreateCluster"}})
    assert throttled.status_code in (200, 201), throttled.text
    mark = world.ledger.mark()
    view = _succeeded(run_stages(world.product.services, [*world.given(plan), HyperpodStage(world.product.deps())],
                                 plan))
    tries = world.ledger.calls(service="sagemaker", operation="CreateCluster", since=mark)
    assert [c["status"] >= 400 for c in tries] == [True, False]  # throttled once, then made once
    assert len(world.ledger.succeeded("s3", "PutObject", since=mark)) == 1  # the retry found the script there
    assert next(s for s in view.stages if s.name == "hyperpod").retries >= 1


def test_an_existing_file_system_in_another_vpc_is_refused_before_anything_is_applied(world: World) -> None:
    ec2, fsx = world.product.client("ec2"), world.product.client("fsx")
    other_vpc = ec2.create_vpc(CidrBlock="10.50.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=other_vpc, CidrBlock="10.50.0.0/20", AvailabilityZone="us-west-2a")
    theirs = fsx.create_file_system(FileSystemType="LUSTRE", StorageCapacity=1200,
                                    SubnetIds=[subnet["Subnet"]["SubnetId"]],
                                    LustreConfiguration={"DeploymentType": "SCRATCH_2"})["FileSystem"]
    plan = make_plan("hp-elsewhere", fsx=FsxChoice(mode="existing", file_system_id=theirs["FileSystemId"]))
    given = world.given(plan)
    mark = world.ledger.mark()
    view = run_stages(world.product.services, [*given, Given("hyperpod", {"hyperpod_arn": "arn:aws:sagemaker:"
                                                                          "us-west-2:123456789012:cluster/x",
                                                                          "status": "InService"}),
                                               StorageStage(world.product.deps())], plan)
    assert view.status == "failed" and f"is in {other_vpc}, not in the cluster's VPC" in str(view.error)
    world.ledger.assert_no_writes(since=mark, service="kubernetes")
    assert world.ledger.writes(since=mark, service="fsx") == []


def test_a_failed_file_system_of_ours_is_replaced_when_the_stage_is_retried(world: World) -> None:
    plan = make_plan("hp-fsx-failed", fsx=FsxChoice(mode="new"))
    given = [*world.given(plan), Given("hyperpod", {"hyperpod_arn": "arn:aws:sagemaker:us-west-2:123456789012:"
                                                                    "cluster/x", "status": "InService"})]
    fault = world.product.live.post("/api/v1/sandbox/faults", {"kind": "file_system_failed", "count": 1, "target": {
        "subnet": world.network.compute_subnet}})
    assert fault.status_code in (200, 201), fault.text
    mark = world.ledger.mark()
    op = _submit(world, [*given, StorageStage(world.product.deps())], plan)
    engine = world.product.services.engine
    view = wait_until(lambda: (v := engine.get(op)).status in TERMINAL and v, 60, "the first attempt ends")
    assert view.status == "failed" and "is FAILED" in str(view.error) and "retry the stage" in str(view.error)
    world.ledger.once("fsx", "CreateFileSystem", since=mark)
    fsx = world.product.client("fsx")
    failed = next(f["FileSystemId"] for f in fsx.describe_file_systems()["FileSystems"]
                  if {"Key": "instantstart:cluster", "Value": "hp-fsx-failed"} in f["Tags"])
    assert failed in str(view.error)

    engine.retry(op, ADMIN)

    def evidence() -> str | None:
        message = next(s for s in engine.get(op).stages if s.name == "storage").message or ""
        return message if failed in message and "FAILED" in message else None

    wait_until(evidence, 60, "the stage naming the failed file system while it replaces it")
    _succeeded(wait_until(lambda: (v := engine.get(op)).status in TERMINAL and v, 120, "operation done"))
    world.ledger.once("fsx", "DeleteFileSystem", since=mark)
    assert len(world.ledger.succeeded("fsx", "CreateFileSystem", since=mark)) == 2
    assert failed not in [f["FileSystemId"] for f in fsx.describe_file_systems()["FileSystems"]]
    handle = world.core(plan).read_persistent_volume(volume_name("hp-fsx-failed", FSX_CLAIM)).spec.csi.volume_handle
    assert handle != failed
    assert fsx.describe_file_systems(FileSystemIds=[handle])["FileSystems"][0]["Lifecycle"] == "AVAILABLE"


def test_teardown_deletes_the_cluster_claims_and_our_file_system_and_keeps_the_bucket(world: World) -> None:
    plan = make_plan("hp-gone", instance_type="ml.g5.4xlarge", count=1, fsx=FsxChoice(mode="new"), efa=False)
    view = _succeeded(run_stages(world.product.services, world.given(plan) + world.create_stages(), plan))
    storage = next(s for s in view.stages if s.name == "storage").result
    fs_id = storage["fsx_file_system_id"]
    assert storage["claims"] == ["default/shared-s3", "default/fsx"]
    fsx = world.product.client("fsx")
    fs = fsx.describe_file_systems(FileSystemIds=[fs_id])["FileSystems"][0]
    assert {"Key": "instantstart:cluster", "Value": "hp-gone"} in fs["Tags"]
    assert fs["SubnetIds"] == [world.network.compute_subnet]
    core = world.core(plan)
    pv = core.read_persistent_volume(volume_name("hp-gone", FSX_CLAIM))
    assert pv.spec.csi.driver == "fsx.csi.aws.com" and pv.spec.csi.volume_handle == fs_id
    assert pv.spec.csi.volume_attributes == {"dnsname": fs["DNSName"],
                                             "mountname": fs["LustreConfiguration"]["MountName"]}
    assert core.read_namespaced_persistent_volume_claim(FSX_CLAIM, "default").status.phase == "Bound"
    assert next(s for s in view.stages if s.name == "verify").result["claims_bound"] == 2

    s3 = world.product.client("s3")
    s3.put_object(Bucket=BUCKET, Key="instantstart/hp-gone/lifecycle/notes.txt", Body=b"a user's file")
    deps = world.product.deps()
    teardown = _delete_plan("hp-gone", hyperpod_cluster="hp-gone")
    mark = world.ledger.mark()
    _succeeded(run_stages(world.product.services, [StorageTeardown(deps), HyperpodTeardown(deps)], teardown))

    world.ledger.once("sagemaker", "DeleteCluster", since=mark)
    world.ledger.once("fsx", "DeleteFileSystem", since=mark)
    assert fs_id not in [f["FileSystemId"] for f in fsx.describe_file_systems()["FileSystems"]]
    names = [c["ClusterName"] for c in world.product.client("sagemaker").list_clusters()["ClusterSummaries"]]
    assert "hp-gone" not in names
    assert {S3_CLAIM, FSX_CLAIM} & {c.metadata.name for c in
                                    core.list_namespaced_persistent_volume_claim("default").items} == set()
    assert {volume_name("hp-gone", c) for c in (S3_CLAIM, FSX_CLAIM)} & {
        v.metadata.name for v in core.list_persistent_volume().items} == set()
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="instantstart/hp-gone/")["Contents"]]
    assert keys == ["instantstart/hp-gone/lifecycle/notes.txt"]  # our script went, the user's file and bucket stay
    s3.head_bucket(Bucket=BUCKET)
    assert world.ledger.succeeded("s3", "DeleteBucket", since=mark) == []


def test_the_plan_lists_what_the_stages_make_and_capacity_types_reach_the_request(world: World) -> None:
    deps = world.product.deps()
    plan = make_plan("hp-plan", fsx=FsxChoice(mode="new"), deep_health_checks=["InstanceStress"])
    made = HyperpodStage(deps).resources(plan) + StorageStage(deps).resources(plan)
    assert [(r.type, r.name, r.action) for r in made] == [
        ("AWS::S3::Object", f"s3://{BUCKET}/instantstart/hp-plan/lifecycle/", "apply"),
        ("AWS::SageMaker::Cluster", "hp-plan", "create"),
        ("Kubernetes PersistentVolume", "instantstart-hp-plan-shared-s3", "apply"),
        ("Kubernetes PersistentVolumeClaim", "default/shared-s3", "apply"),
        ("AWS::FSx::FileSystem", "hp-plan-fsx", "create"),
        ("Kubernetes PersistentVolume", "instantstart-hp-plan-fsx", "apply"),
        ("Kubernetes PersistentVolumeClaim", "default/fsx", "apply")]
    assert "deep health checks InstanceStress" in made[1].detail

    eks = EksResult(eks_arn="arn:aws:eks:us-west-2:123456789012:cluster/hp-plan", endpoint="https://x", oidc_issuer="x")
    results = {"network": world.network.model_dump(), "iam": world.iam.model_dump(), "eks": eks.model_dump()}

    def group(**overrides: Any) -> dict[str, Any]:
        ctx = StageContext("op", "k", "t", make_plan("hp-plan", **overrides), {}, results, world.product.services.clock,
                           1)
        return dict(HyperpodStage(deps).create_request(ctx)["InstanceGroups"][0])

    assert group(capacity_type=CapacityType.SPOT)["CapacityRequirements"] == {"Spot": {}}
    planned = group(capacity_type=CapacityType.TRAINING_PLAN, training_plan_arn=PLAN_ARN,
                    deep_health_checks=["InstanceStress", "InstanceConnectivity"])
    assert planned["TrainingPlanArn"] == PLAN_ARN and "CapacityRequirements" not in planned
    assert planned["OnStartDeepHealthChecks"] == ["InstanceStress", "InstanceConnectivity"]


def test_teardown_of_a_create_that_never_reached_eks_succeeds_and_writes_nothing(world: World) -> None:
    deps = world.product.deps()
    teardown = _delete_plan("hp-never")
    mark = world.ledger.mark()
    _succeeded(run_stages(world.product.services, [StorageTeardown(deps), HyperpodTeardown(deps)], teardown))
    world.ledger.assert_no_writes(since=mark)


def test_verify_counts_only_the_instances_hyperpod_lists_for_the_group(world: World) -> None:
    """A node that only carries the group's label (another cluster's instance) is not one of the group's nodes."""
    plan = make_plan("hp-count", instance_type="ml.m5.4xlarge", count=1, efa=False, accelerator=None)
    given = world.given(plan)
    impostor = {"metadata": {"name": "hyperpod-i-0fedcba9876543210", "labels": {
        "sagemaker.amazonaws.com/instance-group-name": plan.names.instance_group,
        "sagemaker.amazonaws.com/node-health-status": "Schedulable",
        "sagemaker.amazonaws.com/cluster-name": "someone-elses"}},
        "spec": {"providerID": "aws:///usw2-az1/sagemaker/cluster/hyperpod-other-i-0fedcba9876543210"},
        "status": {"conditions": [{"type": "Ready", "status": "True"}],
                   "capacity": {"cpu": "16", "memory": "64Gi", "pods": "110"},
                   "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"}}}
    world.core(plan).create_node(impostor)
    view = _succeeded(run_stages(world.product.services, given + world.create_stages(), plan))
    listed = world.product.client("sagemaker").list_cluster_nodes(ClusterName=plan.names.hyperpod_cluster)
    assert len(listed["ClusterNodeSummaries"]) == 1
    labelled = world.core(plan).list_node(
        label_selector=f"sagemaker.amazonaws.com/instance-group-name={plan.names.instance_group}").items
    assert len(labelled) == 2, "the impostor carries the group's label, as a selector by label would count it"
    verified = next(s for s in view.stages if s.name == "verify")
    assert verified.result["nodes_ready"] == 1, verified.message
