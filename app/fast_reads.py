"""Reads answered from memory without a ``RequestHandler``: the hot path of ``GET /api/v1/status`` and
``GET /api/v1/clusters/{cluster}`` (and every other GET route that answers from memory on the loop).

Under ``wrk`` a cached read cost less than the Tornado machinery around it: a handler object, its
``prepare``/``finish`` coroutine as a task, header bookkeeping, the ``Date`` header formatted per request.
:class:`FastReads` is a Tornado router placed ahead of every other rule. While the request's headers are
routed (a GET has no body, so its answer is written in the same turn of the loop) it tries to answer the
request the way :class:`app.rest.ApiHandler` would and, when it can, returns a delegate that writes the
answer; whenever it cannot, it returns ``None`` and the request goes on to the ordinary rules, so every
refusal, error and slow path is the handler's, unchanged. It answers only:

- a GET with no body, on a path of a route that answers from memory (``Route.on_loop`` or
  ``Route.from_memory``), request headers within the edge's 431 limit;
- with a bearer token that signed in before and is still admitted (``services.auth.TokenStore.cached``:
  revocations seen as by the handler), whose role the route allows;
- whose query and path arguments parse, and whose memory-only answer is a 200 JSON body.

Everything else (no token, a token not admitted yet or revoked, a 403, an unknown path or cluster, a bad
query, a first read that needs a worker) is left to the handler. The answer carries the handler's headers
(``Server``, ``Content-Type``, ``Date``, ``Cache-Control``, ``X-Content-Type-Options``, the application's
output transforms: the security headers) and the same body, and is counted by the access log policy
(app/edge.py ``record_answer``). tests/test_throughput_paths.py compares both paths byte for byte.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import tornado
import tornado.httputil
import tornado.routing
import tornado.web

from app.api.base import Call, Reply, Route
from app.bootstrap import Services
from app.edge import HEADER_LIMIT, PASS_THROUGH, header_bytes
from app.query_args import call_query, path_arguments
from app.rest import UNAUTHENTICATED, bearer_of, claim_of, signed_in_from_memory, to_json
from app.route_table import RouteTable

_OK = tornado.httputil.ResponseStartLine("HTTP/1.1", 200, "OK")
_SERVER = "TornadoServer/" + tornado.version


def memory_reader(route: Route) -> Callable[[Call], Reply | None] | None:
    """What answers ``route`` from memory on the loop, ``None`` when nothing does."""
    if route.method != "GET" or route.path in UNAUTHENTICATED or route.body is not None or \
            route.media_type != "application/json":
        return None
    if route.from_memory is not None:
        return route.from_memory
    return route.handler if route.on_loop else None  # type: ignore[return-value]  # on_loop: synchronous


class _HttpDate:
    """The ``Date`` header's value, formatted once per second (as ``RequestHandler.clear`` would format it)."""

    def __init__(self) -> None:
        self.second = -1
        self.value = ""

    def now(self) -> str:
        second = int(time.time())
        if second != self.second:
            self.second, self.value = second, tornado.httputil.format_timestamp(second)
        return self.value


class _Answer(tornado.httputil.HTTPMessageDelegate):
    """Writes an answer made while the request was routed, once the (empty) request has been read."""

    def __init__(self, request: tornado.httputil.HTTPServerRequest, headers: tornado.httputil.HTTPHeaders,
                 body: bytes, answered: Callable[[tornado.httputil.HTTPServerRequest, int], None]) -> None:
        self.request, self.headers, self.body, self.answered = request, headers, body, answered

    def finish(self) -> None:
        connection = self.request.connection
        assert connection is not None
        connection.write_headers(_OK, self.headers, self.body)
        connection.finish()
        self.answered(self.request, 200)


class FastReads(tornado.routing.Router):
    """The first rule of the server's application: answers what it can (see the module's doc), else ``None``."""

    def __init__(self, app: tornado.web.Application, services: Services, routes: list[Route],
                 answered: Callable[[tornado.httputil.HTTPServerRequest, int], None]) -> None:
        self.app, self.services, self.answered = app, services, answered
        self.readers = {r.name: reader for r in routes if (reader := memory_reader(r)) is not None}
        self.table = RouteTable(routes)  # every route, so a path resolves to the route the handler would serve
        self.date = _HttpDate()

    def find_handler(self, request: tornado.httputil.HTTPServerRequest,
                     **kwargs: Any) -> tornado.httputil.HTTPMessageDelegate | None:
        headers = request.headers
        if request.method != "GET" or "Content-Length" in headers or "Transfer-Encoding" in headers:
            return None
        found = self.table.lookup(request.path)
        route = found[0].get("GET") if found is not None else None
        if found is None or route is None or route.name not in self.readers or header_bytes(request) > HEADER_LIMIT:
            return None
        try:
            body = self._body(request, route, found[1])
            out = None if body is None else self._headers(request, body)
            return None if body is None or out is None else _Answer(request, out, body, self.answered)
        except PASS_THROUGH:
            raise
        except BaseException:  # a refusal, or a bug: the handler answers it (the envelope, or its guarded 500)
            return None

    def _headers(self, request: tornado.httputil.HTTPServerRequest,
                 body: bytes) -> tornado.httputil.HTTPHeaders | None:
        """``ApiHandler``'s headers for a 200 with ``body``, in its order, then the application's transforms
        (``None`` when one would change the status or the body, e.g. compression: left to the handler)."""
        out = tornado.httputil.HTTPHeaders()
        out["Server"] = _SERVER
        out["Content-Type"] = "application/json"
        out["Date"] = self.date.now()
        out["Cache-Control"] = "no-store"
        out["X-Content-Type-Options"] = "nosniff"
        out["Content-Length"] = str(len(body))
        for transform in self.app.transforms:  # the security headers, as RequestHandler.flush applies them
            status, out, changed = transform(request).transform_first_chunk(200, out, body, True)
            if status != 200 or changed is not body:
                return None
        return out

    def _body(self, request: tornado.httputil.HTTPServerRequest, route: Route, params: dict[str, str]) -> bytes | None:
        token = bearer_of(request.headers)
        if token is None:
            return None
        principal = signed_in_from_memory(self.services, token, request.remote_ip or "", face="api",
                                          client=claim_of(request.headers))
        if principal is None or not principal.allows(route.role):
            return None
        if route.query is None and request.query_arguments:
            return None
        call = Call(services=self.services, principal=principal, path=path_arguments(params),
                    query=call_query(route, request.query_arguments), body=None)
        reply = self.readers[route.name](call)
        if reply is None or reply.status != 200 or reply.headers:
            return None
        return to_json(reply.body).encode()


def use_fast_reads(app: tornado.web.Application, services: Services, routes: list[Route],
                   answered: Callable[[tornado.httputil.HTTPServerRequest, int], None]) -> None:
    """Put :class:`FastReads` ahead of every rule of ``app`` (Panel's, Bokeh's and ours): first in the
    application's outermost router, so the others are not walked for what it answers."""
    app.default_router.rules.insert(0, tornado.routing.Rule(tornado.routing.AnyMatches(),
                                                            FastReads(app, services, routes, answered)))
