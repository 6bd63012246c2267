"""Short-TTL cache of AWS describe/list results, on the injected clock.

A status read of a cluster costs at most one AWS call per resource per TTL however often it is asked; an
operation that changes a resource invalidates its entries so the next read sees the change. ``loads``
counts what was really fetched, per (service, operation), for tests and metrics.

A failure (a :class:`ServiceError`: the resource is missing, access is denied, AWS throttled) is cached too,
for a shorter time — the TTL, or the error's own retry ``delay`` when that is shorter — and raised again to
every reader meanwhile, so a missing or denied resource does not cost one AWS call per read.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from services.clock import Clock
from services.errors import ServiceError


@dataclass(frozen=True)
class _Entry:
    at: float
    ttl: float
    value: Any = None
    error: ServiceError | None = None

    def answer(self, now: float) -> tuple[Any, float]:
        if self.error is not None:
            raise self.error.with_traceback(None)  # a fresh traceback per reader, not a growing one
        return self.value, now - self.at


class AwsCache:
    def __init__(self, clock: Clock, ttl: float = 15.0) -> None:
        self.clock = clock
        self.ttl = ttl
        self.loads: Counter[tuple[str, str]] = Counter()
        self._entries: dict[tuple[str, ...], _Entry] = {}
        self._lock = threading.Lock()
        self._loading: dict[tuple[str, ...], threading.Lock] = {}  # one load at a time per key
        self._generation = 0  # bumped by invalidate: a load that started before it is not stored

    def error_ttl(self, exc: ServiceError) -> float:
        """How long a failure is answered from the cache: its retry delay when it has one, at most the TTL."""
        delay = getattr(exc, "delay", None)
        return min(self.ttl, delay) if isinstance(delay, (int, float)) and delay > 0 else self.ttl

    def _fresh(self, key: tuple[str, ...], refresh: bool) -> tuple[_Entry | None, float]:
        with self._lock:
            entry = self._entries.get(key)
        now = self.clock.now()
        if entry is not None and not refresh and now - entry.at < entry.ttl:
            return entry, now
        return None, now

    def peek(self, key: tuple[str, ...]) -> tuple[Callable[[], Any], bool] | None:
        """The entry however old it is, for stale-while-revalidate readers: ``(answer, stale)`` where
        ``answer()`` returns the value (or raises the cached failure); None when there is none (never read,
        or invalidated by an operation). Never loads."""
        with self._lock:
            entry = self._entries.get(key)
        if entry is None:
            return None
        now = self.clock.now()
        return (lambda: entry.answer(now)[0]), now - entry.at >= entry.ttl

    def get(self, key: tuple[str, ...], load: Callable[[], Any], *, refresh: bool = False) -> tuple[Any, float]:
        """``(value, age in seconds)``: cached while younger than the TTL, else ``load()`` (key[0:2] is
        (service, operation), the rest names the resource). A cached failure is raised again."""
        with self._lock:
            loading = self._loading.setdefault(key, threading.Lock())
        entry, now = self._fresh(key, refresh)
        if entry is not None:
            return entry.answer(now)
        with loading:  # concurrent misses of one key wait for one load (and share its failure)
            with self._lock:
                generation = self._generation
            entry, now = self._fresh(key, refresh)
            if entry is not None:
                return entry.answer(now)
            try:
                value = load()
            except ServiceError as exc:
                self._store(key, generation, _Entry(now, self.error_ttl(exc), error=exc))
                raise
            self._store(key, generation, _Entry(now, self.ttl, value=value))
        return value, 0.0

    def _store(self, key: tuple[str, ...], generation: int, entry: _Entry) -> None:
        with self._lock:
            self.loads[(key[0], key[1])] += 1
            if generation == self._generation:  # no invalidation while loading: the answer is current
                self._entries[key] = entry

    def invalidate(self, *resource: str) -> None:
        """Drop every entry (value or failure) whose resource part starts with ``resource`` (e.g. the region
        and a cluster)."""
        with self._lock:
            self._generation += 1
            for key in [k for k in self._entries if k[2:2 + len(resource)] == resource]:
                del self._entries[key]
