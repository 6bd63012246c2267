"""The HyperPod inference operator's autoscaling: a KEDA ``ScaledObject`` per endpoint rendered from its
``autoScalingSpec`` (the real operator is KEDA-backed), where KEDA's CRDs are installed.

For an endpoint ``<name>`` whose ``autoScalingSpec`` has triggers (``prometheusTriggerList`` or the single
``prometheusTrigger``; ``cloudWatchTriggerList`` / ``cloudWatchTrigger``) the operator keeps a ScaledObject
``<name>`` owned by the endpoint's resource (deleting it deletes the ScaledObject, and KEDA's HPA with it): target
the endpoint's Deployment, ``minReplicaCount`` / ``maxReplicaCount`` (defaults 1/5), ``pollingInterval``,
``cooldownPeriod``, ``initialCooldownPeriod``, the stabilization windows as the HPA's ``behavior``, and one trigger
per entry: ``prometheus`` (``query``, ``threshold`` = ``targetValue``, ``activationThreshold``, ``serverAddress``
when given) or ``aws-cloudwatch`` (``namespace``, ``metricName``, ``dimensionName`` / ``dimensionValue`` joined by
``;``, ``targetMetricValue``, ``activationTargetMetricValue``, ``minMetricValue``, ``metricStat``,
``metricStatPeriod`` from ``metricCollectionPeriod``, ``metricCollectionTime`` from ``metricCollectionStartTime``,
``awsRegion`` the cluster's: KEDA requires one and the ``autoScalingSpec`` has none, so the real operator must add
it; an assumption, not in the CRD), ``metricType`` ``Average`` → ``AverageValue``. Triggers gone: the ScaledObject
goes and the replicas stay where KEDA left them. The sandbox's KEDA (:mod:`.keda`) scales on both kinds (CloudWatch:
the sandbox's). Without KEDA's CRDs nothing is made (the product refuses triggers there).
"""

from __future__ import annotations

from typing import Any

from .cluster import Cluster, WriteOptions
from .errors import ApiError
from .operator_support import create, delete
from .store import Key, Obj
from .workloads import owner_ref

SCALED_KEY: Key = ("keda.sh", "scaledobjects")
API_VERSION = "keda.sh/v1alpha1"


def _number(value: Any) -> str:
    return f"{float(value):g}"


def _triggers(scaling: dict[str, Any], many: str, one: str) -> list[dict[str, Any]]:
    found = scaling.get(many) or ([scaling[one]] if isinstance(scaling.get(one), dict) else [])
    return [t for t in found if isinstance(t, dict)]


def _prometheus(trigger: dict[str, Any], index: int) -> dict[str, Any]:
    meta = {"query": str(trigger.get("query") or ""), "threshold": _number(trigger.get("targetValue") or 0)}
    if trigger.get("activationTargetValue") is not None:
        meta["activationThreshold"] = _number(trigger["activationTargetValue"])
    if trigger.get("serverAddress"):
        meta["serverAddress"] = str(trigger["serverAddress"])
    return {"type": "prometheus", "name": str(trigger.get("name") or f"prometheus-{index}"),
            "metricType": "Value" if trigger.get("metricType") == "Value" else "AverageValue", "metadata": meta}


def _cloudwatch(trigger: dict[str, Any], index: int, region: str) -> dict[str, Any]:
    dims = trigger.get("dimensions") or []
    meta = {"namespace": str(trigger.get("namespace") or ""), "metricName": str(trigger.get("metricName") or ""),
            "dimensionName": ";".join(str(d.get("name")) for d in dims),
            "dimensionValue": ";".join(str(d.get("value")) for d in dims),
            "targetMetricValue": _number(trigger.get("targetValue") or 0),
            "activationTargetMetricValue": _number(trigger.get("activationTargetValue") or 0),
            "minMetricValue": _number(trigger.get("minValue") or 0),
            "metricStat": str(trigger.get("metricStat") or "Average"),
            "metricStatPeriod": str(int(trigger.get("metricCollectionPeriod") or 300)),
            "metricCollectionTime": str(int(trigger.get("metricCollectionStartTime") or 300)),
            **({"awsRegion": region} if region else {})}
    return {"type": "aws-cloudwatch", "name": str(trigger.get("name") or f"cloudwatch-{index}"),
            "metricType": "Value" if trigger.get("metricType") == "Value" else "AverageValue", "metadata": meta}


def scaled_object_body(config: Obj, label: str, region: str = "") -> Obj | None:
    """The ScaledObject the operator makes of ``config`` (None: its autoscaling has no trigger); CloudWatch
    triggers read ``region`` (the cluster's)."""
    scaling = (config.get("spec") or {}).get("autoScalingSpec")
    if not isinstance(scaling, dict):
        return None
    triggers = [*(_prometheus(t, i) for i, t in enumerate(
        _triggers(scaling, "prometheusTriggerList", "prometheusTrigger"))),
                *(_cloudwatch(t, i, region) for i, t in enumerate(
                    _triggers(scaling, "cloudWatchTriggerList", "cloudWatchTrigger")))]
    if not triggers:
        return None
    name = config["metadata"]["name"]
    behavior = {"scaleUp": {"stabilizationWindowSeconds": int(scaling.get("scaleUpStabilizationTime", 0))},
                "scaleDown": {"stabilizationWindowSeconds": int(scaling.get("scaleDownStabilizationTime", 300))}}
    return {"apiVersion": API_VERSION, "kind": "ScaledObject",
            "metadata": {"name": name, "labels": {label: name}, "ownerReferences": [owner_ref(config)]},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
                     "pollingInterval": int(scaling.get("pollingInterval", 30)),
                     "cooldownPeriod": int(scaling.get("cooldownPeriod", 300)),
                     "initialCooldownPeriod": int(scaling.get("initialCooldownPeriod", 300)),
                     "minReplicaCount": int(scaling.get("minReplicaCount", 1)),
                     "maxReplicaCount": int(scaling.get("maxReplicaCount", 5)),
                     "advanced": {"horizontalPodAutoscalerConfig": {"behavior": behavior}},
                     "triggers": triggers}}


def reconcile(cluster: Cluster, config: Obj, label: str, manager: str) -> None:
    """Keep the endpoint's ScaledObject as its ``autoScalingSpec`` says (where KEDA's CRDs are installed)."""
    rt = cluster.find_kind(API_VERSION, "ScaledObject")
    if rt is None:
        return
    meta = config["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    want = scaled_object_body(config, label, cluster.cloud[1] if cluster.cloud else "")
    have = cluster.store.get(SCALED_KEY, (namespace, name))
    owned = have is not None and any(r.get("uid") == meta["uid"] for r in have["metadata"].get("ownerReferences")
                                     or ())
    if have is not None and not owned:
        return  # someone else's: left alone
    if want is None:
        if have is not None:
            delete(cluster, SCALED_KEY, have)
        return
    if have is None:
        create(cluster, SCALED_KEY, namespace, want, manager)
    elif have.get("spec") != want["spec"]:
        try:
            cluster.replace(rt, namespace, name, {**have, "spec": want["spec"]}, WriteOptions(manager=manager))
        except ApiError:
            return  # changed meanwhile: its event brings the config back
