"""The sandbox's call ledger: every AWS call and every Kubernetes request, as the outside world saw it.

One append-only JSON Lines file (``<sandbox data dir>/calls.jsonl``) that tests, benchmarks and users read
to learn what the product really did: "zero writes", "created once", "this UpdateCluster payload". Each
entry has a sequence number (``seq``, increasing across restarts), the wall time, the caller (the AWS
access key, or the Kubernetes bearer identity, plus the User-Agent) and:

* AWS: ``service``, ``operation``, ``target`` (the resource the call names), ``request`` (its parameters,
  secrets redacted), ``status`` and ``error`` (the AWS error code, if any);
* Kubernetes: ``cluster``, ``verb`` (get, list, watch, create, update, patch, delete, deletecollection),
  ``resource``, ``namespace``, ``name``, ``subresource``, ``watch`` and ``status`` (no bodies).

``write`` says whether the call changes state. :meth:`Ledger.record` never blocks on the disk: one thread
writes and fsyncs whatever accumulated; :meth:`Ledger.wait` blocks until an entry is on disk, which the
front and the emulator do before answering a mutation, and :meth:`Ledger.entries` waits for everything
recorded so far. The file is rotated at ``max_bytes`` into ``calls.jsonl.1`` (one previous file kept and
still read), so it costs at most twice that on disk.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MAX_BYTES = 64 * 1024 * 1024
MAX_REQUEST_CHARS = 16_384
REDACTED = "<redacted>"
# parameter names that carry secrets (case-insensitive, anywhere in the name), except the ones listed next
_SECRET_NAME = re.compile(r"secret|password|passphrase|credential|privatekey|accesskey|sessiontoken|authtoken"
                          r"|apikey|token$", re.IGNORECASE)
_NOT_SECRET = frozenset({"clientrequesttoken", "clienttoken", "nexttoken", "paginationtoken", "idempotencytoken",
                         "continuationtoken"})
_log = logging.getLogger("sandbox.ledger")
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


def redact(value: Any, depth: int = 0) -> Any:
    """A JSON-able copy of ``value`` with secret-named fields replaced and binary bodies summarised."""
    if depth > 32:
        return "<too deep>"
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            name = str(key)
            secret = _SECRET_NAME.search(name) and name.lower() not in _NOT_SECRET
            out[name] = REDACTED if secret and item not in (None, "") else redact(item, depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        return [redact(item, depth + 1) for item in value]
    if isinstance(value, (bytes, bytearray)):
        return f"<{len(value)} bytes>"
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)


class Ledger:
    """The append-only, fsync'd call ledger at ``path`` (see the module)."""

    def __init__(self, path: Path, max_bytes: int = MAX_BYTES) -> None:
        self.path = path
        self.previous = path.with_name(path.name + ".1")
        self._max_bytes = max_bytes
        path.parent.mkdir(parents=True, exist_ok=True)
        self._cond = threading.Condition()
        self._pending: list[dict[str, Any]] = []
        self._seq = self._last_seq()
        self._written = self._seq
        self._closed = False
        self._file = path.open("ab")
        self._size = path.stat().st_size
        if self._size and not _ends_with_newline(path):  # a line torn by a crash: end it, never extend it
            self._file.write(b"\n")
            self._file.flush()
            self._size += 1
        self._thread = threading.Thread(target=self._run, name="sandbox-ledger", daemon=True)
        self._thread.start()

    def _last_seq(self) -> int:
        for candidate in (self.path, self.previous):
            with contextlib.suppress(OSError), candidate.open("rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - 65_536))
                for line in reversed(fh.read().splitlines()):
                    with contextlib.suppress(ValueError, KeyError, TypeError):
                        return int(json.loads(line)["seq"])
        return 0

    def record(self, entry: dict[str, Any]) -> int:
        """Queue one entry (never blocks on the disk); returns its sequence number."""
        request = entry.get("request")
        if request is not None:
            safe = redact(request)
            if len(json.dumps(safe)) > MAX_REQUEST_CHARS:
                safe = {"truncated": True, "keys": sorted(safe) if isinstance(safe, dict) else []}
            entry = {**entry, "request": safe}
        with self._cond:
            if self._closed:
                return self._seq
            self._seq += 1
            self._pending.append({"seq": self._seq, "time": time.time(), **entry})
            self._cond.notify_all()
            return self._seq

    def wait(self, seq: int, timeout: float = 30.0) -> bool:
        """Block until entry ``seq`` is written and fsync'd (or the ledger closed)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._written >= seq or self._closed, timeout)

    def flush(self) -> None:
        """Block until everything recorded so far is on disk."""
        with self._cond:
            seq = self._seq
        self.wait(seq)

    def entries(self, *, service: str | None = None, operation: str | None = None, verb: str | None = None,
                since: int = 0, write: bool | None = None, cluster: str | None = None,
                limit: int = 10_000) -> list[dict[str, Any]]:
        """Entries after ``since`` (a ``seq``), oldest first, filtered; everything recorded so far is included."""
        self.flush()
        out: list[dict[str, Any]] = []
        for entry in read_entries(self.path):
            if entry.get("seq", 0) <= since or not matches(entry, service, operation, verb, write, cluster):
                continue
            out.append(entry)
        return out[-limit:] if limit else out

    @property
    def last_seq(self) -> int:
        with self._cond:
            return self._seq

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self._thread.join(10)
        self._file.close()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._pending) or self._closed)
                batch, self._pending = self._pending, []
                closed = self._closed
            if batch:
                try:
                    self._write(batch)
                except OSError:  # a full disk must not stop the sandbox: these entries are lost, and logged so
                    _log.exception("writing %d call ledger entries failed", len(batch))
                with self._cond:
                    self._written = batch[-1]["seq"]
                    self._cond.notify_all()
            if closed:
                return

    def _write(self, batch: list[dict[str, Any]]) -> None:
        data = b"".join((json.dumps(entry, separators=(",", ":")) + "\n").encode() for entry in batch)
        if self._size and self._size + len(data) > self._max_bytes:
            self._file.close()
            os.replace(self.path, self.previous)
            self._file = self.path.open("ab")
            self._size = 0
        self._file.write(data)
        self._file.flush()
        os.fsync(self._file.fileno())
        self._size += len(data)


def _ends_with_newline(path: Path) -> bool:
    with path.open("rb") as fh:
        fh.seek(-1, os.SEEK_END)
        return fh.read(1) == b"\n"


def matches(entry: dict[str, Any], service: str | None, operation: str | None, verb: str | None,
            write: bool | None, cluster: str | None) -> bool:
    if service is not None and entry.get("service") != service:
        return False
    if operation is not None and entry.get("operation") != operation:
        return False
    if verb is not None and entry.get("verb") != verb:
        return False
    if write is not None and bool(entry.get("write")) != write:
        return False
    return cluster is None or entry.get("cluster") == cluster


def read_entries(path: Path) -> Iterator[dict[str, Any]]:
    """Every entry of the ledger at ``path`` (its previous file first), oldest first; works without a
    running sandbox. A torn last line (a crash mid-write) is skipped."""
    for candidate in (path.with_name(path.name + ".1"), path):
        try:
            fh = candidate.open("rb")
        except OSError:
            continue
        with fh:
            for line in fh:
                with contextlib.suppress(ValueError):
                    entry = json.loads(line)
                    if isinstance(entry, dict):
                        yield entry


def kube_request(method: str, path: str, query: dict[str, str]) -> dict[str, Any]:
    """What a Kubernetes request does, from its method, path (below the cluster prefix) and query."""
    segs = [s for s in path.split("/") if s]
    group = namespace = name = sub = resource = ""
    rest: list[str] = []
    if segs[:2] == ["api", "v1"]:
        rest = segs[2:]
    elif segs[:1] == ["apis"] and len(segs) >= 3:
        group, rest = segs[1], segs[3:]
    if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in ("status", "finalize"):
        namespace, rest = rest[1], rest[2:]
    if rest:
        resource = rest[0] if not group else f"{rest[0]}.{group}"
        name = rest[1] if len(rest) > 1 else ""
        sub = rest[2] if len(rest) > 2 else ""
    watch = query.get("watch", "").lower() in ("true", "1")
    if not resource:
        verb = "get"
    elif method in ("GET", "HEAD"):
        verb = "get" if name else ("watch" if watch else "list")
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(
            method, ("delete" if name else "deletecollection") if method == "DELETE" else method.lower())
    dry_run = bool(query.get("dryRun"))  # the server validates and stores nothing: no write
    proxied = sub == "proxy"  # a request relayed to a pod changes nothing in the cluster
    return {"verb": verb, "resource": resource or path, "namespace": namespace, "name": name,
            "subresource": sub, "watch": verb == "watch",
            "write": verb in WRITE_VERBS and not dry_run and not proxied,
            **({"dry_run": True} if dry_run else {})}
