"""Managed inference endpoints against a real server in sandbox mode, on a seeded, imported cluster of three
ml.g5.8xlarge nodes (one GPU each), where the sandbox's HyperPod inference operator turns an
InferenceEndpointConfig or a JumpStartModel into a Deployment and Service of a simulated model server: without the
operator's CRDs a deploy is refused naming the feature; bad input (a worker missing, JumpStart with routing, what
only the CRD's schema forbids) is refused before any operation or Kubernetes write; through REST a Hugging Face
endpoint deploys with its token only in a Secret the resource owns, answers a test through the operator's Service,
has intelligent routing refused with the CRD's words and zero writes, scales through its autoscaling bounds (the
operator's Deployment follows) and is deleted with everything the operator made; a JumpStart model deploys and
serves; an agent follows ``skills/deploy-model.md`` through a real MCP client; the inference pane's managed
section previews, deploys, tests, rescales and deletes a JumpStart model; a test call is refused, sending
nothing, when the Service of the endpoint's name is not the operator's. Metric-driven autoscaling: bad triggers are
refused (422 naming the field) with zero writes, and so are triggers where a KEDA someone else installed runs (409);
``prometheus: []`` removes a trigger another field manager wrote;
a preview names KEDA as what a deploy installs first; the
first deploy with a trigger installs KEDA from the component registry (its objects written once, no Prometheus)
and a second endpoint with triggers writes none of them again; a
Prometheus trigger on the simulated vLLM's request counter makes the operator render a ScaledObject the sandbox's KEDA
scales the endpoint's Deployment with: up to its max under test traffic and back to its min after, through REST, an
agent on MCP and the pane's trigger form, while the product itself writes no ScaledObject or HPA; a CloudWatch
trigger scales it on the metric the test puts into the sandbox's CloudWatch."""

from __future__ import annotations

import asyncio
import json
import secrets
from pathlib import Path
from typing import Any

import anyio
import panel as pn
import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from panels.inference import InferencePane
from services.auth import Principal, Role
from services.operations import OperationQuery
from services.settings import Settings
from tests.jobs_support import CLUSTER, JobWorld, cli
from tests.ledger import CallLedger
from tests.managed_support import (
    BASE,
    EXTERNAL_METRICS,
    GROUP,
    KEDA_OBJECTS,
    KINDS,
    NS,
    RATE_QUERY,
    S3,
    VERSION,
    assert_no_operations,
    delete,
    deployment,
    endpoint,
    finished,
    keda_writes,
    operator,
    patch,
    replicas,
    triggered,
    world,
)
from tests.mcp_support import bridge, call, follow, playbook_tools
from tests.sandbox_support import client
from tests.support import wait_until
from tests.test_inference import PLAYBOOK, VLLM
from tests.test_inference_scaling import foreign_keda

pytestmark = pytest.mark.slow
__all__ = ["operator", "world"]  # the module's fixtures, one world for this module
def test_without_the_operator_a_deploy_is_refused_naming_the_feature(world: JobWorld) -> None:
    ledger = CallLedger(world.live)
    mark = ledger.mark()
    refused = world.live.post(BASE, endpoint())
    assert refused.status_code == 409, refused.text
    assert "hyperpod_inference_operator" in refused.text and "features" in refused.text
    listed = world.live.get(BASE).json()
    assert listed == {"cluster": CLUSTER, "operator": False, "endpoints": []}
    ledger.assert_no_writes(since=mark, service="kubernetes")
    assert_no_operations(world)


