"""Create → verify → delete through a real MCP client, following `skills/create-cluster-pipeline.md`: inspect
(clusters_options), plan (the dry run), create, follow the operation with one long operations_wait that sends
progress notifications, describe, then delete (a destructive tool) and follow that too. The bridge calls the
REST API, so the agent passes the same prechecks as the dashboard."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import anyio
import boto3
import pytest
from mcp import Client, StdioServerParameters

from app.sandbox import SANDBOX_ACCESS_KEY
from tests.create_support import leftovers
from tests.ledger import CallLedger
from tests.support import ROOT, LiveServer, clean_env, free_port, start_server

pytestmark = pytest.mark.slow
SPEED = 200


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, int]]:
    aws_port = free_port()
    server = start_server(tmp_path_factory.mktemp("mcp-create") / "data", env={
        "INSTANTSTART_SANDBOX_SPEED": str(SPEED), "INSTANTSTART_SANDBOX_AWS_PORT": str(aws_port)})
    yield server, aws_port
    server.stop()


async def call(client: Client, tool: str, arguments: dict[str, Any], **kw: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments, **kw)
    text = "".join(getattr(c, "text", "") for c in result.content)
    assert not result.is_error, f"{tool} {json.dumps(arguments)}: {text[:2000]}"
    return dict(result.structured_content or {})


def test_an_agent_creates_and_deletes_a_cluster_through_the_bridge(live: tuple[LiveServer, int]) -> None:
    server, aws_port = live
    ledger = CallLedger(server)
    mark = ledger.mark()
    progress: list[str] = []

    async def noted(value: float, total: float | None, message: str | None) -> None:
        progress.append(message or "")

    async def follow(client: Client, op_id: str) -> dict[str, Any]:
        for _ in range(20):  # each wait lasts up to 30 minutes of AWS time
            view = await call(client, "operations_wait", {"id": op_id, "timeout": 1800 / SPEED},
                              progress_callback=noted)
            if view["status"] in ("succeeded", "failed", "cancelled"):
                return view
        raise AssertionError(f"{op_id} did not end")

    async def agent() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        params = StdioServerParameters(command=sys.executable, args=["-m", "app.cli", "mcp", "--url", server.url,
                                                                      "--toolsets", "all"],
                                       env={**clean_env(), "INSTANTSTART_TOKEN": server.admin_token}, cwd=str(ROOT))
        async with Client(params) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert tools["clusters_delete"].annotations and tools["clusters_delete"].annotations.destructive_hint
            options = await call(client, "clusters_options", {})
            offered = {t["instance_type"]: t["zones"] for t in options["instance_types"]}
            decisions = {"name": "agentic", "zone": offered["ml.g5.8xlarge"][0], "instance_type": "ml.g5.8xlarge",
                         "count": 1}
            plan = await call(client, "clusters_create", {**decisions, "dry_run": True})
            assert plan["plan"]["names"]["eks_cluster"] == "agentic" and plan["resources"]
            made = await call(client, "clusters_create", decisions)
            created = await follow(client, made["operation"]["id"])
            detail = await call(client, "clusters_get", {"cluster": "agentic"})
            gone = await call(client, "clusters_delete", {"cluster": "agentic", "confirm": "agentic"})
            deleted = await follow(client, gone["operation"]["id"])
            return created, detail, deleted

    created, detail, deleted = anyio.run(agent)
    assert created["status"] == "succeeded", json.dumps(created.get("error") or created["stages"])[:3000]
    assert detail["ownership"] == "managed" and detail["nodes"] == 1
    assert deleted["status"] == "succeeded", json.dumps(deleted.get("error") or deleted["stages"])[:3000]
    assert any("verify" in p or "hyperpod" in p for p in progress), progress[-5:]
    calls = ledger.calls(since=mark)
    secret = (server.data_dir / "sandbox" / "aws-secret-key").read_text().strip()

    def aws(service: str) -> Any:
        return boto3.client(service, endpoint_url=f"http://127.0.0.1:{aws_port}", region_name="us-west-2",
                            aws_access_key_id=SANDBOX_ACCESS_KEY, aws_secret_access_key=secret)

    assert leftovers(aws, calls, "agentic") == []
