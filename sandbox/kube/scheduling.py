"""What the default scheduler decides: whether a pod fits a node, and why not, in its own words.

Pure functions over stored objects, no writes: :mod:`.scheduler` calls them and binds. The filters are
the default profile's that matter for ML clusters: node readiness (the node lifecycle controller's
``not-ready`` / ``unreachable`` taints), ``spec.unschedulable``, ``nodeName``, ``nodeSelector`` and
required node affinity (``matchExpressions`` and ``matchFields``), taints and tolerations (``NoSchedule``
and ``NoExecute``), and resource requests (CPU, memory, pods, extended resources such as
``nvidia.com/gpu`` and ``vpc.amazonaws.com/efa``) against the node's allocatable minus what its pods
already request. Reasons are the plugins' own strings, so the ``0/N nodes are available: ...`` message of
an unschedulable pod reads exactly as on a real cluster. Preferred affinity, pod (anti-)affinity and
topology spread are not evaluated (``sandbox/README.md``).
"""

from __future__ import annotations

import re
from collections import Counter
from decimal import Decimal, InvalidOperation
from typing import Any

from .store import Obj

_SUFFIXES: dict[str, Decimal] = {
    "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30), "Ti": Decimal(2**40), "Pi": Decimal(2**50),
    "Ei": Decimal(2**60), "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
    "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12), "P": Decimal(10**15),
    "E": Decimal(10**18)}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")
NOT_READY = "node.kubernetes.io/not-ready"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
TERMINAL = ("Succeeded", "Failed")
Resources = dict[str, Decimal]


def quantity(value: Any) -> Decimal | None:
    """A Kubernetes quantity (``100m``, ``4Gi``, ``2``, ``1e3``) as a number; None when malformed."""
    text = str(value).strip()
    m = _QUANTITY.match(text)
    if m is None:
        return None
    try:
        number = Decimal(m[1])
    except InvalidOperation:
        return None
    return number * _SUFFIXES[m[2] or ""]


def _container_requests(container: dict[str, Any]) -> Resources:
    resources = container.get("resources") or {}
    limits = resources.get("limits") or {}
    requests = {**limits, **(resources.get("requests") or {})}  # a request defaults to its limit
    out: Resources = {}
    for name, raw in requests.items():
        q = quantity(raw)
        if q is not None:
            out[name] = q
    return out


def pod_requests(pod: Obj) -> Resources:
    """What a pod asks for: the sum over its containers, at least its largest init container, plus one pod."""
    spec = pod.get("spec") or {}
    total: Resources = {}
    for container in spec.get("containers") or []:
        for name, q in _container_requests(container).items():
            total[name] = total.get(name, Decimal(0)) + q
    for container in spec.get("initContainers") or []:
        for name, q in _container_requests(container).items():
            total[name] = max(total.get(name, Decimal(0)), q)
    for name, raw in ((spec.get("overhead") or {}).items()):
        extra = quantity(raw)
        if extra is not None:
            total[name] = total.get(name, Decimal(0)) + extra
    total["pods"] = Decimal(1)
    return total


def allocatable(node: Obj) -> Resources:
    out: Resources = {}
    for name, raw in ((node.get("status") or {}).get("allocatable") or {}).items():
        q = quantity(raw)
        if q is not None:
            out[name] = q
    return out


def is_ready(node: Obj) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def effective_taints(node: Obj) -> list[dict[str, Any]]:
    """The node's taints, with the ones the node lifecycle controller adds to a node that is not Ready."""
    taints = [t for t in (node.get("spec") or {}).get("taints") or [] if isinstance(t, dict)]
    if not is_ready(node) and not any(t.get("key") in (NOT_READY, "node.kubernetes.io/unreachable") for t in taints):
        taints.append({"key": NOT_READY, "effect": "NoSchedule"})
    return taints


