"""The engine's tables, planned stage lists, backoff, deadlines on retry, target hierarchy and metrics, with
test-only kinds over the fake world (no sandbox needed)."""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Any

import pytest

from app.bootstrap import Services
from services.audit import AuditLog
from services.clock import FakeClock
from services.db import Database
from services.errors import Conflict, Transient
from services.events import Event, EventBus
from services.operation_views import (
    PHASE_TRANSITIONS,
    STAGE_TRANSITIONS,
    Phase,
    StageStatus,
    check_phase_transition,
    check_stage_transition,
)
from services.operations import (
    Backoff,
    DataDirLocked,
    Done,
    Engine,
    Observed,
    OperationKind,
    Stage,
    StageContext,
    Status,
    Wait,
)
from tests.conftest import OPERATOR
from tests.kinds import ThingRequest, World


def test_stage_status_and_phase_move_only_along_their_tables() -> None:
    for table, check, enum in ((STAGE_TRANSITIONS, check_stage_transition, StageStatus),
                               (PHASE_TRANSITIONS, check_phase_transition, Phase)):
        for old, allowed in table.items():
            for new in enum:
                if new == old or new in allowed:
                    check("s", old, new)
                else:
                    with pytest.raises(Conflict, match="stage s cannot"):
                        check("s", old, new)
    assert STAGE_TRANSITIONS[StageStatus.SUCCEEDED] == frozenset() and PHASE_TRANSITIONS[Phase.DONE] == frozenset()


def test_the_store_refuses_a_stage_edge_outside_the_table(engine: Engine, clock: FakeClock) -> None:
    op = engine.submit("thing.create", ThingRequest(name="t"), OPERATOR)[0]
    engine.run_until_idle(op.id)
    clock.advance(10)
    engine.run_until_idle(op.id)
    clock.advance(10)
    assert engine.run_until_idle(op.id).status == Status.SUCCEEDED
    with pytest.raises(Conflict, match="stage create cannot go from succeeded to running"):
        engine.store.save_stage(op.id, 0, None, status=StageStatus.RUNNING)
    with pytest.raises(Conflict, match="phase done to acting"):
        engine.store.save_stage(op.id, 0, None, phase=Phase.ACTING)


def test_a_failed_operation_is_cancelled_in_one_hop(engine: Engine, world: World, services: Services) -> None:
    world.update(faults=["permanent"])
    op = engine.submit("thing.create", ThingRequest(name="f"), OPERATOR)[0]
    assert engine.run_until_idle(op.id).status == Status.FAILED
    seen: list[Event] = []
    services.bus.subscribe(seen.append, topic="operation")
    assert engine.cancel(op.id, OPERATOR).status == Status.CANCELLED
    assert services.bus.drain()
    assert [e.data["status"] for e in seen] == ["cancelled"]  # not failed -> pending -> cancelled


class Feature(Stage[Any]):
    """One feature toggle: acts once, records that it ran."""

    def __init__(self, name: str, ran: list[str]) -> None:
        self.name = name
        self.ran = ran

    def observe(self, ctx: StageContext[Any]) -> Observed:
        return Observed.DONE if ctx.data.get("on") else Observed.ABSENT

    def act(self, ctx: StageContext[Any]) -> None:
        ctx.data["on"] = True
        self.ran.append(self.name)

    def result(self, ctx: StageContext[Any]) -> dict[str, Any]:
        return {"size": ctx.request.size}  # the typed request model, not a dict


