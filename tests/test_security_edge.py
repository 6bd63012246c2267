"""Probes of the server's edge (issue 8): none may stop the server or make it buffer what it must refuse.

Each test talks to a real ``instantstart serve`` subprocess (raw sockets where a client library would hide
what the server did: answering after the headers only, closing the connection), then checks the server
still answers /healthz.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx2
import pytest
import tornado.web
from panel.io.server import ComponentResourceHandler

from app.edge import AllowlistedComponents, guard_application
from services.errors import ERROR_CODES
from tests.support import ROOT, LiveServer, free_port

pytestmark = pytest.mark.slow


def _address(server: LiveServer) -> tuple[str, int]:
    parts = urlsplit(server.url)
    return str(parts.hostname), int(parts.port or 80)


def _read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response (Content-Length delimited), read off a raw socket."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"connection closed before a response: {data!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    while len(body) < int(headers.get("content-length", "0")):
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(lines[0].split()[1]), headers, body


def _closed_by_server(sock: socket.socket) -> bool:
    sock.settimeout(30)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def _raw(server: LiveServer, head: str, body: bytes = b"") -> socket.socket:
    sock = socket.create_connection(_address(server), timeout=30)
    sock.sendall(head.encode() + b"\r\n\r\n" + body)
    return sock


def _alive(server: LiveServer) -> None:
    assert server.process.poll() is None, server.log()
    assert httpx2.get(server.url + "/healthz", timeout=10).status_code == 200


def test_component_urls_import_nothing_and_cannot_stop_the_server(server: LiveServer) -> None:
    # before the fix: venv.__main__ made the process exit with status 2, `this` printed the Zen of Python
    for module in ("venv.__main__", "unittest.__main__", "this", "antigravity"):
        r = httpx2.get(f"{server.url}/components/{module}/x/y/z", timeout=10)
        assert r.status_code == 404, (module, r.status_code)
        _alive(server)
    log = server.log()
    assert "Beautiful is better than ugly" not in log
    assert "unrecognized arguments" not in log


def test_a_base_exception_in_any_handler_is_a_500_not_an_exit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """The second line of defence, through Panel's own (not allowlisted) component handler: a module that
    raises SystemExit or KeyboardInterrupt on import answers 500 and the loop keeps serving."""
    (tmp_path / "exits_on_import.py").write_text("raise SystemExit(3)\n")
    (tmp_path / "interrupts_on_import.py").write_text("raise KeyboardInterrupt\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    class Fine(tornado.web.RequestHandler):
        def get(self) -> None:
            self.finish("fine")

    port = free_port()
    loop = asyncio.new_event_loop()
    started = threading.Event()
    stopped = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        app = tornado.web.Application([(r"/panel/components/(.*)", ComponentResourceHandler, {}),
                                       (r"/ours/components/(.*)", AllowlistedComponents, {}), (r"/fine", Fine)])
        guard_application(app)
        app.listen(port, "127.0.0.1")
        started.set()
        loop.run_forever()
        stopped.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(60)
    base = f"http://127.0.0.1:{port}"
    try:
        for module in ("exits_on_import", "interrupts_on_import", "exits_on_import"):
            assert httpx2.get(f"{base}/ours/components/{module}/x/y/z", timeout=10).status_code == 404
            assert module not in sys.modules
            r = httpx2.get(f"{base}/panel/components/{module}/x/y/z", timeout=10)
            assert r.status_code == 500
            assert httpx2.get(f"{base}/fine", timeout=10).text == "fine"
        assert not stopped.is_set()
        assert "answered 500, the server keeps running" in caplog.text
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def test_unauthenticated_bodies_are_refused_after_the_headers(server: LiveServer) -> None:
    """401 (and the connection closed) before one byte of a 90 MB body is sent, Content-Length or chunked."""
    for framing in ("Content-Length: 94371840", "Transfer-Encoding: chunked"):
        sock = _raw(server, f"POST /api/v1/backups HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                            f"Content-Type: application/json\r\n{framing}")
        with sock:
            status, _, body = _read_response(sock)
            assert status == 401, body
            assert json.loads(body)["error"]["code"] == "unauthorized"
            assert _closed_by_server(sock)
    _alive(server)


def test_oversized_bodies_get_413_with_the_envelope(server: LiveServer) -> None:
    auth = f"Authorization: Bearer {server.admin_token}\r\nContent-Type: application/json"
    # declared too large: refused before the body
    sock = _raw(server, f"POST /api/v1/backups HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}\r\nContent-Length: 94371840")
    with sock:
        status, _, body = _read_response(sock)
        assert status == 413, body
        assert json.loads(body)["error"]["code"] == "too_large"
        assert _closed_by_server(sock)
    # chunked: counted as it arrives, refused past 1 MiB
    sock = _raw(server, f"POST /api/v1/backups HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}\r\n"
                        "Transfer-Encoding: chunked")
    with sock:
        piece = b" " * 65536
        try:
            for _ in range(40):  # 2.5 MiB
                sock.sendall(b"%x\r\n" % len(piece) + piece + b"\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed while we were still sending
        status, _, body = _read_response(sock)
        assert status == 413, body
        assert json.loads(body)["error"]["code"] == "too_large"
    # under the limit, chunked, is read and parsed as usual
    payload = json.dumps({"label": "chunked"}).encode()
    sock = _raw(server, f"POST /api/v1/backups HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}\r\n"
                        "Transfer-Encoding: chunked", b"%x\r\n" % len(payload) + payload + b"\r\n0\r\n\r\n")
    with sock:
        status, _, body = _read_response(sock)
        assert status == 202, body
    _alive(server)


def _peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc/<pid>/status")


def _flood(server: LiveServer, size: int, out: list[Any]) -> None:
    sock = _raw(server, f"POST /api/v1/backups HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                        f"Content-Length: {size}")
    with sock:
        sent = 0
        piece = b"[" * (1024 * 1024)
        try:
            while sent < size:
                sock.sendall(piece)
                sent += len(piece)
        except OSError:
            pass
        try:
            out.append(_read_response(sock)[0])
        except OSError as exc:  # reset after the server closed: the answer may be lost, which is fine
            out.append(type(exc).__name__)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
def test_eight_concurrent_90_mb_posts_leave_peak_rss_within_20_mb(server: LiveServer) -> None:
    # before the fix: 359 MB -> 892 MB, every body buffered before the 401
    pid = server.process.pid
    before = _peak_rss_kib(pid)
    results: list[Any] = []
    threads = [threading.Thread(target=_flood, args=(server, 90 * 1024 * 1024, results)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    grown = _peak_rss_kib(pid) - before
    assert len(results) == 8 and all(r in (401, "ConnectionResetError", "ConnectionError") for r in results), results
    assert grown < 20 * 1024, f"peak RSS grew by {grown} KiB"
    _alive(server)


def test_integer_query_fields_are_bounded_and_empty_values_mean_not_given(server: LiveServer) -> None:
    # before the fix: 500 (OverflowError binding the parameter to SQLite)
    r = server.get("/api/v1/audit?before_id=9223372036854775808")
    assert r.status_code == 422, r.text
    assert r.json()["error"]["details"]["fields"][0]["field"] == "before_id"
    assert server.get("/api/v1/audit?before_id=9223372036854775807").status_code == 200
    for query in ("before=", "status=", "limit=", "kind=&target=&active="):
        r = server.get(f"/api/v1/operations?{query}")
        assert r.status_code == 200, (query, r.text)
    assert server.get("/api/v1/audit?before_id=&limit=").status_code == 200
    _alive(server)


@pytest.mark.parametrize("path", ["/api/v1/backups", "/api/v1/sandbox/faults"])
@pytest.mark.parametrize("body", ["[" * 100_000 + "]" * 100_000, '{"a":' * 50_000 + "1" + "}" * 50_000])
def test_deeply_nested_bodies_are_invalid_not_a_crash(server: LiveServer, path: str, body: str) -> None:
    # before the fix: 500 (RecursionError escaping the body parser)
    r = httpx2.post(server.url + path, content=body, timeout=30,
                    headers=server.headers(**{"Content-Type": "application/json"}))
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "invalid"
    _alive(server)


def test_405_comes_after_authentication_and_names_the_allowed_methods(server: LiveServer) -> None:
    assert httpx2.put(server.url + "/api/v1/whoami", timeout=10).status_code == 401
    r = httpx2.put(server.url + "/api/v1/whoami", headers=server.headers(), timeout=10)
    assert r.status_code == 405
    assert r.headers["Allow"] == "GET"
    assert r.json()["error"]["code"] == "method_not_allowed"
    for method in ("TRACE", "FOO"):  # methods Tornado does not know are refused after authentication too
        assert httpx2.request(method, server.url + "/api/v1/whoami", timeout=10).status_code == 401
        r = httpx2.request(method, server.url + "/api/v1/whoami", headers=server.headers(), timeout=10)
        assert r.status_code == 405 and r.headers["Allow"] == "GET", method
        assert httpx2.request(method, server.url + "/api/v1/nothing", timeout=10).status_code == 404
    r = httpx2.request("HEAD", server.url + "/api/v1/backups", headers=server.headers(), timeout=10)
    assert r.status_code == 405 and r.headers["Allow"] == "GET, POST"
    r = httpx2.post(server.url + "/api/v1/openapi.json", timeout=10)  # the public document: no token needed
    assert r.status_code == 405 and r.headers["Allow"] == "GET"
    assert r.json()["error"]["code"] == "method_not_allowed"


def test_api_paths_in_other_spellings_get_the_json_404(server: LiveServer) -> None:
    for path in ("//api/v1/whoami", "/API/V1/WHOAMI", "/Api", "/api/v2/whoami"):
        r = httpx2.get(server.url + path, headers=server.headers(), timeout=10)
        assert r.status_code == 404, path
        assert r.headers["Content-Type"].startswith("application/json"), path
        assert r.json()["error"]["code"] == "not_found"


def test_header_limits(server: LiveServer) -> None:
    # up to 256 KiB is served; above it 431 with the envelope; above the 1 MiB hard limit Tornado hangs up
    fine = httpx2.get(server.url + "/api/v1/whoami", headers=server.headers(**{"X-Pad": "a" * 200_000}), timeout=10)
    assert fine.status_code == 200
    r = httpx2.get(server.url + "/api/v1/whoami", headers=server.headers(**{"X-Pad": "a" * 300_000}), timeout=10)
    assert r.status_code == 431
    assert r.json()["error"]["code"] == "headers_too_large"
    sock = _raw(server, "GET /api/v1/whoami HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + "a" * 1_100_000)
    with sock:
        assert _closed_by_server(sock)
    _alive(server)


def test_the_document_describes_what_the_server_does(server: LiveServer) -> None:
    doc = server.get("/api/v1/openapi.json").json()
    codes = doc["components"]["schemas"]["ErrorBody"]["properties"]["code"]["enum"]
    assert set(codes) == set(ERROR_CODES) >= {"internal", "permanent", "http_error", "method_not_allowed"}
    for path, methods in doc["paths"].items():
        for method, op in methods.items():
            assert "default" not in op["responses"], (method, path)
            assert op["security"] == ([] if path in ("/healthz", "/readyz") else [{"bearer": []}, {"session": []}])
    assert doc["paths"]["/api/v1/backups"]["post"]["requestBody"]["required"] is False
    r = httpx2.post(server.url + "/api/v1/backups", headers=server.headers(), timeout=30)  # no body at all
    assert r.status_code == 202, r.text
    assert doc["paths"]["/api/v1/tokens"]["post"]["requestBody"]["required"] is True
    fault = doc["components"]["schemas"]["FaultInject"]
    per_kind = {v["properties"]["kind"]["const"]: v["properties"]["target"] for v in fault["oneOf"]}
    assert per_kind["node_unhealthy"]["required"] == ["cluster", "node"]
    assert per_kind["throttle"]["additionalProperties"] is False
    # and the server agrees with that model
    r = server.post("/api/v1/sandbox/faults", {"kind": "throttle", "target": {"instance_type": "ml.g5.xlarge"}})
    assert r.status_code == 422 and "service" in r.json()["error"]["message"]


def test_readme_lists_every_error_code() -> None:
    readme = (ROOT / "README.md").read_text()
    missing = [code for code in ERROR_CODES if f"`{code}`" not in readme]
    assert not missing, f"README's error-code list lacks {missing}"


def test_the_sign_in_form_takes_at_most_4_kib(server: LiveServer) -> None:
    sock = _raw(server, "POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                        "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 5000", b"t" * 5000)
    with sock:
        status, _, _ = _read_response(sock)
        assert status == 400
        assert _closed_by_server(sock)
    _alive(server)


def test_the_events_socket_answers_in_the_envelope_after_authentication(server: LiveServer) -> None:
    """Reviewer finding: POST/DELETE to /api/v1/events got Tornado's HTML 405 before authentication, and a
    GET without an upgrade a plain-text 400."""
    url = server.url + "/api/v1/events"
    anonymous = httpx2.post(url, timeout=10)
    assert anonymous.status_code == 401 and anonymous.json()["error"]["code"] == "unauthorized"
    for method in ("POST", "DELETE", "FOO"):
        r = httpx2.request(method, url, headers=server.headers(), timeout=10)
        assert r.status_code == 405 and r.headers["Allow"] == "GET", (method, r.text)
        assert r.json()["error"]["code"] == "method_not_allowed"
    plain = httpx2.get(url, headers=server.headers(), timeout=10)
    assert plain.status_code == 422 and "Upgrade: websocket" in plain.json()["error"]["message"]
