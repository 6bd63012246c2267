"""REST routes of model pools (warm vLLM / SGLang pods that model services claim by label): each handler is one
call of a verb in ``services/inference/pool.py``. Tagged ``inference``, so the MCP toolset of that name has them."""

from __future__ import annotations

from app.api.base import Call, Reply, Route, accepted
from services.inference.models import EndpointTest, EndpointTestResult
from services.inference.pool import Pools
from services.inference.pool_models import (
    PoolAssign,
    PoolList,
    PoolPreview,
    PoolRelease,
    PoolRequest,
    PoolScale,
    PoolView,
)
from services.replies import Accepted
from services.verbs import role_of

BASE = "/api/v1/clusters/{cluster}/inference/pools"
CLUSTER = {"cluster": "name the cluster is registered under (clusters_list)"}
ONE = {**CLUSTER, "name": "the pool's name (inference_pool_list)"}
SERVICE = {**ONE, "service": "a model service of the pool (inference_pool_get lists them)"}
TAG = "inference"


def _preview(call: Call) -> Reply:
    return Reply(call.services.pools.preview_pool(call.principal, call.path["cluster"], call.body))


def _create(call: Call) -> Reply:
    return accepted(*call.services.pools.create_pool(call.principal, call.path["cluster"], call.body,
                                                     call.idempotency_key))


def _list(call: Call) -> Reply:
    return Reply(call.services.pools.list_pools(call.principal, call.path["cluster"]))


def _get(call: Call) -> Reply:
    return Reply(call.services.pools.describe_pool(call.principal, call.path["cluster"], call.path["name"]))


def _scale(call: Call) -> Reply:
    return accepted(*call.services.pools.scale_pool(call.principal, call.path["cluster"], call.path["name"],
                                                    call.body, call.idempotency_key))


def _assign(call: Call) -> Reply:
    return accepted(*call.services.pools.assign(call.principal, call.path["cluster"], call.path["name"], call.body,
                                                call.idempotency_key))


def _release(call: Call) -> Reply:
    return accepted(*call.services.pools.release(call.principal, call.path["cluster"], call.path["name"], call.body,
                                                 call.idempotency_key))


def _delete(call: Call) -> Reply:
    return accepted(*call.services.pools.delete_pool(call.principal, call.path["cluster"], call.path["name"],
                                                     call.idempotency_key))


def _test(call: Call) -> Reply:
    return Reply(call.services.pools.test_service(call.principal, call.path["cluster"], call.path["name"],
                                                  call.path["service"], call.body))


POOL_DOC = ("A model pool is one vLLM / SGLang Deployment of warm GPU pods, each labelled business=unassigned; a "
            "model service claims pods with inference_pool_assign (they are relabelled business=<service> and its "
            "ClusterIP Service sends them traffic at once: no restart, no reload) and gives them back with "
            "inference_pool_release. command and gpus follow inference_deploy's rules (gpus always from the user).")

