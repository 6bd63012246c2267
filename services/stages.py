"""The stage contract every operation kind is written against.

A stage **observes** actual state (DONE: nothing to do; IN_PROGRESS: already acted, go wait; ABSENT: act
now), **acts** with deterministic names or client tokens, then **polls** until :class:`Done`. Stages never
sleep and never loop: the engine (``services/operations.py``) persists their phase and schedules them.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from services.auth import Role
from services.clock import Clock
from services.errors import Permanent
from services.models import RequestModel


class Observed(Enum):
    DONE = "done"
    IN_PROGRESS = "in_progress"
    ABSENT = "absent"


@dataclass(frozen=True)
class Done:
    """The stage is finished; ``result`` is kept on the stage and visible to later stages."""

    result: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Wait:
    """Not yet: look again in ``seconds``; ``message`` is shown on the operation meanwhile."""

    seconds: float
    message: str = ""


@dataclass
class StageContext:
    """What a stage sees: its operation, its own persisted scratch ``data`` and earlier results."""

    operation_id: str
    kind: str
    target: str
    request: dict[str, Any]
    data: dict[str, Any]
    results: dict[str, dict[str, Any]]
    clock: Clock
    attempt: int


class Stage(abc.ABC):
    """Base stage: ``observe`` is required; read-only stages never act; ``poll`` defaults to done.

    A *read-only* stage (``read_only = True``: a check, a verification) does its work in ``observe`` and
    answers DONE; its run counts as an attempt and :meth:`report` says what it found, so it never reads
    as "already in the desired state, nothing done"."""

    name: str = "stage"
    #: transient failures tolerated in a row before the stage fails
    max_transient: int = 20
    #: the stage only looks (its observation is the work); it never acts
    read_only: bool = False

    @abc.abstractmethod
    def observe(self, ctx: StageContext) -> Observed: ...

    def act(self, ctx: StageContext) -> None:
        raise Permanent(f"stage {self.name} only observes, yet its observation asked it to act")

    def poll(self, ctx: StageContext) -> Done | Wait:
        return Done()

    def result(self, ctx: StageContext) -> dict[str, Any]:
        """The stage's output once done (what later stages and the operation's result see)."""
        return {}

    def report(self, ctx: StageContext) -> str:
        """For a read-only stage: one line on what it checked and found (the stage's message)."""
        return ""


@dataclass(frozen=True)
class OperationKind:
    """A named recipe: the request model it accepts and the ordered stages that carry it out."""

    name: str
    request_model: type[RequestModel]
    stages: tuple[Stage, ...]
    target: Callable[[Any], str]
    description: str = ""
    #: the least role that may start it: admin for destructive kinds (delete cluster, replace nodes)
    role: Role = Role.OPERATOR
    #: synchronous refusals (raise Invalid/Conflict) checked before any operation row is written
    precheck: Callable[[Any], None] | None = None
    #: while one operation of this kind on a target is active, new requests for that target join it
    coalesce: bool = False


def checked_result(stage: Stage, result: Any) -> dict[str, Any]:
    """A stage's result must be a JSON object; anything else would poison every later read."""
    if not isinstance(result, dict):
        raise Permanent(f"stage {stage.name} returned {type(result).__name__}, not a dict; this is a bug")
    try:
        json.dumps(result)
    except (TypeError, ValueError) as exc:
        raise Permanent(f"stage {stage.name} returned a result that is not JSON: {exc}; this is a bug") from None
    return result

