"""REST routes of managed inference endpoints (the HyperPod inference operator's InferenceEndpointConfig and
JumpStartModel): each handler is one call of a verb in ``services/inference/managed.py``."""

from __future__ import annotations

from app.api.base import Call, Reply, Route, accepted
from services.inference.managed import ManagedEndpoints
from services.inference.managed_models import (
    EndpointList,
    EndpointPreview,
    EndpointRequest,
    EndpointUpdate,
    EndpointView,
)
from services.inference.models import EndpointTest, EndpointTestResult
from services.replies import Accepted
from services.verbs import role_of

BASE = "/api/v1/clusters/{cluster}/inference/endpoints"
CLUSTER = {"cluster": "name the cluster is registered under (clusters_list)"}
ONE = {**CLUSTER, "name": "the endpoint's name (inference_endpoints_list)"}
TAG = "inference"


def _preview(call: Call) -> Reply:
    return Reply(call.services.managed_inference.preview_endpoint(call.principal, call.path["cluster"], call.body))


def _deploy(call: Call) -> Reply:
    return accepted(*call.services.managed_inference.deploy_endpoint(call.principal, call.path["cluster"], call.body,
                                                                     call.idempotency_key))


def _list(call: Call) -> Reply:
    return Reply(call.services.managed_inference.list_endpoints(call.principal, call.path["cluster"]))


def _get(call: Call) -> Reply:
    return Reply(call.services.managed_inference.describe_endpoint(call.principal, call.path["cluster"],
                                                                   call.path["name"]))


def _update(call: Call) -> Reply:
    return accepted(*call.services.managed_inference.update_endpoint(call.principal, call.path["cluster"],
                                                                     call.path["name"], call.body,
                                                                     call.idempotency_key))


def _delete(call: Call) -> Reply:
    return accepted(*call.services.managed_inference.delete_endpoint(call.principal, call.path["cluster"],
                                                                     call.path["name"], call.idempotency_key))


def _test(call: Call) -> Reply:
    return Reply(call.services.managed_inference.test_endpoint(call.principal, call.path["cluster"],
                                                               call.path["name"], call.body))


DEPLOY_DOC = ("A managed endpoint is run by the HyperPod inference operator (409 naming the "
              "hyperpod_inference_operator feature when the cluster lacks it). source.type 's3' (bucket, "
              "region, location), 'fsx' (file_system_id, location) or 'huggingface' (model_id, optional "
              "hf_token kept only in a Kubernetes "
              "Secret) makes an InferenceEndpointConfig and needs worker (image, args, port, gpus — ask the user "
              "for gpus); 'jumpstart' (model_id, version, accept_eula only after the user accepted the license) "
              "makes a JumpStartModel on exactly one instance type. instance_types is a preference list; "
              "avoid_labels keeps pods off nodes (e.g. Spot); kv_cache sets L1 CPU offload and an L2 backend "
              "(redis with l2_url, or tieredstorage); routing (prefixaware, kvaware, session, roundrobin) can only be "
              "chosen now: the operator rejects adding it later; autoscaling sets min/max replicas and the metrics "
              "the operator's KEDA scales on: prometheus [{query, target_value, metric_type Average|Value, "
              "server_address (an AMP workspace only)}] and cloudwatch [{metric_name, namespace, dimensions, stat "
              "(Average, Sum, Minimum, Maximum or SampleCount), target_value, period (1, 5, 10, 30 or a multiple "
              "of 60) dividing collection_time (default 300)}], polling_interval, cooldown_period, stabilization "
              "windows; activation_target_value needs min_replicas 0; trigger names (default prometheus-<n>, "
              "cloudwatch-<n>) must be unique; triggers on a cluster without KEDA install ours first (the operation's "
              "components stage; the preview's install lists it); another KEDA (the operator add-on's bundled "
              "copy on, or one whose keda.sh CRDs someone else installed) scales them as it is: nothing is "
              "installed and the preview's warnings name it. The resource is checked "
              "against the operator's CRD schema (422 naming the field's path) and by the API server's dry "
              "run. Names are unique per cluster across managed endpoints and self-managed deployments.")

