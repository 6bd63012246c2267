"""A cluster's events timeline: HyperPod's ``ListClusterEvents`` merged with the Kubernetes Events about its
nodes and pods, newest first — the first place a diagnosis looks (why a group is short, why a node was rebooted
or replaced, what the health agent saw, why a pod does not run).

HyperPod's part is read through the AWS TTL cache: the same question asked again within the TTL costs no
AWS call, and an operation that changes the cluster invalidates it. The filters HyperPod applies itself
(instance group, instance id, time) are sent with the call; the pages (``Descending``, 100 events each) are
read until the answer is full. ``DescribeClusterEvent`` adds one event's details, cached the same way.
The Kubernetes part is the events informer's memory (Events whose ``involvedObject`` is a Node or a Pod; a
read makes no Kubernetes call). Of a pod's events only the Warnings (FailedScheduling, FailedMount, BackOff,
Evicted, ...) are in the timeline unless ``kind=pod`` asks for all of them; a pod event's node is the pod's
(the pods informer) or the kubelet's that reported it. The answer is capped at ``limit``; when more match,
``next_cursor`` (opaque) says where the next, older page starts: the last shown event's time and its tie-breaker
(HyperPod's EventId or the Kubernetes Event's uid), so events sharing one timestamp (Kubernetes' are whole
seconds) are each shown once and paging always moves on.

A part that cannot be read (ListClusterEvents needs ``NodeProvisioningMode=Continuous``; access denied; the
event list not yet arrived) is named in ``errors`` and the other part is still answered. This module only
reads: it never changes AWS or Kubernetes.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import AwareDatetime, Field

from services.auth import Principal, Role
from services.aws import AwsClients
from services.awscache import AwsCache
from services.clusters.instances import INSTANCE_ID, group_instances, instance_id_of
from services.clusters.models import GROUP_LABEL, ClusterRecord
from services.clusters.registry import ClusterRegistry
from services.errors import Invalid, NotFound, ServiceError
from services.informers import Informers
from services.models import RequestModel, ResponseModel
from services.verbs import verb

FIRST_SYNC_SECONDS = 20.0  # the first read of a cluster's events waits this long for the informer's list
PAGE = 100  # ListClusterEvents' MaxResults ceiling
MAX_PAGES = 10  # at most this many pages per read: a severity filter on a busy cluster stops here
EVENT_ID = r"[a-f0-9]{8}-[a-f0-9]{4}-[a-f0-9]{4}-[a-f0-9]{4}-[a-f0-9]{12}"  # the API's EventId pattern
EPOCH = dt.datetime.fromtimestamp(0, dt.UTC)  # an Event without any timestamp sorts last


class Severity(StrEnum):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.ERROR: 2}
HYPERPOD_LEVELS = {"Info": Severity.INFO, "Warn": Severity.WARNING, "Error": Severity.ERROR}


class EventSource(StrEnum):
    HYPERPOD = "hyperpod"  # ListClusterEvents: the cluster, its instance groups and instances
    KUBERNETES = "kubernetes"  # Events about the cluster's Nodes and Pods (kubelet, scheduler, health agent)


class EventKind(StrEnum):
    NODE = "node"  # Kubernetes Events whose involvedObject is a Node
    POD = "pod"  # ... a Pod


class ClusterEventsQuery(RequestModel):
    """Narrow the timeline; every filter is optional, newest events first."""

    since: AwareDatetime | None = Field(None, description="only events after this time, ISO 8601 with a zone "
                                                          "(e.g. 2026-12-01T18:00:00Z)")
    node: str | None = Field(None, max_length=128, pattern=r"^[a-z0-9][a-z0-9.-]*$",
                             description="only events of this node: its Kubernetes name (hyperpod-i-...) or its "
                                         "EC2 instance id (i-...)")
    group: str | None = Field(None, max_length=63, pattern=r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$",
                              description="only events of this instance group (and of its nodes)")
    severity: Severity | None = Field(None, description="at least this severity: info (everything), warning "
                                                        "(HyperPod Warn/Error, Kubernetes Warning) or error")
    source: EventSource | None = Field(None, description="only HyperPod's events or only Kubernetes' events")
    kind: EventKind | None = Field(None, description="only Kubernetes events about nodes, or about pods (every pod "
                                                     "event, Normal ones too; without it only a pod's Warnings are "
                                                     "shown); HyperPod's events are left out")
    namespace: str | None = Field(None, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
                                  description="only events of pods in this namespace (node and HyperPod events "
                                              "have none: they are left out)")
    cursor: str | None = Field(None, max_length=512, description="the previous answer's next_cursor: the next, "
                                                                 "older page (the other filters unchanged)")
    limit: int = Field(100, ge=1, le=500, description="at most this many events (the newest)")
    refresh: bool = Field(False, description="ask HyperPod again instead of the short-lived cache")


class ClusterEvent(ResponseModel):
    time: str = Field(..., description="when it happened (UTC, ISO 8601)")
    source: EventSource
    severity: Severity
    resource: str = Field(..., description="what it is about: Cluster, InstanceGroup or Instance (HyperPod), "
                                           "Node (Kubernetes)")
    group: str | None = Field(None, description="the instance group, when HyperPod names one or the node is known")
    node: str | None = Field(None, description="the Kubernetes node name, when the node has joined (a pod event: "
                                               "the pod's node)")
    namespace: str | None = Field(None, description="a pod event: the pod's namespace")
    pod: str | None = Field(None, description="a pod event: the pod's name")
    instance_id: str | None = None
    reason: str | None = Field(None, description="Kubernetes' machine-readable reason (e.g. NodeNotReady)")
    message: str
    count: int = Field(1, description="how often Kubernetes saw it (Events are deduplicated)")
    event_id: str | None = Field(None, description="HyperPod's event id: clusters_events_get answers its details")


class ClusterEventsView(ResponseModel):
    cluster: str
    events: list[ClusterEvent]
    truncated: bool = Field(False, description="more events match than were returned: narrow with since, node, "
                                               "group, kind, namespace or severity, or page on with next_cursor")
    next_cursor: str | None = Field(None, description="more events match: ask again with cursor=<this> (an opaque "
                                                      "token) for the older ones; each event is shown once")
    errors: list[str] = Field(default_factory=list, description="parts that could not be read, and why; the other "
                                                                "part is still answered")
    hyperpod_age_seconds: float | None = Field(None, description="age of HyperPod's answer in the cache")
    kubernetes_age_seconds: float | None = Field(None, description="age of the node events cache")


class ClusterEventDetail(ResponseModel):
    event: ClusterEvent
    details: dict[str, Any] = Field(default_factory=dict, description="HyperPod's EventDetails.EventMetadata "
                                                                      "(per resource type, as AWS answers it)")


Key = tuple[str, str]  # an event's place in the timeline: (its time as _iso writes it, source:id), newest largest


def encode_cursor(key: Key) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(key)).encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> Key:
    """The (time, tie-breaker) a ``next_cursor`` names; Invalid when it is not one this server wrote."""
    try:
        time, tie = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        if isinstance(time, str) and isinstance(tie, str) and _parse(time) is not None:
            return time, tie
    except (ValueError, TypeError, binascii.Error):
        pass
    raise Invalid(f"cursor {cursor[:40]!r} is not a next_cursor of this timeline: pass the previous answer's "
                  "next_cursor unchanged, or leave it out for the newest events")


def _iso(value: Any) -> str:
    if isinstance(value, dt.datetime):
        stamp = value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)
    else:
        stamp = _parse(str(value)) or EPOCH
    return stamp.astimezone(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _parse(text: str | None) -> dt.datetime | None:
    if not text:
        return None
    try:
        parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=dt.UTC)


@dataclass(frozen=True)
class _Scope:
    """Which node events a read wants, and what is known about the nodes."""

    node: str | None  # the node filter's node name
    group_nodes: set[str] | None  # the group filter's node names
    groups: dict[str, str]  # node name -> instance group
    instances: dict[str, str]  # node name -> instance id


class ClusterTimeline:
    """The read verbs of a cluster's events (the service object the composition root builds once)."""

    def __init__(self, registry: ClusterRegistry, aws: AwsClients, cache: AwsCache, informers: Informers) -> None:
        self.registry = registry
        self.aws = aws
        self.cache = cache
        self.informers = informers

    @verb(Role.VIEWER)
    def list_events(self, principal: Principal, name: str, query: ClusterEventsQuery | None = None,
                    wait: float = FIRST_SYNC_SECONDS) -> ClusterEventsView:
        """The cluster's HyperPod events and Kubernetes node and pod events, merged newest first and filtered."""
        query = query or ClusterEventsQuery()
        before = decode_cursor(query.cursor) if query.cursor else None
        record = self.registry.get(name)
        view = ClusterEventsView(cluster=name, events=[])
        # HyperPod's part needs the nodes only to name an instance's node: it takes what the informer holds
        nodes, groups = self._nodes(record, 0.0 if query.source == EventSource.HYPERPOD else wait, view.errors)
        instance_id, node_name = self._resolve_node(query.node, nodes)
        events: list[tuple[Key, ClusterEvent]] = []
        more = False
        if query.source in (None, EventSource.HYPERPOD) and query.kind is None and query.namespace is None:
            more = self._hyperpod(record, query, before, instance_id, nodes, view, events)
        if query.source in (None, EventSource.KUBERNETES):
            group_nodes = self._group_nodes(record, query.group, nodes, view.errors) if query.group else None
            scope = _Scope(node_name, group_nodes, groups, {n: i for i, n in nodes.items()})
            self._kubernetes(record, query, before, scope, wait, view, events)
        events.sort(key=lambda e: e[0], reverse=True)
        shown = events[:query.limit]
        view.events = [e for _, e in shown]
        view.truncated = more or len(events) > query.limit
        view.next_cursor = encode_cursor(shown[-1][0]) if view.truncated and shown else None
        return view

    @verb(Role.VIEWER)
    def describe_event(self, principal: Principal, name: str, event_id: str,
                       refresh: bool = False) -> ClusterEventDetail:
        """One HyperPod event with its details (``DescribeClusterEvent``), from the cache when fresh."""
        record = self.registry.get(name)
        if not re.fullmatch(EVENT_ID, event_id):
            raise Invalid(f"{event_id!r} is not a HyperPod event id (a lowercase UUID): take one from "
                          "clusters_events_list")
        if not record.hyperpod_name:
            raise NotFound(f"{name} has no HyperPod cluster registered, so it has no HyperPod events")
        hyperpod = record.hyperpod_name

        def load() -> Any:
            return self.aws.client("sagemaker", record.region).describe_cluster_event(
                ClusterName=hyperpod, EventId=event_id)["EventDetails"]

        raw, _ = self.cache.get(("sagemaker", "describe_cluster_event", record.region, hyperpod, event_id), load,
                                refresh=refresh)
        nodes, _ = self._nodes(record, 0.0, [])
        metadata = (raw.get("EventDetails") or {}).get("EventMetadata") or {}
        return ClusterEventDetail(event=_hyperpod_event(raw, nodes), details=dict(metadata))

    # ----- HyperPod ----------------------------------------------------------------------------------

    def _hyperpod(self, record: ClusterRecord, query: ClusterEventsQuery, before: Key | None,
                  instance_id: str | None, nodes: dict[str, str], view: ClusterEventsView,
                  out: list[tuple[Key, ClusterEvent]]) -> bool:
        if not record.hyperpod_name:
            view.errors.append(f"HyperPod: {record.name} has no HyperPod cluster registered")
            return False
        params: dict[str, Any] = {"ClusterName": record.hyperpod_name, "SortOrder": "Descending"}
        if query.group:
            params["InstanceGroupName"] = query.group
        if instance_id:
            params["NodeId"] = instance_id
        if query.since is not None:
            params["EventTimeAfter"] = query.since
        if before is not None:  # the cursor's millisecond too (EventTimeBefore is strict); its ties are cut below
            params["EventTimeBefore"] = (_parse(before[0]) or EPOCH) + dt.timedelta(milliseconds=1)
        level = _at_least(query.severity, lambda e: HYPERPOD_LEVELS.get(str(e.get("EventLevel")), Severity.INFO))

        def wanted(event: dict[str, Any]) -> bool:
            return level(event) and (before is None or _hyperpod_key(event) < before)

        key = ("sagemaker", "list_cluster_events", record.region, record.hyperpod_name, query.group or "",
               instance_id or "", query.since.isoformat() if query.since else "", query.cursor or "",
               str(query.severity or ""), str(query.limit))

        def load() -> tuple[list[dict[str, Any]], bool]:
            client = self.aws.client("sagemaker", record.region)
            found: list[dict[str, Any]] = []
            pages = client.get_paginator("list_cluster_events").paginate(**params, PaginationConfig={"PageSize": PAGE})
            for number, page in enumerate(pages, 1):
                found += [e for e in page.get("Events", []) if wanted(e)]
                if len(found) > query.limit or (number == MAX_PAGES and page.get("NextToken")):
                    return found, True  # full, or MAX_PAGES read with more to come
            return found, False

        try:
            (found, more), age = self.cache.get(key, load, refresh=query.refresh)
        except ServiceError as exc:
            view.errors.append(f"HyperPod: {exc.message}")
            return False
        view.hyperpod_age_seconds = round(age, 3)
        out += [(_hyperpod_key(e), _hyperpod_event(e, nodes)) for e in found]
        return bool(more)

    # ----- Kubernetes --------------------------------------------------------------------------------

    def _kubernetes(self, record: ClusterRecord, query: ClusterEventsQuery, before: Key | None, scope: _Scope,
                    wait: float, view: ClusterEventsView, out: list[tuple[Key, ClusterEvent]]) -> None:
        try:
            informer = self.informers.get(record.name, "events")
        except NotFound as exc:
            view.errors.append(f"Kubernetes: {exc.message}")
            return
        if query.refresh:
            informer.resync(wait)
        if not informer.wait_synced(wait):
            view.errors.append(f"Kubernetes: the event list has not arrived ({informer.error or 'still listing'})")
            return
        view.kubernetes_age_seconds = informer.age()
        wanted = _at_least(query.severity, lambda e: Severity.WARNING if e.get("type") == "Warning" else Severity.INFO)
        pods: dict[tuple[str, str], str] | None = None
        for event in informer.items():
            about = event.get("involvedObject") or {}
            if not wanted(event) or not self._kind_wanted(query, event, about):
                continue
            meta = event.get("metadata") or {}
            when = _parse(event.get("lastTimestamp")) or _parse(meta.get("creationTimestamp"))
            place = (_iso(when or EPOCH), f"{EventSource.KUBERNETES.value}:"
                     f"{meta.get('uid') or (str(meta.get('namespace') or '') + '/' + str(meta.get('name') or ''))}")
            if (query.since is not None and (when is None or when <= query.since)) or (
                    before is not None and place >= before):
                continue
            namespace = pod = None
            if about.get("kind") == "Pod":
                namespace = str(about.get("namespace") or meta.get("namespace") or "")
                pod = str(about.get("name") or "")
                if pods is None:
                    pods = self._pod_nodes(record)
                node = pods.get((namespace, pod)) or event.get("host") or None
            else:
                node = str(about.get("name") or "")
            if (scope.node is not None and node != scope.node) or (scope.group_nodes is not None
                                                                   and node not in scope.group_nodes):
                continue
            out.append((place, ClusterEvent(
                time=place[0], source=EventSource.KUBERNETES,
                severity=Severity.WARNING if event.get("type") == "Warning" else Severity.INFO,
                resource=str(about.get("kind")), group=scope.groups.get(node or ""), node=node,
                instance_id=scope.instances.get(node or ""), namespace=namespace, pod=pod,
                reason=event.get("reason"), message=str(event.get("message") or ""),
                count=int(event.get("count") or 1))))

    @staticmethod
    def _kind_wanted(query: ClusterEventsQuery, event: dict[str, Any], about: dict[str, Any]) -> bool:
        """A Node event unless pods are asked for; a Pod event if it is a Warning or pods are asked for."""
        kind = about.get("kind")
        if kind == "Node":
            return query.kind in (None, EventKind.NODE) and query.namespace is None
        if kind != "Pod" or query.kind is EventKind.NODE:
            return False
        if query.namespace is not None and (about.get("namespace") or (event.get("metadata") or {}).get(
                "namespace")) != query.namespace:
            return False
        return query.kind is EventKind.POD or event.get("type") == "Warning"

    def _pod_nodes(self, record: ClusterRecord) -> dict[tuple[str, str], str]:
        """(namespace, pod) -> its node, from the pods informer's memory (no call; empty until it has listed)."""
        try:
            informer = self.informers.get(record.name, "pods")
        except NotFound:
            return {}
        return {(str(p["metadata"].get("namespace") or ""), str(p["metadata"]["name"])): str(p["spec"]["nodeName"])
                for p in informer.items() if (p.get("spec") or {}).get("nodeName")}

    # ----- nodes -------------------------------------------------------------------------------------

    def _nodes(self, record: ClusterRecord, wait: float, errors: list[str]) -> tuple[dict[str, str], dict[str, str]]:
        """From the nodes informer (empty until its first list): instance id → node name, and node name → the
        group its label names (shown beside a node's events; the group filter asks HyperPod instead)."""
        try:
            informer = self.informers.get(record.name, "nodes")
        except NotFound as exc:
            errors.append(f"Kubernetes: {exc.message}")
            return {}, {}
        informer.wait_synced(wait)
        names: dict[str, str] = {}
        groups: dict[str, str] = {}
        for node in informer.items():
            name = str(node["metadata"]["name"])
            found = instance_id_of(name, (node.get("spec") or {}).get("providerID"))
            if found:
                names[found] = name
            group = (node["metadata"].get("labels") or {}).get(GROUP_LABEL)
            if group:
                groups[name] = str(group)
        return names, groups

    @staticmethod
    def _resolve_node(node: str | None, nodes: dict[str, str]) -> tuple[str | None, str | None]:
        """``(instance id, node name)`` for the ``node`` filter, either of which it may name."""
        if node is None:
            return None, None
        if INSTANCE_ID.fullmatch(node):
            return node, nodes.get(node, f"hyperpod-{node}")
        instance = next((i for i, n in nodes.items() if n == node), None) or instance_id_of(node, None)
        if instance is None:
            raise Invalid(f"node {node!r} is neither a HyperPod node of this cluster nor an instance id (i-...)",
                          details={"nodes": sorted(nodes.values())[:50]})
        return instance, node

    def _group_nodes(self, record: ClusterRecord, group: str, nodes: dict[str, str], errors: list[str]) -> set[str]:
        """The node names of ``group``: the instances HyperPod lists for it (cached), mapped to their nodes."""
        if not record.hyperpod_name:
            return set()
        hyperpod = record.hyperpod_name
        try:
            instances, _ = self.cache.get(
                ("sagemaker", "list_cluster_nodes", record.region, hyperpod, group),
                lambda: group_instances(self.aws.client("sagemaker", record.region), hyperpod, group))
        except ServiceError as exc:
            errors.append(f"HyperPod: {exc.message}")
            return set()
        return {nodes.get(i, f"hyperpod-{i}") for i in instances}


def _at_least(severity: Severity | None, of: Callable[[dict[str, Any]], Severity]) -> Callable[[dict[str, Any]], bool]:
    if severity is None:
        return lambda event: True
    return lambda event: RANK[of(event)] >= RANK[severity]


def _hyperpod_key(event: dict[str, Any]) -> Key:
    return _iso(event.get("EventTime")), f"{EventSource.HYPERPOD.value}:{event.get('EventId') or ''}"


def _hyperpod_event(event: dict[str, Any], nodes: dict[str, str]) -> ClusterEvent:
    instance = event.get("InstanceId")
    return ClusterEvent(
        time=_iso(event.get("EventTime")), source=EventSource.HYPERPOD,
        severity=HYPERPOD_LEVELS.get(str(event.get("EventLevel")), Severity.INFO),
        resource=str(event.get("ResourceType") or "Cluster"), group=event.get("InstanceGroupName"),
        node=nodes.get(instance) if instance else None, instance_id=instance,
        message=str(event.get("Description") or ""), event_id=event.get("EventId"))
