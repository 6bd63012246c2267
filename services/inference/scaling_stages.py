"""The operations of inference autoscaling: ``inference.scaling.set`` (components → scaled_object → ready) and
``inference.scaling.remove`` (delete).

``components`` (``keda_install.ComponentsStage``, shared with managed endpoints) reconciles the registry's KEDA and
Prometheus (``services/components/families.py`` ``ON_USE``) on the cluster. ``scaled_object`` applies the
ScaledObject server-side unless the live one carries the same digest. ``ready`` waits for KEDA's ``Ready`` condition
and for KEDA's HPA to follow the applied spec (bounds, one metric per trigger with its threshold: after a re-set,
``Ready`` alone may still be the previous spec's), and fails with KEDA's reason when it refused the object.
``delete`` removes the ScaledObject it was asked about (its uid); KEDA's HPA goes with it (owner reference) and the
Deployment keeps the replicas it had.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s

from services.aws import AwsClients
from services.clusters.create_base import FIELD_MANAGER, cluster_tags
from services.components import Target
from services.errors import NotFound, Permanent
from services.inference import scaledobject
from services.inference.scaling_models import ScalingPlan, ScalingRef
from services.kube import KubeClients
from services.stages import Done, Observed, Stage, StageContext, Wait

POLL = 2.0


@dataclass(frozen=True)
class ScalingDeps:
    aws: AwsClients
    kube: KubeClients

    def target(self, plan: ScalingPlan) -> Target:
        return Target(cluster=plan.cluster, eks_cluster=plan.eks_cluster, region=plan.region, account=plan.account,
                      tags=cluster_tags(plan.cluster), aws=self.aws, kube=self.kube.api_client(plan.cluster))


class ScaledObjectStage(Stage[ScalingPlan]):
    """Server-side apply of the ScaledObject, unless the live one is the same."""

    name = "scaled_object"
    expected_seconds = 2.0

    def __init__(self, deps: ScalingDeps) -> None:
        self.deps = deps

    def observe(self, ctx: StageContext[ScalingPlan]) -> Observed:
        plan = ctx.request
        live = scaledobject.read(self.deps.kube.api_client(plan.cluster), plan.namespace, plan.name)
        wanted = plan.scaled_object["metadata"]["annotations"][scaledobject.APPLIED]
        same = live is not None and (live["metadata"].get("annotations") or {}).get(scaledobject.APPLIED) == wanted
        return Observed.DONE if same else Observed.ABSENT

    def act(self, ctx: StageContext[ScalingPlan]) -> None:
        plan = ctx.request
        k8s.CustomObjectsApi(self.deps.kube.api_client(plan.cluster)).patch_namespaced_custom_object(
            scaledobject.GROUP, scaledobject.VERSION, plan.namespace, scaledobject.PLURAL, plan.name,
            plan.scaled_object, field_manager=FIELD_MANAGER, force=True, _content_type="application/apply-patch+yaml")

    def result(self, ctx: StageContext[ScalingPlan]) -> dict[str, Any]:
        return {"scaled_object": f"{ctx.request.namespace}/{ctx.request.name}"}


class ReadyStage(Stage[ScalingPlan]):
    """KEDA accepted the ScaledObject (``Ready=True``) and its HPA follows the applied spec."""

    name = "ready"
    expected_seconds = 5.0
    deadline = 600.0

    def __init__(self, deps: ScalingDeps) -> None:
        self.deps = deps

    def observe(self, ctx: StageContext[ScalingPlan]) -> Observed:
        return Observed.IN_PROGRESS

    def poll(self, ctx: StageContext[ScalingPlan]) -> Done | Wait:
        plan = ctx.request
        live = scaledobject.read(self.deps.kube.api_client(plan.cluster), plan.namespace, plan.name)
        if live is None:
            raise Permanent(f"the ScaledObject {plan.namespace}/{plan.name} was deleted before KEDA accepted it")
        ready = scaledobject.condition(live, "Ready")
        if ready is not None and ready.get("status") == "True":
            hpa_name = str((live.get("status") or {}).get("hpaName") or f"keda-hpa-{plan.name}")
            lag = scaledobject.hpa_lag(plan.scaled_object, self._hpa(plan, hpa_name))
            if lag:  # Ready may still be the previous spec's: wait until KEDA's HPA follows the new one
                return Wait(POLL, f"waiting for KEDA to apply the ScaledObject {plan.name} to its HPA ({lag})")
            return Done(f"{plan.name}: KEDA scales it with HPA {hpa_name}")
        if ready is not None and ready.get("status") == "False":
            raise Permanent(f"KEDA refused the ScaledObject {plan.name}: {ready.get('reason')}: "
                            f"{ready.get('message')}")
        return Wait(POLL, f"waiting for KEDA to accept the ScaledObject {plan.name}")


    def _hpa(self, plan: ScalingPlan, name: str) -> dict[str, Any] | None:
        api = self.deps.kube.api_client(plan.cluster)
        try:
            hpa = k8s.AutoscalingV2Api(api).read_namespaced_horizontal_pod_autoscaler(name, plan.namespace)
        except NotFound:
            return None
        found: dict[str, Any] = api.sanitize_for_serialization(hpa)  # type: ignore[no-untyped-call]
        return found


class RemoveStage(Stage[ScalingRef]):
    """Delete the ScaledObject asked about (its uid) and wait until it is gone."""

    name = "delete"
    expected_seconds = 5.0

    def __init__(self, deps: ScalingDeps) -> None:
        self.deps = deps

    def _live(self, ref: ScalingRef) -> dict[str, Any] | None:
        live = scaledobject.read(self.deps.kube.api_client(ref.cluster), ref.namespace, ref.name)
        return live if live is not None and live["metadata"].get("uid") == ref.uid else None

    def observe(self, ctx: StageContext[ScalingRef]) -> Observed:
        if ctx.data.get("deleted"):
            return Observed.IN_PROGRESS
        return Observed.DONE if self._live(ctx.request) is None else Observed.ABSENT

    def act(self, ctx: StageContext[ScalingRef]) -> None:
        ref = ctx.request
        with contextlib.suppress(NotFound):
            k8s.CustomObjectsApi(self.deps.kube.api_client(ref.cluster)).delete_namespaced_custom_object(
                scaledobject.GROUP, scaledobject.VERSION, ref.namespace, scaledobject.PLURAL, ref.name,
                body=k8s.V1DeleteOptions(preconditions=k8s.V1Preconditions(uid=ref.uid)))
        ctx.data["deleted"] = True

    def poll(self, ctx: StageContext[ScalingRef]) -> Done | Wait:
        if self._live(ctx.request) is None:
            return Done(f"autoscaling of {ctx.request.name} removed")
        return Wait(POLL, f"waiting for the ScaledObject {ctx.request.name} to go")

    def result(self, ctx: StageContext[ScalingRef]) -> dict[str, Any]:
        return {"removed": f"{ctx.request.namespace}/{ctx.request.name}"}
