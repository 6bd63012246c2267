"""One error taxonomy for the whole backend, mapped once at each edge.

Domain code raises these; adapters classify botocore and Kubernetes failures into them by error *code*
and HTTP *status*, never by message text. Each face maps a :class:`ServiceError` to its own shape with
:meth:`ServiceError.envelope` (REST body, MCP ``isError`` payload, dashboard notification).
"""

from __future__ import annotations

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
    """A failure that retrying will not fix (a bug, an unsupported state, an AWS limit)."""

    code = "permanent"
    http_status = 500


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


# Every ``error.code`` a face can answer: the classes above, plus ``http_error`` for a refusal the web server
# makes before any of our code runs (a malformed request), with the HTTP status it chose.
class TooManyRequests(ServiceError):
    """A per-principal bound (event WebSockets, long-polls) or the sign-in throttle's queue is full."""

    code = "too_many_requests"
    http_status = 429


ERROR_CODES: tuple[str, ...] = (
    "invalid", "unauthorized", "forbidden", "not_found", "conflict", "transient", "permanent", "internal",
    "method_not_allowed", "too_large", "headers_too_large", "too_many_requests", "http_error",
)


_AWS_CODES: dict[str, type[ServiceError]] = {
    # botocore Error.Code values, grouped by meaning
    "ValidationException": Invalid,
    "ValidationError": Invalid,
    "InvalidParameterException": Invalid,
    "InvalidParameterValue": Invalid,
    "InvalidRequestException": Invalid,
    "MalformedPolicyDocument": Invalid,
    "ResourceNotFound": NotFound,
    "ResourceNotFoundException": NotFound,
    "NoSuchEntity": NotFound,
    "NoSuchBucket": NotFound,
    "NotFoundException": NotFound,
    "ResourceInUse": Conflict,
    "ResourceInUseException": Conflict,
    "ConflictException": Conflict,
    "EntityAlreadyExists": Conflict,
    "AlreadyExistsException": Conflict,
    "ResourceLimitExceeded": Permanent,
    "ServiceQuotaExceededException": Permanent,
    "LimitExceeded": Permanent,
    "AccessDenied": Forbidden,
    "AccessDeniedException": Forbidden,
    "UnauthorizedOperation": Forbidden,
    "Throttling": Transient,
    "ThrottlingException": Transient,
    "TooManyRequestsException": Transient,
    "RequestLimitExceeded": Transient,
    "ServiceUnavailable": Transient,
    "ServiceUnavailableException": Transient,
    "InternalFailure": Transient,
    "InternalServerError": Transient,
    "InsufficientInstanceCapacity": Transient,
    "InsufficientCapacityException": Transient,
}


def from_aws(exc: Exception) -> ServiceError:
    """Classify a botocore ``ClientError`` (or connection failure) by its error code."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        err = response.get("Error", {})
        code = str(err.get("Code", ""))
        message = str(err.get("Message", "")) or code
        status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        cls = _AWS_CODES.get(code)
        if cls is None:
            cls = Transient if status >= 500 or status == 429 else Permanent
        return cls(f"AWS {code}: {message}", details={"aws_code": code, "http_status": status})
    # EndpointConnectionError, ReadTimeout and friends carry no response: the network, not the request
    return Transient(f"AWS unreachable: {exc}", details={"exception": type(exc).__name__})


_KUBE_STATUS: dict[int, type[ServiceError]] = {
    400: Invalid,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Conflict,
    422: Invalid,
    429: Transient,
}


def from_kube(exc: Exception) -> ServiceError:
    """Classify a ``kubernetes.client.ApiException`` by HTTP status (and its Status ``reason``)."""
    status = int(getattr(exc, "status", 0) or 0)
    reason = str(getattr(exc, "reason", "") or "")
    body = getattr(exc, "body", None)
    cls = _KUBE_STATUS.get(status)
    if cls is None:
        cls = Transient if status == 0 or status >= 500 else Permanent
    return cls(f"Kubernetes {status} {reason}".strip(), details={"http_status": status, "body": body})
