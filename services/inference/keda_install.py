"""KEDA from the component registry, shared by the two inference paths that scale on metrics: a self-managed
deployment's ScaledObject (``scaling.py``) and a managed endpoint's triggers (``managed.py``; the inference
operator renders the ScaledObject, our KEDA scales it — the operator add-on's bundled copy stays off).

:func:`check_no_other_keda` is the synchronous refusal both run before any operation row (one KEDA per cluster);
:func:`missing` names the components an operation would install, so a submit plans its ``components`` stage only
when one is missing; :class:`ComponentsStage` reconciles them: it observes each and applies only what is missing or
changed (a second operation finds them and writes nothing), then waits until they are settled (KEDA's CRDs
established, its external metrics APIService Available).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import yaml

from services.aws import AwsClients
from services.clusters.create_base import cluster_tags
from services.clusters.registry import ClusterRegistry
from services.components import Target, kubeapi
from services.components.manifests import MANAGED_LABEL, OURS, Manifests
from services.errors import Conflict, NotFound
from services.kube import KubeClients
from services.models import RequestModel
from services.stages import Done, Observed, Stage, StageContext, Wait

__all__ = ["INFERENCE_ADDON", "ComponentsStage", "check_no_other_keda", "cluster_target", "missing"]
INFERENCE_ADDON = "amazon-sagemaker-hyperpod-inference"
KEDA_OPERATOR = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"namespace": "keda",
                                                                               "name": "keda-operator"}}
POLL = 2.0
R = TypeVar("R", bound=RequestModel)


def cluster_target(registry: ClusterRegistry, aws: AwsClients, kube: KubeClients, cluster: str) -> Target:
    """The registry's cluster as a component target (its EKS cluster, region, account and API client)."""
    record = registry.get(cluster)
    return Target(cluster=record.name, eks_cluster=record.eks_name, region=record.region,
                  account=record.eks_arn.split(":")[4], tags=cluster_tags(record.name), aws=aws,
                  kube=kube.api_client(record.name))


def check_no_other_keda(target: Target) -> None:
    """One KEDA per cluster: the inference operator add-on's bundled copy must be off, and no KEDA someone else
    installed may run (two operators would fight over the same HPAs)."""
    try:
        addon: dict[str, Any] = target.client("eks").describe_addon(
            clusterName=target.eks_cluster, addonName=INFERENCE_ADDON)["addon"]
    except NotFound:
        addon = {}
    values = yaml.safe_load(addon.get("configurationValues") or "{}") if addon else {}
    bundled = (values.get("keda") or {}).get("enabled") if isinstance(values, dict) else None
    if addon and bundled is not False:
        raise Conflict(f"the inference operator add-on of {target.cluster} runs its bundled KEDA (configuration "
                       "keda.enabled is not false): turn it off in the add-on's configuration (features_update "
                       "sets it so), then set autoscaling", details={"addon": INFERENCE_ADDON})
    assert target.kube is not None
    live = kubeapi.get(target.kube, KEDA_OPERATOR)
    if live is not None and (live["metadata"].get("labels") or {}).get(MANAGED_LABEL) != OURS:
        raise Conflict(f"{target.cluster} already runs a KEDA that InstantStart did not install (Deployment "
                       "keda/keda-operator): remove it, or scale with it directly",
                       details={"deployment": "keda/keda-operator"})


def missing(target: Target, components: Sequence[Manifests]) -> list[str]:
    """The names of ``components`` the cluster lacks (or runs in another version), in install order."""
    return [c.name for c in components if c.observe(target).missing]


class ComponentsStage(Stage[R]):
    """``components`` installed (once) and settled. ``target`` gives the cluster of the operation's request."""

    name = "components"
    expected_seconds = 60.0
    deadline = 1800.0

    def __init__(self, target: Callable[[R], Target], components: Sequence[Manifests]) -> None:
        self.target = target
        self.components = tuple(components)

    def observe(self, ctx: StageContext[R]) -> Observed:
        if ctx.data.get("applied") is not None:
            return Observed.IN_PROGRESS
        return Observed.ABSENT if missing(self.target(ctx.request), self.components) else Observed.IN_PROGRESS

    def act(self, ctx: StageContext[R]) -> None:
        target = self.target(ctx.request)
        applied: list[str] = []
        for component in self.components:
            observed = component.observe(target)
            if observed.missing:
                component.apply(target, observed)
                applied.append(component.name)
        ctx.data["applied"] = applied

    def poll(self, ctx: StageContext[R]) -> Done | Wait:
        target = self.target(ctx.request)
        waiting = []
        for component in self.components:
            observed = component.observe(target)
            if observed.missing or not observed.settled:
                waiting.append(f"{component.name}: {observed.detail or ', '.join(observed.missing)}")
        if waiting:
            return Wait(POLL, "waiting for " + "; ".join(waiting))
        made = ctx.data.get("applied") or []
        return Done(f"installed {', '.join(made)}" if made
                    else f"{', '.join(c.name for c in self.components)} already installed")

    def result(self, ctx: StageContext[R]) -> dict[str, Any]:
        return {"installed": ctx.data.get("applied") or []}
