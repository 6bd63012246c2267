"""The dashboard's create form in a real browser (Playwright driving Debian's chromium) against a real
server on the sandbox: the zone select offers the inspected zones, choosing one narrows the instance types
to those it offers, Create stays disabled until a plan of the current choices is shown, the plan shows the
derived names, Create starts the operation and its stages show up live, and Delete waits for the typed
name. The lead's end-to-end test extends this one (create -> verify -> delete).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from app.sandbox import SANDBOX_ACCESS_KEY
from tests.browser_support import BROWSER, SCREENSHOTS, signed_in
from tests.support import LiveServer, start_server, wait_until

pytestmark = BROWSER

NAME = "browser-new"


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[LiveServer]:
    live = start_server(tmp_path / "data", env={"INSTANTSTART_SANDBOX_SPEED": "3000"})
    assert live.admin_token, live.log()
    yield live
    live.stop()


def offered_zones(server: LiveServer, instance_type: str) -> set[str]:
    """What the sandbox's EC2 says offers ``instance_type`` (ml. dropped), read with boto3 as any user would."""
    info = server.get("/api/v1/sandbox").json()
    ec2 = boto3.client("ec2", endpoint_url=info["aws_endpoint_url"], region_name=info["region"],
                       aws_access_key_id=SANDBOX_ACCESS_KEY,
                       aws_secret_access_key=(server.data_dir / "sandbox" / "aws-secret-key").read_text().strip())
    offers = ec2.describe_instance_type_offerings(
        LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": [instance_type[3:]]}])
    return {o["Location"] for o in offers["InstanceTypeOfferings"]}


def test_create_form_offers_inspected_choices_plans_then_creates(own_server: LiveServer, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    server = own_server
    options = server.get("/api/v1/clusters/options").json()
    zones = [z["name"] for z in options["zones"] if z["state"] == "available"]
    assert len(zones) >= 2, options
    by_zone = {z: sorted(t["instance_type"] for t in options["instance_types"] if z in t["zones"]) for z in zones}
    # a zone that does not offer ml.g5.8xlarge (EC2 agrees): choosing it must narrow the list
    narrow = next(z for z in zones if "ml.g5.8xlarge" not in by_zone[z])
    offering = offered_zones(server, "ml.g5.8xlarge")
    assert narrow not in offering and zones[0] in offering and "ml.g5.8xlarge" in by_zone[zones[0]]

    with signed_in(server, tmp_path / "profile", height=1400) as (page, errors):
        page.goto(server.url + "/?page=clusters")
        zone = page.locator(".create-zone select")
        expect(zone).to_be_visible(timeout=30_000)
        expect(zone.locator("option")).to_have_count(len(zones), timeout=30_000)
        assert sorted(zone.locator("option").all_inner_texts()) == sorted(zones)

        kinds = page.locator(".create-type select option")
        zone.select_option(narrow)
        expect(kinds.filter(has_text="ml.g5.8xlarge,")).to_have_count(0)  # the narrow zone's list, not the first's
        expect(kinds).to_have_count(len(by_zone[narrow]))
        # each type is labelled with its accelerator and EFA interfaces
        assert sorted(t.split(",")[0] for t in kinds.all_inner_texts()) == by_zone[narrow]
        assert any("EFA" in t for t in kinds.all_inner_texts())
        zone.select_option(zones[0])
        expect(kinds).to_have_count(len(by_zone[zones[0]]))
        expect(kinds.filter(has_text="ml.g5.8xlarge,")).to_have_count(1)  # the new zone's list, whatever its length

        label = next(t for t in kinds.all_inner_texts() if t.split(",")[0] == "ml.g5.8xlarge")
        page.locator(".create-type select").select_option(label=label)
        page.locator(".create-name input").fill(NAME)
        page.locator(".create-name input").press("Enter")
        count = page.locator(".create-count input")
        count.fill("2")
        count.press("Enter")
        create = page.locator(".create-submit button")
        expect(create).to_be_disabled()  # no plan of these choices yet

        page.locator(".create-plan button").click()
        plan = page.locator(".create-plan-view")
        expect(plan).to_contain_text(f"Plan for {NAME}", timeout=30_000)
        expect(plan).to_contain_text("Nothing has been made yet")
        expect(plan.locator(".plan-names")).to_contain_text("eks_cluster")
        assert server.get("/api/v1/operations?kind=cluster.create").json() == [], "the plan started something"
        expect(create).to_be_enabled()

        create.click()
        progress = page.locator(".create-progress")
        expect(progress).to_contain_text("cluster.create", timeout=30_000)
        ops = wait_until(lambda: server.get("/api/v1/operations?kind=cluster.create").json(), 30,
                         "the create operation")
        assert len(ops) == 1 and ops[0]["target"] == f"cluster/{NAME}" and ops[0]["face"] == "ui", ops
        assert ops[0]["request"]["count"] == 2 and ops[0]["request"]["zone"] == zones[0]
        expect(progress).to_contain_text(ops[0]["id"])
        final = wait_until(lambda: (op := server.get(f"/api/v1/operations/{ops[0]['id']}").json())["status"]
                           in ("succeeded", "failed") and op, 120, "the create to end")
        expect(progress.locator(".op-status")).to_have_text(final["status"], timeout=30_000)
        for stage in final["stages"]:  # each stage's row, with the status the operation reports
            row = progress.locator(f".stage-row[data-stage='{stage['name']}']")
            expect(row).to_have_attribute("data-status", stage["status"])
        if final["status"] == "failed":
            expect(page.locator(".create-retry button")).to_be_visible()
        page.screenshot(path=str(SCREENSHOTS / "instantstart-create.png"), full_page=True)

        # Delete waits for the typed name (the list's selection is the target)
        delete = page.locator(".cluster-delete button")
        expect(delete).to_be_disabled()
    assert not errors, errors
    assert "Traceback" not in server.log(), server.log()
