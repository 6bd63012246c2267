"""Job logs as plain text for agents and terminals: a capped tail, filtered, with the query that continues it.

Each line reads ``<timestamp> <pod>[/<container>] <text>`` (the container is named when the pod has
several). The answer ends with one ``# ...`` line that says what was left out and how to ask for the next
part: ``cursor=`` for what comes after these lines, ``tail=``/``since=``/``grep=`` for what came before.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from services.errors import Invalid
from services.logs.cursor import Cursor, Line, second_of
from services.logs.models import TEXT_MAX_BYTES, TEXT_MAX_LINES, LogTextQuery
from services.logs.views import order_key


@dataclass(frozen=True)
class LogText:
    text: str
    cursor: str
    shown: int
    earlier: int  # matching lines before the ones shown, left out by the tail or the byte cap
    source: str  # "pods" or "archive"


def pattern(grep: str | None) -> re.Pattern[str] | None:
    if grep is None:
        return None
    try:
        return re.compile(grep, re.IGNORECASE)
    except re.error as exc:
        raise Invalid(f"grep is not a valid regular expression: {exc}", details={"grep": grep}) from None


def render(lines: list[Line], query: LogTextQuery, cursor: Cursor, multi_container: set[str],
           source: str) -> LogText:
    """``lines`` (every line read) filtered by the query, tailed and capped, with the continuation line."""
    rx = pattern(query.grep)
    since = second_of(query.since) if query.since else None
    since_key = (since, float("0" + query.since[19:-1]) if query.since and "." in query.since else 0.0) \
        if since is not None else None
    picked = []
    ordered = sorted(lines, key=order_key)
    for line in ordered:
        if not cursor.admits(line):
            continue
        if since_key is not None and order_key(line)[:2] < since_key:
            continue
        if rx is not None and not rx.search(line.text):
            continue
        picked.append(line)
    shown = picked[-query.tail:]
    out: list[str] = []
    size = 0
    for line in reversed(shown):  # the newest lines are kept when the byte cap bites
        who = f"{line.pod}/{line.container}" if line.pod in multi_container else line.pod
        rendered = f"{line.ts} {who} {line.text}\n"
        if size + len(rendered) > TEXT_MAX_BYTES:
            break
        out.append(rendered)
        size += len(rendered)
    out.reverse()
    kept = shown[len(shown) - len(out):]
    earlier = len(picked) - len(kept)
    after = cursor.copy()
    for line in ordered:  # every line read is behind the next read, matched or not
        if cursor.admits(line):
            after.advance(line)
    token = after.encode()
    note = f"# {len(kept)} line(s)"
    if source == "archive":
        note += " from the archive in the shared bucket (the job's pods are gone)"
    if earlier:
        note += (f"; {earlier} earlier matching line(s) not shown: ask a larger tail (at most "
                 f"{TEXT_MAX_LINES}) or narrow with since=/grep=")
    note += f"; newer output: the same query with cursor={token}\n"
    return LogText("".join(out) + note, token, len(kept), earlier, source)
