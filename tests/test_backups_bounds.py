"""Issue 8 defect 3 (backups cannot fill the disk), issue 7's backup report items, and the in-process halves
of defects 6, 7 and 9: session idle/lifetime, the sign-in throttle's schedule, per-principal idempotency
and long-poll bounds. Real services on a temp data dir, a fake clock, no mocks."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from app.api.base import Call
from app.api.operations import OperationWait
from app.api.operations import _get as _operations_get
from app.bootstrap import Services, build_services
from services.audit import AuditQuery
from services.auth import Role, TokenCreate
from services.backups import KIND, BackupCreate
from services.clock import FakeClock
from services.errors import Conflict, Unauthorized
from services.limits import TooManyRequests
from services.sessions import SignInThrottle
from services.settings import Settings
from tests.conftest import ADMIN, OPERATOR
from tests.kinds import ThingRequest, World, thing_kind


def make(tmp_path: Path, clock: FakeClock, **settings: object) -> Services:
    return build_services(Settings(data_dir=tmp_path / "data", workers=2, **settings), clock=clock)  # type: ignore[arg-type]


@pytest.fixture
def kept(tmp_path: Path, clock: FakeClock) -> Iterator[Services]:
    svc = make(tmp_path, clock, backup_keep=3)
    yield svc
    svc.stop()


def backup(svc: Services, label: str) -> str:
    view, created = svc.backups.create_backup(OPERATOR, BackupCreate(label=label))
    assert created
    done = svc.engine.run_until_idle(view.id)
    assert done.status == "succeeded", done.error
    return view.id


# ----- defect 3 -------------------------------------------------------------------------------------------------

def test_backups_keep_a_bounded_number_pruning_oldest_first(kept: Services) -> None:
    ids = [backup(kept, f"b{n}") for n in range(5)]
    names = sorted(p.name for p in kept.backups.directory.iterdir())
    assert names == sorted(f"state-b{n}-{ids[n]}.sqlite" for n in (2, 3, 4))
    last = kept.engine.get(ids[-1])
    prune = next(s for s in last.stages if s.name == "prune")
    assert prune.acted and prune.result == {"kept": 3, "removed": [f"state-b1-{ids[1]}.sqlite"]}
    assert kept.engine.get(ids[3]).stages[-1].result == {"kept": 3, "removed": [f"state-b0-{ids[0]}.sqlite"]}


def test_a_backup_is_one_file_with_no_wal_or_shm_beside_it(kept: Services) -> None:
    backup(kept, "single")
    files = list(kept.backups.directory.iterdir())
    assert [p.suffix for p in files] == [".sqlite"], files
    (only,) = files
    assert only.stat().st_mode & 0o777 == 0o600
    assert only.read_bytes()[18:20] == b"\x01\x01"  # header: rollback journal, not WAL


def test_a_request_while_a_backup_runs_joins_it(kept: Services) -> None:
    first, created = kept.backups.create_backup(OPERATOR, BackupCreate(label="first"))
    joined, created_again = kept.backups.create_backup(ADMIN, BackupCreate(label="second"))
    assert created and not created_again and joined.id == first.id
    rows = kept.audit.list(AuditQuery(action=KIND))
    assert [(r.actor, r.outcome, r.operation_id) for r in rows] == [
        ("root", "merged", first.id), ("tester", "accepted", first.id)]
    kept.engine.run_until_idle(first.id)
    assert kept.backups.create_backup(ADMIN, BackupCreate(label="third"))[1]  # ended: a new one starts


def test_a_backup_the_disk_cannot_take_is_refused_before_any_row(tmp_path: Path, clock: FakeClock) -> None:
    svc = make(tmp_path, clock, backup_reserve_bytes=10**18)
    try:
        with pytest.raises(Conflict) as refused:
            svc.backups.create_backup(OPERATOR, BackupCreate(label="full"))
        assert "free space" in refused.value.message and refused.value.details["needed_bytes"] > 10**18
        assert svc.db.query("SELECT * FROM operations") == []
        assert svc.audit.list(AuditQuery(action=KIND)) == []
    finally:
        svc.stop()


def test_a_retry_of_an_accepted_backup_is_not_prechecked_again(tmp_path: Path, clock: FakeClock) -> None:
    """Reviewer finding: with the disk filling up after a backup was accepted, its retry (same
    Idempotency-Key) and a request joining it got 409 instead of the operation."""
    svc = make(tmp_path, clock)
    try:
        first, created = svc.backups.create_backup(OPERATOR, BackupCreate(label="a"), "key-1")
        assert created
        svc.backups.reserve_bytes = 10**18  # the disk is full now
        again, created = svc.backups.create_backup(OPERATOR, BackupCreate(label="a"), "key-1")
        assert (again.id, created) == (first.id, False)
        joined, created = svc.backups.create_backup(OPERATOR, BackupCreate(label="b"))
        assert (joined.id, created) == (first.id, False), "joins the running backup"
    finally:
        svc.stop()


# ----- issue 7: the verify stage reports what it did; ISO times ------------------------------------------------

def test_the_read_only_verify_stage_reports_its_check(kept: Services) -> None:
    verify = next(s for s in kept.engine.get(backup(kept, "report")).stages if s.name == "verify")
    assert verify.read_only and not verify.acted and verify.attempts == 1
    assert "integrity check passed" in verify.message and "already in the desired state" not in verify.message


def test_backups_list_gives_iso_8601_times(kept: Services) -> None:
    backup(kept, "iso")
    (info,) = kept.backups.list()
    assert info.created_at.endswith("Z")
    assert dt.datetime.fromisoformat(info.created_at).tzinfo is not None


# ----- defect 9: idempotency keys, explicit and derived, per principal ------------------------------------------

def test_keys_explicit_and_derived_belong_to_their_principal(services: Services, world: World) -> None:
    services.engine.register(thing_kind(world))
    mine, _ = services.engine.submit("thing.create", ThingRequest(name="a"), OPERATOR, idempotency_key="k1")
    again, created = services.engine.submit("thing.create", ThingRequest(name="a"), OPERATOR, idempotency_key="k1")
    assert again.id == mine.id and not created
    with pytest.raises(Conflict):  # the owner reusing its key for another body
        services.engine.submit("thing.create", ThingRequest(name="b"), OPERATOR, idempotency_key="k1")
    theirs, created = services.engine.submit("thing.create", ThingRequest(name="b"), ADMIN, idempotency_key="k1")
    assert created and theirs.id != mine.id  # no 409, no operation id of the operator's
    with pytest.raises(Conflict) as busy:  # the same body from another principal joins nothing: its target is busy
        services.engine.submit("thing.create", ThingRequest(name="a"), ADMIN)
    assert busy.value.details["status_tool"] == "operations_get"
    same, created = services.engine.submit("thing.create", ThingRequest(name="a"), OPERATOR)
    assert same.id == mine.id and not created


# ----- defect 6: idle timeout, lifetime, revocation ------------------------------------------------------------

def test_sessions_end_when_idle_when_old_and_when_their_token_is_revoked(services: Services,
                                                                          clock: FakeClock) -> None:
    made = services.tokens.create(TokenCreate(name="dash", role=Role.VIEWER), created_by="t")
    who = services.tokens.authenticate(made.token, "ui")
    idle = services.settings.session_idle_timeout

    busy = services.sessions.open(who)
    for _ in range(int(services.settings.session_lifetime / (idle / 2))):
        assert services.sessions.principal(busy.id).name == "dash"
        clock.advance(idle / 2)
    with pytest.raises(Unauthorized, match="expired"):
        services.sessions.principal(busy.id)

    quiet = services.sessions.open(who)
    clock.advance(idle * 0.6)
    services.sessions.principal(quiet.id, touch=False)  # a background re-check is no activity
    clock.advance(idle * 0.6)
    with pytest.raises(Unauthorized, match="idle"):
        services.sessions.principal(quiet.id)

    live = services.sessions.open(who)
    assert services.sessions.check_xsrf(live.id, live.xsrf) and not services.sessions.check_xsrf(live.id, busy.xsrf)
    services.tokens.revoke(made.id, ADMIN)
    with pytest.raises(Unauthorized):
        services.sessions.principal(live.id)


# ----- defect 7: the sign-in delay doubles per (address, token id), never locks out ---------------------------------

def test_sign_in_delay_doubles_queues_parallel_failures_and_never_locks_out(clock: FakeClock) -> None:
    throttle = SignInThrottle(clock, base=0.5, cap=4)
    waits = []
    for _ in range(6):  # one failure after the other, each answered before the next
        wait = throttle.failed("127.0.0.1", "abcd0123")
        assert wait is not None
        waits.append(wait)
        clock.advance(wait)
        throttle.answered("127.0.0.1", "abcd0123")
    assert waits == [0.5, 1, 2, 4, 4, 4]  # doubling, capped
    # failures arriving together wait in turn, each behind the one before
    assert [throttle.failed("127.0.0.1", "abcd0123") for _ in range(3)] == [4, 8, 12]
    assert throttle.failed("127.0.0.1", "ffff0000") == 0.5 and throttle.failed("10.0.0.9", "abcd0123") == 0.5
    # past MAX_PENDING waiting failures of one key, more are refused at once (429), not queued for ever
    for _ in range(SignInThrottle.MAX_PENDING - 3):
        assert throttle.failed("127.0.0.1", "abcd0123") is not None
    assert throttle.failed("127.0.0.1", "abcd0123") is None
    throttle.succeeded("127.0.0.1", "abcd0123")  # the correct token is never held back: it clears the key
    assert throttle.failed("127.0.0.1", "abcd0123") == 0.5


# ----- defect 9: concurrent long-polls per principal --------------------------------------------------------------

async def until(condition: Callable[[], bool], timeout: float = 30) -> None:
    """Yield to the loop until ``condition()`` holds; fail after ``timeout`` seconds, never hang."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "the condition never held"
        await asyncio.sleep(0.01)


