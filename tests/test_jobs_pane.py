"""The Jobs pane rendered without a browser (as in a notebook) against a product installation with a seeded
sandbox cluster imported and the job CRDs installed: the table follows a job the sandbox's operator runs, from
watch events alone, the job page shows its budget, pods with node and rank and its events, actions ask for a
confirmation before anything happens, and a confirmed suspend sets the flag through the verbs."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import panel as pn
import pytest

from app.bootstrap import Services
from panels.jobs import JobsPane
from services.auth import Principal, Role
from services.operations import OperationQuery
from services.training.jobs_models import JobSubmit
from tests.jobs_support import CLUSTER, NS, JobWorld, hppj, job_world
from tests.support import wait_until

pytestmark = pytest.mark.slow
ADMIN = Principal("pane-admin", Role.ADMIN, "t-adm", "api")
VIEWER = Principal("pane-viewer", Role.VIEWER, "t-view", "api")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[JobWorld, Services]]:
    with job_world(tmp_path_factory.mktemp("jobs-pane")) as made, \
            made.server.imported(tmp_path_factory.mktemp("product") / "data", CLUSTER, ADMIN) as services:
        yield made, services


def test_the_table_and_job_page_follow_the_job_live_and_actions_are_confirmed(
        world: tuple[JobWorld, Services]) -> None:
    made, services = world
    pane = JobsPane(services.jobs, services.clusters, services.bus, ADMIN)
    pn.panel(pane).get_root()  # renders alone, as in a notebook
    wait_until(lambda: pane.picker.value == CLUSTER, 60, "the cluster picked")
    services.engine.start()
    # each pod's first training process crashes at step 2; the HyperPod agent restarts it in place (2 restarts)
    crash_once = {"SANDBOX_FAIL_AT_STEP": "2", "SANDBOX_FAIL_RUNS": "1"}
    view, _ = services.jobs.submit_job(ADMIN, CLUSTER, JobSubmit(name="pane-job", manifest=hppj(env=crash_once)))

    def row(phase: str) -> bool:
        services.bus.drain()
        frame = pane.table.value
        return list(frame["name"]) == ["pane-job"] and list(frame["phase"]) == [phase]

    wait_until(lambda: row("Running"), 120, "the job Running in the table from watch events")
    pane.table.selection = [0]  # a click on its row opens its page

    def page() -> bool:
        services.bus.drain()
        pods: Any = pane.pods.value
        return row("Running") and len(pods) == 2 and list(pane.events.value["reason"]).count(
            "ProcessLevelRestart") == 2 and "restarts **2/5**" in pane.status.object

    wait_until(page, 120, "the job page to show the running pods, the restarts and their events")
    wait_until(lambda: services.engine.get(view.id).status.value == "succeeded", 60, "the submit to end")
    assert "**Running**" in pane.status.object
    assert list(pane.pods.value["rank"]) == [0, 1] and sorted(pane.pods.value["node"]) == made.nodes()
    pane.buttons["suspend"].clicks += 1
    assert pane.confirm_button.visible and "stops its pods" in pane.state.message
    assert services.engine.list(OperationQuery(kind="job.suspend")) == [], "nothing before the confirmation"
    pane.cancel_button.clicks += 1
    assert not pane.confirm_button.visible and "nothing was done" in pane.state.message
    pane.buttons["suspend"].clicks += 1
    asyncio.run(pane.state.confirm())  # what Confirm runs: the verb in a worker thread
    assert pane.state.message.startswith("suspend started"), pane.state.message
    suspend = services.engine.list(OperationQuery(kind="job.suspend"))[0]
    assert suspend.target == f"cluster/{CLUSTER}/job/pane-job"
    wait_until(lambda: made.job("HyperPodPyTorchJob", "pane-job")["spec"]["runPolicy"].get("suspend"), 60,
               "the suspend flag set")
    assert made.job("HyperPodPyTorchJob", "pane-job")["spec"]["runPolicy"]["suspend"] is True
    assert f"{NS}/pane-job" == pane.state.job


def test_a_viewer_sees_the_actions_greyed_out(world: tuple[JobWorld, Services]) -> None:
    _made, services = world
    pane = JobsPane(services.jobs, services.clusters, services.bus, VIEWER)
    assert all(b.disabled for b in pane.buttons.values())
