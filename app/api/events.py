"""REST routes of a cluster's events timeline (``services/clusters/events.py``): each handler is one verb call.
Both run in a worker: the HyperPod part may call AWS (through the TTL cache)."""

from __future__ import annotations

from pydantic import Field

from app.api.base import Call, Reply, Route
from services.clusters.events import ClusterEventDetail, ClusterEventsQuery, ClusterEventsView, ClusterTimeline
from services.models import RequestModel
from services.verbs import role_of

CLUSTER = {"cluster": "name the cluster is registered under (clusters_list)"}


class EventQuery(RequestModel):
    refresh: bool = Field(False, description="ask HyperPod again instead of the short-lived cache")


def _list(call: Call) -> Reply:
    return Reply(call.services.timeline.list_events(call.principal, call.path["cluster"], call.query))


def _get(call: Call) -> Reply:
    return Reply(call.services.timeline.describe_event(call.principal, call.path["cluster"], call.path["event_id"],
                                                       refresh=call.query.refresh))


ROUTES: list[Route] = [
    Route("GET", "/api/v1/clusters/{cluster}/events", "clusters_events_list",
          "A cluster's events: HyperPod, Kubernetes node and pod events, newest first",
          role_of(ClusterTimeline.list_events), _list, query=ClusterEventsQuery, response=ClusterEventsView,
          path_params=CLUSTER, tag="clusters", open_world=True,
          description="Read-only, the first place a diagnosis looks: HyperPod's cluster events (ListClusterEvents: "
                      "the cluster, its instance groups and instances — launches, capacity shortfalls, health "
                      "checks, reboots, replacements) merged with the Kubernetes Events about its nodes (NotReady, "
                      "the health agent's findings) and the Warnings about its pods (FailedScheduling, "
                      "FailedMount, BackOff, Evicted), newest first. Narrow with since, node (name or instance id), "
                      "group, severity (warning or error), source, kind (node or pod: every pod event) and "
                      "namespace; when more match, ask again with cursor=next_cursor. A part that cannot be read is "
                      "named in errors and the rest is still answered. A HyperPod event's event_id gives its details "
                      "through clusters_events_get."),
    Route("GET", "/api/v1/clusters/{cluster}/events/{event_id}", "clusters_events_get",
          "One HyperPod event with its details", role_of(ClusterTimeline.describe_event), _get, query=EventQuery,
          response=ClusterEventDetail,
          path_params={**CLUSTER, "event_id": "a HyperPod event id (a UUID, from clusters_events_list)"},
          tag="clusters", open_world=True,
          description="Read-only: DescribeClusterEvent for one event of clusters_events_list — the summary and "
                      "HyperPod's metadata for its cluster, instance group or instance."),
]
