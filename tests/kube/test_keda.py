"""KEDA in the emulator, through the official client: a ScaledObject with a prometheus trigger gets its HPA
``keda-hpa-<name>`` and, once KEDA's external metrics APIService is registered and Available, scales a vLLM
Deployment within its bounds from the engine's /metrics counters (before, the HPA fails to get the metric); a query
outside the sandbox's subset leaves it Ready=False; deleting it deletes its HPA."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, utils

from sandbox.kube import inference_autoscaling, keda
from sandbox.kube.components import install_component_crds
from sandbox.kube.keda import Query, parse_query
from sandbox.kube.keda_certs import dns_names, granted, make_certs
from tests.kube.serving_support import Served, chat, proxy_call, served, serving
from tests.support import wait_until

__all__ = ["served", "serving"]

GROUP, VERSION, PLURAL = "keda.sh", "v1alpha1", "scaledobjects"


def _vllm(served: Served, name: str) -> None:
    labels = {"app": name}
    client.AppsV1Api(served.api).create_namespaced_deployment("default", {
        "metadata": {"name": name}, "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels}, "spec": {"containers": [{
                "name": "vllm", "image": "vllm/vllm-openai:v0.7.2", "ports": [{"name": "http", "containerPort": 8000}],
                "args": ["--model", "Qwen/Qwen2.5-0.5B-Instruct", "--served-model-name", "qwen"],
                "env": [{"name": "SANDBOX_LOAD_SECONDS", "value": "5"}],
                "resources": {"limits": {"nvidia.com/gpu": "1"}},
                "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5}}]}}}})
    served.core.create_namespaced_service("default", {"metadata": {"name": name}, "spec": {
        "selector": labels, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}})


def _metrics_api_server(served: Served, replicas: int = 1) -> str:
    """KEDA's metrics API server (its Service and Deployment) as the release manifest has them, serving the
    certificate of the Secret kedaorg-certs mounted at /certs; the CA that signed it (base64, a caBundle)."""
    labels = {"app": "keda-operator-metrics-apiserver"}
    served.core.create_namespace({"metadata": {"name": "keda"}})
    certs = {k: base64.b64encode(v).decode() for k, v in make_certs(dns_names("keda")).items()}
    served.core.create_namespaced_secret("keda", {"metadata": {"name": "kedaorg-certs"}, "data": certs})
    served.core.create_namespaced_service("keda", {"metadata": {"name": "keda-operator-metrics-apiserver"}, "spec": {
        "selector": labels, "ports": [{"name": "https", "port": 443, "targetPort": 6443}]}})
    client.AppsV1Api(served.api).create_namespaced_deployment("keda", {
        "metadata": {"name": "keda-operator-metrics-apiserver"}, "spec": {
            "replicas": replicas, "selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels},
                                                                                    "spec": {"containers": [{
                "name": "keda-operator-metrics-apiserver", "image": "ghcr.io/kedacore/keda-metrics-apiserver:2.17.1",
                "ports": [{"name": "https", "containerPort": 6443}],
                "volumeMounts": [{"name": "certificates", "mountPath": "/certs", "readOnly": True}]}],
                "volumes": [{"name": "certificates", "secret": {"secretName": "kedaorg-certs", "optional": True}}]}}}})
    return certs["ca.crt"]


def _register(served: Served, ca_bundle: str = "") -> None:
    """The APIService registering KEDA's external metrics API (no caBundle: as KEDA's manifest ships it)."""
    client.ApiregistrationV1Api(served.api).create_api_service({
        "metadata": {"name": "v1beta1.external.metrics.k8s.io"}, "spec": {
            "service": {"name": "keda-operator-metrics-apiserver", "namespace": "keda"},
            "group": "external.metrics.k8s.io", "version": "v1beta1", "groupPriorityMinimum": 100,
            "versionPriority": 100, **({"caBundle": ca_bundle} if ca_bundle else {})}})


def _available_message(served: Served) -> str:
    status = client.ApiregistrationV1Api(served.api).read_api_service("v1beta1.external.metrics.k8s.io").status
    return next((c.message for c in (status.conditions if status else None) or [] if c.type == "Available"), "")


def _available_reason(served: Served) -> str | None:
    status = client.ApiregistrationV1Api(served.api).read_api_service("v1beta1.external.metrics.k8s.io").status
    return next((c.reason for c in (status.conditions if status else None) or [] if c.type == "Available"), None)


def _available(served: Served) -> str | None:
    api = client.ApiregistrationV1Api(served.api).read_api_service("v1beta1.external.metrics.k8s.io")
    return next((c.status for c in api.status.conditions or [] if c.type == "Available"), None) if api.status else None


def _scaled_object(name: str, target: str, query: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ScaledObject", "metadata": {"name": name},
            "spec": {"scaleTargetRef": {"name": target}, "pollingInterval": 5, **spec, "triggers": [{
                "type": "prometheus", "metadata": {"serverAddress": "http://prometheus.monitoring:9090",
                                                   "query": query, "threshold": "2"}}]}}


def _conditions(custom: client.CustomObjectsApi, name: str) -> dict[str, str]:
    found = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, name)
    return {c["type"]: c["status"] for c in (found.get("status") or {}).get("conditions") or []}


def test_a_scaled_object_scales_its_deployment_from_the_engines_metrics(served: Served) -> None:
    install_component_crds(served.cluster, "keda")
    apps, custom = client.AppsV1Api(served.api), client.CustomObjectsApi(served.api)
    autoscaling = client.AutoscalingV2Api(served.api)
    _vllm(served, "llm")
    wait_until(lambda: (apps.read_namespaced_deployment("llm", "default").status.ready_replicas or 0) == 1,
               60, "the vLLM Deployment Ready")
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, _scaled_object(
        "llm-scaler", "llm", 'sum(vllm:request_success_total{model_name="qwen"})', minReplicaCount=1,
        maxReplicaCount=3))
    wait_until(lambda: _conditions(custom, "llm-scaler") == {"Ready": "True", "Active": "False", "Fallback": "False"},
               60, "the ScaledObject Ready and not active (no request yet)")
    hpa = autoscaling.read_namespaced_horizontal_pod_autoscaler("keda-hpa-llm-scaler", "default")
    assert (hpa.spec.min_replicas, hpa.spec.max_replicas, hpa.spec.scale_target_ref.name) == (1, 3, "llm")
    assert hpa.spec.metrics[0].external.metric.name == "s0-prometheus"
    assert hpa.metadata.owner_references[0].kind == "ScaledObject"
    assert apps.read_namespaced_deployment("llm", "default").spec.replicas == 1

    for _ in range(5):  # 5 requests served: ceil(5 / 2) = 3 replicas, the maximum
        status, _, _ = chat(served.api, "llm:http", "hello", model="qwen")
        assert status == 200

    def failing() -> bool:  # no external metrics API registered: the HPA cannot read KEDA's metrics
        hpa = autoscaling.read_namespaced_horizontal_pod_autoscaler("keda-hpa-llm-scaler", "default")
        return any(c.type == "ScalingActive" and c.status == "False" and c.reason == "FailedGetExternalMetric"
                   and "s0-prometheus.external.metrics.k8s.io" in c.message for c in hpa.status.conditions or [])
    wait_until(failing, 60, "the HPA failing to get its external metric")
    assert apps.read_namespaced_deployment("llm", "default").spec.replicas == 1

    _register(served, _metrics_api_server(served))
    wait_until(lambda: _available(served) == "True", 60, "the external metrics APIService Available")
    wait_until(lambda: apps.read_namespaced_deployment("llm", "default").spec.replicas == 3, 60,
               "the Deployment scaled to 3")
    wait_until(lambda: _conditions(custom, "llm-scaler")["Active"] == "True", 60, "the ScaledObject active")
    status = autoscaling.read_namespaced_horizontal_pod_autoscaler("keda-hpa-llm-scaler", "default").status
    assert status.desired_replicas == 3 and status.current_metrics[0].external.current.average_value == "5"

    custom.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "llm-scaler")
    wait_until(lambda: not autoscaling.list_namespaced_horizontal_pod_autoscaler("default").items, 60,
               "the HPA deleted with its ScaledObject")


def test_a_query_outside_the_subset_is_not_ready(served: Served) -> None:
    install_component_crds(served.cluster, "keda")
    custom = client.CustomObjectsApi(served.api)
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, _scaled_object(
        "odd", "llm", "histogram_quantile(0.9, vllm:e2e_request_latency_seconds_bucket)"))
    wait_until(lambda: _conditions(custom, "odd").get("Ready") == "False", 60, "the ScaledObject refused")
    found = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "odd")
    ready = next(c for c in found["status"]["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "ScaledObjectCheckFailed" and "subset" in ready["message"]
    assert not client.AutoscalingV2Api(served.api).list_namespaced_horizontal_pod_autoscaler("default").items


def test_the_query_subset() -> None:
    assert parse_query("sum(rate(vllm:prompt_tokens_total[1m]))") == Query(
        "sum", "rate", "vllm:prompt_tokens_total", ())
    assert parse_query('avg(vllm:num_requests_waiting{model_name="q"})') == Query(
        "avg", "", "vllm:num_requests_waiting", (("model_name", "q"),))
    assert parse_query("sglang:num_queue_reqs") == Query("sum", "", "sglang:num_queue_reqs", ())
    for refused in ("sum(rate(x[1m])", "sum(x) / 2", 'x{a=~"b"}', "topk(1, x)"):
        with pytest.raises(ValueError):
            parse_query(refused)


def test_a_missing_target_is_not_ready_until_it_appears(served: Served) -> None:
    install_component_crds(served.cluster, "keda")
    custom = client.CustomObjectsApi(served.api)
    autoscaling = client.AutoscalingV2Api(served.api)
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, _scaled_object(
        "later-scaler", "later", "sum(vllm:num_requests_running)", pollingInterval=2))
    wait_until(lambda: _conditions(custom, "later-scaler").get("Ready") == "False", 60, "not Ready without a target")
    assert not autoscaling.list_namespaced_horizontal_pod_autoscaler("default").items
    labels = {"app": "later"}
    client.AppsV1Api(served.api).create_namespaced_deployment("default", {
        "metadata": {"name": "later"}, "spec": {"replicas": 2, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels}, "spec": {"containers": [{"name": "web", "image": "nginx"}]}}}})
    wait_until(lambda: _conditions(custom, "later-scaler").get("Ready") == "True", 60, "Ready once the target exists")
    wait_until(lambda: autoscaling.list_namespaced_horizontal_pod_autoscaler("default").items, 60, "its HPA made")
    assert client.AppsV1Api(served.api).read_namespaced_deployment("later", "default").spec.replicas == 2  # no metrics


def test_an_api_service_is_available_once_its_service_has_a_ready_pod_and_its_ca_verifies_it(served: Served) -> None:
    """kube-aggregator's check: ServiceNotFound, then MissingEndpoints, then FailedDiscoveryCheck while no caBundle
    or a caBundle of another CA fails TLS verification (requests to the group answered 503), then Passed once the
    caBundle holds the CA that signed the server's certificate; discovery lists the group."""
    registration = client.ApiregistrationV1Api(served.api)
    name, discovery = "v1beta1.external.metrics.k8s.io", "/apis/external.metrics.k8s.io/v1beta1"
    _register(served)
    wait_until(lambda: _available_reason(served) == "ServiceNotFound", 60, "Available=False: no Service")
    ca_bundle = _metrics_api_server(served, replicas=0)
    wait_until(lambda: _available_reason(served) == "MissingEndpoints", 60, "Available=False: no ready pod")
    client.AppsV1Api(served.api).patch_namespaced_deployment_scale(
        "keda-operator-metrics-apiserver", "keda", {"spec": {"replicas": 1}})
    wait_until(lambda: _available_reason(served) == "FailedDiscoveryCheck", 60, "Available=False: no caBundle")
    ip = served.core.read_namespaced_service("keda-operator-metrics-apiserver", "keda").spec.cluster_ip
    url = f"https://{ip}:443{discovery}"
    assert _available_message(served) == (f'failing or missing response from {url}: Get "{url}": tls: failed to '
                                          "verify certificate: x509: certificate signed by unknown authority")
    status, _, text = proxy_call(served.api, "GET", discovery + "/namespaces/default/s0-prometheus")
    assert (status, text) == (503, "service unavailable\n")

    registration.patch_api_service(name, {"spec": {"caBundle": ca_bundle}})
    wait_until(lambda: _available_reason(served) == "Passed", 60, "Available once the caBundle verifies the server")
    assert _available(served) == "True" and proxy_call(served.api, "GET", discovery)[0] == 404  # not proxied
    groups = {g.name for g in client.ApisApi(served.api).get_api_versions().groups}
    assert "apiregistration.k8s.io" in groups

    registration.patch_api_service(name, {"spec": {"caBundle": base64.b64encode(  # another CA's
        make_certs(dns_names("keda"))["ca.crt"]).decode()}})
    wait_until(lambda: _available_reason(served) == "FailedDiscoveryCheck", 60, "Available=False: another CA")
    assert _available_message(served).endswith("x509: certificate signed by unknown authority")
    assert proxy_call(served.api, "GET", discovery)[0] == 503


