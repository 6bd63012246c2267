"""REST routes of inference autoscaling (KEDA on a self-managed deployment's engine metrics): each handler is one
call of a verb in ``services/inference/scaling.py``."""

from __future__ import annotations

from app.api.base import Call, Reply, Route, accepted
from app.api.inference import BASE, ONE, TAG
from services.inference.scaling import InferenceScaling
from services.inference.scaling_models import ScalingPreview, ScalingRequest, ScalingView
from services.replies import Accepted
from services.verbs import role_of

SCALING = BASE + "/{name}/scaling"


def _get(call: Call) -> Reply:
    return Reply(call.services.inference_scaling.describe_scaling(call.principal, call.path["cluster"],
                                                                  call.path["name"]))


def _preview(call: Call) -> Reply:
    return Reply(call.services.inference_scaling.preview_scaling(call.principal, call.path["cluster"],
                                                                 call.path["name"], call.body))


def _set(call: Call) -> Reply:
    return accepted(*call.services.inference_scaling.set_scaling(call.principal, call.path["cluster"],
                                                                 call.path["name"], call.body, call.idempotency_key))


def _remove(call: Call) -> Reply:
    return accepted(*call.services.inference_scaling.remove_scaling(call.principal, call.path["cluster"],
                                                                    call.path["name"], call.idempotency_key))


SET_DOC = ("KEDA scales the Deployment between min_replicas and max_replicas on the engine's own Prometheus "
           "metrics: request_rate (completed requests per second per replica) and/or queue_depth (waiting "
           "requests per replica); at least one is required (422). 409 when the deployment runs SGLang without "
           "--enable-metrics, when the inference operator add-on runs its bundled KEDA, when another KEDA is "
           "installed, or when the name is a model pool's (KEDA would fight its scale-in guard: "
           "inference_pool_scale sizes a pool). The first set on a cluster installs KEDA v2.17.1 and a "
           "Prometheus that scrapes the inference pods. While autoscaled, inference_update refuses a replicas "
           "change (409).")

ROUTES: list[Route] = [
    Route("GET", SCALING, "inference_scaling_get", "A deployment's autoscaling",
          role_of(InferenceScaling.describe_scaling), _get, response=ScalingView, path_params=ONE, tag=TAG,
          open_world=True,
          description="Whether KEDA autoscales the deployment: bounds, triggers and their PromQL, KEDA's Ready and "
                      "Active conditions, the HPA's desired/current replicas and metric values, the Deployment's "
                      "replicas now, and the KEDA and Prometheus components' status."),
    Route("POST", SCALING + "/preview", "inference_scaling_preview", "Preview a deployment's autoscaling",
          role_of(InferenceScaling.preview_scaling), _preview, body=ScalingRequest, response=ScalingPreview,
          path_params=ONE, read_only=True, tag=TAG, open_world=True,
          description="Operator: run every check of inference_scaling_set and answer the ScaledObject it would "
                      "apply (checked by the API server's dry run once KEDA is installed) and the components it "
                      "would install first; nothing is created. " + SET_DOC),
    Route("PUT", SCALING, "inference_scaling_set", "Autoscale a deployment with KEDA",
          role_of(InferenceScaling.set_scaling), _set, body=ScalingRequest, response=Accepted, path_params=ONE,
          read_only=False, idempotent=True, status=202, tag=TAG, open_world=True,
          description="Operator: start operation inference.scaling.set (components: KEDA and Prometheus, once per "
                      "cluster; scaled_object; ready: KEDA accepted it). Setting again replaces bounds and "
                      "triggers. " + SET_DOC + " Follow it with operations_wait, then inference_scaling_get."),
    Route("DELETE", SCALING, "inference_scaling_remove", "Stop autoscaling a deployment",
          role_of(InferenceScaling.remove_scaling), _remove, response=Accepted, path_params=ONE, read_only=False,
          idempotent=False, status=202, tag=TAG, open_world=True,
          description="Operator: delete the deployment's ScaledObject (and KEDA's HPA); the Deployment keeps the "
                      "replicas it has (inference_update changes them again). Operation inference.scaling.remove. "
                      "KEDA and Prometheus stay installed."),
]
