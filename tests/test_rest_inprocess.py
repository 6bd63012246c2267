"""REST long-polls and controls on a slow test-only kind, with the app served in-process."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2
import pytest
import tornado.web
import websocket

from app.bootstrap import Services, build_services
from app.rest import rest_patterns
from services.auth import Principal, Role
from services.events import Event
from services.settings import Settings
from tests.kinds import ThingRequest, World, thing_kind
from tests.support import free_port, wait_until


@dataclass
class App:
    url: str
    services: Services
    world: World
    release: Path
    headers: dict[str, str]

    def submit(self, name: str) -> str:
        view, _ = self.services.engine.submit("thing.create", ThingRequest(name=name), Principal("t", Role.OPERATOR))
        return view.id


@pytest.fixture
def app(tmp_path: Path) -> Iterator[App]:
    services = build_services(Settings(data_dir=tmp_path / "data", workers=2, sandbox=True))
    world = World(tmp_path / "world.json")
    release = tmp_path / "release"
    services.engine.register(thing_kind(world, poll_seconds=0.05, release=release))
    services.start()
    token = services.tokens.bootstrap_admin()
    port = free_port()
    loop = asyncio.new_event_loop()
    started = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        tornado.web.Application(rest_patterns(services)).listen(port, "127.0.0.1")
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(60), "the in-process server listening"
    yield App(f"http://127.0.0.1:{port}", services, world, release, {"Authorization": f"Bearer {token}"})
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    services.stop()


def get(app: App, path: str) -> httpx2.Response:
    return httpx2.get(app.url + path, headers=app.headers, timeout=90)


def test_get_with_wait_answers_on_the_next_change(app: App) -> None:
    op_id = app.submit("slow")
    first = wait_until(lambda: (v := get(app, f"/api/v1/operations/{op_id}").json())["status"] == "waiting" and v,
                       60, "the operation waiting on its release file")
    threading.Timer(0.3, app.release.touch).start()
    changed = get(app, f"/api/v1/operations/{op_id}?wait=30").json()
    assert changed["version"] > first["version"]
    done = get(app, f"/api/v1/operations/{op_id}/wait?timeout=30").json()
    assert done["status"] == "succeeded"
    assert app.world.acts == 1


def test_wait_times_out_with_the_current_state(app: App) -> None:
    op_id = app.submit("never")
    r = get(app, f"/api/v1/operations/{op_id}/wait?timeout=0.5")
    assert r.status_code == 200 and r.json()["status"] in ("pending", "running", "waiting")
    assert get(app, f"/api/v1/operations/{op_id}/wait?timeout=121").status_code == 422


def test_cancel_and_retry_through_rest(app: App) -> None:
    op_id = app.submit("cancel-me")
    r = httpx2.post(f"{app.url}/api/v1/operations/{op_id}/cancel", headers=app.headers, timeout=60)
    assert r.status_code == 200
    final = get(app, f"/api/v1/operations/{op_id}/wait?timeout=60").json()
    assert final["status"] == "cancelled"
    assert {c["type"]: c["reason"] for c in final["conditions"]}["Succeeded"] == "Cancelled"

    app.world.update(faults=["permanent"])
    failing = app.submit("fail-once")
    failed = get(app, f"/api/v1/operations/{failing}/wait?timeout=60").json()
    assert failed["status"] == "failed" and failed["error"]["message"] == "quota exhausted"
    app.release.touch()
    r = httpx2.post(f"{app.url}/api/v1/operations/{failing}/retry", headers=app.headers, timeout=60)
    assert r.status_code == 202 and r.json()["status_tool"] == "operations_get"
    assert get(app, f"/api/v1/operations/{failing}/wait?timeout=60").json()["status"] == "succeeded"


def test_the_events_socket_filters_and_a_slow_reader_only_loses_its_own_events(app: App) -> None:
    """``?topic=&cluster=`` narrow the stream; a client that stops reading holds up only its own bounded
    subscription (drops counted there), never the publisher or another socket."""
    url = app.url.replace("http://", "ws://") + "/api/v1/events"
    auth = [f"Authorization: {app.headers['Authorization']}"]
    bus = app.services.bus
    before = bus.subscriber_count()
    narrow = websocket.create_connection(url + "?topic=kube&cluster=c1", header=auth, timeout=30, suppress_origin=True)
    slow = websocket.create_connection(url, header=auth, timeout=30, suppress_origin=True)
    slow.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        wait_until(lambda: bus.subscriber_count() == before + 4, 30, "both sockets subscribed (events + revocation)")
        bus.publish(Event("kube", "modified", {"cluster": "c2", "name": "other"}))
        bus.publish(Event("operation", "updated", {"cluster": "c1", "id": "op"}))
        bus.publish(Event("kube", "modified", {"cluster": "c1", "name": "n1"}))
        assert json.loads(narrow.recv())["data"] == {"cluster": "c1", "name": "n1"}, "only c1's kube events"
        blob = "x" * 65_536
        for i in range(2_000):  # ~130 MB if every event had to be kept for a client that does not read
            bus.publish(Event("kube", "modified", {"cluster": "c9", "name": f"n{i}", "blob": blob}))
        wait_until(lambda: next(st for st in bus.stats() if st.topic is None).dropped > 0, 60,
                   "the slow reader's own subscription to drop and count what it could not deliver")
        bus.publish(Event("kube", "modified", {"cluster": "c1", "name": "n2"}))  # the other socket is unaffected
        assert json.loads(narrow.recv())["data"] == {"cluster": "c1", "name": "n2"}

    finally:
        narrow.close()
        slow.close()