def test_a_kind_plans_its_stage_list_from_the_request_at_submit_time(engine: Engine) -> None:
    ran: list[str] = []
    # size 1 needs only "base"; a larger size needs "scale", which depends on "base"
    engine.register(OperationKind(
        "t.features", ThingRequest, (Feature("base", ran), Feature("scale", ran), Feature("extra", ran)),
        lambda r: f"thing/{r.name}", plan=lambda r: ["scale", "base"] if r.size > 1 else ["base"]))
    small = engine.submit("t.features", ThingRequest(name="small"), OPERATOR)[0]
    big = engine.submit("t.features", ThingRequest(name="big", size=3), OPERATOR)[0]
    assert [s.name for s in small.stages] == ["base"]
    assert [s.name for s in big.stages] == ["base", "scale"]  # the kind's order, whatever the plan's
    assert engine.run_until_idle(small.id).status == Status.SUCCEEDED
    done = engine.run_until_idle(big.id)
    assert done.status == Status.SUCCEEDED and done.result == {"base": {"size": 3}, "scale": {"size": 3}}
    assert ran == ["base", "base", "scale"]


def test_backoff_is_exponential_jittered_capped_and_respects_the_hint() -> None:
    policy = Backoff(base=1, max=8, rng=random.Random(7))
    for n, cap in ((1, 1), (2, 2), (3, 4), (4, 8), (9, 8)):
        delays = {policy.delay(n, 0) for _ in range(50)}
        assert all(cap / 2 <= d <= cap for d in delays) and len(delays) > 1  # jittered within [cap/2, cap]
    assert policy.delay(1, 5) == 5  # AWS's own hint wins when longer
    assert policy.delay(1, 100) == 8  # but never past the maximum


class Flaky(Stage[Any]):
    """Fails transiently ``failures`` times in a row, then waits once, then is done."""

    name = "flaky"
    deadline = 100

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def observe(self, ctx: StageContext[Any]) -> Observed:
        return Observed.IN_PROGRESS

    def poll(self, ctx: StageContext[Any]) -> Done | Wait:
        self.calls += 1
        if self.calls <= self.failures:
            raise Transient("throttled", delay=0)
        return Done()


def test_transients_back_off_on_the_clock_and_are_recorded_on_the_stage(engine: Engine, clock: FakeClock) -> None:
    engine.pace = 1.0  # the fixture's services are in sandbox mode, whose pace is 1/sandbox_speed
    engine.backoff = Backoff(base=2, max=60, rng=random.Random(1))
    engine.register(OperationKind("t.flaky", ThingRequest, (Flaky(3),), lambda r: f"thing/{r.name}"))
    op = engine.submit("t.flaky", ThingRequest(name="f"), OPERATOR)[0]
    total = 0.0
    for n in range(1, 4):
        view = engine.run_until_idle(op.id)
        stage = view.stages[0]
        assert view.status == Status.WAITING and stage.retries == n and f"({n} in a row)" in stage.message
        waited = stage.backoff_seconds - total
        assert 2 ** (n - 1) <= waited <= 2 ** n  # base 2, doubling, jittered
        total = stage.backoff_seconds
        assert engine.run_until_idle(op.id).status == Status.WAITING  # not due yet: nothing runs
        clock.advance(waited + 0.01)  # the view rounds to milliseconds
    view = engine.run_until_idle(op.id)
    assert view.status == Status.SUCCEEDED and view.stages[0].retries == 3
    assert 'instantstart_stage_retries_total{kind="t.flaky",stage="flaky"} 3.0' in engine.metrics.render()


def test_the_deadline_cuts_a_long_backoff_short_and_a_retry_restarts_it(engine: Engine, clock: FakeClock) -> None:
    engine.pace = 1.0
    engine.backoff = Backoff(base=500, max=500, rng=random.Random(1))
    stage = Flaky(100)
    engine.register(OperationKind("t.slow", ThingRequest, (stage,), lambda r: f"thing/{r.name}"))
    op = engine.submit("t.slow", ThingRequest(name="s"), OPERATOR)[0]
    assert engine.run_until_idle(op.id).status == Status.WAITING
    clock.advance(100)  # the stage's deadline, not the 250-500 s backoff, is the next due time
    failed = engine.run_until_idle(op.id)
    assert failed.status == Status.FAILED and failed.error is not None
    message = failed.error["message"]
    assert "past its deadline of 100.0s" in message and "a retry after: throttled" in message
    stage.failures = 0
    engine.retry(op.id, OPERATOR)  # the retried stage gets a fresh deadline
    assert engine.run_until_idle(op.id).status == Status.SUCCEEDED


