"""Watch-backed caches of Kubernetes objects: one informer per (cluster, kind), started on first read.

An informer lists (in pages), then watches from the list's resourceVersion with bookmarks, resumes from
the last version it saw, and lists again when the server answers 410 Gone. Each watch connection asks
the client factory for its cluster's client, so an EKS token is fresh at every reconnect (connections
last at most ``WATCH_SECONDS``). Reads are answered from memory with the cache's age; every change is
published on the bus (topic ``kube``) with the cluster, the resource and the object's name.

Memory: objects are slimmed to the fields the product reads (a node ~2 KB, a pod ~0.3 KB, an event
~0.5 KB), so a 1,000-node cluster with 50,000 pods costs about 20 MB.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from services.errors import Forbidden, NotFound, ServiceError, Unauthorized, classify_kube
from services.events import Event, EventBus
from services.kube import KubeClients

log = logging.getLogger(__name__)

WATCH_SECONDS = 60
PAGE = 500
RETRY_SECONDS = (1.0, 2.0, 5.0, 10.0, 30.0)
#: a list page that takes longer than this (connect, read) is a failure, retried like any other
LIST_TIMEOUT = (10, 60)


def _meta(obj: dict[str, Any], *, labels: bool = True) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    out = {k: meta.get(k) for k in ("name", "namespace", "resourceVersion", "creationTimestamp") if meta.get(k)}
    if labels:
        out["labels"] = meta.get("labels") or {}
    return out


def slim_node(obj: dict[str, Any]) -> dict[str, Any]:
    status = obj.get("status") or {}
    return {"metadata": _meta(obj), "spec": {k: v for k, v in (obj.get("spec") or {}).items()
                                             if k in ("taints", "providerID", "unschedulable")},
            "status": {k: status.get(k) for k in ("capacity", "allocatable", "conditions", "addresses",
                                                  "nodeInfo") if k in status}}


def slim_pod(obj: dict[str, Any]) -> dict[str, Any]:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    restarts = sum(int(c.get("restartCount") or 0) for c in status.get("containerStatuses") or [])
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    meta = obj.get("metadata") or {}
    return {"metadata": {**_meta(obj), "uid": meta.get("uid"), "deletionTimestamp": meta.get("deletionTimestamp")},
            "spec": {"nodeName": spec.get("nodeName")},
            "status": {"phase": status.get("phase"), "restarts": restarts, "ready": ready}}


def slim_event(obj: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": _meta(obj, labels=False),
            **{k: obj.get(k) for k in ("type", "reason", "message", "involvedObject", "lastTimestamp", "count")},
            "host": (obj.get("source") or {}).get("host")}  # the kubelet's node, for a pod's events


def slim_deployment(obj: dict[str, Any]) -> dict[str, Any]:
    """A Deployment: metadata with annotations, replicas, its containers' image and command, its status."""
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    containers = ((spec.get("template") or {}).get("spec") or {}).get("containers") or []
    return {"metadata": {**_meta(obj), "annotations": meta.get("annotations") or {}, "uid": meta.get("uid"),
                         "generation": meta.get("generation")},
            "spec": {"replicas": spec.get("replicas"),
                     "containers": [{k: c.get(k) for k in ("name", "image", "command")} for c in containers]},
            "status": obj.get("status") or {}}


def slim_service(obj: dict[str, Any]) -> dict[str, Any]:
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    return {"metadata": {**_meta(obj), "annotations": meta.get("annotations") or {}},
            "spec": {k: spec.get(k) for k in ("type", "ports", "clusterIP") if k in spec},
            "status": obj.get("status") or {}}


def _without_templates(value: Any) -> Any:
    """A custom resource's spec without its pod templates (the bulk of a job; readers take them from a GET)."""
    if isinstance(value, dict):
        return {k: _without_templates(v) for k, v in value.items() if k not in ("template", "submitterPodTemplate")}
    if isinstance(value, list):
        return [_without_templates(v) for v in value]
    return value


def slim_custom(obj: dict[str, Any]) -> dict[str, Any]:
    """A job custom resource: metadata with annotations, its spec less pod templates, its whole status."""
    meta = obj.get("metadata") or {}
    return {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
            "metadata": {**_meta(obj), "annotations": meta.get("annotations") or {}, "uid": meta.get("uid")},
            "spec": _without_templates(obj.get("spec") or {}), "status": obj.get("status") or {}}


