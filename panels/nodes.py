"""Nodes pane: one cluster's nodes as a grid coloured by health (with deep-health-check status and fault
reasons), a table for bulk selection, and the node actions — cordon, uncordon, drain, reboot, deep health
check, and the destructive replace and delete — each behind a confirmation that says what it does (for
replace and delete: volumes wiped, pods evicted). Live from the informers' watch events (topic ``kube``) and
operation events, no polling.

The pane holds no rules: it calls the nodes noun's verbs (``services/nodes``), in a worker thread when
served, so the event loop never waits on AWS or Kubernetes; the verbs check the role again.
"""

from __future__ import annotations

import asyncio
import html
from collections.abc import Callable
from typing import Any

import pandas as pd
import panel as pn
import param

from panels.live import LiveRefresh, Newest
from panels.tables import ReadOnlyTable
from services.auth import Principal, Role
from services.clusters import Clusters
from services.errors import ServiceError
from services.events import Event, EventBus
from services.nodes import Nodes
from services.nodes.models import (
    DrainRequest,
    HealthCheckRequest,
    NodeDelete,
    NodeDestroy,
    NodeItem,
    NodeQuery,
    NodeSelection,
)

COLUMNS = ["name", "group", "health", "deep health check", "fault", "cordoned", "gpus", "pods"]
COLOURS = {"Schedulable": "#1a7f37", "Ready": "#1a7f37", "NotReady": "#6e7781", "Unschedulable": "#8250df",
           "UnschedulablePendingReboot": "#bf8700", "UnschedulablePendingReplacement": "#cf222e"}
#: action -> (verb, least role, what the confirmation says it does)
ACTIONS: dict[str, tuple[str, Role, str]] = {
    "cordon": ("cordon_nodes", Role.OPERATOR, "marks them unschedulable; running pods stay"),
    "uncordon": ("uncordon_nodes", Role.OPERATOR, "makes them schedulable again"),
    "drain": ("drain_nodes", Role.OPERATOR, "cordons them and evicts their pods, waiting on disruption budgets"),
    "reboot": ("reboot_nodes", Role.OPERATOR, "reboots the instances; volumes are kept"),
    "health check": ("check_nodes", Role.OPERATOR, "runs deep health checks; the nodes are unschedulable meanwhile"),
    "replace": ("replace_nodes", Role.ADMIN, "DESTROYS root and secondary volumes and evicts every pod: new "
                                             "instances start empty"),
    "delete": ("delete_nodes", Role.ADMIN, "DESTROYS the instances, their volumes and pods, and shrinks their "
                                           "groups"),
}


def nodes_frame(nodes: list[NodeItem]) -> pd.DataFrame:
    rows = [{"name": n.name, "group": n.instance_group or "", "health": n.health,
             "deep health check": n.deep_health_check or "", "fault": ", ".join(n.fault_types + n.fault_reasons),
             "cordoned": "yes" if n.cordoned else "", "gpus": n.gpus, "pods": n.pods} for n in nodes]
    return pd.DataFrame(rows, columns=COLUMNS)


def grid_html(nodes: list[NodeItem]) -> str:
    """Each node as a chip coloured by its health (names and labels escaped: they come from the cluster)."""
    if not nodes:
        return "<p>No nodes.</p>"
    esc = html.escape
    chips = "".join(
        f"<span class='node-cell' data-node='{esc(n.name)}' data-health='{esc(n.health)}' "
        f"title='{esc(n.name)}: {esc(n.health)}; deep health check {esc(n.deep_health_check or '-')}; "
        f"{esc(', '.join(n.fault_reasons) or 'no fault')}; {n.pods} pods' style='display:inline-block;margin:2px;"
        f"padding:2px 6px;border-radius:4px;color:white;background:{COLOURS.get(n.health, '#6e7781')}'>"
        f"{esc(n.name)}{' ⛔' if n.cordoned else ''}</span>" for n in nodes)
    return f"<div class='node-grid'>{chips}</div>"


def request_for(action: str, names: list[str]) -> NodeSelection:
    if action in ("replace", "delete"):
        return (NodeDelete if action == "delete" else NodeDestroy)(nodes=names, confirm=True)
    if action == "drain":
        return DrainRequest(nodes=names)
    if action == "health check":
        return HealthCheckRequest(nodes=names)
    return NodeSelection(nodes=names)


