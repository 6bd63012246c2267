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