def slim_crd(obj: dict[str, Any]) -> dict[str, Any]:
    spec = obj.get("spec") or {}
    return {"metadata": _meta(obj, labels=False),
            "spec": {"group": spec.get("group"), "names": spec.get("names") or {},
                     "versions": [v.get("name") for v in spec.get("versions") or []]}}


def _custom(group: str, version: str, plural: str) -> Callable[[k8s.CoreV1Api], Callable[..., Any]]:
    def call(api: k8s.CoreV1Api) -> Callable[..., Any]:
        return functools.partial(k8s.CustomObjectsApi(api.api_client).list_cluster_custom_object, group, version,
                                 plural)
    return call


@dataclass(frozen=True)
class Kind:
    resource: str
    list_call: Callable[[k8s.CoreV1Api], Callable[..., Any]]
    slim: Callable[[dict[str, Any]], dict[str, Any]]


KINDS: dict[str, Kind] = {
    "nodes": Kind("nodes", lambda api: api.list_node, slim_node),
    "pods": Kind("pods", lambda api: api.list_pod_for_all_namespaces, slim_pod),
    "events": Kind("events", lambda api: api.list_event_for_all_namespaces, slim_event),
    # self-managed inference (services/inference)
    "deployments": Kind("deployments", lambda api: k8s.AppsV1Api(api.api_client).list_deployment_for_all_namespaces,
                        slim_deployment),
    "services": Kind("services", lambda api: api.list_service_for_all_namespaces, slim_service),
    "customresourcedefinitions": Kind("customresourcedefinitions", lambda api: k8s.ApiextensionsV1Api(
        api.api_client).list_custom_resource_definition, slim_crd),
    # training jobs (services/training): start one only once its CRD is listed, else it retries a 404
    "hyperpodpytorchjobs": Kind("hyperpodpytorchjobs", _custom("sagemaker.amazonaws.com", "v1", "hyperpodpytorchjobs"),
                                slim_custom),
    "pytorchjobs": Kind("pytorchjobs", _custom("kubeflow.org", "v1", "pytorchjobs"), slim_custom),
    "rayjobs": Kind("rayjobs", _custom("ray.io", "v1", "rayjobs"), slim_custom),
    # managed inference endpoints (services/inference/managed.py): likewise, once their CRD is listed
    "inferenceendpointconfigs": Kind("inferenceendpointconfigs", _custom(
        "inference.sagemaker.aws.amazon.com", "v1", "inferenceendpointconfigs"), slim_custom),
    "jumpstartmodels": Kind("jumpstartmodels", _custom("inference.sagemaker.aws.amazon.com", "v1", "jumpstartmodels"),
                            slim_custom),
}


