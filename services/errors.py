"""One error taxonomy for the whole backend, mapped once at each edge.

Domain code raises these; the adapters (``services/aws.py``, ``services/kube.py``) classify botocore and
Kubernetes failures into them with :func:`classify_aws` and :func:`classify_kube`, by error *code* and HTTP
*status*, never by message text and never at a call site. An exception that is none of these (a
``KeyError`` on a response) is a bug: the engine fails the stage at once with code ``internal``. Each face
maps a :class:`ServiceError` to its own shape with :meth:`ServiceError.envelope` (REST body, MCP
``isError`` payload, dashboard notification).
"""

from __future__ import annotations

import json
from typing import Any


class ServiceError(Exception):
    """Base of every error the backend reports to a caller.

    Raised as is (code ``internal``, 500) it means an unclassified failure: a bug to report. A failure that
    is understood but cannot be fixed by retrying is :class:`Permanent` instead.
    """

    code: str = "internal"
    http_status: int = 500

    def __init__(self, message: str, *, details: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def envelope(self) -> dict[str, Any]:
        """The one error shape every face returns: ``{"error": {"code", "message", "details"}}``."""
        return {"error": {"code": self.code, "message": self.message, "details": self.details}}


class Invalid(ServiceError):
    """The request is malformed or breaks a rule; retrying it unchanged fails again."""

    code = "invalid"
    http_status = 422


class Unauthorized(ServiceError):
    """No credentials, or credentials that match no active token."""

    code = "unauthorized"
    http_status = 401


class Forbidden(ServiceError):
    """Authenticated, but the role (or ownership of the resource) does not allow this."""

    code = "forbidden"
    http_status = 403


class NotFound(ServiceError):
    code = "not_found"
    http_status = 404


class Conflict(ServiceError):
    """The target's current state forbids the request (already exists, in use, wrong status)."""

    code = "conflict"
    http_status = 409


class Transient(ServiceError):
    """A passing failure (throttling, timeouts, 5xx): the same request may succeed after ``delay`` s."""

    code = "transient"
    http_status = 503

    def __init__(self, message: str, *, delay: float = 5.0, details: Any = None) -> None:
        super().__init__(message, details=details)
        self.delay = delay


class Permanent(ServiceError):
    """A failure that retrying will not fix (an unsupported state, an AWS quota or limit)."""

    code = "permanent"
    http_status = 500


class DeadlineExceeded(Permanent):
    """A stage still waiting when its deadline passed; the message names the stage, what it waited for and
    for how long."""

    reason = "DeadlineExceeded"


class MethodNotAllowed(ServiceError):
    """The path exists, the method does not (the answer carries ``Allow``)."""

    code = "method_not_allowed"
    http_status = 405


class TooLarge(ServiceError):
    """The request body is over the server's limit; it was not read."""

    code = "too_large"
    http_status = 413


class HeadersTooLarge(ServiceError):
    """The request's header block is over the server's limit."""

    code = "headers_too_large"
    http_status = 431


class TooManyRequests(ServiceError):
    """A per-principal bound (event WebSockets, long-polls) or the sign-in throttle's queue is full."""

    code = "too_many_requests"
    http_status = 429


# Every ``error.code`` a face can answer: the classes above, plus ``http_error`` for a refusal the web server
# makes before any of our code runs (a malformed request), with the HTTP status it chose.
ERROR_CODES: tuple[str, ...] = (
    "invalid", "unauthorized", "forbidden", "not_found", "conflict", "transient", "permanent", "internal",
    "method_not_allowed", "too_large", "headers_too_large", "too_many_requests", "http_error",
)


# botocore Error.Code values by meaning; prefixes and suffixes cover the families (InvalidParameterValue,
# AccessDeniedException, InvalidVpcID.NotFound, ...). Checked in this order.
_THROTTLING = frozenset({
    "Throttling", "ThrottlingException", "ThrottledException", "TooManyRequestsException", "RequestLimitExceeded",
    "RequestThrottled", "RequestThrottledException", "SlowDown", "ProvisionedThroughputExceededException",
    "PriorRequestNotComplete", "EC2ThrottledException", "BandwidthLimitExceeded",
})
_SERVER_SIDE = frozenset({
    "InternalFailure", "InternalError", "InternalServerError", "InternalServerException", "ServiceUnavailable",
    "ServiceUnavailableException", "ServiceFailure", "RequestTimeout", "RequestTimeoutException",
})
_CAPACITY = frozenset({"InsufficientInstanceCapacity", "InsufficientCapacityException"})
_NOT_FOUND = frozenset({"NoSuchEntity", "NotFoundException", "NotFound"})
_CONFLICT = frozenset({"ConflictException", "EntityAlreadyExists", "AlreadyExistsException",
                       "ResourceExistsException", "ResourceAlreadyExistsException"})
_INVALID = frozenset({"ValidationException", "ValidationError", "InvalidRequestException", "InvalidInput",
                      "MalformedPolicyDocument", "MissingParameter"})
_FORBIDDEN = frozenset({"UnauthorizedOperation", "UnauthorizedException", "UnrecognizedClientException",
                        "InvalidClientTokenId", "ExpiredToken", "ExpiredTokenException"})
_QUOTA = frozenset({"ResourceLimitExceeded", "ServiceQuotaExceededException", "LimitExceeded",
                    "LimitExceededException", "QuotaExceededException"})

THROTTLE_DELAY = 1.0  # seconds before the first retry of a throttled call; the engine's backoff grows it
SERVER_DELAY = 2.0
CAPACITY_DELAY = 30.0


def classify_aws(code: str, message: str, http_status: int, action: str) -> ServiceError:
    """The taxonomy's reading of an AWS error response; ``action`` is ``service:Operation`` (IAM's spelling)."""
    details = {"aws_code": code, "http_status": http_status, "action": action}
    text = f"AWS {action}: {code}: {message or code}"
    if code in _THROTTLING:
        return Transient(f"AWS throttled {action} ({code}): {message}", delay=THROTTLE_DELAY, details=details)
    if code in _SERVER_SIDE:
        return Transient(text, delay=SERVER_DELAY, details=details)
    if code in _CAPACITY:
        return Transient(text, delay=CAPACITY_DELAY, details=details)
    if code.startswith("AccessDenied") or code in _FORBIDDEN:
        return Forbidden(f"AWS denied {action} ({code}): {message}; the caller's IAM policy must allow {action}",
                         details=details)
    if code.startswith(("ResourceNotFound", "NoSuch")) or code.endswith(".NotFound") or code in _NOT_FOUND:
        return NotFound(text, details=details)
    if code.startswith("ResourceInUse") or code in _CONFLICT:
        return Conflict(text, details=details)
    if code.startswith("InvalidParameter") or code in _INVALID:
        return Invalid(text, details=details)
    if code in _QUOTA:
        return Permanent(text, details=details)  # AWS's own message says which quota and how to raise it
    if http_status >= 500 or http_status == 429:
        return Transient(text, delay=SERVER_DELAY, details=details)
    return Permanent(text, details=details)


def classify_kube(status: int, reason: str, body: Any, action: str = "", retry_after: float | None = None
                  ) -> ServiceError:
    """The taxonomy's reading of a Kubernetes API error by HTTP status (422 carries its field causes)."""
    parsed = body if isinstance(body, dict) else _json_or_none(body)
    server_message = str(parsed.get("message", "")) if isinstance(parsed, dict) else ""
    details: dict[str, Any] = {"http_status": status, "reason": reason, "action": action or None}
    where = f" {action}" if action else ""
    text = f"Kubernetes{where} answered {status} {reason}".rstrip() + (f": {server_message}" if server_message else "")
    if status == 422:
        causes = (parsed.get("details") or {}).get("causes", []) if isinstance(parsed, dict) else []
        details["causes"] = [{"field": c.get("field"), "reason": c.get("reason"), "message": c.get("message")}
                             for c in causes if isinstance(c, dict)]
        listed = "; ".join(f"{c['field'] or '?'}: {c['message'] or c['reason']}" for c in details["causes"])
        return Invalid(f"Kubernetes{where} rejected the object: {listed or server_message or reason}",
                       details=details)
    if status == 429:
        return Transient(text, delay=retry_after if retry_after is not None else THROTTLE_DELAY, details=details)
    if status == 0 or status >= 500:
        return Transient(text, delay=SERVER_DELAY, details=details)
    cls: type[ServiceError] = {400: Invalid, 401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict,
                               410: Conflict}.get(status, Permanent)
    return cls(text, details=details)


def _json_or_none(body: Any) -> Any:
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if not isinstance(body, str):
        return None
    try:
        return json.loads(body)
    except ValueError:
        return None
