"""Server-side printing: ``Table`` responses for ``kubectl get``.

kubectl asks for ``as=Table`` and prints the cells it gets verbatim, so the columns here are what a
user sees. Built-in kinds get the columns the real API server prints (``-o wide`` shows the ones with
priority 1); custom resources get their CRD's ``additionalPrinterColumns`` (``date`` columns rendered
as ages) or just Name and Age.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

from .resources import PrinterColumn, ResourceType
from .selectors import jsonpath_get, label_selector_from_match

Cell = Callable[[dict[str, Any]], Any]
Column = tuple[str, str, int, Cell]  # name, type, priority, cell function


def human_duration(seconds: float) -> str:
    """``k8s.io/apimachinery/pkg/util/duration.HumanDuration``."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m" if s % 60 == 0 else f"{m}m{s % 60}s"
    if m < 180:
        return f"{m}m"
    h = m // 60
    if h < 8:
        return f"{h}h" if m % 60 == 0 else f"{h}h{m % 60}m"
    if h < 48:
        return f"{h}h"
    if h < 192:
        return f"{h // 24}d" if h % 24 == 0 else f"{h // 24}d{h % 24}h"
    if h < 24 * 365 * 2:
        return f"{h // 24}d"
    if h < 24 * 365 * 8:
        y = h // (24 * 365)
        return f"{y}y{(h % (24 * 365)) // 24}d"
    return f"{h // (24 * 365)}y"


# The cluster's "now" while :func:`table` renders rows (ages are computed server-side, as the API server does).
_NOW: ContextVar[float] = ContextVar("table_now")


def _now() -> datetime:
    return datetime.fromtimestamp(_NOW.get(), UTC)


def age_of(timestamp: str | None) -> str:
    if not timestamp:
        return "<unknown>"
    try:
        then = datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return "<unknown>"
    return human_duration((_now() - then).total_seconds())


def _get(obj: Any, *path: str, default: Any = None) -> Any:
    for p in path:
        obj = obj.get(p) if isinstance(obj, dict) else None
    return default if obj is None else obj


def _name(o: dict[str, Any]) -> Any:
    return o["metadata"]["name"]


def _age(o: dict[str, Any]) -> Any:
    return age_of(o["metadata"].get("creationTimestamp"))


def _pod_ready(o: dict[str, Any]) -> str:
    total = len(_get(o, "spec", "containers", default=[]))
    ready = sum(1 for c in _get(o, "status", "containerStatuses", default=[]) if c.get("ready"))
    return f"{ready}/{total}"


def _pod_status(o: dict[str, Any]) -> str:
    if o["metadata"].get("deletionTimestamp"):
        return "Terminating"
    for cs in _get(o, "status", "containerStatuses", default=[]):
        waiting = _get(cs, "state", "waiting", "reason")
        if waiting:
            return str(waiting)
    return str(_get(o, "status", "reason") or _get(o, "status", "phase", default=""))


def _restarts(o: dict[str, Any]) -> int:
    return sum(int(c.get("restartCount", 0)) for c in _get(o, "status", "containerStatuses", default=[]))


def _node_status(o: dict[str, Any]) -> str:
    ready = next((c for c in _get(o, "status", "conditions", default=[]) if c.get("type") == "Ready"), None)
    status = "Ready" if ready and ready.get("status") == "True" else "NotReady" if ready else "Unknown"
    if _get(o, "spec", "unschedulable"):
        status += ",SchedulingDisabled"
    return status


def _node_roles(o: dict[str, Any]) -> str:
    prefix = "node-role.kubernetes.io/"
    roles = sorted(k[len(prefix):] for k in o["metadata"].get("labels") or {} if k.startswith(prefix))
    return ",".join(roles) or "<none>"


def _address(kind: str) -> Cell:
    def cell(o: dict[str, Any]) -> str:
        return next((a["address"] for a in _get(o, "status", "addresses", default=[]) if a.get("type") == kind),
                    "<none>")
    return cell


def _ports(o: dict[str, Any]) -> str:
    out = []
    for p in _get(o, "spec", "ports", default=[]):
        text = f"{p.get('port')}"
        if p.get("nodePort"):
            text += f":{p['nodePort']}"
        out.append(f"{text}/{p.get('protocol', 'TCP')}")
    return ",".join(out) or "<none>"


