"""The operations of self-managed inference: ``inference.deploy`` (namespace → apply → rollout, then
load_balancer for an external Service), ``inference.update`` (apply → rollout) and ``inference.delete`` (delete).

``apply`` sends the stored Deployment and Service with server-side apply under the product's field manager (the
same request twice changes nothing), or, for a replicas-only update, the Deployment's scale subresource; then
gives the request's Hugging Face token Secret to the Deployment as its owner and deletes the older token Secrets
of the name (``tokens.py``). ``rollout`` waits until the Deployment is available
with every replica updated, and fails naming the pods that cannot start and why (their waiting or terminated
reason and their last log line: an engine that rejected a flag, an image that does not pull); a pod the
scheduler cannot place is reported while the stage waits (the stage's deadline ends it). ``load_balancer``
waits until the AWS Load Balancer Controller wrote the NLB's DNS name into the Service's
``status.loadBalancer`` (an external deployment is not reachable before). ``delete`` removes the Service, the
Deployment (only the uid it was asked about; the pods go by owner references) and the token Secrets labelled
for the name, and waits until the Deployment is gone and the Service too (the controller's finalizer deletes
its load balancer, target groups and security group first).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s

from services.clusters.create_base import FIELD_MANAGER
from services.clusters.storage_stage import APPLY
from services.errors import NotFound, Permanent, ServiceError
from services.inference import checks, tokens
from services.inference.manifest import CONTAINER, INFERENCE_LABEL
from services.inference.models import DeploymentPlan, DeploymentRef
from services.kube import KubeClients
from services.stages import Done, Observed, Stage, StageContext, Wait
from services.training.downloads.manifest import ensure_job_namespace, ensure_namespace

POLL = 5.0
HASH_LABEL = "pod-template-hash"
REVISION = "deployment.kubernetes.io/revision"
#: waiting reasons that never resolve by themselves
_STUCK = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CrashLoopBackOff", "CreateContainerConfigError",
          "CreateContainerError"}


@dataclass(frozen=True)
class InferenceDeps:
    kube: KubeClients


def _apps(deps: InferenceDeps, cluster: str) -> k8s.AppsV1Api:
    return k8s.AppsV1Api(deps.kube.api_client(cluster))


def _core(deps: InferenceDeps, cluster: str) -> k8s.CoreV1Api:
    return k8s.CoreV1Api(deps.kube.api_client(cluster))


def read_deployment(deps: InferenceDeps, cluster: str, namespace: str, name: str) -> Any | None:
    try:
        return _apps(deps, cluster).read_namespaced_deployment(name, namespace)
    except NotFound:
        return None


@dataclass(frozen=True)
class Rollout:
    """Where a Deployment read live stands in its rollout."""

    want: int
    updated: int
    available: int
    done: bool


def rollout(dep: Any) -> Rollout:
    """Done once the controller has seen the Deployment's generation and every wanted replica runs the new
    template and is available, with no older replica left."""
    status, want = dep.status, int(dep.spec.replicas if dep.spec.replicas is not None else 1)
    observed = int(status.observed_generation or 0) >= int(dep.metadata.generation or 0)
    updated, available = int(status.updated_replicas or 0), int(status.available_replicas or 0)
    return Rollout(want, updated, available,
                   observed and updated >= want and available >= want and int(status.replicas or 0) <= want)


def pod_troubles(deps: InferenceDeps, cluster: str, namespace: str, name: str) -> tuple[list[str], list[str]]:
    """(pods that cannot start, with why and their last log line; pods the scheduler cannot place, with why), of
    the Deployment's current ReplicaSet only: an old one's crash-looping pods are what an update replaces."""
    core = _core(deps, cluster)
    template_hash = _current_hash(deps, cluster, namespace, name)
    if template_hash is None:  # the controller has not made the new ReplicaSet yet
        return [], []
    selector = f"{INFERENCE_LABEL}={name},{HASH_LABEL}={template_hash}"
    pods: list[Any] = core.list_namespaced_pod(namespace, label_selector=selector).items
    failing: list[str] = []
    waiting: list[str] = []
    for pod in pods:
        status = pod.status
        for cs in (status.container_statuses or []) if status else []:
            reason, said = container_trouble(cs)
            if reason:
                line = _last_line(core, pod)
                failing.append(f"{pod.metadata.name}: {reason}" + (f" ({said})" if said else "")
                               + (f"; its log ends: {line}" if line else ""))
        if status is not None and status.phase == "Pending":
            scheduled = next((c for c in status.conditions or [] if c.type == "PodScheduled"), None)
            if scheduled is not None and scheduled.status == "False" and scheduled.message:
                waiting.append(f"{pod.metadata.name}: {scheduled.message}")
    return failing, waiting


def _current_hash(deps: InferenceDeps, cluster: str, namespace: str, name: str) -> str | None:
    """The ``pod-template-hash`` of the ReplicaSet whose revision is the Deployment's (once the controller has
    seen the Deployment's latest generation)."""
    dep = read_deployment(deps, cluster, namespace, name)
    if dep is None or dep.status is None \
            or int(dep.status.observed_generation or 0) < int(dep.metadata.generation or 0):
        return None
    revision = (dep.metadata.annotations or {}).get(REVISION)
    sets: list[Any] = _apps(deps, cluster).list_namespaced_replica_set(
        namespace, label_selector=f"{INFERENCE_LABEL}={name}").items
    for rs in sets:
        owned = any(o.uid == dep.metadata.uid for o in rs.metadata.owner_references or [])
        if owned and revision is not None and (rs.metadata.annotations or {}).get(REVISION) == revision:
            return str((rs.metadata.labels or {}).get(HASH_LABEL) or "") or None
    return None


