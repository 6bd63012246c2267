"""The stepper: advances one claimed operation through its stages, observe -> act -> poll.

The phase is written to SQLite *before* acting and *before* any wait, so after a crash the engine knows
where it was: a stage caught in ``acting`` is observed again (never blindly re-run), a stage in
``waiting`` goes on polling. Waiting is a stored due time, never a sleeping thread.

Failures are read by class, never by text: a :class:`~services.errors.Transient` is backed off (exponential,
jittered, on the injected clock, recorded on the stage) up to the stage's budget; any other
:class:`~services.errors.ServiceError` fails the stage as it is; anything else is a bug, failed at once as
``internal`` with its traceback logged, never retried. A stage past its deadline fails naming what it
waited for. ``pace`` scales every wait, backoff and deadline, so the sandbox runs at its own speed;
``deadline_floor`` keeps a scaled deadline from dropping below that many real seconds.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from services.db import loads
from services.errors import DeadlineExceeded, Permanent, ServiceError, Transient
from services.operation_store import OperationStore
from services.operation_views import Phase, StageStatus, Status, set_condition
from services.stages import (
    DEFAULT_DEADLINE_FLOOR,
    Done,
    Observed,
    OperationKind,
    Stage,
    StageContext,
    Wait,
    checked_result,
    effective_deadline,
)

log = logging.getLogger(__name__)


@dataclass
class Backoff:
    """Exponential backoff with jitter: the n-th transient failure in a row waits a random time in
    [cap/2, cap] with cap = min(max, base * 2**(n-1)), and never less than the error's own hint."""

    base: float = 1.0
    max: float = 60.0
    rng: random.Random = field(default_factory=random.Random)

    def delay(self, failures_in_a_row: int, hint: float) -> float:
        cap = min(self.max, self.base * 2 ** max(0, failures_in_a_row - 1))
        return float(max(min(hint, self.max), cap / 2 + self.rng.random() * cap / 2))


