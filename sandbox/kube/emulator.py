"""The Kubernetes API emulator: many named clusters, their persistence, the request log, and the
in-process API simulated workloads use (``append_log`` and friends).

Mount it in any Tornado application with :meth:`Emulator.url_patterns` (e.g. Panel's
``pn.serve(extra_patterns=...)``) or run it alone with :func:`serve` / ``python -m sandbox.kube``.
Nothing here imports ``services/`` or ``app/``: the product reaches the emulator over HTTP with the
official client and a kubeconfig, exactly as it reaches EKS.
"""

from __future__ import annotations

import hmac
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .cluster import Cluster
from .controllers import Controllers
from .devices import DeviceGate
from .discovery import openapi_v3_docs, openapi_v3_index
from .downloader import ObjectStore
from .kubeconfig import CLUSTER_PREFIX, kubeconfig, write_kubeconfig
from .persistence import Persister
from .requestlog import RequestLog
from .validation import BuiltinValidator, CustomValidator

if TYPE_CHECKING:
    from sandbox.ledger import Ledger

REQUEST_LOG_SIZE = 20_000
OpenApi = tuple[dict[str, dict[str, Any]], dict[str, Any]]  # per group-version documents, their index


@dataclass(frozen=True)
class RequestRecord:
    time: float
    cluster: str
    method: str
    path: str
    query: str
    status: int
    user_agent: str
    content_type: str
    duration_ms: float


