"""The node operation kinds: reboot, replace, delete (HyperPod batch calls), cordon/uncordon (the Node's
``spec.unschedulable``) and deep health checks; drain lives in :mod:`services.nodes.drain`.

HyperPod takes at most 25 nodes per BatchReboot/BatchReplaceClusterNodes call and 99 per
BatchDeleteClusterNodes (50 once NodeLogicalIds are included), so a stage sends as many calls as the batch
needs and keeps, per node, what HyperPod answered (its ``Failed`` entries are per node, not a failed call),
saving each call's outcome before the next call; a rerun sends only what it has no record of and the world
does not show under way.
Then it waits for the world: a reboot is over when the Node's kubelet reports a new boot id and Ready; a
replacement when the old instance is gone and its group is back at its target count; a deletion when the
instances are gone; a deep health check when HyperPod reports the node Running again and the Node carries a
final ``deep-health-check-status``. Waits read the watch cache (free) or one paged ListClusterNodes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s

from services.aws import AwsClients
from services.awscache import AwsCache
from services.errors import NotFound, Permanent
from services.informers import Informers
from services.kube import KubeClients
from services.nodes.facts import DHC_LABEL, HEALTH_LABEL, boot_id, health, labels, ready
from services.nodes.models import NodeAction, NodePlan
from services.stages import Done, Observed, Stage, StageContext, Wait

RECOVER_BATCH = 25  # BatchReboot/BatchReplaceClusterNodes: NodeIds (or NodeLogicalIds) per call
DELETE_BATCH = 99  # BatchDeleteClusterNodes: NodeIds per call
DELETE_BATCH_WITH_LOGICAL = 50  # ... NodeIds and NodeLogicalIds combined, once logical ids are included
POLL = 30.0
CHECKING = "DeepHealthCheckInProgress"  # ClusterInstanceStatus while deep health checks run
PENDING_RECOVERY = ("UnschedulablePendingReplacement", "UnschedulablePendingReboot")  # node-health-status


@dataclass(frozen=True)
class NodeDeps:
    aws: AwsClients
    kube: KubeClients
    informers: Informers
    cache: AwsCache


def batches(ids: list[str], logical: list[str], size: int, size_with_logical: int | None = None
            ) -> Iterator[tuple[list[str], list[str]]]:
    """Split the ids into calls of at most ``size`` (``size_with_logical`` once logical ids are in one call)."""
    limit = size_with_logical if logical and size_with_logical is not None else size
    items = [("id", i) for i in ids] + [("logical", i) for i in logical]
    for start in range(0, len(items), limit):
        chunk = items[start:start + limit]
        yield [i for k, i in chunk if k == "id"], [i for k, i in chunk if k == "logical"]


def cluster_nodes(aws: AwsClients, plan: NodePlan, *, logical: bool = False) -> list[dict[str, Any]]:
    """Every launched node HyperPod lists in the cluster now (ListClusterNodes, paged); with ``logical`` the
    nodes not launched yet too (``IncludeNodeLogicalIds``: summaries with a NodeLogicalId and no InstanceId)."""
    sagemaker = aws.client("sagemaker", plan.region)
    out: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        page = sagemaker.list_cluster_nodes(ClusterName=plan.hyperpod_cluster, MaxResults=100,
                                            **({"IncludeNodeLogicalIds": True} if logical else {}),
                                            **({"NextToken": token} if token else {}))
        out += [n for n in page.get("ClusterNodeSummaries", []) if logical or n.get("InstanceId")]
        token = page.get("NextToken")
        if not token:
            return out


class NodeStage(Stage[NodePlan]):
    def __init__(self, deps: NodeDeps) -> None:
        self.deps = deps

    def cached_nodes(self, plan: NodePlan) -> dict[str, dict[str, Any]]:
        informer = self.deps.informers.get(plan.cluster, "nodes")
        informer.wait_synced(20.0)
        return {n["metadata"]["name"]: n for n in informer.items()}


class BatchRequest(NodeStage):
    """Send the HyperPod batch call(s) once, then wait until the nodes have been rebooted, replaced or deleted."""

    def __init__(self, deps: NodeDeps, action: NodeAction) -> None:
        super().__init__(deps)
        self.action = action
        self.name = action.value
        self.deadline = 7200.0 if action is NodeAction.REPLACE else 3600.0
        self.expected_seconds = {NodeAction.REBOOT: 420.0, NodeAction.REPLACE: 1200.0, NodeAction.DELETE: 600.0}[action]

    def observe(self, ctx: StageContext[NodePlan]) -> Observed:
        if ctx.data.get("sent_all"):
            return Observed.IN_PROGRESS
        if "sent" not in ctx.data:  # first look: what the world is before any call (saved before act runs)
            ctx.data["sent"], ctx.data["accepted"], ctx.data["failed"] = [], [], []
            if self.action is NodeAction.REBOOT:
                cached = self.cached_nodes(ctx.request)
                ctx.data["boot_ids"] = {n.name: boot_id(cached.get(n.name) or {}) for n in ctx.request.nodes}
        return Observed.ABSENT

    def _under_way(self, plan: NodePlan, before: dict[str, str], keys: list[str]) -> set[str]:
        """Of ``keys`` (instance ids / logical ids) not recorded as sent, those the world shows were sent anyway
        (a crash between a call and its record): a new boot id or a pending-reboot label for a reboot;
        an instance gone or shutting down for a replacement or deletion."""
        if self.action is NodeAction.REBOOT:
            cached = self.cached_nodes(plan)
            by_key = {(n.instance_id or n.name): n.name for n in plan.nodes}
            return {k for k in keys if (obj := cached.get(by_key.get(k, ""))) is not None and (
                boot_id(obj) != before.get(by_key[k]) or labels(obj).get(HEALTH_LABEL) == "UnschedulablePendingReboot")}
        named = {n.instance_id or n.name for n in plan.nodes}  # a node without an instance id: its NodeLogicalId
        with_logical = any(not n.instance_id for n in plan.nodes)
        listed: dict[str, str] = {}
        for summary in cluster_nodes(self.deps.aws, plan, logical=with_logical):
            for key in (summary.get("InstanceId"), summary.get("NodeLogicalId") if with_logical else None):
                if key:
                    listed[str(key)] = summary["InstanceStatus"]["Status"]
        return {k for k in keys if k in named and listed.get(k, "ShuttingDown") == "ShuttingDown"}

    def act(self, ctx: StageContext[NodePlan]) -> None:
        plan = ctx.request
        sagemaker = self.deps.aws.client("sagemaker", plan.region)
        sent: list[str] = ctx.data.setdefault("sent", [])
        accepted: list[str] = ctx.data.setdefault("accepted", [])
        failed: list[dict[str, str]] = ctx.data.setdefault("failed", [])
        ids = [n.instance_id for n in plan.nodes if n.instance_id and n.instance_id not in sent]
        logical = [n.name for n in plan.nodes if not n.instance_id and n.name not in sent]  # Continuous mode
        if ctx.attempt:  # a rerun (after a throttle or a crash): what the world already shows under way is not resent
            seen = self._under_way(plan, ctx.data.get("boot_ids") or {}, ids + logical)
            sent += sorted(seen)
            accepted += sorted(seen)
            ids, logical = [i for i in ids if i not in seen], [i for i in logical if i not in seen]
        call, size, with_logical = {
            NodeAction.REBOOT: (sagemaker.batch_reboot_cluster_nodes, RECOVER_BATCH, None),
            NodeAction.REPLACE: (sagemaker.batch_replace_cluster_nodes, RECOVER_BATCH, None),
            NodeAction.DELETE: (sagemaker.batch_delete_cluster_nodes, DELETE_BATCH, DELETE_BATCH_WITH_LOGICAL),
        }[self.action]
        for chunk_ids, chunk_logical in batches(ids, logical, size, with_logical):
            params: dict[str, Any] = {"ClusterName": plan.hyperpod_cluster}
            if chunk_ids:
                params["NodeIds"] = chunk_ids
            if chunk_logical:
                params["NodeLogicalIds"] = chunk_logical
            answer = call(**params)  # a Transient here leaves the earlier batches recorded
            sent += chunk_ids + chunk_logical
            accepted += list(answer.get("Successful") or []) + list(answer.get("SuccessfulNodeLogicalIds") or [])
            for entry in list(answer.get("Failed") or []) + list(answer.get("FailedNodeLogicalIds") or []):
                failed.append({"node": str(entry.get("NodeId") or entry.get("NodeLogicalId")),
                               "code": str(entry.get("ErrorCode") or entry.get("Code") or ""),
                               "message": str(entry.get("Message") or "")})
            ctx.save()  # this batch's outcome on disk before the next call: a crash resends none of it
        ctx.data["sent_all"] = True
        self.deps.cache.invalidate(plan.region, plan.hyperpod_cluster or "")
        if not accepted:
            raise Permanent(f"HyperPod accepted none of the {self.action.value} requests: "
                            + "; ".join(f"{f['node']}: {f['code']} {f['message']}" for f in failed),
                            details={"failed": failed})

    def poll(self, ctx: StageContext[NodePlan]) -> Done | Wait:
        plan = ctx.request
        accepted = set(ctx.data.get("accepted") or [])
        chosen = [n for n in plan.nodes if (n.instance_id or n.name) in accepted]
        if self.action is NodeAction.REBOOT:
            cached = self.cached_nodes(plan)
            before = ctx.data.get("boot_ids") or {}
            waiting = [n.name for n in chosen if n.name in cached and not (
                boot_id(cached[n.name]) != before.get(n.name) and ready(cached[n.name]))]
            ctx.data["after"] = {n.name: health(cached[n.name]) if n.name in cached else "gone" for n in chosen}
            if waiting:
                return Wait(POLL, f"{len(chosen) - len(waiting)} of {len(chosen)} node(s) back from the reboot; "
                                  f"waiting for {', '.join(waiting[:5])}")
            return Done(self._summary(ctx, "rebooted: " + ", ".join(f"{k} now {v}" for k, v in
                                                                     ctx.data["after"].items())))
        listed = {n["InstanceId"] for n in cluster_nodes(self.deps.aws, plan)}
        remaining = sorted(i for i in accepted if i in listed)
        if remaining:
            verb = "terminated" if self.action is NodeAction.DELETE else "replaced"
            return Wait(POLL, f"{len(accepted) - len(remaining)} of {len(accepted)} instance(s) {verb}; waiting "
                              f"for {', '.join(remaining[:5])}")
        if self.action is NodeAction.REPLACE:
            groups = {n.group for n in chosen if n.group}
            described = self.deps.aws.client("sagemaker", plan.region).describe_cluster(
                ClusterName=plan.hyperpod_cluster)
            short = [f"{g['InstanceGroupName']} ({g.get('CurrentCount', 0)}/{g.get('TargetCount', 0)})"
                     for g in described.get("InstanceGroups", []) if g["InstanceGroupName"] in groups
                     and g.get("CurrentCount", 0) < g.get("TargetCount", 0)]
            if short:
                return Wait(POLL, f"old instances gone; waiting for the replacements in {', '.join(short)}")
        self.deps.cache.invalidate(plan.region, plan.hyperpod_cluster or "")
        return Done(self._summary(ctx, f"{len(accepted)} node(s) {self.action.value}d"))

    @staticmethod
    def _summary(ctx: StageContext[NodePlan], text: str) -> str:
        failed = ctx.data.get("failed") or []
        return text + (f"; HyperPod refused {len(failed)}: " + "; ".join(
            f"{f['node']}: {f['code']}" for f in failed) if failed else "")

    def result(self, ctx: StageContext[NodePlan]) -> dict[str, Any]:
        return {"accepted": ctx.data.get("accepted") or [], "failed": ctx.data.get("failed") or [],
                **({"health_after": ctx.data["after"]} if "after" in ctx.data else {})}


class Cordon(NodeStage):
    """Set (or clear) ``spec.unschedulable`` on each node; nodes already so are left alone (zero writes)."""

    def __init__(self, deps: NodeDeps, unschedulable: bool, name: str = "cordon") -> None:
        super().__init__(deps)
        self.unschedulable = unschedulable
        self.name = name

    def _pending(self, plan: NodePlan) -> list[str]:
        cached = self.cached_nodes(plan)
        return [n.name for n in plan.nodes if n.name in cached
                and bool((cached[n.name].get("spec") or {}).get("unschedulable")) != self.unschedulable]

    def observe(self, ctx: StageContext[NodePlan]) -> Observed:
        return Observed.ABSENT if self._pending(ctx.request) else Observed.DONE

    def act(self, ctx: StageContext[NodePlan]) -> None:
        api = k8s.CoreV1Api(self.deps.kube.api_client(ctx.request.cluster))
        changed: list[str] = []
        for name in self._pending(ctx.request):
            try:
                api.patch_node(name, {"spec": {"unschedulable": True if self.unschedulable else None}})
            except NotFound:
                continue  # gone meanwhile (replaced or deleted): nothing to cordon
            changed.append(name)
        ctx.data["changed"] = changed

    def poll(self, ctx: StageContext[NodePlan]) -> Done | Wait:
        if self._pending(ctx.request):
            return Wait(1.0, "waiting for the watch cache to show the change")
        word = "cordoned" if self.unschedulable else "uncordoned"
        return Done(f"{len(ctx.data.get('changed') or [])} node(s) {word}")

    def result(self, ctx: StageContext[NodePlan]) -> dict[str, Any]:
        return {"changed": ctx.data.get("changed") or []}


class HealthCheck(NodeStage):
    """StartClusterHealthCheck for the nodes (grouped by instance group), then wait for the verdicts."""

    name = "health_check"
    deadline = 7200.0
    expected_seconds = 1080.0

    def observe(self, ctx: StageContext[NodePlan]) -> Observed:
        return Observed.IN_PROGRESS if ctx.data.get("started") else Observed.ABSENT

    def act(self, ctx: StageContext[NodePlan]) -> None:
        plan = ctx.request
        chosen = plan.nodes
        if ctx.attempt:  # a rerun (a crash after the call?): nodes HyperPod already checks are not started again
            statuses = {n["InstanceId"]: n["InstanceStatus"]["Status"] for n in cluster_nodes(self.deps.aws, plan)}
            chosen = [n for n in plan.nodes if statuses.get(str(n.instance_id)) != CHECKING]
        by_group: dict[str, list[str]] = {}
        for node in chosen:
            by_group.setdefault(node.group or "", []).append(str(node.instance_id))
        if by_group:
            self.deps.aws.client("sagemaker", plan.region).start_cluster_health_check(
                ClusterName=plan.hyperpod_cluster, DeepHealthCheckConfigurations=[
                    {"InstanceGroupName": group, "InstanceIds": ids, "DeepHealthChecks": list(plan.checks)}
                    for group, ids in sorted(by_group.items())])
        ctx.data["started"] = True

    def poll(self, ctx: StageContext[NodePlan]) -> Done | Wait:
        """A node's verdict, once its checks were seen under way (an earlier check's label is no verdict): Passed
        when it is Running again labelled Passed, else Failed (labelled Failed, or no final label: a reboot ended
        the checks unfinished); Failed at once when HyperPod marks it for reboot or replacement."""
        plan = ctx.request
        statuses = {n["InstanceId"]: n["InstanceStatus"]["Status"] for n in cluster_nodes(self.deps.aws, plan)}
        cached = self.cached_nodes(plan)
        seen: list[str] = ctx.data.setdefault("under_way", [])
        verdicts: dict[str, str] = {}
        waiting: list[str] = []
        for node in plan.nodes:
            status = statuses.get(str(node.instance_id))
            marks = labels(cached[node.name]) if node.name in cached else {}
            label, node_health = marks.get(DHC_LABEL), marks.get(HEALTH_LABEL)
            if (status == CHECKING or label == "InProgress") and node.name not in seen:
                seen.append(node.name)
            if status is None:
                verdicts[node.name] = "gone"
            elif node_health in PENDING_RECOVERY:
                verdicts[node.name] = "Failed"
            elif status in ("Pending", CHECKING) or label == "InProgress" or node.name not in seen:
                waiting.append(node.name)  # not under way yet: a label left by an earlier check is no verdict
            elif status == "Running":  # no final label: the checks ended unfinished (stopped by a reboot)
                verdicts[node.name] = "Passed" if label == "Passed" else "Failed"
            else:
                waiting.append(node.name)
        ctx.data["verdicts"] = verdicts
        if waiting:
            return Wait(POLL, f"deep health checks running on {len(waiting)} node(s) ({len(seen)} seen under way): "
                              f"{', '.join(waiting[:5])}")
        failed = sorted(k for k, v in verdicts.items() if v != "Passed")
        return Done(f"{len(verdicts) - len(failed)} passed" + (f"; failed or gone: {', '.join(failed)}"
                                                               if failed else ""))

    def result(self, ctx: StageContext[NodePlan]) -> dict[str, Any]:
        return {"verdicts": ctx.data.get("verdicts") or {}, "checks": list(ctx.request.checks)}
