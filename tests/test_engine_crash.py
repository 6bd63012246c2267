"""SIGKILL an engine process mid-stage; a new process resumes and never acts twice (counted)."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kinds import World
from tests.support import ROOT, wait_until

pytestmark = pytest.mark.slow


def spawn(data: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.crash_worker", str(data), *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def op_row(data: Path) -> sqlite3.Row | None:
    conn = sqlite3.connect(data / "state.db")
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute("SELECT o.status, s.phase, s.acted FROM operations o JOIN stages s "
                            "ON s.operation_id=o.id AND s.idx=0").fetchone()
    except sqlite3.OperationalError:
        return None
    finally:
        conn.close()


def kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


def finish(data: Path) -> None:
    (data / "release").touch()
    (data / "unblock").touch()
    proc = spawn(data)
    try:
        wait_until(lambda: (row := op_row(data)) is not None and row["status"] == "succeeded", 120,
                   "the resumed operation succeeding")
    finally:
        proc.terminate()
        proc.wait(10)


def test_sigkill_while_waiting_resumes_without_acting_again(tmp_path: Path) -> None:
    data = tmp_path
    (data / "unblock").touch()
    proc = spawn(data, "submit", "alpha")
    try:
        wait_until(lambda: (row := op_row(data)) is not None and row["phase"] == "waiting" and row["acted"] == 1,
                   120, "the stage acting once and waiting")
        polls = World(data / "world.json").load()["polls"]
        wait_until(lambda: World(data / "world.json").load()["polls"] >= polls + 3, 60, "three more polls")
    finally:
        kill(proc)
    assert World(data / "world.json").acts == 1
    finish(data)
    world = World(data / "world.json")
    assert world.acts == 1
    assert world.load()["things"]["alpha"] == {"ready": True, "size": 1, "label": "alpha"}


def test_sigkill_in_the_middle_of_act_observes_instead_of_acting_again(tmp_path: Path) -> None:
    data = tmp_path
    proc = spawn(data, "submit", "beta")
    try:
        # the side effect happened, the process hangs inside act(): phase is 'acting', acted still 0
        wait_until(lambda: (data / "world.json").exists() and World(data / "world.json").acts == 1, 120,
                   "the side effect")
        row = op_row(data)
        assert row is not None and row["phase"] == "acting" and row["acted"] == 0
    finally:
        kill(proc)
    finish(data)
    assert World(data / "world.json").acts == 1