def container_trouble(cs: Any) -> tuple[str, str]:
    """Why a container cannot start: a waiting reason that never resolves, a non-zero exit now, or a past
    non-zero exit while it is waiting or not ready now (one OOM kill long ago on a ready container is not)."""
    state, last = cs.state, cs.last_state
    if state is not None and state.waiting is not None and state.waiting.reason in _STUCK:
        return str(state.waiting.reason), str(state.waiting.message or "")
    struggling = (state is not None and state.waiting is not None) or not cs.ready
    for term in (state.terminated if state else None, last.terminated if last and struggling else None):
        if term is not None and (term.exit_code or 0) != 0:
            return f"exited {term.exit_code} ({term.reason or 'Error'})", str(term.message or "")
    return "", ""


def _last_line(core: k8s.CoreV1Api, pod: Any) -> str:
    for previous in (False, True):
        try:
            text = core.read_namespaced_pod_log(pod.metadata.name, pod.metadata.namespace, container=CONTAINER,
                                                tail_lines=5, previous=previous)
        except ServiceError:
            continue
        lines = [line for line in str(text or "").splitlines() if line.strip()]
        if lines:
            return lines[-1][:500]
    return ""


class InferenceStage(Stage[DeploymentPlan]):
    def __init__(self, deps: InferenceDeps) -> None:
        self.deps = deps


class NamespaceStage(InferenceStage):
    """The namespace, and its ``shared-s3`` claim when the cluster has shared storage (the pods mount it)."""

    name = "namespace"
    expected_seconds = 5.0

    def observe(self, ctx: StageContext[DeploymentPlan]) -> Observed:
        return Observed.DONE if ctx.data.get("made") else Observed.ABSENT

    def act(self, ctx: StageContext[DeploymentPlan]) -> None:
        plan = ctx.request
        if _mounts_shared(plan):
            ensure_job_namespace(self.deps.kube, plan.cluster, plan.namespace)
        else:
            ensure_namespace(self.deps.kube, plan.cluster, plan.namespace)
        ctx.data["made"] = True

    def result(self, ctx: StageContext[DeploymentPlan]) -> dict[str, Any]:
        return {"namespace": ctx.request.namespace, "shared_storage": _mounts_shared(ctx.request)}


def _mounts_shared(plan: DeploymentPlan) -> bool:
    volumes = plan.manifests[0]["spec"]["template"]["spec"].get("volumes") or []
    return any("persistentVolumeClaim" in v for v in volumes)


