"""Schemathesis hooks for tests/test_schemathesis.py, loaded by the CLI through ``SCHEMATHESIS_HOOKS``."""

from __future__ import annotations

from typing import Any

import schemathesis

LONG_POLL_CAP = 0.2  # seconds


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    """The throwaway server's operations never change (its engine is not started), so every valid long-poll
    would wait its whole ``wait``/``timeout`` (or the 60 s default): cap valid values to keep the run fast.
    Invalid values (negative, too large, not numbers) are sent as generated."""
    if "/api/v1/operations/" not in case.operation.path:
        return
    if case.operation.path.endswith("/wait") and "timeout" not in (case.query or {}):
        case.query = {**(case.query or {}), "timeout": LONG_POLL_CAP}  # its default is 60 s
    if not case.query:
        return
    for key in ("wait", "timeout"):
        value = case.query.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            continue
        try:
            number = float(value)
        except ValueError:
            continue
        if LONG_POLL_CAP < number <= 120:
            case.query[key] = LONG_POLL_CAP
