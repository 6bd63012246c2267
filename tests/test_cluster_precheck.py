"""The precheck of ``cluster.create`` against the sandbox: every refusal comes before any operation row and
with zero writes in the call ledger, and names the valid alternatives; a dry run shows the derived names and
computed values without making anything."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from services.clusters.create import check_name
from services.clusters.create_models import ClusterCreate, ClusterDelete
from services.errors import Conflict, Invalid
from services.operations import OperationQuery
from tests.conftest import OPERATOR
from tests.create_support import SandboxProduct, sandbox_product
from tests.ledger import CallLedger

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxProduct]:
    with sandbox_product(tmp_path_factory.mktemp("precheck")) as product:
        yield product


def ask(**fields: object) -> ClusterCreate:
    base: dict[str, object] = {"name": "pre", "zone": "us-west-2a", "instance_type": "ml.g5.8xlarge", "count": 2}
    return ClusterCreate.model_validate({**base, **fields})


def refused(world: SandboxProduct, request: ClusterCreate, error: type[Exception]) -> Exception:
    ledger = CallLedger(world.live)
    mark = ledger.mark()
    with pytest.raises(error) as caught:
        world.services.clusters.create_cluster(OPERATOR, request)
    ledger.assert_no_writes(since=mark)
    assert world.services.engine.list(OperationQuery(kind="cluster.create")) == [], "no operation row"
    return caught.value


def test_a_zone_that_does_not_offer_the_type_is_refused_with_the_zones_that_do(world: SandboxProduct) -> None:
    offers = world.client("ec2").describe_instance_type_offerings(
        LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": ["g5.8xlarge"]}])
    offering = sorted(o["Location"] for o in offers["InstanceTypeOfferings"])
    assert "us-west-2d" not in offering, "moto's offerings: g5 in us-west-2a-c only"
    error = refused(world, ask(zone="us-west-2d"), Invalid)
    assert "us-west-2d does not offer ml.g5.8xlarge" in str(error)
    assert error.details["zones"] == offering  # type: ignore[attr-defined]
    assert "ml.trn1n.32xlarge" in error.details["instance_types"]  # type: ignore[attr-defined]


def test_a_count_above_the_quota_is_refused_with_what_is_free(world: SandboxProduct) -> None:
    error = refused(world, ask(count=5), Invalid)  # ml.g5.8xlarge: 4 for cluster usage in a new account
    assert "exceeds the quota 'ml.g5.8xlarge for cluster usage' of 4" in str(error)
    assert error.details["free"] == 4  # type: ignore[attr-defined]


def test_an_unknown_zone_lists_the_regions_zones(world: SandboxProduct) -> None:
    error = refused(world, ask(zone="us-west-2z"), Invalid)
    assert "us-west-2a" in str(error) and "us-west-2z" in str(error)


def test_a_name_a_resource_would_reject_is_refused_with_the_longest_that_fits(world: SandboxProduct) -> None:
    long_name = "a" * 50  # fits EKS (100) and HyperPod (63), not the IAM role '<name>-hyperpod-exec-role' (64)
    error = refused(world, ask(name=long_name), Invalid)
    assert "IAM role name" in str(error) and "at most 64" in str(error)
    assert error.details["max_name_length"] == 45  # type: ignore[attr-defined]
    assert check_name("a" * 45).execution_role == "a" * 45 + "-hyperpod-exec-role"


def test_a_name_of_an_existing_eks_cluster_is_refused(world: SandboxProduct) -> None:
    from tests.sandbox_support import EKS_TRUST

    ec2, iam, eks = world.client("ec2"), world.client("iam"), world.client("eks")
    vpc = ec2.create_vpc(CidrBlock="10.30.0.0/16")["Vpc"]["VpcId"]
    subnets = [ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.30.{i}.0/24", AvailabilityZone=f"us-west-2{z}")
               ["Subnet"]["SubnetId"] for i, z in ((1, "a"), (2, "b"))]
    role = iam.create_role(RoleName="taken-role", AssumeRolePolicyDocument=EKS_TRUST)["Role"]["Arn"]
    eks.create_cluster(name="taken", roleArn=role, resourcesVpcConfig={"subnetIds": subnets})
    error = refused(world, ask(name="taken"), Conflict)
    assert "an EKS cluster named 'taken' already (foreign)" in str(error)
    assert "import it" in str(error)


def test_contradicting_choices_and_reserved_tags_are_refused_without_reading_aws(world: SandboxProduct) -> None:
    ledger = CallLedger(world.live)
    mark = ledger.mark()
    for request, words in ((ask(capacity_type="training-plan"), "needs training_plan_arn"),
                           (ask(tags={"aws:owner": "x"}), "reserved"),
                           (ask(subnet_ids=["subnet-12345678"]), "give its vpc_id too"),
                           (ask(name="options"), "names a route")):
        with pytest.raises(Invalid, match=words):
            world.services.clusters.plan_cluster(OPERATOR, request)
    assert ledger.calls(since=mark) == [], "refused before any AWS read"


def test_the_dry_run_shows_derived_names_and_computed_values(world: SandboxProduct, tmp_path: Path) -> None:
    ledger = CallLedger(world.live)
    mark = ledger.mark()
    view = world.services.clusters.plan_cluster(OPERATOR, ask(name="dry", deep_health_checks=["InstanceStress"]))
    ledger.assert_no_writes(since=mark)
    plan = view.plan
    assert plan.names.execution_role == "dry-hyperpod-exec-role" and plan.names.eks_cluster == "dry"
    assert plan.zone == "us-west-2a" and plan.zone_id and plan.second_zone != "us-west-2a"
    assert plan.kubernetes_version == "1.33"  # EKS's default (DescribeClusterVersions)
    assert plan.control_plane_principal == "arn:aws:iam::123456789012:user/moto"
    assert plan.bucket == "instantstart-shared-123456789012-us-west-2"
    assert plan.tags["instantstart:cluster"] == "dry" and plan.accelerator == "NVIDIA A10G" and plan.efa
    assert view.stages == [s.name for s in world.services.clusters._create_stages]
    assert world.services.engine.list(OperationQuery(kind="cluster.create")) == []


def test_an_imported_cluster_is_never_deleted(world: SandboxProduct) -> None:
    from services.clusters.models import ClusterRecord, Ownership
    from tests.conftest import ADMIN

    registry = world.services.clusters.registry
    registry.add(ClusterRecord(name="theirs", region="us-west-2", eks_name="theirs",
                               eks_arn="arn:aws:eks:us-west-2:123456789012:cluster/theirs",
                               ownership=Ownership.IMPORTED, created_at="", created_by="tester"), 0.0)
    ledger = CallLedger(world.live)
    mark = ledger.mark()
    with pytest.raises(Conflict, match="imported: this control plane never deletes it"):
        world.services.clusters.delete_cluster(ADMIN, "theirs")
    with pytest.raises(Invalid, match="is not the cluster's name"):
        world.services.clusters.delete_cluster(ADMIN, "theirs", ClusterDelete(confirm="other"))
    ledger.assert_no_writes(since=mark)
    assert world.services.engine.list(OperationQuery(kind="cluster.delete")) == []
