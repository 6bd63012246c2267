"""The HyperPod inference operator in the emulator, through the official client: an InferenceEndpointConfig
becomes a Deployment of its worker (replicas within its autoscaling bounds) and a ClusterIP Service, its status
goes DeploymentInProgress -> DeploymentComplete, a vLLM worker runs the simulated engine and any other worker
the generic model server, both reached through the Service proxy; deleting the config deletes what it made;
autoscaling triggers become a KEDA ScaledObject the config owns, gone once the triggers are."""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client

from sandbox.kube.components import install_component_crds
from tests.kube.serving_support import Served, chat, proxy_call, served, serving
from tests.support import wait_until

__all__ = ["served", "serving"]

GROUP, VERSION, PLURAL = "inference.sagemaker.aws.amazon.com", "v1", "inferenceendpointconfigs"


def _config(name: str, worker: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceEndpointConfig", "metadata": {"name": name},
            "spec": {"modelName": name, "instanceType": "ml.g5.12xlarge",
                     "modelSourceConfig": {"modelSourceType": "s3", "modelLocation": "models/m",
                                           "s3Storage": {"bucketName": "weights", "region": "us-west-2"}},
                     "worker": {"modelVolumeMount": {"name": "model-weights", "mountPath": "/opt/ml/model"},
                                "resources": {"limits": {"nvidia.com/gpu": 1}, "requests": {"nvidia.com/gpu": 1}},
                                **worker}, **spec}}


def _apply(served: Served, body: dict[str, Any]) -> client.CustomObjectsApi:
    install_component_crds(served.cluster, "inference-operator")
    custom = client.CustomObjectsApi(served.api)
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)
    return custom


def _state(custom: client.CustomObjectsApi, name: str, want: str) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        found: dict[str, Any] = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, name)
        return found if (found.get("status") or {}).get("state") == want else None
    return wait_until(reached, 60, f"{name} {want}")


def test_a_config_becomes_a_deployment_and_service_answering_with_its_pod_then_goes_with_it(served: Served) -> None:
    custom = _apply(served, _config("tgi", {
        "image": "763104351884.dkr.ecr.us-east-2.amazonaws.com/huggingface-pytorch-tgi-inference:2.4.0",
        "modelInvocationPort": {"containerPort": 8080, "name": "http"},
        "environmentVariables": [{"name": "SM_NUM_GPUS", "value": "1"}]},
        replicas=7, autoScalingSpec={"minReplicaCount": 1, "maxReplicaCount": 2}))
    apps = client.AppsV1Api(served.api)
    done = _state(custom, "tgi", "DeploymentComplete")
    conditions = {c["type"]: c["status"] for c in done["status"]["conditions"]}
    assert conditions == {"DeploymentInProgress": "False", "DeploymentComplete": "True", "DeploymentFailed": "False"}
    assert done["status"]["replicas"] == 2 and done["status"]["deploymentStatus"]["name"] == "tgi"
    deployment = apps.read_namespaced_deployment("tgi", "default")
    assert deployment.spec.replicas == 2  # 7 asked, the autoscaling maximum is 2
    (container,) = deployment.spec.template.spec.containers
    assert (container.ports[0].container_port, container.volume_mounts[0].mount_path) == (8080, "/opt/ml/model")
    assert container.resources.limits == {"nvidia.com/gpu": "1"}
    assert deployment.metadata.owner_references[0].kind == "InferenceEndpointConfig"
    service = served.core.read_namespaced_service("tgi", "default")
    assert service.spec.type == "ClusterIP" and service.spec.ports[0].port == 8080

    status, headers, text = proxy_call(served.api, "POST", "/api/v1/namespaces/default/services/tgi:http/proxy/"
                                       "invocations", {"inputs": "hi"}, {"Content-Type": "application/json"})
    pods = {p.metadata.name for p in served.core.list_namespaced_pod("default", label_selector="app=tgi").items}
    assert status == 200 and json.loads(text)["pod"] in pods and headers["x-sandbox-pod"] in pods

    custom.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "tgi")
    wait_until(lambda: not apps.list_namespaced_deployment("default").items
               and not [s for s in served.core.list_namespaced_service("default").items if s.metadata.name == "tgi"],
               60, "the Deployment and Service deleted with their config")


