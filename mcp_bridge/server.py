"""The MCP bridge: an MCP server whose tools are the REST routes its token's role may call.

At start it asks ``whoami`` (so a bad token fails fast) and reads ``/api/v1/openapi.json``; each call
then becomes one HTTP request to the REST API, so an agent passes exactly the validation a browser
does. REST errors come back as ``isError`` results carrying the REST error envelope unchanged.
It never holds state of its own and never talks to AWS or Kubernetes.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import anyio
import httpx2
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from mcp_bridge.follow import FOLLOW_MAX_SECONDS, Follow, follow, widen
from mcp_bridge.tools import ToolSpec, cap_result, cap_text, select_toolsets, to_http, tool_specs

log = logging.getLogger(__name__)

INSTRUCTIONS = (
    "InstantStart manages SageMaker HyperPod clusters on EKS. Read before you change: start with status_get. "
    "Every mutating tool returns an operation id at once; follow it until its status is succeeded, failed or "
    f"cancelled with operations_wait and a 'timeout' of up to {FOLLOW_MAX_SECONDS:.0f} s (a cluster creation "
    "takes 30-60 minutes in AWS: use long waits, not sleeps), or operations_get with 'wait': up to 60 s it "
    f"answers on the next change, longer (up to {FOLLOW_MAX_SECONDS:.0f} s) when the operation has ended or the "
    "time is up. During a wait the bridge sends progress notifications (stage, status, message, elapsed) if "
    "the call carries a progressToken. Ask the user only "
    "for decisions; never retry a failed operation blindly: read its error and conditions first."
)


class RestClient:
    """A thin async HTTP client that identifies itself as the MCP face."""

    def __init__(self, base_url: str, token: str, transport: httpx2.AsyncBaseTransport | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self._client = httpx2.AsyncClient(
            # longer than the longest long-poll a route allows (operations_wait: 120 s)
            base_url=self.base_url, timeout=httpx2.Timeout(150.0, connect=10.0), transport=transport,
            headers={"Authorization": f"Bearer {token}", "X-InstantStart-Face": "mcp",
                     "User-Agent": "instantstart-mcp-bridge"})

    async def request(self, method: str, path: str, params: dict[str, Any] | None = None,
                      body: dict[str, Any] | None = None) -> tuple[int, Any]:
        response = await self._client.request(method, path, params=params, json=body)
        media_type = response.headers.get("content-type", "application/json").split(";")[0].strip()
        if response.status_code < 400 and media_type.startswith("text/"):  # a kubeconfig: the text itself
            return response.status_code, {"media_type": media_type, "text": response.text}
        try:
            payload = response.json()
        except ValueError:
            payload = {"error": {"code": "bad_response", "message": response.text[:500], "details": None}}
        return response.status_code, payload

    async def aclose(self) -> None:
        await self._client.aclose()


class BridgeError(Exception):
    pass


async def load_tools(client: RestClient, toolsets: str | None = None) -> tuple[dict[str, Any], list[ToolSpec]]:
    """The role's tools in ``toolsets`` (None: the default set; ``all``; or names separated by commas)."""
    status, who = await client.request("GET", "/api/v1/whoami")
    if status != 200:
        raise BridgeError(f"the REST API refused the token ({status}): {json.dumps(who)}")
    status, document = await client.request("GET", "/api/v1/openapi.json")
    if status != 200:
        raise BridgeError(f"could not read the OpenAPI document ({status})")
    try:
        return who, select_toolsets(tool_specs(document, who["role"]), toolsets)
    except ValueError as exc:
        raise BridgeError(str(exc)) from None


def build_server(client: RestClient, who: dict[str, Any], specs: list[ToolSpec]) -> Server[Any]:
    widened = widen(specs)
    specs = [s for s, _ in widened]
    by_name = {s.name: s for s in specs}
    follows: dict[str, Follow] = {s.name: how for s, how in widened if how is not None}

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[
            types.Tool(name=s.name, title=s.title, description=s.description, input_schema=s.input_schema,
                       annotations=types.ToolAnnotations(title=s.title, read_only_hint=s.read_only,
                                                         destructive_hint=s.destructive,
                                                         idempotent_hint=s.idempotent,
                                                         open_world_hint=s.open_world))
            for s in specs])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        spec = by_name.get(params.name)
        if spec is None:
            return _error({"error": {"code": "not_found", "details": None,
                                     "message": f"no tool {params.name!r} for role {who['role']}"}})
        arguments = dict(params.arguments or {})
        try:
            call = to_http(spec, arguments)
        except ValueError as exc:
            return _error({"error": {"code": "invalid", "message": str(exc), "details": None}})
        how = follows.get(spec.name)
        if how is not None and how.needed(arguments) and arguments[how.argument] > FOLLOW_MAX_SECONDS:
            return _error({"error": {"code": "invalid", "details": {"maximum": FOLLOW_MAX_SECONDS},
                                     "message": f"{how.argument} may be at most {FOLLOW_MAX_SECONDS:.0f} s through "
                                                "the bridge; call again to wait longer"}})
        try:
            if how is not None and how.needed(arguments):
                async def report(progress: float, total: float, message: str) -> None:
                    await ctx.session.report_progress(progress, total, message)

                status, payload = await follow(client.request, how, arguments, report)
            else:
                status, payload = await client.request(call.method, call.path, call.params, call.json)
        except httpx2.HTTPError as exc:
            return _error({"error": {"code": "transient", "details": None,
                                     "message": f"REST API unreachable at {client.base_url}: {exc}"}})
        if status >= 400:
            return _error(payload)
        if isinstance(payload, dict) and set(payload) == {"media_type", "text"}:  # a text answer: as text
            text = cap_text(payload["text"])
            return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                        structured_content={"media_type": payload["media_type"], "text": text})
        text, capped = cap_result(spec, payload)
        structured = capped if isinstance(capped, dict) else {"items": capped}
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                    structured_content=structured)

    return Server("instantstart", version="0.1.0", instructions=INSTRUCTIONS,
                  on_list_tools=list_tools, on_call_tool=call_tool)


def _error(envelope: Any) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=json.dumps(envelope))],
                                structured_content=envelope if isinstance(envelope, dict) else None, is_error=True)


async def _serve(url: str, token: str, transport: str, host: str, port: int, toolsets: str | None) -> None:
    client = RestClient(url, token)
    try:
        who, specs = await load_tools(client, toolsets)
        log.info("bridge for %s (%s): %d tools", who["name"], who["role"], len(specs))
        server = build_server(client, who, specs)
        if transport == "stdio":
            async with stdio_server() as (read_stream, write_stream):
                await server.run(read_stream, write_stream, server.create_initialization_options())
        else:
            import uvicorn

            app = server.streamable_http_app(host=host)
            config = uvicorn.Config(app, host=host, port=port, log_level="warning")
            await uvicorn.Server(config).serve()
    finally:
        await client.aclose()


LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


def run_bridge(url: str, token: str, *, transport: str = "stdio", host: str = "127.0.0.1", port: int = 3100,
               toolsets: str | None = None) -> None:
    if transport == "http" and host not in LOOPBACK:
        # whoever reaches the HTTP transport acts with this bridge's token: it must stay on this machine
        raise BridgeError(f"the HTTP transport binds loopback only (it carries the token's role); refusing {host!r}")
    anyio.run(_serve, url, token, transport, host, port, toolsets)
