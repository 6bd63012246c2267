"""The stored state of simulated HyperPod clusters: clusters, instance groups, nodes and cluster events.

Plain dataclasses of JSON values, so :meth:`HyperPodSimulator.to_state` is ``asdict`` and a restart of the
sandbox restores every cluster mid-transition (a node half-way through its boot keeps its due time).
Identifiers are derived from a seeded counter, never from ``random`` or ``uuid4``, so a sandbox run with
the same calls produces the same instance ids, ARNs and event ids. Nothing here moves state: transitions
live in :mod:`.hyperpod_lifecycle`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import ipaddress
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from .base import AwsError

# Internal node phases (the API's InstanceStatus is derived from them).
LAUNCH = "launch"  # waiting for an instance (capacity); no instance id yet
BOOT = "boot"  # instance launched, lifecycle scripts running, not yet joined to Kubernetes
DHC = "dhc"  # deep health checks running (on start or from StartClusterHealthCheck)
RUN = "run"
REBOOT = "reboot"
UPDATE = "update"  # platform software update (UpdateClusterSoftware)
SHUTDOWN = "shutdown"

PHASE_STATUS = {
    LAUNCH: "Pending",
    BOOT: "Pending",
    DHC: "DeepHealthCheckInProgress",
    RUN: "Running",
    REBOOT: "Pending",
    UPDATE: "SystemUpdating",
    SHUTDOWN: "ShuttingDown",
}


@dataclass
class NodeRec:
    logical_id: str
    group: str
    instance_type: str
    created: float
    phase: str = LAUNCH
    due: float | None = None  # when the current phase ends (None: it waits for an outside event)
    message: str = ""
    instance_id: str | None = None
    launch_time: float | None = None
    ip: str = ""
    zone: str = ""
    zone_id: str = ""
    subnet: str = ""
    checks: list[str] = field(default_factory=list)  # deep health checks still to run
    health: str = ""  # the node-health-status label we last wrote ("" = not joined to Kubernetes)
    dhc: str = ""  # the deep-health-check-status label we last wrote ("" = none)
    fault_type: str = ""
    fault_reason: str = ""
    recovery: str = ""  # "Reboot" | "Replace" while a recovery is pending
    end: str = ""  # what a shutdown is for: "delete" | "replace" | "rollback" | "cluster" | "reclaimed"
    image_release: str = ""
    image_id: str = ""
    last_software_update: float | None = None
    capacity_type: str = "OnDemand"
    added_by_update: bool = False  # launched by an UpdateCluster still in progress (rolled back on failure)
    boots: int = 0  # reboots so far: the kubelet reports a new boot id after each

    @property
    def status(self) -> str:
        return PHASE_STATUS[self.phase]


@dataclass
class GroupRec:
    name: str
    spec: dict[str, Any]  # the ClusterInstanceGroupSpecification as last requested
    target: int
    status: str = "Creating"
    restricted: bool = False
    previous: dict[str, Any] | None = None  # spec and target before an UpdateCluster (for rollback)
    current_release: str = ""
    desired_release: str = ""
    current_image_id: str = ""
    desired_image_id: str = ""
    software_status: str = ""  # SoftwareUpdateStatus of the last UpdateClusterSoftware ("" = never)
    software_config: dict[str, Any] | None = None
    software_next: float | None = None  # when the next rolling batch may start
    software_pending: list[str] = field(default_factory=list)  # logical ids still to update
    min_deadline: float | None = None  # Continuous: when a group short of MinInstanceCount rolls back


@dataclass
class ClusterRec:
    name: str
    id: str
    arn: str
    created: float
    config: dict[str, Any]  # the cluster-level request fields (VpcConfig, Orchestrator, NodeRecovery, ...)
    status: str = "Creating"
    failure: str = ""
    due: float | None = None  # end of the control-plane setup, a rollback or the deletion
    kube_cluster: str | None = None  # the emulator cluster holding this cluster's Kubernetes Nodes
    groups: list[GroupRec] = field(default_factory=list)
    nodes: list[NodeRec] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    add_tokens: dict[str, dict[str, Any]] = field(default_factory=dict)  # BatchAddClusterNodes ClientToken
    # AutoScaling.Status once the cluster is set up ("" until an AutoScaling change): Creating, InService,
    # Failed (with scaling_failure) or Deleting, until scaling_due
    scaling_status: str = ""
    scaling_failure: str = ""
    scaling_due: float | None = None

    @property
    def continuous(self) -> bool:
        return self.config.get("NodeProvisioningMode") == "Continuous"

    @property
    def automatic_recovery(self) -> bool:
        return bool(self.config.get("NodeRecovery", "Automatic") == "Automatic")

    def group(self, name: str) -> GroupRec | None:
        return next((g for g in self.groups if g.name == name), None)

    def node(self, instance_id: str | None = None, logical_id: str | None = None) -> NodeRec | None:
        for node in self.nodes:
            if instance_id is not None and node.instance_id == instance_id:
                return node
            if logical_id is not None and node.logical_id == logical_id:
                return node
        return None

    def group_nodes(self, name: str) -> list[NodeRec]:
        return [n for n in self.nodes if n.group == name]


class Ids:
    """Deterministic identifiers from a seed and a counter (persisted with the state)."""

    def __init__(self, seed: str, counter: int = 0) -> None:
        self.seed = seed
        self.counter = counter

    def _hex(self, kind: str) -> str:
        self.counter += 1
        return hashlib.sha256(f"{self.seed}/{kind}/{self.counter}".encode()).hexdigest()

    def instance_id(self) -> str:
        return "i-" + self._hex("instance")[:17]

    def cluster_id(self) -> str:
        digest = self._hex("cluster")
        # [a-z0-9]{12} as in real cluster ARNs: map the hex digest onto the whole alphabet.
        alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
        return "".join(alphabet[int(digest[i:i + 2], 16) % 36] for i in range(0, 24, 2))

    def uuid(self, kind: str) -> str:
        h = self._hex(kind)
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"

    def logical_id(self, group: str) -> str:
        return f"{group}-{self._hex('logical')[:12]}"

    def ip(self) -> str:
        """An address for a node whose subnet EC2 does not know (no CIDR block to draw from)."""
        n = self.counter = self.counter + 1
        return f"10.1.{(n // 250) % 250}.{n % 250 + 4}"

    def ip_in(self, cidr: str, taken: set[str]) -> str | None:
        """A free private IP of ``cidr`` (``None``: none left). AWS reserves the network address, the next
        three and the broadcast address; the search starts at a counter-driven offset, as AWS's choice
        looks arbitrary."""
        net = ipaddress.IPv4Network(cidr, strict=False)
        first, size = int(net.network_address) + 4, net.num_addresses - 5
        n = self.counter = self.counter + 1
        for k in range(max(size, 0)):
            ip = str(ipaddress.IPv4Address(first + (n + k) % size))
            if ip not in taken:
                return ip
        return None


def cluster_to_dict(cluster: ClusterRec) -> dict[str, Any]:
    return asdict(cluster)


def cluster_from_dict(data: dict[str, Any]) -> ClusterRec:
    fields = dict(data)
    groups = [GroupRec(**g) for g in fields.pop("groups", [])]
    nodes = [NodeRec(**n) for n in fields.pop("nodes", [])]
    return ClusterRec(**fields, groups=groups, nodes=nodes)


def page(items: list[Any], key: Callable[[Any], tuple[Any, ...]], descending: bool, token: str | None,
         limit: int) -> tuple[list[Any], str | None]:
    """One page of ``items`` in ``key`` order and the NextToken for the rest.

    The token carries the last key returned (not an offset), so items created or deleted between pages
    never make a client see one twice or skip one that existed throughout -- the property botocore's
    paginators check.
    """
    ordered = sorted(items, key=key, reverse=descending)
    if token:
        try:
            last = tuple(json.loads(base64.urlsafe_b64decode(token.encode())))
        except (ValueError, binascii.Error) as exc:
            raise AwsError("ValidationException", "Invalid pagination token: NextToken is malformed.") from exc
        ordered = [i for i in ordered if (key(i) < last if descending else key(i) > last)]
    chosen = ordered[:limit]
    if len(ordered) <= limit:
        return chosen, None
    next_token = base64.urlsafe_b64encode(json.dumps(list(key(chosen[-1]))).encode()).decode()
    return chosen, next_token
