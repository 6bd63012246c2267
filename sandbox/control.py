"""The sandbox's control API, under ``/_sandbox/`` on its AWS port: what the product's server reads and does
across the process boundary (``app/sandbox.py``), authenticated with a control token of its own.

* ``GET /_sandbox/health``: ready (the readiness probe);
* ``GET /_sandbox/info``: the simulated operations, endpoints and clusters;
* ``GET|POST /_sandbox/faults``, ``DELETE /_sandbox/faults/<id|all>``: the injected faults, with ``held``:
  the answers a ``hold_response`` fault holds now (listed until cleared, once used up too; a delete
  releases them);
* ``GET /_sandbox/clusters?after=<generation>&wait=<s>``: the emulated clusters, as a long-poll that
  answers as soon as the set changes after ``generation`` (the server follows it to register
  kubeconfigs for clusters an EKS create makes);
* ``GET /_sandbox/calls?service=&operation=&verb=&since=&write=&cluster=&limit=``: the call ledger.

These requests are not AWS or Kubernetes calls, so they are not in the ledger.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import threading
from typing import TYPE_CHECKING, Any

from tornado.web import RequestHandler

if TYPE_CHECKING:
    from sandbox.host import SandboxHost
    from sandbox.kube import Emulator

MAX_WAIT = 30.0


class ClusterFeed:
    """The emulated clusters with a generation that moves on every create or delete, for long-polls."""

    def __init__(self, emulator: Emulator) -> None:
        self._cond = threading.Condition()
        self._generation = 1
        self._names = sorted(emulator.clusters)
        self._closed = False
        emulator.on_clusters_changed(self._changed)

    def _changed(self, names: list[str]) -> None:
        with self._cond:
            self._generation += 1
            self._names = list(names)
            self._cond.notify_all()

    def wait(self, after: int, timeout: float) -> tuple[int, list[str]]:
        """The generation and names once the generation is past ``after`` (or when ``timeout`` ends)."""
        with self._cond:
            self._cond.wait_for(lambda: self._generation > after or self._closed, timeout)
            return self._generation, list(self._names)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class _Control(RequestHandler):
    def initialize(self, host: SandboxHost, token: str) -> None:
        self.host = host
        self.token = token

    def prepare(self) -> None:
        given = self.request.headers.get("Authorization", "").removeprefix("Bearer ")
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            self._json({"error": "the sandbox's control API needs its control token"}, 401)

    def check_xsrf_cookie(self) -> None:
        """Bearer tokens only."""

    def _json(self, body: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(body))

    def _faults(self) -> list[dict[str, Any]]:
        """The active faults, and the used-up hold faults not cleared yet, with the answers they hold now."""
        faults = self.host.world.faults
        held = {f.id: (f, n) for f, n in faults.holding()}
        listed = faults.list()
        return [{"id": f.id, "kind": f.kind, "target": f.target, "remaining": f.remaining,
                 "held": held.pop(f.id, (f, 0))[1]} for f in listed] + [
            {"id": f.id, "kind": f.kind, "target": f.target, "remaining": f.remaining, "held": n}
            for f, n in held.values()]


class _Health(_Control):
    def get(self) -> None:
        self._json({"ready": True})


class _Info(_Control):
    def get(self) -> None:
        self._json(self.host.info())


class _Faults(_Control):
    def get(self) -> None:
        self._json(self._faults())

    def post(self) -> None:
        try:
            body = json.loads(self.request.body or b"{}")
            fault = self.host.world.faults.inject(str(body["kind"]), {str(k): str(v) for k, v in
                                                                      (body.get("target") or {}).items()},
                                                  body.get("count"))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            self._json({"error": f"bad fault: {exc}"}, 400)
            return
        self._json({"id": fault.id, "kind": fault.kind, "target": fault.target, "remaining": fault.remaining}, 201)


class _Fault(_Control):
    def delete(self, fault_id: str) -> None:
        faults = self.host.world.faults
        if fault_id != "all" and fault_id not in {f.id for f in faults.list()} | {f.id for f, _ in faults.holding()}:
            self._json({"error": f"no active fault {fault_id!r} (it may have cleared itself)"}, 404)
            return
        faults.clear(None if fault_id == "all" else fault_id)
        self._json(self._faults())


class _Clusters(_Control):
    async def get(self) -> None:
        after = int(self.get_query_argument("after", "0") or 0)
        wait = min(float(self.get_query_argument("wait", "0") or 0), MAX_WAIT)
        generation, names = await asyncio.get_running_loop().run_in_executor(None, self.host.feed.wait, after, wait)
        self._json({"generation": generation, "clusters": names})


class _Calls(_Control):
    async def get(self) -> None:
        def arg(name: str) -> str | None:
            return self.get_query_argument(name, None) or None

        write = arg("write")
        try:
            since = int(arg("since") or 0)
            limit = int(arg("limit") or 10_000)
        except ValueError:
            self._json({"error": "since and limit are integers"}, 400)
            return
        entries = await asyncio.get_running_loop().run_in_executor(None, lambda: self.host.ledger.entries(
            service=arg("service"), operation=arg("operation"), verb=arg("verb"), since=since, cluster=arg("cluster"),
            write=None if write is None else write.lower() in ("true", "1"), limit=limit))
        self._json({"calls": entries, "last_seq": self.host.ledger.last_seq})


def control_patterns(host: SandboxHost, token: str) -> list[tuple[str, type, dict[str, Any]]]:
    args = {"host": host, "token": token}
    return [(r"/_sandbox/health", _Health, args), (r"/_sandbox/info", _Info, args),
            (r"/_sandbox/faults", _Faults, args), (r"/_sandbox/faults/([^/]+)", _Fault, args),
            (r"/_sandbox/clusters", _Clusters, args), (r"/_sandbox/calls", _Calls, args)]
