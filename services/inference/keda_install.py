"""KEDA from the component registry, shared by the two inference paths that scale on metrics: a self-managed
deployment's ScaledObject (``scaling.py``) and a managed endpoint's triggers (``managed.py``; the inference
operator renders the ScaledObject, any KEDA scales it).

:func:`other_keda` finds a KEDA that is not ours by the objects every KEDA needs cluster-wide (its CRDs, the external
metrics APIService) and the rest of our KEDA's names, whoever owns them; nothing is ever applied over such objects.
Self-managed scaling refuses one (:func:`check_no_other_keda`, 409 before any operation row); a managed endpoint's
triggers use one that serves ScaledObjects as it is and install nothing (``managed.py``). :func:`missing` names the
components an operation would install, so a submit plans its ``components`` stage only when one is missing;
:class:`ComponentsStage` reconciles them: it observes each and applies only what is missing or changed (a second
operation finds them and writes nothing; objects someone else installed meanwhile fail it), then waits until they
are settled (KEDA's CRDs established, its external metrics APIService Available).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import yaml

from services.aws import AwsClients
from services.clusters.create_base import cluster_tags
from services.clusters.registry import ClusterRegistry
from services.components import Target, kubeapi
from services.components.families import KEDA
from services.components.manifests import MANAGED_LABEL, OURS, Manifests
from services.errors import Conflict, NotFound, Permanent
from services.kube import KubeClients
from services.models import RequestModel
from services.stages import Done, Observed, Stage, StageContext, Wait

__all__ = ["INFERENCE_ADDON", "ComponentsStage", "OtherKeda", "check_no_other_keda", "cluster_target", "missing",
           "other_keda"]
INFERENCE_ADDON = "amazon-sagemaker-hyperpod-inference"
SCALED_OBJECTS = "scaledobjects.keda.sh"
POLL = 2.0
R = TypeVar("R", bound=RequestModel)


def cluster_target(registry: ClusterRegistry, aws: AwsClients, kube: KubeClients, cluster: str) -> Target:
    """The registry's cluster as a component target (its EKS cluster, region, account and API client)."""
    record = registry.get(cluster)
    return Target(cluster=record.name, eks_cluster=record.eks_name, region=record.region,
                  account=record.eks_arn.split(":")[4], tags=cluster_tags(record.name), aws=aws,
                  kube=kube.api_client(record.name))


@dataclass(frozen=True)
class OtherKeda:
    """A KEDA InstantStart did not install: who runs it, which objects of our KEDA's names it holds, whether it
    serves ScaledObjects (its ``scaledobjects.keda.sh`` CRD is there, or it is the add-on's bundled copy) and
    whether it is that copy."""

    who: str
    objects: tuple[str, ...]
    serves: bool
    bundled: bool = False


def other_keda(target: Target) -> OtherKeda | None:
    """Any KEDA on the cluster that is not ours, found by what every KEDA needs cluster-wide whoever installed it
    and wherever it runs — the ``keda.sh`` CRDs and the one ``v1beta1.external.metrics.k8s.io`` APIService — and
    by every other object of our KEDA's names, not by one Deployment's name (a Helm chart, or the inference
    operator's chart, runs it in ``kube-system`` or ``hyperpod-inference-system``): an object without our label
    is someone else's, and applying ours over it would take their KEDA over. The inference operator add-on's
    bundled copy counts too while its configuration leaves ``keda.enabled`` on (its objects may not exist yet)."""
    try:
        addon: dict[str, Any] = target.client("eks").describe_addon(
            clusterName=target.eks_cluster, addonName=INFERENCE_ADDON)["addon"]
    except NotFound:
        addon = {}
    values = yaml.safe_load(addon.get("configurationValues") or "{}") if addon else {}
    bundled = bool(addon) and (not isinstance(values, dict) or (values.get("keda") or {}).get("enabled") is not False)
    assert target.kube is not None
    theirs: list[str] = []
    server = ""
    for obj in KEDA.objects(target):
        live = kubeapi.get(target.kube, obj)
        if live is None or (live["metadata"].get("labels") or {}).get(MANAGED_LABEL) == OURS:
            continue
        theirs.append(Manifests.label(obj))
        service = (live.get("spec") or {}).get("service") if obj["kind"] == "APIService" else None
        if service:
            server = f" (its metrics server: Service {service.get('namespace')}/{service.get('name')})"
    if bundled:
        return OtherKeda(f"the bundled KEDA of the inference operator add-on {INFERENCE_ADDON} (configuration "
                         "keda.enabled is not false)", tuple(theirs), True, bundled=True)
    if not theirs:
        return None
    serves = f"CustomResourceDefinition {SCALED_OBJECTS}" in theirs
    return OtherKeda(f"a KEDA that InstantStart did not install{server}", tuple(theirs), serves)


def check_no_other_keda(target: Target) -> None:
    """Self-managed scaling's rule: one KEDA per cluster, ours (409 otherwise). Its ScaledObject queries our
    Prometheus and its view reports our KEDA's version and health, so it neither shares another KEDA nor installs
    ours over one (two operators would fight over the same HPAs and the one external metrics APIService)."""
    other = other_keda(target)
    if other is None:
        return
    if not other.bundled:
        raise Conflict(f"{target.cluster} already runs {other.who}: {', '.join(other.objects)}; InstantStart "
                       "applies nothing over them: remove that KEDA, or scale with it directly",
                       details={"objects": list(other.objects)})
    raise Conflict(f"{target.cluster} runs {other.who}: turn it off in the add-on's configuration (features_update "
                   "sets it so), then set autoscaling", details={"addon": INFERENCE_ADDON})


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
        seen = [(component, component.observe(target)) for component in self.components]
        foreign = [component.name for component, observed in seen if observed.foreign]
        if foreign:  # someone else's install arrived after the submit's check: never apply over it
            raise Permanent(f"objects of {', '.join(foreign)} that InstantStart did not install appeared on "
                            f"{target.cluster} since the submit; nothing was applied over them")
        applied: list[str] = []
        for component, observed in seen:
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
