"""Schemathesis against a throwaway server: the OpenAPI document must describe exactly what it does.

Every route (the sandbox's included) as admin and as viewer, with a fixed seed, deterministic generation and
no example database, so a run is reproducible. The server's operation engine is not started: mutations
stay pending, which keeps the run fast as routes grow. Fault injection is left out (it changes the world
the other requests see), and self-revocation cannot happen (token ids are random; both tokens are checked
to still work at the end).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2
import pytest
import tornado.httpserver
import tornado.web

from app.api.sandbox import sandbox_routes
from app.bootstrap import build_services
from app.edge import edge_patterns, guard_application, http_server_limits
from app.rest import NotFoundHandler, rest_patterns
from app.routes import ROUTES
from app.sandbox import Sandbox
from services.auth import Role, TokenCreate
from services.sandbox_control import SandboxControl
from services.settings import Settings
from tests.support import ROOT, free_port

pytestmark = pytest.mark.slow

CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,"
          "response_headers_conformance")
EXAMPLES_PER_OPERATION = 60
MIN_REQUESTS = 2000


@dataclass
class Throwaway:
    url: str
    tokens: dict[str, str]
    operations: int


@pytest.fixture(scope="module")
def throwaway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Throwaway]:
    data = tmp_path_factory.mktemp("schemathesis") / "data"
    settings = Settings(data_dir=data, workers=1, sandbox_kube_port=free_port(), sandbox_aws_port=free_port())
    services = build_services(settings)  # engine not started: operations stay pending
    world = Sandbox(settings)
    world.start()
    routes = ROUTES + sandbox_routes(SandboxControl(world, services.audit, services.bus))
    admin = services.tokens.bootstrap_admin()
    assert admin
    viewer = services.tokens.create(TokenCreate(name="fuzz-viewer", role=Role.VIEWER), created_by="test").token
    port = free_port()
    loop = asyncio.new_event_loop()
    started = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        app = tornado.web.Application([*rest_patterns(services, routes), *edge_patterns(NotFoundHandler)])
        guard_application(app)
        tornado.httpserver.HTTPServer(app, **http_server_limits()).listen(port, "127.0.0.1")
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(60)
    try:
        yield Throwaway(f"http://127.0.0.1:{port}", {"admin": admin, "viewer": viewer}, len(routes))
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        world.stop()
        services.stop()


@pytest.mark.timeout(900)  # every route of every noun, fuzzed
@pytest.mark.parametrize("role", ["admin", "viewer"])
def test_schemathesis_finds_nothing(throwaway: Throwaway, role: str, tmp_path: Path) -> None:
    report = tmp_path / "events.ndjson"
    config = tmp_path / "schemathesis.toml"
    # readyz answers 503 by design here: the engine is not started (and the document says so)
    config.write_text('[[operations]]\ninclude-operation-id = "readyz"\n'
                      'checks.not_a_server_error.expected-statuses = ["2xx", "3xx", "4xx", "503"]\n')
    cli = Path(sys.executable).with_name("schemathesis")
    result = subprocess.run(
        [str(cli), "--config-file", str(config), "run", f"{throwaway.url}/api/v1/openapi.json", "--checks", CHECKS,
         "--phases", "examples,coverage,fuzzing", "--max-examples", str(EXAMPLES_PER_OPERATION),
         "--seed", "20261201", "--generation-deterministic", "--no-shrink",  # deterministic: no example database
         "--workers", "1", "--exclude-operation-id", "sandbox_faults_inject",
         "--header", f"Authorization: Bearer {throwaway.tokens[role]}",
         "--report", "ndjson", "--report-ndjson-path", str(report), "--no-color", "--request-timeout", "30"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,  # its cache stays out of the checkout
        env={**os.environ, "SCHEMATHESIS_HOOKS": "tests.schemathesis_hooks",
             "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))},
    )
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:]
    requests: dict[str, int] = {}
    for line in report.read_text().splitlines():
        finished = json.loads(line).get("ScenarioFinished")
        if finished:
            label = finished["recorder"]["label"]
            requests[label] = requests.get(label, 0) + len(finished["recorder"].get("interactions", {}))
    assert len([n for n in requests.values() if n]) == throwaway.operations - 1, requests  # all but inject
    assert sum(requests.values()) >= MIN_REQUESTS // 2, f"only {sum(requests.values())} requests as {role}"
    for token in throwaway.tokens.values():  # nobody revoked a token of the run
        r = httpx2.get(throwaway.url + "/api/v1/whoami", headers={"Authorization": f"Bearer {token}"}, timeout=10)
        assert r.status_code == 200
