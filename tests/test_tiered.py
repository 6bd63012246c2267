"""Tiered checkpointing against the sandbox: enabling sends UpdateCluster with only TieredStorageConfig and
builds exactly the identity chain (policy on the shared bucket, role trusting the cluster's OIDC provider for
exactly the service account, the attachment, the annotated service account), a re-apply writes nothing, a
settings change rewrites only what changed, and disabling removes exactly that chain, resource by resource
(ledger + the Kubernetes emulator through the official client)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s
from pydantic import ValidationError

from services.components.tiered import (
    DEFAULT_NAMESPACE,
    PREREQUISITES,
    ROLE_ANNOTATION,
    SERVICE_ACCOUNT,
    TieredCheckpointing,
    TieredSettings,
)
from services.errors import Permanent
from tests.scale_support import BUCKET, ScaleWorld, remove, scale_world, settle

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
    assert update == {"ClusterName": NAME,
                      "TieredStorageConfig": {"Mode": "Enable", "InstanceMemoryAllocationPercentage": 40}}
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
        "iam:DeleteRole": 1, "iam:DeletePolicy": 1})
    assert world.ledger.once("sagemaker", "UpdateCluster", since=mark)["request"]["TieredStorageConfig"] == {
        "Mode": "Disable"}
    assert world.describe()["TieredStorageConfig"]["Mode"] == "Disable"
    with pytest.raises(iam.exceptions.NoSuchEntityException):
        iam.get_role(RoleName=ROLE)
    assert core.read_namespace(DEFAULT_NAMESPACE).metadata.name == DEFAULT_NAMESPACE, "the jobs' namespace stays"
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
        with pytest.raises(Exception, match="not tiers's"):
            feature.observe(world.target())
        assert f"role:{ROLE}" not in feature.leftover(world.target()).to_delete
    finally:
        iam.delete_role(RoleName=ROLE)
