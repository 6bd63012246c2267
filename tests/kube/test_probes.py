"""The kubelet's prober and container config through the official client: every probed program container is
probed (an exec readiness probe passes once its program runs), a model load that outlasts its startup probe
and a failing liveness probe get the container killed and restarted with the kubelet's events, an engine's
API key guards its routes, and a ``secretKeyRef`` to a missing Secret or key keeps the container from being
created (``CreateContainerConfigError``) until it exists. Times are read on the sandbox clock."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from kubernetes import client

from sandbox.kube import backends
from tests.kube.serving_support import Served, proxy_call, served, serving
from tests.kube.training_support import trainer_container
from tests.support import wait_until

__all__ = ["served", "serving"]

HEALTH = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10}


def _engine(*, load: int, args: tuple[str, ...] = (), env: tuple[dict[str, Any], ...] = (),
            **probes: dict[str, Any]) -> dict[str, Any]:
    return {"name": "vllm", "image": "vllm/vllm-openai:v0.7.2",
            "command": ["vllm", "serve", "Qwen/Qwen2.5-0.5B-Instruct", *args],
            "ports": [{"name": "http", "containerPort": 8000}],
            "env": [{"name": "SANDBOX_LOAD_SECONDS", "value": str(load)}, *env],
            "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}, **probes}


def _pod(served: Served, name: str, container: dict[str, Any], labels: dict[str, str] | None = None) -> None:
    served.core.create_namespaced_pod("default", {"metadata": {"name": name, "labels": labels or {}},
                                                  "spec": {"containers": [container]}})


def _status(served: Served, name: str) -> client.V1PodStatus:
    return served.core.read_namespaced_pod(name, "default").status


def _ready(served: Served, name: str) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in _status(served, name).conditions or [])


def _events(served: Served, name: str) -> list[tuple[str, str, str]]:
    return [(e.reason, e.type, e.message) for e in served.core.list_namespaced_event("default").items
            if e.involved_object.name == name]


def _seconds(start: datetime, end: datetime) -> float:
    return (end - start).total_seconds()


def test_a_training_container_with_an_exec_readiness_probe_becomes_ready_after_its_delay(served: Served) -> None:
    probe = {"exec": {"command": ["cat", "/tmp/ready"]}, "initialDelaySeconds": 60, "periodSeconds": 10}
    _pod(served, "trainer", {**trainer_container(["torchrun", "train.py", "--max_steps", "1000000"]),
                             "readinessProbe": probe})
    wait_until(lambda: _ready(served, "trainer"), timeout=60, message="the trainer Ready")
    status = _status(served, "trainer")
    container = status.container_statuses[0]
    assert container.ready and container.started and container.restart_count == 0
    ready = next(c for c in status.conditions if c.type == "Ready")
    assert _seconds(container.state.running.started_at, ready.last_transition_time) >= 60


def test_a_load_outlasting_the_startup_probe_is_killed_and_restarted_and_one_sized_for_it_is_not(
        served: Served) -> None:
    startup = {**HEALTH, "initialDelaySeconds": 5, "failureThreshold": 3}
    _pod(served, "short", _engine(load=600, startupProbe=startup, readinessProbe=HEALTH))
    _pod(served, "sized", _engine(load=600, startupProbe={**startup, "failureThreshold": 90}, readinessProbe=HEALTH))
    wait_until(lambda: (_status(served, "short").container_statuses[0].restart_count or 0) >= 1, timeout=60,
               message="the short-probed engine restarted")
    wait_until(lambda: _ready(served, "sized"), timeout=60, message="the well-sized engine Ready")
    short = _status(served, "short").container_statuses[0]
    killed = short.last_state.terminated
    assert (killed.exit_code, killed.reason) == (137, "Error") and not short.ready
    assert 20 <= _seconds(killed.started_at, killed.finished_at) < 60  # 3 failures 10 s apart, from 5 s on
    events = _events(served, "short")
    assert ("Killing", "Normal", "Container vllm failed startup probe, will be restarted") in events
    unhealthy = [m for reason, kind, m in events if reason == "Unhealthy" and kind == "Warning"]
    assert unhealthy and all(m.startswith('Startup probe failed: Get "http://10.1.') for m in unhealthy)
    assert unhealthy[0].endswith(':8000/health": dial tcp ' + unhealthy[0].split("://")[1].split("/")[0]
                                 + ": connect: connection refused")
    assert "Starting to load model" in served.core.read_namespaced_pod_log("short", "default", previous=True)
    sized = _status(served, "sized").container_statuses[0]
    assert sized.restart_count == 0 and sized.ready and sized.started
    ready_since = next(c for c in _status(served, "sized").conditions if c.type == "Ready").last_transition_time
    mark = served.cluster.clock()  # ready it stays: the startup probe is not sent again once it passed
    wait_until(lambda: served.cluster.clock() > mark + 300, timeout=60, message="5 simulated minutes")
    again = [(c.status, c.last_transition_time) for c in _status(served, "sized").conditions if c.type == "Ready"]
    assert again == [("True", ready_since)]
    assert not any(reason == "Killing" for reason, _, _ in _events(served, "sized"))


def test_a_failing_liveness_probe_restarts_the_container(served: Served) -> None:
    liveness = {"httpGet": {"path": "/alive", "port": 8000}, "initialDelaySeconds": 30, "periodSeconds": 5,
                "failureThreshold": 2}
    _pod(served, "lively", _engine(load=10, readinessProbe=HEALTH, livenessProbe=liveness))
    wait_until(lambda: (_status(served, "lively").container_statuses[0].restart_count or 0) >= 1, timeout=60,
               message="the engine restarted by its liveness probe")
    killed = _status(served, "lively").container_statuses[0].last_state.terminated
    assert killed.exit_code == 137
    events = _events(served, "lively")
    assert ("Killing", "Normal", "Container vllm failed liveness probe, will be restarted") in events
    assert ("Unhealthy", "Warning", "Liveness probe failed: HTTP probe failed with statuscode: 404") in events


def test_an_api_key_guards_the_engines_routes_and_the_apiserver_proxy_does_not_carry_one(served: Served) -> None:
    served.core.create_namespaced_secret("default", {"metadata": {"name": "vllm-key"},
                                                     "stringData": {"key": "sk-sandbox"}})
    key_env = {"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "vllm-key", "key": "key"}}}
    _pod(served, "keyed", _engine(load=10, env=(key_env,), readinessProbe=HEALTH))
    _pod(served, "sgl", {**_engine(load=10, readinessProbe=HEALTH), "image": "lmsysorg/sglang:latest",
                         "command": ["python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen2.5-0.5B",
                                     "--port", "8000", "--api-key", "sk-sgl"]})
    wait_until(lambda: _ready(served, "keyed") and _ready(served, "sgl"), timeout=60, message="both engines Ready")
    base = "/api/v1/namespaces/default/pods"
    status, _, text = proxy_call(served.api, "GET", f"{base}/keyed/proxy/v1/models",
                                 headers={"Authorization": "Bearer sk-sandbox"})
    assert (status, json.loads(text)) == (401, {"error": "Unauthorized"})  # the apiserver keeps Authorization
    assert proxy_call(served.api, "GET", f"{base}/keyed/proxy/health")[0] == 200
    assert proxy_call(served.api, "GET", f"{base}/keyed/proxy/metrics")[0] == 200  # vLLM guards /v1 only
    assert proxy_call(served.api, "GET", f"{base}/sgl/proxy/v1/models")[0] == 401
    assert proxy_call(served.api, "GET", f"{base}/sgl/proxy/metrics")[0] == 404  # not refused: not enabled

    def inside(pod: str, key: str) -> int:  # a client in the cluster network, which can pass the key
        meta = served.core.read_namespaced_pod(pod, "default").metadata
        handler = backends.dial(served.cluster, "default", pod, meta.uid, 8000)
        assert handler is not None
        headers = [("Authorization", f"Bearer {key}")] if key else []
        return handler(backends.Request("GET", "/v1/models", "", headers)).status

    assert (inside("keyed", "sk-sandbox"), inside("keyed", "wrong"), inside("keyed", "")) == (200, 401, 401)
    assert (inside("sgl", "sk-sgl"), inside("sgl", "sk-sandbox")) == (200, 401)


def test_a_secret_key_ref_to_a_missing_secret_or_key_keeps_the_container_from_being_created(served: Served) -> None:
    served.core.create_namespaced_secret("default", {"metadata": {"name": "hf"}, "stringData": {"token": "hf_x"}})

    def plain(secret: str, key: str, optional: bool = False) -> dict[str, Any]:
        return {"name": "app", "image": "busybox", "env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {
            "name": secret, "key": key, "optional": optional}}}]}

    _pod(served, "no-secret", plain("later", "token"))
    _pod(served, "no-key", plain("hf", "other"))
    _pod(served, "optional", plain("absent", "token", optional=True))
    served.core.create_namespaced_pod("default", {"metadata": {"name": "init"}, "spec": {
        "initContainers": [{**plain("hf", "gone"), "name": "fetch"}], "containers": [plain("hf", "token")]}})
    gated = _engine(load=10, env=({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "x"}}},))
    _pod(served, "engine", {**gated, "command": ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"]})
    expected = {"no-secret": 'secret "later" not found', "no-key": "couldn't find key other in Secret default/hf",
                "engine": "couldn't find key x in Secret default/hf"}
    init = wait_until(lambda: _status(served, "init").init_container_statuses, timeout=60, message="init refused")
    assert (init[0].state.waiting.reason, init[0].state.waiting.message) == (
        "CreateContainerConfigError", "couldn't find key gone in Secret default/hf")
    assert _status(served, "init").container_statuses[0].state.waiting.reason == "PodInitializing"

    def waiting(name: str) -> Any:
        statuses = _status(served, name).container_statuses or []
        return statuses[0].state.waiting if statuses and statuses[0].state.waiting else None

    for name, message in expected.items():
        state = wait_until(lambda n=name: waiting(n), timeout=60, message=f"{name} waiting")  # type: ignore[misc]
        assert (state.reason, state.message) == ("CreateContainerConfigError", message), name
        assert _status(served, name).phase == "Pending"
        assert ("Failed", "Warning", f"Error: {message}") in _events(served, name)
    wait_until(lambda: _ready(served, "optional"), timeout=60, message="the optional reference's pod Ready")
    assert served.core.read_namespaced_pod_log("engine", "default", container="vllm") == ""  # never started
    served.core.create_namespaced_secret("default", {"metadata": {"name": "later"}, "stringData": {"token": "t"}})
    wait_until(lambda: _ready(served, "no-secret"), timeout=60, message="the pod started once its Secret exists")
    assert _status(served, "no-key").phase == "Pending"
