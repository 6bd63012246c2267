"""The operations of an SGLang router: ``inference.router.create`` (apply → rollout), ``inference.router.update``
(apply the Deployment → rollout) and ``inference.router.delete`` (delete).

``apply`` sends the stored objects with server-side apply under the product's field manager, in order
(ServiceAccount, Role, RoleBinding, Deployment, Service), so the same request twice changes nothing. ``rollout``
waits until the router's Deployment has its replica updated and available (the router is ready once it has
found a worker), and fails naming a router pod that cannot start and why (an unknown flag, discovery refused).
``delete`` removes the router's Service, Deployment (only the uid it was asked about), RoleBinding, Role and
ServiceAccount, each only when it carries the router's labels; the workers are never touched. It is done only once
none of them is left, so a delete cut short after the Deployment went (or a Deployment deleted out of band) still
removes the rest.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s

from services.clusters.create_base import FIELD_MANAGER
from services.clusters.storage_stage import APPLY
from services.errors import NotFound, Permanent
from services.inference.router_manifest import ROUTER_LABEL
from services.inference.router_models import RouterPlan, RouterRef
from services.inference.stages import InferenceDeps, container_trouble, read_deployment, rollout
from services.stages import Done, Observed, Stage, StageContext, Wait
from services.training.manifests import MANAGED_BY

POLL = 3.0


def _ours(obj: Any, name: str) -> bool:
    found = (obj.metadata.labels or {}) if obj is not None and obj.metadata is not None else {}
    return found.get(MANAGED_BY) == "instantstart" and found.get(ROUTER_LABEL) == name


def _appliers(deps: InferenceDeps, cluster: str) -> dict[str, Callable[..., Any]]:
    api = deps.kube.api_client(cluster)
    core, rbac = k8s.CoreV1Api(api), k8s.RbacAuthorizationV1Api(api)
    return {"ServiceAccount": core.patch_namespaced_service_account, "Role": rbac.patch_namespaced_role,
            "RoleBinding": rbac.patch_namespaced_role_binding,
            "Deployment": k8s.AppsV1Api(api).patch_namespaced_deployment, "Service": core.patch_namespaced_service}


def apply_objects(deps: InferenceDeps, cluster: str, manifests: list[dict[str, Any]], dry_run: bool) -> None:
    appliers = _appliers(deps, cluster)
    extra = {"dry_run": "All"} if dry_run else {}
    for obj in manifests:
        meta = obj["metadata"]
        appliers[obj["kind"]](meta["name"], meta["namespace"], obj, field_manager=FIELD_MANAGER, force=True,
                              _content_type=APPLY, **extra)


class RouterApplyStage(Stage[RouterPlan]):
    name = "apply"
    expected_seconds = 2.0

    def __init__(self, deps: InferenceDeps) -> None:
        self.deps = deps

    def observe(self, ctx: StageContext[RouterPlan]) -> Observed:
        return Observed.DONE if ctx.data.get("applied") else Observed.ABSENT

    def act(self, ctx: StageContext[RouterPlan]) -> None:
        apply_objects(self.deps, ctx.request.cluster, ctx.request.manifests, dry_run=False)
        ctx.data["applied"] = True

    def result(self, ctx: StageContext[RouterPlan]) -> dict[str, Any]:
        return {"applied": [f"{o['kind']}/{o['metadata']['name']}" for o in ctx.request.manifests]}


class RouterRolloutStage(Stage[RouterPlan]):
    name = "rollout"
    expected_seconds = 120.0  # pulling the SGLang image on a node that has not got it
    deadline = 1800.0

    def __init__(self, deps: InferenceDeps) -> None:
        self.deps = deps

    def observe(self, ctx: StageContext[RouterPlan]) -> Observed:
        return Observed.IN_PROGRESS

    def poll(self, ctx: StageContext[RouterPlan]) -> Done | Wait:
        plan = ctx.request
        dep = read_deployment(self.deps, plan.cluster, plan.namespace, plan.name)
        if dep is None:
            raise Permanent(f"the router Deployment {plan.namespace}/{plan.name} was deleted during its rollout")
        now = rollout(dep)
        want, available = now.want, now.available
        if now.done:
            return Done(f"router {plan.name}: {available}/{want} available")
        pods: list[Any] = k8s.CoreV1Api(self.deps.kube.api_client(plan.cluster)).list_namespaced_pod(
            plan.namespace, label_selector=f"{ROUTER_LABEL}={plan.name}").items
        for pod in pods:
            for cs in (pod.status.container_statuses or []) if pod.status else []:
                reason, said = container_trouble(cs)
                if reason and pod.metadata.deletion_timestamp is None:
                    raise Permanent(f"router {plan.name} cannot start: {pod.metadata.name}: {reason}"
                                    + (f" ({said})" if said else ""))
        return Wait(POLL, f"router {plan.name}: {available}/{want} available (it is ready once it has found a "
                          f"worker of {plan.deployment})")


def _others(deps: InferenceDeps, cluster: str) -> list[tuple[str, Callable[..., Any], Callable[..., Any]]]:
    """(kind, read, delete) of a router's objects other than its Deployment, in deletion order."""
    api = deps.kube.api_client(cluster)
    core, rbac = k8s.CoreV1Api(api), k8s.RbacAuthorizationV1Api(api)
    return [("Service", core.read_namespaced_service, core.delete_namespaced_service),
            ("RoleBinding", rbac.read_namespaced_role_binding, rbac.delete_namespaced_role_binding),
            ("Role", rbac.read_namespaced_role, rbac.delete_namespaced_role),
            ("ServiceAccount", core.read_namespaced_service_account, core.delete_namespaced_service_account)]