def test_long_polls_per_principal_are_bounded(tmp_path: Path, clock: FakeClock, world: World) -> None:
    svc = make(tmp_path, clock, longpolls_per_principal=2)
    svc.engine.register(thing_kind(world))
    view, _ = svc.engine.submit("thing.create", ThingRequest(name="polled"), OPERATOR)  # stays pending

    def poll(principal: object, wait: float) -> Call:
        return Call(services=svc, principal=principal, path={"id": view.id},  # type: ignore[arg-type]
                    query=OperationWait(wait=wait), body=None)

    async def main() -> None:
        held = [asyncio.create_task(_operations_get(poll(OPERATOR, 60))) for _ in range(2)]
        try:
            await until(lambda: svc.longpolls.held(OPERATOR) == 2)  # both have taken their slot
            with pytest.raises(TooManyRequests) as refused:
                await _operations_get(poll(OPERATOR, 60))
            assert refused.value.http_status == 429 and refused.value.details == {"limit": 2, "open": 2}
            assert (await _operations_get(poll(OPERATOR, 0))).body.id == view.id  # no wait: no slot
            admin = asyncio.create_task(_operations_get(poll(ADMIN, 60)))  # another principal's own slots
            await until(lambda: svc.longpolls.held(ADMIN) == 1)
            admin.cancel()
        finally:
            for task in held:
                task.cancel()
            await asyncio.gather(*held, return_exceptions=True)
        assert svc.longpolls.held(OPERATOR) == 0

    try:
        asyncio.run(main())
    finally:
        svc.stop()


# ----- defect 9: the audit pane shows the client's claim as a claim ------------------------------------------------

def test_the_audit_pane_shows_face_and_client_claim_apart(services: Services) -> None:
    from panels.audit import audit_frame

    services.audit.record(replace(OPERATOR, face="api", client="mcp"), "backup.create", "state-db", {}, "accepted")
    frame = audit_frame(services.audit.list(AuditQuery(client="mcp")))
    assert frame[["face", "client claim"]].values.tolist() == [["api", "mcp"]]