def test_a_vllm_worker_runs_the_simulated_engine(served: Served) -> None:
    custom = _apply(served, _config("qwen", {
        "image": "vllm/vllm-openai:v0.7.2", "modelInvocationPort": {"containerPort": 8000, "name": "http"},
        "args": ["--model", "/opt/ml/model", "--served-model-name", "qwen", "--port", "8000"],
        "environmentVariables": [{"name": "SANDBOX_LOAD_SECONDS", "value": "1600"}]}))  # 4 s: seen loading
    in_progress = _state(custom, "qwen", "DeploymentInProgress")
    assert in_progress["status"]["deploymentStatus"]["deploymentObjectOverallState"] == "DeploymentInProgress"
    _state(custom, "qwen", "DeploymentComplete")
    status, headers, answer = chat(served.api, "qwen:http", "hello", model="qwen")
    assert status == 200 and answer["model"] == "qwen" and headers["x-sandbox-pod"].startswith("qwen-")


def test_a_jumpstart_model_is_served_and_a_name_already_taken_fails(served: Served) -> None:
    labels = {"app": "taken"}
    client.AppsV1Api(served.api).create_namespaced_deployment("default", {  # a user's Deployment of that name
        "metadata": {"name": "taken"}, "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels}, "spec": {"containers": [{"name": "web", "image": "nginx"}]}}}})
    custom = _apply(served, _config("taken", {"image": "custom:1", "modelInvocationPort": {"containerPort": 8080}}))
    failed = _state(custom, "taken", "DeploymentFailed")
    assert "already exists" in failed["status"]["deploymentStatus"]["message"]
    assert client.AppsV1Api(served.api).read_namespaced_deployment("taken", "default").spec.template.spec \
        .containers[0].image == "nginx"  # left alone

    custom.create_namespaced_custom_object(GROUP, VERSION, "default", "jumpstartmodels", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "JumpStartModel", "metadata": {"name": "js"},
        "spec": {"model": {"modelId": "deepseek-llm-r1-distill-qwen-1-5b", "acceptEula": True},
                 "server": {"instanceType": "ml.g5.8xlarge"}, "sageMakerEndpoint": {"name": "js-endpoint"}}})

    def complete() -> dict[str, Any] | None:
        found: dict[str, Any] = custom.get_namespaced_custom_object(GROUP, VERSION, "default", "jumpstartmodels", "js")
        return found if (found.get("status") or {}).get("state") == "DeploymentComplete" else None
    wait_until(complete, 60, "the JumpStartModel DeploymentComplete")
    status, headers, text = proxy_call(served.api, "POST", "/api/v1/namespaces/default/services/js:http/proxy/"
                                       "invocations", {"inputs": "hi"}, {"Content-Type": "application/json"})
    assert status == 200 and headers["x-sandbox-pod"].startswith("js-") and json.loads(text)["pod"].startswith("js-")


def test_autoscaling_triggers_become_an_owned_scaled_object_that_goes_with_them(served: Served) -> None:
    """With KEDA's CRDs the operator renders the endpoint's ScaledObject from autoScalingSpec's triggers (the
    sandbox's KEDA then scales on it: tests/test_inference_managed.py); triggers removed, it goes."""
    install_component_crds(served.cluster, "keda")
    query = 'sum(vllm:num_requests_waiting{app="scaled"})'
    custom = _apply(served, _config("scaled", {
        "image": "vllm/vllm-openai:v0.7.2", "modelInvocationPort": {"containerPort": 8000, "name": "http"},
        "args": ["--model", "/opt/ml/model", "--served-model-name", "scaled", "--port", "8000"]},
        autoScalingSpec={"minReplicaCount": 1, "maxReplicaCount": 3, "pollingInterval": 5,
                         "prometheusTriggerList": [{"name": "waiting", "query": query, "targetValue": 4,
                                                    "metricType": "Value"}]}))

    def scaled_object() -> dict[str, Any] | None:
        found = [o for o in custom.list_namespaced_custom_object("keda.sh", "v1alpha1", "default",
                                                                 "scaledobjects")["items"]
                 if o["metadata"]["name"] == "scaled"]
        return found[0] if found else None
    made = wait_until(scaled_object, 60, "the operator's ScaledObject")
    config = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "scaled")
    assert [(o["kind"], o["uid"]) for o in made["metadata"]["ownerReferences"]] == [
        ("InferenceEndpointConfig", config["metadata"]["uid"])]
    assert made["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "scaled"}
    assert (made["spec"]["minReplicaCount"], made["spec"]["maxReplicaCount"], made["spec"]["pollingInterval"]) == \
        (1, 3, 5)
    assert made["spec"]["triggers"] == [{"type": "prometheus", "name": "waiting", "metricType": "Value",
                                         "metadata": {"query": query, "threshold": "4",
                                                      "activationThreshold": "0"}}]  # the CRD's default
    custom.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "scaled",
                                          {"spec": {"autoScalingSpec": {"prometheusTriggerList": None}}})
    wait_until(lambda: scaled_object() is None, 60, "the ScaledObject gone with the triggers")
    custom.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "scaled")
