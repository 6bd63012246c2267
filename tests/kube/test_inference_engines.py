"""Simulated vLLM and SGLang servers through the official client: a Deployment of each becomes Ready only
once its readiness probe passes, answers chat completions through the Service proxy (naming the pod that
answered) and counts them in its Prometheus metrics; each broken contract keeps the pod from Ready with the
engine's reason in its log."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from kubernetes import client

from sandbox.kube import engine_cli
from services.inference.command import IMAGES, flag_specs, parse
from services.inference.models import Engine
from tests.kube.serving_support import Served, chat, proxy_call, served, serving
from tests.support import wait_until

__all__ = ["served", "serving"]

PROBE = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5}


def _container(name: str, *, image: str = "vllm/vllm-openai:v0.7.2", command: list[str] | None = None,
               args: list[str] | None = None, port: int = 8000, gpus: int = 1, env: list[dict[str, Any]] | None = None,
               probe: bool = True, mounts: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": name, "image": image, "ports": [{"name": "http", "containerPort": port}],
        "env": env or [], "volumeMounts": mounts or []}
    if command:
        container["command"] = command
    if args:
        container["args"] = args
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}, "requests": {"nvidia.com/gpu": str(gpus)}}
    if probe:
        container["readinessProbe"] = PROBE
    return container


def _deploy(served: Served, name: str, container: dict[str, Any]) -> None:
    labels = {"app": name}
    client.AppsV1Api(served.api).create_namespaced_deployment("default", {
        "metadata": {"name": name}, "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels}, "spec": {"containers": [container]}}}})
    served.core.create_namespaced_service("default", {"metadata": {"name": name}, "spec": {
        "selector": labels, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}})


def _pods(served: Served, app: str) -> list[client.V1Pod]:
    return list(served.core.list_namespaced_pod("default", label_selector=f"app={app}").items)


def _ready(pod: client.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def _log(served: Served, pod: str, previous: bool = False) -> str:
    return str(served.core.read_namespaced_pod_log(pod, "default", previous=previous))


def _metric(text: str, name: str) -> float:
    found = re.search(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.M)
    assert found, f"{name} not in metrics:\n{text}"
    return float(found.group(1))


def test_a_vllm_deployment_is_ready_once_loaded_and_answers_through_the_service_proxy(served: Served) -> None:
    _deploy(served, "llm", _container("vllm", args=[
        "--model", "Qwen/Qwen2.5-0.5B-Instruct", "--served-model-name", "qwen", "-tp", "2", "--port=8000"],
        gpus=2, env=[{"name": "SANDBOX_LOAD_SECONDS", "value": "4800"}]))  # 12 s of real time to see it loading
    pod = wait_until(lambda: next((p for p in _pods(served, "llm") if p.status.phase == "Running"), None),
                     timeout=60, message="the vLLM pod running")
    assert not _ready(pod)  # still loading: the readiness probe finds nothing listening
    status, _, text = chat(served.api, "llm:http", "hello")
    assert status == 503
    wait_until(lambda: (client.AppsV1Api(served.api).read_namespaced_deployment("llm", "default").status
                        .ready_replicas or 0) == 1, timeout=60, message="the vLLM Deployment Ready")
    name = pod.metadata.name
    log = _log(served, name)
    assert "tensor_parallel_size=2" in log and "Uvicorn running on http://0.0.0.0:8000" in log
    mark = served.ledger.mark()
    status, headers, answer = chat(served.api, "llm:http", "Say hello to the sandbox", model="qwen", max_tokens=3)
    assert status == 200 and headers["x-sandbox-pod"] == name and name in answer["system_fingerprint"]
    assert answer["object"] == "chat.completion" and answer["model"] == "qwen"
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 3 == len(answer["choices"][0]["message"]["content"].split())
    assert answer["usage"]["total_tokens"] == answer["usage"]["prompt_tokens"] + 3
    again = chat(served.api, "llm:http", "Say hello to the sandbox", model="qwen", max_tokens=3)[2]
    assert again["choices"][0]["message"] == answer["choices"][0]["message"]  # deterministic
    status, _, missing = chat(served.api, "llm:http", "hi", model="other")
    assert status == 404 and missing["message"] == "The model `other` does not exist."
    base = "/api/v1/namespaces/default/services/llm:http/proxy"
    status, _, text = proxy_call(served.api, "POST", f"{base}/v1/completions",
                                 {"model": "qwen", "prompt": "once upon", "max_tokens": 2, "stream": True})
    assert status == 200 and text.endswith("data: [DONE]\n\n") and text.count("data: ") == 4
    models = json.loads(proxy_call(served.api, "GET", f"{base}/v1/models")[2])
    assert [m["id"] for m in models["data"]] == ["qwen"] and models["data"][0]["root"] == "Qwen/Qwen2.5-0.5B-Instruct"
    metrics = proxy_call(served.api, "GET", f"{base}/metrics")[2]
    assert _metric(metrics, "vllm:generation_tokens_total") == 3 + 3 + 2
    assert _metric(metrics, "vllm:time_to_first_token_seconds_count") == 3
    assert _metric(metrics, "vllm:num_requests_running") == 0
    def proxied() -> list[tuple[Any, ...]]:
        return [(e["verb"], e["resource"], e["name"], e["status"], e["write"])
                for e in served.ledger.calls(cluster=served.name, since=mark) if e["subresource"] == "proxy"]

    # the two chat calls went through the service proxy, as reads (a call's entry is written once it is answered)
    wait_until(lambda: proxied().count(("create", "services", "llm:http", 200, False)) >= 2, timeout=30,
               message=f"the two chat calls in the ledger: {proxied()}")


def test_an_sglang_deployment_with_a_gated_model_and_a_secret_token_serves_metrics(served: Served) -> None:
    served.core.create_namespaced_secret("default", {"metadata": {"name": "hf"}, "stringData": {"token": "hf_x"}})
    _deploy(served, "sgl", _container("sglang", image="lmsysorg/sglang:latest", port=30000, gpus=2, command=[
        "python3", "-m", "sglang.launch_server", "--model-path", "meta-llama/Llama-3.1-8B-Instruct",
        "--tp-size", "2", "--host", "0.0.0.0", "--enable-metrics"],
        env=[{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}]))
    wait_until(lambda: any(_ready(p) for p in _pods(served, "sgl")), timeout=60, message="the SGLang pod Ready")
    pod = _pods(served, "sgl")[0].metadata.name
    assert "The server is fired up and ready to roll!" in _log(served, pod)
    status, headers, answer = chat(served.api, "sgl:http", "hi", model="meta-llama/Llama-3.1-8B-Instruct")
    assert status == 200 and headers["x-sandbox-pod"] == pod
    metrics = proxy_call(served.api, "GET", "/api/v1/namespaces/default/services/sgl:80/proxy/metrics")[2]
    assert _metric(metrics, "sglang:generation_tokens_total") == answer["usage"]["completion_tokens"]
    assert _metric(metrics, "sglang:num_requests_total") == 1


VLLM = ["vllm", "serve", "Qwen/Qwen2.5-0.5B-Instruct"]
SGLANG = ["python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen2.5-0.5B-Instruct"]
SECRET_TOKEN = [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}]
BROKEN: dict[str, tuple[dict[str, Any], int, str]] = {
    "unknown-flag": (_container("e", command=[*VLLM, "--bogus", "1"]), 2, "unrecognized arguments: --bogus 1"),
    "missing-value": (_container("e", command=[*VLLM, "--port"]), 2, "argument --port: expected one argument"),
    "sglang-no-model": (_container("e", port=30000, command=["python3", "-m", "sglang.launch_server"]), 2,
                        "the following arguments are required: --model-path/--model"),
    "sglang-ambiguous-prefix": (_container("e", port=30000, command=[*SGLANG, "--disable", "1"]), 2,
                                "ambiguous option: --disable could match --disable-"),
    "sglang-deprecated-switch": (_container("e", port=30000, command=[*SGLANG, "--enable-ep-moe"]), 2,
                                 "unrecognized arguments: --enable-ep-moe"),
    "undeclared-port": (_container("e", command=[*VLLM, "--port", "9000"]), 1,
                        "does not declare as a containerPort"),
    "no-gpu": (_container("e", command=VLLM, gpus=0), 1, "Failed to infer device type"),
    "tp-over-gpus": (_container("e", command=["python3", "-m", "vllm.entrypoints.openai.api_server", "--model",
                                              "Qwen/Qwen2.5-0.5B-Instruct", "--tensor-parallel-size", "2",
                                              "--pipeline-parallel-size", "2"], gpus=1), 1,
                     "World size (4) = tensor parallel size (2) x pipeline parallel size (2) is larger than the "
                     "number of available GPUs (1"),
    "plain-token": (_container("e", command=VLLM, env=[{"name": "HF_TOKEN", "value": "hf_secret"}]), 1,
                    "the Hugging Face token must come from a Secret"),
    "gated-no-token": (_container("e", command=["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"]), 1,
                       "401 Client Error"),
    "s3-unmounted": (_container("e", command=["vllm", "serve", "/s3/models/qwen"],
                                mounts=[{"name": "scratch", "mountPath": "/data"}]), 1,
                     "Invalid repository ID or local directory specified: '/s3/models/qwen'"),
}


def test_each_broken_contract_keeps_the_pod_from_ready_with_the_engines_reason(served: Served) -> None:
    served.core.create_namespaced_secret("default", {"metadata": {"name": "hf"}, "stringData": {"token": "hf_x"}})
    for name, (container, _, _) in BROKEN.items():
        volumes = [{"name": "scratch", "emptyDir": {}}] if container["volumeMounts"] else []
        served.core.create_namespaced_pod("default", {"metadata": {"name": name}, "spec": {
            "restartPolicy": "Never", "containers": [container], "volumes": volumes}})

    def ended() -> bool:
        return all(served.core.read_namespaced_pod(n, "default").status.phase == "Failed" for n in BROKEN)

    wait_until(ended, timeout=60, message="every broken engine pod Failed")
    for name, (_, code, reason) in BROKEN.items():
        pod = served.core.read_namespaced_pod(name, "default")
        assert not _ready(pod), name
        assert pod.status.container_statuses[0].state.terminated.exit_code == code, name
        assert reason in _log(served, name), (name, _log(served, name))


def test_a_crash_looping_engine_never_becomes_ready(served: Served) -> None:
    _deploy(served, "bad", _container("vllm", args=["--model", "Qwen/Qwen2.5-0.5B-Instruct", "-tp", "4"], gpus=2))
    pod = wait_until(lambda: next((p for p in _pods(served, "bad") if p.status.container_statuses
                                   and p.status.container_statuses[0].restart_count >= 2), None),
                     timeout=60, message="the engine restarted twice")
    assert not _ready(pod) and not pod.status.container_statuses[0].ready
    assert "larger than the number of available GPUs (2" in _log(served, pod.metadata.name, previous=True)
    status, _, answer = chat(served.api, "bad:http", "hi")
    assert status == 503 and "no endpoints available" in answer["message"]


def test_the_product_and_the_simulated_vllm_record_the_same_flags_aliases_and_no_forms() -> None:
    product, simulated = flag_specs()[Engine.VLLM], engine_cli.spec("vllm")
    recorded = simulated.value | simulated.switch | simulated.optional | simulated.values | simulated.negatable
    assert sorted(recorded ^ product.flags) == []
    assert simulated.aliases == product.aliases
    assert simulated.negatable == product.negatable
    # the v0.11.0 tag's files: present there, and flags of later commits the earlier lists carried are not
    assert {"--async-scheduling", "--cuda-graph-sizes", "--structured-outputs-config", "--enable-lora-bias"} <= recorded
    assert {"--cudagraph-capture-sizes", "--tokens-only", "--all2all-backend"}.isdisjoint(recorded)


def test_the_product_and_the_simulated_sglang_record_the_same_flags_aliases_and_arities() -> None:
    product, simulated = flag_specs()[Engine.SGLANG], engine_cli.spec("sglang")
    recorded = simulated.known - frozenset(simulated.aliases)
    assert sorted(recorded ^ product.flags) == []
    assert simulated.aliases == product.aliases
    assert (simulated.switch, simulated.values | simulated.any_values, simulated.negatable) == (
        product.switches, product.values, product.negatable)
    # v0.5.4's server_args.py: present there, and the newer flags the earlier lists carried are not
    assert {"--enable-metrics", "--hybrid-kvcache-ratio", "--lora-paths", "--ep-size"} <= recorded
    assert {"--dcp-size", "--attn-cp-size", "--enable-ep-moe"}.isdisjoint(recorded | set(product.aliases))
    assert product.aliases["--ep"] == "--ep-size" and len(recorded) == 266


def test_sglang_nargs_star_flags_take_zero_words_and_nargs_plus_ones_at_least_one() -> None:
    """argparse lets a nargs="*" flag end at the next option (``--lora-paths --port 30000``); a nargs="+" one
    still needs a word (SGLang v0.5.4's server_args.py)."""
    inv = engine_cli.parse("sglang", "launch_server.py", ["--model-path", "m", "--lora-paths", "--port", "30000",
                                                          "--custom-weight-loader", "--lora-target-modules"])
    assert (inv.args["--lora-paths"], inv.args["--custom-weight-loader"], inv.port) == ([], [], 30000)
    assert inv.args["--lora-target-modules"] == []
    with pytest.raises(engine_cli.EngineError, match="argument --cuda-graph-bs: expected at least one argument"):
        engine_cli.parse("sglang", "launch_server.py", ["--model-path", "m", "--cuda-graph-bs", "--port", "1"])


def test_a_vllm_command_the_product_accepts_starts_the_simulated_engine(served: Served) -> None:
    serve = parse("vllm serve Qwen/Qwen2.5-0.5B-Instruct --async-scheduling --no-enable-prefix-caching "
                  "--cuda-graph-sizes 8 16 --max-model-len 32k -dp 1 --kv-sharing-fast-prefill "
                  "--enable-log-requests --structured-outputs-config '{}' --served-model-name q -tp 2")
    container = _container("vllm", image=IMAGES[Engine.VLLM], command=serve.argv, gpus=serve.gpus_needed)
    assert _ready(_run_to_settled(served, "v011", container)), _log(served, "v011")
    assert "tensor_parallel_size=2" in _log(served, "v011")


def test_an_sglang_command_the_product_accepts_starts_the_simulated_engine(served: Served) -> None:
    serve = parse("python3 -m sglang.launch_server --model Qwen/Qwen2.5-0.5B-Instruct --tp 2 --ep 2 "
                  "--enable-metrics --cuda-graph-bs 8 16 --hybrid-kvcache-ratio --served-model q")
    container = _container("sglang", image=IMAGES[Engine.SGLANG], command=serve.argv, port=30000,
                           gpus=serve.gpus_needed)
    assert _ready(_run_to_settled(served, "s054", container)), _log(served, "s054")
    assert "served_model_name='q', tp_size=2" in _log(served, "s054")


def _run_to_settled(served: Served, name: str, container: dict[str, Any]) -> client.V1Pod:
    served.core.create_namespaced_pod("default", {"metadata": {"name": name}, "spec": {
        "restartPolicy": "Never", "containers": [container]}})

    def settled() -> client.V1Pod | None:
        pod = served.core.read_namespaced_pod(name, "default")
        return pod if _ready(pod) or pod.status.phase == "Failed" else None

    return wait_until(settled, timeout=60, message=f"the {name} pod Ready or Failed")


@pytest.mark.parametrize(("value", "expected"), [("4096", 4096), ("32k", 32_000), ("25.6k", 25_600), ("32K", 32_768),
                                                 ("1M", 2**20), ("1.5K", None), ("32x", None), ("", None)])
def test_max_model_len_reads_as_vllms_human_readable_int(value: str, expected: int | None) -> None:
    assert engine_cli.human_int(value) == expected