def _external_ip(o: dict[str, Any]) -> str:
    ingress = _get(o, "status", "loadBalancer", "ingress", default=[])
    ips = [i.get("ip") or i.get("hostname") for i in ingress] + list(_get(o, "spec", "externalIPs", default=[]))
    if ips:
        return ",".join(str(i) for i in ips)
    return "<pending>" if _get(o, "spec", "type") == "LoadBalancer" else "<none>"


def _containers(field: str) -> Cell:
    def cell(o: dict[str, Any]) -> str:
        return ",".join(str(c.get(field, "")) for c in _get(o, "spec", "template", "spec", "containers", default=[]))
    return cell


def _selector(o: dict[str, Any]) -> str:
    return label_selector_from_match(_get(o, "spec", "selector")) or "<none>"


def _count(*path: str) -> Cell:
    def cell(o: dict[str, Any]) -> int:
        return int(_get(o, *path, default=0))
    return cell


def _ratio(num: tuple[str, ...], den: tuple[str, ...]) -> Cell:
    def cell(o: dict[str, Any]) -> str:
        return f"{_get(o, *num, default=0)}/{_get(o, *den, default=0)}"
    return cell


def _job_duration(o: dict[str, Any]) -> str:
    start = _get(o, "status", "startTime")
    if not start:
        return ""
    end = _get(o, "status", "completionTime")
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    try:
        begin = datetime.strptime(start, fmt).replace(tzinfo=UTC)
        finish = datetime.strptime(end, fmt).replace(tzinfo=UTC) if end else _now()
    except ValueError:
        return ""
    return human_duration((finish - begin).total_seconds())


def _event_object(o: dict[str, Any]) -> str:
    inv = o.get("involvedObject") or {}
    return f"{str(inv.get('kind', '')).lower()}/{inv.get('name', '')}"


def _event_last_seen(o: dict[str, Any]) -> str:
    return age_of(o.get("lastTimestamp") or o.get("eventTime") or o["metadata"].get("creationTimestamp"))


def _pvc_access(o: dict[str, Any]) -> str:
    short = {"ReadWriteOnce": "RWO", "ReadOnlyMany": "ROX", "ReadWriteMany": "RWX", "ReadWriteOncePod": "RWOP"}
    modes = _get(o, "status", "accessModes") or _get(o, "spec", "accessModes", default=[])
    return ",".join(short.get(m, m) for m in modes)


def _map_selector(selector: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(selector.items())) or "<none>"


NAME: Column = ("Name", "string", 0, _name)
AGE: Column = ("Age", "string", 0, _age)

