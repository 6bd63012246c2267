"""What the status summary shows about operations, kept in memory: counts per status, the newest active
operations and the newest failures.

Every write of an operation is followed by :meth:`OperationStore.publish`, which reads the operation's new
view and hands it to :meth:`OperationIndex.apply` (under the index's lock, so views are applied in the
order they were read and the index always ends at the latest committed state). Nothing here reads SQLite
on a reader's path: ``GET /api/v1/status`` answers from memory, on the event loop. The index is built from
the database when the store is made (at start, before operations are resumed); a view that leaves a
shortlist whose status still has older members refills it from the database on the writer's thread.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable

from services.operation_views import ACTIVE, OperationView, Status

ACTIVE_SHOWN = 20  # the status summary's active operations
FAILURES_SHOWN = 5  # and its recent failures
FINAL = frozenset({Status.SUCCEEDED, Status.CANCELLED})  # no edge leaves these (operation_views.TRANSITIONS)

Loader = Callable[[frozenset[Status], int], list[OperationView]]  # the newest views with these statuses


class _Newest:
    """The ``size`` newest views whose status is in ``statuses``, newest first (the store's list order)."""

    def __init__(self, statuses: frozenset[Status], size: int) -> None:
        self.statuses = statuses
        self.size = size
        self.views: list[OperationView] = []

    def apply(self, view: OperationView) -> bool:
        """Take the view's new state; True when it left the list (the caller may need to refill it)."""
        before = len(self.views)
        self.views = [v for v in self.views if v.id != view.id]
        left = len(self.views) < before
        if view.status in self.statuses:
            self.views.append(view)
            self.views.sort(key=lambda v: (v.created_at, v.id), reverse=True)
            del self.views[self.size:]
            return False
        return left


class OperationIndex:
    def __init__(self, load: Loader) -> None:
        self._load = load
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._changeable: dict[str, Status] = {}  # every operation whose status may still change
        self._new: set[str] = set()  # inserted, not yet applied
        self._active = _Newest(ACTIVE, ACTIVE_SHOWN)
        self._failed = _Newest(frozenset({Status.FAILED}), FAILURES_SHOWN)
        #: bumped by every change of what counts(), active() and recent_failures() answer
        self.version = 0

    def rebuild(self, counts: dict[str, int], changeable: Iterable[tuple[str, Status]]) -> None:
        with self._lock:
            self._counts = Counter(counts)
            self._changeable = dict(changeable)
            self._new.clear()
            self.version += 1
        self.reload()

    def reload(self) -> None:
        """Read the shortlists' views again (a kind registered since: its stages' deadlines and flags)."""
        with self._lock:
            for shortlist in (self._active, self._failed):
                shortlist.views = self._load(shortlist.statuses, shortlist.size)
            self.version += 1

    def inserted(self, op_id: str) -> None:
        """A row was written for ``op_id``: its first view is a new operation, whatever its status by then."""
        with self._lock:
            self._new.add(op_id)

    def apply(self, read: Callable[[], OperationView]) -> OperationView:
        """Read an operation's current view (under the lock: reads and applications stay in order) and
        account for it."""
        with self._lock:
            view = read()
            previous = self._changeable.pop(view.id, None)
            if previous is not None:
                self._counts[previous.value] -= 1
            elif view.id in self._new:
                self._new.discard(view.id)
            else:  # a finished operation published again: already counted, in no shortlist
                return view
            self.version += 1
            self._counts[view.status.value] += 1
            if view.status not in FINAL:
                self._changeable[view.id] = view.status
            for shortlist in (self._active, self._failed):
                if shortlist.apply(view) and self._total(shortlist.statuses) > len(shortlist.views):
                    shortlist.views = self._load(shortlist.statuses, shortlist.size)
            return view

    def _total(self, statuses: frozenset[Status]) -> int:
        return sum(self._counts[s.value] for s in statuses)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {status: n for status, n in self._counts.items() if n > 0}

    def active(self, limit: int = ACTIVE_SHOWN) -> list[OperationView]:
        with self._lock:
            return self._active.views[:limit]

    def recent_failures(self, limit: int = FAILURES_SHOWN) -> list[OperationView]:
        with self._lock:
            return self._failed.views[:limit]
