"""Live metrics: one poller per followed MLflow run, however many panes, notebooks or sockets follow it.

A poller runs on its own thread (never the Tornado loop), reads its run every ``interval`` seconds and
publishes only the points it has not published before, as ``metrics`` events on the event bus
(``{"cluster", "namespace", "job", "run": JobRun.key, "series": {name: [point, ...]}}``); panes receive them
through ``panels/live.py`` and the events WebSocket forwards them (``/api/v1/events?topic=metrics``). A tick
whose run did not move costs one MLflow call (GetRun); histories are read only when the latest values changed.
The poller stops as soon as its last follower leaves. A follower that joins late reads the run once itself
(``TrainingMetrics.read_run``, a verb) and then takes the events with steps after what it read.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from services.errors import ServiceError
from services.events import Event, EventBus
from services.mlflow.metrics import JobRun, RunReader

log = logging.getLogger(__name__)
TOPIC = "metrics"
DEFAULT_INTERVAL = 1.0


class Follow:
    """A follower's hold on a run's poller; ``close()`` (idempotent) lets the poller stop once nobody holds it."""

    def __init__(self, live: MetricsLive, run: JobRun) -> None:
        self.run = run
        self._live = live
        self._closed = False

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._live._release(self.run)


class Poller:
    def __init__(self, run: JobRun, reader: RunReader, bus: EventBus, interval: float) -> None:
        self.run = run
        self.reader = reader
        self.bus = bus
        self.interval = interval
        self.followers = 0
        self.calls = 0  # MLflow calls this poller made
        self.published = 0  # points it published
        self.error: str | None = None
        self._cursor: dict[str, int] = {}
        self._signature: tuple[Any, ...] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"metrics-{run.job}")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def tick(self) -> int:
        """One read; publishes the new points, returns how many."""
        try:
            read = self.reader.read(self.run.tracking_uri, self.run.run_id, self._cursor, unchanged=self._signature)
        except ServiceError as exc:
            self.calls += 1  # the call that failed
            self.error = f"{exc.code}: {exc.message}"
            return 0
        self.calls += read.calls
        self.error = None
        self._signature = read.signature
        fresh = {name: points for name, points in read.series.items() if points}
        if not fresh:
            return 0
        for name, points in fresh.items():
            self._cursor[name] = points[-1].step
        count = sum(len(points) for points in fresh.values())
        self.published += count
        self.bus.publish(Event(TOPIC, "points", {
            "cluster": self.run.cluster, "namespace": self.run.namespace, "job": self.run.job,
            "run": self.run.key, "run_status": read.status,
            "series": {name: [p.model_dump() for p in points] for name, points in fresh.items()}}))
        return count

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # a bug must not kill the poller silently while followers wait
                log.exception("metrics poller for %s failed", self.run.key)
            self._stop.wait(self.interval)


class MetricsLive:
    """The pollers, keyed by run. Counters: ``calls`` (MLflow calls of every poller, ended ones included)."""

    def __init__(self, reader: RunReader, bus: EventBus, interval: float = DEFAULT_INTERVAL) -> None:
        self.reader = reader
        self.bus = bus
        self.interval = interval
        self._pollers: dict[str, Poller] = {}
        self._lock = threading.Lock()
        self._ended_calls = 0

    def follow(self, run: JobRun) -> Follow:
        """Start (or join) the run's poller; it publishes the points logged from now on (and, on its first
        tick, those logged before, which a late follower already read and skips by step)."""
        with self._lock:
            poller = self._pollers.get(run.key)
            if poller is None:
                poller = self._pollers[run.key] = Poller(run, self.reader, self.bus, self.interval)
                poller.start()
            poller.followers += 1
        return Follow(self, run)

    def _release(self, run: JobRun) -> None:
        with self._lock:
            poller = self._pollers.get(run.key)
            if poller is None:
                return
            poller.followers -= 1
            if poller.followers <= 0:
                del self._pollers[run.key]
                self._ended_calls += poller.calls
                poller.stop()

    def poller(self, run: JobRun) -> Poller | None:
        with self._lock:
            return self._pollers.get(run.key)

    def pollers(self) -> int:
        with self._lock:
            return len(self._pollers)

    @property
    def calls(self) -> int:
        with self._lock:
            return self._ended_calls + sum(p.calls for p in self._pollers.values())

    def stop(self) -> None:
        with self._lock:
            pollers, self._pollers = list(self._pollers.values()), {}
        for poller in pollers:
            poller.stop()
