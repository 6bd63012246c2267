"""KEDA autoscaling of a self-managed vLLM deployment against a real server in sandbox mode (one seeded cluster of
two one-GPU nodes, one deployment for the module): bad requests are refused before any operation or Kubernetes
write, and so are an SGLang deployment without metrics and a set where someone else's KEDA runs; a preview
renders both triggers with the engine's real metric names and a ScaledObject valid under the shipped KEDA CRD,
installing nothing; through REST the first set installs KEDA and Prometheus from the component registry and a
second identical set writes nothing, a manual replicas change is refused, traffic through the service proxy
scales the deployment up (the sandbox's KEDA on the engines' request counter) and back down to the minimum once
it stops, and a removal deletes the ScaledObject and its HPA; an agent follows ``skills/deploy-model.md``
through a real MCP client to set a queue-depth trigger, read it and remove it; the pane's autoscaling section
does the same; and the inference operator add-on with its bundled KEDA on is refused before any write."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import jsonschema
import panel as pn
import pytest
import yaml
from kubernetes import client as k8s

from panels.inference import InferencePane
from services.auth import Principal, Role
from services.inference.scaledobject import hpa_lag, render
from services.inference.scaling_models import ScalingRequest
from services.operations import OperationQuery
from tests.jobs_support import CLUSTER, JobWorld, cli, job_world
from tests.keda_support import KEDA_CRDS, THEIR_SERVER, their_keda
from tests.ledger import CallLedger
from tests.mcp_support import bridge, call, follow, playbook_tools
from tests.node_support import aws
from tests.support import wait_until

pytestmark = pytest.mark.slow
BASE = f"/api/v1/clusters/{CLUSTER}/inference/deployments"
NS = "hyperpod-ns-inference"
ROOT = Path(__file__).resolve().parents[1]
PLAYBOOK = ROOT / "skills" / "deploy-model.md"
CRD = ROOT / "services" / "components" / "crds" / "keda.sh_scaledobjects.yaml"
SCALING = f"{BASE}/chat/scaling"
SELECTOR = '{namespace="hyperpod-ns-inference",instantstart_io_inference="chat"}'
#: at the tests' clock (500x) a 600 s polling interval is about a second: several test calls per window, and a
#: rate of one request per 1000 s per replica is crossed by any of them
RATE = {"min_replicas": 1, "max_replicas": 2, "request_rate": 0.001, "polling_interval": 600}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JobWorld]:
    with job_world(tmp_path_factory.mktemp("scaling"), components=()) as made:
        started = made.live.post(BASE, {"name": "chat", "command": "vllm serve Qwen/Qwen2.5-0.5B-Instruct "
                                        "--served-model-name chat", "gpus": 1})
        assert started.status_code == 202, started.text
        assert made.finished(started.json()["operation"]["id"], timeout=180)["status"] == "succeeded"
        yield made


def put(world: JobWorld, path: str, body: dict[str, Any]) -> httpx2.Response:
    return httpx2.put(world.live.url + path, json=body, headers=world.live.headers(), timeout=60)


def replicas(world: JobWorld) -> int:
    return int(k8s.AppsV1Api(world.api).read_namespaced_deployment("chat", NS).spec.replicas)


def test_bad_requests_are_refused_before_any_operation_or_write(world: JobWorld) -> None:
    ledger = CallLedger(world.live)
    mark = ledger.mark()
    no_trigger = put(world, SCALING, {"max_replicas": 2})
    assert no_trigger.status_code == 422 and "request_rate" in no_trigger.text, no_trigger.text
    upside_down = put(world, SCALING, {**RATE, "min_replicas": 3})
    assert upside_down.status_code == 422 and "max_replicas" in upside_down.text, upside_down.text
    unknown_field = put(world, SCALING, {**RATE, "max_replica": 2})
    assert unknown_field.status_code == 422 and "max_replicas" in unknown_field.text, unknown_field.text
    missing = put(world, f"{BASE}/nope/scaling", RATE)
    assert missing.status_code == 404, missing.text
    not_scaled = httpx2.delete(world.live.url + SCALING, headers=world.live.headers(), timeout=60)
    assert not_scaled.status_code == 404 and "not autoscaled" in not_scaled.text, not_scaled.text
    ledger.assert_no_writes(since=mark, service="kubernetes")
    assert world.live.get("/api/v1/operations?kind=inference.scaling.set").json() == []


def stopped_sglang(world: JobWorld, name: str, *flags: str) -> None:
    """A stopped SGLang deployment as a deploy of ``flags`` leaves it (replicas 0: no engine), once listed."""
    labels = {"app.kubernetes.io/managed-by": "instantstart", "instantstart.io/inference": name}
    command = ["python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen2.5-0.5B-Instruct", *flags]
    k8s.AppsV1Api(world.api).create_namespaced_deployment(NS, {
        "metadata": {"name": name, "labels": {**labels, "instantstart.io/engine": "sglang"}},
        "spec": {"replicas": 0, "selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels},
                 "spec": {"containers": [{"name": "engine", "image": "lmsysorg/sglang:v0.5.4", "command": command}]}}}})
    wait_until(lambda: name in {d["name"] for d in world.live.get(BASE).json()["deployments"]}, 60,
               f"the SGLang deployment {name} listed")


def test_an_sglang_deployment_without_metrics_is_refused_before_any_write(world: JobWorld) -> None:
    stopped_sglang(world, "quiet")
    ledger = CallLedger(world.live)
    mark = ledger.mark()
    refused = put(world, f"{BASE}/quiet/scaling", RATE)
    assert refused.status_code == 409 and "--enable-metrics" in refused.text, refused.text
    # the fix the answer spells out starts from the deployment's own command, read from the watch cache
    assert "sglang.launch_server --model-path Qwen/Qwen2.5-0.5B-Instruct --enable-metrics" in refused.text
    ledger.assert_no_writes(since=mark, service="kubernetes")
    k8s.AppsV1Api(world.api).delete_namespaced_deployment("quiet", NS)


def test_an_sglang_deployment_with_metrics_is_accepted_with_sglang_queries(world: JobWorld) -> None:
    """The same precheck a set runs (the preview is its plan, writing nothing) passes once the flag is there."""
    stopped_sglang(world, "loud", "--enable-metrics")
    ledger = CallLedger(world.live)
    mark = ledger.mark()
    shown = world.live.post(f"{BASE}/loud/scaling/preview", {**RATE, "queue_depth": 4})
    assert shown.status_code == 200, shown.text
    selector = SELECTOR.replace('"chat"', '"loud"')
    assert [t["metadata"]["query"] for t in shown.json()["scaled_object"]["spec"]["triggers"]] == [
        f"sum(rate(sglang:num_requests_total{selector}[1m]))", f"sum(sglang:num_queue_reqs{selector})"]
    ledger.assert_no_writes(since=mark, service="kubernetes")
    k8s.AppsV1Api(world.api).delete_namespaced_deployment("loud", NS)


@contextmanager
def foreign_keda(api: k8s.ApiClient) -> Iterator[None]:
    """A keda-operator Deployment InstantStart did not install (without our label), in a namespace ``keda`` not ours,
    while the block runs; both are gone after it (a later KEDA install must not find them)."""
    apps, core = k8s.AppsV1Api(api), k8s.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": "keda"}})
    labels = {"app": "keda-operator"}
    apps.create_namespaced_deployment("keda", {"metadata": {"name": "keda-operator"}, "spec": {
        "replicas": 0, "selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}, "spec": {
            "containers": [{"name": "keda-operator", "image": "ghcr.io/kedacore/keda:2.16.0"}]}}}})
    try:
        yield
    finally:
        apps.delete_namespaced_deployment("keda-operator", "keda")
        core.delete_namespace("keda")
        wait_until(lambda: not [n for n in core.list_namespace().items if n.metadata and n.metadata.name == "keda"],
                   60, "their keda namespace gone")


def test_a_keda_someone_else_installed_is_refused_before_any_write(world: JobWorld) -> None:
    with foreign_keda(world.api):
        ledger = CallLedger(world.live)
        mark = ledger.mark()
        refused = put(world, SCALING, RATE)
        assert refused.status_code == 409 and "did not install" in refused.text, refused.text
        ledger.assert_no_writes(since=mark, service="kubernetes")


def test_a_keda_in_another_namespace_is_refused_naming_its_objects_before_any_write(world: JobWorld) -> None:
    """Found by its CRDs and external metrics APIService, not by a Deployment's name: nothing is applied over them."""
    with their_keda(world):
        ledger = CallLedger(world.live)
        mark = ledger.mark()
        for refused in (put(world, SCALING, RATE), world.live.post(f"{SCALING}/preview", RATE)):
            assert refused.status_code == 409, refused.text
            assert f"CustomResourceDefinition {KEDA_CRDS[0]}" in refused.text and THEIR_SERVER in refused.text
        ledger.assert_no_writes(since=mark, service="kubernetes")