class NodesState(param.Parameterized):
    cluster = param.String(default="", doc="the cluster whose nodes are shown")
    clusters = param.List(default=[], item_type=str)
    nodes = param.List(default=[], item_type=NodeItem)
    selected = param.List(default=[], item_type=str, doc="node names chosen for an action")
    pending = param.String(default="", doc="the action awaiting confirmation")
    message = param.String(default="")
    busy = param.Boolean(default=False)

    def __init__(self, nodes: Nodes, clusters: Clusters, principal: Principal,
                 current_principal: Callable[[], Principal] | None = None, **params: Any) -> None:
        super().__init__(**params)
        self.service = nodes
        self.clusters_service = clusters
        self.principal = principal
        self._current_principal = current_principal or (lambda: principal)
        self._newest = Newest()

    def fetch(self) -> tuple[list[str], str, list[NodeItem], str]:
        """Ask the verbs (may wait for a first list); assigns nothing, so it may run in a worker thread."""
        names = [c.name for c in self.clusters_service.list_clusters(self.principal, wait=0)]
        cluster = self.cluster if self.cluster in names else (names[0] if names else "")
        if not cluster:
            return names, "", [], ""
        try:
            listed = self.service.list_nodes(self.principal, cluster, NodeQuery(limit=5000))
        except ServiceError as exc:
            return names, cluster, [], f"{exc.code}: {exc.message}"
        return names, cluster, listed.nodes, ""

    def apply(self, read: tuple[list[str], str, list[NodeItem], str]) -> None:
        self.clusters, self.cluster, self.nodes, error = read
        known = {n.name for n in self.nodes}
        self.selected = [s for s in self.selected if s in known]
        if error:
            self.message = error

    def reload(self) -> None:
        self._newest.read(self.fetch, self.apply)

    async def refresh(self) -> None:
        await self._newest.read_in_worker(self.fetch, self.apply)

    def ask(self, action: str) -> None:
        """First step of an action: say what it will do to the selection; nothing happens before confirm."""
        if not self.selected:
            self.message = "Select nodes in the table first."
            return
        self.pending = action
        self.message = (f"**{action}** {len(self.selected)} node(s) ({', '.join(self.selected[:5])}"
                        f"{'…' if len(self.selected) > 5 else ''}): {ACTIONS[action][2]}. Confirm or cancel.")

    def cancel(self) -> None:
        self.pending, self.message = "", "Cancelled; nothing was done."

    def drain_text(self, principal: Principal, cluster: str, names: list[str]) -> str:
        """What the drain would do (plan_drain: pods, jobs, blocking budgets); assigns nothing (worker-safe)."""
        try:
            plan = self.service.plan_drain(principal, cluster, NodeSelection(nodes=names))
        except ServiceError as exc:
            return f" The drain plan could not be read ({exc.code}): {exc.message}"
        pods = [f"{p.namespace}/{p.name}" for p in plan.pods]
        return (f" It evicts {len(pods)} pod(s){': ' + ', '.join(pods[:10]) if pods else ''}"
                f"{'…' if len(pods) > 10 else ''}; jobs affected: {', '.join(plan.jobs[:10]) or 'none'}; "
                + (f"held up now by the budget(s) {', '.join(plan.blocked_by)} (the drain waits for them)"
                   if plan.blocked_by else "no disruption budget holds it up now")
                + f"; {len(plan.skipped)} pod(s) stay (DaemonSet, mirror).")

    async def ask_drain(self) -> None:
        """The drain's confirmation, with its plan read in a worker; assigned here, on the loop."""
        self.ask("drain")
        if self.pending != "drain":
            return
        asked = self.message
        text = await asyncio.get_running_loop().run_in_executor(
            None, self.drain_text, self._current_principal(), self.cluster, list(self.selected))
        if self.pending == "drain" and self.message == asked:  # not cancelled or changed meanwhile
            self.message = asked + text

    def act(self, principal: Principal, cluster: str, action: str, names: list[str]) -> str:
        """Run a confirmed action (blocking: the verb's precheck reads the caches); assigns nothing, so it may
        run in a worker thread, and answers the message to show."""
        verb_name = ACTIONS[action][0]
        try:
            view, _created = getattr(self.service, verb_name)(principal, cluster, request_for(action, names))
            return f"{action} started: {view.id} ({view.kind})"
        except ServiceError as exc:
            return f"refused ({exc.code}): {exc.message}"

    async def confirm(self) -> None:
        action, self.pending = self.pending, ""
        if not action:
            return
        self.busy = True
        try:
            self.message = await asyncio.get_running_loop().run_in_executor(
                None, self.act, self._current_principal(), self.cluster, action, list(self.selected))
        finally:
            self.busy = False


