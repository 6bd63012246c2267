"""The stages of ``features.update``: one per touched feature (and per prerequisite turned on with one), each a
reconcile of its component through the component contract (observe → diff → apply → settle, or leftover →
delete → gone).

The kind lists every feature twice: first the removals in reverse install order (dependents go first), then
the reconciles in install order (prerequisites first); the precheck picks the ones a request needs. A stage
whose component already is as wanted answers DONE from its observation, so re-sending the current state runs
every stage without a single AWS or Kubernetes write.
"""

from __future__ import annotations

from typing import Any

from services.aws import AwsClients
from services.clusters.create_base import cluster_tags
from services.components import Component, Leftover, Observation, Target
from services.errors import Permanent
from services.features.models import FeatureChange, FeaturesPlan
from services.features.registry import Feature
from services.kube import KubeClients
from services.stages import Done, Observed, Stage, StageContext, Wait

POLL_SECONDS = 10.0
#: re-applies in a row of pieces that keep going missing before the stage gives up
MAX_REAPPLY = 5
REMOVE = "remove-"


def plan_target(plan: FeaturesPlan, aws: AwsClients, kube: KubeClients) -> Target:
    return Target(cluster=plan.cluster, eks_cluster=plan.eks_cluster, region=plan.region, account=plan.account,
                  tags=cluster_tags(plan.cluster), aws=aws, kube=kube.api_client(plan.cluster), bucket=plan.bucket,
                  vpc_id=plan.vpc_id, hyperpod_arn=plan.hyperpod_arn, hyperpod_cluster=plan.hyperpod_cluster)


def configured(feature: Feature, change: FeatureChange | None) -> Component:
    """The feature's component reconciling toward the change's settings (validated by the precheck)."""
    model = feature.component.settings_model
    if model is None or change is None or change.settings is None:
        return feature.component
    return feature.component.configured(model.model_validate(change.settings))


def _change(ctx: StageContext[FeaturesPlan], feature: Feature, enabled: bool) -> FeatureChange:
    for change in ctx.request.changes:
        if change.feature == feature.name and change.enabled is enabled:
            return change
    raise Permanent(f"stage for feature {feature.name} has no change in its request; this is a bug")


class EnableStage(Stage[FeaturesPlan]):
    """Turn one feature on (or reconcile its settings): a component someone else installed is used as it is,
    unless the request adopts it."""

    deadline = 1800.0
    real_time_deadline = True  # the IAM propagation wait is measured in real seconds

    def __init__(self, feature: Feature, aws: AwsClients, kube: KubeClients) -> None:
        self.feature = feature
        self.name = feature.name
        self._aws = aws
        self._kube = kube

    def _look(self, ctx: StageContext[FeaturesPlan]) -> tuple[Target, Component, Observation, FeatureChange]:
        change = _change(ctx, self.feature, True)
        target = plan_target(ctx.request, self._aws, self._kube)
        component = configured(self.feature, change)
        return target, component, component.observe(target), change

    def observe(self, ctx: StageContext[FeaturesPlan]) -> Observed:
        _, component, obs, change = self._look(ctx)
        if obs.failed:
            raise Permanent(obs.failed)
        if obs.foreign:
            return Observed.ABSENT if change.adopt else Observed.DONE
        if component.diff(obs):
            return Observed.ABSENT
        return Observed.DONE if obs.settled else Observed.IN_PROGRESS

    def act(self, ctx: StageContext[FeaturesPlan]) -> None:
        target, component, obs, change = self._look(ctx)
        done: list[str] = list(ctx.data.get("did", []))
        if obs.foreign and change.adopt:
            component.adopt(target, obs)
            done.append("adopted")
            obs = component.observe(target)
        pieces = component.diff(obs)
        if pieces:
            component.apply(target, obs)
            done.append(f"applied {', '.join(pieces)}")
        ctx.data["did"] = done

    def poll(self, ctx: StageContext[FeaturesPlan]) -> Done | Wait:
        target, component, obs, _ = self._look(ctx)
        if obs.failed:
            raise Permanent(obs.failed)
        pieces = component.diff(obs)
        if pieces and not obs.foreign:
            held = component.blocked(target)
            if held:
                return Wait(POLL_SECONDS, held)
            applies = int(ctx.data.get("reapplied", 0)) + 1
            if applies > MAX_REAPPLY:
                raise Permanent(f"{self.feature.name}: {', '.join(pieces)} keep going missing after they are applied")
            ctx.data["reapplied"] = applies
            component.apply(target, obs)  # what apply held back for the role to propagate, or what went missing
            return Wait(POLL_SECONDS, f"applied {', '.join(pieces)}")
        ctx.data["reapplied"] = 0
        if not obs.settled:
            return Wait(POLL_SECONDS, f"waiting for {component.name}: {obs.detail or obs.status}")
        ctx.data["state"] = component.state(obs).model_dump()
        return Done(f"{component.name} is {obs.status}")

    def result(self, ctx: StageContext[FeaturesPlan]) -> dict[str, Any]:
        state = ctx.data.get("state")
        if state is None:
            _, component, obs, _ = self._look(ctx)
            state = component.state(obs).model_dump()
            if obs.foreign:
                state["detail"] = "installed by someone else: used as it is (adopt to manage it)"
        return {"feature": self.feature.name, "enabled": True, "changed": bool(ctx.data.get("did")),
                "did": list(ctx.data.get("did", [])), "component": state}


