"""KEDA's operator and its metrics adapter, for ``ScaledObject`` (``keda.sh/v1alpha1``) with ``prometheus`` and
``aws-cloudwatch`` (:mod:`.keda_cloudwatch`: the sandbox's CloudWatch) triggers, where KEDA's CRDs are installed.

For a ScaledObject ``<name>`` it makes the HorizontalPodAutoscaler ``keda-hpa-<name>`` (owned by it; deleting the
ScaledObject deletes it; a change reaches it at the next poll, KEDA's reconcile being asynchronous: until then
``Ready`` is the previous spec's): the ScaledObject's target, ``minReplicas``
max(``minReplicaCount``, 1) (default 0), ``maxReplicas`` ``maxReplicaCount`` (default 100), one ``External`` metric
``s<i>-<type>`` per trigger with a target of the trigger's ``threshold``, of its ``metricType``
(``AverageValue`` by default, or ``Value``). Every
``pollingInterval`` (default 30 s, on the cluster's clock) it evaluates each trigger's ``query`` against the
``/metrics`` the target's pods serve (the simulated engines' Prometheus counters; no Prometheus server is asked,
``serverAddress`` is not dialled) and scales the target through its scale subresource as KEDA and the HPA would:
``ceil(value / threshold)`` replicas (the largest over the triggers) within the bounds; 0 when ``minReplicaCount``
is 0 and no trigger is above its ``activationThreshold`` (default 0). Status as KEDA writes it: conditions ``Ready``
(``ScaledObjectReady``, or ``ScaledObjectCheckFailed``), ``Active`` (``ScalerActive`` / ``ScalerNotActive``),
``Fallback`` (``NoFallbackFound``), plus ``hpaName``, ``scaleTargetKind``, ``scaleTargetGVKR``,
``originalReplicaCount``, ``triggersTypes``, ``externalMetricNames``, ``lastActiveTime``; the HPA's
``currentReplicas``, ``desiredReplicas``, ``currentMetrics`` and conditions. The HPA reads KEDA's metrics through
the aggregated external metrics API: while the APIService ``v1beta1.external.metrics.k8s.io`` is missing or not
``Available`` (:mod:`.aggregator`), nothing scales and the HPA says ``ScalingActive=False``
(``FailedGetExternalMetric``).

The query subset: ``[sum|avg|max|min] ( [rate|increase] ( METRIC[{label="value",...}][[WINDOW]] ) )``: a metric
name with optional equality matchers, over the series of every pod of the target (each with the target labels
Prometheus adds under the product's scrape config: the pod's labels, sanitized, plus ``namespace`` and
``pod``), optionally the per-second rate (or increase) since the previous poll, aggregated (``sum`` when no
aggregation is named). Anything else makes the ScaledObject ``Ready=False``. A trigger's ``metricType`` ``Value``
scales as the HPA does for a ``Value`` target (``ceil(current * value / threshold)``). Not modelled: other trigger
types, the ``Utilization`` metric type, cooldown and HPA stabilization windows (a poll scales at once),
``fallback``, ``advanced`` HPA settings, pausing annotations, ScaledJobs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
import threading
import weakref
from dataclasses import dataclass
from typing import Any

from . import aggregator, backends, keda_cloudwatch, processes
from .backends import Request
from .cluster import Cluster, WriteOptions
from .errors import ApiError
from .operator_support import condition, create, write_status
from .resources import POD_KEY, ResourceType
from .selectors import label_selector_from_match, labels_match, parse_label_selector
from .store import Key, Loc, Obj
from .workloads import owner_ref

log = logging.getLogger(__name__)
KEY: Key = ("keda.sh", "scaledobjects")
KIND = "ScaledObject"
HPA_KEY: Key = ("autoscaling", "horizontalpodautoscalers")
MANAGER = "keda-operator"
NAME_LABEL = "scaledobject.keda.sh/name"
EXTERNAL_METRICS = "v1beta1.external.metrics.k8s.io"  # KEDA's metrics API server's APIService
DEFAULT_POLL, DEFAULT_MIN, DEFAULT_MAX = 30.0, 0, 100
_QUERY = re.compile(r"^\s*(?:(?P<agg>sum|avg|max|min)\s*\(\s*)?(?:(?P<fn>rate|increase)\s*\(\s*)?"
                    r"(?P<metric>[A-Za-z_:][A-Za-z0-9_:]*)\s*(?:\{(?P<labels>[^}]*)\})?\s*(?:\[\s*\d+[smh]\s*\])?"
                    r"\s*(?P<close>(?:\)\s*)*)$")
_MATCHER = re.compile(r'^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"([^"]*)"\s*$')
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{([^}]*)\})?\s+(\S+)")


@dataclass(frozen=True)
class Query:
    aggregation: str
    function: str
    metric: str
    labels: tuple[tuple[str, str], ...]


def parse_query(text: str) -> Query:
    """The supported subset of PromQL (ValueError: outside it)."""
    found = _QUERY.match(text)
    if found is None:
        raise ValueError(f"query {text!r} is outside the sandbox's subset: [sum|avg|max|min]([rate|increase]("
                         "metric{label=\"value\"}[window]))")
    agg, fn = found.group("agg") or "", found.group("fn") or ""
    if found.group("close").count(")") != bool(agg) + bool(fn):
        raise ValueError(f"query {text!r}: unbalanced parentheses")
    labels = []
    for part in filter(str.strip, (found.group("labels") or "").split(",")):
        matcher = _MATCHER.match(part)
        if matcher is None:
            raise ValueError(f"query {text!r}: only label=\"value\" matchers are supported")
        labels.append((matcher.group(1), matcher.group(2)))
    return Query(agg or "sum", fn, found.group("metric"), tuple(labels))


def target_labels(pod: Obj) -> dict[str, str]:
    """The labels Prometheus adds to a pod's series under the product's scrape config (kubernetes_sd pods, every
    pod label mapped with its name sanitized as the ``__meta_kubernetes_pod_label_*`` ones are, plus ``namespace``
    and ``pod``)."""
    meta = pod["metadata"]
    mapped = {re.sub(r"[^A-Za-z0-9_]", "_", k): str(v) for k, v in (meta.get("labels") or {}).items()}
    return {**mapped, "namespace": str(meta.get("namespace", "")), "pod": str(meta.get("name", ""))}


def _series(text: str, query: Query, target: dict[str, str] | None = None) -> list[float]:
    values = []
    for line in text.splitlines():
        sample = _SAMPLE.match(line)
        if sample is None or sample.group(1) != query.metric:
            continue
        labels = {**(target or {}),
                  **dict(re.findall(r'([A-Za-z_][A-Za-z0-9_]*)="([^"]*)"', sample.group(2) or ""))}
        if all(labels.get(k) == v for k, v in query.labels):
            with contextlib.suppress(ValueError):
                values.append(float(sample.group(3)))
    return values


# --- the operator ------------------------------------------------------------------------------------------------


def _bounds(spec: dict[str, Any]) -> tuple[int, int]:
    return int(spec.get("minReplicaCount", DEFAULT_MIN)), int(spec.get("maxReplicaCount", DEFAULT_MAX))


def _target(spec: dict[str, Any]) -> dict[str, str]:
    ref = spec.get("scaleTargetRef") or {}
    return {"apiVersion": str(ref.get("apiVersion") or "apps/v1"), "kind": str(ref.get("kind") or "Deployment"),
            "name": str(ref.get("name", ""))}


def _target_of(trigger: dict[str, Any]) -> dict[str, str]:
    """The HPA metric target of a trigger: its ``metricType`` (``AverageValue`` by default) and threshold, a
    canonical quantity as the API server stores it."""
    threshold = _quantity(_threshold(trigger))
    if trigger.get("metricType") == "Value":
        return {"type": "Value", "value": threshold}
    return {"type": "AverageValue", "averageValue": threshold}


def hpa_body(so: Obj) -> Obj:
    spec = so.get("spec") or {}
    name = so["metadata"]["name"]
    low, high = _bounds(spec)
    metrics = [{"type": "External", "external": {
        "metric": {"name": f"s{i}-{t.get('type')}", "selector": {"matchLabels": {NAME_LABEL: name}}},
        "target": _target_of(t)}}
        for i, t in enumerate(spec.get("triggers") or [])]
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": f"keda-hpa-{name}", "ownerReferences": [owner_ref(so)],
                         "labels": {"app.kubernetes.io/managed-by": "keda-operator", "app.kubernetes.io/part-of": name,
                                    "app.kubernetes.io/name": f"keda-hpa-{name}", NAME_LABEL: name}},
            "spec": {"scaleTargetRef": _target(spec), "minReplicas": max(low, 1), "maxReplicas": high,
                     "metrics": metrics}}


def _check(so: Obj) -> str:
    """Why KEDA refuses the ScaledObject ("" when it is fine): its ``ValidateTriggers`` (a trigger name given twice)
    first, then each trigger's metadata."""
    triggers = (so.get("spec") or {}).get("triggers") or []
    names = [str(t["name"]) for t in triggers if t.get("name")]
    twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if twice is not None:
        return f"triggerName {json.dumps(twice)} is defined multiple times in the ScaledObject, but it must be unique"
    for trigger in triggers:
        meta = trigger.get("metadata") or {}
        if trigger.get("type") == keda_cloudwatch.TYPE:
            problem = keda_cloudwatch.check(meta)
            if problem:
                return problem
            continue
        if trigger.get("type") != "prometheus":
            return f"trigger type {trigger.get('type')!r} is not simulated (only prometheus and aws-cloudwatch)"
        if "query" not in meta or "threshold" not in meta:
            return "error parsing prometheus metadata: no query or threshold given"
        try:
            parse_query(str(meta["query"]))
            float(meta["threshold"])
        except ValueError as exc:
            return f"error parsing prometheus metadata: {exc}"
    low, high = _bounds(so.get("spec") or {})
    return "" if low <= high else f"MinReplicaCount={low} must be less than MaxReplicaCount={high}"


