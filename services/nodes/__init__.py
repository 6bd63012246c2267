"""The ``nodes`` noun: its verbs are the only entry points for every face.

Reads answer from the watch cache (``list_nodes``: health, deep-health-check status, fault reasons, group,
GPU/EFA capacity and pods; no AWS call) and, for one node, HyperPod's DescribeClusterNode through the AWS TTL
cache (``describe_node``). Mutations precheck synchronously — an unknown node, an empty selector, a node
outside HyperPod, a missing confirmation is a 422/409 before any operation row exists — then submit one
operation on the node (``cluster/<c>/node/<name>``) or, for several, on all the cluster's nodes
(``cluster/<c>/node``): ``node.reboot``, ``node.cordon``, ``node.uncordon``, ``node.drain``,
``node.health_check`` (operator) and the destructive ``node.replace``, ``node.delete`` (admin).
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Any

from services.audit import AuditLog
from services.auth import Principal, Role
from services.aws import AwsClients
from services.awscache import AwsCache
from services.clusters.models import ClusterRecord
from services.clusters.pipeline import cluster_target
from services.clusters.registry import ClusterRegistry
from services.errors import Conflict, Invalid, NotFound, ServiceError, Transient
from services.informers import Informers
from services.kube import KubeClients
from services.nodes.drain import Evict, drain_plan
from services.nodes.facts import GROUP_LABEL, instance_id, labels, node_item, parse_selector
from services.nodes.models import (
    DEEP_HEALTH_CHECKS,
    DrainPlan,
    DrainRequest,
    HealthCheckRequest,
    NodeAction,
    NodeDelete,
    NodeDestroy,
    NodeDetail,
    NodeList,
    NodePlan,
    NodeQuery,
    NodeRef,
    NodeSelection,
    PodOnNode,
)
from services.nodes.stages import BatchRequest, Cordon, HealthCheck, NodeDeps
from services.operations import Engine, OperationKind, OperationView
from services.verbs import verb

__all__ = ["Nodes", "node_target"]
SYNC_SECONDS = 20.0
KINDS = {"reboot": "node.reboot", "replace": "node.replace", "delete": "node.delete", "cordon": "node.cordon",
         "uncordon": "node.uncordon", "drain": "node.drain", "health_check": "node.health_check"}


def node_target(cluster: str, nodes: list[NodeRef]) -> str:
    """One node locks itself; several lock every node of the cluster (an ancestor of each node's target)."""
    return f"{cluster_target(cluster)}/node/{nodes[0].name}" if len(nodes) == 1 else f"{cluster_target(cluster)}/node"


class Nodes:
    """Verbs of the nodes noun (the service object the composition root builds once)."""

    noun = "nodes"

    def __init__(self, registry: ClusterRegistry, informers: Informers, aws: AwsClients, kube: KubeClients,
                 cache: AwsCache, engine: Engine, audit: AuditLog) -> None:
        self.registry = registry
        self.informers = informers
        self.aws = aws
        self.cache = cache
        self._engine = engine
        self.audit = audit
        self.deps = NodeDeps(aws=aws.for_stages(), kube=kube, informers=informers, cache=cache)

    def kinds(self) -> list[OperationKind[Any]]:
        def kind(name: str, stages: tuple[Any, ...], role: Role, description: str) -> OperationKind[NodePlan]:
            return OperationKind(KINDS[name], NodePlan, stages, target=lambda p: node_target(p.cluster, p.nodes),
                                 role=role, description=description)

        d = self.deps
        return [
            kind("reboot", (BatchRequest(d, NodeAction.REBOOT),), Role.OPERATOR,
                 "reboot HyperPod nodes (BatchRebootClusterNodes, 25 per call) and wait until they are back"),
            kind("replace", (BatchRequest(d, NodeAction.REPLACE),), Role.ADMIN,
                 "replace HyperPod nodes with new instances (root and secondary volumes are wiped)"),
            kind("delete", (BatchRequest(d, NodeAction.DELETE),), Role.ADMIN,
                 "delete HyperPod nodes (their group's target count shrinks; volumes are wiped)"),
            kind("cordon", (Cordon(d, True),), Role.OPERATOR, "mark nodes unschedulable"),
            kind("uncordon", (Cordon(d, False, "uncordon"),), Role.OPERATOR, "mark nodes schedulable again"),
            kind("drain", (Cordon(d, True), Evict(d)), Role.OPERATOR,
                 "cordon nodes, then evict their pods honouring PodDisruptionBudgets"),
            kind("health_check", (HealthCheck(d),), Role.OPERATOR, "run deep health checks on HyperPod nodes"),
        ]

    # ----- reads -------------------------------------------------------------------------------------

    def _cached(self, cluster: str, resource: str) -> Any:
        informer = self.informers.get(cluster, resource)
        if not informer.wait_synced(SYNC_SECONDS):
            raise Transient(f"the {resource} of {cluster} have not been listed yet ({informer.error or 'listing'}); "
                            "ask again shortly", delay=2.0)
        return informer

    @verb(Role.VIEWER)
    def list_nodes(self, principal: Principal, cluster: str, query: NodeQuery | None = None) -> NodeList:
        """The cluster's nodes from the watch cache, filtered (group, health, label selector) and paged."""
        query = query or NodeQuery()
        self.registry.get(cluster)
        nodes_informer = self._cached(cluster, "nodes")
        pods = self._pods_per_node(cluster)
        match = parse_selector(query.selector) if query.selector else None
        items = [node_item(n, pods.get(n["metadata"]["name"], 0)) for n in nodes_informer.items()
                 if match is None or match(labels(n))]
        chosen = sorted((i for i in items if (query.group is None or (i.instance_group or "") == query.group)
                         and (query.health is None or i.health == query.health)), key=lambda i: i.name)
        after = [i for i in chosen if query.after is None or i.name > query.after]
        shown = after[:query.limit]
        return NodeList(cluster=cluster, nodes=shown, matched=len(chosen),
                        health=dict(Counter(i.health for i in chosen)),
                        next_after=shown[-1].name if len(after) > len(shown) else None,
                        cache_age_seconds=nodes_informer.age())

    def _pods_per_node(self, cluster: str) -> Counter[str]:
        pods = self.informers.get(cluster, "pods")
        pods.wait_synced(SYNC_SECONDS)
        return Counter(str(p["spec"].get("nodeName")) for p in pods.items()
                       if p["spec"].get("nodeName") and p["status"].get("phase") not in ("Succeeded", "Failed"))

    @verb(Role.VIEWER)
    def describe_node(self, principal: Principal, cluster: str, node: str, refresh: bool = False) -> NodeDetail:
        """One node: the watch cache's view (labels, taints, conditions, pods) and HyperPod's DescribeClusterNode."""
        record = self.registry.get(cluster)
        obj = self._find(cluster, [node])[0]
        pods = [p for p in self.informers.get(cluster, "pods").items() if p["spec"].get("nodeName") == node
                and p["status"].get("phase") not in ("Succeeded", "Failed")]
        item = node_item(obj, len(pods))
        taints = (obj.get("spec") or {}).get("taints") or []
        conditions = (obj.get("status") or {}).get("conditions") or []
        detail = NodeDetail(**item.model_dump(), labels=labels(obj),
                            taints=[{k: str(v) for k, v in t.items()} for t in taints],
                            conditions=[{k: str(c.get(k, "")) for k in ("type", "status", "reason", "message")}
                                        for c in conditions],
                            pod_list=[PodOnNode(namespace=p["metadata"].get("namespace", ""),
                                                name=p["metadata"]["name"], phase=p["status"].get("phase"))
                                      for p in pods])
        if item.instance_id and record.hyperpod_name:
            ident = item.instance_id

            def load() -> Any:
                return self.aws.client("sagemaker", record.region).describe_cluster_node(
                    ClusterName=record.hyperpod_name, NodeId=ident)["NodeDetails"]
            try:
                described, _ = self.cache.get(("sagemaker", "describe_cluster_node", record.region,
                                               record.hyperpod_name, ident), load, refresh=refresh)
                detail.hyperpod = {k: v.isoformat() if isinstance(v, dt.datetime) else v for k, v in described.items()
                                   if isinstance(v, (str, int, float, dict, list, dt.datetime))}
            except ServiceError as exc:
                detail.error = f"HyperPod: {exc.message}"
        return detail

    def _find(self, cluster: str, wanted: list[str]) -> list[dict[str, Any]]:
        objects = self._cached(cluster, "nodes").items()
        by_key: dict[str, dict[str, Any]] = {}
        for obj in objects:
            by_key[obj["metadata"]["name"]] = obj
            ident = instance_id(obj)
            if ident:
                by_key.setdefault(ident, obj)
        missing = [w for w in wanted if w not in by_key]
        if missing:
            known = sorted(o["metadata"]["name"] for o in objects)
            raise NotFound(f"no node {', '.join(repr(m) for m in missing)} in cluster {cluster}; nodes_list lists "
                           f"its {len(known)} node(s)", details={"unknown": missing, "known": known[:50]})
        return [by_key[w] for w in dict.fromkeys(wanted)]

    def _choose(self, record: ClusterRecord, request: NodeSelection, *, hyperpod: bool) -> list[NodeRef]:
        if request.selector:
            match = parse_selector(request.selector)
            objects = [o for o in self._cached(record.name, "nodes").items() if match(labels(o))]
            if not objects and not getattr(request, "logical_ids", None):
                raise Invalid(f"the selector {request.selector!r} matches no node of {record.name}")
        else:
            objects = self._find(record.name, request.nodes) if request.nodes else []
        refs = [NodeRef(name=o["metadata"]["name"], instance_id=instance_id(o), group=labels(o).get(GROUP_LABEL))
                for o in sorted(objects, key=lambda o: o["metadata"]["name"])]
        logical: list[str] = list(getattr(request, "logical_ids", []))
        refs += [NodeRef(name=i) for i in logical]
        if hyperpod:
            if not record.hyperpod_name:
                raise Conflict(f"{record.name} has no HyperPod cluster registered: this works on HyperPod nodes only")
            outside = [r.name for r in refs if not r.instance_id and r.name not in logical]
            if outside:
                raise Invalid(f"not HyperPod nodes (no instance id): {', '.join(outside)}; choose nodes of "
                              f"{record.hyperpod_name}'s instance groups", details={"not_hyperpod": outside})
            refs = self._with_groups(record, refs, logical)
        return refs

    def _with_groups(self, record: ClusterRecord, refs: list[NodeRef], logical: list[str]) -> list[NodeRef]:
        """Each node's instance group as HyperPod lists it (ListClusterNodes, paged; a Node's label may be missing);
        a node HyperPod does not list is refused. NodeLogicalIds need NodeProvisioningMode=Continuous."""
        sagemaker = self.aws.client("sagemaker", record.region)
        if logical:
            mode = sagemaker.describe_cluster(ClusterName=record.hyperpod_name).get("NodeProvisioningMode")
            if mode != "Continuous":
                raise Conflict(f"{record.hyperpod_name} provisions nodes with NodeProvisioningMode "
                               f"{mode or 'unset'}: NodeLogicalIds work only with Continuous; name the nodes instead",
                               details={"node_provisioning_mode": mode})
        groups: dict[str, str] = {}
        token: str | None = None
        while True:
            page = sagemaker.list_cluster_nodes(ClusterName=record.hyperpod_name, MaxResults=100,
                                                **({"IncludeNodeLogicalIds": True} if logical else {}),
                                                **({"NextToken": token} if token else {}))
            for summary in page.get("ClusterNodeSummaries", []):
                for key in (summary.get("InstanceId"), summary.get("NodeLogicalId")):
                    if key:
                        groups[str(key)] = str(summary.get("InstanceGroupName") or "")
            token = page.get("NextToken")
            if not token:
                break
        unknown = sorted(r.name for r in refs if not groups.get(r.instance_id or r.name))
        if unknown:
            raise Invalid(f"HyperPod lists no instance group for {', '.join(unknown[:20])} in "
                          f"{record.hyperpod_name} (gone, or not launched yet): nodes_list shows its nodes now",
                          details={"unknown": unknown})
        return [r.model_copy(update={"group": groups[r.instance_id or r.name]}) for r in refs]

    def _submit(self, principal: Principal, name: str, cluster: str, request: NodeSelection,
                idempotency_key: str | None, *, hyperpod: bool = True,
                checks: list[str] | None = None) -> tuple[OperationView, bool]:
        record = self.registry.get(cluster)
        refs = self._choose(record, request, hyperpod=hyperpod)
        plan = NodePlan(cluster=cluster, region=record.region, hyperpod_cluster=record.hyperpod_name, nodes=refs,
                        requested_by=principal.name, checks=checks or [])
        return self._engine.submit(KINDS[name], plan, principal, idempotency_key)

    # ----- mutations ---------------------------------------------------------------------------------

    @verb(Role.OPERATOR)
    def reboot_nodes(self, principal: Principal, cluster: str, request: NodeSelection,
                     idempotency_key: str | None = None) -> tuple[OperationView, bool]:
        """Reboot HyperPod nodes (the first step after investigating a fault); waits until each is back."""
        return self._submit(principal, "reboot", cluster, request, idempotency_key)

    @staticmethod
    def _confirmed(action: str, request: NodeDestroy) -> None:
        if not request.confirm:
            raise Invalid(f"{action} destroys each node's root and secondary volumes (a new instance starts empty) "
                          "and evicts every pod on it: confirm with the user, then pass confirm=true",
                          details={"destroys": ["root volume", "secondary volumes", "pods on the node"]})

    @verb(Role.ADMIN, audit_denied="node.replace")
    def replace_nodes(self, principal: Principal, cluster: str, request: NodeDestroy,
                      idempotency_key: str | None = None) -> tuple[OperationView, bool]:
        """Replace HyperPod nodes with new instances: the last step when a reboot did not clear a fault."""
        self._confirmed("replace", request)
        return self._submit(principal, "replace", cluster, request, idempotency_key)

    @verb(Role.ADMIN, audit_denied="node.delete")
    def delete_nodes(self, principal: Principal, cluster: str, request: NodeDelete,
                     idempotency_key: str | None = None) -> tuple[OperationView, bool]:
        """Delete HyperPod nodes: their group's target count shrinks by as many."""
        self._confirmed("delete", request)
        return self._submit(principal, "delete", cluster, request, idempotency_key)

    @verb(Role.OPERATOR)
    def cordon_nodes(self, principal: Principal, cluster: str, request: NodeSelection,
                     idempotency_key: str | None = None) -> tuple[OperationView, bool]:
        return self._submit(principal, "cordon", cluster, request, idempotency_key, hyperpod=False)

    @verb(Role.OPERATOR)
    def uncordon_nodes(self, principal: Principal, cluster: str, request: NodeSelection,
                       idempotency_key: str | None = None) -> tuple[OperationView, bool]:
        return self._submit(principal, "uncordon", cluster, request, idempotency_key, hyperpod=False)

    @verb(Role.OPERATOR)
    def plan_drain(self, principal: Principal, cluster: str, request: NodeSelection) -> DrainPlan:
        """The dry run of a drain: the pods it would evict, their jobs, the budgets that would hold it up."""
        record = self.registry.get(cluster)
        return drain_plan(self.deps, cluster, [r.name for r in self._choose(record, request, hyperpod=False)])

    @verb(Role.OPERATOR)
    def drain_nodes(self, principal: Principal, cluster: str, request: DrainRequest,
                    idempotency_key: str | None = None) -> tuple[OperationView, bool]:
        return self._submit(principal, "drain", cluster, request, idempotency_key, hyperpod=False)

    @verb(Role.OPERATOR)
    def check_nodes(self, principal: Principal, cluster: str, request: HealthCheckRequest,
                    idempotency_key: str | None = None) -> tuple[OperationView, bool]:
        """Run deep health checks on HyperPod nodes (unschedulable while they run)."""
        unknown = sorted(set(request.checks) - set(DEEP_HEALTH_CHECKS))
        if unknown:
            raise Invalid(f"unknown deep health check(s) {unknown}; one or both of {list(DEEP_HEALTH_CHECKS)}",
                          details={"valid": list(DEEP_HEALTH_CHECKS)})
        return self._submit(principal, "health_check", cluster, request, idempotency_key, checks=request.checks)
