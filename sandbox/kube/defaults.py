"""API defaulting for built-in kinds: the fields the API server fills in on every write.

Clients read these fields back and rely on them: ``kubectl get job`` prints ``0/1`` from
``spec.completions``, the Python client expects ``spec.replicas == 1`` rather than ``None``, a Service
has a ``clusterIP`` to print and to connect to. An emulator storing objects exactly as sent disagrees
with every real cluster, so, like the API server, defaulting runs on every write (create, update, patch,
apply) before validation and before ``generation`` is compared: re-sending a manifest without the
defaulted fields is then a no-op, as it is against a real cluster.

The defaults are one small table per kind plus the pod-spec defaults, applied wherever a kind embeds a
pod (a Pod's own spec, a workload's ``spec.template.spec``). Only the core, long-stable defaults are
here: no feature-gated fields and nothing that admission plugins add (service accounts, tolerations).
With them comes the check real clusters make on the defaulted ``restartPolicy`` of a workload's
template (a Job's ``Always``, the default, is refused).

Service cluster IPs come from 10.100.0.0/16 (one of the two service CIDRs EKS picks when none is
given). They are allocated against the Services the store holds, so they are unique per cluster, and
being part of the persisted object they are kept across restarts. ``clusterIP: None`` (a headless
Service) is honoured, an update that omits the IP keeps the allocated one, and changing it is refused
as on a real cluster.
"""

from __future__ import annotations

import ipaddress
import random
from collections.abc import Callable, Iterable
from typing import Any

from .errors import FieldError, invalid
from .resources import ResourceType
from .store import Key, Obj

Path = tuple[str, ...]

SERVICE_CIDR = ipaddress.IPv4Network("10.100.0.0/16")

# Plain defaults per kind: (path, value), set where absent. The first path element must already be an
# object (a missing ``spec`` is left for validation to report); deeper missing objects are created.
_FIELDS: dict[Key, tuple[tuple[Path, Any], ...]] = {
    ("apps", "deployments"): (
        (("spec", "replicas"), 1),
        (("spec", "revisionHistoryLimit"), 10),
        (("spec", "progressDeadlineSeconds"), 600),
        (("spec", "strategy", "type"), "RollingUpdate"),
    ),
    ("apps", "replicasets"): ((("spec", "replicas"), 1),),
    ("apps", "statefulsets"): (
        (("spec", "replicas"), 1),
        (("spec", "podManagementPolicy"), "OrderedReady"),
        (("spec", "revisionHistoryLimit"), 10),
        (("spec", "updateStrategy", "type"), "RollingUpdate"),
        (("spec", "persistentVolumeClaimRetentionPolicy", "whenDeleted"), "Retain"),
        (("spec", "persistentVolumeClaimRetentionPolicy", "whenScaled"), "Retain"),
    ),
    ("apps", "daemonsets"): (
        (("spec", "revisionHistoryLimit"), 10),
        (("spec", "updateStrategy", "type"), "RollingUpdate"),
    ),
    ("batch", "jobs"): (  # and completions=1, but only when parallelism is unset too (see apply_defaults)
        (("spec", "parallelism"), 1),
        (("spec", "backoffLimit"), 6),
        (("spec", "completionMode"), "NonIndexed"),
        (("spec", "suspend"), False),
    ),
    ("", "services"): (
        (("spec", "type"), "ClusterIP"),
        (("spec", "sessionAffinity"), "None"),
    ),
}

# The rolling-update parameters, defaulted only while the strategy is RollingUpdate: (strategy, values).
_ROLLING: dict[Key, tuple[Path, dict[str, Any]]] = {
    ("apps", "deployments"): (("spec", "strategy"), {"maxSurge": "25%", "maxUnavailable": "25%"}),
    ("apps", "statefulsets"): (("spec", "updateStrategy"), {"partition": 0}),
    ("apps", "daemonsets"): (("spec", "updateStrategy"), {"maxUnavailable": 1, "maxSurge": 0}),
}

_TEMPLATE: Path = ("spec", "template", "spec")
# Where each kind keeps a pod spec, and the restart policies its validation accepts there.
_POD_SPECS: dict[Key, tuple[Path, tuple[str, ...]]] = {
    ("", "pods"): (("spec",), ("Always", "OnFailure", "Never")),
    ("apps", "deployments"): (_TEMPLATE, ("Always",)),
    ("apps", "replicasets"): (_TEMPLATE, ("Always",)),
    ("apps", "statefulsets"): (_TEMPLATE, ("Always",)),
    ("apps", "daemonsets"): (_TEMPLATE, ("Always",)),
    ("batch", "jobs"): (_TEMPLATE, ("OnFailure", "Never")),
}

_POD_SPEC_FIELDS: tuple[tuple[str, Any], ...] = (
    ("restartPolicy", "Always"),
    ("dnsPolicy", "ClusterFirst"),
    ("terminationGracePeriodSeconds", 30),
    ("schedulerName", "default-scheduler"),
    ("securityContext", {}),
)
_CONTAINER_FIELDS: tuple[tuple[str, Any], ...] = (
    ("terminationMessagePath", "/dev/termination-log"),
    ("terminationMessagePolicy", "File"),
)

ServiceSource = Callable[[], Iterable[Obj]]


