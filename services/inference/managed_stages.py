"""The stages of managed endpoint operations (``managed.deploy``, ``managed.update``, ``managed.delete``).

Each observes the custom resource first: apply is server-side apply under our field manager (the same object
twice is one object), ready waits on the operator's own status (``state`` with ``observedGeneration`` at the
applied generation) and fails naming the operator's state and reason, delete removes only the resource it was
asked about (its uid) and waits until the API no longer has it: the operator's Deployment and Service are owned by
it and go with it. The token's Secret becomes the resource's (owner reference), so it goes with it too.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s

from services.clusters.create_base import FIELD_MANAGER
from services.clusters.storage_stage import APPLY
from services.errors import Invalid, NotFound, Permanent, Transient
from services.inference import managed_scaling, tokens
from services.inference.managed_models import EndpointKind, EndpointPlan, EndpointRef
from services.inference.managed_render import GROUP, PLURALS, VERSION
from services.kube import KubeClients
from services.stages import Done, Observed, Stage, StageContext, Wait
from services.training.downloads.manifest import ensure_namespace

POLL = 5.0
JSON_PATCH = "application/json-patch+json"
COMPLETE, FAILED = "DeploymentComplete", "DeploymentFailed"


@dataclass(frozen=True)
class ManagedDeps:
    kube: KubeClients


def _custom(deps: ManagedDeps, cluster: str) -> k8s.CustomObjectsApi:
    return k8s.CustomObjectsApi(deps.kube.api_client(cluster))


def read_endpoint(deps: ManagedDeps, cluster: str, kind: EndpointKind, namespace: str,
                  name: str) -> dict[str, Any] | None:
    try:
        found: Any = _custom(deps, cluster).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURALS[kind], name)
    except NotFound:
        return None
    return dict(found)


class ManagedStage(Stage[EndpointPlan]):
    def __init__(self, deps: ManagedDeps) -> None:
        self.deps = deps


class NamespaceStage(ManagedStage):
    name = "namespace"
    expected_seconds = 5.0

    def observe(self, ctx: StageContext[EndpointPlan]) -> Observed:
        return Observed.DONE if ctx.data.get("made") else Observed.ABSENT

    def act(self, ctx: StageContext[EndpointPlan]) -> None:
        ensure_namespace(self.deps.kube, ctx.request.cluster, ctx.request.namespace)
        ctx.data["made"] = True

    def result(self, ctx: StageContext[EndpointPlan]) -> dict[str, Any]:
        return {"namespace": ctx.request.namespace}


class ApplyStage(ManagedStage):
    """Server-side apply of the custom resource, then a JSON patch removing the triggers it dropped that another
    field manager wrote (apply keeps those); the token's Secret becomes the resource's."""

    name = "apply"
    expected_seconds = 2.0

    def observe(self, ctx: StageContext[EndpointPlan]) -> Observed:
        return Observed.DONE if ctx.data.get("generation") else Observed.ABSENT

    def act(self, ctx: StageContext[EndpointPlan]) -> None:
        plan = ctx.request
        _custom(self.deps, plan.cluster).patch_namespaced_custom_object(
            GROUP, VERSION, plan.namespace, PLURALS[plan.kind], plan.name, plan.manifest,
            field_manager=FIELD_MANAGER, force=True, _content_type=APPLY)
        # the client does not decode an apply's answer for custom objects: read what the API server now holds
        applied = read_endpoint(self.deps, plan.cluster, plan.kind, plan.namespace, plan.name)
        if applied is None:
            raise Permanent(f"the {plan.kind.value} {plan.namespace}/{plan.name} was deleted as it was applied")
        stale = managed_scaling.leftover(dict(applied.get("spec") or {}), dict(plan.manifest.get("spec") or {}))
        if stale:
            applied = self._remove(plan, applied, stale)
        meta = applied["metadata"]
        if plan.token is not None:
            owner = {"apiVersion": f"{GROUP}/{VERSION}", "kind": plan.kind.value, "name": plan.name,
                     "uid": str(meta["uid"]), "blockOwnerDeletion": False}
            core = k8s.CoreV1Api(self.deps.kube.api_client(plan.cluster))
            try:
                current = core.patch_namespaced_secret(plan.token.name, plan.namespace,
                                                       {"metadata": {"ownerReferences": [owner]}})
            except NotFound:
                raise Permanent(f"the token Secret {plan.namespace}/{plan.token.name} is gone: deploy again with "
                                "the token") from None
            tokens.delete_older(self.deps.kube, plan.cluster, plan.namespace, plan.name, current)
        ctx.data["generation"] = int(meta.get("generation") or 1)

    def _remove(self, plan: EndpointPlan, applied: dict[str, Any], keys: list[str]) -> dict[str, Any]:
        """JSON-patch out the triggers the update removed that another field manager wrote, only on the object
        just read (a ``test`` of its resourceVersion: a write in between retries the stage, which applies again)."""
        ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": applied["metadata"]["resourceVersion"]},
               *({"op": "remove", "path": f"/spec/autoScalingSpec/{key}"} for key in keys)]
        try:
            _custom(self.deps, plan.cluster).patch_namespaced_custom_object(
                GROUP, VERSION, plan.namespace, PLURALS[plan.kind], plan.name, ops, _content_type=JSON_PATCH)
        except Invalid as exc:
            raise Transient(f"the {plan.kind.value} {plan.namespace}/{plan.name} changed while its removed triggers "
                            f"({', '.join(keys)}) were taken out: applying again") from exc
        after = read_endpoint(self.deps, plan.cluster, plan.kind, plan.namespace, plan.name)
        if after is None:
            raise Permanent(f"the {plan.kind.value} {plan.namespace}/{plan.name} was deleted as it was applied")
        return after

    def result(self, ctx: StageContext[EndpointPlan]) -> dict[str, Any]:
        plan = ctx.request
        return {"resource": f"{plan.kind.value} {plan.namespace}/{plan.name}", "generation": ctx.data.get("generation")}


class ReadyStage(ManagedStage):
    """Wait until the operator says ``DeploymentComplete`` for the applied generation; fail on
    ``DeploymentFailed`` naming its reason."""

    name = "ready"
    expected_seconds = 600.0  # the operator fetches the weights and the server loads them
    deadline = 2 * 3600.0

    def observe(self, ctx: StageContext[EndpointPlan]) -> Observed:
        return Observed.IN_PROGRESS

    def poll(self, ctx: StageContext[EndpointPlan]) -> Done | Wait:
        plan = ctx.request
        found = read_endpoint(self.deps, plan.cluster, plan.kind, plan.namespace, plan.name)
        if found is None:
            raise Permanent(f"the {plan.kind.value} {plan.namespace}/{plan.name} was deleted while it deployed")
        status = found.get("status") or {}
        generation = int(found["metadata"].get("generation") or 1)
        state = str(status.get("state") or "DeploymentPending")
        detail = status.get("deploymentStatus") or {}
        message = str(detail.get("message") or "")
        ctx.data["state"] = state
        if int(status.get("observedGeneration") or 0) < generation:
            return Wait(POLL, f"{plan.name}: waiting for the inference operator to see generation {generation}")
        if state == FAILED:
            reason = detail.get("reason") or next((c.get("reason") for c in status.get("conditions") or []
                                                   if c.get("type") == FAILED and c.get("status") == "True"), None)
            raise Permanent(f"{plan.name}: the inference operator says {state} ({reason or 'no reason'}): "
                            f"{message or 'no message'}", details={"state": state, "reason": reason})
        if state == COMPLETE:
            return Done(f"{plan.name}: {message or state}")
        return Wait(POLL, f"{plan.name}: {state}" + (f": {message}" if message else ""))

    def result(self, ctx: StageContext[EndpointPlan]) -> dict[str, Any]:
        return {"state": ctx.data.get("state")}


class DeleteStage(Stage[EndpointRef]):
    """Delete the resource asked about (its uid); wait until it is gone (what the operator made goes with it)."""

    name = "delete"
    expected_seconds = 30.0

    def __init__(self, deps: ManagedDeps) -> None:
        self.deps = deps

    def _present(self, ref: EndpointRef) -> bool:
        found = read_endpoint(self.deps, ref.cluster, ref.kind, ref.namespace, ref.name)
        return found is not None and str(found["metadata"].get("uid")) == ref.uid

    def observe(self, ctx: StageContext[EndpointRef]) -> Observed:
        if ctx.data.get("deleted"):
            return Observed.IN_PROGRESS
        return Observed.ABSENT if self._present(ctx.request) else Observed.DONE

    def act(self, ctx: StageContext[EndpointRef]) -> None:
        ref = ctx.request
        with contextlib.suppress(NotFound):
            _custom(self.deps, ref.cluster).delete_namespaced_custom_object(
                GROUP, VERSION, ref.namespace, PLURALS[ref.kind], ref.name, propagation_policy="Background",
                body=k8s.V1DeleteOptions(preconditions=k8s.V1Preconditions(uid=ref.uid)))
        tokens.delete_all(self.deps.kube, ref.cluster, ref.namespace, ref.name)  # owned, or left by a crash
        ctx.data["deleted"] = True

    def poll(self, ctx: StageContext[EndpointRef]) -> Done | Wait:
        ref = ctx.request
        if self._present(ref):
            return Wait(2.0, f"waiting for the {ref.kind.value} {ref.namespace}/{ref.name} to go (the operator's "
                             "finalizer deletes what it made first)")
        return Done(f"{ref.kind.value} {ref.namespace}/{ref.name} deleted")

    def result(self, ctx: StageContext[EndpointRef]) -> dict[str, Any]:
        return {"deleted": f"{ctx.request.namespace}/{ctx.request.name}"}
