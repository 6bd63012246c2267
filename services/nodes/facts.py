"""What a node is, read from its slimmed watch-cache object: health, fault labels, instance id, capacity; and
Kubernetes label selectors (the list filter, bulk actions, disruption budgets), parsed once and matched in
memory. Pure functions: nothing here reads the network."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from services.errors import Invalid
from services.nodes.models import NodeItem

SM = "sagemaker.amazonaws.com/"
HEALTH_LABEL = SM + "node-health-status"
DHC_LABEL = SM + "deep-health-check-status"
GROUP_LABEL = SM + "instance-group-name"
FAULT_TYPES_LABEL = SM + "fault-types"
FAULT_REASONS_LABEL = SM + "fault-reasons"
INSTANCE_ID = re.compile(r"(i-[0-9a-f]{8,17})$")
_KEY = r"[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?"
_SET = re.compile(rf"^\s*({_KEY})\s+(in|notin)\s*\(([^)]*)\)\s*$")
_CMP = re.compile(rf"^\s*({_KEY})\s*(==|!=|=)\s*([-A-Za-z0-9_.]*)\s*$")
_EXISTS = re.compile(rf"^\s*(!?)\s*({_KEY})\s*$")

Matcher = Callable[[dict[str, str]], bool]


def labels(obj: dict[str, Any]) -> dict[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def instance_id(node: dict[str, Any]) -> str | None:
    """The HyperPod instance id: the providerID's tail (aws:///<az>/sagemaker/cluster/hyperpod-<id>-i-...), else
    the node name's (hyperpod-i-...)."""
    for text in ((node.get("spec") or {}).get("providerID") or "", node["metadata"]["name"]):
        found = INSTANCE_ID.search(text)
        if found and (SM in str(labels(node)) or "sagemaker" in text or text.startswith("hyperpod-")):
            return found.group(1)
    return None


def ready(node: dict[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def health(node: dict[str, Any]) -> str:
    """The node-health-status label, else Ready/NotReady (nodes outside HyperPod)."""
    return labels(node).get(HEALTH_LABEL) or ("Ready" if ready(node) else "NotReady")


def boot_id(node: dict[str, Any]) -> str:
    return str(((node.get("status") or {}).get("nodeInfo") or {}).get("bootID") or "")


def _int(value: Any) -> int:
    try:
        return int(str(value or 0))
    except ValueError:
        return 0


def _split(value: str | None) -> list[str]:
    return [value] if value else []


def node_item(node: dict[str, Any], pods: int) -> NodeItem:
    node_labels = labels(node)
    capacity = (node.get("status") or {}).get("capacity") or {}
    return NodeItem(name=node["metadata"]["name"], instance_id=instance_id(node),
                    instance_group=node_labels.get(GROUP_LABEL),
                    instance_type=node_labels.get("node.kubernetes.io/instance-type"),
                    zone=node_labels.get("topology.kubernetes.io/zone"), health=health(node),
                    deep_health_check=node_labels.get(DHC_LABEL),
                    fault_types=_split(node_labels.get(FAULT_TYPES_LABEL)),
                    fault_reasons=_split(node_labels.get(FAULT_REASONS_LABEL)), ready=ready(node),
                    cordoned=bool((node.get("spec") or {}).get("unschedulable")),
                    gpus=_int(capacity.get("nvidia.com/gpu")), efa=_int(capacity.get("vpc.amazonaws.com/efa")),
                    pods=pods)


def parse_selector(text: str) -> Matcher:
    """A Kubernetes label selector (``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``, ``k notin (a)``, ``k``, ``!k``,
    comma-separated, all must hold) as a matcher over a label map; Invalid on a malformed one."""
    requirements: list[tuple[str, str, frozenset[str]]] = []
    for term in _terms(text):
        if found := _SET.match(term):
            values = frozenset(v.strip() for v in found.group(4).split(",") if v.strip())
            requirements.append((found.group(1), found.group(3), values))
        elif found := _CMP.match(term):
            requirements.append((found.group(1), "notin" if found.group(3) == "!=" else "in",
                                 frozenset({found.group(4)})))
        elif found := _EXISTS.match(term):
            requirements.append((found.group(2), "absent" if found.group(1) == "!" else "exists", frozenset()))
        else:
            raise Invalid(f"invalid label selector {text!r}: cannot read {term.strip()!r}; write terms such as "
                          "'key=value', 'key!=value', 'key in (a,b)', 'key notin (a)', 'key' or '!key', "
                          "separated by commas")
    if not requirements:
        raise Invalid("the label selector is empty")

    def match(node_labels: dict[str, str]) -> bool:
        for key, op, values in requirements:
            value = node_labels.get(key)
            if (op == "in" and value not in values) or (op == "notin" and value in values) \
                    or (op == "exists" and key not in node_labels) or (op == "absent" and key in node_labels):
                return False
        return True

    return match


def _terms(text: str) -> list[str]:
    """Split on the commas outside parentheses."""
    out, depth, current = [], 0, ""
    for ch in text:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            out.append(current)
            current = ""
        else:
            current += ch
    return [t for t in [*out, current] if t.strip()]


def match_selector(selector: dict[str, Any] | None, pod_labels: dict[str, str]) -> bool:
    """A structured selector (``matchLabels``/``matchExpressions``, as a PodDisruptionBudget holds it); a null
    selector matches nothing (policy/v1), an empty one everything."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if pod_labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), set(expr.get("values") or [])
        if (op == "In" and pod_labels.get(key) not in values) or (op == "NotIn" and pod_labels.get(key) in values) \
                or (op == "Exists" and key not in pod_labels) or (op == "DoesNotExist" and key in pod_labels):
            return False
    return True
