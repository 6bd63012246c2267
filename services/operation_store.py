"""The operations' rows: the one place SQL about operations and stages is written.

Every status change goes through :meth:`OperationStore.update` (checked against ``TRANSITIONS`` and
guarded by the row's ``version``); every stage change through :meth:`OperationStore.save_stage` (checked
against ``STAGE_TRANSITIONS`` and ``PHASE_TRANSITIONS`` inside the same transaction). Each write publishes
the operation's new view on the bus. This module decides nothing about *when* a stage runs.
"""

from __future__ import annotations

import builtins
import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from services.audit import AuditLog
from services.auth import Principal, Role
from services.clock import Clock
from services.db import Database, dumps, loads
from services.dedupe import conflicting_operation
from services.errors import Conflict, Invalid, NotFound, ServiceError
from services.events import Event, EventBus
from services.metrics import Metrics
from services.operation_index import FINAL, OperationIndex
from services.operation_views import (
    ACTIVE,
    STATUS_TOOL,
    TERMINAL,
    Condition,
    OperationQuery,
    OperationView,
    Phase,
    StageStatus,
    StageView,
    Status,
    check_phase_transition,
    check_stage_transition,
    check_transition,
    iso,
    set_condition,
)
from services.stages import DEFAULT_DEADLINE_FLOOR, OperationKind, effective_deadline

_UNSET: Any = object()


EXPECTED_CACHE = 4096  # operations whose stage durations are kept

log = logging.getLogger(__name__)


