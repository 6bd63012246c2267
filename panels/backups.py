"""Backups pane: the state database's backups and a button that starts ``backup.create``.

The button submits the operation and returns; progress shows in the Operations page and the list here
refreshes when the operation's events say it ended.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pandas as pd
import panel as pn
import param

from panels.live import LiveRefresh, Newest
from panels.tables import ReadOnlyTable
from services.auth import Principal, Role
from services.backups import KIND, BackupCreate, BackupInfo, Backups
from services.errors import ServiceError
from services.events import Event, EventBus
from services.models import parse


class BackupsState(param.Parameterized):
    label = param.String(default="manual", doc="a short tag in the file name")
    backups = param.List(default=[], item_type=BackupInfo)
    message = param.String(default="")

    def __init__(self, backups: Backups, principal: Principal, current_principal: Callable[[], Principal],
                 **params: Any) -> None:
        super().__init__(**params)
        self.store = backups
        self.principal = principal
        self._current_principal = current_principal
        self._newest = Newest()
        self.reload()

    def reload(self) -> None:
        if self.principal.allows(Role.ADMIN):
            self._newest.read(lambda: self.store.list_backups(self.principal), self._assign)
        else:  # an operator may take a backup; the list (names, sizes) is the admin's
            self.backups = []
            self.message = "listing backups takes the admin role"

    def _assign(self, backups: list[BackupInfo]) -> None:
        self.backups = backups

    async def create(self) -> None:
        def submit() -> str:
            request = parse(BackupCreate, {"label": self.label})
            view, created = self.store.create_backup(self._current_principal(), request)
            return f"{view.id} {'started' if created else 'already running'}"

        try:
            self.message = await asyncio.get_running_loop().run_in_executor(None, submit)
        except ServiceError as exc:
            self.message = f"refused ({exc.code}): {exc.message}"


def backups_frame(backups: list[BackupInfo]) -> pd.DataFrame:
    return pd.DataFrame([{"name": b.name, "size (KiB)": round(b.size_bytes / 1024, 1), "created": b.created_at}
                         for b in backups], columns=["name", "size (KiB)", "created"])


class BackupsPane(pn.viewable.Viewer):
    def __init__(self, backups: Backups, bus: EventBus, principal: Principal,
                 current_principal: Callable[[], Principal] | None = None, **params: Any) -> None:
        super().__init__(**params)
        self.state = BackupsState(backups, principal, current_principal or (lambda: principal))
        self._live = LiveRefresh(bus, "operation", self._on_event)
        self.table = ReadOnlyTable(backups_frame(self.state.backups), sizing_mode="stretch_width", height=260,
                                   css_classes=["backups-table"],
                                   empty="No backups yet: 'Back up now' (or POST /api/v1/backups) makes a verified "
                                         "copy of the state database.")
        self.button = pn.widgets.Button(label="Back up now", color="primary", css_classes=["backup-create"],
                                        disabled=not principal.allows(Role.OPERATOR))
        self.button.on_click(self._create)
        self.state.param.watch(lambda e: setattr(self.table, "value", backups_frame(e.new)), "backups")

    def _on_event(self, events: list[Event]) -> None:
        if any(e.data.get("kind") == KIND and e.data.get("status") == "succeeded" for e in events):
            self.state.reload()

    async def _create(self, _event: Any) -> None:
        await self.state.create()

    def __panel__(self) -> pn.viewable.Viewable:
        return pn.Column(
            pn.pane.Markdown("## Backups\nVerified online copies of the state database (operations, audit log, "
                             "token hashes) in the data directory's `backups/`."),
            self.table,
            pn.Row(pn.widgets.TextInput.from_param(self.state.param.label, name="Label", width=220), self.button),
            pn.pane.Markdown(self.state.param.message, css_classes=["backup-message"]),
            sizing_mode="stretch_width",
        )
