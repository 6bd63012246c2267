"""Advanced Features pane: one cluster's managed features as toggles, and the stages of the last change.

Toggling marks a feature as touched; Apply sends only the touched fields (the explicit diff of
``PATCH /api/v1/clusters/{cluster}/features``), never the whole list, so a feature someone else changed
meanwhile is left alone. A foreign feature (installed by someone else) shows as such and its toggle is
disabled: adopting it is an explicit request (REST or MCP). The pane holds no rules: the features noun's verbs
precheck and run the operation; the pane follows its stages from the bus (topic ``operation``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pandas as pd
import panel as pn
import param

from panels.live import LiveRefresh, Newest
from panels.tables import ReadOnlyTable, role_hint
from services.auth import Principal, Role
from services.clusters import Clusters
from services.errors import ServiceError
from services.events import Event, EventBus
from services.features import KIND, Features, FeaturesPatch
from services.features.models import FeatureView
from services.operation_verbs import Operations
from services.operation_views import OperationView

FEATURE_COLUMNS = ["feature", "enabled", "status", "healthy", "version", "depends on", "required by"]
STAGE_COLUMNS = ["stage", "status", "changed", "message"]


def features_frame(features: list[FeatureView]) -> pd.DataFrame:
    rows = [{"feature": f.name, "enabled": "foreign" if f.foreign else ("on" if f.enabled else "off"),
             "status": f.status, "healthy": f.healthy, "version": f.version, "depends on": ", ".join(f.depends_on),
             "required by": ", ".join(f.required_by)} for f in features]
    return pd.DataFrame(rows, columns=FEATURE_COLUMNS)


def stages_frame(view: OperationView | None) -> pd.DataFrame:
    rows = [] if view is None else [{"stage": s.name, "status": s.status.value, "changed": s.acted,
                                     "message": s.message} for s in view.stages]
    return pd.DataFrame(rows, columns=STAGE_COLUMNS)


class FeaturesState(param.Parameterized):
    clusters = param.List(default=[], doc="registered cluster names")
    cluster = param.String(default="", doc="the cluster whose features are shown")
    features = param.List(default=[], item_type=FeatureView)
    wanted = param.Dict(default={}, doc="feature -> on/off as the toggles say")
    operation = param.ClassSelector(class_=OperationView, default=None, allow_None=True,
                                    doc="the last change sent from here")
    message = param.String(default="")
    busy = param.Boolean(default=False)

    def __init__(self, features: Features, clusters: Clusters, operations: Operations, principal: Principal,
                 current_principal: Callable[[], Principal] | None = None, **params: Any) -> None:
        super().__init__(**params)
        self.service = features
        self.cluster_service = clusters
        self.operations = operations
        self.principal = principal
        self._current_principal = current_principal or (lambda: principal)
        self._newest = Newest()

    def touched(self) -> dict[str, bool]:
        """Only the toggles that differ from the cluster's actual state: what Apply sends."""
        actual = {f.name: f.enabled for f in self.features}
        return {name: on for name, on in self.wanted.items() if name in actual and actual[name] is not on}

    def fetch(self, cluster: str) -> tuple[list[str], str, list[FeatureView], str]:
        """Ask the verbs (blocking: AWS and Kubernetes reads); assigns nothing, so it may run in a worker."""
        names = [c.name for c in self.cluster_service.list_clusters(self.principal, wait=0)]
        if cluster not in names:
            cluster = names[0] if names else ""
        if not cluster:
            return names, cluster, [], ""
        try:
            return names, cluster, self.service.list_features(self.principal, cluster).features, ""
        except ServiceError as exc:
            return names, cluster, [], f"{exc.code}: {exc.message}"

    def assign(self, read: tuple[list[str], str, list[FeatureView], str]) -> None:
        self.clusters, self.cluster, self.features, error = read
        self.wanted = {f.name: f.enabled for f in self.features}
        if error:
            self.message = error

    def reload(self) -> None:
        self._newest.read(lambda: self.fetch(self.cluster), self.assign)

    async def refresh(self) -> None:
        cluster = self.cluster
        await self._newest.read_in_worker(lambda: self.fetch(cluster), self.assign, lambda: self.cluster == cluster)

    def follow(self) -> None:
        """The last operation's stages as they are now (an event said it moved)."""
        if self.operation is not None:
            self.operation = self.operations.get_operation(self.principal, self.operation.id)

    def submit(self) -> OperationView:
        body = FeaturesPatch(**self.touched())
        view, _ = self.service.update_features(self._current_principal(), self.cluster, body)
        return view

    async def apply_changes(self) -> None:
        if not self.touched():
            self.message = "nothing to change: toggle a feature first"
            return
        self.busy = True
        try:
            self.operation = await asyncio.get_running_loop().run_in_executor(None, self.submit)
            self.message = f"{KIND} started: {self.operation.id}"
        except ServiceError as exc:
            self.message = f"refused ({exc.code}): {exc.message}"
        finally:
            self.busy = False


