"""What ``GET /api/v1/clusters[/{cluster}]`` answers: AWS facts from the TTL cache, Kubernetes facts from
the informers' memory. A part that cannot be read is reported in ``error``, never as a failed read of the
whole list.

The AWS part is stale-while-revalidate: an entry past its TTL is answered at once and refreshed by a
background worker (at most one refresh per key in flight), so a read without ``refresh`` never waits on AWS
once a resource has been read. With ``wait=0`` a read touches memory only (it can run on the event loop):
a resource never read (or invalidated by an operation) and a cluster whose first list has not arrived are
loaded in the background and the answer says ``loading``; with ``wait > 0`` (a worker) they are read
before answering, as the first read of a cluster is."""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from services.aws import AwsClients
from services.awscache import AwsCache
from services.clusters.models import (
    GROUP_LABEL,
    HEALTH_LABEL,
    ClusterDetail,
    ClusterDetailQuery,
    ClusterRecord,
    ClusterSummary,
    InstanceGroupView,
    NodeView,
)
from services.errors import NotFound, ServiceError
from services.informers import Informer, Informers

FIRST_SYNC_SECONDS = 20.0  # the first read of a cluster waits this long for its first list
REVALIDATE_WORKERS = 2  # background AWS refreshes at once (each key at most once in flight)
MEMO_ENTRIES = 256  # reused memory-only reads kept (one per cluster and page asked); past it, all are dropped
SUMMARY_FIELDS = set(ClusterSummary.model_fields)
AGE_KEY = '"cache_age_seconds":'
AGE_DIGITS = 2  # cache ages are answered to 10 ms (decimal places)


class _Reused:
    """A memory-only read kept for reuse: the stamp of its inputs, what was derived from them, and its JSON
    before and after the ``cache_age_seconds`` value (None for a summary, which carries no fresh age).

    Ages are answered to 10 ms (:data:`AGE_DIGITS`), so the copy made for one age (the reused detail with
    that age, and its JSON with the age written in) serves every read of the same 10 ms."""

    __slots__ = ("around_age", "detail", "last", "stamp")

    def __init__(self, stamp: tuple[Any, ...], detail: ClusterDetail, around_age: tuple[str, str] | None) -> None:
        self.stamp = stamp
        self.detail = detail
        self.around_age = around_age
        self.last = detail

    def aged(self, synced_at: float | None) -> ClusterDetail:
        if self.around_age is None or synced_at is None:
            return self.detail
        age = round(max(0.0, time.monotonic() - synced_at), AGE_DIGITS)
        last = self.last  # one read, as a worker thread may replace it meanwhile
        if last.cache_age_seconds == age:
            return last
        aged = self.detail.model_copy(update={"cache_age_seconds": age})
        aged.with_encoded(self.around_age[0] + repr(age) + self.around_age[1])
        self.last = aged
        return aged


