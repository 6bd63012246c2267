"""REST routes of the instance_groups noun: each handler is one call of a verb in ``services/groups``."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from app.api.base import Call, Reply, Route, accepted
from app.api.pages import Page, current_principal
from app.bootstrap import Services
from services.auth import Principal
from services.groups import InstanceGroups
from services.groups.models import GroupAdd, GroupPatch, GroupView, SoftwareUpdate
from services.models import RequestModel
from services.replies import Accepted
from services.verbs import role_of

BASE = "/api/v1/clusters/{cluster}/instance-groups"
CLUSTER = {"cluster": "name the cluster is registered under (clusters_list)"}
GROUP = {**CLUSTER, "group": "instance group name (instance_groups_list)"}


class GroupQuery(RequestModel):
    refresh: bool = Field(False, description="read AWS again instead of the short-lived cache")


def _list(call: Call) -> Reply:
    return Reply(call.services.groups.list_groups(call.principal, call.path["cluster"], refresh=call.query.refresh))


def _get(call: Call) -> Reply:
    return Reply(call.services.groups.describe_group(call.principal, call.path["cluster"], call.path["group"],
                                                     refresh=call.query.refresh))


def _add(call: Call) -> Reply:
    view, created, decided = call.services.groups.add_group(call.principal, call.path["cluster"], call.body,
                                                             call.idempotency_key)
    reply = accepted(view, created)
    reply.body.decided = decided
    reply.body.message += "; decided: " + "; ".join(decided)
    return reply


def _patch(call: Call) -> Reply:
    return accepted(*call.services.groups.update_group(call.principal, call.path["cluster"], call.path["group"],
                                                       call.body, call.idempotency_key))


def _delete(call: Call) -> Reply:
    return accepted(*call.services.groups.delete_group(call.principal, call.path["cluster"], call.path["group"],
                                                       call.idempotency_key))


def _software(call: Call) -> Reply:
    return accepted(*call.services.groups.update_software(call.principal, call.path["cluster"], call.path["group"],
                                                          call.body, call.idempotency_key))


ROUTES: list[Route] = [
    Route("GET", BASE, "instance_groups_list", "List a cluster's instance groups", role_of(InstanceGroups.list_groups),
          _list, query=GroupQuery, response=GroupView, many=True, path_params=CLUSTER, tag="instance_groups",
          open_world=True,
          description="The cluster's HyperPod instance groups (also those at 0 instances): type, status, current "
                      "and target counts, capacity type (on-demand, spot, training-plan), EFA-only, labels, taints, "
                      "automatic patching, image release; and its EKS managed node groups (kind eks-nodegroup)."),
    Route("GET", BASE + "/{group}", "instance_groups_get", "One instance group", role_of(InstanceGroups.describe_group),
          _get, query=GroupQuery, response=GroupView, path_params=GROUP, tag="instance_groups", open_world=True,
          description="One HyperPod instance group as instance_groups_list shows it."),
    Route("POST", BASE, "instance_groups_add", "Add an instance group", role_of(InstanceGroups.add_group), _add,
          body=GroupAdd, response=Accepted, path_params=CLUSTER, read_only=False, status=202,
          tag="instance_groups", open_world=True,
          description="Ask only the decisions (name, instance_type, count, zone, capacity_type), offering what "
                      "clusters_options lists for the zone. A training plan decides zone and type (its "
                      "reservation: name one when it holds several), caps the count, must be Scheduled or Active "
                      "and excludes Spot; 'decided' says what it decided. efa_only needs a type with >1 EFA "
                      "interface. Capacity type and efa_only are fixed for the group's life. A bad choice is "
                      "refused at once with the valid ones. Follow it with operations_wait."),
    Route("PATCH", BASE + "/{group}", "instance_groups_update", "Scale an instance group or change its labels, "
          "taints or automatic patching", role_of(InstanceGroups.update_group), _patch, body=GroupPatch,
          response=Accepted, path_params=GROUP, read_only=False, status=202, tag="instance_groups", open_world=True,
          description="Send only what changes: count (0 empties the group), labels, taints (each replaces the "
                      "whole set), auto_patch or auto_patch_off. Re-sending the current state ends as a no-op with "
                      "no AWS write. capacity_type and efa_only are fixed for the group's life: a different value "
                      "is refused (409) with that reason. An EKS managed node group takes count, labels and "
                      "taints only. A group managed Karpenter scales is not scaled by hand (409 naming its "
                      "HyperpodNodeClass). Follow it with operations_wait."),
    Route("DELETE", BASE + "/{group}", "instance_groups_delete", "Delete an instance group",
          role_of(InstanceGroups.delete_group), _delete, response=Accepted, path_params=GROUP, read_only=False,
          destructive=True, status=202, tag="instance_groups", open_world=True,
          description="Destructive, admin only: delete the group and terminate its instances (their volumes are "
                      "wiped; pods on them are evicted). Confirm with the user first. A group managed Karpenter "
                      "scales is refused (409) until it is out of autoscaling. Follow it with "
                      "operations_wait: it ends when the group is gone."),
    Route("POST", BASE + "/{group}/software-update", "instance_groups_update_software",
          "Update an instance group's software (HyperPod AMI)", role_of(InstanceGroups.update_software), _software,
          body=SoftwareUpdate, response=Accepted, path_params=GROUP, read_only=False, status=202,
          tag="instance_groups", open_world=True,
          description="Roll the group's nodes onto a HyperPod AMI release (the latest unless image_release is "
                      "given), node by node; a no-op when it already runs it. Follow it with operations_wait."),
]


def _page(services: Services, principal: Principal) -> Any:
    from panels.groups import GroupsPane

    return GroupsPane(groups=services.groups, clusters=services.clusters, bus=services.bus, principal=principal,
                      current_principal=current_principal(services, principal))


PAGES: list[Page] = [Page("instance-groups", "Instance groups", role_of(InstanceGroups.list_groups), _page)]
