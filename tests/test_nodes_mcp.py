"""`skills/diagnose-node-health.md` driven through a real MCP client: an agent holding an OPERATOR token
investigates a node with a persistent fault (`node_persistent_fault`, automatic recovery off) with read tools,
reboots it, sees the fault remain, and finds no replace tool for its role; an ADMIN token then completes the
replace and the group is healthy again. The bridge calls the REST API, so the agent passes the dashboard's
prechecks and role checks."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.ledger import CallLedger
from tests.mcp_support import bridge, call, follow
from tests.node_support import node_cluster
from tests.sandbox_support import SeededServer
from tests.support import wait_until

pytestmark = pytest.mark.slow
PLAYBOOK = Path(__file__).resolve().parents[1] / "skills" / "diagnose-node-health.md"
READ_TOOLS = {"whoami", "clusters_list", "clusters_get", "nodes_list", "nodes_get", "operations_get",
              "operations_wait"}
TOOLSETS = "nodes,node_actions,clusters,operations,system"


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeededServer]:
    with node_cluster(tmp_path_factory.mktemp("nodes-mcp"), 2) as server:
        yield server




def test_an_operator_agent_escalates_to_reboot_and_hands_the_replace_to_an_admin(seeded: SeededServer) -> None:
    live = seeded.live
    ledger = CallLedger(live)
    listed = live.get("/api/v1/clusters/hp-eks/nodes").json()["nodes"]
    sick, healthy = listed[0], listed[1]
    fault = live.post("/api/v1/sandbox/faults", {"kind": "node_persistent_fault", "target": {
        "cluster": "hp-eks", "node": sick["instance_id"], "reason": "NvidiaGpuXidError"}})
    assert fault.status_code == 201, fault.text
    wait_until(lambda: any(n["name"] == sick["name"] and n["health"] == "UnschedulablePendingReplacement"
                           for n in live.get("/api/v1/clusters/hp-eks/nodes").json()["nodes"]), 60,
               "the health agent to flag the node")
    operator = live.make_token("operator")
    playbook_tools = set(PLAYBOOK.read_text().split("tools: [")[1].split("]")[0].replace("\n", " ").replace(
        " ", "").split(","))
    used: list[str] = []
    mark = ledger.mark()

    async def operator_agent() -> dict[str, Any]:
        async with bridge(seeded.live.url, operator, TOOLSETS) as client:
            tools = {t.name for t in (await client.list_tools()).tools}
            assert "nodes_reboot" in tools and "nodes_drain" in tools
            assert "nodes_replace" not in tools and "nodes_delete" not in tools, "admin tools offered to an operator"
            me = await call(client, "whoami", {}, used)
            assert me["role"] == "operator"
            clusters = await call(client, "clusters_list", {}, used)
            assert clusters["items"][0]["health"] == {"Schedulable": 1, "UnschedulablePendingReplacement": 1}
            unhealthy = await call(client, "nodes_list", {"cluster": "hp-eks",
                                                          "health": "UnschedulablePendingReplacement"}, used)
            assert [n["name"] for n in unhealthy["nodes"]] == [sick["name"]]
            assert unhealthy["nodes"][0]["fault_reasons"] == ["NvidiaGpuXidError"]
            detail = await call(client, "nodes_get", {"cluster": "hp-eks", "node": sick["name"]}, used)
            assert any(c["type"] == "AcceleratedHardware" and c["reason"] == "NvidiaGpuXidError"
                       for c in detail["conditions"])
            cluster = await call(client, "clusters_get", {"cluster": "hp-eks"}, used)
            assert cluster["node_recovery"] == "None", "recovery is off: the agent must act"
            investigated = ledger.writes(since=mark)
            assert investigated == [], f"the investigation wrote: {investigated}"
            # the user approved the reboot the playbook suggested
            started = await call(client, "nodes_reboot", {"cluster": "hp-eks", "nodes": [sick["name"]]}, used)
            rebooted = await follow(client, started["operation"]["id"], used)
            assert rebooted["status"] == "succeeded", rebooted
            again = await call(client, "nodes_list", {"cluster": "hp-eks", "selector":
                                                      f"kubernetes.io/hostname={sick['name']}"}, used)
            return {"rebooted": rebooted, "after": again["nodes"][0]}

    seen = anyio.run(operator_agent)
    assert seen["rebooted"]["stages"][0]["result"]["health_after"] == {sick["name"]: "UnschedulablePendingReplacement"}
    assert seen["after"]["health"] == "UnschedulablePendingReplacement", "the fault survived the reboot"
    assert seen["after"]["fault_reasons"] == ["NvidiaGpuXidError"]
    assert set(used) <= playbook_tools and set(used) - {"nodes_reboot"} <= READ_TOOLS, used
    rebooted_calls = ledger.succeeded("sagemaker", "BatchRebootClusterNodes", since=mark)
    assert [c["request"]["NodeIds"] for c in rebooted_calls] == [[sick["instance_id"]]]
    refused = live.post("/api/v1/clusters/hp-eks/nodes/replace", {"nodes": [sick["name"]], "confirm": True},
                        token=operator)
    assert refused.status_code == 403, "the REST server enforces the role too"

    async def admin_hands() -> dict[str, Any]:
        async with bridge(seeded.live.url, live.admin_token, TOOLSETS) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert tools["nodes_replace"].annotations and tools["nodes_replace"].annotations.destructive_hint
            assert tools["nodes_delete"].annotations and tools["nodes_delete"].annotations.destructive_hint
            started = await call(client, "nodes_replace", {"cluster": "hp-eks", "nodes": [sick["name"]],
                                                           "confirm": True}, [])
            return await follow(client, started["operation"]["id"], [])

    replaced = anyio.run(admin_hands)
    assert replaced["status"] == "succeeded", replaced
    assert ledger.once("sagemaker", "BatchReplaceClusterNodes", since=mark)["request"]["NodeIds"] == [
        sick["instance_id"]]

    def healthy_again() -> list[dict[str, Any]] | None:
        now = live.get("/api/v1/clusters/hp-eks/nodes").json()["nodes"]
        return now if len(now) == 2 and all(n["health"] == "Schedulable" for n in now) else None

    after = wait_until(healthy_again, 60, "the replacement to join healthy")
    assert sick["name"] not in {n["name"] for n in after} and healthy["name"] in {n["name"] for n in after}
