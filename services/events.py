"""In-process event bus: operation transitions (and later resource events) fan out to subscribers.

Publishers are engine workers and request handlers: ``publish`` only appends to each matching
subscriber's bounded queue and returns, so a subscriber that blocks never delays the worker that
published. Each subscription drains its queue on its own thread; when its queue is full, further events
for it are dropped and counted (``dropped``), never for the others. Subscribers still decide how to hop
onto their loop (the WebSocket handler and the long-poll use ``loop.call_soon_threadsafe``, panes their
document's next-tick callback).

A subscription filters by topic and by fields of the event's data (``where={"id": op_id}``, or
``{"cluster": name}``), so a long-poll on one operation wakes for that operation only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_BOUND = 1_000


@dataclass(frozen=True)
class Event:
    """One thing that happened: ``topic`` is e.g. ``operation``; ``data`` is JSON-ready."""

    topic: str
    kind: str
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "kind": self.kind, "data": self.data}


Subscriber = Callable[[Event], None]


@dataclass(frozen=True)
class SubscriptionStats:
    topic: str | None
    where: dict[str, str]
    bound: int
    pending: int
    delivered: int
    dropped: int


class Subscription:
    """One subscriber's queue and delivery thread. Calling it (or ``close()``) unsubscribes."""

    def __init__(self, bus: EventBus, callback: Subscriber, topic: str | None, where: dict[str, str],
                 bound: int) -> None:
        self._bus = bus
        self._callback = callback
        self.topic = topic
        self.where = where
        self.bound = bound
        self.delivered = 0
        self.dropped = 0
        self._queue: deque[Event] = deque()
        self._in_flight = 0
        self._closed = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"bus-{topic or 'all'}")
        self._thread.start()

    def matches(self, event: Event) -> bool:
        if self.topic is not None and event.topic != self.topic:
            return False
        return all(str(event.data.get(key)) == value for key, value in self.where.items())

    def offer(self, event: Event) -> None:
        """Queue ``event`` (never blocks); past the bound, which counts the event being delivered, drop it."""
        with self._cond:
            if self._closed:
                return
            if len(self._queue) + self._in_flight >= self.bound:
                self.dropped += 1
                if self.dropped == 1:
                    log.warning("event subscriber on %s is %d events behind: dropping", self.topic or "all",
                                self.bound)
                return
            self._queue.append(event)
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                event = self._queue.popleft()
                self._in_flight = 1
            try:
                self._callback(event)
            except Exception:
                log.exception("event subscriber failed on %s/%s", event.topic, event.kind)
            with self._cond:
                self._in_flight = 0
                self.delivered += 1
                self._cond.notify_all()

    def idle(self) -> bool:
        with self._cond:
            return not self._queue and not self._in_flight

    def stats(self) -> SubscriptionStats:
        with self._cond:
            return SubscriptionStats(self.topic, dict(self.where), self.bound,
                                     len(self._queue) + self._in_flight, self.delivered, self.dropped)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._queue.clear()
            self._cond.notify_all()
        self._bus._forget(self)

    def __call__(self) -> None:
        self.close()

    def join(self, timeout: float) -> None:
        """Wait until the callback running now (if any) has returned; a no-op from the callback itself."""
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)


class EventBus:
    def __init__(self, bound: int = DEFAULT_BOUND) -> None:
        self._lock = threading.Lock()
        self._subscriptions: list[Subscription] = []
        self.bound = bound

    def subscribe(self, callback: Subscriber, topic: str | None = None, *, where: dict[str, str] | None = None,
                  bound: int | None = None) -> Subscription:
        """Call ``callback`` (on the subscription's own thread) for each event of ``topic`` (or all) whose
        data has the ``where`` field values; returns the subscription (call it to unsubscribe)."""
        subscription = Subscription(self, callback, topic, dict(where or {}), bound or self.bound)
        with self._lock:
            self._subscriptions.append(subscription)
        return subscription

    def _forget(self, subscription: Subscription) -> None:
        with self._lock:
            if subscription in self._subscriptions:
                self._subscriptions.remove(subscription)

    def publish(self, event: Event) -> None:
        with self._lock:
            targets = [s for s in self._subscriptions if s.matches(event)]
        for subscription in targets:
            subscription.offer(event)

    def subscriber_count(self) -> int:
        with self._lock:
            return len(self._subscriptions)

    def stats(self) -> list[SubscriptionStats]:
        with self._lock:
            subscriptions = list(self._subscriptions)
        return [s.stats() for s in subscriptions]

    def close(self, timeout: float = 10.0) -> None:
        """End every subscription and wait for the callbacks running now: nothing is delivered after this, so
        what they read (the database) can be closed next."""
        with self._lock:
            subscriptions = list(self._subscriptions)
        for subscription in subscriptions:
            subscription.close()
        for subscription in subscriptions:
            subscription.join(timeout)

    def drain(self, timeout: float = 60.0) -> bool:
        """Wait until every subscriber has handled what was published so far (tests, orderly shutdown)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                subscriptions = list(self._subscriptions)
            if all(s.idle() for s in subscriptions):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
