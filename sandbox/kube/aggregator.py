"""kube-aggregator's availability check of ``APIService`` objects (``apiregistration.k8s.io/v1``).

An APIService without ``spec.service`` is served by the API server itself: ``Available=True`` (``Local``). One
naming a Service is ``Available`` once that Service exists and has a ready endpoint, i.e. a Running, Ready pod its
selector matches (``ServiceNotFound`` / ``MissingEndpoints`` before, with the aggregator's messages); the
aggregator's discovery request to that server and its TLS check against ``caBundle`` are not simulated (the
servers behind APIServices are not run). Nothing is proxied: a group an APIService registers is not served.
Consumers ask :func:`available` (the KEDA controller, before reading its external metrics).
"""

from __future__ import annotations

from typing import Any

from .cluster import Cluster
from .operator_support import write_status
from .proxy import ready_endpoint
from .resources import POD_KEY
from .selectors import labels_match, parse_label_selector
from .store import Key, Loc, Obj, WatchEvent

KEY: Key = ("apiregistration.k8s.io", "apiservices")
DEPLOY_KEY: Key = ("apps", "deployments")
MANAGER = "kube-apiserver"


def _check(cluster: Cluster, api: Obj) -> tuple[str, str, str]:
    """(status, reason, message) of the Available condition as kube-aggregator computes it."""
    service = (api.get("spec") or {}).get("service")
    if not service:
        return "True", "Local", "Local APIServices are always available"
    namespace, name = str(service.get("namespace", "")), str(service.get("name", ""))
    svc = cluster.store.get(("", "services"), (namespace, name))
    if svc is None:
        return "False", "ServiceNotFound", f'service/{name} in "{namespace}" is not present'
    selector = (svc.get("spec") or {}).get("selector") or {}
    parsed = parse_label_selector(",".join(f"{k}={v}" for k, v in sorted(selector.items())))
    ready = selector and any(labels_match(parsed, pod["metadata"].get("labels") or {}) and ready_endpoint(pod)
                             for _, pod in cluster.store.items(POD_KEY, namespace))
    if not ready:
        port = int(service.get("port") or 443)
        named = next((str(p.get("name") or "") for p in (svc.get("spec") or {}).get("ports") or []
                      if int(p.get("port") or 0) == port), "")
        return "False", "MissingEndpoints", f'endpoints for service/{name} in "{namespace}" have no addresses ' \
                                            f'with port name "{named}"'
    return "True", "Passed", "all checks passed"


def _available_condition(api: Obj) -> dict[str, Any]:
    found: dict[str, Any] = next((c for c in (api.get("status") or {}).get("conditions") or []
                                  if c.get("type") == "Available"), {})
    return found


def reconcile(cluster: Cluster, loc: Loc) -> None:
    api = cluster.store.get(KEY, loc)
    if api is None or api["metadata"].get("deletionTimestamp"):
        return
    status, reason, message = _check(cluster, api)
    old = _available_condition(api)
    since = old.get("lastTransitionTime") if old.get("status") == status else None
    available: dict[str, Any] = {"type": "Available", "status": status, "reason": reason, "message": message,
                                 "lastTransitionTime": since or cluster.now_iso()}
    write_status(cluster, KEY, api, {"conditions": [available]}, MANAGER)


def woken_by(cluster: Cluster, event: WatchEvent) -> set[tuple[Key, Loc]]:
    """The APIServices to check again when a Deployment of their Service's namespace changes (its pods came up
    or went away)."""
    if event.key != DEPLOY_KEY:
        return set()
    namespace = event.obj["metadata"].get("namespace", "")
    return {(KEY, loc) for loc, api in cluster.store.items(KEY)
            if ((api.get("spec") or {}).get("service") or {}).get("namespace") == namespace}


def available(cluster: Cluster, name: str) -> tuple[bool, str]:
    """Whether the APIService ``name`` exists and is Available, and why not."""
    api = cluster.store.get(KEY, ("", name))
    if api is None:
        return False, "the server could not find the requested resource"
    if _available_condition(api).get("status") != "True":
        return False, "the server is currently unable to handle the request"
    return True, ""
