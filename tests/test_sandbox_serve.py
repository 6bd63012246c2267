"""The Kubernetes emulator inside `instantstart serve`: kubeconfig per cluster, kubectl through the
product's own port, state that survives a restart."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox.kube import Emulator
from tests.support import ROOT, free_port, start_server

pytestmark = pytest.mark.slow
SANDBOX = {"INSTANTSTART_SANDBOX": "true"}


def sandbox_env() -> dict[str, str]:
    return {**SANDBOX, "INSTANTSTART_SANDBOX_KUBE_PORT": str(free_port())}


def kubectl(kubeconfig: Path, cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert shutil.which("kubectl"), "kubectl must be on PATH for the sandbox conformance tests"
    return subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), "--cache-dir", str(cache), *args],
                          capture_output=True, text=True, timeout=60)


def test_kubeconfig_kubectl_and_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    seed = Emulator(data / "sandbox")
    seed.ensure_cluster("demo")
    seed.close()

    env = sandbox_env()
    live = start_server(data, env=env)
    try:
        out = subprocess.run([sys.executable, "-m", "app.cli", "kubeconfig", "demo", "--data-dir", str(data),
                              "-o", str(tmp_path / "kc.yaml")], cwd=ROOT, capture_output=True,
                             text=True, timeout=60, env={**os.environ, **env})
        assert out.returncode == 0, out.stderr
        assert (tmp_path / "kc.yaml").stat().st_mode & 0o777 == 0o600
        busy = subprocess.run([sys.executable, "-m", "app.cli", "serve", "--data-dir", str(tmp_path / "other"),
                               "--port", "0"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                              env={**os.environ, **env})
        assert busy.returncode == 2 and "--sandbox-kube-port" in busy.stderr, "a chosen port that is taken fails"
        made = kubectl(tmp_path / "kc.yaml", tmp_path / "cache", "create", "configmap", "kept",
                       "--from-literal=a=1")
        assert made.returncode == 0, made.stderr
        assert live.get("/api/v1/status").json()["clusters"] == [], "seeded, not imported: not ours"
        missing = subprocess.run([sys.executable, "-m", "app.cli", "kubeconfig", "nope", "--data-dir", str(data)],
                                 cwd=ROOT, capture_output=True, text=True, timeout=60,
                                 env={**os.environ, **env})
        assert missing.returncode == 2 and "known: demo" in missing.stderr
    finally:
        live.stop()

    env = sandbox_env()  # another port: the kubeconfig follows the configuration
    again = start_server(data, env=env)
    try:
        out = subprocess.run([sys.executable, "-m", "app.cli", "kubeconfig", "demo", "--data-dir", str(data)],
                             cwd=ROOT, capture_output=True, text=True, timeout=60, env={**os.environ, **env})
        (tmp_path / "kc2.yaml").write_text(out.stdout)
        got = kubectl(tmp_path / "kc2.yaml", tmp_path / "cache", "get", "configmap", "kept",
                      "-o", "jsonpath={.data.a}")
        assert got.returncode == 0 and got.stdout == "1", got.stderr
        wrong = (tmp_path / "kc2.yaml").read_text().replace("token: ", "token: x")
        (tmp_path / "bad.yaml").write_text(wrong)
        assert kubectl(tmp_path / "bad.yaml", tmp_path / "cache", "get", "ns").returncode != 0
    finally:
        again.stop()
