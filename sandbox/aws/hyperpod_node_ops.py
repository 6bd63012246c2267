"""The node-level HyperPod calls: list/describe nodes, batch reboot/replace/delete/add, software updates,
deep health checks and cluster events, each on one :class:`~.hyperpod_state.ClusterRec`.

Like the cluster handlers they only validate and record intent for :mod:`.hyperpod_lifecycle`; per-node
problems are reported in the batch responses' ``Failed`` lists with AWS's error codes rather than failing
the whole call, as AWS does.
"""

from __future__ import annotations

from typing import Any

from .base import AwsError
from .hyperpod_lifecycle import Lifecycle
from .hyperpod_nodes import dns_hostname
from .hyperpod_plans import _epoch
from .hyperpod_state import BOOT, DHC, RUN, SHUTDOWN, ClusterRec, NodeRec, page

MAX_DELETE_WITH_LOGICAL = 50  # NodeIds + NodeLogicalIds combined, once NodeLogicalIds are used (the model's docs)
MAX_ADD_NODES = 50  # BatchAddClusterNodes: nodes across all groups of one request (the model's docs)


def _status(node: NodeRec) -> dict[str, str]:
    out = {"Status": node.status}
    if node.message:
        out["Message"] = node.message
    return out


def node_summary(c: ClusterRec, node: NodeRec, region: str) -> dict[str, Any]:
    g = c.group(node.group)
    out: dict[str, Any] = {"InstanceGroupName": node.group, "NodeLogicalId": node.logical_id,
                           "InstanceType": node.instance_type, "LaunchTime": node.launch_time or node.created,
                           "InstanceStatus": _status(node)}
    if node.instance_id:
        out["InstanceId"] = node.instance_id
        out["PrivateDnsHostname"] = dns_hostname(node.ip, region)
        out["CurrentImageReleaseVersion"] = node.image_release
        out["ImageVersionStatus"] = "UpToDate" if g is None or node.image_release == g.desired_release \
            else "UpdateAvailable"
    if node.last_software_update is not None:
        out["LastSoftwareUpdateTime"] = node.last_software_update
    return out


def list_nodes(c: ClusterRec, p: dict[str, Any], region: str) -> dict[str, Any]:
    after, before = _epoch(p.get("CreationTimeAfter")), _epoch(p.get("CreationTimeBefore"))
    nodes = [n for n in c.nodes if (n.instance_id or p.get("IncludeNodeLogicalIds"))
             and p.get("InstanceGroupNameContains", "") in n.group
             and (after is None or (n.launch_time or n.created) > after)
             and (before is None or (n.launch_time or n.created) < before)]
    if p.get("SortBy") == "NAME":
        def key(n: NodeRec) -> tuple[Any, ...]:
            return (n.group, n.instance_id or "", n.logical_id)
    else:
        def key(n: NodeRec) -> tuple[Any, ...]:
            return (n.launch_time or n.created, n.instance_id or "", n.logical_id)
    items, token = page(nodes, key, p.get("SortOrder") == "Descending", p.get("NextToken"),
                        int(p.get("MaxResults") or 100))
    return {"ClusterNodeSummaries": [node_summary(c, n, region) for n in items],
            **({"NextToken": token} if token else {})}


