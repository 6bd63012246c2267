"""REST routes of the inference router noun (an SGLang router in front of a self-managed deployment): each handler
is one call of a verb in ``services/inference/router.py``."""

from __future__ import annotations

from app.api.base import Call, Reply, Route, accepted
from services.inference.models import EndpointTest, EndpointTestResult
from services.inference.router import Routers
from services.inference.router_models import RouterList, RouterPreview, RouterRequest, RouterUpdate, RouterView
from services.replies import Accepted
from services.verbs import role_of

BASE = "/api/v1/clusters/{cluster}/inference/routers"
CLUSTER = {"cluster": "name the cluster is registered under (clusters_list)"}
ONE = {**CLUSTER, "name": "the router's name (inference_routers_list)"}
TAG = "inference"


def _preview(call: Call) -> Reply:
    return Reply(call.services.inference_routers.preview_router(call.principal, call.path["cluster"], call.body))


def _create(call: Call) -> Reply:
    return accepted(*call.services.inference_routers.create_router(call.principal, call.path["cluster"], call.body,
                                                                   call.idempotency_key))


def _list(call: Call) -> Reply:
    return Reply(call.services.inference_routers.list_routers(call.principal, call.path["cluster"]))


def _get(call: Call) -> Reply:
    return Reply(call.services.inference_routers.describe_router(call.principal, call.path["cluster"],
                                                                 call.path["name"]))


def _update(call: Call) -> Reply:
    return accepted(*call.services.inference_routers.update_router(call.principal, call.path["cluster"],
                                                                   call.path["name"], call.body,
                                                                   call.idempotency_key))


def _delete(call: Call) -> Reply:
    return accepted(*call.services.inference_routers.delete_router(call.principal, call.path["cluster"],
                                                                   call.path["name"], call.idempotency_key))


def _test(call: Call) -> Reply:
    return Reply(call.services.inference_routers.test_router(call.principal, call.path["cluster"], call.path["name"],
                                                             call.body))


ROUTER_DOC = ("deployment names the inference deployment (inference_list) whose pods become the router's workers: "
              "the router discovers them by the label selector instantstart.io/inference=<deployment> in its "
              "namespace (a ServiceAccount and Role of its own let it list and watch pods there) and speaks "
              "OpenAI to them, so vLLM deployments work too. policy 'cache_aware' (default) sends requests that "
              "share a prefix to the worker already holding it, unless the load is uneven beyond "
              "balance_abs_threshold and balance_rel_threshold; cache_threshold (0-1) is the share of the prefix a "
              "worker must hold. For a model pool give deployment=<pool> and pool_service=<service>: the workers "
              "are the pool's pods that service holds (selector adds business=<service>), so inference_pool_assign "
              "and inference_pool_release change them. Knobs out of range: 422; an unknown deployment or pool, or "
              "a pool_service the pool has not: 404; a name in use: 409; a pool without pool_service: 409 (a router "
              "over the whole pool would also reach its unassigned pods and other services' pods); pool_service "
              "on a deployment that is not a pool: 422; all before anything is made. The router's Service "
              "(ClusterIP, port 30000; Prometheus metrics on 29000) takes the same name as the router.")

ROUTES: list[Route] = [
    Route("POST", BASE + "/preview", "inference_routers_preview", "Preview an SGLang router for a deployment",
          role_of(Routers.preview_router), _preview, body=RouterRequest, response=RouterPreview,
          path_params=CLUSTER, read_only=True, tag=TAG, open_world=True,
          description="Operator: run every check of inference_routers_create and the API server's dry run, and "
                      "answer the router's command line, worker selector and port, and its objects "
                      "(ServiceAccount, Role, RoleBinding, Deployment, Service); nothing is made. " + ROUTER_DOC),
    Route("POST", BASE, "inference_routers_create", "Put an SGLang router in front of a deployment",
          role_of(Routers.create_router), _create, body=RouterRequest, response=Accepted, path_params=CLUSTER,
          read_only=False, idempotent=False, status=202, tag=TAG, open_world=True,
          description="Operator: start operation inference.router.create (apply, rollout: it ends once the "
                      "router is ready, i.e. has found a worker, or fails naming why its pod cannot start). "
                      + ROUTER_DOC + " Follow it with operations_wait, then inference_routers_test."),
    Route("GET", BASE, "inference_routers_list", "A cluster's SGLang routers", role_of(Routers.list_routers), _list,
          response=RouterList, path_params=CLUSTER, tag=TAG, open_world=True,
          description="Every router InstantStart made in the cluster: its deployment, policy and knobs, phase, "
                      "workers (pods, ready) and Service, from watch caches (request counts: inference_routers_get). "
                      "A router whose Deployment is gone but whose Service is left is listed with phase 'Orphaned' "
                      "and left ['Service']: inference_routers_delete removes what it left. One with only its "
                      "ServiceAccount, Role or RoleBinding left is not listed (not watched): inference_routers_get "
                      "or inference_routers_delete by name finds it."),
    Route("GET", BASE + "/{name}", "inference_routers_get", "One SGLang router, with its request counts",
          role_of(Routers.describe_router), _get, response=RouterView, path_params=ONE, tag=TAG, open_world=True,
          description="One router: policy and knobs, workers with the requests the router sent each "
                      "(sgl_router_processed_requests_total), all requests, cache hits and misses, read from its "
                      "Prometheus metrics (metrics_error says why when they cannot be read). A router whose "
                      "Deployment is gone is phase 'Orphaned', left naming every object of it still there (read "
                      "live): inference_routers_delete removes them."),
    Route("PATCH", BASE + "/{name}", "inference_routers_update", "Change a router's policy knobs",
          role_of(Routers.update_router), _update, body=RouterUpdate, response=Accepted, path_params=ONE,
          read_only=False, idempotent=False, status=202, tag=TAG, open_world=True,
          description="Operator: new policy or knobs (only those given change; same ranges as on create, 422 "
                      "otherwise); the router's Deployment rolls out with the new command (operation "
                      "inference.router.update) and its prefix tree starts empty."),
    Route("DELETE", BASE + "/{name}", "inference_routers_delete", "Delete an SGLang router",
          role_of(Routers.delete_router), _delete, response=Accepted, path_params=ONE, read_only=False,
          destructive=True, idempotent=False, status=202, tag=TAG, open_world=True,
          description="Operator: delete the router's Deployment, Service, RoleBinding, Role and ServiceAccount "
                      "(operation inference.router.delete); the worker deployment is not touched."),
    Route("POST", BASE + "/{name}/test", "inference_routers_test", "Send one test request through a router",
          role_of(Routers.test_router), _test, body=EndpointTest, response=EndpointTestResult, path_params=ONE,
          read_only=False, idempotent=False, tag=TAG, open_world=True,
          description="Operator: one OpenAI-compatible chat/completions (api 'chat') or completions request to "
                      "the router's Service through the Kubernetes API's service proxy (via 'service_proxy' only), "
                      "capped (64 KiB answer, 60 s); the router picks the worker by its policy, and the answer's "
                      "headers and system_fingerprint name the worker pod that served it."),
]
