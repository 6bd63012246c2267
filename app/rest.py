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
import typing
from typing import Any
from urllib.parse import urlsplit

import tornado.ioloop
import tornado.web
import tornado.websocket
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from app.bootstrap import Services
from app.routes import ROUTES, Call, ErrorEnvelope, Reply, Route, check_routes
from services import __version__
from services.auth import Principal, Role, token_id_of
from services.errors import Forbidden, Invalid, NotFound, ServiceError, Unauthorized
from services.events import Event
from services.models import RequestModel, parse
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


def _json_default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def to_json(value: Any) -> str:
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
    if request.body and request.headers.get("Content-Type", "").split(";")[0].strip() != "application/json":
        raise Invalid("request bodies must be JSON: send Content-Type: application/json")


def client_claim(handler: tornado.web.RequestHandler) -> str:
    """What the caller says it is (``X-InstantStart-Face``), as a short safe label; a claim, never a face."""
    value = handler.request.headers.get(FACE_HEADER, "").strip().lower()
    return value if CLIENT_CLAIM.match(value) else ("other" if value else "")


def _bearer(handler: tornado.web.RequestHandler) -> str | None:
    header = handler.request.headers.get("Authorization", "")
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("Authorization must be 'Bearer <token>'")
    return token.strip()


def authenticate(handler: tornado.web.RequestHandler, services: Services) -> Principal:
    """Bearer token, else the dashboard's session cookie, else (dev mode on loopback) a dev admin.

    A session's changes must carry that session's own XSRF token (never a value the client chose)."""
    token = _bearer(handler)
    if token is not None:
        return services.tokens.authenticate(token, "api", client_claim(handler))
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


async def sign_in(services: Services, token: str, address: str, *, face: str, client: str, action: str,
                  target: str) -> Principal:
    """Check a presented token under the sign-in throttle: a delayed answer (never a lockout) after
    failures of this (client address, token id), and an audit row for each failure."""
    loop = asyncio.get_running_loop()
    token_id = token_id_of(token) or "malformed"
    delay = services.signin.admit(address, token_id)
    if delay > 0:
        await asyncio.sleep(delay)
    try:
        principal = await loop.run_in_executor(None, services.tokens.authenticate, token, face, client)
    except Unauthorized as exc:
        services.signin.failed(address, token_id)
        record = functools.partial(services.audit.record_refusal, action, target,
                                   f"{exc.message} (token id {token_id}, client {address})", face=face,
                                   client=client)
        await loop.run_in_executor(None, record)
        raise
    services.signin.succeeded(address, token_id)
    return principal


async def authenticate_request(handler: tornado.web.RequestHandler, services: Services) -> Principal:
    """:func:`authenticate` off the loop; a presented bearer token goes through :func:`sign_in`."""
    token = _bearer(handler)
    if token is not None:
        return await sign_in(services, token, handler.request.remote_ip or "", face="api",
                             client=client_claim(handler), action="token.authenticate",
                             target=handler.request.path)
    return await asyncio.get_running_loop().run_in_executor(None, authenticate, handler, services)


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


def _is_list(annotation: Any) -> bool:
    if typing.get_origin(annotation) is list:
        return True
    return any(_is_list(a) for a in typing.get_args(annotation))


def query_dict(model: type[RequestModel], arguments: dict[str, list[bytes]]) -> dict[str, Any]:
    """Query arguments to a dict for ``model``: list fields accept repeats and commas."""
    out: dict[str, Any] = {}
    for key, raw in arguments.items():
        values = [v.decode() for v in raw]
        field = model.model_fields.get(key)
        if field is not None and _is_list(field.annotation):
            out[key] = [part for v in values for part in v.split(",") if part]
        else:
            out[key] = values[-1]
    return out


