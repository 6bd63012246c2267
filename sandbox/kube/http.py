"""The Tornado front: Kubernetes REST paths under ``/k8s/clusters/<name>`` for many clusters at once.

One catch-all handler parses the Kubernetes URL grammar (discovery, OpenAPI, ``/version``, and
``[/namespaces/{ns}]/{plural}[/{name}[/{subresource}]]`` under ``/api/v1`` or ``/apis/{group}/{version}``)
and calls the :class:`.Cluster` methods. Transport rules learnt the hard way (see the sandbox findings):

* Tornado reads every request body before the handler runs, so keep-alive connections never see stray
  bytes from an unread DELETE/PATCH body.
* Streams (watch, ``logs -f``) turn Nagle off and flush each event as one chunk.
* A missing ``Content-Type`` means JSON (the 37.x Python client POSTs without one); protobuf bodies get a
  415 that tells the user to use ``-f`` with a JSON/YAML manifest instead.
* Nothing blocks the loop: watches wait on an ``asyncio.Queue`` fed thread-safely by the store.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import yaml
from tornado import iostream
from tornado.web import RequestHandler

from . import aggregator, deletion, discovery, disruption, log_stream, proxy, tables
from .cluster import Cluster, WriteOptions
from .errors import ApiError, bad_request, gone, method_not_allowed, not_found
from .patch import PATCH_TYPES
from .resources import POD_KEY, ResourceType
from .selectors import object_matcher
from .store import WatchEvent

if TYPE_CHECKING:
    from .emulator import Emulator

PROTOBUF = "application/vnd.kubernetes.protobuf"
BOOKMARK_INTERVAL = 5.0
WATCH_QUEUE_LIMIT = 10_000  # events waiting for one slow watcher; beyond it the watch is closed (clients relist)
DEFAULT_WATCH_TIMEOUT = 1800.0
_DELETE_RETURNS_OBJECT = {("", "pods"), ("", "services"), ("", "persistentvolumeclaims"), ("", "persistentvolumes"),
                          ("", "serviceaccounts"), ("storage.k8s.io", "storageclasses"), ("", "namespaces")}


class KubeHandler(RequestHandler):
    """Serves ``/k8s/clusters/<cluster><kubernetes path>``."""

    SUPPORTED_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")

    def initialize(self, emulator: Emulator) -> None:
        self.emulator = emulator
        self._started = time.monotonic()
        self._cluster_name = ""
        self._closed = asyncio.Event()
        self._recorded = False
        self._caller = ""
        self._kube_path = "/"
        self._defer = False  # a mutation: its answer waits until its change is on disk
        self._deferred: tuple[int, Any, list[str] | None] | None = None

    def compute_etag(self) -> str | None:
        """No ETags: a 304 on a list or watch would confuse clients; discovery is cheap to resend."""
        return None

    def check_xsrf_cookie(self) -> None:
        """API clients authenticate with bearer tokens, not cookies."""

    def on_connection_close(self) -> None:
        self._closed.set()
        self._record()

    def finish(self, chunk: str | bytes | dict[str, Any] | None = None) -> Any:
        # Recorded before the response leaves, so a client that got its answer finds its request logged.
        self._record()
        return super().finish(chunk)

    def _record(self) -> int:
        if self._recorded:
            return 0
        self._recorded = True
        return self.emulator.record_request(
            cluster=self._cluster_name, method=self.request.method or "", path=self.request.path,
            query=self.request.query, status=self.get_status(),
            user_agent=self.request.headers.get("User-Agent", ""),
            content_type=self.request.headers.get("Content-Type", ""),
            duration_ms=(time.monotonic() - self._started) * 1000,
            caller=self._caller, kube_path=self._kube_path,
            query_args={k: self.get_query_argument(k, "") or "" for k in ("watch", "dryRun")},
        )

    # --- entry points -----------------------------------------------------------------------------------

    async def get(self, cluster: str, path: str | None) -> None:
        await self._dispatch(cluster, path)

    async def post(self, cluster: str, path: str | None) -> None:
        await self._dispatch(cluster, path)

    async def put(self, cluster: str, path: str | None) -> None:
        await self._dispatch(cluster, path)

    async def patch(self, cluster: str, path: str | None) -> None:
        await self._dispatch(cluster, path)

    async def delete(self, cluster: str, path: str | None) -> None:
        await self._dispatch(cluster, path)

    async def head(self, cluster: str, path: str | None) -> None:
        await self._dispatch(cluster, path)

    async def options(self, cluster: str, path: str | None) -> None:
        await self._dispatch(cluster, path)

    async def _dispatch(self, cluster_name: str, path: str | None) -> None:
        self._cluster_name = cluster_name
        self._kube_path = proxy.clean_path(unquote(path or "/"))
        try:
            self._authorize()
            cluster = self.emulator.clusters.get(cluster_name)
            if cluster is None:
                raise ApiError(404, "NotFound", f'cluster "{cluster_name}" is not served by this sandbox')
            self._defer = self.request.method in ("POST", "PUT", "PATCH", "DELETE")
            await self._route(cluster, self._kube_path)
            if self._deferred is not None:
                await self._durable_answer()
        except ApiError as exc:
            self._defer = False
            self._send(exc.code, exc.status())
        except (iostream.StreamClosedError, asyncio.CancelledError):
            return

    async def _durable_answer(self) -> None:
        """Send a mutation's answer once its change and its ledger entry are on disk (off the loop)."""
        assert self._deferred is not None
        code, body, warnings = self._deferred
        self._deferred, self._defer = None, False
        self.set_status(code)
        seq = self._record()
        await asyncio.get_running_loop().run_in_executor(None, self.emulator.durable, seq)
        self._send(code, body, warnings)

    def _authorize(self) -> None:
        identity = self.emulator.identify(self._cluster_name, self.request.headers.get("Authorization", ""))
        if identity is None:
            raise ApiError(401, "Unauthorized", "Unauthorized")
        self._caller = identity
        if not self.emulator.admitted(self._cluster_name, identity):  # EKS: no access entry for the principal
            raise ApiError(401, "Unauthorized", "Unauthorized")

    # --- responses --------------------------------------------------------------------------------------

    def _send(self, code: int, body: Any, warnings: list[str] | None = None) -> None:
        if self._finished:
            return
        if self._defer and code < 400:
            self._deferred = (code, body, warnings)
            return
        self.set_status(code)
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-cache, private")
        for w in warnings or []:
            self.add_header("Warning", '299 - "' + w.replace('"', '\\"') + '"')
        self.finish(json.dumps(body, separators=(",", ":")))

    def _arg(self, name: str, default: str = "") -> str:
        return self.get_query_argument(name, default) or default

    def _bool(self, name: str) -> bool:
        return self._arg(name).lower() in ("true", "1")

    def _accept_table(self) -> bool:
        return "as=Table" in self.request.headers.get("Accept", "")

    def _accept_partial(self) -> bool:
        return "as=PartialObjectMetadata" in self.request.headers.get("Accept", "")

    def _body(self, patch: bool = False) -> Any:
        ctype = self.request.headers.get("Content-Type", "").split(";")[0].strip().lower()
        raw = self.request.body or b""
        if ctype == PROTOBUF:
            raise ApiError(415, "UnsupportedMediaType",
                           "the body of the request was in an unknown format - accepted media types include: "
                           "application/json, application/yaml. The InstantStart sandbox does not decode "
                           "protobuf: instead of a generator such as 'kubectl create configmap', write the "
                           "manifest to a file and use 'kubectl create -f FILE' or 'kubectl apply -f FILE'")
        if not raw.strip():
            return None
        try:
            if ctype in ("application/yaml", "application/apply-patch+yaml"):
                return yaml.safe_load(raw)
            return json.loads(raw)
        except (ValueError, yaml.YAMLError) as exc:
            raise bad_request(f"the body of the request could not be decoded: {exc}") from exc

    def _write_opts(self) -> WriteOptions:
        manager = self._arg("fieldManager") or self.request.headers.get("User-Agent", "unknown").split("/")[0]
        validation = self._arg("fieldValidation", "Warn")
        if validation not in ("Strict", "Warn", "Ignore"):
            raise bad_request(f"fieldValidation must be one of Strict, Warn, Ignore, got {validation!r}")
        return WriteOptions(manager=manager, validation=validation, dry_run=self._arg("dryRun") == "All",
                            force=self._bool("force"))

    # --- routing ----------------------------------------------------------------------------------------

    async def _route(self, cluster: Cluster, path: str) -> None:
        segs = [s for s in path.split("/") if s]
        method = self.request.method
        if method not in ("GET", "HEAD") and (not segs or segs[0] not in ("api", "apis")):
            raise method_not_allowed()
        types = cluster.resource_types()
        if not segs:
            self._send(200, {"paths": sorted({"/api", "/api/v1", "/apis", "/version", "/openapi/v3"} | {
                f"/apis/{g}/{v}" for g, vs in discovery.group_versions(types).items() if g for v in vs})})
        elif segs[0] in ("healthz", "readyz", "livez"):
            self.set_header("Content-Type", "text/plain")
            self.finish("ok")
        elif segs == ["version"]:
            self._send(200, discovery.version_info())
        elif segs[0] == "openapi":
            self._openapi(cluster, segs[1:])
        elif segs[0] == "api":
            if len(segs) == 1:
                self._send(200, discovery.api_versions())
            elif len(segs) == 2 and segs[1] == "v1":
                self._send(200, discovery.api_resource_list(types, "", "v1"))
            elif segs[1] == "v1":
                await self._resource(cluster, "", "v1", segs[2:])
            else:
                raise not_found("", "", path)
        elif segs == ["apis", "authorization.k8s.io", "v1", "selfsubjectaccessreviews"] and method == "POST":
            self._access_review()
        elif segs[0] == "apis" and len(segs) >= 3 and aggregator.unavailable(cluster, segs[1], segs[2]):
            self._send_text(503, "service unavailable\n")  # kube-aggregator's proxy, its APIService not Available
        elif segs[0] == "apis":
            if len(segs) == 1:
                self._send(200, discovery.api_group_list(types))
            elif len(segs) == 2:
                doc = discovery.api_group(types, segs[1])
                self._send_or_404(doc)
            elif len(segs) == 3:
                self._send_or_404(discovery.api_resource_list(types, segs[1], segs[2]))
            else:
                await self._resource(cluster, segs[1], segs[2], segs[3:])
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")

    def _access_review(self) -> None:
        """``kubectl auth can-i``: the sandbox enforces no RBAC, so everything is allowed."""
        body = self._body()
        review = body if isinstance(body, dict) else {}
        review.update(apiVersion="authorization.k8s.io/v1", kind="SelfSubjectAccessReview",
                      status={"allowed": True, "reason": "the InstantStart sandbox does not enforce RBAC"})
        self._send(201, review)

    def _send_text(self, code: int, text: str) -> None:
        self.set_status(code)
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.set_header("X-Content-Type-Options", "nosniff")
        self.finish(text)

    def _send_or_404(self, doc: dict[str, Any] | None) -> None:
        if doc is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        self._send(200, doc)

    def _openapi(self, cluster: Cluster, segs: list[str]) -> None:
        if not segs or segs[0] != "v3":
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        docs, index = self.emulator.openapi(cluster)
        if len(segs) == 1:
            self._send(200, index)
            return
        self._send_or_404(docs.get("/".join(segs[1:])))

    async def _resource(self, cluster: Cluster, group: str, version: str, segs: list[str]) -> None:
        namespace: str | None = None
        if len(segs) >= 3 and segs[0] == "namespaces" and segs[2] not in ("status", "finalize"):
            namespace, segs = segs[1], segs[2:]
        plural = segs[0]
        name = segs[1] if len(segs) > 1 else ""
        sub = segs[2] if len(segs) > 2 else ""
        if len(segs) > 3 and sub != "proxy":
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        rt = cluster.lookup(group, version, plural)
        if namespace is not None and not rt.namespaced:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if sub and sub not in rt.subresources and not (rt.plural == "namespaces" and sub == "finalize"):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if sub == "proxy" and namespace is not None:
            await self._proxy(cluster, rt, namespace, name, segs[3:])
            return
        method = self.request.method
        if method in ("GET", "HEAD"):
            await self._read(cluster, rt, namespace, name, sub)
        elif method == "POST":
            self._post(cluster, rt, namespace, name, sub)
        elif method == "PUT" and name:
            self._put(cluster, rt, namespace, name, sub)
        elif method == "PATCH" and name:
            self._patch(cluster, rt, namespace, name, sub)
        elif method == "DELETE":
            self._delete(cluster, rt, namespace, name)
        else:
            raise method_not_allowed()

    # --- verbs ------------------------------------------------------------------------------------------

    async def _read(self, cluster: Cluster, rt: ResourceType, namespace: str | None, name: str, sub: str) -> None:
        if name and sub == "log":
            await self._logs(cluster, rt, namespace, name)
        elif name and sub == "scale":
            self._send(200, cluster.get_scale(rt, namespace, name))
        elif name:
            obj = cluster.get(rt, namespace, name)
            self._send(200, self._render(rt, [obj], str(obj["metadata"].get("resourceVersion", "")), cluster.clock(),
                                         single=True))
        elif self._bool("watch"):
            await self._watch(cluster, rt, namespace)
        else:
            limit = self._arg("limit", "0")
            result = cluster.list(rt, namespace, label_selector=self._arg("labelSelector"),
                                  field_selector=self._arg("fieldSelector"),
                                  limit=int(limit) if limit.isdigit() else 0,
                                  continue_token=self._arg("continue"))
            if self._accept_table():
                self._send(200, tables.table(rt, result.items, cluster.clock(), result.resource_version,
                                             result.continue_token, self._arg("includeObject", "Metadata")))
                return
            meta: dict[str, Any] = {"resourceVersion": result.resource_version}
            if result.continue_token:
                meta["continue"] = result.continue_token
                meta["remainingItemCount"] = result.remaining
            items = [_partial(o) for o in result.items] if self._accept_partial() else result.items
            kind = "PartialObjectMetadataList" if self._accept_partial() else rt.list_kind
            api_version = "meta.k8s.io/v1" if self._accept_partial() else rt.api_version
            self._send(200, {"kind": kind, "apiVersion": api_version, "metadata": meta, "items": items})

    def _render(self, rt: ResourceType, objs: list[dict[str, Any]], rv: str, now: float,
                single: bool = False) -> Any:
        if self._accept_table():
            return tables.table(rt, objs, now, rv, include_object=self._arg("includeObject", "Metadata"))
        if single and self._accept_partial():
            return _partial(objs[0])
        return objs[0] if single else objs

    def _post(self, cluster: Cluster, rt: ResourceType, namespace: str | None, name: str, sub: str) -> None:
        body = self._body()
        if name and sub == "eviction" and rt.key == POD_KEY:
            disruption.evict(cluster, rt, namespace, name, dry_run=self._arg("dryRun") == "All")
            self._send(201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})
            return
        if name:
            raise method_not_allowed()
        if not isinstance(body, dict):
            raise bad_request("the request body must be a JSON or YAML object")
        self._check_kind(rt, body)
        result = cluster.create(rt, namespace, body, self._write_opts())
        self._send(201, result.obj, result.warnings)

    def _check_kind(self, rt: ResourceType, body: dict[str, Any]) -> None:
        kind, api_version = body.get("kind"), body.get("apiVersion")
        if kind and kind != rt.kind:
            raise bad_request(f"the kind of the object ({kind}) does not match the resource ({rt.plural})")
        if api_version and rt.crd is None and api_version != rt.api_version:
            raise bad_request(f"the API version in the data ({api_version}) does not match the expected API "
                              f"version ({rt.api_version})")

    def _put(self, cluster: Cluster, rt: ResourceType, namespace: str | None, name: str, sub: str) -> None:
        body = self._body()
        if not isinstance(body, dict):
            raise bad_request("the request body must be a JSON or YAML object")
        if sub == "scale":
            self._send(200, cluster.update_scale(rt, namespace, name, "replace", body, self._write_opts()))
            return
        if sub not in ("status", "") and not (rt.plural == "namespaces" and sub == "finalize"):
            raise method_not_allowed()
        self._check_kind(rt, body)
        result = cluster.replace(rt, namespace, name, body, self._write_opts(), "status" if sub == "status" else "")
        self._send(200, result.obj, result.warnings)

    def _patch(self, cluster: Cluster, rt: ResourceType, namespace: str | None, name: str, sub: str) -> None:
        ctype = self.request.headers.get("Content-Type", "").split(";")[0].strip().lower()
        patch_type = PATCH_TYPES.get(ctype)
        if patch_type is None:
            raise ApiError(415, "UnsupportedMediaType", "the body of the request was in an unknown format - "
                           "accepted media types include: " + ", ".join(PATCH_TYPES))
        body = self._body(patch=True)
        if body is None:
            raise bad_request("the patch body is empty")
        if sub == "scale":
            self._send(200, cluster.update_scale(rt, namespace, name, patch_type, body, self._write_opts()))
            return
        result = cluster.patch(rt, namespace, name, patch_type, body, self._write_opts(), sub)
        self._send(201 if result.created else 200, result.obj, result.warnings)

    def _delete(self, cluster: Cluster, rt: ResourceType, namespace: str | None, name: str) -> None:
        body = self._body() or {}
        if not isinstance(body, dict):
            raise bad_request("DeleteOptions must be an object")
        propagation = self._arg("propagationPolicy") or body.get("propagationPolicy")
        if body.get("orphanDependents") is True or self._arg("orphanDependents") == "true":
            propagation = "Orphan"
        dry_run = self._arg("dryRun") == "All" or "All" in (body.get("dryRun") or [])
        if not name:
            deleted = deletion.delete_collection(cluster, rt, namespace, self._arg("labelSelector"),
                                                 self._arg("fieldSelector"), propagation, dry_run)
            self._send(200, {"kind": rt.list_kind, "apiVersion": rt.api_version, "metadata": {}, "items": deleted})
            return
        obj, gone_now = deletion.delete(cluster, rt, namespace, name, propagation=propagation,
                                        preconditions=body.get("preconditions"), dry_run=dry_run)
        if not gone_now or rt.key in _DELETE_RETURNS_OBJECT or rt.crd is not None:
            self._send(200, obj)
            return
        self._send(200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                         "details": {"name": name, "group": rt.group, "kind": rt.plural,
                                     "uid": obj["metadata"].get("uid", "")}})

    async def _proxy(self, cluster: Cluster, rt: ResourceType, namespace: str, name: str, rest: list[str]) -> None:
        self._defer = False  # nothing in the cluster changes: the answer is the backend's
        await proxy.relay(self, cluster, rt.key == POD_KEY, namespace, name, rest, self._kube_path)

    # --- streams ----------------------------------------------------------------------------------------

    async def _start_stream(self, content_type: str) -> None:
        """Send the headers now: clients wait for them before they read events. A stream is recorded as it
        starts (a watch may last half an hour)."""
        self.set_status(200)
        self._record()
        self.set_header("Content-Type", content_type)
        self.set_header("Cache-Control", "no-cache, private")
        conn = self.request.connection
        stream = getattr(conn, "stream", None)
        if stream is not None:
            stream.set_nodelay(True)
        await self.flush()

    async def _watch(self, cluster: Cluster, rt: ResourceType, namespace: str | None) -> None:
        match = object_matcher(self._arg("labelSelector"), self._arg("fieldSelector"))
        rv_arg = self._arg("resourceVersion")
        try:
            timeout = float(self._arg("timeoutSeconds") or DEFAULT_WATCH_TIMEOUT)
        except ValueError:
            raise bad_request(f"invalid value for timeoutSeconds: {self._arg('timeoutSeconds')!r}") from None
        bookmarks = self._bool("allowWatchBookmarks")
        table = self._accept_table()
        ns = namespace if rt.namespaced else None
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[WatchEvent] = asyncio.Queue(WATCH_QUEUE_LIMIT)
        overflow = asyncio.Event()

        def enqueue(event: WatchEvent) -> None:
            try:
                queue.put_nowait(event)
            except asyncio.QueueFull:
                overflow.set()  # too slow a reader: the watch ends, as the apiserver's does

        def on_event(event: WatchEvent) -> None:
            if event.key == rt.key:
                loop.call_soon_threadsafe(enqueue, event)

        store = cluster.store
        with store.lock:
            start_rv = store.rv
            if rv_arg in ("", "0"):
                initial = [o for o in _in_scope(cluster, rt, ns) if match(o)]
                backlog = store.subscribe(None, on_event)
            else:
                initial = []
                backlog = store.subscribe(int(rv_arg) if rv_arg.isdigit() else 0, on_event)
        if backlog is None:
            await self._start_stream("application/json")
            err = gone(f"too old resource version: {rv_arg} ({store.compacted_rv})").status()
            self.write(json.dumps({"type": "ERROR", "object": err}) + "\n")
            self.finish()
            return
        first = True
        try:
            await self._start_stream("application/json")
            for obj in initial:
                await self._emit("ADDED", cluster.out(rt, obj), rt, table, first, cluster.clock())
                first = False
            last_rv = start_rv
            for event in backlog:
                first = await self._deliver(event, cluster, rt, ns, match, table, first)
                last_rv = event.rv
            if bookmarks:
                await self._bookmark(rt, last_rv)
            deadline = loop.time() + timeout
            closed = asyncio.ensure_future(self._closed.wait())
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0 or overflow.is_set():
                    break
                getter = asyncio.ensure_future(queue.get())
                done, _ = await asyncio.wait({getter, closed}, timeout=min(remaining, BOOKMARK_INTERVAL),
                                             return_when=asyncio.FIRST_COMPLETED)
                if closed in done:
                    getter.cancel()
                    break
                if getter in done:
                    event = getter.result()
                    first = await self._deliver(event, cluster, rt, ns, match, table, first)
                    last_rv = event.rv
                else:
                    getter.cancel()
                    if bookmarks:
                        await self._bookmark(rt, store.rv)
            closed.cancel()
            if not self._finished:
                self.finish()
        finally:
            store.unsubscribe(on_event)

    async def _deliver(self, event: WatchEvent, cluster: Cluster, rt: ResourceType, ns: str | None,
                       match: Any, table: bool, first: bool) -> bool:
        """Filter one event like the apiserver's cacheWatcher: on whether the object matched before the
        change and whether it matches after it (an object leaving the selector is DELETED for this watch)."""

        def matches(obj: dict[str, Any] | None) -> bool:
            return obj is not None and (not ns or obj["metadata"].get("namespace") == ns) and bool(match(obj))

        deleted = event.type == "DELETED"
        now = not deleted and matches(event.obj)
        before = matches(event.old if event.old is not None else (event.obj if deleted else None))
        if now:
            kind = "MODIFIED" if before else "ADDED"
        elif before:
            kind = "DELETED"
        else:
            return first
        await self._emit(kind, cluster.out(rt, event.obj), rt, table, first, cluster.clock())
        return False

    async def _emit(self, kind: str, obj: dict[str, Any], rt: ResourceType, table: bool, first: bool,
                    now: float) -> None:
        payload = tables.table(rt, [obj], now, obj["metadata"].get("resourceVersion", ""),
                               include_object=self._arg("includeObject", "Metadata"), with_headers=first) \
            if table else obj
        self.write(json.dumps({"type": kind, "object": payload}, separators=(",", ":")) + "\n")
        await self.flush()

    async def _bookmark(self, rt: ResourceType, rv: int) -> None:
        obj = {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": {"resourceVersion": str(rv)}}
        self.write(json.dumps({"type": "BOOKMARK", "object": obj}) + "\n")
        await self.flush()

    async def _logs(self, cluster: Cluster, rt: ResourceType, namespace: str | None, name: str) -> None:
        await log_stream.serve(self, cluster, rt, namespace, name)


def _in_scope(cluster: Cluster, rt: ResourceType, namespace: str | None) -> list[dict[str, Any]]:
    return [obj for _, obj in cluster.store.items(rt.key, namespace)]


def _partial(obj: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}
