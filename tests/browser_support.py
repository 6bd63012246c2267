"""One real browser for the dashboard tests: Debian's chromium driven by Playwright (never a browser download),
with the flags this machine needs, a profile of the test's own, and a session signed in with the server's
first-start admin token."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.support import LiveServer

if TYPE_CHECKING:
    from playwright.sync_api import Page

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage"]
SCREENSHOTS = Path(os.environ.get("INSTANTSTART_SCREENSHOTS", "/tmp"))
#: a browser test's marks: skipped where Debian's chromium is missing
BROWSER = [pytest.mark.browser, pytest.mark.slow,
           pytest.mark.skipif(not Path(CHROMIUM).exists() and not shutil.which("chromium"),
                              reason="Debian chromium is not installed (tests/run.sh installs it)")]


@contextmanager
def signed_in(server: LiveServer, profile: Path, height: int = 900) -> Iterator[tuple[Page, list[str]]]:
    """A page signed in to ``server`` on the dashboard's start page, and the page errors it records."""
    from playwright.sync_api import expect, sync_playwright

    errors: list[str] = []
    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(str(profile), executable_path=CHROMIUM, headless=True,
                                                   args=FLAGS, viewport={"width": 1280, "height": height})
        try:
            page = ctx.new_page()
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(server.url + "/login")
            page.fill("#token", server.admin_token)
            page.click("#login")
            expect(page).to_have_url(server.url + "/")
            yield page, errors
        finally:
            ctx.close()
