"""``/api/v1/clusters/{cluster}/jobs/{job}/logs/ws``: a job's logs pushed over a WebSocket (viewer role).

Authentication, origin check, the per-token socket bound and revocation are :class:`EventsSocket`'s. The
query (``namespace``, ``pod``, ``container``, ``rank``, ``tail``, ``cursor``) is a
:class:`~services.logs.models.LogStreamQuery`. A frame is a batch: one line of JSON,
``{"chunks": [{"pod", "container", "lines"}], "cursor", "dropped", "caught_up"}`` (plus ``warning`` when the
earlier lines could not be read), then a newline and the batch's lines, at most one frame every ``FLUSH_MS``.
The lines are as Kubernetes gives them with ``timestamps=true`` (``<RFC 3339 time> <line>\n`` each), the first
chunk's ``lines`` of them from its pod and container, then the next chunk's, and so on; chunks of different
pods interleave by time. The server never handles or escapes a line on its own. Reconnecting
with the last ``cursor`` resumes exactly after the last line received. A frame is written only once the
previous one was flushed to the client, so a slow client leaves its lines in the view's bounded buffer
(counted in ``dropped`` when pushed out), never in the server's write buffers.
A refused request gets one ``{"error": {...}}`` frame (the REST envelope) and a close with code 4000 + the
HTTP status (4404 for an unknown cluster, 4422 for a bad query).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import tornado.ioloop
import tornado.websocket

from app.query_args import query_dict
from app.rest import TOKEN_RECHECK_SECONDS, EventsSocket
from services.errors import ServiceError
from services.events import Event
from services.logs import LogView
from services.logs.models import LogStreamQuery
from services.models import parse

FLUSH_MS = 100
BATCH_LINES = 20_000


class JobLogSocket(EventsSocket):
    def initialize(self, services: Any) -> None:
        super().initialize(services)
        self._view: LogView | None = None
        self._pump: tornado.ioloop.PeriodicCallback | None = None
        self._writing = False
        self._sent_dropped = 0
        self._sent_caught_up = False
        self._closed = False

    async def open(self, *args: str, **kwargs: str) -> None:  # type: ignore[override]
        self._opened = True
        cluster, job = args[0], args[1]
        loop = asyncio.get_running_loop()
        try:
            query = parse(LogStreamQuery, query_dict(LogStreamQuery, self.request.query_arguments))
            view = await loop.run_in_executor(None, self.services.logs.open_stream, self.principal, cluster, job,
                                              query)
        except ServiceError as exc:
            await self._fail(exc)
            return
        if self._closed:  # the client left while the view was opening
            await loop.run_in_executor(None, view.close)
            return
        self._view = view

        def revoked(_event: Event) -> None:
            loop.call_soon_threadsafe(self._close_revoked)

        if self.principal.token_id is not None:
            self._unsubscribe = self.services.bus.subscribe(revoked, topic="token",
                                                            where={"id": str(self.principal.token_id)})
            self._recheck = tornado.ioloop.PeriodicCallback(self._check_token, TOKEN_RECHECK_SECONDS * 1000)
            self._recheck.start()
        self._pump = tornado.ioloop.PeriodicCallback(self._flush, FLUSH_MS)
        self._pump.start()

    async def _fail(self, exc: ServiceError) -> None:
        try:
            await self.write_message(json.dumps(exc.envelope()))
        except tornado.websocket.WebSocketClosedError:
            return
        self.close(4000 + exc.http_status, exc.message[:120])

    async def _flush(self) -> None:
        view = self._view
        if view is None or self._writing or self.ws_connection is None or self.ws_connection.is_closing():
            return
        caught_up = view.caught_up.is_set()
        batch = view.take(BATCH_LINES)
        if not batch.chunks and batch.dropped == self._sent_dropped and caught_up == self._sent_caught_up:
            return
        head = {"chunks": [{"pod": chunk.pod, "container": chunk.container, "lines": chunk.nlines}
                           for chunk in batch.chunks],
                "cursor": batch.cursor, "dropped": batch.dropped, "caught_up": caught_up,
                **({"warning": batch.error} if batch.error else {})}
        body = b"".join(chunk.data for chunk in batch.chunks).decode("utf-8", "replace")  # no escaping: as read
        self._sent_dropped, self._sent_caught_up = batch.dropped, caught_up
        self._writing = True
        try:
            await self.write_message(f"{json.dumps(head, separators=(',', ':'))}\n{body}")  # flushed before the next
        except tornado.websocket.WebSocketClosedError:
            return
        finally:
            self._writing = False

    def on_close(self) -> None:
        self._closed = True
        if self._pump is not None:
            self._pump.stop()
        view, self._view = self._view, None
        if view is not None:
            asyncio.get_running_loop().run_in_executor(None, view.close)
        super().on_close()
