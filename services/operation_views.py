"""What an operation looks like to every face, and the rules its status follows.

Statuses move only along :data:`TRANSITIONS` (Prefect's FROM -> TO idea); conditions are Kubernetes style,
one per type, with a transition time that moves only when the status does.
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
    Status.PENDING: frozenset({Status.RUNNING, Status.CANCELLED}),
    Status.RUNNING: frozenset({Status.WAITING, Status.SUCCEEDED, Status.FAILED, Status.CANCELLED,
                               Status.PENDING}),  # PENDING: released by a crash, resumed at start-up
    Status.WAITING: frozenset({Status.RUNNING, Status.CANCELLED}),
    Status.FAILED: frozenset({Status.PENDING}),  # retry of the failed stage
    Status.SUCCEEDED: frozenset(),
    Status.CANCELLED: frozenset(),
}


def check_transition(old: Status, new: Status) -> None:
    if new != old and new not in TRANSITIONS[old]:
        raise Conflict(f"operation cannot go from {old.value} to {new.value}")



class Condition(ResponseModel):
    type: str
    status: str = Field(..., description="True, False or Unknown")
    reason: str
    message: str = ""
    last_transition_time: str


class StageView(ResponseModel):
    name: str
    status: str
    phase: str
    attempts: int = Field(..., description="times the stage acted, or, for a read-only stage, ran its check")
    acted: bool = Field(..., description="whether the stage changed anything")
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

