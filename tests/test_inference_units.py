"""Units of self-managed inference: the serve-command parser (both engines, every launcher form, unknown flags
with a suggestion, secrets refused), the renderer (labels, GPUs as given, probes sized for loading, the token by
reference, both Service shapes), the exposure / parallelism prechecks, which container states fail a rollout, and the
engine-metrics arithmetic (real metric names, histogram quantiles, windows across engine restarts)."""

from __future__ import annotations

import json
import math

import pytest
from kubernetes import client as k8s

from sandbox.kube.backends import Request
from sandbox.kube.engine_server import EngineServer
from services.errors import Conflict, Invalid
from services.inference import checks, endpoint_metrics, manifest
from services.inference.command import IMAGES, parse
from services.inference.models import Engine, Exposure, ServiceSpec
from services.inference.stages import container_trouble
from services.secrets import SecretRef
from services.training.manifests import InstanceFacts


@pytest.mark.parametrize(("command", "engine", "model", "port", "tp", "pp"), [
    ("vllm serve Qwen/Qwen2.5-0.5B-Instruct", Engine.VLLM, "Qwen/Qwen2.5-0.5B-Instruct", 8000, 1, 1),
    ("vllm serve /s3/models/Qwen--Qwen2.5-7B --tensor-parallel-size 4 --pipeline-parallel-size=2 --port 9000",
     Engine.VLLM, "/s3/models/Qwen--Qwen2.5-7B", 9000, 4, 2),
    ("vllm serve m/x -tp 2 --enforce-eager --no-enable-prefix-caching", Engine.VLLM, "m/x", 8000, 2, 1),
    ("python3 -m vllm.entrypoints.openai.api_server --model org/m --max-model-len 4096", Engine.VLLM, "org/m", 8000,
     1, 1),
    ("python3 -m sglang.launch_server --model-path org/m --tp-size 2", Engine.SGLANG, "org/m", 30000, 2, 1),
    ("python -m sglang.launch_server --model org/m --tp 4 --pp-size 2 --port 31000", Engine.SGLANG, "org/m", 31000,
     4, 2),
    ("python3 -m sglang.launch_server --model-path org/m --tensor-parallel-size 8", Engine.SGLANG, "org/m", 30000, 8,
     1),
])
def test_the_parser_reads_engine_model_port_and_parallel_sizes(command: str, engine: Engine, model: str, port: int,
                                                               tp: int, pp: int) -> None:
    serve = parse(command)
    assert (serve.engine, serve.model, serve.port, serve.tensor_parallel, serve.pipeline_parallel) == \
        (engine, model, port, tp, pp)


def test_served_model_name_is_what_requests_carry() -> None:
    assert parse("vllm serve org/m --served-model-name chat").api_model == "chat"
    assert parse("vllm serve org/m").api_model == "org/m"


def test_sglang_listens_on_all_interfaces_unless_told() -> None:
    assert parse("python3 -m sglang.launch_server --model-path m/x").argv[-2:] == ["--host", "0.0.0.0"]
    assert "--host" not in parse("vllm serve m/x").argv


@pytest.mark.parametrize(("command", "suggestion"), [
    ("vllm serve m/x --tensor-parallel 2", "--tensor-parallel-size"),
    ("vllm serve m/x --max-model-length 4096", "--max-model-len"),
    ("python3 -m sglang.launch_server --model-path m/x --mem-fraction-statc 0.8", "--mem-fraction-static"),
    ("python3 -m sglang.launch_server --model-path m/x --served-model chat --contxt-length 10", "--context-length"),
])
def test_a_flag_the_engine_lacks_is_refused_with_the_closest_one(command: str, suggestion: str) -> None:
    with pytest.raises(Invalid) as err:
        parse(command)
    assert "did you mean" in err.value.message
    assert err.value.details["suggestions"][0] == suggestion


def test_an_unknown_flag_names_the_suggestion() -> None:
    with pytest.raises(Invalid) as err:
        parse("vllm serve m/x --tensor-paralel-size 2")
    assert "did you mean --tensor-parallel-size" in err.value.message


def test_vllm_flags_are_not_abbreviated_but_sglang_ones_are() -> None:
    with pytest.raises(Invalid):
        parse("vllm serve m/x --tensor-parallel 2")
    assert parse("python3 -m sglang.launch_server --model-path m/x --tp 2").tensor_parallel == 2
    with pytest.raises(Invalid, match="ambiguous"):
        parse("python3 -m sglang.launch_server --model-path m/x --disable 1")