def describe_node(c: ClusterRec, p: dict[str, Any], region: str) -> dict[str, Any]:
    if ("NodeId" in p) == ("NodeLogicalId" in p):
        raise AwsError("ValidationException", "Specify exactly one of NodeId and NodeLogicalId.")
    node = c.node(instance_id=p.get("NodeId"), logical_id=p.get("NodeLogicalId"))
    if node is None:
        raise AwsError("ResourceNotFound", f"Node {p.get('NodeId') or p.get('NodeLogicalId')} not found in cluster "
                       f"{c.name}.")
    g = c.group(node.group)
    spec = g.spec if g is not None else {}
    out = node_summary(c, node, region)
    out.pop("ImageVersionStatus", None)
    out["ThreadsPerCore"] = spec.get("ThreadsPerCore", 1)
    out["CapacityType"] = node.capacity_type
    for key in ("LifeCycleConfig", "OverrideVpcConfig", "InstanceStorageConfigs", "NetworkInterface"):
        if key in spec:
            out[key] = spec[key]
    if node.instance_id:
        out["PrivatePrimaryIp"] = node.ip
        out["Placement"] = {"AvailabilityZone": node.zone, "AvailabilityZoneId": node.zone_id}
        out["CurrentImageId"] = node.image_id
        out["DesiredImageId"] = g.desired_image_id if g is not None else node.image_id
        out["DesiredImageReleaseVersion"] = g.desired_release if g is not None else node.image_release
        out["ImageVersionStatus"] = "UpToDate" if g is None or node.image_release == g.desired_release \
            else "UpdateAvailable"
    if "KubernetesConfig" in spec:
        kc = spec["KubernetesConfig"]
        out["KubernetesConfig"] = {"CurrentLabels": kc.get("Labels", {}), "DesiredLabels": kc.get("Labels", {}),
                                   "CurrentTaints": kc.get("Taints", []), "DesiredTaints": kc.get("Taints", [])}
    return {"NodeDetails": out}


def _targets(c: ClusterRec, p: dict[str, Any], limit: int | None) -> tuple[list[tuple[str, NodeRec | None]],
                                                                               list[tuple[str, NodeRec | None]]]:
    ids = list(p.get("NodeIds") or [])
    logical = list(p.get("NodeLogicalIds") or [])
    if not ids and not logical:
        raise AwsError("ValidationException", "Specify at least one of NodeIds and NodeLogicalIds.")
    if logical and not c.continuous:
        raise AwsError("ValidationException", "NodeLogicalIds are only supported for clusters with "
                       "NodeProvisioningMode set to Continuous.")
    if limit is not None and len(ids) + len(logical) > limit:
        raise AwsError("ValidationException", f"You can specify at most {limit} nodes in a single request.")
    return ([(i, c.node(instance_id=i)) for i in ids], [(i, c.node(logical_id=i)) for i in logical])


def batch_recover(c: ClusterRec, p: dict[str, Any], now: float, action: str, life: Lifecycle) -> dict[str, Any]:
    """BatchRebootClusterNodes (action ``Reboot``) and BatchReplaceClusterNodes (``Replace``)."""
    if c.status in ("Creating", "Deleting", "Failed"):
        raise AwsError("ValidationException", f"Cluster {c.name} is in {c.status} state; nodes can be "
                       f"{action.lower()}ed only when the cluster is InService.")
    by_id, by_logical = _targets(c, p, 25)
    out: dict[str, list[Any]] = {"Successful": [], "Failed": [], "SuccessfulNodeLogicalIds": [],
                                 "FailedNodeLogicalIds": []}
    for ident, node, ok_key, fail_key, id_key in (
            [(i, n, "Successful", "Failed", "NodeId") for i, n in by_id]
            + [(i, n, "SuccessfulNodeLogicalIds", "FailedNodeLogicalIds", "NodeLogicalId") for i, n in by_logical]):
        if node is None or node.instance_id is None:
            out[fail_key].append({id_key: ident, "ErrorCode": "InstanceIdNotFound",
                                  "Message": f"Node {ident} was not found in cluster {c.name}."})
        elif node.recovery or node.phase not in (RUN, DHC):
            out[fail_key].append({id_key: ident, "ErrorCode": "InvalidInstanceStatus",
                                  "Message": f"Node {ident} is in {node.status} state."})
        else:
            life.request(node, action, now)
            out[ok_key].append(ident)
            life.event(c, now, "Info", "Instance", f"{action} requested through the API.", node=node)
    return {k: v for k, v in out.items() if v or k in ("Successful", "Failed")}


