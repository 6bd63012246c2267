"""A training job's metrics, read from its MLflow run with the official client (``MlflowClient``).

The run of a job is named by the job's custom resource, not guessed: the env ``MLFLOW_TRACKING_URI`` and
``MLFLOW_RUN_ID`` the product injected into the first container of its pod template(s). The tracking URI is
whatever was injected (a SageMaker tracking server's ARN through the ``sagemaker-mlflow`` plugin, or a plain
http URL); this module never builds one.

Each recipe logs its own metric names; the reader normalises them to four series (``SERIES``): throughput in
tokens/s, loss, step time in seconds and learning rate. A recipe that logs throughput only at the end
(HF-Trainer based: LLaMA-Factory, MS-Swift) has it derived per logging step from the deltas of
``num_input_tokens_seen`` over the deltas of their timestamps; its step time from timestamp deltas over step
deltas. Logged values are returned exactly as MLflow stored them (no rounding, no resampling).

Incremental reads: ``since`` holds, per series, the last step a reader already has; only points with a
greater step come back. A point logged again at a step already read (a job resumed from a checkpoint) is not
sent twice. This module never keeps a thread: the live poller (``live.py``) calls it from its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import boto3
from kubernetes import client as k8s
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from pydantic import Field

from services.auth import Principal, Role
from services.errors import Invalid, NotFound, Permanent, ServiceError, Transient
from services.kube import KubeClients
from services.mlflow.client import calls_to
from services.models import TRAINING_NAMESPACE, RequestModel, ResponseModel
from services.verbs import verb

DEFAULT_NAMESPACE = TRAINING_NAMESPACE
SERIES = ("throughput", "loss", "step_time", "learning_rate")
UNITS = {"throughput": "tokens/s", "loss": "", "step_time": "s", "learning_rate": ""}
#: per series, the keys the recipes log it under (contract: pytorch, verl)
DIRECT: dict[str, tuple[str, ...]] = {
    "throughput": ("tokens_per_second", "perf/throughput"),
    "loss": ("loss", "actor/pg_loss"),
    "step_time": ("step_time_seconds", "timing_s/step"),
    "learning_rate": ("learning_rate", "actor/lr"),
}
TOKENS_SEEN = "num_input_tokens_seen"  # HF-Trainer recipes: the cumulative count throughput is derived from
#: the job kinds a job may be, in the order they are looked for: (group, version, plural)
JOB_KINDS = (("sagemaker.amazonaws.com", "v1", "hyperpodpytorchjobs"), ("kubeflow.org", "v1", "pytorchjobs"),
             ("ray.io", "v1", "rayjobs"))
RECIPE_LABEL = "instantstart.io/recipe"
MAX_COMPARE = 10
class Point(ResponseModel):
    step: int
    value: float
    timestamp: int = Field(..., description="when it was logged, milliseconds since the epoch")


class Series(ResponseModel):
    name: str = Field(..., description="throughput, loss, step_time or learning_rate")
    source: str = Field(..., description="the MLflow key it was read from, or how it was derived")
    unit: str
    points: list[Point] = Field(default_factory=list, description="in step order; only steps after `since`")


class JobMetrics(ResponseModel):
    cluster: str
    namespace: str
    job: str
    recipe: str = Field(..., description="the job's recipe label (pytorch, llama-factory, ms-swift, verl, manifest)")
    run_id: str
    run_status: str = Field(..., description="the MLflow run's status: RUNNING, FINISHED, FAILED, KILLED")
    series: list[Series] = Field(..., description="the series the run has, normalised (empty series omitted)")
    cursor: int | None = Field(None, description="the highest step returned: pass it as `since` to get only what "
                                                 "is logged after this answer")
    last: dict[str, float] = Field(default_factory=dict, description="each series' last value so far")
    keys: list[str] = Field(default_factory=list, description="every metric key the run logged, as MLflow has it")


class MetricsQuery(RequestModel):
    namespace: str = Field(DEFAULT_NAMESPACE, description="the job's namespace")
    since: int | None = Field(None, description="only points after this step (the `cursor` of a previous answer)")


class CompareQuery(RequestModel):
    jobs: str = Field(..., description=f"comma-separated job names (2 to {MAX_COMPARE}), all in `namespace`")
    namespace: str = Field(DEFAULT_NAMESPACE, description="the jobs' namespace")
    points: bool = Field(True, description="include every series' points, not just the last values")

    def names(self) -> list[str]:
        names = list(dict.fromkeys(n.strip() for n in self.jobs.split(",") if n.strip()))
        if not 1 <= len(names) <= MAX_COMPARE:
            raise Invalid(f"compare takes 1 to {MAX_COMPARE} job names, got {len(names)}",
                          details={"jobs": names})
        return names


class Comparison(ResponseModel):
    cluster: str
    namespace: str
    jobs: list[JobMetrics] = Field(..., description="one entry per job, in the order asked")


class Digest(ResponseModel):
    """The one-line progress of a job's training: what ``jobs watch`` prints."""

    job: str
    run_id: str
    run_status: str
    step: int | None = Field(None, description="the last step any series reached")
    loss: float | None = None
    tokens_per_second: float | None = None
    step_time: float | None = None
    learning_rate: float | None = None
    timestamp: int | None = Field(None, description="when the last point was logged, ms since the epoch")


