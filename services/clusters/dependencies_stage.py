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

from services.clusters.create_base import ClusterDeletePlan, CreateStage, DeleteStage, StageDeps, result_of
from services.clusters.create_models import (
    ClusterCreatePlan,
    ComponentState,
    DependenciesResult,
    NetworkResult,
    PlannedResource,
)
from services.components import COMPONENTS, Component, Leftover, Target, components_for, kubeapi
from services.components.addons import Addon
from services.components.families import DEVICE_PLUGINS, LOAD_BALANCER_CONTROLLER
from services.components.manifests import Manifests
from services.errors import NotFound, Permanent
from services.stages import Done, Observed, StageContext, Wait

POLL_SECONDS = 15.0
#: the pieces of a component that use its IAM role: applied only once the role has propagated
USES_ROLE = {"addon", "association"}


def _target(deps: StageDeps, name: str, eks_cluster: str, region: str, account: str, tags: dict[str, str],
            bucket: str | None = None, vpc_id: str = "", *, teardown: bool = False) -> Target:
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
                  kube=kube, bucket=bucket, vpc_id=vpc_id)


def plan_target(deps: StageDeps, plan: ClusterCreatePlan, vpc_id: str) -> Target:
    """Where ``plan``'s components go; ``vpc_id`` is the network stage's VPC."""
    target = _target(deps, plan.name, plan.names.eks_cluster, plan.region, plan.account, plan.tags, plan.bucket,
                     vpc_id)
    if target.kube is None:
        raise Permanent(f"the EKS cluster {plan.names.eks_cluster} is not there; the eks stage makes it")
    return target


def components_health(deps: StageDeps, plan: ClusterCreatePlan, vpc_id: str) -> list[ComponentState]:
    """Every component of ``plan`` as it is now (``healthy``: ready to serve), for the verify stage. A device
    plugin the plan's instance type needs is healthy only with a ready pod on each of the plan's ``count``
    nodes: without it those nodes advertise no GPU, Neuron device or EFA, and nothing asking for one schedules."""
    target = plan_target(deps, plan, vpc_id)
    states = []
    for component in components_for(plan):
        state = component.state(component.observe(target))
        if isinstance(component, Manifests) and component in DEVICE_PLUGINS and state.healthy:
            ready = component.pods_ready(target)
            if ready < plan.count:
                state = state.model_copy(update={
                    "healthy": False, "status": "Applied",
                    "detail": f"{ready}/{plan.count} device plugin pods ready: nodes without one advertise no "
                              "devices"})
        states.append(state)
    return states