class ApiHandler(tornado.web.RequestHandler):
    """Serves every route of one path; the route table decides method, role and models."""

    def initialize(self, services: Services, routes: dict[str, Route]) -> None:
        self.services = services
        self.routes = routes

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.set_header("X-Content-Type-Options", "nosniff")

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        body = {"error": {"code": "internal" if status_code >= 500 else "http_error",
                          "message": self._reason, "details": None}}
        self.finish(json.dumps(body))

    async def get(self, **path: str) -> None:
        await self._dispatch("GET", path)

    async def post(self, **path: str) -> None:
        await self._dispatch("POST", path)

    async def delete(self, **path: str) -> None:
        await self._dispatch("DELETE", path)

    async def put(self, **path: str) -> None:
        await self._dispatch("PUT", path)

    async def patch(self, **path: str) -> None:
        await self._dispatch("PATCH", path)

    async def _dispatch(self, method: str, path: dict[str, str]) -> None:
        route = self.routes.get(method)
        principal: Principal | None = None
        try:
            if route is None:
                self.set_header("Allow", ", ".join(sorted(self.routes)))
                self._send_error(405, "method_not_allowed",
                                 f"{method} is not allowed here; use {', '.join(sorted(self.routes))}")
                return
            if route.path in ("/healthz", "/readyz"):
                principal = DEV_PRINCIPAL
            else:
                principal = await authenticate_request(self, self.services)
                principal.require(route.role)
            call = Call(services=self.services, principal=principal, path=path,
                        query=parse(route.query, query_dict(route.query, self.request.query_arguments))
                        if route.query else None,
                        body=parse(route.body, self._body()) if route.body else None,
                        idempotency_key=self.request.headers.get("Idempotency-Key"))
            if route.query is None and self.request.query_arguments:
                raise Invalid(f"{route.name} takes no query parameters; got {sorted(self.request.query_arguments)}")
            if inspect.iscoroutinefunction(route.handler):
                reply = await route.handler(call)
            else:
                reply = await asyncio.get_running_loop().run_in_executor(None, route.handler, call)
            assert isinstance(reply, Reply)
        except ServiceError as exc:
            if route is not None and exc.http_status == 403:
                await audit_refusal(self, self.services, principal, route.name, exc)
            self._send_error(exc.http_status, exc.code, exc.message, exc.details)
            return
        self.set_status(reply.status)
        for key, value in reply.headers.items():
            self.set_header(key, value)
        self.finish(to_json(reply.body))

    def _body(self) -> Any:
        raw = self.request.body
        if not raw:
            return {}
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise Invalid(f"request body is not valid JSON: {exc}") from None

    def _send_error(self, status: int, code: str, message: str, details: Any = None) -> None:
        self.set_status(status)
        self.finish(json.dumps({"error": {"code": code, "message": message, "details": details}},
                               default=str))


class NotFoundHandler(tornado.web.RequestHandler):
    def prepare(self) -> None:
        self.set_status(404)
        self.set_header("Content-Type", "application/json")
        err = NotFound(f"no API route {self.request.method} {self.request.path}; see /api/v1/openapi.json")
        self.finish(json.dumps(err.envelope()))


class OpenApiHandler(tornado.web.RequestHandler):
    def initialize(self, document: dict[str, Any]) -> None:
        self.document = document

    def get(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(self.document))


class EventsSocket(tornado.websocket.WebSocketHandler):
    """Pushes every operation transition as ``{"topic", "kind", "data"}`` JSON (viewer role).

    Bounded: at most ``ws_per_principal`` open sockets per token (past it: 429 with the envelope, before
    the upgrade), and client messages of at most ``ws_max_message_bytes`` (past it: close 1009 "message
    too big"). The socket only sends; what a client sends within the bound is ignored."""

    def initialize(self, services: Services) -> None:
        self.services = services
        self._unsubscribe: Any = None
        self._recheck: tornado.ioloop.PeriodicCallback | None = None
        self._holds_slot = False
        self._opened = False

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
            self.services.websockets.acquire(self.principal)
            self._holds_slot = True
        except ServiceError as exc:
            self.set_status(exc.http_status)
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps(exc.envelope()))
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

        def forward(event: Event) -> None:
            loop.call_soon_threadsafe(self._send, event)

        self._unsubscribe = self.services.bus.subscribe(forward)
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
                await loop.run_in_executor(None, self.services.tokens.principal, principal.token_id, "api")
        except Unauthorized:
            self.close(1008, "session ended" if principal.session else "token revoked")

    def _send(self, event: Event) -> None:
        if self.ws_connection is None or self.ws_connection.is_closing():
            return
        if event.topic == "token" and event.kind == "revoked" and event.data.get("id") == self.principal.token_id:
            self.close(1008, "token revoked")
            return
        self.write_message(json.dumps(event.to_json()))

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


