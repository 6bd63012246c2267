"""The REST route table: the single source of the HTTP API, its OpenAPI document and the MCP tools.

A route names its method and path, the least role it needs, its query and body models, its response
model and how an agent should treat it (read-only, destructive, idempotent). Handlers are thin: they
take parsed models and call one service. Handlers run in a worker thread (never on the Tornado loop),
except the async ones, which only await.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, Field

from app.api import clusters as clusters_api
from app.api.base import Call, Reply, Route, accepted
from services.audit import AuditEntry, AuditQuery
from services.auth import Role, TokenCreate, TokenCreated, TokenInfo
from services.backups import KIND as BACKUP_KIND
from services.backups import BackupCreate, BackupInfo
from services.errors import ERROR_CODES, Invalid
from services.events import Event
from services.models import RequestModel
from services.operations import STATUS_TOOL, OperationQuery, OperationView
from services.replies import Accepted, Health, Whoami
from services.status import StatusSummary, summarize
from services.tokens import Tokens
from services.verbs import role_of


class OperationWait(RequestModel):
    wait: float = Field(0, ge=0, le=60, description="long-poll: answer when the operation changes or after "
                        "this many seconds (at most 60); 0 answers at once")


class OperationUntilDone(RequestModel):
    timeout: float = Field(60, ge=0, le=120, description="answer when the operation has ended, or after this "
                           "many seconds (at most 120) with its current state")


class ErrorBody(BaseModel):
    code: str = Field(..., description="internal: an unclassified failure (a bug, please report it); "
                      "permanent: a classified failure that retrying will not fix; transient: retry later",
                      json_schema_extra={"enum": list(ERROR_CODES)})
    message: str
    details: Any = None


class ErrorEnvelope(BaseModel):
    error: ErrorBody


# ----- handlers ------------------------------------------------------------------------------------------

def _healthz(call: Call) -> Reply:
    return Reply(Health(status="ok"))


def _readyz(call: Call) -> Reply:
    checks = {"database": "ok" if call.services.db.ping() else "failing",
              "engine": "ok" if call.services.engine.running else "stopped"}
    ok = all(v == "ok" for v in checks.values())
    return Reply(Health(status="ok" if ok else "unavailable", checks=checks), status=200 if ok else 503)


def _whoami(call: Call) -> Reply:
    p = call.principal
    return Reply(Whoami(name=p.name, role=p.role, face=p.face, token_id=p.token_id,
                        allowed_roles=[r for r in Role if p.allows(r)]))


def _status(call: Call) -> Reply:
    registered = call.services.clusters.list_clusters(call.principal, wait=0)  # never waits on a cluster
    return Reply(summarize(call.services.engine, call.services.kube.clusters(), registered))


def _metrics(call: Call) -> Reply:
    return Reply(call.services.engine.metrics.render())


def _operations_list(call: Call) -> Reply:
    return Reply(call.services.engine.list(call.query))


async def _watch(call: Call, timeout: float, done: Callable[[OperationView, OperationView], bool]) -> Reply:
    """Read the operation, then wait on the event bus (never by polling) until ``done(first, now)``."""
    engine = call.services.engine
    loop = asyncio.get_running_loop()
    op_id = call.path["id"]
    wake = asyncio.Event()

    if timeout <= 0:  # no wait: one read, no subscription
        return Reply(await loop.run_in_executor(None, engine.get, op_id))
    call.services.longpolls.acquire(call.principal)  # a long-poll holds one of its principal's few slots
    def wake_up(_event: Event) -> None:
        loop.call_soon_threadsafe(wake.set)

    unsubscribe = call.services.bus.subscribe(wake_up, topic="operation", where={"id": op_id})
    try:
        deadline = loop.time() + timeout
        first = current = await loop.run_in_executor(None, engine.get, op_id)
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
            current = await loop.run_in_executor(None, engine.get, op_id)
        return Reply(current)
    finally:
        unsubscribe()
        call.services.longpolls.release(call.principal)


async def _operations_get(call: Call) -> Reply:
    """Answer at once, or long-poll until the operation's version moves past the one first seen."""
    return await _watch(call, call.query.wait, lambda first, now: now.version > first.version
                        or call.query.wait == 0)


async def _operations_wait(call: Call) -> Reply:
    """Long-poll until the operation ends (succeeded, failed, cancelled) or the timeout passes."""
    return await _watch(call, call.query.timeout, lambda first, now: now.status.terminal)


def _operations_retry(call: Call) -> Reply:
    view = call.services.engine.retry(call.path["id"], call.principal)
    return accepted(view, True)


def _operations_cancel(call: Call) -> Reply:
    view = call.services.engine.cancel(call.path["id"], call.principal)
    return Reply(view)


def _audit_list(call: Call) -> Reply:
    return Reply(call.services.audit.list(call.query))


def _tokens_list(call: Call) -> Reply:
    return Reply(call.services.token_verbs.list_tokens(call.principal))


def _tokens_create(call: Call) -> Reply:
    return Reply(call.services.token_verbs.create_token(call.principal, call.body), status=201)


def _tokens_revoke(call: Call) -> Reply:
    return Reply(call.services.token_verbs.revoke_token(call.principal, call.path["id"]))


def _backups_list(call: Call) -> Reply:
    return Reply(call.services.backups.list())


def _backups_create(call: Call) -> Reply:
    view, created = call.services.engine.submit(BACKUP_KIND, call.body, call.principal, call.idempotency_key)
    return accepted(view, created)


OP_ID = {"id": "operation id, e.g. op-1a2b3c4d5e6f7a8b"}

