"""HyperPod's managed Karpenter in the sandbox: what HyperPod does for a cluster whose ``AutoScaling`` is
``Mode=Enable, AutoScalerType=Karpenter`` (aws-facts §6, §9; docs sagemaker-hyperpod-eks-autoscaling).

* Enabling installs Karpenter's v1 CRDs into the EKS cluster: the real ``karpenter.sh/v1`` NodePool CRD and a
  reconstructed ``karpenter.sagemaker.amazonaws.com/v1`` HyperpodNodeClass CRD (the real one is not public).
  The Karpenter controller itself runs in HyperPod's control plane, not as pods of the cluster.
* On every tick the controller looks at the cluster's pending pods (unbound, ``PodScheduled=False`` with reason
  ``Unschedulable``; DaemonSet pods never count) and at each NodePool whose ``nodeClassRef`` names a
  HyperpodNodeClass. A pod can go to an instance group of that class when a new node of the group (its labels,
  taints and allocatable, :func:`~.hyperpod_nodes.template_node`, plus the NodePool's template labels and
  taints) satisfies the NodePool's requirements and the default scheduler's filters for the pod. Pods are
  packed first onto the room left on the group's live nodes (the scheduler places them there), then onto new
  nodes; the group's target is raised by the new nodes, as ``BatchAddClusterNodes`` would, within the
  NodePool's ``limits.nodes`` (over all of its groups) and the 6758-instance cap of a group. The nodes then
  launch and join like any other HyperPod node, so DescribeCluster and ``kubectl get nodes`` show them.

``AutoScaling.Status`` (InService | Failed | Creating | Deleting, the API's enum): enabling on a running cluster
is Creating for :data:`SCALING_SECONDS` (an assumption: HyperPod documents no duration), then InService, or
Failed with a ``FailureMessage`` when an ``autoscaling_failed`` fault (target ``cluster``, optional ``message``)
names the cluster; a Failed autoscaling scales nothing. Disabling reads ``Mode=Disable`` at once and is
Deleting for as long, then InService. A cluster created with autoscaling on is Creating while it is.

Consolidation is "when empty" only: a running node of the pool's groups that has held no pod but DaemonSets'
for the pool's ``consolidateAfter`` (simulated time; ``Never`` keeps it) is deleted and its group's target
lowered, while no pending pod is headed for those groups; the timers live in memory (a restart starts them
again). Not simulated: moving pods off underutilized nodes, disruption budgets, ``limits`` other than
``nodes``, weights between NodePools (they are taken in name order), availability-zone requirements (a zone is
picked at launch), and Karpenter draining a deleted NodePool's nodes (they stay until empty and consolidated
by another pool, or deleted).
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any

from sandbox.kube import install_component_crds
from sandbox.kube.cluster import Cluster
from sandbox.kube.emulator import Emulator
from sandbox.kube.errors import ApiError
from sandbox.kube.scheduling import free_resources, matches_node_selection, misfit, pod_requests

from .base import FaultRegistry
from .hyperpod_lifecycle import Lifecycle
from .hyperpod_nodes import node_name, template_node
from .hyperpod_state import RUN, ClusterRec, GroupRec

NODECLASS_GROUP = "karpenter.sagemaker.amazonaws.com"
NODECLASS_KIND = "HyperpodNodeClass"
MAX_GROUP = 6758
CRDS = "hyperpod-karpenter"
SCALING_SECONDS = 600.0  # simulated seconds AutoScaling stays Creating or Deleting after an UpdateCluster
DEFAULT_FAILURE = "Karpenter could not be set up for the cluster: the cluster role could not be assumed."


def enabled(c: ClusterRec) -> bool:
    scaling = c.config.get("AutoScaling") or {}
    return bool(scaling.get("Mode") == "Enable" and scaling.get("AutoScalerType", "Karpenter") == "Karpenter")


def scaling_output(c: ClusterRec) -> dict[str, Any] | None:
    """DescribeCluster's ``AutoScaling`` (ClusterAutoScalingConfigOutput); None if it was never configured."""
    scaling = c.config.get("AutoScaling")
    if scaling is None:
        return None
    creating = c.status == "Creating" and scaling["Mode"] == "Enable"
    status = "Creating" if creating else c.scaling_status or "InService"
    out = {**scaling, "Status": status}
    if status == "Failed":
        out["FailureMessage"] = c.scaling_failure
    return out


def _requirement_met(req: dict[str, Any], labels: dict[str, str]) -> bool:
    key, op, values = req.get("key"), req.get("operator"), [str(v) for v in req.get("values") or []]
    value = labels.get(str(key))
    if op == "In":
        return value in values
    if op == "NotIn":
        return value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt", "Gte", "Lte") and value is not None and value.isdigit() and values:
        a, b = int(value), int(values[0])
        return {"Gt": a > b, "Lt": a < b, "Gte": a >= b, "Lte": a <= b}[op]
    return False


