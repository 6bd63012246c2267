"""The per-cluster object store: objects, the resourceVersion clock, watch history and indexes.

It knows nothing about Kubernetes semantics beyond ``metadata.resourceVersion``: the cluster layer
(:mod:`.cluster`) decides *what* to write, the store makes every write atomic, stamps the next
resourceVersion, appends the change to a bounded history (older entries are compacted away, which is
what makes a watch from an old resourceVersion answer ``410 Gone``) and tells subscribers.

Stored objects are treated as immutable: a write always stores a new dict. That lets readers
serialise an object outside the lock and lets the persister snapshot by reference.

All methods are thread-safe (one re-entrant lock per store) because simulated controllers and the
in-process API may run on other threads than the Tornado loop. Subscribers are called with the lock
held and must only hand the event over (e.g. ``loop.call_soon_threadsafe``), never block.
"""

from __future__ import annotations

import threading
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

Key = tuple[str, str]  # (group, plural)
Loc = tuple[str, str]  # (namespace or "", name)
Obj = dict[str, Any]


@dataclass(frozen=True)
class WatchEvent:
    rv: int
    type: str  # ADDED, MODIFIED, DELETED
    key: Key
    obj: Obj
    old: Obj | None = None  # the object before the change (selector-filtered watches compare both)


Subscriber = Callable[[WatchEvent], None]


class Store:
    def __init__(self, history: int = 20_000) -> None:
        self.lock = threading.RLock()
        self.rv = 0
        self.objects: dict[Key, dict[Loc, Obj]] = defaultdict(dict)
        self.by_uid: dict[str, tuple[Key, Loc]] = {}
        self.dependents: dict[str, set[tuple[Key, Loc]]] = defaultdict(set)
        self.history: deque[WatchEvent] = deque()
        self.max_history = history
        self.compacted_rv = 0
        self._subscribers: list[Subscriber] = []

    @contextmanager
    def locked(self) -> Iterator[None]:
        with self.lock:
            yield

    # --- reads ------------------------------------------------------------------------------------------

    def get(self, key: Key, loc: Loc) -> Obj | None:
        return self.objects.get(key, {}).get(loc)  # never ``objects[key]``: that would insert without the lock

    def items(self, key: Key, namespace: str | None = None) -> list[tuple[Loc, Obj]]:
        with self.lock:
            entries = list(self.objects.get(key, {}).items())
        if namespace:
            entries = [e for e in entries if e[0][0] == namespace]
        entries.sort(key=lambda e: e[0])
        return entries

    def locate_uid(self, uid: str) -> tuple[Key, Loc] | None:
        return self.by_uid.get(uid)

    def dependents_of(self, uid: str) -> list[tuple[Key, Loc]]:
        with self.lock:
            return sorted(self.dependents.get(uid, ()))

    def count(self) -> int:
        with self.lock:
            return sum(len(v) for v in self.objects.values())

    # --- writes -----------------------------------------------------------------------------------------

    def put(self, key: Key, loc: Loc, obj: Obj, event: str) -> Obj:
        """Store ``obj`` under a fresh resourceVersion and record the event (``ADDED``/``MODIFIED``)."""
        with self.lock:
            self.rv += 1
            obj["metadata"]["resourceVersion"] = str(self.rv)
            old = self.objects[key].get(loc)
            if old is not None:
                self._unindex(key, loc, old)
            self.objects[key][loc] = obj
            self._index(key, loc, obj)
            self._record(WatchEvent(self.rv, event, key, obj, old))
            return obj

    def remove(self, key: Key, loc: Loc) -> Obj | None:
        """Delete the object; the ``DELETED`` event carries it with a new resourceVersion."""
        with self.lock:
            old = self.objects[key].pop(loc, None)
            if old is None:
                return None
            self._unindex(key, loc, old)
            self.rv += 1
            final = {**old, "metadata": {**old["metadata"], "resourceVersion": str(self.rv)}}
            self._record(WatchEvent(self.rv, "DELETED", key, final, old))
            return final

    def drop_key(self, key: Key) -> list[tuple[Loc, Obj]]:
        """Delete every object of one resource (a CRD went away); returns what was deleted."""
        with self.lock:
            removed = []
            for loc in sorted(self.objects.get(key, {})):
                final = self.remove(key, loc)
                if final is not None:
                    removed.append((loc, final))
            self.objects.pop(key, None)
            return removed

    def load(self, rv: int, objects: dict[Key, dict[Loc, Obj]]) -> None:
        """Replace the whole state (restore from a snapshot); history starts empty at ``rv``."""
        with self.lock:
            self.objects = defaultdict(dict, objects)
            self.by_uid.clear()
            self.dependents.clear()
            for key, objs in self.objects.items():
                for loc, obj in objs.items():
                    self._index(key, loc, obj)
            self.rv = rv
            self.compacted_rv = rv
            self.history.clear()

    # --- watch ------------------------------------------------------------------------------------------

    def subscribe(self, since: int | None, callback: Subscriber) -> list[WatchEvent] | None:
        """Atomically return the events after ``since`` and subscribe for later ones.

        Returns ``None`` (and does not subscribe) when ``since`` is older than the retained history.
        """
        with self.lock:
            backlog: list[WatchEvent] = []
            if since is not None:
                if since < self.compacted_rv:
                    return None
                backlog = [e for e in self.history if e.rv > since]
            self._subscribers.append(callback)
            return backlog

    def unsubscribe(self, callback: Subscriber) -> None:
        with self.lock:
            if callback in self._subscribers:
                self._subscribers.remove(callback)

    def compact(self) -> None:
        """Forget all history (tests use it to provoke ``410 Gone``)."""
        with self.lock:
            self.history.clear()
            self.compacted_rv = self.rv

    # --- internals --------------------------------------------------------------------------------------

    def _record(self, event: WatchEvent) -> None:
        self.history.append(event)
        while len(self.history) > self.max_history:
            self.compacted_rv = self.history.popleft().rv
        for cb in list(self._subscribers):
            cb(event)

    def _index(self, key: Key, loc: Loc, obj: Obj) -> None:
        meta = obj["metadata"]
        if uid := meta.get("uid"):
            self.by_uid[uid] = (key, loc)
        for ref in meta.get("ownerReferences") or ():
            if ref.get("uid"):
                self.dependents[ref["uid"]].add((key, loc))

    def _unindex(self, key: Key, loc: Loc, obj: Obj) -> None:
        meta = obj["metadata"]
        if (uid := meta.get("uid")) and self.by_uid.get(uid) == (key, loc):
            del self.by_uid[uid]
        for ref in meta.get("ownerReferences") or ():
            deps = self.dependents.get(ref.get("uid", ""))
            if deps is not None:
                deps.discard((key, loc))
                if not deps:
                    del self.dependents[ref["uid"]]
