"""Model pools: warm vLLM / SGLang workers that model services claim by relabelling pods — no restart, no reload.

A pool is a self-managed inference Deployment (the serve command, image, GPU, token Secret and probe rules of
``Inference``; its prechecks and dry run are the same) whose pod template carries ``business: unassigned`` and
whose selector does not name ``business``, so a relabelled pod stays its ReplicaSet's (no replacement is made).
A model service is a ClusterIP Service selecting the pool's pods labelled ``business=<service>``; assigning pods
to it relabels Ready unassigned ones, releasing sets them back. The pool never scales below the pods services
hold (409 naming them), and claimed pods carry a pod-deletion cost so a scale-in takes unassigned pods first.

Every mutation prechecks synchronously from the watch caches (422/409 before any operation row), then submits an
operation on ``cluster/<c>/inference/<pool>``: assigns, releases and scales of one pool are serialized, so what a
precheck counted still holds when its operation runs (the stages check again on live objects all the same).
Reads answer from the caches. This module never touches pods' specs.
"""

from __future__ import annotations

import copy
import shlex
from collections.abc import Mapping
from typing import Any

from services.auth import Principal, Role
from services.errors import Conflict, Invalid, NotFound
from services.inference import Inference, checks, inference_target, manifest, names, testcall, tokens
from services.inference.command import parse
from services.inference.kobjects import cached_ready as _ready
from services.inference.kobjects import labels as _labels
from services.inference.kobjects import meta as _meta
from services.inference.manifest import POOL_LABEL
from services.inference.models import (
    DeploymentPlan,
    DeploymentRef,
    DeploymentRequest,
    EndpointTest,
    EndpointTestResult,
    Exposure,
)
from services.inference.pool_models import (
    BUSINESS,
    UNASSIGNED,
    PoolAssign,
    PoolClaim,
    PoolList,
    PoolPodView,
    PoolPreview,
    PoolRelease,
    PoolRequest,
    PoolScale,
    PoolServiceView,
    PoolView,
)
from services.inference.pool_stages import ClaimStage, ScaleStage, at_risk, held_by, pool_service
from services.inference.stages import ApplyStage, DeleteStage, NamespaceStage, RolloutStage
from services.operations import Engine, OperationKind, OperationView, Status
from services.secrets import SecretRef
from services.verbs import verb

__all__ = ["ASSIGN_KIND", "CREATE_KIND", "DELETE_KIND", "RELEASE_KIND", "SCALE_KIND", "Pools"]
CREATE_KIND = "inference.pool.create"
SCALE_KIND = "inference.pool.scale"
ASSIGN_KIND = "inference.pool.assign"
RELEASE_KIND = "inference.pool.release"
DELETE_KIND = "inference.pool.delete"


