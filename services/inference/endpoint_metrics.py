"""Time to first token and generated tokens per second of a deployment, from its engines' own metrics.

Each engine serves Prometheus text at ``/metrics`` (vLLM always; SGLang with ``--enable-metrics``): the time to
first token histogram (``vllm:time_to_first_token_seconds`` / ``sglang:time_to_first_token_seconds``), the
generated-token counter (``vllm:generation_tokens_total`` / ``sglang:generation_tokens_total``) and the finished
requests (``vllm:request_success_total`` / ``sglang:num_requests_total``). The control plane needs no network
path to the pods: it reads them through the Kubernetes API's pod proxy (``/api/v1/namespaces/{ns}/pods/
{pod}:{port}/proxy/metrics``) with the official client, at most :data:`MAX_PODS` ready pods per scrape (within
:data:`BUDGET` seconds), each answer capped at :data:`MAX_BYTES`. A deployment is scraped at most once per
:data:`FRESH_SECONDS` however many read it (a read in between answers the cached figures), and the figures
compare the two latest scrapes: bucket and counter deltas per pod (a counter that went down is a restarted
engine: its new value is the delta, as Prometheus' ``rate`` reads it), quantiles interpolated within buckets as
``histogram_quantile`` does.

It never writes anything, and a pod that does not answer is counted out, not an error of the read.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes import client as k8s
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from services.errors import NotFound, ServiceError
from services.inference import kobjects as ko
from services.inference.manifest import INFERENCE_LABEL
from services.inference.obs_models import EndpointMetrics
from services.kube import KubeClients

MAX_PODS = 8
MAX_BYTES = 2 * 1024 * 1024
FRESH_SECONDS = 5.0
KEPT = 256  # deployments whose scrapes are remembered (least recently read forgotten first)
TIMEOUT = (3.0, 5.0)  # one pod's connect and read
BUDGET = 10.0  # one scrape of all its pods: the pods not reached by then are counted out
#: engine -> (TTFT histogram, generated tokens counter, finished requests counter), as the engines name them
NAMES: Mapping[str, tuple[str, str, str]] = {
    "vllm": ("vllm:time_to_first_token_seconds", "vllm:generation_tokens", "vllm:request_success"),
    "sglang": ("sglang:time_to_first_token_seconds", "sglang:generation_tokens", "sglang:num_requests"),
}


@dataclass(frozen=True)
class PodSample:
    """One pod's counters at one scrape: the TTFT histogram's cumulative buckets (upper bound, count)."""

    buckets: tuple[tuple[float, float], ...]
    tokens: float
    requests: float


@dataclass(frozen=True)
class Scrape:
    at: float
    pods: Mapping[str, PodSample]
    ready: int
    failures: tuple[str, ...]


@dataclass(frozen=True)
class PodTarget:
    namespace: str
    name: str
    port: int


def ready_pods(namespace: str, name: str, port: int, pods: list[dict[str, Any]]) -> list[PodTarget]:
    """Deployment ``name``'s ready pods in the pods cache (no API call), its engine listening on ``port``: Running
    and Ready (:func:`~services.inference.kobjects.cached_ready`; a pod not Running has no engine to scrape even if
    its cached Ready says otherwise)."""
    out = []
    for pod in pods:
        meta = ko.meta(pod)
        if meta.get("namespace") == namespace and ko.labels(pod).get(INFERENCE_LABEL) == name and ko.cached_ready(pod):
            out.append(PodTarget(namespace, str(meta.get("name")), port))
    return out


def samples(text: str) -> Iterator[Sample]:
    """Every sample of a Prometheus text page (``prometheus_client``'s parser: name, labels, value; a counter's
    samples keep their ``_total``); a malformed page raises ValueError."""
    for family in text_string_to_metric_families(text):
        yield from family.samples


def parse(text: str, engine: str) -> PodSample:
    """The engine's figures in one ``/metrics`` answer (samples summed over labels, e.g. per finish reason)."""
    histogram, tokens_name, requests_name = NAMES[engine]
    buckets: dict[float, float] = {}
    tokens = requests = 0.0
    for sample in samples(text):
        if sample.name == f"{histogram}_bucket":
            bound = float(sample.labels["le"])
            buckets[bound] = buckets.get(bound, 0.0) + sample.value
        elif sample.name == f"{tokens_name}_total":
            tokens += sample.value
        elif sample.name == f"{requests_name}_total":
            requests += sample.value
    return PodSample(tuple(sorted(buckets.items())), tokens, requests)


def quantile(q: float, buckets: tuple[tuple[float, float], ...]) -> float | None:
    """``histogram_quantile(q, ...)`` over cumulative ``buckets``: linear within the bucket holding the rank; the
    highest finite bound when the rank falls in ``+Inf``; None without observations."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


def _delta(now: PodSample, before: PodSample | None) -> PodSample:
    """The pod's increase since ``before`` (a counter that went down restarted: its whole value is the increase)."""
    if before is None:
        return now
    old = dict(before.buckets)
    reset = now.requests < before.requests or now.tokens < before.tokens or any(
        count < old.get(bound, 0.0) for bound, count in now.buckets)
    if reset:
        return now
    return PodSample(tuple((b, c - old.get(b, 0.0)) for b, c in now.buckets), now.tokens - before.tokens,
                     now.requests - before.requests)


