"""The inference pane's observability section for the deployment selected in its table: the engines' time to first
token and tokens/s (``describe_deployment``'s metrics) and the engine's log lines (``read_logs``, grep and tail).

It holds no rules and reads only when asked (its buttons): the verbs run in a worker thread when
served, so the event loop never waits on the pod proxy or a log read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import panel as pn
import param
from pydantic import ValidationError

from panels.live import Newest
from panels.refusals import refused
from services.auth import Principal
from services.errors import ServiceError
from services.inference import Inference
from services.inference.obs_models import EndpointMetrics, InferenceLogQuery


def metrics_text(name: str, m: EndpointMetrics | None) -> str:
    """The figures as one Markdown line for ``name``."""
    if m is None:
        return f"**{name}**: no engine metrics"
    def ms(v: float | None) -> str:
        return f"{v * 1000:.0f} ms" if v is not None else "-"
    rate = f"{m.tokens_per_second:.1f} tokens/s" if m.tokens_per_second is not None else "- tokens/s"
    window = f" over {m.window_seconds:.0f} s" if m.window_seconds is not None else ""
    line = (f"**{name}**: TTFT p50 {ms(m.ttft_p50_seconds)}, p95 {ms(m.ttft_p95_seconds)}; {rate}; "
            f"{m.requests} requests{window} ({m.pods_scraped}/{m.pods_ready} pods read)")
    return line + (f" — {m.note}" if m.note else "")


class InferenceObsState(param.Parameterized):
    metrics = param.String(default="", doc="the selected deployment's engine metrics, as Markdown")
    grep = param.String(default="", doc="only log lines matching this regular expression")
    tail = param.Integer(default=200, bounds=(1, 2000))
    logs = param.String(default="", doc="the last log lines read")

    def __init__(self, inference: Inference, **params: Any) -> None:
        super().__init__(**params)
        self.service = inference

    def read_metrics(self, principal: Principal, cluster: str, name: str) -> str:
        try:
            return metrics_text(name, self.service.describe_deployment(principal, cluster, name).metrics)
        except ServiceError as exc:
            return refused(exc)

    def read_logs(self, principal: Principal, cluster: str, name: str) -> str:
        try:
            query = InferenceLogQuery(tail=self.tail, grep=self.grep or None)
            return self.service.read_logs(principal, cluster, name, query).text
        except (ValidationError, ServiceError) as exc:
            return refused(exc)


class InferenceObs(pn.viewable.Viewer):
    """Metrics and logs of ``selected()`` in ``cluster()``; ``principal()`` is the session's."""

    def __init__(self, inference: Inference, principal: Callable[[], Principal], cluster: Callable[[], str],
                 selected: Callable[[], str], **params: Any) -> None:
        super().__init__(**params)
        self.state = InferenceObsState(inference)
        self._principal, self._cluster, self._selected = principal, cluster, selected
        self._newest = {"metrics": Newest(), "logs": Newest()}  # two clicks' reads may overlap
        s = self.state.param
        self.grep = pn.widgets.TextInput.from_param(s.grep, name="Grep", placeholder="error|CUDA|out of memory")
        self.tail = pn.widgets.IntInput.from_param(s.tail, name="Last lines", width=120)
        self.metrics_button = pn.widgets.Button(label="Refresh metrics", css_classes=["inference-metrics"])
        self.logs_button = pn.widgets.Button(label="Read logs", css_classes=["inference-logs"])
        self.metrics_button.on_click(self.refresh_metrics)
        self.logs_button.on_click(self.refresh_logs)

    async def _run(self, shown: str, fn: Callable[..., str]) -> None:
        """``fn`` on the selected deployment in a worker thread, its answer to the ``shown`` parameter."""
        principal, cluster, name = self._principal(), self._cluster(), self._selected()

        def read() -> str:
            return fn(principal, cluster, name) if name else "Select a deployment in the table first."

        await self._newest[shown].read_in_worker(read, lambda answer: setattr(self.state, shown, answer))

    async def refresh_metrics(self, _event: Any = None) -> None:
        await self._run("metrics", self.state.read_metrics)

    async def refresh_logs(self, _event: Any = None) -> None:
        await self._run("logs", self.state.read_logs)

    def __panel__(self) -> pn.viewable.Viewable:
        return pn.Column(
            pn.pane.Markdown("### Metrics and logs"),
            pn.Row(self.metrics_button, pn.pane.Markdown(self.state.param.metrics, css_classes=["inference-ttft"])),
            pn.Row(self.grep, self.tail, self.logs_button),
            pn.widgets.TextAreaInput.from_param(self.state.param.logs, name="", disabled=True, height=260,
                                                css_classes=["inference-log-view"]),
            sizing_mode="stretch_width")
