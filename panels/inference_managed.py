"""Managed endpoints section of the inference pane: the cluster's HyperPod inference operator endpoints
(InferenceEndpointConfig and JumpStartModel: the operator's state, replicas, autoscaling bounds, routing, KV
cache), a request editor (the same JSON body as ``inference_endpoints_deploy``) with preview and deploy, new
autoscaling bounds or a Prometheus metric trigger for the selected endpoint (the replicas its autoscaler asks for
show as ``scaled_to``), a test request and delete. Redrawn from operation events of the
``managed.*`` kinds, no polling; renders alone in a notebook.

The section holds no rules: it calls the managed endpoints' verbs (``services/inference/managed.py``) in a worker
thread, and the verbs check the role again. A Hugging Face token lives only in its password widget until sent.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pandas as pd
import panel as pn
import param
import yaml
from pydantic import ValidationError

from panels.live import LiveRefresh
from panels.refusals import refused
from panels.scoped import ClusterScoped, ScopedPane
from panels.tables import ReadOnlyTable
from services.auth import Principal, Role
from services.clusters import Clusters
from services.errors import ServiceError
from services.events import Event, EventBus
from services.inference.managed import DELETE_KIND, DEPLOY_KIND, UPDATE_KIND, ManagedEndpoints
from services.inference.managed_models import (
    Autoscaling,
    EndpointRequest,
    EndpointUpdate,
    EndpointView,
    PrometheusTrigger,
)
from services.inference.models import EndpointTest

COLUMNS = ["name", "kind", "state", "replicas", "scaled_to", "autoscaling", "routing", "kv_cache", "model", "message"]
KINDS = {DEPLOY_KIND, UPDATE_KIND, DELETE_KIND}
EXAMPLE = {"name": "llama", "source": {"type": "s3", "bucket": "my-models", "region": "us-west-2",
                                       "location": "llama31_8b"},
           "worker": {"image": "lmcache/vllm-openai:v0.3.7", "args": ["/opt/ml/model", "--max-model-len", "4096"],
                      "port": 8000, "gpus": 1},
           "instance_types": ["ml.g5.8xlarge"], "autoscaling": {"min_replicas": 1, "max_replicas": 2}}


def _scaling(scaling: Autoscaling | None) -> str:
    if scaling is None:
        return ""
    triggers = [f"{t.name} ≥ {t.target_value:g}" for t in scaling.prometheus] + \
        [f"{t.namespace}/{t.metric_name} ≥ {t.target_value:g}" for t in scaling.cloudwatch]
    return f"{scaling.min_replicas}-{scaling.max_replicas}" + (f" on {', '.join(triggers)}" if triggers else "")


def endpoints_frame(endpoints: list[EndpointView]) -> pd.DataFrame:
    rows = [{"name": e.name, "kind": e.kind.value, "state": e.state or "", "replicas": f"{e.available}/{e.replicas}",
             "scaled_to": "" if e.scaled_to is None else str(e.scaled_to), "autoscaling": _scaling(e.autoscaling),
             "routing": e.routing or "", "kv_cache": e.kv_cache or "", "model": e.model or "", "message": e.message}
            for e in endpoints]
    return pd.DataFrame(rows, columns=COLUMNS)


class ManagedState(ClusterScoped):
    items_param = "endpoints"

    endpoints = param.List(default=[], item_type=EndpointView)
    body = param.String(default=json.dumps(EXAMPLE, indent=1), doc="the deploy request as JSON (no token)")
    selected = param.String(default="", doc="the endpoint chosen in the table")
    min_replicas = param.Integer(default=1, bounds=(0, 100))
    max_replicas = param.Integer(default=2, bounds=(1, 100))
    query = param.String(default="", doc="a PromQL query the operator's KEDA scales the selected endpoint on")
    target = param.Number(default=1.0, doc="the query's value one model pod should carry")
    prompt = param.String(default="Say hello in one short sentence.")
    preview = param.String(default="", doc="the previewed resource as YAML")
    answer = param.String(default="", doc="the last test answer")

    def __init__(self, managed: ManagedEndpoints, clusters: Clusters, principal: Principal,
                 current_principal: Callable[[], Principal] | None = None, **params: Any) -> None:
        super().__init__(clusters, principal, current_principal,
                         lambda who, cluster: list(managed.list_endpoints(who, cluster).endpoints), **params)
        self.service = managed

    def request(self, token: str) -> EndpointRequest:
        body = json.loads(self.body)
        if token and isinstance(body, dict) and (body.get("source") or {}).get("type") == "huggingface":
            body["source"] = {**body["source"], "hf_token": token}
        return EndpointRequest.model_validate(body)

    def do_preview(self, principal: Principal, cluster: str) -> tuple[str, str]:
        try:
            shown = self.service.preview_endpoint(principal, cluster, self.request(""))
        except (ValidationError, ServiceError, ValueError) as exc:
            return refused(exc), ""
        return "; ".join([f"{shown.kind.value} accepted", *shown.warnings]), yaml.safe_dump(shown.manifest,
                                                                                            sort_keys=False)

    def deploy(self, principal: Principal, cluster: str, token: str) -> str:
        try:
            request = self.request(token)
            view, _created = self.service.deploy_endpoint(principal, cluster, request)
        except (ValidationError, ServiceError, ValueError) as exc:
            return refused(exc)
        return f"deploying {request.name} ({view.id}); the table shows the operator's state"

    def scale(self, principal: Principal, cluster: str, name: str) -> str:
        try:
            update = EndpointUpdate(autoscaling=Autoscaling(min_replicas=self.min_replicas,
                                                            max_replicas=self.max_replicas))
            view, _created = self.service.update_endpoint(principal, cluster, name, update)
        except (ValidationError, ServiceError) as exc:
            return refused(exc)
        return f"scaling {name} to {self.min_replicas}-{self.max_replicas} replicas ({view.id})"

    def trigger(self, principal: Principal, cluster: str, name: str) -> str:
        try:
            update = EndpointUpdate(autoscaling=Autoscaling.model_validate({"prometheus": [
                PrometheusTrigger(name="pane", query=self.query, target_value=self.target)]}))
            view, _created = self.service.update_endpoint(principal, cluster, name, update)
        except (ValidationError, ServiceError) as exc:
            return refused(exc)
        return f"scaling {name} on {self.query} (target {self.target:g} per pod) ({view.id})"

    def delete(self, principal: Principal, cluster: str, name: str) -> str:
        try:
            view, _created = self.service.delete_endpoint(principal, cluster, name)
        except ServiceError as exc:
            return refused(exc)
        return f"deleting {name} ({view.id})"

    def test(self, principal: Principal, cluster: str, name: str) -> tuple[str, str]:
        try:
            result = self.service.test_endpoint(principal, cluster, name, EndpointTest(prompt=self.prompt))
        except (ValidationError, ServiceError) as exc:
            return refused(exc), ""
        shown = result.text if result.text is not None else json.dumps(result.answer, indent=1)[:4000]
        return f"HTTP {result.status} in {result.elapsed_ms} ms", shown


class ManagedSection(ScopedPane, pn.viewable.Viewer):
    def __init__(self, managed: ManagedEndpoints, clusters: Clusters, bus: EventBus, principal: Principal,
                 current_principal: Callable[[], Principal] | None = None, **params: Any) -> None:
        super().__init__(**params)
        self.state = ManagedState(managed, clusters, principal, current_principal)
        s = self.state.param
        self.body = pn.widgets.TextAreaInput.from_param(s.body, name="Request (JSON, as inference_endpoints_deploy)",
                                                        height=220)
        self.token = pn.widgets.PasswordInput(label="Hugging Face token (huggingface source)", placeholder="hf_…")
        operator = principal.allows(Role.OPERATOR)
        self.preview_button = pn.widgets.Button(label="Preview", disabled=not operator, loading=s.busy,
                                                css_classes=["managed-preview"])
        self.deploy_button = pn.widgets.Button(label="Deploy", color="primary", disabled=not operator,
                                               loading=s.busy, css_classes=["managed-deploy"])
        self.min_replicas = pn.widgets.IntInput.from_param(s.min_replicas, name="Min replicas", width=120)
        self.max_replicas = pn.widgets.IntInput.from_param(s.max_replicas, name="Max replicas", width=120)
        self.scale_button = pn.widgets.Button(label="Set bounds", disabled=not operator,
                                              css_classes=["managed-scale"])
        self.query = pn.widgets.TextInput.from_param(s.query, name="Scale on (PromQL)",
                                                     placeholder="sum(vllm:num_requests_waiting{app=\"llama\"})")
        self.target = pn.widgets.FloatInput.from_param(s.target, name="Target per pod", width=120)
        self.trigger_button = pn.widgets.Button(label="Set trigger", disabled=not operator,
                                                css_classes=["managed-trigger"])
        self.delete_button = pn.widgets.Button(label="Delete selected", disabled=not operator,
                                               css_classes=["managed-delete"])
        self.prompt = pn.widgets.TextInput.from_param(s.prompt, name="Prompt")
        self.test_button = pn.widgets.Button(label="Send", disabled=not operator, css_classes=["managed-test"])
        if not operator:
            for button in (self.preview_button, self.deploy_button, self.scale_button, self.trigger_button,
                           self.delete_button, self.test_button):
                button.description = "needs the operator role"
        self.table = ReadOnlyTable(endpoints_frame([]), selectable=1, sizing_mode="stretch_width",
                                   css_classes=["managed-table"], empty="No managed endpoints yet.")
        for button, handler in ((self.preview_button, self._preview), (self.deploy_button, self._deploy),
                                (self.scale_button, self._scale), (self.trigger_button, self._trigger),
                                (self.delete_button, self._delete),
                                (self.test_button, self._test)):
            button.on_click(handler)
        self.table.param.watch(self._on_selection, "selection")
        s.watch(lambda event: setattr(self.table, "value", endpoints_frame(event.new)), "endpoints")
        self._ops = LiveRefresh(bus, "operation", self._on_operation)
        self._refresh()

    def follow(self, cluster: str) -> None:
        """Follow the pane's cluster picker."""
        if cluster and cluster != self.state.cluster:
            self.state.cluster = cluster
            self._refresh()

    def _on_selection(self, event: param.parameterized.Event) -> None:
        rows = self.state.endpoints
        self.state.selected = rows[event.new[0]].name if event.new and event.new[0] < len(rows) else ""

    def _on_operation(self, events: list[Event]) -> None:
        if any(e.data.get("kind") in KINDS for e in events):
            self._refresh()

    async def _deploy(self, _event: Any) -> None:
        await self._submit(self.state.deploy)

    async def _selected(self, fn: Callable[..., Any]) -> Any:
        if not self.state.selected:
            self.state.message = "Select an endpoint in the table first."
            return None
        return await self._run(fn, self.state.selected)

    async def _scale(self, _event: Any) -> None:
        said = await self._selected(self.state.scale)
        if said is not None:
            self.state.message = said

    async def _trigger(self, _event: Any) -> None:
        said = await self._selected(self.state.trigger)
        if said is not None:
            self.state.message = said

    async def _delete(self, _event: Any) -> None:
        said = await self._selected(self.state.delete)
        if said is not None:
            self.state.message = said
            await self.state.refresh()

    async def _test(self, _event: Any) -> None:
        said = await self._selected(self.state.test)
        if said is not None:
            self.state.message, self.state.answer = said

    def __panel__(self) -> pn.viewable.Viewable:
        return pn.Column(
            pn.pane.Markdown("### Managed endpoints (HyperPod inference operator)\nA model from S3, FSx, Hugging "
                             "Face or the JumpStart catalog, run by the operator: tiered KV cache, intelligent "
                             "routing (chosen at deploy only), autoscaling on Prometheus or CloudWatch metrics "
                             "(`autoscaling.prometheus` / `autoscaling.cloudwatch` in the request; installs KEDA first "
                             "where the cluster has none). Needs "
                             "the `hyperpod_inference_operator` feature."),
            self.body,
            pn.Row(self.token, self.preview_button, self.deploy_button),
            pn.pane.Markdown(self.state.param.message, css_classes=["managed-message"]),
            pn.Accordion(("Preview", pn.widgets.TextAreaInput.from_param(self.state.param.preview, name="",
                                                                         disabled=True, height=300))),
            self.table,
            pn.Row(self.min_replicas, self.max_replicas, self.scale_button, self.delete_button),
            pn.Row(self.query, self.target, self.trigger_button),
            pn.Row(self.prompt, self.test_button),
            pn.pane.Markdown(self.state.param.answer, css_classes=["managed-answer"]),
            sizing_mode="stretch_width",
        )
