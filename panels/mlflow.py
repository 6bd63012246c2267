"""MLflow pane: one cluster's SageMaker managed MLflow tracking server — its status, a Create button, and a
sign-in link to the MLflow UI once it is Created.

The link is a one-time credential: it is fetched only when the user asks (Open the MLflow UI), shown to that
user, and kept nowhere. The pane holds no rules: the mlflow noun's verbs precheck and run the operation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import panel as pn
import param

from panels.live import Newest
from panels.tables import role_hint
from services.auth import Principal, Role
from services.clusters import Clusters
from services.errors import ServiceError
from services.mlflow import MlflowTracking
from services.mlflow.models import TrackingCreate, TrackingView
from services.operation_verbs import Operations


def status_text(view: TrackingView | None) -> str:
    if view is None:
        return "No cluster registered yet: import or create one first."
    if not view.exists:
        return (f"**{view.name}**: no tracking server. Jobs on {view.cluster} run without MLflow until one is "
                "created (SageMaker takes up to 25 minutes).")
    ready = "ready: jobs get a run" if view.ready else "not ready: jobs run without MLflow meanwhile"
    return f"**{view.name}**: {view.status} ({ready}); size {view.size}, MLflow {view.mlflow_version}\n\n`{view.arn}`"


class MlflowState(param.Parameterized):
    clusters = param.List(default=[])
    cluster = param.String(default="")
    view = param.ClassSelector(class_=TrackingView, default=None, allow_None=True)
    link = param.String(default="", doc="the last sign-in link asked for (one-time, short-lived)")
    message = param.String(default="")

    def __init__(self, mlflow: MlflowTracking, clusters: Clusters, principal: Principal,
                 current_principal: Callable[[], Principal] | None = None, **params: Any) -> None:
        super().__init__(**params)
        self.service = mlflow
        self.cluster_service = clusters
        self.principal = principal
        self._current_principal = current_principal or (lambda: principal)
        self._newest = Newest()

    def fetch(self, cluster: str) -> tuple[list[str], str, TrackingView | None, str]:
        """Ask the verbs (blocking: a SageMaker read); assigns nothing, so it may run in a worker."""
        names = [c.name for c in self.cluster_service.list_clusters(self.principal, wait=0)]
        if cluster not in names:
            cluster = names[0] if names else ""
        if not cluster:
            return names, cluster, None, ""
        try:
            return names, cluster, self.service.describe_tracking(self.principal, cluster), ""
        except ServiceError as exc:
            return names, cluster, None, f"{exc.code}: {exc.message}"

    def assign(self, read: tuple[list[str], str, TrackingView | None, str]) -> None:
        self.clusters, self.cluster, self.view, error = read
        self.link = ""
        if error:
            self.message = error

    def reload(self) -> None:
        self._newest.read(lambda: self.fetch(self.cluster), self.assign)

    async def refresh(self) -> None:
        cluster = self.cluster
        await self._newest.read_in_worker(lambda: self.fetch(cluster), self.assign)

    def create(self) -> str:
        try:
            view, _ = self.service.create_tracking(self._current_principal(), self.cluster, TrackingCreate())
        except ServiceError as exc:
            return f"refused ({exc.code}): {exc.message}"
        return f"mlflow.create started: {view.id}"

    def sign_in(self) -> tuple[str, str]:
        try:
            return self.service.presigned_url(self._current_principal(), self.cluster).url, ""
        except ServiceError as exc:
            return "", f"refused ({exc.code}): {exc.message}"


class MlflowPane(pn.viewable.Viewer):
    def __init__(self, mlflow: MlflowTracking, clusters: Clusters, operations: Operations, principal: Principal,
                 current_principal: Callable[[], Principal] | None = None, **params: Any) -> None:
        super().__init__(**params)
        self.state = MlflowState(mlflow, clusters, principal, current_principal)
        operator = principal.allows(Role.OPERATOR)
        self.cluster_select = pn.widgets.Select(name="Cluster", options=[], width=240)
        self.status = pn.pane.Markdown(status_text(None), css_classes=["mlflow-status"])
        self.create_button = pn.widgets.Button(label="Create tracking server", color="primary", disabled=True,
                                               css_classes=["mlflow-create"])
        self.link_button = pn.widgets.Button(label="Open the MLflow UI", disabled=True, css_classes=["mlflow-link"])
        self.link = pn.pane.Markdown("", css_classes=["mlflow-ui-link"])
        self.refresh_button = pn.widgets.Button(label="Refresh", css_classes=["mlflow-refresh"])
        self.role_hint = role_hint(principal, Role.OPERATOR, "Creating the tracking server")
        self._operator = operator
        self.create_button.on_click(self._create)
        self.link_button.on_click(self._sign_in)
        self.refresh_button.on_click(self._refresh)
        self.cluster_select.param.watch(self._on_cluster, "value")
        self.state.param.watch(self._on_view, ["view", "clusters"])
        self.state.param.watch(lambda e: setattr(self.link, "object", f"[Open the MLflow UI]({e.new}) (one-time "
                                                 "link, open it within 5 minutes)" if e.new else ""), "link")
        self.state.reload()

    def _on_view(self, _event: Any) -> None:
        view = self.state.view
        self.cluster_select.options = list(self.state.clusters)
        self.cluster_select.value = self.state.cluster
        self.status.object = status_text(view)
        self.create_button.disabled = not self._operator or view is None or view.exists
        self.link_button.disabled = not self._operator or view is None or not view.ready

    def _on_cluster(self, event: Any) -> None:
        if event.new and event.new != self.state.cluster:
            self.state.cluster = event.new
            self.state.reload()

    async def _refresh(self, _event: Any) -> None:
        await self.state.refresh()

    async def _create(self, _event: Any) -> None:
        self.state.message = await asyncio.get_running_loop().run_in_executor(None, self.state.create)
        await self._refresh(None)

    async def _sign_in(self, _event: Any) -> None:
        link, error = await asyncio.get_running_loop().run_in_executor(None, self.state.sign_in)
        self.state.link, self.state.message = link, error

    def __panel__(self) -> pn.viewable.Viewable:
        return pn.Column(
            pn.pane.Markdown("## MLflow"),
            self.cluster_select,
            self.status,
            pn.Row(self.create_button, self.link_button, self.refresh_button),
            self.link,
            self.role_hint,
            pn.pane.Markdown(self.state.param.message, css_classes=["mlflow-message"]),
            sizing_mode="stretch_width",
        )