@dataclass(frozen=True)
class JobRun:
    """Where a job's metrics are: read from its custom resource."""

    cluster: str
    namespace: str
    job: str
    recipe: str
    tracking_uri: str
    run_id: str

    @property
    def key(self) -> str:
        return f"{self.tracking_uri}#{self.run_id}"


@dataclass
class RunRead:
    """One read of a run: the normalised series (only new points), where each came from, the run's state."""

    series: dict[str, list[Point]]
    sources: dict[str, str]
    status: str
    keys: list[str]
    signature: tuple[Any, ...]
    changed: bool = True
    calls: int = 0  # MLflow calls this read made


def _pod_specs(node: Any) -> Iterable[dict[str, Any]]:
    """Every pod spec inside a custom resource's spec (replica specs, head/worker groups, templates)."""
    if isinstance(node, dict):
        if isinstance(node.get("containers"), list):
            yield node
        for value in node.values():
            yield from _pod_specs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _pod_specs(value)


def run_of(resource: dict[str, Any], cluster: str) -> JobRun:
    """The MLflow run a job's resource names (first container of each pod template, first that has one)."""
    meta = resource.get("metadata", {})
    job, namespace = meta.get("name", ""), meta.get("namespace", "")
    for spec in _pod_specs(resource.get("spec", {})):
        containers = spec["containers"]
        env = {e.get("name"): e.get("value") for e in (containers[0].get("env") or []) if isinstance(e, dict)}
        if env.get("MLFLOW_RUN_ID") and env.get("MLFLOW_TRACKING_URI"):
            return JobRun(cluster, namespace, job, (meta.get("labels") or {}).get(RECIPE_LABEL, "manifest"),
                          str(env["MLFLOW_TRACKING_URI"]), str(env["MLFLOW_RUN_ID"]))
    raise NotFound(f"job {job!r} has no MLflow run: it was submitted without a tracking server (its pod template "
                   "has no MLFLOW_RUN_ID); create the cluster's tracking server and submit it again",
                   details={"cluster": cluster, "namespace": namespace, "job": job})


def find_job_run(api: k8s.ApiClient, cluster: str, namespace: str, job: str) -> JobRun:
    """Look the job up among the kinds we submit (a GET per kind until found)."""
    objects = k8s.CustomObjectsApi(api)
    for group, version, plural in JOB_KINDS:
        try:
            resource = objects.get_namespaced_custom_object(group, version, namespace, plural, job)
        except NotFound:
            continue
        return run_of(dict(resource), cluster)  # type: ignore[call-overload]
    raise NotFound(f"no training job {job!r} in namespace {namespace!r} of cluster {cluster!r}",
                   details={"cluster": cluster, "namespace": namespace, "job": job})


def _classify(exc: MlflowException, action: str) -> ServiceError:
    code = str(getattr(exc, "error_code", "") or "")
    details = {"mlflow_error": code, "action": action}
    if code in ("RESOURCE_DOES_NOT_EXIST", "NOT_FOUND"):
        return NotFound(f"MLflow has no such run ({action}): {exc.message}", details=details)
    if code in ("INVALID_PARAMETER_VALUE", "BAD_REQUEST"):
        return Invalid(f"MLflow refused {action}: {exc.message}", details=details)
    if code in ("PERMISSION_DENIED", "UNAUTHENTICATED"):
        return Permanent(f"the tracking server refused {action} to this identity: {exc.message}", details=details)
    return Transient(f"the tracking server failed {action}: {exc.message}", delay=2.0, details=details)