class DisableStage(Stage[FeaturesPlan]):
    """Turn one feature off: delete what of it is ours (tag or label), then wait until it is gone."""

    deadline = 1800.0

    def __init__(self, feature: Feature, aws: AwsClients, kube: KubeClients) -> None:
        self.feature = feature
        self.name = REMOVE + feature.name
        self._aws = aws
        self._kube = kube

    def _left(self, ctx: StageContext[FeaturesPlan]) -> tuple[Target, Leftover]:
        target = plan_target(ctx.request, self._aws, self._kube)
        return target, self.feature.component.leftover(target)

    def observe(self, ctx: StageContext[FeaturesPlan]) -> Observed:
        _, left = self._left(ctx)
        if left.to_delete:
            return Observed.ABSENT
        return Observed.DONE if left.gone else Observed.IN_PROGRESS

    def act(self, ctx: StageContext[FeaturesPlan]) -> None:
        target, left = self._left(ctx)
        self.feature.component.delete(target, left)
        ctx.data["deleted"] = [*ctx.data.get("deleted", []), *left.to_delete]

    def poll(self, ctx: StageContext[FeaturesPlan]) -> Done | Wait:
        target, left = self._left(ctx)
        if left.to_delete:  # a piece that could go only once another had (a role after its add-on)
            self.feature.component.delete(target, left)
            ctx.data["deleted"] = [*ctx.data.get("deleted", []), *left.to_delete]
            return Wait(POLL_SECONDS, f"deleting {', '.join(left.to_delete)}")
        if left.going:
            return Wait(POLL_SECONDS, f"waiting for {', '.join(left.going)} to go")
        return Done(f"{self.feature.component.name} removed")

    def result(self, ctx: StageContext[FeaturesPlan]) -> dict[str, Any]:
        deleted = list(ctx.data.get("deleted", []))
        return {"feature": self.feature.name, "enabled": False, "changed": bool(deleted), "deleted": deleted}


def feature_stages(features: tuple[Feature, ...], aws: AwsClients, kube: KubeClients) -> tuple[Stage[Any], ...]:
    """Every stage the kind may run, in the order it runs them: removals dependents first, then reconciles
    prerequisites first."""
    removals: list[Stage[Any]] = [DisableStage(f, aws, kube) for f in reversed(features)]
    reconciles: list[Stage[Any]] = [EnableStage(f, aws, kube) for f in features]
    return (*removals, *reconciles)