def batch_delete(c: ClusterRec, p: dict[str, Any], now: float, life: Lifecycle) -> dict[str, Any]:
    if c.status in ("Creating", "Deleting"):
        raise AwsError("ValidationException", f"Cluster {c.name} is in {c.status} state.")
    if p.get("NodeLogicalIds") and len(p.get("NodeIds") or []) + len(p["NodeLogicalIds"]) > MAX_DELETE_WITH_LOGICAL:
        raise AwsError("ValidationException", f"You can specify at most {MAX_DELETE_WITH_LOGICAL} NodeIds and "
                       "NodeLogicalIds combined in a single BatchDeleteClusterNodes request; got "
                       f"{len(p.get('NodeIds') or []) + len(p['NodeLogicalIds'])}.")
    by_id, by_logical = _targets(c, p, 99)
    out: dict[str, list[Any]] = {"Successful": [], "Failed": [], "SuccessfulNodeLogicalIds": [],
                                 "FailedNodeLogicalIds": []}
    for ident, node, ok_key, fail_key, id_key in (
            [(i, n, "Successful", "Failed", "NodeId") for i, n in by_id]
            + [(i, n, "SuccessfulNodeLogicalIds", "FailedNodeLogicalIds", "NodeLogicalId") for i, n in by_logical]):
        if node is None:
            out[fail_key].append({"Code": "NodeIdNotFound", "Message": f"Node {ident} not found.", id_key: ident})
        elif node.phase == SHUTDOWN or node.recovery == "Delete" or node.end:
            out[fail_key].append({"Code": "InvalidNodeStatus", "Message": f"Node {ident} is already being "
                                  "deleted.", id_key: ident})
        else:
            g = c.group(node.group)
            if g is not None:
                g.target = max(g.target - 1, 0)
                g.spec = {**g.spec, "InstanceCount": g.target}
            life.request(node, "Delete", now)
            out[ok_key].append(ident)
    return {k: v for k, v in out.items() if v or k in ("Successful", "Failed")}


def check_add_total(p: dict[str, Any]) -> None:
    """BatchAddClusterNodes adds at most 50 nodes across all of its groups (checked before quotas)."""
    total = sum(int(spec["IncrementTargetCountBy"]) for spec in p["NodesToAdd"])
    if total > MAX_ADD_NODES:
        raise AwsError("ValidationException", f"The total number of nodes to add across all instance groups cannot "
                       f"exceed {MAX_ADD_NODES}; the request adds {total}.")


def batch_add(c: ClusterRec, p: dict[str, Any], now: float, life: Lifecycle) -> dict[str, Any]:
    if not c.continuous:
        raise AwsError("ValidationException", "BatchAddClusterNodes is only supported for clusters with "
                       "NodeProvisioningMode set to Continuous.")
    token = p.get("ClientToken")
    if token and token in c.add_tokens:
        return c.add_tokens[token]
    successful: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    for spec in p["NodesToAdd"]:
        g = c.group(spec["InstanceGroupName"])
        count = int(spec["IncrementTargetCountBy"])
        if g is None or g.status in ("Deleting", "Failed"):
            failed.append({"InstanceGroupName": spec["InstanceGroupName"], "FailedCount": count,
                           "ErrorCode": "InstanceGroupNotFound" if g is None else "InvalidInstanceGroupStatus",
                           "Message": f"Instance group {spec['InstanceGroupName']} "
                                      + ("not found." if g is None else f"is {g.status}.")})
            continue
        g.target += count
        g.spec = {**g.spec, "InstanceCount": g.target}
        for _ in range(count):
            node = life.new_node(c, g, now)
            entry: dict[str, Any] = {"NodeLogicalId": node.logical_id, "InstanceGroupName": g.name,
                                     "Status": "Pending"}
            for key in ("AvailabilityZones", "InstanceTypes"):
                if key in spec:
                    entry[key] = spec[key]
            successful.append(entry)
    result = {"Successful": successful, "Failed": failed}
    if token:
        c.add_tokens[token] = result
    return result