ROUTES: list[Route] = [
    Route("POST", BASE + "/preview", "inference_endpoints_preview", "Preview a managed inference endpoint",
          role_of(ManagedEndpoints.preview_endpoint), _preview, body=EndpointRequest, response=EndpointPreview,
          path_params=CLUSTER, read_only=True, tag=TAG, open_world=True,
          description="Operator: run every check of inference_endpoints_deploy and answer the custom resource it "
                      "would apply, the components it would install first (install: keda when triggers need it), and "
                      "warnings; nothing is created. " + DEPLOY_DOC),
    Route("POST", BASE, "inference_endpoints_deploy", "Deploy a managed inference endpoint",
          role_of(ManagedEndpoints.deploy_endpoint), _deploy, body=EndpointRequest, response=Accepted,
          path_params=CLUSTER, read_only=False, idempotent=False, status=202, tag=TAG, open_world=True,
          description="Operator: start operation managed.deploy (components when triggers need KEDA, namespace, "
                      "apply, ready: it ends when the operator "
                      "reports DeploymentComplete, or fails naming the operator's state and reason). " + DEPLOY_DOC
                      + " Follow it with operations_wait, then inference_endpoints_test."),
    Route("GET", BASE, "inference_endpoints_list", "A cluster's managed inference endpoints",
          role_of(ManagedEndpoints.list_endpoints), _list, response=EndpointList, path_params=CLUSTER, tag=TAG,
          open_world=True,
          description="Every InferenceEndpointConfig and JumpStartModel InstantStart made in the cluster, from watch "
                      "caches: the operator's state (DeploymentInProgress, DeploymentComplete, DeploymentFailed, …) "
                      "and message, replicas and available, scaled_to (the replicas the autoscaler asks the operator's "
                      "Deployment for now), autoscaling bounds and triggers, routing, KV cache, model source and "
                      "instance types; operator false when the hyperpod_inference_operator feature is off."),
    Route("GET", BASE + "/{name}", "inference_endpoints_get", "One managed inference endpoint",
          role_of(ManagedEndpoints.describe_endpoint), _get, response=EndpointView, path_params=ONE, tag=TAG,
          open_world=True,
          description="One managed endpoint: the operator's state, conditions and message, replicas (desired: "
                      "spec.replicas; scaled_to: what the autoscaler asks the operator's Deployment for now; running; "
                      "available), autoscaling bounds and triggers, routing, KV cache and the Service tests go "
                      "through. Poll it to watch metric-driven scaling."),
    Route("PATCH", BASE + "/{name}", "inference_endpoints_update", "Change a managed inference endpoint",
          role_of(ManagedEndpoints.update_endpoint), _update, body=EndpointUpdate, response=Accepted,
          path_params=ONE, read_only=False, idempotent=False, status=202, tag=TAG, open_world=True,
          description="Operator: operation managed.update. replicas rescales; autoscaling changes only the fields "
                      "it gives: new min/max bounds (the operator's autoscaler moves the pods into them), new "
                      "prometheus or cloudwatch triggers (an empty list removes them; the operator's KEDA "
                      "ScaledObject follows; triggers on a cluster without KEDA install ours first), polling or "
                      "cooldown; image or args roll the operator's "
                      "Deployment (InferenceEndpointConfig only). Adding intelligent routing to an endpoint deployed "
                      "without it is refused (409 quoting the CRD: the operator rejects it); delete and deploy again "
                      "instead."),
    Route("DELETE", BASE + "/{name}", "inference_endpoints_delete", "Delete a managed inference endpoint",
          role_of(ManagedEndpoints.delete_endpoint), _delete, response=Accepted, path_params=ONE, read_only=False,
          destructive=True, idempotent=False, status=202, tag=TAG, open_world=True,
          description="Operator: delete the endpoint's custom resource (operation managed.delete); the operator's "
                      "Deployment and Service go with it, and its token Secret. Only endpoints InstantStart made."),
    Route("POST", BASE + "/{name}/test", "inference_endpoints_test", "Send one test request to a managed endpoint",
          role_of(ManagedEndpoints.test_endpoint), _test, body=EndpointTest, response=EndpointTestResult,
          path_params=ONE, read_only=False, idempotent=False, tag=TAG, open_world=True,
          description="Operator: one OpenAI-compatible chat/completions (api 'chat') or completions request to the "
                      "operator's Service through the Kubernetes API's service proxy (via 'service_proxy' only), "
                      "capped (64 KiB answer, 60 s): the server's status, text, JSON answer and x-* headers."),
]
