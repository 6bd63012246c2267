"""How simulated HyperPod clusters move: every status change after an API call happens here, on the clock.

The API handlers only record intent (a new node waiting to launch, a recovery due now, a group to delete);
:meth:`Lifecycle.advance` then replays everything due up to ``now`` in time order, so one tick after a
long pause walks a node through launch, boot, deep health checks and Running with the right timestamps.
Durations are simulated seconds shaped on real HyperPod (a cluster takes about 20 minutes, 35 with deep
health checks); a sped-up :class:`~sandbox.aws.base.RealClock` shortens them.

Faults come from the shared :class:`~sandbox.aws.base.FaultRegistry`: ``insufficient_capacity`` (target
``instance_type``, optional ``availability_zone``) fails a launch; ``node_unhealthy`` (target ``cluster``
= HyperPod cluster name, ``node`` = instance id, optional ``recovery`` = ``Reboot``/``Replace``, default
``Replace``) is a one-shot event that flips the node's health label the way the health monitoring agent
does; ``deep_health_check_failed`` (target ``cluster``, optional ``node``, ``check``) fails the deep health
checks a node is running when they end (``deep-health-check-status=Failed``, pending replacement);
``spot_reclaimed`` (target ``cluster``, optional ``node``, ``instance_group``) has EC2 take a Spot node
back: it shuts down and HyperPod launches a replacement; ``node_persistent_fault`` (target ``cluster``,
``node``, optional ``fault_type``, ``reason``) is bad hardware: the node is flagged pending replacement, again
after every reboot, until the instance is replaced (automatically with ``NodeRecovery=Automatic``; otherwise
only BatchReplaceClusterNodes clears it). Each is one-shot unless injected with a count.
Recovery is automatic only with ``NodeRecovery=Automatic``; otherwise the node waits for
BatchRebootClusterNodes/BatchReplaceClusterNodes.

With ``NodeProvisioningMode=Continuous`` the cluster is InService once its own resources are set up, while
groups fill; a failed launch is retried; a group given ``MinInstanceCount`` that has not reached it within
3 hours rolls back (a new group to zero instances, an updated one to its previous spec). A node of a group
on a training plan launches only while the plan is Active and has an instance left (``plan_gate``).

A node launches into one of its subnets (round robin), in that subnet's availability zone, with a private
IP from the subnet's CIDR block that no other node in the subnet holds (AWS keeps the first four
addresses and the last); a full subnet fails the launch like missing capacity does.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .base import FaultRegistry
from .hyperpod_nodes import (
    PENDING_REBOOT,
    PENDING_REPLACEMENT,
    SCHEDULABLE,
    UNSCHEDULABLE,
    KubeNodes,
    dns_hostname,
)
from .hyperpod_state import BOOT, DHC, LAUNCH, REBOOT, RUN, SHUTDOWN, UPDATE, ClusterRec, GroupRec, Ids, NodeRec

SETUP = 300.0  # control plane, networking and EKS access entries before the first instance launches
BOOT_SECONDS = 900.0  # instance launch, AMI boot, lifecycle scripts, kubelet join
CHECK_SECONDS = {"InstanceStress": 600.0, "InstanceConnectivity": 480.0, "MultiNodeTrainingValidation": 900.0}
REBOOT_SECONDS = 420.0
DETECT = 90.0  # from a health fault to the start of automatic recovery
SHUTDOWN_SECONDS = 180.0
UPDATE_SECONDS = 900.0  # drain, patch and reboot one node
ROLLBACK = 300.0
DELETE = 600.0
EVENTS_KEPT = 5000  # per cluster, oldest dropped first
CAPACITY_RETRY = 300.0  # Continuous provisioning retries a launch that found no capacity
MIN_COUNT_WINDOW = 3 * 3600.0  # a group must reach MinInstanceCount within 3 hours or roll back

CAPACITY_MESSAGE = "We currently do not have sufficient capacity for the requested instance type(s). Please try again."


@dataclass(frozen=True)
class Placement:
    """Where a node in a subnet lands: the subnet's zone and IPv4 CIDR block (``None``: EC2 knows no such
    subnet, so there is no block to respect)."""

    zone: str
    zone_id: str
    cidr: str | None = None


PlacementOf = Callable[[str], Placement]  # subnet id -> placement
InUse = Callable[[str], set[str]]  # subnet id -> private IPs its nodes hold
PlanGate = Callable[[str, float], tuple[bool, float | None, str]]  # (plan ARN, t) -> (may launch, retry at, why)


def default_placement_of(region: str) -> PlacementOf:
    """Subnet -> AZ without EC2: a stable spread over the region's first three zones."""
    parts = region.split("-")
    prefix = parts[0] + parts[1][0] + parts[-1] if len(parts) >= 3 else region

    def placement_of(subnet: str) -> Placement:
        index = sum(subnet.encode()) % 3 if subnet else 0
        return Placement(f"{region}{'abc'[index]}", f"{prefix}-az{index + 1}")

    return placement_of