def test_a_preview_renders_both_triggers_and_installs_nothing(world: JobWorld) -> None:
    ledger = CallLedger(world.live)
    mark = ledger.mark()
    shown = world.live.post(f"{SCALING}/preview", {**RATE, "queue_depth": 4})
    assert shown.status_code == 200, shown.text
    preview = shown.json()
    assert preview["install"] == ["keda", "prometheus"]
    obj = preview["scaled_object"]
    assert obj["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "chat"}
    assert (obj["spec"]["minReplicaCount"], obj["spec"]["maxReplicaCount"]) == (1, 2)
    assert [(t["name"], t["metadata"]["query"], t["metadata"]["threshold"]) for t in obj["spec"]["triggers"]] == [
        ("request-rate", f"sum(rate(vllm:request_success_total{SELECTOR}[1m]))", "0.001"),
        ("queue-depth", f"sum(vllm:num_requests_waiting{SELECTOR})", "4")]
    assert {t["metadata"]["serverAddress"] for t in obj["spec"]["triggers"]} == {
        "http://prometheus.instantstart-monitoring.svc.cluster.local:9090"}
    ledger.assert_no_writes(since=mark, service="kubernetes")


def test_the_scaled_object_is_valid_under_the_shipped_crd() -> None:
    crd = yaml.safe_load(CRD.read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for engine in ("vllm", "sglang"):
        obj = render(name="chat", namespace=NS, engine=engine, deployment_uid="u-1",
                     request=ScalingRequest(max_replicas=3, request_rate=2.5, queue_depth=8))
        jsonschema.validate(obj, schema)
    bad = render(name="chat", namespace=NS, engine="vllm", deployment_uid="u-1",
                 request=ScalingRequest(max_replicas=3, queue_depth=8))
    bad["spec"]["triggers"][0]["metadata"] = "threshold=8"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
    sglang = render(name="chat", namespace=NS, engine="sglang", deployment_uid="u-1",
                    request=ScalingRequest(max_replicas=3, request_rate=1, queue_depth=8))
    assert [t["metadata"]["query"] for t in sglang["spec"]["triggers"]] == [
        f"sum(rate(sglang:num_requests_total{SELECTOR}[1m]))",
        f"sum(sglang:num_queue_reqs{SELECTOR})"]


def test_only_an_hpa_that_follows_the_new_spec_is_evidence_keda_processed_it() -> None:
    def hpa(low: int, high: int, *targets: str) -> dict[str, Any]:
        return {"spec": {"minReplicas": low, "maxReplicas": high, "metrics": [
            {"type": "External", "external": {"metric": {"name": f"s{i}-prometheus"},
                                              "target": {"type": "AverageValue", "averageValue": t}}}
            for i, t in enumerate(targets)]}}
    new = render(name="chat", namespace=NS, engine="vllm", deployment_uid="u-1",
                 request=ScalingRequest(max_replicas=3, request_rate=0.5, queue_depth=8))
    assert hpa_lag(new, hpa(1, 3, "500m", "8")) == ""  # the API server's canonical quantity of 0.5
    assert "no HPA" in hpa_lag(new, None)
    assert "1-2, not 1-3" in hpa_lag(new, hpa(1, 2, "500m", "8"))  # the previous bounds
    assert "not s0-prometheus 0.5, s1-prometheus 8" in hpa_lag(new, hpa(1, 3, "500m"))  # the previous triggers


def test_traffic_scales_up_and_back_down_once_it_stops(world: JobWorld) -> None:
    ledger = CallLedger(world.live)
    mark = ledger.mark()
    started = put(world, SCALING, RATE)
    assert started.status_code == 202, started.text
    op = world.finished(started.json()["operation"]["id"], timeout=180)
    assert op["status"] == "succeeded", op
    assert [s["name"] for s in op["stages"]] == ["components", "scaled_object", "ready"]
    assert world.stage(op["id"], "components")["result"]["installed"] == ["keda", "prometheus"]
    crds = [e for e in ledger.writes(since=mark, service="kubernetes")
            if e.get("resource") == "customresourcedefinitions.apiextensions.k8s.io"]
    assert sorted(e["name"] for e in crds) == ["scaledobjects.keda.sh", "triggerauthentications.keda.sh"], crds
    registered = [e for e in ledger.writes(since=mark, service="kubernetes")
                  if e.get("resource") == "apiservices.apiregistration.k8s.io"]
    assert [e["name"] for e in registered] == ["v1beta1.external.metrics.k8s.io"], registered
    api_service = k8s.ApiregistrationV1Api(world.api).read_api_service("v1beta1.external.metrics.k8s.io")
    assert api_service.spec.service.name == "keda-operator-metrics-apiserver"
    assert [(c.type, c.status) for c in api_service.status.conditions] == [("Available", "True")]
    # shipped without a caBundle: KEDA's operator, with the rights the shipped RBAC gives it, made its certificates
    # and injected its CA, which verifies the metrics server's certificate (the aggregator's check)
    certs = k8s.CoreV1Api(world.api).read_namespaced_secret("kedaorg-certs", "keda")
    assert api_service.spec.ca_bundle == certs.data["ca.crt"]
    apps = k8s.AppsV1Api(world.api)
    assert apps.read_namespaced_deployment("keda-operator", "keda").metadata.labels[
        "app.kubernetes.io/managed-by"] == "instantstart"
    config = k8s.CoreV1Api(world.api).read_namespaced_config_map("prometheus", "instantstart-monitoring")
    assert "kubernetes_sd_configs" in config.data["prometheus.yml"]

    again_mark = ledger.mark()
    again = put(world, SCALING, RATE)
    assert again.status_code == 202, again.text
    assert again.json()["operation"]["id"] != started.json()["operation"]["id"]  # a new operation, not a join
    assert world.finished(again.json()["operation"]["id"], timeout=180)["status"] == "succeeded"
    components = world.stage(again.json()["operation"]["id"], "components")
    assert components["result"]["installed"] == [] and "already installed" in components["message"], components
    ledger.assert_no_writes(since=again_mark, service="kubernetes")  # KEDA, Prometheus, the ScaledObject: as wanted

    # new triggers: the set is done only once KEDA's HPA follows them (its Ready is the previous spec's until then)
    changed = put(world, SCALING, {**RATE, "max_replicas": 3, "queue_depth": 4})
    assert changed.status_code == 202, changed.text
    assert world.finished(changed.json()["operation"]["id"], timeout=180)["status"] == "succeeded"
    hpa = k8s.AutoscalingV2Api(world.api).read_namespaced_horizontal_pod_autoscaler("keda-hpa-chat", NS)
    assert hpa.spec.max_replicas == 3
    assert [(m.external.metric.name, m.external.target.average_value) for m in hpa.spec.metrics] == [
        ("s0-prometheus", "1m"), ("s1-prometheus", "4")]
    put_back = put(world, SCALING, RATE)
    assert world.finished(put_back.json()["operation"]["id"], timeout=180)["status"] == "succeeded"

    manual = httpx2.patch(world.live.url + f"{BASE}/chat", json={"replicas": 2}, headers=world.live.headers(),
                          timeout=60)
    assert manual.status_code == 409 and "inference_scaling_set" in manual.text, manual.text

    def scaled_up() -> bool:
        answer = world.live.post(f"{BASE}/chat/test", {"prompt": "hello", "max_tokens": 4})
        assert answer.status_code == 200, answer.text
        return replicas(world) == 2
    wait_until(scaled_up, 120, "KEDA to scale chat to 2 on its request rate")
    view = world.live.get(SCALING).json()
    assert view["enabled"] and view["ready"] is True and view["max_replicas"] == 2, view
    assert view["triggers"][0]["kind"] == "request_rate"
    assert {c["name"] for c in view["components"]} == {"keda", "prometheus"}
    wait_until(lambda: replicas(world) == 1, 120, "KEDA to scale chat back to 1 once the traffic stopped")
    wait_until(lambda: world.live.get(SCALING).json()["desired_replicas"] == 1, 60, "the HPA's desired replicas 1")

    gone = httpx2.delete(world.live.url + SCALING, headers=world.live.headers(), timeout=60)
    assert gone.status_code == 202, gone.text
    assert world.finished(gone.json()["operation"]["id"], timeout=120)["status"] == "succeeded"
    assert world.live.get(SCALING).json()["enabled"] is False
    autoscaling = k8s.AutoscalingV2Api(world.api)
    wait_until(lambda: not autoscaling.list_namespaced_horizontal_pod_autoscaler(NS).items, 60,
               "KEDA's HPA deleted with its ScaledObject")
    assert replicas(world) == 1


def test_the_cli_sets_gets_and_removes_autoscaling(world: JobWorld) -> None:
    ledger = CallLedger(world.live)
    mark = ledger.mark()
    refused = cli(world, "inference", "scaling", "set", CLUSTER, "chat", "--max-replicas", "2")
    assert refused.returncode != 0 and "422" in refused.stderr and "request_rate" in refused.stderr, refused.stderr
    ledger.assert_no_writes(since=mark, service="kubernetes")
    done = cli(world, "inference", "scaling", "set", CLUSTER, "chat", "--max-replicas", "2", "--queue-depth", "8",
               "--wait")
    assert done.returncode == 0 and "chat autoscaled" in done.stdout, done.stderr
    shown = cli(world, "inference", "scaling", "get", CLUSTER, "chat")
    assert "KEDA 1-2 replicas, Ready" in shown.stdout and "trigger queue_depth" in shown.stdout, shown.stdout
    assert k8s.CustomObjectsApi(world.api).get_namespaced_custom_object(
        "keda.sh", "v1alpha1", NS, "scaledobjects", "chat")["spec"]["triggers"][0]["metadata"]["threshold"] == "8"
    removed = cli(world, "inference", "scaling", "remove", CLUSTER, "chat", "--wait", "--json")
    assert removed.returncode == 0 and json.loads(removed.stdout)["status"] == "succeeded", removed.stderr
    assert "not autoscaled" in cli(world, "inference", "scaling", "get", CLUSTER, "chat").stdout


def test_an_agent_sets_reads_and_removes_a_queue_depth_trigger(world: JobWorld) -> None:
    operator = world.live.make_token("operator")
    playbook = playbook_tools(PLAYBOOK)
    used: list[str] = []
    one = {"cluster": CLUSTER, "name": "chat"}
    request = {**one, "min_replicas": 1, "max_replicas": 2, "queue_depth": 8}

    async def agent() -> dict[str, Any]:
        async with bridge(world.live.url, operator, "inference,clusters,operations,system") as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert tools["inference_scaling_get"].annotations and tools[
                "inference_scaling_get"].annotations.read_only_hint
            preview = await call(client, "inference_scaling_preview", request, used)
            started = await call(client, "inference_scaling_set", request, used)
            done = await follow(client, started["operation"]["id"], used, timeout=180)
            view = await call(client, "inference_scaling_get", one, used)
            removing = await call(client, "inference_scaling_remove", one, used)
            removed = await follow(client, removing["operation"]["id"], used, timeout=180)
            return {"preview": preview, "done": done, "view": view, "removed": removed}

    seen = anyio.run(agent)
    assert [t["name"] for t in seen["preview"]["scaled_object"]["spec"]["triggers"]] == ["queue-depth"]
    assert seen["done"]["status"] == "succeeded", seen["done"]
    assert [t["kind"] for t in seen["view"]["triggers"]] == ["queue_depth"]
    assert seen["view"]["triggers"][0]["query"] == f"sum(vllm:num_requests_waiting{SELECTOR})"
    assert seen["view"]["ready"] is True, seen["view"]
    assert seen["removed"]["status"] == "succeeded"
    assert set(used) <= playbook, f"tools outside the playbook: {set(used) - playbook}"


def test_the_pane_sets_shows_and_removes_autoscaling(world: JobWorld, tmp_path: Path) -> None:
    operator = Principal("pane-operator", Role.OPERATOR, "t-op", "api")
    viewer = Principal("pane-viewer", Role.VIEWER, "t-view", "api")
    with world.server.imported(tmp_path / "product", CLUSTER, operator) as services:
        scaling = services.inference_scaling
        assert services.inference.live_deployment(CLUSTER, "chat")["metadata"]["name"] == "chat"
        watching = InferencePane(services.inference, services.clusters, services.bus, viewer, scaling=scaling)
        assert watching.scaling is not None and watching.scaling.set_button.disabled
        pane = InferencePane(services.inference, services.clusters, services.bus, operator, scaling=scaling)
        pn.panel(pane).get_root()  # renders alone, as in a notebook
        assert pane.scaling is not None
        pane.scaling.show_button.clicks += 1
        assert pane.scaling.state.status == "Select a deployment in the table first."
        wait_until(lambda: pane.state.reload() or not pane.table.value.empty, 60, "the table to list chat")
        pane._on_selection(type("E", (), {"new": [0]})())
        panel = pane.scaling
        said: list[str] = []  # every status shown: the set's events re-read the section on the bus's thread
        panel.state.param.watch(lambda e: said.append(e.new), "status")
        panel.state.max_replicas, panel.state.queue_depth = 2, 6
        panel.set_button.clicks += 1
        # the click's answer is shown, and never swallowed by the show its own operation event started meanwhile
        assert any(s.startswith("autoscaling chat") for s in said), said
        op = services.engine.list(OperationQuery(kind="inference.scaling.set", limit=1))[0]
        wait_until(lambda: services.engine.run_until_idle(op.id).status == "succeeded", 120, "the pane's set")
        # the set's events show the autoscaling again on the bus's thread (the pane has no loop): a read from
        # before it was Ready would land after the click below; let them land first
        services.bus.drain()
        panel.show_button.clicks += 1
        assert "KEDA 1-2 replicas, Ready" in panel.state.status, panel.state.status
        assert "sum(vllm:num_requests_waiting" in panel.state.status and "keda v2.17.1" in panel.state.status
        said.clear()
        panel.remove_button.clicks += 1
        assert any(s.startswith("removing the autoscaling of chat") for s in said), said
        gone = services.engine.list(OperationQuery(kind="inference.scaling.remove", limit=1))[0]
        wait_until(lambda: services.engine.run_until_idle(gone.id).status == "succeeded", 60, "the pane's remove")
        services.bus.drain()  # the same for the remove's events
        panel.show_button.clicks += 1
        assert "not autoscaled" in panel.state.status, panel.state.status


def test_the_inference_operators_bundled_keda_is_refused_before_any_write(world: JobWorld) -> None:
    """Last in the module: the add-on it installs stays for the module's world."""
    eks = aws(world.server, "eks")
    eks.create_addon(clusterName=CLUSTER, addonName="cert-manager")
    eks.create_addon(clusterName=CLUSTER, addonName="amazon-sagemaker-hyperpod-inference",
                     addonVersion="v1.3.0-eksbuild.1", configurationValues=json.dumps({"keda": {"enabled": True}}))
    ledger = CallLedger(world.live)
    mark = ledger.mark()
    refused = put(world, SCALING, RATE)
    assert refused.status_code == 409 and "bundled KEDA" in refused.text, refused.text
    ledger.assert_no_writes(since=mark, service="kubernetes")
    assert world.live.get(SCALING).json()["enabled"] is False
