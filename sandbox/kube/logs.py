"""Container logs that simulated workloads write and ``pods/log`` serves.

Workloads call :meth:`PodLogs.append` (through ``Emulator.append_log``) from any thread; readers get
the lines with the ``tailLines`` / ``sinceSeconds`` / ``sinceTime`` / ``previous`` semantics of the
kubelet, and followers (``kubectl logs -f``) are called back for each new line and once with ``None``
when the container terminates or the pod is deleted. A follower must start with :meth:`PodLogs.read_and_follow`,
which reads and subscribes under one lock hold: with a separate read and subscribe, a line written in
between would be in neither and the stream would silently skip it. Logs live in memory only, bounded
per container.
"""

from __future__ import annotations

import threading
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

LogKey = tuple[str, str, str]  # namespace, pod, container
MAX_LINES = 10_000


@dataclass(frozen=True)
class LogLine:
    ts: float
    text: str

    def render(self, timestamps: bool) -> str:
        if not timestamps:
            return self.text + "\n"
        stamp = datetime.fromtimestamp(self.ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"
        return f"{stamp} {self.text}\n"


Follower = Callable[[LogLine | None], None]


class PodLogs:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current: dict[LogKey, deque[LogLine]] = defaultdict(lambda: deque(maxlen=MAX_LINES))
        self._previous: dict[LogKey, list[LogLine]] = {}
        self._terminated: set[LogKey] = set()
        self._followers: dict[LogKey, list[Follower]] = defaultdict(list)

    def append(self, key: LogKey, text: str, ts: float) -> None:
        with self._lock:
            for part in text.splitlines() or [""]:
                line = LogLine(ts, part)
                self._current[key].append(line)
                for cb in list(self._followers.get(key, ())):
                    cb(line)

    def restart(self, key: LogKey) -> None:
        """The container restarted: its log becomes ``previous`` and a new one starts."""
        with self._lock:
            self._previous[key] = list(self._current.pop(key, ()))
            self._terminated.discard(key)

    def terminate(self, key: LogKey) -> None:
        """The container ended: followers get their end of stream."""
        with self._lock:
            self._terminated.add(key)
            for cb in self._followers.pop(key, []):
                cb(None)

    def pod_deleted(self, namespace: str, pod: str) -> None:
        with self._lock:
            keys = {k for k in (*self._current, *self._previous, *self._followers) if k[:2] == (namespace, pod)}
            for key in keys:
                self._current.pop(key, None)
                self._previous.pop(key, None)
                self._terminated.discard(key)
                for cb in self._followers.pop(key, []):
                    cb(None)

    def read(self, key: LogKey, *, previous: bool = False, tail: int | None = None,
             since: float | None = None) -> list[LogLine]:
        with self._lock:
            lines = list(self._previous.get(key, ()) if previous else self._current.get(key, ()))
        return _select(lines, tail, since)

    def follow(self, key: LogKey, callback: Follower) -> bool:
        """Subscribe to new lines; False when the container already terminated (nothing will follow)."""
        with self._lock:
            return self._subscribe(key, callback)

    def read_and_follow(self, key: LogKey, callback: Follower, *, tail: int | None = None,
                        since: float | None = None) -> tuple[list[LogLine], bool]:
        """The current lines and a subscription to the next ones, atomically: every line is either in the
        result or passed to ``callback``, never lost in between. The bool is :meth:`follow`'s."""
        with self._lock:
            lines = list(self._current.get(key, ()))
            following = self._subscribe(key, callback)
        return _select(lines, tail, since), following

    def _subscribe(self, key: LogKey, callback: Follower) -> bool:
        """:meth:`follow` with the lock already held."""
        if key in self._terminated:
            return False
        self._followers[key].append(callback)
        return True

    def unfollow(self, key: LogKey, callback: Follower) -> None:
        with self._lock:
            if callback in self._followers.get(key, []):
                self._followers[key].remove(callback)


def _select(lines: list[LogLine], tail: int | None, since: float | None) -> list[LogLine]:
    if since is not None:
        lines = [line for line in lines if line.ts >= since]
    if tail is not None:
        lines = lines[-tail:] if tail > 0 else []
    return lines
