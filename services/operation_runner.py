"""The runner: a scheduler thread hands due operations to a worker pool, one claim per operation.

It takes the data-directory lock (one engine per state database), releases the claims a dead process left
(those operations run again from their stored phase) and wakes when work is submitted or falls due. What a
step does is the stepper's business; what is stored, the store's.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from services.db import loads
from services.errors import ServiceError
from services.operation_stepper import Stepper
from services.operation_store import OperationStore
from services.operation_views import OperationView, Status, set_condition

log = logging.getLogger(__name__)


class DataDirLocked(ServiceError):
    code = "data_dir_locked"
    http_status = 409


def lock_data_dir(path: Path) -> int:
    """Take the data directory's exclusive lock (a held ``flock`` on ``path``); the open descriptor holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DataDirLocked(f"another instantstart process is running on {path.parent}") from None
    return fd


class Runner:
    def __init__(self, store: OperationStore, stepper: Stepper, *, workers: int, lock_path: Path | None) -> None:
        self.store = store
        self.stepper = stepper
        self.db = store.db
        self.clock = store.clock
        self.workers = workers
        self._lock_path = lock_path
        self._lock_fd: int | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._busy: set[str] = set()
        self._busy_lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._scheduler: threading.Thread | None = None

    def acquire_lock(self) -> None:
        """Take the data-dir lock (once): the first step of start-up, before anything else touches the data."""
        if self._lock_path is None or self._lock_fd is not None:
            return
        self._lock_fd = lock_data_dir(self._lock_path)

    def adopt_lock(self, fd: int) -> None:
        """The lock was taken before this engine existed (``lock_data_dir``): hold it from now on."""
        self._lock_fd = fd

    def start(self) -> None:
        """Take the data-dir lock (unless already held), resume what a previous process left unfinished, start
        the workers. The composition root may take the lock first, bring up what resumed operations need (the
        sandbox, the cluster registry), then call this."""
        self.acquire_lock()
        self.resume()
        self._stop.clear()
        self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="op-worker")
        self._scheduler = threading.Thread(target=self._schedule_loop, name="op-scheduler", daemon=True)
        self._scheduler.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._scheduler is not None:
            self._scheduler.join(timeout)
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    @property
    def running(self) -> bool:
        return self._scheduler is not None and self._scheduler.is_alive() and not self._stop.is_set()

    def wake(self) -> None:
        self._wake.set()

    def resume(self) -> int:
        """Release every claim left by a dead process: those operations run again from their phase."""
        now = self.clock.now()
        resumed: list[str] = []
        with self.db.tx() as conn:
            for row in conn.execute("SELECT * FROM operations WHERE claimed=1 OR status=?",
                                    (Status.RUNNING.value,)).fetchall():
                conds = set_condition(loads(row["conditions"]), now, "Progressing", "True", "Resumed",
                                      "resumed after a restart")
                new = Status.PENDING if row["status"] == Status.RUNNING.value else Status(row["status"])
                self.store.update(conn, row, new, now, due_at=now, conditions=conds, claimed=0)
                resumed.append(row["id"])
        for op_id in resumed:
            self.store.publish(op_id)
        if resumed:
            log.info("resumed %d unfinished operation(s)", len(resumed))
        return len(resumed)

    def _schedule_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            try:
                next_due = self._dispatch_due()
            except Exception:
                log.exception("operation scheduler failed; retrying")
                next_due = self.clock.now() + 1.0
            timeout = 1.0 if next_due is None else max(0.0, min(1.0, next_due - self.clock.now()))
            self.clock.wait(self._wake, timeout)

    def _dispatch_due(self) -> float | None:
        """Claim due operations up to the free worker count; return the next due time, if any."""
        with self._busy_lock:
            free = self.workers - len(self._busy)
        now = self.clock.now()
        if free > 0:
            rows = self.db.query(
                "SELECT id, version FROM operations WHERE status IN (?,?) AND claimed=0 AND due_at<=? "
                "ORDER BY due_at LIMIT ?", (Status.PENDING.value, Status.WAITING.value, now, free))
            for row in rows:
                if self.claim(row["id"], row["version"]):
                    with self._busy_lock:
                        self._busy.add(row["id"])
                    assert self._pool is not None
                    self._pool.submit(self._work, row["id"])
        nxt = self.db.query_one("SELECT MIN(due_at) AS due FROM operations WHERE status IN (?,?) AND claimed=0",
                                (Status.PENDING.value, Status.WAITING.value))
        return None if nxt is None or nxt["due"] is None else float(nxt["due"])

    def claim(self, op_id: str, version: int) -> bool:
        now = self.clock.now()
        with self.db.tx() as conn:
            row = conn.execute("SELECT * FROM operations WHERE id=? AND version=? AND claimed=0",
                               (op_id, version)).fetchone()
            if row is None:
                return False
            conds = set_condition(loads(row["conditions"]), now, "Progressing", "True", "Running", "working on it")
            self.store.update(conn, row, Status.RUNNING, now, claimed=1, conditions=conds)
        self.store.publish(op_id)
        return True

    def _work(self, op_id: str) -> None:
        try:
            self.stepper.drive(op_id)
        except Exception:
            log.exception("operation %s: engine error", op_id)
            self.store.fail(op_id, ServiceError("internal engine error; see the server log"), stage_idx=None)
        finally:
            with self._busy_lock:
                self._busy.discard(op_id)
            self._wake.set()

    def run_until_idle(self, op_id: str, max_steps: int = 1000) -> OperationView:
        """Drive one operation in the calling thread until it waits or ends (tests, CLI one-shots)."""
        for _ in range(max_steps):
            view = self.store.get(op_id)
            if view.status.terminal:
                return view
            due = self.db.query_one("SELECT due_at, version FROM operations WHERE id=?", (op_id,))
            assert due is not None
            if view.status == Status.WAITING and (due["due_at"] or 0) > self.clock.now():
                return view
            if view.status != Status.RUNNING and not self.claim(op_id, due["version"]):
                return self.store.get(op_id)
            self.stepper.drive(op_id)
        return self.store.get(op_id)
