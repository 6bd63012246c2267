"""The metric-driven autoscaling of a managed endpoint: its ``autoScalingSpec`` (the operator renders a KEDA
ScaledObject for the endpoint's Deployment from it), written from and read back into ``Autoscaling``.

Pure functions, and the components triggers need (:data:`COMPONENTS`). The rules the CRD's schema cannot say: the
bounds in order, an ``activationTargetValue`` only with ``minReplicaCount`` 0 (the CRD: "Only applicable if
minReplicaCount = 0"), and what KEDA refuses the operator's ScaledObject for: a CloudWatch period other than 1, 5,
10, 30 or a multiple of 60, or one the collection time is not a multiple of (kedacore/keda's aws-cloudwatch
scaler), and a trigger name used twice across both families (its ValidateTriggers). Triggers go in the list forms
(``prometheusTriggerList``, ``cloudWatchTriggerList``, which take priority over the single ones); a single
``prometheusTrigger`` / ``cloudWatchTrigger`` someone else wrote is read back as a one-entry list.
"""

from __future__ import annotations

from typing import Any

from services.components.families import KEDA
from services.components.manifests import Manifests
from services.errors import Invalid
from services.inference.managed_models import Autoscaling, CloudWatchTrigger, PrometheusTrigger

#: what triggers install first: KEDA only. Our Prometheus is there for self-managed triggers, which query it in
#: the cluster; a managed Prometheus trigger reads the Amazon Managed Service for Prometheus workspace in its
#: server_address (the CRD's pattern refuses an in-cluster address) and a CloudWatch trigger reads CloudWatch, so
#: no managed trigger ever reads it
COMPONENTS: tuple[Manifests, ...] = (KEDA,)
#: Autoscaling's fields -> the autoScalingSpec keys each one writes
KEYS: dict[str, tuple[str, ...]] = {
    "min_replicas": ("minReplicaCount",), "max_replicas": ("maxReplicaCount",),
    "prometheus": ("prometheusTriggerList", "prometheusTrigger"),
    "cloudwatch": ("cloudWatchTriggerList", "cloudWatchTrigger"),
    "polling_interval": ("pollingInterval",), "cooldown_period": ("cooldownPeriod",),
    "scale_up_stabilization": ("scaleUpStabilizationTime",),
    "scale_down_stabilization": ("scaleDownStabilizationTime",)}
#: the CRD's default for metricCollectionPeriod and metricCollectionStartTime
DEFAULT_SECONDS = 300


def _triggers_of(scaling: Autoscaling) -> list[tuple[str, int, PrometheusTrigger | CloudWatchTrigger]]:
    return [*(("prometheus", i, t) for i, t in enumerate(scaling.prometheus)),
            *(("cloudwatch", i, t) for i, t in enumerate(scaling.cloudwatch))]


def _check_period(at: str, trigger: CloudWatchTrigger) -> None:
    """KEDA's aws-cloudwatch scaler refuses a metricStatPeriod under 60 other than 1, 5, 10 or 30, one of 60 or
    more that is not a multiple of 60, and a metricCollectionTime that is not a multiple of it (both default to
    300 in the CRD)."""
    period = trigger.period or DEFAULT_SECONDS
    window = trigger.collection_time or DEFAULT_SECONDS
    if (period < 60 and period not in (1, 5, 10, 30)) or (period >= 60 and period % 60):
        raise Invalid(f"{at}.period {period}: KEDA takes 1, 5, 10, 30, 60 or a multiple of 60",
                      details={"field": f"{at}.period"})
    if window % period:
        raise Invalid(f"{at}.period {period} does not divide collection_time {window} (default {DEFAULT_SECONDS}): "
                      "KEDA needs the collection time to be a multiple of the period",
                      details={"field": f"{at}.period"})


def check(scaling: Autoscaling) -> None:
    """422 naming the field: bounds out of order, an activation value while min_replicas is not 0, a CloudWatch
    period KEDA refuses, a trigger name used twice (defaults included; KEDA refuses the ScaledObject)."""
    if scaling.min_replicas > scaling.max_replicas:
        raise Invalid(f"autoscaling.min_replicas {scaling.min_replicas} is above max_replicas {scaling.max_replicas}",
                      details={"field": "autoscaling"})
    named: set[str] = set()
    for family, index, trigger in _triggers_of(scaling):
        at = f"autoscaling.{family}[{index}]"
        if trigger.activation_target_value and scaling.min_replicas != 0:  # the CRD's default 0 is no activation
            field = f"{at}.activation_target_value"
            raise Invalid(f"{field}: the activation value scales from 0 to 1 pod, so it applies only with "
                          f"min_replicas 0 (the CRD: only applicable if minReplicaCount = 0); min_replicas is "
                          f"{scaling.min_replicas}", details={"field": field})
        if isinstance(trigger, CloudWatchTrigger):
            _check_period(at, trigger)
        name = trigger.name or f"{family}-{index}"
        if name in named:
            raise Invalid(f"{at}.name: another trigger is already named {name!r} (a trigger without a name is "
                          f"<family>-<n>); KEDA needs each trigger's name to be unique",
                          details={"field": f"{at}.name"})
        named.add(name)


def triggered(scaling: Autoscaling | None) -> bool:
    """Whether ``scaling`` has metric triggers (the operator makes a KEDA ScaledObject only for them; bounds
    alone need no KEDA)."""
    return scaling is not None and bool(scaling.prometheus or scaling.cloudwatch)


