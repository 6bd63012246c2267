"""The ``operations`` noun: the verbs every face uses to read, retry and cancel operations, and the status
summary built on them. Submitting is not here: each noun submits its own kinds from its own verbs, and
the engine (``services/operations.py``) is importable only inside ``services/`` (an import-linter contract).

Retry and cancel take the role the operation's kind takes to start (the engine checks it per operation);
the verb's declared role is the least one, which the route and the MCP tool list show."""

from __future__ import annotations

import threading
import time

from services import __version__
from services.auth import Principal, Role
from services.clusters import Clusters
from services.kube import KubeClients
from services.operation_views import OperationQuery, OperationView
from services.operations import Engine
from services.status import StatusSummary
from services.verbs import verb


class Operations:
    def __init__(self, engine: Engine, kube: KubeClients, clusters: Clusters) -> None:
        self._engine = engine
        self._kube = kube
        self._clusters = clusters
        #: the last summary and what it was made from: (the engine index's version, the Kubernetes clusters)
        self._summary: tuple[int, list[str], StatusSummary] | None = None

    @verb(Role.VIEWER)
    def list_operations(self, principal: Principal, query: OperationQuery | None = None) -> list[OperationView]:
        return self._engine.list(query or OperationQuery())

    @verb(Role.VIEWER)
    def get_operation(self, principal: Principal, op_id: str) -> OperationView:
        return self._engine.get(op_id)

    @verb(Role.VIEWER)
    def wait_operation(self, principal: Principal, op_id: str, timeout: float = 60.0) -> OperationView:
        """Block until the operation ends or ``timeout`` seconds pass, woken by its bus events (no polling);
        for notebooks and the CLI (the REST face long-polls on the loop instead)."""
        changed = threading.Event()
        unsubscribe = self._engine.bus.subscribe(lambda _event: changed.set(), topic="operation",
                                                 where={"id": op_id})
        try:
            deadline = time.monotonic() + timeout
            view = self._engine.get(op_id)
            while not view.status.terminal and (remaining := deadline - time.monotonic()) > 0:
                changed.wait(remaining)
                changed.clear()  # before reading: an event during the read wakes the next wait at once
                view = self._engine.get(op_id)
            return view
        finally:
            unsubscribe()

    @verb(Role.OPERATOR)
    def retry_operation(self, principal: Principal, op_id: str) -> OperationView:
        return self._engine.retry(op_id, principal)

    @verb(Role.OPERATOR)
    def cancel_operation(self, principal: Principal, op_id: str) -> OperationView:
        return self._engine.cancel(op_id, principal)

    @verb(Role.VIEWER)
    def summary(self, principal: Principal, wait: float = 0) -> StatusSummary:
        """What the control plane is doing: counts, active operations, recent failures, and the clusters with
        their node health from the caches; ``wait``: how long a cluster not yet read may take (the server
        never waits, a one-off CLI read does). With ``wait=0`` it reads memory only (the engine's index,
        the registry, the caches), so the REST face answers it on the event loop.

        The summary is reused (the same object, its JSON encoded once) until one of its parts changes: the
        engine index's version (every change of counts, active operations and failures bumps it), the
        Kubernetes clusters, or a cluster row (rows are themselves reused until their inputs change)."""
        version = self._engine.index_version()  # first: a change after this read makes the next summary anew
        clusters = self._kube.clusters()
        registered = self._clusters.list_clusters(principal, wait=wait)
        made = self._summary
        if made is not None and made[0] == version and made[1] == clusters and \
                len(made[2].registered) == len(registered) and \
                all(a is b for a, b in zip(made[2].registered, registered, strict=True)):
            return made[2]
        summary = StatusSummary(
            version=__version__,
            operations=self._engine.counts(),
            active=self._engine.active(),
            recent_failures=self._engine.recent_failures(),
            clusters=clusters,
            registered=registered,
        )
        self._summary = (version, clusters, summary)
        return summary

    @verb(Role.VIEWER)
    def metrics_text(self, principal: Principal) -> str:
        """Prometheus text: engine, bus, AWS calls and informer lists."""
        return self._engine.metrics.render()

    @property
    def engine_running(self) -> bool:
        return self._engine.running
