"""A Tornado HTTP server on its own event loop thread, for the sandbox's endpoints.

The sandbox's AWS front and Kubernetes emulator run beside the product's Panel loop, not on it: their
work (validation, moto forwarding, watches) never delays the dashboard. The socket is bound in the
caller's thread, so a taken port raises there at once instead of failing silently in the thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
from collections.abc import Callable
from typing import Any

from tornado.httpserver import HTTPServer
from tornado.web import Application


class ThreadedHttpServer:
    def __init__(self, make_app: Callable[[], Application], host: str = "127.0.0.1", port: int = 0, *,
                 ssl_context: ssl.SSLContext | None = None, name: str = "sandbox-http", **server_options: Any) -> None:
        self._make_app = make_app
        self.host = host
        self.port = 0
        self._requested_port = port
        self._ssl = ssl_context
        self._name = name
        self._options = server_options
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: HTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"{'https' if self._ssl else 'http'}://{self.host}:{self.port}"

    def start(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self._requested_port))
        except OSError:
            sock.close()
            raise
        sock.listen(256)
        sock.setblocking(False)
        self.port = sock.getsockname()[1]
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._loop = loop

            async def listen() -> None:
                self._server = HTTPServer(self._make_app(), ssl_options=self._ssl, **self._options)
                self._server.add_sockets([sock])

            loop.run_until_complete(listen())
            ready.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name=self._name, daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise TimeoutError(f"{self._name} did not start on {self.host}:{self.port}")

    def stop(self) -> None:
        loop, server = self._loop, self._server
        if loop is None or server is None:
            return

        async def shutdown() -> None:
            server.stop()
            await server.close_all_connections()

        with contextlib.suppress(TimeoutError):
            asyncio.run_coroutine_threadsafe(shutdown(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(5)
        self._loop = self._server = None