ROUTES: list[Route] = [
    Route("GET", "/healthz", "healthz", "Liveness", Role.VIEWER, _healthz, response=Health, mcp=False,
          on_loop=True),
    Route("GET", "/readyz", "readyz", "Readiness: database and operation engine", Role.VIEWER, _readyz,
          response=Health, mcp=False),
    Route("GET", "/api/v1/whoami", "whoami", "Who am I: token name and role", Role.VIEWER, _whoami,
          response=Whoami, on_loop=True,
          description="The caller's token name and role, and which roles' routes it may call."),
    Route("GET", "/api/v1/status", "status_get", "Summary of what the control plane is doing", Role.VIEWER,
          _status, response=StatusSummary,
          description="Operation counts by status, active operations with their current stage, recent "
                      "failures and known clusters. A cheap first call to orient."),
    Route("GET", "/metrics", "metrics", "Prometheus metrics", Role.VIEWER, _metrics, mcp=False,
          media_type="text/plain; version=0.0.4; charset=utf-8",
          description="Engine (stage durations, retries, backoff, queue depth, operations by status), event bus "
                      "(subscribers, dropped events), AWS calls by service and operation, informer lists; "
                      "Prometheus text format, viewer token."),
    Route("GET", "/api/v1/operations", "operations_list", "List operations", Role.VIEWER, _operations_list,
          query=OperationQuery, response=OperationView, many=True, tag="operations",
          description="Operations newest first, filterable by status, kind, target and actor."),
    Route("GET", "/api/v1/operations/{id}", STATUS_TOOL, "Get one operation (optionally long-poll)",
          Role.VIEWER, _operations_get, query=OperationWait, response=OperationView, path_params=OP_ID,
          tag="operations",
          description="An operation with its stages and Kubernetes-style conditions (Accepted, Progressing, "
                      "Succeeded). With wait=N it answers as soon as the operation changes, or after N "
                      "seconds: use it instead of sleeping between checks. Terminal statuses: succeeded, "
                      "failed, cancelled."),
    Route("GET", "/api/v1/operations/{id}/wait", "operations_wait", "Wait until an operation ends",
          Role.VIEWER, _operations_wait, query=OperationUntilDone, response=OperationView, path_params=OP_ID,
          tag="operations",
          description="Blocks until the operation is succeeded, failed or cancelled, or until 'timeout' seconds "
                      "pass, then returns it. Check 'status': if it is still pending, running or waiting, call "
                      "again. Cheaper than repeated operations_get calls."),
    Route("POST", "/api/v1/operations/{id}/retry", "operations_retry", "Retry a failed operation",
          Role.OPERATOR, _operations_retry, response=Accepted, path_params=OP_ID, read_only=False,
          idempotent=False, status=202, tag="operations",
          description="Queue the failed stage of a failed operation again. The stage observes actual "
                      "state first, so work already done is not repeated."),
    Route("POST", "/api/v1/operations/{id}/cancel", "operations_cancel", "Cancel an operation",
          Role.OPERATOR, _operations_cancel, response=OperationView, path_params=OP_ID, read_only=False,
          idempotent=False, tag="operations",
          description="Stop an operation between steps. Nothing already done is undone; what it created "
                      "stays, tagged with the operation id."),
    Route("GET", "/api/v1/audit", "audit_list", "Audit log", Role.VIEWER, _audit_list, query=AuditQuery,
          response=AuditEntry, many=True, tag="audit",
          description="Who did what through which face (ui: dashboard session, api: bearer token, cli, system), "
                      "with the client each caller claimed to be (e.g. mcp), newest first."),
    Route("GET", "/api/v1/tokens", "tokens_list", "List API tokens", role_of(Tokens.list_tokens), _tokens_list,
          response=TokenInfo, many=True, tag="tokens", mcp=False),
    Route("POST", "/api/v1/tokens", "tokens_create", "Create an API token", role_of(Tokens.create_token),
          _tokens_create,
          body=TokenCreate, response=TokenCreated, read_only=False, idempotent=False, status=201,
          tag="tokens", mcp=False),
    Route("DELETE", "/api/v1/tokens/{id}", "tokens_revoke", "Revoke an API token", role_of(Tokens.revoke_token),
          _tokens_revoke,
          response=TokenInfo, path_params={"id": "token id (the part after 'ist_')"}, read_only=False,
          destructive=True, tag="tokens", mcp=False),
    Route("GET", "/api/v1/backups", "backups_list", "List state backups", Role.ADMIN, _backups_list,
          response=BackupInfo, many=True, tag="backups"),
    Route("POST", "/api/v1/backups", "backups_create", "Back up the state database", Role.OPERATOR,
          _backups_create, body=BackupCreate, response=Accepted, read_only=False, idempotent=False,
          status=202, tag="backups",
          description="Start a backup.create operation: an online copy of the state database (operations, "
                      "audit, token hashes) into the data directory, then an integrity check."),
    *clusters_api.ROUTES,
]


def check_routes(routes: list[Route]) -> None:
    """Fail fast on a malformed table: duplicate tool names or (method, path) pairs."""
    names = [r.name for r in routes]
    if len(set(names)) != len(names):
        raise Invalid(f"duplicate route names in {names}")
    keys = [(r.method, r.path) for r in routes]
    if len(set(keys)) != len(keys):
        raise Invalid(f"duplicate routes in {keys}")
    for r in routes:
        if not r.read_only and r.method == "GET":
            raise Invalid(f"route {r.name} mutates with GET")


check_routes(ROUTES)
