"""Tornado glue for the route table: authentication, parsing, one error envelope, OpenAPI, events.

Everything here is mechanical; rules live in ``services``. Credentials come from an
``Authorization: Bearer`` header (REST clients, the MCP bridge) or from the dashboard's signed session
cookie, in which case state-changing calls must also carry the XSRF token (``X-XSRFToken`` header or
``_xsrf`` field), as Tornado checks it.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import re
from typing import Any
from urllib.parse import urlsplit

import tornado.http1connection
import tornado.httputil
import tornado.ioloop
import tornado.web
import tornado.websocket
from pydantic import BaseModel
from tornado.escape import url_unescape

from app.api.base import Call, Reply, Route
from app.bootstrap import Services
from app.openapi import openapi_document
from app.query_args import call_query
from app.route_table import RouteTable
from app.routes import ROUTES, check_routes
from services.auth import Principal, Role, token_id_of
from services.errors import (
    Forbidden,
    Invalid,
    MethodNotAllowed,
    NotFound,
    ServiceError,
    TooLarge,
    TooManyRequests,
    Unauthorized,
)
from services.events import Event
from services.models import ReusedResponse, parse
from services.settings import LOOPBACK_HOSTS, Settings

log = logging.getLogger(__name__)

SESSION_COOKIE = "instantstart_session"
#: the session's own XSRF token, readable by the dashboard's pages; cookie-authenticated changes echo it
#: in the X-XSRFToken header
XSRF_COOKIE = "instantstart_xsrf"
XSRF_HEADERS = ("X-XSRFToken", "X-CSRFToken")
FACE_HEADER = "X-InstantStart-Face"
CLIENT_CLAIM = re.compile(r"^[a-z0-9][a-z0-9._-]{0,31}$")
DEV_PRINCIPAL = Principal("dev", Role.ADMIN, None, "api")
TOKEN_RECHECK_SECONDS = 5
#: probes answered without credentials
UNAUTHENTICATED = frozenset({"/healthz", "/readyz"})


def _json_default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def to_json(value: Any) -> str:
    if isinstance(value, ReusedResponse):  # a reused read: encoded once per state of its inputs
        return value.encoded()
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    if isinstance(value, list):
        return "[" + ",".join(to_json(v) for v in value) + "]"
    return json.dumps(value, default=_json_default)


def allowed_origins(settings: Settings) -> set[str]:
    """``host:port`` values a browser page may come from (the Panel WebSocket list uses the same)."""
    hosts = {"127.0.0.1", "localhost", "::1", settings.host}
    return {f"[{h}]:{settings.port}" if ":" in h else f"{h}:{settings.port}" for h in hosts} | set(
        settings.allowed_origins)


def _origin_allowed(origin: str | None, settings: Settings, protocol: str = "http") -> bool:
    """A browser page of ours: an http(s) origin (https when the request came over https) at an allowed
    ``host:port``. ``evil://127.0.0.1:3099`` or ``null`` are not pages of ours."""
    if origin is None:
        return True
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or (protocol == "https" and parts.scheme != "https"):
        return False
    return parts.netloc in allowed_origins(settings)


def _guard_ambient(handler: tornado.web.RequestHandler, services: Services) -> None:
    """Credentials a browser attaches by itself (the session cookie, dev mode's none at all) must not be
    usable by another site: same-origin pages only for changes, JSON bodies only (a cross-site form or
    ``text/plain`` POST cannot send ``application/json`` without a preflight, which is never granted)."""
    request = handler.request
    if request.host_name.strip("[]") not in LOOPBACK_HOSTS and services.settings.dev_no_auth:
        raise Forbidden(f"dev mode answers loopback names only, not Host {request.host_name!r}")
    if request.method in ("GET", "HEAD"):
        return
    if not _origin_allowed(request.headers.get("Origin"), services.settings, request.protocol):
        raise Forbidden(f"cross-origin request from {request.headers.get('Origin')!r} refused")
    if _declared_length(request) != 0 and \
            request.headers.get("Content-Type", "").split(";")[0].strip() != "application/json":
        raise Invalid("request bodies must be JSON: send Content-Type: application/json")


