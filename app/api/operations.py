"""REST routes and the page of the operations noun (``services/operation_verbs.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from pydantic import Field

from app.api.base import Call, Reply, Route, accepted
from app.api.pages import Page, current_principal
from app.bootstrap import Services
from services.auth import Principal
from services.events import Event
from services.models import RequestModel
from services.operation_verbs import Operations
from services.operation_views import STATUS_TOOL, OperationQuery, OperationView
from services.replies import Accepted
from services.verbs import role_of

OP_ID = {"id": "operation id, e.g. op-1a2b3c4d5e6f7a8b"}


class OperationWait(RequestModel):
    wait: float = Field(0, ge=0, le=60, description="long-poll: answer when the operation changes or after "
                        "this many seconds (at most 60); 0 answers at once")


class OperationUntilDone(RequestModel):
    timeout: float = Field(60, ge=0, le=120, description="answer when the operation has ended, or after this "
                           "many seconds (at most 120) with its current state")


def _list(call: Call) -> Reply:
    return Reply(call.services.operations.list_operations(call.principal, call.query))


async def _watch(call: Call, timeout: float, done: Callable[[OperationView, OperationView], bool]) -> Reply:
    """Read the operation, then wait on the event bus (never by polling) until ``done(first, now)``."""
    operations = call.services.operations
    loop = asyncio.get_running_loop()
    op_id = call.path["id"]
    wake = asyncio.Event()

    def read() -> OperationView:
        return operations.get_operation(call.principal, op_id)

    if timeout <= 0:  # no wait: one read, no subscription
        return Reply(await loop.run_in_executor(None, read))
    call.services.longpolls.acquire(call.principal)  # a long-poll holds one of its principal's few slots
    def wake_up(_event: Event) -> None:
        loop.call_soon_threadsafe(wake.set)

    unsubscribe = call.services.bus.subscribe(wake_up, topic="operation", where={"id": op_id})
    try:
        deadline = loop.time() + timeout
        first = current = await loop.run_in_executor(None, read)
        while not done(first, current) and not current.status.terminal:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            try:
                await asyncio.wait_for(wake.wait(), timeout=remaining)
            except TimeoutError:
                break
            # clear before reading: an event that lands during the read wakes the next wait at once
            wake.clear()
            current = await loop.run_in_executor(None, read)
        return Reply(current)
    finally:
        unsubscribe()
        call.services.longpolls.release(call.principal)


async def _get(call: Call) -> Reply:
    """Answer at once, or long-poll until the operation's version moves past the one first seen."""
    return await _watch(call, call.query.wait, lambda first, now: now.version > first.version
                        or call.query.wait == 0)


async def _wait(call: Call) -> Reply:
    """Long-poll until the operation ends (succeeded, failed, cancelled) or the timeout passes."""
    return await _watch(call, call.query.timeout, lambda first, now: now.status.terminal)


def _retry(call: Call) -> Reply:
    return accepted(call.services.operations.retry_operation(call.principal, call.path["id"]), True)


def _cancel(call: Call) -> Reply:
    return Reply(call.services.operations.cancel_operation(call.principal, call.path["id"]))


ROUTES: list[Route] = [
    Route("GET", "/api/v1/operations", "operations_list", "List operations", role_of(Operations.list_operations),
          _list, query=OperationQuery, response=OperationView, many=True, tag="operations",
          description="Operations newest first, filterable by status, kind, target and actor."),
    Route("GET", "/api/v1/operations/{id}", STATUS_TOOL, "Get one operation (optionally long-poll)",
          role_of(Operations.get_operation), _get, query=OperationWait, response=OperationView,
          path_params=OP_ID, tag="operations",
          description="An operation with its stages and Kubernetes-style conditions (Accepted, Progressing, "
                      "Succeeded). With wait=N it answers as soon as the operation changes, or after N "
                      "seconds: use it instead of sleeping between checks. Terminal statuses: succeeded, "
                      "failed, cancelled."),
    Route("GET", "/api/v1/operations/{id}/wait", "operations_wait", "Wait until an operation ends",
          role_of(Operations.get_operation), _wait, query=OperationUntilDone, response=OperationView,
          path_params=OP_ID, tag="operations",
          description="Blocks until the operation is succeeded, failed or cancelled, or until 'timeout' seconds "
                      "pass, then returns it. Check 'status': if it is still pending, running or waiting, call "
                      "again. Cheaper than repeated operations_get calls."),
    Route("POST", "/api/v1/operations/{id}/retry", "operations_retry", "Retry a failed operation",
          role_of(Operations.retry_operation), _retry, response=Accepted, path_params=OP_ID, read_only=False,
          idempotent=False, status=202, tag="operations",
          description="Queue the failed stage of a failed operation again. The stage observes actual "
                      "state first, so work already done is not repeated."),
    Route("POST", "/api/v1/operations/{id}/cancel", "operations_cancel", "Cancel an operation",
          role_of(Operations.cancel_operation), _cancel, response=OperationView, path_params=OP_ID,
          read_only=False, idempotent=False, tag="operations",
          description="Stop an operation between steps. Nothing already done is undone; what it created "
                      "stays, tagged with the operation id."),
]


def _page(services: Services, principal: Principal) -> Any:
    from panels.operations import OperationsPane

    return OperationsPane(operations=services.operations, bus=services.bus, principal=principal,
                          current_principal=current_principal(services, principal))


PAGES: list[Page] = [Page("operations", "Operations", role_of(Operations.list_operations), _page)]
