"""The engine's metrics in Prometheus text format (``prometheus_client``), for ``GET /metrics``.

One :class:`Metrics` per process, built by the composition root and handed to whoever counts (no
module-level registry: two services in one test process never share counts). Counters and histograms are
updated where things happen; gauges that describe stored state (queue depth, operations by status, bus
subscribers' drops) are read when scraped, so they are never stale.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from services.events import EventBus

STAGE_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300, 900, 1800, 3600, 7200)


class _Gauges(Collector):
    """Gauges computed at scrape time from a callback returning (labels, value) pairs."""

    def __init__(self, name: str, documentation: str, labels: list[str],
                 read: Callable[[], list[tuple[list[str], float]]]) -> None:
        self.name, self.documentation, self.labels, self.read = name, documentation, labels, read

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(self.name, self.documentation, labels=self.labels)

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(self.name, self.documentation, labels=self.labels)
        for labels, value in self.read():
            family.add_metric(labels, value)
        yield family


#: HTTP methods counted by name; any other (a client may send any token) is counted as OTHER
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class _Answers(Collector):
    """HTTP answers by method and status. Counted where the server logs requests (the event loop's thread,
    once per request) in a plain dictionary, so a request pays a dictionary update rather than a labelled
    counter's lookup and lock; reported as one counter when scraped."""

    NAME = "instantstart_http_requests"
    DOC = "HTTP requests answered, by method and status code"

    def __init__(self) -> None:
        self.counts: dict[tuple[str, int], int] = {}

    def describe(self) -> Iterator[Metric]:
        yield CounterMetricFamily(self.NAME, self.DOC, labels=["method", "code"])

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.NAME, self.DOC, labels=["method", "code"])
        for (method, code), n in sorted(self.counts.copy().items()):  # a copy: the loop keeps counting
            family.add_metric([method, str(code)], n)
        yield family


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._answers = _Answers()
        self.registry.register(self._answers)
        self._stage_seconds = Histogram(
            "instantstart_stage_duration_seconds", "Time from a stage's first step to its end (engine clock)",
            ["kind", "stage", "outcome"], buckets=STAGE_BUCKETS, registry=self.registry)
        self._retries = Counter(
            "instantstart_stage_retries", "Transient failures (throttling, 5xx, timeouts) the engine backed off "
            "from and retried", ["kind", "stage"], registry=self.registry)
        self._backoff = Counter(
            "instantstart_stage_backoff_seconds", "Seconds of backoff the engine scheduled before retries",
            ["kind", "stage"], registry=self.registry)
        self._finished = Counter(
            "instantstart_operations_finished", "Operations that ended, by outcome", ["kind", "outcome"],
            registry=self.registry)
        self._aws_calls = Counter(
            "instantstart_aws_calls", "AWS API calls the product made (each page of a paginated list counts)",
            ["service", "operation"], registry=self.registry)
        self._informer_lists = Counter(
            "instantstart_informer_lists", "Full Kubernetes lists informers made (first sync, 410 Gone, refresh)",
            ["cluster", "resource"], registry=self.registry)

    def http_answered(self, method: str, status: int) -> None:
        """One HTTP request answered (called on the server's event loop only)."""
        key = (method if method in HTTP_METHODS else "OTHER", status)
        counts = self._answers.counts
        counts[key] = counts.get(key, 0) + 1

    def aws_call(self, service: str, operation: str) -> None:
        self._aws_calls.labels(service, operation).inc()

    def informer_listed(self, cluster: str, resource: str) -> None:
        self._informer_lists.labels(cluster, resource).inc()

    def stage_finished(self, kind: str, stage: str, outcome: str, seconds: float) -> None:
        self._stage_seconds.labels(kind, stage, outcome).observe(max(0.0, seconds))

    def stage_retried(self, kind: str, stage: str, backoff: float) -> None:
        self._retries.labels(kind, stage).inc()
        self._backoff.labels(kind, stage).inc(backoff)

    def operation_finished(self, kind: str, outcome: str) -> None:
        self._finished.labels(kind, outcome).inc()

    def track_operations(self, depth: Callable[[], int], counts: Callable[[], dict[str, int]]) -> None:
        """Queue depth (due, unclaimed operations) and operations by status, read at each scrape."""
        self.registry.register(_Gauges("instantstart_operation_queue_depth",
                                       "Operations due now that no worker has picked up yet", [],
                                       lambda: [([], float(depth()))]))
        self.registry.register(_Gauges("instantstart_operations", "Stored operations by status", ["status"],
                                       lambda: [([status], float(n)) for status, n in sorted(counts().items())]))

    def track_bus(self, bus: EventBus) -> None:
        """Per topic, over the live subscriptions: events dropped for subscribers that fell behind, and
        subscribers. A subscription's drops leave with it when it closes."""
        def dropped() -> list[tuple[list[str], float]]:
            by_topic: dict[str, int] = {}
            for stat in bus.stats():
                by_topic[stat.topic or "*"] = by_topic.get(stat.topic or "*", 0) + stat.dropped
            return [([topic], float(n)) for topic, n in sorted(by_topic.items())]

        def subscribers() -> list[tuple[list[str], float]]:
            by_topic: dict[str, int] = {}
            for stat in bus.stats():
                by_topic[stat.topic or "*"] = by_topic.get(stat.topic or "*", 0) + 1
            return [([topic], float(n)) for topic, n in sorted(by_topic.items())]

        self.registry.register(_Gauges("instantstart_bus_dropped_events",
                                       "Events dropped for live subscribers whose queue was full", ["topic"], dropped))
        self.registry.register(_Gauges("instantstart_bus_subscribers", "Live event-bus subscriptions", ["topic"],
                                       subscribers))

    def track_informers(self, ages: Callable[[], list[tuple[str, str, float | None]]]) -> None:
        """Informer lag: seconds since each (cluster, resource) cache last matched its server (a list or a
        watch event; a quiet cluster's lag grows until its next bookmark or event), and whether it has
        synced at all."""
        self.registry.register(_Gauges(
            "instantstart_informer_lag_seconds", "Seconds since the watch cache last heard from its cluster",
            ["cluster", "resource"],
            lambda: [([c, r], age) for c, r, age in ages() if age is not None]))
        self.registry.register(_Gauges(
            "instantstart_informer_synced", "1 once the watch cache holds a full list, else 0",
            ["cluster", "resource"],
            lambda: [([c, r], 0.0 if age is None else 1.0) for c, r, age in ages()]))

    def render(self) -> str:
        """Everything registered, in the Prometheus text exposition format."""
        return generate_latest(self.registry).decode()