def test_the_operator_makes_its_certificates_with_the_shipped_rbac_and_not_without_its_role(served: Served) -> None:
    """The shipped KEDA manifest without the Role keda-operator-certs: the operator cannot create kedaorg-certs and
    exits ('unable to set up cert rotation'), the APIService stays FailedDiscoveryCheck; with the Role it writes the
    certificates and injects its CA, and the APIService is Available."""
    docs = [d for d in yaml.safe_load_all(Path("services/components/manifests/keda.yaml").read_text()) if d]
    certs_role = [d for d in docs if d["kind"] in ("Role", "RoleBinding") and d["metadata"]["name"] ==
                  "keda-operator-certs"]
    assert len(certs_role) == 2
    utils.create_from_yaml(served.api, yaml_objects=[d for d in docs if d not in certs_role])
    wait_until(lambda: _available_reason(served) == "FailedDiscoveryCheck", 60, "the metrics server's cert unverified")

    def exited() -> str:  # the log of a run that exited 1 (the kubelet may restart it between the two reads)
        pods = served.core.list_namespaced_pod("keda", label_selector="app=keda-operator").items
        status = pods[0].status.container_statuses if pods else None
        ended = status and (status[0].last_state.terminated or status[0].state.terminated)
        log = served.core.read_namespaced_pod_log(pods[0].metadata.name, "keda", previous=bool(
            status[0].last_state.terminated)) if ended and ended.exit_code == 1 else ""
        return log if "unable to set up cert rotation" in log else ""
    log = wait_until(exited, 60, "the operator to exit without the Role")
    assert 'cannot create resource \\"secrets\\"' in log, log
    assert not served.core.list_namespaced_secret("keda", field_selector="metadata.name=kedaorg-certs").items

    # an incomplete Secret someone made: the rotator completes it with an update (the Role grants no patch)
    served.core.create_namespaced_secret("keda", {"metadata": {"name": "kedaorg-certs"}, "data": {
        "ca.crt": base64.b64encode(b"stale").decode()}})
    utils.create_from_yaml(served.api, yaml_objects=certs_role)
    wait_until(lambda: _available_reason(served) == "Passed", 120, "Available once the operator made its certs")
    secret = served.core.read_namespaced_secret("kedaorg-certs", "keda")
    assert set(secret.data) == {"ca.crt", "ca.key", "tls.crt", "tls.key"}
    assert ("keda-operator", "Update") in {(f.manager, f.operation) for f in secret.metadata.managed_fields}
    api = client.ApiregistrationV1Api(served.api).read_api_service("v1beta1.external.metrics.k8s.io")
    assert api.spec.ca_bundle == secret.data["ca.crt"]

    # and no more on Secrets and Leases than that (KEDA's chart): read and write its own Secret, never patch or
    # delete one, read no other; its Lease only in its own namespace
    operator = ("keda", "keda-operator")

    def may(namespace: str, resource: str, verb: str, name: str = "") -> bool:
        group = "coordination.k8s.io" if resource == "leases" else ""
        return granted(served.cluster, operator, namespace, group, resource, verb, name)
    assert all(may("keda", "secrets", v, "kedaorg-certs") for v in ("get", "create", "update"))
    assert not any(may("keda", "secrets", v, "kedaorg-certs") for v in ("patch", "delete"))
    assert not may("default", "secrets", "create") and not may("default", "secrets", "update", "other")
    assert may("keda", "leases", "update", "operator.keda.sh") and not may("default", "leases", "create")
    # the rotator's informers on the kinds of its webhooks: ValidatingWebhookConfigurations as well as APIServices
    assert all(granted(served.cluster, operator, "", group, resource, v) for v in ("list", "watch")
               for group, resource in (("admissionregistration.k8s.io", "validatingwebhookconfigurations"),
                                       ("apiregistration.k8s.io", "apiservices")))


