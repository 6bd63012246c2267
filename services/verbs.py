"""A verb declares the least role it needs, once: it checks the caller itself, and the REST route that
serves it reads the role from it (``role_of``), so route table, OpenAPI document, MCP tool list and the
verb cannot disagree."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

from services.auth import Principal, Role

F = TypeVar("F", bound=Callable[..., Any])


def verb(role: Role) -> Callable[[F], F]:
    """Mark a noun's method ``(self, principal, ...)`` as a verb needing ``role``."""
    def mark(fn: F) -> F:
        @functools.wraps(fn)
        def checked(self: Any, principal: Principal, *args: Any, **kwargs: Any) -> Any:
            principal.require(role)
            return fn(self, principal, *args, **kwargs)

        checked.verb_role = role  # type: ignore[attr-defined]
        return cast(F, checked)

    return mark


def role_of(fn: Callable[..., Any]) -> Role:
    role = getattr(fn, "verb_role", None)
    if not isinstance(role, Role):
        raise TypeError(f"{getattr(fn, '__qualname__', fn)} is not a verb (no @verb(role))")
    return role
