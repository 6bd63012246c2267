"""REST route and page of the audit noun (``services/audit.py``)."""

from __future__ import annotations

from typing import Any

from app.api.base import Call, Reply, Route
from app.api.pages import Page
from app.bootstrap import Services
from services.audit import AuditEntry, AuditLog, AuditQuery
from services.auth import Principal
from services.verbs import role_of


def _list(call: Call) -> Reply:
    return Reply(call.services.audit.list_entries(call.principal, call.query))


ROUTES: list[Route] = [
    Route("GET", "/api/v1/audit", "audit_list", "Audit log", role_of(AuditLog.list_entries), _list,
          query=AuditQuery, response=AuditEntry, many=True, tag="audit",
          description="Who did what through which face (ui: dashboard session, api: bearer token, cli, system), "
                      "with the client each caller claimed to be (e.g. mcp), newest first."),
]


def _page(services: Services, principal: Principal) -> Any:
    from panels.audit import AuditPane

    return AuditPane(audit=services.audit, bus=services.bus, principal=principal)


PAGES: list[Page] = [Page("audit", "Audit", role_of(AuditLog.list_entries), _page)]
