"""One reader's view of a job's log stream: what it selected, where it stands, and its bounded buffer.

A view subscribes to the shared :class:`~services.logs.streams.JobStream` first and catches up second (reads
of each container from the reader's cursor, or its tail, or the start): every line is then in the catch-up,
in the live feed, or in both, and its place (instance, second, index) drops the copy. Live lines that come
during the catch-up wait in a bounded side buffer and follow it in order. Lines are queued, taken and dropped
as :class:`~services.logs.chunks.Chunk` blocks, cut at a line where a bound or a ``take`` limit falls.

Memory is bounded per reader (``max_lines`` and ``max_bytes``): a live line that does not fit pushes out the
oldest one and counts as dropped; the catch-up instead waits for room (on its own thread), so a reader that
starts from the beginning gets all of it at the pace it reads. The cursor a batch carries covers exactly
the lines delivered (and those dropped before them), so a reconnect with it resumes where this one left.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from services.errors import ServiceError
from services.logs.chunks import Chunk, chunks_of, stamp_key
from services.logs.cursor import Cursor, Line, Mark
from services.logs.pods import JobPod, read_log
from services.logs.streams import JobStream

MAX_LINES = 100_000  # queued lines are compact (their bytes as read, in chunks): MAX_BYTES is what bites first
MAX_BYTES = 8 * 1024 * 1024
CHUNK_OVERHEAD = 256  # bytes a queued chunk costs beside its lines (a rough figure for the bound)
CATCH_UP_LINES = 256  # the catch-up queues its lines in chunks of at most this many


@dataclass(frozen=True)
class Selection:
    """Which lines a reader wants: all pods of the job, or one pod, container or node rank; where to start."""

    pod: str | None = None
    container: str | None = None
    rank: int | None = None
    tail: int | None = None  # None: from the start (or the cursor)


@dataclass
class Batch:
    chunks: list[Chunk]
    cursor: str
    dropped: int
    error: str | None = None  # the catch-up failed: only live lines follow

    @property
    def count(self) -> int:
        return sum(chunk.nlines for chunk in self.chunks)

    @property
    def lines(self) -> list[Line]:
        """The lines one by one (parsed here: readers that pass the text on use ``chunks``)."""
        return [line for chunk in self.chunks for line in chunk.lines()]


def _size(chunk: Chunk) -> int:
    return len(chunk.data) + CHUNK_OVERHEAD


def order_key(line: Line) -> tuple[int, float, str, int]:
    frac = line.ts[19:].rstrip("Z")
    try:
        fraction = float("0" + frac) if frac.startswith(".") else 0.0
    except ValueError:
        fraction = 0.0
    return line.second, fraction, line.key, line.nth


class LogView:
    def __init__(self, stream: JobStream, selection: Selection, cursor: Cursor, *, max_lines: int = MAX_LINES,
                 max_bytes: int = MAX_BYTES) -> None:
        self.stream = stream
        self.selection = selection
        self.max_lines = max_lines
        self.max_bytes = max_bytes
        self._lock = threading.Condition()
        self._queue: deque[Chunk] = deque()
        self._lines = 0
        self._bytes = 0
        self._pending: deque[Chunk] | None = deque()  # live lines during the catch-up; None once caught up
        self._pending_lines = 0
        self._seen = cursor.copy()  # what is queued or delivered: the live feed's dedup
        self._delivered = cursor.copy()
        self._dropped = 0
        self._closed = False
        self.on_ready: Callable[[], None] | None = None  # called (from any thread) when lines are waiting
        self.caught_up = threading.Event()
        self.error: str | None = None

    # ----- selection -------------------------------------------------------------------------------------

    def wants(self, pod: str, container: str) -> bool:
        s = self.selection
        if s.pod is not None and pod != s.pod:
            return False
        if s.container is not None and container != s.container:
            return False
        return s.rank is None or self.stream.rank_of(pod) == s.rank

    # ----- the live feed (JobStream.publish, any thread; never blocks) -----------------------------------

    def offer(self, chunks: list[Chunk]) -> None:
        s = self.selection
        if s.pod is not None or s.container is not None or s.rank is not None:
            chunks = [chunk for chunk in chunks if self.wants(chunk.pod, chunk.container)]
        if not chunks:
            return
        with self._lock:
            if self._closed:
                return
            if self._pending is not None:
                self._pending.extend(chunks)
                self._pending_lines += sum(chunk.nlines for chunk in chunks)
                while self._pending_lines > self.max_lines:
                    head, rest = self._pending[0].split(self._pending_lines - self.max_lines)
                    assert head is not None
                    self._pending_lines -= head.nlines
                    self._dropped += head.nlines
                    if rest is None:
                        self._pending.popleft()
                    else:
                        self._pending[0] = rest
                return
            for chunk in chunks:
                self._admit(chunk)
        self._ready()

    def _admit(self, chunk: Chunk) -> None:
        """Queue what of ``chunk`` was not queued or delivered yet (lock held)."""
        kept = chunk.after(self._seen.marks.get(chunk.key))
        if kept is not None:
            self._seen.marks[chunk.key] = kept.mark()
            self._push(kept)

    def _push(self, chunk: Chunk) -> None:
        """Queue ``chunk`` (lock held), pushing out the oldest lines past the bounds."""
        self._queue.append(chunk)
        self._lines += chunk.nlines
        self._bytes += _size(chunk)
        while self._lines > self.max_lines or self._bytes > self.max_bytes:
            over = self._lines - self.max_lines if self._bytes <= self.max_bytes else self._queue[0].nlines
            old = self._pop(over)
            self._dropped += old.nlines
            self._delivered.marks[old.key] = old.mark()  # skipped for good: a reconnect does not bring it back

    def _pop(self, count: int) -> Chunk:
        """Take the first ``count`` queued lines (at most the first chunk's; lock held, the queue not empty)."""
        first = self._queue.popleft()
        head, rest = first.split(max(count, 1))
        assert head is not None
        self._lines -= head.nlines
        self._bytes -= _size(first)
        if rest is not None:
            self._queue.appendleft(rest)
            self._bytes += _size(rest)
        return head

    def _ready(self) -> None:
        if self.on_ready is not None:
            self.on_ready()

    # ----- the catch-up ----------------------------------------------------------------------------------

    def start(self) -> None:
        """Subscribe, then catch up on a thread of the view's own (it may wait for the reader)."""
        pods = self.stream.subscribe(self)
        threading.Thread(target=self._catch_up, args=(pods,), daemon=True,
                         name=f"logs-view-{self.stream.job}").start()

    def _backlog(self, pods: list[JobPod]) -> tuple[list[Line], dict[str, Mark]]:
        api = self.stream.kube.api_client(self.stream.cluster)
        ns = self.stream.namespace
        lines: list[Line] = []
        ends: dict[str, Mark] = {}
        tail = self.selection.tail
        for pod in pods:
            for c in pod.containers:
                if not self.wants(pod.name, c.name):
                    continue
                mark = self._seen.marks.get(f"{pod.name}/{c.name}")
                got: list[Line] = []
                if mark is not None and mark.instance == c.instance:
                    got = read_log(api, ns, pod.name, c, since_second=mark.second)
                elif mark is not None and mark.instance == c.previous:
                    got = read_log(api, ns, pod.name, c, previous=True, since_second=mark.second)
                    got += read_log(api, ns, pod.name, c)
                elif mark is None and tail is not None:
                    got = read_log(api, ns, pod.name, c, tail=tail)
                else:  # from the start: the previous instance first, when there is one
                    got = (read_log(api, ns, pod.name, c, previous=True) if mark is None else []) \
                        + read_log(api, ns, pod.name, c)
                got = [line for line in got if mark is None or mark.admits(line)]
                if got:
                    ends[got[-1].key] = Mark.after(got[-1])
                lines += got
        lines.sort(key=order_key)
        if tail is not None:
            lines = lines[-tail:] if tail > 0 else []
        return lines, ends

    def _catch_up(self, pods: list[JobPod]) -> None:
        try:
            lines, ends = self._backlog(pods)
        except ServiceError as exc:
            lines, ends = [], {}
            self.error = f"the earlier lines could not be read ({exc.message}); live lines follow"
        for chunk in chunks_of(lines, CATCH_UP_LINES):
            with self._lock:  # wait for room: the catch-up goes at the reader's pace and drops nothing
                while not self._closed and self._queue and (self._lines + chunk.nlines > self.max_lines
                                                            or self._bytes + _size(chunk) > self.max_bytes):
                    self._lock.wait(1.0)
                if self._closed:
                    return
                self._seen.marks[chunk.key] = chunk.mark()
                self._push(chunk)
            self._ready()
        with self._lock:
            queued = {chunk.key for chunk in self._queue}
            for key, mark in ends.items():  # cut by the tail: delivered as far as the reader is concerned
                self._seen.marks[key] = mark
                if key not in queued:
                    self._delivered.marks[key] = mark
            pending, self._pending = self._pending or deque(), None
            self._pending_lines = 0
            for chunk in pending:
                self._admit(chunk)
        self.caught_up.set()
        self._ready()

    # ----- the reader ------------------------------------------------------------------------------------

    def take(self, limit: int = 5_000) -> Batch:
        """Up to ``limit`` waiting lines (in chunks), the cursor after them and the dropped count so far (never
        blocks)."""
        with self._lock:
            out: list[Chunk] = []
            room = limit
            while self._queue and room > 0:
                chunk = self._pop(room)
                self._delivered.marks[chunk.key] = chunk.mark()
                out.append(chunk)
                room -= chunk.nlines
            self._lock.notify_all()
            cursor = self._delivered.encode()
            dropped = self._dropped
        out.sort(key=stamp_key)  # pods interleave by time within a batch (stable: each container stays in order)
        return Batch(out, cursor, dropped, self.error)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._queue.clear()
            self._lines = self._bytes = 0
            self._lock.notify_all()
        self.stream.unsubscribe(self)
