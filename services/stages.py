"""The stage contract every operation kind is written against.

A stage **observes** actual state (DONE: nothing to do; IN_PROGRESS: already acted, go wait; ABSENT: act
now), **acts** with deterministic names or client tokens, then **polls** until :class:`Done`. Its output,
whichever way it finished, comes from one place: :meth:`Stage.result`. Stages see the kind's typed request
model (``ctx.request``), never a dict. Stages never sleep, never loop and never retry: the engine
(``services/operations.py``) persists their phase, schedules their waits, backs off on
:class:`~services.errors.Transient` failures and fails a stage that waits past its :attr:`Stage.deadline`.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Generic, TypeVar

from services.auth import Role
from services.clock import Clock
from services.errors import Permanent
from services.models import RequestModel

R = TypeVar("R", bound=RequestModel)

#: how long a stage may take, from its first step to done, unless it says otherwise
DEFAULT_DEADLINE = 3600.0
#: real seconds a paced deadline never drops below: a sped-up sandbox scales an hour to about a second, which a
#: loaded machine can spend on the stage's own calls (see :func:`effective_deadline`)
DEFAULT_DEADLINE_FLOOR = 60.0


class Observed(Enum):
    DONE = "done"
    IN_PROGRESS = "in_progress"
    ABSENT = "absent"


@dataclass(frozen=True)
class Done:
    """The stage is finished (its output is :meth:`Stage.result`); ``message``, if given, says how (the
    stage's message; else "done"), e.g. what it found and left alone."""

    message: str = ""


@dataclass(frozen=True)
class Wait:
    """Not yet: look again in ``seconds``; ``message`` says what the stage waits for (shown meanwhile, and
    named if the stage runs past its deadline)."""

    seconds: float
    message: str = ""


def _unsaved() -> None:
    """A context outside the engine (a test driving a stage by hand) has nowhere to save to."""


@dataclass
class StageContext(Generic[R]):
    """What a stage sees: its operation, the typed request, its own persisted scratch ``data`` and the
    results of the stages before it. ``save`` writes ``data`` now, mid-act: an act of several calls records
    each call's outcome before the next, so a crash between them resumes knowing what was sent."""

    operation_id: str
    kind: str
    target: str
    request: R
    data: dict[str, Any]
    results: dict[str, dict[str, Any]]
    clock: Clock
    attempt: int
    save: Callable[[], None] = _unsaved


class Stage(abc.ABC, Generic[R]):
    """Base stage: ``observe`` is required; read-only stages never act; ``poll`` defaults to done.

    A *read-only* stage (``read_only = True``: a check, a verification) does its work in ``observe`` and
    answers DONE; its run counts as an attempt and :meth:`report` says what it found, so it never reads
    as "already in the desired state, nothing done"."""

    name: str = "stage"
    #: transient failures tolerated in a row before the stage fails
    max_transient: int = 20
    #: the stage only looks (its observation is the work); it never acts
    read_only: bool = False
    #: seconds from the stage's first step to done; past it a waiting stage fails naming what it waited for
    #: (scaled by the engine's pace, like its waits). None: no limit
    deadline: float | None = DEFAULT_DEADLINE
    #: the wait is on this machine's own work (a watch listing), not on the world's clock: the deadline is
    #: real seconds, never scaled by the pace (a sandbox at 40x lists a cluster no faster)
    real_time_deadline: bool = False
    #: how long the stage usually takes in the world it acts on (AWS's real durations), seconds; shown next to
    #: its elapsed time, scaled by the engine's pace like its waits (so the sandbox shows its own). None: unknown
    expected_seconds: float | None = None

    def expected_for(self, request: R) -> float | None:
        """How long the stage usually takes for ``request`` (AWS's durations, seconds): ``expected_seconds``
        unless the request changes it (a stage that makes a resource only for some requests)."""
        return self.expected_seconds

    @abc.abstractmethod
    def observe(self, ctx: StageContext[R]) -> Observed: ...

    def act(self, ctx: StageContext[R]) -> None:
        raise Permanent(f"stage {self.name} only observes, yet its observation asked it to act")

    def poll(self, ctx: StageContext[R]) -> Done | Wait:
        return Done()

    def result(self, ctx: StageContext[R]) -> dict[str, Any]:
        """The stage's output once done, however it got there (later stages and the operation see it)."""
        return {}

    def report(self, ctx: StageContext[R]) -> str:
        """For a read-only stage: one line on what it checked and found (the stage's message)."""
        return ""


@dataclass(frozen=True)
class OperationKind(Generic[R]):
    """A named recipe: the request model it accepts and the ordered stages that carry it out."""

    name: str
    request_model: type[R]
    stages: tuple[Stage[R], ...]
    target: Callable[[R], str]
    description: str = ""
    #: the least role that may start it: admin for destructive kinds (delete cluster, replace nodes)
    role: Role = Role.OPERATOR
    #: synchronous refusals (raise Invalid/Conflict) checked before any operation row is written
    precheck: Callable[[R], None] | None = None
    #: while one operation of this kind on a target is active, new requests for that target join it
    coalesce: bool = False
    #: the names of the stages this request needs (in any order; run in the kind's order), decided once at
    #: submit time and stored with the operation. None: every stage
    plan: Callable[[R], Sequence[str]] | None = None
    #: what cancelling must stop outside the engine (a Job still running in the cluster), called once the
    #: operation has ended cancelled, whichever face asked for it (and again when it is cancelled again)
    on_cancel: Callable[[R], None] | None = None
    #: what an operation that ends without success (failed, or cancelled) must undo outside the engine, given
    #: its id and request: called once it has ended so, however it ended (a stage's error, its retry budget or
    #: deadline, a bug, a cancel), and again when it is cancelled or fails again; it must be safe to run again
    on_unsuccessful: Callable[[str, R], None] | None = None

    def stages_for(self, request: R) -> tuple[Stage[R], ...]:
        if self.plan is None:
            return self.stages
        wanted = set(self.plan(request))
        unknown = wanted - {s.name for s in self.stages}
        if unknown:
            raise Permanent(f"kind {self.name} planned stages it does not have: {sorted(unknown)}; this is a bug")
        return tuple(s for s in self.stages if s.name in wanted)

    def stage(self, name: str) -> Stage[R] | None:
        return next((s for s in self.stages if s.name == name), None)


def effective_deadline(stage: Stage[Any], pace: float, floor: float) -> float | None:
    """The seconds, on the engine's clock, a stage may take: its :attr:`Stage.deadline` scaled by ``pace``
    (real-time deadlines are not scaled), but never less than ``floor`` real seconds, so a fast sandbox's scaled
    deadline cannot fail a stage that only ran slowly on a loaded machine; the floor never lengthens a deadline
    past the stage's own (against AWS, at pace 1, the deadline is the stage's)."""
    if stage.deadline is None:
        return None
    if stage.real_time_deadline:
        return stage.deadline
    return max(stage.deadline * pace, min(stage.deadline, floor))


def checked_result(stage: Stage[Any], result: Any) -> dict[str, Any]:
    """A stage's result must be a JSON object; anything else would poison every later read."""
    if not isinstance(result, dict):
        raise Permanent(f"stage {stage.name} returned {type(result).__name__}, not a dict; this is a bug")
    try:
        json.dumps(result)
    except (TypeError, ValueError) as exc:
        raise Permanent(f"stage {stage.name} returned a result that is not JSON: {exc}; this is a bug") from None
    return result
