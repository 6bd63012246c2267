"""Backups of the control plane's own state database, as an operation.

The state database holds every operation, the audit trail and the token hashes; losing it loses the
history of what was done to the clusters. ``backup.create`` takes a consistent online copy with SQLite's
backup API (safe while the server writes), then verifies it with ``PRAGMA integrity_check``, then prunes
the oldest backups beyond the retention count. The copy is written to a temporary name and renamed, so a
file under its final name is always complete, and it is a single file (rollback journal, no -wal/-shm).

Backups must not fill the disk: a request is refused before any operation row when free space is below
twice the database's size (plus the configured reserve), and a request that arrives while a backup runs
joins that backup instead of starting another copy.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any

from pydantic import Field

from services.auth import Principal, Role
from services.db import Database
from services.errors import Conflict, NotFound, Permanent
from services.models import RequestModel, ResponseModel
from services.operation_views import OperationView, iso
from services.operations import Engine, Observed, OperationKind, Stage, StageContext
from services.verbs import verb

KIND = "backup.create"
PATTERN = "state-*.sqlite"


class BackupCreate(RequestModel):
    """Copy the state database (operations, audit log, token hashes) to the data directory's backups/."""

    label: str = Field("manual", min_length=1, max_length=40, pattern=r"^[a-z0-9][a-z0-9-]*$",
                       description="a short tag in the file name, e.g. 'before-upgrade'")


class BackupInfo(ResponseModel):
    name: str
    size_bytes: int
    created_at: str = Field(..., description="when the backup was written (ISO 8601, UTC)")


class Backups:
    """The ``backups`` noun: ``list_backups``, ``get_backup`` and ``create_backup`` (an operation)."""

    def __init__(self, db: Database, directory: Path, engine: Engine, *, keep: int = 10,
                 reserve_bytes: int = 0) -> None:
        self.db = db
        self.directory = directory
        self.keep = keep
        self.reserve_bytes = reserve_bytes
        self._engine = engine
        engine.register(self.kind())

    @verb(Role.ADMIN)
    def list_backups(self, principal: Principal) -> list[BackupInfo]:
        """Backups newest first (admin: their names and sizes say how much state there is)."""
        return self.list()

    @verb(Role.OPERATOR)
    def create_backup(self, principal: Principal, request: BackupCreate,
                      idempotency_key: str | None = None) -> tuple[OperationView, bool]:
        """Submit a ``backup.create`` (free space prechecked; a request while one runs joins it).
        Returns the operation and whether this call created it."""
        return self._engine.submit(KIND, request, principal, idempotency_key)

    def path_for(self, ctx: StageContext[BackupCreate]) -> Path:
        return self.directory / f"state-{ctx.request.label}-{ctx.operation_id}.sqlite"

    def files(self) -> list[tuple[int, Path]]:
        """(mtime in ns, path) of every backup, newest first (the snapshot makes mtimes strictly increase)."""
        if not self.directory.is_dir():
            return []
        found = []
        for path in self.directory.glob(PATTERN):
            try:
                found.append((path.stat().st_mtime_ns, path))
            except FileNotFoundError:  # pruned meanwhile
                continue
        return sorted(found, key=lambda item: (item[0], item[1].name), reverse=True)

    def list(self) -> list[BackupInfo]:
        out = []
        for mtime, path in self.files():
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                continue
            out.append(BackupInfo(name=path.name, size_bytes=size, created_at=iso(mtime / 1e9) or ""))
        return out

    def get(self, name: str) -> BackupInfo:
        for backup in self.list():
            if backup.name == name:
                return backup
        raise NotFound(f"no backup named {name!r}")

    def check_space(self, _request: Any = None) -> None:
        """Refuse a backup the disk cannot take: free space below twice the database's size (+ reserve)."""
        where = self.directory if self.directory.is_dir() else self.directory.parent
        free = shutil.disk_usage(where).free
        size = self.db.size_bytes()
        needed = 2 * size + self.reserve_bytes
        if free < needed:
            reserve = f" plus the {self.reserve_bytes}-byte reserve" if self.reserve_bytes else ""
            raise Conflict(
                f"not enough free space for a backup: {free} bytes free in {where}, {needed} needed (twice the "
                f"state database's {size} bytes{reserve}); delete old backups or free disk space",
                details={"free_bytes": free, "needed_bytes": needed, "database_bytes": size})

    def kind(self) -> OperationKind[BackupCreate]:
        return OperationKind(
            name=KIND,
            request_model=BackupCreate,
            stages=(Snapshot(self), Verify(self), Prune(self)),
            target=lambda request: "state-db",
            description="online copy of the state database, an integrity check, then pruning of old backups",
            precheck=self.check_space,
            coalesce=True,
        )


