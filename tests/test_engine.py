"""The operation engine with test-only kinds: stage contract, waits, failures, retry, cancel, idempotency."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app.bootstrap import Services
from services.audit import AuditQuery
from services.clock import FakeClock
from services.db import Database
from services.errors import Conflict, Invalid, NotFound, Permanent, Transient
from services.events import Event
from services.operations import (
    TRANSITIONS,
    DataDirLocked,
    Done,
    Engine,
    Observed,
    OperationKind,
    OperationQuery,
    OperationView,
    Stage,
    StageContext,
    Status,
    Wait,
    check_transition,
)
from tests.conftest import ADMIN, OPERATOR
from tests.kinds import ThingRequest, World, thing_kind
from tests.support import wait_until


def submit(engine: Engine, name: str = "a", key: str | None = None, size: int = 1) -> OperationView:
    view, _ = engine.submit("thing.create", ThingRequest(name=name, size=size), OPERATOR, key)
    return view


def cond(view: OperationView, type_: str) -> tuple[str, str]:
    c = next(c for c in view.conditions if c.type == type_)
    return c.status, c.reason


def test_stages_observe_act_wait_then_succeed(engine: Engine, world: World, clock: FakeClock) -> None:
    op = submit(engine)
    assert op.status == Status.PENDING and cond(op, "Accepted") == ("True", "Validated")
    view = engine.run_until_idle(op.id)
    assert view.status == Status.WAITING
    assert view.stages[0].phase == "waiting" and view.stages[0].acted
    assert cond(view, "Progressing") == ("True", "Waiting")
    assert world.acts == 1
    # not due yet: nothing happens
    assert engine.run_until_idle(op.id).status == Status.WAITING
    clock.advance(10)
    view = engine.run_until_idle(op.id)
    assert view.status == Status.SUCCEEDED, view
    assert world.acts == 1
    assert [s.status for s in view.stages] == ["succeeded", "succeeded"]
    assert view.result == {"create": {"thing": "a"}, "label": {}}
    assert cond(view, "Succeeded") == ("True", "AllStagesDone")
    assert cond(view, "Progressing")[0] == "False"
    assert world.load()["things"]["a"]["label"] == "a"


def test_stage_already_satisfied_does_not_act(engine: Engine, world: World) -> None:
    world.update(things={"a": {"ready": True, "size": 1, "label": "a"}})
    view = engine.run_until_idle(submit(engine).id)
    assert view.status == Status.SUCCEEDED
    assert world.acts == 0
    assert all(not s.acted for s in view.stages)
    assert view.stages[0].message == "already in the desired state"


def test_transient_failure_waits_and_retries(engine: Engine, world: World, clock: FakeClock) -> None:
    world.update(faults=["transient"])
    op = submit(engine)
    view = engine.run_until_idle(op.id)
    assert view.status == Status.WAITING
    assert "throttled" in view.stages[0].message
    assert world.acts == 0
    clock.advance(5)
    view = engine.run_until_idle(op.id)
    assert view.status == Status.WAITING and world.acts == 1
    clock.advance(10)
    assert engine.run_until_idle(op.id).status == Status.SUCCEEDED


def test_permanent_failure_keeps_evidence_and_retry_resumes_the_failed_stage(
        engine: Engine, world: World, clock: FakeClock, services: Services) -> None:
    world.update(faults=["permanent"])
    op = submit(engine)
    view = engine.run_until_idle(op.id)
    assert view.status == Status.FAILED
    assert view.error is not None and view.error["stage"] == "create" and view.error["code"] == "permanent"
    assert cond(view, "Succeeded") == ("False", "Permanent")
    assert view.stages[0].status == "failed" and view.stages[1].status == "pending"
    with pytest.raises(Conflict):
        engine.retry(submit(engine, "other").id, OPERATOR)
    retried = engine.retry(op.id, OPERATOR)
    assert retried.status == Status.PENDING and retried.error is None
    assert engine.run_until_idle(op.id).status == Status.WAITING
    clock.advance(10)
    assert engine.run_until_idle(op.id).status == Status.SUCCEEDED
    assert world.acts == 1
    actions = [(e.action, e.outcome) for e in services.audit.list(AuditQuery(operation_id=op.id))]
    assert ("operation.retry", "accepted") in actions and ("thing.create", "failed") in actions
    assert ("thing.create", "succeeded") in actions


def test_cancel_waiting_and_terminal(engine: Engine, world: World) -> None:
    op = submit(engine)
    engine.run_until_idle(op.id)
    view = engine.cancel(op.id, OPERATOR)
    assert view.status == Status.CANCELLED
    assert cond(view, "Succeeded") == ("False", "Cancelled")
    assert [s.status for s in view.stages] == ["cancelled", "cancelled"]
    with pytest.raises(Conflict):
        engine.cancel(op.id, OPERATOR)
    with pytest.raises(NotFound):
        engine.cancel("op-missing", OPERATOR)


def test_idempotency_key_and_derived_key(engine: Engine, clock: FakeClock) -> None:
    first, created = engine.submit("thing.create", ThingRequest(name="a"), OPERATOR, "key-1")
    again, created_again = engine.submit("thing.create", ThingRequest(name="a"), OPERATOR, "key-1")
    assert created and not created_again and again.id == first.id
    with pytest.raises(Conflict):
        engine.submit("thing.create", ThingRequest(name="a", size=2), OPERATOR, "key-1")
    # no key: an identical request while the first is active is the same operation...
    derived = submit(engine, "b")
    assert submit(engine, "b").id == derived.id
    # ...a different request on the same target is refused while it is active, naming it...
    with pytest.raises(Conflict) as busy:
        submit(engine, "b", size=3)
    assert busy.value.details["operation_id"] == derived.id and busy.value.details["status_tool"] == "operations_get"
    # ...and once it has ended, the same request makes a new one
    engine.run_until_idle(derived.id)
    clock.advance(10)
    assert engine.run_until_idle(derived.id).status == Status.SUCCEEDED
    assert submit(engine, "b").id != derived.id
    # an explicit key still finds its operation after the end
    engine.run_until_idle(first.id)
    clock.advance(10)
    engine.run_until_idle(first.id)
    assert engine.submit("thing.create", ThingRequest(name="a"), OPERATOR, "key-1")[0].id == first.id


def test_rejects_unknown_kind_and_wrong_model(engine: Engine) -> None:
    with pytest.raises(Invalid):
        engine.submit("nope", ThingRequest(name="a"), OPERATOR)
    with pytest.raises(Invalid):
        engine.submit("backup.create", ThingRequest(name="a"), OPERATOR)


def test_transition_table_guards_status_changes() -> None:
    for old, allowed in TRANSITIONS.items():
        for new in Status:
            if new == old or new in allowed:
                check_transition(old, new)
            else:
                with pytest.raises(Conflict):
                    check_transition(old, new)
    assert TRANSITIONS[Status.SUCCEEDED] == frozenset()


def test_list_filters_and_pages(engine: Engine, clock: FakeClock) -> None:
    ids = []
    for n in range(5):
        ids.append(submit(engine, f"t{n}").id)
        clock.advance(1)
    engine.cancel(ids[0], ADMIN)
    newest_first = [op.id for op in engine.list(OperationQuery())]
    assert newest_first == ids[::-1]
    page = engine.list(OperationQuery(limit=2))
    assert [op.id for op in page] == ids[:2:-1][:2]
    rest = engine.list(OperationQuery(before=page[-1].id))
    assert [op.id for op in rest] == ids[2::-1]
    assert [op.id for op in engine.list(OperationQuery(status=[Status.CANCELLED]))] == [ids[0]]
    assert len(engine.list(OperationQuery(active=True))) == 4
    assert [op.id for op in engine.list(OperationQuery(target="thing/t3"))] == [ids[3]]
    with pytest.raises(Invalid):
        engine.list(OperationQuery(before="op-nope"))


def test_events_publish_every_transition(engine: Engine, services: Services, clock: FakeClock) -> None:
    seen: list[Event] = []
    services.bus.subscribe(seen.append, topic="operation")
    op = submit(engine)
    engine.run_until_idle(op.id)
    assert services.bus.drain()
    statuses = [e.data["status"] for e in seen]
    assert statuses[0] == "pending" and "running" in statuses and statuses[-1] == "waiting"
    versions = [e.data["version"] for e in seen]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)


def test_workers_drive_operations_and_restart_resumes(tmp_path: Path, world: World) -> None:
    """The scheduler and pool run due work by themselves; a new engine on the same DB resumes it."""
    clock = FakeClock()
    db = Database(tmp_path / "state.db")
    from services.audit import AuditLog
    from services.events import EventBus

    def make() -> Engine:
        e = Engine(db, EventBus(), AuditLog(db, clock), clock, workers=2, lock_path=tmp_path / "engine.lock")
        e.register(thing_kind(world, ready_polls=3, poll_seconds=10))
        return e

    first = make()
    first.start()
    op, _ = first.submit("thing.create", ThingRequest(name="w"), OPERATOR)
    wait_until(lambda: first.get(op.id).status == Status.WAITING)
    with pytest.raises(DataDirLocked):
        make().start()
    first.stop()
    # simulate a crash mid-step: the row is claimed and running when the process disappears
    db.connection().execute("UPDATE operations SET status='running', claimed=1 WHERE id=?", (op.id,))
    second = make()
    seen: list[Event] = []
    second.bus.subscribe(seen.append)
    second.start()
    try:
        wait_until(lambda: second.get(op.id).status == Status.WAITING)
        assert second.bus.drain()  # the subscriber runs on its own thread: the resume's event may not be in yet
        resumed = next(e for e in seen if e.data["id"] == op.id)
        assert resumed.data["status"] == "pending"
        assert {c["type"]: c["reason"] for c in resumed.data["conditions"]}["Progressing"] == "Resumed"
        clock.advance(10)
        wait_until(lambda: second.get(op.id).status == Status.SUCCEEDED)
    finally:
        second.stop()
    assert world.acts == 1


def test_roles_are_enforced_by_the_engine_and_recorded(engine: Engine, world: World, services: Services) -> None:
    from services.auth import Role
    from services.errors import Forbidden
    from services.operations import OperationKind
    from tests.conftest import VIEWER

    with pytest.raises(Forbidden):
        engine.submit("thing.create", ThingRequest(name="v"), VIEWER)
    op = submit(engine)
    with pytest.raises(Forbidden):
        engine.cancel(op.id, VIEWER)
    admin_only = OperationKind("thing.destroy", ThingRequest, thing_kind(world).stages, lambda r: r.name,
                               role=Role.ADMIN)
    engine.register(admin_only)
    with pytest.raises(Forbidden):
        engine.submit("thing.destroy", ThingRequest(name="z"), OPERATOR)
    destroy, _ = engine.submit("thing.destroy", ThingRequest(name="z"), ADMIN)
    with pytest.raises(Forbidden):
        engine.cancel(destroy.id, OPERATOR)
    assert engine.cancel(destroy.id, ADMIN).status == Status.CANCELLED
    world.update(faults=["permanent"])
    failing, _ = engine.submit("thing.destroy", ThingRequest(name="y"), ADMIN)
    assert engine.run_until_idle(failing.id).status == Status.FAILED
    ended = services.audit.list(AuditQuery(operation_id=failing.id, action="thing.destroy"))
    assert [(e.outcome, e.role) for e in ended] == [("failed", "admin"), ("accepted", "admin")]


class _Scripted(Stage):
    """A stage driven by a script of callbacks, for the engine's edge cases."""

    name = "scripted"

    def __init__(self, on_act: Callable[[StageContext], None] = lambda ctx: None,
                 on_poll: Callable[[StageContext], Done | Wait] = lambda ctx: Done(),
                 result_of: Callable[[StageContext], Any] = lambda ctx: {}) -> None:
        self.on_act, self.on_poll, self.result_of = on_act, on_poll, result_of

    def observe(self, ctx: StageContext) -> Observed:
        return Observed.IN_PROGRESS if ctx.data.get("acted") else Observed.ABSENT

    def act(self, ctx: StageContext) -> None:
        ctx.data["acted"] = True
        self.on_act(ctx)

    def poll(self, ctx: StageContext) -> Done | Wait:
        return self.on_poll(ctx)

    def result(self, ctx: StageContext) -> dict[str, Any]:
        return self.result_of(ctx)  # type: ignore[no-any-return]


