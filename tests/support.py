"""Test helpers: a real `instantstart serve` subprocess on a free loopback port, HTTP shortcuts, and
:func:`wait_until`, the one way tests wait for something to happen (never a bare sleep)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import httpx2

if TYPE_CHECKING:
    from panels.live import LiveRefresh

ROOT = Path(__file__).resolve().parents[1]
TOKEN_RE = re.compile(r"\b(ist_[0-9a-f]{8}_[A-Za-z0-9_-]+)")
# The sandbox-mode switch and the AWS credential sources a subprocess server must not inherit: tests say
# which mode they want instead of depending on what this machine has configured.
AWS_ENV_PREFIXES = ("AWS_", "INSTANTSTART_")
# kept from this process: the suite's private server registry, and the session's shared MLflow tracking server
# (the ``mlflow_url`` fixture), which every sandbox a test starts afterwards uses instead of starting its own
KEPT_ENV = ("INSTANTSTART_RUNTIME_DIR", "INSTANTSTART_SANDBOX_MLFLOW_URL")
T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float = 30, message: str = "the condition",
               interval: float = 0.05) -> T:
    """Poll ``predicate`` until it returns a truthy value (returned), failing after ``timeout`` seconds with
    ``message``; exceptions from the predicate count as "not yet" and the last one is reported."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # "not yet"; reported if it never succeeds
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"{message} did not happen within {timeout}s"
                                 + (f" (last error: {last!r})" if last is not None else ""))
        time.sleep(interval)


def silence(*subscriptions: LiveRefresh, timeout: float = 60) -> None:
    """End a pane's live subscriptions and wait for the delivery running now (a pane made with no loop re-reads
    on the bus's delivery thread): from here on no background event (a node heartbeat, an informer resync, an
    operation's event) re-reads the pane, so what the test asserts next is what it did itself. A pane made on a
    loop has its spawned reads to await as well (``quiet`` in tests/test_panes.py)."""
    for live in subscriptions:
        live.close()
        live._unsubscribe.join(timeout)  # closed: the delivery thread ends once its callback has returned


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without AWS credentials/endpoints and InstantStart settings, plus ``extra``.
    ``KEPT_ENV`` stays: the private server registry the suite set up (``INSTANTSTART_RUNTIME_DIR``, conftest), so
    test servers never register in the user's own, and the session's MLflow server."""
    kept = {k: v for k, v in os.environ.items()
            if not k.startswith(AWS_ENV_PREFIXES) or k in KEPT_ENV}
    return {**kept, **extra}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LiveServer:
    url: str
    data_dir: Path
    admin_token: str
    process: subprocess.Popen[str]
    log_path: Path

    def headers(self, token: str | None = None, **extra: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token or self.admin_token}", **extra}

    def get(self, path: str, token: str | None = None, **kw: Any) -> httpx2.Response:
        return httpx2.get(self.url + path, headers=self.headers(token), timeout=130, **kw)

    def post(self, path: str, body: Any = None, token: str | None = None, headers: dict[str, str] | None = None,
             **kw: Any) -> httpx2.Response:
        return httpx2.post(self.url + path, json=body if body is not None else {},
                           headers={**self.headers(token), **(headers or {})}, timeout=30, **kw)

    def make_token(self, role: str, name: str | None = None) -> str:
        r = self.post("/api/v1/tokens", {"name": name or f"{role}-{time.monotonic_ns()}", "role": role})
        assert r.status_code == 201, r.text
        return str(r.json()["token"])

    def log(self) -> str:
        return self.log_path.read_text()

    def no_backup_running(self) -> None:
        """A backup requested while one runs joins it: tests that need their own start from none running."""
        wait_until(lambda: self.get("/api/v1/operations?kind=backup.create&active=true").json() == [], 60,
                   "earlier backups to finish")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def start_server(data_dir: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 60) -> LiveServer:
    """``instantstart serve`` in sandbox mode (explicitly, whatever credentials this machine has: the
    server gets no AWS_* or inherited INSTANTSTART_* variables) on free loopback ports; ``env`` adds to it."""
    port = free_port()
    log_path = data_dir.parent / f"serve-{port}.log"
    data_dir.mkdir(parents=True, exist_ok=True)
    handle = open(log_path, "w")  # noqa: SIM115 - the process owns it for its lifetime
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--data-dir", str(data_dir), "--port", str(port), *args],
        cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT, text=True,
        env=clean_env(**{"PYTHONUNBUFFERED": "1", "INSTANTSTART_SANDBOX": "true",
                         "INSTANTSTART_SANDBOX_KUBE_PORT": str(free_port()),
                         "INSTANTSTART_SANDBOX_AWS_PORT": str(free_port()), **(env or {})}),
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log_path.read_text()}")
        try:
            if httpx2.get(url + "/healthz", timeout=1).status_code == 200:
                break
        except httpx2.HTTPError:
            pass
        time.sleep(0.1)
    else:
        proc.kill()
        raise RuntimeError(f"server did not answer /healthz in {timeout}s:\n{log_path.read_text()}")
    match = TOKEN_RE.search(log_path.read_text())
    return LiveServer(url, data_dir, match.group(1) if match else "", proc, log_path)


def until_terminated(stop_services: Callable[[], None]) -> None:
    """A crash-test worker's last act: run until SIGTERM (a SIGKILL never gets here), then stop cleanly."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    stop_services()
