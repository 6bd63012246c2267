"""The on-disk request log (``kube/requests.jsonl``), written off the event loop and bounded in size.

Every API request is recorded, and ``record_request`` runs on the Tornado loop: a synchronous
line-buffered write there put a ``write(2)`` (and whatever the disk decides to do with it) on the path of
every request, and the file grew for as long as the sandbox lived. Here the loop only enqueues the
record; one daemon thread serialises and writes whatever has accumulated, flushes once per batch, and
rotates the file at ``max_bytes`` keeping one previous file (``requests.jsonl.1``), so the log costs
at most twice that on disk. Recent requests stay queryable in memory (``Emulator.requests_for``); the
file is for people reading what the product did.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import threading
from pathlib import Path
from typing import Any, BinaryIO

MAX_BYTES = 10 * 1024 * 1024
_STOP = object()


class RequestLog:
    def __init__(self, path: Path, max_bytes: int | None = None) -> None:
        self.path = path
        self.previous = path.with_name(path.name + ".1")
        self._max_bytes = MAX_BYTES if max_bytes is None else max_bytes
        self._queue: queue.Queue[Any] = queue.Queue()
        self._file: BinaryIO | None = None
        self._size = 0
        self._open()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="kube-request-log", daemon=True)
        self._thread.start()

    def write(self, record: dict[str, Any]) -> None:
        """Queue one record (never blocks on the disk)."""
        if not self._closed:
            self._queue.put(record)

    def flush(self) -> None:
        """Wait until everything queued so far is written and flushed."""
        if not self._closed:
            self._queue.join()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        self._thread.join()
        if self._file is not None:
            self._file.close()

    def _run(self) -> None:
        while True:
            batch = [self._queue.get()]
            while True:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                self._write([item for item in batch if item is not _STOP])
            except OSError:  # a full or vanished disk must not stop the emulator: reopen on the next batch
                if self._file is not None:
                    with contextlib.suppress(OSError):
                        self._file.close()
                self._file = None
            finally:
                for _ in batch:
                    self._queue.task_done()
            if _STOP in batch:
                return

    def _write(self, records: list[dict[str, Any]]) -> None:
        if self._file is None:
            self._open()
        for record in records:
            line = (json.dumps(record) + "\n").encode()
            if self._size and self._size + len(line) > self._max_bytes:
                self._rotate()
            assert self._file is not None
            self._file.write(line)
            self._size += len(line)
        if self._file is not None:
            self._file.flush()

    def _open(self) -> None:
        self._file = self.path.open("ab")
        self._size = self.path.stat().st_size

    def _rotate(self) -> None:
        """Keep the full file as the one previous file (replacing the older one) and start a new one."""
        if self._file is not None:
            self._file.close()
            self._file = None
        os.replace(self.path, self.previous)
        self._open()
