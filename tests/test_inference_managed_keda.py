"""Managed triggers on a cluster where a KEDA InstantStart did not install already runs, in the managed tests'
world (the operator's CRDs installed): one installed elsewhere than ``keda`` (its CRDs and the external metrics
APIService, not ours) and the inference operator add-on's bundled copy each serve the operator's ScaledObject as
they are: the preview installs nothing and names that KEDA, the deploy runs without a ``components`` stage and the
ledger shows no write to any of KEDA's objects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from services.auth import Principal, Role
from services.inference.managed_models import EndpointRequest
from tests.jobs_support import CLUSTER, JobWorld
from tests.keda_support import THEIR_SERVER, their_keda
from tests.ledger import CallLedger
from tests.managed_support import BASE, NS, delete, finished, keda_writes, operator, triggered, world
from tests.node_support import aws
from tests.support import wait_until

pytestmark = pytest.mark.slow
__all__ = ["operator", "world"]  # the managed tests' fixtures: a world of this module's own
INFERENCE_ADDON = "amazon-sagemaker-hyperpod-inference"


def deploy_on_their_keda(world: JobWorld, name: str, serving: str) -> None:
    """Preview and deploy a triggered endpoint: no install, the preview names ``serving``, no KEDA object written,
    the operator's ScaledObject made; then delete it."""
    wait_until(lambda: world.live.get(BASE).json()["operator"], 60, "the operator's CRDs in the cache")
    ledger = CallLedger(world.live)
    mark = ledger.mark()
    shown = world.live.post(f"{BASE}/preview", triggered(name))
    assert shown.status_code == 200, shown.text
    assert shown.json()["install"] == [], shown.text
    assert any(serving in w and "nothing is installed" in w for w in shown.json()["warnings"]), shown.text
    made = world.live.post(BASE, triggered(name))
    assert made.status_code == 202, made.text
    op = finished(world, made.json()["operation"]["id"])
    assert op["status"] == "succeeded", op
    assert [s["name"] for s in op["stages"]] == ["namespace", "apply", "ready"]
    scaled: Any = world.custom.get_namespaced_custom_object("keda.sh", "v1alpha1", NS, "scaledobjects", name)
    assert scaled["spec"]["scaleTargetRef"]["name"] == name
    assert keda_writes(ledger, mark) == []
    gone = delete(world, f"{BASE}/{name}")
    assert finished(world, gone.json()["operation"]["id"])["status"] == "succeeded"
    def scaled_objects() -> list[Any]:
        found: Any = world.custom.list_namespaced_custom_object("keda.sh", "v1alpha1", NS, "scaledobjects")
        return list(found["items"])
    wait_until(lambda: not scaled_objects(), 60, "the operator's ScaledObject gone with the endpoint")


def test_a_keda_installed_in_another_namespace_serves_the_triggers_as_it_is(operator: JobWorld) -> None:
    with their_keda(operator):
        deploy_on_their_keda(operator, "theirs", THEIR_SERVER)


def test_a_keda_that_arrives_after_the_submit_fails_the_components_stage_with_no_write(operator: JobWorld,
                                                                                       tmp_path: Path) -> None:
    """The submit found no KEDA and planned ours; their KEDA installed before the stage acts fails it (nothing is
    applied over their objects) instead of being taken over."""
    principal = Principal("keda-race", Role.OPERATOR, "t-op", "api")
    with operator.server.imported(tmp_path / "product", CLUSTER, principal) as services:
        request = EndpointRequest.model_validate(triggered("late"))
        view, _ = services.managed_inference.deploy_endpoint(principal, CLUSTER, request)
        assert view.request["install"] == ["keda"], view.request
        with their_keda(operator):
            ledger = CallLedger(operator.live)
            mark = ledger.mark()
            wait_until(lambda: services.engine.run_until_idle(view.id).status == "failed", 60, "the deploy to fail")
            failed = services.engine.get(view.id)
            assert failed.stages[0].name == "components" and "did not install" in str(failed.error), failed
            assert keda_writes(ledger, mark) == []


def test_the_operator_add_on_s_bundled_keda_serves_the_triggers_as_it_is(operator: JobWorld) -> None:
    """Last in the module: the add-on stays for the module's world."""
    eks = aws(operator.server, "eks")
    eks.create_addon(clusterName=CLUSTER, addonName="cert-manager")
    eks.create_addon(clusterName=CLUSTER, addonName=INFERENCE_ADDON, addonVersion="v1.3.0-eksbuild.1")
    def active() -> bool:
        return all(eks.describe_addon(clusterName=CLUSTER, addonName=a)["addon"]["status"] == "ACTIVE"
                   for a in ("cert-manager", INFERENCE_ADDON))
    wait_until(active, 120, "the two add-ons ACTIVE")
    deploy_on_their_keda(operator, "bundled", "bundled KEDA")
