"""The Nodes pane rendered without a browser against a product installation with a sandbox cluster imported:
the grid coloured by health follows a node fault live (watch events, no refresh asked), actions ask for a
confirmation that says what they do before anything happens, the destructive ones are greyed out for an
operator, and a confirmed replace submits the operation through the verbs."""

from __future__ import annotations

import html
from collections.abc import Iterator
from typing import Any

import panel as pn
import pytest

from app.bootstrap import Services
from panels.nodes import NodesPane
from services.auth import Principal, Role
from services.clusters.models import ClusterImport
from services.operations import OperationQuery
from tests.node_support import node_cluster
from tests.sandbox_support import SeededServer
from tests.support import wait_until

pytestmark = pytest.mark.slow
ADMIN = Principal("pane-admin", Role.ADMIN, "t-adm", "api")
OPERATOR = Principal("pane-operator", Role.OPERATOR, "t-op", "api")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SeededServer, Services]]:
    with node_cluster(tmp_path_factory.mktemp("nodes-pane"), 2) as seeded:
        services = seeded.product(tmp_path_factory.mktemp("product") / "data")
        try:
            view, _ = services.clusters.import_cluster(ADMIN, ClusterImport(eks_cluster="hp-eks",
                                                                            hyperpod_cluster="hp-eks"))
            wait_until(lambda: services.engine.run_until_idle(view.id).status == "succeeded", 60,
                       "the import to connect (its node list synced)")
            yield seeded, services
        finally:
            services.stop()


def grid(pane: NodesPane) -> str:
    return html.unescape(pane.grid.object)


def test_the_grid_follows_a_fault_live_and_actions_are_confirmed(world: tuple[SeededServer, Services]) -> None:
    seeded, services = world
    pane = NodesPane(services.nodes, services.clusters, services.bus, ADMIN)
    pn.panel(pane).get_root()  # renders alone, as in a notebook
    wait_until(lambda: grid(pane).count("data-health='Schedulable'") == 2, 60, "both nodes in the grid")
    assert pane.picker.value == "hp-eks" and len(pane.table.value) == 2
    sick: Any = pane.state.nodes[0]
    fault = seeded.live.post("/api/v1/sandbox/faults", {"kind": "node_persistent_fault", "target": {
        "cluster": "hp-eks", "node": sick.instance_id}})
    assert fault.status_code == 201, fault.text

    def red() -> bool:
        services.bus.drain()
        return f"data-node='{sick.name}' data-health='UnschedulablePendingReplacement'" in grid(pane)

    wait_until(red, 60, "the grid to show the fault from watch events alone")
    assert "NvidiaGpuXidError" in grid(pane)

    pane.table.selection = [0]
    assert pane.state.selected == [sick.name]
    pane.buttons["replace"].clicks += 1  # first click: only the confirmation
    assert pane.state.pending == "replace" and pane.confirm_button.visible
    assert "DESTROYS root and secondary volumes" in pane.state.message
    pane.cancel_button.clicks += 1
    assert pane.state.pending == "" and "nothing was done" in pane.state.message
    assert services.engine.list(OperationQuery(kind="node.replace")) == []

    pane.buttons["replace"].clicks += 1
    pane.state.act()  # what Confirm runs in a worker thread
    (replace,) = services.engine.list(OperationQuery(kind="node.replace"))
    assert replace.target == f"cluster/hp-eks/node/{sick.name}" and replace.id in pane.state.message

    operator_pane = NodesPane(services.nodes, services.clusters, services.bus, OPERATOR)
    assert operator_pane.buttons["replace"].disabled and operator_pane.buttons["delete"].disabled
    assert not operator_pane.buttons["reboot"].disabled and not operator_pane.buttons["drain"].disabled
