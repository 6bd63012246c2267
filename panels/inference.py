"""Inference pane: deploy a model with vLLM or SGLang from its serve command (preview first: the Deployment and
Service the API server accepted), a table of the cluster's deployments (phase, replicas, Service address), and a
test console that sends one chat request to the selected deployment through the control plane. Redrawn from
operation events of the ``inference.*`` kinds (topic ``operation``), no polling.

The pane holds no rules: it calls the inference noun's verbs (``services/inference``), in a worker thread when
served, so the event loop never waits on Kubernetes; the verbs check the role again.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pandas as pd
import panel as pn
import param
import yaml
from pydantic import SecretStr, ValidationError

from panels.inference_managed import ManagedSection
from panels.inference_obs import InferenceObs
from panels.inference_pool import PoolBoard
from panels.inference_router import RouterSection
from panels.inference_scaling import ScalingPanel
from panels.live import LiveRefresh
from panels.refusals import refused
from panels.scoped import ClusterScoped, ScopedPane
from panels.tables import ReadOnlyTable
from services.auth import Principal, Role
from services.clusters import Clusters
from services.errors import ServiceError
from services.events import Event, EventBus
from services.inference import DELETE_KIND, DEPLOY_KIND, UPDATE_KIND, Inference
from services.inference.managed import ManagedEndpoints
from services.inference.models import (
    INFERENCE_NAMESPACE,
    DeploymentRequest,
    DeploymentView,
    EndpointTest,
    Exposure,
    ServiceSpec,
)
from services.inference.pool import Pools
from services.inference.router import Routers
from services.inference.scaling import InferenceScaling

COLUMNS = ["name", "namespace", "engine", "model", "phase", "replicas", "gpus", "service", "message"]
KINDS = {DEPLOY_KIND, UPDATE_KIND, DELETE_KIND}


def _address(d: DeploymentView) -> str:
    if d.service is None:
        return ""
    return f"{d.service.type} {d.service.address or d.service.cluster_ip or ''}:{d.service.port}"


def deployments_frame(deployments: list[DeploymentView]) -> pd.DataFrame:
    rows = [{"name": d.name, "namespace": d.namespace, "engine": d.engine or "", "model": d.model or "",
             "phase": d.phase, "replicas": f"{d.available}/{d.replicas}", "gpus": d.gpus or "",
             "service": _address(d), "message": d.message} for d in deployments]
    return pd.DataFrame(rows, columns=COLUMNS)


class InferenceState(ClusterScoped):
    items_param = "deployments"

    deployments = param.List(default=[], item_type=DeploymentView)
    deployment = param.String(default="", doc="the new deployment's name")
    command = param.String(default="", doc="the serve command, e.g. vllm serve Qwen/Qwen2.5-0.5B-Instruct")
    gpus = param.Integer(default=1, bounds=(1, 64), doc="GPUs per replica")
    replicas = param.Integer(default=1, bounds=(1, 64))
    namespace = param.String(default=INFERENCE_NAMESPACE)
    exposure: param.Selector[str] = param.Selector(default=Exposure.CLUSTER.value, objects=[e.value for e in Exposure])
    selected = param.String(default="", doc="the deployment chosen in the table")
    prompt = param.String(default="Say hello in one short sentence.")
    preview = param.String(default="", doc="the previewed manifests as YAML")
    answer = param.String(default="", doc="the last test answer")

    def __init__(self, inference: Inference, clusters: Clusters, principal: Principal,
                 current_principal: Callable[[], Principal] | None = None, **params: Any) -> None:
        super().__init__(clusters, principal, current_principal,
                         lambda who, cluster: list(inference.list_deployments(who, cluster).deployments), **params)
        self.service = inference

    def request(self, token: str) -> DeploymentRequest:
        return DeploymentRequest(name=self.deployment, command=self.command, gpus=self.gpus, replicas=self.replicas,
                                 namespace=self.namespace, hf_token=SecretStr(token) if token else None,
                                 service=ServiceSpec(exposure=Exposure(self.exposure)))

    def do_preview(self, principal: Principal, cluster: str) -> tuple[str, str]:
        """(message, manifests as YAML) for the form as it is (blocking: the checks read the cluster)."""
        try:
            shown = self.service.preview_deployment(principal, cluster, self.request(""))
        except (ValidationError, ServiceError) as exc:
            return refused(exc), ""
        note = f"{shown.engine.value} serving {shown.api_model} on port {shown.port} " \
               f"(tensor-parallel {shown.tensor_parallel}, pipeline-parallel {shown.pipeline_parallel})"
        return "; ".join([note, *shown.warnings]), yaml.safe_dump_all(shown.manifests, sort_keys=False)

    def deploy(self, principal: Principal, cluster: str, token: str) -> str:
        try:
            view, _created = self.service.deploy(principal, cluster, self.request(token))
        except (ValidationError, ServiceError) as exc:
            return refused(exc)
        return f"deploying {self.deployment} ({view.id}); the table shows it once its pods start"

    def delete(self, principal: Principal, cluster: str, name: str) -> str:
        try:
            view, _created = self.service.delete_deployment(principal, cluster, name)
        except ServiceError as exc:
            return refused(exc)
        return f"deleting {name} ({view.id})"

    def test(self, principal: Principal, cluster: str, name: str) -> tuple[str, str]:
        try:
            result = self.service.test_deployment(principal, cluster, name, EndpointTest(prompt=self.prompt))
        except (ValidationError, ServiceError) as exc:
            return refused(exc), ""
        shown = result.text if result.text is not None else json.dumps(result.answer, indent=1)[:4000]
        return f"HTTP {result.status} in {result.elapsed_ms} ms", shown


class InferencePane(ScopedPane, pn.viewable.Viewer):
    def __init__(self, inference: Inference, clusters: Clusters, bus: EventBus, principal: Principal,
                 current_principal: Callable[[], Principal] | None = None, scaling: InferenceScaling | None = None,
                 managed: ManagedEndpoints | None = None, routers: Routers | None = None,
                 pools: Pools | None = None,
                 **params: Any) -> None:
        super().__init__(**params)
        self.state = InferenceState(inference, clusters, principal, current_principal)
        # the managed path's section (panels/inference_managed.py), following this pane's cluster picker
        self.managed = ManagedSection(managed, clusters, bus, principal, current_principal) if managed else None
        self.routers = RouterSection(routers, self.state, bus, principal, lambda: self.state.selected) \
            if routers is not None else None
        self.pool_board = PoolBoard(pools, clusters, bus, principal, current_principal, follow=self.state,
                                    routers=routers) \
            if pools is not None else None
        s = self.state.param
        self.picker = pn.widgets.Select(label="Cluster", options=[], width=240, css_classes=["inference-cluster"])
        self.deployment = pn.widgets.TextInput.from_param(s.deployment, name="Name", placeholder="chat")
        self.command = pn.widgets.TextAreaInput.from_param(s.command, name="Serve command", height=70,
                                                           placeholder="vllm serve Qwen/Qwen2.5-0.5B-Instruct")
        self.gpus = pn.widgets.IntInput.from_param(s.gpus, name="GPUs per replica", width=140)
        self.replicas = pn.widgets.IntInput.from_param(s.replicas, name="Replicas", width=120)
        self.namespace = pn.widgets.TextInput.from_param(s.namespace, name="Namespace")
        self.exposure = pn.widgets.RadioButtonGroup.from_param(s.exposure, name="Service")
        # the token lives only in this widget until it is sent; it is cleared right after
        self.token = pn.widgets.PasswordInput(label="Hugging Face token (gated models)", placeholder="hf_…")
        operator = principal.allows(Role.OPERATOR)
        self.scaling = ScalingPanel(scaling, lambda: (self.state.current(), self.state.cluster, self.state.selected),
                                    operator) if scaling is not None else None
        self.preview_button = pn.widgets.Button(label="Preview", disabled=not operator,
                                                css_classes=["inference-preview"], loading=s.busy)
        self.deploy_button = pn.widgets.Button(label="Deploy", color="primary", disabled=not operator,
                                               css_classes=["inference-deploy"], loading=s.busy)
        self.delete_button = pn.widgets.Button(label="Delete selected", disabled=not operator,
                                               css_classes=["inference-delete"])
        self.prompt = pn.widgets.TextInput.from_param(s.prompt, name="Prompt")
        self.test_button = pn.widgets.Button(label="Send", disabled=not operator, css_classes=["inference-test"])
        if not operator:
            for button in (self.preview_button, self.deploy_button, self.delete_button, self.test_button):
                button.description = "needs the operator role"
        self.table = ReadOnlyTable(deployments_frame([]), selectable=1, sizing_mode="stretch_width",
                                   css_classes=["inference-table"], empty="No deployments yet.")
        for button, handler in ((self.preview_button, self._preview), (self.deploy_button, self._deploy),
                                (self.delete_button, self._delete), (self.test_button, self._test)):
            button.on_click(handler)
        self.picker.param.watch(self._on_pick, "value")
        self.table.param.watch(self._on_selection, "selection")
        s.watch(self._on_deployments, "deployments")
        s.watch(self._on_clusters, ["clusters", "cluster"])
        self._ops = LiveRefresh(bus, "operation", self._on_operation)
        self.obs = InferenceObs(inference, self.state.current, lambda: self.state.cluster, lambda: self.state.selected)
        self._refresh()

    def _on_deployments(self, event: param.parameterized.Event) -> None:
        self.table.value = deployments_frame(event.new)

    def _on_pick(self, event: param.parameterized.Event) -> None:
        if event.new and event.new != self.state.cluster:
            self.state.cluster = event.new
            self._refresh()
        if self.managed is not None and event.new:
            self.managed.follow(event.new)

    def _on_selection(self, event: param.parameterized.Event) -> None:
        rows = self.state.deployments
        self.state.selected = rows[event.new[0]].name if event.new and event.new[0] < len(rows) else ""

    def _on_operation(self, events: list[Event]) -> None:
        if any(e.data.get("kind") in KINDS for e in events):
            self._refresh()
        if self.scaling is not None:
            self.scaling.changed({str(e.data.get("kind")) for e in events})

    async def _deploy(self, _event: Any) -> None:
        await self._submit(self.state.deploy)

    async def _delete(self, _event: Any) -> None:
        if not self.state.selected:
            self.state.message = "Select a deployment in the table first."
            return
        self.state.message = await self._run(self.state.delete, self.state.selected)
        await self.state.refresh()

    async def _test(self, _event: Any) -> None:
        if not self.state.selected:
            self.state.message = "Select a deployment in the table first."
            return
        self.state.message, self.state.answer = await self._run(self.state.test, self.state.selected)

    def __panel__(self) -> pn.viewable.Viewable:
        return pn.Column(
            pn.pane.Markdown("## Inference\nServe a model with vLLM or SGLang: paste the command you would run on a "
                             "GPU box; every flag is checked against the engine's. Models downloaded to the shared "
                             "bucket are under `/s3/models/<org>--<name>/`."),
            self.picker,
            pn.Row(self.deployment, self.namespace, self.gpus, self.replicas),
            self.command,
            pn.Row(self.exposure, self.token, self.preview_button, self.deploy_button),
            pn.pane.Markdown(self.state.param.message, css_classes=["inference-message"]),
            pn.Accordion(("Preview", pn.widgets.TextAreaInput.from_param(self.state.param.preview, name="",
                                                                         disabled=True, height=300))),
            self.table,
            self.delete_button,
            pn.pane.Markdown("### Test console"),
            pn.Row(self.prompt, self.test_button),
            pn.pane.Markdown(self.state.param.answer, css_classes=["inference-answer"]),
            self.obs,
            *([self.scaling] if self.scaling is not None else []),
            *([self.managed] if self.managed is not None else []),
            *([self.routers] if self.routers is not None else []),
            *([self.pool_board] if self.pool_board is not None else []),
            sizing_mode="stretch_width",
        )
