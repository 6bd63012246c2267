"""One HTTP endpoint for every AWS service of the sandbox, like a regional AWS endpoint.

boto3 clients, the product's adapters and ``aws --endpoint-url`` all talk to this front. For each request
it finds the service (SigV4 credential scope) and the operation (``protocol.py``), answers a throttling
error while a ``throttle`` fault is armed (for every call, moto-bound ones too), and then either validates
the input against the botocore model and calls the :class:`~sandbox.aws.base.SimulatedService` that owns
the operation, or forwards the request byte for byte to the in-process moto server and relays its answer.

A service's ``handle`` and ``tick`` never run at the same time: both take the service's lock (see
:meth:`AwsFront.lock`). Handlers run on an executor thread so a slow simulator never blocks the event loop
of an application the front is mounted in. The front never imports ``services/`` or ``app/``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.httpclient import HTTPResponse as ClientResponse
from tornado.web import Application, RequestHandler

from sandbox.threaded import ThreadedHttpServer

from . import protocol
from .base import AwsError, Call, FaultRegistry, SimulatedService
from .validation import validate

ACCOUNT_ID = "123456789012"
_log = logging.getLogger("sandbox.aws.front")
_HOP_HEADERS = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "expect",
                          "proxy-connection", "te", "upgrade"})
# (method, path with query, headers, body) of a request forwarded to moto, for the world's recorder.
ForwardHook = Callable[[str, str, Mapping[str, str], bytes], None]


class AwsFront:
    """Routes calls to registered simulators or to moto at ``moto_url``; serve it with :meth:`url_patterns`
    in any Tornado application or alone with :meth:`start`."""

    def __init__(self, moto_url: str, faults: FaultRegistry, *, account: str = ACCOUNT_ID,
                 region: str = "us-west-2", on_forward: ForwardHook | None = None) -> None:
        self.moto_url = moto_url.rstrip("/")
        self.faults = faults
        self.account = account
        self.region = region
        self.on_forward = on_forward
        self._simulators: dict[str, SimulatedService] = {}
        self._locks: dict[str, threading.RLock] = {}
        self._http: ThreadedHttpServer | None = None
        self.port = 0

    # --- simulators ----------------------------------------------------------------------------------

    def register(self, simulator: SimulatedService) -> None:
        """Route ``simulator.operations`` of ``simulator.service`` to it, replacing any earlier simulator."""
        self._simulators[simulator.service] = simulator
        self._locks.setdefault(simulator.service, threading.RLock())

    @property
    def simulators(self) -> list[SimulatedService]:
        return list(self._simulators.values())

    def lock(self, service: str) -> threading.RLock:
        """The lock serialising ``handle`` and ``tick`` of the simulator of ``service``."""
        return self._locks.setdefault(service, threading.RLock())

    def owner(self, service: str, operation: str) -> SimulatedService | None:
        simulator = self._simulators.get(service)
        return simulator if simulator is not None and operation in simulator.operations else None

    def call(self, call: Call) -> dict[str, Any]:
        """Validate and run one call on its simulator (also the in-process path tests may use)."""
        simulator = self.owner(call.service, call.operation)
        if simulator is None:
            raise AwsError("UnknownOperationException", f"{call.service}.{call.operation} is not simulated")
        validate(protocol.service_model(call.service).operation_model(call.operation), call.params)
        with self.lock(call.service):
            return simulator.handle(call)

    # --- HTTP ---------------------------------------------------------------------------------------------

    def url_patterns(self, prefix: str = "") -> list[tuple[str, type, dict[str, Any]]]:
        """Tornado URL specs serving the front under ``prefix`` (clients use ``endpoint_url=<base><prefix>``)."""
        return [(rf"{prefix}(?:/.*)?", _AwsHandler, {"front": self, "prefix": prefix})]

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, host: str = "127.0.0.1", port: int = 0) -> AwsFront:
        """Serve on ``host:port`` (0: a free port) from a daemon thread with its own event loop."""
        self._http = ThreadedHttpServer(lambda: Application(self.url_patterns(), log_function=_log_request), host,
                                        port, name="aws-front", max_body_size=5 * 1024**3,
                                        idle_connection_timeout=300)
        self._http.start()
        self.port = self._http.port
        return self

    def stop(self) -> None:
        if self._http is not None:
            self._http.stop()
            self._http = None


def _log_request(handler: RequestHandler) -> None:
    """AWS errors are answers, not server faults: log requests at debug level, 5xx from moto at warning."""
    status = handler.get_status()
    level = logging.WARNING if status >= 500 and status != 503 else logging.DEBUG
    _log.log(level, "%d %s %.1fms", status, handler._request_summary(), 1000 * handler.request.request_time())


class _AwsHandler(RequestHandler):
    SUPPORTED_METHODS = ("GET", "HEAD", "POST", "DELETE", "PATCH", "PUT", "OPTIONS")

    def initialize(self, front: AwsFront, prefix: str) -> None:
        self.front = front
        self.prefix = prefix

    def compute_etag(self) -> None:
        return None

    async def _dispatch(self) -> None:
        front = self.front
        path = self.request.path[len(self.prefix):] or "/"  # still percent-encoded, as REST URI labels must be
        headers = self.request.headers
        query = {k: [v.decode("utf-8", "replace") for v in vs] for k, vs in self.request.query_arguments.items()}
        request = protocol.Request(self.request.method or "GET", path, query, headers, self.request.body)
        scope = protocol.credential_scope(headers, query)
        service = None
        if scope is not None:
            service = await asyncio.get_running_loop().run_in_executor(
                None, protocol.service_for_signing_name, scope.signing_name)
        if service is None or scope is None:
            await self._forward(path)
            return
        model = protocol.service_model(service)
        op = protocol.find_operation(service, request)
        if front.faults.take("throttle", service=service, operation=op.name if op else ""):
            self._write(protocol.throttle_error(model.protocol))
            return
        if op is None or front.owner(service, op.name) is None:
            await self._forward(path)
            return
        try:
            params = protocol.parse_params(op, request)
            call = Call(service, op.name, params, scope.region, front.account)
            result = await asyncio.get_running_loop().run_in_executor(None, front.call, call)
            self._write(protocol.serialize_result(op, result))
        except AwsError as exc:
            self._write(protocol.serialize_error(model.protocol, exc, protocol.error_status(service, exc)))
        except ValueError as exc:
            error = AwsError("SerializationException", f"Could not parse the request: {exc}")
            self._write(protocol.serialize_error(model.protocol, error))

    get = head = post = delete = patch = put = options = _dispatch

    def _write(self, response: protocol.Response) -> None:
        self.set_status(response.status)
        for key, value in response.headers.items():
            self.set_header(key, value)
        if response.body and self.request.method != "HEAD":
            self.write(response.body)

    async def _forward(self, path: str) -> None:
        """Relay the request to moto unchanged and its answer back unchanged."""
        front = self.front
        uri = path + (f"?{self.request.query}" if self.request.query else "")
        headers = {k: v for k, v in self.request.headers.get_all() if k.lower() not in _HOP_HEADERS}
        body = self.request.body
        method = self.request.method or "GET"
        if front.on_forward is not None and not path.startswith("/moto-api"):
            front.on_forward(method, uri, headers, body)
        request = HTTPRequest(front.moto_url + uri, method=method, headers=headers,
                              body=body if method in ("POST", "PUT", "PATCH") or body else None,
                              allow_nonstandard_methods=True, follow_redirects=False, decompress_response=False,
                              request_timeout=120)
        try:
            response: ClientResponse = await AsyncHTTPClient().fetch(request, raise_error=False)
        except HTTPClientError as exc:  # only connection-level failures reach here
            self.set_status(502)
            self.write(f"sandbox AWS backend unavailable: {exc}")
            return
        self.set_status(response.code, response.reason)
        self.clear_header("Content-Type")
        for key, value in response.headers.get_all():
            if key.lower() not in _HOP_HEADERS:
                self.add_header(key, value)
        if method == "HEAD" and "Content-Length" in response.headers:
            self.set_header("Content-Length", response.headers["Content-Length"])
        if response.body and method != "HEAD" and response.code not in (204, 304):
            self.write(response.body)