def warnings(scaling: Autoscaling | None) -> list[str]:
    """What a preview should say about the triggers."""
    if scaling is None:
        return []
    unaddressed = [t.name or f"prometheus-{i}" for i, t in enumerate(scaling.prometheus) if not t.server_address]
    return [f"prometheus trigger {', '.join(unaddressed)} names no server_address: the operator's KEDA asks the "
            "Prometheus it is configured with; the CRD accepts only an Amazon Managed Service for Prometheus "
            "workspace there, never an in-cluster Prometheus"] if unaddressed else []


def _prometheus(index: int, trigger: PrometheusTrigger) -> dict[str, Any]:
    out: dict[str, Any] = {"name": trigger.name or f"prometheus-{index}", "query": trigger.query,
                           "targetValue": trigger.target_value, "metricType": trigger.metric_type}
    if trigger.activation_target_value is not None:
        out["activationTargetValue"] = trigger.activation_target_value
    if trigger.server_address:
        out["serverAddress"] = trigger.server_address
    return out


def _cloudwatch(index: int, trigger: CloudWatchTrigger) -> dict[str, Any]:
    out: dict[str, Any] = {"name": trigger.name or f"cloudwatch-{index}", "metricName": trigger.metric_name,
                           "namespace": trigger.namespace,
                           "dimensions": [{"name": k, "value": v} for k, v in sorted(trigger.dimensions.items())],
                           "metricStat": trigger.stat, "targetValue": trigger.target_value,
                           "metricType": trigger.metric_type}
    if trigger.activation_target_value is not None:
        out["activationTargetValue"] = trigger.activation_target_value
    if trigger.period is not None:
        out["metricCollectionPeriod"] = trigger.period
    if trigger.collection_time is not None:
        out["metricCollectionStartTime"] = trigger.collection_time
    return out


def spec_of(scaling: Autoscaling) -> dict[str, Any]:
    """The ``autoScalingSpec`` for ``scaling``."""
    spec: dict[str, Any] = {"minReplicaCount": scaling.min_replicas, "maxReplicaCount": scaling.max_replicas}
    if scaling.prometheus:
        spec["prometheusTriggerList"] = [_prometheus(i, t) for i, t in enumerate(scaling.prometheus)]
    if scaling.cloudwatch:
        spec["cloudWatchTriggerList"] = [_cloudwatch(i, t) for i, t in enumerate(scaling.cloudwatch)]
    for field in ("polling_interval", "cooldown_period", "scale_up_stabilization", "scale_down_stabilization"):
        if getattr(scaling, field) is not None:
            spec[KEYS[field][0]] = getattr(scaling, field)
    return spec


def merged(current: dict[str, Any], update: Autoscaling) -> dict[str, Any]:
    """``current`` (an autoScalingSpec) with the fields ``update`` gives replaced: a field it leaves out keeps its
    value (so new bounds keep the triggers; ``prometheus: []`` drops them)."""
    given = spec_of(update)
    out = {k: v for k, v in current.items()
           if not any(k in KEYS[f] for f in update.model_fields_set if f in KEYS)}
    for field in update.model_fields_set:
        for key in KEYS.get(field, ()):
            if key in given:
                out[key] = given[key]
    return out


def leftover(applied: dict[str, Any], wanted: dict[str, Any]) -> list[str]:
    """The trigger keys of the applied spec's ``autoScalingSpec`` that ``wanted`` (the spec we applied) leaves out:
    ones another field manager wrote, which server-side apply keeps although our apply dropped them. None when we
    applied no ``autoScalingSpec``."""
    if not isinstance(wanted.get("autoScalingSpec"), dict):
        return []
    have, want = applied.get("autoScalingSpec") or {}, wanted["autoScalingSpec"]
    return [k for family in ("prometheus", "cloudwatch") for k in KEYS[family] if k in have and k not in want]


def _triggers(spec: dict[str, Any], family: str) -> list[dict[str, Any]]:
    many, one = KEYS[family]
    found = spec.get(many) or ([spec[one]] if isinstance(spec.get(one), dict) else [])
    return [t for t in found if isinstance(t, dict)]


def autoscaling_of(spec: dict[str, Any]) -> Autoscaling:
    """An ``autoScalingSpec`` as ``Autoscaling`` for the views (the CRD's defaults for what it leaves out; read
    back as written, not validated again)."""
    def number(value: Any) -> float | None:
        return None if value is None else float(value)
    prometheus = [PrometheusTrigger.model_construct(
        name=t.get("name"), query=str(t.get("query") or ""), target_value=float(t.get("targetValue") or 0),
        metric_type=t.get("metricType") or "Average", activation_target_value=number(t.get("activationTargetValue")),
        server_address=t.get("serverAddress") or None) for t in _triggers(spec, "prometheus")]
    cloudwatch = [CloudWatchTrigger.model_construct(
        name=t.get("name"), metric_name=str(t.get("metricName") or ""), namespace=str(t.get("namespace") or ""),
        dimensions={str(d.get("name")): str(d.get("value")) for d in t.get("dimensions") or []},
        stat=t.get("metricStat") or "Average", target_value=float(t.get("targetValue") or 0),
        metric_type=t.get("metricType") or "Average", activation_target_value=number(t.get("activationTargetValue")),
        period=t.get("metricCollectionPeriod"), collection_time=t.get("metricCollectionStartTime"))
        for t in _triggers(spec, "cloudwatch")]
    return Autoscaling.model_construct(
        min_replicas=int(spec.get("minReplicaCount", 1)), max_replicas=int(spec.get("maxReplicaCount", 5)),
        prometheus=prometheus, cloudwatch=cloudwatch, polling_interval=spec.get("pollingInterval"),
        cooldown_period=spec.get("cooldownPeriod"), scale_up_stabilization=spec.get("scaleUpStabilizationTime"),
        scale_down_stabilization=spec.get("scaleDownStabilizationTime"))
