"""Fixtures: one emulator on a free loopback port for the whole session, a fresh cluster per test.

Clusters are cheap (a dict and four namespaces), so each test gets its own under a unique name and
shares the one HTTP server; kubectl runs with a per-test kubeconfig and ``--cache-dir``.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client, config

from sandbox.kube import BackgroundServer, Emulator

_counter = itertools.count()


@dataclass
class KubeServer:
    emulator: Emulator
    server: BackgroundServer

    @property
    def base_url(self) -> str:
        return self.server.base_url


@pytest.fixture(scope="session")
def kube_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeServer]:
    emulator = Emulator(tmp_path_factory.mktemp("kube-data"), debounce=0.05)
    server = BackgroundServer(emulator).start()
    yield KubeServer(emulator, server)
    server.stop()
    emulator.close()


@pytest.fixture
def cluster_name(kube_server: KubeServer, request: pytest.FixtureRequest) -> Iterator[str]:
    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-") + f"-{next(_counter)}"
    kube_server.emulator.ensure_cluster(name)
    yield name
    kube_server.emulator.delete_cluster(name)


@pytest.fixture
def kubeconfig_path(kube_server: KubeServer, cluster_name: str, tmp_path: Path) -> Path:
    return kube_server.emulator.write_kubeconfig(cluster_name, kube_server.base_url, tmp_path / "kubeconfig")


@pytest.fixture
def api(kubeconfig_path: Path) -> Iterator[client.ApiClient]:
    api_client = config.new_client_from_config(str(kubeconfig_path))
    yield api_client
    api_client.close()


Kubectl = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="session")
def kubectl_binary() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.fail("kubectl is not on PATH: the emulator's kubectl conformance tests need it (install kubectl; "
                    "these tests must not be skipped)")
    return path


@pytest.fixture
def kubectl(kubectl_binary: str, kubeconfig_path: Path, tmp_path: Path) -> Kubectl:
    """Run kubectl against this test's cluster; fails the test on a non-zero exit unless ``check=False``."""
    cache = tmp_path / "kubectl-cache"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBE")}
    env["HOME"] = str(tmp_path)

    def run(*args: str, stdin: str | None = None, check: bool = True,
            timeout: float = 30) -> subprocess.CompletedProcess[str]:
        cmd = [kubectl_binary, f"--kubeconfig={kubeconfig_path}", f"--cache-dir={cache}", *args]
        proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout, env=env)
        if check and proc.returncode != 0:
            pytest.fail(f"kubectl {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
        return proc

    return run