class Snapshot(Stage[BackupCreate]):
    name = "snapshot"

    def __init__(self, backups: Backups) -> None:
        self.backups = backups

    def observe(self, ctx: StageContext[BackupCreate]) -> Observed:
        return Observed.DONE if self.backups.path_for(ctx).exists() else Observed.ABSENT

    def act(self, ctx: StageContext[BackupCreate]) -> None:
        final = self.backups.path_for(ctx)
        final.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        partial = final.with_suffix(".partial")
        partial.unlink(missing_ok=True)
        self.backups.db.backup_to(partial)
        os.chmod(partial, 0o600)
        # Retention prunes by age: give the copy a time later than every other backup's, since the file
        # system's timestamps can be coarser than the time between two backups
        newest = max((mtime for mtime, _ in self.backups.files()), default=0)
        stamp = max(time.time_ns(), newest + 1000)
        os.utime(partial, ns=(stamp, stamp))
        with open(partial, "rb") as handle:
            os.fsync(handle.fileno())
        partial.rename(final)

    def result(self, ctx: StageContext[BackupCreate]) -> dict[str, Any]:
        path = self.backups.path_for(ctx)
        return {"name": path.name, "size_bytes": path.stat().st_size}


class Verify(Stage[BackupCreate]):
    name = "verify"
    read_only = True

    def __init__(self, backups: Backups) -> None:
        self.backups = backups

    def observe(self, ctx: StageContext[BackupCreate]) -> Observed:
        # Reading is the whole stage: it is done as soon as it has looked. Read-only and immutable: the
        # copy is a single file, and opening it this way writes nothing beside it.
        path = self.backups.path_for(ctx)
        conn = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
        try:
            verdict = conn.execute("PRAGMA integrity_check").fetchone()[0]
            operations = conn.execute("SELECT COUNT(*) FROM operations").fetchone()[0]
        finally:
            conn.close()
        if verdict != "ok":
            raise Permanent(f"backup {path.name} failed its integrity check: {verdict}")
        ctx.data["operations"] = operations
        return Observed.DONE

    def result(self, ctx: StageContext[BackupCreate]) -> dict[str, Any]:
        return {"integrity": "ok", "operations": ctx.data.get("operations", 0)}

    def report(self, ctx: StageContext[BackupCreate]) -> str:
        return f"integrity check passed; the copy holds {ctx.data.get('operations', 0)} operations"


class Prune(Stage[BackupCreate]):
    """Keep the newest ``keep`` backups (this one among them); delete the rest, oldest first."""

    name = "prune"

    def __init__(self, backups: Backups) -> None:
        self.backups = backups

    def _surplus(self, ctx: StageContext[BackupCreate]) -> list[Path]:
        own = self.backups.path_for(ctx)
        others = [path for _, path in self.backups.files() if path != own]
        return others[max(0, self.backups.keep - 1):]  # newest first: what lies past the retention count

    def observe(self, ctx: StageContext[BackupCreate]) -> Observed:
        return Observed.ABSENT if self._surplus(ctx) else Observed.DONE

    def act(self, ctx: StageContext[BackupCreate]) -> None:
        removed = ctx.data.setdefault("removed", [])
        for path in reversed(self._surplus(ctx)):  # oldest first
            path.unlink(missing_ok=True)
            removed.append(path.name)

    def result(self, ctx: StageContext[BackupCreate]) -> dict[str, Any]:
        return {"kept": min(len(self.backups.files()), self.backups.keep), "removed": ctx.data.get("removed", [])}