class _NotRead(Exception):
    """A memory-only read found no entry: its load was started in the background."""


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
        self._refresher = ThreadPoolExecutor(REVALIDATE_WORKERS, thread_name_prefix="aws-revalidate")
        self._in_flight: set[tuple[str, ...]] = set()
        self._lock = threading.Lock()
        #: memory-only reads by (cluster, summary, page)
        self._memo: dict[tuple[Any, ...], _Reused] = {}
        self._summaries: dict[str, tuple[ClusterDetail, ClusterSummary]] = {}

    def _aws(self, service: str, operation: str, region: str, resource: str, refresh: bool, wait: float,
             **params: Any) -> Any:
        def load() -> Any:  # the clients raise the error taxonomy themselves
            return getattr(self.aws.client(service, region), operation)(**params)

        key = (service, operation, region, resource)
        cached = None if refresh else self.cache.peek(key)
        if cached is not None:
            answer, stale = cached
            if stale:
                self._revalidate(key, load)
            return answer()
        if wait > 0 or refresh:  # a worker's read: load now (concurrent misses share one load)
            return self.cache.get(key, load, refresh=refresh)[0]
        self._revalidate(key, load)
        raise _NotRead

    def _revalidate(self, key: tuple[str, ...], load: Any) -> None:
        """Refresh ``key`` on a background worker unless a refresh of it is already under way."""
        with self._lock:
            if key in self._in_flight:
                return
            self._in_flight.add(key)

        def run() -> None:
            try:
                self.cache.get(key, load, refresh=True)
            except ServiceError:
                pass  # cached as the entry's failure: the next read reports it
            finally:
                with self._lock:
                    self._in_flight.discard(key)

        self._refresher.submit(run)

    def close(self) -> None:
        """Stop the background refreshes (those under way finish)."""
        self._refresher.shutdown(wait=False, cancel_futures=True)

    def detail(self, record: ClusterRecord, refresh: bool = False, wait: float = FIRST_SYNC_SECONDS,
               page: ClusterDetailQuery | None = None, *, summary: bool = False) -> ClusterDetail:
        """The cluster from the caches. ``summary``: counts only (no pods, no node list: what a list or a
        status answer needs, cheap on a 1,000-node cluster); ``page`` narrows and pages the node list.

        A memory-only read (``wait=0``, no ``refresh``) is derived once per state of its inputs and then
        reused: the registry record, the AWS answers and the informers' versions are compared, not the
        objects rebuilt (only ``cache_age_seconds`` is brought up to date). What is handed out is shared:
        callers read it, never change it. Its JSON is encoded once per state too (:class:`_Reused`)."""
        eks = self._part("eks", "describe_cluster", record.region, record.eks_name, refresh, wait,
                         name=record.eks_name)
        hp = self._part("sagemaker", "describe_cluster", record.region, record.hyperpod_name, refresh, wait,
                        ClusterName=record.hyperpod_name) if record.hyperpod_name else None
        try:
            nodes = self.informers.get(record.name, "nodes")
            pods = None if summary else self.informers.get(record.name, "pods")
        except NotFound as exc:  # forgotten while this read was under way
            detail = self._aws_facts(record, eks, hp)
            detail.error = "; ".join([*([detail.error] if detail.error else []), f"Kubernetes: {exc.message}"])
            return detail
        if refresh or wait > 0:
            return self._build(record, eks, hp, nodes, pods, refresh, wait, page, summary)
        key = (record.name, summary, None if page is None else (page.group, page.health, page.after, page.limit))
        version, synced_at = nodes.stamp()  # before the objects are read: a later change makes a new stamp
        stamp = (record, eks, hp, version, nodes.synced.is_set(), nodes.error,
                 None if pods is None else (pods.stamp()[0], pods.synced.is_set(), pods.error))
        memo = self._memo.get(key)
        if memo is not None and memo.stamp == stamp:
            return memo.aged(synced_at)
        detail = self._build(record, eks, hp, nodes, pods, refresh, wait, page, summary)
        if not detail.loading:
            if len(self._memo) >= MEMO_ENTRIES:
                self._memo.clear()
            self._memo[key] = _Reused(stamp, detail, None if summary else _around_age(detail))
        return detail

    def summary(self, record: ClusterRecord, refresh: bool = False,
                wait: float = FIRST_SYNC_SECONDS) -> ClusterSummary:
        """The cluster's counts as a :class:`ClusterSummary` (a list's row), reused like :meth:`detail`."""
        detail = self.detail(record, refresh, wait, summary=True)
        made = self._summaries.get(record.name)
        if made is not None and made[0] is detail:
            return made[1]
        row = ClusterSummary(**detail.model_dump(include=SUMMARY_FIELDS))
        if len(self._summaries) >= MEMO_ENTRIES:
            self._summaries.clear()
        self._summaries[record.name] = (detail, row)
        return row

    def _part(self, service: str, operation: str, region: str, resource: str, refresh: bool, wait: float,
              **params: Any) -> Any:
        """An AWS answer, or the :class:`ServiceError` it is cached as, or a :class:`_NotRead`."""
        try:
            return self._aws(service, operation, region, resource, refresh, wait, **params)
        except (ServiceError, _NotRead) as exc:
            return exc

    @staticmethod
    def _aws_facts(record: ClusterRecord, eks: Any, hp: Any) -> ClusterDetail:
        detail = ClusterDetail(name=record.name, ownership=record.ownership, region=record.region,
                               eks_name=record.eks_name, hyperpod_name=record.hyperpod_name)
        errors: list[str] = []
        if isinstance(eks, ServiceError):
            errors.append(f"EKS: {eks.message}")
        elif isinstance(eks, _NotRead):
            detail.loading = True
        else:
            detail.eks_status, detail.kubernetes_version = eks["cluster"].get("status"), eks["cluster"].get("version")
        if isinstance(hp, ServiceError):
            errors.append(f"HyperPod: {hp.message}")
        elif isinstance(hp, _NotRead):
            detail.loading = True
        elif hp is not None:
            detail.hyperpod_status, detail.node_recovery = hp.get("ClusterStatus"), hp.get("NodeRecovery")
            detail.instance_groups = [
                InstanceGroupView(name=g["InstanceGroupName"], instance_type=g.get("InstanceType", ""),
                                  current_count=g.get("CurrentCount", 0), target_count=g.get("TargetCount", 0),
                                  status=g.get("Status", "")) for g in hp.get("InstanceGroups", [])]
        detail.error = "; ".join(errors) or None
        return detail

    def _build(self, record: ClusterRecord, eks: Any, hp: Any, nodes: Informer, pods: Informer | None,
               refresh: bool, wait: float, page: ClusterDetailQuery | None, summary: bool) -> ClusterDetail:
        detail = self._aws_facts(record, eks, hp)
        errors = [detail.error] if detail.error else []
        if refresh:
            nodes.resync(wait)
            if pods is not None:
                pods.resync(wait)
        if nodes.wait_synced(wait):
            per_node: Counter[str | None] = Counter()
            if pods is not None:
                if not pods.wait_synced(wait) and wait <= 0 and pods.error is None:
                    detail.loading = True  # pod counts follow once the pods' first list is in
                per_node = Counter(p["spec"].get("nodeName") for p in pods.items()
                                   if p["status"].get("phase") not in ("Succeeded", "Failed"))
            items = nodes.items()
            detail.nodes = len(items)
            detail.health = dict(Counter(_health(n) for n in items))
            age = nodes.age()
            detail.cache_age_seconds = None if age is None else round(age, AGE_DIGITS)
            if not summary:
                self._page_nodes(detail, items, per_node, page)
        elif wait <= 0 and nodes.error is None:
            detail.loading = True  # the first list is under way
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


def _around_age(detail: ClusterDetail) -> tuple[str, str] | None:
    """The detail's JSON before and after its ``cache_age_seconds`` value (None when it has no age). The key
    found is the top level's, the last match: inside a string value its quotes would be escaped, but a key of
    ``nodes_by_group`` (a node's group label, before it) may be that very word, and the fields after it
    (``nodes_shown``, ``next_after``: a number and a node name) cannot hold it. The value is a number, ended by
    the comma before ``nodes_shown``."""
    if detail.cache_age_seconds is None:
        return None
    before, key, after = detail.encoded().rpartition(AGE_KEY)
    return before + key, after[after.index(","):]


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