BUILTIN_COLUMNS: dict[tuple[str, str], list[Column]] = {
    ("", "pods"): [NAME, ("Ready", "string", 0, _pod_ready), ("Status", "string", 0, _pod_status),
                   ("Restarts", "string", 0, _restarts), AGE,
                   ("IP", "string", 1, lambda o: _get(o, "status", "podIP", default="<none>")),
                   ("Node", "string", 1, lambda o: _get(o, "spec", "nodeName", default="<none>")),
                   ("Nominated Node", "string", 1, lambda o: _get(o, "status", "nominatedNodeName",
                                                                   default="<none>")),
                   ("Readiness Gates", "string", 1, lambda o: "<none>")],
    ("", "nodes"): [NAME, ("Status", "string", 0, _node_status), ("Roles", "string", 0, _node_roles), AGE,
                    ("Version", "string", 0, lambda o: _get(o, "status", "nodeInfo", "kubeletVersion", default="")),
                    ("Internal-IP", "string", 1, _address("InternalIP")),
                    ("External-IP", "string", 1, _address("ExternalIP")),
                    ("Instance-Type", "string", 1, lambda o: (o["metadata"].get("labels") or {}).get(
                        "node.kubernetes.io/instance-type", "<none>")),
                    ("OS-Image", "string", 1, lambda o: _get(o, "status", "nodeInfo", "osImage", default="")),
                    ("Kernel-Version", "string", 1, lambda o: _get(o, "status", "nodeInfo", "kernelVersion",
                                                                     default="")),
                    ("Container-Runtime", "string", 1, lambda o: _get(o, "status", "nodeInfo",
                                                                        "containerRuntimeVersion", default=""))],
    ("", "namespaces"): [NAME, ("Status", "string", 0, lambda o: _get(o, "status", "phase", default="")), AGE],
    ("", "services"): [NAME, ("Type", "string", 0, lambda o: _get(o, "spec", "type", default="ClusterIP")),
                       ("Cluster-IP", "string", 0, lambda o: _get(o, "spec", "clusterIP", default="<none>")),
                       ("External-IP", "string", 0, _external_ip), ("Port(s)", "string", 0, _ports), AGE,
                       ("Selector", "string", 1, lambda o: _map_selector(_get(o, "spec", "selector", default={})))],
    ("", "configmaps"): [NAME, ("Data", "integer", 0, lambda o: len(o.get("data") or {}) +
                                len(o.get("binaryData") or {})), AGE],
    ("", "secrets"): [NAME, ("Type", "string", 0, lambda o: o.get("type", "Opaque")),
                      ("Data", "integer", 0, lambda o: len(o.get("data") or {}) + len(o.get("stringData") or {})),
                      AGE],
    ("", "serviceaccounts"): [NAME, ("Secrets", "integer", 0, lambda o: len(o.get("secrets") or [])), AGE],
    ("", "endpoints"): [NAME, ("Endpoints", "string", 0, lambda o: ",".join(
        f"{a.get('ip')}:{p.get('port')}" for s in o.get("subsets") or [] for a in s.get("addresses") or []
        for p in s.get("ports") or []) or "<none>"), AGE],
    ("", "events"): [("Last Seen", "string", 0, _event_last_seen), ("Type", "string", 0, lambda o: o.get("type", "")),
                     ("Reason", "string", 0, lambda o: o.get("reason", "")), ("Object", "string", 0, _event_object),
                     ("Message", "string", 0, lambda o: o.get("message", ""))],
    ("", "persistentvolumes"): [NAME, ("Capacity", "string", 0, lambda o: _get(o, "spec", "capacity", "storage",
                                                                              default="")),
                                ("Access Modes", "string", 0, _pvc_access),
                                ("Reclaim Policy", "string", 0, lambda o: _get(
                                    o, "spec", "persistentVolumeReclaimPolicy", default="")),
                                ("Status", "string", 0, lambda o: _get(o, "status", "phase", default="")),
                                ("Claim", "string", 0, lambda o: "/".join(
                                    x for x in (_get(o, "spec", "claimRef", "namespace", default=""),
                                                _get(o, "spec", "claimRef", "name", default="")) if x)),
                                ("StorageClass", "string", 0, lambda o: _get(o, "spec", "storageClassName",
                                                                               default="")), AGE],
    ("", "persistentvolumeclaims"): [NAME, ("Status", "string", 0, lambda o: _get(o, "status", "phase", default="")),
                                     ("Volume", "string", 0, lambda o: _get(o, "spec", "volumeName", default="")),
                                     ("Capacity", "string", 0, lambda o: _get(o, "status", "capacity", "storage",
                                                                               default="")),
                                     ("Access Modes", "string", 0, _pvc_access),
                                     ("StorageClass", "string", 0, lambda o: _get(o, "spec", "storageClassName",
                                                                                    default="")), AGE],
    ("storage.k8s.io", "storageclasses"): [
        NAME, ("Provisioner", "string", 0, lambda o: o.get("provisioner", "")),
        ("ReclaimPolicy", "string", 0, lambda o: o.get("reclaimPolicy", "Delete")),
        ("VolumeBindingMode", "string", 0, lambda o: o.get("volumeBindingMode", "Immediate")),
        ("AllowVolumeExpansion", "string", 0, lambda o: str(bool(o.get("allowVolumeExpansion"))).lower()), AGE],
    ("apps", "deployments"): [NAME, ("Ready", "string", 0, _ratio(("status", "readyReplicas"), ("spec", "replicas"))),
                              ("Up-to-date", "integer", 0, _count("status", "updatedReplicas")),
                              ("Available", "integer", 0, _count("status", "availableReplicas")), AGE,
                              ("Containers", "string", 1, _containers("name")),
                              ("Images", "string", 1, _containers("image")), ("Selector", "string", 1, _selector)],
    ("apps", "replicasets"): [NAME, ("Desired", "integer", 0, _count("spec", "replicas")),
                              ("Current", "integer", 0, _count("status", "replicas")),
                              ("Ready", "integer", 0, _count("status", "readyReplicas")), AGE,
                              ("Containers", "string", 1, _containers("name")),
                              ("Images", "string", 1, _containers("image")), ("Selector", "string", 1, _selector)],
    ("apps", "statefulsets"): [NAME, ("Ready", "string", 0, _ratio(("status", "readyReplicas"), ("spec", "replicas"))),
                               AGE, ("Containers", "string", 1, _containers("name")),
                               ("Images", "string", 1, _containers("image"))],
    ("apps", "daemonsets"): [NAME, ("Desired", "integer", 0, _count("status", "desiredNumberScheduled")),
                             ("Current", "integer", 0, _count("status", "currentNumberScheduled")),
                             ("Ready", "integer", 0, _count("status", "numberReady")),
                             ("Up-to-date", "integer", 0, _count("status", "updatedNumberScheduled")),
                             ("Available", "integer", 0, _count("status", "numberAvailable")),
                             ("Node Selector", "string", 0, lambda o: ",".join(
                                 f"{k}={v}" for k, v in sorted(_get(o, "spec", "template", "spec", "nodeSelector",
                                                                     default={}).items())) or "<none>"), AGE],
    ("batch", "jobs"): [NAME, ("Completions", "string", 0, _ratio(("status", "succeeded"), ("spec", "completions"))),
                        ("Duration", "string", 0, _job_duration), AGE,
                        ("Containers", "string", 1, _containers("name")),
                        ("Images", "string", 1, _containers("image")), ("Selector", "string", 1, _selector)],
    ("rbac.authorization.k8s.io", "rolebindings"): [
        NAME, ("Role", "string", 0, lambda o: f"{_get(o, 'roleRef', 'kind')}/{_get(o, 'roleRef', 'name')}"), AGE],
    ("rbac.authorization.k8s.io", "clusterrolebindings"): [
        NAME, ("Role", "string", 0, lambda o: f"{_get(o, 'roleRef', 'kind')}/{_get(o, 'roleRef', 'name')}"), AGE],
    ("coordination.k8s.io", "leases"): [NAME, ("Holder", "string", 0, lambda o: _get(o, "spec", "holderIdentity",
                                                                                    default="")), AGE],
    ("apiextensions.k8s.io", "customresourcedefinitions"): [
        NAME, ("Created At", "date", 0, lambda o: o["metadata"].get("creationTimestamp", ""))],
}


