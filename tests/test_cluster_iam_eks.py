"""The ``iam`` and ``eks`` stages of ``cluster.create`` and their teardowns, run through the real engine against a
sandbox server: what AWS saw (the call ledger), what exists afterwards, and that a rerun changes nothing."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from kubernetes import client as k8s

from services.clusters.create_base import ClusterDeletePlan, cluster_tags, tag_list
from services.clusters.create_models import NetworkResult
from services.clusters.eks_stage import EksStage, EksTeardown, admin_policy_arn
from services.clusters.iam_stage import INLINE_POLICY, IamStage, IamTeardown, execution_policy
from services.clusters.models import Ownership
from services.stages import Observed, StageContext, Wait
from tests.conftest import ADMIN
from tests.create_support import Given, SandboxProduct, make_plan, run_stages, sandbox_product
from tests.ledger import CallLedger
from tests.support import wait_until

pytestmark = pytest.mark.slow

ADMIN_POLICY = admin_policy_arn("us-west-2")


@pytest.fixture(scope="module")
def product(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxProduct]:
    # 1000x: EKS's 10 simulated minutes take 0.6 s, and the engine's scaled deadline (1 h) stays 3.6 s
    with sandbox_product(Path(tmp_path_factory.mktemp("iam-eks")), speed=1000.0) as made:
        yield made


@pytest.fixture(scope="module")
def ledger(product: SandboxProduct) -> CallLedger:
    return CallLedger(product.live)


def network(product: SandboxProduct, name: str) -> NetworkResult:
    """What the network stage would hand on: a VPC, private subnets in two zones and a security group, made
    here with boto3 as a user would."""
    ec2 = product.client("ec2")
    vpc = ec2.create_vpc(CidrBlock="10.192.0.0/16")["Vpc"]["VpcId"]
    subnets = [ec2.create_subnet(VpcId=vpc, CidrBlock=cidr, AvailabilityZone=zone)["Subnet"]["SubnetId"]
               for cidr, zone in (("10.192.0.0/20", "us-west-2a"), ("10.192.16.0/20", "us-west-2b"))]
    group = ec2.create_security_group(GroupName=f"{name}-efa", Description="efa", VpcId=vpc)["GroupId"]
    return NetworkResult(vpc_id=vpc, public_subnets=[], private_subnets=subnets, compute_subnet=subnets[0],
                         security_group=group)


def admin_role(product: SandboxProduct, name: str) -> str:
    trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                     "Principal": {"AWS": "arn:aws:iam::123456789012:root"}}]}
    return str(product.client("iam").create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(trust))
               ["Role"]["Arn"])


def create(product: SandboxProduct, name: str, **overrides: Any) -> tuple[Any, Any]:
    plan = make_plan(name, **overrides)
    deps = product.deps()
    given = Given("network", network(product, name).model_dump())
    view = run_stages(product.services, [given, IamStage(deps), EksStage(deps)], plan)
    return plan, view


def failure(view: Any) -> str:
    return json.dumps(view.error)


@pytest.fixture(scope="module")
def alpha(product: SandboxProduct, ledger: CallLedger) -> dict[str, Any]:
    """One cluster made by iam + eks, with an extra admin principal; the ledger mark from before it."""
    admin = admin_role(product, "alpha-ops-admin")
    mark = ledger.mark()
    plan, view = create(product, "alpha", admin_principals=[admin], tags={**cluster_tags("alpha"), "team": "ml"})
    assert view.status == "succeeded", failure(view)
    return {"plan": plan, "view": view, "mark": mark, "admin": admin}


def test_roles_trust_their_services_and_the_execution_policy_is_scoped(product: SandboxProduct,
                                                                       alpha: dict[str, Any]) -> None:
    plan = alpha["plan"]
    iam = product.client("iam")
    eks_role = iam.get_role(RoleName=plan.names.eks_role)["Role"]
    exec_role = iam.get_role(RoleName=plan.names.execution_role)["Role"]
    assert eks_role["AssumeRolePolicyDocument"]["Statement"][0]["Principal"] == {"Service": "eks.amazonaws.com"}
    assert exec_role["AssumeRolePolicyDocument"]["Statement"][0]["Principal"] == {
        "Service": "sagemaker.amazonaws.com"}
    assert [p["PolicyName"] for p in iam.list_attached_role_policies(RoleName=plan.names.eks_role)
            ["AttachedPolicies"]] == ["AmazonEKSClusterPolicy"]
    assert [p["PolicyName"] for p in iam.list_attached_role_policies(RoleName=plan.names.execution_role)
            ["AttachedPolicies"]] == ["AmazonSageMakerClusterInstanceRolePolicy"]
    assert iam.list_role_policies(RoleName=plan.names.eks_role)["PolicyNames"] == []
    document = iam.get_role_policy(RoleName=plan.names.execution_role, PolicyName=INLINE_POLICY)["PolicyDocument"]
    by_sid = {s["Sid"]: s for s in document["Statement"]}
    assert by_sid["PodIdentity"]["Resource"] == "arn:aws:eks:us-west-2:123456789012:cluster/alpha"
    assert "ec2:CreateNetworkInterface" in by_sid["NodeNetworkInterfaces"]["Action"]
    assert "ecr:BatchGetImage" in by_sid["PullImages"]["Action"]
    s3 = [s for s in document["Statement"] if any(a.startswith("s3:") for a in _list(s["Action"]))]
    resources = sorted(r for s in s3 for r in _list(s["Resource"]))
    assert resources == [f"arn:aws:s3:::{plan.bucket}", f"arn:aws:s3:::{plan.bucket}/*"]
    assert not any(a == "s3:*" for s in s3 for a in _list(s["Action"]))
    for role in (eks_role, exec_role):
        tags = {t["Key"]: t["Value"] for t in role["Tags"]}
        assert tags == {"instantstart:managed-by": "instantstart", "instantstart:cluster": "alpha", "team": "ml"}
    product.client("s3").head_bucket(Bucket=plan.bucket)  # the shared bucket was made


def _query_tags(request: dict[str, str]) -> list[dict[str, str]]:
    """The ``Tags`` of a query-protocol call as the ledger keeps it (flat ``Tags.member.N.Key`` fields)."""
    count = sum(1 for k in request if k.startswith("Tags.member.") and k.endswith(".Key"))
    return [{"Key": request[f"Tags.member.{n}.Key"], "Value": request[f"Tags.member.{n}.Value"]}
            for n in range(1, count + 1)]


def _list(value: Any) -> list[str]:
    return value if isinstance(value, list) else [value]


def test_tags_are_set_in_the_create_calls(ledger: CallLedger, alpha: dict[str, Any]) -> None:
    mark = alpha["mark"]
    expected = tag_list(alpha["plan"].tags)
    created = ledger.succeeded("iam", "CreateRole", since=mark)
    assert sorted(c["request"]["RoleName"] for c in created) == ["alpha-eks-cluster-role",
                                                                  "alpha-hyperpod-exec-role"]
    assert all(_query_tags(c["request"]) == expected for c in created)
    cluster = ledger.once("eks", "CreateCluster", since=mark)["request"]
    assert cluster["tags"] == alpha["plan"].tags
    provider = ledger.once("iam", "CreateOpenIDConnectProvider", since=mark)["request"]
    assert _query_tags(provider) == expected
    for service, operation in (("iam", "TagRole"), ("eks", "TagResource"), ("iam", "TagOpenIDConnectProvider")):
        assert ledger.succeeded(service, operation, since=mark) == []


def test_eks_is_active_with_api_auth_and_the_planned_request(product: SandboxProduct, ledger: CallLedger,
                                                             alpha: dict[str, Any]) -> None:
    plan, view = alpha["plan"], alpha["view"]
    request = ledger.once("eks", "CreateCluster", since=alpha["mark"])["request"]
    assert request["version"] == "1.32"
    assert request["accessConfig"] == {"authenticationMode": "API", "bootstrapClusterCreatorAdminPermissions": True}
    assert request["roleArn"] == product.client("iam").get_role(RoleName=plan.names.eks_role)["Role"]["Arn"]
    network = view.stages[0].result
    assert request["resourcesVpcConfig"]["subnetIds"] == network["private_subnets"]
    assert request["resourcesVpcConfig"]["securityGroupIds"] == [network["security_group"]]
    assert request["resourcesVpcConfig"]["publicAccessCidrs"] == ["0.0.0.0/0"]
    assert request["clientRequestToken"].startswith("instantstart-")
    cluster = product.client("eks").describe_cluster(name="alpha")["cluster"]
    assert cluster["status"] == "ACTIVE"
    assert cluster["accessConfig"]["authenticationMode"] == "API"
    result = view.stages[2].result
    assert result["eks_arn"] == cluster["arn"] and result["endpoint"] == cluster["endpoint"]
    assert result["oidc_issuer"] == cluster["identity"]["oidc"]["issuer"]
    assert result["cluster_security_group"] == cluster["resourcesVpcConfig"]["clusterSecurityGroupId"]
    assert view.stages[1].result["eks_role_arn"] == request["roleArn"]


def test_access_entries_oidc_provider_registry_and_kube_client(product: SandboxProduct, ledger: CallLedger,
                                                               alpha: dict[str, Any]) -> None:
    plan, view = alpha["plan"], alpha["view"]
    eks = product.client("eks")
    entries = eks.list_access_entries(clusterName="alpha")["accessEntries"]
    assert plan.control_plane_principal in entries and alpha["admin"] in entries
    # the control plane is the creator: EKS's own entry covers it, so only the admin's entry was made
    assert [c["request"]["principalArn"] for c in ledger.succeeded("eks", "CreateAccessEntry",
                                                                   since=alpha["mark"])] == [alpha["admin"]]
    policies = eks.list_associated_access_policies(clusterName="alpha", principalArn=alpha["admin"])
    assert [(p["policyArn"], p["accessScope"]["type"]) for p in policies["associatedAccessPolicies"]] == [
        (ADMIN_POLICY, "cluster")]
    provider_arn = view.stages[2].result["oidc_provider_arn"]
    provider = product.client("iam").get_open_id_connect_provider(OpenIDConnectProviderArn=provider_arn)
    assert provider["ClientIDList"] == ["sts.amazonaws.com"]
    assert {t["Key"]: t["Value"] for t in provider["Tags"]}["instantstart:cluster"] == "alpha"
    record = product.services.clusters.registry.get("alpha")
    assert record.ownership is Ownership.MANAGED and record.eks_arn == view.stages[2].result["eks_arn"]
    assert (record.hyperpod_name, record.hyperpod_arn, record.created_by) == ("alpha", None, "tester")
    nodes = k8s.CoreV1Api(product.deps().kube.api_client("alpha")).list_node()
    assert nodes.items == []  # reachable with an EKS token; HyperPod has not added nodes yet


def test_a_rerun_observes_and_writes_nothing(product: SandboxProduct, ledger: CallLedger,
                                             alpha: dict[str, Any]) -> None:
    plan, first = alpha["plan"], alpha["view"]
    mark = ledger.mark()
    deps = product.deps()
    again = run_stages(product.services, [Given("network", first.stages[0].result or {}), IamStage(deps),
                                          EksStage(deps)], plan)
    assert again.status == "succeeded", failure(again)
    ledger.assert_no_writes(since=mark)
    assert [s.message for s in again.stages[1:]] == ["already in the desired state"] * 2
    assert again.stages[2].result == first.stages[2].result
    assert len(ledger.succeeded("eks", "CreateCluster", since=alpha["mark"])) == 1
    assert len(ledger.succeeded("iam", "CreateRole", since=alpha["mark"])) == 2


def test_a_rerun_makes_only_what_is_missing(product: SandboxProduct, ledger: CallLedger,
                                            alpha: dict[str, Any]) -> None:
    """What a crash between two calls leaves (an inline policy not yet put, an access entry without its policy)
    is observed and made, and nothing else is written."""
    plan, first = alpha["plan"], alpha["view"]
    product.client("iam").delete_role_policy(RoleName=plan.names.execution_role, PolicyName=INLINE_POLICY)
    product.client("eks").disassociate_access_policy(clusterName="alpha", principalArn=alpha["admin"],
                                                     policyArn=ADMIN_POLICY)
    mark = ledger.mark()
    deps = product.deps()
    again = run_stages(product.services, [Given("network", first.stages[0].result or {}), IamStage(deps),
                                          EksStage(deps)], plan)
    assert again.status == "succeeded", failure(again)
    assert sorted(f"{w['service']}:{w['operation']}" for w in ledger.writes(since=mark)) == [
        "eks:AssociateAccessPolicy", "iam:PutRolePolicy"]
    document = product.client("iam").get_role_policy(RoleName=plan.names.execution_role,
                                                      PolicyName=INLINE_POLICY)["PolicyDocument"]
    assert any(s["Sid"] == "SharedBucketObjects" for s in document["Statement"])
    associated = product.client("eks").list_associated_access_policies(clusterName="alpha",
                                                                       principalArn=alpha["admin"])
    assert [p["policyArn"] for p in associated["associatedAccessPolicies"]] == [ADMIN_POLICY]


def test_a_role_with_our_name_but_not_our_tags_is_refused(product: SandboxProduct, ledger: CallLedger) -> None:
    iam = product.client("iam")
    trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                     "Principal": {"Service": "eks.amazonaws.com"}}]}
    iam.create_role(RoleName="beta-eks-cluster-role", AssumeRolePolicyDocument=json.dumps(trust),
                    Tags=[{"Key": "owner", "Value": "someone-else"}])
    mark = ledger.mark()
    view = run_stages(product.services, [IamStage(product.deps())], make_plan("beta"))
    assert view.status == "failed"
    assert view.error is not None and view.error["code"] == "permanent"
    assert "beta-eks-cluster-role" in view.error["message"]
    ledger.assert_no_writes(since=mark)
    assert iam.list_attached_role_policies(RoleName="beta-eks-cluster-role")["AttachedPolicies"] == []
    assert iam.get_role(RoleName="beta-eks-cluster-role")["Role"]["Tags"] == [{"Key": "owner",
                                                                              "Value": "someone-else"}]


def test_an_existing_bucket_is_used_as_it_is(product: SandboxProduct, ledger: CallLedger) -> None:
    s3 = product.client("s3")
    s3.create_bucket(Bucket="team-shared-data", CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    s3.put_object(Bucket="team-shared-data", Key="keep.txt", Body=b"kept")
    mark = ledger.mark()
    view = run_stages(product.services, [IamStage(product.deps())], make_plan("delta", bucket="team-shared-data"))
    assert view.status == "succeeded", failure(view)
    assert view.stages[0].result == {**view.stages[0].result, "bucket": "team-shared-data"}
    assert ledger.succeeded("s3", "CreateBucket", since=mark) == []
    assert s3.get_object(Bucket="team-shared-data", Key="keep.txt")["Body"].read() == b"kept"


def test_teardown_removes_eks_provider_and_roles_and_keeps_the_bucket(product: SandboxProduct, ledger: CallLedger,
                                                                      alpha: dict[str, Any]) -> None:
    plan, view = create(product, "gamma")
    assert view.status == "succeeded", failure(view)
    provider_arn = view.stages[2].result["oidc_provider_arn"]
    foreign = admin_role(product, "gamma-not-ours")  # named like ours, untagged: never deleted
    deps = product.deps()
    delete = ClusterDeletePlan(name="gamma", region="us-west-2", account="123456789012", eks_cluster="gamma",
                               hyperpod_cluster="gamma", bucket=plan.bucket, requested_by="tester")
    mark = ledger.mark()
    gone = run_stages(product.services, [EksTeardown(deps), IamTeardown(deps)], delete)
    assert gone.status == "succeeded", failure(gone)
    eks, iam = product.client("eks"), product.client("iam")
    with pytest.raises(ClientError) as missing:
        eks.describe_cluster(name="gamma")
    assert missing.value.response["Error"]["Code"] == "ResourceNotFoundException"
    with pytest.raises(ClientError):
        iam.get_open_id_connect_provider(OpenIDConnectProviderArn=provider_arn)
    for role in (plan.names.eks_role, plan.names.execution_role):
        with pytest.raises(ClientError) as no_role:
            iam.get_role(RoleName=role)
        assert no_role.value.response["Error"]["Code"] == "NoSuchEntity"
    assert iam.get_role(RoleName="gamma-not-ours")["Role"]["Arn"] == foreign
    product.client("s3").head_bucket(Bucket=plan.bucket)
    assert ledger.succeeded("s3", "DeleteBucket", since=mark) == []
    assert ledger.once("eks", "DeleteCluster", since=mark)["target"] == "gamma"
    assert product.services.clusters.registry.find("gamma") is None
    assert "gamma" not in deps.kube.clusters()
    assert product.services.clusters.registry.find("alpha") is not None  # another cluster's row stays
    assert sorted(gone.stages[1].result["deleted_roles"]) == ["gamma-eks-cluster-role", "gamma-hyperpod-exec-role"]
    mark = ledger.mark()
    again = run_stages(product.services, [EksTeardown(deps), IamTeardown(deps)], delete)
    assert again.status == "succeeded", failure(again)
    ledger.assert_no_writes(since=mark)


def test_an_eks_cluster_of_that_name_that_is_not_ours_is_neither_adopted_nor_deleted(
        product: SandboxProduct, ledger: CallLedger, alpha: dict[str, Any]) -> None:
    """A create refused because the EKS name is taken still made its roles; the delete of that create leaves
    the other cluster alone, says so, and goes on to delete the roles it made."""
    made = network(product, "zeta")
    given = Given("network", made.model_dump())
    subnets = made.private_subnets
    role = product.client("iam").get_role(RoleName=alpha["plan"].names.eks_role)["Role"]["Arn"]
    eks = product.client("eks")
    eks.create_cluster(name="zeta", roleArn=role, resourcesVpcConfig={"subnetIds": subnets},
                       tags={"owner": "someone-else"})
    deps = product.deps()
    mark = ledger.mark()
    view = run_stages(product.services, [given, IamStage(deps), EksStage(deps)], make_plan("zeta"))
    assert view.status == "failed" and view.error is not None and view.error["code"] == "permanent"
    assert "EKS cluster named zeta" in view.error["message"]
    assert ledger.succeeded("eks", "CreateCluster", since=mark) == []
    delete = ClusterDeletePlan(name="zeta", region="us-west-2", account="123456789012", eks_cluster="zeta",
                               bucket=alpha["plan"].bucket, requested_by="tester")
    mark = ledger.mark()
    gone = run_stages(product.services, [EksTeardown(deps), IamTeardown(deps)], delete)
    assert gone.status == "succeeded", failure(gone)
    assert "not this cluster's" in gone.stages[0].message and "zeta" in gone.stages[0].message
    assert sorted(gone.stages[1].result["deleted_roles"]) == ["zeta-eks-cluster-role", "zeta-hyperpod-exec-role"]
    assert [w["operation"] for w in ledger.writes(since=mark) if w["service"] == "eks"] == []
    assert ledger.succeeded("iam", "DeleteRole", since=mark) != []
    assert eks.describe_cluster(name="zeta")["cluster"]["tags"] == {"owner": "someone-else"}


def test_the_iam_teardown_names_a_role_of_our_name_without_our_tags_and_leaves_it(
        product: SandboxProduct, ledger: CallLedger) -> None:
    iam = product.client("iam")
    trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                     "Principal": {"Service": "sagemaker.amazonaws.com"}}]}
    iam.create_role(RoleName="kappa-hyperpod-exec-role", AssumeRolePolicyDocument=json.dumps(trust),
                    Tags=[{"Key": "owner", "Value": "someone-else"}])
    delete = ClusterDeletePlan(name="kappa", region="us-west-2", account="123456789012", eks_cluster="kappa",
                               bucket="instantstart-shared-123456789012-us-west-2", requested_by="tester")
    mark = ledger.mark()
    view = run_stages(product.services, [IamTeardown(product.deps())], delete)
    assert view.status == "succeeded", failure(view)
    assert "kappa-hyperpod-exec-role" in view.stages[0].message and "left untouched" in view.stages[0].message
    ledger.assert_no_writes(since=mark)
    assert iam.get_role(RoleName="kappa-hyperpod-exec-role")["Role"]["Tags"] == [{"Key": "owner",
                                                                                  "Value": "someone-else"}]


def test_a_crash_after_create_role_still_waits_for_iam_to_propagate(product: SandboxProduct) -> None:
    """The engine saves ``ctx.data`` after observe and before act, and again after act: a crash in act (after
    CreateRole) resumes with what observe saved. That resumed observation must still owe the wait."""
    plan = make_plan("lambda")
    stage = IamStage(product.deps())

    def context(data: dict[str, Any]) -> StageContext[Any]:
        return StageContext(operation_id="op-crash", kind="test", target="test/crash", request=plan, data=data,
                            results={}, clock=product.services.clock, attempt=0)

    first = context({})
    assert stage.observe(first) is Observed.ABSENT
    saved_before_act = copy.deepcopy(first.data)
    stage.act(first)  # the roles exist now; the process dies before act's data is saved
    resumed = context(copy.deepcopy(saved_before_act))
    assert stage.observe(resumed) is Observed.IN_PROGRESS
    waited = stage.poll(resumed)
    assert isinstance(waited, Wait) and "propagate" in waited.message
    assert not isinstance(stage.poll(resumed), Wait)
    assert stage.observe(context({})) is Observed.DONE  # a later operation has nothing to wait for


def test_arns_follow_the_partition_of_the_region() -> None:
    assert admin_policy_arn("cn-north-1") == "arn:aws-cn:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"
    assert admin_policy_arn("us-gov-west-1").startswith("arn:aws-us-gov:eks::aws:")
    assert ADMIN_POLICY == "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"
    china = execution_policy(make_plan("mu", region="cn-northwest-1"))
    resources = [r for st in china["Statement"] for r in _list(st["Resource"]) if r != "*"]
    assert resources and all(r.startswith("arn:aws-cn:") for r in resources)


def test_a_failed_eks_cluster_is_deleted_and_created_again_on_retry(product: SandboxProduct, ledger: CallLedger,
                                                                    alpha: dict[str, Any]) -> None:
    injected = product.live.post("/api/v1/sandbox/faults", {"kind": "eks_create_failed", "count": 1,
                                                             "target": {"cluster": "theta"}})
    assert injected.status_code == 201, injected.text
    mark = ledger.mark()
    _, view = create(product, "theta")
    assert view.status == "failed" and view.error is not None and view.error["code"] == "permanent", view
    assert "FAILED" in view.error["message"] and "Ec2SubnetNotFound" in view.error["message"]
    assert "retry" in view.error["message"]
    eks = product.client("eks")
    assert eks.describe_cluster(name="theta")["cluster"]["status"] == "FAILED"
    engine = product.services.engine
    engine.retry(view.id, ADMIN)
    done = wait_until(lambda: (v := engine.get(view.id)).status in ("succeeded", "failed") and v, 180,
                      "the retried create terminal")
    assert done.status == "succeeded", failure(done)
    assert ledger.once("eks", "DeleteCluster", since=mark)["target"] == "theta"
    tokens = [c["request"]["clientRequestToken"] for c in ledger.succeeded("eks", "CreateCluster", since=mark)]
    assert len(tokens) == 2 and tokens[0] != tokens[1]
    cluster = eks.describe_cluster(name="theta")["cluster"]
    assert cluster["status"] == "ACTIVE"
    result = done.stages[2].result
    assert result["eks_arn"] == cluster["arn"] and "Ec2SubnetNotFound" in result["replaced_failure"]
    assert product.services.clusters.registry.get("theta").eks_arn == cluster["arn"]


def test_teardown_finds_the_provider_by_its_tags_when_the_cluster_went_first(product: SandboxProduct,
                                                                              ledger: CallLedger) -> None:
    plan, view = create(product, "epsilon")
    assert view.status == "succeeded", failure(view)
    provider_arn = view.stages[2].result["oidc_provider_arn"]
    eks = product.client("eks")
    eks.delete_cluster(name="epsilon")  # deleted outside this control plane, before its teardown

    def gone() -> bool:
        try:
            eks.describe_cluster(name="epsilon")
        except ClientError as exc:
            return bool(exc.response["Error"]["Code"] == "ResourceNotFoundException")
        return False

    wait_until(gone, 60, "epsilon deleted by EKS")
    delete = ClusterDeletePlan(name="epsilon", region="us-west-2", account="123456789012", eks_cluster="epsilon",
                               bucket=plan.bucket, requested_by="tester")
    mark = ledger.mark()
    done = run_stages(product.services, [EksTeardown(product.deps())], delete)
    assert done.status == "succeeded", failure(done)
    assert ledger.once("iam", "DeleteOpenIDConnectProvider", since=mark)["request"][
        "OpenIDConnectProviderArn"] == provider_arn
    assert ledger.succeeded("eks", "DeleteCluster", since=mark) == []
    assert product.services.clusters.registry.find("epsilon") is None
