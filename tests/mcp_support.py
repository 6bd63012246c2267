"""A real MCP client for agent tests: the bridge started as a user would (``instantstart mcp --url … --toolsets
…`` over stdio, the token in its environment), and the two calls every playbook test makes: a tool call that must
succeed, and following an operation until it ends. ``used`` collects the tools called, for the playbook check."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import yaml
from mcp import Client, StdioServerParameters

from tests.support import ROOT, clean_env

ENDED = ("succeeded", "failed", "cancelled")


@asynccontextmanager
async def bridge(url: str, token: str, toolsets: str) -> AsyncIterator[Client]:
    params = StdioServerParameters(command=sys.executable, args=["-m", "app.cli", "mcp", "--url", url,
                                                                       "--toolsets", toolsets],
                                   env={**clean_env(), "INSTANTSTART_TOKEN": token}, cwd=str(ROOT))
    async with Client(params) as client:
        yield client


async def call(client: Client, tool: str, arguments: dict[str, Any], used: list[str]) -> dict[str, Any]:
    used.append(tool)
    result = await client.call_tool(tool, arguments)
    text = "".join(getattr(c, "text", "") for c in result.content)
    assert not result.is_error, f"{tool} {json.dumps(arguments)[:300]}: {text[:2000]}"
    return dict(result.structured_content or json.loads(text))


async def follow(client: Client, op_id: str, used: list[str], timeout: int = 60) -> dict[str, Any]:
    for _ in range(20):
        view = await call(client, "operations_wait", {"id": op_id, "timeout": timeout}, used)
        if view["status"] in ENDED:
            return view
    raise AssertionError(f"{op_id} did not end")


def playbook_tools(playbook: Path) -> set[str]:
    """The tools a skill's front matter lists (what an agent following it may call)."""
    return set(yaml.safe_load(playbook.read_text().split("---")[1])["tools"])
