"""Rendering managed endpoints, without a cluster: every model source, the tiered KV cache, intelligent routing,
the instance-type preference and the node affinity render resources the shipped CRDs' schemas accept; a resource
that breaks the schema is refused naming each path; the request rules the schema cannot say are refused; autoscaling
triggers render the CRD's trigger lists, read back, update only what is given, are refused (naming the field) for
what KEDA refuses (a statistic or period it does not take, a name used twice), and become a ScaledObject (the
sandbox operator's) that KEDA's shipped CRD accepts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from pydantic import ValidationError

from sandbox.kube import inference_autoscaling
from services.errors import Invalid
from services.inference import managed_render as render
from services.inference import managed_scaling
from services.inference.managed_models import Autoscaling, EndpointRequest
from services.models import parse
from services.secrets import SecretRef

WORKER = {"image": "lmcache/vllm-openai:v0.3.7", "args": ["/opt/ml/model", "--served-model-name", "chat"],
          "port": 8000, "gpus": 1, "cpu": "6", "memory": "30Gi", "env": {"MAX_MODEL_LEN": "4096"}}
KEDA_CRD = Path(__file__).resolve().parents[1] / "services" / "components" / "crds" / "keda.sh_scaledobjects.yaml"
SOURCES: list[dict[str, Any]] = [
    {"type": "s3", "bucket": "models-bucket", "region": "us-west-2", "location": "llama31_8b", "prefetch": True},
    {"type": "fsx", "file_system_id": "fs-0123456789abcdef0", "location": "/models/llama", "mount_name": "abcdef"},
    {"type": "huggingface", "model_id": "meta-llama/Llama-3.1-8B-Instruct", "commit": "a" * 40},
]


def rendered(body: dict[str, Any], token: SecretRef | None = None) -> dict[str, Any]:
    request = parse(EndpointRequest, body)  # as REST reads it: a schema error is a 422 listing the fields
    render.check_request(request)
    manifest = render.render(request, token)
    render.check_schema(manifest)
    return manifest


@pytest.mark.parametrize("source", SOURCES, ids=lambda s: s["type"])
def test_each_source_renders_an_endpoint_config_its_crd_accepts(source: dict[str, Any]) -> None:
    token = SecretRef(cluster="c", namespace="ns", name="chat-hf-token-abc123", key="token")
    manifest = rendered({"name": "chat", "source": source, "worker": WORKER, "instance_types": ["ml.g5.8xlarge"]},
                        token if source["type"] == "huggingface" else None)
    spec = manifest["spec"]
    assert manifest["kind"] == "InferenceEndpointConfig" and spec["modelSourceConfig"]["modelSourceType"] == \
        source["type"]
    assert spec["instanceType"] == "ml.g5.8xlarge" and spec["worker"]["modelInvocationPort"]["containerPort"] == 8000
    assert manifest["metadata"]["annotations"] == {"instantstart.io/api-model": "chat"}
    if source["type"] == "huggingface":
        assert spec["modelSourceConfig"]["huggingFaceModel"]["tokenSecretRef"] == {
            "name": "chat-hf-token-abc123", "key": "token"}


def test_cache_routing_preference_and_affinity_render_as_the_crd_says() -> None:
    spec = rendered({"name": "chat", "source": SOURCES[0], "worker": WORKER,
                     "instance_types": ["ml.g5.8xlarge", "ml.g5.12xlarge"], "routing": "session",
                     "kv_cache": {"l2_backend": "redis", "l2_url": "redis://redis.ns.svc.cluster.local:6379"},
                     "autoscaling": {"min_replicas": 0, "max_replicas": 4}})["spec"]
    assert spec["instanceTypes"] == ["ml.g5.8xlarge", "ml.g5.12xlarge"] and "nodeAffinity" not in spec
    assert spec["intelligentRoutingSpec"] == {"enabled": True, "routingStrategy": "session"}
    assert spec["kvCacheSpec"]["l2CacheSpec"] == {"l2CacheBackend": "redis",
                                                  "l2CacheLocalUrl": "redis://redis.ns.svc.cluster.local:6379"}
    assert spec["autoScalingSpec"] == {"minReplicaCount": 0, "maxReplicaCount": 4}
    # nodeAffinity and instanceTypes are exclusive (the CRD): the types move into the affinity's In term
    avoided = rendered({"name": "chat", "source": SOURCES[0], "worker": WORKER, "instance_types": ["ml.g5.8xlarge"],
                        "avoid_labels": {"example.com/capacity": ["Spot"]}})["spec"]
    assert "instanceType" not in avoided and "instanceTypes" not in avoided
    terms = avoided["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [
        {"key": "example.com/capacity", "operator": "NotIn", "values": ["Spot"]},
        {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["ml.g5.8xlarge"]}]}]


def test_a_jumpstart_model_renders_and_a_broken_resource_names_each_path() -> None:
    manifest = rendered({"name": "ds", "source": {"type": "jumpstart", "model_id": "deepseek-llm-r1-distill-qwen-1-5b",
                                                  "version": "2.0.4", "accept_eula": True},
                         "instance_types": ["ml.g5.8xlarge"], "autoscaling": {"min_replicas": 1, "max_replicas": 2}})
    assert manifest["kind"] == "JumpStartModel" and manifest["spec"]["server"] == {"instanceType": "ml.g5.8xlarge"}
    manifest["spec"]["server"]["instanceType"] = "g5.8xlarge"
    manifest["spec"]["model"]["modelVersion"] = "latest"
    with pytest.raises(Invalid) as refused:
        render.check_schema(manifest)
    assert [f["field"] for f in refused.value.details["fields"]] == ["spec.model.modelVersion",
                                                                     "spec.server.instanceType"]


@pytest.mark.parametrize(("body", "says"), [
    ({"name": "x", "source": SOURCES[0]}, "needs worker"),
    ({"name": "x", "source": {"type": "jumpstart", "model_id": "m"}, "instance_types": ["ml.g5.8xlarge"],
      "worker": WORKER}, "worker applies to an InferenceEndpointConfig"),
    ({"name": "x", "source": {"type": "jumpstart", "model_id": "m"}, "instance_types": []}, "exactly one"),
    ({"name": "x", "source": SOURCES[0], "worker": WORKER, "kv_cache": {"l2_backend": "redis"}}, "l2_url"),
    ({"name": "x", "source": SOURCES[0], "worker": WORKER, "autoscaling": {"min_replicas": 3, "max_replicas": 1}},
     "above max_replicas"),
])
def test_rules_the_schema_cannot_say_are_refused(body: dict[str, Any], says: str) -> None:
    with pytest.raises(Invalid, match=says):
        render.check_request(EndpointRequest.model_validate(body))


SCALED = {"min_replicas": 0, "max_replicas": 4, "polling_interval": 15, "scale_down_stabilization": 60,
          "prometheus": [{"name": "waiting", "query": "sum(vllm:num_requests_waiting)", "target_value": 4,
                          "activation_target_value": 1,
                          "server_address": "https://aps-workspaces.us-west-2.amazonaws.com/workspaces/ws-a1b2"}],
          "cloudwatch": [{"name": "invocations", "metric_name": "Invocations", "namespace": "AWS/SageMaker",
                          "stat": "Sum",
                          "dimensions": {"EndpointName": "chat", "VariantName": "AllTraffic"}, "target_value": 10.5,
                          "metric_type": "Value"}]}


def test_triggers_render_the_crd_lists_and_read_back_and_a_partial_update_keeps_the_rest() -> None:
    manifest = rendered({"name": "chat", "source": SOURCES[0], "worker": WORKER, "autoscaling": SCALED})
    spec = manifest["spec"]["autoScalingSpec"]
    assert spec["prometheusTriggerList"][0] == {
        "name": "waiting", "query": "sum(vllm:num_requests_waiting)", "targetValue": 4.0, "metricType": "Average",
        "activationTargetValue": 1.0, "serverAddress": SCALED["prometheus"][0]["server_address"]}
    assert spec["cloudWatchTriggerList"][0]["dimensions"] == [{"name": "EndpointName", "value": "chat"},
                                                               {"name": "VariantName", "value": "AllTraffic"}]
    assert (spec["pollingInterval"], spec["scaleDownStabilizationTime"]) == (15, 60)
    back = managed_scaling.autoscaling_of(spec).model_dump(exclude_none=True)
    assert back == Autoscaling.model_validate(SCALED).model_dump(exclude_none=True)
    wider = managed_scaling.merged(spec, Autoscaling.model_validate({"max_replicas": 6}))
    assert wider["maxReplicaCount"] == 6 and wider["prometheusTriggerList"] == spec["prometheusTriggerList"]
    dropped = managed_scaling.merged(spec, Autoscaling.model_validate({"prometheus": []}))
    assert "prometheusTriggerList" not in dropped and dropped["cloudWatchTriggerList"] == spec["cloudWatchTriggerList"]


def test_an_activation_value_needs_min_zero_and_the_crd_refuses_an_in_cluster_prometheus() -> None:
    with pytest.raises(Invalid) as refused:
        rendered({"name": "chat", "source": SOURCES[0], "worker": WORKER,
                  "autoscaling": {**SCALED, "min_replicas": 1}})
    assert refused.value.details == {"field": "autoscaling.prometheus[0].activation_target_value"}
    with pytest.raises(ValidationError, match="server_address"):
        Autoscaling.model_validate({"prometheus": [
            {"query": "q", "target_value": 1, "server_address": "http://prometheus.monitoring:9090"}]})


def test_the_sandbox_operator_renders_a_scaled_object_valid_under_the_keda_crd() -> None:
    manifest = rendered({"name": "chat", "source": SOURCES[0], "worker": WORKER, "autoscaling": SCALED})
    config = {**manifest, "metadata": {**manifest["metadata"], "namespace": "ns", "uid": "u-1"}}
    obj = inference_autoscaling.scaled_object_body(config, "endpoint")
    assert obj is not None
    crd = yaml.safe_load(KEDA_CRD.read_text())
    jsonschema.validate(obj, crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    prometheus, cloudwatch = obj["spec"]["triggers"]
    assert (prometheus["type"], prometheus["metricType"], prometheus["metadata"]) == ("prometheus", "AverageValue", {
        "query": "sum(vllm:num_requests_waiting)", "threshold": "4", "activationThreshold": "1",
        "serverAddress": SCALED["prometheus"][0]["server_address"]})
    assert (cloudwatch["type"], cloudwatch["metricType"]) == ("aws-cloudwatch", "Value")
    assert {k: cloudwatch["metadata"][k] for k in ("dimensionName", "dimensionValue", "targetMetricValue",
                                                   "metricStat")} == {
        "dimensionName": "EndpointName;VariantName", "dimensionValue": "chat;AllTraffic",
        "targetMetricValue": "10.5", "metricStat": "Sum"}
    assert (obj["spec"]["minReplicaCount"], obj["spec"]["maxReplicaCount"]) == (0, 4)
    bounds_only = {**config, "spec": {**config["spec"], "autoScalingSpec": {"minReplicaCount": 1}}}
    assert inference_autoscaling.scaled_object_body(bounds_only, "endpoint") is None


def _refused_field(autoscaling: dict[str, Any]) -> str:
    """The one field the 422 of a deploy with ``autoscaling`` names (the schema's or the precheck's)."""
    with pytest.raises(Invalid) as refused:
        rendered({"name": "chat", "source": SOURCES[0], "worker": WORKER, "autoscaling": autoscaling})
    details = refused.value.details
    return str(details["field"]) if "field" in details else ",".join(f["field"] for f in details["fields"])


def cw(**extra: Any) -> dict[str, Any]:
    return {"metric_name": "Invocations", "namespace": "AWS/SageMaker", "target_value": 1, **extra}


@pytest.mark.parametrize(("cloudwatch", "field"), [
    ([cw(stat="p99")], "autoscaling.cloudwatch.0.stat"),  # KEDA takes only the five statistics
    ([cw(period=7)], "autoscaling.cloudwatch[0].period"),  # under 60: 1, 5, 10 or 30
    ([cw(), cw(period=90)], "autoscaling.cloudwatch[1].period"),  # 60 or more: a multiple of 60
    ([cw(period=600)], "autoscaling.cloudwatch[0].period"),  # the default collection time 300 is no multiple
    ([cw(period=120, collection_time=300)], "autoscaling.cloudwatch[0].period"),
])
def test_cloudwatch_statistics_and_periods_keda_refuses_are_refused_naming_the_field(
        cloudwatch: list[dict[str, Any]], field: str) -> None:
    assert _refused_field({"cloudwatch": cloudwatch}) == field


def test_a_period_keda_takes_renders_with_its_collection_time() -> None:
    spec = rendered({"name": "chat", "source": SOURCES[0], "worker": WORKER, "autoscaling": {"cloudwatch": [
        cw(period=600, collection_time=1200), cw(period=30)]}})["spec"]["autoScalingSpec"]
    first, second = spec["cloudWatchTriggerList"]
    assert (first["metricCollectionPeriod"], first["metricCollectionStartTime"]) == (600, 1200)
    assert second["metricCollectionPeriod"] == 30 and "metricCollectionStartTime" not in second
    assert managed_scaling.autoscaling_of(spec).cloudwatch[0].collection_time == 1200


PROM = {"query": "sum(x)", "target_value": 1}


@pytest.mark.parametrize(("autoscaling", "field"), [
    ({"prometheus": [{**PROM, "name": "a"}, {**PROM, "name": "a"}]}, "autoscaling.prometheus[1].name"),
    ({"prometheus": [{**PROM, "name": "a"}], "cloudwatch": [cw(name="a")]}, "autoscaling.cloudwatch[0].name"),
    ({"prometheus": [{**PROM, "name": "prometheus-1"}, PROM]}, "autoscaling.prometheus[1].name"),  # a default
])
def test_a_trigger_name_used_twice_is_refused_naming_the_field(autoscaling: dict[str, Any], field: str) -> None:
    assert _refused_field(autoscaling) == field


def test_an_update_checks_the_merged_triggers_names() -> None:
    current = rendered({"name": "chat", "source": SOURCES[0], "worker": WORKER,
                        "autoscaling": SCALED})["spec"]["autoScalingSpec"]
    merged = managed_scaling.merged(current, Autoscaling.model_validate({"cloudwatch": [cw(name="waiting")]}))
    with pytest.raises(Invalid) as refused:
        managed_scaling.check(managed_scaling.autoscaling_of(merged))
    assert refused.value.details == {"field": "autoscaling.cloudwatch[0].name"}
