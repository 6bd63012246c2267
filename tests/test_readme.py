"""Every README command, in order, as a new user runs them: a fresh HOME (so no AWS credentials and the
default data directory), no INSTANTSTART_* settings, default ports, a private server registry.

Each ``bash``/``python`` block carries a marker comment on the line above it: ``readme-test: run`` (one
bash script; its exports carry on to the next block, as in one terminal), ``background`` (a server: started
and awaited through its runtime file), ``python``, or ``skip: <why>``. A block without a marker fails this
test, so a new README command cannot escape it. Without the ``aws`` CLI only the lines that start with
``aws`` are skipped, each with a message.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT, wait_until

pytestmark = pytest.mark.slow
BLOCK = re.compile(r"(?:<!-- readme-test: (?P<marker>[^>]*?) -->\n)?```(?P<lang>bash|python)\n(?P<body>.*?)```",
                   re.S)


def readme_blocks() -> list[tuple[str, str, str]]:
    """(marker, language, body) for every bash and python block of the README, in order."""
    return [(m["marker"] or "", m["lang"], m["body"]) for m in BLOCK.finditer((ROOT / "README.md").read_text())]


def test_every_block_says_how_it_is_tested() -> None:
    blocks = readme_blocks()
    assert len(blocks) >= 6
    for marker, lang, body in blocks:
        assert marker in ("run", "background", "python") or marker.startswith("skip: "), \
            f"README block without a readme-test marker (or an unknown one, {marker!r}):\n{body}"
        assert lang == "python" or marker != "python", body


def fresh_env(home: Path) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items()
            if not k.startswith(("INSTANTSTART_", "AWS_", "XDG_", "KUBECONFIG", "VIRTUAL_ENV"))}
    return {**keep, "HOME": str(home), "INSTANTSTART_RUNTIME_DIR": str(home / "run"), "PYTHONUNBUFFERED": "1"}


@pytest.mark.timeout(900)  # the whole walkthrough: a sandbox, an import, a create and a delete of `demo`
def test_readme_commands_run_in_order(tmp_path: Path) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (work / ".venv").symlink_to(sys.prefix)  # the project's virtual environment, made as the Quickstart says
    env = fresh_env(home)
    exports = tmp_path / "exports.sh"
    exports.write_text("")
    has_aws = shutil.which("aws") is not None
    if not has_aws:
        print("readme test: the aws CLI is not installed; its README lines are skipped")
    servers: list[subprocess.Popen[str]] = []
    try:
        for index, (marker, _lang, body) in enumerate(readme_blocks()):
            where = f"README block {index + 1}:\n{body}"
            if marker.startswith("skip: "):
                continue
            if marker == "background":
                log = open(tmp_path / f"server-{index}.log", "w")  # noqa: SIM115 - the process owns it
                servers.append(subprocess.Popen(["bash", "-c", body], cwd=work, env=env, stdout=log,
                                                stderr=subprocess.STDOUT, text=True, start_new_session=True))
                runtime_file = home / ".local" / "share" / "instantstart" / "runtime.json"
                wait_until(lambda f=runtime_file: f.exists() or servers[-1].poll() is not None,  # type: ignore[misc]
                         timeout=120, message=f"the server of {where}")
                assert servers[-1].poll() is None, (tmp_path / f"server-{index}.log").read_text()
                runtime = json.loads(runtime_file.read_text())
                assert runtime["sandbox"] and runtime["mode_reason"] == "no AWS credentials are configured"
                continue
            if marker == "python":
                out = subprocess.run([str(work / ".venv" / "bin" / "python"), "-c", body], cwd=work, env=env,
                                     capture_output=True, text=True, timeout=300)
            else:
                if not has_aws:  # only the lines that start with aws (and what they chain with &&)
                    body = "\n".join(f"echo {shlex.quote('readme test: skipped, no aws CLI: ' + line)} >&2"
                                     if line.startswith("aws ") else line for line in body.splitlines())
                script = f"set -euo pipefail\nsource {exports}\n{body}\nexport -p > {exports}.next\n"
                out = subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True,
                                     timeout=600)
                if out.returncode == 0:
                    (tmp_path / "exports.sh.next").replace(exports)
            assert out.returncode == 0, f"{where}\nstdout:\n{out.stdout}\nstderr:\n{out.stderr}"
            print(f"--- {where}{out.stdout}")
    finally:
        for proc in servers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
