"""The server's edge: rules every HTTP request meets, whichever handler (ours, Panel's, Bokeh's) serves it.

- No request can end the process. Tornado catches ``Exception`` from a handler, but ``SystemExit``,
  ``KeyboardInterrupt`` and other ``BaseException`` subclasses pass through its task and stop the loop;
  :func:`guard_application` wraps every handler so they become a logged 500 instead.
- Panel's ``/components/<module>/...`` handler imports the module named in the URL before any check
  (see SECURITY.md); ours serves only :data:`COMPONENT_MODULES` and never imports anything else.
- Request headers: Tornado closes the connection without an answer past :data:`HEADER_HARD_LIMIT`; below
  it, a header block over :data:`HEADER_LIMIT` is answered 431 with the JSON error envelope.
- Unknown paths under ``/api`` in any spelling (``//api/...``, ``/API/V1/...``) get the JSON 404 envelope.
- The access log (:func:`use_access_log`): every request is counted in the metrics; quick successful reads
  are not written line by line, everything else is.

This module must never import a module named by a request, nor swallow a cancellation. The guard wraps
``RequestHandler._execute`` (Tornado 6, as pinned); tests/test_security_edge.py proves it through Panel's
own component handler, so a Tornado change that bypasses it fails there.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any
from urllib.parse import urlsplit

import tornado.httputil
import tornado.web
import tornado.websocket
from panel.io.server import ComponentResourceHandler

from services.errors import Forbidden, HeadersTooLarge
from services.metrics import Metrics

log = logging.getLogger(__name__)
access_log = logging.getLogger("tornado.access")  # Tornado's own access logger, so its handlers still apply

#: reads (these methods) answered 2xx or 304 within this time are counted, not logged line by line
SLOW_REQUEST_SECONDS = 1.0
QUIET_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

# Modules whose component resources the dashboard requests. tests/test_browser.py records every
# /components/ request of a real session and fails when one names a module missing here.
COMPONENT_MODULES: frozenset[str] = frozenset()

HEADER_LIMIT = 256 * 1024  # request line plus headers, answered 431 above this
HEADER_HARD_LIMIT = 1024 * 1024  # Tornado's max_header_size: above it the connection is closed unanswered
FORM_BODY_LIMIT = 4 * 1024  # every handler that is not a REST route (the login form): Tornado's max_body_size

#: what a guard lets through: a cancellation or a closing generator is not an error
PASS_THROUGH = (asyncio.CancelledError, GeneratorExit)


class AllowlistedComponents(ComponentResourceHandler):
    """Panel's component resource handler, refusing (404) any module not in :data:`COMPONENT_MODULES`."""

    def parse_url_path(self, path: str) -> str:
        module = path.split("/", 1)[0]
        if module not in COMPONENT_MODULES:
            raise tornado.web.HTTPError(404, "Module not found")
        return str(super().parse_url_path(path))


def header_bytes(request: Any) -> int:
    """Size of the request line and header block as received (close enough: names, values, separators)."""
    line = len(request.method or "") + len(request.uri or "") + len(request.version or "") + 4
    return line + sum(len(k) + len(v) + 4 for k, v in request.headers.get_all())


class _Guarded:
    """Mixed in front of every handler class of the application (see :func:`guard_application`)."""

    async def _execute(self, transforms: Any, *args: bytes, **kwargs: bytes) -> None:
        handler: tornado.web.RequestHandler = self  # type: ignore[assignment]
        if header_bytes(handler.request) > HEADER_LIMIT:
            _refuse_headers(handler, transforms)
            return
        try:
            await super()._execute(transforms, *args, **kwargs)  # type: ignore[misc]
        except PASS_THROUGH:
            raise
        except BaseException as exc:  # SystemExit, KeyboardInterrupt...: a request must not stop the server
            log.error("request %s %s raised %s: answered 500, the server keeps running",
                      handler.request.method, handler.request.path, type(exc).__name__, exc_info=True)
            if not handler._finished:
                handler.send_error(500)


def _refuse_headers(handler: tornado.web.RequestHandler, transforms: Any) -> None:
    handler._transforms = transforms
    err = HeadersTooLarge(f"request headers are over {HEADER_LIMIT // 1024} KiB; send fewer or smaller ones")
    handler.clear()
    handler.set_status(err.http_status)
    handler.set_header("Content-Type", "application/json")
    handler.set_header("Connection", "close")
    handler.finish(json.dumps(err.envelope()))
    prepared = handler._prepared_future
    if prepared is not None and not prepared.done():
        prepared.set_result(None)  # a streaming handler's connection waits on it
    handler.request.connection.close()  # type: ignore[union-attr]  # its body, if any, is never read