def _scale_target(cluster: Cluster, so: Obj) -> tuple[ResourceType, Obj] | None:
    target = _target(so.get("spec") or {})
    rt = cluster.find_kind(target["apiVersion"], target["kind"])
    found = cluster.store.get(rt.key, (so["metadata"]["namespace"], target["name"])) if rt is not None else None
    return (rt, found) if rt is not None and rt.scale is not None and found is not None else None


def _problem(cluster: Cluster, so: Obj) -> str:
    """Why KEDA cannot scale with the ScaledObject now ("" when it can)."""
    problem = _check(so)
    if not problem and _scale_target(cluster, so) is None:
        target = _target(so.get("spec") or {})
        problem = f"ScaledObject doesn't have correct scaleTargetRef specification: {target['kind']} " \
                  f"{target['name']} not found or not scalable"
    return problem


def reconcile(cluster: Cluster, loc: Loc) -> None:
    so = cluster.store.get(KEY, loc)
    if so is None or so["metadata"].get("deletionTimestamp"):
        return  # its HPA goes with it (owner reference)
    problem = _problem(cluster, so)
    if not problem and cluster.store.get(HPA_KEY, (loc[0], f"keda-hpa-{loc[1]}")) is None:
        problem = create(cluster, HPA_KEY, loc[0], hpa_body(so), MANAGER) or ""
    _write(cluster, so, problem, None)
    _Poller.ensure(cluster)  # polls also wait for a missing target to appear


