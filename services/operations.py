"""Operations: every mutation is a persisted state machine, driven by a small worker pool.

An operation kind (``services/stages.py``) is an ordered list of stages, each observe -> act -> poll.
:class:`Engine` is the one entry point: ``submit`` (dedupe, target conflicts, the planned stage list, all
in the insert transaction), reads, ``retry``/``cancel`` and the worker lifecycle. It delegates: rows and
transitions to ``operation_store``, one operation's steps to ``operation_stepper``, scheduling and the
data-directory lock to ``operation_runner``.

This module never decides *what* a stage does; kinds live in their domain modules and register here.
"""

from __future__ import annotations

import builtins
import logging
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from services.audit import AuditLog
from services.auth import Principal, Role
from services.clock import Clock
from services.db import Database, loads
from services.dedupe import existing_operation, request_fingerprint, scoped_idempotency_key
from services.errors import Conflict, Invalid
from services.events import EventBus
from services.metrics import Metrics
from services.models import RequestModel
from services.operation_index import ACTIVE_SHOWN, FAILURES_SHOWN
from services.operation_runner import DataDirLocked, Runner, lock_data_dir
from services.operation_stepper import Backoff, Stepper
from services.operation_store import OperationStore
from services.operation_views import (
    ACTIVE,
    STATUS_TOOL,
    TERMINAL,
    TRANSITIONS,
    Condition,
    OperationQuery,
    OperationView,
    Phase,
    StageStatus,
    StageView,
    Status,
    check_transition,
    iso,
    set_condition,
)
from services.secrets import refuse_secrets
from services.stages import DEFAULT_DEADLINE_FLOOR, Done, Observed, OperationKind, Stage, StageContext, Wait

__all__ = [  # the engine's module is also where callers find the contract and the views
    "ACTIVE", "STATUS_TOOL", "TERMINAL", "TRANSITIONS", "Backoff", "Condition", "DataDirLocked", "Done", "Engine",
    "Observed", "OperationKind", "OperationQuery", "OperationView", "Phase", "Stage", "StageContext", "StageStatus",
    "StageView", "Status", "Wait", "check_transition", "iso", "lock_data_dir",
]

log = logging.getLogger(__name__)


