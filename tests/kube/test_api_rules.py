"""Semantic validation a real API server does beyond the schema: each wrong manifest gets its 422 Invalid
with the API server's field path and message, and the corrected one is accepted."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException


def _pod(resources: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "main", "image": "busybox:1.36", "resources": resources}], **spec}}


def _refused(call: Any, *args: Any) -> dict[str, Any]:
    with pytest.raises(ApiException) as exc:
        call(*args)
    assert exc.value.status == 422
    body: dict[str, Any] = json.loads(exc.value.body)
    assert body["reason"] == "Invalid"
    return body


@pytest.mark.parametrize(("resources", "field", "message"), [
    ({"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "2"}},
     "spec.containers[0].resources.requests", 'Invalid value: "1": must be equal to nvidia.com/gpu limit of 2'),
    ({"requests": {"nvidia.com/gpu": "1"}}, "spec.containers[0].resources.limits",
     "Required value: Limit must be set for non overcommitable resources"),
    ({"limits": {"nvidia.com/gpu": "0.5"}}, "spec.containers[0].resources.limits[nvidia.com/gpu]",
     'Invalid value: "0.5": must be an integer'),
    ({"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}, "spec.containers[0].resources.requests",
     'Invalid value: "2": must be less than or equal to cpu limit of 1'),
    ({"requests": {"memory": "8Gi"}, "limits": {"memory": "4Gi"}}, "spec.containers[0].resources.requests",
     'Invalid value: "8Gi": must be less than or equal to memory limit of 4Gi'),
])
def test_container_resource_rules(api: client.ApiClient, resources: dict[str, Any], field: str,
                                  message: str) -> None:
    core = client.CoreV1Api(api)
    body = _refused(core.create_namespaced_pod, "default", _pod(resources))
    assert {"field": field, "message": message} in [{k: c[k] for k in ("field", "message")}
                                                     for c in body["details"]["causes"]]
    assert body["message"] == f'Pod "p" is invalid: {field}: {message}'


def test_valid_resources_are_accepted(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    created = core.create_namespaced_pod("default", _pod({
        "requests": {"cpu": "500m", "memory": "1Gi", "nvidia.com/gpu": "2", "vpc.amazonaws.com/efa": "1"},
        "limits": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "2", "vpc.amazonaws.com/efa": "1"}}))
    assert created.spec.containers[0].resources.limits["nvidia.com/gpu"] == "2"
    only_limits = _pod({"limits": {"nvidia.com/gpu": "8"}})  # the request defaults to the limit
    only_limits["metadata"]["name"] = "q"
    assert core.create_namespaced_pod("default", only_limits).metadata.name == "q"


def test_workload_template_resources_are_checked_too(api: client.ApiClient) -> None:
    apps = client.AppsV1Api(api)
    body = _refused(apps.create_namespaced_deployment, "default", {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
        "spec": {"selector": {"matchLabels": {"app": "d"}}, "template": {"metadata": {"labels": {"app": "d"}}, "spec": {
            "containers": [{"name": "m", "image": "x:1", "resources": {"limits": {"nvidia.com/gpu": "1.5"}}}]}}}})
    assert body["details"]["causes"][0]["field"] == "spec.template.spec.containers[0].resources.limits[nvidia.com/gpu]"


def test_unknown_taint_and_toleration_effects(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    body = _refused(core.create_node, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"},
                                       "spec": {"taints": [{"key": "gpu", "value": "x", "effect": "NoRun"}]}})
    assert body["details"]["causes"] == [{
        "reason": "FieldValueNotSupported", "field": "spec.taints[0].effect",
        "message": 'Unsupported value: "NoRun": supported values: "NoSchedule", "PreferNoSchedule", "NoExecute"'}]
    assert core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}, "spec": {
        "taints": [{"key": "gpu", "value": "x", "effect": "NoSchedule"}]}}).metadata.name == "n"
    body = _refused(core.create_namespaced_pod, "default", _pod({}, tolerations=[
        {"key": "gpu", "operator": "Exists", "effect": "NoRun"}]))
    assert body["details"]["causes"][0]["field"] == "spec.tolerations[0].effect"
    body = _refused(core.create_namespaced_pod, "default", _pod({}, tolerations=[
        {"key": "gpu", "operator": "Exists", "value": "x"}]))
    assert body["details"]["causes"][0]["message"] == \
        "Invalid value: \"x\": value must be empty when `operator` is 'Exists'"


@pytest.mark.parametrize("kind", ["deployment", "daemonset", "statefulset", "replicaset"])
def test_selector_must_match_the_template(api: client.ApiClient, kind: str) -> None:
    apps = client.AppsV1Api(api)
    create = getattr(apps, {"deployment": "create_namespaced_deployment", "daemonset": "create_namespaced_daemon_set",
                            "statefulset": "create_namespaced_stateful_set",
                            "replicaset": "create_namespaced_replica_set"}[kind])
    kinds = {"deployment": "Deployment", "daemonset": "DaemonSet", "statefulset": "StatefulSet",
             "replicaset": "ReplicaSet"}

    def manifest(selector: dict[str, Any]) -> dict[str, Any]:
        spec = {"selector": selector, "template": {"metadata": {"labels": {"app": "web"}}, "spec": {
            "containers": [{"name": "m", "image": "nginx:1.27"}]}}}
        if kind == "statefulset":
            spec["serviceName"] = "w"
        return {"apiVersion": "apps/v1", "kind": kinds[kind], "metadata": {"name": "w"}, "spec": spec}

    body = _refused(create, "default", manifest({"matchLabels": {"app": "api"}}))
    assert body["details"]["causes"][0] == {
        "reason": "FieldValueInvalid", "field": "spec.template.metadata.labels",
        "message": 'Invalid value: map[string]string{"app":"web"}: `selector` does not match template `labels`'}
    body = _refused(create, "default", manifest({}))
    assert body["details"]["causes"][0]["message"].endswith(f"empty selector is invalid for {kind}")
    assert create("default", manifest({"matchExpressions": [
        {"key": "app", "operator": "In", "values": ["web", "api"]}]})).metadata.name == "w"