class FeaturesPane(pn.viewable.Viewer):
    def __init__(self, features: Features, clusters: Clusters, operations: Operations, bus: EventBus,
                 principal: Principal, current_principal: Callable[[], Principal] | None = None,
                 **params: Any) -> None:
        super().__init__(**params)
        self.state = FeaturesState(features, clusters, operations, principal, current_principal)
        self.operator = principal.allows(Role.OPERATOR)
        self.table = ReadOnlyTable(features_frame([]), sizing_mode="stretch_width", css_classes=["features-table"],
                                   empty="No cluster registered yet: import or create one first.")
        self.stages = ReadOnlyTable(stages_frame(None), sizing_mode="stretch_width", css_classes=["feature-stages"],
                                    empty="The stages of the last change show here.")
        self.toggles = pn.FlexBox(css_classes=["feature-toggles"])
        self.cluster_select = pn.widgets.Select(name="Cluster", options=[], width=240)
        self.apply_button = pn.widgets.Button(label="Apply", color="primary", disabled=not self.operator,
                                              css_classes=["features-apply"], loading=self.state.param.busy)
        self.apply_button.on_click(self._apply)
        self.role_hint = role_hint(principal, Role.OPERATOR, "Changing features")
        self.cluster_select.param.watch(self._on_cluster, "value")
        self.state.param.watch(self._on_features, "features")
        self.state.param.watch(self._on_clusters, "clusters")
        self.state.param.watch(lambda e: setattr(self.stages, "value", stages_frame(e.new)), "operation")
        self._ops = LiveRefresh(bus, "operation", self._on_operation)
        self._refresh()

    def _on_clusters(self, event: param.parameterized.Event) -> None:
        self.cluster_select.options = list(event.new)
        self.cluster_select.value = self.state.cluster

    def _on_cluster(self, event: param.parameterized.Event) -> None:
        if event.new and event.new != self.state.cluster:
            self.state.cluster = event.new
            self._refresh()

    def _on_features(self, event: param.parameterized.Event) -> None:
        self.table.value = features_frame(event.new)
        switches = []
        for f in event.new:
            switch = pn.widgets.Switch(name=f.name, value=f.enabled, disabled=f.foreign or not self.operator,
                                       css_classes=[f"feature-{f.name}"])
            switch.param.watch(lambda e, name=f.name: self._on_toggle(name, e.new), "value")
            switches.append(pn.Column(pn.pane.Markdown(f"**{f.name}**" + (" (foreign)" if f.foreign else "")),
                                      switch, width=230))
        self.toggles.objects = switches

    def _on_toggle(self, name: str, on: bool) -> None:
        self.state.wanted = {**self.state.wanted, name: on}

    def _on_operation(self, events: list[Event]) -> None:
        current = self.state.operation
        if current is None or not any(e.data.get("id") == current.id for e in events):
            return
        self.state.follow()
        if self.state.operation is not None and self.state.operation.status.value in ("succeeded", "failed",
                                                                                      "cancelled"):
            self._refresh()

    def _refresh(self) -> None:
        if not self._ops.spawn(self.state.refresh):
            self.state.reload()

    async def _apply(self, _event: Any) -> None:
        await self.state.apply_changes()

    def __panel__(self) -> pn.viewable.Viewable:
        return pn.Column(
            pn.pane.Markdown("## Advanced features"),
            self.cluster_select,
            self.table,
            pn.pane.Markdown("Toggle, then Apply: only what you changed is sent. Prerequisites turn on first; a "
                             "feature others depend on cannot be turned off while they are on."),
            self.toggles,
            pn.Row(self.apply_button),
            self.role_hint,
            pn.pane.Markdown(self.state.param.message, css_classes=["features-message"]),
            pn.pane.Markdown("**Stages of the last change**"),
            self.stages,
            sizing_mode="stretch_width",
        )
