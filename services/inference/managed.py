"""The managed inference path: endpoints the HyperPod inference operator runs (``InferenceEndpointConfig`` for a
model from S3, FSx or Hugging Face with our worker, ``JumpStartModel`` for a catalog model).

Its verbs are the only entry points for every face. ``preview_endpoint`` renders, validates against the shipped CRD
and dry-runs; ``deploy_endpoint`` / ``update_endpoint`` / ``delete_endpoint`` precheck synchronously — the
``hyperpod_inference_operator`` feature (its CRDs served), for metric triggers a KEDA (``keda_install``: any KEDA
serving ScaledObjects is used as it is; otherwise a deploy or update with triggers installs ours first), the name
free in the cluster (no endpoint, no self-managed deployment, no Deployment or Service of the operator's name that
is not the endpoint's), the source and worker rules, the CRD's schema, the operator's refusal to add intelligent
routing to a deployed endpoint — before any operation row, then submit an operation on
``cluster/<c>/inference/<name>``, the self-managed path's target, so the two paths can never work on one name at
once. Reads come from the watch caches of the two kinds. A Hugging Face token goes into its own Secret per request
(``tokens.py``) that the resource then owns; no record, response or log holds it. ``test_endpoint`` calls the
operator's Service through the Kubernetes API's service proxy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes import client as k8s

from services.audit import AuditLog
from services.auth import Principal, Role
from services.aws import AwsClients
from services.clusters.registry import ClusterRegistry
from services.components.families import KEDA
from services.errors import Conflict, Invalid, NotFound
from services.inference import checks, inference_target, keda_install, managed_scaling, names, testcall, tokens
from services.inference import managed_render as render
from services.inference.keda_install import ComponentsStage
from services.inference.kobjects import meta as _meta
from services.inference.managed_models import (
    Autoscaling,
    EndpointCondition,
    EndpointKind,
    EndpointList,
    EndpointPlan,
    EndpointPreview,
    EndpointRef,
    EndpointRequest,
    EndpointUpdate,
    EndpointView,
    HuggingFaceSource,
)
from services.inference.managed_stages import ApplyStage, DeleteStage, ManagedDeps, NamespaceStage, ReadyStage
from services.inference.manifest import API_MODEL_ANNOTATION
from services.inference.models import EndpointTest, EndpointTestResult
from services.informers import Informers
from services.kube import KubeClients
from services.limits import Slots
from services.operations import Engine, OperationKind, OperationView
from services.secrets import SecretRef
from services.stages import Stage
from services.training.downloads.manifest import ensure_namespace
from services.verbs import verb

__all__ = ["DELETE_KIND", "DEPLOY_KIND", "UPDATE_KIND", "ManagedEndpoints"]
DEPLOY_KIND = "managed.deploy"
UPDATE_KIND = "managed.update"
DELETE_KIND = "managed.delete"
FEATURE = "hyperpod_inference_operator"
TEST_CALLS_PER_PRINCIPAL = 2


class ManagedEndpoints:
    """Verbs of managed inference endpoints (built once by the composition root)."""

    noun = "inference"

    def __init__(self, registry: ClusterRegistry, informers: Informers, aws: AwsClients, kube: KubeClients,
                 engine: Engine, audit: AuditLog) -> None:
        self.registry = registry
        self.informers = informers
        self.aws = aws
        self.kube = kube
        self.audit = audit
        self._engine = engine
        self.deps = ManagedDeps(kube=kube)
        self._test_calls = Slots("managed endpoint test calls", TEST_CALLS_PER_PRINCIPAL)

    def kinds(self) -> list[OperationKind[Any]]:
        d = self.deps
        stage_aws = self.aws.for_stages()
        components: ComponentsStage[EndpointPlan] = ComponentsStage(
            lambda p: keda_install.cluster_target(self.registry, stage_aws, self.kube, p.cluster),
            managed_scaling.COMPONENTS)
        deploy: tuple[Stage[EndpointPlan], ...] = (components, NamespaceStage(d), ApplyStage(d), ReadyStage(d))
        update: tuple[Stage[EndpointPlan], ...] = (components, ApplyStage(d), ReadyStage(d))
        return [
            OperationKind(DEPLOY_KIND, EndpointPlan, deploy, plan=lambda p: _stages(deploy, p),
                          target=lambda p: inference_target(p.cluster, p.name), role=Role.OPERATOR,
                          description="deploy a managed inference endpoint (HyperPod inference operator); metric "
                                      "triggers on a cluster without any KEDA install ours first",
                          on_cancel=self._cancelled),
            OperationKind(UPDATE_KIND, EndpointPlan, update, plan=lambda p: _stages(update, p),
                          target=lambda p: inference_target(p.cluster, p.name), role=Role.OPERATOR,
                          description="change a managed inference endpoint (the operator rolls or rescales it); "
                                      "metric triggers on a cluster without any KEDA install ours first"),
            OperationKind(DELETE_KIND, EndpointRef, (DeleteStage(d),),
                          target=lambda r: inference_target(r.cluster, r.name), role=Role.OPERATOR,
                          description="delete a managed inference endpoint (what the operator made goes with it)"),
        ]

    # ----- caches ------------------------------------------------------------------------------------------

    def _items(self, cluster: str, resource: str) -> list[dict[str, Any]]:
        return names.cached(self.informers, cluster, resource)

    def _installed(self, cluster: str) -> list[EndpointKind]:
        return names.managed_kinds(self.informers, cluster)

    def _require_operator(self, cluster: str, kind: EndpointKind) -> None:
        if kind not in self._installed(cluster):
            raise Conflict(f"cluster {cluster} does not serve {kind.value} ({render.crd_name(kind)}): turn on the "
                           f"{FEATURE} feature (features_update, PATCH /api/v1/clusters/{cluster}/features with "
                           f"{{\"{FEATURE}\": true}}), then deploy again", details={"feature": FEATURE})

    def _endpoints(self, cluster: str) -> list[tuple[EndpointKind, dict[str, Any]]]:
        return [(kind, obj) for kind in self._installed(cluster) for obj in self._items(cluster, render.PLURALS[kind])
                if checks.ours(obj, str(_meta(obj).get("name")))]

    def _find(self, cluster: str, name: str) -> tuple[EndpointKind, dict[str, Any]]:
        self.registry.get(cluster)
        for kind, obj in self._endpoints(cluster):
            if _meta(obj).get("name") == name:
                return kind, obj
        raise NotFound(f"no managed inference endpoint {name!r} in cluster {cluster}; inference_endpoints_list "
                       "lists them")

    # ----- prechecks ---------------------------------------------------------------------------------------

    def _check_name(self, cluster: str, name: str, namespace: str) -> None:
        """Names are unique per cluster across both paths (one operation target), and the operator makes a
        Deployment and a Service of the endpoint's name, refusing when one it does not own is there."""
        for kind, obj in self._endpoints(cluster):
            if _meta(obj).get("name") == name:
                raise Conflict(f"the cluster already has a managed endpoint {name!r} ({kind.value} in namespace "
                               f"{_meta(obj).get('namespace')}): change it with inference_endpoints_update, or "
                               "delete it first", details={"namespace": _meta(obj).get("namespace")})
        names.check_other_paths(self.informers, cluster, name, "endpoint")
        for resource, kind_name in (("deployments", "Deployment"), ("services", "Service")):
            for obj in self._items(cluster, resource):
                meta = _meta(obj)
                if meta.get("name") != name:
                    continue
                if meta.get("namespace") == namespace:
                    raise Conflict(f"a {kind_name} {namespace}/{name} exists: the inference operator makes one of the "
                                   "endpoint's name and refuses when another is there; choose another name",
                                   details={"kind": kind_name, "namespace": namespace})

    def _keda(self, cluster: str, scaling: Autoscaling | None) -> tuple[list[str], str | None]:
        """What triggers need installed first (KEDA from the registry, as a self-managed set installs it) and, when
        another KEDA serves ScaledObjects (the add-on's bundled copy, or one installed anywhere else), which: the
        operator's ScaledObject works with any KEDA, so that one scales it and nothing is installed over it. Objects
        of our KEDA's names that someone else holds without their CRD are refused (409); bounds alone need no KEDA."""
        if not managed_scaling.triggered(scaling):
            return [], None
        target = keda_install.cluster_target(self.registry, self.aws, self.kube, cluster)
        other = keda_install.other_keda(target)
        if other is not None and other.serves:
            return [], other.who
        if other is not None:
            raise Conflict(f"{cluster} holds objects of KEDA's names that InstantStart did not install "
                           f"({', '.join(other.objects)}) but no KEDA serving ScaledObjects: InstantStart applies "
                           "nothing over them: remove them, or install that KEDA completely",
                           details={"objects": list(other.objects)})
        return keda_install.missing(target, managed_scaling.COMPONENTS), None

    def _dry_run(self, cluster: str, manifest: dict[str, Any]) -> None:
        """The API server validates the resource (its schema, admission) and stores nothing; before the namespace
        exists (the operation makes it) the check runs in ``default``."""
        api = self.kube.api_client(cluster)
        namespace = str(manifest["metadata"]["namespace"])
        try:
            k8s.CoreV1Api(api).read_namespace(namespace)
        except NotFound:
            namespace = "default"
        body = {**manifest, "metadata": {**manifest["metadata"], "namespace": namespace}}
        kind = EndpointKind(manifest["kind"])
        k8s.CustomObjectsApi(api).create_namespaced_custom_object(render.GROUP, render.VERSION, namespace,
                                                                 render.PLURALS[kind], body, dry_run="All")

    def _plan(self, principal: Principal, cluster: str, request: EndpointRequest,
              token: SecretRef | None) -> tuple[EndpointPlan, list[str]]:
        self.registry.get(cluster)
        render.check_request(request)
        kind = render.kind_of(request)
        manifest = render.render(request, token)
        render.check_schema(manifest)
        self._require_operator(cluster, kind)
        install, serving = self._keda(cluster, request.autoscaling)
        self._check_name(cluster, request.name, request.namespace)
        self._dry_run(cluster, manifest)
        warnings = []
        if not request.instance_types and not request.avoid_labels and kind is EndpointKind.CONFIG:
            warnings.append("no instance type given: the operator may place the pods on any node with the resources")
        warnings.extend(managed_scaling.warnings(request.autoscaling))
        if install:
            warnings.append(f"first installs {', '.join(install)} on {cluster} (KEDA {KEDA.version}): the operator's "
                            "triggers are KEDA ScaledObjects")
        if serving is not None:
            warnings.append(f"the triggers' ScaledObject is scaled by {serving}, as it is: nothing is installed")
        if request.routing is not None:
            warnings.append(f"intelligent routing ({request.routing.value}) is fixed for the endpoint's life: "
                            + render.ROUTING_RULE)
        return EndpointPlan(cluster=cluster, name=request.name, namespace=request.namespace, kind=kind,
                            manifest=manifest, token=token, install=install, requested_by=principal.name), warnings

    # ----- mutations ---------------------------------------------------------------------------------------

    @verb(Role.OPERATOR)
    def preview_endpoint(self, principal: Principal, cluster: str, request: EndpointRequest) -> EndpointPreview:
        """What a deploy would create (every precheck, the CRD's schema, the API server's dry run)."""
        token = _token(request)
        ref = tokens.new_ref(cluster, request.namespace, request.name) if token else None
        plan, warnings = self._plan(principal, cluster, request, ref)
        return EndpointPreview(kind=plan.kind, manifest=plan.manifest, install=plan.install, warnings=warnings)

    @verb(Role.OPERATOR)
    def deploy_endpoint(self, principal: Principal, cluster: str, request: EndpointRequest,
                        idempotency_key: str | None = None) -> tuple[OperationView, bool]:
        """Deploy a managed endpoint (prechecked; then ``managed.deploy``: [components →] namespace → apply →
        ready; components installs KEDA when the request has triggers and the cluster has no KEDA at all)."""
        def same(stored: dict[str, Any]) -> bool:
            return stored.get("cluster") == cluster and stored.get("name") == request.name
        replay = self._engine.replayed(DEPLOY_KIND, principal, idempotency_key, same)
        if replay is not None:
            return replay, False
        token = _token(request)
        ref = tokens.new_ref(cluster, request.namespace, request.name) if token else None
        plan, _ = self._plan(principal, cluster, request, ref)
        if ref is not None:  # this request's own Secret: a refused submit deletes only it
            ensure_namespace(self.kube, cluster, request.namespace)
            tokens.create(self.kube, ref, request.name, token)
        try:
            return self._engine.submit(DEPLOY_KIND, plan, principal, idempotency_key)
        except BaseException:
            if ref is not None:
                tokens.delete(self.kube, ref)
            raise

    def _cancelled(self, plan: EndpointPlan) -> None:
        """A cancelled deploy deletes the token Secret it made unless the resource it applied owns it."""
        if plan.token is None:
            return
        try:
            secret: Any = k8s.CoreV1Api(self.kube.api_client(plan.cluster)).read_namespaced_secret(
                plan.token.name, plan.namespace)
        except NotFound:
            return
        if not secret.metadata.owner_references:
            tokens.delete(self.kube, plan.token)

    @verb(Role.OPERATOR)
    def update_endpoint(self, principal: Principal, cluster: str, name: str, update: EndpointUpdate,
                        idempotency_key: str | None = None) -> tuple[OperationView, bool]:
        """Change replicas, autoscaling (bounds and triggers; the fields it leaves out keep their values), image or
        args (``managed.update``: apply → ready); adding intelligent routing is refused as the CRD says the
        operator does."""
        if all(v is None for v in (update.replicas, update.autoscaling, update.image, update.args, update.routing)):
            raise Invalid("nothing to change: give replicas, autoscaling, image, args or routing")
        def same(stored: dict[str, Any]) -> bool:
            return stored.get("cluster") == cluster and stored.get("name") == name
        replay = self._engine.replayed(UPDATE_KIND, principal, idempotency_key, same)
        if replay is not None:
            return replay, False
        kind, obj = self._find(cluster, name)
        namespace = str(_meta(obj).get("namespace"))
        live: Any = k8s.CustomObjectsApi(self.kube.api_client(cluster)).get_namespaced_custom_object(
            render.GROUP, render.VERSION, namespace, render.PLURALS[kind], name)
        spec = dict(live.get("spec") or {})
        _check_routing(name, spec, update)
        if kind is EndpointKind.JUMPSTART and (update.image is not None or update.args is not None):
            raise Invalid("a JumpStart model's server comes from the catalog: image and args cannot change",
                          details={"field": "image" if update.image is not None else "args"})
        if update.replicas is not None:
            spec["replicas"] = update.replicas
        install: list[str] = []
        if update.autoscaling is not None:
            scaling = managed_scaling.merged(dict(spec.get("autoScalingSpec") or {}), update.autoscaling)
            now = managed_scaling.autoscaling_of(scaling)
            managed_scaling.check(now)
            install, _ = self._keda(cluster, now)
            spec["autoScalingSpec"] = scaling
        if update.image is not None or update.args is not None:
            worker = dict(spec.get("worker") or {})
            if update.image is not None:
                worker["image"] = update.image
            if update.args is not None:
                worker["args"] = list(update.args)
            spec["worker"] = worker
        manifest = {"apiVersion": render.API_VERSION, "kind": kind.value,
                    "metadata": {"name": name, "namespace": namespace, "labels": dict(_meta(live).get("labels") or {}),
                                 "annotations": {k: v for k, v in (_meta(live).get("annotations") or {}).items()
                                                 if k == API_MODEL_ANNOTATION}},
                    "spec": spec}
        render.check_schema(manifest)
        plan = EndpointPlan(cluster=cluster, name=name, namespace=namespace, kind=kind, manifest=manifest,
                            install=install, requested_by=principal.name)
        return self._engine.submit(UPDATE_KIND, plan, principal, idempotency_key)

    @verb(Role.OPERATOR)
    def delete_endpoint(self, principal: Principal, cluster: str, name: str,
                        idempotency_key: str | None = None) -> tuple[OperationView, bool]:
        """Delete the endpoint's resource (``managed.delete``); only ours, only the uid seen now."""
        def same(stored: dict[str, Any]) -> bool:
            return stored.get("cluster") == cluster and stored.get("name") == name
        replay = self._engine.replayed(DELETE_KIND, principal, idempotency_key, same)
        if replay is not None:
            return replay, False
        kind, obj = self._find(cluster, name)
        meta = _meta(obj)
        ref = EndpointRef(cluster=cluster, name=name, namespace=str(meta.get("namespace")), kind=kind,
                          uid=str(meta.get("uid")), requested_by=principal.name)
        return self._engine.submit(DELETE_KIND, ref, principal, idempotency_key)

    # ----- reads -------------------------------------------------------------------------------------------

    @verb(Role.VIEWER)
    def list_endpoints(self, principal: Principal, cluster: str) -> EndpointList:
        """Every managed endpoint of the cluster, from the watch caches (no API call)."""
        self.registry.get(cluster)
        installed = self._installed(cluster)
        scaled = self._scaled(cluster)
        views = [_view(cluster, kind, obj, scaled) for kind, obj in self._endpoints(cluster)]
        return EndpointList(cluster=cluster, operator=bool(installed),
                            endpoints=sorted(views, key=lambda v: (v.namespace, v.name)))

    @verb(Role.VIEWER)
    def describe_endpoint(self, principal: Principal, cluster: str, name: str) -> EndpointView:
        """One managed endpoint: the operator's state, conditions and replicas."""
        kind, obj = self._find(cluster, name)
        return _view(cluster, kind, obj, self._scaled(cluster))

    def _scaled(self, cluster: str) -> dict[str, int]:
        """``namespace/name`` -> that Deployment's spec.replicas, from the cache (the operator names an endpoint's
        Deployment like it, and a deploy refuses a name whose Deployment is someone else's)."""
        return {f"{_meta(d).get('namespace')}/{_meta(d).get('name')}": int((d.get("spec") or {}).get("replicas") or 0)
                for d in self._items(cluster, "deployments")}

    @verb(Role.OPERATOR)
    def test_endpoint(self, principal: Principal, cluster: str, name: str,
                      request: EndpointTest) -> EndpointTestResult:
        """One OpenAI-compatible request to the endpoint, through the service proxy to the operator's Service."""
        if request.via != "service_proxy":
            raise Invalid("a managed endpoint is tested through the Kubernetes API's service proxy (via "
                          "'service_proxy')", details={"field": "via"})
        kind, obj = self._find(cluster, name)
        meta = _meta(obj)
        namespace = str(meta.get("namespace"))
        svc = next((s for s in self._items(cluster, "services")
                    if _meta(s).get("namespace") == namespace and _meta(s).get("name") == name), None)
        if svc is None:
            raise Conflict(f"the inference operator has not made the Service of {name} yet: wait for the deploy "
                           "(operations_wait), then test again")
        self._check_operators_service(cluster, kind, namespace, name)
        port = int(str(((svc.get("spec") or {}).get("ports") or [{}])[0].get("port") or 0))
        spec = obj.get("spec") or {}
        model = str((spec.get("model") or {}).get("modelId") if kind is EndpointKind.JUMPSTART
                    else (meta.get("annotations") or {}).get(API_MODEL_ANNOTATION) or spec.get("modelName") or name)
        self._test_calls.acquire(principal)
        try:
            result = testcall.call(self.kube.api_client(cluster),
                                   testcall.Target(namespace=namespace, service=name, port=port, model=model), request)
        finally:
            self._test_calls.release(principal)
        self.audit.record(principal, "managed.test", inference_target(cluster, name),
                          {"api": request.api, "max_tokens": request.max_tokens}, f"status {result.status}")
        return result


    def _check_operators_service(self, cluster: str, kind: EndpointKind, namespace: str, name: str) -> None:
        """409 unless the Service of the endpoint's name is the operator's: one of its owner references is the
        endpoint's resource (its uid, read live with the Service: the caches keep neither)."""
        api = self.kube.api_client(cluster)
        resource: Any = k8s.CustomObjectsApi(api).get_namespaced_custom_object(
            render.GROUP, render.VERSION, namespace, render.PLURALS[kind], name)
        service: Any = k8s.CoreV1Api(api).read_namespaced_service(name, namespace)
        uid = (resource.get("metadata") or {}).get("uid")
        if not any(ref.uid == uid for ref in service.metadata.owner_references or []):
            raise Conflict(f"the Service {namespace}/{name} is not the inference operator's (it has no owner "
                           f"reference to the {kind.value} {name}), so a test call would reach something else: "
                           "find out what that Service is; the endpoint is tested once its Service is the operator's",
                           details={"service": f"{namespace}/{name}"})


