"""The MCP bridge, driven by the official SDK client over stdio and streamable HTTP against a live server."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client, StdioServerParameters

from mcp_bridge.tools import to_http, tool_specs
from tests.support import ROOT, LiveServer, clean_env, free_port, wait_until

pytestmark = pytest.mark.slow


@asynccontextmanager
async def stdio_client(server: LiveServer, token: str) -> AsyncIterator[Any]:
    params = StdioServerParameters(command=sys.executable, args=["-m", "app.cli", "mcp", "--url", server.url],
                                   env={**clean_env(), "INSTANTSTART_TOKEN": token}, cwd=str(ROOT))
    async with Client(params) as client:
        yield client


def test_stdio_lists_tools_and_calls_operations_list(server: LiveServer) -> None:
    async def main() -> tuple[dict[str, Any], Any, Any]:
        async with stdio_client(server, server.admin_token) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            listed = await client.call_tool("operations_list", {"limit": 5})
            who = await client.call_tool("whoami", {})
            return tools, listed, who

    tools, listed, who = anyio.run(main)
    assert {"operations_list", "operations_get", "operations_wait", "operations_retry", "operations_cancel",
            "whoami", "backups_create", "status_get"} <= set(tools)
    assert tools["operations_list"].annotations.read_only_hint is True
    assert tools["operations_cancel"].annotations.read_only_hint is False
    assert tools["backups_create"].annotations.idempotent_hint is False  # each call makes another backup
    assert tools["operations_get"].annotations.idempotent_hint is True
    assert listed.is_error is False
    assert isinstance(json.loads(listed.content[0].text), list)
    assert who.structured_content["role"] == "admin"


def test_viewer_sees_no_mutating_tools_and_errors_carry_the_envelope(server: LiveServer) -> None:
    viewer = server.make_token("viewer")

    async def main() -> tuple[list[Any], Any]:
        async with stdio_client(server, viewer) as client:
            tools = (await client.list_tools()).tools
            missing = await client.call_tool("operations_get", {"id": "op-doesnotexist"})
            return tools, missing

    tools, missing = anyio.run(main)
    assert tools, "a viewer still gets the read tools"
    assert all(t.annotations.read_only_hint for t in tools), [t.name for t in tools if not t.annotations.read_only_hint]
    assert missing.is_error is True
    assert json.loads(missing.content[0].text)["error"]["code"] == "not_found"


def test_http_transport_mutation_names_operation_and_status_tool(server: LiveServer) -> None:
    operator = server.make_token("operator")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "mcp", "--transport", "http", "--port", str(port),
                             "--url", server.url], cwd=ROOT, env={**clean_env(), "INSTANTSTART_TOKEN": operator},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def listening() -> bool:
            try:
                httpx2.get(f"http://127.0.0.1:{port}/mcp", timeout=1)
            except httpx2.HTTPError:
                return False
            return True

        wait_until(listening, 30, "the bridge's HTTP transport to listen")

        async def main() -> tuple[Any, Any, Any, Any]:
            async with Client(f"http://127.0.0.1:{port}/mcp") as client:
                created = await client.call_tool("backups_create", {"label": "mcp-http"})
                op_id = created.structured_content["operation"]["id"]
                done = await client.call_tool("operations_wait", {"id": op_id, "timeout": 10})
                bad = await client.call_tool("backups_create", {"label": "Not Valid"})
                listed = await client.call_tool("operations_list", {"kind": "backup.create", "limit": 50})
                return created, done, bad, listed

        created, done, bad, listed = anyio.run(main)
    finally:
        proc.terminate()
        proc.wait(10)
    body = created.structured_content
    assert body["status_tool"] == "operations_get"
    assert body["operation"]["id"].startswith("op-")
    assert body["operation"]["face"] == "api" and body["operation"]["client"] == "mcp"  # transport, claim
    assert done.structured_content["id"] == body["operation"]["id"]
    assert done.structured_content["status"] == "succeeded"
    assert bad.is_error is True
    assert json.loads(bad.content[0].text)["error"]["code"] == "invalid"
    assert listed.is_error is False
    assert body["operation"]["id"] in [op["id"] for op in json.loads(listed.content[0].text)]


def test_every_tool_is_a_live_route(server: LiveServer) -> None:
    document = server.get("/api/v1/openapi.json").json()
    specs = tool_specs(document, "admin")
    assert len(specs) >= 8
    for spec in specs:
        call = to_http(spec, {p: "op-x" for p in spec.path_params})
        # OPTIONS is not routed: HEAD-like probe with the real method but no auth must answer 401, not 404
        r = httpx2.request(spec.method, server.url + call.path, timeout=10)
        assert r.status_code == 401, (spec.name, r.status_code, r.text)


def test_bridge_refuses_a_bad_token(server: LiveServer) -> None:
    proc = subprocess.run([sys.executable, "-m", "app.cli", "mcp", "--url", server.url, "--token", "ist_00000000_x"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, input="")
    assert proc.returncode != 0
    assert "refused the token" in proc.stderr