class OperationStore:
    def __init__(self, db: Database, bus: EventBus, audit: AuditLog, clock: Clock, metrics: Metrics,
                 kinds: dict[str, OperationKind[Any]]) -> None:
        self.db = db
        self.bus = bus
        self.audit = audit
        self.clock = clock
        self.metrics = metrics
        self.kinds = kinds  # the engine's registry, read for each view (read-only stages, deadlines)
        self.pace = 1.0
        self.deadline_floor = DEFAULT_DEADLINE_FLOOR
        #: operation id -> each stage's expected seconds for its request (a request never changes: computed once)
        self._expected: OrderedDict[str, dict[str, float | None]] = OrderedDict()
        self._expected_lock = threading.Lock()
        self.index = OperationIndex(lambda statuses, size: self.list(OperationQuery(status=sorted(statuses),
                                                                                     limit=size)))
        changeable = self.db.query(
            f"SELECT id, status FROM operations WHERE status NOT IN ({','.join('?' * len(FINAL))})",
            [s.value for s in FINAL])
        self.index.rebuild(self._sql_counts(), ((r["id"], Status(r["status"])) for r in changeable))

    # ----- writes at submission --------------------------------------------------------------------

    def insert(self, conn: Any, kind: OperationKind[Any], target: str, normalized: Any, stage_names: Sequence[str],
               principal: Principal, fingerprint: str, scoped_key: str | None) -> str:
        """A new operation row and its planned stages, refused (409) while a related target is busy."""
        busy = conflicting_operation(conn, target)
        if busy is not None:
            raise Conflict(
                f"{busy['kind']} operation {busy['id']} on {busy['target']} is {busy['status']}; it conflicts with "
                f"this request on {target} (same, enclosing or enclosed target). Follow it with {STATUS_TOOL} "
                f"(GET /api/v1/operations/{busy['id']}) and try again once it has ended",
                details={"operation_id": busy["id"], "kind": busy["kind"], "target": busy["target"],
                         "status": busy["status"], "status_tool": STATUS_TOOL,
                         "status_url": f"/api/v1/operations/{busy['id']}"})
        now = self.clock.now()
        op_id = f"op-{uuid.uuid4().hex[:16]}"
        conditions = set_condition([], now, "Accepted", "True", "Validated", "request accepted")
        conditions = set_condition(conditions, now, "Succeeded", "Unknown", "Pending")
        conn.execute(
            "INSERT INTO operations(id, kind, target, status, request, fingerprint, idempotency_key,"
            " actor, role, face, client, created_at, updated_at, due_at, conditions)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (op_id, kind.name, target, Status.PENDING.value, dumps(normalized), fingerprint, scoped_key,
             principal.name, principal.role.value, principal.face, principal.client, now, now, now,
             dumps(conditions)))
        self.index.inserted(op_id)
        for idx, name in enumerate(stage_names):
            conn.execute("INSERT INTO stages(operation_id, idx, name, status, phase) VALUES (?,?,?,?,?)",
                         (op_id, idx, name, StageStatus.PENDING.value, Phase.OBSERVE.value))
        return op_id

    # ----- reads ------------------------------------------------------------------------------------

    def get(self, op_id: str) -> OperationView:
        row = self.db.query_one("SELECT * FROM operations WHERE id=?", (op_id,))
        if row is None:
            raise NotFound(f"no operation {op_id!r}")
        stages = self.db.query("SELECT * FROM stages WHERE operation_id=? ORDER BY idx", (op_id,))
        return self.view(row, stages)

    def list(self, query: OperationQuery) -> builtins.list[OperationView]:
        where: builtins.list[str] = []
        params: builtins.list[Any] = []
        if query.status:
            where.append(f"status IN ({','.join('?' * len(query.status))})")
            params += [s.value for s in query.status]
        if query.active is not None:
            states = ACTIVE if query.active else TERMINAL
            where.append(f"status IN ({','.join('?' * len(states))})")
            params += [s.value for s in states]
        if query.cluster is not None:  # the cluster and everything under it (groups, nodes)
            where.append("(target = ? OR substr(target, 1, ?) = ?)")
            prefix = f"cluster/{query.cluster}/"
            params += [f"cluster/{query.cluster}", len(prefix), prefix]
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
        by_op: dict[str, builtins.list[Any]] = {}
        for s in stage_rows:
            by_op.setdefault(s["operation_id"], []).append(s)
        return [self.view(r, by_op.get(r["id"], [])) for r in rows]

    def counts(self) -> dict[str, int]:
        """Operations per status, from memory (:mod:`services.operation_index`)."""
        return self.index.counts()

    def _sql_counts(self) -> dict[str, int]:
        rows = self.db.query("SELECT status, COUNT(*) AS n FROM operations GROUP BY status")
        return {r["status"]: r["n"] for r in rows}

    def queue_depth(self) -> int:
        """Operations due now that no worker has claimed yet."""
        row = self.db.query_one("SELECT COUNT(*) AS n FROM operations WHERE status IN (?,?) AND claimed=0 "
                                "AND due_at<=?", (Status.PENDING.value, Status.WAITING.value, self.clock.now()))
        return int(row["n"]) if row is not None else 0

    def view(self, row: Any, stages: builtins.list[Any]) -> OperationView:
        kind = self.kinds.get(row["kind"])
        declared = {s.name: s for s in kind.stages} if kind is not None else {}
        durations = self._expected_of(kind, row, declared) if declared else {}
        views = []
        for s in stages:
            stage = declared.get(s["name"])
            deadline = effective_deadline(stage, self.pace, self.deadline_floor) if stage is not None else None
            seconds = durations.get(s["name"])
            expected = seconds * self.pace if seconds else None
            views.append(StageView(
                name=s["name"], status=StageStatus(s["status"]), phase=Phase(s["phase"]), attempts=s["attempts"],
                acted=bool(s["acted"]), read_only=stage.read_only if stage is not None else False,
                retries=s["retries"], backoff_seconds=round(s["backoff"], 3), deadline_seconds=deadline,
                expected_seconds=round(expected, 3) if expected is not None else None,
                started_at=iso(s["started_at"]), finished_at=iso(s["finished_at"]), message=s["message"],
                result=loads(s["result"])))
        return OperationView(
            id=row["id"], kind=row["kind"], target=row["target"], status=Status(row["status"]),
            actor=row["actor"], face=row["face"], client=row["client"], created_at=iso(row["created_at"]) or "",
            updated_at=iso(row["updated_at"]) or "", version=row["version"], due_at=iso(row["due_at"]),
            cancel_requested=bool(row["cancel_requested"]), request=loads(row["request"]),
            conditions=[Condition(**c) for c in loads(row["conditions"])],
            result=loads(row["result"]), error=loads(row["error"]),
            status_url=f"/api/v1/operations/{row['id']}", stages=views)

    def _expected_of(self, kind: Any, row: Any, declared: Mapping[str, Any]) -> dict[str, float | None]:
        """Each declared stage's expected seconds for this operation's request, computed at its first view and
        kept (the last ``EXPECTED_CACHE`` operations): a view or long-poll never re-validates the request."""
        with self._expected_lock:
            found = self._expected.get(row["id"])
            if found is not None:
                self._expected.move_to_end(row["id"])
                return found
        request = self._typed_request(kind, row)
        found = {name: stage.expected_for(request) if request is not None else stage.expected_seconds
                 for name, stage in declared.items()}
        with self._expected_lock:
            self._expected[row["id"]] = found
            while len(self._expected) > EXPECTED_CACHE:
                self._expected.popitem(last=False)
        return found

    @staticmethod
    def _typed_request(kind: Any, row: Any) -> Any:
        """The operation's request as its kind's model (what a stage's expected duration may depend on);
        None when the stored request no longer fits the model."""
        try:
            return kind.request_model.model_validate(loads(row["request"]))
        except ValidationError:
            return None

    @staticmethod
    def row(conn: Any, op_id: str) -> Any:
        row = conn.execute("SELECT * FROM operations WHERE id=?", (op_id,)).fetchone()
        if row is None:
            raise NotFound(f"no operation {op_id!r}")
        return row

    # ----- the transition functions -----------------------------------------------------------------

    def update(self, conn: Any, row: Any, status: Status, now: float, *, due_at: Any = _UNSET,
               claimed: int | None = None, conditions: builtins.list[dict[str, Any]] | None = None,
               result: Any = _UNSET, error: Any = _UNSET) -> None:
        """The one place an operation's status changes: checked against TRANSITIONS, version-guarded."""
        check_transition(Status(row["status"]), status)
        sets = ["status=?", "updated_at=?", "version=version+1"]
        params: builtins.list[Any] = [status.value, now]
        for column, value in (("due_at", due_at), ("result", result), ("error", error)):
            if value is not _UNSET:
                sets.append(f"{column}=?")
                params.append(value if column == "due_at" or value is None else dumps(value))
        if claimed is not None:
            sets.append("claimed=?")
            params.append(claimed)
        if conditions is not None:
            sets.append("conditions=?")
            params.append(dumps(conditions))
        cur = conn.execute(f"UPDATE operations SET {', '.join(sets)} WHERE id=? AND version=?",
                           (*params, row["id"], row["version"]))
        if cur.rowcount != 1:
            raise Conflict(f"operation {row['id']} changed concurrently; try again")

    def save_stage(self, op_id: str, idx: int, data: dict[str, Any] | None, *, status: StageStatus | None = None,
                   phase: Phase | None = None, attempts: int | None = None, transients: int | None = None,
                   retries: int | None = None, backoff: float | None = None, acted: bool | None = None,
                   message: str | None = None, result: dict[str, Any] | None = None, started: bool = False,
                   conn: Any = None) -> None:
        """The one place a stage changes: its status and phase checked against their tables."""
        if conn is None:
            with self.db.tx() as tx:
                self.save_stage(op_id, idx, data, status=status, phase=phase, attempts=attempts,
                                transients=transients, retries=retries, backoff=backoff, acted=acted,
                                message=message, result=result, started=started, conn=tx)
            self.publish(op_id)
            return
        now = self.clock.now()
        old = conn.execute("SELECT s.name, s.status, s.phase, s.started_at, o.kind FROM stages s JOIN operations o "
                           "ON o.id=s.operation_id WHERE s.operation_id=? AND s.idx=?", (op_id, idx)).fetchone()
        if status is not None:
            check_stage_transition(old["name"], StageStatus(old["status"]), status)
        if phase is not None:
            check_phase_transition(old["name"], Phase(old["phase"]), phase)
        sets: builtins.list[str] = []
        params: builtins.list[Any] = []
        if data is not None:
            sets.append("data=?")
            params.append(dumps(data))
        for column, value in (("status", status), ("phase", phase), ("attempts", attempts),
                              ("transients", transients), ("retries", retries), ("backoff", backoff),
                              ("message", message)):
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
        if status in (StageStatus.SUCCEEDED, StageStatus.FAILED):
            sets.append("finished_at=?")
            params.append(now)
            began = now if started or old["started_at"] is None else float(old["started_at"])
            self.metrics.stage_finished(old["kind"], old["name"], status.value, now - began)
        if sets:
            conn.execute(f"UPDATE stages SET {', '.join(sets)} WHERE operation_id=? AND idx=?", (*params, op_id, idx))
        conn.execute("UPDATE operations SET version=version+1, updated_at=? WHERE id=?", (now, op_id))

    # ----- endings ----------------------------------------------------------------------------------

    def finish_cancelled(self, conn: Any, row: Any, now: float, by: str) -> None:
        conds = set_condition(loads(row["conditions"]), now, "Progressing", "False", "Cancelled", f"cancelled by {by}")
        conds = set_condition(conds, now, "Succeeded", "False", "Cancelled", f"cancelled by {by}")
        self.update(conn, row, Status.CANCELLED, now, due_at=None, conditions=conds, claimed=0)
        conn.execute("UPDATE stages SET status=? WHERE operation_id=? AND status IN (?,?,?)",
                     (StageStatus.CANCELLED.value, row["id"], StageStatus.PENDING.value, StageStatus.RUNNING.value,
                      StageStatus.FAILED.value))
        self.audit_end(conn, row, "cancelled", f"cancelled by {by}")
        self.metrics.operation_finished(row["kind"], Status.CANCELLED.value)

    def succeed(self, op_id: str) -> None:
        now = self.clock.now()
        with self.db.tx() as conn:
            row = self.row(conn, op_id)
            results = {r["name"]: loads(r["result"]) or {} for r in conn.execute(
                "SELECT name, result FROM stages WHERE operation_id=? ORDER BY idx", (op_id,))}
            conds = set_condition(loads(row["conditions"]), now, "Progressing", "False", "Finished", "all stages done")
            conds = set_condition(conds, now, "Succeeded", "True", "AllStagesDone", "")
            self.update(conn, row, Status.SUCCEEDED, now, due_at=None, claimed=0, conditions=conds, result=results)
            self.audit_end(conn, row, "succeeded", "")
        self.metrics.operation_finished(row["kind"], Status.SUCCEEDED.value)
        self.publish(op_id)

    def stop_outside(self, op_id: str) -> None:
        """A cancelled operation's kind ``on_cancel`` (what still runs outside the engine: a Job), run after the
        cancel committed; safe to run again."""
        row = self.db.query_one("SELECT kind, request FROM operations WHERE id=?", (op_id,))
        kind = self.kinds.get(row["kind"]) if row is not None else None
        if row is not None and kind is not None and kind.on_cancel is not None:
            kind.on_cancel(kind.request_model.model_validate(loads(row["request"])))
        self.undo_unsuccessful(op_id)

    def undo_unsuccessful(self, op_id: str) -> None:
        """An operation that ended failed or cancelled: its kind's ``on_unsuccessful`` (safe to run again)."""
        row = self.db.query_one("SELECT kind, request FROM operations WHERE id=?", (op_id,))
        kind = self.kinds.get(row["kind"]) if row is not None else None
        if row is not None and kind is not None and kind.on_unsuccessful is not None:
            kind.on_unsuccessful(op_id, kind.request_model.model_validate(loads(row["request"])))

    def stopped_by_request(self, op_id: str) -> None:
        """After a worker ended an operation whose cancel was asked for while it stepped: :meth:`stop_outside`,
        its failure logged (the cancel stands; cancelling again runs it again)."""
        try:
            self.stop_outside(op_id)
        except Exception:
            log.warning("operation %s: stopping what it started outside the engine failed; cancel it again to "
                        "retry", op_id, exc_info=True)

    def fail(self, op_id: str, exc: ServiceError, stage_idx: int | None) -> None:
        now = self.clock.now()
        with self.db.tx() as conn:
            row = self.row(conn, op_id)
            if Status(row["status"]).terminal:
                return
            stage_name = ""
            if stage_idx is not None:
                stage_name = conn.execute("SELECT name FROM stages WHERE operation_id=? AND idx=?",
                                          (op_id, stage_idx)).fetchone()["name"]
                self.save_stage(op_id, stage_idx, None, status=StageStatus.FAILED, message=exc.message, conn=conn)
            reason = getattr(exc, "reason", None) or "".join(p.capitalize() for p in exc.code.split("_"))
            where = f"stage {stage_name}: " if stage_name else ""
            conds = set_condition(loads(row["conditions"]), now, "Progressing", "False", "Failed", where + exc.message)
            conds = set_condition(conds, now, "Succeeded", "False", reason, where + exc.message)
            error = {**exc.envelope()["error"], "stage": stage_name or None}
            row = self.row(conn, op_id)
            self.update(conn, row, Status.FAILED, now, due_at=None, claimed=0, conditions=conds, error=error)
            self.audit_end(conn, row, "failed", where + exc.message)
        self.metrics.operation_finished(row["kind"], Status.FAILED.value)
        self.publish(op_id)
        try:
            self.undo_unsuccessful(op_id)
        except Exception:  # the failure stands; cancelling the operation runs the undo again
            log.warning("operation %s: undoing what the failed operation did failed; cancel it to retry", op_id,
                        exc_info=True)

    def audit_end(self, conn: Any, row: Any, outcome: str, detail: str) -> None:
        who = Principal(row["actor"], Role(row["role"]), None, row["face"], row["client"])
        self.audit.record(who, row["kind"], row["target"], loads(row["request"]), outcome, row["id"],
                          detail=detail, conn=conn)

    def publish(self, op_id: str) -> None:
        view = self.index.apply(lambda: self.get(op_id)).model_dump(mode="json")
        parts = str(view["target"]).split("/")
        cluster = {"cluster": parts[1]} if len(parts) > 1 and parts[0] == "cluster" else {}
        self.bus.publish(Event("operation", "updated", {**view, **cluster}))  # a cluster's subscribers find it
