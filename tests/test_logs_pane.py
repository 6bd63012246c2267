"""The job-logs pane rendered without a browser against the Kubernetes emulator: it opens on the last 1,000
lines, follows new ones in one terminal write per pump, pages older history in, searches and downloads the
full log gzipped."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import Iterator
from pathlib import Path

import panel as pn
import pytest

from panels.logs import LogsPane
from tests.logs_support import BASE_TS, CLUSTER, VIEWER, LogWorld, log_world
from tests.support import wait_until


@pytest.fixture
def world(tmp_path: Path) -> Iterator[LogWorld]:
    with log_world(tmp_path) as w:
        yield w


def _lines(pane: LogsPane) -> list[str]:
    return [line.rsplit(" ", 1)[-1] for line in pane.terminal.output.split("\r\n") if line]


def test_the_pane_opens_on_the_last_lines_follows_pages_searches_and_downloads(world: LogWorld) -> None:
    world.pod("train-worker-0", "train")
    for i in range(1_500):
        world.log("train-worker-0", f"step {i}", BASE_TS + i * 0.01)
    pane = LogsPane(world.services.logs, VIEWER, cluster=CLUSTER, job="train")
    pn.panel(pane).get_root()  # renders alone, as in a notebook
    writes: list[str] = []
    pane.terminal.param.watch(lambda e: writes.append(e.new), "_output")
    try:
        asyncio.run(pane.restart())
        wait_until(lambda: pane.pump() == 0 and len(_lines(pane)) == 1_000, 30, "the last 1,000 lines")
        assert _lines(pane) == [str(i) for i in range(500, 1_500)]
        before = len(writes)
        for i in range(1_500, 1_520):
            world.log("train-worker-0", f"step {i}", BASE_TS + i * 0.01)
        pumps_with_lines = []

        def followed() -> bool:
            if (written := pane.pump()) > 0:
                pumps_with_lines.append(written)
            return _lines(pane)[-1] == "1519"

        wait_until(followed, 30, "the new lines")
        assert sum(pumps_with_lines) == 20 and len(writes) - before == len(pumps_with_lines)  # one write a pump
        assert all(w.endswith("\r\n") for w in writes)
        asyncio.run(pane.page_older())
        history = pane.state.history.splitlines()
        assert [h.rsplit(" ", 1)[-1] for h in history] == [str(i) for i in range(500)]
        assert "step 0" in pane.history.object
        asyncio.run(pane.page_older())
        assert pane.state.message == "No older lines."
        pane.state.grep = r"step 1[0-4]99$"
        asyncio.run(pane.run_search())
        assert [h.split(" ", 2)[2] for h in pane.state.history.splitlines()[:-1]] == \
            ["step 1099", "step 1199", "step 1299", "step 1399", "step 1499"]
        asyncio.run(pane.prepare_download())
        assert pane.download.visible and pane.download.filename == "train.log.gz"
        full = gzip.decompress(pane.download.file.getvalue()).decode().splitlines()
        assert len(full) == 1_520 and full[0].endswith("train-worker-0/pytorch step 0")
    finally:
        pane.stop()


def test_an_unknown_cluster_is_said_in_the_pane(world: LogWorld) -> None:
    pane = LogsPane(world.services.logs, VIEWER, cluster="nope", job="train")
    asyncio.run(pane.restart())
    assert "no cluster named 'nope'" in pane.status.object
