"""Semantic validation the API server does beyond the OpenAPI schema, for pods, workloads and nodes.

The schema check (:mod:`.validation`) knows types and required fields; these are the rules of the
API server's validation code that ML manifests trip over, with its field paths and messages:

* container resources: an extended resource (``nvidia.com/gpu``, ``vpc.amazonaws.com/efa``) must be
  a whole number, must have a limit, and its request must equal that limit; a CPU, memory or
  ephemeral-storage request must not exceed its limit;
* tolerations: a known operator and effect, no value with ``Exists``, ``tolerationSeconds`` only
  with ``NoExecute``; node taints: a known effect, unique by key and effect;
* a workload's ``spec.selector`` must not be empty and must match its template's labels.
"""

from __future__ import annotations

import json
from typing import Any

from .errors import ApiError, FieldError
from .resources import ResourceType
from .scheduling import quantity
from .selectors import label_selector_from_match, labels_match, parse_label_selector
from .store import Key, Obj

EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_POD_SPEC_PATHS: dict[Key, tuple[str, ...]] = {
    ("", "pods"): ("spec",),
    ("apps", "deployments"): ("spec", "template", "spec"),
    ("apps", "replicasets"): ("spec", "template", "spec"),
    ("apps", "statefulsets"): ("spec", "template", "spec"),
    ("apps", "daemonsets"): ("spec", "template", "spec"),
    ("batch", "jobs"): ("spec", "template", "spec"),
}
_SELECTOR_KINDS = {("apps", "deployments"): "deployment", ("apps", "replicasets"): "replicaset",
                   ("apps", "statefulsets"): "statefulset", ("apps", "daemonsets"): "daemonset",
                   ("batch", "jobs"): "job"}
_OVERCOMMIT = ("cpu", "memory", "ephemeral-storage")


def errors(rt: ResourceType, obj: Obj) -> list[FieldError]:
    if rt.crd is not None:
        return []
    found: list[FieldError] = []
    path = _POD_SPEC_PATHS.get(rt.key)
    if path is not None:
        spec = _at(obj, path)
        if isinstance(spec, dict):
            found.extend(_pod_spec_errors(spec, ".".join(path)))
    if rt.key in _SELECTOR_KINDS:
        found.extend(_selector_errors(obj, _SELECTOR_KINDS[rt.key]))
    if rt.key == ("", "nodes"):
        found.extend(_taint_errors(obj))
    return found


