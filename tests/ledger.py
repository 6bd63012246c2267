"""Test helper: the sandbox's call ledger, read the way tests assert on what AWS and Kubernetes saw.

``CallLedger`` reads through a running server's ``GET /api/v1/sandbox/calls``, a started
:class:`app.sandbox.Sandbox`, or the ledger file of a data directory when nothing runs::

    mark = ledger.mark()
    ...  # the product does something
    ledger.assert_no_writes(since=mark)
    created = ledger.once("eks", "CreateCluster", since=mark)      # exactly one successful call
    assert created["request"]["version"] == "1.32"
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.sandbox import Sandbox
from sandbox.ledger import matches, read_entries
from tests.support import LiveServer


class CallLedger:
    def __init__(self, source: LiveServer | Sandbox | Path) -> None:
        self.source = source

    def calls(self, *, service: str | None = None, operation: str | None = None, verb: str | None = None,
              write: bool | None = None, cluster: str | None = None, since: int = 0) -> list[dict[str, Any]]:
        """Entries after ``since`` (a seq), oldest first; everything the sandbox answered so far is included."""
        filters: dict[str, Any] = {"service": service, "operation": operation, "verb": verb, "write": write,
                                   "cluster": cluster, "since": since}
        if isinstance(self.source, LiveServer):
            params = {k: (str(v).lower() if isinstance(v, bool) else v) for k, v in filters.items() if v is not None}
            response = self.source.get("/api/v1/sandbox/calls", params={**params, "limit": 10_000})
            assert response.status_code == 200, response.text
            return list(response.json())
        if isinstance(self.source, Sandbox):
            return self.source.calls(**filters, limit=10_000)
        path = self.source / "sandbox" / "calls.jsonl"
        return [e for e in read_entries(path) if e.get("seq", 0) > since
                and matches(e, service, operation, verb, write, cluster)]

    def mark(self) -> int:
        """The seq of the newest entry: pass it as ``since`` to see only what happens next."""
        entries = self.calls()
        return int(entries[-1]["seq"]) if entries else 0

    def writes(self, since: int = 0, **filters: Any) -> list[dict[str, Any]]:
        return self.calls(write=True, since=since, **filters)

    def assert_no_writes(self, since: int = 0, **filters: Any) -> None:
        made = self.writes(since, **filters)
        assert not made, "expected no writes, got: " + ", ".join(_describe(e) for e in made)

    def succeeded(self, service: str, operation: str, since: int = 0,
                  target: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.calls(service=service, operation=operation, since=since)
                if e["status"] < 400 and (target is None or e.get("target") == target)]

    def once(self, service: str, operation: str, since: int = 0, target: str | None = None) -> dict[str, Any]:
        """The one successful ``service:operation`` call (on ``target``); fails if there are none or several."""
        found = self.succeeded(service, operation, since, target)
        assert len(found) == 1, (f"expected {service}:{operation} once, got {len(found)}: "
                                 f"{[_describe(e) for e in found]}")
        return found[0]


def _describe(entry: dict[str, Any]) -> str:
    if entry.get("kind") == "aws":
        return f"#{entry['seq']} {entry['service']}:{entry.get('operation')} {entry.get('target')} -> {entry['status']}"
    return (f"#{entry['seq']} k8s {entry.get('cluster')} {entry.get('verb')} {entry.get('resource')} "
            f"{entry.get('name')} -> {entry['status']}")