def _key(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name')}"


class Informer:
    """One kind of one cluster, in memory; ``items()`` never blocks on the network."""

    def __init__(self, kube: KubeClients, bus: EventBus, cluster: str, kind: Kind,
                 on_list: Callable[[str, str], None] | None = None,
                 retry_seconds: tuple[float, ...] = RETRY_SECONDS) -> None:
        self.kube = kube
        self.retry_seconds = retry_seconds
        self.bus = bus
        self.on_list = on_list
        self.cluster = cluster
        self.kind = kind
        self.synced = threading.Event()
        self.attempted = threading.Event()  # the first list has succeeded or failed
        self.lists = 0  # full lists made (the first, and one per 410 or resync)
        self.error: str | None = None
        #: the last failure, classified: Forbidden/Unauthorized (no access entry or policy), or a bare
        #: ServiceError (code ``internal``) for an exception nothing classified — a bug or a broken kubeconfig,
        #: logged with its traceback. A stage waiting on this informer fails at once on these (see ``fatal``).
        self.failure: ServiceError | None = None
        self._objects: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._relist = threading.Event()
        self._wake = threading.Event()  # ends a retry pause early: a stop or a resync
        self._listed = threading.Condition()  # notified after every list and at stop
        self._synced_at: float | None = None
        self._version = 0  # counts changes to the objects (a list, an applied event)
        self._resp: Any = None
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"informer-{cluster}-{kind.resource}")
        self._thread.start()

    # ----- reads -------------------------------------------------------------------------------------

    def items(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._objects.values())

    def stamp(self) -> tuple[int, float | None]:
        """``(version, synced_at)``: the version changes with every change to the objects (a list, an applied
        event), so a reader may reuse what it derived from them while it holds; ``synced_at`` (monotonic
        seconds, None before the first list) is what :meth:`age` counts from."""
        with self._lock:
            return self._version, self._synced_at

    def age(self) -> float | None:
        """Seconds since the cache last matched the server (a list or a watch event), None before the first."""
        with self._lock:
            return None if self._synced_at is None else max(0.0, time.monotonic() - self._synced_at)

    def wait_synced(self, timeout: float) -> bool:
        """True once the cache holds a list; False at once when the first list has failed (its ``error``
        says why), else after ``timeout``: a read never waits long on a cluster that cannot answer."""
        if self.synced.is_set():
            return True
        self.attempted.wait(timeout)
        return self.synced.is_set()

    def resync(self, timeout: float) -> bool:
        """List again now (``refresh``); True once the new list is in."""
        with self._listed:
            before = self.lists
        self._relist.set()
        self._wake.set()  # a loop pausing after a failure lists at once
        self._interrupt()
        with self._listed:
            self._listed.wait_for(lambda: self.lists > before or self._stop.is_set(), timeout)
            return self.lists > before

    def stop(self, timeout: float = 0.0) -> None:
        self._stop.set()
        self._wake.set()
        self._interrupt()
        with self._listed:
            self._listed.notify_all()
        if timeout:
            self._thread.join(timeout)

    def _interrupt(self) -> None:
        """End a watch connection that is blocked reading (its loop then sees the stop or relist)."""
        resp = self._resp
        if resp is not None:
            try:
                resp.shutdown()  # urllib3's thread-safe way to end a read blocked in another thread
            except (OSError, ValueError):  # not connected yet, or already ended: nothing to interrupt
                log.debug("informer %s/%s: connection already closed", self.cluster, self.kind.resource)

    # ----- the loop ----------------------------------------------------------------------------------

    def _run(self) -> None:
        version: str | None = None
        failures = 0
        while not self._stop.is_set():
            try:
                api = k8s.CoreV1Api(self.kube.api_client(self.cluster))
                if version is None or self._relist.is_set():
                    self._relist.clear()
                    version = self._list(api)
                version = self._follow(api, version)
                failures = 0
            except ServiceError as exc:  # the client factory's clients raise the taxonomy
                if (exc.details or {}).get("http_status") == 410:
                    version = None  # too old: list again
                    continue
                failures = self._failed(exc.message, failures, exc)
            except ApiException as exc:
                if exc.status == 410:
                    version = None
                    continue
                failures = self._failed(f"Kubernetes {exc.status} {exc.reason}", failures,
                                        classify_kube(exc.status or 0, str(exc.reason), exc.body,
                                                      f"watch {self.kind.resource}"))
            except Exception as exc:  # unclassified: a bug or a kubeconfig the client cannot use
                if failures == 0 and not self._stop.is_set():
                    log.exception("informer %s/%s: unclassified failure", self.cluster, self.kind.resource)
                message = f"{type(exc).__name__}: {exc}"
                failures = self._failed(message, failures, ServiceError(
                    f"internal error reading {self.kind.resource} of {self.cluster}: {message} (a bug or an "
                    "unusable kubeconfig; see the server log)"))

    @property
    def fatal(self) -> ServiceError | None:
        """The last failure if waiting will not cure it (access refused, or unclassified), else None."""
        failure = self.failure
        if failure is None:  # cleared by every successful list
            return None
        return failure if isinstance(failure, (Forbidden, Unauthorized)) or failure.code == "internal" else None

    def _failed(self, message: str, failures: int, failure: ServiceError | None = None) -> int:
        if self._stop.is_set():  # ended on purpose: say nothing (the process may be exiting)
            return failures
        self.error = message
        self.failure = failure
        self.attempted.set()
        log.warning("informer %s/%s: %s", self.cluster, self.kind.resource, message)
        self._wake.wait(self.retry_seconds[min(failures, len(self.retry_seconds) - 1)])
        self._wake.clear()
        return failures + 1

    def _list(self, api: k8s.CoreV1Api) -> str:
        objects: dict[str, dict[str, Any]] = {}
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": PAGE, "_preload_content": False, "_request_timeout": LIST_TIMEOUT}
            if token:
                kwargs["_continue"] = token
            page = json.loads(self.kind.list_call(api)(**kwargs).data)
            for item in page.get("items", []):
                slim = self.kind.slim(item)
                objects[_key(slim)] = slim
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                break
        with self._lock:
            self._objects = objects
            self._version += 1
            self._synced_at = time.monotonic()
        # cleared before the list is announced: a refresh woken by it reads no failure the list has healed
        self.error = None
        self.failure = None
        with self._listed:
            self.lists += 1
            self._listed.notify_all()
        if self.on_list is not None:
            self.on_list(self.cluster, self.kind.resource)
        self.synced.set()
        self.attempted.set()
        self.bus.publish(Event("kube", "synced", {"cluster": self.cluster, "resource": self.kind.resource,
                                                  "count": len(objects)}))
        return str(page.get("metadata", {}).get("resourceVersion") or "0")

    def _follow(self, api: k8s.CoreV1Api, version: str) -> str | None:
        """Watch from ``version`` until the server ends the connection; the version to resume from (None:
        list again). Raw JSON lines: the client's ``Watch(deserialize=False)`` breaks on ERROR events."""
        resp = self.kind.list_call(api)(watch=True, resource_version=version, allow_watch_bookmarks=True,
                                        timeout_seconds=WATCH_SECONDS, _request_timeout=WATCH_SECONDS + 30,
                                        _preload_content=False)
        self._resp = resp
        try:
            # a stop or resync that came while the connection was being made found no response to end:
            # look once more now that it is published, so the watch never blocks on a request already taken back
            if self._stop.is_set() or self._relist.is_set():
                return None if self._relist.is_set() else version
            if resp.status == 410:
                return None
            if not 200 <= resp.status <= 299:
                raise ApiException(status=resp.status, reason=resp.reason)
            for line in iter_resp_lines(resp):  # type: ignore[no-untyped-call]
                if self._stop.is_set() or self._relist.is_set():
                    return None if self._relist.is_set() else version
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        return None
                    raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                if kind == "BOOKMARK":  # the server says the cache is current up to ``version``
                    with self._lock:
                        self._synced_at = time.monotonic()
                    continue
                self._apply(str(kind), self.kind.slim(obj))
        finally:
            self._resp = None
            resp.close()
            resp.release_conn()
        return None if self._relist.is_set() else version

    def _apply(self, kind: str, slim: dict[str, Any]) -> None:
        with self._lock:
            if kind == "DELETED":
                self._objects.pop(_key(slim), None)
            else:
                self._objects[_key(slim)] = slim
            self._version += 1
            self._synced_at = time.monotonic()
        self.bus.publish(Event("kube", kind.lower(), {"cluster": self.cluster, "resource": self.kind.resource,
                                                      "name": slim["metadata"].get("name")}))


