"""`skills/train-model.md` through a real MCP client: an operator agent submits a raw HyperPodPyTorchJob
manifest, lists and describes it, suspends it and deletes it, with the tools the playbook names. The bridge calls
the REST API, so the agent passes the same prechecks; the sandbox's HyperPod training operator runs the job, and
the test asserts what the Kubernetes API received."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.jobs_support import CLUSTER, NS, JobWorld, hppj, job_world
from tests.mcp_support import bridge, call, follow, playbook_tools

pytestmark = pytest.mark.slow
PLAYBOOK = Path(__file__).resolve().parents[1] / "skills" / "train-model.md"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JobWorld]:
    with job_world(tmp_path_factory.mktemp("jobs-mcp")) as made:
        yield made




def _exists(world: JobWorld) -> bool:
    try:
        world.job("HyperPodPyTorchJob", "agent-job")
    except Exception as exc:  # the client's ApiException: 404 until the stage creates it
        if getattr(exc, "status", None) == 404:
            return False
        raise
    return True


def test_an_agent_submits_watches_suspends_and_deletes_a_job(world: JobWorld) -> None:
    operator = world.live.make_token("operator")
    playbook = playbook_tools(PLAYBOOK)
    used: list[str] = []

    async def agent() -> dict[str, Any]:
        async with bridge(world.live.url, operator, "jobs,features,clusters,operations,system") as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert tools["jobs_delete"].annotations and tools["jobs_delete"].annotations.destructive_hint
            assert tools["jobs_list"].annotations and tools["jobs_list"].annotations.read_only_hint
            listed = await call(client, "jobs_list", {"cluster": CLUSTER}, used)
            assert listed["jobs"] == [] and "HyperPodPyTorchJob" in listed["kinds_installed"]
            started = await call(client, "jobs_submit", {"cluster": CLUSTER, "name": "agent-job", "recipe": "manifest",
                                                         "manifest": hppj()}, used)
            assert "operations_wait" in started["message"] or "operations_get" in started["message"]
            submitted = await follow(client, started["operation"]["id"], used)
            assert submitted["status"] == "succeeded", submitted
            listed = await call(client, "jobs_list", {"cluster": CLUSTER}, used)
            detail = await call(client, "jobs_get", {"cluster": CLUSTER, "job": "agent-job"}, used)
            digest = await call(client, "jobs_digest", {"cluster": CLUSTER, "job": "agent-job"}, used)
            suspending = await call(client, "jobs_suspend", {"cluster": CLUSTER, "job": "agent-job"}, used)
            suspended = await follow(client, suspending["operation"]["id"], used)
            after = await call(client, "jobs_get", {"cluster": CLUSTER, "job": "agent-job"}, used)
            deleting = await call(client, "jobs_delete", {"cluster": CLUSTER, "job": "agent-job"}, used)
            deleted = await follow(client, deleting["operation"]["id"], used)
            return {"listed": listed, "detail": detail, "digest": digest, "suspended": suspended, "after": after,
                    "deleted": deleted}

    seen = anyio.run(agent)
    assert [(j["name"], j["phase"], j["kind"]) for j in seen["listed"]["jobs"]] == [
        ("agent-job", "Running", "HyperPodPyTorchJob")]
    assert seen["detail"]["restarts"]["limit"] == 5 and seen["detail"]["namespace"] == NS
    assert "Running" in seen["digest"]["line"] and "restarts 0/5" in seen["digest"]["line"]
    assert sorted(p["name"] for p in seen["detail"]["pods"]) == ["agent-job-worker-0", "agent-job-worker-1"]
    assert seen["suspended"]["status"] == "succeeded" and seen["after"]["phase"] == "Suspended"
    assert seen["after"]["pods"] == [], "the operator stopped the pods"
    assert seen["deleted"]["status"] == "succeeded"
    assert not _exists(world), "the job is gone from the Kubernetes API"
    assert set(used) <= playbook, f"tools outside the playbook: {set(used) - playbook}"
    audit = world.live.get("/api/v1/audit", params={"limit": 50}).json()
    actions = {e["action"] for e in (audit["items"] if isinstance(audit, dict) else audit)}
    assert {"job.submit", "job.suspend", "job.delete"} <= actions
