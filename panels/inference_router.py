"""The router section of the inference pane: put an SGLang router in front of the deployment selected in the
inference table (policy and cache threshold; the other knobs keep the router's defaults, the REST/MCP faces set
them), a table of the cluster's routers (deployment, policy, knobs, workers, phase), the request counts per
worker from the selected router's Prometheus metrics, and its delete. Redrawn from operation events of the
``inference.router.*`` kinds (topic ``operation``), no polling.

The section holds no rules: it calls the router noun's verbs (``services/inference/router.py``), in a worker
thread when served, and assigns their answers on the session's event loop; the verbs check the role again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd
import panel as pn
from pydantic import ValidationError

from panels.live import LiveRefresh, Newest, in_worker
from panels.refusals import refused
from panels.scoped import ClusterScoped, redraw, refresh
from panels.tables import ReadOnlyTable
from services.auth import Principal, Role
from services.errors import ServiceError
from services.events import Event, EventBus
from services.inference.router import CREATE_KIND, DELETE_KIND, UPDATE_KIND, Routers
from services.inference.router_models import RouterRequest, RouterView

COLUMNS = ["name", "deployment", "policy", "knobs", "workers", "phase", "message"]
KINDS = {CREATE_KIND, UPDATE_KIND, DELETE_KIND}
POLICIES = ["cache_aware", "round_robin", "random", "power_of_two"]
RouterFields = tuple[pn.widgets.TextInput, pn.widgets.Select, pn.widgets.FloatInput]


def router_fields(placeholder: str) -> RouterFields:
    """The router forms' knobs (router name, policy, cache threshold), as the section and the pool board show them."""
    return (pn.widgets.TextInput(label="Router name", placeholder=placeholder, width=200),
            pn.widgets.Select(label="Policy", options=POLICIES, value="cache_aware", width=160),
            pn.widgets.FloatInput(label="Cache threshold", value=0.3, start=0.0, end=1.0, step=0.05, width=140))


def router_request(fields: RouterFields, fronted: str, **target: str) -> RouterRequest:
    """The request those knobs ask for; an empty name is ``<fronted>-router``."""
    name, policy, cache_threshold = fields
    return RouterRequest(name=name.value or f"{fronted}-router", policy=policy.value,
                         cache_threshold=cache_threshold.value, **target)


def routers_frame(routers: list[RouterView]) -> pd.DataFrame:
    rows = [{"name": r.name, "deployment": f"{r.deployment}/{r.pool_service}" if r.pool_service else r.deployment,
             "policy": r.knobs.policy if r.knobs else "",
             "knobs": (f"cache {r.knobs.cache_threshold}, balance {r.knobs.balance_abs_threshold}/"
                       f"{r.knobs.balance_rel_threshold}") if r.knobs else "",
             "workers": f"{sum(w.phase == 'Running' for w in r.workers)}/{len(r.workers)} running", "phase": r.phase,
             "message": r.message} for r in routers]
    return pd.DataFrame(rows, columns=COLUMNS)


def counts_text(view: RouterView) -> str:
    """The selected router's request counts, one line per worker pod."""
    if view.metrics_error:
        return f"{view.name}: {view.metrics_error}"
    lines = [f"**{view.name}** ({view.knobs.policy if view.knobs else ''}): {view.requests_total} requests, "
             f"cache hits {view.cache_hits}, misses {view.cache_misses}"]
    lines += [f"- `{w.pod}` ({'ready' if w.ready else 'not ready'}): {w.requests} requests" for w in view.workers]
    return "\n".join(lines)


