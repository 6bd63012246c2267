"""The KEDA ScaledObject (``keda.sh/v1alpha1``) that autoscales a self-managed inference deployment, and reading it.

One ScaledObject per deployment, named like it, owned by the Deployment (deleting the deployment deletes it, and
KEDA's HPA with it), labelled as ours and stamped with the sha256 of what we applied (a second identical set
writes nothing). Its ``prometheus`` triggers query the cluster's Prometheus (the ``prometheus`` component) with
the engine's own metric names, selected by the target labels that Prometheus's scrape config gives each pod
(``namespace`` and the pod label ``instantstart.io/inference`` as ``instantstart_io_inference``). Builders never
read the cluster and never raise.
"""

from __future__ import annotations

import hashlib
import json
from decimal import Decimal
from typing import Any

from kubernetes import client as k8s
from kubernetes.utils import parse_quantity

from services.errors import NotFound
from services.inference.manifest import INFERENCE_LABEL, labels
from services.inference.scaling_models import ScalingRequest, TriggerView

GROUP, VERSION, PLURAL = "keda.sh", "v1alpha1", "scaledobjects"
API_VERSION = f"{GROUP}/{VERSION}"
APPLIED = "instantstart.io/applied"
#: the Service of the ``prometheus`` component (services/components/manifests/prometheus.yaml)
PROMETHEUS = "http://prometheus.instantstart-monitoring.svc.cluster.local:9090"
#: engine -> (completed-requests counter, waiting-requests gauge): the names vLLM and SGLang export
METRICS = {"vllm": ("vllm:request_success_total", "vllm:num_requests_waiting"),
           "sglang": ("sglang:num_requests_total", "sglang:num_queue_reqs")}
TARGET_LABEL = INFERENCE_LABEL.replace(".", "_").replace("/", "_")  # as Prometheus's labelmap names it


def queries(engine: str, namespace: str, name: str) -> dict[str, str]:
    """The trigger queries of a deployment, by trigger kind."""
    counter, gauge = METRICS[engine]
    selector = f'{{namespace="{namespace}",{TARGET_LABEL}="{name}"}}'
    return {"request_rate": f"sum(rate({counter}{selector}[1m]))", "queue_depth": f"sum({gauge}{selector})"}


def _number(value: float) -> str:
    return f"{value:g}"


def render(*, name: str, namespace: str, engine: str, deployment_uid: str, request: ScalingRequest) -> dict[str, Any]:
    """The ScaledObject for ``request`` (at least one trigger given: the verb checked it)."""
    found = queries(engine, namespace, name)
    triggers = [{"type": "prometheus", "name": kind.replace("_", "-"), "metricType": "AverageValue",
                 "metadata": {"serverAddress": PROMETHEUS, "query": found[kind], "threshold": _number(threshold)}}
                for kind, threshold in (("request_rate", request.request_rate), ("queue_depth", request.queue_depth))
                if threshold is not None]
    obj: dict[str, Any] = {
        "apiVersion": API_VERSION, "kind": "ScaledObject",
        "metadata": {"name": name, "namespace": namespace, "labels": labels(name),
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": name,
                                          "uid": deployment_uid, "blockOwnerDeletion": False}]},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
                 "pollingInterval": request.polling_interval, "cooldownPeriod": request.cooldown_period,
                 "minReplicaCount": request.min_replicas, "maxReplicaCount": request.max_replicas,
                 "triggers": triggers}}
    digest = hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    obj["metadata"]["annotations"] = {APPLIED: digest}
    return obj


def triggers_of(obj: dict[str, Any]) -> list[TriggerView]:
    return [TriggerView(kind=str(t.get("name") or "").replace("-", "_"), query=str((t.get("metadata") or {})
                        .get("query") or ""), threshold=float((t.get("metadata") or {}).get("threshold") or 0))
            for t in (obj.get("spec") or {}).get("triggers") or []]


def live(api: k8s.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    """The ScaledObject called ``name``, whoever made it (None: none, or KEDA's CRDs are not installed)."""
    try:
        found: Any = k8s.CustomObjectsApi(api).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    except NotFound:
        return None
    return dict(found)


def ours(obj: dict[str, Any], name: str) -> bool:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(INFERENCE_LABEL) == name


def read(api: k8s.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    """The live ScaledObject of ``name`` when it is ours (None: none, not ours, or no KEDA CRDs)."""
    obj = live(api, namespace, name)
    return obj if obj is not None and ours(obj, name) else None


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == kind), None)


def _quantity(value: Any) -> Decimal:
    """A Kubernetes quantity as a number ("500m" and "0.5" are equal)."""
    parsed: Decimal = parse_quantity(str(value))  # type: ignore[no-untyped-call]
    return parsed


def hpa_lag(obj: dict[str, Any], hpa: dict[str, Any] | None) -> str:
    """How KEDA's HPA (``hpa``, as the API serves it) still differs from what KEDA makes of the ScaledObject
    ``obj`` ("" once it follows it): KEDA's ``minReplicas`` (``minReplicaCount``, at least 1), ``maxReplicas``
    (``maxReplicaCount``) and one ``External`` metric ``s<i>-<trigger type>`` per trigger with an ``AverageValue``
    target of its threshold. KEDA's ``Ready`` condition can be the one of the ScaledObject before a change; an
    HPA that matches is the evidence that KEDA processed the change."""
    if hpa is None:
        return "no HPA yet"
    spec, want = hpa.get("spec") or {}, obj.get("spec") or {}
    bounds = (max(int(want.get("minReplicaCount", 0)), 1), int(want.get("maxReplicaCount", 100)))
    if (spec.get("minReplicas"), spec.get("maxReplicas")) != bounds:
        return f"HPA replicas {spec.get('minReplicas')}-{spec.get('maxReplicas')}, not {bounds[0]}-{bounds[1]}"
    wanted = [(f"s{i}-{t.get('type')}", _quantity((t.get("metadata") or {}).get("threshold")))
              for i, t in enumerate(want.get("triggers") or [])]
    try:
        have = [(str(m["external"]["metric"]["name"]), _quantity(m["external"]["target"]["averageValue"]))
                for m in spec.get("metrics") or [] if m.get("type") == "External"]
    except (KeyError, TypeError, ValueError):
        return "HPA metrics not KEDA's"
    if have == wanted:
        return ""
    shown = (", ".join(f"{n} {q}" for n, q in metrics) or "none" for metrics in (have, wanted))
    return "HPA metrics {}, not {}".format(*shown)