def scripted(engine: Engine, name: str, stage: Stage) -> OperationView:
    engine.register(OperationKind(name, ThingRequest, (stage,), lambda r: r.name))
    view, _ = engine.submit(name, ThingRequest(name="x"), OPERATOR)
    return view


def test_a_retry_is_not_swallowed_by_a_cancel_asked_before_the_failure(engine: Engine) -> None:
    fail = {"now": True}

    def act(ctx: StageContext) -> None:
        if fail["now"]:
            engine.cancel(ctx.operation_id, OPERATOR)  # the user presses Cancel while the stage runs...
            raise Permanent("boom")  # ...and the stage fails anyway

    op = scripted(engine, "t.cancel-then-fail", _Scripted(on_act=act))
    failed = engine.run_until_idle(op.id)
    assert failed.status == Status.FAILED
    fail["now"] = False
    engine.retry(op.id, OPERATOR)
    assert engine.run_until_idle(op.id).status == Status.SUCCEEDED


def test_a_cancel_asked_during_a_step_stops_at_once_not_at_the_next_due_time(engine: Engine,
                                                                            services: Services) -> None:
    def poll(ctx: StageContext) -> Wait:
        engine.cancel(ctx.operation_id, OPERATOR)
        return Wait(600, "long wait")

    op = scripted(engine, "t.cancel-during-step", _Scripted(on_poll=poll))
    assert engine.run_until_idle(op.id).status == Status.CANCELLED
    ended = services.audit.list(AuditQuery(operation_id=op.id, action="t.cancel-during-step"))
    assert ended[0].outcome == "cancelled"


