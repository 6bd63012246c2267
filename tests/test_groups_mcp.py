"""An agent grows a cluster through a real MCP client (the bridge calls the REST API, so it passes the same
prechecks): inspect the zone's types, add a group, scale it to 0, delete it (an admin-only, destructive tool
an operator's bridge does not offer), following each operation with operations_wait."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters

from tests.ledger import CallLedger
from tests.sandbox_support import SeededServer, seeded_server
from tests.support import ROOT, clean_env

pytestmark = pytest.mark.slow
EKS = "agent-groups"


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeededServer]:
    with seeded_server(tmp_path_factory.mktemp("groups-mcp"), EKS, nodes=1) as server:
        accepted = server.live.post("/api/v1/clusters/import", {"eks_cluster": EKS, "hyperpod_cluster": EKS})
        assert accepted.status_code == 202, accepted.text
        done = server.live.get(f"/api/v1/operations/{accepted.json()['operation']['id']}/wait?timeout=120").json()
        assert done["status"] == "succeeded", done
        yield server


async def call(client: Client, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    text = "".join(getattr(c, "text", "") for c in result.content)
    assert not result.is_error, f"{tool} {json.dumps(arguments)}: {text[:2000]}"
    return dict(result.structured_content or {})


async def follow(client: Client, op_id: str) -> dict[str, Any]:
    for _ in range(20):
        view = await call(client, "operations_wait", {"id": op_id, "timeout": 30})
        if view["status"] in ("succeeded", "failed", "cancelled"):
            return view
    raise AssertionError(f"{op_id} did not end")


def bridge(seeded: SeededServer, token: str) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=["-m", "app.cli", "mcp", "--url", seeded.live.url,
                                       "--toolsets", "system,operations,clusters,instance_groups"],
                                 env={**clean_env(), "INSTANTSTART_TOKEN": token}, cwd=str(ROOT))


def test_an_agent_adds_scales_and_deletes_a_group(seeded: SeededServer) -> None:
    ledger = CallLedger(seeded.live)
    operator = seeded.live.make_token("operator")
    mark = ledger.mark()

    async def as_operator() -> tuple[set[str], dict[str, Any], dict[str, Any], str]:
        async with Client(bridge(seeded, operator)) as client:
            tools = {t.name for t in (await client.list_tools()).tools}
            listed = await call(client, "instance_groups_list", {"cluster": EKS})
            zone = await call(client, "instance_groups_get", {"cluster": EKS, "group": "workers"})
            made = await call(client, "instance_groups_add", {"cluster": EKS, "name": "agents", "count": 1,
                                                              "instance_type": "ml.g5.8xlarge", "zone": "us-west-2a"})
            added = await follow(client, made["operation"]["id"])
            emptied = await call(client, "instance_groups_update", {"cluster": EKS, "group": "agents", "count": 0})
            scaled = await follow(client, emptied["operation"]["id"])
            after = await call(client, "instance_groups_list", {"cluster": EKS, "refresh": True})
            assert zone["name"] == "workers"
            assert "workers" in json.dumps(listed)
            return tools, added, scaled, json.dumps(after)

    tools, added, scaled, seen = anyio.run(as_operator)
    assert {"instance_groups_list", "instance_groups_add", "instance_groups_update"} <= tools
    assert "instance_groups_delete" not in tools, "delete is admin only: an operator's bridge does not offer it"
    assert added["status"] == "succeeded" and scaled["status"] == "succeeded", (added, scaled)
    assert '"agents"' in seen
    sent = [e["request"] for e in ledger.succeeded("sagemaker", "UpdateCluster", since=mark)]
    assert len(sent) == 2
    assert {g["InstanceGroupName"] for g in sent[0]["InstanceGroups"]} == {"workers", "agents"}
    emptied = next(g for g in sent[1]["InstanceGroups"] if g["InstanceGroupName"] == "agents")
    assert emptied["InstanceCount"] == 0 and emptied["MinInstanceCount"] == 0

    async def as_admin() -> tuple[bool, dict[str, Any]]:
        async with Client(bridge(seeded, seeded.live.admin_token)) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            annotations = tools["instance_groups_delete"].annotations
            gone = await call(client, "instance_groups_delete", {"cluster": EKS, "group": "agents"})
            return bool(annotations and annotations.destructive_hint), await follow(client, gone["operation"]["id"])

    destructive, deleted = anyio.run(as_admin)
    assert destructive and deleted["status"] == "succeeded", deleted
    assert ledger.succeeded("sagemaker", "UpdateCluster", since=mark)[-1]["request"]["InstanceGroupsToDelete"] == [
        "agents"]