class DependenciesStage(CreateStage):
    name = "dependencies"
    expected_seconds = 300.0
    # the IAM propagation wait is measured from the roles' CreateDate, in real seconds: so is the deadline
    deadline = 1800.0
    real_time_deadline = True

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
        target = plan_target(self.deps, ctx.request, result_of(ctx, "network", NetworkResult).vpc_id)
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
        target, observed = self._pass(ctx)
        failed = [o.failed for _, o in observed if o.failed]
        if failed:
            raise Permanent("; ".join(failed))
        # what apply held back while the component's new IAM role propagated (its add-on or association)
        # and the objects whose kinds another component's CRDs serve, until they are served
        deferred = [(c, o) for c, o in observed if isinstance(c, Addon | Manifests) and c.identity is not None
                    and c.diff(o) and set(c.diff(o)) <= USES_ROLE | (
                        c.later(target) if isinstance(c, Manifests) else set())]
        held = {c.name: why for c, _ in deferred if (why := c.blocked(target))}
        ready = [(c, o) for c, o in deferred if c.name not in held]
        if ready:  # their roles have propagated: apply what uses them now
            for component, obs in ready:
                component.apply(target, obs)
            target, observed = self._pass(ctx)
        gone = [f"{c.name} ({', '.join(c.diff(o))})" for c, o in observed if c.diff(o) and c.name not in held]
        if gone:  # applied, then missing: someone removed it; a retry of the stage applies it again
            raise Permanent(f"components went missing after they were applied: {'; '.join(gone)}")
        pending = [f"{name} ({why})" for name, why in held.items()] + [
            f"{c.name} ({o.detail or o.status})" for c, o in observed if not o.settled and c.name not in held]
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
    own; only what carries our tags (AWS) or our label (Kubernetes).

    First every Service of type LoadBalancer and every Ingress of the cluster goes (all namespaces, whoever
    made them): their finalizers are the load balancer controller's, which deletes their AWS load balancers
    and target groups before it lets them go. The controller itself is deleted only once none is left, so no
    load balancer outlives the cluster unseen (the eks and network teardowns could not delete its VPC)."""

    name = "dependencies"
    expected_seconds = 120.0

    def _target(self, plan: ClusterDeletePlan) -> Target:
        return _target(self.deps, plan.name, plan.eks_cluster, plan.region, plan.account, {}, teardown=True)

    @staticmethod
    def _balanced(target: Target) -> Leftover:
        """The cluster's load-balanced Services and Ingresses: to delete, or going (held by a finalizer)."""
        left = Leftover()
        for obj in kubeapi.load_balanced(target.kube) if target.kube is not None else []:
            meta = obj["metadata"]
            label = f"{obj['kind']} {meta.get('namespace')}/{meta['name']}"
            (left.going if meta.get("deletionTimestamp") else left.to_delete).append(label)
        return left

    def _left(self, target: Target) -> list[tuple[Component | None, Leftover]]:
        """What is left, in deletion order; None stands for the load-balanced objects, first."""
        components: list[tuple[Component | None, Leftover]] = [(c, c.leftover(target)) for c in reversed(COMPONENTS)]
        return [(None, self._balanced(target)), *components]

    def _delete(self, ctx: StageContext[ClusterDeletePlan], target: Target) -> None:
        """Delete what is left, except the load balancer controller while a load-balanced object remains."""
        deleted: list[str] = list(ctx.data.get("deleted", []))
        left = self._left(target)
        balanced = left[0][1]
        for component, lo in left:
            if not lo.to_delete or (component is LOAD_BALANCER_CONTROLLER and not balanced.gone):
                continue
            if component is None:
                assert target.kube is not None  # there are load-balanced objects only with a Kubernetes API
                for obj in kubeapi.load_balanced(target.kube):
                    if not obj["metadata"].get("deletionTimestamp"):
                        kubeapi.delete(target.kube, obj)
                deleted.extend(f"load balancers: {piece}" for piece in lo.to_delete)
                continue
            component.delete(target, lo)
            deleted.extend(f"{component.name}: {piece}" for piece in lo.to_delete)
        ctx.data["deleted"] = deleted

    def observe(self, ctx: StageContext[ClusterDeletePlan]) -> Observed:
        left = self._left(self._target(ctx.request))
        if any(lo.to_delete for _, lo in left):
            return Observed.ABSENT
        return Observed.DONE if all(lo.gone for _, lo in left) else Observed.IN_PROGRESS

    def act(self, ctx: StageContext[ClusterDeletePlan]) -> None:
        self._delete(ctx, self._target(ctx.request))

    def poll(self, ctx: StageContext[ClusterDeletePlan]) -> Done | Wait:
        target = self._target(ctx.request)
        left = self._left(target)
        if left[0][1].gone and any(c is LOAD_BALANCER_CONTROLLER and lo.to_delete for c, lo in left):
            self._delete(ctx, target)  # the controller was held back for the load balancers: they are gone now
            left = self._left(target)
        still = [f"{c.name if c is not None else 'load balancers'} ({', '.join(lo.to_delete + lo.going)})"
                 for c, lo in left if not lo.gone]
        if still:
            return Wait(POLL_SECONDS, f"waiting for {len(still)} component(s) to go: {', '.join(still)}")
        return Done()

    def result(self, ctx: StageContext[ClusterDeletePlan]) -> dict[str, Any]:
        return {"deleted": list(ctx.data.get("deleted", []))}