def tolerates(tolerations: list[dict[str, Any]], taint: dict[str, Any]) -> bool:
    for tol in tolerations:
        if tol.get("effect") and tol.get("effect") != taint.get("effect"):
            continue
        operator = tol.get("operator") or "Equal"
        if operator == "Exists":
            if not tol.get("key") or tol.get("key") == taint.get("key"):
                return True
        elif tol.get("key") == taint.get("key") and (tol.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def untolerated_taint(pod_spec: dict[str, Any], node: Obj) -> dict[str, Any] | None:
    tolerations = [t for t in pod_spec.get("tolerations") or [] if isinstance(t, dict)]
    for taint in effective_taints(node):
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(tolerations, taint):
            return taint
    return None


def _expression_matches(expr: dict[str, Any], value: str | None) -> bool:
    operator = expr.get("operator")
    values = [str(v) for v in expr.get("values") or []]
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and values:
        try:
            have, want = int(value), int(values[0])
        except ValueError:
            return False
        return have > want if operator == "Gt" else have < want
    return False


def _term_matches(term: dict[str, Any], node: Obj) -> bool:
    labels = node["metadata"].get("labels") or {}
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False  # an empty term matches no objects
    return all(_expression_matches(e, labels.get(e.get("key", ""))) for e in expressions) and all(
        _expression_matches(f, node["metadata"]["name"] if f.get("key") == "metadata.name" else None)
        for f in fields)


def matches_node_selection(pod_spec: dict[str, Any], node: Obj) -> bool:
    """``nodeSelector`` and required node affinity (any term; every expression of a term)."""
    labels = node["metadata"].get("labels") or {}
    for key, value in (pod_spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return False
    required = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms")
    if terms is None:
        return True
    return any(_term_matches(term, node) for term in terms)


def affinity_node_name(pod_spec: dict[str, Any]) -> str | None:
    """The single node a pod's required affinity names by ``metadata.name`` (a DaemonSet pod), if any."""
    required = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms") or []
    if len(terms) != 1:
        return None
    fields = terms[0].get("matchFields") or []
    if len(fields) == 1 and fields[0].get("key") == "metadata.name" and fields[0].get("operator") == "In" \
            and len(fields[0].get("values") or []) == 1:
        return str(fields[0]["values"][0])
    return None


def misfit(spec: dict[str, Any], requests: Resources, node: Obj, free: Resources) -> tuple[list[str], bool]:
    """Why a pod (its spec, its :func:`pod_requests`) cannot go to ``node`` with ``free`` resources left
    (empty: it fits), and whether preemption could help (only resources can be freed by it)."""
    if (node.get("spec") or {}).get("unschedulable") and not tolerates(
            spec.get("tolerations") or [], {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}):
        return ["node(s) were unschedulable"], False
    if not matches_node_selection(spec, node):
        return ["node(s) didn't match Pod's node affinity/selector"], False
    taint = untolerated_taint(spec, node)
    if taint is not None:
        return [f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value') or ''}}}"], False
    reasons = []
    for name, want in sorted(requests.items()):
        if want > 0 and want > free.get(name, Decimal(0)):
            reasons.append("Too many pods" if name == "pods" else f"Insufficient {name}")
    return reasons, True


def free_resources(node: Obj, used: Resources | None) -> Resources:
    """What is left of ``node``'s allocatable after ``used``."""
    free = allocatable(node)
    for name, q in (used or {}).items():
        free[name] = free.get(name, Decimal(0)) - q
    return free


def unschedulable_message(total: int, reasons: Counter[str], resolvable: int) -> str:
    """The scheduler's FailedScheduling message for ``total`` nodes (reasons counted over nodes)."""
    if total == 0:
        return "no nodes available to schedule pods"
    parts = sorted(f"{count} {reason}" for reason, count in reasons.items())
    preemption = []
    if resolvable:
        preemption.append(f"{resolvable} No preemption victims found for incoming pod")
    if total - resolvable:
        preemption.append(f"{total - resolvable} Preemption is not helpful for scheduling")
    return (f"0/{total} nodes are available: {', '.join(parts)}. preemption: 0/{total} nodes are available: "
            f"{', '.join(sorted(preemption))}.")


def add_usage(used: dict[str, Resources], pod: Obj) -> None:
    """Count ``pod``'s requests against its node (terminal pods hold nothing)."""
    node = (pod.get("spec") or {}).get("nodeName")
    if not node or (pod.get("status") or {}).get("phase") in TERMINAL:
        return
    usage = used.setdefault(node, {})
    for name, q in pod_requests(pod).items():
        usage[name] = usage.get(name, Decimal(0)) + q
