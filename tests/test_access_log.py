"""The server's access log policy (app/edge.py ``use_access_log``), seen from outside: a quick successful read
is counted in ``GET /metrics`` and not written to the log; a refused sign-in and a change are written."""

from __future__ import annotations

import re

import httpx2

from tests.support import LiveServer, wait_until


def _answered(server: LiveServer, token: str, method: str, code: int) -> float:
    for line in server.get("/metrics", token).text.splitlines():
        name, _, value = line.rpartition(" ")
        if name.startswith("instantstart_http_requests_total{") and f'method="{method}"' in name and \
                f'code="{code}"' in name:
            return float(value)
    return 0.0


def test_quick_reads_are_counted_not_logged_while_refusals_and_changes_are_logged(server: LiveServer) -> None:
    viewer = server.make_token("viewer")
    before = _answered(server, viewer, "GET", 200)
    for _ in range(3):  # a query no other test sends, so its log line (if any) is this test's
        assert server.get("/api/v1/operations?limit=93", viewer).status_code == 200
    refused = httpx2.get(server.url + "/api/v1/operations?limit=94", timeout=60,
                         headers={"Authorization": "Bearer ist_00000000_not-a-token-of-this-server"})
    assert refused.status_code == 401, refused.text
    assert server.post("/api/v1/tokens", {"name": "access-log-change", "role": "viewer"}).status_code == 201

    # one logger writes these lines in order: once the later ones are in, an earlier one would be too
    wait_until(lambda: "GET /api/v1/operations?limit=94" in server.log() and "POST /api/v1/tokens" in server.log(),
               30, "the refused sign-in and the change in the access log")
    log = server.log()
    assert re.search(r"WARNING tornado\.access: 401 GET /api/v1/operations\?limit=94 ", log), log[-2000:]
    assert re.search(r"INFO tornado\.access: 201 POST /api/v1/tokens ", log), log[-2000:]
    assert "limit=93" not in log, "a quick 200 read was logged line by line"
    assert _answered(server, viewer, "GET", 200) >= before + 3, "the quick reads were not counted"
    assert _answered(server, viewer, "GET", 401) >= 1 and _answered(server, viewer, "POST", 201) >= 1
