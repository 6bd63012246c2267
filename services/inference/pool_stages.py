"""The stages only model pools have: ``claim`` (relabel pool pods for a service, or give them back) and ``scale``
(the pool's replicas, never below the pods services hold). A pool's create, rollout and delete are the
self-managed deployment's stages (``stages.py``) over the pool's Deployment.

A claim relabels a pod with a merge patch of ``metadata.labels`` carrying the pod's ``resourceVersion``: the API
server refuses it (409) when the pod changed since it was read, so two claims never take the same pod; the stage
reads the pod again and re-decides. An assign marks each pod it relabels with its operation's id (an
annotation in the same patch), so its give-back finds exactly its own pods on the API. Labels and annotations
are the only fields touched: the pod's containers run on, nothing restarts. The pool's Deployment selects its
pods without ``business``, so a relabelled pod stays its ReplicaSet's. A claimed pod carries
``controller.kubernetes.io/pod-deletion-cost`` so that a scale-in removes unassigned pods first; a released one
loses it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s

from services.clock import Clock
from services.clusters.create_base import FIELD_MANAGER
from services.clusters.storage_stage import APPLY, MANAGED_LABEL
from services.errors import Conflict, NotFound, Permanent, ServiceError, Transient
from services.inference.kobjects import typed_ready as _ready
from services.inference.manifest import INFERENCE_LABEL, POOL_LABEL, PORT_NAME, labels
from services.inference.models import DeploymentPlan
from services.inference.pool_models import BUSINESS, UNASSIGNED, PoolClaim
from services.inference.router_manifest import FOR_ANNOTATION, ROUTER_LABEL, SERVICE_ANNOTATION
from services.inference.stages import InferenceDeps
from services.stages import Observed, Stage, StageContext

SERVICE_LABEL = "instantstart.io/pool-service"
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
#: a claimed pod's deletion cost (unassigned pods have none, i.e. 0, and so go first on scale-in)
CLAIMED_COST = "1000"
#: the assign operation that relabelled a held pod (written in the same patch as the label)
CLAIMED_BY = "instantstart.io/claimed-by"
#: how often a give-back reads and patches a pod that keeps changing under it
UNDO_TRIES = 5


def held_by(labels_: dict[str, str] | None) -> str | None:
    """The service holding a pool pod (None: unassigned)."""
    value = (labels_ or {}).get(BUSINESS)
    return None if value in (None, UNASSIGNED) else value


def at_risk(pods: list[tuple[str, str | None, bool]], replicas: int) -> list[str]:
    """The held pods a scale to ``replicas`` could remove, from ``(name, holder, ready)`` per live pod.

    The ReplicaSet removes unscheduled, Pending and not-Ready pods before it weighs the deletion cost that
    protects claimed pods (``controller.ActivePodsWithRanks``), so when a scale removes any pod, a held pod that
    is not Running and Ready may be the one to go: all such pods are named (none when nothing is removed)."""
    if replicas >= len(pods):
        return []
    return sorted(name for name, holder, ready in pods if holder is not None and not ready)


def left_claimed(stuck: dict[str, str], service: str) -> str:
    """What a give-back says of the pods it could not settle (``stuck``: why, per pod)."""
    return (f"{', '.join(stuck)} could not be given back and may still serve {service} (" + "; ".join(stuck.values())
            + "): release them (inference_pool_release)")


def model_service(claim: PoolClaim) -> dict[str, Any]:
    """The service's Kubernetes Service: the pool's pods labelled ``business=<service>``, owned by the pool's
    Deployment (its delete takes the Service)."""
    owner = {"apiVersion": "apps/v1", "kind": "Deployment", "name": claim.pool, "uid": claim.uid,
             "blockOwnerDeletion": False}
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": claim.service, "namespace": claim.namespace,
                         "labels": {**MANAGED_LABEL, POOL_LABEL: claim.pool, SERVICE_LABEL: claim.service},
                         "ownerReferences": [owner]},
            "spec": {"type": "ClusterIP", "selector": {**labels(claim.pool), BUSINESS: claim.service},
                     "ports": [{"name": PORT_NAME, "port": claim.port, "targetPort": claim.port, "protocol": "TCP"}]}}


def pool_service(svc: dict[str, Any], pool: str) -> bool:
    """A Service this product made for a service of ``pool``."""
    found = (svc.get("metadata") or {}).get("labels") or {}
    return found.get(POOL_LABEL) == pool and SERVICE_LABEL in found \
        and all(found.get(k) == v for k, v in MANAGED_LABEL.items())


class ClaimStage(Stage[PoolClaim]):
    """Assign: apply the service's Service, then relabel each chosen pod ``business=<service>``, marking it
    ``instantstart.io/claimed-by: <operation id>`` in the same patch. Release: relabel the service's chosen pods
    ``business=unassigned`` (dropping the mark), and delete the Service when none is left. Each pod is read,
    judged and patched with its resourceVersion; a pod already as wanted is skipped, so a resumed stage repeats
    nothing (a pod the service holds under this operation's mark is this assign's, even if the stage died before
    it remembered it). A pod that changed between the read and the patch (409) is read and judged again (a
    retry); an assign that then cannot have it (another service holds it, or this service under another claim,
    it is gone or not Ready) fails naming it and gives back the pods it had relabelled, so no partial claim is
    left; :meth:`give_back` does the same for an assign that ends any other way without success."""

    name = "claim"
    expected_seconds = 2.0

    def __init__(self, deps: InferenceDeps, pace: Callable[[], float]) -> None:
        self.deps = deps
        self.pace = pace  # the engine's pace: a give-back's retry delay is scaled like every engine wait

    def observe(self, ctx: StageContext[PoolClaim]) -> Observed:
        return Observed.DONE if ctx.data.get("relabelled") is not None else Observed.ABSENT

    def act(self, ctx: StageContext[PoolClaim]) -> None:
        claim = ctx.request
        core = k8s.CoreV1Api(self.deps.kube.api_client(claim.cluster))
        if not claim.release:
            core.patch_namespaced_service(claim.service, claim.namespace, model_service(claim),
                                          field_manager=FIELD_MANAGER, force=True, _content_type=APPLY)
        else:
            self._check_unfronted(core, claim)
        changed: list[str] = ctx.data.setdefault("changed", [])  # kept across a retry (a 409) and a resume
        try:
            for pod in claim.pods:  # each read again, even one remembered: a give-back may have undone it (a retry)
                if self._relabel(core, claim, pod, ctx.operation_id) and pod not in changed:
                    changed.append(pod)
                    ctx.save()
        except Permanent as exc:
            if claim.release:
                raise
            given, stuck = self._undo(core, claim, ctx.operation_id, changed, ctx.clock)
            said = [f"{', '.join(given)} went back to the pool"] if given else []
            if stuck:
                said.append(left_claimed(stuck, claim.service))
            raise Permanent(f"{exc.message}; " + ("; ".join(said) if stuck else "nothing is assigned: "
                                                  + ("; ".join(said) or "no pod had been relabelled")),
                            details={**exc.details, "given_back": given, "stuck": sorted(stuck)}) from None
        if claim.release:  # all of them (or the rest went meanwhile): the Service goes
            self._drop_service(core, claim)
        ctx.data["relabelled"] = changed

    def _check_unfronted(self, core: k8s.CoreV1Api, claim: PoolClaim) -> None:
        """A release that would leave the service no pod while a router fronts it fails before any patch, on live
        objects (its submit's check read the caches, which may not have seen another release yet)."""
        selector = f"{INFERENCE_LABEL}={claim.pool},{BUSINESS}={claim.service}"
        held: list[Any] = core.list_namespaced_pod(claim.namespace, label_selector=selector).items
        if {str(p.metadata.name) for p in held if p.metadata.deletion_timestamp is None} - set(claim.pods):
            return  # some pods stay the service's
        apps = k8s.AppsV1Api(self.deps.kube.api_client(claim.cluster))
        found: list[Any] = apps.list_namespaced_deployment(claim.namespace).items
        routers = sorted(str(d.metadata.name) for d in found if ROUTER_LABEL in (d.metadata.labels or {})
                         and (d.metadata.annotations or {}).get(FOR_ANNOTATION) == claim.pool
                         and (d.metadata.annotations or {}).get(SERVICE_ANNOTATION) == claim.service)
        if routers:
            raise Permanent(f"the router {routers[0]} fronts the service {claim.service} of the pool {claim.pool} and "
                            "this release would leave it no pod: delete the router first (inference_routers_delete "
                            f"{routers[0]}), or release fewer pods", details={"routers": routers})

    def give_back(self, operation_id: str, claim: PoolClaim, clock: Clock) -> None:
        """An assign that ended without success (its retry budget or deadline spent, a bug, a cancel) gives back
        the pods it marked, read from the API: no partial claim is left. Raises naming the pods it could not."""
        core = k8s.CoreV1Api(self.deps.kube.api_client(claim.cluster))
        _, stuck = self._undo(core, claim, operation_id, [], clock)
        if stuck:
            raise Permanent(left_claimed(stuck, claim.service), details={"stuck": sorted(stuck),
                                                                         "service": claim.service})

    def _undo(self, core: k8s.CoreV1Api, claim: PoolClaim, operation_id: str, changed: list[str],
              clock: Clock) -> tuple[list[str], dict[str, str]]:
        """Give back the pods the assign relabelled (those it remembers and those the service holds under its
        mark, each checked on a fresh read with its resourceVersion), past any pod it cannot settle; the Service
        goes when no pod of the service is left: an assign is all or nothing. Returns the pods given back and,
        per pod left claimed, why."""
        back = PoolClaim(**{**claim.model_dump(), "release": True})
        selector = f"{INFERENCE_LABEL}={claim.pool},{BUSINESS}={claim.service}"
        held: list[Any] = core.list_namespaced_pod(claim.namespace, label_selector=selector).items
        marked = [str(p.metadata.name) for p in held if (p.metadata.annotations or {}).get(CLAIMED_BY) == operation_id]
        given: list[str] = []
        stuck: dict[str, str] = {}
        for pod in dict.fromkeys([*changed, *marked]):
            for attempt in range(UNDO_TRIES):  # a pod changing under the undo: read it again, after its delay
                try:
                    if self._relabel(core, back, pod, operation_id):
                        given.append(pod)
                    break
                except Transient as exc:
                    if attempt + 1 == UNDO_TRIES:
                        stuck[pod] = f"{pod} kept changing"
                    else:
                        clock.wait(threading.Event(), exc.delay * self.pace())
                except ServiceError as exc:
                    stuck[pod] = exc.message
                    break
        self._drop_service(core, claim)
        return given, stuck

    def _relabel(self, core: k8s.CoreV1Api, claim: PoolClaim, name: str, operation_id: str) -> bool:
        """Relabel one pod unless it already is as wanted; False when nothing had to change (an assign: True
        for a pod the service holds under this operation's mark, which this assign relabelled)."""
        try:
            pod: Any = core.read_namespaced_pod(name, claim.namespace)
        except NotFound:
            if claim.release:  # gone: it holds nothing any more
                return False
            raise Permanent(f"the pool pod {name} is gone: assign again to pick another",
                            details={"pod": name}) from None
        found = dict(pod.metadata.labels or {})
        if found.get(INFERENCE_LABEL) != claim.pool or pod.metadata.deletion_timestamp is not None:
            if claim.release:  # terminating or no longer the pool's: it holds nothing any more
                return False
            raise Permanent(f"{name} is not a live pod of the pool {claim.pool}", details={"pod": name})
        holder = held_by(found)
        if claim.release:
            if holder != claim.service:
                return False
            patch: dict[str, Any] = {"labels": {BUSINESS: UNASSIGNED},
                                     "annotations": {DELETION_COST: None, CLAIMED_BY: None}}
        else:
            if holder == claim.service:
                if (pod.metadata.annotations or {}).get(CLAIMED_BY) == operation_id:
                    return True  # relabelled by this assign before a crash let it remember so
                raise Permanent(f"{name} already serves {holder}: it was taken meanwhile; assign again to pick "
                                "another", details={"pod": name, "service": holder})
            if holder is not None:
                raise Permanent(f"{name} is held by the service {holder} now: release it first, or assign again",
                                details={"pod": name, "service": holder})
            if not _ready(pod):
                raise Permanent(f"{name} is not Ready now: assign again to pick a Ready pod", details={"pod": name})
            patch = {"labels": {BUSINESS: claim.service},
                     "annotations": {DELETION_COST: CLAIMED_COST, CLAIMED_BY: operation_id}}
        try:
            core.patch_namespaced_pod(name, claim.namespace,
                                      {"metadata": {**patch, "resourceVersion": pod.metadata.resource_version}})
        except Conflict:  # the pod changed since it was read: read it again and decide again
            raise Transient(f"{name} changed while it was relabelled; trying again", delay=1.0) from None
        return True

    def _drop_service(self, core: k8s.CoreV1Api, claim: PoolClaim) -> None:
        selector = f"{INFERENCE_LABEL}={claim.pool},{BUSINESS}={claim.service}"
        left: list[Any] = core.list_namespaced_pod(claim.namespace, label_selector=selector).items
        if any(p.metadata.deletion_timestamp is None for p in left):
            return  # a pod was given to the service meanwhile: the Service still serves it (a terminating one not)
        with contextlib.suppress(NotFound):
            svc: Any = core.read_namespaced_service(claim.service, claim.namespace)
            if pool_service(core.api_client.sanitize_for_serialization(svc), claim.pool):
                core.delete_namespaced_service(claim.service, claim.namespace, body=k8s.V1DeleteOptions(
                    preconditions=k8s.V1Preconditions(uid=svc.metadata.uid)))

    def result(self, ctx: StageContext[PoolClaim]) -> dict[str, Any]:
        return {"service": ctx.request.service, "relabelled": ctx.data.get("relabelled") or [],
                "released" if ctx.request.release else "assigned": ctx.request.pods}


class ScaleStage(Stage[DeploymentPlan]):
    """The pool's scale subresource, after checking again (on the live pods) that no pod a service holds would
    have to go; the claimed pods' deletion cost makes the ReplicaSet remove unassigned ones first."""

    name = "scale"
    expected_seconds = 2.0

    def __init__(self, deps: InferenceDeps) -> None:
        self.deps = deps

    def observe(self, ctx: StageContext[DeploymentPlan]) -> Observed:
        return Observed.DONE if ctx.data.get("scaled") else Observed.ABSENT

    def act(self, ctx: StageContext[DeploymentPlan]) -> None:
        plan = ctx.request
        core = k8s.CoreV1Api(self.deps.kube.api_client(plan.cluster))
        pods: list[Any] = core.list_namespaced_pod(plan.namespace,
                                                   label_selector=f"{INFERENCE_LABEL}={plan.name}").items
        held = sorted(p.metadata.name for p in pods
                      if p.metadata.deletion_timestamp is None and held_by(p.metadata.labels) is not None)
        if len(held) > plan.replicas:
            raise Permanent(f"services hold {len(held)} pods of {plan.name}, more than {plan.replicas}: release "
                            "some first", details={"held": held})
        live = [p for p in pods if p.metadata.deletion_timestamp is None]
        risky = at_risk([(p.metadata.name, held_by(p.metadata.labels), _ready(p)) for p in live], plan.replicas)
        if risky:
            raise Permanent(f"held pods are not Ready ({', '.join(risky)}): the ReplicaSet removes such pods "
                            "first, so this scale-in could take them; wait until they are Ready or release them",
                            details={"not_ready": risky})
        k8s.AppsV1Api(self.deps.kube.api_client(plan.cluster)).patch_namespaced_deployment_scale(
            plan.name, plan.namespace, {"spec": {"replicas": plan.replicas}})
        ctx.data["scaled"] = True

    def result(self, ctx: StageContext[DeploymentPlan]) -> dict[str, Any]:
        return {"replicas": ctx.request.replicas}
