"""Standalone hosting of the emulator: a blocking :func:`serve` for ``python -m sandbox.kube`` and a
:class:`BackgroundServer` that runs it on its own event loop thread (tests, benchmarks, notebooks).

The product server does not use this module: it mounts :meth:`Emulator.url_patterns` in its own
Tornado application.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import ssl
from pathlib import Path

from tornado.httpserver import HTTPServer
from tornado.web import Application

from sandbox.threaded import ThreadedHttpServer

from .emulator import Emulator


def make_app(emulator: Emulator) -> Application:
    return Application(emulator.url_patterns())


def _listen(emulator: Emulator, host: str, port: int) -> tuple[HTTPServer, int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(256)
    sock.setblocking(False)
    server = HTTPServer(make_app(emulator), idle_connection_timeout=3600)
    server.add_sockets([sock])
    return server, sock.getsockname()[1]


class BackgroundServer:
    """Serve an emulator on ``host:port`` (0 picks a free port) from a daemon thread, over TLS when given a
    server ``ssl_context`` (kubectl sends bearer tokens only over TLS). A taken port raises in ``start``."""

    def __init__(self, emulator: Emulator, host: str = "127.0.0.1", port: int = 0,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.emulator = emulator
        self._http = ThreadedHttpServer(lambda: make_app(emulator), host, port, ssl_context=ssl_context,
                                        name="kube-emulator", idle_connection_timeout=3600)

    @property
    def host(self) -> str:
        return self._http.host

    @property
    def port(self) -> int:
        return self._http.port

    @property
    def base_url(self) -> str:
        return self._http.base_url

    def start(self) -> BackgroundServer:
        self._http.start()
        return self

    def stop(self) -> None:
        self._http.stop()


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