def figures(latest: Scrape, previous: Scrape | None) -> EndpointMetrics:
    """The deployment's figures from its two latest scrapes (``previous`` None: the first one only)."""
    merged: dict[float, float] = {}
    tokens = requests = 0.0
    compared = 0
    for pod, sample in latest.pods.items():
        before = previous.pods.get(pod) if previous is not None else None
        if previous is not None and before is None:
            continue  # a pod new since the last scrape: its counters are not from this window
        compared += 1
        delta = _delta(sample, before)
        for bound, count in delta.buckets:
            merged[bound] = merged.get(bound, 0.0) + count
        tokens += delta.tokens
        requests += delta.requests
    buckets = tuple(sorted(merged.items()))
    window = latest.at - previous.at if previous is not None else None
    notes = [*latest.failures]
    if not latest.pods:
        notes.insert(0, "no pod answered /metrics" if latest.ready else "no ready pod to read metrics from")
    elif not requests:
        notes.insert(0, "no requests finished in the window" if previous is not None else "no requests yet")
    if latest.ready > MAX_PODS:
        notes.append(f"only {MAX_PODS} of the {latest.ready} ready pods are read: the figures are theirs")
    if window is None and latest.pods:
        notes.append(f"tokens/s needs a second scrape: read again after {FRESH_SECONDS:.0f} s")
    return EndpointMetrics(
        ttft_p50_seconds=_round(quantile(0.5, buckets)), ttft_p95_seconds=_round(quantile(0.95, buckets)),
        tokens_per_second=round(tokens / window, 3) if window and compared else None, requests=int(requests),
        window_seconds=round(window, 3) if window is not None else None, pods_scraped=len(latest.pods),
        pods_ready=latest.ready, note="; ".join(notes))


def _round(value: float | None) -> float | None:
    return round(value, 4) if value is not None else None


class EndpointScraper:
    """The scrapes of every deployment read lately: each at most once per :data:`FRESH_SECONDS`."""

    def __init__(self, kube: KubeClients, clock: Callable[[], float] = time.monotonic) -> None:
        self.kube = kube
        self.clock = clock
        self._lock = threading.Lock()
        self._kept: OrderedDict[tuple[str, str, str], tuple[threading.Lock, list[Scrape]]] = OrderedDict()

    def read(self, cluster: str, namespace: str, name: str, engine: str, pods: list[PodTarget]) -> EndpointMetrics:
        """The figures of deployment ``name`` whose ready ``pods`` are given; scraped when the latest scrape is
        older than :data:`FRESH_SECONDS` (one reader scrapes, the others wait for its answer)."""
        if engine not in NAMES:
            return EndpointMetrics(note=f"no metrics are known for the engine {engine!r}")
        key = (cluster, namespace, name)
        with self._lock:
            lock, scrapes = self._kept.pop(key) if key in self._kept else (threading.Lock(), [])
            self._kept[key] = (lock, scrapes)
            while len(self._kept) > KEPT:
                self._kept.popitem(last=False)
        with lock:
            if not scrapes or self.clock() - scrapes[-1].at >= FRESH_SECONDS:
                scrapes.append(self._scrape(cluster, engine, sorted(pods, key=lambda p: p.name)[:MAX_PODS],
                                            len(pods)))
                del scrapes[:-2]
            return figures(scrapes[-1], scrapes[-2] if len(scrapes) > 1 else None)

    def _scrape(self, cluster: str, engine: str, pods: list[PodTarget], ready: int) -> Scrape:
        samples: dict[str, PodSample] = {}
        failures: list[str] = []
        if pods:
            core = k8s.CoreV1Api(self.kube.api_client(cluster))
            deadline = time.monotonic() + BUDGET
            for pod in pods:
                if time.monotonic() >= deadline:
                    failures.append(f"{pod.name}: not read (the scrape's {BUDGET:.0f} s were spent)")
                    continue
                try:
                    samples[pod.name] = parse(fetch(core, pod), engine)
                except (ServiceError, urllib3.exceptions.HTTPError, ValueError) as exc:
                    failures.append(f"{pod.name}: /metrics did not answer ({_reason(exc, engine)})")
        return Scrape(self.clock(), samples, ready, tuple(failures))


def fetch(core: k8s.CoreV1Api, pod: PodTarget) -> str:
    """The pod's ``/metrics`` page through the pod proxy: each read within :data:`TIMEOUT`, ValueError over
    :data:`MAX_BYTES` (the router's metrics are read so too)."""
    raw: Any = core.connect_get_namespaced_pod_proxy_with_path(
        f"{pod.name}:{pod.port}", pod.namespace, "metrics", _preload_content=False, _request_timeout=TIMEOUT)
    try:
        body = bytes(raw.read(MAX_BYTES + 1))
    finally:
        raw.release_conn()
    if len(body) > MAX_BYTES:
        raise ValueError(f"more than {MAX_BYTES} bytes")
    return body.decode("utf-8", "replace")


def _reason(exc: Exception, engine: str) -> str:
    text = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
    if engine == "sglang" and isinstance(exc, NotFound):
        return f"{text}; SGLang serves /metrics only with --enable-metrics"
    return text