def client_claim(handler: tornado.web.RequestHandler) -> str:
    """What the caller says it is (``X-InstantStart-Face``), as a short safe label; a claim, never a face."""
    return claim_of(handler.request.headers)


def claim_of(headers: tornado.httputil.HTTPHeaders) -> str:
    value = headers.get(FACE_HEADER, "").strip().lower()
    return value if CLIENT_CLAIM.match(value) else ("other" if value else "")


def bearer_of(headers: tornado.httputil.HTTPHeaders) -> str | None:
    """The bearer token presented, ``None`` when there is no Authorization header."""
    header = headers.get("Authorization", "")
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("Authorization must be 'Bearer <token>'")
    return token.strip()


def authenticate_ambient(handler: tornado.web.RequestHandler, services: Services) -> Principal:
    """The credentials a browser sends by itself: the dashboard's session cookie, else (dev mode on
    loopback) a dev admin. Bearer tokens never come here: :func:`sign_in` checks them under the throttle.

    A session's changes must carry that session's own XSRF token (never a value the client chose)."""
    cookie = handler.get_signed_cookie(SESSION_COOKIE, max_age_days=services.settings.session_lifetime / 86_400)
    if cookie:
        _guard_ambient(handler, services)
        principal = services.sessions.principal(cookie.decode(), "ui")
        if handler.request.method not in ("GET", "HEAD"):
            presented = next((handler.request.headers[h] for h in XSRF_HEADERS if h in handler.request.headers),
                             None)
            if principal.session is None or not services.sessions.check_xsrf(principal.session, presented):
                raise Forbidden(f"missing or wrong XSRF token for a dashboard session: send the {XSRF_COOKIE} "
                                "cookie's value in the X-XSRFToken header")
        return principal
    if services.settings.dev_no_auth:
        _guard_ambient(handler, services)
        return DEV_PRINCIPAL
    raise Unauthorized("no credentials: send 'Authorization: Bearer <token>' (make one with "
                       "'instantstart token create --role viewer')")


def signed_in_from_memory(services: Services, token: str, address: str, *, face: str,
                          client: str) -> Principal | None:
    """A token that signed in before and is still admitted, from memory (no thread, no database); ``None``
    means :func:`sign_in` must check it."""
    cached = services.tokens.cached(token, face, client)
    if cached is not None:
        services.signin.succeeded(address, token_id_of(token) or "malformed")
    return cached


async def sign_in(services: Services, token: str, address: str, *, face: str, client: str, action: str,
                  target: str) -> Principal:
    """Check a presented token: a correct one is admitted at once; a failure is audited and answered only
    after the sign-in throttle's delay for this (client address, token id) — never a lockout."""
    cached = signed_in_from_memory(services, token, address, face=face, client=client)
    if cached is not None:
        return cached
    token_id = token_id_of(token) or "malformed"
    loop = asyncio.get_running_loop()
    try:
        principal = await loop.run_in_executor(None, services.tokens.authenticate, token, face, client)
    except Unauthorized as exc:
        delay = services.signin.failed(address, token_id)
        record = functools.partial(services.audit.record_refusal, action, target,
                                   f"{exc.message} (token id {token_id}, client {address})", face=face,
                                   client=client)
        await loop.run_in_executor(None, record)
        if delay is None:
            raise TooManyRequests(f"too many failed sign-ins for token id {token_id} from {address} are waiting; "
                                  "try again later") from None
        try:
            await asyncio.sleep(delay)
        finally:
            services.signin.answered(address, token_id)
        raise
    services.signin.succeeded(address, token_id)
    return principal


async def authenticate_request(handler: tornado.web.RequestHandler, services: Services) -> Principal:
    """Bearer tokens through :func:`sign_in` (the throttle), anything else through :func:`authenticate_ambient`."""
    token = bearer_of(handler.request.headers)
    if token is not None:
        return await sign_in(services, token, handler.request.remote_ip or "", face="api",
                             client=client_claim(handler), action="token.authenticate",
                             target=handler.request.path)
    return await asyncio.get_running_loop().run_in_executor(None, authenticate_ambient, handler, services)


