"""AWS wire protocols for the sandbox front: who is being called, with what, and how to answer.

The front must look exactly like AWS to botocore and the ``aws`` CLI, so everything here is driven by the
installed botocore service model rather than hand-written routes: the service comes from the SigV4
credential scope (signing names differ from botocore names, e.g. ``servicequotas`` is ``service-quotas``),
the operation from ``X-Amz-Target`` (JSON), ``Action`` (query/EC2) or the model's ``requestUri`` templates
(REST); parameters are read from the body, path, query string and headers per member location, and results
and errors are written the way each protocol's botocore parser expects. Simulators see botocore member names
and plain Python values; nothing here knows any service's semantics.
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote
from xml.sax.saxutils import escape

import botocore.session
from botocore.exceptions import UnknownServiceError
from botocore.model import ListShape, MapShape, OperationModel, ServiceModel, Shape, StructureShape

from .base import AwsError

_SCOPE = re.compile(r"Credential=([^/\s,]+)/(\d{8})/([^/\s,]+)/([^/\s,]+)/aws4_request")
# Signing names whose botocore service name differs and that several services share; the common ones.
_SIGNING_ALIASES = {
    "servicequotas": "service-quotas", "monitoring": "cloudwatch", "elasticfilesystem": "efs",
    "states": "stepfunctions", "tagging": "resourcegroupstaggingapi", "access-analyzer": "accessanalyzer",
    "elasticloadbalancing": "elbv2", "elasticmapreduce": "emr", "aps": "amp", "execute-api": "apigateway",
}


@functools.lru_cache(maxsize=1)
def _session() -> botocore.session.Session:
    return botocore.session.get_session()


@functools.lru_cache(maxsize=256)
def service_model(name: str) -> ServiceModel:
    return _session().get_service_model(name)


@functools.lru_cache(maxsize=1)
def _signing_index() -> dict[str, str]:
    """Signing name -> botocore service name over every installed model (slow: ~3 s; built on first miss)."""
    loader = _session().get_component("data_loader")
    index: dict[str, str] = {}
    for name in loader.list_available_services("service-2"):
        meta = loader.load_service_model(name, "service-2")["metadata"]
        index.setdefault(meta.get("signingName", meta["endpointPrefix"]), name)
    return index


@functools.lru_cache(maxsize=512)
def service_for_signing_name(signing: str) -> str | None:
    """The botocore service name for a SigV4 signing name, or ``None`` if botocore knows none."""
    if signing in _SIGNING_ALIASES:
        return _SIGNING_ALIASES[signing]
    try:
        if service_model(signing).signing_name == signing:
            return signing
    except UnknownServiceError:
        pass
    return _signing_index().get(signing)


@dataclass(frozen=True)
class Scope:
    """What the SigV4 credential scope says: access key, region and signing name."""

    access_key: str
    region: str
    signing_name: str


def credential_scope(headers: Mapping[str, str], query: dict[str, list[str]]) -> Scope | None:
    """From the ``Authorization`` header, or from ``X-Amz-Credential`` of a presigned URL."""
    auth = headers.get("Authorization", "")
    match = _SCOPE.search(auth)
    if match:
        return Scope(match.group(1), match.group(3), match.group(4))
    cred = (query.get("X-Amz-Credential") or [""])[0]
    parts = cred.split("/")
    if len(parts) == 5 and parts[4] == "aws4_request":
        return Scope(parts[0], parts[2], parts[3])
    return None


@dataclass(frozen=True)
class Route:
    operation: OperationModel
    method: str
    path: re.Pattern[str]
    query_literals: tuple[tuple[str, str | None], ...]
    specificity: int
    #: headers the operation's required members travel in (lower case): S3 PutObject and CopyObject share
    #: ``PUT /{Bucket}/{Key+}`` and only CopyObject's required ``x-amz-copy-source`` tells them apart
    required_headers: tuple[str, ...] = ()


def _compile_route(op: OperationModel) -> Route:
    uri = op.http["requestUri"]
    path, _, query = uri.partition("?")
    regex = ""
    last = 0
    for match in re.finditer(r"\{([^}]+)\}", path):
        regex += re.escape(path[last:match.start()])
        label = match.group(1)
        group = re.sub(r"\W", "_", label.rstrip("+"))
        regex += f"(?P<{group}>.+)" if label.endswith("+") else f"(?P<{group}>[^/]+)"
        last = match.end()
    regex += re.escape(path[last:])
    literals: list[tuple[str, str | None]] = []
    for item in filter(None, query.split("&")):
        key, eq, value = item.partition("=")
        literals.append((key, value if eq else None))
    literal_chars = len(re.sub(r"\{[^}]+\}", "", path))
    members = op.input_shape.members if op.input_shape is not None else {}
    required = op.input_shape.required_members if op.input_shape is not None else []
    headers = tuple(sorted(str(members[m].serialization.get("name", m)).lower() for m in required
                           if members[m].serialization.get("location") == "header"))
    return Route(op, op.http["method"], re.compile(regex + "/?"), tuple(literals),
                 literal_chars * 10 + len(literals) + len(headers), headers)


@functools.lru_cache(maxsize=64)
def _routes(service: str) -> tuple[Route, ...]:
    model = service_model(service)
    routes = [_compile_route(model.operation_model(name)) for name in model.operation_names]
    return tuple(sorted(routes, key=lambda r: -r.specificity))


@dataclass
class Request:
    """The parts of an HTTP request the protocol code needs (path without any mount prefix)."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: Mapping[str, str]
    body: bytes


