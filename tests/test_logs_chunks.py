"""Chunks of log lines: the places the live path computes from a block's first and last stamps agree with
numbering every line, whatever the cut; a followed body's chunked framing is undone however the reads split
it, and a body cut short raises instead of passing a cut line on as whole."""

from __future__ import annotations

import io
import random

import pytest
from urllib3.exceptions import ProtocolError

from services.logs.chunks import MAX_LINE_BYTES, read_chunk
from services.logs.cursor import Mark
from services.logs.pods import numbered
from services.logs.streams import line_blocks

STAMPS = [(0, 1), (0, 2), (0, 2), (1, 0), (1, 5), (1, 5), (1, 9), (3, 0), (3, 1)]  # (second, fraction)


def _raw(seconds: list[tuple[int, int]]) -> bytes:
    return b"".join(b"2026-01-01T00:00:%02d.%09dZ line %d\n" % (s, f, i) for i, (s, f) in enumerate(seconds))


def _places(data: bytes) -> list[tuple[int, int, str]]:
    return [(line.second, line.nth, line.text) for line in numbered("p", "c", "i", data.decode().splitlines())]


def test_places_from_the_block_ends_match_numbering_every_line() -> None:
    data = _raw(STAMPS)
    expected = _places(data)
    for cut in range(1, len(STAMPS)):  # the stream's read boundary anywhere
        head_end = sum(len(line) for line in data.splitlines(keepends=True)[:cut])
        head = read_chunk("p", "c", "i", data[:head_end], None)
        assert head is not None
        tail = read_chunk("p", "c", "i", data[head_end:], head.last)
        assert tail is not None
        got = [(line.second, line.nth, line.text) for line in head.lines() + tail.lines()]
        assert got == expected and head.nlines + tail.nlines == len(STAMPS)
        assert (head.first, tail.last) == (expected[0][:2], expected[-1][:2])
        for count in range(tail.nlines + 1):  # a reader takes part of it, or a full buffer drops part of it
            taken, rest = tail.split(count)
            parts = [c for c in (taken, rest) if c is not None]
            assert [(line.second, line.nth, line.text) for c in parts for line in c.lines()] == expected[cut:]
            if taken is not None and rest is not None:
                assert (taken.last, rest.first) == (expected[cut + count - 1][:2], expected[cut + count][:2])


def test_after_a_mark_keeps_exactly_the_later_lines() -> None:
    chunk = read_chunk("p", "c", "i", _raw(STAMPS), None)
    assert chunk is not None
    lines = chunk.lines()
    for line in lines:
        after = chunk.after(Mark.after(line))
        kept = [x.text for x in after.lines()] if after is not None else []
        assert kept == [x.text for x in lines if (x.second, x.nth) > (line.second, line.nth)]
    assert chunk.after(Mark("another instance", 99, 0)) is chunk


def test_an_overlong_line_is_cut() -> None:
    data = b"2026-01-01T00:00:00.000000000Z " + b"x" * (2 * MAX_LINE_BYTES) + b"\n" + _raw(STAMPS[3:])
    chunk = read_chunk("p", "c", "i", data, None)
    assert chunk is not None and chunk.nlines == 1 + len(STAMPS) - 3
    assert len(chunk.data.split(b"\n")[0]) == MAX_LINE_BYTES


class _Trickle(io.RawIOBase):
    """A connection that hands over a few bytes per read, at random cuts."""

    def __init__(self, data: bytes, seed: int) -> None:
        self.data, self.pos, self.rng = data, 0, random.Random(seed)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray) -> int:  # type: ignore[override]
        size = min(len(buffer), self.rng.randint(1, 9), len(self.data) - self.pos)
        buffer[:size] = self.data[self.pos:self.pos + size]
        self.pos += size
        return size


class _Response:
    """What urllib3 hands back for a chunked body: ``chunked`` and the connection's buffered reader."""

    chunked = True

    def __init__(self, data: bytes, seed: int) -> None:
        self._fp = type("Conn", (), {"fp": io.BufferedReader(_Trickle(data, seed), buffer_size=16)})()


def _framed(body: bytes, seed: int = 7) -> bytes:
    pieces, pos, rng = [], 0, random.Random(seed)
    while pos < len(body):
        size = rng.randint(1, 40)
        pieces.append(b"%x;ext=1\r\n" % len(body[pos:pos + size]) + body[pos:pos + size] + b"\r\n")
        pos += size
    return b"".join(pieces) + b"0\r\n\r\n"


def test_chunked_framing_is_undone_however_reads_split_it() -> None:
    body = _raw(STAMPS * 3)
    framed = _framed(body)
    for seed in range(20):
        blocks = list(line_blocks(_Response(framed, seed)))
        assert b"".join(blocks) == body and all(block.endswith(b"\n") for block in blocks)


def test_a_last_line_without_newline_is_whole_when_the_body_ends_cleanly() -> None:
    body = _raw(STAMPS) + b"2026-01-01T00:00:04.000000000Z no newline"
    assert b"".join(line_blocks(_Response(_framed(body), 1))) == body + b"\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


@pytest.mark.parametrize("cut", ["mid-line", "between chunks", "in a size line", "in the last size line"])
def test_a_body_cut_short_raises_after_its_whole_lines_only(cut: str) -> None:
    body = _raw(STAMPS)
    mid = body.rindex(b"line 8") + 3  # inside the last line
    head = _chunk(body[:mid])
    framed = head + _chunk(body[mid:]) + b"0\r\n\r\n"
    framed = {"mid-line": head[:-4], "between chunks": head, "in a size line": framed[:len(head) + 1],
              "in the last size line": framed[:-4]}[cut]
    whole = body if cut == "in the last size line" else body[:body.rindex(b"\n", 0, mid) + 1]
    for seed in range(10):
        blocks: list[bytes] = []
        with pytest.raises(ProtocolError):
            blocks.extend(line_blocks(_Response(framed, seed)))
        assert b"".join(blocks) == whole and all(block.endswith(b"\n") for block in blocks)
