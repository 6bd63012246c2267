"""Blocks of consecutive log lines of one container instance, handled whole so a busy job costs per block,
not per line.

The live path never looks at a line on its own: a follower splits what it read at the last newline, and a
:class:`Chunk` is that run of whole lines exactly as the API server sent them (``<RFC 3339 stamp> <text>\\n``
each) with the place (second, index within the second; see :mod:`services.logs.cursor`) of its first and
last line. Only those two stamps are parsed; the index of the last line comes from counting the lines of the
block that share its second, which sit together at its end because a container's log is in time order. All
scanning is ``bytes.find``/``count`` and compiled regular expressions, in C.

Cutting a block (a reader takes part of it, a bounded buffer pushes out its oldest lines) is equally cheap;
only where a chunk straddles a reader's mark (a reconnect, the hand-over from catch-up to live) are its
lines looked at one by one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import NamedTuple

from services.logs.cursor import Line, Mark, parse_stamped, second_of

__all__ = ["MAX_LINE_BYTES", "Chunk", "chunk_of", "chunks_of", "clip", "read_chunk", "stamp_key"]

STAMP = 19  # "2026-12-01T22:00:01": the part of a stamp that names its second
MAX_LINE_BYTES = 16_384 + 40  # a stamped line longer than this is cut (the kubelet splits at 16 KiB itself)
_LONG = re.compile(rb"(?m)^[^\n]{%d}" % MAX_LINE_BYTES)
_CUT = re.compile(rb"(?m)^([^\n]{%d})[^\n]+" % MAX_LINE_BYTES)


class Chunk(NamedTuple):
    """Consecutive lines of one container instance: ``data`` holds them as read (stamped, each ending in a
    newline); ``first``/``last`` are the places of its first and last line."""

    pod: str
    container: str
    instance: str
    first: tuple[int, int]  # (second, index within it) of the first line
    last: tuple[int, int]
    nlines: int
    data: bytes

    @property
    def key(self) -> str:
        return f"{self.pod}/{self.container}"

    def lines(self) -> list[Line]:
        """The lines one by one (for the few readers that want them: tests, the boundary cases below)."""
        out: list[Line] = []
        second, nth = self.first[0], self.first[1] - 1
        for raw in self.data.decode("utf-8", "replace").split("\n")[:-1]:
            parsed = parse_stamped(raw)
            if parsed is None:
                continue
            ts, sec, text = parsed
            nth = nth + 1 if sec == second else 0
            second = sec
            out.append(Line(self.pod, self.container, self.instance, ts, sec, nth, text))
        return out

    def split(self, count: int) -> tuple[Chunk | None, Chunk | None]:
        """The first ``count`` lines and the rest (either None when empty)."""
        if count <= 0:
            return None, self
        if count >= self.nlines:
            return self, None
        cut = _line_end(self.data, count, self.nlines)
        head_data, rest_data = self.data[:cut], self.data[cut:]
        head_last = _last_place(head_data, self.first)
        rest_second = _second(rest_data)
        rest_first = (rest_second, head_last[1] + 1 if rest_second == head_last[0] else 0)
        return (self._replace(last=head_last, nlines=count, data=head_data),
                self._replace(first=rest_first, nlines=self.nlines - count, data=rest_data))

    def after(self, mark: Mark | None) -> Chunk | None:
        """The part of this chunk that comes after ``mark`` (None when none does)."""
        if mark is None or mark.instance != self.instance or self.first >= (mark.second, mark.seen):
            return self
        if self.last < (mark.second, mark.seen):
            return None
        return chunk_of([line for line in self.lines() if mark.admits(line)])

    def mark(self) -> Mark:
        """The mark just after this chunk's last line."""
        return Mark(self.instance, self.last[0], self.last[1] + 1)


def stamp_key(chunk: Chunk) -> tuple[int, float]:
    """(second, fraction) of the chunk's first line: the order chunks of different pods interleave in."""
    space = chunk.data.find(b" ", STAMP, 40)
    frac = chunk.data[STAMP:space if space > 0 else STAMP].rstrip(b"Z")
    try:
        return chunk.first[0], float(b"0" + frac) if frac.startswith(b".") else 0.0
    except ValueError:
        return chunk.first[0], 0.0


def _line_end(data: bytes, count: int, total: int) -> int:
    """Where the first ``count`` of the ``total`` lines of ``data`` end (a find per line passed over, from
    whichever end is nearer)."""
    if count <= total // 2:
        cut = 0
        for _ in range(count):
            cut = data.find(b"\n", cut) + 1
        return cut
    cut = len(data) - 1
    for _ in range(total - count):
        cut = data.rfind(b"\n", 0, cut)
    return cut + 1


def _second(data: bytes) -> int:
    return second_of(data[:STAMP].decode("ascii", "replace"))


def _last_place(data: bytes, first: tuple[int, int]) -> tuple[int, int]:
    """Place of the last line of ``data`` (whole lines, newline-ended) whose first line is at ``first``."""
    start = data.rfind(b"\n", 0, len(data) - 1) + 1
    prefix = data[start:start + STAMP]
    second = _second(prefix)
    if second == first[0]:  # the whole block is in one second
        return second, first[1] + data.count(b"\n") - 1
    run = data.find(b"\n" + prefix) + 1  # where that second's lines begin: they sit together at the end
    return second, data.count(b"\n", run) - 1


def clip(data: bytes) -> bytes:
    """``data`` with any line longer than :data:`MAX_LINE_BYTES` cut (a C scan; rarely a rewrite)."""
    if len(data) > MAX_LINE_BYTES and _LONG.search(data) is not None:
        return _CUT.sub(rb"\1", data)
    return data


def chunk_of(lines: list[Line]) -> Chunk | None:
    """Consecutive lines of one container instance as a chunk (None for no lines)."""
    return _joined(lines) if lines else None


def _joined(lines: list[Line]) -> Chunk:
    first, last = lines[0], lines[-1]
    data = "".join(f"{line.ts} {line.text}\n" for line in lines).encode()
    return Chunk(first.pod, first.container, first.instance, (first.second, first.nth), (last.second, last.nth),
                 len(lines), data)


def chunks_of(lines: Iterable[Line], most: int) -> list[Chunk]:
    """Lines in the order given, as chunks of consecutive lines of the same container instance, of at most
    ``most`` lines each."""
    out: list[Chunk] = []
    run: list[Line] = []
    for line in lines:
        if run and (len(run) >= most or (line.key, line.instance) != (run[-1].key, run[-1].instance)):
            out.append(_joined(run))
            run = []
        run.append(line)
    if run:
        out.append(_joined(run))
    return out


def read_chunk(pod: str, container: str, instance: str, data: bytes,
               previous: tuple[int, int] | None) -> Chunk | None:
    """A chunk of whole lines as read from a follow stream; ``previous`` is the place of the line the stream
    gave before them (None at its start)."""
    data = clip(data)
    try:
        second = _second(data)
        first = (second, previous[1] + 1 if previous is not None and previous[0] == second else 0)
        return Chunk(pod, container, instance, first, _last_place(data, first), data.count(b"\n"), data)
    except ValueError:  # an unstamped first or last line (not what the kubelet sends): line by line
        second, nth = previous if previous is not None else (-1, -1)
        lines = []
        for raw in data.decode("utf-8", "replace").split("\n")[:-1]:
            if (parsed := parse_stamped(raw)) is not None:
                ts, sec, text = parsed
                nth, second = nth + 1 if sec == second else 0, sec
                lines.append(Line(pod, container, instance, ts, sec, nth, text))
        return chunk_of(lines)
