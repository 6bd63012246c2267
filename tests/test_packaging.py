"""The installable package (what the Dockerfile installs) carries its data: every CRD, the entry point."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support import ROOT

pytestmark = pytest.mark.slow


def test_wheel_has_every_crd_and_the_console_script(tmp_path: Path) -> None:
    # build from a clean copy of the project's files: a stale egg-info in the checkout would hide omissions
    source = tmp_path / "src"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    for name in files:
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(source)],
                   check=True, capture_output=True, timeout=300)
    wheel = next(tmp_path.glob("instantstart-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    crds = {p.relative_to(ROOT).as_posix() for folder in ("sandbox/kube/crds", "services/components/crds",
                                                          "services/components/manifests")
            for p in (ROOT / folder).rglob("*") if p.is_file()}
    assert crds and crds <= names, sorted(crds - names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "instantstart = app.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
    assert {"services/operations.py", "mcp_bridge/server.py", "panels/operations.py"} <= names
    assert "services/clusters/lifecycle/on_create.sh" in names  # the pinned HyperPod lifecycle script


_HIDE_SANDBOX_EXTRA = """
import importlib.abc, sys
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('moto', 'flask'):
            raise ModuleNotFoundError(name)
        return None
sys.meta_path.insert(0, Refuse())
for cached in [m for m in sys.modules if m.split('.')[0] in ('moto', 'flask')]:
    del sys.modules[cached]
from app.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_serve_without_credentials_and_without_the_sandbox_extra_names_both_ways_forward(tmp_path: Path) -> None:
    """The production image leaves out the ``sandbox`` extra: with no AWS credentials either, ``serve`` refuses
    with one message instead of failing later inside the sandbox."""
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "AWS_CONFIG_FILE": str(empty / "config"),
           "AWS_SHARED_CREDENTIALS_FILE": str(empty / "credentials")}
    done = subprocess.run([sys.executable, "-c", _HIDE_SANDBOX_EXTRA, "serve", "--data-dir", str(tmp_path / "d"),
                           "--port", "0"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "pip install 'instantstart[sandbox]'" in done.stderr
    assert "configure AWS credentials" in done.stderr
    assert "moto" in done.stderr and "mlflow" in done.stderr
    assert not (tmp_path / "d").exists() or not any((tmp_path / "d").iterdir())
