"""The HyperPod inference operator's controller for ``InferenceEndpointConfig``: what the operator makes of one
(where its CRDs are installed, i.e. where the add-on is), and a generic simulated model server.

For an ``InferenceEndpointConfig`` ``<name>`` it makes, owned by it (deleting it deletes them):

* a Deployment ``<name>`` of the model server: one container ``worker`` from ``spec.worker`` (image, command,
  args, ``environmentVariables``, resources, ``modelInvocationPort`` as its port, ``workingDir``), the model
  source as volume ``modelVolumeMount.name`` mounted at its ``mountPath`` (default ``/opt/ml/model``),
  ``worker.probes`` (default: a ``tcpSocket`` readiness probe on the invocation port); its
  replicas are ``spec.replicas`` (default 1), kept within ``autoScalingSpec`` ``minReplicaCount`` /
  ``maxReplicaCount`` (defaults 1/5) when autoscaling is set: once made, the replicas are the autoscaler's, and
  new bounds move them into the bounds;
* with autoscaling triggers, a KEDA ScaledObject that scales the Deployment on them (:mod:`.inference_autoscaling`);
* a ClusterIP Service ``<name>`` on the invocation port, selecting the Deployment's pods;
* the status: ``state`` (``DeploymentInProgress`` until every replica is available, then
  ``DeploymentComplete``), conditions ``DeploymentInProgress`` / ``DeploymentComplete`` (status True/False),
  ``deploymentStatus`` (name, the Deployment's status, overall state), ``replicas``, ``selector`` (for the
  scale subresource) and ``observedGeneration``.

A worker container the simulated vLLM/SGLang engines recognise runs as that engine (:mod:`.inference_engines`);
any other worker runs :func:`generic_server`: after ``SANDBOX_LOAD_SECONDS`` (default 5) it listens on the
invocation port and answers ``GET /ping``, ``GET /health``, ``POST /invocations`` and the OpenAI routes
``POST /v1/chat/completions`` / ``/v1/completions`` with JSON naming its pod (header ``x-sandbox-pod``).
A ``JumpStartModel`` gets the same, its worker being the sandbox's stand-in serving image (:func:`worker_of`).
A Deployment of that name that the config does not own is left alone and the config is ``DeploymentFailed``.
Not modelled: the JumpStart catalog, SageMaker endpoint registration, TLS certificates, the routing service and load
balancer, KV cache and intelligent routing, instance-type node affinity, the model download (the volume is an
``emptyDir``: the weights are not fetched).
"""

from __future__ import annotations

import json
from typing import Any

from . import inference_autoscaling, operator_support, processes
from .backends import Request, Response
from .cluster import Cluster, WriteOptions, clone
from .engine_cli import engine_argv
from .errors import ApiError
from .store import Key, Loc, Obj
from .workloads import owner_ref

GROUP = "inference.sagemaker.aws.amazon.com"
KEY: Key = (GROUP, "inferenceendpointconfigs")
KIND = "InferenceEndpointConfig"
JUMPSTART_KEY: Key = (GROUP, "jumpstartmodels")
JUMPSTART_KIND = "JumpStartModel"
# the sandbox's stand-in for the serving image JumpStart resolves from its catalog (a SageMaker container: :8080)
JUMPSTART_IMAGE = "sandbox.local/jumpstart-model-server:latest"
DEPLOY_KEY: Key = ("apps", "deployments")
SERVICE_KEY: Key = ("", "services")
MANAGER = "hyperpod-inference-operator"
COMPONENT = "hyperpod-inference-operator"
LABEL = f"{GROUP}/endpoint-config"  # on what it makes, valued with the config's name
DEFAULT_MOUNT = "/opt/ml/model"
DEFAULT_MIN, DEFAULT_MAX = 1, 5
GENERIC_LOAD_SECONDS = 5.0


def desired_replicas(spec: dict[str, Any]) -> int:
    """``spec.replicas`` (default 1), within the autoscaling bounds when autoscaling is set."""
    replicas = int(spec.get("replicas", 1))
    scaling = spec.get("autoScalingSpec")
    return bounded(scaling, replicas) if isinstance(scaling, dict) else replicas


def bounded(scaling: dict[str, Any], replicas: int) -> int:
    """``replicas`` within ``autoScalingSpec``'s ``minReplicaCount`` / ``maxReplicaCount`` (defaults 1/5), as the
    operator's autoscaler (KEDA's HPA) holds them: between the bounds only its triggers' ScaledObject moves them."""
    low = int(scaling.get("minReplicaCount", DEFAULT_MIN))
    high = int(scaling.get("maxReplicaCount", DEFAULT_MAX))
    return max(low, min(replicas, high))


