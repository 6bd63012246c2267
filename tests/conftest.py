from __future__ import annotations

import asyncio
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.bootstrap import Services, build_services
from sandbox.mlflow_server import SHARED_URL_ENV, MlflowServer
from services.auth import Principal, Role
from services.clock import FakeClock
from services.operations import Engine
from services.settings import Settings
from tests.kinds import World, thing_kind
from tests.support import LiveServer, start_server


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """One real server for the REST/MCP/browser tests (its own data dir, a free port)."""
    live = start_server(tmp_path_factory.mktemp("server") / "data")
    assert live.admin_token, live.log()
    yield live
    live.stop()


@pytest.fixture(scope="session")
def mlflow_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One real MLflow tracking server for the whole test session (``sandbox/mlflow_server.py``), exported
    as ``INSTANTSTART_SANDBOX_MLFLOW_URL`` so that every sandbox started afterwards uses it."""
    mlflow = MlflowServer(tmp_path_factory.mktemp("mlflow"))
    url = mlflow.url()
    os.environ[SHARED_URL_ENV] = url
    yield url
    os.environ.pop(SHARED_URL_ENV, None)
    mlflow.stop()


@pytest.fixture
def kernel_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """A loop running in its own thread, as a Jupyter kernel's does."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="kernel-loop", daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(30)
    loop.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def services(tmp_path: Path, clock: FakeClock) -> Iterator[Services]:
    """In-process services on a temp data dir with a fake clock, in sandbox mode whatever credentials the
    machine has; the engine is not started."""
    svc = build_services(Settings(data_dir=tmp_path / "data", workers=2, sandbox=True), clock=clock)
    yield svc
    svc.stop()


@pytest.fixture
def world(tmp_path: Path) -> World:
    """The fake outside system the test-only kind ``thing.create`` changes."""
    return World(tmp_path / "world.json")


@pytest.fixture
def engine(services: Services, world: World) -> Engine:
    """The services' engine with ``thing.create`` registered (ready after 2 polls, 10 s apart)."""
    services.engine.register(thing_kind(world, ready_polls=2, poll_seconds=10))
    return services.engine


OPERATOR = Principal("tester", Role.OPERATOR, "t0", "rest")
ADMIN = Principal("root", Role.ADMIN, "t1", "rest")
VIEWER = Principal("watcher", Role.VIEWER, "t2", "rest")


def pytest_configure(config: pytest.Config) -> None:
    """Servers the tests start register in a private runtime registry, never in the user's own."""
    os.environ["INSTANTSTART_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="instantstart-runtime-")
