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
    before = len(world.services.engine.list(OperationQuery(kind="cluster.create")))
    with pytest.raises(error) as caught:
        world.services.clusters.create_cluster(OPERATOR, request)
    ledger.assert_no_writes(since=mark)
    assert len(world.services.engine.list(OperationQuery(kind="cluster.create"))) == before, "no operation row"
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


def test_what_a_create_would_reuse_or_name_is_read_before_any_write(world: SandboxProduct) -> None:
    sts_session = "arn:aws:sts::123456789012:assumed-role/Admin/alice"
    error = refused(world, ask(admin_principals=[sts_session]), Invalid)
    assert "arn:aws:iam::123456789012:role/Admin" in str(error), "the IAM principal to give instead"
    error = refused(world, ask(kubernetes_version="1.19"), Invalid)
    assert "1.33" in error.details["kubernetes_versions"]  # type: ignore[attr-defined]
    ec2 = world.client("ec2")
    vpc = ec2.create_vpc(CidrBlock="10.40.0.0/16")["Vpc"]["VpcId"]
    one_zone = [ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.40.{i}.0/24", AvailabilityZone="us-west-2a")
                ["Subnet"]["SubnetId"] for i in (1, 2)]
    error = refused(world, ask(vpc_id=vpc, subnet_ids=one_zone), Invalid)
    assert "two Availability Zones" in str(error)
    world.client("iam").create_role(RoleName="squat-hyperpod-exec-role", AssumeRolePolicyDocument="{}")
    error = refused(world, ask(name="squat"), Conflict)
    assert "squat-hyperpod-exec-role exists and is not this cluster's" in str(error)
    with pytest.raises(ValueError, match="multiple of 2400"):
        ask(fsx={"mode": "new", "storage_capacity_gib": 2000})
    error = refused(world, ask(fsx={"mode": "existing", "file_system_id": "fs-0123456789abcdef0"}), Invalid)
    assert "give that vpc_id" in str(error)


def test_a_replayed_key_with_other_choices_is_a_conflict(world: SandboxProduct) -> None:
    clusters = world.services.clusters
    first, created = clusters.create_cluster(OPERATOR, ask(name="replay"), idempotency_key="k-replay")
    assert created
    clusters_ops = world.services.operations
    again, created = clusters.create_cluster(OPERATOR, ask(name="replay"), idempotency_key="k-replay")
    assert again.id == first.id and not created
    with pytest.raises(Conflict, match="Idempotency-Key was already used"):
        clusters.create_cluster(OPERATOR, ask(name="replay", count=3), idempotency_key="k-replay")
    clusters_ops.cancel_operation(OPERATOR, first.id)