def _stages(stages: tuple[Stage[EndpointPlan], ...], plan: EndpointPlan) -> list[str]:
    """The stages ``plan`` runs: ``components`` only when its submit found something to install."""
    return [s.name for s in stages if s.name != ComponentsStage.name or plan.install]


def _token(request: EndpointRequest) -> str:
    source = request.source
    if isinstance(source, HuggingFaceSource) and source.hf_token is not None:
        return source.hf_token.get_secret_value()
    return ""


def _check_routing(name: str, spec: Mapping[str, Any], update: EndpointUpdate) -> None:
    """The CRD on ``intelligentRoutingSpec``: adding it to a deployed endpoint is rejected, and ``enabled`` cannot
    change once set."""
    if update.routing is None:
        return
    current = render.routing_of(dict(spec))
    if current is None:
        raise Conflict(f"{name} was deployed without intelligent routing, and the inference operator rejects adding "
                       f"it: \"{render.ROUTING_RULE}\" (CRD, spec.intelligentRoutingSpec): delete the endpoint and "
                       "deploy it again with routing", details={"field": "routing", "current": None})
    if current != update.routing.value:
        raise Conflict(f"{name} routes with {current}; the operator does not support changing intelligent routing on "
                       f"an existing deployment: \"{render.ROUTING_RULE}\"", details={"field": "routing",
                                                                                       "current": current})


