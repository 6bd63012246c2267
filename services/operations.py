"""Operations: every mutation is a persisted state machine, driven by a small worker pool.

An operation kind is an ordered list of stages. Each stage follows one contract:

* ``observe`` reads the actual state and says DONE (nothing to do), IN_PROGRESS (already acted, go wait)
  or ABSENT (act now);
* ``act`` performs the change with deterministic names or client tokens;
* ``poll`` checks progress and answers :class:`Done` or :class:`Wait`.

The phase is written to SQLite *before* acting and *before* any wait, so after a crash the engine knows
where it was: a stage caught in ``acting`` is observed again (never blindly re-run), a stage in
``waiting`` goes on polling. Waiting is a stored due time, not a sleeping thread. Status changes go
through ``check_transition`` (a FROM -> TO table in ``operation_views``) and bump ``version``, which
long-polls watch. The stage contract lives in ``stages``.

This module never decides *what* a stage does; kinds live in their domain modules and register here.
"""

from __future__ import annotations

import builtins
import fcntl
import logging
import os
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from services.audit import AuditLog
from services.auth import Principal, Role
from services.clock import Clock
from services.db import Database, dumps, loads
from services.dedupe import existing_operation, request_fingerprint, scoped_idempotency_key
from services.errors import Conflict, Invalid, NotFound, Permanent, ServiceError, Transient
from services.events import Event, EventBus
from services.models import RequestModel
from services.operation_views import (
    ACTIVE,
    STATUS_TOOL,
    TERMINAL,
    TRANSITIONS,
    Condition,
    OperationQuery,
    OperationView,
    StageView,
    Status,
    check_transition,
    iso,
    set_condition,
)
from services.stages import Done, Observed, OperationKind, Stage, StageContext, Wait, checked_result

__all__ = [  # the engine's module is also where callers find the contract and the views
    "ACTIVE", "STATUS_TOOL", "TERMINAL", "TRANSITIONS", "Condition", "DataDirLocked", "Done", "Engine",
    "Observed", "OperationKind", "OperationQuery", "OperationView", "Stage", "StageContext", "StageView", "Status",
    "Wait", "check_transition", "iso",
]

log = logging.getLogger(__name__)


class DataDirLocked(ServiceError):
    code = "data_dir_locked"
    http_status = 409


