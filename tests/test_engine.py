"""The operation engine with test-only kinds: stage contract, waits, failures, retry, cancel, idempotency."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from app.bootstrap import Services
from services.audit import AuditQuery
from services.clock import FakeClock
from services.db import Database
from services.errors import Conflict, Invalid, NotFound
from services.events import Event
from services.operations import (
    TRANSITIONS,
    DataDirLocked,
    Engine,
    OperationQuery,
    OperationView,
    Status,
    _check_transition,
)
from tests.conftest import ADMIN, OPERATOR
from tests.kinds import ThingRequest, World, thing_kind


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
    # ...a different request is not...
    assert submit(engine, "b", size=3).id != derived.id
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
                _check_transition(old, new)
            else:
                with pytest.raises(Conflict):
                    _check_transition(old, new)
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
    wait_for(lambda: first.get(op.id).status == Status.WAITING)
    with pytest.raises(DataDirLocked):
        make().start()
    first.stop()
    # simulate a crash mid-step: the row is claimed and running when the process disappears
    db.connection().execute("UPDATE operations SET status='running', claimed=1 WHERE id=?", (op.id,))
    second = make()
    second.start()
    try:
        wait_for(lambda: second.get(op.id).status == Status.WAITING)
        assert any(c.reason in ("Resumed", "Waiting", "Running") for c in second.get(op.id).conditions)
        clock.advance(10)
        wait_for(lambda: second.get(op.id).status == Status.SUCCEEDED)
    finally:
        second.stop()
    assert world.acts == 1


def wait_for(predicate: object, timeout: float = 10.0) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("condition not reached in time")


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
