"""Per-principal bounds on long-lived requests: open event WebSockets and concurrent long-polls.

One token (or one dashboard session's token) may hold only so many of each at a time; past the bound a
request is refused at once with ``too_many_requests`` (429), never queued, so a runaway client cannot
tie up the server's connections and event subscriptions.
"""

from __future__ import annotations

import threading

from services.auth import Principal
from services.errors import TooManyRequests


class Slots:
    """At most ``limit`` concurrent holders per principal (by token, else by name)."""

    def __init__(self, what: str, limit: int) -> None:
        self.what = what
        self.limit = limit
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def acquire(self, principal: Principal) -> None:
        key = principal.scope
        with self._lock:
            held = self._held.get(key, 0)
            if held >= self.limit:
                raise TooManyRequests(
                    f"{principal.name!r} already has {held} {self.what} open (the limit is {self.limit}); "
                    "close one first", details={"limit": self.limit, "open": held})
            self._held[key] = held + 1

    def release(self, principal: Principal) -> None:
        key = principal.scope
        with self._lock:
            held = self._held.get(key, 0) - 1
            if held > 0:
                self._held[key] = held
            else:
                self._held.pop(key, None)

    def held(self, principal: Principal) -> int:
        """How many this principal holds now."""
        with self._lock:
            return self._held.get(principal.scope, 0)