def test_on_cancel_stops_what_runs_outside_once_the_operation_ends_cancelled(engine: Engine) -> None:
    """A kind's on_cancel: not while a worker's step is still running (it could start what the hook just
    stopped), but once the operation has ended cancelled, on every path; a failure reaches the caller, and
    cancelling the cancelled operation again runs it again."""
    stopped: list[str] = []
    broken = {"now": False}

    def stop(request: ThingRequest) -> None:
        if broken["now"]:
            raise Transient("the cluster did not answer")
        stopped.append(request.name)

    def poll(ctx: StageContext) -> Wait:
        engine.cancel(ctx.operation_id, OPERATOR)  # during the step: only requested
        assert stopped == [], "nothing is stopped while the step runs"
        return Wait(600, "long wait")

    engine.register(OperationKind("t.stoppable", ThingRequest, (_Scripted(on_poll=poll),), lambda r: r.name,
                                  on_cancel=stop))
    during, _ = engine.submit("t.stoppable", ThingRequest(name="during"), OPERATOR)
    assert engine.run_until_idle(during.id).status == Status.CANCELLED
    assert stopped == ["during"], "the worker that ended it cancelled ran the hook"

    engine.register(OperationKind("t.stoppable-waiting", ThingRequest, (_Scripted(on_poll=lambda c: Wait(600, "x")),),
                                  lambda r: r.name, on_cancel=stop))
    waiting, _ = engine.submit("t.stoppable-waiting", ThingRequest(name="waiting"), OPERATOR)
    assert engine.run_until_idle(waiting.id).status == Status.WAITING
    broken["now"] = True
    with pytest.raises(Transient):
        engine.cancel(waiting.id, OPERATOR)
    assert engine.get(waiting.id).status == Status.CANCELLED, "the cancel stands"
    broken["now"] = False
    assert engine.cancel(waiting.id, OPERATOR).status == Status.CANCELLED  # again: no 409, the hook runs again
    assert stopped == ["during", "waiting"]