class RouterSection(pn.viewable.Viewer):
    """Needs the inference pane's state: its cluster, principal and selected deployment."""

    def __init__(self, routers: Routers, scope: ClusterScoped, bus: EventBus, principal: Principal,
                 selected: Callable[[], str]) -> None:
        super().__init__()
        self.routers, self.scope, self._selected = routers, scope, selected
        self.rows: list[RouterView] = []
        self.chosen = ""
        self.newest = Newest()
        operator = principal.allows(Role.OPERATOR)
        self.router_name, self.policy, self.cache_threshold = router_fields("chat-router")
        self.create_button = pn.widgets.Button(label="Route the selected deployment", disabled=not operator,
                                               css_classes=["router-create"])
        self.delete_button = pn.widgets.Button(label="Delete selected router", disabled=not operator,
                                               css_classes=["router-delete"])
        self.counts_button = pn.widgets.Button(label="Request counts", css_classes=["router-counts"])
        self.message = pn.pane.Markdown("", css_classes=["router-message"])
        self.counts = pn.pane.Markdown("", css_classes=["router-counts-text"])
        self.table = ReadOnlyTable(routers_frame([]), selectable=1, sizing_mode="stretch_width",
                                   css_classes=["router-table"], empty="No routers yet.")
        for button, handler in ((self.create_button, self._create), (self.delete_button, self._delete),
                                (self.counts_button, self._counts)):
            button.on_click(handler)
        self.table.param.watch(self._on_selection, "selection")
        self._ops = LiveRefresh(bus, "operation", self._on_operation)
        scope.param.watch(lambda _event: self._refresh(), "cluster")
        self._refresh()

    # ----- blocking (a worker thread when served) ----------------------------------------------------------

    def fetch(self) -> tuple[list[RouterView] | None, str]:
        """(the cluster's routers, or None with why) — reads only, so it may run in a worker thread."""
        if not self.scope.cluster:
            return [], ""
        try:
            return list(self.routers.list_routers(self.scope.current(), self.scope.cluster).routers), ""
        except ServiceError as exc:
            return None, f"{exc.code}: {exc.message}"

    def apply(self, fetched: tuple[list[RouterView] | None, str]) -> None:
        """Assign what :meth:`fetch` read (on the session's event loop when served)."""
        rows, error = fetched
        if rows is None:
            self.message.object = error
            return
        self.rows = rows
        self.table.value = routers_frame(rows)

    def load(self) -> None:
        self.newest.read(self.fetch, self.apply)

    def create(self) -> str:
        deployment = self._selected()
        if not deployment:
            return "Select a deployment in the table above first."
        try:
            request = router_request((self.router_name, self.policy, self.cache_threshold), deployment,
                                     deployment=deployment)
            view, _ = self.routers.create_router(self.scope.current(), self.scope.cluster, request)
        except (ValidationError, ServiceError) as exc:
            return refused(exc)
        return f"routing {deployment} through {request.name} ({view.id})"

    def describe(self) -> str:
        if not self.chosen:
            return "Select a router in the table first."
        try:
            return counts_text(self.routers.describe_router(self.scope.current(), self.scope.cluster, self.chosen))
        except ServiceError as exc:
            return f"{exc.code}: {exc.message}"

    def delete(self) -> str:
        if not self.chosen:
            return "Select a router in the table first."
        try:
            view, _ = self.routers.delete_router(self.scope.current(), self.scope.cluster, self.chosen)
        except ServiceError as exc:
            return refused(exc)
        return f"deleting router {self.chosen} ({view.id})"

    # ----- handlers ----------------------------------------------------------------------------------------

    def _on_selection(self, event: Any) -> None:
        self.chosen = self.rows[event.new[0]].name if event.new and event.new[0] < len(self.rows) else ""

    def _on_operation(self, events: list[Event]) -> None:
        if any(e.data.get("kind") in KINDS for e in events):
            self._refresh()

    def _refresh(self) -> None:
        redraw(self._ops, self)

    async def _create(self, _event: Any) -> None:
        self.message.object = await in_worker(self.create)
        await refresh(self)

    async def _delete(self, _event: Any) -> None:
        self.message.object = await in_worker(self.delete)
        await refresh(self)

    async def _counts(self, _event: Any) -> None:
        self.counts.object = await in_worker(self.describe)

    def __panel__(self) -> pn.viewable.Viewable:
        return pn.Column(
            pn.pane.Markdown("### SGLang router\nRoutes requests sharing a prefix to the same worker (cache-aware); "
                             "it finds the deployment's pods by their label."),
            pn.Row(self.router_name, self.policy, self.cache_threshold, self.create_button),
            self.message, self.table, pn.Row(self.counts_button, self.delete_button), self.counts,
            sizing_mode="stretch_width")
