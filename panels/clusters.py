"""Clusters pane: the registered clusters, an import form, one cluster's overview with its nodes coloured
by health, updated live from the informers' watch events (topic ``kube``) — no polling — and the create /
delete pane (``panels/cluster_create.py``), whose Delete targets the selected cluster when it was created here.

The pane holds no rules: it calls the clusters noun's verbs (``services/clusters``), in a worker thread when
served, so the event loop never waits on AWS or Kubernetes.
"""

from __future__ import annotations

import asyncio
import html
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd
import panel as pn
import param

from panels.cluster_create import ClusterCreatePane
from panels.events import EventsPane
from panels.live import LiveRefresh, Newest
from panels.tables import ReadOnlyTable, role_hint
from services.auth import Principal, Role
from services.clusters import Clusters
from services.clusters.events import ClusterTimeline
from services.clusters.models import ClusterDetail, ClusterImport, ClusterSummary, Ownership
from services.errors import ServiceError
from services.events import Event, EventBus
from services.operation_verbs import Operations

LIST_COLUMNS = ["name", "ownership", "eks", "hyperpod", "nodes", "health"]
GROUP_COLUMNS = ["group", "type", "current", "target", "status"]
COLOURS = {"Schedulable": "#1a7f37", "Ready": "#1a7f37", "NotReady": "#6e7781",
           "UnschedulablePendingReboot": "#bf8700", "UnschedulablePendingReplacement": "#cf222e",
           "Unschedulable": "#cf222e"}
READING = "Reading the registered clusters and their nodes…"


def clusters_frame(clusters: list[ClusterSummary]) -> pd.DataFrame:
    rows = [{"name": c.name, "ownership": c.ownership.value, "eks": c.eks_status or "", "hyperpod":
             c.hyperpod_status or "", "nodes": c.nodes,
             "health": ", ".join(f"{k} {v}" for k, v in sorted(c.health.items()))} for c in clusters]
    return pd.DataFrame(rows, columns=LIST_COLUMNS)


def groups_frame(detail: ClusterDetail | None) -> pd.DataFrame:
    rows = [] if detail is None else [
        {"group": g.name, "type": g.instance_type, "current": g.current_count, "target": g.target_count,
         "status": g.status} for g in detail.instance_groups]
    return pd.DataFrame(rows, columns=GROUP_COLUMNS)


def overview_html(detail: ClusterDetail | None) -> str:
    """The cluster's header and its nodes as chips coloured by health (names escaped: they come from the
    cluster)."""
    if detail is None:
        return "<p>Select a cluster to see its nodes.</p>"
    esc = html.escape
    parts = [f"<h3>{esc(detail.name)}</h3><p>EKS <b>{esc(detail.eks_status or '?')}</b> "
             f"(Kubernetes {esc(detail.kubernetes_version or '?')}) · HyperPod <b>{esc(detail.hyperpod_status or '-')}"
             f"</b> · node recovery {esc(detail.node_recovery or '-')}</p>"]
    if detail.error:
        parts.append(f"<p class='cluster-error'>{esc(detail.error)}</p>")
    for group, nodes in sorted(detail.nodes_by_group.items()):
        chips = "".join(
            f"<span class='node-chip' data-health='{esc(n.health or '')}' title='{esc(n.name)}: "
            f"{esc(n.health or ('Ready' if n.ready else 'NotReady'))}, {n.pods} pods, {n.gpus} GPU' "
            f"style='display:inline-block;margin:2px;padding:2px 6px;border-radius:4px;color:white;"
            f"background:{COLOURS.get(n.health or ('Ready' if n.ready else 'NotReady'), '#6e7781')}'>"
            f"{esc(n.name)}</span>" for n in nodes)
        parts.append(f"<p><b>{esc(group or 'outside instance groups')}</b> ({len(nodes)})<br>{chips}</p>")
    if not detail.nodes_by_group:
        parts.append("<p>No nodes yet.</p>")
    return "".join(parts)


