"""What an operation looks like to every face, and the rules its status follows.

An operation's status moves only along :data:`TRANSITIONS`, a stage's status along
:data:`STAGE_TRANSITIONS` and its phase along :data:`PHASE_TRANSITIONS` (Prefect's FROM -> TO idea): every
edge the engine takes is in a table, with no double hops through a state it never was in. Conditions are
Kubernetes style, one per type, with a transition time that moves only when the status does.
"""

from __future__ import annotations

import datetime as dt
from enum import StrEnum
from typing import Any

from pydantic import Field

from services.errors import Conflict
from services.models import RequestModel, ResponseModel

STATUS_TOOL = "operations_get"


class Status(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    WAITING = "waiting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({Status.SUCCEEDED, Status.FAILED, Status.CANCELLED})
ACTIVE = frozenset({Status.PENDING, Status.RUNNING, Status.WAITING})

TRANSITIONS: dict[Status, frozenset[Status]] = {
    # FAILED: an operation whose kind is no longer registered, or that cannot be read, fails unclaimed
    Status.PENDING: frozenset({Status.RUNNING, Status.CANCELLED, Status.FAILED}),
    Status.RUNNING: frozenset({Status.WAITING, Status.SUCCEEDED, Status.FAILED, Status.CANCELLED,
                               Status.PENDING}),  # PENDING: released by a crash, resumed at start-up
    Status.WAITING: frozenset({Status.RUNNING, Status.CANCELLED, Status.FAILED}),
    Status.FAILED: frozenset({Status.PENDING,  # retry of the failed stage
                              Status.CANCELLED}),  # a failed operation abandoned
    Status.SUCCEEDED: frozenset(),
    Status.CANCELLED: frozenset(),
}


def check_transition(old: Status, new: Status) -> None:
    if new != old and new not in TRANSITIONS[old]:
        raise Conflict(f"operation cannot go from {old.value} to {new.value}")


class StageStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


STAGE_TRANSITIONS: dict[StageStatus, frozenset[StageStatus]] = {
    # FAILED from PENDING: a stage that cannot even start (its request no longer validates)
    StageStatus.PENDING: frozenset({StageStatus.RUNNING, StageStatus.FAILED, StageStatus.CANCELLED}),
    StageStatus.RUNNING: frozenset({StageStatus.SUCCEEDED, StageStatus.FAILED, StageStatus.CANCELLED}),
    StageStatus.FAILED: frozenset({StageStatus.PENDING, StageStatus.CANCELLED}),  # retried, or abandoned
    StageStatus.SUCCEEDED: frozenset(),
    StageStatus.CANCELLED: frozenset(),
}


class Phase(StrEnum):
    """Where a stage is in observe -> act -> poll; on disk *before* each side effect and each wait."""

    OBSERVE = "observe"  # look first
    ACTING = "acting"  # act() has been entered: after a crash, observe again, never act blindly
    WAITING = "waiting"  # acted (or found in progress): poll until done
    DONE = "done"


PHASE_TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.OBSERVE: frozenset({Phase.ACTING, Phase.WAITING, Phase.DONE}),
    # OBSERVE: a retry starts the failed stage over with a look; DONE: observed done after a crash in act()
    Phase.ACTING: frozenset({Phase.WAITING, Phase.DONE, Phase.OBSERVE}),
    Phase.WAITING: frozenset({Phase.DONE, Phase.OBSERVE}),
    Phase.DONE: frozenset(),
}


def check_stage_transition(stage: str, old: StageStatus, new: StageStatus) -> None:
    if new != old and new not in STAGE_TRANSITIONS[old]:
        raise Conflict(f"stage {stage} cannot go from {old.value} to {new.value}")


def check_phase_transition(stage: str, old: Phase, new: Phase) -> None:
    if new != old and new not in PHASE_TRANSITIONS[old]:
        raise Conflict(f"stage {stage} cannot move from phase {old.value} to {new.value}")



class Condition(ResponseModel):
    type: str
    status: str = Field(..., description="True, False or Unknown")
    reason: str
    message: str = ""
    last_transition_time: str


class StageView(ResponseModel):
    name: str
    status: StageStatus
    phase: Phase
    attempts: int = Field(..., description="times the stage acted, or, for a read-only stage, ran its check")
    acted: bool = Field(..., description="whether the stage changed anything")
    retries: int = Field(0, description="transient failures (throttling, 5xx, timeouts) the engine retried")
    backoff_seconds: float = Field(0.0, description="time spent backing off before those retries")
    deadline_seconds: float | None = Field(None, description="how long the stage may take before it fails")
    expected_seconds: float | None = Field(None, description="how long the stage usually takes (in this world: "
                                                             "AWS's durations, scaled in the sandbox)")
    read_only: bool = Field(False, description="a check: it looks and reports, never changes anything")
    started_at: str | None = None
    finished_at: str | None = None
    message: str = ""
    result: dict[str, Any] | None = None


class OperationView(ResponseModel):
    """An operation as every face shows it."""

    id: str
    kind: str
    target: str
    status: Status
    actor: str
    face: str = Field(..., description="the transport the server saw: ui (dashboard), api (bearer token), cli, "
                                       "system")
    client: str = Field("", description="what the caller claimed to be (X-InstantStart-Face), e.g. mcp")
    created_at: str
    updated_at: str
    version: int
    due_at: str | None = None
    cancel_requested: bool = False
    request: dict[str, Any]
    stages: list[StageView]
    conditions: list[Condition]
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    status_url: str
    status_tool: str = STATUS_TOOL


class OperationQuery(RequestModel):
    """Filter operations; newest first."""

    status: list[Status] | None = Field(None, description="only these statuses")
    kind: str | None = Field(None, description="only this kind, e.g. 'backup.create'")
    target: str | None = Field(None, description="only operations on this target")
    cluster: str | None = Field(None, description="only operations on this cluster or anything in it "
                                "(targets cluster/<name> and cluster/<name>/...)")
    actor: str | None = Field(None, description="only operations started by this token name")
    active: bool | None = Field(None, description="true: only pending/running/waiting; false: only ended")
    before: str | None = Field(None, description="page: operations created before this operation id")
    limit: int = Field(50, ge=1, le=500, description="at most this many operations")


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def set_condition(conditions: list[dict[str, Any]], now: float, type_: str, status: str, reason: str,
                   message: str = "") -> list[dict[str, Any]]:
    """Upsert one condition per type; the transition time moves only when the status does."""
    out = [c for c in conditions if c["type"] != type_]
    old = next((c for c in conditions if c["type"] == type_), None)
    when = old["last_transition_time"] if old and old["status"] == status else iso(now)
    out.append({"type": type_, "status": status, "reason": reason, "message": message,
                "last_transition_time": when})
    order = ["Accepted", "Progressing", "Succeeded"]
    return sorted(out, key=lambda c: order.index(c["type"]) if c["type"] in order else len(order))

