"""Dashboard pages, registered per noun the way routes are: each ``app/api/<noun>.py`` exports ``PAGES``
next to its ``ROUTES``; a page's builder makes the noun's pane over the noun's verbs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.bootstrap import Services
from services.auth import Principal, Role


@dataclass(frozen=True)
class Page:
    """One entry of the dashboard's navigation (slug in ``?page=``, the least role that sees it)."""

    slug: str
    title: str
    role: Role
    build: Callable[[Services, Principal], Any]


def current_principal(services: Services, principal: Principal) -> Callable[[], Principal] | None:
    """For panes: the session's principal looked up again, so an ended session or a revoked token stops
    acting at once."""
    session, token_id = principal.session, principal.token_id
    if session is not None:
        return lambda: services.sessions.principal(session, "ui")
    return (lambda: services.tokens.principal(token_id, "ui")) if token_id else None
