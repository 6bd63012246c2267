"""Model downloads pane: start a Hugging Face model download onto a cluster's shared bucket (model id, revision,
namespace, an optional token that is never shown again), and a table of the cluster's downloads with their
phase and progress (files, bytes) and a cancel for a running one. Redrawn from operation events of kind
``model.download`` (topic ``operation``), no polling.

The pane holds no rules: it calls the downloads noun's verbs (``services/training/downloads``), in a worker
thread when served, so the event loop never waits on Kubernetes; the verbs check the role again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd
import panel as pn
import param
from pydantic import SecretStr, ValidationError

from panels.live import LiveRefresh
from panels.scoped import ClusterScoped, ScopedPane
from panels.tables import ReadOnlyTable
from services.auth import Principal, Role
from services.clusters import Clusters
from services.errors import ServiceError
from services.events import Event, EventBus
from services.training.downloads import KIND, Downloads
from services.training.downloads.models import DEFAULT_NAMESPACE, DownloadRequest, DownloadView

COLUMNS = ["id", "model", "phase", "files", "bytes", "destination", "message"]


def downloads_frame(downloads: list[DownloadView]) -> pd.DataFrame:
    rows = [{"id": d.id, "model": d.model + (f"@{d.revision}" if d.revision else ""), "phase": d.phase.value,
             "files": f"{d.progress.files_done}/{d.progress.files_total}" if d.progress.files_total else "",
             "bytes": f"{d.progress.bytes_done:,}", "destination": d.destination, "message": d.message}
            for d in downloads]
    return pd.DataFrame(rows, columns=COLUMNS)


class DownloadsState(ClusterScoped):
    items_param = "downloads"

    downloads = param.List(default=[], item_type=DownloadView)
    model = param.String(default="", doc="Hugging Face model id, org/name")
    revision = param.String(default="", doc="branch, tag or commit (empty: main)")
    namespace = param.String(default=DEFAULT_NAMESPACE)
    selected = param.String(default="", doc="the download chosen in the table")

    def __init__(self, downloads: Downloads, clusters: Clusters, principal: Principal,
                 current_principal: Callable[[], Principal] | None = None, **params: Any) -> None:
        super().__init__(clusters, principal, current_principal,
                         lambda who, cluster: list(downloads.list_downloads(who, cluster).downloads), **params)
        self.service = downloads

    def start(self, principal: Principal, cluster: str, token: str) -> str:
        """Submit the download (blocking: the precheck reads the cluster); answers the message to show."""
        try:
            request = DownloadRequest(model=self.model, revision=self.revision or None, namespace=self.namespace,
                                      hf_token=SecretStr(token) if token else None)
            view, _created = self.service.download_model(principal, cluster, request)
        except ValidationError as exc:
            return "invalid: " + "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        except ServiceError as exc:
            return f"refused ({exc.code}): {exc.message}"
        return f"download started: {view.request.get('id')} ({view.id}); the files go to " \
               f"/s3/models/{self.model.replace('/', '--')}"

    def cancel(self, principal: Principal, cluster: str, download_id: str) -> str:
        try:
            view = self.service.cancel_download(principal, cluster, download_id)
        except ServiceError as exc:
            return f"refused ({exc.code}): {exc.message}"
        return f"{view.id} cancelled; files already copied stay in the bucket"


class DownloadsPane(ScopedPane, pn.viewable.Viewer):
    def __init__(self, downloads: Downloads, clusters: Clusters, bus: EventBus, principal: Principal,
                 current_principal: Callable[[], Principal] | None = None, **params: Any) -> None:
        super().__init__(**params)
        self.state = DownloadsState(downloads, clusters, principal, current_principal)
        self.picker = pn.widgets.Select(label="Cluster", options=[], width=240, css_classes=["downloads-cluster"])
        self.model = pn.widgets.TextInput.from_param(self.state.param.model, name="Model (org/name)",
                                                     placeholder="Qwen/Qwen2.5-0.5B-Instruct")
        self.revision = pn.widgets.TextInput.from_param(self.state.param.revision, name="Revision",
                                                        placeholder="main")
        self.namespace = pn.widgets.TextInput.from_param(self.state.param.namespace, name="Namespace")
        # the token lives only in this widget until it is sent; it is cleared right after
        self.token = pn.widgets.PasswordInput(label="Hugging Face token (gated models)", placeholder="hf_…")
        operator = principal.allows(Role.OPERATOR)
        self.start_button = pn.widgets.Button(label="Download", color="primary", disabled=not operator,
                                              css_classes=["download-start"], loading=self.state.param.busy)
        self.cancel_button = pn.widgets.Button(label="Cancel selected", disabled=not operator,
                                               css_classes=["download-cancel"])
        if not operator:
            self.start_button.description = self.cancel_button.description = "needs the operator role"
        self.table = ReadOnlyTable(downloads_frame([]), selectable=1, sizing_mode="stretch_width",
                                   css_classes=["downloads-table"], empty="No downloads yet.")
        self.start_button.on_click(self._start)
        self.cancel_button.on_click(self._cancel)
        self.picker.param.watch(self._on_pick, "value")
        self.table.param.watch(self._on_selection, "selection")
        self.state.param.watch(self._on_downloads, "downloads")
        self.state.param.watch(self._on_clusters, ["clusters", "cluster"])
        self._ops = LiveRefresh(bus, "operation", self._on_operation)
        self._refresh()

    def _on_downloads(self, event: param.parameterized.Event) -> None:
        self.table.value = downloads_frame(event.new)

    def _on_pick(self, event: param.parameterized.Event) -> None:
        if event.new and event.new != self.state.cluster:
            self.state.cluster = event.new
            self._refresh()

    def _on_selection(self, event: param.parameterized.Event) -> None:
        rows = self.state.downloads
        self.state.selected = rows[event.new[0]].id if event.new and event.new[0] < len(rows) else ""

    def _on_operation(self, events: list[Event]) -> None:
        if any(e.data.get("kind") == KIND for e in events):
            self._refresh()

    async def _start(self, _event: Any) -> None:
        await self._submit(self.state.start)

    async def _cancel(self, _event: Any) -> None:
        if not self.state.selected:
            self.state.message = "Select a running download in the table first."
            return
        self.state.message = await self._run(self.state.cancel, self.state.selected)
        await self.state.refresh()

    def __panel__(self) -> pn.viewable.Viewable:
        return pn.Column(
            pn.pane.Markdown("## Model downloads\nFiles land on the shared bucket: pods see them under "
                             "`/s3/models/<org>--<name>/`."),
            self.picker,
            pn.Row(self.model, self.revision, self.namespace),
            pn.Row(self.token, self.start_button),
            self.table,
            self.cancel_button,
            pn.pane.Markdown(self.state.param.message, css_classes=["download-message"]),
            sizing_mode="stretch_width",
        )
