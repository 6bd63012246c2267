"""The state database: one SQLite file in WAL mode under the data directory.

Each thread gets its own connection (SQLite connections are not shared across threads); writes that must
be atomic go through :meth:`Database.tx`, which takes the write lock up front (``BEGIN IMMEDIATE``) so a
read-then-write never races another writer. Schema changes are numbered migrations on ``user_version``.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

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
        self._migrate()

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
        """A consistent online copy (SQLite's backup API), safe while others write."""
        target = sqlite3.connect(dest)
        try:
            self.connection().backup(target)
        finally:
            target.close()

    def close(self) -> None:
        with self._lock:
            for conn in self._all:
                conn.close()
            self._all.clear()
        self._local = threading.local()