def find_operation(service: str, request: Request) -> OperationModel | None:
    """The operation a request calls, or ``None`` when the model has no match."""
    model = service_model(service)
    protocol = model.protocol
    if protocol == "json":
        target = request.headers.get("X-Amz-Target", "")
        name = target.rpartition(".")[2]
        return model.operation_model(name) if name in model.operation_names else None
    if protocol in ("query", "ec2"):
        action = (request.query.get("Action") or [""])[0]
        if not action and request.body:
            action = (parse_qs(request.body.decode("utf-8", "replace")).get("Action") or [""])[0]
        return model.operation_model(action) if action in model.operation_names else None
    sent = {key.lower() for key in request.headers}
    for route in _routes(service):
        if route.method != request.method or not route.path.fullmatch(request.path):
            continue
        if not all(header in sent for header in route.required_headers):
            continue
        if all(key in request.query and (value is None or value in request.query[key])
               for key, value in route.query_literals):
            return route.operation
    return None


# --- input ---------------------------------------------------------------------------------------------


def _from_wire(shape: Shape, value: Any) -> Any:
    if value is None:
        return None
    if isinstance(shape, StructureShape) and isinstance(value, dict):
        out: dict[str, Any] = {}
        for name, member in shape.members.items():
            wire = member.serialization.get("name", name)
            if wire in value:
                out[name] = _from_wire(member, value[wire])
        return out
    if isinstance(shape, ListShape) and isinstance(value, list):
        return [_from_wire(shape.member, item) for item in value]
    if isinstance(shape, MapShape) and isinstance(value, dict):
        return {key: _from_wire(shape.value, item) for key, item in value.items()}
    if shape.type_name == "blob" and isinstance(value, str):
        return base64.b64decode(value)
    return value


def _scalar_from_text(shape: Shape, text: str) -> Any:
    kind = shape.type_name
    if kind in ("integer", "long"):
        return int(text)
    if kind in ("float", "double"):
        return float(text)
    if kind == "boolean":
        return text.lower() == "true"
    return text


def parse_params(op: OperationModel, request: Request) -> dict[str, Any]:
    """The operation's input as botocore member names and Python values (JSON and REST-JSON protocols)."""
    shape = op.input_shape
    if shape is None:
        return {}
    try:
        body = json.loads(request.body) if request.body.strip() else {}
    except ValueError as exc:
        raise AwsError("SerializationException", f"Could not parse the request body: {exc}") from exc
    if op.metadata["protocol"] == "json":
        return dict(_from_wire(shape, body) or {})
    params: dict[str, Any] = {}
    payload = shape.serialization.get("payload")
    path_match = next((r.path.fullmatch(request.path) for r in _routes(op.service_model.service_name)
                       if r.operation.name == op.name), None)
    path_values = path_match.groupdict() if path_match else {}
    for name, member in shape.members.items():
        location = member.serialization.get("location")
        wire = member.serialization.get("name", name)
        if location == "uri":
            raw = path_values.get(re.sub(r"\W", "_", wire))
            if raw is not None:
                params[name] = unquote(raw)
        elif location == "querystring":
            if isinstance(member, MapShape):
                params[name] = {k: v[-1] for k, v in request.query.items()}
            elif wire in request.query:
                values = request.query[wire]
                params[name] = ([_scalar_from_text(member.member, v) for v in values] if isinstance(member, ListShape)
                                else _scalar_from_text(member, values[-1]))
        elif location == "header":
            if wire in request.headers:
                params[name] = _scalar_from_text(member, request.headers[wire])
        elif location == "headers":
            prefix = wire.lower()
            params[name] = {k[len(prefix):]: v for k, v in request.headers.items() if k.lower().startswith(prefix)}
        elif payload == name:
            params[name] = _from_wire(member, body) if member.type_name == "structure" else request.body
        elif payload is None and wire in body:
            params[name] = _from_wire(member, body[wire])
    return params