class Engine:
    """Persists operations and drives their stages with a scheduler thread and a worker pool."""

    def __init__(self, db: Database, bus: EventBus, audit: AuditLog, clock: Clock, *, workers: int = 4,
                 lock_path: Path | None = None) -> None:
        self.db = db
        self.bus = bus
        self.audit = audit
        self.clock = clock
        self.workers = workers
        self.kinds: dict[str, OperationKind] = {}
        self._lock_path = lock_path
        self._lock_fd: int | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._busy: set[str] = set()
        self._busy_lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._scheduler: threading.Thread | None = None

    # ----- registration and submission -------------------------------------------------------------

    def register(self, kind: OperationKind) -> None:
        if kind.name in self.kinds:
            raise ValueError(f"operation kind {kind.name!r} registered twice")
        names = [s.name for s in kind.stages]
        if len(set(names)) != len(names):
            raise ValueError(f"operation kind {kind.name!r} has duplicate stage names {names}")
        self.kinds[kind.name] = kind

    def submit(self, kind_name: str, request: RequestModel, principal: Principal,
               idempotency_key: str | None = None) -> tuple[OperationView, bool]:
        """Record a new operation (or find the one this request already made); returns (op, created)."""
        kind = self.kinds.get(kind_name)
        if kind is None:
            raise Invalid(f"unknown operation kind {kind_name!r}")
        principal.require(kind.role)
        if not isinstance(request, kind.request_model):
            raise Invalid(f"{kind_name} takes {kind.request_model.__name__}, not {type(request).__name__}")
        if idempotency_key is not None and not 1 <= len(idempotency_key) <= 200:
            raise Invalid("Idempotency-Key must be 1 to 200 characters")
        target = kind.target(request)
        if kind.precheck is not None:
            kind.precheck(request)  # refusals come before any row is written
        normalized = request.model_dump(mode="json")
        fingerprint = request_fingerprint(kind_name, target, normalized, principal)
        scoped_key = scoped_idempotency_key(idempotency_key, principal)
        now = self.clock.now()
        with self.db.tx() as conn:
            existing, outcome = existing_operation(conn, kind, target, fingerprint, scoped_key)
            if existing is not None:
                self.audit.record(principal, kind_name, target, normalized, outcome, existing, conn=conn)
            else:
                op_id = f"op-{uuid.uuid4().hex[:16]}"
                conditions = set_condition([], now, "Accepted", "True", "Validated", "request accepted")
                conditions = set_condition(conditions, now, "Succeeded", "Unknown", "Pending")
                conn.execute(
                    "INSERT INTO operations(id, kind, target, status, request, fingerprint, idempotency_key,"
                    " actor, role, face, client, created_at, updated_at, due_at, conditions)"
                    " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (op_id, kind_name, target, Status.PENDING.value, dumps(normalized), fingerprint,
                     scoped_key, principal.name, principal.role.value, principal.face, principal.client, now,
                     now, now, dumps(conditions)))
                for idx, stage in enumerate(kind.stages):
                    conn.execute("INSERT INTO stages(operation_id, idx, name, status, phase) VALUES (?,?,?,?,?)",
                                 (op_id, idx, stage.name, "pending", "observe"))
                self.audit.record(principal, kind_name, target, normalized, "accepted", op_id, conn=conn)
        if existing is not None:
            return self.get(existing), False
        view = self.get(op_id)
        self._publish(view)
        self._wake.set()
        return view, True

    # ----- reads ------------------------------------------------------------------------------------

    def get(self, op_id: str) -> OperationView:
        row = self.db.query_one("SELECT * FROM operations WHERE id=?", (op_id,))
        if row is None:
            raise NotFound(f"no operation {op_id!r}")
        stages = self.db.query("SELECT * FROM stages WHERE operation_id=? ORDER BY idx", (op_id,))
        return self._view(row, stages)

    def list(self, query: OperationQuery) -> list[OperationView]:
        where: list[str] = []
        params: list[Any] = []
        if query.status:
            where.append(f"status IN ({','.join('?' * len(query.status))})")
            params += [s.value for s in query.status]
        if query.active is not None:
            states = ACTIVE if query.active else TERMINAL
            where.append(f"status IN ({','.join('?' * len(states))})")
            params += [s.value for s in states]
        for column in ("kind", "target", "actor"):
            value = getattr(query, column)
            if value is not None:
                where.append(f"{column}=?")
                params.append(value)
        if query.before is not None:
            anchor = self.db.query_one("SELECT created_at, id FROM operations WHERE id=?", (query.before,))
            if anchor is None:
                raise Invalid(f"'before' names no operation: {query.before!r}")
            where.append("(created_at < ? OR (created_at = ? AND id < ?))")
            params += [anchor["created_at"], anchor["created_at"], anchor["id"]]
        sql = "SELECT * FROM operations" + (" WHERE " + " AND ".join(where) if where else "")
        sql += " ORDER BY created_at DESC, id DESC LIMIT ?"
        params.append(query.limit)
        rows = self.db.query(sql, params)
        if not rows:
            return []
        ids = [r["id"] for r in rows]
        stage_rows = self.db.query(
            f"SELECT * FROM stages WHERE operation_id IN ({','.join('?' * len(ids))}) ORDER BY idx", ids)
        by_op: dict[str, list[Any]] = {}
        for s in stage_rows:
            by_op.setdefault(s["operation_id"], []).append(s)
        return [self._view(r, by_op.get(r["id"], [])) for r in rows]

    def counts(self) -> dict[str, int]:
        rows = self.db.query("SELECT status, COUNT(*) AS n FROM operations GROUP BY status")
        return {r["status"]: r["n"] for r in rows}

    def _view(self, row: Any, stages: builtins.list[Any]) -> OperationView:
        kind = self.kinds.get(row["kind"])
        kind_stages = {s.name: s.read_only for s in kind.stages} if kind is not None else {}
        return OperationView(
            id=row["id"], kind=row["kind"], target=row["target"], status=Status(row["status"]),
            actor=row["actor"], face=row["face"], client=row["client"], created_at=iso(row["created_at"]) or "",
            updated_at=iso(row["updated_at"]) or "", version=row["version"], due_at=iso(row["due_at"]),
            cancel_requested=bool(row["cancel_requested"]), request=loads(row["request"]),
            conditions=[Condition(**c) for c in loads(row["conditions"])],
            result=loads(row["result"]), error=loads(row["error"]),
            status_url=f"/api/v1/operations/{row['id']}",
            stages=[StageView(name=s["name"], status=s["status"], phase=s["phase"], attempts=s["attempts"],
                              acted=bool(s["acted"]), read_only=kind_stages.get(s["name"], False),
                              started_at=iso(s["started_at"]),
                              finished_at=iso(s["finished_at"]), message=s["message"],
                              result=loads(s["result"])) for s in stages])

    # ----- control: retry and cancel -----------------------------------------------------------------

    def retry(self, op_id: str, principal: Principal) -> OperationView:
        """Re-run the failed stage of a failed operation (observed first, so nothing is done twice)."""
        principal.require(self._role_for(op_id))
        with self.db.tx() as conn:
            row = self._row(conn, op_id)
            if row["status"] != Status.FAILED.value:
                raise Conflict(f"only a failed operation can be retried; {op_id} is {row['status']}")
            now = self.clock.now()
            conn.execute("UPDATE stages SET status='pending', phase='observe', message='', finished_at=NULL, "
                         "transients=0 WHERE operation_id=? AND status='failed'", (op_id,))
            # a cancel asked for before the failure must not swallow this retry
            conn.execute("UPDATE operations SET cancel_requested=0 WHERE id=?", (op_id,))
            row = self._row(conn, op_id)
            conds = set_condition(loads(row["conditions"]), now, "Succeeded", "Unknown", "Retrying",
                                   f"retry requested by {principal.name}")
            conds = set_condition(conds, now, "Progressing", "True", "Retrying", "failed stage queued again")
            self._update(conn, row, Status.PENDING, now, due_at=now, conditions=conds, error=None)
            self.audit.record(principal, "operation.retry", op_id, {}, "accepted", op_id, conn=conn)
        view = self.get(op_id)
        self._publish(view)
        self._wake.set()
        return view

    def cancel(self, op_id: str, principal: Principal) -> OperationView:
        """Stop an operation between steps. Nothing already done is undone; the evidence stays."""
        principal.require(self._role_for(op_id))
        with self.db.tx() as conn:
            row = self._row(conn, op_id)
            status = Status(row["status"])
            if status.terminal and status != Status.FAILED:
                raise Conflict(f"operation {op_id} already ended ({status.value})")
            now = self.clock.now()
            if row["claimed"]:
                conn.execute("UPDATE operations SET cancel_requested=1, version=version+1, updated_at=? "
                             "WHERE id=?", (now, op_id))
                outcome = "requested"
            else:
                self._finish_cancelled(conn, row, now, principal.name)
                outcome = "cancelled"
            self.audit.record(principal, "operation.cancel", op_id, {}, outcome, op_id, conn=conn)
        view = self.get(op_id)
        self._publish(view)
        return view

    def _role_for(self, op_id: str) -> Role:
        """Retrying or cancelling takes the role that starting the operation takes."""
        kind = self.kinds.get(self.get(op_id).kind)
        return kind.role if kind is not None else Role.OPERATOR

    def _finish_cancelled(self, conn: Any, row: Any, now: float, by: str) -> None:
        conds = set_condition(loads(row["conditions"]), now, "Progressing", "False", "Cancelled",
                               f"cancelled by {by}")
        conds = set_condition(conds, now, "Succeeded", "False", "Cancelled", f"cancelled by {by}")
        if Status(row["status"]) == Status.FAILED:
            # a failed operation may be abandoned: FAILED -> PENDING -> CANCELLED keeps the table honest
            self._update(conn, row, Status.PENDING, now, conditions=conds)
            row = self._row(conn, row["id"])
        self._update(conn, row, Status.CANCELLED, now, due_at=None, conditions=conds, claimed=0)
        conn.execute("UPDATE stages SET status='cancelled' WHERE operation_id=? AND status IN "
                     "('pending','running','failed')", (row["id"],))
        self._audit_end(conn, row, "cancelled", f"cancelled by {by}")

    # ----- the scheduler and workers -----------------------------------------------------------------

    def start(self) -> None:
        """Take the data-dir lock, resume what a previous process left unfinished, start the workers."""
        if self._lock_path is not None:
            fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise DataDirLocked(f"another instantstart process is running on {self._lock_path.parent}") from None
            self._lock_fd = fd
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
                self._update(conn, row, new, now, due_at=now, conditions=conds, claimed=0)
                resumed.append(row["id"])
        for op_id in resumed:
            self._publish(self.get(op_id))
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
                if self._claim(row["id"], row["version"]):
                    with self._busy_lock:
                        self._busy.add(row["id"])
                    assert self._pool is not None
                    self._pool.submit(self._work, row["id"])
        nxt = self.db.query_one("SELECT MIN(due_at) AS due FROM operations WHERE status IN (?,?) AND claimed=0",
                                (Status.PENDING.value, Status.WAITING.value))
        return None if nxt is None or nxt["due"] is None else float(nxt["due"])

    def _claim(self, op_id: str, version: int) -> bool:
        now = self.clock.now()
        with self.db.tx() as conn:
            row = conn.execute("SELECT * FROM operations WHERE id=? AND version=? AND claimed=0",
                               (op_id, version)).fetchone()
            if row is None:
                return False
            conds = set_condition(loads(row["conditions"]), now, "Progressing", "True", "Running",
                                   "working on it")
            self._update(conn, row, Status.RUNNING, now, claimed=1, conditions=conds)
        self._publish(self.get(op_id))
        return True

    def _work(self, op_id: str) -> None:
        try:
            self._drive(op_id)
        except Exception:
            log.exception("operation %s: engine error", op_id)
            self._fail(op_id, Permanent("internal engine error; see the server log"), stage_idx=None)
        finally:
            with self._busy_lock:
                self._busy.discard(op_id)
            self._wake.set()

    def run_until_idle(self, op_id: str, max_steps: int = 1000) -> OperationView:
        """Drive one operation in the calling thread until it waits or ends (tests, CLI one-shots)."""
        for _ in range(max_steps):
            view = self.get(op_id)
            if view.status.terminal:
                return view
            due = self.db.query_one("SELECT due_at, version FROM operations WHERE id=?", (op_id,))
            assert due is not None
            if view.status == Status.WAITING and (due["due_at"] or 0) > self.clock.now():
                return view
            if view.status != Status.RUNNING and not self._claim(op_id, due["version"]):
                return self.get(op_id)
            self._drive(op_id)
        return self.get(op_id)

    def _drive(self, op_id: str) -> None:
        """Advance a claimed operation as far as it goes without waiting, persisting every phase."""
        kind = self.kinds.get(self.get(op_id).kind)
        if kind is None:
            self._fail(op_id, Permanent("operation kind is not registered in this server"), stage_idx=None)
            return
        while True:
            row = self.db.query_one("SELECT * FROM operations WHERE id=?", (op_id,))
            assert row is not None
            if row["cancel_requested"]:
                with self.db.tx() as conn:
                    self._finish_cancelled(conn, self._row(conn, op_id), self.clock.now(), "request")
                self._publish(self.get(op_id))
                return
            srow = self.db.query_one("SELECT * FROM stages WHERE operation_id=? AND status!='succeeded' "
                                     "ORDER BY idx LIMIT 1", (op_id,))
            if srow is None:
                self._succeed(op_id)
                return
            stage = kind.stages[srow["idx"]]
            ctx = self._context(row, srow)
            try:
                outcome = self._step(op_id, stage, srow, ctx)
            except Transient as exc:
                if srow["transients"] + 1 > stage.max_transient:
                    self._fail(op_id, exc, stage_idx=srow["idx"])
                    return
                self._save_stage(op_id, srow["idx"], ctx, transients=srow["transients"] + 1,
                                 message=f"transient: {exc.message}")
                self._park(op_id, Wait(exc.delay, f"{stage.name}: {exc.message} (will retry)"))
                return
            except ServiceError as exc:
                self._fail(op_id, exc, stage_idx=srow["idx"])
                return
            except Exception as exc:
                log.exception("operation %s stage %s crashed", op_id, stage.name)
                self._fail(op_id, Permanent(f"{type(exc).__name__}: {exc}"), stage_idx=srow["idx"])
                return
            if srow["transients"]:  # the budget counts transient failures in a row, not in a lifetime
                self._save_stage(op_id, srow["idx"], ctx, transients=0)
            if isinstance(outcome, Wait):
                self._park(op_id, outcome)
                return

    def _step(self, op_id: str, stage: Stage, srow: Any, ctx: StageContext) -> Wait | None:
        """One stage, one step. Returns a Wait to park the operation, None when the stage finished."""
        idx = srow["idx"]
        phase = srow["phase"]
        if srow["started_at"] is None:
            self._save_stage(op_id, idx, ctx, status="running", started=True)
        if phase in ("observe", "acting"):
            seen = stage.observe(ctx)
            if seen is Observed.DONE:
                if stage.read_only:  # its observation is its work: say what it checked
                    message = stage.report(ctx) or "checked"
                elif phase == "observe" and not srow["acted"]:
                    message = "already in the desired state"
                else:
                    message = "done"
                self._save_stage(op_id, idx, ctx, status="succeeded", phase="done",
                                 attempts=srow["attempts"] + 1 if stage.read_only else None,
                                 result=checked_result(stage, stage.result(ctx)), message=message)
                return None
            if seen is Observed.ABSENT:
                # the phase is on disk before the side effect, so a crash here is seen on resume
                self._save_stage(op_id, idx, ctx, phase="acting", attempts=srow["attempts"] + 1)
                stage.act(ctx)
                self._save_stage(op_id, idx, ctx, phase="waiting", acted=True, message="acted; waiting")
            else:
                self._save_stage(op_id, idx, ctx, phase="waiting", message="in progress; waiting")
        polled = stage.poll(ctx)
        if isinstance(polled, Wait):
            self._save_stage(op_id, idx, ctx, message=polled.message or "waiting")
            return Wait(polled.seconds, f"{stage.name}: {polled.message or 'waiting'}")
        result = {**checked_result(stage, polled.result), **checked_result(stage, stage.result(ctx))}
        self._save_stage(op_id, idx, ctx, status="succeeded", phase="done", result=result, message="done")
        return None

    def _context(self, row: Any, srow: Any) -> StageContext:
        results = {r["name"]: loads(r["result"]) or {} for r in self.db.query(
            "SELECT name, result FROM stages WHERE operation_id=? AND status='succeeded'", (row["id"],))}
        return StageContext(operation_id=row["id"], kind=row["kind"], target=row["target"],
                            request=loads(row["request"]), data=loads(srow["data"]) or {}, results=results,
                            clock=self.clock, attempt=srow["attempts"])

    def _save_stage(self, op_id: str, idx: int, ctx: StageContext, *, status: str | None = None,
                    phase: str | None = None, attempts: int | None = None, transients: int | None = None,
                    acted: bool | None = None,
                    message: str | None = None, result: dict[str, Any] | None = None,
                    started: bool = False) -> None:
        now = self.clock.now()
        sets = ["data=?"]
        params: list[Any] = [dumps(ctx.data)]
        for column, value in (("status", status), ("phase", phase), ("attempts", attempts),
                              ("transients", transients), ("message", message)):
            if value is not None:
                sets.append(f"{column}=?")
                params.append(value)
        if acted is not None:
            sets.append("acted=?")
            params.append(int(acted))
        if result is not None:
            sets.append("result=?")
            params.append(dumps(result))
        if started:
            sets.append("started_at=?")
            params.append(now)
        if status in ("succeeded", "failed"):
            sets.append("finished_at=?")
            params.append(now)
        with self.db.tx() as conn:
            conn.execute(f"UPDATE stages SET {', '.join(sets)} WHERE operation_id=? AND idx=?",
                         (*params, op_id, idx))
            conn.execute("UPDATE operations SET version=version+1, updated_at=? WHERE id=?", (now, op_id))
        self._publish(self.get(op_id))

    def _park(self, op_id: str, wait: Wait) -> None:
        now = self.clock.now()
        with self.db.tx() as conn:
            row = self._row(conn, op_id)
            if row["cancel_requested"]:  # asked for while this step ran: stop now, not at the next due time
                self._finish_cancelled(conn, row, now, "request")
            else:
                conds = set_condition(loads(row["conditions"]), now, "Progressing", "True", "Waiting",
                                       wait.message)
                self._update(conn, row, Status.WAITING, now, due_at=now + max(0.0, wait.seconds), claimed=0,
                             conditions=conds)
        self._publish(self.get(op_id))

    def _succeed(self, op_id: str) -> None:
        now = self.clock.now()
        with self.db.tx() as conn:
            row = self._row(conn, op_id)
            results = {r["name"]: loads(r["result"]) or {} for r in conn.execute(
                "SELECT name, result FROM stages WHERE operation_id=? ORDER BY idx", (op_id,))}
            conds = set_condition(loads(row["conditions"]), now, "Progressing", "False", "Finished",
                                   "all stages done")
            conds = set_condition(conds, now, "Succeeded", "True", "AllStagesDone", "")
            self._update(conn, row, Status.SUCCEEDED, now, due_at=None, claimed=0, conditions=conds,
                         result=results)
            self._audit_end(conn, row, "succeeded", "")
        self._publish(self.get(op_id))

    def _fail(self, op_id: str, exc: ServiceError, stage_idx: int | None) -> None:
        now = self.clock.now()
        with self.db.tx() as conn:
            row = self._row(conn, op_id)
            if Status(row["status"]).terminal:
                return
            stage_name = ""
            if stage_idx is not None:
                stage_name = conn.execute("SELECT name FROM stages WHERE operation_id=? AND idx=?",
                                          (op_id, stage_idx)).fetchone()["name"]
                conn.execute("UPDATE stages SET status='failed', message=?, finished_at=? "
                             "WHERE operation_id=? AND idx=?", (exc.message, now, op_id, stage_idx))
            reason = "".join(p.capitalize() for p in exc.code.split("_"))
            where = f"stage {stage_name}: " if stage_name else ""
            conds = set_condition(loads(row["conditions"]), now, "Progressing", "False", "Failed",
                                   where + exc.message)
            conds = set_condition(conds, now, "Succeeded", "False", reason, where + exc.message)
            error = {**exc.envelope()["error"], "stage": stage_name or None}
            if row["status"] != Status.RUNNING.value:
                self._update(conn, row, Status.RUNNING, now)
                row = self._row(conn, op_id)
            self._update(conn, row, Status.FAILED, now, due_at=None, claimed=0, conditions=conds, error=error)
            self._audit_end(conn, row, "failed", where + exc.message)
        self._publish(self.get(op_id))

    def _audit_end(self, conn: Any, row: Any, outcome: str, detail: str) -> None:
        who = Principal(row["actor"], Role(row["role"]), None, row["face"], row["client"])
        self.audit.record(who, row["kind"], row["target"], loads(row["request"]), outcome, row["id"],
                          detail=detail, conn=conn)

    @staticmethod
    def _row(conn: Any, op_id: str) -> Any:
        row = conn.execute("SELECT * FROM operations WHERE id=?", (op_id,)).fetchone()
        if row is None:
            raise NotFound(f"no operation {op_id!r}")
        return row

    _UNSET: Any = object()

    def _update(self, conn: Any, row: Any, status: Status, now: float, *, due_at: Any = _UNSET,
                claimed: int | None = None, conditions: builtins.list[dict[str, Any]] | None = None,
                result: Any = _UNSET, error: Any = _UNSET) -> None:
        """The one place an operation's status changes: checked against TRANSITIONS, version-guarded."""
        check_transition(Status(row["status"]), status)
        sets = ["status=?", "updated_at=?", "version=version+1"]
        params: list[Any] = [status.value, now]
        if due_at is not self._UNSET:
            sets.append("due_at=?")
            params.append(due_at)
        if claimed is not None:
            sets.append("claimed=?")
            params.append(claimed)
        if conditions is not None:
            sets.append("conditions=?")
            params.append(dumps(conditions))
        if result is not self._UNSET:
            sets.append("result=?")
            params.append(None if result is None else dumps(result))
        if error is not self._UNSET:
            sets.append("error=?")
            params.append(None if error is None else dumps(error))
        cur = conn.execute(f"UPDATE operations SET {', '.join(sets)} WHERE id=? AND version=?",
                           (*params, row["id"], row["version"]))
        if cur.rowcount != 1:
            raise Conflict(f"operation {row['id']} changed concurrently; try again")

    def _publish(self, view: OperationView) -> None:
        self.bus.publish(Event("operation", "updated", view.model_dump(mode="json")))
