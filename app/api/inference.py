"""REST routes of the inference noun (self-managed vLLM / SGLang deployments): each handler is one call of a verb
in ``services/inference``."""

from __future__ import annotations

from typing import Any

from app.api.base import Call, Reply, Route, accepted
from app.api.pages import Page, current_principal
from app.bootstrap import Services
from services.auth import Principal
from services.inference import Inference
from services.inference.models import (
    DeploymentList,
    DeploymentRequest,
    DeploymentUpdate,
    DeploymentView,
    EndpointTest,
    EndpointTestResult,
    Preview,
)
from services.replies import Accepted
from services.verbs import role_of

BASE = "/api/v1/clusters/{cluster}/inference/deployments"
CLUSTER = {"cluster": "name the cluster is registered under (clusters_list)"}
ONE = {**CLUSTER, "name": "the deployment's name (inference_list)"}
TAG = "inference"


def _preview(call: Call) -> Reply:
    return Reply(call.services.inference.preview_deployment(call.principal, call.path["cluster"], call.body))


def _deploy(call: Call) -> Reply:
    return accepted(*call.services.inference.deploy(call.principal, call.path["cluster"], call.body,
                                                    call.idempotency_key))


def _list(call: Call) -> Reply:
    return Reply(call.services.inference.list_deployments(call.principal, call.path["cluster"]))


def _get(call: Call) -> Reply:
    return Reply(call.services.inference.describe_deployment(call.principal, call.path["cluster"], call.path["name"]))


def _update(call: Call) -> Reply:
    return accepted(*call.services.inference.update_deployment(call.principal, call.path["cluster"],
                                                               call.path["name"], call.body, call.idempotency_key))


def _delete(call: Call) -> Reply:
    return accepted(*call.services.inference.delete_deployment(call.principal, call.path["cluster"],
                                                               call.path["name"], call.idempotency_key))


def _test(call: Call) -> Reply:
    return Reply(call.services.inference.test_deployment(call.principal, call.path["cluster"], call.path["name"],
                                                         call.body))


DEPLOY_DOC = ("command is the serve command as the user would type it ('vllm serve MODEL [flags]', 'python3 -m "
              "vllm.entrypoints.openai.api_server --model MODEL …' or 'python3 -m sglang.launch_server --model-path "
              "MODEL …'): every flag is checked against the engine's real flags (422 with 'did you mean'); the "
              "model may be a Hugging Face id or a path under /s3/models (downloads_start puts models there). gpus "
              "(per replica) must come from the user; 422 when tensor x pipeline parallel exceeds it, 409 when no "
              "node type of the cluster has that many GPUs. service.exposure 'cluster' (default) makes a ClusterIP "
              "Service; 'external' an internal NLB through the AWS Load Balancer Controller (409 without it), "
              "internet-facing only with internet_facing and source_ranges (0.0.0.0/0 only with "
              "confirm_open_to_world after the user agreed). hf_token goes into a Kubernetes Secret, never stored "
              "or shown.")

ROUTES: list[Route] = [
    Route("POST", BASE + "/preview", "inference_preview", "Preview a vLLM / SGLang deployment's manifests",
          role_of(Inference.preview_deployment), _preview, body=DeploymentRequest, response=Preview,
          path_params=CLUSTER, read_only=True, tag=TAG, open_world=True,
          description="Operator: run every check of inference_deploy and the API server's dry run, and answer the "
                      "Deployment and Service it would create, the engine, model, port and parallel sizes read from "
                      "the command, and warnings; nothing is created. " + DEPLOY_DOC),
    Route("POST", BASE, "inference_deploy", "Deploy a model with vLLM or SGLang", role_of(Inference.deploy), _deploy,
          body=DeploymentRequest, response=Accepted, path_params=CLUSTER, read_only=False, idempotent=False,
          status=202, tag=TAG, open_world=True,
          description="Operator: start operation inference.deploy (namespace, apply, rollout: it ends when every "
                      "replica is available, or fails naming the pods that cannot start and their last log line). "
                      + DEPLOY_DOC + " Follow it with operations_wait, then inference_test."),
    Route("GET", BASE, "inference_list", "A cluster's self-managed inference deployments",
          role_of(Inference.list_deployments), _list, response=DeploymentList, path_params=CLUSTER, tag=TAG,
          open_world=True,
          description="Every vLLM / SGLang deployment of the cluster made by InstantStart: phase (Available, "
                      "Progressing, Stopped, Failed), replicas ready/available/updated, pods and their nodes, the "
                      "Service (type, port, the load balancer's address once made), from watch caches."),
    Route("GET", BASE + "/{name}", "inference_get", "One self-managed inference deployment",
          role_of(Inference.describe_deployment), _get, response=DeploymentView, path_params=ONE, tag=TAG,
          open_world=True,
          description="One deployment: engine, model, image, GPUs per replica, replicas, phase and message, pods "
                      "(node, phase, restarts) and the Service's address; metrics: the engines' time to first "
                      "token (p50/p95) and generated tokens/s between their two latest scrapes (read from each "
                      "ready pod's /metrics, at most every 5 s: call again a few seconds later for a rate), with "
                      "a note when a figure is missing (no requests yet; SGLang without --enable-metrics)."),
    Route("PATCH", BASE + "/{name}", "inference_update", "Change a deployment (rolling update)",
          role_of(Inference.update_deployment), _update, body=DeploymentUpdate, response=Accepted, path_params=ONE,
          read_only=False, idempotent=False, status=202, tag=TAG, open_world=True,
          description="Operator: a new serve command or image rolls out a new ReplicaSet (old pods stay until new "
                      "ones are available); replicas scale (0 stops the engine, keeps the Service). Checked like a "
                      "deploy; the port cannot change. Operation inference.update."),
    Route("DELETE", BASE + "/{name}", "inference_delete", "Delete a self-managed inference deployment",
          role_of(Inference.delete_deployment), _delete, response=Accepted, path_params=ONE, read_only=False,
          destructive=True, idempotent=False, status=202, tag=TAG, open_world=True,
          description="Operator: delete the Deployment, its Service (and load balancer) and its token Secret; "
                      "operation inference.delete. Only deployments InstantStart made."),
    Route("POST", BASE + "/{name}/test", "inference_test", "Send one test request to a deployment",
          role_of(Inference.test_deployment), _test, body=EndpointTest, response=EndpointTestResult, path_params=ONE,
          read_only=False, idempotent=False, tag=TAG, open_world=True,
          description="Operator: one OpenAI-compatible chat/completions (api 'chat') or completions request to the "
                      "deployment through the Kubernetes API's service proxy, capped (64 KiB answer, 60 s): the "
                      "engine's status, generated text, JSON answer and x-* headers."),
]


def _page(services: Services, principal: Principal) -> Any:
    from panels.inference import InferencePane

    return InferencePane(inference=services.inference, clusters=services.clusters, bus=services.bus,
                         principal=principal, current_principal=current_principal(services, principal),
                         scaling=services.inference_scaling, managed=services.managed_inference,
                         routers=services.inference_routers, pools=services.pools)


PAGES: list[Page] = [Page("inference", "Inference", role_of(Inference.list_deployments), _page)]