def _at(obj: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


def is_extended(name: str) -> bool:
    """An extended resource: a domain-prefixed name outside ``kubernetes.io`` (and not a quota name)."""
    prefix, slash, _ = name.partition("/")
    return bool(slash) and not (prefix == "kubernetes.io" or prefix.endswith(".kubernetes.io")) \
        and not name.startswith("requests.")


def _render(value: Any) -> str:
    return json.dumps(str(value))


def _pod_spec_errors(spec: dict[str, Any], path: str) -> list[FieldError]:
    found: list[FieldError] = []
    for group in ("initContainers", "containers"):
        for index, container in enumerate(spec.get(group) or []):
            if isinstance(container, dict):
                found.extend(_resource_errors(container.get("resources"), f"{path}.{group}[{index}].resources"))
    for index, tol in enumerate(spec.get("tolerations") or []):
        if isinstance(tol, dict):
            found.extend(_toleration_errors(tol, f"{path}.tolerations[{index}]"))
    return found


def _resource_errors(resources: Any, path: str) -> list[FieldError]:
    if not isinstance(resources, dict):
        return []
    limits: dict[str, Any] = resources["limits"] if isinstance(resources.get("limits"), dict) else {}
    requests: dict[str, Any] = resources["requests"] if isinstance(resources.get("requests"), dict) else {}
    found: list[FieldError] = []
    for kind, values in (("limits", limits), ("requests", requests)):
        for name, raw in values.items():
            q = quantity(raw)
            if q is not None and is_extended(name) and q != q.to_integral_value():
                found.append(FieldError(f"{path}.{kind}[{name}]", f"Invalid value: {_render(raw)}: must be an integer"))
    for name, raw in requests.items():
        want = quantity(raw)
        if want is None:
            continue
        if name in limits:
            limit = quantity(limits[name])
            if limit is None:
                continue
            if name not in _OVERCOMMIT and want != limit:
                found.append(FieldError(f"{path}.requests", f"Invalid value: {_render(raw)}: must be equal to {name} "
                                        f"limit of {limits[name]}"))
            elif want > limit:
                found.append(FieldError(f"{path}.requests", f"Invalid value: {_render(raw)}: must be less than or "
                                        f"equal to {name} limit of {limits[name]}"))
        elif is_extended(name):
            found.append(FieldError(f"{path}.limits", "Required value: Limit must be set for non overcommitable "
                                    "resources", "FieldValueRequired"))
    return found


def _unsupported(path: str, value: Any, allowed: tuple[str, ...]) -> FieldError:
    supported = ", ".join(f'"{a}"' for a in allowed)
    return FieldError(path, f"Unsupported value: {_render(value)}: supported values: {supported}",
                      "FieldValueNotSupported")


def _toleration_errors(tol: dict[str, Any], path: str) -> list[FieldError]:
    found: list[FieldError] = []
    operator = tol.get("operator") or "Equal"
    if operator not in ("Equal", "Exists"):
        found.append(_unsupported(f"{path}.operator", operator, ("Equal", "Exists")))
    if operator == "Exists" and tol.get("value"):
        found.append(FieldError(f"{path}.operator", f"Invalid value: {_render(tol['value'])}: value must be empty "
                                "when `operator` is 'Exists'"))
    if not tol.get("key") and operator != "Exists":
        found.append(FieldError(f"{path}.operator", f"Invalid value: {_render(operator)}: operator must be Exists "
                                "when `key` is empty, which means \"match all values and all keys\""))
    effect = tol.get("effect")
    if effect and effect not in EFFECTS:
        found.append(_unsupported(f"{path}.effect", effect, EFFECTS))
    if tol.get("tolerationSeconds") is not None and effect != "NoExecute":
        found.append(FieldError(f"{path}.effect", f"Invalid value: {_render(effect or '')}: effect must be "
                                "'NoExecute' when `tolerationSeconds` is set"))
    return found


def _taint_errors(node: Obj) -> list[FieldError]:
    found: list[FieldError] = []
    seen: set[tuple[str, str]] = set()
    for index, taint in enumerate(_at(node, ("spec", "taints")) or []):
        if not isinstance(taint, dict):
            continue
        path = f"spec.taints[{index}]"
        effect = taint.get("effect")
        if not effect:
            found.append(FieldError(f"{path}.effect", "Required value", "FieldValueRequired"))
        elif effect not in EFFECTS:
            found.append(_unsupported(f"{path}.effect", effect, EFFECTS))
        pair = (str(taint.get("key")), str(effect))
        if pair in seen:
            found.append(FieldError(f"{path}", f"Duplicate value: {json.dumps({'key': pair[0], 'effect': pair[1]})}: "
                                    "taints must be unique by key and effect pair", "FieldValueDuplicate"))
        seen.add(pair)
    return found


def _go_map(labels: dict[str, Any]) -> str:
    return "map[string]string{" + ", ".join(f"{json.dumps(k)}:{json.dumps(str(v))}"
                                           for k, v in sorted(labels.items())) + "}"


def _selector_errors(obj: Obj, kind: str) -> list[FieldError]:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return []
    selector = spec.get("selector")
    if kind == "job" and not spec.get("manualSelector"):
        return []  # generated by the API server (admission)
    if not isinstance(selector, dict):
        return []  # absent: the schema's "Required value"
    if not selector.get("matchLabels") and not selector.get("matchExpressions"):
        return [FieldError("spec.selector", "Invalid value: v1.LabelSelector{MatchLabels:map[string]string(nil), "
                           f"MatchExpressions:[]v1.LabelSelectorRequirement(nil)}}: empty selector is invalid for "
                           f"{kind}")]
    labels = _at(spec, ("template", "metadata", "labels")) or {}
    if not isinstance(labels, dict):
        return []
    try:
        requirements = parse_label_selector(label_selector_from_match(selector))
    except ApiError:
        return []  # a malformed selector is the schema's to report
    if not labels_match(requirements, labels):
        return [FieldError("spec.template.metadata.labels", f"Invalid value: {_go_map(labels)}: `selector` does not "
                           "match template `labels`")]
    return []