def test_vllm_arities_follow_the_engine_switches_take_no_value_lists_take_several_only_bools_negate() -> None:
    serve = parse("vllm serve m/x --cuda-graph-sizes 8 16 --async-scheduling -dp 2 --no-enforce-eager "
                  "--no-enable-lora-bias")
    assert serve.flags == {"--cuda-graph-sizes": "8 16", "--async-scheduling": None,
                           "--data-parallel-size": "2", "--enforce-eager": None, "--enable-lora-bias": None}
    with pytest.raises(Invalid, match="--cudagraph-capture-sizes"):  # after v0.11.0, the pinned image's tag
        parse("vllm serve m/x --cudagraph-capture-sizes 8 16")
    with pytest.raises(Invalid, match="unexpected argument"):
        parse("vllm serve m/x --enable-sleep-mode 1")  # a switch takes no value: argparse leaves 1 over
    with pytest.raises(Invalid, match="has no flag --no-port"):
        parse("vllm serve m/x --no-port")


@pytest.mark.parametrize("command", [
    "vllm serve m/x --hf-token hf_abc", "vllm serve m/x --api-key k",
    "python3 -m sglang.launch_server --model-path m/x --api-key k"])
def test_secrets_on_the_command_line_are_refused(command: str) -> None:
    with pytest.raises(Invalid, match="secret"):
        parse(command)


@pytest.mark.parametrize(("command", "match"), [
    ("", "empty"), ("vllm serve", "no model"), ("kubectl run x", "unknown serve command"),
    ("vllm serve m/x --port 80", "between"), ("vllm serve m/x --port abc", "whole number"),
    ("vllm serve m/x --host 127.0.0.1", "only inside the container"), ("vllm serve 'unterminated", "parse"),
    ("vllm serve m/x extra", "unexpected"), ("vllm serve m/x --model m/y", "once"),
    ("python3 -m sglang.launch_server --tp-size 2", "no model")])
def test_commands_the_product_cannot_serve_are_refused(command: str, match: str) -> None:
    with pytest.raises(Invalid, match=match):
        parse(command)


def test_parallel_sizes_over_the_gpus_are_refused_and_the_gpu_count_is_never_inferred() -> None:
    serve = parse("vllm serve m/x -tp 4 -pp 2")
    with pytest.raises(Invalid, match="8 GPUs"):
        checks.check_parallel(serve, 4)
    checks.check_parallel(serve, 8)
    dep = render(parse("vllm serve m/x -tp 2"), gpus=8)
    limits = dep["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/gpu": "8"}


def render(serve: object, gpus: int = 1, token: SecretRef | None = None, storage: bool = True) -> dict[str, object]:
    return manifest.deployment(name="chat", namespace="ns", serve=serve, gpus=gpus, replicas=2, efa=0,  # type: ignore[arg-type]
                               instance_type=None, image=None, model_gb=14.0, token=token, shared_storage=storage)


