"""The inference pane's autoscaling section: KEDA bounds and triggers for the deployment selected in the pane's
table, set or removed through the scaling verbs (``services/inference/scaling.py``), and what KEDA and the HPA
report now. Redrawn when an ``inference.scaling.*`` operation changes (the pane's operation events), no polling.

It holds no rules: every button calls one verb in a worker thread when served; the verbs check the role again.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import panel as pn
import param
from pydantic import ValidationError

from panels.live import Newest, in_worker
from panels.refusals import refused
from services.auth import Principal
from services.errors import ServiceError
from services.inference.scaling import REMOVE_KIND, SET_KIND, InferenceScaling
from services.inference.scaling_models import ScalingRequest, ScalingView

KINDS = {SET_KIND, REMOVE_KIND}


def describe(view: ScalingView) -> str:
    """The autoscaling of one deployment, for people (markdown)."""
    parts = [f"**{view.name}**: {view.replicas} replica(s)"]
    if not view.enabled:
        parts.append("not autoscaled")
    else:
        state = "Ready" if view.ready else f"not ready ({view.message})" if view.ready is False else "pending"
        parts.append(f"KEDA {view.min_replicas}-{view.max_replicas} replicas, {state}"
                     + (", active" if view.active else ""))
        if view.desired_replicas is not None:
            parts.append(f"HPA desired {view.desired_replicas}, current {view.current_replicas}")
        parts += [f"`{t.kind}` > {t.threshold:g} per replica: `{t.query}`" for t in view.triggers]
        parts += view.metrics
    parts += [f"{c.name} {c.version}: {c.status}" + (f" ({c.detail})" if c.detail else "") for c in view.components]
    return "\n\n".join(parts)


class ScalingState(param.Parameterized):
    min_replicas = param.Integer(default=1, bounds=(1, 64))
    max_replicas = param.Integer(default=2, bounds=(1, 64))
    request_rate = param.Number(default=None, allow_None=True, bounds=(0, None),
                                doc="completed requests per second per replica (empty: no such trigger)")
    queue_depth = param.Number(default=None, allow_None=True, bounds=(0, None),
                               doc="waiting requests per replica (empty: no such trigger)")
    status = param.String(default="", doc="the selected deployment's autoscaling, or the last verb's answer")

    def __init__(self, scaling: InferenceScaling, **params: Any) -> None:
        super().__init__(**params)
        self.service = scaling

    def request(self) -> ScalingRequest:
        return ScalingRequest(min_replicas=self.min_replicas, max_replicas=self.max_replicas,
                              request_rate=self.request_rate or None, queue_depth=self.queue_depth or None)

    def show(self, principal: Principal, cluster: str, name: str) -> str:
        try:
            return describe(self.service.describe_scaling(principal, cluster, name))
        except ServiceError as exc:
            return refused(exc)

    def set(self, principal: Principal, cluster: str, name: str) -> str:
        try:
            view, _created = self.service.set_scaling(principal, cluster, name, self.request())
        except (ValidationError, ServiceError) as exc:
            return refused(exc)
        return f"autoscaling {name} ({view.id})"

    def remove(self, principal: Principal, cluster: str, name: str) -> str:
        try:
            view, _created = self.service.remove_scaling(principal, cluster, name)
        except ServiceError as exc:
            return refused(exc)
        return f"removing the autoscaling of {name} ({view.id})"


class ScalingPanel(pn.viewable.Viewer):
    """The section; ``where`` answers (principal, cluster, selected deployment) from the pane."""

    def __init__(self, scaling: InferenceScaling, where: Callable[[], tuple[Principal, str, str]],
                 operator: bool, **params: Any) -> None:
        super().__init__(**params)
        self.state = ScalingState(scaling)
        self.where = where
        self._newest = Newest()  # a show re-read on an event and the user's own call may overlap
        s = self.state.param
        self.inputs = [pn.widgets.IntInput.from_param(s.min_replicas, name="Min replicas", width=120),
                       pn.widgets.IntInput.from_param(s.max_replicas, name="Max replicas", width=120),
                       pn.widgets.FloatInput.from_param(s.request_rate, name="Requests/s per replica", width=170),
                       pn.widgets.FloatInput.from_param(s.queue_depth, name="Queue per replica", width=150)]
        self.show_button = pn.widgets.Button(label="Show", css_classes=["scaling-show"])
        self.set_button = pn.widgets.Button(label="Set autoscaling", color="primary", disabled=not operator,
                                            css_classes=["scaling-set"])
        self.remove_button = pn.widgets.Button(label="Remove autoscaling", disabled=not operator,
                                               css_classes=["scaling-remove"])
        for button, verb, change in ((self.show_button, self.state.show, False),
                                     (self.set_button, self.state.set, True),
                                     (self.remove_button, self.state.remove, True)):
            button.on_click(functools.partial(self._clicked, verb, change))

    def _clicked(self, verb: Callable[[Principal, str, str], str], change: bool, _event: Any) -> None:
        self._spawn(verb, change)

    def _spawn(self, verb: Callable[[Principal, str, str], str], change: bool = False) -> None:
        """A show is a read, numbered when asked; a set or remove is the user's change, its answer told when it
        is given, so the show its own operation event starts meanwhile never swallows it."""
        if pn.state.served:
            pn.state.execute(functools.partial(self.run, verb, change))
        elif change:
            answer = self._call(verb)
            self._newest.tell(lambda: self._show(answer))
        else:
            self._newest.read(functools.partial(self._call, verb), self._show)

    def _call(self, verb: Callable[[Principal, str, str], str]) -> str:
        principal, cluster, name = self.where()
        if not name:
            return "Select a deployment in the table first."
        return verb(principal, cluster, name)

    async def run(self, verb: Callable[[Principal, str, str], str], change: bool = False) -> None:
        if change:
            answer = await in_worker(self._call, verb)
            self._newest.tell(lambda: self._show(answer))
        else:
            await self._newest.read_in_worker(functools.partial(self._call, verb), self._show)

    def _show(self, status: str) -> None:
        self.state.status = status

    def changed(self, kinds: set[str]) -> None:
        """Operation events of these kinds arrived: show the selected deployment's autoscaling again."""
        if kinds & KINDS:
            self._spawn(self.state.show)

    def __panel__(self) -> pn.viewable.Viewable:
        return pn.Column(
            pn.pane.Markdown("### Autoscaling (KEDA)\nScale the selected deployment on its engine's request rate "
                             "or queue depth; the first use installs KEDA and Prometheus on the cluster."),
            pn.Row(*self.inputs),
            pn.Row(self.show_button, self.set_button, self.remove_button),
            pn.pane.Markdown(self.state.param.status, css_classes=["scaling-status"]),
        )