class Listing(Flaky):
    """Waits on this machine's own work (an informer's first list): its deadline is real seconds."""

    name = "listing"
    real_time_deadline = True


def test_a_real_time_deadline_is_not_scaled_by_the_pace(engine: Engine, clock: FakeClock) -> None:
    engine.pace = 0.01  # a fast sandbox: a paced 100 s deadline would be 1 s
    engine.deadline_floor = 0  # no floor: the paced deadline as it is
    engine.backoff = Backoff(base=500, max=500, rng=random.Random(1))
    paced, real = Flaky(100), Listing(100)
    engine.register(OperationKind("t.paced", ThingRequest, (paced,), lambda r: f"thing/{r.name}"))
    engine.register(OperationKind("t.real", ThingRequest, (real,), lambda r: f"thing/{r.name}"))
    paced_op = engine.submit("t.paced", ThingRequest(name="p"), OPERATOR)[0]
    real_op = engine.submit("t.real", ThingRequest(name="r"), OPERATOR)[0]
    assert engine.run_until_idle(paced_op.id).status == Status.WAITING
    assert engine.run_until_idle(real_op.id).status == Status.WAITING
    clock.advance(1.0)
    assert engine.run_until_idle(paced_op.id).status == Status.FAILED
    assert engine.run_until_idle(real_op.id).status == Status.WAITING, "1 s is not past a real 100 s deadline"
    clock.advance(99.0)
    failed = engine.run_until_idle(real_op.id)
    assert failed.status == Status.FAILED and "past its deadline of 100.0s" in (failed.error or {})["message"]


def test_a_paced_deadline_never_drops_below_the_real_time_floor(engine: Engine, clock: FakeClock) -> None:
    """A fast sandbox scales a stage's hour to about a second, which a loaded machine can spend on the stage's
    own calls: the floor keeps the deadline at real seconds, and never lengthens a stage's own deadline."""
    engine.pace = 0.001  # a sandbox at 1000x: the paced 100 s deadline is 0.1 s
    engine.deadline_floor = 30
    engine.backoff = Backoff(base=500, max=500, rng=random.Random(1))
    slow, short = Flaky(100), Flaky(100)
    short.deadline = 20  # shorter than the floor: the floor does not lengthen it
    engine.register(OperationKind("t.floored", ThingRequest, (slow,), lambda r: f"thing/{r.name}"))
    engine.register(OperationKind("t.short", ThingRequest, (short,), lambda r: f"thing/{r.name}"))
    op = engine.submit("t.floored", ThingRequest(name="f"), OPERATOR)[0]
    assert engine.run_until_idle(op.id).status == Status.WAITING
    assert engine.get(op.id).stages[0].deadline_seconds == 30, "the view shows the deadline the engine applies"
    clock.advance(29.0)
    assert engine.run_until_idle(op.id).status == Status.WAITING, "29 s is past the paced 0.1 s, not the floor"
    clock.advance(1.0)
    failed = engine.run_until_idle(op.id)
    assert failed.status == Status.FAILED and "past its deadline of 30.0s" in (failed.error or {})["message"]
    engine.pace = 1.0  # against AWS the stage's own 20 s, not the 30 s floor
    short_op = engine.submit("t.short", ThingRequest(name="s"), OPERATOR)[0]
    assert engine.run_until_idle(short_op.id).status == Status.WAITING
    clock.advance(20.0)
    assert "past its deadline of 20.0s" in (engine.run_until_idle(short_op.id).error or {})["message"]