async def audit_refusal(handler: tornado.web.RequestHandler, services: Services, principal: Principal | None,
                        action: str, exc: ServiceError) -> None:
    """Every 403 is recorded, by its principal when it got that far, else by its transport."""
    if principal is not None:
        record = functools.partial(services.audit.record, principal, action, handler.request.path, {}, "denied",
                                   detail=exc.message)
    else:
        face = "ui" if handler.get_cookie(SESSION_COOKIE) else "api"
        record = functools.partial(services.audit.record_refusal, action, handler.request.path, exc.message,
                                   face=face, client=client_claim(handler))
    await asyncio.get_running_loop().run_in_executor(None, record)


def _close_connection(request: tornado.httputil.HTTPServerRequest) -> None:
    """Close the HTTP/1 connection under ``request`` (its unread body goes with it)."""
    if isinstance(request.connection, tornado.http1connection.HTTP1Connection):
        request.connection.close()


def _declared_length(request: tornado.httputil.HTTPServerRequest) -> int | None:
    """The body length the client declared, ``None`` for a chunked body (its length is unknown)."""
    if "chunked" in request.headers.get("Transfer-Encoding", "").lower():
        return None
    try:
        return int(request.headers.get("Content-Length", "0"))
    except ValueError:
        return 0  # Tornado itself refuses a malformed Content-Length before any handler runs


class EveryMethod(tuple[str, ...]):
    """``SUPPORTED_METHODS`` that admits any method, so an unusual one (``TRACE``, ``FOO``) reaches
    ``prepare()`` and is refused there, after authentication, like any other method a path lacks."""

    def __contains__(self, method: object) -> bool:
        return True


def write_http_error(handler: tornado.web.RequestHandler, status_code: int, allow: str) -> None:
    """An error Tornado raised itself (unsupported method, a handler's bug) in the one envelope: ``internal``
    for a 500, ``method_not_allowed`` with ``Allow``, ``http_error`` for any other refusal."""
    code = {405: "method_not_allowed"}.get(status_code, "internal" if status_code >= 500 else "http_error")
    handler.set_header("Content-Type", "application/json")
    if status_code == 405:
        handler.set_header("Allow", allow)
    handler.finish(json.dumps({"error": {"code": code, "message": handler._reason, "details": None}}))