def test_bad_input_is_refused_before_any_operation_or_write(operator: JobWorld) -> None:
    world = operator
    wait_until(lambda: world.live.get(BASE).json()["operator"], 60, "the operator's CRDs in the cache")
    ledger = CallLedger(world.live)
    mark = ledger.mark()
    no_worker = world.live.post(BASE, {"name": "llama", "source": S3})
    assert no_worker.status_code == 422 and "needs worker" in no_worker.text, no_worker.text
    jumpstart = {"type": "jumpstart", "model_id": "deepseek-llm-r1-distill-qwen-1-5b"}
    routed = world.live.post(BASE, {"name": "ds", "source": jumpstart, "instance_types": ["ml.g5.8xlarge"],
                                    "routing": "kvaware"})
    assert routed.status_code == 422 and "routing applies to an InferenceEndpointConfig" in routed.text, routed.text
    # the request model leaves the hub's spelling to the CRD: its schema refuses it, naming the path
    bad_hub = world.live.post(BASE, {"name": "ds", "source": {**jumpstart, "hub": "my_hub"},
                                     "instance_types": ["ml.g5.8xlarge"]})
    assert bad_hub.status_code == 422, bad_hub.text
    fields = [f["field"] for f in bad_hub.json()["error"]["details"]["fields"]]
    assert fields == ["spec.model.modelHubName"], bad_hub.text
    l2 = world.live.post(BASE, endpoint(kv_cache={"l2_backend": "redis"}))
    assert l2.status_code == 422 and "l2_url" in l2.text, l2.text
    strategy = world.live.post(BASE, endpoint(routing="fastest"))
    assert strategy.status_code == 422 and "prefixaware" in strategy.text, strategy.text
    bounds = world.live.post(BASE, endpoint(autoscaling={"min_replicas": 3, "max_replicas": 2}))
    assert bounds.status_code == 422 and "min_replicas" in bounds.text, bounds.text
    shown = world.live.post(f"{BASE}/preview", endpoint(routing="prefixaware",
                                                        kv_cache={"l2_backend": "tieredstorage"}))
    assert shown.status_code == 200, shown.text
    spec = shown.json()["manifest"]["spec"]
    assert spec["intelligentRoutingSpec"] == {"enabled": True, "routingStrategy": "prefixaware"}
    assert spec["kvCacheSpec"] == {"enableL1Cache": True, "enableL2Cache": True,
                                   "l2CacheSpec": {"l2CacheBackend": "tieredstorage"}}
    assert spec["instanceType"] == "ml.g5.8xlarge"
    assert any("fixed for the endpoint's life" in w for w in shown.json()["warnings"])
    ledger.assert_no_writes(since=mark, service="kubernetes")
    assert_no_operations(world)