class Lifecycle:
    def __init__(self, faults: FaultRegistry, kube: KubeNodes, ids: Ids, region: str, placement_of: PlacementOf,
                 in_use: InUse, plan_gate: PlanGate | None = None) -> None:
        self.faults = faults
        self.plan_gate = plan_gate
        self.kube = kube
        self.ids = ids
        self.region = region
        self.placement_of = placement_of
        self.in_use = in_use

    # --- events -----------------------------------------------------------------------------------------

    def event(self, c: ClusterRec, t: float, level: str, resource: str, description: str, *,
              group: str | None = None, node: NodeRec | None = None,
              metadata: dict[str, Any] | None = None) -> None:
        event: dict[str, Any] = {"EventId": self.ids.uuid("event"), "ClusterArn": c.arn, "ClusterName": c.name,
                                 "ResourceType": resource, "EventTime": t, "Description": description,
                                 "EventLevel": level}
        if group is not None:
            event["InstanceGroupName"] = group
        if node is not None:
            event["InstanceGroupName"] = node.group
            if node.instance_id:
                event["InstanceId"] = node.instance_id
        if metadata is not None:
            event["EventDetails"] = {"EventMetadata": metadata}
        c.events.append(event)
        del c.events[:-EVENTS_KEPT]

    # --- creating intent (called by the API handlers) ---------------------------------------------------

    def new_node(self, c: ClusterRec, g: GroupRec, start: float, *, added_by_update: bool = False) -> NodeRec:
        instance_type = g.spec.get("InstanceType") or (g.spec.get("InstanceRequirements") or {}).get(
            "InstanceTypes", ["ml.m5.xlarge"])[0]
        capacity = "Spot" if "Spot" in (g.spec.get("CapacityRequirements") or {}) else "OnDemand"
        node = NodeRec(logical_id=self.ids.logical_id(g.name), group=g.name, instance_type=instance_type,
                       created=start, due=start, capacity_type=capacity, added_by_update=added_by_update)
        c.nodes.append(node)
        return node

    def scale(self, c: ClusterRec, g: GroupRec, start: float, *, by_update: bool) -> None:
        """Add or remove nodes so the group's live nodes match its target."""
        live = [n for n in c.group_nodes(g.name) if not n.end and n.recovery != "Delete"]
        for _ in range(g.target - len(live)):
            self.new_node(c, g, start, added_by_update=by_update)
        surplus = len(live) - g.target
        for node in sorted(live, key=lambda n: (n.phase == RUN, -n.created))[:max(surplus, 0)]:
            self.request(node, "Delete", start)

    @staticmethod
    def request(node: NodeRec, action: str, t: float) -> None:
        """Ask for a reboot, replacement or deletion; it starts at the next tick."""
        if node.phase == LAUNCH and action == "Delete":
            node.end = "delete"
        node.recovery = action
        node.due = t

    # --- the clock --------------------------------------------------------------------------------------

    def advance(self, c: ClusterRec, now: float) -> bool:
        """Replay everything due up to ``now``; False when the cluster is gone."""
        while True:
            t, step = self._next(c)
            if step is None or t > now:
                break
            step(t)
            if not self._evaluate(c, t):
                return False
        if not self._evaluate(c, now):
            return False
        self._poll(c, now)
        return True

    def _next(self, c: ClusterRec) -> tuple[float, Callable[[float], None] | None]:
        best: tuple[float, Callable[[float], None] | None] = (math.inf, None)
        if c.due is not None:
            best = (c.due, lambda t: self._cluster_due(c, t))
        for node in list(c.nodes):
            if node.due is not None and node.due < best[0]:
                best = (node.due, lambda t, n=node: self._node_due(c, n, t))  # type: ignore[misc]
        for g in c.groups:
            if g.software_next is not None and g.software_next < best[0]:
                best = (g.software_next, lambda t, g=g: self._software_batch(c, g, t))  # type: ignore[misc]
            if g.min_deadline is not None and g.min_deadline < best[0]:
                best = (g.min_deadline, lambda t, g=g: self._min_count_due(c, g, t))  # type: ignore[misc]
        return best

    def _cluster_due(self, c: ClusterRec, t: float) -> None:
        c.due = None
        if c.status == "RollingBack":
            c.groups = [g for g in c.groups if g.status != "Failed"]
            for g in c.groups:
                g.status = "InService"
            c.status = "InService"
            self.event(c, t, "Info", "Cluster", "Cluster rollback complete; the cluster is InService.")
        elif c.status == "Deleting":
            for node in c.nodes:
                self.kube.remove(c, node)
            c.nodes = []
            c.status = "Deleted"

    # --- nodes ------------------------------------------------------------------------------------------

    def _node_due(self, c: ClusterRec, node: NodeRec, t: float) -> None:
        node.due = None
        g = c.group(node.group)
        if node.end == "delete" and node.phase == LAUNCH:
            c.nodes.remove(node)
            return
        if node.recovery and node.phase not in (LAUNCH, SHUTDOWN):
            self._start_recovery(c, node, t)
            return
        if g is None:
            return
        if node.phase == LAUNCH:
            self._launch(c, g, node, t)
        elif node.phase == BOOT:
            if node.checks:
                node.phase, node.health, node.dhc = DHC, UNSCHEDULABLE, "InProgress"
                node.due = t + sum(CHECK_SECONDS[ch] for ch in node.checks)
                self.event(c, t, "Info", "Instance", f"Deep health checks started: {', '.join(node.checks)}.",
                           node=node)
            else:
                node.phase, node.health = RUN, SCHEDULABLE
                self.event(c, t, "Info", "Instance", "Instance is Running and joined the cluster.", node=node)
            self.kube.sync(c, g, node, t)
        elif node.phase == DHC:
            failed = next((check for check in node.checks if self._take(
                "deep_health_check_failed", cluster=c.name, node=node.instance_id or "", check=check)), None)
            if failed is not None:
                node.phase, node.dhc, node.checks = RUN, "Failed", []
                self.mark_unhealthy(c, node, t, "Replace", "DeepHealthCheck", f"{failed}Failed")
                return
            node.phase, node.health, node.dhc, node.checks = RUN, SCHEDULABLE, "Passed", []
            self.kube.sync(c, g, node, t)
            self.event(c, t, "Info", "Instance", "Deep health checks passed; instance is Running.", node=node)
        elif node.phase == REBOOT:
            node.phase, node.health, node.message, node.boots = RUN, SCHEDULABLE, "", node.boots + 1
            node.fault_type = node.fault_reason = ""
            persistent = self._persistent(c, node)
            if persistent is not None:  # the hardware is still bad: the agent flags it again after the boot
                self.event(c, t, "Info", "Instance", "Instance rebooted and is Running.", node=node)
                self.mark_unhealthy(c, node, t, "Replace", *persistent)
                return
            self.kube.sync(c, g, node, t)
            self.event(c, t, "Info", "Instance", "Instance rebooted and is Running.", node=node)
        elif node.phase == UPDATE:
            node.phase, node.message, node.last_software_update = RUN, "", t
            node.image_release, node.image_id = g.desired_release, g.desired_image_id
            self.kube.sync(c, g, node, t)
        elif node.phase == SHUTDOWN:
            self.kube.remove(c, node)
            c.nodes.remove(node)
            self.event(c, t, "Info", "Instance", "Instance terminated.", node=node)

    def _launch(self, c: ClusterRec, g: GroupRec, node: NodeRec, t: float) -> None:
        plan = g.spec.get("TrainingPlanArn")
        if plan and self.plan_gate is not None:
            ok, retry, why = self.plan_gate(plan, t)
            if not ok:
                if why != node.message:
                    self.event(c, t, "Info", "InstanceGroup", f"Instance launch waits: {why}", group=g.name)
                node.message, node.due = why, retry
                return
        vpc = g.spec.get("OverrideVpcConfig") or c.config.get("VpcConfig") or {}
        subnets: list[str] = vpc.get("Subnets") or [""]
        subnet = subnets[len([n for n in c.nodes if n.instance_id]) % len(subnets)]
        placement = self.placement_of(subnet)
        zone, zone_id = placement.zone, placement.zone_id
        fault = self.faults.take("insufficient_capacity", instance_type=node.instance_type, availability_zone=zone)
        if fault is not None:
            self._capacity_failure(c, g, node, t, zone)
            return
        node.instance_id = self.ids.instance_id()
        ip = self.ids.ip() if placement.cidr is None else self.ids.ip_in(placement.cidr, self.in_use(subnet))
        if ip is None:
            node.instance_id = None
            self._capacity_failure(c, g, node, t, zone, f"There are not enough free addresses in subnet {subnet} "
                                                        f"({placement.cidr}) to launch {node.instance_type}.")
            return
        node.ip = ip
        node.zone, node.zone_id, node.subnet = zone, zone_id, subnet
        node.launch_time = t
        node.phase, node.due, node.message = BOOT, t + BOOT_SECONDS, ""
        node.checks = list(g.spec.get("OnStartDeepHealthChecks") or [])
        node.image_release, node.image_id = g.current_release, g.current_image_id
        self.event(c, t, "Info", "Instance", f"Launched {node.instance_type} instance in {zone}.", node=node,
                   metadata={"Instance": {"NodeLogicalId": node.logical_id,
                                          "CustomerEni": f"eni-{node.instance_id[2:]}"}})

    def _capacity_failure(self, c: ClusterRec, g: GroupRec, node: NodeRec, t: float, zone: str,
                          detail: str | None = None) -> None:
        detail = detail or f"{CAPACITY_MESSAGE} ({node.instance_type} in {zone})"
        if c.continuous:
            node.message = detail
            node.due = t + CAPACITY_RETRY
            self.event(c, t, "Error", "InstanceGroup", f"Instance launch failed: {detail} Retrying.",
                       group=g.name, metadata={"InstanceGroupScaling": {
                           "InstanceCount": self.current_count(c, g), "TargetCount": g.target,
                           "FailureMessage": detail}})
            return
        message = f"Instance group {g.name}: {detail}"
        self.event(c, t, "Error", "InstanceGroup", message, group=g.name,
                   metadata={"InstanceGroup": {"FailureMessage": message}})
        c.failure = message
        if c.status == "Creating":
            g.status = "Failed"
            for other in list(c.nodes):
                self._terminate(c, other, t, "cluster")
            return
        # A failed UpdateCluster rolls back: new nodes go, groups return to their previous configuration.
        c.status, c.due = "RollingBack", t + ROLLBACK
        for other in list(c.nodes):
            if other.added_by_update:
                self._terminate(c, other, t, "rollback")
        for group in c.groups:
            if group.previous is not None:
                group.spec, group.target = group.previous["spec"], group.previous["target"]
                group.previous = None
                group.status = "Updating"
            elif group.status == "Creating":
                group.status = "Failed"

    def _terminate(self, c: ClusterRec, node: NodeRec, t: float, why: str) -> None:
        if node.phase == SHUTDOWN:
            return
        for fault in self.faults.list():  # a persistent fault lives with its instance
            if fault.kind == "node_persistent_fault" and fault.target.get("node") == node.instance_id \
                    and fault.target.get("cluster", c.name) == c.name:
                self.faults.clear(fault.id)
        if node.instance_id is None:
            c.nodes.remove(node)
            return
        node.phase, node.end, node.due, node.recovery = SHUTDOWN, why, t + SHUTDOWN_SECONDS, ""
        g = c.group(node.group)
        if g is not None:
            self.kube.sync(c, g, node, t)

    def _start_recovery(self, c: ClusterRec, node: NodeRec, t: float) -> None:
        action, node.recovery = node.recovery, ""
        g = c.group(node.group)
        if action == "Delete":
            self._terminate(c, node, t, "delete")
            self.event(c, t, "Info", "Instance", "Instance deletion started.", node=node)
        elif action == "Reboot":
            if node.phase == DHC:  # the reboot ends the checks unfinished: no InProgress label survives it
                node.checks, node.dhc = [], ""
                self.event(c, t, "Warn", "Instance", "Deep health checks stopped by a reboot; they did not "
                           "complete.", node=node)
            node.phase, node.health, node.due = REBOOT, PENDING_REBOOT, t + REBOOT_SECONDS
            node.message = "Rebooting the instance."
            if g is not None:
                self.kube.sync(c, g, node, t)
            self.event(c, t, "Info", "Instance", "Instance reboot started.", node=node)
        elif action == "Replace":
            node.health = PENDING_REPLACEMENT
            self._terminate(c, node, t, "replace")
            if g is not None:
                self.new_node(c, g, t)
            self.event(c, t, "Info", "Instance", "Instance replacement started.", node=node)

    # --- health -----------------------------------------------------------------------------------------

    def _poll(self, c: ClusterRec, now: float) -> None:
        """Faults the health agent would detect, and manual recovery requests made through the Node label."""
        if c.status in ("Deleting", "Deleted", "Failed"):
            return
        for node in list(c.nodes):
            if node.capacity_type == "Spot" and node.phase in (RUN, DHC) and node.instance_id and not node.end \
                    and self._take("spot_reclaimed", cluster=c.name, node=node.instance_id, instance_group=node.group):
                self._reclaim(c, node, now)
                continue
            if node.phase != RUN or node.instance_id is None or node.recovery:
                continue
            persistent = self._persistent(c, node)
            if persistent is not None and not node.fault_type:
                self.mark_unhealthy(c, node, now, "Replace", *persistent)
                continue
            fault = self.faults.take("node_unhealthy", cluster=c.name, node=node.instance_id)
            if fault is not None:
                if fault.remaining is None:
                    self.faults.clear(fault.id)
                recovery = fault.target.get("recovery", "Replace")
                self.mark_unhealthy(c, node, now, "Reboot" if recovery == "Reboot" else "Replace",
                                    fault.target.get("fault_type", "AcceleratedHardware"),
                                    fault.target.get("reason", "NvidiaGpuXidError"))
                continue
            label = self.kube.health_label(c, node)
            if label in (PENDING_REBOOT, PENDING_REPLACEMENT) and label != node.health:
                node.health = label
                if c.automatic_recovery:
                    self.request(node, "Reboot" if label == PENDING_REBOOT else "Replace", now)
                    self.event(c, now, "Info", "Instance", f"Manual recovery requested with label {label}.",
                               node=node)
                else:
                    self.event(c, now, "Warn", "Instance", f"Label {label} ignored: node recovery by label "
                               "needs NodeRecovery=Automatic.", node=node)

    def _persistent(self, c: ClusterRec, node: NodeRec) -> tuple[str, str] | None:
        """(fault type, reason) of a ``node_persistent_fault`` on this node (never used up: only a replacement,
        which retires the instance, clears it)."""
        if node.instance_id is None:
            return None
        fault = next((f for f in self.faults.list() if f.kind == "node_persistent_fault"
                      and f.target.get("node") == node.instance_id and f.target.get("cluster", c.name) == c.name), None)
        if fault is None:
            return None
        return fault.target.get("fault_type", "AcceleratedHardware"), fault.target.get("reason", "NvidiaGpuXidError")

    def _take(self, kind: str, **match: str) -> bool:
        """Whether a fault of ``kind`` matches; one injected without a count is used up by this one match."""
        fault = self.faults.take(kind, **match)
        if fault is not None and fault.remaining is None:
            self.faults.clear(fault.id)
        return fault is not None

    def _reclaim(self, c: ClusterRec, node: NodeRec, t: float) -> None:
        """EC2 takes a Spot instance back: it shuts down and HyperPod launches another to keep the count."""
        self.event(c, t, "Warn", "Instance", "EC2 reclaimed the Spot instance (Spot interruption); a replacement "
                   "is being launched.", node=node)
        self._terminate(c, node, t, "reclaimed")
        g = c.group(node.group)
        if g is not None:
            self.new_node(c, g, t)

    def mark_unhealthy(self, c: ClusterRec, node: NodeRec, t: float, recovery: str, fault_type: str,
                       reason: str) -> None:
        node.health = PENDING_REBOOT if recovery == "Reboot" else PENDING_REPLACEMENT
        node.fault_type, node.fault_reason = fault_type, reason
        node.message = f"Health check failed: {reason}."
        g = c.group(node.group)
        if g is not None:
            self.kube.sync(c, g, node, t)
        self.event(c, t, "Warn", "Instance", f"Instance is unhealthy ({fault_type}: {reason}); "
                   f"node-health-status={node.health}.", node=node)
        if c.automatic_recovery:
            node.recovery, node.due = recovery, t + DETECT

    # --- groups and the cluster -------------------------------------------------------------------------

    @staticmethod
    def current_count(c: ClusterRec, g: GroupRec) -> int:
        return sum(1 for n in c.group_nodes(g.name) if n.phase in (RUN, REBOOT, UPDATE, DHC) and not n.end)

    def _evaluate(self, c: ClusterRec, t: float) -> bool:
        if c.status == "Deleted":
            return False
        if c.status == "Deleting":
            for node in list(c.nodes):
                self._terminate(c, node, t, "cluster")
            return True
        for g in list(c.groups):
            self._evaluate_group(c, g, t)
        if c.status == "Creating" and c.due is None and c.continuous:
            c.status = "InService"  # cluster-level resources are ready; the groups go on filling
            self.event(c, t, "Info", "Cluster", "Cluster is InService.")  # groups go on filling
        elif c.status == "Creating" and c.due is None:
            if any(g.status == "Failed" for g in c.groups):
                c.status = "Failed"
                for g in c.groups:
                    g.status = "Failed"
                self.event(c, t, "Error", "Cluster", f"Cluster creation failed: {c.failure}",
                           metadata={"Cluster": {"FailureMessage": c.failure}})
            elif all(g.status == "InService" for g in c.groups):
                c.status = "InService"
                self.event(c, t, "Info", "Cluster", "Cluster is InService.")
        elif c.status in ("Updating", "SystemUpdating") and all(g.status == "InService" for g in c.groups):
            c.status = "InService"
            self.event(c, t, "Info", "Cluster", "Cluster update complete; the cluster is InService.")
        return True

    @staticmethod
    def _running(c: ClusterRec, g: GroupRec) -> int:
        return sum(1 for n in c.group_nodes(g.name) if n.phase == RUN and not n.recovery and not n.end)

    def _min_count_due(self, c: ClusterRec, g: GroupRec, t: float) -> None:
        """The 3 hours are up and the group is still short of MinInstanceCount: roll it back."""
        g.min_deadline = None
        wanted = int(g.spec.get("MinInstanceCount") or 0)
        running = self._running(c, g)
        if running >= wanted or g.status == "Deleting":
            return
        if g.previous is not None:
            g.spec, g.target, g.previous = g.previous["spec"], g.previous["target"], None
            outcome = "rolled back to its previous configuration"
        else:
            g.spec, g.target = {**g.spec, "InstanceCount": 0}, 0
            outcome = "rolled back to zero instances"
        g.status = "InService"
        self.scale(c, g, t, by_update=False)
        message = (f"Instance group {g.name} did not reach MinInstanceCount {wanted} within 3 hours ({running} "
                   f"running); {outcome}.")
        self.event(c, t, "Error", "InstanceGroup", message, group=g.name,
                   metadata={"InstanceGroupScaling": {"InstanceCount": running, "TargetCount": g.target,
                                                      "FailureMessage": message}})

    def _evaluate_group(self, c: ClusterRec, g: GroupRec, t: float) -> None:
        nodes = c.group_nodes(g.name)
        if g.status == "Deleting":
            if not nodes:
                c.groups.remove(g)
                self.event(c, t, "Info", "InstanceGroup", f"Instance group {g.name} deleted.", group=g.name)
            return
        if g.min_deadline is not None and self._running(c, g) >= int(g.spec.get("MinInstanceCount") or 0):
            g.min_deadline, g.previous = None, None  # reached in time: nothing to roll back to any more
        if g.status not in ("Creating", "Updating"):
            return
        live = [n for n in nodes if not n.end]
        running = [n for n in live if n.phase == RUN and not n.recovery]
        settled = len(running) == len(live) == g.target and len(nodes) == len(live)
        if c.continuous and g.spec.get("MinInstanceCount") is not None:
            settled = settled or len(running) >= g.spec["MinInstanceCount"]
        if settled:
            g.status, g.previous = "InService", None
            for node in live:
                node.added_by_update = False
            g.software_status = g.software_status or ""
            self.event(c, t, "Info", "InstanceGroup", f"Instance group {g.name} is InService with "
                       f"{len(running)} instance(s).", group=g.name,
                       metadata={"InstanceGroupScaling": {"InstanceCount": len(running), "TargetCount": g.target}})

    def _software_batch(self, c: ClusterRec, g: GroupRec, t: float) -> None:
        """Start the next rolling batch of a platform software update, or finish it."""
        g.software_next = None
        if any(n.phase == UPDATE for n in c.group_nodes(g.name)):
            g.software_next = min(n.due or t for n in c.group_nodes(g.name) if n.phase == UPDATE)
            return
        pending = [n for n in c.group_nodes(g.name) if n.logical_id in g.software_pending and not n.end]
        g.software_pending = [n.logical_id for n in pending]
        if not pending:
            g.software_status, g.software_config = "Succeeded", None
            g.current_release, g.current_image_id = g.desired_release, g.desired_image_id
            if g.status == "SystemUpdating":
                g.status = "InService"
            self.event(c, t, "Info", "InstanceGroup", f"Software update of {g.name} succeeded "
                       f"(release {g.desired_release}).", group=g.name)
            return
        g.software_status = "InProgress"
        config = g.software_config or {}
        size = (config.get("RollingUpdatePolicy") or {}).get("MaximumBatchSize")
        total = len([n for n in c.group_nodes(g.name) if not n.end])
        batch = total
        if size is not None:
            batch = size["Value"] if size["Type"] == "INSTANCE_COUNT" else math.ceil(total * size["Value"] / 100)
        chosen = [n for n in pending if n.phase == RUN][:max(batch, 1)]
        for node in chosen:
            node.phase, node.due, node.message = UPDATE, t + UPDATE_SECONDS, "Updating platform software."
            g.software_pending.remove(node.logical_id)
            self.kube.sync(c, g, node, t)
        g.software_next = t + UPDATE_SECONDS + float(config.get("WaitIntervalInSeconds", 0)) if chosen else t + 60

    def hostname(self, node: NodeRec) -> str:
        return dns_hostname(node.ip, self.region) if node.ip else ""
