"""Write-behind persistence of every cluster's objects to SQLite, so state survives a restart.

Each store change marks ``(cluster, resource, namespace, name)`` dirty; a background thread wakes after
a short debounce, takes the current objects by reference under the store lock (they are immutable) and
writes them in one transaction outside it. Nothing here runs on the event loop, and a burst of 10,000
creates costs a handful of transactions, not 10,000 fsyncs. ``flush()`` writes synchronously: the
HTTP front calls it before answering a mutation (concurrent callers share one transaction), so a
change a client was told about survives a crash of the sandbox. Watch history is not persisted: after
a restart every watch must relist, which is what a real API server's compaction would also force.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .store import Key, Loc, Obj, WatchEvent

if TYPE_CHECKING:
    from .cluster import Cluster

Dirty = tuple[str, Key, Loc]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS clusters (name TEXT PRIMARY KEY, rv INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS objects (
    cluster TEXT NOT NULL, grp TEXT NOT NULL, plural TEXT NOT NULL, ns TEXT NOT NULL, name TEXT NOT NULL,
    body TEXT NOT NULL, PRIMARY KEY (cluster, grp, plural, ns, name));
"""


class Persister:
    def __init__(self, path: Path, debounce: float = 0.2) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), check_same_thread=False)
        self._db.executescript("PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;" + _SCHEMA)
        self._db_lock = threading.Lock()
        self._debounce = debounce
        self._clusters: dict[str, Cluster] = {}
        self._dirty: set[Dirty] = set()
        self._dirty_clusters: set[str] = set()
        self._removed_clusters: set[str] = set()
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()  # a flush returns only once everything dirty before it is committed
        self._wake = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="kube-persister", daemon=True)
        self._thread.start()

    def load(self) -> dict[str, tuple[int, dict[Key, dict[Loc, Obj]]]]:
        """Everything stored: cluster name -> (resourceVersion, objects)."""
        out: dict[str, tuple[int, dict[Key, dict[Loc, Obj]]]] = {}
        with self._db_lock:
            for name, rv in self._db.execute("SELECT name, rv FROM clusters"):
                out[name] = (int(rv), {})
            rows = self._db.execute("SELECT cluster, grp, plural, ns, name, body FROM objects").fetchall()
        for cluster, grp, plural, ns, name, body in rows:
            if cluster in out:
                out[cluster][1].setdefault((grp, plural), {})[(ns, name)] = json.loads(body)
        return out

    def attach(self, cluster: Cluster) -> None:
        self._clusters[cluster.name] = cluster
        name = cluster.name

        def on_event(event: WatchEvent) -> None:
            meta = event.obj["metadata"]
            with self._lock:
                self._dirty.add((name, event.key, (meta.get("namespace", ""), meta["name"])))
                self._dirty_clusters.add(name)
            self._wake.set()

        with self._lock:
            pending_removal = name in self._removed_clusters
            self._removed_clusters.discard(name)
        if pending_removal:  # a cluster deleted and created again: its old rows must not come back
            with self._db_lock, self._db:
                self._db.execute("DELETE FROM objects WHERE cluster = ?", (name,))
                self._db.execute("DELETE FROM clusters WHERE name = ?", (name,))
        cluster.store.subscribe(None, on_event)
        with self._lock:
            self._dirty_clusters.add(name)
        self._wake.set()

    def forget(self, name: str) -> None:
        self._clusters.pop(name, None)
        with self._lock:
            self._removed_clusters.add(name)
            self._dirty = {d for d in self._dirty if d[0] != name}
            self._dirty_clusters.discard(name)
        self._wake.set()

    def flush(self) -> None:
        """Commit everything changed so far (the emulator calls it before answering a mutation)."""
        with self._flush_lock:
            self._flush()

    def _flush(self) -> None:
        with self._lock:
            dirty, self._dirty = self._dirty, set()
            clusters, self._dirty_clusters = self._dirty_clusters, set()
            removed, self._removed_clusters = self._removed_clusters, set()
        if not (dirty or clusters or removed):
            return
        writes: list[tuple[Dirty, Obj | None]] = []
        rvs: list[tuple[str, int]] = []
        for name in clusters:
            cluster = self._clusters.get(name)
            if cluster is None:
                continue
            with cluster.store.lock:
                rvs.append((name, cluster.store.rv))
                writes.extend((d, cluster.store.get(d[1], d[2])) for d in dirty if d[0] == name)
        rows = [(d[0], d[1][0], d[1][1], d[2][0], d[2][1], json.dumps(obj)) for d, obj in writes if obj is not None]
        gone = [(d[0], d[1][0], d[1][1], d[2][0], d[2][1]) for d, obj in writes if obj is None]
        with self._db_lock, self._db:
            for name in removed:
                self._db.execute("DELETE FROM objects WHERE cluster = ?", (name,))
                self._db.execute("DELETE FROM clusters WHERE name = ?", (name,))
            self._db.executemany("INSERT OR REPLACE INTO clusters (name, rv) VALUES (?, ?)", rvs)
            self._db.executemany("INSERT OR REPLACE INTO objects VALUES (?, ?, ?, ?, ?, ?)", rows)
            self._db.executemany("DELETE FROM objects WHERE cluster = ? AND grp = ? AND plural = ? AND ns = ? "
                                 "AND name = ?", gone)

    def close(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=5)
        self.flush()
        with self._db_lock:
            self._db.close()

    def _run(self) -> None:
        while not self._stop:
            self._wake.wait()
            if self._stop:
                return
            self._wake.clear()
            time.sleep(self._debounce)
            self.flush()


def stored_cluster_names(path: Path) -> list[str]:
    """The clusters a persisted emulator holds, read without opening it for writing (CLI, status)."""
    if not path.exists():
        return []
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return sorted(name for (name,) in db.execute("SELECT name FROM clusters"))
    except sqlite3.OperationalError:
        return []
    finally:
        db.close()