def test_an_endpoint_deploys_serves_refuses_added_routing_scales_and_is_deleted(operator: JobWorld) -> None:
    world = operator
    token = "hf_" + secrets.token_urlsafe(24)
    seen: list[str] = []
    hf = {"type": "huggingface", "model_id": "meta-llama/Llama-3.1-8B-Instruct", "hf_token": token}
    started = world.live.post(BASE, endpoint("llama", source=hf, autoscaling={"min_replicas": 1, "max_replicas": 3}))
    seen.append(started.text)
    assert started.status_code == 202, started.text
    op = finished(world, started.json()["operation"]["id"])
    seen.append(str(op))
    assert op["status"] == "succeeded", (op, op.get("stages"), op.get("error"))
    assert op["target"] == f"cluster/{CLUSTER}/inference/llama"

    resource: Any = world.custom.get_namespaced_custom_object(GROUP, VERSION, NS, "inferenceendpointconfigs", "llama")
    ref = resource["spec"]["modelSourceConfig"]["huggingFaceModel"]["tokenSecretRef"]
    secret: Any = world.core.read_namespaced_secret(ref["name"], NS)
    assert [(o.kind, o.uid) for o in secret.metadata.owner_references] == [
        ("InferenceEndpointConfig", resource["metadata"]["uid"])]
    wait_until(lambda: world.live.get(f"{BASE}/llama").json()["scaled_to"] == 1, 60, "the operator's Deployment cached")
    view = world.live.get(f"{BASE}/llama").json()
    seen.append(str(view))
    assert view["state"] == "DeploymentComplete" and view["source"] == "huggingface", view
    assert (view["autoscaling"]["min_replicas"], view["autoscaling"]["max_replicas"]) == (1, 3), view
    assert view["autoscaling"]["prometheus"] == [] and view["available"] == 1
    assert any(c["type"] == "DeploymentComplete" and c["status"] == "True" for c in view["conditions"])
    listed_cli = cli(world, "inference", "endpoints", "list", CLUSTER)
    assert listed_cli.returncode == 0 and listed_cli.stdout.startswith(f"{NS}/llama "), listed_cli.stderr
    counts = f"{view['available']}/{view['desired']} available, scaled to {view['scaled_to']}"
    assert "DeploymentComplete" in listed_cli.stdout and counts in listed_cli.stdout, listed_cli.stdout
    described_cli = cli(world, "inference", "endpoints", "describe", CLUSTER, "llama", "--json")
    assert described_cli.returncode == 0 and json.loads(described_cli.stdout)["name"] == "llama", described_cli.stderr

    answer = world.live.post(f"{BASE}/llama/test", {"prompt": "hello"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == 200, answer.json()
    assert answer.json()["headers"]["x-sandbox-pod"].startswith("llama-")
    assert answer.json()["path"].endswith("/services/llama:8000/proxy/v1/chat/completions")

    ledger = CallLedger(world.live)
    mark = ledger.mark()
    routing = patch(world, f"{BASE}/llama", {"routing": "prefixaware"})
    assert routing.status_code == 409, routing.text
    assert "Adding this configuration to an existing deployment will be rejected" in routing.text
    # a self-managed deployment may not take the endpoint's name, in any namespace (one name, one thing)
    clash = world.live.post(f"/api/v1/clusters/{CLUSTER}/inference/deployments",
                            {"name": "llama", "namespace": "team-a", "command": VLLM, "gpus": 1})
    assert clash.status_code == 409 and "managed inference endpoint 'llama'" in clash.text, clash.text
    ledger.assert_no_writes(since=mark, service="kubernetes")
    assert world.live.get("/api/v1/operations?kind=managed.update").json() == []
    assert world.live.get("/api/v1/operations?kind=inference.deploy").json() == []

    scaled = patch(world, f"{BASE}/llama", {"autoscaling": {"min_replicas": 2, "max_replicas": 3}})
    assert scaled.status_code == 202, scaled.text
    assert finished(world, scaled.json()["operation"]["id"])["status"] == "succeeded"
    wait_until(lambda: deployment(world, "llama").spec.replicas == 2, 60,
               "the operator's Deployment moved into the new bounds")
    wait_until(lambda: world.live.get(f"{BASE}/llama").json()["available"] == 2, 120, "two pods available")
    again = world.live.post(f"{BASE}/llama/test", {"prompt": "hello"}).json()
    assert again["status"] == 200, again  # the update kept the model name requests carry

    gone = delete(world, f"{BASE}/llama")
    assert gone.status_code == 202, gone.text
    assert finished(world, gone.json()["operation"]["id"])["status"] == "succeeded"
    with pytest.raises(ApiException) as absent:
        world.custom.get_namespaced_custom_object(GROUP, VERSION, NS, "inferenceendpointconfigs", "llama")
    assert absent.value.status == 404
    with pytest.raises(ApiException) as no_secret:
        world.core.read_namespaced_secret(ref["name"], NS)
    assert no_secret.value.status == 404

    def collected() -> bool:
        try:
            deployment(world, "llama")
        except ApiException as exc:
            return bool(exc.status == 404)
        return False
    wait_until(collected, 60, "the operator's Deployment to go with its owner")
    wait_until(lambda: world.live.get(BASE).json()["endpoints"] == [], 60, "the cached list to drop the endpoint")
    records = [str(o) for kind in KINDS for o in world.live.get(f"/api/v1/operations?kind={kind}").json()]
    audit = world.live.get("/api/v1/audit", params={"limit": 100}).text
    assert all(token not in text for text in [*seen, *records, audit])


def test_a_jumpstart_model_deploys_and_serves(operator: JobWorld) -> None:
    world = operator
    source = {"type": "jumpstart", "model_id": "deepseek-llm-r1-distill-qwen-1-5b", "version": "2.0.4",
              "accept_eula": True}
    started = world.live.post(BASE, {"name": "deepseek", "source": source, "instance_types": ["ml.g5.8xlarge"]})
    assert started.status_code == 202, started.text
    assert finished(world, started.json()["operation"]["id"])["status"] == "succeeded"
    found: Any = world.custom.get_namespaced_custom_object(GROUP, VERSION, NS, "jumpstartmodels", "deepseek")
    assert found["spec"]["model"] == {"modelId": "deepseek-llm-r1-distill-qwen-1-5b", "modelVersion": "2.0.4",
                                      "modelHubName": "SageMakerPublicHub", "acceptEula": True}
    view = world.live.get(f"{BASE}/deepseek").json()
    assert (view["kind"], view["state"], view["source"]) == ("JumpStartModel", "DeploymentComplete", "jumpstart")
    answer = world.live.post(f"{BASE}/deepseek/test", {"api": "completion", "prompt": "Once upon"}).json()
    assert answer["status"] == 200 and answer["headers"]["x-sandbox-pod"].startswith("deepseek-"), answer
    gone = delete(world, f"{BASE}/deepseek")
    assert finished(world, gone.json()["operation"]["id"])["status"] == "succeeded"


def test_an_agent_deploys_tests_scales_and_deletes_a_managed_endpoint(operator: JobWorld) -> None:
    world = operator
    token = world.live.make_token("operator")
    playbook = playbook_tools(PLAYBOOK)
    used: list[str] = []
    request = {"cluster": CLUSTER, **endpoint("agent-llama", autoscaling={"min_replicas": 1, "max_replicas": 2})}
    one = {"cluster": CLUSTER, "name": "agent-llama"}

    async def agent() -> dict[str, Any]:
        async with bridge(world.live.url, token, "inference,clusters,operations,system") as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert tools["inference_endpoints_delete"].annotations.destructive_hint  # type: ignore[union-attr]
            assert tools["inference_endpoints_list"].annotations.read_only_hint  # type: ignore[union-attr]
            preview = await call(client, "inference_endpoints_preview", request, used)
            started = await call(client, "inference_endpoints_deploy", request, used)
            deployed = await follow(client, started["operation"]["id"], used, timeout=180)
            answer = await call(client, "inference_endpoints_test", {**one, "prompt": "hi"}, used)
            scaling = await call(client, "inference_endpoints_update",
                                 {**one, "autoscaling": {"min_replicas": 2, "max_replicas": 2}}, used)
            scaled = await follow(client, scaling["operation"]["id"], used, timeout=180)
            detail = await call(client, "inference_endpoints_get", one, used)
            deleting = await call(client, "inference_endpoints_delete", one, used)
            deleted = await follow(client, deleting["operation"]["id"], used, timeout=180)
            listed = await call(client, "inference_endpoints_list", {"cluster": CLUSTER}, used)
            return {"preview": preview, "deployed": deployed, "answer": answer, "scaled": scaled, "detail": detail,
                    "deleted": deleted, "listed": listed}

    seen = anyio.run(agent)
    assert seen["preview"]["kind"] == "InferenceEndpointConfig"
    assert seen["deployed"]["status"] == "succeeded", seen["deployed"]
    assert seen["answer"]["status"] == 200, seen["answer"]
    assert seen["scaled"]["status"] == "succeeded", seen["scaled"]
    assert (seen["detail"]["autoscaling"]["min_replicas"], seen["detail"]["autoscaling"]["max_replicas"]) == (2, 2)
    assert seen["detail"]["replicas"] == 2, seen["detail"]
    assert seen["deleted"]["status"] == "succeeded"
    assert "agent-llama" not in {e["name"] for e in seen["listed"]["endpoints"]}
    assert set(used) <= playbook, f"tools outside the playbook: {set(used) - playbook}"
    audit = world.live.get("/api/v1/audit", params={"limit": 100}).json()
    actions = {e["action"] for e in (audit["items"] if isinstance(audit, dict) else audit)}
    assert {"managed.deploy", "managed.test", "managed.update", "managed.delete"} <= actions


def test_the_pane_section_previews_deploys_tests_scales_and_deletes(operator: JobWorld, tmp_path: Path) -> None:
    world = operator
    who = Principal("pane-operator", Role.OPERATOR, "t-op", "api")
    viewer = Principal("pane-viewer", Role.VIEWER, "t-view", "api")
    with world.server.imported(tmp_path / "product", CLUSTER, who) as services:
        watching = InferencePane(services.inference, services.clusters, services.bus, viewer,
                                 managed=services.managed_inference)
        assert watching.managed is not None and watching.managed.deploy_button.disabled
        pane = InferencePane(services.inference, services.clusters, services.bus, who,
                             managed=services.managed_inference)
        pn.panel(pane).get_root()  # renders alone, as in a notebook
        section = pane.managed
        assert section is not None and section.state.cluster == CLUSTER
        section.state.body = json.dumps({"name": "pane-ds", "source": {
            "type": "jumpstart", "model_id": "deepseek-llm-r1-distill-qwen-1-5b"}, "instance_types": []})
        asyncio.run(section._preview(None))
        assert "exactly one instance type" in section.state.message, section.state.message
        section.state.body = json.dumps({"name": "pane-ds", "source": {
            "type": "jumpstart", "model_id": "deepseek-llm-r1-distill-qwen-1-5b"},
            "instance_types": ["ml.g5.8xlarge"], "autoscaling": {"min_replicas": 1, "max_replicas": 2}})
        asyncio.run(section._preview(None))
        assert section.state.message.startswith("JumpStartModel accepted"), section.state.message
        assert "kind: JumpStartModel" in section.state.preview
        asyncio.run(section._deploy(None))
        assert "deploying pane-ds" in section.state.message, section.state.message
        op = services.engine.list(OperationQuery(kind="managed.deploy", limit=1))[0]
        wait_until(lambda: services.engine.run_until_idle(op.id).status == "succeeded", 120, "the pane's deploy")
        services.bus.drain()  # the deploy's events re-read the section on the bus's thread: let them land first
        wait_until(lambda: section.state.reload() or (not section.table.value.empty and
                                                      section.table.value.iloc[0]["state"] == "DeploymentComplete"),
                   60, "the table to show the endpoint complete")
        assert section.table.value.iloc[0]["autoscaling"] == "1-2"
        section._on_selection(type("E", (), {"new": [0]})())
        asyncio.run(section._test(None))
        assert section.state.message.startswith("HTTP 200"), section.state.message
        section.state.min_replicas = 2
        asyncio.run(section._scale(None))
        assert "scaling pane-ds to 2-2" in section.state.message, section.state.message
        scaled = services.engine.list(OperationQuery(kind="managed.update", limit=1))[0]
        wait_until(lambda: services.engine.run_until_idle(scaled.id).status == "succeeded", 120, "the pane's scale")
        assert k8s.AppsV1Api(world.api).read_namespaced_deployment("pane-ds", NS).spec.replicas == 2
        asyncio.run(section._delete(None))
        assert "deleting pane-ds" in section.state.message, section.state.message
        gone = services.engine.list(OperationQuery(kind="managed.delete", limit=1))[0]
        wait_until(lambda: services.engine.run_until_idle(gone.id).status == "succeeded", 60, "the pane's delete")


def test_a_test_call_is_refused_when_the_service_of_the_name_is_not_the_operator_s(operator: JobWorld) -> None:
    """Someone's Service took the name before the operator made its own: the endpoint is never tested through it."""
    world = operator
    shown = world.live.post(f"{BASE}/preview", endpoint("imposter"))
    assert shown.status_code == 200, shown.text
    if NS not in {n.metadata.name for n in world.core.list_namespace().items}:  # no deploy made it yet
        world.core.create_namespace({"metadata": {"name": NS}})
    world.core.create_namespaced_service(NS, {"metadata": {"name": "imposter"}, "spec": {
        "selector": {"app": "elsewhere"}, "ports": [{"port": 8000, "targetPort": 8000}]}})
    world.custom.create_namespaced_custom_object(GROUP, VERSION, NS, "inferenceendpointconfigs",
                                                 shown.json()["manifest"])
    wait_until(lambda: world.live.get(f"{BASE}/imposter").status_code == 200, 60, "the endpoint listed")
    ledger = CallLedger(world.live)
    mark = ledger.mark()
    refused = world.live.post(f"{BASE}/imposter/test", {"prompt": "hello"})
    assert refused.status_code == 409 and "is not the inference operator's" in refused.text, refused.text
    assert not [e for e in ledger.calls(service="kubernetes", since=mark)
                if e.get("subresource") == "proxy"], "a test call was sent"
    world.custom.delete_namespaced_custom_object(GROUP, VERSION, NS, "inferenceendpointconfigs", "imposter")
    world.core.delete_namespaced_service("imposter", NS)


# --- metric-driven autoscaling: the operator's KEDA ScaledObject, the sandbox's KEDA scaling on the engine's metric

def test_bad_triggers_are_refused_and_a_preview_names_keda_before_any_write(operator: JobWorld) -> None:
    world = operator
    wait_until(lambda: world.live.get(BASE).json()["operator"], 60, "the operator's CRDs in the cache")
    ledger = CallLedger(world.live)
    mark = ledger.mark()
    before = world.live.get("/api/v1/operations?kind=managed.deploy").json()
    good = triggered("scaler")["autoscaling"]
    bad = {"query": [{"target_value": 1}], "target_value": [{"query": "sum(x)", "target_value": 0}],
           "server_address": [{"query": "sum(x)", "target_value": 1, "server_address": "http://prometheus:9090"}]}
    for field, triggers in bad.items():
        refused = world.live.post(BASE, endpoint("scaler", autoscaling={**good, "prometheus": triggers}))
        assert refused.status_code == 422, (field, refused.text)
        assert [f["field"] for f in refused.json()["error"]["details"]["fields"]] == [
            f"autoscaling.prometheus.0.{field}"], refused.text
    activation = world.live.post(BASE, endpoint("scaler", autoscaling={**good, "prometheus": [
        {"query": "sum(x)", "target_value": 1, "activation_target_value": 2}]}))
    assert activation.status_code == 422, activation.text
    assert activation.json()["error"]["details"]["field"] == "autoscaling.prometheus[0].activation_target_value"
    cloudwatch = world.live.post(BASE, endpoint("scaler", autoscaling={**good, "prometheus": [], "cloudwatch": [
        {"metric_name": "Invocations", "namespace": "AWS/SageMaker", "target_value": -1}]}))
    assert cloudwatch.status_code == 422, cloudwatch.text
    assert [f["field"] for f in cloudwatch.json()["error"]["details"]["fields"]] == [
        "autoscaling.cloudwatch.0.target_value"], cloudwatch.text
    shown = world.live.post(f"{BASE}/preview", triggered("scaler"))
    assert shown.status_code == 200, shown.text
    assert shown.json()["install"] == ["keda"], shown.text  # no Prometheus: a managed trigger never reads ours
    assert any("first installs keda" in w for w in shown.json()["warnings"]), shown.text
    bounds = world.live.post(f"{BASE}/preview", endpoint("scaler", autoscaling={"min_replicas": 1, "max_replicas": 2}))
    assert bounds.status_code == 200 and bounds.json()["install"] == [], bounds.text
    ledger.assert_no_writes(since=mark, service="kubernetes")
    with foreign_keda(world.api):  # one KEDA per cluster, as inference_scaling_set refuses
        mark = ledger.mark()
        foreign = world.live.post(BASE, triggered("scaler"))
        assert foreign.status_code == 409 and "did not install" in foreign.text, foreign.text
        bounds_only = world.live.post(f"{BASE}/preview", endpoint("scaler", autoscaling={"min_replicas": 1,
                                                                                         "max_replicas": 2}))
        assert bounds_only.status_code == 200, bounds_only.text  # no triggers: their KEDA is not ours to mind
        ledger.assert_no_writes(since=mark, service="kubernetes")
    assert world.live.get("/api/v1/operations?kind=managed.deploy").json() == before


def test_the_first_trigger_installs_keda_once_and_a_second_endpoint_installs_nothing(operator: JobWorld) -> None:
    world = operator
    ledger = CallLedger(world.live)
    mark = ledger.mark()
    first = world.live.post(BASE, triggered("keda-first"))
    assert first.status_code == 202, first.text
    op = finished(world, first.json()["operation"]["id"])
    assert op["status"] == "succeeded", op
    assert [s["name"] for s in op["stages"]] == ["components", "namespace", "apply", "ready"]
    assert world.stage(op["id"], "components")["result"]["installed"] == ["keda"]
    assert keda_writes(ledger, mark) == sorted(KEDA_OBJECTS)  # each once
    assert not k8s.AppsV1Api(world.api).list_namespaced_deployment("instantstart-monitoring").items  # no Prometheus
    registration = k8s.ApiregistrationV1Api(world.api).read_api_service(EXTERNAL_METRICS)
    assert [(c.type, c.status) for c in registration.status.conditions] == [("Available", "True")]

    again = ledger.mark()
    second = world.live.post(BASE, endpoint("keda-second", autoscaling={
        "min_replicas": 1, "max_replicas": 1, "cloudwatch": [
            {"metric_name": "QueueDepth", "namespace": "InstantStart/Tests", "target_value": 10}]}))
    assert second.status_code == 202, second.text
    op = finished(world, second.json()["operation"]["id"])
    assert op["status"] == "succeeded", op
    assert [s["name"] for s in op["stages"]] == ["namespace", "apply", "ready"]
    assert keda_writes(ledger, again) == []
    # prometheus: [] removes a trigger another field manager wrote too (server-side apply alone would keep it)
    plural = "inferenceendpointconfigs"
    edited: Any = world.custom.get_namespaced_custom_object(GROUP, VERSION, NS, plural, "keda-second")
    edited["spec"]["autoScalingSpec"]["prometheusTrigger"] = {"name": "edited", "query": "sum(y)", "targetValue": 1}
    world.custom.replace_namespaced_custom_object(GROUP, VERSION, NS, plural, "keda-second", edited,
                                                  field_manager="kubectl-edit")
    removed = patch(world, f"{BASE}/keda-second", {"autoscaling": {"prometheus": []}})
    assert finished(world, removed.json()["operation"]["id"])["status"] == "succeeded", removed.text
    left = world.custom.get_namespaced_custom_object(GROUP, VERSION, NS, plural, "keda-second")["spec"]
    assert [k for k in left["autoScalingSpec"] if k.startswith("prometheus")] == [], left
    assert [t["name"] for t in left["autoScalingSpec"]["cloudWatchTriggerList"]] == ["cloudwatch-0"], left
    for name in ("keda-first", "keda-second"):
        gone = delete(world, f"{BASE}/{name}")
        assert finished(world, gone.json()["operation"]["id"])["status"] == "succeeded"


def test_a_prometheus_trigger_scales_the_endpoint_up_with_traffic_and_back_down(operator: JobWorld) -> None:
    world = operator
    ledger = CallLedger(world.live)
    mark = ledger.mark()
    shown = world.live.post(f"{BASE}/preview", triggered("scaler"))
    assert shown.status_code == 200, shown.text
    assert shown.json()["manifest"]["spec"]["autoScalingSpec"] == {
        "minReplicaCount": 1, "maxReplicaCount": 2, "pollingInterval": 600, "prometheusTriggerList": [
            {"name": "request-rate", "query": RATE_QUERY.format(ns=NS, name="scaler"), "targetValue": 0.001,
             "metricType": "Average"}]}
    started = world.live.post(BASE, triggered("scaler"))
    assert started.status_code == 202, started.text
    assert finished(world, started.json()["operation"]["id"])["status"] == "succeeded"
    resource: Any = world.custom.get_namespaced_custom_object(GROUP, VERSION, NS, "inferenceendpointconfigs", "scaler")
    scaled: Any = world.custom.get_namespaced_custom_object("keda.sh", "v1alpha1", NS, "scaledobjects", "scaler")
    assert [(o["kind"], o["uid"]) for o in scaled["metadata"]["ownerReferences"]] == [
        ("InferenceEndpointConfig", resource["metadata"]["uid"])]
    assert [(t["type"], t["metadata"]["threshold"]) for t in scaled["spec"]["triggers"]] == [("prometheus", "0.001")]

    def hot() -> bool:
        answer = world.live.post(f"{BASE}/scaler/test", {"prompt": "hello", "max_tokens": 4})
        assert answer.status_code == 200, answer.text
        # traffic until the view's cache shows it too: KEDA scales back down a poll after the traffic stops
        return replicas(world, "scaler") == 2 and world.live.get(f"{BASE}/scaler").json()["scaled_to"] == 2
    wait_until(hot, 120, "KEDA to scale the endpoint to its max on the request rate (and the view to show it)")
    view = world.live.get(f"{BASE}/scaler").json()
    assert view["autoscaling"]["prometheus"][0]["query"] == RATE_QUERY.format(ns=NS, name="scaler"), view
    assert view["desired"] == 1  # spec.replicas never changed: KEDA moved the Deployment
    wait_until(lambda: replicas(world, "scaler") == 1, 120, "KEDA to scale back to min once the traffic stopped")

    # new bounds keep the trigger; the operator's ScaledObject follows
    wider = patch(world, f"{BASE}/scaler", {"autoscaling": {"max_replicas": 3}})
    assert wider.status_code == 202, wider.text
    assert finished(world, wider.json()["operation"]["id"])["status"] == "succeeded"
    wait_until(lambda: world.custom.get_namespaced_custom_object(
        "keda.sh", "v1alpha1", NS, "scaledobjects", "scaler")["spec"]["maxReplicaCount"] == 3, 60, "max 3 followed")
    assert len(world.live.get(f"{BASE}/scaler").json()["autoscaling"]["prometheus"]) == 1
    made = {e.get("resource") for e in ledger.writes(since=mark, service="kubernetes")}
    assert not {r for r in made if r and ("scaledobjects" in r or "horizontalpodautoscalers" in r)}, made
    gone = delete(world, f"{BASE}/scaler")
    assert finished(world, gone.json()["operation"]["id"])["status"] == "succeeded"


def test_the_pane_section_sets_a_metric_trigger_and_shows_it(operator: JobWorld, tmp_path: Path) -> None:
    world = operator
    started = world.live.post(BASE, endpoint("pane-scaler", autoscaling={"min_replicas": 1, "max_replicas": 2}))
    assert finished(world, started.json()["operation"]["id"])["status"] == "succeeded"
    who = Principal("pane-operator", Role.OPERATOR, "t-op", "api")
    with world.server.imported(tmp_path / "product", CLUSTER, who) as services:
        pane = InferencePane(services.inference, services.clusters, services.bus, who,
                             managed=services.managed_inference)
        section = pane.managed
        assert section is not None
        wait_until(lambda: section.state.reload() or "pane-scaler" in list(section.table.value["name"]), 60,
                   "the table to list the endpoint")
        row = list(section.table.value["name"]).index("pane-scaler")
        assert section.table.value.iloc[row]["autoscaling"] == "1-2"
        section._on_selection(type("E", (), {"new": [row]})())
        section.state.query, section.state.target = RATE_QUERY.format(ns=NS, name="pane-scaler"), 0.5
        asyncio.run(section._trigger(None))
        assert "scaling pane-scaler on sum(rate(" in section.state.message, section.state.message
        op = services.engine.list(OperationQuery(kind="managed.update", limit=1))[0]
        wait_until(lambda: services.engine.run_until_idle(op.id).status == "succeeded", 120, "the pane's trigger")
        services.bus.drain()  # the update's events re-read the section on the bus's thread: let them land first
        wait_until(lambda: section.state.reload() or
                   section.table.value.iloc[row]["autoscaling"] == "1-2 on pane ≥ 0.5", 60, "the trigger shown")
        assert section.table.value.iloc[row]["scaled_to"] == "1"
    def threshold() -> str | None:
        try:
            found: Any = world.custom.get_namespaced_custom_object("keda.sh", "v1alpha1", NS, "scaledobjects",
                                                                   "pane-scaler")
        except ApiException:
            return None
        return str(found["spec"]["triggers"][0]["metadata"]["threshold"])
    wait_until(lambda: threshold() == "0.5", 60, "the operator's ScaledObject on the pane's trigger")
    gone = delete(world, f"{BASE}/pane-scaler")
    assert finished(world, gone.json()["operation"]["id"])["status"] == "succeeded"


def test_a_cloudwatch_trigger_scales_the_endpoint_on_the_metric_the_test_puts(operator: JobWorld,
                                                                             tmp_path: Path) -> None:
    """The sandbox's KEDA reads the sandbox's CloudWatch: the test's PutMetricData moves the replicas."""
    world = operator
    cloudwatch = client(Settings(data_dir=tmp_path, sandbox=True, sandbox_aws_port=world.server.aws_port),
                        "cloudwatch")
    dimensions = {"EndpointName": "cw-scaler"}

    def put(value: float) -> None:
        cloudwatch.put_metric_data(Namespace="InstantStart/Tests", MetricData=[{
            "MetricName": "QueueDepth", "Value": value, "Unit": "Count",
            "Dimensions": [{"Name": k, "Value": v} for k, v in dimensions.items()]}])
    trigger = {"name": "queue", "metric_name": "QueueDepth", "namespace": "InstantStart/Tests",
               "dimensions": dimensions, "stat": "Maximum", "target_value": 10, "period": 1}
    started = world.live.post(BASE, endpoint("cw-scaler", autoscaling={
        "min_replicas": 1, "max_replicas": 2, "polling_interval": 600, "cloudwatch": [trigger]}))
    assert started.status_code == 202, started.text
    assert finished(world, started.json()["operation"]["id"])["status"] == "succeeded"
    put(25)  # 25 / 10 per pod: 3 pods wanted, 2 at most
    wait_until(lambda: replicas(world, "cw-scaler") == 2, 120, "KEDA to scale on the CloudWatch metric")
    # 1 on every poll: a lone put(1) may share KEDA's newest one-second bucket with the 25 (Maximum reads 25)
    wait_until(lambda: put(1) or replicas(world, "cw-scaler") == 1, 120, "KEDA to scale back once the metric fell")
    scaled: Any = world.custom.get_namespaced_custom_object("keda.sh", "v1alpha1", NS, "scaledobjects", "cw-scaler")
    assert [t["type"] for t in scaled["spec"]["triggers"]] == ["aws-cloudwatch"]
    gone = delete(world, f"{BASE}/cw-scaler")
    assert finished(world, gone.json()["operation"]["id"])["status"] == "succeeded"


def test_an_agent_scales_a_managed_endpoint_on_a_metric_following_the_playbook(operator: JobWorld) -> None:
    world = operator
    token = world.live.make_token("operator")
    playbook = playbook_tools(PLAYBOOK)
    used: list[str] = []
    one = {"cluster": CLUSTER, "name": "agent-scaler"}

    async def agent() -> dict[str, Any]:
        async with bridge(world.live.url, token, "inference,clusters,operations,system") as client:
            started = await call(client, "inference_endpoints_deploy", {"cluster": CLUSTER,
                                                                        **triggered("agent-scaler")}, used)
            deployed = await follow(client, started["operation"]["id"], used, timeout=180)
            with anyio.fail_after(120):  # traffic until the endpoint reads scaled to its max
                hot = await call(client, "inference_endpoints_get", one, used)
                while hot["scaled_to"] != 2:
                    await call(client, "inference_endpoints_test", {**one, "prompt": "hi", "max_tokens": 4}, used)
                    hot = await call(client, "inference_endpoints_get", one, used)
            with anyio.fail_after(120):  # no traffic: it reads back at its min
                cool = await call(client, "inference_endpoints_get", one, used)
                while cool["scaled_to"] != 1:
                    cool = await call(client, "inference_endpoints_get", one, used)
            retarget = await call(client, "inference_endpoints_update", {**one, "autoscaling": {"prometheus": [
                {"name": "request-rate", "query": RATE_QUERY.format(ns=NS, name="agent-scaler"),
                 "target_value": 5}]}}, used)
            retargeted = await follow(client, retarget["operation"]["id"], used, timeout=180)
            detail = await call(client, "inference_endpoints_get", one, used)
            deleting = await call(client, "inference_endpoints_delete", one, used)
            deleted = await follow(client, deleting["operation"]["id"], used, timeout=180)
            return {"deployed": deployed, "hot": hot, "cool": cool, "retargeted": retargeted, "detail": detail,
                    "deleted": deleted}

    seen = anyio.run(agent)
    assert seen["deployed"]["status"] == "succeeded", seen["deployed"]
    assert seen["hot"]["scaled_to"] == 2 and seen["hot"]["desired"] == 1, seen["hot"]
    assert seen["cool"]["scaled_to"] == 1, seen["cool"]
    assert seen["retargeted"]["status"] == "succeeded", seen["retargeted"]
    assert seen["detail"]["autoscaling"]["prometheus"][0]["target_value"] == 5
    assert seen["detail"]["autoscaling"]["max_replicas"] == 2  # bounds kept: the update gave only the trigger
    assert seen["deleted"]["status"] == "succeeded"
    assert set(used) <= playbook, f"tools outside the playbook: {set(used) - playbook}"