class _GuardedSocket(_Guarded):
    async def get(self, *args: Any, **kwargs: Any) -> None:
        """Every WebSocket upgrade, Panel's own ``/ws`` included: a page's origin is ``http``/``https``
        (``https`` only when the request came over HTTPS). Tornado lets an origin whose host matches the
        Host header through without asking the handler, and Bokeh's list compares ``host:port`` only, so
        ``evil://127.0.0.1:3099`` would pass both; the handler's own checks run after this one."""
        handler: tornado.websocket.WebSocketHandler = self  # type: ignore[assignment]
        origin = handler.request.headers.get("Origin")
        if origin is not None:
            scheme = urlsplit(origin).scheme
            if scheme not in ("http", "https") or (handler.request.protocol == "https" and scheme != "https"):
                err = Forbidden(f"WebSocket origin {origin!r} is not a page of this server (http or https only, "
                                "https when served over HTTPS)")
                handler.set_status(err.http_status)
                handler.set_header("Content-Type", "application/json")
                handler.finish(json.dumps(err.envelope()))
                return
        await super().get(*args, **kwargs)  # type: ignore[misc]

    def on_message(self, message: str | bytes) -> Any:
        return _guard_message(self, message)


async def _guard_message(socket: Any, message: str | bytes) -> None:
    try:
        result = super(_GuardedSocket, socket).on_message(message)
        if result is not None:
            await result
    except PASS_THROUGH:
        raise
    except BaseException as exc:
        log.error("WebSocket message on %s raised %s: connection closed, the server keeps running",
                  socket.request.path, type(exc).__name__, exc_info=True)
        socket.close(1011, "internal error")


def _guarded(cls: type[tornado.web.RequestHandler]) -> type[tornado.web.RequestHandler]:
    if issubclass(cls, _Guarded):
        return cls
    mixin = _GuardedSocket if issubclass(cls, tornado.websocket.WebSocketHandler) else _Guarded
    return type(cls.__name__, (mixin, cls), {"__module__": cls.__module__, "__doc__": cls.__doc__})


def guard_application(app: tornado.web.Application) -> None:
    """Wrap every handler class routed by ``app`` (and the default 404 handler) in the guard above."""
    routers = [app.wildcard_router, app.default_router]
    for router in routers:
        for rule in router.rules:
            target = rule.target
            if isinstance(target, type) and issubclass(target, tornado.web.RequestHandler):
                rule.target = _guarded(target)
    default = app.settings.get("default_handler_class")
    if default is not None:
        app.settings["default_handler_class"] = _guarded(default)


def use_access_log(app: tornado.web.Application, metrics: Metrics) -> None:
    """The server's access log policy (:func:`record_answer`) for every request a handler answers."""
    def log_request(handler: tornado.web.RequestHandler) -> None:
        record_answer(metrics, handler.request, handler.get_status())

    app.settings["log_function"] = log_request


def record_answer(metrics: Metrics, request: tornado.httputil.HTTPServerRequest, status: int) -> None:
    """The server's access log policy. Every request is counted in ``instantstart_http_requests`` (method,
    status; ``GET /metrics``). A read (GET, HEAD, OPTIONS) answered 2xx or 304 in under
    :data:`SLOW_REQUEST_SECONDS` is only counted: at thousands of cached reads a second, a line each was a
    tenth of the event loop's time. Everything else is logged as Tornado logs it (INFO, WARNING for 4xx,
    ERROR for 5xx): mutations, refusals (401, 403, 429), errors, redirects, WebSocket upgrades and slow
    reads. The audit log of mutations and refusals is a separate record and is not affected."""
    method = request.method or ""
    metrics.http_answered(method, status)
    seconds = request.request_time()
    if (200 <= status < 300 or status == 304) and method in QUIET_METHODS and seconds < SLOW_REQUEST_SECONDS:
        return
    level = logging.INFO if status < 400 else logging.WARNING if status < 500 else logging.ERROR
    access_log.log(level, "%d %s %s (%s) %.2fms", status, method, request.uri, request.remote_ip, 1000.0 * seconds)


def edge_patterns(not_found: type[tornado.web.RequestHandler]) -> list[tuple[Any, ...]]:
    """Patterns mounted after the REST routes and ahead of Panel's own: the component allowlist and the
    catch-all for /api in other spellings."""
    return [
        (r"/components/(.*)", AllowlistedComponents, {}),
        (r"(?i)/+api(?:/.*)?", not_found),
    ]


def http_server_limits() -> dict[str, int]:
    """``HTTPServer`` keyword arguments: header and (non-REST) body limits. REST routes stream their bodies
    and set their own limit per request (``api_max_body_bytes``)."""
    return {"max_header_size": HEADER_HARD_LIMIT, "max_body_size": FORM_BODY_LIMIT}