# --- output --------------------------------------------------------------------------------------------


def _timestamp(value: Any, fmt: str) -> Any:
    if isinstance(value, dt.datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    else:
        moment = dt.datetime.fromtimestamp(float(value), dt.UTC)
    if fmt == "iso8601":
        return moment.isoformat().replace("+00:00", "Z")
    if fmt == "rfc822":
        return moment.strftime("%a, %d %b %Y %H:%M:%S GMT")
    return round(moment.timestamp(), 3)


def to_wire(shape: Shape, value: Any) -> Any:
    """A Python value as the JSON the protocol sends (wire names, epoch timestamps, base64 blobs)."""
    if value is None:
        return None
    if isinstance(shape, StructureShape):
        out: dict[str, Any] = {}
        for name, member in shape.members.items():
            if name in value and value[name] is not None and member.serialization.get("location") is None:
                out[member.serialization.get("name", name)] = to_wire(member, value[name])
        return out
    if isinstance(shape, ListShape):
        return [to_wire(shape.member, item) for item in value]
    if isinstance(shape, MapShape):
        return {key: to_wire(shape.value, item) for key, item in value.items()}
    if shape.type_name == "timestamp":
        return _timestamp(value, shape.serialization.get("timestampFormat", "unixTimestamp"))
    if shape.type_name == "blob":
        raw = value.encode() if isinstance(value, str) else value
        return base64.b64encode(raw).decode("ascii")
    return value


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes


def _request_id() -> str:
    return str(uuid.uuid4())


def _xml(shape: Shape, value: Any) -> str:
    """A value in the query protocol's XML: structures by member name, lists as ``member`` elements."""
    if isinstance(shape, StructureShape):
        return "".join(f"<{member.serialization.get('name', name)}>{_xml(member, value[name])}"
                       f"</{member.serialization.get('name', name)}>"
                       for name, member in shape.members.items() if value.get(name) is not None)
    if isinstance(shape, ListShape):
        return "".join(f"<member>{_xml(shape.member, item)}</member>" for item in value)
    if isinstance(shape, MapShape):
        return "".join(f"<entry><key>{escape(str(k))}</key><value>{_xml(shape.value, v)}</value></entry>"
                       for k, v in value.items())
    if isinstance(value, bool):
        return "true" if value else "false"
    if shape.type_name == "timestamp" and not isinstance(value, str):
        return dt.datetime.fromtimestamp(float(value), dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return re.sub(r"[\x00-\x08\x0b\x0c\x0e-\x1f]", "?", escape(str(value)))


def _query_result(op: OperationModel, result: dict[str, Any], headers: dict[str, str]) -> Response:
    """A query-protocol (IAM, STS) answer: ``<OpResponse><OpResult>...</OpResult><ResponseMetadata>``."""
    namespace = op.metadata.get("xmlNamespace", "")
    inner = _xml(op.output_shape, result) if op.output_shape is not None else ""
    wrapper = op.output_shape.serialization.get("resultWrapper", f"{op.name}Result") if op.output_shape else ""
    body = (f'<{op.name}Response xmlns="{namespace}">' + (f"<{wrapper}>{inner}</{wrapper}>" if wrapper else "")
            + f"<ResponseMetadata><RequestId>{headers['x-amzn-RequestId']}</RequestId></ResponseMetadata>"
            f"</{op.name}Response>")
    return Response(200, {**headers, "Content-Type": "text/xml"}, body.encode())


def serialize_result(op: OperationModel, result: dict[str, Any]) -> Response:
    """A successful response for a JSON, REST-JSON or query operation."""
    headers = {"x-amzn-RequestId": _request_id()}
    if op.metadata["protocol"] == "query":
        return _query_result(op, result, headers)
    shape = op.output_shape
    status = int(op.http.get("responseCode", 200))
    if shape is None:
        return Response(status, headers, b"{}" if op.metadata["protocol"] == "json" else b"")
    if op.metadata["protocol"] == "json":
        headers["Content-Type"] = "application/x-amz-json-1.1"
        return Response(status, headers, json.dumps(to_wire(shape, result)).encode())
    headers["Content-Type"] = "application/json"
    for name, member in shape.members.items():
        location = member.serialization.get("location")
        if result.get(name) is None:
            continue
        if location == "header":
            headers[member.serialization.get("name", name)] = str(result[name])
        elif location == "statusCode":
            status = int(result[name])
    payload = shape.serialization.get("payload")
    body_value = to_wire(shape.members[payload], result.get(payload)) if payload else to_wire(shape, result)
    return Response(status, headers, json.dumps(body_value if body_value is not None else {}).encode())


def error_status(service: str, error: AwsError) -> int:
    """The HTTP status of an error: the model's ``httpStatusCode`` for a modelled error, else the raised one."""
    model = service_model(service)
    for shape in model.error_shapes:
        if shape.name == error.code:
            return int(shape.metadata.get("error", {}).get("httpStatusCode", error.status))
    return error.status


def serialize_error(protocol: str, error: AwsError, status: int | None = None) -> Response:
    """An error response that the protocol's botocore parser turns into ``Error.Code``/``Error.Message``."""
    status = error.status if status is None else status
    rid = _request_id()
    if protocol == "json":
        body = json.dumps({"__type": error.code, "message": error.message}).encode()
        return Response(status, {"x-amzn-RequestId": rid, "Content-Type": "application/x-amz-json-1.1"}, body)
    if protocol == "rest-json":
        return Response(status, {"x-amzn-RequestId": rid, "x-amzn-ErrorType": error.code,
                                 "Content-Type": "application/json"}, json.dumps({"message": error.message}).encode())
    text = re.sub(r"[\x00-\x08\x0b\x0c\x0e-\x1f]", "?", escape(error.message))  # XML 1.0 has no such chars
    if protocol == "ec2":
        xml = (f"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Response><Errors><Error><Code>{error.code}</Code>"
                f"<Message>{text}</Message></Error></Errors><RequestID>{rid}</RequestID></Response>")
    elif protocol == "rest-xml":
        xml = (f"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{error.code}</Code><Message>{text}</Message>"
                f"<RequestId>{rid}</RequestId></Error>")
    else:
        xml = (f"<ErrorResponse><Error><Type>Sender</Type><Code>{error.code}</Code><Message>{text}</Message>"
                f"</Error><RequestId>{rid}</RequestId></ErrorResponse>")
    return Response(status, {"x-amzn-RequestId": rid, "Content-Type": "text/xml"}, xml.encode())


# What each protocol calls "slow down" (botocore's retry handler knows all of these as throttling).
THROTTLE_CODES = {"json": ("ThrottlingException", 400), "rest-json": ("ThrottlingException", 400),
                  "query": ("Throttling", 400), "ec2": ("RequestLimitExceeded", 503), "rest-xml": ("SlowDown", 503)}


def throttle_error(protocol: str) -> Response:
    code, status = THROTTLE_CODES.get(protocol, ("ThrottlingException", 400))
    return serialize_error(protocol, AwsError(code, "Rate exceeded", status))


ACCESS_DENIED_CODES = {"json": "AccessDeniedException", "rest-json": "AccessDeniedException", "query": "AccessDenied",
                       "ec2": "UnauthorizedOperation", "rest-xml": "AccessDenied"}


def access_denied_error(protocol: str, account: str, action: str, resource: str) -> Response:
    """What IAM answers when no policy allows ``action`` (``service:Operation``): 403 naming the action."""
    code = ACCESS_DENIED_CODES.get(protocol, "AccessDeniedException")
    # the caller is the IAM user the sandbox's credentials sign as (moto's STS: user "moto"), as in EKS's creator
    message = (f"User: arn:aws:iam::{account}:user/moto is not authorized to perform: {action} on resource: "
               f"{resource or '*'} because no identity-based policy allows the {action} action")
    return serialize_error(protocol, AwsError(code, message, 403))