def _view(cluster: str, kind: EndpointKind, obj: Mapping[str, Any], scaled: Mapping[str, int]) -> EndpointView:
    meta, spec, status = _meta(obj), obj.get("spec") or {}, obj.get("status") or {}
    detail = status.get("deploymentStatus") or {}
    seen = detail.get("status") or {}
    scaling = spec.get("autoScalingSpec")
    if kind is EndpointKind.JUMPSTART:
        model = (spec.get("model") or {}).get("modelId")
        source: str | None = "jumpstart"
        types = [str((spec.get("server") or {}).get("instanceType") or "")]
    else:
        model = spec.get("modelName")
        source = (spec.get("modelSourceConfig") or {}).get("modelSourceType")
        types = [spec["instanceType"]] if spec.get("instanceType") else list(spec.get("instanceTypes") or [])
    cache = spec.get("kvCacheSpec")
    kv: str | None = None
    if isinstance(cache, dict):
        parts = ["L1"] if cache.get("enableL1Cache", True) else []
        if cache.get("enableL2Cache"):
            parts.append(f"L2 ({(cache.get('l2CacheSpec') or {}).get('l2CacheBackend')})")
        kv = "+".join(parts) or None
    port = ((spec.get("worker") or {}).get("modelInvocationPort") or {}).get("containerPort") \
        if kind is EndpointKind.CONFIG else 8080
    return EndpointView(
        name=str(meta.get("name")), namespace=str(meta.get("namespace")), cluster=cluster, kind=kind, model=model,
        source=source, instance_types=[t for t in types if t], state=status.get("state"),
        message=str(detail.get("message") or ""), replicas=int(status.get("replicas") or 0),
        available=int(seen.get("availableReplicas") or 0), desired=int(spec.get("replicas", 1)),
        scaled_to=scaled.get(f"{meta.get('namespace')}/{meta.get('name')}"),
        autoscaling=managed_scaling.autoscaling_of(scaling) if isinstance(scaling, dict) else None,
        routing=render.routing_of(dict(spec)), kv_cache=kv,
        service=f"{meta.get('name')}:{port}",
        conditions=[EndpointCondition(type=str(c.get("type")), status=str(c.get("status")), reason=c.get("reason"),
                                      message=c.get("message")) for c in status.get("conditions") or []],
        created=meta.get("creationTimestamp"))