def test_targets_conflict_with_ancestors_and_descendants_only(engine: Engine) -> None:
    engine.register(OperationKind("t.at", ThingRequest, (Feature("x", []),), lambda r: r.name.replace("-", "/")))

    def at(path: str) -> str:
        return engine.submit("t.at", ThingRequest(name=path.replace("/", "-")), OPERATOR)[0].id

    group = at("cluster/c/group/g")
    at("cluster/c/group/h")  # a sibling group
    at("cluster/d")  # another cluster
    at("cluster/cc")  # a name that merely starts like it
    for busy in ("cluster/c", "cluster/c/group/g/node/n"):  # its ancestor and its descendant
        with pytest.raises(Conflict) as refused:
            at(busy)
        assert refused.value.details["operation_id"] == group  # the oldest conflicting operation is named
        assert refused.value.details["target"] == "cluster/c/group/g"
    assert at("cluster/c/group/g") == group  # the identical request joins it instead
    engine.cancel(group, OPERATOR)
    at("cluster/c/group/g/node/n")  # once it has ended, the node may go


def test_racing_submits_on_related_targets_admit_exactly_one(engine: Engine) -> None:
    engine.register(OperationKind("t.race", ThingRequest, (Feature("x", []),), lambda r: r.name.replace("-", "/")))
    outcomes: list[str] = []
    start = threading.Barrier(6)

    def go(path: str) -> None:
        start.wait()
        try:
            _, created = engine.submit("t.race", ThingRequest(name=path.replace("/", "-")), OPERATOR)
            outcomes.append("created" if created else "joined")
        except Conflict:
            outcomes.append("conflict")

    threads = [threading.Thread(target=go, args=(p,)) for p in
               ["cluster/r", "cluster/r/group/a", "cluster/r/group/a/node/1"] * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    # one wins, its identical twin joins it, the four on related targets are refused
    assert sorted(outcomes) == ["conflict"] * 4 + ["created", "joined"]


def test_metrics_render_stage_durations_queue_depth_and_bus_drops(engine: Engine, services: Services,
                                                                   clock: FakeClock) -> None:
    release = threading.Event()
    services.bus.subscribe(lambda e: release.wait(30), topic="operation", bound=2)
    try:
        op = engine.submit("thing.create", ThingRequest(name="m"), OPERATOR)[0]
        engine.submit("thing.create", ThingRequest(name="queued"), OPERATOR)
        text = engine.metrics.render()
        assert "instantstart_operation_queue_depth 2.0" in text
        assert 'instantstart_operations{status="pending"} 2.0' in text
        engine.run_until_idle(op.id)
        clock.advance(10)
        engine.run_until_idle(op.id)
        clock.advance(10)
        assert engine.run_until_idle(op.id).status == Status.SUCCEEDED
        text = engine.metrics.render()
        duration = 'instantstart_stage_duration_seconds_count{kind="thing.create",outcome="succeeded",stage="create"}'
        assert f"{duration} 1.0" in text
        assert 'instantstart_operations_finished_total{kind="thing.create",outcome="succeeded"} 1.0' in text
        dropped = sum(s.dropped for s in services.bus.stats() if s.topic == "operation")
        assert dropped > 0 and f'instantstart_bus_dropped_events{{topic="operation"}} {float(dropped)}' in text
    finally:
        release.set()


def test_the_data_dir_lock_can_be_taken_before_start_and_is_held_once(tmp_path: Path, clock: FakeClock) -> None:
    db = Database(tmp_path / "state.db")

    def make() -> Engine:
        return Engine(db, EventBus(), AuditLog(db, clock), clock, workers=1, lock_path=tmp_path / "engine.lock")

    first = make()
    first.acquire_lock()  # start-up: lock first, then the sandbox and the registry, then start (resume)
    with pytest.raises(DataDirLocked):
        make().acquire_lock()
    first.start()  # keeps the lock it holds
    try:
        assert first.running
        with pytest.raises(DataDirLocked):
            make().start()
    finally:
        first.stop()
    second = make()
    second.acquire_lock()  # released by stop
    second.stop()
    db.close()
