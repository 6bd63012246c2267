"""Time as a dependency, so waits and retries are testable in milliseconds."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class Clock:
    """Wall-clock time. ``wait`` sleeps on an event so a wake-up can cut it short."""

    def now(self) -> float:
        return time.time()

    def wait(self, event: threading.Event, timeout: float) -> bool:
        return event.wait(max(0.0, timeout))


class FakeClock(Clock):
    """A clock that only moves when told; ``advance`` wakes every waiter so due work runs at once."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds
            listeners = list(self._listeners)
        for notify in listeners:
            notify()

    def on_advance(self, callback: Callable[[], None]) -> None:
        with self._lock:
            self._listeners.append(callback)

    def wait(self, event: threading.Event, timeout: float) -> bool:
        # Real time still passes for the engine's loop; cap it so a test never stalls on a fake due time.
        return event.wait(min(max(0.0, timeout), 0.05))