def test_a_value_trigger_gives_the_hpa_a_value_target() -> None:
    so = {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "chat", "uid": "u-1"},
          "spec": {"scaleTargetRef": {"name": "chat"}, "triggers": [
        {"type": "prometheus", "metricType": "Value", "metadata": {"query": "sum(x)", "threshold": "4"}},
        {"type": "prometheus", "metadata": {"query": "sum(y)", "threshold": "0.5"}}]}}
    targets = [m["external"]["target"] for m in keda.hpa_body(so)["spec"]["metrics"]]
    assert targets == [{"type": "Value", "value": "4"}, {"type": "AverageValue", "averageValue": "500m"}]


def _cloudwatch_trigger(**meta: str) -> dict[str, Any]:
    return {"type": "aws-cloudwatch", "metadata": {
        "namespace": "AWS/SageMaker", "metricName": "Invocations", "dimensionName": "EndpointName",
        "dimensionValue": "chat", "targetMetricValue": "10", "awsRegion": "us-west-2", **meta}}


def _refusal(*triggers: dict[str, Any]) -> str:
    return keda._check({"spec": {"scaleTargetRef": {"name": "chat"}, "triggers": list(triggers)}})


def test_keda_refuses_cloudwatch_metadata_as_its_scaler_parses_it() -> None:
    """KEDA's aws-cloudwatch parser: the five statistics, its periods, a window that is a multiple of the period,
    a region; its messages."""
    assert _refusal(_cloudwatch_trigger()) == ""
    assert _refusal(_cloudwatch_trigger(metricStat="Sum", metricStatPeriod="60", metricCollectionTime="300")) == ""
    assert _refusal(_cloudwatch_trigger(metricStatPeriod="1200", metricCollectionTime="3600")) == ""
    prefix = "error parsing cloudwatch metadata: "
    assert _refusal(_cloudwatch_trigger(metricStat="p99")) == \
        prefix + "metricStat 'p99' is not one of [SampleCount Average Sum Minimum Maximum]"
    assert _refusal(_cloudwatch_trigger(metricStatPeriod="7")) == \
        prefix + "metricStatPeriod < 60 has to be one of [1, 5, 10, 30], however, 7 is provided"
    assert _refusal(_cloudwatch_trigger(metricStatPeriod="90")) == \
        prefix + "metricStatPeriod >= 60 has to be a multiple of 60, however, 90 is provided"
    assert _refusal(_cloudwatch_trigger(metricStatPeriod="600")) == prefix + \
        "metricCollectionTime must be greater than 0 and a multiple of metricStatPeriod(600), 300 is given"
    assert _refusal(_cloudwatch_trigger(awsRegion="")) == prefix + "no awsRegion given"


