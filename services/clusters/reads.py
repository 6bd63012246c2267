"""What ``GET /api/v1/clusters[/{cluster}]`` answers: AWS facts from the TTL cache, Kubernetes facts from
the informers' memory. A part that cannot be read is reported in ``error``, never as a failed read of the
whole list."""

from __future__ import annotations

from collections import Counter
from typing import Any

from services.aws import AwsClients
from services.awscache import AwsCache
from services.clusters.models import (
    GROUP_LABEL,
    HEALTH_LABEL,
    ClusterDetail,
    ClusterDetailQuery,
    ClusterRecord,
    InstanceGroupView,
    NodeView,
)
from services.errors import NotFound, ServiceError
from services.informers import Informers

FIRST_SYNC_SECONDS = 20.0  # the first read of a cluster waits this long for its first list


def _int(value: Any) -> int:
    try:
        return int(str(value or 0))
    except ValueError:
        return 0


def node_view(node: dict[str, Any], pods: int) -> NodeView:
    labels = _labels(node)
    status = node.get("status") or {}
    ready = _ready(node)
    capacity = status.get("capacity") or {}
    return NodeView(name=node["metadata"]["name"], instance_group=labels.get(GROUP_LABEL),
                    instance_type=labels.get("node.kubernetes.io/instance-type"), health=labels.get(HEALTH_LABEL),
                    ready=ready, gpus=_int(capacity.get("nvidia.com/gpu")),
                    efa=_int(capacity.get("vpc.amazonaws.com/efa")),
                    allocatable={k: str(v) for k, v in (status.get("allocatable") or {}).items()}, pods=pods)


class ClusterReader:
    def __init__(self, aws: AwsClients, cache: AwsCache, informers: Informers) -> None:
        self.aws = aws
        self.cache = cache
        self.informers = informers

    def _aws(self, service: str, operation: str, region: str, resource: str, refresh: bool, **params: Any) -> Any:
        def load() -> Any:  # the clients raise the error taxonomy themselves
            return getattr(self.aws.client(service, region), operation)(**params)

        return self.cache.get((service, operation, region, resource), load, refresh=refresh)[0]

    def detail(self, record: ClusterRecord, refresh: bool = False, wait: float = FIRST_SYNC_SECONDS,
               page: ClusterDetailQuery | None = None, *, summary: bool = False) -> ClusterDetail:
        """The cluster from the caches. ``summary``: counts only (no pods, no node list: what a list or a
        status answer needs, cheap on a 1,000-node cluster); ``page`` narrows and pages the node list."""
        detail = ClusterDetail(name=record.name, ownership=record.ownership, region=record.region,
                               eks_name=record.eks_name, hyperpod_name=record.hyperpod_name)
        errors: list[str] = []
        try:
            eks = self._aws("eks", "describe_cluster", record.region, record.eks_name, refresh,
                            name=record.eks_name)["cluster"]
            detail.eks_status, detail.kubernetes_version = eks.get("status"), eks.get("version")
        except ServiceError as exc:
            errors.append(f"EKS: {exc.message}")
        if record.hyperpod_name:
            try:
                hp = self._aws("sagemaker", "describe_cluster", record.region, record.hyperpod_name, refresh,
                               ClusterName=record.hyperpod_name)
                detail.hyperpod_status, detail.node_recovery = hp.get("ClusterStatus"), hp.get("NodeRecovery")
                detail.instance_groups = [
                    InstanceGroupView(name=g["InstanceGroupName"], instance_type=g.get("InstanceType", ""),
                                      current_count=g.get("CurrentCount", 0), target_count=g.get("TargetCount", 0),
                                      status=g.get("Status", "")) for g in hp.get("InstanceGroups", [])]
            except ServiceError as exc:
                errors.append(f"HyperPod: {exc.message}")
        try:
            nodes = self.informers.get(record.name, "nodes")
            pods = None if summary else self.informers.get(record.name, "pods")
        except NotFound as exc:  # forgotten while this read was under way
            detail.error = "; ".join([*errors, f"Kubernetes: {exc.message}"])
            return detail
        if refresh:
            nodes.resync(wait)
            if pods is not None:
                pods.resync(wait)
        if nodes.wait_synced(wait):
            per_node: Counter[str | None] = Counter()
            if pods is not None:
                pods.wait_synced(wait)
                per_node = Counter(p["spec"].get("nodeName") for p in pods.items()
                                   if p["status"].get("phase") not in ("Succeeded", "Failed"))
            items = nodes.items()
            detail.nodes = len(items)
            detail.health = dict(Counter(_health(n) for n in items))
            detail.cache_age_seconds = nodes.age()
            if not summary:
                self._page_nodes(detail, items, per_node, page)
        else:
            errors.append(f"Kubernetes: the node list has not arrived ({nodes.error or 'still listing'})")
        detail.error = "; ".join(errors) or None
        return detail

    @staticmethod
    def _page_nodes(detail: ClusterDetail, items: list[dict[str, Any]], per_node: Counter[str | None],
                    page: ClusterDetailQuery | None) -> None:
        """``page`` None: every node (the dashboard's overview); else filtered and paged (REST, MCP)."""
        chosen = sorted((n for n in items if page is None or _matches(n, page)),
                        key=lambda n: str(n["metadata"]["name"]))
        if page is not None and page.after is not None:
            chosen = [n for n in chosen if str(n["metadata"]["name"]) > page.after]
        shown = chosen[:page.limit] if page is not None else chosen
        for node in shown:
            view = node_view(node, per_node.get(node["metadata"]["name"], 0))
            detail.nodes_by_group.setdefault(view.instance_group or "", []).append(view)
        detail.nodes_shown = len(shown)
        detail.next_after = str(shown[-1]["metadata"]["name"]) if len(chosen) > len(shown) else None


def _labels(node: dict[str, Any]) -> dict[str, str]:
    return node["metadata"].get("labels") or {}


def _health(node: dict[str, Any]) -> str:
    """The node's health label, else Ready/NotReady from its condition (nodes outside HyperPod)."""
    return _labels(node).get(HEALTH_LABEL) or ("Ready" if _ready(node) else "NotReady")


def _ready(node: dict[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _matches(node: dict[str, Any], page: ClusterDetailQuery) -> bool:
    labels = _labels(node)
    if page.group is not None and (labels.get(GROUP_LABEL) or "") != page.group:
        return False
    return page.health is None or _health(node) == page.health