# ----- OpenAPI 3.1 from the route table ------------------------------------------------------------------

def _models(routes: list[Route]) -> list[type[BaseModel]]:
    seen: list[type[BaseModel]] = [ErrorEnvelope]
    for r in routes:
        for model in (r.query, r.body, r.response):
            if model is not None and model not in seen:
                seen.append(model)
    return seen


def openapi_document(routes: list[Route] = ROUTES) -> dict[str, Any]:
    """OpenAPI 3.1, generated from the routes and pydantic models; ``x-mcp-tool`` feeds the bridge."""
    models = _models(routes)
    keys = [(m, "validation" if issubclass(m, RequestModel) else "serialization") for m in models]
    refs, defs = models_json_schema(keys, ref_template="#/components/schemas/{model}")  # type: ignore[arg-type]
    schemas = defs.get("$defs", {})

    def ref(model: type[BaseModel], request: bool) -> dict[str, Any]:
        return dict(refs[(model, "validation" if request else "serialization")])

    paths: dict[str, dict[str, Any]] = {}
    for r in routes:
        params: list[dict[str, Any]] = [
            {"name": name, "in": "path", "required": True, "description": desc, "schema": {"type": "string"}}
            for name, desc in r.path_params.items()
        ]
        if r.query is not None:
            qschema = r.query.model_json_schema(ref_template="#/components/schemas/{model}")
            for name, prop in qschema.get("properties", {}).items():
                prop = dict(prop)
                desc = prop.pop("description", "")
                params.append({"name": name, "in": "query", "required": name in qschema.get("required", []),
                               "description": desc, "schema": prop})
        op: dict[str, Any] = {
            "operationId": r.name,
            "summary": r.summary,
            "description": r.description or r.summary,
            "tags": [r.tag],
            "parameters": params,
            "x-required-role": r.role.value,
            "responses": {
                str(r.status): {"description": "OK" if r.status < 300 else "accepted"},
                "default": {"description": "error",
                            "content": {"application/json": {"schema": ref(ErrorEnvelope, False)}}},
            },
        }
        if r.response is not None:
            schema = ref(r.response, False)
            if r.many:
                schema = {"type": "array", "items": schema}
            op["responses"][str(r.status)]["content"] = {"application/json": {"schema": schema}}
        if r.body is not None:
            op["requestBody"] = {"required": True,
                                 "content": {"application/json": {"schema": ref(r.body, True)}}}
        if r.path.startswith("/api/"):
            op["security"] = [{"bearer": []}, {"session": []}]
        if r.mcp:
            op["x-mcp-tool"] = {"name": r.name, "title": r.summary, "readOnlyHint": r.read_only,
                                "destructiveHint": r.destructive, "idempotentHint": r.idempotent}
        paths.setdefault(r.path, {})[r.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "InstantStart", "version": __version__,
                 "description": "Control plane for SageMaker HyperPod on EKS. Mutations answer 202 with an "
                                "operation; follow it at its status_url (long-poll with ?wait=N)."},
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "description": "an API token (ist_...)"},
                "session": {"type": "apiKey", "in": "cookie", "name": SESSION_COOKIE},
            },
        },
    }


def _pattern(path: str) -> str:
    return re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", path) + "$"


def rest_patterns(services: Services, routes: list[Route] = ROUTES) -> list[tuple[Any, ...]]:
    """Tornado URL patterns for every route, the OpenAPI document, events and the /api 404 catch-all."""
    check_routes(routes)
    by_path: dict[str, dict[str, Route]] = {}
    for r in routes:
        by_path.setdefault(r.path, {})[r.method] = r
    patterns: list[tuple[Any, ...]] = [
        (r"/api/v1/openapi\.json$", OpenApiHandler, {"document": openapi_document(routes)}),
        (r"/api/v1/events$", EventsSocket, {"services": services}),
    ]
    for path, methods in by_path.items():
        patterns.append((_pattern(path), ApiHandler, {"services": services, "routes": methods}))
    patterns.append((r"/api/.*", NotFoundHandler))
    return patterns