def update_software(c: ClusterRec, p: dict[str, Any], now: float, life: Lifecycle, latest: str,
                    amis: dict[str, str]) -> dict[str, Any]:
    if c.status != "InService":
        raise AwsError("ConflictException", f"Cluster {c.name} is in {c.status} state. UpdateClusterSoftware is "
                       "only allowed when the cluster is InService.")
    requested = {s["InstanceGroupName"]: s for s in p.get("InstanceGroups") or []}
    for name in requested:
        if c.group(name) is None:
            raise AwsError("ValidationException", f"Instance group {name} does not exist in cluster {c.name}.")
    groups = [g for g in c.groups if not requested or g.name in requested]
    for g in groups:
        release = (requested.get(g.name) or {}).get("ImageReleaseVersion") or latest
        g.desired_release = release
        g.desired_image_id = p.get("ImageId") or amis.get(release, amis[latest])
        g.software_status = "Pending"
        g.software_config = p.get("DeploymentConfig") or {}
        g.software_pending = [n.logical_id for n in c.group_nodes(g.name) if n.instance_id and not n.end]
        g.software_next = now
        if not c.continuous:
            g.status = "SystemUpdating"
    if not c.continuous:
        c.status = "SystemUpdating"
    life.event(c, now, "Info", "Cluster", "Platform software update requested for "
               + ", ".join(g.name for g in groups) + ".")
    return {"ClusterArn": c.arn}


def start_health_check(c: ClusterRec, p: dict[str, Any], now: float, life: Lifecycle) -> dict[str, Any]:
    if c.status != "InService":
        raise AwsError("ValidationException", f"Cluster {c.name} is in {c.status} state. Deep health checks can "
                       "be started only when the cluster is InService.")
    chosen: list[tuple[NodeRec, list[str]]] = []
    for conf in p["DeepHealthCheckConfigurations"]:
        g = c.group(conf["InstanceGroupName"])
        if g is None:
            raise AwsError("ValidationException", f"Instance group {conf['InstanceGroupName']} does not exist.")
        ids = conf.get("InstanceIds")
        for node in c.group_nodes(g.name):
            if ids is not None and node.instance_id not in ids:
                continue
            if node.phase != RUN or node.recovery:
                raise AwsError("ValidationException", f"Node {node.instance_id} is in {node.status} state; deep "
                               "health checks need Running nodes.")
            chosen.append((node, list(conf["DeepHealthChecks"])))
        missing = set(ids or []) - {n.instance_id for n in c.group_nodes(g.name)}
        if missing:
            raise AwsError("ValidationException", f"Nodes not found in {g.name}: {', '.join(sorted(missing))}.")
    for node, checks in chosen:
        # Back through BOOT's exit: the next tick starts the checks (labels, taint, DeepHealthCheckInProgress).
        node.phase, node.checks, node.due = BOOT, checks, now
    life.event(c, now, "Info", "Cluster", f"Deep health checks requested for {len(chosen)} instance(s).")
    return {"ClusterArn": c.arn}


def list_events(c: ClusterRec, p: dict[str, Any]) -> dict[str, Any]:
    if not c.continuous:
        raise AwsError("ValidationException", "ListClusterEvents is only supported for clusters with "
                       "NodeProvisioningMode set to Continuous.")
    after, before = _epoch(p.get("EventTimeAfter")), _epoch(p.get("EventTimeBefore"))
    events = [e for e in c.events
              if (not p.get("InstanceGroupName") or e.get("InstanceGroupName") == p["InstanceGroupName"])
              and (not p.get("NodeId") or e.get("InstanceId") == p["NodeId"])
              and (not p.get("ResourceType") or e["ResourceType"] == p["ResourceType"])
              and (not p.get("OperationId") or e.get("OperationId") == p["OperationId"])
              and (after is None or e["EventTime"] > after) and (before is None or e["EventTime"] < before)]
    items, token = page(events, lambda e: (e["EventTime"], e["EventId"]), p.get("SortOrder") == "Descending",
                        p.get("NextToken"), int(p.get("MaxResults") or 100))
    return {"Events": [{k: v for k, v in e.items() if k != "EventDetails"} for e in items],
            **({"NextToken": token} if token else {})}


def describe_event(c: ClusterRec, p: dict[str, Any]) -> dict[str, Any]:
    event = next((e for e in c.events if e["EventId"] == p["EventId"]), None)
    if event is None:
        raise AwsError("ResourceNotFound", f"Event {p['EventId']} not found in cluster {c.name}.")
    return {"EventDetails": event}

