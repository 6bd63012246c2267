"""Tiered checkpointing and managed Karpenter as managed features (the features noun over their components):
listed with their settings schema, and refused by the features precheck when the cluster cannot take them:
Karpenter's preflight names each missing prerequisite, tiered checkpointing and the inference operator (both
trusted through IRSA) name the missing IAM OIDC provider and how to create it —
before any operation row, with zero AWS writes. (Their reconcile, resource by resource, is tested on the
components themselves: tests/test_tiered.py, tests/test_karpenter.py.)"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.bootstrap import Services
from services.auth import Principal, Role
from services.errors import Conflict
from services.features import FeaturesPatch
from services.operations import OperationQuery
from tests.ledger import CallLedger
from tests.sandbox_support import SeededServer, seeded_server

pytestmark = pytest.mark.slow
CLUSTER = "fscale"
ADMIN = Principal("scale-admin", Role.ADMIN, "t-sadm", "api")


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SeededServer, Services]]:
    with seeded_server(tmp_path_factory.mktemp("features-scale"), CLUSTER, nodes=1) as seeded, \
            seeded.imported(tmp_path_factory.mktemp("product") / "data", CLUSTER, ADMIN) as services:
        yield seeded, services


def test_both_are_listed_off_with_their_settings(imported: tuple[SeededServer, Services]) -> None:
    _, services = imported
    views = {v.name: v for v in services.features.list_features(ADMIN, CLUSTER).features}
    for name, field in (("tiered_checkpointing", "memory_percent"), ("managed_karpenter", "instance_groups")):
        assert not views[name].enabled and not views[name].foreign, views[name]
        assert views[name].settings_schema is not None and field in views[name].settings_schema["properties"]


def test_a_cluster_that_cannot_take_them_is_refused_before_any_operation(
        imported: tuple[SeededServer, Services]) -> None:
    seeded, services = imported
    ledger = CallLedger(seeded.live)
    mark = ledger.mark()
    before = len(services.engine.list(OperationQuery(kind="features.update")))
    group = services.clusters.describe_cluster(ADMIN, CLUSTER).instance_groups[0].name
    with pytest.raises(Conflict) as karpenter:
        services.features.update_features(ADMIN, CLUSTER, FeaturesPatch.model_validate(
            {"managed_karpenter": {"instance_groups": [group]}}))
    problems = karpenter.value.details["problems"]
    assert any(p.startswith("continuous-provisioning") for p in problems), problems
    assert len(services.engine.list(OperationQuery(kind="features.update"))) == before, "no operation row"
    assert ledger.writes(since=mark) == [], "the preflight only reads"

    # tiered checkpointing and the inference operator: both roles trust the cluster's IAM OIDC provider (IRSA),
    # which this imported cluster lacks; one check names it and says how to create it, for each of them
    eks = services.aws.client("eks", services.clusters.registry.get(CLUSTER).region)
    issuer = eks.describe_cluster(name=CLUSTER)["cluster"]["identity"]["oidc"]["issuer"]
    provider = f"arn:aws:iam::123456789012:oidc-provider/{issuer.removeprefix('https://')}"
    for patch in ({"tiered_checkpointing": True}, {"hyperpod_inference_operator": True}):
        with pytest.raises(Conflict, match="no IAM OIDC provider") as refused:
            services.features.update_features(ADMIN, CLUSTER, FeaturesPatch.model_validate(patch))
        problem = refused.value.details["problems"][-1]
        assert provider in problem and f"create-open-id-connect-provider --url {issuer}" in problem, problem
    assert len(services.engine.list(OperationQuery(kind="features.update"))) == before, "no operation row"
    assert ledger.writes(since=mark) == [], "the preflight only reads"

