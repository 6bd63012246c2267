"""REST routes of the clusters noun: each handler is one call of a verb in ``services/clusters``."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from pydantic import Field

from app.api.base import Call, Reply, Route, accepted
from app.api.pages import Page, current_principal
from app.bootstrap import Services
from services.auth import Principal
from services.clusters import Clusters
from services.clusters.create_models import ClusterCreate, ClusterDelete, CreatePlanView
from services.clusters.models import (
    ClusterDetail,
    ClusterDetailQuery,
    ClusterImport,
    ClusterQuery,
    ClusterRecord,
    ClusterSummary,
)
from services.clusters.options import ClusterOptions, OptionsQuery
from services.models import RequestModel
from services.replies import Accepted
from services.verbs import role_of

CLUSTER = {"cluster": "name the cluster is registered under (clusters_list)"}
KUBECONFIG_MEDIA_TYPE = "text/yaml; charset=utf-8"


class CreateQuery(RequestModel):
    """``POST /api/v1/clusters``: a dry run answers the plan (200) instead of starting the create (202)."""

    dry_run: bool = Field(False, description="true: answer what the create would make (derived names, resources, "
                                             "expected durations, warnings) and start nothing")


def _list(call: Call) -> Reply:
    return Reply(call.services.clusters.list_clusters(call.principal, refresh=call.query.refresh))


def _get_from_memory(call: Call) -> Reply | None:
    """From memory on the loop (wait=0: the registry, the AWS cache even when stale, the informers); ``None``
    for a ``refresh`` or a part not read yet (a first read)."""
    if call.query.refresh:
        return None
    detail = call.services.clusters.describe_cluster(call.principal, call.path["cluster"], wait=0, page=call.query)
    return None if detail.loading else Reply(detail)


async def _get(call: Call) -> Reply:
    """From memory when it can (:func:`_get_from_memory`); else read in a worker, which may wait for it."""
    reply = _get_from_memory(call)
    if reply is not None:
        return reply
    clusters, name = call.services.clusters, call.path["cluster"]
    return Reply(await asyncio.get_running_loop().run_in_executor(
        None, functools.partial(clusters.describe_cluster, call.principal, name, refresh=call.query.refresh,
                                page=call.query)))


def _options(call: Call) -> Reply:
    return Reply(call.services.clusters.cluster_options(call.principal, call.query))


def _import(call: Call) -> Reply:
    view, created = call.services.clusters.import_cluster(call.principal, call.body, call.idempotency_key)
    return accepted(view, created)


def _create(call: Call) -> Reply:
    if call.query.dry_run:
        return Reply(call.services.clusters.plan_cluster(call.principal, call.body))
    view, created = call.services.clusters.create_cluster(call.principal, call.body, call.idempotency_key)
    return accepted(view, created)


def _delete(call: Call) -> Reply:
    view, created = call.services.clusters.delete_cluster(call.principal, call.path["cluster"], call.body,
                                                          call.idempotency_key)
    return accepted(view, created)


def _kubeconfig(call: Call) -> Reply:
    return Reply(call.services.clusters.cluster_kubeconfig(call.principal, call.path["cluster"]))


def _forget(call: Call) -> Reply:
    return Reply(call.services.clusters.forget_cluster(call.principal, call.path["cluster"]))


ROUTES: list[Route] = [
    Route("GET", "/api/v1/clusters", "clusters_list", "List registered clusters with their health",
          role_of(Clusters.list_clusters),
          _list, query=ClusterQuery, response=ClusterSummary, many=True, tag="clusters", open_world=True,
          description="Every cluster this control plane knows (imported or created here): EKS and HyperPod "
                      "status and node counts per health state, from short-lived caches (refresh=true reads "
                      "again)."),
    Route("GET", "/api/v1/clusters/options", "clusters_options", "Inspect a region before creating a cluster",
          role_of(Clusters.cluster_options), _options, query=OptionsQuery, response=ClusterOptions,
          tag="clusters", open_world=True,
          description="Read-only: the region's Availability Zones, the instance types HyperPod accepts that each "
                      "zone offers (accelerator, GPU memory, EFA interfaces, the cluster-usage quota and what is "
                      "in use), VPC and Elastic IP quotas, existing VPCs and clusters (managed, imported or "
                      "foreign), HyperPod's service-linked role and this control plane's identity. Call it "
                      "before proposing a create: offer only what it lists."),
    Route("POST", "/api/v1/clusters", "clusters_create", "Create a HyperPod cluster on a new EKS cluster",
          role_of(Clusters.create_cluster), _create, query=CreateQuery, body=ClusterCreate, response=Accepted,
          also=((200, CreatePlanView),), read_only=False, status=202, tag="clusters", open_world=True,
          description="Ask only the decisions (name, zone, instance_type, count, capacity_type), offering what "
                      "clusters_options lists; everything else (CIDRs, roles, versions) is computed. Refused at "
                      "once (nothing made) on a bad choice, with the valid ones in the error's details. Then the "
                      "stages network, iam, eks, dependencies, hyperpod, storage, verify run for 30-45 minutes "
                      "(EKS 8-15, HyperPod 20-30): follow them with operations_wait or operations_get (wait=30); "
                      "a failed stage keeps what was made, and operations_retry resumes from it. dry_run=true "
                      "first: the same prechecks, then the plan (derived names, resources per stage, expected "
                      "durations, warnings) with nothing made; show it to the user before the real create."),
    Route("GET", "/api/v1/clusters/{cluster}", "clusters_get", "One cluster: groups, nodes, health",
          role_of(Clusters.describe_cluster),
          _get, query=ClusterDetailQuery, response=ClusterDetail, path_params=CLUSTER, tag="clusters", open_world=True,
          from_memory=_get_from_memory,
          description="EKS status and version, HyperPod status and node recovery, instance groups with "
                      "current/target counts, and nodes by instance group with their health label, Ready, "
                      "GPU/EFA capacity, allocatable resources and pod count, from the watch-backed cache "
                      "(cache_age_seconds says how fresh)."),
    Route("POST", "/api/v1/clusters/import", "clusters_import", "Import an existing EKS/HyperPod cluster",
          role_of(Clusters.import_cluster), _import, body=ClusterImport, response=Accepted, read_only=False,
          status=202, tag="clusters", open_world=True,
          description="Register an existing EKS cluster (and the HyperPod cluster on it) without changing it. "
                      "Refused at once when the EKS cluster is missing or not ACTIVE, when the HyperPod "
                      "cluster is not orchestrated by it, or when this control plane's identity has no EKS "
                      "access entry (the message says how to add one)."),
    Route("DELETE", "/api/v1/clusters/{cluster}", "clusters_delete", "Delete a cluster created here",
          role_of(Clusters.delete_cluster), _delete, body=ClusterDelete, response=Accepted, path_params=CLUSTER,
          read_only=False, destructive=True, status=202, tag="clusters", open_world=True,
          description="Destructive, admin only: tear down a cluster this control plane created, in order (storage, "
                      "HyperPod, dependencies, EKS, network, IAM), removing only what carries its tags; the shared "
                      "bucket stays. Refused for imported clusters (use clusters_forget) and while another "
                      "operation on the cluster is active. Confirm the name with the user and pass it as confirm. "
                      "Follow it with operations_wait."),
    Route("GET", "/api/v1/clusters/{cluster}/kubeconfig", "clusters_kubeconfig", "Kubeconfig for a cluster",
          role_of(Clusters.cluster_kubeconfig), _kubeconfig, path_params=CLUSTER, tag="clusters",
          media_type=KUBECONFIG_MEDIA_TYPE, open_world=True,
          description="A kubeconfig (YAML) for kubectl: the cluster's EKS endpoint and CA, and an exec plugin "
                      "('instantstart kube-token') that mints a short-lived token from the caller's own AWS "
                      "credentials; no token is embedded, so the file is safe to share."),
    Route("DELETE", "/api/v1/clusters/{cluster}/registration", "clusters_forget",
          "Forget an imported cluster (it is not touched)", role_of(Clusters.forget_cluster), _forget,
          response=ClusterRecord, path_params=CLUSTER, read_only=False, tag="clusters",
          description="Remove an imported cluster from this control plane's registry; nothing in AWS or "
                      "Kubernetes changes. Refused while the cluster has active operations."),
]


def _page(services: Services, principal: Principal) -> Any:
    from panels.clusters import ClustersPane

    return ClustersPane(clusters=services.clusters, operations=services.operations, bus=services.bus,
                        principal=principal, timeline=services.timeline,
                        current_principal=current_principal(services, principal))


PAGES: list[Page] = [Page("clusters", "Clusters", role_of(Clusters.list_clusters), _page)]