class Informers:
    """Every informer of this server: started on first read, stopped when their cluster is forgotten."""

    def __init__(self, kube: KubeClients, bus: EventBus,
                 on_list: Callable[[str, str], None] | None = None,
                 retry_seconds: tuple[float, ...] = RETRY_SECONDS) -> None:
        self.kube = kube
        self.bus = bus
        self.on_list = on_list
        self.retry_seconds = retry_seconds
        self._informers: dict[tuple[str, str], Informer] = {}
        self._lock = threading.Lock()
        self._stopped = False  # after stop(), a late reader starts no informer (its thread would outlive ours)

    def get(self, cluster: str, resource: str) -> Informer:
        """The cluster's informer of ``resource``, started on first use; NotFound for a cluster the client
        factory does not know (e.g. forgotten while a read was under way), so none is started for it."""
        key = (cluster, resource)
        if cluster not in self.kube.clusters():
            raise NotFound(f"no Kubernetes cluster named {cluster!r} is registered")
        with self._lock:
            if self._stopped:
                raise NotFound(f"the informers are stopped: no {resource} of {cluster} are watched any more")
            informer = self._informers.get(key)
            if informer is None:
                informer = self._informers[key] = Informer(self.kube, self.bus, cluster, KINDS[resource],
                                                           self.on_list, self.retry_seconds)
        return informer

    def ages(self) -> list[tuple[str, str, float | None]]:
        """(cluster, resource, cache age or None before its first list) of every informer, for metrics."""
        with self._lock:
            informers = list(self._informers.items())
        return [(cluster, resource, informer.age()) for (cluster, resource), informer in sorted(informers)]

    def forget(self, cluster: str) -> None:
        with self._lock:
            gone = [self._informers.pop(key) for key in list(self._informers) if key[0] == cluster]
        for informer in gone:
            informer.stop()

    def stop(self) -> None:
        """Stop every informer and wait briefly for their threads, so none writes a log line while the
        process exits."""
        with self._lock:
            gone, self._informers, self._stopped = list(self._informers.values()), {}, True
        for informer in gone:
            informer.stop()
        for informer in gone:
            informer.stop(timeout=5)
