"""Tiered checkpointing against the sandbox: enabling sends UpdateCluster with only TieredStorageConfig and
builds exactly the identity chain (policy on the shared bucket, role trusting the cluster's OIDC provider for
exactly the service account, the attachment, the annotated service account), a re-apply writes nothing, a
settings change rewrites only what changed, and disabling removes exactly that chain, resource by resource
(ledger + the Kubernetes emulator through the official client)."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s
from pydantic import ValidationError

from services.clusters.create_base import ClusterDeletePlan
from services.clusters.iam_stage import IamTeardown
from services.components.tiered import (
    DEFAULT_NAMESPACE,
    PREREQUISITES,
    ROLE_ANNOTATION,
    SERVICE_ACCOUNT,
    TieredCheckpointing,
    TieredSettings,
)
from services.errors import Permanent
from tests.create_support import run_stages
from tests.scale_support import BUCKET, ScaleWorld, remove, scale_world, settle
from tests.support import wait_until

pytestmark = pytest.mark.slow
NAME = "tiers"
ROLE = f"{NAME}-tiered-checkpointing"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScaleWorld]:
    with scale_world(tmp_path_factory.mktemp("tiered"), NAME) as made:
        yield made


def _writes(world: ScaleWorld, since: int) -> Counter[str]:
    out: Counter[str] = Counter()
    for e in world.ledger.writes(since):
        if e.get("kind") == "aws":
            out[f"{e['service']}:{e['operation']}"] += 1
        else:
            out[f"k8s:{e['verb']}:{e['resource']}"] += 1
    return out


def test_settings_refuse_what_hyperpod_would_not_take() -> None:
    assert TieredSettings().namespace == DEFAULT_NAMESPACE and PREREQUISITES == ()
    with pytest.raises(ValidationError, match="auto-resume"):
        TieredSettings(namespace="training")
    with pytest.raises(ValidationError, match="namespace name"):
        TieredSettings(namespace="Hyperpod_Jobs")
    with pytest.raises(ValidationError):
        TieredSettings(memory_percent=10)  # the setup guide's range is 20-100
    assert TieredSettings(namespace="kubeflow").namespace == "kubeflow"
    assert TieredSettings(namespace="hyperpod-team-a", memory_percent=40).memory_percent == 40


def test_enable_builds_exactly_the_chain_then_a_reapply_writes_nothing_and_disable_removes_it(
        world: ScaleWorld) -> None:
    feature = TieredCheckpointing().configured(TieredSettings(memory_percent=40))
    target = world.target()
    before = feature.observe(target)
    assert before.status == "ABSENT" and not before.foreign and before.settings == {}
    assert set(feature.diff(before)) == {"tiered-storage", "namespace", "policy", "role", "attachment",
                                         "service-account"}

    mark = world.ledger.mark()
    after = settle(feature, target)
    assert after.settings == {"memory_percent": 40, "namespace": DEFAULT_NAMESPACE} and after.healthy
    assert _writes(world, mark) == Counter({
        "sagemaker:UpdateCluster": 1, "iam:CreatePolicy": 1, "iam:CreateRole": 1, "iam:AttachRolePolicy": 1,
        "k8s:create:namespaces": 1, "k8s:create:serviceaccounts": 1})
    update = world.ledger.once("sagemaker", "UpdateCluster", since=mark)["request"]
    assert update == {"ClusterName": NAME, "NodeRecovery": "Automatic",  # update-cluster won't take it alone
                      "TieredStorageConfig": {"Mode": "Enable", "InstanceMemoryAllocationPercentage": 40}}
    last = [f"{e['service']}:{e['operation']}" if e.get("kind") == "aws" else f"k8s:{e['verb']}:{e['resource']}"
            for e in world.ledger.writes(mark)][-1]
    assert last == "sagemaker:UpdateCluster", "the chain first, TieredStorageConfig last"
    assert world.describe()["TieredStorageConfig"] == update["TieredStorageConfig"]

    iam = world.product.client("iam")
    issuer = world.product.client("eks").describe_cluster(name=NAME)["cluster"]["identity"]["oidc"]["issuer"]
    host = issuer.removeprefix("https://")
    role = iam.get_role(RoleName=ROLE)["Role"]
    statement = role["AssumeRolePolicyDocument"]["Statement"]
    assert statement == [{"Effect": "Allow", "Principal": {"Federated": f"arn:aws:iam::123456789012:oidc-provider/"
                                                                          f"{host}"},
                          "Action": "sts:AssumeRoleWithWebIdentity", "Condition": {"StringEquals": {
                              f"{host}:sub": f"system:serviceaccount:{DEFAULT_NAMESPACE}:{SERVICE_ACCOUNT}",
                              f"{host}:aud": "sts.amazonaws.com"}}}]
    policy_arn = f"arn:aws:iam::123456789012:policy/{ROLE}"
    assert [p["PolicyArn"] for p in iam.list_attached_role_policies(RoleName=ROLE)["AttachedPolicies"]] == [policy_arn]
    version = iam.get_policy(PolicyArn=policy_arn)["Policy"]["DefaultVersionId"]
    document = iam.get_policy_version(PolicyArn=policy_arn, VersionId=version)["PolicyVersion"]["Document"]
    document = json.loads(document) if isinstance(document, str) else document
    assert sorted(r for st in document["Statement"] for r in st["Resource"]) == [
        f"arn:aws:s3:::{BUCKET}", f"arn:aws:s3:::{BUCKET}/*"]
    core = k8s.CoreV1Api(world.product.services.kube.api_client(NAME))
    sa = core.read_namespaced_service_account(SERVICE_ACCOUNT, DEFAULT_NAMESPACE)
    assert sa.metadata.annotations[ROLE_ANNOTATION] == role["Arn"]

    mark = world.ledger.mark()
    again = feature.observe(target)
    assert again.settled and feature.diff(again) == []
    world.ledger.assert_no_writes(since=mark)

    mark = world.ledger.mark()
    remove(feature, target)
    assert _writes(world, mark) == Counter({
        "sagemaker:UpdateCluster": 1, "k8s:delete:serviceaccounts": 1, "iam:DetachRolePolicy": 1,
        "iam:DeleteRole": 1, "iam:DeletePolicy": 1, "k8s:delete:namespaces": 1})
    assert world.ledger.once("sagemaker", "UpdateCluster", since=mark)["request"] == {
        "ClusterName": NAME, "NodeRecovery": "Automatic", "TieredStorageConfig": {"Mode": "Disable"}}
    first = world.ledger.writes(mark)[0]
    assert (first.get("service"), first.get("operation")) == ("sagemaker", "UpdateCluster"), "Disable first"
    assert world.describe()["TieredStorageConfig"]["Mode"] == "Disable"
    with pytest.raises(iam.exceptions.NoSuchEntityException):
        iam.get_role(RoleName=ROLE)
    assert not core.list_namespace(field_selector=f"metadata.name={DEFAULT_NAMESPACE}").items, \
        "the namespace we made, holding nothing else, is gone"
    assert not core.list_service_account_for_all_namespaces(field_selector=f"metadata.name={SERVICE_ACCOUNT}").items
    mark = world.ledger.mark()
    assert feature.leftover(target).gone
    world.ledger.assert_no_writes(since=mark)


def test_moving_the_namespace_rewrites_the_trust_and_moves_the_service_account(world: ScaleWorld) -> None:
    target = world.target()
    settle(TieredCheckpointing(), target)
    moved = TieredCheckpointing().configured(TieredSettings(namespace="hyperpod-team-b"))
    observed = moved.observe(target)
    assert set(moved.diff(observed)) == {"namespace", "trust", "service-account"}
    assert observed.settings["namespace"] == DEFAULT_NAMESPACE, "the actual settings, not the wanted ones"
    mark = world.ledger.mark()
    settle(moved, target)
    assert _writes(world, mark) == Counter({
        "k8s:create:namespaces": 1, "iam:UpdateAssumeRolePolicy": 1, "k8s:delete:serviceaccounts": 1,
        "k8s:create:serviceaccounts": 1})
    sub = next(iter(world.product.client("iam").get_role(RoleName=ROLE)["Role"]["AssumeRolePolicyDocument"]
                    ["Statement"][0]["Condition"]["StringEquals"].items()))
    assert sub[1] == f"system:serviceaccount:hyperpod-team-b:{SERVICE_ACCOUNT}"
    remove(moved, target)
    assert moved.leftover(target).gone


def test_a_cluster_without_an_oidc_provider_is_refused_with_how_to_add_it(world: ScaleWorld) -> None:
    iam = world.product.client("iam")
    issuer = world.product.client("eks").describe_cluster(name=NAME)["cluster"]["identity"]["oidc"]["issuer"]
    arn = f"arn:aws:iam::123456789012:oidc-provider/{issuer.removeprefix('https://')}"
    iam.delete_open_id_connect_provider(OpenIDConnectProviderArn=arn)
    try:
        feature = TieredCheckpointing()
        mark = world.ledger.mark()
        observed = feature.observe(world.target())
        assert observed.failed is not None and "no IAM OIDC provider" in observed.failed
        assert "CreateOpenIDConnectProvider" in observed.failed and not observed.settled
        with pytest.raises(Permanent, match="no IAM OIDC provider"):
            feature.apply(world.target(), observed)
        world.ledger.assert_no_writes(since=mark)
    finally:
        iam.create_open_id_connect_provider(Url=issuer, ClientIDList=["sts.amazonaws.com"], Tags=[])


def test_a_role_of_our_name_that_is_not_ours_is_refused_and_left_alone(world: ScaleWorld) -> None:
    iam = world.product.client("iam")
    iam.create_role(RoleName=ROLE, AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": []}))
    try:
        feature = TieredCheckpointing()
        observed = feature.observe(world.target())  # a mere read: reported, never raised
        assert observed.failed is not None and f"IAM role {ROLE} exists and is not tiers's" in observed.failed
        assert not observed.settled
        mark = world.ledger.mark()
        with pytest.raises(Permanent, match="not tiers's"):
            feature.apply(world.target(), observed)
        world.ledger.assert_no_writes(since=mark)
        assert f"role:{ROLE}" not in feature.leftover(world.target()).to_delete
    finally:
        iam.delete_role(RoleName=ROLE)


def test_a_policy_of_our_name_that_is_not_ours_is_reported_not_raised(world: ScaleWorld) -> None:
    iam = world.product.client("iam")
    arn = iam.create_policy(PolicyName=ROLE, PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "*"}]}))["Policy"]["Arn"]
    try:
        feature = TieredCheckpointing()
        observed = feature.observe(world.target())
        assert observed.failed is not None and f"IAM policy {ROLE} exists and is not tiers's" in observed.failed
        assert f"policy:{ROLE}" not in feature.leftover(world.target()).to_delete
    finally:
        iam.delete_policy(PolicyArn=arn)


def test_no_hyperpod_cluster_is_reported_not_raised(world: ScaleWorld) -> None:
    feature = TieredCheckpointing()
    for hyperpod in ("", "no-such-cluster"):
        target = dataclasses.replace(world.target(), hyperpod_cluster=hyperpod)
        observed = feature.observe(target)
        assert observed.failed is not None and not observed.settled and not observed.foreign
        assert ("has no HyperPod cluster" if not hyperpod else "does not exist") in observed.failed
        assert feature.leftover(target).to_delete == []


def test_a_stop_half_way_through_enabling_leaves_the_feature_ours_and_resumable(world: ScaleWorld) -> None:
    """A fault after the policy and before the role: HyperPod's TieredStorageConfig is not sent yet, the next
    round sees our tagged policy (not a foreign feature) and finishes the chain, the UpdateCluster last."""
    feature = TieredCheckpointing()
    target = world.target()
    fault = world.product.live.post("/api/v1/sandbox/faults", {
        "kind": "access_denied", "count": 1, "target": {"service": "iam", "action": "CreateRole"}})
    assert fault.status_code == 201, fault.text
    mark = world.ledger.mark()
    with pytest.raises(Exception, match="CreateRole"):
        feature.apply(target, feature.observe(target))
    assert "sagemaker:UpdateCluster" not in _writes(world, mark)
    assert world.describe().get("TieredStorageConfig", {}).get("Mode") != "Enable"
    half = feature.observe(target)
    assert not half.foreign and half.failed is None and {"role", "tiered-storage"} <= set(half.missing)
    assert "policy" not in half.missing

    world.product.client("sagemaker").update_cluster(  # HyperPod enabled with only our policy to show for it
        ClusterName=NAME, NodeRecovery="Automatic", TieredStorageConfig={"Mode": "Enable"})
    assert not feature.observe(target).foreign, "our tagged policy is proof enough"
    assert settle(feature, target).healthy
    remove(feature, target)
    assert feature.leftover(target).gone


def test_disable_keeps_our_namespace_while_it_holds_something_of_someone_else(world: ScaleWorld) -> None:
    feature = TieredCheckpointing()
    target = world.target()
    settle(feature, target)
    core = k8s.CoreV1Api(world.product.services.kube.api_client(NAME))
    core.create_namespaced_config_map(DEFAULT_NAMESPACE, k8s.V1ConfigMap(
        metadata=k8s.V1ObjectMeta(name="job-config"), data={"epochs": "3"}))
    remove(feature, target)
    assert core.read_namespaced_config_map("job-config", DEFAULT_NAMESPACE).data == {"epochs": "3"}
    assert not core.list_service_account_for_all_namespaces(field_selector=f"metadata.name={SERVICE_ACCOUNT}").items
    core.delete_namespace(DEFAULT_NAMESPACE)
    wait_until(lambda: not core.list_namespace(field_selector=f"metadata.name={DEFAULT_NAMESPACE}").items, 30,
               "namespace gone")


def test_the_cluster_delete_iam_stage_removes_the_role_and_the_tagged_policy(world: ScaleWorld) -> None:
    """Deleting the cluster with the feature on: its iam stage removes our role and our tagged policy too (the
    service account and namespace go with the EKS cluster); an untagged policy of a cluster-derived name stays."""
    settle(TieredCheckpointing(), world.target())
    iam = world.product.client("iam")
    theirs = iam.create_policy(PolicyName=f"{NAME}-theirs", PolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "*"}]}))
    delete = ClusterDeletePlan(name=NAME, region="us-west-2", account="123456789012", eks_cluster=NAME,
                               bucket=BUCKET, requested_by="tester")
    view = run_stages(world.product.services, [IamTeardown(world.product.deps())], delete)
    assert view.status == "succeeded", view.error
    policy_arn = f"arn:aws:iam::123456789012:policy/{ROLE}"
    assert view.stages[0].result["deleted_policies"] == [policy_arn]
    with pytest.raises(iam.exceptions.NoSuchEntityException):
        iam.get_role(RoleName=ROLE)
    with pytest.raises(iam.exceptions.NoSuchEntityException):
        iam.get_policy(PolicyArn=policy_arn)
    assert iam.get_policy(PolicyArn=theirs["Policy"]["Arn"])["Policy"]["PolicyName"] == f"{NAME}-theirs"


def test_disable_waits_while_the_cluster_takes_no_update(world: ScaleWorld) -> None:
    """A HyperPod cluster that ended Failed with tiered storage on: disabling reports it as going (the cluster
    takes no UpdateCluster) and writes nothing, instead of a refused UpdateCluster."""
    fault = world.product.live.post("/api/v1/sandbox/faults", {
        "kind": "insufficient_capacity", "target": {"instance_type": "ml.c5.2xlarge"}})
    assert fault.status_code == 201, fault.text
    sm = world.product.client("sagemaker")
    broken = f"{NAME}-broken"
    eks_arn = world.product.client("eks").describe_cluster(name=NAME)["cluster"]["arn"]
    sm.create_cluster(ClusterName=broken, Orchestrator={"Eks": {"ClusterArn": eks_arn}}, NodeRecovery="Automatic",
                      InstanceGroups=[world.group("w", 1, instance_type="ml.c5.2xlarge")],
                      VpcConfig={"SecurityGroupIds": [world.security_group], "Subnets": [world.subnet]},
                      TieredStorageConfig={"Mode": "Enable"})
    try:
        wait_until(lambda: sm.describe_cluster(ClusterName=broken)["ClusterStatus"] == "Failed", 120,
                   "the cluster failed")
        target = dataclasses.replace(world.target(), hyperpod_cluster=broken)
        feature = TieredCheckpointing()
        assert "is Failed" in (feature.blocked(target) or "")
        left = feature.leftover(target)
        assert "tiered-storage" in left.going and "tiered-storage" not in left.to_delete
        mark = world.ledger.mark()
        feature.delete(target, left)
        world.ledger.assert_no_writes(since=mark)
        assert sm.describe_cluster(ClusterName=broken)["TieredStorageConfig"]["Mode"] == "Enable"
    finally:
        sm.delete_cluster(ClusterName=broken)
        wait_until(lambda: broken not in [c["ClusterName"] for c in sm.list_clusters()["ClusterSummaries"]], 120,
                   "the failed cluster deleted")
