"""The Advanced features pane renders alone (no server, no browser), shows a cluster's features, sends only the
toggles the user touched and shows the reconcile stages of the change it started; and, through the same
in-process installation, the load balancer controller is not turned off while it holds load balancers."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import panel as pn
import pytest
from kubernetes import client as k8s

from app.bootstrap import Services
from panels.features import FeaturesPane
from services.auth import Principal, Role
from services.errors import Conflict
from services.features import FeaturesPatch
from services.operations import OperationQuery
from tests.sandbox_support import seeded_server
from tests.support import wait_until

pytestmark = pytest.mark.slow
ADMIN = Principal("features-admin", Role.ADMIN, "t-fadm", "api")
VIEWER = Principal("features-viewer", Role.VIEWER, "t-fview", "api")


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    with seeded_server(tmp_path_factory.mktemp("features-pane"), "fpane", nodes=1) as seeded, \
            seeded.imported(tmp_path_factory.mktemp("product") / "data", "fpane", ADMIN) as services:
        yield services


def pane_for(services: Services, principal: Principal) -> FeaturesPane:
    return FeaturesPane(services.features, services.clusters, services.operations, services.bus, principal)


def test_the_pane_sends_only_touched_toggles_and_shows_the_stages(imported: Services) -> None:
    pane = pane_for(imported, ADMIN)
    assert pane.state.cluster == "fpane"
    assert list(pane.table.value["feature"]) == [f.name for f in imported.features.features]
    assert set(pane.table.value["enabled"]) == {"off"}
    pn.panel(pane).get_root()  # renders alone

    switches = {w.name: w for w in pane.toggles.select(pn.widgets.Switch)}
    switches["kuberay_operator"].value = True
    assert pane.state.touched() == {"kuberay_operator": True}, "only what the user changed"
    asyncio.run(pane.state.apply_changes())
    op = pane.state.operation
    assert op is not None, pane.state.message
    assert [c["feature"] for c in op.request["changes"]] == ["kuberay_operator"]
    done = wait_until(lambda: (v := imported.engine.run_until_idle(op.id)).status.value == "succeeded" and v, 120,
                      "the change to finish")
    assert [s.name for s in done.stages] == ["kuberay_operator"]
    pane.state.follow()
    assert list(pane.stages.value["stage"]) == ["kuberay_operator"]
    assert list(pane.stages.value["status"]) == ["succeeded"]
    pane.state.reload()
    assert dict(zip(pane.table.value["feature"], pane.table.value["enabled"], strict=True))["kuberay_operator"] == "on"
    assert pane.state.touched() == {}, "the toggles follow the cluster again"

    viewer = pane_for(imported, VIEWER)
    assert all(w.disabled for w in viewer.toggles.select(pn.widgets.Switch)) and viewer.apply_button.disabled


def test_the_load_balancer_controller_stays_while_it_holds_load_balancers(imported: Services) -> None:
    features = imported.features
    view, _ = features.update_features(ADMIN, "fpane", FeaturesPatch(load_balancer_controller=True))
    wait_until(lambda: imported.engine.run_until_idle(view.id).status.value == "succeeded", 120, "the controller on")
    core = k8s.CoreV1Api(imported.kube.api_client("fpane"))
    core.create_namespace({"metadata": {"name": "web"}})
    core.create_namespaced_service("web", {"metadata": {"name": "front"}, "spec": {
        "type": "LoadBalancer", "ports": [{"port": 80, "targetPort": 8080}]}})
    before = len(imported.engine.list(OperationQuery(kind="features.update")))
    with pytest.raises(Conflict, match="Service web/front") as refused:
        features.update_features(ADMIN, "fpane", FeaturesPatch(load_balancer_controller=False))
    assert refused.value.details == {"feature": "load_balancer_controller", "in_use": ["Service web/front"]}
    assert len(imported.engine.list(OperationQuery(kind="features.update"))) == before, "refused before any row"
    core.delete_namespaced_service("front", "web")
    wait_until(lambda: not core.list_namespaced_service("web").items, 60,
               "the Service gone (the controller deletes its load balancer first)")
    view, _ = features.update_features(ADMIN, "fpane", FeaturesPatch(load_balancer_controller=False))
    done = wait_until(lambda: (v := imported.engine.run_until_idle(view.id)).status.value == "succeeded" and v, 120,
                      "the controller off")
    assert [s.name for s in done.stages] == ["remove-load_balancer_controller"]