@tornado.web.stream_request_body
class ApiHandler(tornado.web.RequestHandler):
    """Serves every route of one path; the route table decides method, role and models.

    The body is streamed, so the caller is authenticated, authorized and its declared size checked in
    ``prepare()``, before one byte of the body is read; a refusal then closes the connection, and the
    body is never read. A chunked body is counted as it arrives and refused (413) past the limit.
    """

    SUPPORTED_METHODS = EveryMethod(tornado.web.RequestHandler.SUPPORTED_METHODS)

    def initialize(self, services: Services, table: RouteTable) -> None:
        self.services = services
        found = table.lookup(self.request.path)
        assert found is not None, "the table's pattern matched this path"
        self.routes, self.path_params = found
        self.limit = services.settings.api_max_body_bytes
        self.route: Route | None = None
        self.principal: Principal | None = None
        self.chunks: list[bytes] = []
        self.received = 0

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.set_header("X-Content-Type-Options", "nosniff")

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        write_http_error(self, status_code, allow=", ".join(sorted(self.routes)))

    def compute_etag(self) -> None:  # answers are no-store: a SHA-1 of every body (352 KB at 1,000 nodes) is waste
        return None

    async def prepare(self) -> None:
        try:
            await self._admit()
        except ServiceError as exc:
            await self._refuse(exc, close=_declared_length(self.request) != 0)  # the body stays unread

    async def _admit(self) -> None:
        method = self.request.method or "GET"
        route = self.routes.get(method)
        if route is not None and route.path in UNAUTHENTICATED:
            principal = DEV_PRINCIPAL
        else:  # bearer tokens under the sign-in throttle; sessions with their own XSRF token
            principal = await authenticate_request(self, self.services)
            self.principal = principal
        if route is None:  # after authentication: an anonymous caller learns nothing about the routes
            allowed = ", ".join(sorted(self.routes))
            self.set_header("Allow", allowed)
            raise MethodNotAllowed(f"{method} is not allowed here; use {allowed}")
        self.route = route
        principal.require(route.role)
        declared = _declared_length(self.request)
        if declared is not None and declared > self.limit:
            raise TooLarge(f"request body of {declared} bytes is over the limit of {self.limit} bytes "
                           "(setting api_max_body_bytes)")
        # a chunked body is counted in data_received; Tornado's own cap would answer a bare 400 instead
        if isinstance(self.request.connection, tornado.http1connection.HTTP1Connection):
            self.request.connection.set_max_body_size(self.limit if declared is not None else 2**62)

    async def _refuse(self, exc: ServiceError, close: bool) -> None:
        if exc.http_status == 403:  # every 403 is audited, by its principal when it got that far
            route = self.route or self.routes.get(self.request.method or "GET")
            await audit_refusal(self, self.services, self.principal, route.name if route else "api.request", exc)
        stream = getattr(self.request.connection, "stream", None)
        if stream is not None and stream.closed():  # the client left (e.g. during a sign-in delay)
            return
        await self._send_error(exc.http_status, exc.code, exc.message, exc.details)
        if close:
            _close_connection(self.request)  # the rest of the body is never read

    async def data_received(self, chunk: bytes) -> None:
        if self._finished:
            return
        self.received += len(chunk)
        if self.received > self.limit:
            await self._refuse(TooLarge(f"request body is over the limit of {self.limit} bytes "
                                        "(setting api_max_body_bytes)"), close=True)
            return
        self.chunks.append(chunk)

    async def get(self) -> None:
        path = {k: self.decode_argument(url_unescape(v, encoding=None, plus=False), name=k)
                for k, v in self.path_params.items()}  # as Tornado's own path arguments are decoded
        await self._dispatch(path)

    post = delete = put = patch = get

    async def _dispatch(self, path: dict[str, str]) -> None:
        route, principal = self.route, self.principal or DEV_PRINCIPAL
        assert route is not None
        try:
            call = Call(services=self.services, principal=principal, path=path,
                        query=call_query(route, self.request.query_arguments),
                        body=parse(route.body, self._body()) if route.body else None,
                        idempotency_key=self.request.headers.get("Idempotency-Key"))
            if route.query is None and self.request.query_arguments:
                raise Invalid(f"{route.name} takes no query parameters; got {sorted(self.request.query_arguments)}")
            if inspect.iscoroutinefunction(route.handler):
                reply = await route.handler(call)
            elif route.on_loop:  # memory only (Route.on_loop): a thread hop would cost more than the answer
                reply = route.handler(call)
            else:
                reply = await asyncio.get_running_loop().run_in_executor(None, route.handler, call)
            assert isinstance(reply, Reply)
        except ServiceError as exc:
            await self._refuse(exc, close=False)
            return
        self.set_status(reply.status)
        for key, value in reply.headers.items():
            self.set_header(key, value)
        if self.route is not None and self.route.media_type != "application/json":
            self.set_header("Content-Type", self.route.media_type)
            self.finish(str(reply.body))
            return
        self.finish(to_json(reply.body))

    def _body(self) -> Any:
        raw = b"".join(self.chunks)
        if not raw:
            return {}
        try:
            return json.loads(raw)
        except RecursionError:
            raise Invalid("request body is nested too deeply") from None
        except ValueError as exc:
            raise Invalid(f"request body is not valid JSON: {exc}") from None

    def _send_error(self, status: int, code: str, message: str, details: Any = None) -> Any:
        self.set_status(status)
        return self.finish(json.dumps({"error": {"code": code, "message": message, "details": details}},
                                      default=str))


