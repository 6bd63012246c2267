"""What every route module builds on: the parsed call a handler sees, its reply, the route record, and the
202 answer of a mutation."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from app.bootstrap import Services
from services.auth import Principal, Role
from services.models import RequestModel
from services.operation_views import STATUS_TOOL, OperationView
from services.replies import Accepted


@dataclass
class Call:
    """One parsed request as a handler sees it."""

    services: Services
    principal: Principal
    path: dict[str, str]
    query: Any
    body: Any
    idempotency_key: str | None = None


@dataclass
class Reply:
    body: Any
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)


Handler = Callable[[Call], Reply | Awaitable[Reply]]


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    name: str
    summary: str
    role: Role
    handler: Handler
    description: str = ""
    query: type[RequestModel] | None = None
    body: type[RequestModel] | None = None
    response: type[BaseModel] | None = None
    path_params: dict[str, str] = field(default_factory=dict)
    read_only: bool = True
    destructive: bool = False
    idempotent: bool = True
    status: int = 200
    many: bool = False
    tag: str = "system"
    mcp: bool = True
    #: what the route answers; anything but JSON is a text body (``/metrics``)
    media_type: str = "application/json"
    #: the route reaches AWS or Kubernetes (MCP ``openWorldHint``)
    open_world: bool = False
    #: the handler only reads memory (never SQLite, AWS or Kubernetes) and is synchronous: it runs on the
    #: event loop, with no thread hop; every other handler runs in a worker thread
    on_loop: bool = False
    #: a GET route whose handler may need a worker: its synchronous memory-only try, answering ``None`` when
    #: the handler must run (app/fast_reads.py serves what it answers without a RequestHandler)
    from_memory: Callable[[Call], Reply | None] | None = None
    #: other success answers beside ``status``: (status, model), e.g. a dry run's 200 with the plan
    also: tuple[tuple[int, type[BaseModel]], ...] = ()


def accepted(view: OperationView, created: bool) -> Reply:
    note = "started" if created else "already requested; this is the existing operation"
    return Reply(
        Accepted(operation=view, created=created, status_url=view.status_url,
                 message=f"{view.kind} {note}; follow it with {STATUS_TOOL}(id='{view.id}') "
                         f"or GET {view.status_url}?wait=30"),
        status=202, headers={"Location": view.status_url},
    )
