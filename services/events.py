"""In-process event bus: operation transitions (and later resource events) fan out to subscribers.

Publishers are worker threads; subscribers decide how to hop threads (the WebSocket handler and the
long-poll use ``loop.call_soon_threadsafe``, panes use their document's next-tick callback). A slow or
failing subscriber never stops delivery to the others.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Event:
    """One thing that happened: ``topic`` is e.g. ``operation``; ``data`` is JSON-ready."""

    topic: str
    kind: str
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "kind": self.kind, "data": self.data}


Subscriber = Callable[[Event], None]


class EventBus:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subscribers: dict[int, tuple[str | None, Subscriber]] = {}
        self._next = 0

    def subscribe(self, callback: Subscriber, topic: str | None = None) -> Callable[[], None]:
        """Call ``callback`` for each event (of ``topic``, or all); returns the unsubscribe function."""
        with self._lock:
            key = self._next
            self._next += 1
            self._subscribers[key] = (topic, callback)

        def unsubscribe() -> None:
            with self._lock:
                self._subscribers.pop(key, None)

        return unsubscribe

    def publish(self, event: Event) -> None:
        with self._lock:
            targets = [cb for topic, cb in self._subscribers.values() if topic in (None, event.topic)]
        for callback in targets:
            try:
                callback(event)
            except Exception:
                log.exception("event subscriber failed on %s/%s", event.topic, event.kind)

    def subscriber_count(self) -> int:
        with self._lock:
            return len(self._subscribers)
