"""The fast path of a bearer read: principals of tokens that signed in are answered from memory, a revoked
token is refused on its very next request (revoked here; by another process, once the generation file is
looked at again, at most GENERATION_RECHECK later), last use is still recorded,
and only synchronous memory-only routes may run on the loop."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx2
import pytest
import tornado.web

from app.api.base import Call, Reply, Route
from app.bootstrap import build_services
from app.rest import rest_patterns
from services.auth import SYSTEM, Role, TokenCreate, TokenStore
from services.clock import FakeClock
from services.db import Database
from services.errors import Invalid, Unauthorized
from services.settings import Settings
from tests.support import ROOT, LiveServer, free_port, start_server


def stores(tmp_path: Path) -> tuple[TokenStore, TokenStore, FakeClock]:
    """Two stores over one database file: this server and another process (the CLI)."""
    clock = FakeClock()
    return TokenStore(Database(tmp_path / "state.db"), clock), TokenStore(Database(tmp_path / "state.db"), clock), \
        clock


def test_a_signed_in_token_is_answered_from_memory_until_it_is_revoked(tmp_path: Path) -> None:
    server, cli, clock = stores(tmp_path)
    made = server.create(TokenCreate(name="reader", role=Role.VIEWER), "test")
    assert server.cached(made.token) is None, "never signed in: the database decides"
    server.authenticate(made.token)
    principal = server.cached(made.token, "api", "mcp")
    assert principal is not None and (principal.name, principal.role, principal.token_id, principal.client) == \
        ("reader", Role.VIEWER, made.id, "mcp")
    assert server.cached(made.token + "x") is None, "a wrong secret is never answered from memory"
    assert server.cached(made.token, "api", "mcp") is principal, "one principal per (face, client), reused"

    cli.revoke(made.id, SYSTEM)  # another process: only the generation file tells this one
    assert server.cached(made.token) is not None, "the file is looked at most every GENERATION_RECHECK"
    clock.advance(TokenStore.GENERATION_RECHECK + 0.01)
    assert server.cached(made.token) is None
    with pytest.raises(Unauthorized):
        server.authenticate(made.token)


def test_a_revocation_here_voids_every_cached_token(tmp_path: Path) -> None:
    server, _, _ = stores(tmp_path)
    kept = server.create(TokenCreate(name="kept", role=Role.OPERATOR), "test")
    gone = server.create(TokenCreate(name="gone", role=Role.VIEWER), "test")
    for token in (kept.token, gone.token):
        server.authenticate(token)
    server.revoke(gone.id, SYSTEM)
    assert server.cached(gone.token) is None and server.cached(kept.token) is None
    assert server.authenticate(kept.token).name == "kept", "a token still active signs in again"
    assert server.cached(kept.token) is not None


def test_last_use_is_still_recorded(tmp_path: Path) -> None:
    server, _, clock = stores(tmp_path)
    made = server.create(TokenCreate(name="used", role=Role.VIEWER), "test")
    server.authenticate(made.token)
    first = next(t for t in server.list() if t.id == made.id).last_used_at
    clock.advance(TokenStore.TOUCH_INTERVAL + 1)
    assert server.cached(made.token) is None, "its last use is due: the database path records it"
    server.authenticate(made.token)
    later = next(t for t in server.list() if t.id == made.id).last_used_at
    assert first is not None and later == first + TokenStore.TOUCH_INTERVAL + 1
    assert server.cached(made.token) is not None


def test_only_memory_only_routes_run_on_the_loop(tmp_path: Path) -> None:
    services = build_services(Settings(data_dir=tmp_path, sandbox=False))
    try:
        def handler(call: object) -> Reply:
            return Reply({})

        async def coroutine(call: object) -> Reply:
            return Reply({})

        for bad in (Route("GET", "/api/v1/x", "x_get", "x", Role.VIEWER, coroutine, on_loop=True),
                    Route("POST", "/api/v1/x", "x_make", "x", Role.OPERATOR, handler, on_loop=True,
                          read_only=False)):
            with pytest.raises(Invalid, match="cannot run on the loop"):
                rest_patterns(services, [bad])
        assert rest_patterns(services, [Route("GET", "/api/v1/x", "x_get", "x", Role.VIEWER, handler,
                                              on_loop=True, open_world=True)]), "served from caches of AWS"
    finally:
        services.db.close()


def test_loop_routes_answer_on_the_loop_thread_and_the_others_in_workers(tmp_path: Path) -> None:
    services = build_services(Settings(data_dir=tmp_path, sandbox=False))
    seen: dict[str, str] = {}

    def where(label: str) -> Callable[[Call], Reply]:
        def handler(call: Call) -> Reply:
            seen[label] = threading.current_thread().name
            return Reply({"principal": call.principal.name})
        return handler

    routes = [Route("GET", "/api/v1/memory", "memory_get", "m", Role.VIEWER, where("memory"), on_loop=True),
              Route("GET", "/api/v1/worker", "worker_get", "w", Role.VIEWER, where("worker"))]
    token = services.tokens.create(TokenCreate(name="reader", role=Role.VIEWER), "test").token
    port, loop, started = free_port(), asyncio.new_event_loop(), threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        tornado.web.Application(rest_patterns(services, routes)).listen(port, "127.0.0.1")
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=run, name="the-loop", daemon=True)
    thread.start()
    try:
        assert started.wait(60)
        for path in ("/api/v1/memory", "/api/v1/worker", "/api/v1/memory"):
            r = httpx2.get(f"http://127.0.0.1:{port}{path}", headers={"Authorization": f"Bearer {token}"}, timeout=10)
            assert r.status_code == 200 and r.json() == {"principal": "reader"}, r.text
        assert seen["memory"] == "the-loop" and seen["worker"] != "the-loop"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        services.db.close()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    server = start_server(tmp_path_factory.mktemp("token-cache") / "data")
    yield server
    server.stop()


@pytest.mark.parametrize("path", ["/api/v1/whoami", "/api/v1/status"])
def test_a_token_revoked_through_rest_is_refused_on_its_next_request(live: LiveServer, path: str) -> None:
    token = live.make_token("viewer")
    token_id = token.split("_")[1]
    for _ in range(3):  # admitted once, then from memory
        assert live.get(path, token).status_code == 200
    assert live.get("/api/v1/whoami", token).json()["token_id"] == token_id
    revoked = httpx2.delete(f"{live.url}/api/v1/tokens/{token_id}", headers=live.headers(), timeout=30)
    assert revoked.status_code == 200, revoked.text
    refused = live.get(path, token)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthorized"


def test_a_token_revoked_by_the_cli_is_refused_on_its_next_request(live: LiveServer) -> None:
    token = live.make_token("viewer")
    assert live.get("/api/v1/status", token).status_code == 200
    assert live.get("/api/v1/status", token).status_code == 200
    out = subprocess.run([sys.executable, "-m", "app.cli", "token", "revoke", token.split("_")[1], "--data-dir",
                          str(live.data_dir)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert live.get("/api/v1/status", token).status_code == 401



class SteppedClock(FakeClock):
    """A FakeClock whose readings each run the next of ``steps`` first: how a test puts a revocation between two
    lines of a sign-in, where a concurrent request's could land. It never advances: every answer stays fresh."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[Callable[[], None]] = []

    def now(self) -> float:
        if self.steps:
            self.steps.pop(0)()
        return super().now()


