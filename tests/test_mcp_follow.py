"""Long waits through the MCP bridge: a real SDK client over stdio calls operations_get with a wait far
beyond one REST long-poll; the bridge (a subprocess) polls the REST server again and again, sends progress
notifications and answers with the terminal operation. Cancelling the call stops the polling.

The REST app is served in-process so a test-only kind can hold an operation open until the test releases
it; what the bridge did is read from the server's own access log (Tornado's ``log_function``)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
import tornado.web
from mcp import Client, StdioServerParameters

from app.bootstrap import Services, build_services
from app.rest import rest_patterns
from services.auth import Principal, Role
from services.settings import Settings
from tests.kinds import ThingRequest, World, thing_kind
from tests.support import ROOT, clean_env, free_port, wait_until

pytestmark = pytest.mark.slow
BRIDGE_AGENT = "instantstart-mcp-bridge"


@dataclass
class App:
    url: str
    services: Services
    release: Path
    token: str
    requests: list[tuple[str, str]] = field(default_factory=list)  # (path, user agent), as the server logged

    def submit(self, name: str) -> str:
        view, _ = self.services.engine.submit("thing.create", ThingRequest(name=name), Principal("t", Role.OPERATOR))
        return view.id

    def bridge_polls(self, op_id: str) -> int:
        return sum(1 for path, agent in list(self.requests)
                   if path == f"/api/v1/operations/{op_id}" and agent == BRIDGE_AGENT)

    def version(self, op_id: str) -> int:
        r = httpx2.get(f"{self.url}/api/v1/operations/{op_id}", headers={"Authorization": f"Bearer {self.token}"},
                       timeout=30)
        return int(r.json()["version"])


@pytest.fixture
def app(tmp_path: Path) -> Iterator[App]:
    services = build_services(Settings(data_dir=tmp_path / "data", workers=2, sandbox=True))
    release = tmp_path / "release"
    # each poll of the stage is 8 simulated seconds (0.2 s at the sandbox's speed): the operation changes
    # several times a second until the test releases it
    services.engine.register(thing_kind(World(tmp_path / "world.json"), poll_seconds=8, release=release))
    services.start()
    token = services.tokens.bootstrap_admin()
    port = free_port()
    app = App(f"http://127.0.0.1:{port}", services, release, token)

    def record(handler: tornado.web.RequestHandler) -> None:
        app.requests.append((handler.request.path, handler.request.headers.get("User-Agent", "")))

    loop = asyncio.new_event_loop()
    started = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        tornado.web.Application(rest_patterns(services), log_function=record).listen(port, "127.0.0.1")
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(60)
    yield app
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    services.stop()


@asynccontextmanager
async def bridge(app: App) -> AsyncIterator[Client]:
    params = StdioServerParameters(command=sys.executable, args=["-m", "app.cli", "mcp", "--url", app.url],
                                   env={**clean_env(), "INSTANTSTART_TOKEN": app.token}, cwd=str(ROOT))
    async with Client(params) as client:
        yield client


@asynccontextmanager
async def http_bridge(app: App) -> AsyncIterator[Client]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "mcp", "--transport", "http", "--port", str(port),
                             "--url", app.url], cwd=ROOT, env={**clean_env(), "INSTANTSTART_TOKEN": app.token},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def listening() -> bool:
            try:
                httpx2.get(f"http://127.0.0.1:{port}/mcp", timeout=1)
            except httpx2.HTTPError:
                return False
            return True

        await anyio.to_thread.run_sync(lambda: wait_until(listening, 30, "the bridge's HTTP transport to listen"))
        async with Client(f"http://127.0.0.1:{port}/mcp") as client:
            yield client
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize(("tool", "argument"), [("operations_get", "wait"), ("operations_wait", "timeout")])
def test_a_long_wait_sends_progress_per_stage_and_answers_the_terminal_operation(app: App, tool: str,
                                                                                  argument: str) -> None:
    op_id = app.submit("followed")
    seen: list[tuple[float, float | None, str | None]] = []

    async def main() -> tuple[Any, Any]:
        async with bridge(app) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}

            async def progress(value: float, total: float | None, message: str | None) -> None:
                seen.append((value, total, message))
                if message and "stage create" in message:
                    app.release.touch()  # the operation may go on once the bridge has reported its first stage

            result = await client.call_tool(tool, {"id": op_id, argument: 600}, progress_callback=progress)
            return tools[tool], result

    definition, result = anyio.run(main)
    assert definition.input_schema["properties"][argument]["maximum"] == 1800  # the bridge's, not the route's
    assert result.is_error is False, result.content[0].text
    assert result.structured_content["status"] == "succeeded"
    assert [s["status"] for s in result.structured_content["stages"]] == ["succeeded", "succeeded"]
    messages = [m or "" for _, _, m in seen]
    assert len(seen) >= 2, seen
    assert "stage create (1/2)" in messages[0], messages
    assert "thing.create succeeded" in messages[-1], messages
    assert all(total == 600 for _, total, _ in seen)
    assert [v for v, _, _ in seen] == sorted(v for v, _, _ in seen)  # progress only moves forward
    # one agent call, several REST long-polls by the bridge (the stage's polls end each of them)
    assert app.bridge_polls(op_id) >= 2, app.requests


def test_progress_reaches_a_client_of_the_http_transport(app: App) -> None:
    op_id = app.submit("over-http")
    messages: list[str] = []

    async def main() -> Any:
        async with http_bridge(app) as client:
            async def progress(value: float, total: float | None, message: str | None) -> None:
                messages.append(message or "")
                app.release.touch()

            return await client.call_tool("operations_wait", {"id": op_id, "timeout": 300}, progress_callback=progress)

    result = anyio.run(main)
    assert result.is_error is False and result.structured_content["status"] == "succeeded"
    assert messages and "stage create (1/2)" in messages[0], messages
    assert "thing.create succeeded" in messages[-1], messages


def test_a_wait_within_the_routes_bound_is_one_request_and_over_the_bridges_bound_is_refused(app: App) -> None:
    op_id = app.submit("short")

    async def main() -> tuple[Any, Any]:
        async with bridge(app) as client:
            short = await client.call_tool("operations_get", {"id": op_id, "wait": 0})
            too_long = await client.call_tool("operations_get", {"id": op_id, "wait": 1801})
            return short, too_long

    short, too_long = anyio.run(main)
    assert short.is_error is False and short.structured_content["id"] == op_id
    assert app.bridge_polls(op_id) == 1
    assert too_long.is_error is True and "at most 1800" in too_long.content[0].text


def test_a_cancelled_wait_stops_polling_and_the_session_goes_on(app: App) -> None:
    op_id = app.submit("abandoned")
    polls_at_cancel: list[int] = []

    async def main() -> Any:
        async with bridge(app) as client:
            reported = anyio.Event()

            async def progress(value: float, total: float | None, message: str | None) -> None:
                reported.set()

            async with anyio.create_task_group() as tg:
                async def call() -> None:
                    await client.call_tool("operations_get", {"id": op_id, "wait": 900}, progress_callback=progress)
                    raise AssertionError("the call answered although the operation never ended")

                tg.start_soon(call)
                await reported.wait()
                # the bridge is polling: let it show that it keeps going while the operation changes
                await anyio.to_thread.run_sync(lambda: wait_until(lambda: app.bridge_polls(op_id) >= 3, 60,
                                                                  "the bridge to poll a few times"))
                tg.cancel_scope.cancel()  # the client abandons the call: the SDK sends notifications/cancelled
            polls_at_cancel.append(app.bridge_polls(op_id))
            return await client.call_tool("whoami", {})

    who = anyio.run(main)
    assert who.is_error is False and who.structured_content["role"] == "admin"
    # the operation goes on changing (several versions a second); a bridge still polling would answer each
    start = app.version(op_id)
    wait_until(lambda: app.version(op_id) >= start + 15, 60, "the operation to move on by 15 versions")
    # at most the poll that was in flight when the call was cancelled lands after it
    assert app.bridge_polls(op_id) <= polls_at_cancel[0] + 1, (polls_at_cancel, app.bridge_polls(op_id))