def _derived(tokens: list[Point]) -> tuple[list[Point], list[Point]]:
    """Throughput (Δtokens / Δseconds) and step time (Δseconds / Δsteps) between consecutive logging steps."""
    throughput: list[Point] = []
    step_time: list[Point] = []
    for before, after in pairwise(tokens):
        seconds = (after.timestamp - before.timestamp) / 1000.0
        steps = after.step - before.step
        if seconds <= 0 or steps <= 0:
            continue
        throughput.append(Point(step=after.step, value=(after.value - before.value) / seconds,
                                timestamp=after.timestamp))
        step_time.append(Point(step=after.step, value=seconds / steps, timestamp=after.timestamp))
    return throughput, step_time


class RunReader:
    """Reads runs through one ``MlflowClient`` per tracking URI; counts every MLflow call it makes. A tracking
    server's ARN is read through ``services/mlflow/client.py`` (the plugin's global URI, signed with
    ``session``: the product's credentials)."""

    def __init__(self, on_call: Callable[[str], None] | None = None, session: boto3.Session | None = None) -> None:
        self._session = session
        self._clients: dict[str, MlflowClient] = {}
        self._lock = threading.Lock()
        self._on_call = on_call
        self.calls = 0

    def _client(self, uri: str) -> MlflowClient:
        with self._lock:
            client = self._clients.get(uri)
            if client is None:
                client = self._clients[uri] = MlflowClient(tracking_uri=uri)
            return client

    def _call(self, uri: str, action: str, fn: Callable[[], Any]) -> Any:
        with self._lock:
            self.calls += 1
        if self._on_call is not None:
            self._on_call(action)
        try:
            with calls_to(uri, self._session):
                return fn()
        except MlflowException as exc:
            raise _classify(exc, action) from exc
        except OSError as exc:  # connection refused, DNS, TLS: requests' errors are OSErrors
            raise Transient(f"the tracking server is unreachable for {action}: {exc}", delay=2.0) from exc

    def read(self, uri: str, run_id: str, since: Mapping[str, int] | None = None,
             unchanged: tuple[Any, ...] | None = None) -> RunRead:
        """The run's normalised series after ``since``; with ``unchanged`` (a previous read's signature), a
        run whose latest values did not move costs one call and returns no points."""
        client = self._client(uri)
        calls = 1
        run = self._call(uri, "GetRun", lambda: client.get_run(run_id))
        latest = run.data.to_proto().metrics
        signature = tuple(sorted((m.key, m.step, m.timestamp, m.value) for m in latest))
        keys = sorted(run.data.metrics)
        if unchanged is not None and signature == unchanged:
            return RunRead({}, {}, run.info.status, keys, signature, changed=False, calls=calls)
        histories: dict[str, list[Point]] = {}

        def history(key: str) -> list[Point]:
            nonlocal calls
            if key not in histories:
                calls += 1
                got = self._call(uri, f"GetMetricHistory {key}", lambda: client.get_metric_history(run_id, key))
                histories[key] = sorted((Point(step=m.step, value=m.value, timestamp=m.timestamp) for m in got),
                                        key=lambda p: (p.step, p.timestamp))
            return histories[key]

        series: dict[str, list[Point]] = {}
        sources: dict[str, str] = {}
        for name in SERIES:
            key = next((k for k in DIRECT[name] if k in run.data.metrics), None)
            if key is not None:
                series[name], sources[name] = history(key), key
        if TOKENS_SEEN in run.data.metrics and ("throughput" not in series or "step_time" not in series):
            throughput, step_time = _derived(history(TOKENS_SEEN))
            for name, points in (("throughput", throughput), ("step_time", step_time)):
                if name not in series:
                    series[name], sources[name] = points, f"derived from {TOKENS_SEEN} deltas"
        after = since or {}
        fresh = {name: [p for p in points if name not in after or p.step > after[name]]
                 for name, points in series.items()}
        return RunRead(fresh, sources, run.info.status, keys, signature, calls=calls)


