"""REST routes of the clusters noun: each handler is one call of a verb in ``services/clusters``."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from app.api.base import Call, Reply, Route, accepted
from app.api.pages import Page, current_principal
from app.bootstrap import Services
from services.auth import Principal
from services.clusters import Clusters
from services.clusters.models import (
    ClusterDetail,
    ClusterDetailQuery,
    ClusterImport,
    ClusterQuery,
    ClusterRecord,
    ClusterSummary,
)
from services.clusters.options import ClusterOptions, OptionsQuery
from services.replies import Accepted
from services.verbs import role_of

CLUSTER = {"cluster": "name the cluster is registered under (clusters_list)"}


def _list(call: Call) -> Reply:
    return Reply(call.services.clusters.list_clusters(call.principal, refresh=call.query.refresh))


async def _get(call: Call) -> Reply:
    """On the loop from memory (wait=0: the registry, the AWS cache even when stale, the informers); a
    ``refresh``, or a part not read yet (a first read), is read in a worker, which may wait for it."""
    clusters, name = call.services.clusters, call.path["cluster"]
    if not call.query.refresh:
        detail = clusters.describe_cluster(call.principal, name, wait=0, page=call.query)
        if not detail.loading:
            return Reply(detail)
    return Reply(await asyncio.get_running_loop().run_in_executor(
        None, functools.partial(clusters.describe_cluster, call.principal, name, refresh=call.query.refresh,
                                page=call.query)))


def _options(call: Call) -> Reply:
    return Reply(call.services.clusters.cluster_options(call.principal, call.query))


def _import(call: Call) -> Reply:
    view, created = call.services.clusters.import_cluster(call.principal, call.body, call.idempotency_key)
    return accepted(view, created)


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
    Route("GET", "/api/v1/clusters/{cluster}", "clusters_get", "One cluster: groups, nodes, health",
          role_of(Clusters.describe_cluster),
          _get, query=ClusterDetailQuery, response=ClusterDetail, path_params=CLUSTER, tag="clusters", open_world=True,
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
    Route("DELETE", "/api/v1/clusters/{cluster}/registration", "clusters_forget",
          "Forget an imported cluster (it is not touched)", role_of(Clusters.forget_cluster), _forget,
          response=ClusterRecord, path_params=CLUSTER, read_only=False, tag="clusters",
          description="Remove an imported cluster from this control plane's registry; nothing in AWS or "
                      "Kubernetes changes. Refused while the cluster has active operations."),
]


def _page(services: Services, principal: Principal) -> Any:
    from panels.clusters import ClustersPane

    return ClustersPane(clusters=services.clusters, bus=services.bus, principal=principal,
                        current_principal=current_principal(services, principal))


PAGES: list[Page] = [Page("clusters", "Clusters", role_of(Clusters.list_clusters), _page)]
