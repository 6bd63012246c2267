"""The CLI as a user runs it: serve start-up and restart, tokens, status, refusals."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx2
import pytest

from tests.create_support import operation_end
from tests.support import ROOT, TOKEN_RE, LiveServer, start_server

pytestmark = pytest.mark.slow


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_serve_prints_token_once_refuses_a_second_server_and_keeps_state(tmp_path: Path) -> None:
    live = start_server(tmp_path / "data")  # time to /healthz is measured in bench/startup.py
    try:
        assert live.admin_token, live.log()
        op = live.post("/api/v1/backups", {"label": "keep"}).json()["operation"]
        # ended before the stop: one still running would be resumed by the restart and read mid-way below
        assert operation_end(live, op["id"], 120)["status"] == "succeeded"
        # a second server on the same data dir is refused while the first runs
        port_busy = cli("serve", "--data-dir", str(tmp_path / "data"), "--port", "0", timeout=60)
        assert port_busy.returncode != 0 and "another instantstart process" in port_busy.stderr
        assert "serving on" not in port_busy.stdout, "the lock comes first, before the data is touched"
    finally:
        live.stop()
    again = start_server(tmp_path / "data")
    try:
        assert TOKEN_RE.search(again.log()) is None, "the admin token is printed on the first start only"
        r = httpx2.get(f"{again.url}/api/v1/operations/{op['id']}", headers=live.headers())
        assert r.status_code == 200 and r.json()["status"] == "succeeded"
    finally:
        again.stop()


def test_token_create_prints_the_token_last_and_it_works(server: LiveServer) -> None:
    out = cli("token", "create", "--role", "viewer", "--name", "cli-made", "--data-dir", str(server.data_dir))
    assert out.returncode == 0, out.stderr
    token = out.stdout.strip().splitlines()[-1]
    assert TOKEN_RE.fullmatch(token)
    assert server.get("/api/v1/whoami", token=token).json() == {
        "name": "cli-made", "role": "viewer", "face": "api", "token_id": token.split("_")[1],
        "allowed_roles": ["viewer"]}
    listed = cli("token", "list", "--data-dir", str(server.data_dir)).stdout
    assert "cli-made" in listed and token not in listed
    bad = cli("token", "create", "--role", "root", "--data-dir", str(server.data_dir))
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


def test_status_text_and_json(server: LiveServer) -> None:
    made = server.post("/api/v1/backups", {"label": "status"})
    assert made.status_code == 202, made.text
    # ended first: a running (or waiting) operation is counted under neither status asserted below
    assert operation_end(server, made.json()["operation"]["id"], 120)["status"] == "succeeded"
    text = cli("status", "--data-dir", str(server.data_dir))
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith("instantstart ") and "operations:" in text.stdout
    as_json = json.loads(cli("status", "--json", "--data-dir", str(server.data_dir)).stdout)
    assert as_json["operations"].get("succeeded", 0) >= 1, as_json
    remote = cli("status", "--json", "--url", server.url, "--token", server.admin_token)
    assert json.loads(remote.stdout)["version"] == as_json["version"]


def test_dev_no_auth_refuses_a_public_bind(tmp_path: Path) -> None:
    out = cli("serve", "--dev-no-auth", "--host", "0.0.0.0", "--data-dir", str(tmp_path))
    assert out.returncode == 2 and "only binds loopback" in out.stderr


def test_dev_no_auth_on_loopback_serves_without_tokens(tmp_path: Path) -> None:
    live = start_server(tmp_path / "data", "--dev-no-auth")
    try:
        assert httpx2.get(live.url + "/api/v1/whoami").json()["name"] == "dev"
    finally:
        live.stop()
