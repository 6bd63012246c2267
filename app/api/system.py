"""System routes: liveness, readiness, who am I, the status summary, Prometheus metrics."""

from __future__ import annotations

from app.api.base import Call, Reply, Route
from services.auth import Role
from services.operation_verbs import Operations
from services.replies import Health, Whoami
from services.status import StatusSummary
from services.verbs import role_of


def _healthz(call: Call) -> Reply:
    return Reply(Health(status="ok"))


def _readyz(call: Call) -> Reply:
    checks = {"database": "ok" if call.services.db.ping() else "failing",
              "engine": "ok" if call.services.operations.engine_running else "stopped"}
    ok = all(v == "ok" for v in checks.values())
    return Reply(Health(status="ok" if ok else "unavailable", checks=checks), status=200 if ok else 503)


def _whoami(call: Call) -> Reply:
    p = call.principal
    return Reply(Whoami(name=p.name, role=p.role, face=p.face, token_id=p.token_id,
                        allowed_roles=[r for r in Role if p.allows(r)]))


def _status(call: Call) -> Reply:
    return Reply(call.services.operations.summary(call.principal))  # memory only: never waits on a cluster


def _metrics(call: Call) -> Reply:
    return Reply(call.services.operations.metrics_text(call.principal))


ROUTES: list[Route] = [
    Route("GET", "/healthz", "healthz", "Liveness", Role.VIEWER, _healthz, response=Health, mcp=False,
          on_loop=True),
    Route("GET", "/readyz", "readyz", "Readiness: database and operation engine", Role.VIEWER, _readyz,
          response=Health, mcp=False),
    Route("GET", "/api/v1/whoami", "whoami", "Who am I: token name and role", Role.VIEWER, _whoami,
          response=Whoami, on_loop=True,
          description="The caller's token name and role, and which roles' routes it may call."),
    Route("GET", "/api/v1/status", "status_get", "Summary of what the control plane is doing",
          role_of(Operations.summary), _status, response=StatusSummary, open_world=True, on_loop=True,
          description="Operation counts by status, active operations with their current stage, recent "
                      "failures and known clusters. A cheap first call to orient."),
    Route("GET", "/metrics", "metrics", "Prometheus metrics", role_of(Operations.metrics_text), _metrics,
          mcp=False, media_type="text/plain; version=0.0.4; charset=utf-8",
          description="Engine (stage durations, retries, backoff, queue depth, operations by status), event bus "
                      "(subscribers, dropped events), AWS calls by service and operation, informer lists; "
                      "Prometheus text format, viewer token."),
]