def _follow(cluster: Cluster, so: Obj) -> None:
    """Update the ScaledObject's HPA to what its spec makes of it now (a changed ScaledObject)."""
    hpa = cluster.store.get(HPA_KEY, (so["metadata"]["namespace"], f"keda-hpa-{so['metadata']['name']}"))
    wanted = hpa_body(so)["spec"]
    if hpa is None or all((hpa.get("spec") or {}).get(k) == v for k, v in wanted.items()):
        return
    rt = next(rt for rt in cluster.resource_types() if rt.key == HPA_KEY)
    meta = hpa["metadata"]
    cluster.replace(rt, meta["namespace"], meta["name"], {**hpa, "spec": {**hpa["spec"], **wanted}},
                    WriteOptions(manager=MANAGER))


def _write(cluster: Cluster, so: Obj, problem: str, active: bool | None) -> None:
    now = cluster.now_iso()
    old = so.get("status") or {}
    spec = so.get("spec") or {}
    target = _target(spec)
    group, _, version = target["apiVersion"].rpartition("/")
    was_active = next((c.get("status") == "True" for c in old.get("conditions") or [] if c.get("type") == "Active"),
                      False)
    active = was_active if active is None else active
    ready = condition(so, "Ready", "False", "ScaledObjectCheckFailed", problem, now) if problem else condition(
        so, "Ready", "True", "ScaledObjectReady", "ScaledObject is defined correctly and is ready for scaling", now)
    activity = condition(so, "Active", "True", "ScalerActive", "Scaling is performed because triggers are active",
                         now) if active else condition(so, "Active", "False", "ScalerNotActive",
                                                       "Scaling is not performed because triggers are not active", now)
    fallback = condition(so, "Fallback", "False", "NoFallbackFound", "No fallbacks are active on this scaled object",
                         now)
    status: dict[str, Any] = {
        **old, "conditions": [ready, activity, fallback],
        "hpaName": f"keda-hpa-{so['metadata']['name']}", "scaleTargetKind": f"{target['apiVersion']}.{target['kind']}",
        "scaleTargetGVKR": {"group": group, "version": version, "kind": target["kind"],
                            "resource": f"{target['kind'].lower()}s"},
        "triggersTypes": ",".join(str(t.get("type")) for t in spec.get("triggers") or []),
        "externalMetricNames": [f"s{i}-{t.get('type')}" for i, t in enumerate(spec.get("triggers") or [])]}
    if active:
        status["lastActiveTime"] = now if not was_active else old.get("lastActiveTime", now)
    write_status(cluster, KEY, so, status, MANAGER)