@tornado.web.stream_request_body
class NotFoundHandler(tornado.web.RequestHandler):
    """The JSON 404 for any other path under /api (in any spelling); a body sent along is never read."""

    SUPPORTED_METHODS = EveryMethod(tornado.web.RequestHandler.SUPPORTED_METHODS)

    async def prepare(self) -> None:
        self.set_status(404)
        self.set_header("Content-Type", "application/json")
        err = NotFound(f"no API route {self.request.method} {self.request.path}; see /api/v1/openapi.json")
        await self.finish(json.dumps(err.envelope()))
        if _declared_length(self.request) != 0:
            _close_connection(self.request)  # the body sent along is never read


class OpenApiHandler(tornado.web.RequestHandler):
    def initialize(self, document: dict[str, Any]) -> None:
        self.document = document

    def get(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(self.document))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        write_http_error(self, status_code, allow="GET")


class EventsSocket(tornado.websocket.WebSocketHandler):
    """Pushes bus events as ``{"topic", "kind", "data"}`` JSON (viewer role): every event, or those of
    ``?topic=`` (``operation``, ``kube``, ``cluster``, ``sandbox``...) and ``?cluster=`` (a cluster's
    Kubernetes changes and the operations on it).

    Bounded: at most ``ws_per_principal`` open sockets per token (past it: 429 with the envelope, before
    the upgrade), and client messages of at most ``ws_max_message_bytes`` (past it: close 1009 "message
    too big"). The socket only sends; what a client sends within the bound is ignored. A client that reads
    slowly holds up only its own bus subscription: each event is written and flushed before the next is
    taken, so what does not fit in the subscription's bounded queue is dropped and counted (the bus's
    dropped-events metric), never piled up in the server's memory."""

    SUPPORTED_METHODS = EveryMethod(tornado.web.RequestHandler.SUPPORTED_METHODS)

    def initialize(self, services: Services) -> None:
        self.services = services
        self._unsubscribe: Any = None
        self._recheck: tornado.ioloop.PeriodicCallback | None = None
        self._holds_slot = False
        self._opened = False

    async def prepare(self) -> None:
        """Any method but GET: authenticated first, then 405 with ``Allow: GET``, in the one envelope."""
        if self.request.method == "GET":
            return
        try:
            principal = await authenticate_request(self, self.services)
            principal.require(Role.VIEWER)
            self.set_header("Allow", "GET")
            raise MethodNotAllowed(f"{self.request.method} is not allowed here; open a WebSocket with GET")
        except ServiceError as exc:
            self._refuse(exc)

    def _refuse(self, exc: ServiceError) -> None:
        self.set_status(exc.http_status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(exc.envelope()))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        write_http_error(self, status_code, allow="GET")

    @property
    def max_message_size(self) -> int:
        return self.services.settings.ws_max_message_bytes

    async def get(self, *args: Any, **kwargs: Any) -> None:
        try:
            # Browsers attach cookies to cross-site WebSocket upgrades: only our own pages may open one.
            origin = self.request.headers.get("Origin")
            if not _origin_allowed(origin, self.services.settings, self.request.protocol):
                forbidden = Forbidden(f"WebSocket from origin {origin!r} refused; add it to allowed_origins")
                await audit_refusal(self, self.services, None, "events.connect", forbidden)
                raise forbidden
            self.principal = await authenticate_request(self, self.services)
            self.principal.require(Role.VIEWER)
            if self.request.headers.get("Upgrade", "").lower() != "websocket":
                raise Invalid("this is a WebSocket: send an Upgrade: websocket request")
            self.services.websockets.acquire(self.principal)
            self._holds_slot = True
        except ServiceError as exc:
            self._refuse(exc)
            return
        try:
            await super().get(*args, **kwargs)
        finally:
            if not self._opened:  # the upgrade failed: on_close will not run
                self._release()

    def check_origin(self, origin: str) -> bool:
        # already checked in get(), with an envelope
        return _origin_allowed(origin, self.services.settings, self.request.protocol)

    def open(self, *args: str, **kwargs: str) -> None:
        self._opened = True
        loop = asyncio.get_running_loop()

        def forward(event: Event) -> None:  # on the subscription's own delivery thread
            try:
                asyncio.run_coroutine_threadsafe(self._send(event), loop).result()
            except RuntimeError:  # the loop has ended (server shutting down)
                return

        def revoked(_event: Event) -> None:
            loop.call_soon_threadsafe(self._close_revoked)

        topic = self.get_query_argument("topic", None) or None
        cluster = self.get_query_argument("cluster", None) or None
        subscriptions = [self.services.bus.subscribe(forward, topic=topic,
                                                     where={"cluster": cluster} if cluster else None)]
        if self.principal.token_id is not None:  # whatever the filter, a revocation of this token closes it
            subscriptions.append(self.services.bus.subscribe(revoked, topic="token",
                                                             where={"id": str(self.principal.token_id)}))
        def unsubscribe_all() -> None:
            for subscription in subscriptions:
                subscription()

        self._unsubscribe = unsubscribe_all
        if self.principal.token_id is not None:
            # REST revocations close at once (a bus event); this catches revocations by other processes (CLI)
            # and, for a dashboard session, its end (sign-out, idle, lifetime)
            self._recheck = tornado.ioloop.PeriodicCallback(self._check_token, TOKEN_RECHECK_SECONDS * 1000)
            self._recheck.start()

    def on_message(self, message: str | bytes) -> None:
        """Nothing to receive: the socket only sends (messages past the size bound close it)."""

    async def _check_token(self) -> None:
        principal = self.principal
        loop = asyncio.get_running_loop()
        try:
            if principal.session is not None:
                check = functools.partial(self.services.sessions.principal, principal.session, "ui", touch=False)
                await loop.run_in_executor(None, check)
            else:
                await loop.run_in_executor(None, self.services.tokens.principal, str(principal.token_id), "api")
        except Unauthorized:
            self.close(1008, "session ended" if principal.session else "token revoked")

    def _close_revoked(self) -> None:
        if self.ws_connection is not None and not self.ws_connection.is_closing():
            self.close(1008, "token revoked")

    async def _send(self, event: Event) -> None:
        if self.ws_connection is None or self.ws_connection.is_closing():
            return
        if event.topic == "token" and event.kind == "revoked":
            return  # this token's own revocation closes the socket (its own subscription), others' are private
        try:
            await self.write_message(json.dumps(event.to_json()))  # flushed to the client: the bound holds
        except tornado.websocket.WebSocketClosedError:
            return

    def _release(self) -> None:
        if self._holds_slot:
            self._holds_slot = False
            self.services.websockets.release(self.principal)

    def on_close(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
        if self._recheck is not None:
            self._recheck.stop()
        self._release()


def rest_patterns(services: Services, routes: list[Route] = ROUTES) -> list[tuple[Any, ...]]:
    """Tornado URL patterns for every route, the OpenAPI document, events and the /api 404 catch-all."""
    check_routes(routes)
    for r in routes:  # what runs on the loop must not be able to block it
        if r.on_loop and (not r.read_only or inspect.iscoroutinefunction(r.handler)):
            raise Invalid(f"route {r.name} cannot run on the loop: on_loop is for synchronous memory-only reads")
        if r.from_memory is not None and (r.method != "GET" or inspect.iscoroutinefunction(r.from_memory)):
            raise Invalid(f"route {r.name}: from_memory is a synchronous memory-only try of a GET")
    table = RouteTable(routes)
    from app.logsocket import JobLogSocket  # builds on EventsSocket, so it imports this module

    return [
        (r"/api/v1/openapi\.json$", OpenApiHandler, {"document": openapi_document(routes)}),
        (r"/api/v1/events$", EventsSocket, {"services": services}),
        (r"/api/v1/clusters/([^/]+)/jobs/([^/]+)/logs/ws$", JobLogSocket, {"services": services}),
        (table.pattern, ApiHandler, {"services": services, "table": table}),
        (r"/api/.*", NotFoundHandler),
    ]
