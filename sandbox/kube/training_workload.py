"""The simulated trainer: what a training container prints and logs to MLflow in the sandbox.

A container whose command runs a recorded training CLI (:mod:`.training_cli`: ``torchrun``/``hyperpodrun``
with a script, ``llamafactory-cli train``, ``swift sft|pt|rlhf``, ``python3 -m verl.trainer.main_ppo``,
also behind ``bash -c`` or ``ray job submit --``) runs this program (:mod:`.processes`). A command the real
CLI refuses prints the CLI's error and exits with its code. Otherwise it trains for the command's step count
(``max_steps``, ``--max-steps``, ``trainer.total_training_steps``; default :data:`DEFAULT_STEPS`), one step per
:data:`STEP_SECONDS` simulated seconds (HF-Trainer recipes report every ``logging_steps``), and writes realistic
stdout: NCCL init lines (``NCCL_DEBUG=INFO``),
one line per step in the recipe's style (HF Trainer dicts for LLaMA-Factory and ms-swift, the torch-style
``[rank0] step ...`` line, VERL's ``step:N - key:value`` line), checkpoint saves under
``/s3/jobs/<job>/checkpoints/checkpoint-<step>`` and a final line. A restarted run resumes from the job's
latest checkpoint (kept per job in memory: the sandbox's shared storage has no contents).

With ``MLFLOW_TRACKING_URI`` and ``MLFLOW_RUN_ID`` in the container's environment, global rank 0 logs the
issue's metrics for its recipe to that run through the real MLflow client, one ``log_batch`` per step,
finding its run only through those variables.

A ``hyperpodrun`` launch is supervised by the HyperPod elastic agent: when the training process fails, the
agent asks the operator (:func:`.hpto.request_restart`) and either restarts it in place or exits.

Sandbox-only knobs (container env): ``SANDBOX_STEP_SECONDS`` (simulated seconds per step),
``SANDBOX_FAIL_AT_STEP`` (the training process crashes at that step, exit 1) and ``SANDBOX_FAIL_RUNS``
(only the first N runs in that pod crash; default: every run).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from . import hpto
from .processes import Process, program
from .store import Obj
from .training_cli import CliError, Invocation, identify, llamafactory_config

DEFAULT_STEPS = 50
STEP_SECONDS = 2.0
JOB_LABEL = "instantstart.io/job"
_STEP_KEYS = ("max_steps", "max-steps", "total_steps", "num_steps", "steps", "trainer.total_training_steps")
_SAVE_KEYS = ("save_steps", "save-steps", "checkpoint_interval", "save_interval", "trainer.save_freq")
_checkpoints: dict[tuple[int, str, str], int] = {}  # (cluster id, namespace, job) -> latest saved step
_checkpoints_lock = threading.Lock()


def _claims(pod: Obj, container: dict[str, Any]) -> bool:
    argv = [str(w) for w in (container.get("command") or []) + (container.get("args") or [])]
    env = {e["name"]: str(e["value"]) for e in container.get("env") or [] if "value" in e}
    try:
        return identify(argv, env) is not None
    except CliError:
        return True  # the real CLI runs and refuses its arguments


@dataclass
class Plan:
    """What one container trains, worked out from its command and environment."""

    invocation: Invocation
    job: str
    namespace: str
    rank: int  # global rank of this pod's first process
    world: int
    nnodes: int
    steps: int
    save_every: int
    log_every: int  # HF Trainer recipes log every ``logging_steps``; the others every step
    step_seconds: float
    fail_at: int
    fail_runs: int

    @property
    def recipe(self) -> str:
        return self.invocation.recipe


def _int(value: str | None, default: int) -> int:
    try:
        return int(float(value)) if value else default
    except ValueError:
        return default


def plan_for(proc: Process, invocation: Invocation) -> Plan:
    env = proc.env
    options = invocation.launch.options if invocation.launch is not None else {}
    settings = invocation.settings
    # torchrun reads an option it was not given from PET_<OPTION>; operators inject NNODES / NODE_RANK too.
    nnodes = _int((options.get("nnodes") or env.get("PET_NNODES") or env.get("NNODES", "")).split(":")[-1], 1)
    nproc = _int(options.get("nproc-per-node") or env.get("PET_NPROC_PER_NODE") or env.get("NPROC_PER_NODE"), 1)
    node_rank = _int(options.get("node-rank") or env.get("PET_NODE_RANK") or env.get("NODE_RANK")
                     or env.get("RANK"), 0)
    if invocation.recipe == "verl":
        nnodes = _int(settings.get("trainer.nnodes"), nnodes)
        nproc = _int(settings.get("trainer.n_gpus_per_node"), nproc)
    steps = next((_int(settings[k], DEFAULT_STEPS) for k in _STEP_KEYS if k in settings), DEFAULT_STEPS)
    save = next((_int(settings[k], 0) for k in _SAVE_KEYS if k in settings), 0) or max(steps // 4, 1)
    log_every = _int(settings.get("logging_steps"), 1) if invocation.recipe in ("llama-factory", "ms-swift") else 1
    labels = proc.pod_obj["metadata"].get("labels") or {}
    return Plan(invocation, labels.get(JOB_LABEL) or proc.pod, proc.namespace, node_rank * nproc,
                max(nnodes * nproc, 1), nnodes, max(steps, 1), save, max(log_every, 1),
                float(env.get("SANDBOX_STEP_SECONDS") or STEP_SECONDS), _int(env.get("SANDBOX_FAIL_AT_STEP"), 0),
                _int(env.get("SANDBOX_FAIL_RUNS"), -1))


def _noise(job: str, step: int, salt: str) -> float:
    """A deterministic value in [-1, 1) for this job, step and metric."""
    digest = hashlib.sha256(f"{job}/{step}/{salt}".encode()).digest()
    return int.from_bytes(digest[:4], "big") / 2**31 - 1.0


def step_metrics(plan: Plan, step: int, timestamp: float) -> dict[str, float]:
    """The metrics the recipe's trainer logs at ``step`` (the issue's names per recipe)."""
    frac = step / plan.steps
    loss = round(0.35 + 2.2 * math.exp(-3.0 * frac) + 0.03 * _noise(plan.job, step, "loss"), 4)
    warm = max(plan.steps // 10, 1)
    peak = 2e-5 if plan.recipe in ("llama-factory", "ms-swift") else (1e-6 if plan.recipe == "verl" else 1e-4)
    lr = peak * step / warm if step <= warm else peak * 0.5 * (1 + math.cos(math.pi * (step - warm) /
                                                                           max(plan.steps - warm, 1)))
    grad = round(0.9 * math.exp(-frac) + 0.2 + 0.05 * _noise(plan.job, step, "grad"), 4)
    step_time = round(plan.step_seconds * (1 + 0.02 * _noise(plan.job, step, "time")), 4)
    tokens = round(4096 * plan.world / step_time, 1)
    if plan.recipe == "pytorch":
        return {"loss": loss, "learning_rate": lr, "grad_norm": grad, "tokens_per_second": tokens,
                "step_time_seconds": step_time}
    if plan.recipe == "verl":
        return {"actor/pg_loss": round(loss - 1.0, 4), "actor/lr": lr, "perf/throughput": tokens,
                "timing_s/step": step_time, "critic/score/mean": round(min(1.0, frac * 0.8 + 0.1), 4)}
    return {"loss": loss, "learning_rate": lr, "grad_norm": grad, "epoch": round(frac * _epochs(plan), 4),
            "num_input_tokens_seen": float(4096 * plan.world * step)}


def _epochs(plan: Plan) -> float:
    return float(plan.invocation.settings.get("num_train_epochs") or 1.0)


def step_line(plan: Plan, step: int, metrics: dict[str, float]) -> str:
    if plan.recipe == "pytorch":
        return (f"[rank{plan.rank}] step {step}/{plan.steps} | loss {metrics['loss']:.4f} | lr "
                f"{metrics['learning_rate']:.1e} | {metrics['tokens_per_second']:.1f} tokens/s | "
                f"{metrics['step_time_seconds']:.3f} s/step")
    if plan.recipe == "verl":
        return f"step:{step} - " + " - ".join(f"{k}:{v:.4g}" for k, v in metrics.items())
    shown = {"loss": metrics["loss"], "grad_norm": metrics["grad_norm"], "learning_rate": metrics["learning_rate"],
             "epoch": metrics["epoch"], "num_input_tokens_seen": int(metrics["num_input_tokens_seen"])}
    return str(shown)


# A pod's process has MLFLOW_TRACKING_URI as its own global MLflow URI, and its pod identity's credentials. The
# sandbox runs every pod's trainer in one process: for a tracking server's ARN, each call sets the global URI
# (the sagemaker-mlflow plugin reads it for its header and signing region) under one lock, and signs with
# stand-in pod-identity credentials (the sandbox's MLflow front checks the SigV4 scope, not who signed).
_ARN_LOCK = threading.Lock()
_POD_KEY, _POD_SECRET = "ASIAPODIDENTITYSBX01", "sandbox-pod-identity"


@contextlib.contextmanager
def _as_pod(uri: str) -> Iterator[None]:
    if not uri.startswith("arn:"):
        yield
        return
    import boto3
    from mlflow.tracking._tracking_service.utils import _use_tracking_uri
    from sagemaker_mlflow.session import use_session

    session = boto3.Session(aws_access_key_id=_POD_KEY, aws_secret_access_key=_POD_SECRET,
                            region_name=uri.split(":")[3])
    with _ARN_LOCK, use_session(session), _use_tracking_uri(uri):
        yield


class _Mlflow:
    """Rank 0's MLflow logger: the run the manifest injected, one ``log_batch`` per step."""

    def __init__(self, proc: Process, plan: Plan) -> None:
        env = proc.env
        self.proc = proc
        self.run_id = env.get("MLFLOW_RUN_ID", "")
        self.uri = env.get("MLFLOW_TRACKING_URI", "")
        self.client: Any = None
        self.metric: Any = None
        self.warned = False
        if plan.rank != 0 or not self.run_id or not self.uri:
            return
        try:
            from mlflow.entities import Metric
            from mlflow.tracking import MlflowClient
        except ImportError:
            proc.log("WARNING: mlflow is not installed; metrics are not logged")
            return
        try:
            with _as_pod(self.uri):
                self.client = MlflowClient(tracking_uri=self.uri)
        except Exception as exc:  # e.g. an ARN without the sagemaker-mlflow plugin: training goes on
            proc.log(f"WARNING: MLflow client for {self.uri} failed: {type(exc).__name__}: {exc}")
            return
        self.metric = Metric

    def log(self, step: int, metrics: dict[str, float], ts: float) -> None:
        if self.client is None:
            return
        batch = [self.metric(key, float(value), int(ts * 1000), step) for key, value in metrics.items()]
        try:
            with _as_pod(self.uri):
                self.client.log_batch(self.run_id, metrics=batch)
        except Exception as exc:  # the trainer goes on, as HF's MLflow callback's failure would be logged
            if not self.warned:
                self.proc.log(f"WARNING: MLflow logging failed: {type(exc).__name__}: {exc}")
                self.warned = True