# --- the metrics adapter and the HPA -----------------------------------------------------------------------------


class _Poller:
    """One thread per cluster that polls its ScaledObjects on the cluster's clock, until none is left."""

    _lock = threading.Lock()
    _threads: weakref.WeakKeyDictionary[Cluster, _Poller] = weakref.WeakKeyDictionary()

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = weakref.ref(cluster)
        self.stopped = threading.Event()
        self.due: dict[str, float] = {}  # ScaledObject uid -> when it is polled next
        self.previous: dict[tuple[str, int], tuple[float, float]] = {}  # (uid, trigger) -> (time, total)

    @classmethod
    def ensure(cls, cluster: Cluster) -> None:
        with cls._lock:
            poller = cls._threads.get(cluster)
            if poller is not None and not poller.stopped.is_set():
                return
            poller = cls._threads[cluster] = _Poller(cluster)
        threading.Thread(target=poller.run, name=f"keda-{cluster.name}", daemon=True).start()

    @classmethod
    def stop(cls, cluster: Cluster) -> None:
        with cls._lock:
            poller = cls._threads.pop(cluster, None)
        if poller is not None:
            poller.stopped.set()

    def run(self) -> None:
        while not self.stopped.is_set():
            cluster = self.cluster()
            if cluster is None:
                return
            objects = cluster.store.items(KEY)
            if not objects:
                with self._lock:
                    if self._threads.get(cluster) is self:
                        del self._threads[cluster]
                    self.stopped.set()
                return
            now = cluster.clock()
            live = {so["metadata"]["uid"] for _, so in objects}
            self.due = {uid: due for uid, due in self.due.items() if uid in live}
            for _, so in objects:
                uid = so["metadata"]["uid"]
                if now >= self.due.get(uid, now):
                    self.due[uid] = now + float((so.get("spec") or {}).get("pollingInterval") or DEFAULT_POLL)
                    try:
                        self.poll(cluster, so)
                    except ApiError:
                        pass  # changed meanwhile: the next poll sees it
                    except Exception:  # one bad ScaledObject must not stop the others' polls
                        log.exception("KEDA poll of %s in %s failed", so["metadata"]["name"], cluster.name)
            wait = processes.real_wait(cluster, min(self.due.values(), default=now + DEFAULT_POLL) - cluster.clock())
            del cluster  # held only while working: a deleted cluster ends the thread
            self.stopped.wait(wait)

    def poll(self, cluster: Cluster, so: Obj) -> None:
        if so["metadata"].get("deletionTimestamp"):
            return
        problem = _problem(cluster, so)
        found = _scale_target(cluster, so)
        if problem or found is None:
            _write(cluster, so, problem, None)  # the same as the reconciler writes: no flapping
            return
        _follow(cluster, so)
        rt, owner = found
        spec = so.get("spec") or {}
        namespace = so["metadata"]["namespace"]
        registered, why = aggregator.available(cluster, EXTERNAL_METRICS)
        if not registered:  # the HPA cannot read KEDA's metrics: nothing scales
            self.hpa_failed(cluster, so, int((owner.get("spec") or {}).get("replicas") or 0), why)
            _write(cluster, so, "", None)
            return
        target = _target(spec)
        values = [self.evaluate(cluster, so, i, t, owner) for i, t in enumerate(spec.get("triggers") or [])]
        low, high = _bounds(spec)
        current = int((owner.get("spec") or {}).get("replicas") or 0)
        known = [(v, t) for v, t in zip(values, spec.get("triggers") or [], strict=True) if v is not None]
        if not known:
            _write(cluster, so, "", None)  # nothing answered: keep the replicas
            return
        active = any(v > _activation(t) for v, t in known)
        wanted = max(_wanted(v, t, current) for v, t in known)
        desired = 0 if low == 0 and not active else max(max(low, 1), min(wanted, high))
        if desired != current:
            cluster.update_scale(rt, namespace, target["name"], "merge", {"spec": {"replicas": desired}},
                                 WriteOptions(manager=MANAGER))
        self.hpa_status(cluster, so, current, desired, values)
        _write(cluster, so, "", active)

    def evaluate(self, cluster: Cluster, so: Obj, index: int, trigger: dict[str, Any], owner: Obj) -> float | None:
        """The trigger's query over the target's pods' /metrics, or its CloudWatch metric (None: no pod answered,
        CloudWatch did not)."""
        if trigger.get("type") == keda_cloudwatch.TYPE:
            return keda_cloudwatch.value(cluster, trigger.get("metadata") or {})
        query = parse_query(str(trigger["metadata"]["query"]))
        selector = parse_label_selector(label_selector_from_match((owner.get("spec") or {}).get("selector")))
        per_pod: list[float] = []
        answered = False
        for _, pod in cluster.store.items(POD_KEY, owner["metadata"]["namespace"]):
            if not labels_match(selector, pod["metadata"].get("labels") or {}) or not _running(pod):
                continue
            text = _scrape(cluster, pod)
            if text is None:
                continue
            answered = True
            per_pod.extend(_series(text, query, target_labels(pod)))
        if not answered:
            return None
        if query.function:
            now, total = cluster.clock(), sum(per_pod)
            key = (so["metadata"]["uid"], index)
            before = self.previous.get(key)
            self.previous[key] = (now, total)
            if before is None or now <= before[0]:
                return 0.0
            delta = max(total - before[1], 0.0)
            return delta / (now - before[0]) if query.function == "rate" else delta
        if not per_pod:
            return 0.0
        if query.aggregation == "avg":
            return sum(per_pod) / len(per_pod)
        return float({"sum": sum(per_pod), "max": max(per_pod), "min": min(per_pod)}[query.aggregation])

    def hpa_status(self, cluster: Cluster, so: Obj, current: int, desired: int, values: list[float | None]) -> None:
        hpa = cluster.store.get(HPA_KEY, (so["metadata"]["namespace"], f"keda-hpa-{so['metadata']['name']}"))
        if hpa is None:
            return
        now = cluster.now_iso()
        metrics = [{"type": "External", "external": {
            "metric": m["external"]["metric"],
            "current": {"value" if m["external"]["target"].get("type") == "Value" else "averageValue": _quantity(v)}}}
            for m, v in zip(hpa["spec"].get("metrics") or [], values, strict=False) if v is not None]
        write_status(cluster, HPA_KEY, hpa, {
            "currentReplicas": current, "desiredReplicas": desired, "currentMetrics": metrics,
            "conditions": [condition(hpa, "AbleToScale", "True", "ReadyForNewScale",
                                     "recommended size matches current size", now),
                           condition(hpa, "ScalingActive", "True", "ValidMetricFound",
                                     "the HPA was able to successfully calculate a replica count from external metric",
                                     now)]}, MANAGER)

    def hpa_failed(self, cluster: Cluster, so: Obj, current: int, why: str) -> None:
        """The HPA's status while the external metrics API is not registered or not available: the HPA
        controller's FailedGetExternalMetric condition, the replicas left as they are."""
        hpa = cluster.store.get(HPA_KEY, (so["metadata"]["namespace"], f"keda-hpa-{so['metadata']['name']}"))
        if hpa is None:
            return
        now, namespace = cluster.now_iso(), so["metadata"]["namespace"]
        metric = next((m["external"]["metric"]["name"] for m in hpa["spec"].get("metrics") or []), "s0-prometheus")
        message = (f"the HPA was unable to compute the replica count: unable to get external metric {namespace}/"
                   f"{metric}/&LabelSelector{{MatchLabels:map[string]string{{{NAME_LABEL}: "
                   f"{so['metadata']['name']},}},MatchExpressions:[]LabelSelectorRequirement{{}},}}: unable to fetch "
                   f"metrics from external metrics API: {why} (get {metric}.external.metrics.k8s.io)")
        write_status(cluster, HPA_KEY, hpa, {
            "currentReplicas": current, "desiredReplicas": current, "currentMetrics": [],
            "conditions": [condition(hpa, "AbleToScale", "True", "SucceededGetScale",
                                     "the HPA controller was able to get the target's current scale", now),
                           condition(hpa, "ScalingActive", "False", "FailedGetExternalMetric", message, now)]},
                     MANAGER)


