"""Operations pane: a live list of operations, the selected one's stages and conditions, retry/cancel.

Updates come from the event bus, not from polling. Every operation event carries the operation's full
view, so the state merges it into the list by id and version without touching the database, and the
pane updates its tables in place (no widget is rebuilt, so the selection and scroll position survive).
Buttons submit and return: the verb runs in an executor, the role is checked by the verb (and the
engine, per operation kind), and the outcome arrives as events.
"""

from __future__ import annotations

import asyncio
import html
import operator
import threading
from collections.abc import Callable, Iterable
from typing import Any

import pandas as pd
import panel as pn
import param

from panels.live import LiveRefresh, Newest
from panels.tables import ReadOnlyTable, role_hint
from services.auth import Principal, Role
from services.errors import ServiceError
from services.events import Event, EventBus
from services.operation_verbs import Operations
from services.operation_views import ACTIVE, OperationQuery, OperationView, Status

STATUS_FILTERS = ["all", "active", *[s.value for s in Status]]
LIMIT = 200

OPERATION_COLUMNS = ["id", "kind", "target", "status", "stage", "actor", "updated"]
STAGE_COLUMNS = ["stage", "status", "phase", "attempts", "acted", "message"]
CONDITION_COLUMNS = ["type", "status", "reason", "message", "since"]


def _query(status_filter: str) -> OperationQuery:
    if status_filter == "all":
        return OperationQuery(limit=LIMIT)
    if status_filter == "active":
        return OperationQuery(active=True, limit=LIMIT)
    return OperationQuery(status=[Status(status_filter)], limit=LIMIT)


def _matches(status_filter: str, op: OperationView) -> bool:
    if status_filter == "all":
        return True
    if status_filter == "active":
        return op.status in ACTIVE
    return op.status.value == status_filter


def _newest_first(ops: Iterable[OperationView]) -> list[OperationView]:
    return sorted(ops, key=lambda op: (op.created_at, op.id), reverse=True)[:LIMIT]


class OperationsState(param.Parameterized):
    """What the pane shows; acts only through the operations noun's verbs."""

    status_filter: param.Selector[str] = param.Selector(default="all", objects=STATUS_FILTERS,
                                                        doc="which operations to list")
    operations = param.List(default=[], item_type=OperationView, doc="the listed operations, newest first")
    selected = param.String(default="", doc="id of the operation whose details are shown")
    current = param.ClassSelector(class_=OperationView, default=None, allow_None=True, constant=True,
                                  doc="the selected operation, if it is listed")
    can_retry = param.Boolean(default=False, constant=True, doc="the principal may retry the current operation")
    can_cancel = param.Boolean(default=False, constant=True, doc="the principal may cancel the current operation")
    busy = param.Boolean(default=False, doc="a retry or cancel is on its way to the engine")
    message = param.String(default="", doc="outcome of the last retry or cancel")

    def __init__(self, operations: Operations, principal: Principal,
                 current_principal: Callable[[], Principal] | None = None, **params: Any) -> None:
        super().__init__(**params)
        self.operations_verbs = operations
        self.principal = principal
        # asked again at every action, so a token revoked while the page is open acts no more
        self._current_principal = current_principal or (lambda: principal)
        # outside a served session events arrive on the bus's thread while an action may finish on the
        # caller's: the derived flags are read and written under one lock, so the last derive sees both
        self._derive_lock = threading.RLock()
        self._newest = Newest()
        self.reload()
        self._derive()

    # ----- reading -----------------------------------------------------------------------------------

    def reload(self) -> None:
        """Read the list for the current filter (synchronously: notebooks, tests, first render)."""
        query = _query(self.status_filter)
        self._newest.read(lambda: self.operations_verbs.list_operations(self.principal, query), self._replace)

    async def refresh(self) -> None:
        """Read the list for the current filter in a worker thread, so the event loop never waits on SQLite."""
        wanted = self.status_filter
        await self._newest.read_in_worker(lambda: self.operations_verbs.list_operations(self.principal, _query(wanted)),
                                          self._replace, lambda: wanted == self.status_filter)

    def _replace(self, ops: list[OperationView]) -> None:
        # keep what an event already brought in if it is newer than the read
        known = {op.id: op for op in self.operations}
        merged = [known[op.id] if op.id in known and known[op.id].version > op.version else op for op in ops]
        self.operations = _newest_first(merged)
        if not self.selected and self.operations:
            self.selected = self.operations[0].id

    def apply(self, views: Iterable[OperationView]) -> bool:
        """Merge operation views from events (by id, newest version wins); True when the list changed."""
        by_id = {op.id: op for op in self.operations}
        changed = False
        for view in views:
            old = by_id.get(view.id)
            if old is not None and old.version >= view.version:
                continue
            if _matches(self.status_filter, view):
                by_id[view.id] = view
                changed = True
            elif old is not None:
                del by_id[view.id]
                changed = True
        if changed:
            self.operations = _newest_first(by_id.values())
            if not self.selected and self.operations:
                self.selected = self.operations[0].id
        return changed

    @param.depends("operations", "selected", "busy", watch=True)
    def _derive(self) -> None:
        with self._derive_lock:
            self._derive_locked()

    def _derive_locked(self) -> None:
        op = next((o for o in self.operations if o.id == self.selected), None)
        may = self.principal.allows(Role.OPERATOR) and not self.busy and op is not None
        with param.edit_constant(self):
            self.current = op
            self.can_retry = may and op is not None and op.status == Status.FAILED
            self.can_cancel = may and op is not None and (
                (op.status in ACTIVE and not op.cancel_requested) or op.status == Status.FAILED)

    # ----- control -----------------------------------------------------------------------------------

    async def retry(self) -> None:
        await self._control(self.operations_verbs.retry_operation, "retry")

    async def cancel(self) -> None:
        await self._control(self.operations_verbs.cancel_operation, "cancel")

    async def _control(self, action: Callable[[Principal, str], OperationView], verb: str) -> None:
        op = self.current
        if op is None:
            self.message = f"{verb}: no operation selected"
            return
        self.busy = True
        try:
            # the engine checks the role; the disabled button is only a courtesy
            def run() -> OperationView:
                return action(self._current_principal(), op.id)

            await asyncio.get_running_loop().run_in_executor(None, run)
            self.message = f"{verb} of {op.id} requested"
        except ServiceError as exc:
            self.message = f"{verb} of {op.id} refused ({exc.code}): {exc.message}"
        finally:
            self.busy = False


