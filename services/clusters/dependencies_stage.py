"""Stage 4 of ``cluster.create`` (``dependencies``): reconcile every component the plan needs (the registry in
``services/components``: EKS add-ons, the HyperPod dependency chart's pieces, the training and KubeRay
operators, the load balancer controller), then wait until each is settled; and its teardown in
``cluster.delete``.

Settled means applied and not waiting on anything but nodes: the nodes come with the HyperPod stage, so an
add-on DEGRADED only for want of a node, or a DaemonSet with nowhere to run, counts as done here; the verify
stage checks real readiness with :func:`components_health`. Nothing here sleeps: waits are the engine's.
"""

from __future__ import annotations

from typing import Any

from services.clusters.create_base import ClusterDeletePlan, CreateStage, DeleteStage, StageDeps
from services.clusters.create_models import ClusterCreatePlan, ComponentState, DependenciesResult, PlannedResource
from services.components import COMPONENTS, Component, Target, components_for
from services.components.addons import Addon
from services.components.manifests import Manifests
from services.errors import NotFound, Permanent
from services.stages import Done, Observed, StageContext, Wait

POLL_SECONDS = 15.0


def _target(deps: StageDeps, name: str, eks_cluster: str, region: str, account: str, tags: dict[str, str],
            bucket: str | None = None, *, teardown: bool = False) -> Target:
    """Where the components of cluster ``name`` live; ``kube`` is None once its EKS cluster is gone, and, for a
    teardown, while it was never registered (nothing is applied in a cluster before its registry row)."""
    try:
        deps.aws.client("eks", region).describe_cluster(name=eks_cluster)
    except NotFound:
        kube = None
    else:
        try:
            kube = deps.kube.api_client(name)
        except NotFound:
            if not (teardown and deps.registry.find(name) is None):
                raise Permanent(f"the EKS cluster {eks_cluster} exists but is not registered as {name} here, so its "
                                "Kubernetes API cannot be reached; the eks stage registers it") from None
            kube = None
    return Target(cluster=name, eks_cluster=eks_cluster, region=region, account=account, tags=tags, aws=deps.aws,
                  kube=kube, bucket=bucket)


def plan_target(deps: StageDeps, plan: ClusterCreatePlan) -> Target:
    target = _target(deps, plan.name, plan.names.eks_cluster, plan.region, plan.account, plan.tags, plan.bucket)
    if target.kube is None:
        raise Permanent(f"the EKS cluster {plan.names.eks_cluster} is not there; the eks stage makes it")
    return target


def components_health(deps: StageDeps, plan: ClusterCreatePlan) -> list[ComponentState]:
    """Every component of ``plan`` as it is now (``healthy``: ready to serve), for the verify stage."""
    target = plan_target(deps, plan)
    return [c.state(c.observe(target)) for c in components_for(plan)]


class DependenciesStage(CreateStage):
    name = "dependencies"
    expected_seconds = 300.0

    def resources(self, plan: ClusterCreatePlan) -> list[PlannedResource]:
        out = []
        for c in components_for(plan):
            out.append(PlannedResource(stage=self.name, type=c.resource_type, name=c.name, action="apply",
                                       detail=f"version {c.version}"))
            identity = c.identity if isinstance(c, Addon | Manifests) else None
            if identity is not None:
                out.append(PlannedResource(stage=self.name, type="AWS::IAM::Role", name=f"{plan.name}-"
                                           f"{identity.suffix}", detail=f"EKS Pod Identity for {identity.namespace}/"
                                                                        f"{identity.service_account}"))
        return out

    def _pass(self, ctx: StageContext[ClusterCreatePlan]) -> tuple[Target, list[tuple[Component, Any]]]:
        target = plan_target(self.deps, ctx.request)
        return target, [(c, c.observe(target)) for c in components_for(ctx.request)]

    def observe(self, ctx: StageContext[ClusterCreatePlan]) -> Observed:
        _, observed = self._pass(ctx)
        if any(c.diff(o) for c, o in observed):
            return Observed.ABSENT
        return Observed.DONE if all(o.settled for _, o in observed) else Observed.IN_PROGRESS

    def act(self, ctx: StageContext[ClusterCreatePlan]) -> None:
        target, observed = self._pass(ctx)
        for component, obs in observed:
            if component.diff(obs):
                component.apply(target, obs)

    def poll(self, ctx: StageContext[ClusterCreatePlan]) -> Done | Wait:
        _, observed = self._pass(ctx)
        failed = [o.failed for _, o in observed if o.failed]
        if failed:
            raise Permanent("; ".join(failed))
        gone = [f"{c.name} ({', '.join(c.diff(o))})" for c, o in observed if c.diff(o)]
        if gone:  # applied, then missing: someone removed it; a retry of the stage applies it again
            raise Permanent(f"components went missing after they were applied: {'; '.join(gone)}")
        pending = [f"{c.name} ({o.detail or o.status})" for c, o in observed if not o.settled]
        if pending:
            return Wait(POLL_SECONDS, f"waiting for {len(pending)} component(s): {', '.join(pending)}")
        ctx.data["components"] = [c.state(o).model_dump() for c, o in observed]
        return Done()

    def result(self, ctx: StageContext[ClusterCreatePlan]) -> dict[str, Any]:
        states = ctx.data.get("components")
        if states is None:
            _, observed = self._pass(ctx)
            states = [c.state(o).model_dump() for c, o in observed]
        return DependenciesResult(components=[ComponentState.model_validate(s) for s in states]).model_dump()


class DependenciesTeardown(DeleteStage):
    """Delete the components in reverse install order with the IAM roles and pod identity associations they
    own; only what carries our tags (AWS) or our label (Kubernetes)."""

    name = "dependencies"
    expected_seconds = 120.0

    def _target(self, plan: ClusterDeletePlan) -> Target:
        return _target(self.deps, plan.name, plan.eks_cluster, plan.region, plan.account, {}, teardown=True)

    def _left(self, target: Target) -> list[tuple[Component, Any]]:
        return [(c, c.leftover(target)) for c in reversed(COMPONENTS)]

    def observe(self, ctx: StageContext[ClusterDeletePlan]) -> Observed:
        left = self._left(self._target(ctx.request))
        if any(lo.to_delete for _, lo in left):
            return Observed.ABSENT
        return Observed.DONE if all(lo.gone for _, lo in left) else Observed.IN_PROGRESS

    def act(self, ctx: StageContext[ClusterDeletePlan]) -> None:
        target = self._target(ctx.request)
        deleted: list[str] = list(ctx.data.get("deleted", []))
        for component, left in self._left(target):
            if left.to_delete:
                component.delete(target, left)
                deleted.extend(f"{component.name}: {piece}" for piece in left.to_delete)
        ctx.data["deleted"] = deleted

    def poll(self, ctx: StageContext[ClusterDeletePlan]) -> Done | Wait:
        left = self._left(self._target(ctx.request))
        still = [f"{c.name} ({', '.join(lo.to_delete + lo.going)})" for c, lo in left if not lo.gone]
        if still:
            return Wait(POLL_SECONDS, f"waiting for {len(still)} component(s) to go: {', '.join(still)}")
        return Done()

    def result(self, ctx: StageContext[ClusterDeletePlan]) -> dict[str, Any]:
        return {"deleted": list(ctx.data.get("deleted", []))}
