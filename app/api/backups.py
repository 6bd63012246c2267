"""REST routes and the page of the backups noun (``services/backups.py``)."""

from __future__ import annotations

from typing import Any

from app.api.base import Call, Reply, Route, accepted
from app.api.pages import Page, current_principal
from app.bootstrap import Services
from services.auth import Principal
from services.backups import BackupCreate, BackupInfo, Backups
from services.replies import Accepted
from services.verbs import role_of


def _list(call: Call) -> Reply:
    return Reply(call.services.backups.list_backups(call.principal))


def _create(call: Call) -> Reply:
    view, created = call.services.backups.create_backup(call.principal, call.body, call.idempotency_key)
    return accepted(view, created)


ROUTES: list[Route] = [
    Route("GET", "/api/v1/backups", "backups_list", "List state backups", role_of(Backups.list_backups), _list,
          response=BackupInfo, many=True, tag="backups"),
    Route("POST", "/api/v1/backups", "backups_create", "Back up the state database",
          role_of(Backups.create_backup), _create, body=BackupCreate, response=Accepted, read_only=False,
          idempotent=False, status=202, tag="backups",
          description="Start a backup.create operation: an online copy of the state database (operations, "
                      "audit, token hashes) into the data directory, then an integrity check."),
]


def _page(services: Services, principal: Principal) -> Any:
    from panels.backups import BackupsPane

    return BackupsPane(backups=services.backups, bus=services.bus, principal=principal,
                       current_principal=current_principal(services, principal))


# listing backups is admin-only, as in REST
PAGES: list[Page] = [Page("backups", "Backups", role_of(Backups.list_backups), _page)]
