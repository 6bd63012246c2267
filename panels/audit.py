"""Audit pane: who did what through which face, newest first, live from the event bus.

"face" is the transport the server saw (ui, api, cli, system); "client claim" is what the caller said it
was (e.g. mcp), shown as the claim it is.

Every audited change of an operation also publishes an operation event, so that event is the cue to
read the log again. In a served session the read runs in an executor (the loop never waits on SQLite)
and the table's value is replaced in place; the widgets are made once.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import panel as pn
import param

from panels.live import LiveRefresh, Newest
from panels.tables import ReadOnlyTable
from services.audit import AuditEntry, AuditLog, AuditQuery
from services.auth import Principal
from services.events import Event, EventBus
from services.operation_views import iso

FACES = ["all", "ui", "api", "cli", "system"]
COLUMNS = ["time", "actor", "role", "face", "client claim", "action", "target", "outcome", "operation", "detail"]
LIMIT = 200


class AuditState(param.Parameterized):
    actor = param.String(default="", doc="only rows by this token name (empty: everyone)")
    face: param.Selector[str] = param.Selector(default="all", objects=FACES,
                                               doc="only rows that came through this face")
    entries = param.List(default=[], item_type=AuditEntry, doc="the listed rows, newest first")

    def __init__(self, audit: AuditLog, principal: Principal, **params: Any) -> None:
        super().__init__(**params)
        self.audit = audit
        self.principal = principal
        self._newest = Newest()
        self.reload()

    def query(self) -> AuditQuery:
        return AuditQuery(actor=self.actor.strip() or None, face=None if self.face == "all" else self.face,
                          limit=LIMIT)

    def reload(self) -> None:
        """Read synchronously (notebooks, tests, first render)."""
        query = self.query()
        self._newest.read(lambda: self.audit.list_entries(self.principal, query), self._assign)

    async def refresh(self) -> None:
        """Read in a worker thread; a filter change while reading wins over this answer."""
        query = self.query()
        await self._newest.read_in_worker(lambda: self.audit.list_entries(self.principal, query), self._assign,
                                          lambda: query == self.query())

    def _assign(self, entries: list[AuditEntry]) -> None:
        self.entries = entries


def audit_frame(entries: list[AuditEntry]) -> pd.DataFrame:
    return pd.DataFrame(
        [{"time": iso(e.ts), "actor": e.actor, "role": e.role, "face": e.face, "client claim": e.client,
          "action": e.action,
          "target": e.target, "outcome": e.outcome, "operation": e.operation_id or "", "detail": e.detail}
         for e in entries],
        columns=COLUMNS)


class AuditPane(pn.viewable.Viewer):
    def __init__(self, audit: AuditLog, bus: EventBus, principal: Principal, **params: Any) -> None:
        super().__init__(**params)
        self.state = AuditState(audit, principal)
        self.table = ReadOnlyTable(audit_frame(self.state.entries), disabled=True, show_index=False,
                                          sizing_mode="stretch_width", height=480, css_classes=["audit-table"],
                                          empty="No audit entries match: every change (operations, tokens, "
                                                "sign-ins, faults) is recorded here with its actor and face.")
        self.state.param.watch(self._on_entries, "entries")
        self.state.param.watch(self._on_filter, ["actor", "face"])
        self._live = LiveRefresh(bus, "operation", self._on_events)

    def _on_events(self, _events: list[Event]) -> None:
        self._reread()

    def _on_filter(self, _event: param.parameterized.Event) -> None:
        self._reread()

    def _reread(self) -> None:
        if not self._live.spawn(self.state.refresh):  # no loop to read on: read here
            self.state.reload()

    def _on_entries(self, _event: param.parameterized.Event) -> None:
        self.table.value = audit_frame(self.state.entries)

    def __panel__(self) -> pn.viewable.Viewable:
        return pn.Column(
            pn.pane.Markdown("## Audit"),
            pn.Row(pn.widgets.TextInput.from_param(self.state.param.actor, name="Actor", width=200,
                                                   css_classes=["audit-actor"]),
                   pn.widgets.Select.from_param(self.state.param.face, name="Face", width=150,
                                                css_classes=["audit-face"])),
            self.table,
            sizing_mode="stretch_width",
        )
