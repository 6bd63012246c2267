"""Several instances on one machine: a taken default port is replaced by a free one and recorded in the
runtime file, an explicitly chosen one fails naming its flag, and every CLI command addresses the server
that really runs (or asks which, when several do)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx2
import pytest

from app.sandbox import SANDBOX_ACCESS_KEY, sandbox_mode
from sandbox.kube import Emulator
from services.settings import Settings
from tests.support import ROOT, LiveServer, wait_until

pytestmark = pytest.mark.slow


def clean_env(home: Path, registry: Path) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("INSTANTSTART_", "AWS_", "XDG_"))}
    return {**keep, "HOME": str(home), "INSTANTSTART_RUNTIME_DIR": str(registry), "PYTHONUNBUFFERED": "1"}


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env=env)


def start(data: Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    log = open(data.parent / f"{data.name}.log", "w")  # noqa: SIM115 - the process owns it
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--data-dir", str(data), *args], cwd=ROOT,
                            env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    wait_until(lambda: (data / "runtime.json").exists() or proc.poll() is not None, timeout=90,
             message=f"serve on {data}")
    assert proc.poll() is None, (data.parent / f"{data.name}.log").read_text()
    return proc


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(2)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_two_servers_with_default_flags_run_side_by_side(tmp_path: Path) -> None:
    env = {**clean_env(tmp_path / "home", tmp_path / "registry"), "INSTANTSTART_REGION": "eu-central-1"}
    first, second = tmp_path / "first", tmp_path / "second"
    for data in (first, second):
        made = Emulator(data / "sandbox")
        made.ensure_cluster("demo")
        made.close()
    a = start(first, env)
    b = None
    try:
        b = start(second, env)
        ra, rb = (json.loads((d / "runtime.json").read_text()) for d in (first, second))
        ports = [*ra["ports"].values(), *rb["ports"].values()]
        assert len(set(ports)) == 6, (ra, rb)
        assert "is in use" in (tmp_path / "second.log").read_text(), "the second instance says what it picked"
        for r in (ra, rb):
            assert r["sandbox"] and r["mode_reason"] == "no AWS credentials are configured"
            assert httpx2.get(r["url"] + "/healthz", timeout=10).status_code == 200

        ambiguous = cli(env, "status")
        assert ambiguous.returncode == 2 and str(first) in ambiguous.stderr and str(second) in ambiguous.stderr

        info = cli(env, "sandbox", "info", "--json", "--data-dir", str(second))
        assert info.returncode == 0, info.stderr
        assert json.loads(info.stdout)["aws_endpoint_url"] == rb["aws_endpoint_url"]
        assert f"data directory {second} (as given; server running at {rb['url']}" in info.stderr

        kubeconfig = cli(env, "kubeconfig", "demo", "--data-dir", str(second))
        assert f"{rb['kube_url']}/k8s/clusters/demo" in kubeconfig.stdout
        served = (second / "kubeconfigs" / "demo.yaml").read_text()
        assert rb["kube_url"] in served and ra["kube_url"] not in served

        unauthenticated = cli(env, "sandbox", "faults", "--data-dir", str(second))  # REST to the right server
        assert unauthenticated.returncode == 1 and "401" in unauthenticated.stderr
        assert "HTTP Request" not in unauthenticated.stderr, "no httpx INFO line per CLI call"

        exports = cli(env, "sandbox", "env", "--data-dir", str(first)).stdout
        assert f"export AWS_ENDPOINT_URL={ra['aws_endpoint_url']}" in exports
        assert f"export AWS_ACCESS_KEY_ID={SANDBOX_ACCESS_KEY}" in exports
        other_shell = {k: v for k, v in env.items() if k != "INSTANTSTART_REGION"}  # the CLI learns the region
        assert "export AWS_REGION=eu-central-1" in cli(other_shell, "sandbox", "env", "--data-dir", str(first)).stdout
    finally:
        stop(a)
    assert not (first / "runtime.json").exists(), "a clean stop removes the runtime file"

    try:
        alone = cli(env, "status")  # the one server left is found without --data-dir
        assert alone.returncode == 0, alone.stderr
        assert f"data directory {second} (the running server's" in alone.stderr
    finally:
        if b is not None:
            stop(b)
    for data in (first, second):  # at least one of them was not on the default ports
        written = (data / "kubeconfigs" / "demo.yaml").read_text()
        assert cli(env, "token", "list", "--data-dir", str(data)).returncode == 0
        assert cli(env, "status", "--data-dir", str(data)).returncode == 0
        assert (data / "kubeconfigs" / "demo.yaml").read_text() == written, "read-only commands rewrite nothing"
    nothing = cli(env, "sandbox", "env")
    assert nothing.returncode == 1 and "no sandbox is running" in nothing.stderr
    bridge = cli(env, "mcp")  # never a guessed port: a bridge would send its token there
    assert bridge.returncode == 1 and "no running server found" in bridge.stderr


@pytest.mark.parametrize("flag", ["--port", "--sandbox-aws-port", "--sandbox-kube-port"])
def test_an_explicit_port_that_is_taken_fails_naming_its_flag(tmp_path: Path, flag: str) -> None:
    env = clean_env(tmp_path / "home", tmp_path / "registry")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        out = cli(env, "serve", "--data-dir", str(tmp_path / "data"), flag, str(port))
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"port {port} is already in use: choose another with {flag}" in out.stderr
    assert not (tmp_path / "data" / "state.db").exists(), "nothing is made before the ports are settled"


def test_the_mode_and_its_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("HOME", str(tmp_path))
    settings = Settings(data_dir=tmp_path / "d")
    assert sandbox_mode(settings) == (True, "no AWS credentials are configured")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", SANDBOX_ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "whatever")
    assert sandbox_mode(settings) == (True, "the configured AWS credentials are the sandbox's own "
                                            "(instantstart sandbox env)")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAIOSFODNN7EXAMPLE")
    sandboxed, reason = sandbox_mode(settings)
    assert not sandboxed and "AWS credentials were found (source: env)" in reason and "--sandbox" in reason
    forced = Settings(data_dir=tmp_path / "d", sandbox=True)
    assert sandbox_mode(forced)[0] and "sandbox: true was set" in sandbox_mode(forced)[1]


def test_no_sandbox_banner_says_why(tmp_path: Path) -> None:
    env = clean_env(tmp_path / "home", tmp_path / "registry")
    proc = start(tmp_path / "data", env, "--no-sandbox", "--port", "0")
    try:
        runtime = json.loads((tmp_path / "data" / "runtime.json").read_text())
        assert not runtime["sandbox"] and runtime["aws_endpoint_url"] is None
        assert "AWS mode (sandbox: false was set" in (tmp_path / "data.log").read_text()
        refused = cli(env, "kubeconfig", "demo")
        assert refused.returncode == 1 and "runs against AWS" in refused.stderr
    finally:
        stop(proc)


def test_seed_makes_a_ready_cluster_once_and_refuses_clearly(tmp_path: Path) -> None:
    env = {**clean_env(tmp_path / "home", tmp_path / "registry"), "INSTANTSTART_SANDBOX_SPEED": "2000"}
    proc = start(tmp_path / "data", env, "--port", "0", "--sandbox-aws-port", "0", "--sandbox-kube-port", "0")
    try:
        runtime = json.loads((tmp_path / "data" / "runtime.json").read_text())
        assert 0 not in runtime["ports"].values() and not runtime["aws_endpoint_url"].endswith(":0"), runtime
        first = cli(env, "sandbox", "seed", "--name", "team-a", "--nodes", "3")
        assert first.returncode == 0, first.stderr
        assert first.stdout.startswith("seeded team-a:") and "3 nodes Running" in first.stdout
        assert "created HyperPod cluster team-a (3 x ml.g5.8xlarge" in first.stderr
        again = cli(env, "sandbox", "seed", "--name", "team-a", "--nodes", "3")
        assert again.returncode == 0 and again.stdout.startswith("already there: team-a"), again.stderr
        assert "created" not in again.stderr, "a second seed makes nothing"
        kubeconfig = cli(env, "kubeconfig", "team-a")
        assert kubeconfig.returncode == 0 and "team-a" in kubeconfig.stdout
        assert f"127.0.0.1:{runtime['ports']['sandbox_kube_port']}/" in kubeconfig.stdout
        too_big = cli(env, "sandbox", "seed", "--name", "team-b", "--nodes", "9")
        assert too_big.returncode == 1
        assert "AWS refused CreateCluster: ResourceLimitExceeded" in too_big.stderr
    finally:
        stop(proc)


def test_test_servers_register_only_in_the_suites_private_registry(server: LiveServer) -> None:
    from app.runtime import running_servers

    assert os.environ["INSTANTSTART_RUNTIME_DIR"].startswith(tempfile.gettempdir())
    assert str(server.data_dir) in {r.data_dir for r in running_servers()}, "start_server keeps the registry"
