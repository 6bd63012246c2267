"""Where a log reader stands in each container's log, since Kubernetes gives logs no cursor of their own.

``pods/log`` answers ``sinceTime`` to the second only, and one second can hold many lines. A line's place is
therefore (container instance, second, index within that second): the index counts every line of that second
from its first, which a read with ``sinceTime=<that second>`` always sees. A cursor keeps, per pod and
container, the instance and the (second, count of lines already seen in it); resuming reads from that second
and skips that many lines of it, so nothing is lost or repeated, however many lines share a second.

The encoded cursor is an opaque URL-safe string a client hands back on reconnect; it holds names and
counters only.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
from datetime import UTC, datetime
from typing import NamedTuple

from services.errors import Invalid

__all__ = ["Cursor", "Line", "Mark", "parse_stamped", "second_of", "since_time"]


class Line(NamedTuple):
    """One log line as the product hands it on: which pod/container it came from and its place there (a
    tuple: a busy job makes tens of thousands a second)."""

    pod: str
    container: str
    instance: str  # "<pod uid>:<restart count>": a restarted container or a re-created pod starts afresh
    ts: str  # the kubelet's RFC 3339 timestamp, as written
    second: int
    nth: int  # 0-based among this instance's lines in ``second``
    text: str

    @property
    def key(self) -> str:
        return f"{self.pod}/{self.container}"


class Mark(NamedTuple):
    """How far a reader got in one container: its instance, and ``seen`` lines of ``second``."""

    instance: str
    second: int
    seen: int  # lines of ``second`` already seen

    def admits(self, line: Line) -> bool:
        """True when ``line`` comes after this mark in the same instance, or belongs to another instance."""
        if line.instance != self.instance:
            return True
        return line.second > self.second or (line.second == self.second and line.nth >= self.seen)

    @staticmethod
    def after(line: Line) -> Mark:
        return Mark(line.instance, line.second, line.nth + 1)


class Cursor:
    """Marks per ``pod/container`` key; ``encode``/``decode`` give the opaque string clients keep."""

    def __init__(self, marks: dict[str, Mark] | None = None) -> None:
        self.marks: dict[str, Mark] = dict(marks or {})

    def admits(self, line: Line) -> bool:
        mark = self.marks.get(line.key)
        return mark is None or mark.admits(line)

    def advance(self, line: Line) -> None:
        self.marks[line.key] = Mark.after(line)

    def copy(self) -> Cursor:
        return Cursor(self.marks)

    def encode(self) -> str:
        raw = json.dumps({k: [m.instance, m.second, m.seen] for k, m in sorted(self.marks.items())},
                         separators=(",", ":"))
        return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str | None) -> Cursor:
        if not text:
            return cls()
        try:
            raw = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
            marks = {str(k): Mark(str(v[0]), int(v[1]), int(v[2])) for k, v in raw.items()}
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, binascii.Error):
            raise Invalid("cursor is not one this server gave out: pass back the 'cursor' of the last batch "
                          "unchanged, or leave it out to start afresh") from None
        return cls(marks)


def second_of(ts: str) -> int:
    """The whole second (epoch) of an RFC 3339 timestamp such as ``2026-12-01T22:00:01.123456789Z``."""
    return _second(ts[:19])


@functools.lru_cache(maxsize=4096)
def _second(stamp: str) -> int:  # many lines share a second: parse each second once
    return int(datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC).timestamp())


def since_time(second: int) -> str:
    """``sinceTime`` for a whole second, in the form the API server parses."""
    return datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_stamped(raw: str) -> tuple[str, int, str] | None:
    """``(ts, second, text)`` of a line read with ``timestamps=true``; None for a line without a stamp."""
    ts, sep, text = raw.partition(" ")
    if not sep and not ts.endswith("Z"):
        return None
    try:
        return ts, second_of(ts), text
    except ValueError:
        return None
