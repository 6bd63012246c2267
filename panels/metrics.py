"""Training metrics panes: a live chart of one job (throughput and loss against step) and a comparison of runs.

The live chart streams: each series is an ``hv.streams.Buffer``, and only points after the last step it holds
are sent to it, so the browser receives the new points, never the whole series again. Points come from the
run's one poller (``services/mlflow/live.py``) as ``metrics`` bus events, delivered where the pane lives by
``panels/live.py``. Choosing a job reads its run once (off the loop) for what was logged before. Both panes
render alone in a notebook.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

import holoviews as hv
import pandas as pd
import panel as pn
import param

from panels.live import LiveRefresh
from services.auth import Principal
from services.errors import ServiceError
from services.events import Event, EventBus
from services.mlflow.live import TOPIC, Follow, MetricsLive
from services.mlflow.metrics import DEFAULT_NAMESPACE, CompareQuery, JobMetrics, JobRun, TrainingMetrics

hv.extension("bokeh", logo=False)
CHARTED = {"throughput": "tokens/s", "loss": "loss"}
BUFFER_LENGTH = 1_000_000  # points kept per series in the browser


def _empty() -> pd.DataFrame:
    return pd.DataFrame({"step": pd.Series([], dtype="int64"), "value": pd.Series([], dtype="float64")})


class MetricsState(param.Parameterized):
    cluster = param.String(default="", doc="the cluster the job runs on")
    namespace = param.String(default=DEFAULT_NAMESPACE)
    job = param.String(default="", doc="the training job")
    message = param.String(default="")
    run_status = param.String(default="")
    points = param.Integer(default=0, doc="points charted so far")
    last_step = param.Integer(default=None, allow_None=True)


class MetricsPane(pn.viewable.Viewer):
    """A job's throughput and loss, live. Set ``cluster`` and ``job`` (widgets or parameters) to follow a job, or
    give ``run`` (a notebook that knows its MLflow run: tracking URI and run id) to follow that run."""

    def __init__(self, metrics: TrainingMetrics, live: MetricsLive, bus: EventBus, principal: Principal,
                 run: JobRun | None = None, **params: Any) -> None:
        super().__init__()
        self.metrics, self.live, self.principal = metrics, live, principal
        self._fixed = run
        if run is not None:
            params = {"cluster": run.cluster, "namespace": run.namespace, "job": run.job, **params}
        self.state = MetricsState(**params)
        self.buffers = {name: hv.streams.Buffer(_empty(), length=BUFFER_LENGTH, index=False) for name in CHARTED}
        self.steps: dict[str, int] = {}  # per series, the last step in its buffer
        self.run: JobRun | None = None
        self._follows: list[Follow] = []  # at most one; a list so the finalizer can release it without the pane
        self._events = LiveRefresh(bus, TOPIC, self._on_points)
        weakref.finalize(self, _release, self._follows)  # a pane dropped (a notebook cell run again) stops following
        doc = pn.state.curdoc
        if self._events.in_session and doc is not None:  # a closed browser tab stops following
            doc.on_session_destroyed(lambda _ctx: self.close())
        self.state.param.watch(self._on_choice, ["cluster", "namespace", "job"])
        self.charts = {name: hv.DynamicMap(lambda data, label=label: hv.Curve(data, "step", ("value", label)),
                                           streams=[buffer]).opts(responsive=True, height=260, title=label,
                                                                  framewise=True, tools=["hover"])
                       for (name, label), buffer in zip(CHARTED.items(), self.buffers.values(), strict=True)}
        if self.state.cluster and self.state.job:
            self._start()

    def close(self) -> None:
        """Stop following (the run's poller ends when nobody else follows it)."""
        _release(self._follows)
        self._events.close()

    def _on_choice(self, _event: Any) -> None:
        self._fixed = None  # a job chosen by hand from now on
        self._start()

    def _start(self) -> None:
        _release(self._follows)
        self.run = None
        self.steps = {}
        self.state.param.update(points=0, last_step=None, run_status="")
        for buffer in self.buffers.values():
            buffer.clear()
        if not (self.state.cluster and self.state.job):
            self.state.message = "Choose a cluster and a job."
            return
        self.state.message = f"Reading the MLflow run of {self.state.job}..."
        if not self._events.spawn(self._load):
            self._apply(self._read(self.state.cluster, self.state.namespace, self.state.job))

    async def _load(self) -> None:
        choice = (self.state.cluster, self.state.namespace, self.state.job)
        read = await asyncio.get_running_loop().run_in_executor(None, self._read, *choice)
        if choice == (self.state.cluster, self.state.namespace, self.state.job):  # not changed meanwhile
            self._apply(read)

    def _read(self, cluster: str, namespace: str, job: str) -> tuple[JobRun, JobMetrics] | str:
        try:
            run = self._fixed or self.metrics.find_run(self.principal, cluster, job, namespace)
            return run, self.metrics.read_run(self.principal, run)
        except ServiceError as exc:
            return f"{exc.code}: {exc.message}"

    def _apply(self, read: tuple[JobRun, JobMetrics] | str) -> None:
        if isinstance(read, str):
            self.state.message = read
            return
        self.run, metrics = read
        self._push({s.name: [p.model_dump() for p in s.points] for s in metrics.series})
        self.state.run_status = metrics.run_status
        self.state.message = f"{metrics.job}: MLflow run {metrics.run_id} ({metrics.run_status}), live"
        self._follows.append(self.live.follow(self.run))

    def _push(self, series: dict[str, list[dict[str, Any]]]) -> int:
        """Send each charted series' points after its last step to its buffer; returns how many."""
        sent = 0
        for name, buffer in self.buffers.items():
            last = self.steps.get(name)
            fresh = [p for p in series.get(name, []) if last is None or p["step"] > last]
            if fresh:
                buffer.send(pd.DataFrame({"step": [p["step"] for p in fresh],
                                          "value": [p["value"] for p in fresh]}))
                self.steps[name] = fresh[-1]["step"]
                sent += len(fresh)
        if sent:
            self.state.param.update(points=self.state.points + sent, last_step=max(self.steps.values()))
        return sent

    def _on_points(self, events: list[Event]) -> None:
        if self.run is None:
            return
        for event in events:
            if event.data.get("run") == self.run.key:
                self._push(event.data["series"])
                self.state.run_status = str(event.data.get("run_status", self.state.run_status))

    def __panel__(self) -> pn.viewable.Viewable:
        return pn.Column(
            pn.pane.Markdown("## Training metrics"),
            pn.Row(pn.widgets.TextInput.from_param(self.state.param.cluster, css_classes=["metrics-cluster"]),
                   pn.widgets.TextInput.from_param(self.state.param.namespace, css_classes=["metrics-namespace"]),
                   pn.widgets.TextInput.from_param(self.state.param.job, css_classes=["metrics-job"])),
            pn.pane.Markdown(self.state.param.message, css_classes=["metrics-message"]),
            pn.pane.Markdown(pn.bind(_count, self.state.param.points, self.state.param.last_step),
                             css_classes=["metrics-count"]),
            pn.Row(pn.pane.HoloViews(self.charts["throughput"], sizing_mode="stretch_width",
                                     css_classes=["metrics-throughput"]),
                   pn.pane.HoloViews(self.charts["loss"], sizing_mode="stretch_width", css_classes=["metrics-loss"]),
                   sizing_mode="stretch_width"),
            sizing_mode="stretch_width",
        )


def _count(points: int, last_step: int | None) -> str:
    return f"{points} points charted, last step {last_step}" if last_step is not None else "no points yet"


def _release(follows: list[Follow]) -> None:
    while follows:
        follows.pop().close()


class CompareState(param.Parameterized):
    cluster = param.String(default="")
    namespace = param.String(default=DEFAULT_NAMESPACE)
    jobs = param.String(default="", doc="comma-separated job names")
    message = param.String(default="")


class ComparePane(pn.viewable.Viewer):
    """Several jobs' runs: throughput and loss overlaid per job, and a table of their last values."""

    def __init__(self, metrics: TrainingMetrics, principal: Principal, **params: Any) -> None:
        super().__init__()
        self.metrics, self.principal = metrics, principal
        self.state = CompareState(**params)
        self.table = pn.widgets.Tabulator(pd.DataFrame(), disabled=True, sizing_mode="stretch_width",
                                          css_classes=["compare-table"])
        self.plots = pn.Row(sizing_mode="stretch_width")
        self.button = pn.widgets.Button(label="Compare", color="primary", css_classes=["compare-run"])
        self.button.on_click(self._on_click)
        if self.state.cluster and self.state.jobs:
            self.apply(self.fetch())

    def fetch(self) -> Any:
        try:
            return self.metrics.compare(self.principal, self.state.cluster,
                                        CompareQuery(jobs=self.state.jobs, namespace=self.state.namespace))
        except ServiceError as exc:
            return f"{exc.code}: {exc.message}"

    def apply(self, read: Any) -> None:
        if isinstance(read, str):
            self.state.message = read
            return
        self.table.value = pd.DataFrame([{"job": m.job, "recipe": m.recipe, "status": m.run_status,
                                          **{name: m.last.get(name) for name in
                                             ("throughput", "loss", "step_time", "learning_rate")}}
                                         for m in read.jobs])
        overlays = []
        for name, label in CHARTED.items():
            curves = [hv.Curve([(p.step, p.value) for s in m.series if s.name == name for p in s.points],
                               "step", ("value", label), label=m.job) for m in read.jobs]
            overlays.append(pn.pane.HoloViews(hv.Overlay(curves).opts(title=label, responsive=True, height=260),
                                              sizing_mode="stretch_width"))
        self.plots.objects = overlays
        self.state.message = f"{len(read.jobs)} runs"

    async def _on_click(self, _event: Any) -> None:
        self.apply(await asyncio.get_running_loop().run_in_executor(None, self.fetch))

    def __panel__(self) -> pn.viewable.Viewable:
        return pn.Column(
            pn.pane.Markdown("## Compare runs"),
            pn.Row(pn.widgets.TextInput.from_param(self.state.param.cluster),
                   pn.widgets.TextInput.from_param(self.state.param.namespace),
                   pn.widgets.TextInput.from_param(self.state.param.jobs), self.button),
            pn.pane.Markdown(self.state.param.message, css_classes=["compare-message"]),
            self.plots, self.table, sizing_mode="stretch_width",
        )