class Engine:
    """Persists operations and drives their stages with a scheduler thread and a worker pool.

    ``pace`` scales every stage wait, backoff and deadline (1 against AWS; the sandbox runs faster), a
    deadline never below ``deadline_floor`` real seconds (:func:`~services.stages.effective_deadline`);
    ``backoff`` is the transient-failure policy (its random source can be seeded)."""

    def __init__(self, db: Database, bus: EventBus, audit: AuditLog, clock: Clock, *, workers: int = 4,
                 lock_path: Path | None = None, metrics: Metrics | None = None, pace: float = 1.0,
                 backoff: Backoff | None = None, deadline_floor: float = DEFAULT_DEADLINE_FLOOR) -> None:
        self.db = db
        self.bus = bus
        self.audit = audit
        self.clock = clock
        self.workers = workers
        self.metrics = metrics or Metrics()
        self.kinds: dict[str, OperationKind[Any]] = {}
        self.store = OperationStore(db, bus, audit, clock, self.metrics, self.kinds)
        self.store.pace = pace
        self.store.deadline_floor = deadline_floor
        self.stepper = Stepper(self.store, self.kinds, backoff or Backoff(rng=random.Random()), pace, deadline_floor)
        self.runner = Runner(self.store, self.stepper, workers=workers, lock_path=lock_path)
        self.metrics.track_operations(self.store.queue_depth, self.store.counts)
        self.metrics.track_bus(bus)

    @property
    def pace(self) -> float:
        """The multiplier on every stage wait, backoff and deadline."""
        return self.stepper.pace

    @pace.setter
    def pace(self, value: float) -> None:
        if not value > 0:
            raise ValueError("the engine's pace must be positive")
        self.stepper.pace = self.store.pace = value

    @property
    def deadline_floor(self) -> float:
        """Real seconds a paced stage deadline never drops below."""
        return self.stepper.deadline_floor

    @deadline_floor.setter
    def deadline_floor(self, value: float) -> None:
        if value < 0:
            raise ValueError("the engine's deadline floor cannot be negative")
        self.stepper.deadline_floor = self.store.deadline_floor = value

    @property
    def backoff(self) -> Backoff:
        return self.stepper.backoff

    @backoff.setter
    def backoff(self, policy: Backoff) -> None:
        self.stepper.backoff = policy

    # ----- registration and submission -------------------------------------------------------------

    def register(self, kind: OperationKind[Any]) -> None:
        if kind.name in self.kinds:
            raise ValueError(f"operation kind {kind.name!r} registered twice")
        names = [s.name for s in kind.stages]
        if len(set(names)) != len(names):
            raise ValueError(f"operation kind {kind.name!r} has duplicate stage names {names}")
        self.kinds[kind.name] = kind
        self.store.index.reload()  # views of its operations read before now lacked its stages' flags

    def submit(self, kind_name: str, request: RequestModel, principal: Principal,
               idempotency_key: str | None = None) -> tuple[OperationView, bool]:
        """Record a new operation (or find the one this request already made); returns (op, created).

        An identical request joins its active operation; otherwise a request whose target, an enclosing or
        an enclosed target has an active operation is refused with 409 naming it."""
        kind = self.kinds.get(kind_name)
        if kind is None:
            raise Invalid(f"unknown operation kind {kind_name!r}")
        principal.require(kind.role)
        if not isinstance(request, kind.request_model):
            raise Invalid(f"{kind_name} takes {kind.request_model.__name__}, not {type(request).__name__}")
        if idempotency_key is not None and not 1 <= len(idempotency_key) <= 200:
            raise Invalid("Idempotency-Key must be 1 to 200 characters")
        refuse_secrets(request)  # a secret value is never stored: its verb passes a reference
        target = kind.target(request)
        stage_names = [s.name for s in kind.stages_for(request)]
        normalized = request.model_dump(mode="json")
        fingerprint = request_fingerprint(kind_name, target, normalized, principal)
        scoped_key = scoped_idempotency_key(idempotency_key, principal)
        existing: str | None = None
        for prechecked in (False, True):
            if prechecked and kind.precheck is not None:
                kind.precheck(request)  # refusals come before any row is written
            with self.db.tx() as conn:
                existing, outcome = existing_operation(conn, kind, target, fingerprint, scoped_key)
                if existing is not None:  # a retry, or a request joining its operation: never prechecked again
                    self.audit.record(principal, kind_name, target, normalized, outcome, existing, conn=conn)
                elif prechecked:
                    op_id = self.store.insert(conn, kind, target, normalized, stage_names, principal, fingerprint,
                                              scoped_key)
                    self.audit.record(principal, kind_name, target, normalized, "accepted", op_id, conn=conn)
            if existing is not None:
                return self.get(existing), False
        self.store.publish(op_id)
        self.runner.wake()
        return self.get(op_id), True

    def replayed(self, kind_name: str, principal: Principal, idempotency_key: str | None,
                 same: Callable[[dict[str, Any]], bool]) -> OperationView | None:
        """The operation an ``Idempotency-Key`` already made, for a verb whose precheck is costly (AWS reads)
        and should not run again on a replay: ``same(stored request)`` says whether this is the same request
        (else 409, as :meth:`submit` answers). ``None``: the key is new (or absent), precheck and submit."""
        scoped_key = scoped_idempotency_key(idempotency_key, principal)
        if scoped_key is None:
            return None
        with self.db.tx() as conn:
            row = conn.execute("SELECT id, kind, target, request FROM operations WHERE idempotency_key=?",
                               (scoped_key,)).fetchone()
            if row is None:
                return None
            stored = loads(row["request"])
            if row["kind"] != kind_name or not same(stored):
                raise Conflict("this Idempotency-Key was already used for a different request",
                               details={"operation_id": row["id"]})
            self.audit.record(principal, kind_name, row["target"], stored, "deduplicated", row["id"], conn=conn)
        return self.get(row["id"])

    # ----- reads (never blocked by an operation) -----------------------------------------------------

    def get(self, op_id: str) -> OperationView:
        return self.store.get(op_id)

    def list(self, query: OperationQuery) -> builtins.list[OperationView]:
        return self.store.list(query)

    def counts(self) -> dict[str, int]:
        """Operations per status, from memory."""
        return self.store.counts()

    def index_version(self) -> int:
        """Changes whenever :meth:`counts`, :meth:`active` or :meth:`recent_failures` may answer differently."""
        return self.store.index.version

    def active(self, limit: int = ACTIVE_SHOWN) -> builtins.list[OperationView]:
        """The newest active operations, from memory (at most :data:`ACTIVE_SHOWN`)."""
        return self.store.index.active(limit)

    def recent_failures(self, limit: int = FAILURES_SHOWN) -> builtins.list[OperationView]:
        """The newest failed operations, from memory (at most :data:`FAILURES_SHOWN`)."""
        return self.store.index.recent_failures(limit)

    # ----- control: retry and cancel -----------------------------------------------------------------

    def retry(self, op_id: str, principal: Principal) -> OperationView:
        """Re-run the failed stage of a failed operation (observed first, so nothing is done twice)."""
        principal.require(self._role_for(op_id))
        with self.db.tx() as conn:
            row = self.store.row(conn, op_id)
            if row["status"] != Status.FAILED.value:
                raise Conflict(f"only a failed operation can be retried; {op_id} is {row['status']}")
            now = self.clock.now()
            for failed in conn.execute("SELECT idx FROM stages WHERE operation_id=? AND status=?",
                                       (op_id, StageStatus.FAILED.value)).fetchall():
                self.store.save_stage(op_id, failed["idx"], None, status=StageStatus.PENDING, phase=Phase.OBSERVE,
                                      message="", transients=0, conn=conn)
                conn.execute("UPDATE stages SET finished_at=NULL, started_at=NULL WHERE operation_id=? AND idx=?",
                             (op_id, failed["idx"]))
            # a cancel asked for before the failure must not swallow this retry
            conn.execute("UPDATE operations SET cancel_requested=0 WHERE id=?", (op_id,))
            row = self.store.row(conn, op_id)
            conds = set_condition(loads(row["conditions"]), now, "Succeeded", "Unknown", "Retrying",
                                  f"retry requested by {principal.name}")
            conds = set_condition(conds, now, "Progressing", "True", "Retrying", "failed stage queued again")
            self.store.update(conn, row, Status.PENDING, now, due_at=now, conditions=conds, error=None)
            self.audit.record(principal, "operation.retry", op_id, {}, "accepted", op_id, conn=conn)
        self.store.publish(op_id)
        self.runner.wake()
        return self.get(op_id)

    def cancel(self, op_id: str, principal: Principal) -> OperationView:
        """Stop an operation between steps; the evidence stays. A kind's ``on_cancel`` then stops what still runs
        outside the engine, and its ``on_unsuccessful`` undoes what its kind undoes (once the operation has ended
        cancelled; cancelling a cancelled operation of such a kind runs them again)."""
        principal.require(self._role_for(op_id))
        kind = self.kinds.get(self.get(op_id).kind)
        stops = kind is not None and (kind.on_cancel is not None or kind.on_unsuccessful is not None)
        with self.db.tx() as conn:
            row = self.store.row(conn, op_id)
            status = Status(row["status"])
            if status == Status.CANCELLED and stops:
                outcome = "stopped again"  # what it started outside may have outlived an earlier cancel
            elif status.terminal and status != Status.FAILED:
                raise Conflict(f"operation {op_id} already ended ({status.value})")
            elif row["claimed"]:  # the worker ends it after its step, then stops what it started
                conn.execute("UPDATE operations SET cancel_requested=1, version=version+1, updated_at=? "
                             "WHERE id=?", (self.clock.now(), op_id))
                outcome = "requested"
            else:
                self.store.finish_cancelled(conn, row, self.clock.now(), principal.name)
                outcome = "cancelled"
            self.audit.record(principal, "operation.cancel", op_id, {}, outcome, op_id, conn=conn)
        self.store.publish(op_id)
        if outcome in ("cancelled", "stopped again"):
            self.store.stop_outside(op_id)  # a failure reaches the caller, who may cancel again
        return self.get(op_id)

    def _role_for(self, op_id: str) -> Role:
        """Retrying or cancelling takes the role that starting the operation takes."""
        kind = self.kinds.get(self.get(op_id).kind)
        return kind.role if kind is not None else Role.OPERATOR

    # ----- the workers -------------------------------------------------------------------------------

    def acquire_lock(self) -> None:
        """Take the data-directory lock now (``start`` takes it otherwise): lock, then sandbox and registry,
        then ``start``, which resumes operations."""
        self.runner.acquire_lock()

    def adopt_lock(self, fd: int) -> None:
        self.runner.adopt_lock(fd)

    def start(self) -> None:
        self.runner.start()

    def stop(self, timeout: float = 10.0) -> None:
        self.runner.stop(timeout)

    @property
    def running(self) -> bool:
        return self.runner.running

    def wake(self) -> None:
        self.runner.wake()

    def resume(self) -> int:
        return self.runner.resume()

    def run_until_idle(self, op_id: str, max_steps: int = 1000) -> OperationView:
        return self.runner.run_until_idle(op_id, max_steps)