class Pools:
    """Verbs of model pools (built once by the composition root, over the inference noun)."""

    def __init__(self, inference: Inference, engine: Engine) -> None:
        self.inference = inference
        self.audit = inference.audit
        self._engine = engine

    def kinds(self) -> list[OperationKind[Any]]:
        d = self.inference.deps
        claim = ClaimStage(d, lambda: self._engine.pace)  # an assign that ends without success gives back its pods
        return [
            OperationKind(CREATE_KIND, DeploymentPlan, (NamespaceStage(d), ApplyStage(d), RolloutStage(d)),
                          target=lambda p: inference_target(p.cluster, p.name), role=Role.OPERATOR,
                          description="start a model pool of warm vLLM / SGLang pods labelled business=unassigned",
                          on_cancel=self.inference.cancelled),
            OperationKind(SCALE_KIND, DeploymentPlan, (ScaleStage(d), RolloutStage(d)),
                          target=lambda p: inference_target(p.cluster, p.name), role=Role.OPERATOR,
                          description="scale a model pool (never below the pods services hold)"),
            OperationKind(ASSIGN_KIND, PoolClaim, (claim,),
                          target=lambda c: inference_target(c.cluster, c.pool), role=Role.OPERATOR,
                          description="give pool pods to a model service by relabelling them (no restart)",
                          on_unsuccessful=lambda op_id, c: self._give_back(claim, op_id, c)),
            OperationKind(RELEASE_KIND, PoolClaim, (ClaimStage(d, lambda: self._engine.pace),),
                          target=lambda c: inference_target(c.cluster, c.pool), role=Role.OPERATOR,
                          description="give a model service's pods back to its pool (business=unassigned)"),
            OperationKind(DELETE_KIND, DeploymentRef, (DeleteStage(d),),
                          target=lambda r: inference_target(r.cluster, r.name), role=Role.OPERATOR,
                          description="delete a model pool, its pods and its services' Services"),
        ]

    def _give_back(self, claim: ClaimStage, op_id: str, request: PoolClaim) -> None:
        """The assign's ``on_unsuccessful``: its pods go back, unless it failed in the claim stage, whose own
        give-back already ran and told (its error's ``given_back`` and ``stuck``): once per end, so a pod left
        claimed is tried and reported once. Cancelling the failed assign runs it again (and retries such a pod)."""
        op = self._engine.get(op_id)
        if op.status == Status.FAILED and "given_back" in ((op.error or {}).get("details") or {}):
            return
        claim.give_back(op_id, request, self._engine.clock)

    # ----- caches ------------------------------------------------------------------------------------------

    def _pools(self, cluster: str) -> list[dict[str, Any]]:
        return [d for d in self.inference.items(cluster, "deployments")
                if _labels(d).get(POOL_LABEL) and checks.ours(d, str(_labels(d).get(manifest.INFERENCE_LABEL)))]

    def _find(self, cluster: str, name: str) -> dict[str, Any]:
        self.inference.registry.get(cluster)
        for dep in self._pools(cluster):
            if _meta(dep).get("name") == name:
                return dep
        raise NotFound(f"no model pool {name!r} in cluster {cluster}; inference_pool_list lists them")

    def _pods(self, cluster: str, dep: Mapping[str, Any], *, live: bool = False) -> list[dict[str, Any]]:
        """The pool's pods (``live``: without the terminating ones, which a claim or a scale cannot count on)."""
        name, namespace = _meta(dep).get("name"), _meta(dep).get("namespace")
        return sorted((p for p in self.inference.items(cluster, "pods")
                       if _meta(p).get("namespace") == namespace
                       and _labels(p).get(manifest.INFERENCE_LABEL) == name
                       and not (live and _meta(p).get("deletionTimestamp"))), key=lambda p: str(_meta(p).get("name")))

    # ----- create ------------------------------------------------------------------------------------------

    def _plan(self, principal: Principal, cluster: str, request: PoolRequest,
              token: SecretRef | None) -> tuple[DeploymentPlan, Any, list[str]]:
        """The self-managed deployment's prechecks and rendering, then the pool's labels: ``business:
        unassigned`` on the pod template only, the selector as it was (without ``business``), no Service."""
        as_deployment = DeploymentRequest(name=request.name, command=request.command, gpus=request.gpus,
                                          replicas=request.replicas, namespace=request.namespace,
                                          instance_type=request.instance_type, image=request.image,
                                          model_size_gb=request.model_size_gb)
        plan, serve, warnings = self.inference.plan(principal, cluster, as_deployment, token)
        for other in self.inference.items(cluster, "deployments"):  # a deployment of ours there is not a pool
            if _meta(other).get("name") == request.name and _meta(other).get("namespace") == request.namespace:
                raise Conflict(f"an inference deployment {request.namespace}/{request.name} exists: choose another "
                               "name for the pool", details={"namespace": request.namespace})
        dep = copy.deepcopy(plan.manifests[0])
        dep["metadata"]["labels"] = {**dep["metadata"]["labels"], POOL_LABEL: request.name}
        template = dep["spec"]["template"]["metadata"]
        template["labels"] = {**template["labels"], BUSINESS: UNASSIGNED}
        plan.manifests = [dep]
        return plan, serve, warnings

    @verb(Role.OPERATOR)
    def preview_pool(self, principal: Principal, cluster: str, request: PoolRequest) -> PoolPreview:
        """What a pool create would make (every precheck, then the API server's dry run); nothing is created."""
        ref = tokens.new_ref(cluster, request.namespace, request.name) if request.hf_token is not None else None
        plan, serve, warnings = self._plan(principal, cluster, request, ref)
        self.inference.dry_run(plan)
        return PoolPreview(engine=serve.engine.value, model=serve.model, api_model=serve.api_model, port=serve.port,
                           manifests=plan.manifests, warnings=warnings)

    @verb(Role.OPERATOR)
    def create_pool(self, principal: Principal, cluster: str, request: PoolRequest,
                    idempotency_key: str | None = None) -> tuple[OperationView, bool]:
        """Start a pool (prechecked and dry-run like a deploy; then ``inference.pool.create``: namespace → apply →
        rollout, done when every pod is available, warm and unassigned)."""
        def same(stored: dict[str, Any]) -> bool:
            return stored.get("cluster") == cluster and stored.get("name") == request.name
        replay = self._engine.replayed(CREATE_KIND, principal, idempotency_key, same)
        if replay is not None:
            return replay, False
        token = request.hf_token.get_secret_value() if request.hf_token is not None else ""
        ref = tokens.new_ref(cluster, request.namespace, request.name) if token else None
        plan, _, _ = self._plan(principal, cluster, request, ref)
        self.inference.dry_run(plan)
        return self.inference.submit_with_token(CREATE_KIND, plan, principal, idempotency_key, token)

    # ----- scale, assign, release, delete --------------------------------------------------------------------

    def _replayed(self, kind: str, principal: Principal, cluster: str, name: str,
                  idempotency_key: str | None) -> OperationView | None:
        """The operation an Idempotency-Key already made, answered before the prechecks (which its own success
        would now fail: the pods it claimed are held)."""
        def same(stored: dict[str, Any]) -> bool:
            return stored.get("cluster") == cluster and name in (stored.get("name"), stored.get("pool"))
        return self._engine.replayed(kind, principal, idempotency_key, same)

    @verb(Role.OPERATOR)
    def scale_pool(self, principal: Principal, cluster: str, name: str, request: PoolScale,
                   idempotency_key: str | None = None) -> tuple[OperationView, bool]:
        """Scale the pool's Deployment (``inference.pool.scale``: scale → rollout). 409 naming the services and
        their pods when services hold more pods than ``replicas``."""
        replay = self._replayed(SCALE_KIND, principal, cluster, name, idempotency_key)
        if replay is not None:
            return replay, False
        dep = self._find(cluster, name)
        held: dict[str, list[str]] = {}
        pods = self._pods(cluster, dep, live=True)
        for pod in pods:
            holder = held_by(dict(_labels(pod)))
            if holder is not None:
                held.setdefault(holder, []).append(str(_meta(pod).get("name")))
        count = sum(len(pods) for pods in held.values())
        if request.replicas < count:
            raise Conflict(f"services hold {count} pods of the pool {name} ("
                           + "; ".join(f"{svc}: {len(pods)}" for svc, pods in sorted(held.items()))
                           + f"): it cannot scale to {request.replicas}; release pods first "
                           "(inference_pool_release)", details={"assigned": count, "services": held})
        risky = at_risk([(str(_meta(p).get("name")), held_by(dict(_labels(p))), _ready(p)) for p in pods],
                        request.replicas)
        if risky:
            raise Conflict(f"pods of the pool {name} that services hold are not Ready ({', '.join(risky)}): "
                           "Kubernetes removes pods that are not Ready first on a scale-in, whatever their "
                           "deletion cost, so this scale could take them; wait until they are Ready or release "
                           "them (inference_pool_release)", details={"not_ready": risky})
        meta = _meta(dep)
        plan = self.inference.scale_plan(principal, cluster, meta, Exposure.CLUSTER, request.replicas)
        return self._engine.submit(SCALE_KIND, plan, principal, idempotency_key)

    @verb(Role.OPERATOR)
    def assign(self, principal: Principal, cluster: str, name: str, request: PoolAssign,
               idempotency_key: str | None = None) -> tuple[OperationView, bool]:
        """Give pool pods to a model service (``inference.pool.assign``): its Service is applied, the pods are
        relabelled. 409 when fewer Ready unassigned pods are there than asked, when a named pod is held or not
        Ready, or when the service's name belongs to a Service that is not this pool's."""
        replay = self._replayed(ASSIGN_KIND, principal, cluster, name, idempotency_key)
        if replay is not None:
            return replay, False
        dep = self._find(cluster, name)
        meta = _meta(dep)
        namespace = str(meta.get("namespace"))
        self._check_service_name(cluster, namespace, name, request.service)
        pods = self._pods(cluster, dep, live=True)
        free = [str(_meta(p).get("name")) for p in pods if held_by(dict(_labels(p))) is None and _ready(p)]
        if request.pods is not None:
            by_name = {str(_meta(p).get("name")): p for p in pods}
            for pod in request.pods:
                if pod not in by_name:
                    raise NotFound(f"{pod} is not a pod of the pool {name}; inference_pool_get lists them")
                holder = held_by(dict(_labels(by_name[pod])))
                if holder == request.service:
                    raise Conflict(f"{pod} already serves {holder}", details={"pod": pod, "service": holder})
                if holder is not None:
                    raise Conflict(f"{pod} is held by the service {holder}: release it first",
                                   details={"pod": pod, "service": holder})
                if pod not in free:
                    raise Conflict(f"{pod} is not Ready: only Ready pods can take traffic", details={"pod": pod})
            chosen = list(dict.fromkeys(request.pods))
        else:
            wanted = int(request.count or 0)
            if len(free) < wanted:
                raise Conflict(f"the pool {name} has {len(free)} Ready unassigned pods, not {wanted}: scale it "
                               "(inference_pool_scale) or release pods first",
                               details={"unassigned_ready": free, "asked": wanted})
            chosen = free[:wanted]
        claim = PoolClaim(cluster=cluster, pool=name, namespace=namespace, uid=str(meta.get("uid")),
                          service=request.service, port=self._port(dep), pods=chosen, requested_by=principal.name)
        return self._engine.submit(ASSIGN_KIND, claim, principal, idempotency_key)

    def _check_service_name(self, cluster: str, namespace: str, pool: str, service: str) -> None:
        for svc in self.inference.items(cluster, "services"):
            if _meta(svc).get("namespace") == namespace and _meta(svc).get("name") == service \
                    and not pool_service(svc, pool):
                raise Conflict(f"a Service {namespace}/{service} exists and is not a service of the pool {pool}: "
                               "choose another service name", details={"service": service})

    @staticmethod
    def _port(dep: Mapping[str, Any]) -> int:
        """The engine's port, read from the pool's serve command as its deploy read it."""
        containers = (dep.get("spec") or {}).get("containers") or []
        engine = next((c for c in containers if c.get("name") == manifest.CONTAINER), None)
        if engine is None or not engine.get("command"):
            raise Conflict(f"the pool {_meta(dep).get('name')} has no {manifest.CONTAINER} container to serve from")
        return parse(shlex.join(engine["command"])).port

    @verb(Role.OPERATOR)
    def release(self, principal: Principal, cluster: str, name: str, request: PoolRelease,
                idempotency_key: str | None = None) -> tuple[OperationView, bool]:
        """Give a service's pods back (``inference.pool.release``); releasing all of them deletes its Service.
        404 when the service holds no pod of the pool; 409 when a named pod is not the service's, and when all
        of them would go while a router fronts the service (naming it: delete the router first)."""
        replay = self._replayed(RELEASE_KIND, principal, cluster, name, idempotency_key)
        if replay is not None:
            return replay, False
        dep = self._find(cluster, name)
        meta = _meta(dep)
        held = [str(_meta(p).get("name")) for p in self._pods(cluster, dep)
                if held_by(dict(_labels(p))) == request.service]
        if not held:
            raise NotFound(f"the service {request.service} holds no pod of the pool {name}")
        chosen = list(dict.fromkeys(request.pods)) if request.pods is not None else held
        foreign = [pod for pod in chosen if pod not in held]
        if foreign:
            raise Conflict(f"{', '.join(foreign)} not held by the service {request.service} (it holds "
                           f"{', '.join(held)})", details={"pods": foreign, "held": held})
        drop = set(chosen) == set(held)
        if drop:
            self._check_unfronted(cluster, str(meta.get("namespace")), name, request.service)
        claim = PoolClaim(cluster=cluster, pool=name, namespace=str(meta.get("namespace")), uid=str(meta.get("uid")),
                          service=request.service, port=self._port(dep), pods=chosen, release=True,
                          drop_service=drop, requested_by=principal.name)
        return self._engine.submit(RELEASE_KIND, claim, principal, idempotency_key)

    def _check_unfronted(self, cluster: str, namespace: str, pool: str, service: str) -> None:
        """409 while a router fronts the pool service (or a router create for it is in flight): releasing all its
        pods deletes its Service and would leave the router running with no workers."""
        names.refuse_router_create(self._engine, cluster, pool, then="release them, or release fewer pods",
                                   pool_service=service)
        routers = names.fronting_routers(self.inference.informers, cluster, namespace, pool, service)
        if routers:
            raise Conflict(f"the router {routers[0]} fronts the service {service} of the pool {pool}: releasing all "
                           "its pods would leave the router with no workers; delete the router first "
                           f"(inference_routers_delete {routers[0]}), then release them, or release fewer pods",
                           details={"routers": routers, "service": service})

    @verb(Role.OPERATOR)
    def delete_pool(self, principal: Principal, cluster: str, name: str,
                    idempotency_key: str | None = None) -> tuple[OperationView, bool]:
        """Delete the pool (``inference.pool.delete``): its Deployment (the uid seen now), pods, token Secrets
        and, by owner reference, its services' Services. 409 while a router fronts one of its services, or while a
        router create for one is in flight (naming its operation)."""
        replay = self._replayed(DELETE_KIND, principal, cluster, name, idempotency_key)
        if replay is not None:  # before the lookup: after the delete the pool is gone, the answer is not
            return replay, False
        meta = _meta(self._find(cluster, name))
        names.refuse_router_create(self._engine, cluster, name, then="the pool")
        routers = names.fronting_routers(self.inference.informers, cluster, str(meta.get("namespace")), name)
        if routers:
            raise Conflict(f"the router {routers[0]} fronts a service of the pool {name}: delete the router first "
                           f"(inference_routers_delete {routers[0]}), then the pool", details={"routers": routers})
        ref = DeploymentRef(cluster=cluster, name=name, namespace=str(meta.get("namespace")),
                            uid=str(meta.get("uid")), requested_by=principal.name)
        return self._engine.submit(DELETE_KIND, ref, principal, idempotency_key)

    # ----- reads and test ----------------------------------------------------------------------------------

    @verb(Role.VIEWER)
    def list_pools(self, principal: Principal, cluster: str) -> PoolList:
        """Every model pool of the cluster with its pods' assignments, from the watch caches (no API call)."""
        self.inference.registry.get(cluster)
        views = [self._view(cluster, d) for d in self._pools(cluster)]
        return PoolList(cluster=cluster, pools=sorted(views, key=lambda v: (v.namespace, v.name)))

    @verb(Role.VIEWER)
    def describe_pool(self, principal: Principal, cluster: str, name: str) -> PoolView:
        """One pool: each pod's node, readiness, restarts and the service holding it; the services and their
        Services' ports."""
        return self._view(cluster, self._find(cluster, name))

    def _view(self, cluster: str, dep: dict[str, Any]) -> PoolView:
        meta, spec, status = _meta(dep), dep.get("spec") or {}, dep.get("status") or {}
        name, namespace = str(meta.get("name")), str(meta.get("namespace"))
        notes = meta.get("annotations") or {}
        pods = [PoolPodView(name=str(_meta(p).get("name")), uid=str(_meta(p).get("uid")),
                            node=(p.get("spec") or {}).get("nodeName"), phase=(p.get("status") or {}).get("phase"),
                            ready=_ready(p), restarts=int((p.get("status") or {}).get("restarts") or 0),
                            assigned_to=held_by(dict(_labels(p))))
                for p in self._pods(cluster, dep)]
        services: dict[str, PoolServiceView] = {}
        for svc in self.inference.items(cluster, "services"):
            if _meta(svc).get("namespace") == namespace and pool_service(svc, name):
                port = ((svc.get("spec") or {}).get("ports") or [{}])[0].get("port")
                services[str(_meta(svc).get("name"))] = PoolServiceView(name=str(_meta(svc).get("name")),
                                                                        port=int(port) if port else None)
        for pod in pods:
            if pod.assigned_to is not None:
                services.setdefault(pod.assigned_to, PoolServiceView(name=pod.assigned_to)).pods.append(pod.name)
        assigned = sum(1 for p in pods if p.assigned_to is not None)
        return PoolView(name=name, namespace=namespace, cluster=cluster, engine=_labels(dep).get(manifest.ENGINE_LABEL),
                        model=notes.get(manifest.MODEL_ANNOTATION),
                        gpus=int(notes[manifest.GPUS_ANNOTATION]) if notes.get(manifest.GPUS_ANNOTATION) else None,
                        replicas=1 if spec.get("replicas") is None else int(spec["replicas"]),
                        ready=int(status.get("readyReplicas") or 0), assigned=assigned,
                        unassigned=len(pods) - assigned, services=sorted(services.values(), key=lambda s: s.name),
                        pods=pods, created=meta.get("creationTimestamp"))

    @verb(Role.OPERATOR)
    def test_service(self, principal: Principal, cluster: str, name: str, service: str,
                     request: EndpointTest) -> EndpointTestResult:
        """One OpenAI-compatible request to a model service of the pool, through the Kubernetes API's service
        proxy: the answer's ``x-sandbox-pod``-style headers name the pod that served it."""
        if request.via != "service_proxy":
            raise Invalid("a pool's service is cluster-internal: test it with via 'service_proxy'",
                          details={"field": "via"})
        dep = self._find(cluster, name)
        meta = _meta(dep)
        namespace = str(meta.get("namespace"))
        svc = self.inference.cached_service(cluster, namespace, service)
        if svc is None or not pool_service(svc, name):
            raise NotFound(f"the pool {name} has no service {service!r}; inference_pool_assign makes one")
        port = int(((svc.get("spec") or {}).get("ports") or [{}])[0].get("port") or 0)
        model = str((meta.get("annotations") or {}).get(manifest.API_MODEL_ANNOTATION) or "")
        target = testcall.Target(namespace=namespace, service=service, port=port, model=model)
        slots = self.inference.test_calls
        slots.acquire(principal)
        try:
            result = testcall.call(self.inference.kube.api_client(cluster), target, request)
        finally:
            slots.release(principal)
        self.audit.record(principal, "inference.pool.test", inference_target(cluster, name),
                          {"service": service, "api": request.api, "max_tokens": request.max_tokens},
                          f"status {result.status}")
        return result

