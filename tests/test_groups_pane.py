"""The instance-groups pane rendered without a browser, on a product installation with the seeded cluster
imported: the table, the inspected choices (the zone's types with their quota), a scale through the form
that runs as an operation, and a viewer whose attempt the verb refuses (the message says so)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import panel as pn
import pytest
from bokeh.model import Model

from app.bootstrap import Services
from panels.groups import GroupsPane
from services.auth import Principal, Role
from services.clusters.models import ClusterImport
from services.groups.models import GroupAdd
from tests.sandbox_support import seeded_server
from tests.support import wait_until

pytestmark = pytest.mark.slow
ADMIN = Principal("pane-admin", Role.ADMIN, "t-adm", "api")
VIEWER = Principal("pane-viewer", Role.VIEWER, "t-view", "ui")


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    with seeded_server(tmp_path_factory.mktemp("groups-pane"), "gpane", nodes=1) as seeded:
        services = seeded.product(tmp_path_factory.mktemp("product") / "data")
        try:
            services.start()
            view, _ = services.clusters.import_cluster(ADMIN, ClusterImport(eks_cluster="gpane",
                                                                            hyperpod_cluster="gpane"))
            wait_until(lambda: services.engine.get(view.id).status.value == "succeeded", 60, "the import")
            yield services
        finally:
            services.stop()


def css(root: Model, name: str) -> list[Model]:
    return [m for m in root.references() if name in (getattr(m, "css_classes", None) or [])]


def test_the_pane_shows_groups_and_offers_only_inspected_choices(imported: Services) -> None:
    pane = GroupsPane(imported.groups, imported.clusters, imported.bus, ADMIN)  # no loop: reads at once
    root = pn.panel(pane).get_root()
    (table,) = css(root, "groups-table")
    assert list(table.source.data["group"]) == ["workers"]
    state = pane.state
    assert state.cluster == "gpane" and state.zone in state.param.zone.objects
    labels = state.param.instance_type.names  # label -> type: what the form's drop-down shows
    assert "ml.g5.8xlarge" in state.param.instance_type.objects and "ml.g5.8xlarge" in labels.values()
    assert any(k.startswith("ml.g5.8xlarge") and "quota 4" in k for k in labels), labels

    async def scale() -> None:
        added, _, _ = imported.groups.add_group(ADMIN, "gpane", GroupAdd(name="panes", instance_type="ml.g5.8xlarge",
                                                                         count=1, zone=str(state.zone)))
        wait_until(lambda: imported.engine.get(added.id).status.value == "succeeded", 60, "the add")
        # the add's events re-read the pane on the bus's thread (it has no loop): a read from before the group
        # existed, landing after the next lines, would put the form's group back to "workers"
        imported.bus.drain()
        state.reload()
        state.target, state.scale_to = "panes", 0
        await state.scale()

    asyncio.run(scale())
    assert "scale panes to 0" in state.message and "instance_group.update" in state.message, state.message
    op_id = state.message.split()[5]
    wait_until(lambda: imported.engine.get(op_id).status.value == "succeeded", 60, "the scale")
    state.reload()
    shown: dict[str, Any] = {g.name: g for g in state.groups}
    assert shown["panes"].target_count == 0


def test_a_viewer_sees_the_verbs_refusal(imported: Services) -> None:
    pane = GroupsPane(imported.groups, imported.clusters, imported.bus, VIEWER)
    assert pane.add_button.disabled and pane.delete_button.disabled
    state = pane.state
    state.group_name = "nope"
    asyncio.run(state.add())
    assert state.message.startswith("refused (forbidden)"), state.message
