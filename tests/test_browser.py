"""One real browser (Playwright driving Debian's chromium, no browser download) against a real server.

Sign in with the first-start admin token, see the Operations pane, create a backup over REST and watch
the pane show it and its success without a reload (pushed by events). A wrong token is refused on the
login page. No request of the page may fail: everything is served locally, no CDN.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from app.edge import COMPONENT_MODULES
from tests.browser_support import BROWSER, CHROMIUM, FLAGS, SCREENSHOTS
from tests.support import LiveServer, start_server

pytestmark = BROWSER


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[LiveServer]:
    """A server of our own, so its first-start admin token is ours to sign in with."""
    live = start_server(tmp_path / "data")
    assert live.admin_token, live.log()
    yield live
    live.stop()


def test_sign_in_and_watch_a_backup_arrive(own_server: LiveServer, tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    server = own_server
    failed: list[str] = []
    errors: list[str] = []
    components: list[str] = []
    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(str(tmp_path / "profile"), executable_path=CHROMIUM,
                                                   headless=True, args=FLAGS,
                                                   viewport={"width": 1280, "height": 900})
        try:
            page = ctx.new_page()
            page.on("requestfailed", lambda r: failed.append(f"{r.url} {r.failure}"))
            page.on("response", lambda r: failed.append(f"{r.url} {r.status}") if r.status >= 400 else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: components.append(r.url) if "/components/" in r.url else None)
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            # every Content-Security-Policy violation becomes a console error, which the checks below refuse
            page.add_init_script("document.addEventListener('securitypolicyviolation', e => console.error("
                                 "`CSP violation: ${e.violatedDirective} ${e.blockedURI}`))")

            # not signed in: the dashboard sends us to the login page
            page.goto(server.url + "/")
            expect(page).to_have_url(f"{server.url}/login?next=%2F")

            # a wrong token is refused on the login page
            page.fill("#token", "ist_00000000_not-a-real-token")
            page.click("#login")
            expect(page.locator(".error")).to_contain_text("unknown token")
            assert page.url.startswith(server.url + "/login")
            # the refusal itself is the only failed request so far
            assert [f.rsplit(" ", 1)[1] for f in failed] == ["401"] and "/login" in failed[0], failed
            assert all("401" in e for e in errors), errors
            failed.clear()
            errors.clear()

            page.fill("#token", server.admin_token)
            page.click("#login")
            expect(page).to_have_url(server.url + "/")
            cookies = {c["name"]: c for c in ctx.cookies(server.url)}
            session = cookies.get("instantstart_session")
            assert session is not None, f"chromium kept no session cookie: {list(cookies)}"
            assert session["httpOnly"] and session["secure"] and session["sameSite"] == "Strict"

            expect(page.locator(".whoami")).to_contain_text("Signed in as admin (admin)", timeout=30_000)
            expect(page.locator(".nav-operations button")).to_be_visible()
            expect(page.locator(".nav-audit button")).to_be_visible()
            table = page.locator(".operations-table")
            expect(table).to_be_visible()
            expect(page.locator(".op-header")).to_contain_text("No operation selected.")
            expect(table).to_contain_text("No operations yet")  # an empty table says what it will hold

            # a backup made elsewhere (REST) shows up and finishes without any reload
            r = server.post("/api/v1/backups", {"label": "browser"})
            assert r.status_code == 202, r.text
            op_id = r.json()["operation"]["id"]
            row = table.locator(".tabulator-row", has_text=op_id)
            expect(row).to_be_visible(timeout=15_000)
            expect(row).to_contain_text("succeeded", timeout=15_000)
            expect(page.locator(".op-header")).to_contain_text(op_id)
            expect(page.locator(".op-stages")).to_contain_text("verify")
            expect(page.locator(".op-retry button")).to_be_disabled()  # succeeded: nothing to retry
            expect(page.locator(".op-conditions")).to_contain_text("AllStagesDone")
            box = page.locator(".op-conditions").bounding_box()
            assert box is not None and box["y"] + box["height"] <= 900, f"cut off at 900 px: {box}"
            page.screenshot(path=str(SCREENSHOTS / "instantstart-operations.png"), full_page=True)

            # the filter re-reads in a worker thread: a succeeded operation is not active
            page.locator(".op-filter select").select_option("active")
            expect(row).to_have_count(0)
            page.locator(".op-filter select").select_option("all")
            expect(row).to_contain_text("succeeded")

            expect(page.locator(".nav-operations button")).to_have_class(re.compile(r"bk-btn-primary"))
            page.locator(".nav-audit button").click()
            expect(page.locator(".nav-audit button")).to_have_class(re.compile(r"bk-btn-primary"))
            expect(page.locator(".nav-operations button")).to_have_class(re.compile(r"bk-btn-default"))
            audit = page.locator(".audit-table")
            expect(audit).to_contain_text("backup.create", timeout=15_000)
            expect(audit).to_contain_text(op_id)
            # every page has a URL: a reload lands on the same page
            expect(page).to_have_url(f"{server.url}/?page=audit")
            page.reload()
            expect(page.locator(".nav-audit button")).to_have_class(re.compile(r"bk-btn-primary"), timeout=30_000)
            audit = page.locator(".audit-table")
            expect(audit).to_contain_text(op_id, timeout=15_000)
            # the audit pane follows events too
            r = server.post("/api/v1/backups", {"label": "browser-two"})
            assert r.status_code == 202, r.text
            second = r.json()["operation"]["id"]
            expect(audit.locator(".tabulator-row", has_text=second).filter(has_text="succeeded")).to_have_count(1)
            page.screenshot(path=str(SCREENSHOTS / "instantstart-audit.png"), full_page=True)
        finally:
            ctx.close()
    assert not failed, failed
    assert not errors, errors
    # Panel's /components/<module>/... resources are served only for modules in the allowlist (SECURITY.md):
    # every module the dashboard asks for must be in it (recorded in a session: none so far)
    requested = {urlsplit(url).path.split("/")[2] for url in components}
    assert requested <= COMPONENT_MODULES, f"add {sorted(requested - COMPONENT_MODULES)} to COMPONENT_MODULES"
    assert "Traceback" not in server.log(), server.log()