def test_the_deployment_carries_our_labels_the_pinned_image_probes_and_the_token_by_reference() -> None:
    serve = parse("vllm serve /s3/models/Qwen--Qwen2.5-7B --port 8080")
    ref = SecretRef(cluster="c", namespace="ns", name="chat-hf-token", key="token")
    dep: dict[str, object] = render(serve, token=ref)
    pod = dep["spec"]["template"]["spec"]  # type: ignore[index]
    container = pod["containers"][0]
    assert dep["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "instantstart"  # type: ignore[index]
    assert dep["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/managed-by": "instantstart",  # type: ignore[index]
                                                       "instantstart.io/inference": "chat"}
    assert container["image"] == IMAGES[Engine.VLLM]
    assert container["command"] == ["vllm", "serve", "/s3/models/Qwen--Qwen2.5-7B", "--port", "8080"]
    assert container["ports"] == [{"containerPort": 8080, "name": "http", "protocol": "TCP"}]
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "chat-hf-token", "key": "token"}}} \
        in container["env"]
    startup = container["startupProbe"]
    assert startup["httpGet"]["path"] == "/health" and container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert startup["failureThreshold"] * startup["periodSeconds"] >= 14 * manifest.LOAD_SECONDS_PER_GB
    assert {"name": "shared", "mountPath": "/s3"} in container["volumeMounts"]
    assert {"name": "shared", "persistentVolumeClaim": {"claimName": "shared-s3"}} in pod["volumes"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms[0]["matchExpressions"][0]["values"] == ["Schedulable"]


def test_the_startup_budget_grows_with_the_model() -> None:
    assert manifest.estimated_gb("Qwen/Qwen2.5-7B-Instruct") == 14.0
    assert manifest.estimated_gb("meta-llama/Llama-3.1-70B") == 140.0
    assert manifest.startup_failures(140.0) > manifest.startup_failures(14.0)


def test_the_service_shapes() -> None:
    serve = parse("vllm serve m/x")
    inside = manifest.service(name="chat", namespace="ns", serve=serve, spec=ServiceSpec())
    assert inside["spec"]["type"] == "ClusterIP"
    assert inside["spec"]["ports"][0]["targetPort"] == 8000
    internal = manifest.service(name="chat", namespace="ns", serve=serve,
                                spec=ServiceSpec(exposure=Exposure.EXTERNAL))
    assert internal["spec"]["type"] == "LoadBalancer"
    assert internal["metadata"]["annotations"][manifest.LB_SCHEME] == "internal"
    public = manifest.service(name="chat", namespace="ns", serve=serve, spec=ServiceSpec(
        exposure=Exposure.EXTERNAL, internet_facing=True, source_ranges=["203.0.113.0/24"]))
    assert public["metadata"]["annotations"][manifest.LB_SCHEME] == "internet-facing"
    assert public["spec"]["loadBalancerSourceRanges"] == ["203.0.113.0/24"]


@pytest.mark.parametrize(("spec", "match"), [
    (ServiceSpec(exposure=Exposure.EXTERNAL, internet_facing=True), "needs source_ranges"),
    (ServiceSpec(exposure=Exposure.EXTERNAL, internet_facing=True, source_ranges=["0.0.0.0/0"]), "whole internet"),
    (ServiceSpec(exposure=Exposure.EXTERNAL, source_ranges=["::/0"]), "is IPv6, and the load balancer is IPv4"),
    (ServiceSpec(exposure=Exposure.EXTERNAL, source_ranges=["2001:db8::/32"], confirm_open_to_world=True),
     "not dual-stack"),
    (ServiceSpec(exposure=Exposure.EXTERNAL, source_ranges=["10.0.0.0/33"]), "not a CIDR"),
    (ServiceSpec(exposure=Exposure.EXTERNAL, internet_facing=True, source_ranges=["0.0.0.0/1", "128.0.0.0/1"]),
     r"more than a /8 of the IPv4"),
    (ServiceSpec(exposure=Exposure.EXTERNAL, source_ranges=["10.0.0.0/8", "11.0.0.0/24"]), r"more than a /8"),
    (ServiceSpec(internet_facing=True), "'external' only"),
])
def test_exposure_rules(spec: ServiceSpec, match: str) -> None:
    with pytest.raises(Invalid, match=match):
        checks.check_service(spec)


def test_the_whole_internet_only_when_confirmed() -> None:
    checks.check_service(ServiceSpec(exposure=Exposure.EXTERNAL, internet_facing=True, source_ranges=["0.0.0.0/0"],
                                     confirm_open_to_world=True))
    checks.check_service(ServiceSpec(exposure=Exposure.EXTERNAL, internet_facing=True,
                                     source_ranges=["0.0.0.0/1", "128.0.0.0/1"], confirm_open_to_world=True))
    # a /8 in all (overlaps counted once) needs no confirmation
    checks.check_service(ServiceSpec(exposure=Exposure.EXTERNAL, internet_facing=True,
                                     source_ranges=["10.0.0.0/8", "10.1.0.0/16"]))


def test_the_gpu_count_must_fit_a_node_type() -> None:
    facts = {"ml.g5.2xlarge": InstanceFacts("ml.g5.2xlarge", nodes=2, gpus=1),
             "ml.g5.12xlarge": InstanceFacts("ml.g5.12xlarge", nodes=1, gpus=4),
             "ml.m5.xlarge": InstanceFacts("ml.m5.xlarge", nodes=1)}
    assert checks.pick_instance_types(facts, 1, None) == ["ml.g5.12xlarge", "ml.g5.2xlarge"]
    assert checks.pick_instance_types(facts, 4, None) == ["ml.g5.12xlarge"]
    with pytest.raises(Conflict, match="no node type of the cluster has 8 GPUs"):
        checks.pick_instance_types(facts, 8, None)
    with pytest.raises(Conflict, match="has 1 GPUs"):
        checks.pick_instance_types(facts, 2, "ml.g5.2xlarge")


def _status(*, ready: bool, waiting: str | None = None, last_exit: int | None = None) -> k8s.V1ContainerStatus:
    state = k8s.V1ContainerState(waiting=k8s.V1ContainerStateWaiting(reason=waiting) if waiting else None,
                                 running=None if waiting else k8s.V1ContainerStateRunning())
    last = k8s.V1ContainerState(terminated=k8s.V1ContainerStateTerminated(exit_code=last_exit, reason="OOMKilled")) \
        if last_exit is not None else k8s.V1ContainerState()
    return k8s.V1ContainerStatus(name="engine", image="i", image_id="", ready=ready, restart_count=1, state=state,
                                 last_state=last)


def test_a_past_exit_counts_only_while_the_container_struggles_now() -> None:
    assert container_trouble(_status(ready=True, last_exit=137)) == ("", "")  # OOM-killed once, ready now
    assert container_trouble(_status(ready=False, last_exit=137))[0] == "exited 137 (OOMKilled)"
    assert container_trouble(_status(ready=False, waiting="CrashLoopBackOff", last_exit=1))[0] == "CrashLoopBackOff"
    restarting = _status(ready=False, waiting="ContainerCreating", last_exit=1)
    assert container_trouble(restarting)[0] == "exited 1 (OOMKilled)"
    assert container_trouble(_status(ready=False)) == ("", "")


PLANTED = "hf_" + "Zq8rT2" * 6


@pytest.mark.parametrize(("command", "said"), [
    (f"HF_TOKEN={PLANTED} vllm serve m/x", "environment assignment (HF_TOKEN=…)"),
    (f"vllm serve m/x {PLANTED}", "unexpected argument"),
    (f"{PLANTED} serve m/x", "unknown serve command"),
    (f"vllm serve m/x --port {PLANTED}", "needs a whole number"),
    (f"vllm serve m/x --{PLANTED}", "has no flag"),
    (f"vllm serve m/x --hf-token={PLANTED}", "secret"),
])
def test_a_refusal_never_repeats_a_token(command: str, said: str) -> None:
    with pytest.raises(Invalid) as refused:
        parse(command)
    assert said in refused.value.message, refused.value.message
    assert PLANTED not in refused.value.message + repr(refused.value.details)


def test_the_deploy_time_decisions_are_recorded_on_the_deployment_not_its_pods() -> None:
    dep = manifest.deployment(name="chat", namespace="ns", serve=parse("vllm serve m/x"), gpus=1, replicas=1, efa=2,
                              instance_type="ml.p5.48xlarge", image=None, model_gb=40.0, token=None,
                              shared_storage=False, model_size_gb=40.0)
    assert {manifest.EFA_ANNOTATION: "2", manifest.INSTANCE_TYPE_ANNOTATION: "ml.p5.48xlarge",
            manifest.MODEL_GB_ANNOTATION: "40.0"}.items() <= dep["metadata"]["annotations"].items()
    assert manifest.EFA_ANNOTATION not in dep["spec"]["template"]["metadata"]["annotations"]
    estimated = render(parse("vllm serve m/x"))
    assert manifest.MODEL_GB_ANNOTATION not in estimated["metadata"]["annotations"]  # type: ignore[index]


@pytest.mark.parametrize("command", ["vllm serve --enforce-eager org/m", "vllm serve org/m --enforce-eager",
                                     "vllm serve --max-model-len 32k org/m --port 8001"])
def test_vllm_serves_the_model_named_before_or_after_its_options(command: str) -> None:
    """`vllm serve`'s model is argparse's optional positional: it may follow options."""
    assert parse(command).model == "org/m"


def test_a_second_positional_is_still_refused() -> None:
    with pytest.raises(Invalid, match="unexpected argument"):
        parse("vllm serve --enforce-eager org/m extra")


# ----- engine metrics: the sandbox engine's real metric names parsed, quantiles and windows as Prometheus ----

def _served(engine: str, prompts: list[str]) -> str:
    server = EngineServer(engine=engine, model="org/m", served_name="m", pod="p-0")
    for prompt in prompts:
        body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": 5}).encode()
        answered = server(Request("POST", "/v1/completions", "", [("content-type", "application/json")], body))
        assert answered.status == 200
    return server.metrics()


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_engines_metrics_are_read_under_their_own_names(engine: str) -> None:
    sample = endpoint_metrics.parse(_served(engine, ["a b c", "hello there"]), engine)
    assert (sample.tokens, sample.requests) == (10.0, 2.0)
    assert sample.buckets[-1] == (math.inf, 2.0) and dict(sample.buckets)[0.04] == 2.0
    assert endpoint_metrics.parse(_served(engine, ["x"]), "sglang" if engine == "vllm" else "vllm").tokens == 0


def test_quantiles_interpolate_within_the_bucket_as_histogram_quantile_does() -> None:
    buckets = ((0.1, 2.0), (0.2, 6.0), (0.5, 10.0), (math.inf, 10.0))
    assert endpoint_metrics.quantile(0.5, buckets) == pytest.approx(0.175)  # rank 5: 3/4 into (0.1, 0.2]
    assert endpoint_metrics.quantile(0.95, buckets) == pytest.approx(0.2 + 0.3 * 3.5 / 4)
    assert endpoint_metrics.quantile(0.99, ((0.1, 0.0), (math.inf, 4.0))) == 0.1  # in +Inf: the highest bound
    assert endpoint_metrics.quantile(0.5, ((0.1, 0.0), (math.inf, 0.0))) is None


def test_the_window_compares_two_scrapes_and_a_restarted_engine_counts_from_zero() -> None:
    def pod(tokens: float, requests: float, fast: float) -> endpoint_metrics.PodSample:
        return endpoint_metrics.PodSample(((0.05, fast), (1.0, requests), (math.inf, requests)), tokens, requests)
    before = endpoint_metrics.Scrape(100.0, {"a": pod(1000, 50, 50), "b": pod(500, 20, 20)}, 2, ())
    after = endpoint_metrics.Scrape(110.0, {"a": pod(1300, 60, 55), "b": pod(40, 2, 2), "c": pod(9, 1, 1)}, 3, ())
    shown = endpoint_metrics.figures(after, before)
    # a: +300 tokens, +10 requests (5 fast); b restarted: its 40 tokens, 2 requests; c is new: not in the window
    assert (shown.tokens_per_second, shown.requests, shown.window_seconds) == (34.0, 12, 10.0)
    assert shown.ttft_p50_seconds == pytest.approx(0.05 * 6 / 7, abs=1e-4)  # rank 6 of 12, 7 in (0, 0.05]
    first = endpoint_metrics.figures(before, None)
    assert first.tokens_per_second is None and first.window_seconds is None and "second scrape" in first.note
    idle = endpoint_metrics.figures(endpoint_metrics.Scrape(105.0, before.pods, 2, ()), before)
    assert (idle.tokens_per_second, idle.ttft_p50_seconds, idle.note) == (0.0, None,
                                                                           "no requests finished in the window")


def test_a_pool_scale_in_is_unsafe_for_held_pods_that_are_not_ready() -> None:
    """The ReplicaSet removes not-Ready pods before it weighs the deletion cost that protects claimed pods."""
    from services.inference.pool_stages import at_risk

    pods = [("a", "chat", False), ("b", None, True), ("c", None, True)]
    assert at_risk(pods, 2) == ["a"]  # one pod goes: the not-Ready claimed pod ranks first
    assert at_risk(pods, 3) == []  # nothing is removed
    assert at_risk([("a", "chat", True), ("b", None, True), ("c", None, False)], 1) == []  # cost protects a Ready one


def test_only_running_and_ready_pods_are_scraped() -> None:
    """A slim cached pod (``informers.slim_pod``) counts only when Running and Ready: a Pending pod whose cached
    Ready is true has no engine to read yet."""
    def pod(name: str, phase: str, ready: bool) -> dict[str, object]:
        return {"metadata": {"name": name, "namespace": "ns", "labels": {manifest.INFERENCE_LABEL: "chat"}},
                "status": {"phase": phase, "ready": ready}}
    pods = [pod("a", "Running", True), pod("b", "Pending", True), pod("c", "Running", False)]
    assert endpoint_metrics.ready_pods("ns", "chat", 8000, pods) == [endpoint_metrics.PodTarget("ns", "a", 8000)]


def test_a_router_page_with_one_line_the_parser_refuses_reports_the_metrics_could_not_be_read() -> None:
    """One malformed line fails the whole page (Prometheus' parser): the view says so and shows no counts. The
    page is one the reader kept from a read just now (so no cluster is asked)."""
    from services.inference.router import Routers
    from services.inference.router_manifest import ROUTER_LABEL
    from services.inference.router_metrics import RouterMetricsReader, _Kept
    from services.inference.router_models import RouterView

    page = "sgl_router_requests_total{route=\"/generate\"} 3\nsgl_router_active_workers two\n"
    routers = Routers.__new__(Routers)
    routers.metrics = RouterMetricsReader(kube=None, clock=lambda: 0.0)  # type: ignore[arg-type]
    routers.metrics._kept[("c", "ns", "r-0")] = _Kept(at=0.0, text=page)
    router_pod = {"metadata": {"name": "r-0", "namespace": "ns", "labels": {ROUTER_LABEL: "r"}},
                  "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
    view = RouterView(name="r", namespace="ns", cluster="c", deployment="chat")
    routers._read_metrics("c", view, [router_pod])
    assert view.metrics_error is not None and view.metrics_error.startswith("the router's metrics could not be read")
    assert view.requests_total is None and view.active_workers is None
