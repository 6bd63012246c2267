"""The ``inference`` noun, self-managed path: vLLM and SGLang as Kubernetes Deployments with a Service.

Its verbs are the only entry points for every face. ``preview_deployment`` renders and dry-runs; ``deploy`` and
``update_deployment`` precheck synchronously — the serve command against the engine's real flags, tensor x
pipeline parallel against the GPU count, the GPU count against the cluster's node types, the exposure rules
(internet-facing needs source ranges; the whole internet only when confirmed), the name (free, or ours), the
AWS Load Balancer Controller for an external Service — before any operation row exists, then submit an
operation on ``cluster/<c>/inference/<name>`` (so it conflicts with a cluster delete). Reads answer from watch
caches (Deployments, Services, pods): no API call per list. ``test_deployment`` sends one capped
OpenAI-compatible request through the Kubernetes API's service proxy, only to deployments this product made.
The Hugging Face token goes into a Secret of its own per deploy request (``tokens.py``), which the Deployment
then owns; no record, response or log holds it. A failed deploy keeps it on purpose: a Deployment that reads it
is fixed by an update (which keeps the live token: the user need not paste it again) and a failed stage is
retried with the same plan; a cancel deletes it unless the Deployment reads it, the delete always.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from kubernetes import client as k8s

from services.audit import AuditLog
from services.auth import Principal, Role
from services.clusters.create_base import FIELD_MANAGER
from services.clusters.pipeline import cluster_target
from services.clusters.registry import ClusterRegistry
from services.clusters.storage_stage import APPLY
from services.errors import Conflict, Invalid, NotFound
from services.inference import checks, egress, manifest, names, scaledobject, testcall, tokens
from services.inference.command import IMAGES, ServeCommand, parse
from services.inference.endpoint_metrics import EndpointScraper, ready_pods
from services.inference.kobjects import labels as _labels
from services.inference.kobjects import meta as _meta
from services.inference.models import (
    DeploymentList,
    DeploymentPlan,
    DeploymentRef,
    DeploymentRequest,
    DeploymentUpdate,
    DeploymentView,
    EndpointTest,
    EndpointTestResult,
    Exposure,
    PodView,
    Preview,
    ServiceView,
)
from services.inference.obs_models import InferenceLogQuery
from services.inference.stages import (
    ApplyStage,
    DeleteStage,
    InferenceDeps,
    LoadBalancerStage,
    NamespaceStage,
    RolloutStage,
)
from services.informers import Informers
from services.kube import KubeClients
from services.limits import Slots
from services.logs import JobLogs, LogText
from services.logs.models import LogTextQuery
from services.operations import Engine, OperationKind, OperationView
from services.secrets import SecretRef
from services.training.downloads.manifest import ensure_namespace, shared_storage
from services.training.manifests import EFA, INSTANCE_TYPE_LABEL, SHARED_MOUNT, InstanceFacts
from services.verbs import verb

__all__ = ["DELETE_KIND", "DEPLOY_KIND", "UPDATE_KIND", "Inference", "inference_target", "service_view"]
DEPLOY_KIND = "inference.deploy"
UPDATE_KIND = "inference.update"
DELETE_KIND = "inference.delete"
LBC = ("kube-system", "aws-load-balancer-controller")
TEST_CALLS_PER_PRINCIPAL = 2


def inference_target(cluster: str, name: str) -> str:
    return f"{cluster_target(cluster)}/inference/{name}"


class Inference:
    """Verbs of the inference noun (built once by the composition root).

    Besides its verbs it offers the noun's other verb modules (model pools, scaling) a small surface, so they
    build on the self-managed path instead of repeating it: :meth:`items` and :meth:`cached_service` (watch-cache
    reads), :meth:`live_deployment`, :meth:`plan` (every precheck, then the rendered plan), :meth:`dry_run`,
    :meth:`scale_plan`, :meth:`submit_with_token`, :meth:`cancelled` (an ``on_cancel`` for a kind whose plan may
    hold a token Secret) and :attr:`test_calls` (the per-principal slots every test call of the noun takes). None
    of these is a verb: the verb calling them has checked the caller's role."""

    noun = "inference"

    def __init__(self, registry: ClusterRegistry, informers: Informers, kube: KubeClients, engine: Engine,
                 audit: AuditLog, logs: JobLogs) -> None:
        self.registry = registry
        self.logs = logs
        self.informers = informers
        self.kube = kube
        self.audit = audit
        self._engine = engine
        self.deps = InferenceDeps(kube=kube)
        #: a test call holds a REST worker thread for up to a minute: a few at a time per principal (pools' too)
        self.test_calls = Slots("inference test calls", TEST_CALLS_PER_PRINCIPAL)
        self.scraper = EndpointScraper(kube)

    def kinds(self) -> list[OperationKind[Any]]:
        d = self.deps
        return [
            OperationKind(DEPLOY_KIND, DeploymentPlan,
                          (NamespaceStage(d), ApplyStage(d), RolloutStage(d), LoadBalancerStage(d)),
                          target=lambda p: inference_target(p.cluster, p.name), role=Role.OPERATOR,
                          description="deploy a model with vLLM or SGLang as a Deployment and Service",
                          plan=_deploy_stages, on_cancel=self.cancelled),
            OperationKind(UPDATE_KIND, DeploymentPlan, (ApplyStage(d), RolloutStage(d)),
                          target=lambda p: inference_target(p.cluster, p.name), role=Role.OPERATOR,
                          description="rolling update of a self-managed inference deployment"),
            OperationKind(DELETE_KIND, DeploymentRef, (DeleteStage(d),),
                          target=lambda r: inference_target(r.cluster, r.name), role=Role.OPERATOR,
                          description="delete a self-managed inference deployment and its Service"),
        ]

    # ----- caches ------------------------------------------------------------------------------------------

    def items(self, cluster: str, resource: str) -> list[dict[str, Any]]:
        """The watch cache's ``resource`` objects of ``cluster`` (503 until listed); not a verb, no API call."""
        return names.cached(self.informers, cluster, resource)

    def _ours(self, cluster: str) -> list[dict[str, Any]]:
        return [d for d in self.items(cluster, "deployments")  # model pools are pool.py's
                if checks.ours(d, str(_labels(d).get(manifest.INFERENCE_LABEL, "")))
                and manifest.POOL_LABEL not in _labels(d)]

    def live_deployment(self, cluster: str, name: str) -> dict[str, Any]:
        """The live Deployment of our inference deployment ``name`` (from the informer cache; NotFound when the
        cluster has none of that name). A read for the noun's own verb modules (scaling), not a verb itself."""
        self.registry.get(cluster)
        for dep in self._ours(cluster):
            if _meta(dep).get("name") == name:
                return dep
        raise NotFound(f"no inference deployment {name!r} in cluster {cluster}; inference_list lists them")

    # ----- planning ----------------------------------------------------------------------------------------

    def plan(self, principal: Principal, cluster: str, request: DeploymentRequest,
             token: SecretRef | None) -> tuple[DeploymentPlan, ServeCommand, list[str]]:
        """Every precheck, then the rendered plan. Request-only checks come first: a bad command, TP x PP over
        the GPUs or an unconfirmed open endpoint is refused before the cluster is asked anything."""
        self.registry.get(cluster)
        serve = parse(request.command)
        checks.check_parallel(serve, request.gpus)
        checks.check_service(request.service)
        self._check_image(serve, request.image)
        facts = InstanceFacts.from_nodes(self.items(cluster, "nodes"))
        fits = checks.pick_instance_types(facts, request.gpus, request.instance_type)
        checks.check_name(self.items(cluster, "deployments"), self.items(cluster, "services"), request.name,
                          request.namespace)
        names.check_other_paths(self.informers, cluster, request.name, "deployment")
        if request.service.exposure is Exposure.EXTERNAL:
            self._check_lbc(cluster)
        storage = self._has_shared_storage(cluster, serve)
        warnings = [f"pods run on {', '.join(fits)} nodes (those with at least {request.gpus} GPUs)"]
        if serve.gpus_needed < request.gpus:
            warnings.append(f"the engine uses {serve.gpus_needed} of the {request.gpus} GPUs each pod holds "
                            "(tensor x pipeline parallel)")
        model_gb = request.model_size_gb or manifest.estimated_gb(serve.model)
        objects = [manifest.deployment(name=request.name, namespace=request.namespace, serve=serve, gpus=request.gpus,
                                       replicas=request.replicas, efa=request.efa, instance_type=request.instance_type,
                                       image=request.image, model_gb=model_gb, token=token, shared_storage=storage,
                                       model_size_gb=request.model_size_gb),
                   manifest.service(name=request.name, namespace=request.namespace, serve=serve, spec=request.service)]
        plan = DeploymentPlan(cluster=cluster, name=request.name, namespace=request.namespace, engine=serve.engine,
                              model=serve.model, api_model=serve.api_model, gpus=request.gpus,
                              replicas=request.replicas, exposure=request.service.exposure, manifests=objects,
                              token=token, requested_by=principal.name)
        return plan, serve, warnings

    def _check_image(self, serve: ServeCommand, image: str | None) -> None:
        repository = IMAGES[serve.engine].rsplit(":", 1)[0]
        if image is not None and image.rsplit(":", 1)[0] != repository:
            raise Invalid(f"a {serve.engine.value} deployment runs {repository}:<tag>, not {image}",
                          details={"field": "image"})

    def _check_lbc(self, cluster: str) -> None:
        namespace, name = LBC
        if not any(_meta(d).get("name") == name and _meta(d).get("namespace") == namespace
                   for d in self.items(cluster, "deployments")):
            raise Conflict(f"an external endpoint needs the AWS Load Balancer Controller ({namespace}/{name}) in "
                           f"{cluster}: install it with the cluster's dependencies, or use exposure 'cluster'",
                           details={"missing": f"{namespace}/{name}"})

    def _has_shared_storage(self, cluster: str, serve: ServeCommand) -> bool:
        try:
            shared_storage(self.kube, cluster)
        except Conflict as exc:
            if serve.model.startswith(SHARED_MOUNT + "/"):
                raise Conflict(f"the model {serve.model} is on shared storage, but {cluster} has none (no claim "
                               "default/shared-s3 bound to a Mountpoint for S3 volume): serve a Hugging Face id "
                               "instead, or give the cluster shared storage first", details=exc.details) from None
            return False
        return True

    def dry_run(self, plan: DeploymentPlan) -> None:
        """The API server validates both objects (its schemas, admission) and stores nothing: a 422 names the
        field. Before the namespace exists (the operation makes it) the check runs in ``default``."""
        api = self.kube.api_client(plan.cluster)
        core = k8s.CoreV1Api(api)
        namespace = plan.namespace
        try:
            core.read_namespace(namespace)
        except NotFound:
            namespace = "default"
        for obj in plan.manifests:  # server-side apply: a deployment of ours already there is checked as updated
            body = {**obj, "metadata": {**obj["metadata"], "namespace": namespace}}
            apply = k8s.AppsV1Api(api).patch_namespaced_deployment if obj["kind"] == "Deployment" \
                else core.patch_namespaced_service
            apply(plan.name, namespace, body, field_manager=FIELD_MANAGER, force=True, dry_run="All",
                  _content_type=APPLY)

    # ----- mutations ---------------------------------------------------------------------------------------

    @verb(Role.OPERATOR)
    def preview_deployment(self, principal: Principal, cluster: str, request: DeploymentRequest) -> Preview:
        """What a deploy would create (every precheck, then the API server's dry run); nothing is created."""
        ref = tokens.new_ref(cluster, request.namespace, request.name) if request.hf_token is not None else None
        plan, serve, warnings = self.plan(principal, cluster, request, ref)
        self.dry_run(plan)
        return Preview(engine=serve.engine, model=serve.model, api_model=serve.api_model, port=serve.port,
                       tensor_parallel=serve.tensor_parallel, pipeline_parallel=serve.pipeline_parallel,
                       image=plan.manifests[0]["spec"]["template"]["spec"]["containers"][0]["image"],
                       manifests=plan.manifests, warnings=warnings)

    @verb(Role.OPERATOR)
    def deploy(self, principal: Principal, cluster: str, request: DeploymentRequest,
               idempotency_key: str | None = None) -> tuple[OperationView, bool]:
        """Deploy a model (prechecked, dry-run; then ``inference.deploy``: namespace → apply → rollout, and
        load_balancer for an external Service: done once its NLB's DNS name is in the Service)."""
        def same(stored: dict[str, Any]) -> bool:
            return stored.get("cluster") == cluster and stored.get("name") == request.name
        replay = self._engine.replayed(DEPLOY_KIND, principal, idempotency_key, same)
        if replay is not None:
            return replay, False
        token = request.hf_token.get_secret_value() if request.hf_token is not None else ""
        ref = tokens.new_ref(cluster, request.namespace, request.name) if token else None
        plan, _, _ = self.plan(principal, cluster, request, ref)
        self.dry_run(plan)
        return self.submit_with_token(DEPLOY_KIND, plan, principal, idempotency_key, token)

    def submit_with_token(self, kind: str, plan: DeploymentPlan, principal: Principal, idempotency_key: str | None,
                          token: str) -> tuple[OperationView, bool]:
        """Submit ``plan`` after making the request's own token Secret (``plan.token``): a refused submit deletes
        only that Secret."""
        ref = plan.token
        if ref is not None:
            ensure_namespace(self.kube, plan.cluster, plan.namespace)
            tokens.create(self.kube, ref, plan.name, token)
        try:
            return self._engine.submit(kind, plan, principal, idempotency_key)
        except BaseException:
            if ref is not None:
                tokens.delete(self.kube, ref)
            raise

    def cancelled(self, plan: DeploymentPlan) -> None:
        """A cancelled (or failed, then cancelled) deploy deletes the token Secret it made, unless the
        Deployment already reads it."""
        if plan.token is None:
            return
        try:
            live: Any = k8s.AppsV1Api(self.kube.api_client(plan.cluster)).read_namespaced_deployment(
                plan.name, plan.namespace)
        except NotFound:
            live = None
        container = next((c for c in live.spec.template.spec.containers if c.name == manifest.CONTAINER),
                         None) if live is not None else None
        used = _live_token(plan.cluster, plan.namespace, container) if container is not None else None
        if used is None or used.name != plan.token.name:
            tokens.delete(self.kube, plan.token)

    @verb(Role.OPERATOR)
    def update_deployment(self, principal: Principal, cluster: str, name: str, update: DeploymentUpdate,
                          idempotency_key: str | None = None) -> tuple[OperationView, bool]:
        """Rolling update of the Deployment (a new command or image makes a new ReplicaSet; replicas scale in
        place), prechecked like a deploy; the Service stays as it is, so the port cannot change."""
        if update.command is None and update.image is None and update.replicas is None:
            raise Invalid("nothing to change: give command, image or replicas")
        def same(stored: dict[str, Any]) -> bool:
            return stored.get("cluster") == cluster and stored.get("name") == name
        replay = self._engine.replayed(UPDATE_KIND, principal, idempotency_key, same)
        if replay is not None:
            return replay, False
        meta = _meta(self.live_deployment(cluster, name))
        namespace = str(meta.get("namespace"))
        svc = self.cached_service(cluster, namespace, name) or {}
        exposure = Exposure.EXTERNAL if (svc.get("spec") or {}).get("type") == "LoadBalancer" else Exposure.CLUSTER
        if update.replicas is not None and scaledobject.read(self.kube.api_client(cluster), namespace, name):
            raise Conflict(f"{name} is autoscaled by KEDA, which owns its replica count: change min_replicas / "
                           "max_replicas with inference_scaling_set, or inference_scaling_remove first",
                           details={"autoscaled": True})
        if update.command is None and update.image is None and update.replicas is not None:
            return self._engine.submit(UPDATE_KIND, self.scale_plan(principal, cluster, meta, exposure,
                                                                    update.replicas), principal, idempotency_key)
        live: Any = k8s.AppsV1Api(self.kube.api_client(cluster)).read_namespaced_deployment(name, namespace)
        pod, notes = live.spec.template.spec, dict(live.metadata.annotations or {})
        container = next(c for c in pod.containers if c.name == manifest.CONTAINER)
        limits = (container.resources.limits if container.resources else None) or {}
        given_gb = notes.get(manifest.MODEL_GB_ANNOTATION)
        request = DeploymentRequest(
            name=name, command=update.command or shlex.join(container.command or []),
            gpus=int(notes.get(manifest.GPUS_ANNOTATION) or 1), namespace=namespace,
            image=update.image or container.image, replicas=max(update.replicas if update.replicas is not None
                                                                else int(live.spec.replicas or 0), 1),
            instance_type=notes.get(manifest.INSTANCE_TYPE_ANNOTATION)
            or (pod.node_selector or {}).get(INSTANCE_TYPE_LABEL),
            efa=int(notes.get(manifest.EFA_ANNOTATION) or limits.get(EFA) or 0),
            model_size_gb=float(given_gb) if given_gb else None)
        serve = parse(request.command)
        ports = [int(p.get("targetPort") or 0) for p in (svc.get("spec") or {}).get("ports") or []]
        if ports and serve.port not in ports:
            raise Invalid(f"the Service of {name} sends traffic to port {ports[0]}; the new command listens on "
                          f"{serve.port}: keep the port, or delete and deploy again", details={"port": ports[0]})
        plan, _, _ = self.plan(principal, cluster, request, _live_token(cluster, namespace, container))
        if update.replicas is not None:
            plan.manifests[0]["spec"]["replicas"] = plan.replicas = update.replicas
        plan.manifests, plan.update = plan.manifests[:1], True  # the Deployment only
        self.dry_run(plan)
        return self._engine.submit(UPDATE_KIND, plan, principal, idempotency_key)

    def scale_plan(self, principal: Principal, cluster: str, meta: Mapping[str, Any], exposure: Exposure,
                   replicas: int) -> DeploymentPlan:
        """Replicas only: the scale subresource changes ``spec.replicas`` and nothing of the pod template, so no
        new ReplicaSet and no engine restarts."""
        name, namespace = str(meta.get("name")), str(meta.get("namespace"))
        labels, notes = meta.get("labels") or {}, meta.get("annotations") or {}
        scale = {"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": {"name": name, "namespace": namespace},
                 "spec": {"replicas": replicas}}
        return DeploymentPlan(cluster=cluster, name=name, namespace=namespace, engine=labels[manifest.ENGINE_LABEL],
                              model=str(notes.get(manifest.MODEL_ANNOTATION) or ""),
                              api_model=str(notes.get(manifest.API_MODEL_ANNOTATION) or ""),
                              gpus=int(notes.get(manifest.GPUS_ANNOTATION) or 1), replicas=replicas,
                              exposure=exposure, manifests=[scale], update=True, scale=True,
                              requested_by=principal.name)

    @verb(Role.OPERATOR)
    def delete_deployment(self, principal: Principal, cluster: str, name: str,
                          idempotency_key: str | None = None) -> tuple[OperationView, bool]:
        """Delete the deployment and its Service (``inference.delete``); only ours, only the uid seen now. A
        deployment a router fronts is refused (409 naming the router): delete the router first."""
        def same(stored: dict[str, Any]) -> bool:
            return stored.get("cluster") == cluster and stored.get("name") == name
        replay = self._engine.replayed(DELETE_KIND, principal, idempotency_key, same)
        if replay is not None:  # before the lookup: after the delete the deployment is gone, the answer is not
            return replay, False
        dep = self.live_deployment(cluster, name)
        meta = _meta(dep)
        names.refuse_router_create(self._engine, cluster, name, then="this deployment")
        routers = names.fronting_routers(self.informers, cluster, str(meta.get("namespace")), name)
        if routers:
            raise Conflict(f"the router {routers[0]} fronts {name}: delete the router first "
                           f"(inference_routers_delete {routers[0]}), then this deployment",
                           details={"routers": routers})
        ref = DeploymentRef(cluster=cluster, name=name, namespace=str(meta.get("namespace")), uid=str(meta.get("uid")),
                            requested_by=principal.name)
        return self._engine.submit(DELETE_KIND, ref, principal, idempotency_key)

    # ----- reads -------------------------------------------------------------------------------------------

    @verb(Role.VIEWER)
    def list_deployments(self, principal: Principal, cluster: str) -> DeploymentList:
        """Every self-managed deployment of the cluster, from the watch caches (no API call)."""
        self.registry.get(cluster)
        services = {(_meta(s).get("namespace"), _meta(s).get("name")): s for s in self.items(cluster, "services")}
        pods = self.items(cluster, "pods")
        views = [self._view(cluster, d, services, pods) for d in self._ours(cluster)]
        return DeploymentList(cluster=cluster, deployments=sorted(views, key=lambda v: (v.namespace, v.name)))

    @verb(Role.VIEWER)
    def describe_deployment(self, principal: Principal, cluster: str, name: str) -> DeploymentView:
        """One deployment: replicas ready/available/updated, its pods and nodes, its Service's address, and its
        engines' time to first token and tokens/s (their /metrics through the pod proxy, scraped at most every
        few seconds)."""
        dep = self.live_deployment(cluster, name)
        services = {(_meta(s).get("namespace"), _meta(s).get("name")): s for s in self.items(cluster, "services")}
        pods = self.items(cluster, "pods")
        view = self._view(cluster, dep, services, pods)
        svc = services.get((view.namespace, name))
        ports = ((svc or {}).get("spec") or {}).get("ports") or [{}]
        port = ports[0].get("targetPort")
        if view.engine is None or not isinstance(port, int):
            return view
        metrics = self.scraper.read(cluster, view.namespace, name, view.engine,
                                    ready_pods(view.namespace, name, port, pods))
        return view.model_copy(update={"metrics": metrics})

    def cached_service(self, cluster: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The Service ``namespace/name`` from the watch cache (whoever made it), or None."""
        return next((s for s in self.items(cluster, "services")
                     if _meta(s).get("namespace") == namespace and _meta(s).get("name") == name), None)

    def _view(self, cluster: str, dep: dict[str, Any], services: Mapping[tuple[Any, Any], dict[str, Any]],
              pods: list[dict[str, Any]]) -> DeploymentView:
        meta, spec, status = _meta(dep), dep.get("spec") or {}, dep.get("status") or {}
        name, namespace = str(meta.get("name")), str(meta.get("namespace"))
        labels, notes = meta.get("labels") or {}, meta.get("annotations") or {}
        want = 1 if spec.get("replicas") is None else int(spec["replicas"])
        ready, available = int(status.get("readyReplicas") or 0), int(status.get("availableReplicas") or 0)
        updated = int(status.get("updatedReplicas") or 0)
        failed = next((c for c in status.get("conditions") or []
                       if c.get("type") == "Progressing" and c.get("status") == "False"), None)
        if failed is not None:
            phase, message = "Failed", f"{failed.get('reason')}: {failed.get('message')}"
        elif want == 0:
            phase, message = "Stopped", "scaled to 0 replicas"
        elif available >= want and updated >= want:
            phase, message = "Available", f"{available}/{want} replicas available"
        else:
            phase, message = "Progressing", f"{available}/{want} available, {updated}/{want} updated"
        mine = [p for p in pods if _meta(p).get("namespace") == namespace
                and _labels(p).get(manifest.INFERENCE_LABEL) == name]
        svc = services.get((namespace, name))
        container = (spec.get("containers") or [{}])[0]
        return DeploymentView(
            name=name, namespace=namespace, cluster=cluster, engine=labels.get(manifest.ENGINE_LABEL),
            model=notes.get(manifest.MODEL_ANNOTATION), image=container.get("image"),
            gpus=int(notes[manifest.GPUS_ANNOTATION]) if notes.get(manifest.GPUS_ANNOTATION) else None,
            replicas=want, ready=ready, available=available, updated=updated, phase=phase, message=message,
            pods=[PodView(name=str(_meta(p).get("name")), node=(p.get("spec") or {}).get("nodeName"),
                          phase=(p.get("status") or {}).get("phase"),
                          restarts=int((p.get("status") or {}).get("restarts") or 0)) for p in mine],
            service=service_view(svc) if svc is not None else None, created=meta.get("creationTimestamp"))

    @verb(Role.VIEWER)
    def read_logs(self, principal: Principal, cluster: str, name: str, query: InferenceLogQuery) -> LogText:
        """The engine container's log lines of the deployment's pods (previous containers included: a crash
        loop's last words), through the logs noun's text reader; ``cursor`` continues after a read."""
        namespace = str(_meta(self.live_deployment(cluster, name)).get("namespace"))
        select = LogTextQuery(namespace=namespace, container=manifest.CONTAINER, **query.model_dump())
        return self.logs.read_labelled_text(cluster, manifest.INFERENCE_LABEL, name, select)

    # ----- test --------------------------------------------------------------------------------------------

    @verb(Role.OPERATOR)
    def test_deployment(self, principal: Principal, cluster: str, name: str,
                        request: EndpointTest) -> EndpointTestResult:
        """One OpenAI-compatible request to a deployment of ours: through the Kubernetes API's service proxy, or
        at its load balancer (its name resolved once and checked by the SSRF guard)."""
        dep = self.live_deployment(cluster, name)
        meta = _meta(dep)
        namespace = str(meta.get("namespace"))
        svc = self.cached_service(cluster, namespace, name)
        if svc is None or not checks.ours(svc, name):
            raise Conflict(f"the deployment {name} has no Service of ours to test through")
        port = int(str(((svc.get("spec") or {}).get("ports") or [{}])[0].get("port") or 0))
        model = str((meta.get("annotations") or {}).get(manifest.API_MODEL_ANNOTATION) or "")
        address = service_view(svc).address
        if request.via == "load_balancer" and address is None:
            raise Conflict(f"{name} has no load balancer address (exposure 'cluster', or AWS has not made it "
                           "yet): test it with via 'service_proxy'")
        self.test_calls.acquire(principal)
        try:
            if request.via == "load_balancer" and address is not None:
                result = testcall.call_load_balancer(egress.check_load_balancer_name(address), port, model,
                                                     request)
            else:
                target = testcall.Target(namespace=namespace, service=name, port=port, model=model)
                result = testcall.call(self.kube.api_client(cluster), target, request)
        finally:
            self.test_calls.release(principal)
        self.audit.record(principal, "inference.test", inference_target(cluster, name),
                          {"api": request.api, "max_tokens": request.max_tokens, "via": request.via},
                          f"status {result.status}")
        return result


def _deploy_stages(plan: DeploymentPlan) -> list[str]:
    """An external deployment also waits for its load balancer's DNS name."""
    stages = ["namespace", "apply", "rollout"]
    return [*stages, "load_balancer"] if plan.exposure is Exposure.EXTERNAL else stages


def _live_token(cluster: str, namespace: str, container: Any) -> SecretRef | None:
    """The token Secret the live container reads ``HF_TOKEN`` from (an update keeps it)."""
    for env in container.env or []:
        source = env.value_from.secret_key_ref if env.name == "HF_TOKEN" and env.value_from else None
        if source is not None:
            return SecretRef(cluster=cluster, namespace=namespace, name=source.name, key=source.key)
    return None


def service_view(svc: Mapping[str, Any]) -> ServiceView:
    """A Service's type, port and address as the deployment and router views show them."""
    spec, status = svc.get("spec") or {}, svc.get("status") or {}
    ingress = ((status.get("loadBalancer") or {}).get("ingress") or [{}])[0]
    notes = _meta(svc).get("annotations") or {}
    return ServiceView(type=str(spec.get("type") or "ClusterIP"),
                       port=int(((spec.get("ports") or [{}])[0]).get("port") or 0),
                       cluster_ip=spec.get("clusterIP"), address=ingress.get("hostname") or ingress.get("ip"),
                       scheme=notes.get(manifest.LB_SCHEME))