def _port(worker: dict[str, Any]) -> dict[str, Any]:
    port = worker.get("modelInvocationPort") or {}
    return {"name": str(port.get("name") or "http"), "containerPort": int(port.get("containerPort") or 8080),
            "protocol": "TCP"}


def worker_of(config: Obj) -> dict[str, Any]:
    """The model server's container as the config describes it (a JumpStartModel's: the catalog's server)."""
    spec = config.get("spec") or {}
    if config.get("kind") != JUMPSTART_KIND:
        return dict(spec.get("worker") or {})
    model = spec.get("model") or {}
    return {"image": JUMPSTART_IMAGE, "modelInvocationPort": {"containerPort": 8080, "name": "http"},
            "modelVolumeMount": {"name": "model-weights"},
            "environmentVariables": [{"name": "SM_MODEL_ID", "value": str(model.get("modelId", ""))},
                                     *(spec.get("environmentVariables") or [])]}


def deployment_body(config: Obj) -> Obj:
    spec = config.get("spec") or {}
    worker = worker_of(config)
    name = config["metadata"]["name"]
    labels = {"app": name, LABEL: name}
    mount = worker.get("modelVolumeMount") or {}
    volume = str(mount.get("name") or "model-weights")
    container: dict[str, Any] = {
        "name": "worker", "image": worker.get("image", ""), "ports": [_port(worker)],
        "resources": {part: {k: str(v) for k, v in (amounts or {}).items()}  # quantities, as the API writes them
                      for part, amounts in (worker.get("resources") or {}).items() if part in ("limits", "requests")},
        "env": [clone(e) for e in worker.get("environmentVariables") or []],
        "volumeMounts": [{"name": volume, "mountPath": str(mount.get("mountPath") or DEFAULT_MOUNT)}]}
    for field in ("command", "args", "workingDir"):
        if worker.get(field):
            container[field] = clone(worker[field])
    probes_given = worker.get("probes") or {}
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        if probes_given.get(probe):
            container[probe] = clone(probes_given[probe])
    # ready once the server listens (the sandbox's default; the operator's own is not in our sources)
    container.setdefault("readinessProbe", {"tcpSocket": {"port": container["ports"][0]["containerPort"]},
                                            "periodSeconds": 5})
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "labels": labels, "ownerReferences": [owner_ref(config)]},
            "spec": {"replicas": desired_replicas(spec), "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [container], "volumes": [{"name": volume, "emptyDir": {}}]}}}}


def service_body(config: Obj) -> Obj:
    name = config["metadata"]["name"]
    port = _port(worker_of(config))
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "labels": {LABEL: name}, "ownerReferences": [owner_ref(config)]},
            "spec": {"type": "ClusterIP", "selector": {"app": name, LABEL: name},
                     "ports": [{"name": port["name"], "port": port["containerPort"],
                                "targetPort": port["containerPort"], "protocol": "TCP"}]}}


def reconcile(cluster: Cluster, loc: Loc) -> None:
    _reconcile(cluster, KEY, loc)


def reconcile_jumpstart(cluster: Cluster, loc: Loc) -> None:
    _reconcile(cluster, JUMPSTART_KEY, loc)


def _reconcile(cluster: Cluster, key: Key, loc: Loc) -> None:
    config = cluster.store.get(key, loc)
    if config is None or config["metadata"].get("deletionTimestamp"):
        return  # what it made goes with it (owner references)
    namespace = loc[0]
    want = deployment_body(config)
    deployment = cluster.store.get(DEPLOY_KEY, loc)
    if deployment is None:
        refused = operator_support.create(cluster, DEPLOY_KEY, namespace, want, MANAGER)
        if refused:
            operator_support.event(cluster, config, "DeploymentFailed", refused, COMPONENT, "Warning")
            _status(cluster, key, config, None, refused)
            return
    elif not any(r.get("uid") == config["metadata"]["uid"]
                 for r in deployment["metadata"].get("ownerReferences") or ()):
        _status(cluster, key, config, None,
                f"Deployment {loc[1]} already exists and is not owned by this {config['kind']}")
        return
    else:
        scaling = (config.get("spec") or {}).get("autoScalingSpec")
        if isinstance(scaling, dict):  # the autoscaler keeps the pods within the bounds: new bounds move them in
            want["spec"]["replicas"] = bounded(scaling, int(deployment["spec"].get("replicas") or 0))
        if deployment["spec"].get("replicas") != want["spec"]["replicas"] or \
                _core(deployment["spec"]["template"]) != _core(want["spec"]["template"]):
            _update_deployment(cluster, deployment, want)
    if cluster.store.get(SERVICE_KEY, loc) is None:
        operator_support.create(cluster, SERVICE_KEY, namespace, service_body(config), MANAGER)
    inference_autoscaling.reconcile(cluster, config, LABEL, MANAGER)
    _status(cluster, key, config, cluster.store.get(DEPLOY_KEY, loc), "")


