"""Simulated inference engines: vLLM's and SGLang's OpenAI-compatible servers as container programs.

A container :func:`.engine_cli.engine_argv` recognises runs :func:`serve`: its flags are parsed as the
engine's CLI parses them and the pod is held to the engine's contract (:func:`.engine_cli.check_pod`); a
refusal is the engine's error in the container log and a non-zero exit (2 for argparse, 1 otherwise), so a
Deployment's pod crash-loops and never becomes Ready. Otherwise the engine logs its start, "loads" the model
(``SANDBOX_LOAD_SECONDS`` simulated seconds from the container env, default 60), then listens on its port
(:class:`.engine_server.EngineServer`, reached through the apiserver's proxy) until it is killed; the kubelet
probes it meanwhile (:mod:`.probes`).
"""

from __future__ import annotations

from typing import Any

from .engine_cli import EngineError, Invocation, check_pod, engine_argv, human_int, parse
from .engine_server import EngineServer
from .processes import Process, program
from .store import Obj

LOAD_SECONDS = 60.0


def _claims(pod: Obj, container: dict[str, Any]) -> bool:
    return engine_argv(container) is not None


def _secret_holds(proc: Process) -> Any:
    def holds(name: str, key: str) -> bool:
        secret = proc.cluster.store.get(("", "secrets"), (proc.namespace, name))
        return secret is not None and key in {**(secret.get("data") or {}), **(secret.get("stringData") or {})}
    return holds


def _load_seconds(proc: Process) -> float:
    try:
        return float(proc.env.get("SANDBOX_LOAD_SECONDS") or LOAD_SECONDS)
    except ValueError:
        return LOAD_SECONDS


def _startup(proc: Process, inv: Invocation, gpus: str) -> list[str]:
    if inv.engine == "vllm":
        tp, pp = inv.size("--tensor-parallel-size"), inv.size("--pipeline-parallel-size")
        return [f"INFO api_server.py: vLLM API server (simulated by the InstantStart sandbox) on pod {proc.pod}",
                f"INFO api_server.py: args: model={inv.model!r}, served_model_name={inv.served_name!r}, "
                f"tensor_parallel_size={tp}, pipeline_parallel_size={pp}, port={inv.port}",
                f"INFO config.py: Defaulting to use mp for distributed inference ({gpus} GPUs visible)",
                f"INFO model_runner.py: Starting to load model {inv.model}..."]
    tp, pp = inv.size("--tp-size"), inv.size("--pp-size")
    return [f"server_args=ServerArgs(model_path={inv.model!r}, served_model_name={inv.served_name!r}, "
            f"tp_size={tp}, pp_size={pp}, port={inv.port}) (simulated by the InstantStart sandbox on pod {proc.pod})",
            f"[TP0] Init torch distributed begin. ({gpus} GPUs visible)",
            f"[TP0] Load weight begin. model={inv.model}"]


def _loaded(inv: Invocation) -> list[str]:
    url = f"http://0.0.0.0:{inv.port}"
    if inv.engine == "vllm":
        return ["INFO model_runner.py: Loading model weights took 14.99 GB",
                "INFO worker.py: Memory profiling takes 2.10 seconds", "INFO executor_base.py: # cuda blocks: 27000",
                f"INFO api_server.py: Starting vLLM API server on {url}",
                "INFO:     Started server process [1]", "INFO:     Waiting for application startup.",
                "INFO:     Application startup complete.",
                f"INFO:     Uvicorn running on {url} (Press CTRL+C to quit)"]
    return ["[TP0] Load weight end. dtype=torch.bfloat16, mem usage=14.99 GB.", "[TP0] KV Cache is allocated.",
            f"INFO:     Uvicorn running on {url} (Press CTRL+C to quit)",
            "The server is fired up and ready to roll!"]


@program(_claims)
def serve(proc: Process) -> int:
    found = engine_argv(proc.spec)
    assert found is not None
    engine, usage, argv = found
    gpus = str(((proc.spec.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu", 0))
    try:
        inv = parse(engine, usage, argv)
        for line in _startup(proc, inv, gpus):
            proc.log(line)
        check_pod(inv, proc.pod_obj, proc.spec, _secret_holds(proc))
    except EngineError as exc:
        for line in exc.lines:
            proc.log(line)
        return exc.exit_code
    proc.sleep(_load_seconds(proc))
    api_key = inv.get("--api-key") or (proc.env.get("VLLM_API_KEY", "") if engine == "vllm" else "")
    server = EngineServer(engine, inv.model, inv.served_name, proc.pod,
                          metrics_enabled=engine == "vllm" or bool(inv.args.get("--enable-metrics")),
                          max_model_len=human_int(inv.get("--max-model-len") or inv.get("--context-length") or "")
                          or 4096,
                          api_key=api_key)
    proc.listen(inv.port, server)
    for line in _loaded(inv):
        proc.log(line)
    proc.sleep(float("inf"))  # serves until killed
    return 0
