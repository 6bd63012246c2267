"""REST routes of the nodes noun: each handler is one call of a verb in ``services/nodes``. One typed route
per action; each takes nodes by name or a label selector (bulk)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from app.api.base import Call, Handler, Reply, Route, accepted
from app.api.pages import Page, current_principal
from app.bootstrap import Services
from services.auth import Principal
from services.models import RequestModel
from services.nodes import Nodes
from services.nodes.models import (
    DrainPlan,
    DrainRequest,
    HealthCheckRequest,
    NodeDelete,
    NodeDestroy,
    NodeDetail,
    NodeList,
    NodeQuery,
    NodeSelection,
)
from services.replies import Accepted
from services.verbs import role_of

CLUSTER = {"cluster": "name the cluster is registered under (clusters_list)"}
NODE = {**CLUSTER, "node": "the node's name (nodes_list) or its HyperPod instance id"}
BASE = "/api/v1/clusters/{cluster}/nodes"
#: the node actions are their own MCP toolset (``--toolsets node_actions``), so the default set an agent loads stays
#: small; the reads are in the default ``nodes`` toolset
ACTIONS_TOOLSET = "node_actions"


class DetailQuery(RequestModel):
    refresh: bool = Field(False, description="ask HyperPod again instead of the short-lived cache")


def _list(call: Call) -> Reply:
    return Reply(call.services.nodes.list_nodes(call.principal, call.path["cluster"], call.query))


def _get(call: Call) -> Reply:
    return Reply(call.services.nodes.describe_node(call.principal, call.path["cluster"], call.path["node"],
                                                   refresh=call.query.refresh))


def _action(verb_name: str) -> Handler:
    def handler(call: Call) -> Reply:
        view, created = getattr(call.services.nodes, verb_name)(call.principal, call.path["cluster"], call.body,
                                                                call.idempotency_key)
        return accepted(view, created)
    return handler


def _drain(call: Call) -> Reply:
    if call.body.dry_run:
        return Reply(call.services.nodes.plan_drain(call.principal, call.path["cluster"], call.body))
    view, created = call.services.nodes.drain_nodes(call.principal, call.path["cluster"], call.body,
                                                    call.idempotency_key)
    return accepted(view, created)


def _mutation(name: str, path: str, summary: str, verb_fn: Any, handler: Handler, body: type[RequestModel],
              description: str, *, destructive: bool = False, **extra: Any) -> Route:
    return Route("POST", f"{BASE}/{path}", name, summary, role_of(verb_fn), handler, body=body, response=Accepted,
                 path_params=CLUSTER, read_only=False, destructive=destructive, status=202, tag=ACTIONS_TOOLSET,
                 open_world=True, description=description, **extra)


ROUTES: list[Route] = [
    Route("GET", BASE, "nodes_list", "A cluster's nodes with their health", role_of(Nodes.list_nodes), _list,
          query=NodeQuery, response=NodeList, path_params=CLUSTER, tag="nodes", open_world=True,
          description="Every node from the watch-backed cache (no AWS call): health (node-health-status label), "
                      "deep-health-check status, fault types and reasons from the health agent, instance group, "
                      "instance id, GPU/EFA capacity, cordoned, pod count. Filter by group, health or a label "
                      "selector; page with after/limit. The first read in a diagnosis."),
    Route("GET", BASE + "/{node}", "nodes_get", "One node in detail", role_of(Nodes.describe_node), _get,
          query=DetailQuery, response=NodeDetail, path_params=NODE, tag="nodes", open_world=True,
          description="One node: labels, taints, conditions (a fault shows as a condition named by its fault "
                      "type), the pods on it, and HyperPod's DescribeClusterNode (instance status, image, "
                      "placement, capacity type)."),
    _mutation("nodes_reboot", "reboot", "Reboot HyperPod nodes", Nodes.reboot_nodes, _action("reboot_nodes"),
              NodeSelection,
              "Operator: reboot nodes (BatchRebootClusterNodes, 25 per call) and wait until each is back with a "
              "new boot; the result says each node's health afterwards. Volumes and the instance are kept. The "
              "first remedy after investigating a fault; if the fault remains after the reboot, a replace (admin) "
              "is next."),
    _mutation("nodes_replace", "replace", "Replace HyperPod nodes with new instances", Nodes.replace_nodes,
              _action("replace_nodes"), NodeDestroy,
              "Destructive, admin only: terminate each node and launch a new instance in its group "
              "(BatchReplaceClusterNodes, 25 per call). Root and secondary volumes are wiped and the node's pods "
              "are evicted. Refused without confirm=true. Waits until the old instances are gone and the groups are "
              "back at their counts.", destructive=True, idempotent=False),
    _mutation("nodes_delete", "delete", "Delete HyperPod nodes", Nodes.delete_nodes, _action("delete_nodes"),
              NodeDelete,
              "Destructive, admin only: terminate nodes and shrink their groups' target counts "
              "(BatchDeleteClusterNodes, 99 per call, 50 once logical ids are included). Volumes are wiped and pods "
              "evicted. Refused without confirm=true.", destructive=True, idempotent=False),
    _mutation("nodes_cordon", "cordon", "Cordon nodes (no new pods)", Nodes.cordon_nodes, _action("cordon_nodes"),
              NodeSelection, "Operator: mark nodes unschedulable; running pods stay. Nodes already cordoned are "
              "left alone (a no-op operation)."),
    _mutation("nodes_uncordon", "uncordon", "Uncordon nodes", Nodes.uncordon_nodes, _action("uncordon_nodes"),
              NodeSelection, "Operator: mark nodes schedulable again."),
    _mutation("nodes_drain", "drain", "Drain nodes (cordon, then evict pods)", Nodes.drain_nodes, _drain,
              DrainRequest,
              "Operator: cordon the nodes, then evict their pods through the eviction API, honouring "
              "PodDisruptionBudgets (DaemonSet pods stay). dry_run=true first: the pods and jobs affected and the "
              "budgets that would hold it up, with nothing changed; show it to the user. A blocking budget keeps "
              "the operation waiting with the budget's name until it allows the eviction or the stage's deadline.",
              also=((200, DrainPlan),)),
    _mutation("nodes_health_check", "health-checks", "Run deep health checks on nodes", Nodes.check_nodes,
              _action("check_nodes"), HealthCheckRequest,
              "Operator: StartClusterHealthCheck on the nodes (InstanceStress, InstanceConnectivity); they are "
              "unschedulable while the checks run (10-20 minutes). The result gives each node's verdict "
              "(deep-health-check-status Passed/Failed); nodes_list shows the label and the fault reason."),
]


def _page(services: Services, principal: Principal) -> Any:
    from panels.nodes import NodesPane

    return NodesPane(nodes=services.nodes, clusters=services.clusters, bus=services.bus, principal=principal,
                     current_principal=current_principal(services, principal))


PAGES: list[Page] = [Page("nodes", "Nodes", role_of(Nodes.list_nodes), _page)]