ROUTES: list[Route] = [
    Route("POST", BASE + "/preview", "inference_pool_preview", "Preview a model pool's Deployment",
          role_of(Pools.preview_pool), _preview, body=PoolRequest, response=PoolPreview, path_params=CLUSTER,
          read_only=True, tag=TAG, open_world=True,
          description="Operator: run every check of inference_pool_create and the API server's dry run, and answer "
                      "the pool's Deployment (pod template labelled business=unassigned; its selector leaves "
                      "business out), the engine, model and port; nothing is created. " + POOL_DOC),
    Route("POST", BASE, "inference_pool_create", "Start a model pool of warm workers", role_of(Pools.create_pool),
          _create, body=PoolRequest, response=Accepted, path_params=CLUSTER, read_only=False, idempotent=False,
          status=202, tag=TAG, open_world=True,
          description="Operator: start operation inference.pool.create (namespace, apply, rollout: it ends when "
                      "every pod is available). " + POOL_DOC + " Follow it with operations_wait, then "
                      "inference_pool_assign."),
    Route("GET", BASE, "inference_pool_list", "A cluster's model pools", role_of(Pools.list_pools), _list,
          response=PoolList, path_params=CLUSTER, tag=TAG, open_world=True,
          description="Every model pool of the cluster: replicas, ready, pods held by services and unassigned, "
                      "each pod's node, readiness, restarts and the service holding it, from watch caches."),
    Route("GET", BASE + "/{name}", "inference_pool_get", "One model pool with its pods' assignments",
          role_of(Pools.describe_pool), _get, response=PoolView, path_params=ONE, tag=TAG, open_world=True,
          description="One pool: each pod (name, uid, node, Ready, restarts, assigned_to: the service holding it, "
                      "null when unassigned) and each service with its port and pods."),
    Route("POST", BASE + "/{name}/scale", "inference_pool_scale", "Scale a model pool", role_of(Pools.scale_pool),
          _scale, body=PoolScale, response=Accepted, path_params=ONE, read_only=False, idempotent=False, status=202,
          tag=TAG, open_world=True,
          description="Operator: set the pool's pod count (operation inference.pool.scale; running pods are not "
                      "restarted). Refused with 409 naming the services and how many pods they hold when replicas "
                      "is below that count: release pods first. On scale-in unassigned pods go first; a scale-in "
                      "is refused (409 naming them, details.not_ready) while a pod a service holds is not Ready."),
    Route("POST", BASE + "/{name}/assign", "inference_pool_assign", "Give pool pods to a model service",
          role_of(Pools.assign), _assign, body=PoolAssign, response=Accepted, path_params=ONE, read_only=False,
          idempotent=False, status=202, tag=TAG, open_world=True,
          description="Operator: operation inference.pool.assign: apply the service's ClusterIP Service (named "
                      "after the service, selecting business=<service>) and relabel the chosen pods — count Ready "
                      "unassigned ones, or the named pods — so they serve it at once, without a restart. 409 when "
                      "not enough Ready unassigned pods are there or a named pod is held. All or nothing: a pod "
                      "another writer changes meanwhile is read again; one it then cannot have (held, gone, not "
                      "Ready) fails the operation naming it, and the pods it had relabelled go back to the pool. "
                      "Then inference_pool_test answers from those pods."),
    Route("POST", BASE + "/{name}/release", "inference_pool_release", "Give a service's pods back to the pool",
          role_of(Pools.release), _release, body=PoolRelease, response=Accepted, path_params=ONE, read_only=False,
          idempotent=False, status=202, tag=TAG, open_world=True,
          description="Operator: operation inference.pool.release: relabel the service's pods (all, or the named "
                      "ones) business=unassigned; they keep running warm and stop taking its traffic. Releasing "
                      "every pod of a service deletes its Service, so it is refused (409 naming the router, before any "
                      "write) while a router fronts the service: inference_routers_delete it first; releasing some "
                      "of its pods stays allowed."),
    Route("DELETE", BASE + "/{name}", "inference_pool_delete", "Delete a model pool", role_of(Pools.delete_pool),
          _delete, response=Accepted, path_params=ONE, read_only=False, destructive=True, idempotent=False,
          status=202, tag=TAG, open_world=True,
          description="Operator: delete the pool's Deployment and pods, its token Secret and its services' "
                      "Services (operation inference.pool.delete). Only pools InstantStart made; 409 while a "
                      "router fronts one of its services (inference_routers_delete it first)."),
    Route("POST", BASE + "/{name}/services/{service}/test", "inference_pool_test",
          "Send one test request to a model service of a pool", role_of(Pools.test_service), _test,
          body=EndpointTest, response=EndpointTestResult, path_params=SERVICE, read_only=False, idempotent=False,
          tag=TAG, open_world=True,
          description="Operator: one OpenAI-compatible chat/completions (api 'chat') or completions request to the "
                      "service through the Kubernetes API's service proxy (via 'service_proxy' only), capped (64 "
                      "KiB answer, 60 s): status, text, JSON answer and x-* headers (which name the pod that "
                      "answered where the engine says so)."),
]