def test_on_unsuccessful_undoes_on_every_ending_but_success(engine: Engine, clock: FakeClock) -> None:
    """A kind's on_unsuccessful gets the operation's id and request once it has ended failed (a stage's error, its
    transient budget spent, a bug) or cancelled (while it waits); a success never runs it, and its own failure
    leaves the failure as it was."""
    undone: list[tuple[str, str]] = []
    broken = {"now": False}

    def undo(op_id: str, request: ThingRequest) -> None:
        if broken["now"]:
            raise RuntimeError("the cluster did not answer")
        undone.append((op_id, request.name))

    def raising(exc: Exception) -> Callable[[StageContext], Any]:
        def step(ctx: StageContext) -> Any:
            raise exc
        return step

    endings = {"permanent": _Scripted(on_act=raising(Permanent("boom"))),
               "budget": _Scripted(on_poll=raising(Transient("busy", delay=1))),
               "bug": _Scripted(on_act=raising(KeyError("x"))),
               "cancelled": _Scripted(on_poll=lambda ctx: Wait(600, "long wait")),
               "succeeded": _Scripted()}
    ops = {}
    for name, stage in endings.items():
        engine.register(OperationKind(f"t.undo-{name}", ThingRequest, (stage,), lambda r: r.name,
                                      on_unsuccessful=undo))
        ops[name], _ = engine.submit(f"t.undo-{name}", ThingRequest(name=name), OPERATOR)
    assert engine.run_until_idle(ops["cancelled"].id).status == Status.WAITING
    assert engine.cancel(ops["cancelled"].id, OPERATOR).status == Status.CANCELLED
    for _ in range(200):  # the budget's back-offs, on the fake clock
        views = {name: engine.run_until_idle(op.id) for name, op in ops.items()}
        if views["budget"].status.terminal:
            break
        clock.advance(120)
    assert {name: v.status for name, v in views.items() if name != "cancelled"} == {
        "permanent": Status.FAILED, "budget": Status.FAILED, "bug": Status.FAILED, "succeeded": Status.SUCCEEDED}
    assert sorted(undone) == sorted((ops[n].id, n) for n in ("permanent", "budget", "bug", "cancelled"))
    broken["now"] = True
    failing, _ = engine.submit("t.undo-permanent", ThingRequest(name="again"), OPERATOR)
    failed = engine.run_until_idle(failing.id)
    assert failed.status == Status.FAILED and failed.error is not None and failed.error["message"] == "boom"


def test_the_transient_budget_counts_failures_in_a_row(engine: Engine, clock: FakeClock) -> None:
    polls = {"n": 0}

    def poll(ctx: StageContext) -> Done | Wait:
        polls["n"] += 1
        if polls["n"] >= 60:
            return Done()
        if polls["n"] % 2:
            raise Transient("throttled", delay=1)
        return Wait(1, "still going")

    op = scripted(engine, "t.flaky", _Scripted(on_poll=poll))
    for _ in range(100):
        view = engine.run_until_idle(op.id)
        if view.status.terminal:
            break
        clock.advance(1)
    assert view.status == Status.SUCCEEDED, view.error  # 30 throttles, never two in a row


def test_a_malformed_stage_result_fails_the_stage_and_reads_keep_working(engine: Engine) -> None:
    op = scripted(engine, "t.bad-result", _Scripted(result_of=lambda ctx: ["not", "a", "dict"]))
    failed = engine.run_until_idle(op.id)
    assert failed.status == Status.FAILED and "not a dict" in (failed.error or {})["message"]
    assert any(v.id == op.id for v in engine.list(OperationQuery()))