def _duration(text: str) -> float | None:
    """A Karpenter duration (``30s``, ``1h30m``) in seconds; None for ``Never``."""
    if text == "Never":
        return None
    seconds = 0.0
    for number, unit in re.findall(r"([0-9]+)([smh])", text):
        seconds += int(number) * {"s": 1, "m": 60, "h": 3600}[unit]
    return seconds


def _pending(pod: dict[str, Any]) -> bool:
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    if spec.get("nodeName") or status.get("phase") not in (None, "Pending"):
        return False
    if any(o.get("kind") == "DaemonSet" for o in pod["metadata"].get("ownerReferences") or []):
        return False
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
               for c in status.get("conditions") or [])


class ManagedKarpenter:
    """The CRDs HyperPod installs and the controller that scales eligible groups for pending pods."""

    def __init__(self, emulator: Emulator | None, life: Lifecycle, region: str, faults: FaultRegistry) -> None:
        self.emulator = emulator
        self.life = life
        self.region = region
        self.faults = faults
        self.empty_since: dict[tuple[str, str], float] = {}  # (cluster, instance id) -> when it became empty

    def _cluster(self, c: ClusterRec) -> Cluster | None:
        if self.emulator is None or c.kube_cluster is None:
            return None
        return self.emulator.clusters.get(c.kube_cluster)

    def install(self, c: ClusterRec) -> None:
        """Called when a request leaves the cluster with autoscaling enabled: Karpenter's CRDs, once."""
        cluster = self._cluster(c)
        if cluster is not None and enabled(c):
            install_component_crds(cluster, CRDS, manager="sagemaker-hyperpod")

    def changed(self, c: ClusterRec, was_enabled: bool, now: float) -> None:
        """An UpdateCluster switched autoscaling on (Creating) or off (Deleting); the status settles later."""
        if enabled(c) == was_enabled:
            return
        c.scaling_status, c.scaling_failure = ("Creating" if enabled(c) else "Deleting"), ""
        c.scaling_due = now + SCALING_SECONDS

    def _settle(self, c: ClusterRec, now: float) -> None:
        if c.scaling_due is None or now < c.scaling_due:
            return
        c.scaling_due = None
        if c.scaling_status == "Creating":
            fault = self.faults.take("autoscaling_failed", cluster=c.name)
            if fault is not None:
                if fault.remaining is None:
                    self.faults.clear(fault.id)
                c.scaling_status, c.scaling_failure = "Failed", fault.target.get("message") or DEFAULT_FAILURE
                self.life.event(c, now, "Error", "Cluster", f"Autoscaling failed: {c.scaling_failure}")
                return
        c.scaling_status = "InService"

    def reconcile(self, c: ClusterRec, now: float) -> None:
        self._settle(c, now)
        cluster = self._cluster(c)
        if cluster is None or not enabled(c) or c.status in ("Creating", "Deleting", "Failed") \
                or c.scaling_status == "Failed":
            return
        pool_rt = cluster.find_kind("karpenter.sh/v1", "NodePool")
        class_rt = cluster.find_kind(f"{NODECLASS_GROUP}/v1", NODECLASS_KIND)
        if pool_rt is None or class_rt is None:
            return
        pods_rt = cluster.builtin("", "pods")
        all_pods = cluster.list(pods_rt, None).items
        pending = sorted((p for p in all_pods if _pending(p)),
                         key=lambda p: (p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"]))
        used: dict[str, dict[str, Decimal]] = {}
        busy: set[str] = set()  # nodes running a pod that is not a DaemonSet's
        for pod in all_pods:
            bound = (pod.get("spec") or {}).get("nodeName")
            if bound and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                total = used.setdefault(bound, {})
                for name, q in pod_requests(pod).items():
                    total[name] = total.get(name, Decimal(0)) + q
                if not any(o.get("kind") == "DaemonSet" for o in pod["metadata"].get("ownerReferences") or []):
                    busy.add(bound)
        placed: set[str] = set()
        for pool in sorted(cluster.list(pool_rt, None).items, key=lambda p: p["metadata"]["name"]):
            if pool["metadata"].get("deletionTimestamp"):
                continue
            groups = self._groups(c, cluster, class_rt, pool)
            if not groups:
                continue
            before = len(placed)
            self._scale_pool(c, pool, groups, [p for p in pending if p["metadata"]["uid"] not in placed],
                             used, placed, now)
            if len(placed) == before:  # no pending pod is headed for these groups' nodes
                self._consolidate(c, pool, groups, busy, now)

    def _consolidate(self, c: ClusterRec, pool: dict[str, Any], groups: list[GroupRec], busy: set[str],
                     now: float) -> None:
        """Remove the pool's nodes that have run no pod but DaemonSets' for ``consolidateAfter`` (as
        BatchDeleteClusterNodes would: the group's target goes down with it)."""
        after = _duration(((pool.get("spec") or {}).get("disruption") or {}).get("consolidateAfter", "0s"))
        if after is None:
            return
        for g in groups:
            for node in c.group_nodes(g.name):
                if node.phase != RUN or node.end or node.recovery or not node.instance_id:
                    continue
                key = (c.name, node.instance_id)
                if node_name(node.instance_id) in busy:
                    self.empty_since.pop(key, None)
                    continue
                if now - self.empty_since.setdefault(key, now) < after:
                    continue
                del self.empty_since[key]
                g.target = max(g.target - 1, 0)
                g.spec = {**g.spec, "InstanceCount": g.target}
                self.life.request(node, "Delete", now)
                self.life.event(c, now, "Info", "InstanceGroup", f"Karpenter NodePool {pool['metadata']['name']} "
                                f"removed empty node {node.instance_id} from instance group {g.name}.", node=node)

    def _groups(self, c: ClusterRec, cluster: Cluster, class_rt: Any, pool: dict[str, Any]) -> list[GroupRec]:
        ref = ((pool.get("spec") or {}).get("template") or {}).get("spec", {}).get("nodeClassRef") or {}
        if ref.get("group") != NODECLASS_GROUP or ref.get("kind") != NODECLASS_KIND:
            return []
        try:
            node_class = cluster.get(class_rt, None, str(ref.get("name")))
        except ApiError:  # a NodePool naming a class that does not exist provisions nothing
            return []
        names = (node_class.get("spec") or {}).get("instanceGroups") or []
        return [g for name in names if (g := c.group(name)) is not None and not g.restricted
                and g.status not in ("Deleting", "Failed")]

    def _shape(self, c: ClusterRec, g: GroupRec, pool: dict[str, Any]) -> dict[str, Any] | None:
        """A new node of ``g`` as this NodePool would launch it; None if the pool's requirements exclude it."""
        node = template_node(c, g, self.region)
        template = (pool.get("spec") or {}).get("template") or {}
        node["metadata"]["labels"].update((template.get("metadata") or {}).get("labels") or {})
        node["metadata"]["labels"]["karpenter.sh/nodepool"] = pool["metadata"]["name"]
        node["spec"]["taints"] = [*node["spec"]["taints"], *(template.get("spec") or {}).get("taints", [])]
        requirements = (template.get("spec") or {}).get("requirements") or []
        if not all(_requirement_met(r, node["metadata"]["labels"]) for r in requirements):
            return None
        return node

    def _scale_pool(self, c: ClusterRec, pool: dict[str, Any], groups: list[GroupRec],
                    pending: list[dict[str, Any]], used: dict[str, dict[str, Decimal]], placed: set[str],
                    now: float) -> None:
        limit_raw = ((pool.get("spec") or {}).get("limits") or {}).get("nodes")
        live = {g.name: [n for n in c.group_nodes(g.name) if not n.end and n.recovery != "Delete"] for g in groups}
        room = math.inf if limit_raw is None else int(limit_raw) - sum(len(v) for v in live.values())
        added: dict[str, int] = {}
        for g in groups:
            shape = self._shape(c, g, pool)
            if shape is None:
                continue
            # the room left on the group's nodes (joined or still launching), then new nodes
            bins = [free_resources(shape, used.get(node_name(n.instance_id)) if n.instance_id else None)
                    for n in live[g.name]]
            for pod in pending:
                uid = pod["metadata"]["uid"]
                if uid in placed:
                    continue
                spec, requests = pod.get("spec") or {}, pod_requests(pod)
                if not matches_node_selection(spec, shape):
                    continue
                fresh = free_resources(shape, None)
                reasons, _ = misfit(spec, requests, shape, fresh)
                if reasons:
                    continue  # no node of this group could ever run it
                slot = next((b for b in bins if not misfit(spec, requests, shape, b)[0]), None)
                if slot is None:
                    if room <= 0 or g.target + added.get(g.name, 0) >= MAX_GROUP:
                        continue
                    slot = fresh
                    bins.append(slot)
                    added[g.name] = added.get(g.name, 0) + 1
                    room -= 1
                for name, q in requests.items():
                    slot[name] = slot.get(name, Decimal(0)) - q
                placed.add(uid)
        for g in groups:
            count = added.get(g.name, 0)
            if not count:
                continue
            g.target += count
            g.spec = {**g.spec, "InstanceCount": g.target}
            for _ in range(count):
                self.life.new_node(c, g, now)
            self.life.event(c, now, "Info", "InstanceGroup",
                            f"Karpenter NodePool {pool['metadata']['name']} added {count} node(s) to instance group "
                            f"{g.name} for pending pods.", group=g.name)