def _core(template: dict[str, Any]) -> str:
    container = ((template.get("spec") or {}).get("containers") or [{}])[0]
    keys = ("image", "command", "args", "env", "resources", "workingDir")
    return json.dumps({k: container.get(k) for k in keys} | {"ports": [
        (p.get("name"), p.get("containerPort")) for p in container.get("ports") or []]}, sort_keys=True)


def _update_deployment(cluster: Cluster, deployment: Obj, want: Obj) -> None:
    body = clone(deployment)
    body["spec"]["replicas"] = want["spec"]["replicas"]
    if _core(deployment["spec"]["template"]) != _core(want["spec"]["template"]):
        body["spec"]["template"] = want["spec"]["template"]
    meta = deployment["metadata"]
    try:
        cluster.replace(cluster.builtin(*DEPLOY_KEY), meta["namespace"], meta["name"], body,
                        WriteOptions(manager=MANAGER))
    except ApiError:
        return  # changed meanwhile: its event brings the config back


def _status(cluster: Cluster, key: Key, config: Obj, deployment: Obj | None, failure: str) -> None:
    now = cluster.now_iso()
    name = config["metadata"]["name"]
    spec_replicas = desired_replicas(config.get("spec") or {})
    seen = (deployment or {}).get("status") or {}
    available = int(seen.get("availableReplicas") or 0)
    if failure:
        state, reason, message = "DeploymentFailed", "DeploymentFailed", failure
    elif deployment is not None and available >= spec_replicas and \
            seen.get("observedGeneration") == deployment["metadata"].get("generation"):
        state, reason, message = "DeploymentComplete", "DeploymentComplete", \
            f"Deployment {name} has {available}/{spec_replicas} replicas available"
    else:
        state, reason, message = "DeploymentInProgress", "DeploymentInProgress", \
            f"Deployment {name} has {available}/{spec_replicas} replicas available"
    conditions = [operator_support.condition(config, ctype, "True" if ctype == state else "False", reason, message,
                                             now)
                  for ctype in ("DeploymentInProgress", "DeploymentComplete", "DeploymentFailed")]
    old = config.get("status") or {}
    changed = old.get("state") != state
    status: dict[str, Any] = {
        **old, "state": state, "conditions": conditions, "observedGeneration": config["metadata"].get("generation", 1),
        "replicas": int(seen.get("replicas") or 0), "selector": f"app={name},{LABEL}={name}",
        "deploymentStatus": {"name": name, "deploymentObjectOverallState": state, "reason": reason,
                             "message": message, "status": clone(seen),
                             "lastUpdated": now if changed else (old.get("deploymentStatus") or {}).get(
                                 "lastUpdated", now)}}
    operator_support.write_status(cluster, key, config, status, MANAGER)


# --- the generic model server ---------------------------------------------------------------------------------


def _generic(pod: Obj, container: dict[str, Any]) -> bool:
    labels = pod["metadata"].get("labels") or {}
    return LABEL in labels and container.get("name") == "worker" and engine_argv(container) is None


@processes.program(_generic)
def generic_server(proc: processes.Process) -> int:
    """A model server that answers SageMaker's and OpenAI's routes with its pod's name."""
    port = int(next((p.get("containerPort") for p in proc.spec.get("ports") or []), 8080))
    proc.log(f"Starting simulated model server (image {proc.spec.get('image', '')})")
    proc.sleep(float(proc.env.get("SANDBOX_LOAD_SECONDS", GENERIC_LOAD_SECONDS)))
    pod = proc.pod

    def handle(request: Request) -> Response:
        headers = [("Content-Type", "application/json"), ("x-sandbox-pod", pod)]
        if request.method == "GET" and request.path in ("/ping", "/health"):
            return Response(200, b"{}", headers)
        if request.method == "POST" and request.path in ("/invocations", "/v1/chat/completions", "/v1/completions"):
            body = {"pod": pod, "generated_text": f"simulated answer from {pod}"}
            return Response(200, json.dumps(body).encode(), headers)
        return Response(404, json.dumps({"error": "Not Found"}).encode(), headers)

    proc.listen(port, handle)
    proc.log(f"Listening on port {port}")
    proc.sleep(float("inf"))  # serves until killed; the kubelet's prober decides when it is Ready
    return 0
