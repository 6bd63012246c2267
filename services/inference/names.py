"""What the three inference paths share: the watch-cache read every verb answers from, and one name space.

A self-managed deployment, a managed endpoint (InferenceEndpointConfig or JumpStartModel) and a router never
share a name in a cluster: the first two share one operation target (``cluster/<c>/inference/<name>``), and a
user (or an agent) says which one they mean by its name alone. Each path checks its own kind itself (is it
this one's, may it be updated); :func:`check_other_paths` refuses a name the other paths already hold. A router
fronting a deployment is found here too (and a router create in flight), so the deployment's delete can name it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from services.errors import Conflict, Transient
from services.inference import managed_render
from services.inference.kobjects import labels as _labels
from services.inference.kobjects import meta as _meta
from services.inference.managed_models import EndpointKind
from services.inference.manifest import INFERENCE_LABEL, POOL_LABEL
from services.inference.router_manifest import FOR_ANNOTATION, ROUTER_LABEL, SERVICE_ANNOTATION
from services.informers import Informers
from services.operation_views import OperationQuery
from services.operations import Engine, OperationView
from services.training.manifests import MANAGED_BY

SYNC_SECONDS = 20.0
ROUTER_CREATE_KIND = "inference.router.create"
Path = Literal["deployment", "endpoint", "router"]


def cached(informers: Informers, cluster: str, resource: str) -> list[dict[str, Any]]:
    """The watch cache's objects of ``resource`` in ``cluster``; 503 (retry shortly) until it has listed them."""
    informer = informers.get(cluster, resource)
    if not informer.wait_synced(SYNC_SECONDS):
        raise Transient(f"the {resource} of {cluster} have not been listed yet ({informer.error or 'listing'}); "
                        "ask again shortly", delay=2.0)
    return informer.items()


def _ours(obj: Mapping[str, Any]) -> Mapping[str, str]:
    labels = _labels(obj)
    return labels if labels.get(MANAGED_BY) == "instantstart" else {}


def check_other_paths(informers: Informers, cluster: str, name: str, path: Path) -> None:
    """409 when a path other than ``path`` holds ``name`` anywhere in the cluster, naming what holds it."""
    for dep in cached(informers, cluster, "deployments"):
        meta, labels = _meta(dep), _ours(dep)
        if meta.get("name") != name:
            continue
        if path != "deployment" and labels.get(INFERENCE_LABEL) == name and POOL_LABEL in labels:
            raise Conflict(f"the cluster already has a model pool {name!r} (namespace {meta.get('namespace')}): "
                           "choose another name, or delete the pool with inference_pool_delete first",
                           details={"field": "name", "kind": "pool"})
        if path != "deployment" and labels.get(INFERENCE_LABEL) == name:
            raise Conflict(f"the cluster already has a self-managed inference deployment {name!r} (namespace "
                           f"{meta.get('namespace')}): choose another name", details={"field": "name",
                                                                                      "kind": "deployment"})
        if path != "router" and labels.get(ROUTER_LABEL) == name:
            raise Conflict(f"the cluster already has an inference router {name!r} (namespace "
                           f"{meta.get('namespace')}): choose another name, or delete it with "
                           "inference_routers_delete first", details={"field": "name", "kind": "router"})
    if path == "endpoint":
        return
    for kind in managed_kinds(informers, cluster):
        for obj in cached(informers, cluster, managed_render.PLURALS[kind]):
            if _meta(obj).get("name") == name and _ours(obj).get(INFERENCE_LABEL) == name:
                raise Conflict(f"the cluster already has a managed inference endpoint {name!r} ({kind.value} in "
                               f"namespace {_meta(obj).get('namespace')}): choose another name",
                               details={"field": "name", "kind": "endpoint"})


def managed_kinds(informers: Informers, cluster: str) -> list[EndpointKind]:
    """The managed endpoint kinds the cluster serves (the inference operator's CRDs are there)."""
    served = {_meta(c).get("name") for c in cached(informers, cluster, "customresourcedefinitions")}
    return [kind for kind in EndpointKind if managed_render.crd_name(kind) in served]


def fronting_routers(informers: Informers, cluster: str, namespace: str, deployment: str,
                     service: str | None = None) -> list[str]:
    """The routers of ours in ``namespace`` whose workers are ``deployment``'s pods (with ``service``: only those
    fronting that pool service)."""
    return sorted(str(_meta(d).get("name")) for d in cached(informers, cluster, "deployments")
                  if _meta(d).get("namespace") == namespace and _ours(d).get(ROUTER_LABEL)
                  and (_meta(d).get("annotations") or {}).get(FOR_ANNOTATION) == deployment
                  and (service is None or (_meta(d).get("annotations") or {}).get(SERVICE_ANNOTATION) == service))


def in_flight(engine: Engine, cluster: str, kind: str, **request: str | bool) -> OperationView | None:
    """An active operation of ``kind`` in ``cluster`` whose request has these fields (the newest)."""
    active = engine.list(OperationQuery(kind=kind, cluster=cluster, active=True, limit=500))
    return next((op for op in active if all(op.request.get(k) == v for k, v in request.items())), None)


def refuse_router_create(engine: Engine, cluster: str, deployment: str, *, then: str,
                         pool_service: str | None = None) -> None:
    """409 while a router create for ``deployment`` (for its pool service ``pool_service`` when given) is in
    flight, naming the operation: the router cannot be deleted before its create ends (the create holds its
    target), so the way out is to cancel the create, or wait for it and delete the router."""
    wanted: dict[str, str | bool] = {"deployment": deployment}
    if pool_service is not None:
        wanted["pool_service"] = pool_service
    creating = in_flight(engine, cluster, ROUTER_CREATE_KIND, **wanted)
    if creating is None:
        return
    router, fronted = str(creating.request.get("name")), creating.request.get("pool_service")
    what = f"the service {fronted} of the pool {deployment}" if fronted else deployment
    raise Conflict(f"the router {router} is being created for {what} (operation {creating.id}): cancel it "
                   f"(operations_cancel {creating.id}), or wait for it (operations_wait) and delete the router "
                   f"(inference_routers_delete {router}), then {then}",
                   details={"routers": [router], "operation": creating.id,
                            **({"service": fronted} if fronted else {})})
