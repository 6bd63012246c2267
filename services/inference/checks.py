"""Prechecks of a self-managed deployment: pure functions over the request and facts already read, raised before
any operation row (and, for the request-only ones, before any call to the cluster)."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import Any

from services.errors import Conflict, Invalid
from services.inference.command import ServeCommand
from services.inference.kobjects import labels as _labels
from services.inference.manifest import INFERENCE_LABEL, POOL_LABEL
from services.inference.models import Exposure, ServiceSpec
from services.training.manifests import MANAGED_BY, InstanceFacts

OPEN = {"0.0.0.0/0"}
#: the widest prefix source ranges may add up to without the user's confirmation (they are IPv4 only)
BROADEST = 8


def check_parallel(serve: ServeCommand, gpus: int) -> None:
    """The engine crashes at start when tensor x pipeline parallel needs more GPUs than the pod has."""
    if serve.gpus_needed > gpus:
        raise Invalid(f"tensor-parallel {serve.tensor_parallel} x pipeline-parallel {serve.pipeline_parallel} = "
                      f"{serve.gpus_needed} GPUs, but the deployment asks for {gpus} per replica: {serve.engine.value} "
                      "would crash at start; raise gpus or lower the parallel sizes",
                      details={"tensor_parallel": serve.tensor_parallel, "pipeline_parallel": serve.pipeline_parallel,
                               "gpus": gpus})


def check_service(spec: ServiceSpec) -> None:
    """Exposure rules: the source ranges are IPv4 CIDRs (the load balancer is not dual-stack); internet-facing
    needs them; the whole internet (or ranges covering more than a /8 in total) only when the user confirmed it;
    cluster-internal takes none of the load balancer's settings."""
    if spec.exposure is Exposure.CLUSTER:
        if spec.internet_facing or spec.source_ranges:
            raise Invalid("internet_facing and source_ranges apply to exposure 'external' only")
        return
    ranges: list[str] = []
    for text in spec.source_ranges:
        try:
            net = ipaddress.ip_network(text, strict=False)
        except ValueError:
            raise Invalid(f"source_ranges: {text!r} is not a CIDR such as 203.0.113.0/24",
                          details={"field": "service.source_ranges"}) from None
        if net.version == 6:  # the load balancer is IPv4 only; the controller refuses a v6 range for it
            raise Invalid(f"source_ranges: {text!r} is IPv6, and the load balancer is IPv4 only (the AWS Load "
                          "Balancer Controller refuses a v6 CIDR for a load balancer that is not dual-stack)",
                          details={"field": "service.source_ranges"})
        ranges.append(str(net))
    if spec.internet_facing and not ranges:
        raise Invalid("an internet-facing load balancer needs source_ranges: the CIDRs allowed to reach it",
                      details={"field": "service.source_ranges"})
    if spec.confirm_open_to_world:
        return
    opened = sorted(OPEN & set(ranges))
    if opened:
        raise Invalid(f"source_ranges {opened} open the endpoint to the whole internet: ask the user, and set "
                      "service.confirm_open_to_world only if they agree", details={"field": "service.source_ranges"})
    collapsed = ipaddress.collapse_addresses(ipaddress.IPv4Network(r) for r in ranges)
    if sum(n.num_addresses for n in collapsed) > 2 ** (32 - BROADEST):
        raise Invalid(f"source_ranges add up to more than a /{BROADEST} of the IPv4 internet: ask the user, and set "
                      "service.confirm_open_to_world only if they agree", details={"field": "service.source_ranges"})


def pick_instance_types(facts: Mapping[str, InstanceFacts], gpus: int, wanted: str | None) -> list[str]:
    """The cluster's node types a pod asking ``gpus`` GPUs fits on (``wanted`` only, when given); 409 naming what
    the cluster has when none does."""
    offered = {name: f.gpus for name, f in facts.items() if f.gpus > 0}
    if wanted is not None:
        if wanted not in facts:
            raise Conflict(f"the cluster has no {wanted} nodes; it has {sorted(facts) or 'no nodes'}",
                           details={"instance_types": {n: f.gpus for n, f in facts.items()}})
        if facts[wanted].gpus < gpus:
            raise Conflict(f"a {wanted} node has {facts[wanted].gpus} GPUs; the deployment asks for {gpus} per pod",
                           details={"instance_types": offered})
        return [wanted]
    fits = sorted(name for name, count in offered.items() if count >= gpus)
    if not fits:
        raise Conflict(f"no node type of the cluster has {gpus} GPUs (it has {offered or 'no GPU nodes'}): ask for "
                       "fewer GPUs per replica, or add an instance group with larger GPU instances",
                       details={"instance_types": offered})
    return fits


def ours(obj: Mapping[str, Any], name: str) -> bool:
    return _labels(obj).get(MANAGED_BY) == "instantstart" and _labels(obj).get(INFERENCE_LABEL) == name


def pool_named(deployments: Iterable[Mapping[str, Any]], name: str) -> Mapping[str, Any] | None:
    """Our model pool's Deployment called ``name`` (a self-managed Deployment that also carries the pool label)."""
    return next((d for d in deployments if (d.get("metadata") or {}).get("name") == name and ours(d, name)
                 and POOL_LABEL in _labels(d)), None)


def check_name(deployments: Iterable[Mapping[str, Any]], services: Iterable[Mapping[str, Any]], name: str,
               namespace: str) -> None:
    """The name is free in the namespace (or already ours there) and no deployment of ours elsewhere in the
    cluster has it: names are unique per cluster, so every other verb needs only the name."""
    for kind, objects in (("Deployment", deployments), ("Service", services)):
        for obj in objects:
            meta = obj.get("metadata") or {}
            if meta.get("name") != name:
                continue
            if kind == "Deployment" and POOL_LABEL in _labels(obj):
                raise Conflict(f"the cluster already has a model pool {name!r} (namespace {meta.get('namespace')}): "
                               "choose another name; inference_pool_scale changes a pool's size",
                               details={"namespace": meta.get("namespace")})
            if meta.get("namespace") == namespace and not ours(obj, name):
                raise Conflict(f"a {kind} {namespace}/{name} exists and is not InstantStart's: choose another name",
                               details={"kind": kind, "namespace": namespace})
            if meta.get("namespace") != namespace and kind == "Deployment" and ours(obj, name):
                raise Conflict(f"the cluster already has an inference deployment {name!r} in namespace "
                               f"{meta.get('namespace')}: choose another name, or delete it first",
                               details={"namespace": meta.get("namespace")})