def _nccl_lines(proc: Process, plan: Plan) -> list[str]:
    host = proc.pod
    pid = 100 + plan.rank
    ip = (proc.pod_obj.get("status") or {}).get("podIP", "10.1.0.1")
    return [f"{host}:{pid}:{pid} [0] NCCL INFO Bootstrap : Using eth0:{ip}<0>",
            f"{host}:{pid}:{pid} [0] NCCL INFO NET/OFI Using aws-ofi-nccl 1.13.2",
            f"{host}:{pid}:{pid} [0] NCCL INFO NCCL version 2.23.4+cuda12.6",
            f"{host}:{pid}:{pid + 40} [0] NCCL INFO comm 0x5581f3c0 rank {plan.rank} nranks {plan.world} cudaDev 0 "
            "nvmlDev 0 busId 101c0 commId 0x6e7cbe1a59d2f8a1 - Init COMPLETE"]


def _header(proc: Process, plan: Plan, start: int) -> None:
    inv = plan.invocation
    if inv.launcher:
        proc.log(f"[{inv.launcher}] W1201 starting {plan.world // max(plan.nnodes, 1)} processes per node "
                 f"(nnodes={plan.nnodes}, node_rank={plan.rank // max(plan.world // max(plan.nnodes, 1), 1)})")
    if proc.env.get("NCCL_DEBUG", "").upper() == "INFO":
        for line in _nccl_lines(proc, plan):
            proc.log(line)
    if start:
        proc.log(f"Resuming training from checkpoint /s3/jobs/{plan.job}/checkpoints/checkpoint-{start}")
    if plan.recipe in ("llama-factory", "ms-swift") and plan.rank == 0:
        proc.log("***** Running training *****")
        proc.log(f"  Total optimization steps = {plan.steps}")