@dataclass(frozen=True)
class ClustersRead:
    """One answer of the verbs: the list, the cluster shown (the first when none was chosen) and its detail."""

    clusters: list[ClusterSummary]
    selected: str
    detail: ClusterDetail | None
    error: str = ""


class ClustersState(param.Parameterized):
    clusters = param.List(default=[], item_type=ClusterSummary, doc="registered clusters")
    selected = param.String(default="", doc="the cluster whose overview is shown")
    detail = param.ClassSelector(class_=ClusterDetail, default=None, allow_None=True)
    eks_cluster = param.String(default="", doc="EKS cluster to import")
    hyperpod_cluster = param.String(default="", doc="its HyperPod cluster (optional)")
    message = param.String(default="")
    busy = param.Boolean(default=False)
    reading = param.Boolean(default=False, doc="a read of the verbs is in flight")
    loaded = param.Boolean(default=False, doc="a first answer has been assigned")

    def __init__(self, clusters: Clusters, principal: Principal,
                 current_principal: Callable[[], Principal] | None = None, **params: Any) -> None:
        super().__init__(**params)
        self.service = clusters
        self.principal = principal
        self._current_principal = current_principal or (lambda: principal)
        self._newest = Newest()  # an older answer never overwrites a newer one
        self._in_flight = 0

    def fetch(self, selected: str) -> ClustersRead:
        """Ask the verbs (blocking: AWS on a cache miss, an informer's first sync); assigns nothing, so it may
        run in a worker thread. A cluster no longer listed gives way to the first one."""
        clusters = self.service.list_clusters(self.principal, wait=0)
        if selected not in {c.name for c in clusters}:
            selected = clusters[0].name if clusters else ""
        try:
            detail = self.service.describe_cluster(self.principal, selected, wait=2) if selected else None
        except ServiceError as exc:
            return ClustersRead(clusters, selected, None, f"{exc.code}: {exc.message}")
        return ClustersRead(clusters, selected, detail)

    def apply(self, read: ClustersRead) -> None:
        self.clusters = read.clusters
        self.selected = read.selected
        self.detail = read.detail
        if read.error:
            self.message = read.error
        self.loaded = True

    def reload(self) -> None:
        """Read and assign synchronously: where there is no loop to read on (a script, a synchronous test)."""
        self._newest.read(lambda: self.fetch(self.selected), self.apply)

    async def refresh(self) -> None:
        """Fetch in a worker thread, assign here on the loop; an answer is dropped when the selection changed
        while it was read or a newer read already landed."""
        selected = self.selected
        self._in_flight += 1
        self.reading = True
        try:
            await self._newest.read_in_worker(lambda: self.fetch(selected), self.apply,
                                              lambda: self.selected == selected)
        finally:  # a read that raised must not leave the hint up
            self._in_flight -= 1
            self.reading = self._in_flight > 0

    async def import_cluster(self) -> None:
        self.busy = True
        try:
            request = ClusterImport(eks_cluster=self.eks_cluster.strip(),
                                    hyperpod_cluster=self.hyperpod_cluster.strip() or None)

            def run() -> Any:
                return self.service.import_cluster(self._current_principal(), request)

            view, _created = await asyncio.get_running_loop().run_in_executor(None, run)
            self.message = f"import of {request.eks_cluster} started: {view.id}"
        except ServiceError as exc:
            self.message = f"refused ({exc.code}): {exc.message}"
        except ValueError as exc:  # the request model's own validation
            self.message = f"refused (invalid): {exc}"
        finally:
            self.busy = False