def operations_frame(ops: list[OperationView]) -> pd.DataFrame:
    """One row per operation, indexed by id so the table keeps its selection when rows move."""
    rows = []
    for op in ops:
        stage = next((s for s in op.stages if s.status != "succeeded"), None)
        rows.append({"id": op.id, "kind": op.kind, "target": op.target, "status": op.status.value,
                     "stage": stage.name if stage and not op.status.terminal else "",
                     "actor": f"{op.actor} ({op.face})", "updated": op.updated_at})
    return pd.DataFrame(rows, columns=OPERATION_COLUMNS, index=pd.Index([op.id for op in ops], dtype=object))


def stages_frame(op: OperationView | None) -> pd.DataFrame:
    rows = [] if op is None else [
        {"stage": s.name, "status": s.status, "phase": s.phase, "attempts": s.attempts, "acted": s.acted,
         "message": s.message} for s in op.stages]
    return pd.DataFrame(rows, columns=STAGE_COLUMNS)


def conditions_frame(op: OperationView | None) -> pd.DataFrame:
    rows = [] if op is None else [
        {"type": c.type, "status": c.status, "reason": c.reason, "message": c.message,
         "since": c.last_transition_time} for c in op.conditions]
    return pd.DataFrame(rows, columns=CONDITION_COLUMNS)


def header_markdown(op: OperationView | None) -> str:
    if op is None:
        return "No operation selected."
    esc = html.escape  # errors often echo request values from AWS or Kubernetes: never render them as HTML
    text = (f"### {esc(op.kind)} · `{esc(op.id)}`\n**{op.status.value}** on `{esc(op.target)}` by "
            f"{esc(op.actor)} ({esc(op.face)})")
    if op.cancel_requested and not op.status.terminal:
        text += " · cancel requested"
    error = (op.error or {}).get("message", "")
    if error:
        text += f"\n\n**Error:** {esc(str(error))}"
    return text


