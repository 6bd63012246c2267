"""How the panes word a verb's refusal in their message line."""

from __future__ import annotations

from pydantic import ValidationError

from services.errors import ServiceError


def refused(exc: Exception) -> str:
    """A request the models refused (``invalid: <field>: <why>; …``), a verb's refusal (``refused (<code>):
    <message>``), or another ValueError, e.g. a body that is not JSON (``invalid: <why>``)."""
    if isinstance(exc, ValidationError):
        return "invalid: " + "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
    if isinstance(exc, ServiceError):
        return f"refused ({exc.code}): {exc.message}"
    return f"invalid: {exc}"