class Emulator:
    """All emulated clusters of one sandbox.

    ``data_dir``: where state (``kube/state.sqlite3``), the request log (``kube/requests.jsonl``, written
    by a background thread and rotated at 10 MB into ``requests.jsonl.1``) and kubeconfigs
    (``kube/kubeconfig-<cluster>.yaml``) live; ``None`` keeps everything in memory.
    ``token``: when set, requests must carry ``Authorization: Bearer <token>`` (its caller is
    ``token_identity``), or a bearer token for which ``accept`` (called with the cluster name and the token)
    returns the caller's identity, e.g. the IAM principal of an EKS-style presigned token.
    ``admit``: when given, called with the cluster name and the caller's identity; a caller it refuses gets
    401 Unauthorized, as EKS answers a principal without an access entry.
    ``ledger``: every request goes to the sandbox's call ledger too (:mod:`sandbox.ledger`).
    A mutation is answered only once its change and its ledger entry are on disk.
    ``device_plugins``: nodes advertise GPUs, Neuron devices and EFA only where their device plugin's pod runs
    (:mod:`.devices`); off, they advertise what their writer says.
    ``clock``: the time every cluster tells (epoch seconds): wall time unless the sandbox's AWS world hands
    the emulator its simulated clock (:meth:`use_clock`), so Kubernetes and AWS timestamps agree.
    """

    def __init__(self, data_dir: Path | None = None, *, token: str | None = None, history: int = 20_000,
                 debounce: float = 0.2, accept: Callable[[str, str], str | None] | None = None,
                 clock: Callable[[], float] = time.time, token_identity: str = "sandbox",
                 admit: Callable[[str, str], bool] | None = None, ledger: Ledger | None = None,
                 device_plugins: bool = False) -> None:
        self.data_dir = Path(data_dir) / "kube" if data_dir is not None else None
        self._clock = clock
        self.token = token
        self.token_identity = token_identity
        self._accept = accept
        self._admit = admit
        self.ledger = ledger
        self.clusters: dict[str, Cluster] = {}
        self.device_plugins = device_plugins
        self.requests: deque[RequestRecord] = deque(maxlen=REQUEST_LOG_SIZE)
        self._history = history
        self._builtin = BuiltinValidator()
        self._custom = CustomValidator()
        self._openapi: dict[str, tuple[int, OpenApi]] = {}  # cluster -> (types generation, documents)
        self._lock = threading.Lock()
        self._log_file: RequestLog | None = None
        self._persister: Persister | None = None
        self._listeners: list[Callable[[list[str]], None]] = []
        self._controllers: dict[str, Controllers] = {}
        self._object_store: ObjectStore | None = None
        self._cloud: tuple[str, str] | None = None
        if self.data_dir is not None:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self._persister = Persister(self.data_dir / "state.sqlite3", debounce)
            self._log_file = RequestLog(self.data_dir / "requests.jsonl")
            for name, (rv, objects) in self._persister.load().items():
                cluster = self._new_cluster(name)
                cluster.store.load(rv, objects)
                cluster.restored()
                self._persister.attach(cluster)
                self._controllers[name] = Controllers(cluster).start()

    def now(self) -> float:
        return self._clock()

    def use_clock(self, clock: Callable[[], float]) -> None:
        """Tell time by ``clock`` from now on, in every cluster (existing and new)."""
        self._clock = clock

    def identify(self, cluster: str, authorization: str) -> str | None:
        """Who an ``Authorization`` header says the caller is (``None``: not authenticated)."""
        if self.token is None:
            return "anonymous"
        scheme, _, token = authorization.partition(" ")
        if scheme != "Bearer" or not token:
            return None
        if hmac.compare_digest(token, self.token):
            return self.token_identity
        return self._accept(cluster, token) if self._accept is not None else None

    def admitted(self, cluster: str, identity: str) -> bool:
        """Whether an authenticated caller may use ``cluster`` (EKS: it has an access entry)."""
        return self._admit is None or self._admit(cluster, identity)

    # --- clusters ---------------------------------------------------------------------------------------

    def use_object_store(self, store: ObjectStore) -> None:
        """Where Mountpoint for S3 volumes write (the sandbox's S3), in every cluster (existing and new)."""
        self._object_store = store
        for cluster in list(self.clusters.values()):
            cluster.downloads.object_store = store

    def use_cloud(self, endpoint_url: str, region: str) -> None:
        """The AWS endpoint in-cluster AWS controllers (the load balancer controller) call, in every cluster."""
        self._cloud = (endpoint_url, region)
        for cluster in list(self.clusters.values()):
            cluster.cloud = self._cloud

    def _new_cluster(self, name: str) -> Cluster:
        cluster = Cluster(name, history=self._history, builtin_validator=self._builtin,
                          custom_validator=self._custom, clock=self.now)
        cluster.downloads.object_store = self._object_store
        cluster.cloud = self._cloud
        cluster.on_types_changed.append(lambda: self._forget_openapi(name))
        if self.device_plugins:
            cluster.devices = DeviceGate()
        self.clusters[name] = cluster
        return cluster

    def _forget_openapi(self, name: str) -> None:
        """Drop a cluster's outdated documents early (``openapi`` would never serve them anyway)."""
        self._openapi.pop(name, None)

    def on_clusters_changed(self, listener: Callable[[list[str]], None]) -> None:
        """Call ``listener(sorted names)`` after a cluster is created or deleted (outside the lock)."""
        self._listeners.append(listener)

    def _changed(self) -> None:
        names = sorted(self.clusters)
        for listener in list(self._listeners):
            listener(names)

    def ensure_cluster(self, name: str) -> Cluster:
        """The cluster called ``name``, created (with its system namespaces) if it does not exist."""
        with self._lock:
            cluster = self.clusters.get(name)
            created = cluster is None
            if cluster is None:
                cluster = self._new_cluster(name)
                if self._persister is not None:
                    self._persister.attach(cluster)  # before bootstrap, so its namespaces are persisted too
                cluster.bootstrap()
                self._controllers[name] = Controllers(cluster).start()
        if created:
            self._changed()
        return cluster

    def delete_cluster(self, name: str) -> None:
        with self._lock:
            existed = self.clusters.pop(name, None) is not None
            controllers = self._controllers.pop(name, None)
            if controllers is not None:
                controllers.stop()
            self._openapi.pop(name, None)
            if self._persister is not None:
                self._persister.forget(name)
        if existed:
            self._changed()

    def cluster(self, name: str) -> Cluster:
        return self.clusters[name]

    def controllers(self, name: str) -> Controllers:
        """The control loops of cluster ``name`` (scheduler, kubelets, workload controllers)."""
        return self._controllers[name]

    # --- in-process API for simulated workloads ---------------------------------------------------------

    def append_log(self, cluster: str, namespace: str, pod: str, container: str, line: str,
                   ts: float | None = None) -> None:
        self.clusters[cluster].logs.append((namespace, pod, container), line, self.now() if ts is None else ts)

    def restart_container(self, cluster: str, namespace: str, pod: str, container: str) -> None:
        self.clusters[cluster].logs.restart((namespace, pod, container))

    def end_log(self, cluster: str, namespace: str, pod: str, container: str) -> None:
        """The container terminated: ``logs -f`` followers see the end of the stream."""
        self.clusters[cluster].logs.terminate((namespace, pod, container))

    # --- kubeconfig -------------------------------------------------------------------------------------

    def kubeconfig(self, cluster: str, base_url: str) -> dict[str, Any]:
        return kubeconfig(cluster, base_url, self.token or "sandbox")

    def write_kubeconfig(self, cluster: str, base_url: str, path: Path | None = None, *,
                         ca_pem: bytes | None = None) -> Path:
        """Write a kubeconfig for ``cluster``; an https ``base_url`` needs the CA of its certificate."""
        if path is None:
            if self.data_dir is None:
                raise ValueError("no data directory: pass an explicit kubeconfig path")
            path = self.data_dir / f"kubeconfig-{cluster}.yaml"
        return write_kubeconfig(path, cluster, base_url, self.token or "sandbox", ca_pem=ca_pem)

    # --- HTTP -------------------------------------------------------------------------------------------

    def url_patterns(self, prefix: str = CLUSTER_PREFIX) -> list[tuple[str, type, dict[str, Any]]]:
        """Tornado URL specs serving every cluster under ``<prefix>/<name>/...``."""
        from .http import KubeHandler

        return [(rf"{prefix}/([^/]+)(/.*)?", KubeHandler, {"emulator": self})]

    def openapi(self, cluster: Cluster) -> OpenApi:
        """The cluster's OpenAPI v3 documents and index, cached per generation of its types. A CRD can
        register on another thread while the documents are built: they are then stored only if the
        generation did not move meanwhile, and a cached entry from an older generation is never served."""
        generation = cluster.types_generation
        cached = self._openapi.get(cluster.name)
        if cached is not None and cached[0] == generation:
            return cached[1]
        docs = openapi_v3_docs(cluster.resource_types())
        built = (docs, openapi_v3_index(docs))
        with self._lock:
            if cluster.types_generation == generation and self.clusters.get(cluster.name) is cluster:
                self._openapi[cluster.name] = (generation, built)
        return built

    def record_request(self, *, caller: str = "", query_args: dict[str, str] | None = None, kube_path: str = "",
                       **fields: Any) -> int:
        """Keep one request (memory, the request log, the ledger); returns its ledger sequence number."""
        from sandbox.ledger import kube_request

        record = RequestRecord(time=time.time(), **fields)
        self.requests.append(record)
        if self._log_file is not None:
            self._log_file.write(asdict(record))
        if self.ledger is None:
            return 0
        return self.ledger.record({
            "kind": "kubernetes", "service": "kubernetes", "cluster": record.cluster,
            **kube_request(record.method, kube_path, query_args or {}), "status": record.status,
            "caller": {"identity": caller, "user_agent": record.user_agent}})

    def durable(self, seq: int = 0) -> None:
        """Block until every change so far and ledger entry ``seq`` are on disk (before answering a mutation)."""
        if self._persister is not None:
            self._persister.flush()
        if self.ledger is not None and seq:
            self.ledger.wait(seq)

    def requests_for(self, cluster: str, method: str | None = None) -> list[RequestRecord]:
        return [r for r in list(self.requests) if r.cluster == cluster and (method is None or r.method == method)]

    # --- lifecycle --------------------------------------------------------------------------------------

    def flush(self) -> None:
        if self._persister is not None:
            self._persister.flush()
        if self._log_file is not None:
            self._log_file.flush()

    def close(self) -> None:
        for controllers in list(self._controllers.values()):
            controllers.stop()
        self._controllers.clear()
        if self._persister is not None:
            self._persister.close()
            self._persister = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
