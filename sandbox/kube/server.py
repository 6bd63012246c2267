"""Standalone hosting of the emulator: a blocking :func:`serve` for ``python -m sandbox.kube`` and a
:class:`BackgroundServer` that runs it on its own event loop thread (tests, benchmarks, notebooks).

The product server does not use this module: it mounts :meth:`Emulator.url_patterns` in its own
Tornado application.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import ssl
import threading
from pathlib import Path

from tornado.httpserver import HTTPServer
from tornado.web import Application

from .emulator import Emulator


def make_app(emulator: Emulator) -> Application:
    return Application(emulator.url_patterns())


def _listen(emulator: Emulator, host: str, port: int,
            ssl_context: ssl.SSLContext | None = None) -> tuple[HTTPServer, int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(256)
    sock.setblocking(False)
    server = HTTPServer(make_app(emulator), idle_connection_timeout=3600, ssl_options=ssl_context)
    server.add_sockets([sock])
    return server, sock.getsockname()[1]


class BackgroundServer:
    """Serve an emulator on ``host:port`` (0 picks a free port) from a daemon thread, over TLS when given a
    server ``ssl_context`` (kubectl sends bearer tokens only over TLS)."""

    def __init__(self, emulator: Emulator, host: str = "127.0.0.1", port: int = 0,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.emulator = emulator
        self.host = host
        self._ssl = ssl_context
        self.port = 0
        self._requested_port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: HTTPServer | None = None
        self._ready = threading.Event()
        self._error: OSError | None = None
        self._thread = threading.Thread(target=self._run, name="kube-emulator", daemon=True)

    @property
    def base_url(self) -> str:
        return f"{'https' if self._ssl else 'http'}://{self.host}:{self.port}"

    def start(self) -> BackgroundServer:
        """Start serving; raises what binding raised (e.g. the port is taken) instead of failing silently."""
        self._thread.start()
        if not self._ready.wait(10):
            raise TimeoutError(f"emulator server on {self.host}:{self._requested_port} did not start")
        if self._error is not None:
            raise self._error
        return self

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop

        async def start() -> None:
            self._server, self.port = _listen(self.emulator, self.host, self._requested_port, self._ssl)

        try:
            loop.run_until_complete(start())
        except OSError as exc:
            self._error = exc
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        loop.run_forever()
        loop.close()

    def stop(self) -> None:
        loop, server = self._loop, self._server
        if loop is None or server is None:
            return

        async def shutdown() -> None:
            server.stop()
            await server.close_all_connections()

        fut = asyncio.run_coroutine_threadsafe(shutdown(), loop)
        with contextlib.suppress(TimeoutError):
            fut.result(5)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(5)


def serve(port: int, data_dir: Path | None, clusters: list[str], host: str = "127.0.0.1",
          token: str | None = None) -> None:
    """Run the emulator in the foreground until SIGINT/SIGTERM; state is flushed on exit."""
    emulator = Emulator(data_dir, token=token)
    for name in clusters:
        emulator.ensure_cluster(name)

    async def main() -> None:
        server, bound = _listen(emulator, host, port)
        base = f"http://{host}:{bound}"
        for name in clusters:
            if emulator.data_dir is not None:
                path = emulator.write_kubeconfig(name, base)
                print(f"cluster {name}: {base}/k8s/clusters/{name} (kubeconfig {path})", flush=True)
            else:
                print(f"cluster {name}: {base}/k8s/clusters/{name}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        server.stop()

    try:
        asyncio.run(main())
    finally:
        emulator.close()
