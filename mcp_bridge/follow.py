"""Long waits on the status tools, carried out by the bridge as successive REST long-polls with MCP progress.

A REST long-poll is bounded (``operations_get``: 60 s, ``operations_wait``: 120 s) because it holds a
connection and a slot on the server. An agent following a cluster creation (30-60 minutes in AWS) would
still spend a turn per minute. So the bridge accepts a much longer wait on these two tools (up to
:data:`FOLLOW_MAX_SECONDS`) and carries it out itself: it calls the status route (``operations_get``'s, which
answers on every change) again and again within that route's bound until the operation is terminal or the
wait is over, and after each poll that shows
something new (a stage started, its message changed, the operation ended) it sends an MCP progress
notification on the caller's ``progressToken``. It adds no backend feature: every poll is the same HTTP
request the tool makes for a short wait. A client that cancels the call cancels the poll in flight; nothing
is left polling.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import anyio

from mcp_bridge.tools import ToolSpec, to_http
from services.operation_views import Status

log = logging.getLogger(__name__)

#: the longest wait the bridge carries out on a status tool (30 minutes: a HyperPod cluster's creation)
FOLLOW_MAX_SECONDS = 1800.0
#: the status route the bridge polls (it answers on every change of the operation) and its wait argument
STATUS_TOOL, STATUS_ARGUMENT = "operations_get", "wait"
#: tool -> (its wait argument, whether any wait is followed: operations_wait's route answers only at the end,
#: so the bridge always follows it through the status route to report stages; operations_get keeps its
#: "answer on the next change" meaning up to its route's bound)
FOLLOWED = {"operations_get": ("wait", False), "operations_wait": ("timeout", True)}
#: a notification at least this often while nothing changes, so a client sees the wait is alive
HEARTBEAT_SECONDS = 30.0

Report = Callable[[float, float, str], Awaitable[None]]
Request = Callable[[str, str, dict[str, Any], dict[str, Any] | None], Awaitable[tuple[int, Any]]]


def _bound(spec: ToolSpec, argument: str) -> float | None:
    prop = spec.input_schema.get("properties", {}).get(argument)
    if isinstance(prop, dict) and isinstance(prop.get("maximum"), int | float):
        return float(prop["maximum"])
    return None


@dataclass(frozen=True)
class Follow:
    """How the bridge carries out a status tool's wait: polls of ``status`` (the operations_get route) with
    at most ``poll_max`` seconds each, for waits above ``threshold``."""

    argument: str
    threshold: float
    status: ToolSpec
    poll_max: float

    def needed(self, arguments: dict[str, Any]) -> bool:
        value = arguments.get(self.argument)
        return isinstance(value, int | float) and not isinstance(value, bool) and value > self.threshold


def widen(specs: list[ToolSpec]) -> list[tuple[ToolSpec, Follow | None]]:
    """Each tool as agents see it (a status tool's wait allowed up to :data:`FOLLOW_MAX_SECONDS`) and how
    to follow it; other tools, or all of them when the status route is not offered, come back unchanged."""
    status = next((s for s in specs if s.name == STATUS_TOOL), None)
    poll_max = _bound(status, STATUS_ARGUMENT) if status is not None else None
    out: list[tuple[ToolSpec, Follow | None]] = []
    for spec in specs:
        argument, always = FOLLOWED.get(spec.name, ("", False))
        route_max = _bound(spec, argument) if argument else None
        if status is None or poll_max is None or route_max is None:
            out.append((spec, None))
            continue
        prop = spec.input_schema["properties"][argument]
        widened = {**prop, "maximum": FOLLOW_MAX_SECONDS, "description": (
            f"{prop.get('description', '')}. Through this bridge it may be up to {FOLLOW_MAX_SECONDS:.0f} s"
            + ("" if always else f": above {route_max:.0f} s the bridge waits until the operation has ended "
                                 "(succeeded, failed, cancelled) or the time is up")
            + "; meanwhile it sends a progress notification (stage, status, message, elapsed) whenever a stage "
              "changes").lstrip(". ")}
        schema = {**spec.input_schema, "properties": {**spec.input_schema["properties"], argument: widened}}
        description = (f"{spec.description} A long {argument} (up to {FOLLOW_MAX_SECONDS:.0f} s) follows the "
                       "operation to its end in one call, with progress notifications.")
        out.append((replace(spec, input_schema=schema, description=description),
                    Follow(argument, 0.0 if always else route_max, status, poll_max)))
    return out


def _current_stage(view: dict[str, Any]) -> tuple[int, dict[str, Any] | None]:
    stages = view.get("stages") or []
    for i, stage in enumerate(stages):
        if stage.get("status") != "succeeded":
            return i, stage
    return len(stages) - 1, (stages[-1] if stages else None)


def _stage_seconds(view: dict[str, Any], stage: dict[str, Any]) -> float | None:
    """How long the stage has run, from the server's own timestamps (never this machine's clock)."""
    start = stage.get("started_at")
    end = stage.get("finished_at") or view.get("updated_at")
    if not start or not end:
        return None
    try:
        return max(0.0, (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds())
    except ValueError:
        return None


def progress_key(view: dict[str, Any]) -> tuple[Any, ...]:
    """What a user would call a change: the current stage, its status and message, and the end. (The
    operation flips between running and waiting on every poll of a stage: that alone is not news.)"""
    i, stage = _current_stage(view)
    status = str(view.get("status"))
    return (i, stage and stage.get("status"), stage and stage.get("message"),
            status if Status(status).terminal else "active", view.get("cancel_requested"))


def progress_message(view: dict[str, Any], elapsed: float) -> str:
    i, stage = _current_stage(view)
    total = len(view.get("stages") or [])
    parts = [f"{view.get('kind')} {view.get('status')}"]
    if stage is not None:
        took = _stage_seconds(view, stage)
        parts.append(f"stage {stage.get('name')} ({i + 1}/{total}) {stage.get('status')}"
                     + (f" for {took:.0f} s" if took is not None else "")
                     + (f": {stage['message']}" if stage.get("message") else ""))
    parts.append(f"{elapsed:.0f} s into this wait")
    return "; ".join(parts)


async def follow(request: Request, how: Follow, arguments: dict[str, Any], report: Report) -> tuple[int, Any]:
    """Poll the status route until the operation is terminal or ``arguments[how.argument]`` seconds have
    passed; returns the last answer (an error answer ends the wait at once)."""
    total = min(float(arguments[how.argument]), FOLLOW_MAX_SECONDS)
    started = anyio.current_time()
    last_key: tuple[Any, ...] | None = None
    last_report = started
    polls = 0
    try:
        while True:
            remaining = total - (anyio.current_time() - started)
            chunk = round(max(0.0, min(how.poll_max, remaining)), 3)
            call = to_http(how.status, {"id": arguments.get("id"), STATUS_ARGUMENT: chunk})
            status, payload = await request(call.method, call.path, call.params, call.json)
            polls += 1
            now = anyio.current_time()
            if status >= 400 or not isinstance(payload, dict):
                return status, payload
            key = progress_key(payload)
            if key != last_key or now - last_report >= HEARTBEAT_SECONDS:
                await report(now - started, total, progress_message(payload, now - started))
                last_key, last_report = key, now
            if Status(str(payload.get("status"))).terminal or now - started >= total:
                return status, payload
    except anyio.get_cancelled_exc_class():
        log.info("follow of %s cancelled by the client after %d polls", arguments.get("id"), polls)
        raise
