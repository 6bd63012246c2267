"""The sandbox's MLflow tracking server: the real ``mlflow server`` (the full package, the ``sandbox`` extra).

It stands behind the simulated SageMaker managed MLflow, so the product's MLflow client, the
``sagemaker-mlflow`` plugin and the simulated workloads all talk to a real tracking server. It is started
lazily, on the first call of :meth:`MlflowServer.url` (a fresh SQLite store takes about 20 s to migrate; one
with its database already made about 6 s: ``ecosystem-findings.md``), on a free loopback port, with
``MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false`` (without it the server starts a job runner and seven
``huey_consumer`` processes). Its data lives under the sandbox's data directory, so runs survive a restart.

One server per test session: when ``INSTANTSTART_SANDBOX_MLFLOW_URL`` names a running server (a test
session's fixture starts one and exports it), every sandbox of that session uses it instead of starting its
own. The server runs in its own process group, so :meth:`MlflowServer.stop` ends its worker too.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

_log = logging.getLogger("sandbox.mlflow")

SHARED_URL_ENV = "INSTANTSTART_SANDBOX_MLFLOW_URL"
START_TIMEOUT = 180.0  # seconds; a fresh store on a busy 2-core machine took 28 s in the findings


class MlflowUnavailable(RuntimeError):
    """The tracking server could not be started (the ``sandbox`` extra missing, or it did not come up)."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


class MlflowServer:
    """A lazily started ``mlflow server`` with a SQLite store under ``data_dir``."""

    def __init__(self, data_dir: Path) -> None:
        self._dir = data_dir
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._url: str | None = None

    def url(self) -> str:
        """The server's base URL (``http://127.0.0.1:<port>``), starting it on first use."""
        with self._lock:
            if self._url is not None and (self._proc is None or self._proc.poll() is None):
                return self._url
            shared = os.environ.get(SHARED_URL_ENV)
            if shared:
                self._url = shared.rstrip("/")
                return self._url
            self._url = self._start()
            return self._url

    def _start(self) -> str:
        if importlib.util.find_spec("flask") is None:  # what mlflow-skinny lacks to serve
            raise MlflowUnavailable("the sandbox's MLflow tracking server needs the full mlflow package: "
                                    "pip install 'instantstart[sandbox]'")
        self._dir.mkdir(parents=True, exist_ok=True)
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        env.pop(SHARED_URL_ENV, None)
        log = (self._dir / "server.log").open("ab")
        cmd = [sys.executable, "-m", "mlflow", "server",
               "--backend-store-uri", f"sqlite:///{self._dir / 'mlflow.db'}",
               "--default-artifact-root", str(self._dir / "artifacts"),
               "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
        self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                                      start_new_session=True)
        log.close()
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise MlflowUnavailable(f"mlflow server exited with {self._proc.returncode}: "
                                        f"see {self._dir / 'server.log'}")
            if healthy(url):
                _log.info("MLflow tracking server on %s (store %s)", url, self._dir)
                return url
            time.sleep(0.25)  # polling a child process's health endpoint: nothing to wait on instead
        self.stop()
        raise MlflowUnavailable(f"mlflow server did not answer /health within {START_TIMEOUT:.0f} s")

    def stop(self) -> None:
        with self._lock:
            proc, self._proc, self._url = self._proc, None, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)
        except ProcessLookupError:
            pass