def _last(series: Mapping[str, list[Point]]) -> dict[str, float]:
    return {name: points[-1].value for name, points in series.items() if points}


class TrainingMetrics:
    """The metrics noun: a job's series, a comparison of jobs, a one-line digest. Reads only."""

    noun = "metrics"

    def __init__(self, kube: KubeClients, reader: RunReader | None = None) -> None:
        self.kube = kube
        self.reader = reader or RunReader()

    def _job_run(self, cluster: str, namespace: str, job: str) -> JobRun:
        return find_job_run(self.kube.api_client(cluster), cluster, namespace, job)

    @verb(Role.VIEWER)
    def find_run(self, principal: Principal, cluster: str, job: str, namespace: str = DEFAULT_NAMESPACE) -> JobRun:
        """The job's MLflow run, from its custom resource (Kubernetes reads: call it off the event loop)."""
        return self._job_run(cluster, namespace, job)

    @verb(Role.VIEWER)
    def read_run(self, principal: Principal, run: JobRun, since: int | None = None) -> JobMetrics:
        """A run's normalised series (what ``find_run`` found, or a run a notebook names itself)."""
        return self._read(run, since)

    def _read(self, run: JobRun, since: int | None = None) -> JobMetrics:
        read = self.reader.read(run.tracking_uri, run.run_id,
                                None if since is None else dict.fromkeys(SERIES, since))
        steps = [p.step for points in read.series.values() for p in points]
        return JobMetrics(cluster=run.cluster, namespace=run.namespace, job=run.job, recipe=run.recipe,
                          run_id=run.run_id, run_status=read.status, keys=read.keys,
                          series=[Series(name=n, source=read.sources[n], unit=UNITS[n], points=read.series[n])
                                  for n in SERIES if n in read.series],
                          cursor=max(steps) if steps else since, last=_last(read.series))

    @verb(Role.VIEWER)
    def job_metrics(self, principal: Principal, cluster: str, job: str, query: MetricsQuery) -> JobMetrics:
        """A job's normalised series from its MLflow run (only the points after ``query.since``)."""
        return self._read(self._job_run(cluster, query.namespace, job), query.since)

    @verb(Role.VIEWER)
    def compare(self, principal: Principal, cluster: str, query: CompareQuery) -> Comparison:
        """Several jobs' runs side by side: last values, and their series unless ``points`` is false."""
        runs = [self._job_run(cluster, query.namespace, name) for name in query.names()]
        read = [self._read(run) for run in runs]
        if not query.points:
            read = [m.model_copy(update={"series": [s.model_copy(update={"points": s.points[-1:]})
                                                    for s in m.series]}) for m in read]
        return Comparison(cluster=cluster, namespace=query.namespace, jobs=read)

    @verb(Role.VIEWER)
    def latest(self, principal: Principal, cluster: str, job: str,
               namespace: str = DEFAULT_NAMESPACE) -> Digest:
        """The job's latest step, loss, tokens/s, step time and learning rate (``jobs watch``, status)."""
        return self._latest(cluster, job, namespace)

    def progress(self, cluster: str, namespace: str, job: str) -> dict[str, float | None]:
        """The jobs digest's progress (the jobs noun's ``ProgressReader``, for ``jobs watch`` and ``status``): the
        latest step, loss and tokens/s; empty when the job has no run or its MLflow cannot be read now."""
        try:
            d = self._latest(cluster, job, namespace)
        except ServiceError:
            return {}
        return {"step": float(d.step) if d.step is not None else None, "loss": d.loss,
                "tokens_per_second": d.tokens_per_second}

    def _latest(self, cluster: str, job: str, namespace: str) -> Digest:
        metrics = self._read(self._job_run(cluster, namespace, job))
        points = [p for s in metrics.series for p in s.points]
        newest = max(points, key=lambda p: (p.timestamp, p.step)) if points else None
        return Digest(job=job, run_id=metrics.run_id, run_status=metrics.run_status,
                      step=max((p.step for p in points), default=None), loss=metrics.last.get("loss"),
                      tokens_per_second=metrics.last.get("throughput"), step_time=metrics.last.get("step_time"),
                      learning_rate=metrics.last.get("learning_rate"),
                      timestamp=newest.timestamp if newest else None)
