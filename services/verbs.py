"""A verb declares the least role it needs, once: it checks the caller itself, and the REST route that
serves it reads the role from it (``role_of``), so route table, OpenAPI document, MCP tool list and the
verb cannot disagree."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

from services.auth import Principal, Role
from services.errors import Forbidden

F = TypeVar("F", bound=Callable[..., Any])


def verb(role: Role, *, audit_denied: str | None = None) -> Callable[[F], F]:
    """Mark a noun's method ``(self, principal, ...)`` as a verb needing ``role``.

    ``audit_denied``: the audit action recorded (on the noun's ``audit`` log) when a caller without the role
    tries it, so refused attempts at a mutation leave a trace whichever face they came through; the audit
    target is the noun's ``noun`` attribute."""
    def mark(fn: F) -> F:
        @functools.wraps(fn)
        def checked(self: Any, principal: Principal, *args: Any, **kwargs: Any) -> Any:
            try:
                principal.require(role)
            except Forbidden as exc:
                if audit_denied is not None:
                    self.audit.record(principal, audit_denied, getattr(self, "noun", type(self).__name__.lower()), {},
                                      "denied",
                                      detail=exc.message)
                raise
            return fn(self, principal, *args, **kwargs)

        checked.verb_role = role  # type: ignore[attr-defined]
        return cast(F, checked)

    return mark


def role_of(fn: Callable[..., Any]) -> Role:
    role = getattr(fn, "verb_role", None)
    if not isinstance(role, Role):
        raise TypeError(f"{getattr(fn, '__qualname__', fn)} is not a verb (no @verb(role))")
    return role