def _threshold(trigger: dict[str, Any]) -> float:
    meta = trigger.get("metadata") or {}
    return float(meta.get("targetMetricValue" if trigger.get("type") == keda_cloudwatch.TYPE else "threshold", 1))


def _activation(trigger: dict[str, Any]) -> float:
    meta = trigger.get("metadata") or {}
    return float(meta.get("activationTargetMetricValue" if trigger.get("type") == keda_cloudwatch.TYPE
                          else "activationThreshold") or 0)


def _wanted(value: float, trigger: dict[str, Any], current: int) -> int:
    """The HPA's replicas for one trigger: ``AverageValue`` (the default) ``ceil(value / threshold)``; ``Value``
    ``ceil(current * value / threshold)`` (at least one current replica counted)."""
    ratio = value / _threshold(trigger)
    return math.ceil(ratio * max(current, 1) if trigger.get("metricType") == "Value" else ratio)


def _quantity(value: float) -> str:
    """A quantity as the API server writes it canonically: whole numbers plain, else in thousandths."""
    milli = round(value * 1000)
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def _running(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running" and not pod["metadata"].get("deletionTimestamp")


def _scrape(cluster: Cluster, pod: Obj) -> str | None:
    meta = pod["metadata"]
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            handler = backends.dial(cluster, meta["namespace"], meta["name"], meta["uid"],
                                    int(port.get("containerPort") or 0))
            if handler is None:
                continue
            answer = handler(Request("GET", "/metrics"))
            if answer.status == 200:
                return answer.body.decode(errors="replace")
    return None


def stop_cluster(cluster: Cluster) -> None:
    _Poller.stop(cluster)
