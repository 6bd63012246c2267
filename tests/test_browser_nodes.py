"""One real browser on the Nodes page: a node fault injected in the sandbox is recovered by HyperPod itself
(automatic node recovery) and the node grid shows the health change live — the node turns to pending
replacement, then its replacement joins healthy — without a reload (pushed by watch events)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.browser_support import BROWSER, SCREENSHOTS, signed_in
from tests.node_support import node_cluster
from tests.sandbox_support import SeededServer

pytestmark = BROWSER


@pytest.fixture
def seeded(tmp_path: Path) -> Iterator[SeededServer]:
    # slow enough that the unhealthy state lasts seconds: detection, then shutdown, then a 15-minute boot
    with node_cluster(tmp_path, 2, recovery="Automatic", speed=60) as server:
        yield server


def test_an_injected_fault_is_recovered_and_the_grid_follows_live(seeded: SeededServer, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    server = seeded.live
    nodes = server.get("/api/v1/clusters/hp-eks/nodes").json()["nodes"]
    sick, other = nodes[0]["name"], nodes[1]["name"]
    with signed_in(server, tmp_path / "profile") as (page, errors):
        page.goto(server.url + "/?page=nodes")
        cell = page.locator(f".node-grid [data-node='{sick}']")
        expect(cell).to_have_attribute("data-health", "Schedulable", timeout=30_000)
        expect(page.locator(".node-grid [data-health='Schedulable']")).to_have_count(2)

        fault = server.post("/api/v1/sandbox/faults", {"kind": "node_unhealthy", "target": {
            "cluster": "hp-eks", "node": sick.removeprefix("hyperpod-"), "recovery": "Replace"}})
        assert fault.status_code == 201, fault.text
        expect(cell).to_have_attribute("data-health", "UnschedulablePendingReplacement", timeout=30_000)
        page.screenshot(path=str(SCREENSHOTS / "instantstart-nodes-fault.png"), full_page=True)
        expect(cell).to_have_count(0, timeout=60_000)  # HyperPod replaced it by itself
        healthy = page.locator(".node-grid [data-health='Schedulable']")
        expect(healthy).to_have_count(2, timeout=60_000)  # the replacement joined healthy
        expect(page.locator(f".node-grid [data-node='{other}']")).to_have_attribute("data-health", "Schedulable")
        page.screenshot(path=str(SCREENSHOTS / "instantstart-nodes-recovered.png"), full_page=True)
    assert not errors, errors
    assert "Traceback" not in server.log(), server.log()