@pytest.mark.parametrize("reading", [1, 2, 3])
def test_a_sign_in_under_way_during_a_revocation_never_revives_the_revoked_token(tmp_path: Path, reading: int) -> None:
    """While one token signs in, another sign-in of the token being revoked runs; the revocation lands at its
    ``reading``-th clock reading. Neither in-flight sign-in may leave memory answering the revoked token."""
    clock = SteppedClock()
    server = TokenStore(Database(tmp_path / "state.db"), clock)
    other = server.create(TokenCreate(name="other", role=Role.VIEWER), "test")
    victim = server.create(TokenCreate(name="victim", role=Role.VIEWER), "test")
    revoked: list[str] = []

    def victim_signs_in() -> None:
        with contextlib.suppress(Unauthorized):  # the revocation came before its row was read
            server.authenticate(victim.token)

    def revoke() -> None:
        server.revoke(victim.id, SYSTEM)
        revoked.append(victim.id)

    clock.steps = [victim_signs_in, *([lambda: None] * (reading - 1)), revoke]
    assert server.authenticate(other.token).name == "other"
    while clock.steps:  # the script outlasted the sign-ins: the rest runs now
        clock.steps.pop(0)()
    assert revoked == [victim.id]
    assert server.cached(victim.token) is None, "the revoked token is not answered from memory"
    with pytest.raises(Unauthorized):
        server.authenticate(victim.token)
    assert server.authenticate(other.token).name == "other"
