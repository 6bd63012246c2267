"""One HTTP endpoint for every AWS service of the sandbox, like a regional AWS endpoint.

boto3 clients, the product's adapters and ``aws --endpoint-url`` all talk to this front. For each request
it finds the service (SigV4 credential scope) and the operation (``protocol.py``), answers a throttling
error while a ``throttle`` fault is armed and a 403 naming the action while an ``access_denied`` one is
(for every call, moto-bound ones too), and then either validates
the input against the botocore model and calls the :class:`~sandbox.aws.base.SimulatedService` that owns
the operation, or forwards the request byte for byte to the in-process moto server and relays its answer
(once it passed the checks AWS makes and moto does not: model validation, policy JSON, EC2 tags, AssumeRole
trust, see ``forwarded.py``).
Every call goes to the call ledger (:mod:`sandbox.ledger`) when the front has one; a mutation's entry is on
disk before its answer leaves, and so is the simulator's state (``after_write``).

A service's ``handle`` and ``tick`` never run at the same time: both take the service's lock (see
:meth:`AwsFront.lock`). Handlers run on an executor thread so a slow simulator never blocks the event loop
of an application the front is mounted in. The front never imports ``services/`` or ``app/``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from botocore.model import OperationModel
from tornado.iostream import StreamClosedError
from tornado.web import Application, RequestHandler

from sandbox.threaded import ThreadedHttpServer

from . import protocol
from .base import AwsError, Call, FaultRegistry, SimulatedService
from .forwarded import ForwardedChecks, query_params
from .moto_backend import Forwarded
from .validation import validate

if TYPE_CHECKING:
    from sandbox.ledger import Ledger

ACCOUNT_ID = "123456789012"
_log = logging.getLogger("sandbox.aws.front")
_HOP_HEADERS = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "expect",
                          "proxy-connection", "te", "upgrade"})
HOLD_POLL = 0.05  # how often a held answer looks whether it was released or its client went away
CHUNK = 1024 * 1024  # moto's answers are relayed in chunks of this size, never buffered whole
_READ_PREFIXES = ("Describe", "List", "Get", "Head", "Search", "BatchGet", "Simulate")
# parameters that name what a call acts on, most specific last: the ledger's ``target``
_PRIMARY = ("ClusterName", "clusterName", "name", "ResourceArn", "resourceArn", "RoleName", "Bucket", "FileSystemId",
            "VpcId", "SubnetId", "GroupId", "InstanceId", "ServiceCode", "PolicyArn", "UserName",
            "TrackingServerName")
_SECONDARY = ("addonName", "nodegroupName", "principalArn", "associationId", "NodeId", "InstanceGroupName", "Key",
              "QuotaCode", "NodeIds")
LEDGER_PARSE_LIMIT = 1024 * 1024


class Backend(Protocol):
    """Where requests no simulator owns go (the world's :class:`~sandbox.aws.moto_backend.MotoBackend`):
    ``forward`` (blocking; the front calls it on an executor thread) sends one request and returns the answer."""

    def forward(self, method: str, uri: str, headers: Mapping[str, str], body: bytes) -> Forwarded: ...


class AwsFront:
    """Routes calls to registered simulators or to ``backend`` (moto); serve it with :meth:`url_patterns`
    in any Tornado application or alone with :meth:`start`."""

    def __init__(self, backend: Backend, faults: FaultRegistry, *, account: str = ACCOUNT_ID,
                 region: str = "us-west-2", ledger: Ledger | None = None) -> None:
        self.backend = backend
        self.faults = faults
        self.ledger = ledger
        # called with the service after a simulator answered a mutating call, before the answer leaves
        # (the world saves that simulator's state there: it is durable before the client hears of it)
        self.after_write: Callable[[str], None] | None = None
        # what AWS checks on requests bound for moto before moto sees them (the world sets it)
        self.forwarded: ForwardedChecks | None = None
        self.account = account
        self.region = region
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

    def owner_of(self, service: str) -> SimulatedService | None:
        return self._simulators.get(service)

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
            try:
                return simulator.handle(call)
            finally:
                if self.after_write is not None and is_write(call.operation):
                    self.after_write(call.service)

    # --- HTTP ---------------------------------------------------------------------------------------------

    def url_patterns(self, prefix: str = "") -> list[tuple[str, type, dict[str, Any]]]:
        """Tornado URL specs serving the front under ``prefix`` (clients use ``endpoint_url=<base><prefix>``)."""
        return [(rf"{prefix}(?:/.*)?", _AwsHandler, {"front": self, "prefix": prefix})]

    def record(self, entry: dict[str, Any]) -> int:
        """Put one call in the ledger (if there is one); returns its sequence number (0 without a ledger)."""
        return self.ledger.record(entry) if self.ledger is not None else 0

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, host: str = "127.0.0.1", port: int = 0,
              extra_patterns: list[tuple[str, type, dict[str, Any]]] | None = None) -> AwsFront:
        """Serve on ``host:port`` (0: a free port) from a daemon thread with its own event loop;
        ``extra_patterns`` go before the front's catch-all (the sandbox's control API)."""
        patterns = [*(extra_patterns or []), *self.url_patterns()]
        self._http = ThreadedHttpServer(lambda: Application(patterns, log_function=_log_request), host,
                                        port, name="aws-front", max_body_size=5 * 1024**3,
                                        idle_connection_timeout=300)
        self._http.start()
        self.port = self._http.port
        return self

    def stop(self) -> None:
        if self._http is not None:
            self._http.stop()
            self._http = None


def is_write(operation: str) -> bool:
    """Whether an API operation changes state (by AWS's naming: reads are Describe*, List*, Get*, ...)."""
    return not operation.startswith(_READ_PREFIXES)


def call_target(params: Mapping[str, Any] | None, fallback: str) -> str:
    """What a call acts on, for the ledger: e.g. ``hp-eks`` or ``hp-eks/vpc-cni``."""
    if not params:
        return fallback
    primary = next((str(params[k]) for k in _PRIMARY if params.get(k) not in (None, "")), "")
    secondary = next((params[k] for k in _SECONDARY if params.get(k) not in (None, "")), "")
    if isinstance(secondary, list):
        secondary = ",".join(map(str, secondary[:5]))
    return "/".join(part for part in (primary, str(secondary)) if part) or fallback


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
        self._gone = False  # the client closed the connection (a held answer stops waiting)

    def compute_etag(self) -> None:
        return None

    async def _dispatch(self) -> None:
        front = self.front
        path = self.request.path[len(self.prefix):] or "/"  # still percent-encoded, as REST URI labels must be
        headers = self.request.headers
        query = {k: [v.decode("utf-8", "replace") for v in vs] for k, vs in self.request.query_arguments.items()}
        request = protocol.Request(self.request.method or "GET", path, query, headers, self.request.body)
        scope = protocol.credential_scope(headers, query)
        self._entry: dict[str, Any] = {
            "kind": "aws", "service": "", "operation": "", "target": path, "request": None,
            "write": self.request.method not in ("GET", "HEAD", "OPTIONS"),
            "caller": {"access_key": scope.access_key if scope else "", "user_agent": headers.get("User-Agent", "")}}
        service = None
        if scope is not None:
            service = await asyncio.get_running_loop().run_in_executor(
                None, protocol.service_for_signing_name, scope.signing_name)
        if service is None or scope is None:
            await self._forward(path)
            return
        model = protocol.service_model(service)
        op = protocol.find_operation(service, request)
        self._entry["service"] = service
        params: dict[str, Any] | None = None
        recorded: dict[str, Any] | None = None
        if op is not None:
            self._entry.update(operation=op.name, write=is_write(op.name))
            if model.protocol in ("query", "ec2"):
                recorded = _form_params(self.request.body, query)
            elif len(self.request.body) <= LEDGER_PARSE_LIMIT:
                try:
                    params = recorded = protocol.parse_params(op, request)
                except Exception:  # what moto makes of it is moto's business; the ledger keeps the path
                    params = None
            self._entry.update(request=recorded, target=call_target(recorded, path))
        if front.faults.take("throttle", service=service, operation=op.name if op else ""):
            await self._answer(protocol.throttle_error(model.protocol))
            return
        if op is not None and front.faults.take("access_denied", service=service, action=op.name):
            await self._answer(protocol.access_denied_error(model.protocol, front.account,
                                                            f"{scope.signing_name}:{op.name}", self._entry["target"]))
            return
        if op is None or front.owner(service, op.name) is None:
            refusal = None
            if op is not None and front.forwarded is not None:
                checked = params
                if model.protocol in ("query", "ec2"):  # a body too big to parse is not checked
                    checked = query_params(op, recorded or {}) if len(self.request.body) <= LEDGER_PARSE_LIMIT \
                        else None
                refusal = await asyncio.get_running_loop().run_in_executor(None, self._refusal, op, checked,
                                                                           scope.access_key)
            if refusal is not None:
                await self._answer(protocol.serialize_error(model.protocol, refusal, refusal.status), refusal.code)
                return
            await self._forward(path)
            return
        try:
            if params is None:
                params = query_params(op, recorded or {}) if model.protocol == "query" else \
                    protocol.parse_params(op, request)
            call = Call(service, op.name, params, scope.region, front.account)
            result = await asyncio.get_running_loop().run_in_executor(None, front.call, call)
            await self._answer(protocol.serialize_result(op, result))
        except AwsError as exc:
            await self._answer(protocol.serialize_error(model.protocol, exc, protocol.error_status(service, exc)),
                               exc.code)
        except ValueError as exc:
            error = AwsError("SerializationException", f"Could not parse the request: {exc}")
            await self._answer(protocol.serialize_error(model.protocol, error), error.code)

    def _refusal(self, op: OperationModel, params: dict[str, Any] | None, access_key: str) -> AwsError | None:
        """What AWS answers a request bound for moto with instead of moto's answer (see ``forwarded.py``)."""
        if params is None or self.front.forwarded is None:
            return None
        try:
            self.front.forwarded.check(op, params, access_key)
        except AwsError as exc:
            return exc
        return None

    async def _ledger(self, status: int, error: str | None) -> None:
        """Record the call; a mutation's entry is on disk before its answer leaves."""
        seq = self.front.record({**self._entry, "status": status, "error": error})
        if seq and self._entry["write"] and self.front.ledger is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.front.ledger.wait, seq)

    async def _answer(self, response: protocol.Response, error: str | None = None) -> None:
        if error is None and response.status >= 400:
            error = response.headers.get("x-amzn-ErrorType") or _error_code(response.body)
        await self._ledger(response.status, error)
        if await self._held(response.status):
            self._write(response)

    def on_connection_close(self) -> None:
        self._gone = True

    async def _held(self, status: int) -> bool:
        """Hold a successful call's answer while a ``hold_response`` fault for it is armed: the call is made
        and in the ledger, its answer waits until the fault is cleared. False if the client went away
        meanwhile (a killed caller: the act happened, its answer was never seen)."""
        fault = None
        if status < 400 and self._entry["operation"]:
            fault = self.front.faults.take("hold_response", service=self._entry["service"],
                                           operation=self._entry["operation"])
        if fault is None:
            return True
        released = self.front.faults.hold(fault)
        stream = getattr(self.request.connection, "stream", None)  # HTTP/1's IOStream
        try:
            while not released.is_set():
                if self._gone or stream is None or stream.closed():
                    return False
                await asyncio.sleep(HOLD_POLL)
            return True
        finally:
            self.front.faults.unhold(fault)

    get = head = post = delete = patch = put = options = _dispatch

    def _write(self, response: protocol.Response) -> None:
        self.set_status(response.status)
        for key, value in response.headers.items():
            self.set_header(key, value)
        if response.body and self.request.method != "HEAD":
            self.write(response.body)

    async def _forward(self, path: str) -> None:
        """Relay the request to moto unchanged and its answer back unchanged, streaming the body."""
        uri = path + (f"?{self.request.query}" if self.request.query else "")
        headers = {k: v for k, v in self.request.headers.get_all() if k.lower() not in _HOP_HEADERS}
        method = self.request.method or "GET"
        loop = asyncio.get_running_loop()
        try:
            response = await loop.run_in_executor(None, self.front.backend.forward, method, uri, headers,
                                                  self.request.body)
        except OSError as exc:  # only connection-level failures reach here
            await self._ledger(502, "BackendUnavailable")
            self.set_status(502)
            self.write(f"sandbox AWS backend unavailable: {exc}")
            return
        try:
            error = None
            if response.status >= 400:
                error = next((v.split(":")[0] for k, v in response.headers if k.lower() == "x-amzn-errortype"), None)
            await self._ledger(response.status, error)
            if not await self._held(response.status):
                return
            self.set_status(response.status, response.reason)
            self.clear_header("Content-Type")
            length = None
            for key, value in response.headers:
                if key.lower() == "content-length":
                    length = value
                elif key.lower() not in _HOP_HEADERS:
                    self.add_header(key, value)
            if length is not None and (method == "HEAD" or response.status not in (204, 304)):
                self.set_header("Content-Length", length)
            if method == "HEAD" or response.status in (204, 304):
                return
            while chunk := await loop.run_in_executor(None, response.read, CHUNK):
                self.write(chunk)
                await self.flush()
        except StreamClosedError:
            pass  # the client went away
        finally:
            response.close()


def _form_params(body: bytes, query: dict[str, list[str]]) -> dict[str, Any]:
    """The flat parameters of a query-protocol call (EC2, IAM, STS: ``CidrBlock``, ``TagSpecification.1.Key``)."""
    from urllib.parse import parse_qs

    fields = {k: v[-1] for k, v in query.items() if not k.startswith("X-Amz-")}
    if body and len(body) <= LEDGER_PARSE_LIMIT:
        fields.update({k: v[-1] for k, v in parse_qs(body.decode("utf-8", "replace")).items()})
    return {k: v for k, v in fields.items() if k not in ("Action", "Version")}


def _error_code(body: bytes) -> str | None:
    """The ``Code`` (XML) or ``__type`` (JSON) of one of our own error bodies."""
    text = body[:4096].decode("utf-8", "replace")
    if "<Code>" in text:
        return text.split("<Code>", 1)[1].split("</Code>", 1)[0]
    if '"__type"' in text:
        with contextlib.suppress(ValueError, AttributeError):
            return str(json.loads(text).get("__type")) or None
    return None
