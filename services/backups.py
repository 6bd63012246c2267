"""Backups of the control plane's own state database, as an operation.

The state database holds every operation, the audit trail and the token hashes; losing it loses the
history of what was done to the clusters. ``backup.create`` takes a consistent online copy with SQLite's
backup API (safe while the server writes), then verifies it with ``PRAGMA integrity_check``. The copy
is written to a temporary name and renamed, so a file under its final name is always complete.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

from pydantic import Field

from services.db import Database
from services.errors import NotFound, Permanent
from services.models import RequestModel, ResponseModel
from services.operations import Observed, OperationKind, Stage, StageContext

KIND = "backup.create"


class BackupCreate(RequestModel):
    """Copy the state database (operations, audit log, token hashes) to the data directory's backups/."""

    label: str = Field("manual", min_length=1, max_length=40, pattern=r"^[a-z0-9][a-z0-9-]*$",
                       description="a short tag in the file name, e.g. 'before-upgrade'")


class BackupInfo(ResponseModel):
    name: str
    size_bytes: int
    created_at: float


class Backups:
    def __init__(self, db: Database, directory: Path) -> None:
        self.db = db
        self.directory = directory

    def path_for(self, ctx: StageContext) -> Path:
        return self.directory / f"state-{ctx.request['label']}-{ctx.operation_id}.sqlite"

    def list(self) -> list[BackupInfo]:
        if not self.directory.is_dir():
            return []
        out = [BackupInfo(name=p.name, size_bytes=p.stat().st_size, created_at=p.stat().st_mtime)
               for p in self.directory.glob("state-*.sqlite")]
        return sorted(out, key=lambda b: b.created_at, reverse=True)

    def get(self, name: str) -> BackupInfo:
        for backup in self.list():
            if backup.name == name:
                return backup
        raise NotFound(f"no backup named {name!r}")

    def kind(self) -> OperationKind:
        return OperationKind(
            name=KIND,
            request_model=BackupCreate,
            stages=(Snapshot(self), Verify(self)),
            target=lambda request: "state-db",
            description="online copy of the state database, then an integrity check",
        )


class Snapshot(Stage):
    name = "snapshot"

    def __init__(self, backups: Backups) -> None:
        self.backups = backups

    def observe(self, ctx: StageContext) -> Observed:
        return Observed.DONE if self.backups.path_for(ctx).exists() else Observed.ABSENT

    def act(self, ctx: StageContext) -> None:
        final = self.backups.path_for(ctx)
        final.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        partial = final.with_suffix(".partial")
        partial.unlink(missing_ok=True)
        self.backups.db.backup_to(partial)
        os.chmod(partial, 0o600)
        with open(partial, "rb") as handle:
            os.fsync(handle.fileno())
        partial.rename(final)

    def result(self, ctx: StageContext) -> dict[str, Any]:
        path = self.backups.path_for(ctx)
        return {"name": path.name, "size_bytes": path.stat().st_size}


class Verify(Stage):
    name = "verify"

    def __init__(self, backups: Backups) -> None:
        self.backups = backups

    def observe(self, ctx: StageContext) -> Observed:
        # Reading is the whole stage: it is done as soon as it has looked.
        path = self.backups.path_for(ctx)
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            verdict = conn.execute("PRAGMA integrity_check").fetchone()[0]
            operations = conn.execute("SELECT COUNT(*) FROM operations").fetchone()[0]
        finally:
            conn.close()
        if verdict != "ok":
            raise Permanent(f"backup {path.name} failed its integrity check: {verdict}")
        ctx.data["operations"] = operations
        return Observed.DONE

    def result(self, ctx: StageContext) -> dict[str, Any]:
        return {"integrity": "ok", "operations": ctx.data.get("operations", 0)}

