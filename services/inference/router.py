"""The inference router noun: an SGLang router (cache-aware by default) in front of a self-managed deployment.

Its verbs are the only entry points for every face. ``preview_router`` renders and dry-runs; ``create_router``
and ``update_router`` precheck synchronously — the knobs' ranges (the request model: 422), the worker deployment
exists and is InstantStart's (404), the router's name is free in its namespace or already this router's, and no
inference deployment or other router has it (409) — and the API server dry-runs every object, before any
operation row; then an operation on ``cluster/<c>/inference/<name>`` applies them: the target a deployment, a
pool and a managed endpoint of that name use too, so a create of another path's name in flight is refused (409
naming it). The workers are a deployment's pods, or a model pool's pods one pool service holds (``pool_service``:
an unknown pool 404, a pool without it 409, a service the pool has not 404). ``delete_router`` finds a router
by any object with its labels (a Deployment deleted out of band leaves the rest to delete). Reads answer from
the watch caches; ``describe_router`` also reads the router's Prometheus metrics (``sgl_router_*``) through the
Kubernetes API's pod proxy (bounded and kept a few seconds: :mod:`services.inference.router_metrics`), and
``test_router`` sends one OpenAI-compatible request through the router's Service, so the answer names the worker
pod that served it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import urllib3
from kubernetes import client as k8s

from services.audit import AuditLog
from services.auth import Principal, Role
from services.clusters.registry import ClusterRegistry
from services.errors import Conflict, Invalid, NotFound, ServiceError
from services.inference import DELETE_KIND as DEPLOYMENT_DELETE_KIND
from services.inference import checks, inference_target, manifest, names, service_view, testcall
from services.inference import router_manifest as rm
from services.inference.endpoint_metrics import samples
from services.inference.kobjects import labels as _labels
from services.inference.kobjects import live_ready as _ready
from services.inference.kobjects import meta as _meta
from services.inference.models import EndpointTest, EndpointTestResult
from services.inference.pool import DELETE_KIND as POOL_DELETE_KIND
from services.inference.pool import RELEASE_KIND as POOL_RELEASE_KIND
from services.inference.pool_models import BUSINESS
from services.inference.pool_stages import pool_service as pool_service_of
from services.inference.router_metrics import RouterMetricsReader
from services.inference.router_models import (
    RouterKnobs,
    RouterList,
    RouterPlan,
    RouterPreview,
    RouterRef,
    RouterRequest,
    RouterUpdate,
    RouterView,
    WorkerView,
)
from services.inference.router_stages import (
    RouterApplyStage,
    RouterDeleteStage,
    RouterRolloutStage,
    apply_objects,
    leftovers,
)
from services.inference.stages import InferenceDeps
from services.informers import Informers
from services.kube import KubeClients
from services.limits import Slots
from services.operations import Engine, OperationKind, OperationView
from services.training.manifests import MANAGED_BY
from services.verbs import verb

__all__ = ["CREATE_KIND", "DELETE_KIND", "UPDATE_KIND", "Routers"]
CREATE_KIND = names.ROUTER_CREATE_KIND
UPDATE_KIND = "inference.router.update"
DELETE_KIND = "inference.router.delete"
#: the inference routes of sgl_router_requests_total (its health and readiness probes are counted there too)
ROUTED = ("/v1/chat/completions", "/v1/completions", "/generate")


def _is_router(obj: Mapping[str, Any], name: str | None = None) -> bool:
    mine = _labels(obj).get(rm.ROUTER_LABEL)
    return _labels(obj).get(MANAGED_BY) == "instantstart" and mine is not None and (name is None or mine == name)


class Routers:
    """Verbs of the inference router noun (built once by the composition root)."""

    noun = "inference_router"

    def __init__(self, registry: ClusterRegistry, informers: Informers, kube: KubeClients, engine: Engine,
                 audit: AuditLog) -> None:
        self.registry = registry
        self.informers = informers
        self.kube = kube
        self.audit = audit
        self._engine = engine
        self.deps = InferenceDeps(kube=kube)
        self._test_calls = Slots("router test calls", 2)
        self.metrics = RouterMetricsReader(kube)

    def kinds(self) -> list[OperationKind[Any]]:
        d = self.deps
        return [
            OperationKind(CREATE_KIND, RouterPlan, (RouterApplyStage(d), RouterRolloutStage(d)),
                          target=lambda p: inference_target(p.cluster, p.name), role=Role.OPERATOR,
                          description="run an SGLang router in front of an inference deployment"),
            OperationKind(UPDATE_KIND, RouterPlan, (RouterApplyStage(d), RouterRolloutStage(d)),
                          target=lambda p: inference_target(p.cluster, p.name), role=Role.OPERATOR,
                          description="change an SGLang router's policy knobs (rolling update)"),
            OperationKind(DELETE_KIND, RouterRef, (RouterDeleteStage(d),),
                          target=lambda r: inference_target(r.cluster, r.name), role=Role.OPERATOR,
                          description="delete an SGLang router (its workers stay)"),
        ]

    # ----- caches ------------------------------------------------------------------------------------------

    def _items(self, cluster: str, resource: str) -> list[dict[str, Any]]:
        return names.cached(self.informers, cluster, resource)

    def _worker_deployment(self, cluster: str, name: str, pool_service: str | None = None) -> dict[str, Any]:
        pool = checks.pool_named(self._items(cluster, "deployments"), name)
        if pool is not None and pool_service is None:
            raise Conflict(f"{name} is a model pool: a router over the whole pool would also send requests to its "
                           "unassigned pods and to every other service's; give pool_service, the pool's service "
                           "whose pods the router routes to (inference_pool_get lists them)",
                           details={"field": "pool_service", "pool": name})
        if pool is not None:
            namespace = _meta(pool).get("namespace")
            if not any(_meta(s).get("namespace") == namespace and _meta(s).get("name") == pool_service
                       and pool_service_of(s, name) for s in self._items(cluster, "services")):
                raise NotFound(f"the pool {name} has no service {pool_service!r}; inference_pool_assign makes one",
                               details={"field": "pool_service"})
            return dict(pool)
        for dep in self._items(cluster, "deployments"):
            if _meta(dep).get("name") == name and checks.ours(dep, name):
                if pool_service is not None:
                    raise Invalid(f"pool_service is only for a model pool, and {name} is not one: leave it out",
                                  details={"field": "pool_service"})
                return dep
        if pool_service is not None:
            raise NotFound(f"no model pool {name!r} in cluster {cluster}; inference_pool_list lists them",
                           details={"field": "deployment"})
        raise NotFound(f"no inference deployment {name!r} in cluster {cluster}; inference_list lists them",
                       details={"field": "deployment"})

    def _find(self, cluster: str, name: str) -> dict[str, Any]:
        self.registry.get(cluster)
        for dep in self._items(cluster, "deployments"):
            if _meta(dep).get("name") == name and _is_router(dep, name):
                return dep
        raise NotFound(f"no inference router {name!r} in cluster {cluster}; inference_routers_list lists them")

    def _find_remains(self, cluster: str, name: str) -> tuple[str, str]:
        """(namespace, Deployment uid) of a router to delete; the uid is empty when its Deployment is gone (deleted
        out of band, or a delete cut short) and another object with its labels is left: its Service (cache), or
        its ServiceAccount, Role or RoleBinding (read live)."""
        try:
            meta = _meta(self._find(cluster, name))
            return str(meta.get("namespace")), str(meta.get("uid"))
        except NotFound:
            pass
        for svc in self._items(cluster, "services"):
            if _meta(svc).get("name") == name and _is_router(svc, name):
                return str(_meta(svc).get("namespace")), ""
        api = self.kube.api_client(cluster)
        core, rbac = k8s.CoreV1Api(api), k8s.RbacAuthorizationV1Api(api)
        selector = ",".join(f"{k}={v}" for k, v in rm.labels(name).items())
        for list_all in (core.list_service_account_for_all_namespaces, rbac.list_role_for_all_namespaces,
                         rbac.list_role_binding_for_all_namespaces):
            found: Any = list_all(label_selector=selector)
            for obj in found.items:
                if obj.metadata.name == name:
                    return str(obj.metadata.namespace), ""
        raise NotFound(f"no inference router {name!r} in cluster {cluster}; inference_routers_list lists them")

    # ----- planning ----------------------------------------------------------------------------------------

    def _check_name(self, cluster: str, name: str, namespace: str) -> None:
        """Free in the namespace for every kind the router makes (or already this router's), and no inference
        deployment or router elsewhere in the cluster has it."""
        for resource in ("deployments", "services"):
            for obj in self._items(cluster, resource):
                meta = _meta(obj)
                if meta.get("name") != name:
                    continue
                if meta.get("namespace") == namespace and not _is_router(obj, name):
                    raise Conflict(f"a {resource[:-1]} {namespace}/{name} exists and is not this router's: choose "
                                   "another name", details={"field": "name"})
                if meta.get("namespace") != namespace and resource == "deployments" and _is_router(obj, name):
                    raise Conflict(f"the cluster already has an inference router {name!r} in namespace "
                                   f"{meta.get('namespace')}: choose another name", details={"field": "name"})
        names.check_other_paths(self.informers, cluster, name, "router")
        api = self.kube.api_client(cluster)
        core, rbac = k8s.CoreV1Api(api), k8s.RbacAuthorizationV1Api(api)
        for kind, read in (("ServiceAccount", core.read_namespaced_service_account),
                           ("Role", rbac.read_namespaced_role), ("RoleBinding", rbac.read_namespaced_role_binding)):
            try:
                found: Any = read(name, namespace)
            except NotFound:
                continue
            if (found.metadata.labels or {}) != {**(found.metadata.labels or {}), **rm.labels(name)}:
                raise Conflict(f"a {kind} {namespace}/{name} exists and is not this router's: choose another name",
                               details={"field": "name", "kind": kind})

    def _worker_port(self, cluster: str, dep: Mapping[str, Any]) -> int:
        """The engine's port, from the live Deployment (the watch cache keeps no pod template)."""
        name, namespace = str(_meta(dep).get("name")), str(_meta(dep).get("namespace"))
        live: Any = k8s.AppsV1Api(self.kube.api_client(cluster)).read_namespaced_deployment(name, namespace)
        engine = next((c for c in live.spec.template.spec.containers if c.name == manifest.CONTAINER), None)
        port = next((p.container_port for p in (engine.ports or []) if p.name == manifest.PORT_NAME), None) \
            if engine is not None else None
        if port is None:
            raise Conflict(f"the deployment {name} declares no engine port to route to")
        return int(port)

    def _plan(self, principal: Principal, cluster: str, name: str, deployment: str, knobs: RouterKnobs,
              *, pool_service: str | None = None, check_name: bool = True) -> RouterPlan:
        self.registry.get(cluster)
        worker = self._worker_deployment(cluster, deployment, pool_service)
        namespace = str(_meta(worker).get("namespace"))
        deleting = names.in_flight(self._engine, cluster, DEPLOYMENT_DELETE_KIND, name=deployment) \
            or names.in_flight(self._engine, cluster, POOL_DELETE_KIND, name=deployment)
        if deleting is not None:
            raise Conflict(f"the deployment {deployment} is being deleted (operation {deleting.id}): a router for it "
                           "would have no workers", details={"operation": deleting.id})
        releasing = names.in_flight(self._engine, cluster, POOL_RELEASE_KIND, pool=deployment, service=pool_service,
                                    drop_service=True) if pool_service is not None else None
        if releasing is not None:
            raise Conflict(f"all the pods of the service {pool_service} of the pool {deployment} are being released "
                           f"(operation {releasing.id}), which deletes its Service: a router for it would have no "
                           "workers; assign pods to the service again once it ends",
                           details={"operation": releasing.id})
        if check_name:
            self._check_name(cluster, name, namespace)
        objects = rm.objects(name=name, namespace=namespace, deployment=deployment, knobs=knobs,
                             worker_port=self._worker_port(cluster, worker), pool_service=pool_service)
        return RouterPlan(cluster=cluster, name=name, namespace=namespace, deployment=deployment,
                          pool_service=pool_service, knobs=knobs, manifests=objects, requested_by=principal.name)

    def _dry_run(self, plan: RouterPlan) -> None:
        """The API server validates every object (schemas, admission) and stores nothing: a 422 names the field."""
        apply_objects(self.deps, plan.cluster, plan.manifests, dry_run=True)

    # ----- mutations ---------------------------------------------------------------------------------------

    @verb(Role.OPERATOR)
    def preview_router(self, principal: Principal, cluster: str, request: RouterRequest) -> RouterPreview:
        """What a router create would make (every precheck, then the API server's dry run); nothing is made."""
        plan = self._plan(principal, cluster, request.name, request.deployment, _knobs(request),
                          pool_service=request.pool_service)
        self._dry_run(plan)
        container = plan.manifests[3]["spec"]["template"]["spec"]["containers"][0]
        command = list(container["command"])
        return RouterPreview(command=command, selector=rm.selector(request.deployment, request.pool_service),
                             worker_port=int(command[command.index("--service-discovery-port") + 1]),
                             manifests=plan.manifests)

    @verb(Role.OPERATOR)
    def create_router(self, principal: Principal, cluster: str, request: RouterRequest,
                      idempotency_key: str | None = None) -> tuple[OperationView, bool]:
        """Run a router for a deployment (prechecked, dry-run; then ``inference.router.create``: apply →
        rollout, done once the router is ready, i.e. has found a worker)."""
        def same(stored: dict[str, Any]) -> bool:
            return stored.get("cluster") == cluster and stored.get("name") == request.name
        replay = self._engine.replayed(CREATE_KIND, principal, idempotency_key, same)
        if replay is not None:
            return replay, False
        plan = self._plan(principal, cluster, request.name, request.deployment, _knobs(request),
                          pool_service=request.pool_service)
        self._dry_run(plan)
        return self._engine.submit(CREATE_KIND, plan, principal, idempotency_key)

    @verb(Role.OPERATOR)
    def update_router(self, principal: Principal, cluster: str, name: str, update: RouterUpdate,
                      idempotency_key: str | None = None) -> tuple[OperationView, bool]:
        """New policy knobs (only those given change): the router's Deployment rolls out with the new command."""
        changes = update.model_dump(exclude_none=True)
        if not changes:
            raise Invalid("nothing to change: give policy or a knob")
        def same(stored: dict[str, Any]) -> bool:
            return stored.get("cluster") == cluster and stored.get("name") == name
        replay = self._engine.replayed(UPDATE_KIND, principal, idempotency_key, same)
        if replay is not None:
            return replay, False
        live = self._find(cluster, name)
        notes = _meta(live).get("annotations") or {}
        knobs = RouterKnobs.model_validate({**json.loads(str(notes.get(rm.KNOBS_ANNOTATION) or "{}")), **changes})
        plan = self._plan(principal, cluster, name, str(notes.get(rm.FOR_ANNOTATION) or ""), knobs,
                          pool_service=notes.get(rm.SERVICE_ANNOTATION), check_name=False)
        plan.manifests = [m for m in plan.manifests if m["kind"] == "Deployment"]
        self._dry_run(plan)
        return self._engine.submit(UPDATE_KIND, plan, principal, idempotency_key)

    @verb(Role.OPERATOR)
    def delete_router(self, principal: Principal, cluster: str, name: str,
                      idempotency_key: str | None = None) -> tuple[OperationView, bool]:
        """Delete the router's objects (``inference.router.delete``); the worker deployment stays. A router whose
        Deployment is already gone is found by the objects it left, and they are deleted."""
        def same(stored: dict[str, Any]) -> bool:
            return stored.get("cluster") == cluster and stored.get("name") == name
        replay = self._engine.replayed(DELETE_KIND, principal, idempotency_key, same)
        if replay is not None:
            return replay, False
        namespace, uid = self._find_remains(cluster, name)
        ref = RouterRef(cluster=cluster, name=name, namespace=namespace, uid=uid, requested_by=principal.name)
        return self._engine.submit(DELETE_KIND, ref, principal, idempotency_key)

    # ----- reads -------------------------------------------------------------------------------------------

    @verb(Role.VIEWER)
    def list_routers(self, principal: Principal, cluster: str) -> RouterList:
        """Every router of the cluster, from the watch caches (no metrics: describe_router reads them); a router
        whose Deployment is gone and whose Service is left is listed ``Orphaned`` (``Progressing`` while its create
        or delete is in flight). Its ServiceAccount, Role and
        RoleBinding are not watched (three more watches per cluster for a rare state: an out-of-band delete, or a
        create whose apply failed after them, which a create of that name again reuses): describe and delete by
        name find a router with only those left."""
        self.registry.get(cluster)
        pods, services = self._items(cluster, "pods"), self._items(cluster, "services")
        views = [self._view(cluster, d, pods, services) for d in self._items(cluster, "deployments")
                 if _is_router(d, str(_meta(d).get("name")))]
        seen = {(v.namespace, v.name) for v in views}
        views += [self._service_only(cluster, str(_meta(s).get("namespace")), str(_meta(s).get("name")))
                  for s in services if _is_router(s, str(_meta(s).get("name")))
                  and (str(_meta(s).get("namespace")), str(_meta(s).get("name"))) not in seen]
        return RouterList(cluster=cluster, routers=sorted(views, key=lambda v: (v.namespace, v.name)))

    def _service_only(self, cluster: str, namespace: str, name: str) -> RouterView:
        """A router whose Service the cache has without its Deployment: Orphaned, unless its create or delete is
        in flight (the two watches see a create's Service first, and a delete's Service last)."""
        view = _orphan(cluster, namespace, name, ["Service"])
        for kind, doing in ((CREATE_KIND, "created"), (DELETE_KIND, "deleted")):
            op = names.in_flight(self._engine, cluster, kind, name=name)
            if op is not None:
                return view.model_copy(update={"phase": "Progressing",
                                               "message": f"being {doing} (operation {op.id})"})
        return view

    @verb(Role.VIEWER)
    def describe_router(self, principal: Principal, cluster: str, name: str) -> RouterView:
        """One router: policy and knobs, its workers (Ready or not), and the request counts from its Prometheus
        metrics. A router whose Deployment is gone is shown ``Orphaned`` with the objects it left (read live)."""
        try:
            dep = self._find(cluster, name)
        except NotFound:
            namespace, _ = self._find_remains(cluster, name)
            return _orphan(cluster, namespace, name, leftovers(self.deps, cluster, namespace, name))
        view = self._view(cluster, dep, self._items(cluster, "pods"), self._items(cluster, "services"))
        core = k8s.CoreV1Api(self.kube.api_client(cluster))
        pods = [core.api_client.sanitize_for_serialization(p) for p in core.list_namespaced_pod(
            view.namespace, label_selector=f"{rm.ROUTER_LABEL}={name}").items]  # the cache has no IPs, no readiness
        if view.deployment:
            pods += [core.api_client.sanitize_for_serialization(p) for p in core.list_namespaced_pod(
                view.namespace, label_selector=rm.selector(view.deployment, view.pool_service)).items]
        ready = {str(_meta(p).get("name")): _ready(p) for p in pods}
        for worker in view.workers:
            worker.ready = ready.get(worker.pod, False)
        self._read_metrics(cluster, view, pods)
        return view

    def _view(self, cluster: str, dep: Mapping[str, Any], pods: list[dict[str, Any]],
              services: list[dict[str, Any]]) -> RouterView:
        meta, status = _meta(dep), dep.get("status") or {}
        name, namespace = str(meta.get("name")), str(meta.get("namespace"))
        notes = meta.get("annotations") or {}
        worker_of = str(notes.get(rm.FOR_ANNOTATION) or "")
        pool_service = notes.get(rm.SERVICE_ANNOTATION)
        knobs = RouterKnobs.model_validate(json.loads(str(notes[rm.KNOBS_ANNOTATION]))) \
            if notes.get(rm.KNOBS_ANNOTATION) else None
        available = int(status.get("availableReplicas") or 0)
        failed = next((c for c in status.get("conditions") or []
                       if c.get("type") == "Progressing" and c.get("status") == "False"), None)
        if failed is not None:
            phase, message = "Failed", f"{failed.get('reason')}: {failed.get('message')}"
        elif available >= 1:
            phase, message = "Available", "routing"
        else:
            phase, message = "Progressing", "not ready (it is ready once it has found a worker)"
        workers = [WorkerView(pod=str(_meta(p).get("name")), phase=(p.get("status") or {}).get("phase")) for p in pods
                   if _meta(p).get("namespace") == namespace
                   and (_labels(p)).get(manifest.INFERENCE_LABEL) == worker_of and worker_of
                   and (pool_service is None or _labels(p).get(BUSINESS) == pool_service)]
        svc = next((s for s in services if _meta(s).get("namespace") == namespace and _meta(s).get("name") == name
                    and _is_router(s, name)), None)
        return RouterView(name=name, namespace=namespace, cluster=cluster, deployment=worker_of,
                          pool_service=pool_service, knobs=knobs,
                          selector=rm.selector(worker_of, pool_service) if worker_of else "", phase=phase,
                          message=message,
                          workers=sorted(workers, key=lambda w: w.pod),
                          service=service_view(svc) if svc is not None else None)

    def _read_metrics(self, cluster: str, view: RouterView, pods: list[dict[str, Any]]) -> None:
        """The router pod's ``/metrics`` through the API server's pod proxy: requests per worker (their URLs are
        pod IPs: named back to pods), all requests, cache hits and misses."""
        router_pod = next((p for p in pods if _meta(p).get("namespace") == view.namespace and _ready(p)
                           and _labels(p).get(rm.ROUTER_LABEL) == view.name), None)
        if router_pod is None:
            view.metrics_error = "no ready router pod to read metrics from"
            return
        try:  # ValueError: an oversized page, or one Prometheus' parser refuses
            found = list(samples(self.metrics.text(cluster, view.namespace, str(_meta(router_pod).get("name")))))
        except (ServiceError, urllib3.exceptions.HTTPError, ValueError) as exc:
            view.metrics_error = f"the router's metrics could not be read: {exc}"
            return
        by_ip = {str((p.get("status") or {}).get("podIP")): str(_meta(p).get("name")) for p in pods
                 if _meta(p).get("namespace") == view.namespace}
        served: dict[str, int] = {}
        totals = {"sgl_router_requests_total": 0, "sgl_router_cache_hits_total": 0,
                  "sgl_router_cache_misses_total": 0}
        for sample in found:
            metric, labels, value = sample.name, sample.labels, sample.value
            if metric == "sgl_router_processed_requests_total":
                host = re.sub(r"^https?://", "", labels.get("worker", "")).rsplit(":", 1)[0]
                pod = by_ip.get(host, labels.get("worker", ""))
                served[pod] = served.get(pod, 0) + int(value)
            elif metric == "sgl_router_active_workers":
                view.active_workers = int(value)
            elif metric in totals and (metric != "sgl_router_requests_total" or labels.get("route") in ROUTED):
                totals[metric] += int(value)
        view.requests_total = totals["sgl_router_requests_total"]
        view.cache_hits, view.cache_misses = (totals["sgl_router_cache_hits_total"],
                                              totals["sgl_router_cache_misses_total"])
        for worker in view.workers:
            worker.requests = served.get(worker.pod, 0)

    # ----- test --------------------------------------------------------------------------------------------

    @verb(Role.OPERATOR)
    def test_router(self, principal: Principal, cluster: str, name: str,
                    request: EndpointTest) -> EndpointTestResult:
        """One OpenAI-compatible request through the router's Service (the Kubernetes API's service proxy); the
        answer's ``x-sandbox-pod``/``system_fingerprint`` name the worker pod where the engine says so."""
        if request.via != "service_proxy":
            raise Invalid("a router is reached inside the cluster only: use via 'service_proxy'",
                          details={"field": "via"})
        dep = self._find(cluster, name)
        meta = _meta(dep)
        namespace = str(meta.get("namespace"))
        notes = meta.get("annotations") or {}
        worker = self._worker_deployment(cluster, str(notes.get(rm.FOR_ANNOTATION) or ""),
                                         notes.get(rm.SERVICE_ANNOTATION))
        model = str((_meta(worker).get("annotations") or {}).get(manifest.API_MODEL_ANNOTATION) or "")
        self._test_calls.acquire(principal)
        try:
            result = testcall.call(self.kube.api_client(cluster),
                                   testcall.Target(namespace=namespace, service=name, port=rm.PORT, model=model),
                                   request)
        finally:
            self._test_calls.release(principal)
        self.audit.record(principal, "inference.router.test", inference_target(cluster, name),
                          {"api": request.api, "max_tokens": request.max_tokens}, f"status {result.status}")
        return result


def _orphan(cluster: str, namespace: str, name: str, left: list[str]) -> RouterView:
    return RouterView(name=name, namespace=namespace, cluster=cluster, deployment="", phase="Orphaned", left=left,
                      message=f"its Deployment is gone; left: {', '.join(left) or 'nothing'}: "
                      "inference_routers_delete removes them")


def _knobs(request: RouterRequest) -> RouterKnobs:
    return RouterKnobs.model_validate(request.model_dump(include=set(RouterKnobs.model_fields)))
