"""One real browser on the Training metrics page: the chart of a job shows the points its MLflow run holds,
and a point logged afterwards with ``log_metric`` arrives in the chart's data source without a reload
(pushed by the run's poller through the session's document)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.browser_support import BROWSER, SCREENSHOTS, signed_in
from tests.test_mlflow_metrics_faces import World, metrics_world

pytestmark = BROWSER

#: the step columns of the page's Bokeh data sources (one per charted series)
STEPS_JS = """() => {
  const out = [];
  for (const doc of Bokeh.documents) for (const m of doc.all_models) {
    const data = m.data instanceof Map ? Object.fromEntries(m.data) : m.data;
    if (data && data.step !== undefined && data.value !== undefined) out.push(Array.from(data.step));
  }
  return out;
}"""


@pytest.fixture
def world(tmp_path: Path, mlflow_url: str) -> Iterator[World]:
    with metrics_world(tmp_path, mlflow_url) as made:
        yield made


def test_a_logged_point_arrives_in_the_chart_live(world: World, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    server = world.seeded.live
    with signed_in(server, tmp_path / "profile") as (page, errors):
        page.goto(server.url + "/?page=metrics")
        page.locator(".metrics-cluster input").fill("hp-eks")
        page.locator(".metrics-cluster input").press("Enter")
        page.locator(".metrics-job input").fill("run-a")
        page.locator(".metrics-job input").press("Enter")
        count = page.locator(".metrics-count")
        expect(count).to_contain_text("10 points charted, last step 5", timeout=60_000)

        # the count and the two data sources are separate model changes in the browser: wait for the sources
        page.wait_for_function(f"() => ({STEPS_JS})().filter(s => s.join() === '1,2,3,4,5').length === 2",
                               timeout=30_000)
        MlflowClient(world.url).log_metric(world.runs["run-a"], "loss", 0.123, step=6,
                                           timestamp=int(time.time() * 1000))
        expect(count).to_contain_text("11 points charted, last step 6", timeout=30_000)
        page.wait_for_function(f"() => ({STEPS_JS})().some(s => s.length === 6 && s[5] === 6)",
                               timeout=30_000)
        page.screenshot(path=str(SCREENSHOTS / "instantstart-metrics-live.png"), full_page=True)
    assert not errors, errors
    assert "Traceback" not in server.log(), server.log()
