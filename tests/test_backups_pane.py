"""The Backups page: lists verified backups, starts backup.create through the engine, follows its events."""

from __future__ import annotations

import asyncio

import panel as pn

from app.bootstrap import Services
from panels.backups import BackupsPane
from services.auth import Principal, Role
from services.operations import Status

ADMIN = Principal("ada", Role.ADMIN, None, "ui")
VIEWER = Principal("vic", Role.VIEWER, None, "ui")


def test_back_up_now_runs_the_operation_and_the_list_follows(services: Services) -> None:
    pane = BackupsPane(backups=services.backups, bus=services.bus, principal=ADMIN)
    pn.panel(pane).get_root()
    assert pane.state.backups == [] and not pane.button.disabled
    pane.state.label = "before-upgrade"
    asyncio.run(pane.state.create())
    services.bus.drain()  # delivery is off the publisher's thread
    op_id = pane.state.message.split()[0]
    assert services.engine.run_until_idle(op_id).status == Status.SUCCEEDED
    services.bus.drain()  # delivery is off the publisher's thread
    assert [b.name.split("-op-")[0] for b in pane.state.backups] == ["state-before-upgrade"]  # via events
    assert list(pane.table.value["name"]) == [b.name for b in pane.state.backups]
    assert services.engine.get(op_id).face == "ui"


def test_bad_labels_and_viewers_are_refused_by_the_services(services: Services) -> None:
    pane = BackupsPane(backups=services.backups, bus=services.bus, principal=ADMIN)
    pane.state.label = "Not Valid!"
    asyncio.run(pane.state.create())
    services.bus.drain()  # delivery is off the publisher's thread
    assert pane.state.message.startswith("refused (invalid)")
    viewer = BackupsPane(backups=services.backups, bus=services.bus, principal=VIEWER)
    assert viewer.button.disabled
    asyncio.run(viewer.state.create())
    services.bus.drain()  # delivery is off the publisher's thread
    assert viewer.state.message.startswith("refused (forbidden)")
    assert services.backups.list() == []
