"""Operations pane: a live list of operations, the selected one's stages and conditions, retry/cancel.

Updates come from the event bus, not from polling: each event marks the list stale and schedules one
refresh on the session's document (Bokeh's ``add_next_tick_callback`` is the thread-safe way in), so a
burst of transitions costs one re-read. Buttons submit and return; the result arrives as events.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pandas as pd
import panel as pn
import param

from panels.live import LiveRefresh
from services.auth import Principal, Role
from services.errors import ServiceError
from services.events import Event, EventBus
from services.operations import ACTIVE, Engine, OperationQuery, OperationView, Status

STATUS_FILTERS = ["all", "active", *[s.value for s in Status]]


class OperationsState(param.Parameterized):
    """What the pane shows; talks to the engine only through its public methods."""

    status_filter = param.Selector(default="all", objects=STATUS_FILTERS, doc="which operations to list")
    operations = param.List(default=[], item_type=OperationView, doc="the listed operations, newest first")
    selected = param.String(default="", doc="id of the operation whose details are shown")
    message = param.String(default="", doc="outcome of the last retry or cancel")

    def __init__(self, engine: Engine, principal: Principal, **params: Any) -> None:
        super().__init__(**params)
        self.engine = engine
        self.principal = principal

    @param.depends("status_filter", watch=True, on_init=True)
    def reload(self) -> None:
        f = self.status_filter
        query = OperationQuery(limit=200) if f == "all" else (
            OperationQuery(active=True, limit=200) if f == "active" else OperationQuery(status=[Status(f)], limit=200))
        self.operations = self.engine.list(query)
        if not self.selected and self.operations:
            self.selected = self.operations[0].id

    @property
    def current(self) -> OperationView | None:
        return next((op for op in self.operations if op.id == self.selected), None)

    @property
    def can_mutate(self) -> bool:
        return self.principal.allows(Role.OPERATOR)

    async def retry(self) -> None:
        await self._control(self.engine.retry, "retry")

    async def cancel(self) -> None:
        await self._control(self.engine.cancel, "cancel")

    async def _control(self, action: Any, verb: str) -> None:
        op = self.current
        if op is None:
            return
        try:
            self.principal.require(Role.OPERATOR)
            await asyncio.get_running_loop().run_in_executor(None, action, op.id, self.principal)
            self.message = f"{verb} of {op.id} requested"
        except ServiceError as exc:
            self.message = f"{verb} failed: {exc.message}"


def operations_frame(ops: list[OperationView]) -> pd.DataFrame:
    rows = []
    for op in ops:
        stage = next((s for s in op.stages if s.status != "succeeded"), None)
        rows.append({"id": op.id, "kind": op.kind, "target": op.target, "status": op.status.value,
                     "stage": stage.name if stage and not op.status.terminal else "",
                     "actor": f"{op.actor} ({op.face})", "updated": op.updated_at})
    return pd.DataFrame(rows, columns=["id", "kind", "target", "status", "stage", "actor", "updated"])


class OperationsPane(pn.viewable.Viewer):
    """Operations with stages and conditions; renders alone in a notebook or inside the dashboard."""

    def __init__(self, engine: Engine, bus: EventBus, principal: Principal, **params: Any) -> None:
        super().__init__(**params)
        self.state = OperationsState(engine, principal)
        self._live = LiveRefresh(bus, "operation", self._on_event)

    def _on_event(self, events: list[Event]) -> None:
        self.state.reload()

    async def _retry(self, _event: Any) -> None:
        await self.state.retry()

    async def _cancel(self, _event: Any) -> None:
        await self.state.cancel()

    def _select(self, event: Any) -> None:
        if event.new:
            self.state.selected = self.state.operations[event.new[0]].id

    @param.depends("state.operations", "state.selected", "state.message")
    def _details(self) -> pn.viewable.Viewable:
        op = self.state.current
        if op is None:
            return pn.pane.Markdown("No operation selected.", css_classes=["op-details"])
        stages = pd.DataFrame([{"stage": s.name, "status": s.status, "phase": s.phase, "attempts": s.attempts,
                                "acted": s.acted, "message": s.message} for s in op.stages])
        conditions = pd.DataFrame([{"type": c.type, "status": c.status, "reason": c.reason,
                                    "message": c.message, "since": c.last_transition_time} for c in op.conditions])
        retry = pn.widgets.Button(name="Retry", button_type="warning", css_classes=["op-retry"],
                                  disabled=not (self.state.can_mutate and op.status == Status.FAILED))
        cancel = pn.widgets.Button(name="Cancel", button_type="danger", css_classes=["op-cancel"],
                                   disabled=not (self.state.can_mutate and
                                                 (op.status in ACTIVE or op.status == Status.FAILED)))
        retry.on_click(self._retry)
        cancel.on_click(self._cancel)
        error = (op.error or {}).get("message", "")
        header = f"### {op.kind} · `{op.id}`\n**{op.status.value}** on `{op.target}` by {op.actor} ({op.face})"
        if error:
            header += f"\n\n**Error:** {error}"
        return pn.Column(
            pn.pane.Markdown(header, css_classes=["op-header"]),
            pn.Row(retry, cancel),
            pn.pane.Markdown(self.state.message, css_classes=["op-message"]) if self.state.message else None,
            pn.pane.Markdown("**Stages**"),
            pn.widgets.Tabulator(stages, disabled=True, show_index=False, sizing_mode="stretch_width",
                                 css_classes=["op-stages"]),
            pn.pane.Markdown("**Conditions**"),
            pn.widgets.Tabulator(conditions, disabled=True, show_index=False, sizing_mode="stretch_width",
                                 css_classes=["op-conditions"]),
            css_classes=["op-details"], sizing_mode="stretch_width",
        )

    @param.depends("state.operations")
    def _table(self) -> pn.viewable.Viewable:
        table = pn.widgets.Tabulator(operations_frame(self.state.operations), disabled=True, show_index=False,
                                     selectable=1, sizing_mode="stretch_width", height=320,
                                     css_classes=["operations-table"])
        table.param.watch(self._select, "selection")
        return table

    def __panel__(self) -> pn.viewable.Viewable:
        return pn.Column(
            pn.pane.Markdown("## Operations"),
            pn.widgets.Select.from_param(self.state.param.status_filter, name="Show", width=200),
            self._table,
            self._details,
            sizing_mode="stretch_width",
        )