class ClustersPane(pn.viewable.Viewer):
    def __init__(self, clusters: Clusters, bus: EventBus, principal: Principal,
                 current_principal: Callable[[], Principal] | None = None, *, operations: Operations,
                 timeline: ClusterTimeline | None = None, **params: Any) -> None:
        super().__init__(**params)
        self.state = ClustersState(clusters, principal, current_principal)
        self.lifecycle = ClusterCreatePane(clusters, operations, bus, principal, current_principal)
        self.events = EventsPane(timeline, bus, principal) if timeline is not None else None  # the cluster's timeline
        self.table = ReadOnlyTable(clusters_frame(self.state.clusters), selectable=1, sizing_mode="stretch_width",
                                   css_classes=["clusters-table"],
                                   empty="No clusters yet: import one below ('instantstart sandbox seed' makes a "
                                         "ready one in the sandbox).")
        self.groups = ReadOnlyTable(groups_frame(self.state.detail), sizing_mode="stretch_width",
                                    css_classes=["cluster-groups"], empty="No HyperPod instance groups.")
        self.overview = pn.pane.HTML(overview_html(None), sizing_mode="stretch_width",
                                     css_classes=["cluster-overview"])
        self.reading_hint = pn.pane.Markdown(READING, css_classes=["cluster-reading"])  # until the first answer
        operator = principal.allows(Role.OPERATOR)
        self.import_button = pn.widgets.Button(label="Import", color="primary", disabled=not operator,
                                               css_classes=["cluster-import"], loading=self.state.param.busy)
        if not operator:
            self.import_button.description = "needs the operator role"
        self.import_button.on_click(self._import)
        self.role_hint = role_hint(principal, Role.OPERATOR, "Importing a cluster")
        self.table.param.watch(self._on_selection, "selection")
        self.state.param.watch(lambda e: setattr(self.table, "value", clusters_frame(e.new)), "clusters")
        self.state.param.watch(self._on_detail, "detail")
        self.state.param.watch(self._on_loaded, "loaded")
        self._kube = LiveRefresh(bus, "kube", self._on_kube)
        self._ops = LiveRefresh(bus, "operation", self._on_operation)
        self._refresh()  # the first read too: in a session or a notebook the page shows at once, then fills

    def _on_loaded(self, event: param.parameterized.Event) -> None:
        self.reading_hint.visible = not event.new

    def _on_detail(self, event: param.parameterized.Event) -> None:
        self.groups.value = groups_frame(event.new)
        self.overview.object = overview_html(event.new)
        managed = {c.name for c in self.state.clusters if c.ownership is Ownership.MANAGED}
        self.lifecycle.state.target = self.state.selected if self.state.selected in managed else ""
        if self.events is not None:
            self.events.state.cluster = self.state.selected

    def _on_selection(self, event: param.parameterized.Event) -> None:
        if event.new and event.new[0] < len(self.state.clusters):
            self.state.selected = self.state.clusters[event.new[0]].name
            self._refresh()

    def _on_kube(self, events: list[Event]) -> None:
        if any(e.data.get("cluster") == self.state.selected for e in events):
            self._refresh()

    def _on_operation(self, events: list[Event]) -> None:
        if any(str(e.data.get("kind", "")).startswith("cluster.") and e.data.get("status") == "succeeded"
               for e in events):
            self._refresh()

    def _refresh(self) -> None:
        """Read where the pane lives: on its session's or notebook's loop (the verbs in a worker thread), so
        the loop never waits on AWS or an informer; with no loop (a script), here."""
        if not self._kube.spawn(self.state.refresh):
            self.state.reload()

    async def _import(self, _event: Any) -> None:
        await self.state.import_cluster()

    def __panel__(self) -> pn.viewable.Viewable:
        state = self.state
        return pn.Column(
            pn.pane.Markdown("## Clusters"),
            self.table,
            pn.Row(pn.widgets.TextInput.from_param(state.param.eks_cluster, name="EKS cluster", width=220,
                                                   placeholder="hp-eks", css_classes=["import-eks"]),
                   pn.widgets.TextInput.from_param(state.param.hyperpod_cluster, name="HyperPod cluster",
                                                   width=220, placeholder="hp-eks (optional)",
                                                   css_classes=["import-hyperpod"]),
                   self.import_button),
            self.role_hint,
            self.reading_hint,
            pn.pane.Markdown(state.param.message, css_classes=["cluster-message"]),
            self.overview,
            pn.pane.Markdown("**Instance groups**"),
            self.groups,
            *([self.events] if self.events is not None else []),
            self.lifecycle,
            sizing_mode="stretch_width",
        )
