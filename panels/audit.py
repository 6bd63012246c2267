"""Audit pane: who did what through which face, newest first, live from the event bus."""

from __future__ import annotations

from typing import Any

import pandas as pd
import panel as pn
import param

from panels.live import LiveRefresh
from services.audit import AuditEntry, AuditLog, AuditQuery
from services.events import Event, EventBus
from services.operations import iso


class AuditState(param.Parameterized):
    actor = param.String(default="", doc="only rows by this token name (empty: everyone)")
    face = param.Selector(default="all", objects=["all", "ui", "rest", "mcp", "cli", "system"])
    entries = param.List(default=[], item_type=AuditEntry)

    def __init__(self, audit: AuditLog, **params: Any) -> None:
        super().__init__(**params)
        self.audit = audit

    @param.depends("actor", "face", watch=True, on_init=True)
    def reload(self) -> None:
        self.entries = self.audit.list(AuditQuery(actor=self.actor or None,
                                                  face=None if self.face == "all" else self.face, limit=200))


def audit_frame(entries: list[AuditEntry]) -> pd.DataFrame:
    return pd.DataFrame(
        [{"time": iso(e.ts), "actor": e.actor, "role": e.role, "face": e.face, "action": e.action,
          "target": e.target, "outcome": e.outcome, "operation": e.operation_id or "", "detail": e.detail}
         for e in entries],
        columns=["time", "actor", "role", "face", "action", "target", "outcome", "operation", "detail"])


class AuditPane(pn.viewable.Viewer):
    def __init__(self, audit: AuditLog, bus: EventBus, **params: Any) -> None:
        super().__init__(**params)
        self.state = AuditState(audit)
        # every audited change of an operation also publishes an operation event
        self._live = LiveRefresh(bus, "operation", self._on_event)

    def _on_event(self, events: list[Event]) -> None:
        self.state.reload()

    @param.depends("state.entries")
    def _table(self) -> pn.viewable.Viewable:
        return pn.widgets.Tabulator(audit_frame(self.state.entries), disabled=True, show_index=False,
                                    sizing_mode="stretch_width", height=480, css_classes=["audit-table"])

    def __panel__(self) -> pn.viewable.Viewable:
        return pn.Column(
            pn.pane.Markdown("## Audit"),
            pn.Row(pn.widgets.TextInput.from_param(self.state.param.actor, name="Actor", width=200),
                   pn.widgets.Select.from_param(self.state.param.face, name="Face", width=150)),
            self._table,
            sizing_mode="stretch_width",
        )
