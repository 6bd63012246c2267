"""The cluster create/delete faces against a real server in sandbox mode: the CLI's ``kube-token`` exec
plugin that kubectl runs, REST (dry-run plan, prechecks, create, delete, kubeconfig) and the CLI over it.

A cluster made by ``sandbox seed`` (as a user's own would be) stands for one that exists; the sandbox
emulator accepts an EKS token only when it is signed with this installation's sandbox key and its identity
has an access entry, exactly as EKS does.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.sandbox_support import SeededServer, seeded_server
from tests.support import ROOT, clean_env

pytestmark = pytest.mark.slow

KUBECTL = shutil.which("kubectl")
EKS = "faces-eks"


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeededServer]:
    with seeded_server(tmp_path_factory.mktemp("faces"), EKS, nodes=1) as server:
        yield server


def cli(server: SeededServer, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=clean_env(INSTANTSTART_URL=server.live.url,
                                                     INSTANTSTART_TOKEN=server.live.admin_token, **(env or {})))


def exec_kubeconfig(sandbox_config: str, data_dir: Path) -> dict[str, Any]:
    """The sandbox cluster's kubeconfig with its embedded token replaced by the ``kube-token`` exec plugin."""
    config = yaml.safe_load(sandbox_config)
    config["users"] = [{"name": "exec", "user": {"exec": {
        "apiVersion": "client.authentication.k8s.io/v1beta1", "command": sys.executable,
        "args": ["-m", "app.cli", "kube-token", "--cluster-name", EKS, "--data-dir", str(data_dir)],
        "interactiveMode": "Never"}}}]
    for context in config["contexts"]:
        context["context"]["user"] = "exec"
    return dict(config)


def test_kube_token_prints_an_exec_credential_the_cluster_accepts(seeded: SeededServer, tmp_path: Path) -> None:
    data_dir = seeded.live.data_dir
    minted = cli(seeded, "kube-token", "--cluster-name", EKS, "--data-dir", str(data_dir))
    assert minted.returncode == 0, minted.stderr
    credential = json.loads(minted.stdout)
    assert credential["kind"] == "ExecCredential"
    assert credential["apiVersion"] == "client.authentication.k8s.io/v1beta1"
    assert credential["status"]["token"].startswith("k8s-aws-v1.") and credential["status"]["expirationTimestamp"]
    assert minted.stderr == "", "stderr is shown by kubectl on every call"

    if KUBECTL is None:
        pytest.skip("kubectl is not installed")
    sandbox_config = cli(seeded, "kubeconfig", EKS, "--data-dir", str(data_dir))
    assert sandbox_config.returncode == 0, sandbox_config.stderr
    path = tmp_path / "exec.yaml"
    path.write_text(yaml.safe_dump(exec_kubeconfig(sandbox_config.stdout, data_dir)))
    nodes = subprocess.run([KUBECTL, "--kubeconfig", str(path), "get", "nodes", "-o", "name"], capture_output=True,
                           text=True, timeout=60, env=clean_env())
    assert nodes.returncode == 0, nodes.stderr
    assert len(nodes.stdout.split()) == 1 and nodes.stdout.startswith("node/"), nodes.stdout

    # a token for another cluster is refused by this one: the signature covers the cluster's name
    other = exec_kubeconfig(sandbox_config.stdout, data_dir)
    other["users"][0]["user"]["exec"]["args"][4] = "someone-else"
    path.write_text(yaml.safe_dump(other))
    refused = subprocess.run([KUBECTL, "--kubeconfig", str(path), "get", "nodes"], capture_output=True, text=True,
                             timeout=60, env=clean_env())
    assert refused.returncode != 0 and "Unauthorized" in refused.stderr, (refused.stdout, refused.stderr)


def test_kube_token_refuses_a_data_dir_with_no_sandbox_running(seeded: SeededServer, tmp_path: Path) -> None:
    refused = cli(seeded, "kube-token", "--cluster-name", EKS, "--data-dir", str(tmp_path / "nothing-here"),
                  env={"INSTANTSTART_SANDBOX": "true"})
    assert refused.returncode == 1 and "no sandbox is running on" in refused.stderr, refused.stderr
    assert refused.stdout == ""
