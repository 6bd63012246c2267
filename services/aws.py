"""AWS client factory: one place that knows region, endpoint, retries, our user agent and error classes.

Stateless apart from a cache of thread-safe boto3 clients. An endpoint override (the sandbox, a VPC
endpoint, a proxy) is configuration; nothing downstream knows the difference.

Every client it hands out raises the backend's taxonomy (``services/errors.py``), classified here and
nowhere else: a ``ClientError`` by its ``Error.Code``, a connection failure as ``Transient``. Anything else
(a bug in our code or botocore's) passes through unclassified, and the engine fails the stage as
``internal`` instead of retrying it. :meth:`AwsClients.for_stages` hands out clients with botocore's own
retries off (one attempt in all: botocore's ``total_max_attempts=1``; its ``max_attempts`` counts retries
only): an operation stage's transient failure goes back to the engine, whose
persisted, jittered backoff is the one that runs. Reads keep botocore's retries.
"""

from __future__ import annotations

import functools
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, cast

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError, HTTPClientError, NoCredentialsError, ParamValidationError
from botocore.exceptions import ConnectionError as BotocoreConnectionError
from botocore.parsers import ResponseParserError

from services import __version__
from services.errors import Forbidden, Invalid, ServiceError, Transient, classify_aws

CONNECTION_DELAY = 2.0


def from_aws(exc: Exception, action: str = "aws") -> ServiceError | None:
    """The taxonomy's reading of a botocore failure, or None for an exception that is not one (a bug)."""
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        code = str(err.get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        return classify_aws(code, str(err.get("Message", "")), status, action)
    if isinstance(exc, (BotocoreConnectionError, HTTPClientError)):  # endpoint unreachable, timeouts, resets
        return Transient(f"AWS unreachable for {action}: {exc}", delay=CONNECTION_DELAY,
                         details={"exception": type(exc).__name__, "action": action})
    if isinstance(exc, ResponseParserError):  # an answer that is not AWS's (a proxy's or a 5xx page)
        return Transient(f"AWS answered {action} with something that is not an AWS response: "
                         f"{str(exc).splitlines()[0]}", delay=CONNECTION_DELAY,
                         details={"exception": type(exc).__name__, "action": action})
    if isinstance(exc, NoCredentialsError):
        return Forbidden(f"no AWS credentials to call {action}: {exc}", details={"action": action})
    if isinstance(exc, ParamValidationError):
        return Invalid(f"AWS {action} parameters: {exc}", details={"action": action})
    return None


def _classified(call: Callable[..., Any], action: str) -> Callable[..., Any]:
    @functools.wraps(call)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return call(*args, **kwargs)
        except Exception as exc:
            classified = from_aws(exc, action)
            if classified is None:
                raise
            raise classified from exc
    return run


class _Pages:
    """A page iterator whose pages raise the taxonomy too (the call happens while iterating)."""

    def __init__(self, pages: Any, action: str) -> None:
        self._pages = pages
        self._action = action

    def __iter__(self) -> Iterator[Any]:
        it = iter(self._pages)
        while True:
            try:
                page = next(it)
            except StopIteration:
                return
            except Exception as exc:
                classified = from_aws(exc, self._action)
                if classified is None:
                    raise
                raise classified from exc
            yield page


class _Paginator:
    def __init__(self, paginator: Any, action: str) -> None:
        self._paginator = paginator
        self._action = action

    def paginate(self, **kwargs: Any) -> _Pages:
        return _Pages(self._paginator.paginate(**kwargs), self._action)


class ClassifiedClient:
    """A boto3 client whose API calls and paginators raise the taxonomy; everything else passes through."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._prefix = client.meta.service_model.signing_name

    def action(self, method: str) -> str:
        """``service:Operation`` for a client method name, as IAM policies spell it."""
        return f"{self._prefix}:{self._client.meta.method_to_api_mapping.get(method, method)}"

    def get_paginator(self, method: str) -> _Paginator:
        return _Paginator(self._client.get_paginator(method), self.action(method))

    def all_pages(self, method: str, key: str, **params: Any) -> list[Any]:
        """Every item under ``key`` of every page of a paginated list (a paged list is one logical read)."""
        items: list[Any] = []
        for page in self.get_paginator(method).paginate(**params):
            items.extend(page.get(key, []))
        return items

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if name in self._client.meta.method_to_api_mapping:
            return _classified(attr, self.action(name))
        return attr


class AwsClients:
    """``calls`` counts every API call this factory's clients make, by (service, operation) — each page of a
    paginated list once, retries by botocore not again — and ``on_call`` (metrics) hears of each."""

    def __init__(self, region: str, endpoint_url: str | None = None, session: boto3.Session | None = None,
                 max_attempts: int = 6, on_call: Callable[[str, str], None] | None = None) -> None:
        self.region = region
        self.endpoint_url = endpoint_url
        self.calls: Counter[tuple[str, str]] = Counter()
        self.on_call = on_call
        self.session = session or boto3.Session()
        self.max_attempts = max_attempts
        self.config = Config(
            region_name=region,
            retries={"mode": "standard", "total_max_attempts": max_attempts},  # attempts, the first one included
            user_agent_extra=f"instantstart/{__version__}",
            connect_timeout=10,
            read_timeout=60,
        )
        self._clients: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()
        self._for_stages: AwsClients | None = None

    def _count(self, model: Any, **_: Any) -> None:
        key = (str(model.service_model.service_name), str(model.name))
        with self._lock:
            self.calls[key] += 1
        if self.on_call is not None:
            self.on_call(*key)

    def client(self, service: str, region: str | None = None) -> Any:
        """A cached boto3 client for ``service`` in ``region`` (default: the configured region), raising the
        backend's error taxonomy."""
        key = (service, region or self.region)
        with self._lock:
            client = self._clients.get(key)
            if client is None:
                raw = cast(Any, self.session).client(service, region_name=key[1], endpoint_url=self.endpoint_url,
                                                     config=self.config)
                raw.meta.events.register("before-call", self._count)
                client = ClassifiedClient(raw)
                self._clients[key] = client
        return client

    def _forward(self, service: str, operation: str) -> None:
        """Calls the stage clients make count here too: one product, one tally."""
        with self._lock:
            self.calls[(service, operation)] += 1
        if self.on_call is not None:
            self.on_call(service, operation)

    def for_stages(self) -> AwsClients:
        """The same account, endpoint and region with botocore's retries off: for calls operation stages
        make, so the engine's backoff (persisted, jittered, visible on the stage) is the only one."""
        if self.max_attempts == 1:
            return self
        with self._lock:
            if self._for_stages is None:
                self._for_stages = AwsClients(self.region, self.endpoint_url, self.session, max_attempts=1,
                                              on_call=self._forward)
            return self._for_stages