class ApplyStage(InferenceStage):
    """Server-side apply of the Deployment and the Service; the token's Secret becomes the Deployment's."""

    name = "apply"
    expected_seconds = 2.0

    def observe(self, ctx: StageContext[DeploymentPlan]) -> Observed:
        return Observed.DONE if ctx.data.get("applied") else Observed.ABSENT

    def act(self, ctx: StageContext[DeploymentPlan]) -> None:
        plan = ctx.request
        if plan.scale:  # replicas only: the pod template (and so every running engine) stays as it is
            _apps(self.deps, plan.cluster).patch_namespaced_deployment_scale(
                plan.name, plan.namespace, {"spec": {"replicas": plan.replicas}})
            ctx.data["applied"] = True
            return
        applied: Any = _apps(self.deps, plan.cluster).patch_namespaced_deployment(
            plan.name, plan.namespace, plan.manifests[0], field_manager=FIELD_MANAGER, force=True,
            _content_type=APPLY)
        for service in plan.manifests[1:]:  # an update applies the Deployment only
            _core(self.deps, plan.cluster).patch_namespaced_service(
                plan.name, plan.namespace, service, field_manager=FIELD_MANAGER, force=True, _content_type=APPLY)
        if plan.token is not None:
            owner = {"apiVersion": "apps/v1", "kind": "Deployment", "name": plan.name,
                     "uid": str(applied.metadata.uid), "blockOwnerDeletion": False}
            try:
                current = _core(self.deps, plan.cluster).patch_namespaced_secret(
                    plan.token.name, plan.namespace, {"metadata": {"ownerReferences": [owner]}})
            except NotFound:
                raise Permanent(f"the token Secret {plan.namespace}/{plan.token.name} is gone: deploy again with "
                                "the token") from None
            ctx.data["tokens_deleted"] = tokens.delete_older(self.deps.kube, plan.cluster, plan.namespace,
                                                             plan.name, current)
        ctx.data["applied"] = True

    def result(self, ctx: StageContext[DeploymentPlan]) -> dict[str, Any]:
        return {"deployment": f"{ctx.request.namespace}/{ctx.request.name}", "service": ctx.request.exposure.value}


class RolloutStage(InferenceStage):
    """Wait until every replica runs the new template and is available; fail naming pods that cannot start."""

    name = "rollout"
    expected_seconds = 600.0  # pulling a multi-GB engine image and loading the weights
    deadline = 2 * 3600.0

    def observe(self, ctx: StageContext[DeploymentPlan]) -> Observed:
        return Observed.IN_PROGRESS

    def poll(self, ctx: StageContext[DeploymentPlan]) -> Done | Wait:
        plan = ctx.request
        dep = read_deployment(self.deps, plan.cluster, plan.namespace, plan.name)
        if dep is None:
            raise Permanent(f"the Deployment {plan.namespace}/{plan.name} was deleted during its rollout")
        now = rollout(dep)
        want, updated, available = now.want, now.updated, now.available
        ctx.data["available"] = available
        if now.done:
            return Done(f"{plan.name}: {available}/{want} replicas available")
        failing, unplaced = pod_troubles(self.deps, plan.cluster, plan.namespace, plan.name)
        if failing:
            raise Permanent(f"{plan.name} cannot start: " + "; ".join(failing[:5]),
                            details={"pods": failing[:20]})
        stalled = next((c for c in dep.status.conditions or [] if c.type == "Progressing" and c.status == "False"),
                       None)
        if stalled is not None:
            raise Permanent(f"{plan.name} stopped progressing: {stalled.reason}: {stalled.message}")
        if unplaced:
            return Wait(POLL, f"{plan.name}: {available}/{want} available; waiting for a node: {unplaced[0]}")
        return Wait(POLL, f"{plan.name}: {available}/{want} available, {updated}/{want} updated (loading the model)")

    def result(self, ctx: StageContext[DeploymentPlan]) -> dict[str, Any]:
        return {"available": ctx.data.get("available", 0)}