def _train_once(proc: Process, plan: Plan, mlflow: _Mlflow, run: int) -> int:
    """One run of the training process: 0 at the end, 1 when it crashes (the fault knob)."""
    owner = next((r.get("uid", "") for r in proc.pod_obj["metadata"].get("ownerReferences") or []
                  if r.get("controller")), proc.uid)
    ckey = (id(proc.cluster), plan.namespace, f"{plan.job}/{owner}")
    with _checkpoints_lock:
        start = _checkpoints.get(ckey, 0)
    _header(proc, plan, start)
    first_ts = proc.now()
    for step in range(start + 1, plan.steps + 1):
        proc.sleep(plan.step_seconds)
        if plan.fail_at and step == plan.fail_at and (plan.fail_runs < 0 or run < plan.fail_runs):
            proc.log(f"[rank{plan.rank}]: RuntimeError: CUDA error: an illegal memory access was encountered")
            proc.log(f"ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 0 "
                     f"(pid: {100 + plan.rank}) of binary: /usr/bin/python3")
            return 1
        ts = proc.now()
        metrics = step_metrics(plan, step, ts)
        if step % plan.log_every == 0 or step == plan.steps:
            if plan.rank == 0 or plan.recipe == "pytorch":
                proc.log(step_line(plan, step, metrics))
            mlflow.log(step, metrics, ts)
        # the main process writes the checkpoint, as HF Trainer and torch.save do
        if step % plan.save_every == 0 and step < plan.steps and plan.rank == 0:
            proc.log(f"Saving model checkpoint to /s3/jobs/{plan.job}/checkpoints/checkpoint-{step}")
            with _checkpoints_lock:
                _checkpoints[ckey] = max(_checkpoints.get(ckey, 0), step)
    runtime = max(proc.now() - first_ts, 1e-6)
    done = plan.steps - start
    if plan.recipe in ("llama-factory", "ms-swift"):
        final = {"train_runtime": round(runtime, 4), "train_samples_per_second": round(done * plan.world / runtime, 3),
                 "train_steps_per_second": round(done / runtime, 3)}
        if plan.rank == 0:
            proc.log(str({**final, "train_loss": step_metrics(plan, plan.steps, 0)["loss"], "epoch": _epochs(plan)}))
        mlflow.log(plan.steps, final, proc.now())
    if plan.rank == 0:
        proc.log(f"Saving model checkpoint to /s3/jobs/{plan.job}/checkpoints/checkpoint-{plan.steps}")
        proc.log(f"Training completed: {plan.steps} steps; outputs in /s3/jobs/{plan.job}/outputs")
        with _checkpoints_lock:
            _checkpoints[ckey] = plan.steps
    return 0


@program(_claims)
def train(proc: Process) -> int:
    """The program: refuse like the CLI, or train (under the HyperPod agent for ``hyperpodrun``)."""
    try:
        invocation = identify(proc.argv, proc.env)
        assert invocation is not None  # claimed by _claims
        if invocation.config_file:  # the YAML the command names, as the container sees it
            invocation = replace(invocation, settings=llamafactory_config(
                invocation.config_file, proc.read_file(invocation.config_file), invocation.settings))
    except CliError as exc:
        for line in exc.lines:
            proc.log(line)
        return exc.exit_code
    plan = plan_for(proc, invocation)
    mlflow = _Mlflow(proc, plan)
    run = proc.restart_count
    while True:
        code = _train_once(proc, plan, mlflow, run)
        if code == 0 or invocation.launcher != "hyperpodrun" or not hpto.request_restart(proc, code):
            return code
        run += 1
        proc.log(f"[HyperPodElasticAgent] process-level restart {run}: restarting workers in place")