def _printer_cell(col: PrinterColumn) -> Cell:
    def cell(o: dict[str, Any]) -> Any:
        try:
            values = jsonpath_get(o, col.json_path)
        except ValueError:
            return "<error>"
        if not values:
            return None
        value = values[0]
        if col.type == "date" and isinstance(value, str):
            return age_of(value)
        if isinstance(value, dict | list):
            return json.dumps(value)
        return value
    return cell


def columns_for(rt: ResourceType) -> list[Column]:
    if rt.crd is not None:
        custom = [(c.name, c.type, c.priority, _printer_cell(c)) for c in rt.printer_columns]
        if not any(c.json_path == ".metadata.creationTimestamp" for c in rt.printer_columns):
            custom.append(AGE)
        return [NAME, *custom]
    return BUILTIN_COLUMNS.get(rt.key, [NAME, AGE])


def _partial(obj: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}


def table(rt: ResourceType, objs: list[dict[str, Any]], now: float, resource_version: str = "",
          continue_token: str = "", include_object: str = "Metadata", with_headers: bool = True) -> dict[str, Any]:
    """``objs`` as a ``meta.k8s.io/v1`` Table; ages are relative to ``now`` (the cluster's clock)."""
    reset = _NOW.set(now)
    try:
        return _table(rt, objs, resource_version, continue_token, include_object, with_headers)
    finally:
        _NOW.reset(reset)


def _table(rt: ResourceType, objs: list[dict[str, Any]], resource_version: str, continue_token: str,
           include_object: str, with_headers: bool) -> dict[str, Any]:
    cols = columns_for(rt)
    rows = []
    for obj in objs:
        cells = []
        for _, _, _, fn in cols:
            try:
                cells.append(fn(obj))
            except (KeyError, TypeError, ValueError, AttributeError):
                cells.append("<unknown>")
        row: dict[str, Any] = {"cells": cells}
        if include_object == "Object":
            row["object"] = obj
        elif include_object != "None":
            row["object"] = _partial(obj)
        rows.append(row)
    meta: dict[str, Any] = {}
    if resource_version:
        meta["resourceVersion"] = resource_version
    if continue_token:
        meta["continue"] = continue_token
    out: dict[str, Any] = {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "rows": rows}
    if with_headers:
        out["columnDefinitions"] = [
            {"name": name, "type": "string" if typ == "date" else typ, "format": "name" if name == "Name" else "",
             "description": name, "priority": prio}
            for name, typ, prio, _ in cols
        ]
    else:
        out["columnDefinitions"] = []
    return out
