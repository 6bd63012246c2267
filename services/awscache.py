"""Short-TTL cache of AWS describe/list results, on the injected clock.

A status read of a cluster costs at most one AWS call per resource per TTL however often it is asked; an
operation that changes a resource invalidates its entries so the next read sees the change. ``loads``
counts what was really fetched, per (service, operation), for tests and metrics.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from services.clock import Clock


class AwsCache:
    def __init__(self, clock: Clock, ttl: float = 15.0) -> None:
        self.clock = clock
        self.ttl = ttl
        self.loads: Counter[tuple[str, str]] = Counter()
        self._entries: dict[tuple[str, ...], tuple[float, Any]] = {}
        self._lock = threading.Lock()
        self._loading: dict[tuple[str, ...], threading.Lock] = {}  # one load at a time per key
        self._generation = 0  # bumped by invalidate: a load that started before it is not stored

    def get(self, key: tuple[str, ...], load: Callable[[], Any], *, refresh: bool = False) -> tuple[Any, float]:
        """``(value, age in seconds)``: cached while younger than the TTL, else ``load()`` (key[0:2] is
        (service, operation), the rest names the resource)."""
        with self._lock:
            entry = self._entries.get(key)
            loading = self._loading.setdefault(key, threading.Lock())
        now = self.clock.now()
        if entry is not None and not refresh and now - entry[0] < self.ttl:
            return entry[1], now - entry[0]
        with loading:  # concurrent misses of one key wait for one load
            with self._lock:
                entry = self._entries.get(key)
                generation = self._generation
            now = self.clock.now()
            if entry is not None and not refresh and now - entry[0] < self.ttl:
                return entry[1], now - entry[0]
            value = load()
            with self._lock:
                self.loads[(key[0], key[1])] += 1
                if generation == self._generation:  # no invalidation while loading: the value is current
                    self._entries[key] = (now, value)
        return value, 0.0

    def invalidate(self, *resource: str) -> None:
        """Drop every entry whose resource part starts with ``resource`` (e.g. the region and a cluster)."""
        with self._lock:
            self._generation += 1
            for key in [k for k in self._entries if k[2:2 + len(resource)] == resource]:
                del self._entries[key]
