"""A node fault and a used-up recovery budget, seen on all three faces. An agent (a real MCP client with an admin
token and the sandbox toolset) submits a one-pod HyperPodPyTorchJob whose budget allows one full-job restart and
injects a fault (``sandbox_faults_inject`` node_unhealthy) into the node its pod runs on: HyperPod's training
operator restarts the job on another node, within the budget. A second fault, on that node, uses the budget up
and the job ends Failed; the reason is the same in the agent's ``jobs_get``, in the REST digest a terminal polls
and in the dashboard's Jobs pane (rendered without a browser, as in a notebook)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import anyio
import panel as pn
import pytest
from mcp import Client

from app.bootstrap import Services
from panels.jobs import JobsPane
from services.auth import Principal, Role
from tests.jobs_support import BASE, CLUSTER, JobWorld, hppj, job_world
from tests.mcp_support import bridge, call, follow
from tests.support import wait_until

pytestmark = pytest.mark.slow
ADMIN = Principal("faults-admin", Role.ADMIN, "t-adm", "api")
JOB = "fault-job"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[JobWorld, Services]]:
    with job_world(tmp_path_factory.mktemp("jobs-faults"), nodes=3) as made, \
            made.server.imported(tmp_path_factory.mktemp("product") / "data", CLUSTER, ADMIN) as services:
        yield made, services


async def until(client: Client, done: Callable[[dict[str, Any]], bool], used: list[str], what: str
                ) -> dict[str, Any]:
    """Poll ``jobs_get`` as an agent would (the playbook's 'poll until terminal') until ``done`` holds."""
    detail: dict[str, Any] = {}
    with anyio.fail_after(180):
        while True:
            detail = await call(client, "jobs_get", {"cluster": CLUSTER, "job": JOB}, used)
            if done(detail):
                return detail
            await anyio.sleep(0.5)
    raise AssertionError(f"{what}: {detail}")  # unreachable: fail_after raises first


def running_node(detail: dict[str, Any]) -> str | None:
    pods = [p for p in detail["pods"] if p["phase"] == "Running" and p["node"]]
    return str(pods[0]["node"]) if detail["phase"] == "Running" and len(pods) == 1 else None


def test_a_node_fault_restarts_the_job_within_budget_and_a_second_fails_it_on_every_face(
        world: tuple[JobWorld, Services]) -> None:
    made, services = world
    used: list[str] = []

    async def fault(client: Client, node: str) -> None:
        await call(client, "sandbox_faults_inject", {"kind": "node_unhealthy", "target": {
            "cluster": CLUSTER, "node": node.removeprefix("hyperpod-")}}, used)

    async def agent() -> dict[str, Any]:
        async with bridge(made.live.url, made.live.admin_token, "jobs,sandbox,operations,system") as client:
            started = await call(client, "jobs_submit", {"cluster": CLUSTER, "name": JOB, "recipe": "manifest",
                                                         "manifest": hppj(replicas=1, max_full_restarts=1)}, used)
            assert (await follow(client, started["operation"]["id"], used))["status"] == "succeeded"
            first = await until(client, lambda d: running_node(d) is not None, used, "the job running")
            first_node = str(running_node(first))
            await fault(client, first_node)
            # the pods and the events come from two watch caches: the NodeFault event may show after the new pod
            again = await until(client, lambda d: running_node(d) not in (None, first_node) and any(
                e["reason"] == "NodeFault" for e in d["events"]), used, "the job restarted on another node")
            second_node = str(running_node(again))
            await fault(client, second_node)
            failed = await until(client, lambda d: d["phase"] == "Failed", used, "the job Failed")
            digest = await call(client, "jobs_digest", {"cluster": CLUSTER, "job": JOB}, used)
            return {"first": first_node, "again": again, "second": second_node, "failed": failed, "digest": digest}

    seen = anyio.run(agent)
    again, failed = seen["again"], seen["failed"]
    # the first fault: one full-job restart, away from the faulty node, within the budget
    assert again["restarts"]["full_job_restarts_used"] == 1, again["restarts"]
    assert seen["second"] != seen["first"]
    fault_events = [e for e in again["events"] if e["reason"] == "NodeFault"]
    assert fault_events and seen["first"] in fault_events[0]["message"], again["events"]
    # the second: the budget is used up; the agent reads why
    reason = failed["reason"]
    assert reason.startswith("RestartBudgetExhausted: maxFullJobRestarts (1) exhausted"), reason
    assert seen["second"] in reason, reason
    assert "RestartBudgetExhausted" in seen["digest"]["line"], seen["digest"]
    # a terminal's face: the REST digest and describe give the same reason
    digest = made.live.get(f"{BASE}/{JOB}/digest").json()
    assert digest["phase"] == "Failed" and reason in digest["line"], digest
    assert made.live.get(f"{BASE}/{JOB}").json()["reason"] == reason
    # the dashboard's face: the Jobs pane's table and the job's page
    pane = JobsPane(services.jobs, services.clusters, services.bus, ADMIN)
    pn.panel(pane).get_root()
    wait_until(lambda: pane.picker.value == CLUSTER, 60, "the cluster picked")

    def row() -> bool:
        services.bus.drain()
        frame = pane.table.value
        return list(frame["name"]) == [JOB] and list(frame["phase"]) == ["Failed"]

    wait_until(row, 60, "the failed job in the table")
    assert list(pane.table.value["reason"]) == [reason]
    pane.table.selection = [0]
    wait_until(lambda: f"**Failed:** {reason}" in pane.status.object, 60, "the job page to show the reason")