def leftovers(deps: InferenceDeps, cluster: str, namespace: str, name: str) -> list[str]:
    """The kinds of the router's objects other than its Deployment that are there (read live, ours by labels)."""
    left = []
    for kind, read, _ in _others(deps, cluster):
        with contextlib.suppress(NotFound):
            if _ours(read(name, namespace), name):
                left.append(kind)
    return left


class RouterDeleteStage(Stage[RouterRef]):
    name = "delete"
    expected_seconds = 10.0

    def __init__(self, deps: InferenceDeps) -> None:
        self.deps = deps

    def _left(self, ref: RouterRef) -> bool:
        """Whether the Deployment of that uid, or any other object with the router's labels, is still there."""
        dep = read_deployment(self.deps, ref.cluster, ref.namespace, ref.name) if ref.uid else None
        if dep is not None and str(dep.metadata.uid) == ref.uid:
            return True
        return bool(leftovers(self.deps, ref.cluster, ref.namespace, ref.name))

    def observe(self, ctx: StageContext[RouterRef]) -> Observed:
        if ctx.data.get("deleted"):
            return Observed.IN_PROGRESS
        return Observed.ABSENT if self._left(ctx.request) else Observed.DONE

    def act(self, ctx: StageContext[RouterRef]) -> None:
        ref = ctx.request
        if ref.uid:  # empty: the Deployment was already gone when the delete was asked
            with contextlib.suppress(NotFound):
                k8s.AppsV1Api(self.deps.kube.api_client(ref.cluster)).delete_namespaced_deployment(
                    ref.name, ref.namespace, propagation_policy="Background",
                    body=k8s.V1DeleteOptions(preconditions=k8s.V1Preconditions(uid=ref.uid)))
        for _, read, delete in _others(self.deps, ref.cluster):
            with contextlib.suppress(NotFound):  # ours only (labels), and only the one just read (its uid)
                found: Any = read(ref.name, ref.namespace)
                if _ours(found, ref.name):
                    delete(ref.name, ref.namespace,
                           body=k8s.V1DeleteOptions(preconditions=k8s.V1Preconditions(uid=found.metadata.uid)))
        ctx.data["deleted"] = True

    def poll(self, ctx: StageContext[RouterRef]) -> Done | Wait:
        ref = ctx.request
        dep = read_deployment(self.deps, ref.cluster, ref.namespace, ref.name) if ref.uid else None
        if dep is not None and str(dep.metadata.uid) == ref.uid:
            return Wait(2.0, f"waiting for the router Deployment {ref.namespace}/{ref.name} to go")
        return Done(f"router {ref.namespace}/{ref.name} deleted")

    def result(self, ctx: StageContext[RouterRef]) -> dict[str, Any]:
        return {"deleted": f"{ctx.request.namespace}/{ctx.request.name}"}