def apply_defaults(rt: ResourceType, obj: Obj, old: Obj | None, services: ServiceSource) -> None:
    """Fill in ``obj``'s defaults in place. ``old`` is the stored object on an update; ``services``
    lists the cluster's other Services (called only to allocate or check a cluster IP). Raises the
    API server's 422 when a Service asks for a cluster IP it cannot have."""
    key = rt.key
    if rt.crd is not None:
        return
    if key == ("batch", "jobs"):
        spec = obj.get("spec")
        if isinstance(spec, dict) and "completions" not in spec and "parallelism" not in spec:
            spec["completions"] = 1
    for path, value in _FIELDS.get(key, ()):
        _set_default(obj, path, value)
    if key in _ROLLING:
        path, values = _ROLLING[key]
        strategy = _at(obj, path)
        if strategy is not None and strategy.get("type") == "RollingUpdate":
            rolling = strategy.setdefault("rollingUpdate", {})
            if isinstance(rolling, dict):
                for name, value in values.items():
                    rolling.setdefault(name, value)
    if key in _POD_SPECS:
        pod_spec = _at(obj, _POD_SPECS[key][0])
        if pod_spec is not None:
            _default_pod_spec(pod_spec)
    if key == ("", "services"):
        _default_service(obj, old, services)


def template_errors(rt: ResourceType, obj: Obj) -> list[FieldError]:
    """The restart policy a kind's pod (template) may not have, e.g. a Job's defaulted ``Always``."""
    if rt.crd is not None or rt.key not in _POD_SPECS:
        return []
    path, allowed = _POD_SPECS[rt.key]
    pod_spec = _at(obj, path)
    policy = pod_spec.get("restartPolicy") if pod_spec is not None else None
    if policy is None or policy in allowed:
        return []
    supported = ", ".join(f'"{p}"' for p in allowed)
    return [FieldError(".".join((*path, "restartPolicy")), f'Unsupported value: "{policy}": supported values: '
                       f"{supported}", "FieldValueNotSupported")]


def image_pull_policy(image: str) -> str:
    """``Always`` for ``:latest`` or an untagged image, else ``IfNotPresent`` (digests included)."""
    if "@" in image:
        return "IfNotPresent"
    last = image.rsplit("/", 1)[-1]
    tag = last.partition(":")[2]
    return "Always" if tag in ("", "latest") else "IfNotPresent"


def _default_pod_spec(spec: dict[str, Any]) -> None:
    for name, value in _POD_SPEC_FIELDS:
        spec.setdefault(name, dict(value) if isinstance(value, dict) else value)
    for group in ("initContainers", "containers"):
        for container in _objects(spec.get(group)):
            for name, value in _CONTAINER_FIELDS:
                container.setdefault(name, value)
            if isinstance(container.get("image"), str):
                container.setdefault("imagePullPolicy", image_pull_policy(container["image"]))
            for port in _objects(container.get("ports")):
                port.setdefault("protocol", "TCP")


def _default_service(svc: Obj, old: Obj | None, services: ServiceSource) -> None:
    spec = svc.get("spec")
    if not isinstance(spec, dict):
        return
    for port in _objects(spec.get("ports")):
        port.setdefault("protocol", "TCP")
        if "port" in port:
            port.setdefault("targetPort", port["port"])
    if spec.get("type") == "ExternalName":
        return
    old_ip = ((old or {}).get("spec") or {}).get("clusterIP") or ""
    ip = spec.get("clusterIP") or ""
    name = svc["metadata"].get("name", "")
    if not ip:
        ip = old_ip or _allocate(_used_ips(services))
    elif old_ip and ip != old_ip:
        raise invalid("Service", "", name, [FieldError("spec.clusterIP", f'Invalid value: "{ip}": field is '
                                                                         "immutable")])
    elif ip != "None" and ip != old_ip:
        _check_requested(name, ip, _used_ips(services))
    spec["clusterIP"] = ip
    spec.setdefault("clusterIPs", [ip])


def _used_ips(services: ServiceSource) -> set[str]:
    return {ip for svc in services() if isinstance(ip := (svc.get("spec") or {}).get("clusterIP"), str)}


def _allocate(used: set[str]) -> str:
    """A free address of the service CIDR (not its network or broadcast address), from a random start
    as the API server's allocator does."""
    size = SERVICE_CIDR.num_addresses - 2
    start = random.randrange(size)
    for i in range(size):
        candidate = str(SERVICE_CIDR.network_address + 1 + (start + i) % size)
        if candidate not in used:
            return candidate
    raise invalid("Service", "", "", [FieldError("spec.clusterIPs", "Internal error: failed to allocate a "
                                                 f"serviceIP: range is full ({SERVICE_CIDR})")])


def _check_requested(name: str, ip: str, used: set[str]) -> None:
    try:
        address = ipaddress.IPv4Address(ip)
    except ValueError:
        reason = "must be a valid IP address"
    else:
        if address not in SERVICE_CIDR or address in (SERVICE_CIDR.network_address, SERVICE_CIDR.broadcast_address):
            reason = f"failed to allocate IP {ip}: the provided IP ({ip}) is not in the valid range. The range " \
                     f"of valid IPs is {SERVICE_CIDR}"
        elif ip in used:
            reason = f"failed to allocate IP {ip}: provided IP is already allocated"
        else:
            return
    raise invalid("Service", "", name, [FieldError("spec.clusterIPs", f'Invalid value: ["{ip}"]: {reason}')])


def _objects(value: Any) -> list[dict[str, Any]]:
    """The objects of a list field (anything else is validation's to report)."""
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _at(obj: Obj, path: Path) -> dict[str, Any] | None:
    """The object at ``path``, or None when some step is missing or not an object."""
    cur: Any = obj
    for part in path:
        cur = cur.get(part) if isinstance(cur, dict) else None
    return cur if isinstance(cur, dict) else None


def _set_default(obj: Obj, path: Path, value: Any) -> None:
    cur = obj.get(path[0])
    if not isinstance(cur, dict):
        return
    for part in path[1:-1]:
        cur = cur.setdefault(part, {})
        if not isinstance(cur, dict):
            return
    cur.setdefault(path[-1], value)