class Stepper:
    def __init__(self, store: OperationStore, kinds: dict[str, OperationKind[Any]], backoff: Backoff,
                 pace: float = 1.0, deadline_floor: float = DEFAULT_DEADLINE_FLOOR) -> None:
        self.store = store
        self.db = store.db
        self.clock = store.clock
        self.kinds = kinds
        self.backoff = backoff
        self.pace = pace
        self.deadline_floor = deadline_floor

    def drive(self, op_id: str) -> None:
        """Advance a claimed operation as far as it goes without waiting, persisting every phase."""
        row = self.db.query_one("SELECT * FROM operations WHERE id=?", (op_id,))
        assert row is not None
        kind = self.kinds.get(row["kind"])
        if kind is None:
            self.store.fail(op_id, Permanent("operation kind is not registered in this server"), stage_idx=None)
            return
        try:
            request = kind.request_model.model_validate(loads(row["request"]))
        except ValidationError as exc:
            self.store.fail(op_id, Permanent(f"the stored request no longer fits {kind.name}: {exc}"), None)
            return
        while True:
            row = self.db.query_one("SELECT * FROM operations WHERE id=?", (op_id,))
            assert row is not None
            if row["cancel_requested"]:
                with self.db.tx() as conn:
                    self.store.finish_cancelled(conn, self.store.row(conn, op_id), self.clock.now(), "request")
                self.store.publish(op_id)
                self.store.stopped_by_request(op_id)
                return
            srow = self.db.query_one("SELECT * FROM stages WHERE operation_id=? AND status!=? ORDER BY idx LIMIT 1",
                                     (op_id, StageStatus.SUCCEEDED.value))
            if srow is None:
                self.store.succeed(op_id)
                return
            stage = kind.stage(srow["name"])
            if stage is None:
                self.store.fail(op_id, Permanent(f"stage {srow['name']} is no longer part of {kind.name}"), srow["idx"])
                return
            ctx = self._context(row, srow, request)
            started = srow["started_at"] if srow["started_at"] is not None else self.clock.now()
            try:
                outcome = self._step(op_id, stage, srow, ctx)
            except Transient as exc:
                self._back_off(op_id, kind, stage, srow, ctx, exc, started)
                return
            except ServiceError as exc:
                self.store.fail(op_id, exc, stage_idx=srow["idx"])
                return
            except Exception as exc:
                log.exception("operation %s stage %s: unclassified error (a bug), not retried", op_id, stage.name)
                self.store.fail(op_id, ServiceError(
                    f"internal error in stage {stage.name}: {type(exc).__name__}: {exc} (a bug, not retried; "
                    "the traceback is in the server log)", details={"exception": type(exc).__name__}),
                    stage_idx=srow["idx"])
                return
            if srow["transients"]:  # the budget counts transient failures in a row, not in a lifetime
                self.store.save_stage(op_id, srow["idx"], ctx.data, transients=0)
            if isinstance(outcome, Wait):
                self._wait(op_id, stage, srow["idx"], started, outcome.seconds, outcome.message)
                return

    def _step(self, op_id: str, stage: Stage[Any], srow: Any, ctx: StageContext[Any]) -> Wait | None:
        """One stage, one step. Returns a Wait (unscaled) to park the operation, None when the stage is done."""
        idx = srow["idx"]
        phase = Phase(srow["phase"])
        save = self.store.save_stage
        if srow["started_at"] is None:
            save(op_id, idx, ctx.data, status=StageStatus.RUNNING, started=True)
        if phase in (Phase.OBSERVE, Phase.ACTING):
            seen = stage.observe(ctx)
            if seen is Observed.DONE:
                if stage.read_only:  # its observation is its work: say what it checked
                    message = stage.report(ctx) or "checked"
                elif phase is Phase.OBSERVE and not srow["acted"]:
                    message = "already in the desired state"
                else:
                    message = "done"
                save(op_id, idx, ctx.data, status=StageStatus.SUCCEEDED, phase=Phase.DONE,
                     attempts=srow["attempts"] + 1 if stage.read_only else None,
                     result=checked_result(stage, stage.result(ctx)), message=message)
                return None
            if seen is Observed.ABSENT:
                # the phase is on disk before the side effect, so a crash here is seen on resume
                save(op_id, idx, ctx.data, phase=Phase.ACTING, attempts=srow["attempts"] + 1)
                stage.act(ctx)
                save(op_id, idx, ctx.data, phase=Phase.WAITING, acted=True, message="acted; waiting")
            else:
                save(op_id, idx, ctx.data, phase=Phase.WAITING, message="in progress; waiting")
        polled = stage.poll(ctx)
        if isinstance(polled, Wait):
            save(op_id, idx, ctx.data, message=polled.message or "waiting")
            return polled
        assert isinstance(polled, Done)
        save(op_id, idx, ctx.data, status=StageStatus.SUCCEEDED, phase=Phase.DONE,
             result=checked_result(stage, stage.result(ctx)), message=polled.message or "done")
        return None

    def _back_off(self, op_id: str, kind: OperationKind[Any], stage: Stage[Any], srow: Any, ctx: StageContext[Any],
                  exc: Transient, started: float) -> None:
        in_a_row = srow["transients"] + 1
        if in_a_row > stage.max_transient:
            self.store.fail(op_id, Transient(f"{exc.message} ({in_a_row - 1} transient failures in a row, the "
                                             f"stage's budget)", delay=exc.delay, details=exc.details), srow["idx"])
            return
        delay = self.backoff.delay(in_a_row, exc.delay) * self.pace
        self.store.save_stage(op_id, srow["idx"], ctx.data, transients=in_a_row, retries=srow["retries"] + 1,
                              backoff=srow["backoff"] + delay,
                              message=f"transient ({in_a_row} in a row): {exc.message}; retrying in {delay:.2f}s")
        self.store.metrics.stage_retried(kind.name, stage.name, delay)
        self._wait(op_id, stage, srow["idx"], started, delay, f"a retry after: {exc.message}", scaled=True)

    def _wait(self, op_id: str, stage: Stage[Any], idx: int, started: float, seconds: float, waited_for: str,
              *, scaled: bool = False) -> None:
        """Park until ``seconds`` from now (or the stage's deadline, if sooner); past the deadline, fail."""
        now = self.clock.now()
        due = now + max(0.0, seconds if scaled else seconds * self.pace)
        deadline = effective_deadline(stage, self.pace, self.deadline_floor)
        if deadline is not None:
            if now - started >= deadline:
                self.store.fail(op_id, DeadlineExceeded(
                    f"stage {stage.name} was still waiting for {waited_for or 'its condition'!r} after "
                    f"{now - started:.1f}s, past its deadline of {deadline:.1f}s",
                    details={"stage": stage.name, "waited_for": waited_for, "waited_seconds": round(now - started, 3),
                             "deadline_seconds": deadline}), idx)
                return
            due = min(due, started + deadline)
        self._park(op_id, due, f"{stage.name}: {waited_for or 'waiting'}")

    def _park(self, op_id: str, due: float, message: str) -> None:
        now = self.clock.now()
        with self.db.tx() as conn:
            row = self.store.row(conn, op_id)
            cancelled = bool(row["cancel_requested"])
            if cancelled:  # asked for while this step ran: stop now, not at the next due time
                self.store.finish_cancelled(conn, row, now, "request")
            else:
                conds = set_condition(loads(row["conditions"]), now, "Progressing", "True", "Waiting", message)
                self.store.update(conn, row, Status.WAITING, now, due_at=due, claimed=0, conditions=conds)
        self.store.publish(op_id)
        if cancelled:
            self.store.stopped_by_request(op_id)

    def _context(self, row: Any, srow: Any, request: Any) -> StageContext[Any]:
        results = {r["name"]: loads(r["result"]) or {} for r in self.db.query(
            "SELECT name, result FROM stages WHERE operation_id=? AND status=?",
            (row["id"], StageStatus.SUCCEEDED.value))}
        ctx: StageContext[Any] = StageContext(
            operation_id=row["id"], kind=row["kind"], target=row["target"], request=request,
            data=loads(srow["data"]) or {}, results=results, clock=self.clock, attempt=srow["attempts"])
        ctx.save = lambda: self.store.save_stage(row["id"], srow["idx"], ctx.data)
        return ctx
