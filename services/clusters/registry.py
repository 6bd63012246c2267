"""The cluster registry: the clusters this control plane knows, persisted in the state database.

Kubernetes clients are rebuilt from it at every start, the same way with and without the sandbox: each
cluster is an EKS source (endpoint and CA from DescribeCluster, an STS-presigned token), so an operation
resumed after a restart finds its cluster's client.

Reads come from memory (filled from the table when the registry is made, updated after each write's
commit), so a cluster read can be served on the event loop; this process is the table's only writer (the
data-directory lock).
"""

from __future__ import annotations

import datetime as dt
import sqlite3
import threading
from collections.abc import Sequence

from services.clock import Clock
from services.clusters.models import ClusterRecord, Ownership
from services.db import Database
from services.errors import Conflict, NotFound
from services.kube import KubeClients


def _iso(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _record(row: sqlite3.Row) -> ClusterRecord:
    return ClusterRecord(name=row["name"], region=row["region"], eks_name=row["eks_name"], eks_arn=row["eks_arn"],
                         hyperpod_name=row["hyperpod_name"], hyperpod_arn=row["hyperpod_arn"],
                         ownership=Ownership(row["ownership"]), created_at=_iso(row["created_at"]),
                         created_by=row["created_by"])


class ClusterRegistry:
    def __init__(self, db: Database, clock: Clock, kube: KubeClients) -> None:
        self.db = db
        self.clock = clock
        self.kube = kube
        self._lock = threading.Lock()
        self._records = {r.name: r for r in self._read_all()}

    def _read_all(self) -> list[ClusterRecord]:
        return [_record(r) for r in self.db.query("SELECT * FROM clusters ORDER BY name")]

    def _reread(self, name: str) -> None:
        row = self.db.query_one("SELECT * FROM clusters WHERE name = ?", (name,))
        with self._lock:
            if row is None:
                self._records.pop(name, None)
            else:
                self._records[name] = _record(row)

    def load(self) -> list[ClusterRecord]:
        """Register every known cluster with the Kubernetes client factory (at start-up)."""
        records = self._read_all()
        with self._lock:
            self._records = {r.name: r for r in records}
        for record in records:
            self.kube.register_eks(record.name, record.eks_name, record.region)
        return records

    def list(self) -> list[ClusterRecord]:
        with self._lock:
            return sorted(self._records.values(), key=lambda r: r.name)

    def find(self, name: str) -> ClusterRecord | None:
        with self._lock:
            return self._records.get(name)

    def find_by_arn(self, eks_arn: str) -> ClusterRecord | None:
        with self._lock:
            return next((r for r in self._records.values() if r.eks_arn == eks_arn), None)

    def get(self, name: str) -> ClusterRecord:
        record = self.find(name)
        if record is None:
            known = ", ".join(r.name for r in self.list()) or "none yet (POST /api/v1/clusters/import)"
            raise NotFound(f"no cluster named {name!r} is registered; known: {known}")
        return record

    def add(self, record: ClusterRecord, created_at: float) -> ClusterRecord:
        with self.db.tx() as conn:
            row = conn.execute("SELECT eks_arn FROM clusters WHERE name = ?", (record.name,)).fetchone()
            if row is not None and row["eks_arn"] != record.eks_arn:
                raise Conflict(f"the name {record.name!r} is registered for {row['eks_arn']} already")
            other = conn.execute("SELECT name FROM clusters WHERE eks_arn = ? AND name != ?",
                                 (record.eks_arn, record.name)).fetchone()
            if other is not None:  # one cluster, one name: else two targets would lock one real cluster
                raise Conflict(f"EKS cluster {record.eks_arn} is registered here already as {other['name']!r}",
                               details={"registered_as": other["name"]})
            if row is None:
                conn.execute(
                    "INSERT INTO clusters (name, region, eks_name, eks_arn, hyperpod_name, hyperpod_arn, ownership,"
                    " created_at, created_by) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (record.name, record.region, record.eks_name, record.eks_arn, record.hyperpod_name,
                     record.hyperpod_arn, record.ownership.value, created_at, record.created_by))
        self._reread(record.name)
        self.kube.register_eks(record.name, record.eks_name, record.region)
        return self.get(record.name)

    def set_hyperpod(self, name: str, hyperpod_name: str, hyperpod_arn: str) -> ClusterRecord:
        """Record the HyperPod cluster a created cluster runs (its ARN exists only once HyperPod made it)."""
        with self.db.tx() as conn:
            conn.execute("UPDATE clusters SET hyperpod_name = ?, hyperpod_arn = ? WHERE name = ?",
                         (hyperpod_name, hyperpod_arn, name))
        self._reread(name)
        return self.get(name)

    def remove(self, name: str) -> None:
        """Forget ``name`` unconditionally: for the delete operation itself, once its cluster is gone (it is
        the active operation :meth:`remove_if_idle` would refuse on)."""
        with self.db.tx() as conn:
            conn.execute("DELETE FROM clusters WHERE name = ?", (name,))
        self._reread(name)
        self.kube.forget(name)

    def remove_if_idle(self, name: str, active_statuses: Sequence[str]) -> None:
        """Forget ``name`` unless an operation on it (or on anything in it) is active: checked and deleted in
        one write transaction, so no operation can be submitted between the two."""
        marks = ",".join("?" * len(active_statuses))
        with self.db.tx() as conn:
            busy = [r["id"] for r in conn.execute(
                f"SELECT id FROM operations WHERE status IN ({marks}) AND (target = ? OR substr(target, 1, ?) = ?)",
                (*active_statuses, f"cluster/{name}", len(f"cluster/{name}/"), f"cluster/{name}/"))]
            if busy:
                raise Conflict(f"{name} has active operations ({', '.join(busy)}); wait for them or cancel them "
                               "first (operations_get / operations_cancel)",
                               details={"operations": busy, "status_tool": "operations_get"})
            conn.execute("DELETE FROM clusters WHERE name = ?", (name,))
        self._reread(name)
        self.kube.forget(name)