class LoadBalancerStage(InferenceStage):
    """An external Service's load balancer: wait until the controller answers its DNS name in the Service."""

    name = "load_balancer"
    expected_seconds = 180.0  # an NLB is provisioning for a few minutes before its name is published
    deadline = 1800.0

    def observe(self, ctx: StageContext[DeploymentPlan]) -> Observed:
        return Observed.IN_PROGRESS

    def poll(self, ctx: StageContext[DeploymentPlan]) -> Done | Wait:
        plan = ctx.request
        try:
            svc = _core(self.deps, plan.cluster).read_namespaced_service(plan.name, plan.namespace)
        except NotFound:
            raise Permanent(f"the Service {plan.namespace}/{plan.name} was deleted before its load balancer "
                            "was made") from None
        ingress = (svc.status.load_balancer.ingress if svc.status and svc.status.load_balancer else None) or []
        address = next((i.hostname or i.ip for i in ingress if i.hostname or i.ip), None)
        if address:
            ctx.data["address"] = address
            return Done(f"{plan.name}: load balancer {address}")
        return Wait(POLL, f"{plan.name}: waiting for the AWS Load Balancer Controller to make the Service's load "
                          "balancer and publish its DNS name (not reachable from outside the cluster before)")

    def result(self, ctx: StageContext[DeploymentPlan]) -> dict[str, Any]:
        return {"address": ctx.data.get("address")}


class DeleteStage(Stage[DeploymentRef]):
    """Delete the Service and the Deployment it was asked about (its uid), then wait until both are gone (a
    load-balanced Service stays until the controller's finalizer deleted its load balancer)."""

    name = "delete"
    expected_seconds = 30.0

    def __init__(self, deps: InferenceDeps) -> None:
        self.deps = deps

    def observe(self, ctx: StageContext[DeploymentRef]) -> Observed:
        ref = ctx.request
        if ctx.data.get("deleted"):  # sent: the poll waits for the Deployment and the Service to go
            return Observed.IN_PROGRESS
        dep = read_deployment(self.deps, ref.cluster, ref.namespace, ref.name)
        return Observed.DONE if dep is None or str(dep.metadata.uid) != ref.uid else Observed.ABSENT

    def act(self, ctx: StageContext[DeploymentRef]) -> None:
        ref = ctx.request
        with contextlib.suppress(NotFound):  # ours only (by its labels), and only the one just read (its uid)
            core = _core(self.deps, ref.cluster)
            svc: Any = core.read_namespaced_service(ref.name, ref.namespace)
            if checks.ours(core.api_client.sanitize_for_serialization(svc), ref.name):
                core.delete_namespaced_service(ref.name, ref.namespace, body=k8s.V1DeleteOptions(
                    preconditions=k8s.V1Preconditions(uid=svc.metadata.uid)))
        with contextlib.suppress(NotFound):
            _apps(self.deps, ref.cluster).delete_namespaced_deployment(
                ref.name, ref.namespace, propagation_policy="Background",
                body=k8s.V1DeleteOptions(preconditions=k8s.V1Preconditions(uid=ref.uid)))
        tokens.delete_all(self.deps.kube, ref.cluster, ref.namespace, ref.name)  # owned or left by a crash
        ctx.data["deleted"] = True

    def poll(self, ctx: StageContext[DeploymentRef]) -> Done | Wait:
        ref = ctx.request
        dep = read_deployment(self.deps, ref.cluster, ref.namespace, ref.name)
        if dep is not None and str(dep.metadata.uid) == ref.uid:
            return Wait(2.0, f"waiting for the Deployment {ref.namespace}/{ref.name} to go")
        try:
            svc: Any = _core(self.deps, ref.cluster).read_namespaced_service(ref.name, ref.namespace)
        except NotFound:
            return Done(f"{ref.namespace}/{ref.name} deleted")
        if svc.metadata.deletion_timestamp is None:  # not the one we deleted: another made since
            return Done(f"{ref.namespace}/{ref.name} deleted")
        return Wait(2.0, f"waiting for the Service {ref.namespace}/{ref.name} to go (its finalizers: "
                         f"{', '.join(svc.metadata.finalizers or []) or 'none'}; the load balancer controller "
                         "deletes the load balancer first)")

    def result(self, ctx: StageContext[DeploymentRef]) -> dict[str, Any]:
        return {"deleted": f"{ctx.request.namespace}/{ctx.request.name}"}
