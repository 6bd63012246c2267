"""The state database: one SQLite file in WAL mode under the data directory.

Each thread gets its own connection (SQLite connections are not shared across threads); writes that must
be atomic go through :meth:`Database.tx`, which takes the write lock up front (``BEGIN IMMEDIATE``) so a
read-then-write never races another writer. Schema changes are numbered migrations on ``user_version``.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MIGRATIONS: list[str] = [
    """
    CREATE TABLE operations (
        id TEXT PRIMARY KEY,
        kind TEXT NOT NULL,
        target TEXT NOT NULL,
        status TEXT NOT NULL,
        request TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        idempotency_key TEXT UNIQUE,
        actor TEXT NOT NULL,
        face TEXT NOT NULL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        due_at REAL,
        claimed INTEGER NOT NULL DEFAULT 0,
        cancel_requested INTEGER NOT NULL DEFAULT 0,
        version INTEGER NOT NULL DEFAULT 1,
        conditions TEXT NOT NULL DEFAULT '[]',
        result TEXT,
        error TEXT
    );
    CREATE INDEX operations_status ON operations(status, due_at);
    CREATE INDEX operations_fingerprint ON operations(fingerprint, status);
    CREATE INDEX operations_created ON operations(created_at, id);
    CREATE TABLE stages (
        operation_id TEXT NOT NULL REFERENCES operations(id) ON DELETE CASCADE,
        idx INTEGER NOT NULL,
        name TEXT NOT NULL,
        status TEXT NOT NULL,
        phase TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        acted INTEGER NOT NULL DEFAULT 0,
        started_at REAL,
        finished_at REAL,
        message TEXT NOT NULL DEFAULT '',
        data TEXT NOT NULL DEFAULT '{}',
        result TEXT,
        PRIMARY KEY (operation_id, idx)
    );
    CREATE TABLE audit (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        ts REAL NOT NULL,
        actor TEXT NOT NULL,
        role TEXT NOT NULL,
        face TEXT NOT NULL,
        action TEXT NOT NULL,
        target TEXT NOT NULL,
        request TEXT NOT NULL,
        outcome TEXT NOT NULL,
        operation_id TEXT,
        detail TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX audit_ts ON audit(ts);
    CREATE TABLE tokens (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        role TEXT NOT NULL,
        hash TEXT NOT NULL,
        created_at REAL NOT NULL,
        created_by TEXT NOT NULL,
        last_used_at REAL,
        revoked_at REAL
    );
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    """,
    # 2: the starter's role, so the audit row written when an operation ends names it correctly
    """
    ALTER TABLE operations ADD COLUMN role TEXT NOT NULL DEFAULT 'operator';
    """,
    # 3: transient failures in a row (reset by any successful step), apart from act attempts
    """
    ALTER TABLE stages ADD COLUMN transients INTEGER NOT NULL DEFAULT 0;
    """,
    # 4: server-side dashboard sessions (ended by sign-out, idle time, lifetime or revocation); the client's
    # own claim of what it is (X-InstantStart-Face), kept apart from the face the server saw
    """
    CREATE TABLE sessions (
        id_hash TEXT PRIMARY KEY,
        token_id TEXT NOT NULL,
        xsrf_hash TEXT NOT NULL,
        created_at REAL NOT NULL,
        last_seen_at REAL NOT NULL,
        expires_at REAL NOT NULL,
        ended_at REAL,
        end_reason TEXT
    );
    CREATE INDEX sessions_token ON sessions(token_id);
    ALTER TABLE audit ADD COLUMN client TEXT NOT NULL DEFAULT '';
    ALTER TABLE operations ADD COLUMN client TEXT NOT NULL DEFAULT '';
    """,
    # 5: what the engine's own backoff did for a stage: transient failures retried and the time backed off
    """
    ALTER TABLE stages ADD COLUMN retries INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE stages ADD COLUMN backoff REAL NOT NULL DEFAULT 0;
    """,
    # 6: the cluster registry (services/clusters/registry.py)
    """
    CREATE TABLE clusters (
        name TEXT PRIMARY KEY,
        region TEXT NOT NULL,
        eks_name TEXT NOT NULL,
        eks_arn TEXT NOT NULL,
        hyperpod_name TEXT,
        hyperpod_arn TEXT,
        ownership TEXT NOT NULL CHECK (ownership IN ('managed', 'imported')),
        created_at REAL NOT NULL,
        created_by TEXT NOT NULL
    );
    """,
    # 7: one registration per EKS cluster (two names would be two lock targets for one real cluster)
    """
    CREATE UNIQUE INDEX clusters_eks_arn ON clusters(eks_arn);
    """,
    # 8: what a cluster's stages are about to create or created where AWS has no tags to find it by
    # (services/clusters/intents.py: a VPC CIDR block added to a user's VPC)
    """
    CREATE TABLE resource_intents (
        cluster TEXT NOT NULL,
        kind TEXT NOT NULL,
        scope TEXT NOT NULL,
        key TEXT NOT NULL,
        ref TEXT,
        recorded_at REAL NOT NULL,
        PRIMARY KEY (cluster, kind, scope, key)
    );
    """,
]


def dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


class Database:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._private_files()
        self._migrate()

    def _private_files(self) -> None:
        """The database and its WAL/SHM files are 0600: token hashes and the audit trail are in them.

        SQLite creates ``-wal`` and ``-shm`` with the database file's mode, so making the database first
        with 0600 covers them; files an older version left 0644 are tightened here."""
        os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
        for suffix in ("", "-wal", "-shm"):
            name = f"{self.path}{suffix}"
            with suppress(FileNotFoundError):
                if os.stat(name).st_mode & 0o077:
                    try:
                        os.chmod(name, 0o600)
                    except PermissionError:  # another user's file: say so, the directory still guards it
                        log.warning("%s is readable by others and not ours to chmod; run chmod 600 on it", name)

    def connection(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=10.0, isolation_level=None, check_same_thread=False)
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
            conn.execute("PRAGMA busy_timeout=10000")
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        return conn

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """A write transaction holding SQLite's write lock from its first statement."""
        conn = self.connection()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException:
            # also when COMMIT itself fails (disk full, I/O): never leave this thread's connection in a transaction
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def query(self, sql: str, params: tuple[Any, ...] | list[Any] = ()) -> list[sqlite3.Row]:
        return list(self.connection().execute(sql, params))

    def query_one(self, sql: str, params: tuple[Any, ...] | list[Any] = ()) -> sqlite3.Row | None:
        row: sqlite3.Row | None = self.connection().execute(sql, params).fetchone()
        return row

    def ping(self) -> bool:
        return self.query_one("SELECT 1") is not None

    def _migrate(self) -> None:
        with self.tx() as conn:
            current = int(conn.execute("PRAGMA user_version").fetchone()[0])
            for number, script in enumerate(MIGRATIONS[current:], start=current + 1):
                for statement in script.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute(f"PRAGMA user_version={number}")

    def backup_to(self, dest: Path) -> None:
        """A consistent online copy (SQLite's backup API), safe while others write.

        The copy is a single self-contained file: the page copy carries WAL mode over, so the copy is
        switched to a rollback journal before it is closed (opening it later leaves no -wal/-shm beside it)."""
        os.close(os.open(dest, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600))
        target = sqlite3.connect(dest, isolation_level=None)
        try:
            self.connection().backup(target)
            target.execute("PRAGMA journal_mode=DELETE")
        finally:
            target.close()

    def size_bytes(self) -> int:
        """The database's size on disk, with its write-ahead log."""
        total = 0
        for suffix in ("", "-wal"):
            with suppress(FileNotFoundError):
                total += os.stat(f"{self.path}{suffix}").st_size
        return total

    def close(self) -> None:
        with self._lock:
            for conn in self._all:
                conn.close()
            self._all.clear()
        self._local = threading.local()