class OperationsPane(pn.viewable.Viewer):
    """Operations with stages and conditions; renders alone in a notebook or inside the dashboard."""

    def __init__(self, operations: Operations, bus: EventBus, principal: Principal,
                 current_principal: Callable[[], Principal] | None = None, **params: Any) -> None:
        super().__init__(**params)
        self.state = OperationsState(operations, principal, current_principal)
        state = self.state
        self.table = ReadOnlyTable(
            operations_frame(state.operations), disabled=True, show_index=False, selectable=1,
            sizing_mode="stretch_width", max_height=320, css_classes=["operations-table"],
            empty="No operations yet: every change (a backup, and cluster work as it arrives) is an operation "
                  "and appears here live.")
        self.stages = ReadOnlyTable(stages_frame(state.current), disabled=True, show_index=False,
                                    sizing_mode="stretch_width", css_classes=["op-stages"],
                                    empty="Select an operation to see its stages.")
        self.conditions = ReadOnlyTable(conditions_frame(state.current), disabled=True, show_index=False,
                                        sizing_mode="stretch_width", css_classes=["op-conditions"],
                                        empty="Select an operation to see its conditions.")
        self.retry_button = pn.widgets.Button(
            label="Retry", color="warning", css_classes=["op-retry"],
            disabled=state.param.can_retry.rx.pipe(operator.not_), loading=state.param.busy)
        self.cancel_button = pn.widgets.Button(
            label="Cancel", color="danger", css_classes=["op-cancel"],
            disabled=state.param.can_cancel.rx.pipe(operator.not_), loading=state.param.busy)
        self.retry_button.on_click(self._retry)
        self.cancel_button.on_click(self._cancel)
        self.role_hint = role_hint(principal, Role.OPERATOR, "Retry and Cancel")
        if not principal.allows(Role.OPERATOR):
            for button in (self.retry_button, self.cancel_button):
                button.description = "needs the operator role"
        self._select_row()
        self.table.param.watch(self._on_selection, "selection")
        state.param.watch(self._on_operations, "operations")
        state.param.watch(self._on_current, "current")
        state.param.watch(self._on_selected, "selected")
        state.param.watch(self._on_filter, "status_filter")
        state.param.watch(self._on_message, "message")
        self._live = LiveRefresh(bus, "operation", self._on_events)

    # ----- events in -----------------------------------------------------------------------------------

    def _on_events(self, events: list[Event]) -> None:
        views = []
        for event in events:
            try:
                views.append(OperationView.model_validate(event.data))
            except ValueError:
                continue  # not an operation view; the next read will catch up
        self.state.apply(views)

    def _on_filter(self, _event: param.parameterized.Event) -> None:
        if not self._live.spawn(self.state.refresh):  # no loop to read on: read here
            self.state.reload()

    # ----- state -> widgets (in place) -----------------------------------------------------------------

    def _on_operations(self, _event: param.parameterized.Event) -> None:
        # Tabulator maps the selection through the index (the operation id) when rows move
        self.table.value = operations_frame(self.state.operations)
        self._select_row()

    def _on_selected(self, _event: param.parameterized.Event) -> None:
        self._select_row()

    def _select_row(self) -> None:
        ids = list(self.table.value.index)
        wanted = [ids.index(self.state.selected)] if self.state.selected in ids else []
        if self.table.selection != wanted:
            self.table.selection = wanted

    def _on_current(self, _event: param.parameterized.Event) -> None:
        self.stages.value = stages_frame(self.state.current)
        self.conditions.value = conditions_frame(self.state.current)

    def _on_message(self, event: param.parameterized.Event) -> None:
        notifications = pn.state.notifications if self._live.in_session else None
        if notifications is not None and event.new:
            (notifications.error if "refused" in event.new else notifications.info)(event.new, duration=5000)

    # ----- user actions ----------------------------------------------------------------------------------

    def _on_selection(self, event: param.parameterized.Event) -> None:
        if event.new and event.new[0] < len(self.table.value):
            self.state.selected = str(self.table.value.index[event.new[0]])

    async def _retry(self, _event: Any) -> None:
        await self.state.retry()

    async def _cancel(self, _event: Any) -> None:
        await self.state.cancel()

    def __panel__(self) -> pn.viewable.Viewable:
        state = self.state
        return pn.Column(
            pn.pane.Markdown("## Operations"),
            pn.widgets.Select.from_param(state.param.status_filter, name="Show", width=200,
                                         css_classes=["op-filter"]),
            self.table,
            pn.Column(
                pn.pane.Markdown(state.param.current.rx.pipe(header_markdown), css_classes=["op-header"]),
                pn.Row(self.retry_button, self.cancel_button),
                self.role_hint,
                pn.pane.Markdown(state.param.message, css_classes=["op-message"]),
                pn.pane.Markdown("**Stages**"),
                self.stages,
                pn.pane.Markdown("**Conditions**"),
                self.conditions,
                css_classes=["op-details"], sizing_mode="stretch_width",
            ),
            sizing_mode="stretch_width",
        )
