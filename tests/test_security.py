"""Ambient credentials (the dashboard's cookie, dev mode's none) cannot be used by another site; sign-in
refuses open redirects and insecure contexts; revoking a token closes its WebSockets."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
import websocket

from mcp_bridge.server import BridgeError, run_bridge
from mcp_bridge.tools import ToolSpec, to_http
from tests.support import ROOT, LiveServer, start_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = start_server(tmp_path_factory.mktemp("dev") / "data", "--dev-no-auth")
    yield live
    live.stop()


def code(r: httpx2.Response) -> str:
    return str(r.json()["error"]["code"])


def test_dev_mode_serves_only_same_origin_json_on_loopback_names(dev: LiveServer) -> None:
    host = dev.url.removeprefix("http://")
    ok = httpx2.post(dev.url + "/api/v1/backups", json={"label": "dev"})
    assert ok.status_code == 202
    rebound = httpx2.post(dev.url + "/api/v1/tokens", json={"name": "x", "role": "admin"},
                          headers={"Host": "rebind.evil.example"})
    assert rebound.status_code == 403 and code(rebound) == "forbidden"
    assert httpx2.get(dev.url + "/api/v1/whoami", headers={"Host": "rebind.evil.example"}).status_code == 403
    cross = httpx2.post(dev.url + "/api/v1/tokens", json={"name": "x", "role": "admin"},
                        headers={"Origin": "http://evil.example"})
    assert cross.status_code == 403
    simple = httpx2.post(dev.url + "/api/v1/tokens", content=b'{"name": "x", "role": "admin"}',
                         headers={"Content-Type": "text/plain", "Origin": f"http://{host}"})
    assert simple.status_code == 422 and "application/json" in simple.json()["error"]["message"]
    ws_url = dev.url.replace("http://", "ws://") + "/api/v1/events"
    with pytest.raises(websocket.WebSocketBadStatusException) as refused:
        websocket.create_connection(ws_url, origin="http://evil.example", timeout=5)
    assert refused.value.status_code == 403
    assert json.loads(refused.value.resp_body)["error"]["code"] == "forbidden"
    same = websocket.create_connection(ws_url, origin=f"http://{host}", timeout=5)
    same.close()


def login(server: LiveServer, token: str, next_url: str = "/", host: str | None = None) -> httpx2.Response:
    client = httpx2.Client(base_url=server.url, follow_redirects=False, timeout=10,
                           headers={"Host": host} if host else {})
    xsrf = re.search(r'name="_xsrf" value="([^"]+)"', client.get("/login").text)
    assert xsrf
    return client.post(f"/login?next={next_url}", data={"token": token, "_xsrf": xsrf.group(1)})


def test_sign_in_refuses_open_redirects_and_plain_http_off_loopback(server: LiveServer) -> None:
    assert login(server, server.admin_token, "/%2F%2Fevil").status_code == 302
    r = login(server, server.admin_token, "//evil.example/phish")
    assert r.status_code == 302 and r.headers["Location"] == "/"
    r = login(server, server.admin_token, "http://evil.example/")
    assert r.headers["Location"] == "/"
    lan = login(server, server.admin_token, host="10.0.0.5")
    assert lan.status_code == 403 and "HTTPS" in lan.text and "instantstart_session" not in lan.headers.get(
        "set-cookie", "")
    good = login(server, server.admin_token)
    cookie = good.headers["set-cookie"]
    assert "Secure" in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    expired = httpx2.post(server.url + "/login", data={"token": server.admin_token})
    assert expired.status_code == 403 and "expired" in expired.text


def test_cookie_sessions_refuse_cross_origin_and_non_json_changes(server: LiveServer) -> None:
    r = login(server, server.admin_token)
    session = re.search(r"instantstart_session=([^;]+)", r.headers["set-cookie"])
    assert session
    jar = httpx2.Client(base_url=server.url, timeout=10)
    form = jar.get("/login")
    xsrf_cookie = form.cookies["_xsrf"]
    token_value = re.search(r'name="_xsrf" value="([^"]+)"', form.text)
    assert token_value
    headers = {"Cookie": f"instantstart_session={session.group(1)}; _xsrf={xsrf_cookie}",
               "X-XSRFToken": token_value.group(1)}
    host = server.url.removeprefix("http://")
    cross = httpx2.post(server.url + "/api/v1/backups", json={"label": "x"},
                        headers={**headers, "Origin": "http://evil.example"})
    assert cross.status_code == 403
    plain = httpx2.post(server.url + "/api/v1/backups", content=b'{"label": "x"}',
                        headers={**headers, "Content-Type": "text/plain"})
    assert plain.status_code == 422
    bound = re.search(r"instantstart_xsrf=([^;]+)", r.headers["set-cookie"])  # the session's own XSRF token
    assert bound
    same = httpx2.post(server.url + "/api/v1/backups", json={"label": "x"},
                       headers={**headers, "X-XSRFToken": bound.group(1), "Origin": f"http://{host}"})
    assert same.status_code == 202, same.text


def test_revoking_a_token_closes_its_websocket(server: LiveServer) -> None:
    created = server.post("/api/v1/tokens", {"name": "ws-watcher", "role": "viewer"}).json()
    ws = websocket.create_connection(server.url.replace("http://", "ws://") + "/api/v1/events",
                                     header=[f"Authorization: Bearer {created['token']}"], timeout=10)
    try:
        assert httpx2.delete(f"{server.url}/api/v1/tokens/{created['id']}", headers=server.headers()).status_code == 200
        with pytest.raises(websocket.WebSocketConnectionClosedException):
            while True:  # events may arrive first; the close follows the revocation
                ws.recv()
    finally:
        ws.close()


def test_first_start_makes_an_admin_token_even_when_the_name_is_taken(tmp_path: Path) -> None:
    made = subprocess.run([sys.executable, "-m", "app.cli", "token", "create", "--role", "viewer", "--name", "admin",
                           "--data-dir", str(tmp_path / "data")], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    live = start_server(tmp_path / "data")
    try:
        assert live.admin_token, live.log()
        who = live.get("/api/v1/whoami").json()
        assert who["role"] == "admin" and who["name"].startswith("admin-")
    finally:
        live.stop()


def test_bridge_quotes_path_arguments_and_stays_on_loopback() -> None:
    spec = ToolSpec(name="operations_cancel", title="", description="", method="POST",
                    path="/api/v1/operations/{id}/cancel", role="operator", input_schema={}, read_only=False,
                    destructive=False, idempotent=False, path_params=("id",))
    for hostile in ("op-1#", "op-1?x=1", "a/b", "..", "op%2F"):
        with pytest.raises(ValueError):
            to_http(spec, {"id": hostile})
    assert to_http(spec, {"id": "op-1 x"}).path == "/api/v1/operations/op-1%20x/cancel"
    with pytest.raises(BridgeError):
        run_bridge("http://127.0.0.1:1", "ist_x_y", transport="http", host="0.0.0.0")


def test_revoking_with_the_cli_closes_websockets_of_the_running_server(server: LiveServer) -> None:
    created = server.post("/api/v1/tokens", {"name": "cli-revoked", "role": "viewer"}).json()
    ws = websocket.create_connection(server.url.replace("http://", "ws://") + "/api/v1/events",
                                     header=[f"Authorization: Bearer {created['token']}"], timeout=20)
    try:
        out = subprocess.run([sys.executable, "-m", "app.cli", "token", "revoke", created["id"], "--data-dir",
                              str(server.data_dir)], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        with pytest.raises(websocket.WebSocketConnectionClosedException):
            while True:
                ws.recv()  # closed by the periodic re-check (another process revoked it)
    finally:
        ws.close()


def test_loopback_ipv6_host_and_backslash_redirects(dev: LiveServer) -> None:
    from app.server import safe_next

    port = dev.url.rsplit(":", 1)[1]
    assert httpx2.get(dev.url + "/api/v1/whoami", headers={"Host": f"[::1]:{port}"}).status_code == 200
    assert safe_next("/\\evil.example") == "/" and safe_next("/ops") == "/ops"


def test_sign_in_behind_a_tls_proxy_when_told_to_trust_it(tmp_path: Path) -> None:
    live = start_server(tmp_path / "data", env={"INSTANTSTART_TRUST_PROXY_HEADERS": "true"})
    try:
        client = httpx2.Client(base_url=live.url, follow_redirects=False, timeout=10,
                               headers={"Host": "is.example.com", "X-Forwarded-Proto": "https"})
        xsrf = re.search(r'name="_xsrf" value="([^"]+)"', client.get("/login").text)
        assert xsrf
        r = client.post("/login", data={"token": live.admin_token, "_xsrf": xsrf.group(1)})
        assert r.status_code == 302 and "Secure" in r.headers["set-cookie"]
    finally:
        live.stop()