def test_keda_refuses_a_trigger_name_given_twice() -> None:
    prometheus = {"type": "prometheus", "metadata": {"query": "sum(x)", "threshold": "1"}}
    assert _refusal({**prometheus, "name": "a"}, {**prometheus, "name": "b"}, prometheus, prometheus) == ""
    assert _refusal({**prometheus, "name": "a"}, {**_cloudwatch_trigger(), "name": "a"}) == \
        'triggerName "a" is defined multiple times in the ScaledObject, but it must be unique'


def test_a_scaled_object_keda_refuses_is_not_ready_and_gets_no_hpa(served: Served) -> None:
    install_component_crds(served.cluster, "keda")
    custom = client.CustomObjectsApi(served.api)
    twice = _scaled_object("twice", "llm", "sum(vllm:num_requests_running)")
    twice["spec"]["triggers"] = [{**twice["spec"]["triggers"][0], "name": "a"}] * 2
    percentile = {**_scaled_object("percentile", "llm", ""), "spec": {
        "scaleTargetRef": {"name": "llm"}, "triggers": [_cloudwatch_trigger(metricStat="p99")]}}
    for body in (twice, percentile):
        custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)
    for name, message in (("twice", 'triggerName "a" is defined multiple times'), ("percentile", "metricStat 'p99'")):
        wait_until(lambda n=name: _conditions(custom, n).get("Ready") == "False", 60, f"{name} refused")
        found = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, name)
        ready = next(c for c in found["status"]["conditions"] if c["type"] == "Ready")
        assert ready["reason"] == "ScaledObjectCheckFailed" and message in ready["message"], ready
    assert not client.AutoscalingV2Api(served.api).list_namespaced_horizontal_pod_autoscaler("default").items


def test_the_operator_gives_cloudwatch_triggers_the_clusters_region() -> None:
    """KEDA has no default region; the operator's ScaledObject names the cluster's (none without a cloud)."""
    config = {"apiVersion": "inference.sagemaker.aws.amazon.com/v1", "kind": "InferenceEndpointConfig",
              "metadata": {"name": "chat", "namespace": "ns", "uid": "u-1"}, "spec": {"autoScalingSpec": {
                  "cloudWatchTrigger": {"namespace": "AWS/SageMaker", "metricName": "Invocations",
                                        "dimensions": [{"name": "EndpointName", "value": "chat"}],
                                        "targetValue": 10}}}}
    for region, refusal in (("us-west-2", ""), ("", "error parsing cloudwatch metadata: no awsRegion given")):
        so = inference_autoscaling.scaled_object_body(config, "endpoint", region)
        assert so is not None and keda._check(so) == refusal
        assert so["spec"]["triggers"][0]["metadata"].get("awsRegion", "") == region
