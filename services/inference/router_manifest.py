"""The objects an SGLang router is, built from decisions already made (builders never read the cluster).

The router runs ``python3 -m sglang_router.launch_router`` in the pinned SGLang image (it ships the router), with
Kubernetes service discovery: it lists and watches the pods of its namespace that carry the worker deployment's
label (a model pool's service: the pool's pods labelled ``business=<service>``, so reassigning pods changes its
workers) and sends requests to their engine port. For that its pod runs as a ServiceAccount of its own, bound by a
Role to get/list/watch pods in that namespace only. It listens on all interfaces (the router's default is
loopback, which no Service reaches) for requests on :data:`PORT` and for Prometheus on :data:`METRICS_PORT`; a
ClusterIP Service of the router's name exposes both. Every flag used is in ``router_flags.yaml`` (a test holds
it so).
"""

from __future__ import annotations

import json
from typing import Any

from services.clusters.storage_stage import MANAGED_LABEL
from services.inference.command import IMAGES
from services.inference.manifest import INFERENCE_LABEL
from services.inference.models import Engine
from services.inference.pool_models import BUSINESS
from services.inference.router_models import RouterKnobs
from services.training.manifests import GPU

ROUTER_LABEL = "instantstart.io/inference-router"
FOR_ANNOTATION = "instantstart.io/router-for"
KNOBS_ANNOTATION = "instantstart.io/router-knobs"
SERVICE_ANNOTATION = "instantstart.io/router-pool-service"
CONTAINER = "router"
PORT = 30000
METRICS_PORT = 29000
MODULE = "sglang_router.launch_router"


def labels(name: str) -> dict[str, str]:
    return {**MANAGED_LABEL, ROUTER_LABEL: name}


def selector(deployment: str, pool_service: str | None = None) -> str:
    """The worker pods' label selector: the inference deployment's pods (never a router's: they lack the label);
    for a model pool's service, the pool's pods that service holds (``business=<service>``)."""
    return f"{INFERENCE_LABEL}={deployment}" + (f",{BUSINESS}={pool_service}" if pool_service else "")


def command(knobs: RouterKnobs, *, deployment: str, namespace: str, worker_port: int,
            pool_service: str | None = None) -> list[str]:
    argv = ["python3", "-m", MODULE, "--host", "0.0.0.0", "--port", str(PORT), "--policy", knobs.policy,
            "--cache-threshold", str(knobs.cache_threshold),
            "--balance-abs-threshold", str(knobs.balance_abs_threshold),
            "--balance-rel-threshold", str(knobs.balance_rel_threshold),
            "--eviction-interval-secs", str(knobs.eviction_interval_secs),
            "--max-tree-size", str(knobs.max_tree_size),
            "--service-discovery", "--selector", *selector(deployment, pool_service).split(","),
            "--service-discovery-port", str(worker_port), "--service-discovery-namespace", namespace,
            "--prometheus-host", "0.0.0.0", "--prometheus-port", str(METRICS_PORT)]
    return argv


def _meta(name: str, namespace: str, kind_labels: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": kind_labels}


def objects(*, name: str, namespace: str, deployment: str, knobs: RouterKnobs, worker_port: int,
            pool_service: str | None = None) -> list[dict[str, Any]]:
    """ServiceAccount, Role, RoleBinding, Deployment, Service (the order they are applied in)."""
    mine = labels(name)
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(name, namespace, mine)}
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(name, namespace, mine),
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": _meta(name, namespace, mine),
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
               "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]}
    return [account, role, binding,
            router_deployment(name=name, namespace=namespace, deployment=deployment, knobs=knobs,
                              worker_port=worker_port, pool_service=pool_service),
            {"apiVersion": "v1", "kind": "Service", "metadata": _meta(name, namespace, mine),
             "spec": {"type": "ClusterIP", "selector": mine,
                      "ports": [{"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"},
                                {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics",
                                 "protocol": "TCP"}]}}]


def router_deployment(*, name: str, namespace: str, deployment: str, knobs: RouterKnobs, worker_port: int,
                      pool_service: str | None = None) -> dict[str, Any]:
    mine = labels(name)
    probe = {"periodSeconds": 10, "timeoutSeconds": 5}
    container = {
        "name": CONTAINER, "image": IMAGES[Engine.SGLANG],
        "command": command(knobs, deployment=deployment, namespace=namespace, worker_port=worker_port,
                           pool_service=pool_service),
        "ports": [{"containerPort": PORT, "name": "http", "protocol": "TCP"},
                  {"containerPort": METRICS_PORT, "name": "metrics", "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "4Gi"}},
        "readinessProbe": {"httpGet": {"path": "/readiness", "port": "http"}, **probe, "failureThreshold": 3},
        "livenessProbe": {"httpGet": {"path": "/liveness", "port": "http"}, **probe, "failureThreshold": 6}}
    notes = {FOR_ANNOTATION: deployment, KNOBS_ANNOTATION: json.dumps(knobs.model_dump(), sort_keys=True),
             **({SERVICE_ANNOTATION: pool_service} if pool_service else {})}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {**_meta(name, namespace, mine), "annotations": notes},
            "spec": {"replicas": 1, "selector": {"matchLabels": mine},
                     "template": {"metadata": {"labels": mine},
                                  "spec": {"serviceAccountName": name, "containers": [container],
                                           "tolerations": [{"key": GPU, "operator": "Exists",
                                                            "effect": "NoSchedule"}]}}}}