class NodesPane(pn.viewable.Viewer):
    def __init__(self, nodes: Nodes, clusters: Clusters, bus: EventBus, principal: Principal,
                 current_principal: Callable[[], Principal] | None = None, **params: Any) -> None:
        super().__init__(**params)
        self.state = NodesState(nodes, clusters, principal, current_principal)
        self.picker = pn.widgets.Select(label="Cluster", options=[], width=240, css_classes=["nodes-cluster"])
        self.grid = pn.pane.HTML(grid_html([]), sizing_mode="stretch_width", css_classes=["node-grid-pane"])
        self.table = ReadOnlyTable(nodes_frame([]), selectable="checkbox", sizing_mode="stretch_width",
                                   css_classes=["nodes-table"],
                                   empty="No nodes: import a cluster on the Clusters page.")
        self.buttons: dict[str, pn.widgets.Button] = {}
        for action, (_verb, role, _what) in ACTIONS.items():
            button = pn.widgets.Button(label=action.capitalize(), disabled=not principal.allows(role),
                                       color="danger" if role is Role.ADMIN else "default",
                                       css_classes=[f"node-action-{action.replace(' ', '-')}"])
            if not principal.allows(role):
                button.description = f"needs the {role.value} role"
            button.on_click(self._asker(action))
            self.buttons[action] = button
        self.confirm_button = pn.widgets.Button(label="Confirm", color="primary", visible=False,
                                                css_classes=["node-confirm"], loading=self.state.param.busy)
        self.cancel_button = pn.widgets.Button(label="Cancel", visible=False, css_classes=["node-cancel"])
        self.confirm_button.on_click(self._confirm)
        self.cancel_button.on_click(lambda _e: self.state.cancel())
        self.picker.param.watch(self._on_pick, "value")
        self.table.param.watch(self._on_selection, "selection")
        self.state.param.watch(self._on_nodes, "nodes")
        self.state.param.watch(self._on_clusters, ["clusters", "cluster"])
        self.state.param.watch(self._on_pending, "pending")
        self._kube = LiveRefresh(bus, "kube", self._on_kube)
        self._refresh()

    def _asker(self, action: str) -> Callable[[Any], Any]:
        if action == "drain":
            async def ask_drain(_event: Any) -> None:
                await self.state.ask_drain()
            return ask_drain

        def ask(_event: Any) -> None:
            self.state.ask(action)
        return ask

    def _on_nodes(self, event: param.parameterized.Event) -> None:
        self.grid.object = grid_html(event.new)
        self.table.value = nodes_frame(event.new)
        names = [n.name for n in event.new]
        self.table.selection = [names.index(s) for s in self.state.selected if s in names]

    def _on_clusters(self, _event: param.parameterized.Event) -> None:
        self.picker.options = list(self.state.clusters)
        self.picker.value = self.state.cluster or None

    def _on_pick(self, event: param.parameterized.Event) -> None:
        if event.new and event.new != self.state.cluster:
            self.state.cluster, self.state.selected = event.new, []
            self._refresh()

    def _on_selection(self, event: param.parameterized.Event) -> None:
        nodes = self.state.nodes
        self.state.selected = [nodes[i].name for i in event.new if i < len(nodes)]

    def _on_pending(self, event: param.parameterized.Event) -> None:
        self.confirm_button.visible = self.cancel_button.visible = bool(event.new)

    def _on_kube(self, events: list[Event]) -> None:
        if any(e.data.get("cluster") == self.state.cluster and e.data.get("resource") in ("nodes", "pods")
               for e in events):
            self._refresh()

    def _refresh(self) -> None:
        if not self._kube.spawn(self.state.refresh):
            self.state.reload()

    async def _confirm(self, _event: Any) -> None:
        await self.state.confirm()

    def __panel__(self) -> pn.viewable.Viewable:
        return pn.Column(
            pn.pane.Markdown("## Nodes"),
            self.picker,
            self.grid,
            self.table,
            pn.Row(*self.buttons.values()),
            pn.pane.Markdown(self.state.param.message, css_classes=["node-message"]),
            pn.Row(self.confirm_button, self.cancel_button),
            sizing_mode="stretch_width",
        )
