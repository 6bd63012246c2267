"""The VERL recipe: reinforcement learning (GRPO, PPO ...) with ``python3 -m verl.trainer.main_ppo`` and Hydra
``key=value`` overrides, as a KubeRay RayJob (always: VERL drives its workers through Ray), so it needs the KubeRay
operator."""

from __future__ import annotations

import shlex
from typing import Literal

import yaml
from pydantic import Field

from services.errors import Conflict
from services.training.manifests import (
    OPERATOR_KUBERAY,
    RAY_JOB,
    PodPlan,
    RayPlan,
    RenderContext,
    RenderedJob,
    ray_job,
)
from services.training.recipes.base import (
    MODEL_REF,
    Images,
    PlacementParams,
    Recipe,
    check_names,
    check_replicas,
    mlflow_warning,
    nproc,
    pick_type,
)

IMAGES = Images(
    # VERL's application image (vLLM + FSDP + Megatron), as named in verl's docker/README.md (verl 0.5 line)
    ray="verlai/verl:app-verl0.5-transformers4.55.4-vllm0.10.0-mcore0.13.0-te2.2",
)
#: the rayClusterSpec.rayVersion KubeRay records (it gates features by it; the image brings its own Ray)
RAY_VERSION = "2.48.0"
PARQUET = r"^/s3/\S+\.parquet$"


class VerlParams(PlacementParams):
    model: str = Field(..., pattern=MODEL_REF, max_length=1024,
                       description="actor model: a path under /s3 (e.g. /s3/models/Qwen--Qwen3-0.6B) or a Hub id")
    train_files: str = Field(..., pattern=PARQUET,
                             max_length=1024, description="training prompts: a parquet file under /s3")
    val_files: str | None = Field(None, pattern=PARQUET, max_length=1024,
                                  description="validation prompts (default: train_files)")
    adv_estimator: Literal["grpo", "gae", "rloo", "reinforce_plus_plus"] = Field(
        "grpo", description="advantage estimator: grpo (no critic) or gae (PPO with a critic of the same model)")
    learning_rate: float = Field(1e-6, gt=0, le=1, description="actor learning rate")
    total_epochs: int = Field(1, ge=1, le=1000)
    total_training_steps: int | None = Field(None, ge=1, le=10_000_000,
                                             description="stop after this many steps (overrides total_epochs)")
    train_batch_size: int = Field(256, ge=1, le=1_000_000, description="prompts per step")
    ppo_mini_batch_size: int = Field(64, ge=1, le=1_000_000)
    micro_batch_size_per_gpu: int = Field(4, ge=1, le=1024)
    max_prompt_length: int = Field(512, ge=16, le=1_048_576)
    max_response_length: int = Field(1024, ge=16, le=1_048_576)
    rollout_n: int = Field(5, ge=1, le=256, description="responses sampled per prompt (GRPO's group size)")
    rollout_engine: Literal["vllm", "sglang"] = "vllm"
    save_freq: int = Field(20, ge=-1, le=1_000_000, description="checkpoint every this many steps (-1: never)")
    test_freq: int = Field(5, ge=-1, le=1_000_000, description="validate every this many steps (-1: never)")
    max_retries: int = Field(0, ge=0, le=10, description="RayJob backoffLimit: new attempts after a failure "
                                                         "(each on a fresh Ray cluster)")


def overrides(params: VerlParams, ctx: RenderContext, nodes: int, gpus: int) -> list[str]:
    out = [f"algorithm.adv_estimator={params.adv_estimator}",
           f"data.train_files={params.train_files}", f"data.val_files={params.val_files or params.train_files}",
           f"data.train_batch_size={params.train_batch_size}",
           f"data.max_prompt_length={params.max_prompt_length}",
           f"data.max_response_length={params.max_response_length}",
           f"actor_rollout_ref.model.path={params.model}",
           f"actor_rollout_ref.actor.optim.lr={params.learning_rate}",
           f"actor_rollout_ref.actor.ppo_mini_batch_size={params.ppo_mini_batch_size}",
           f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={params.micro_batch_size_per_gpu}",
           f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={params.micro_batch_size_per_gpu}",
           f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={params.micro_batch_size_per_gpu}",
           f"actor_rollout_ref.rollout.name={params.rollout_engine}",
           f"actor_rollout_ref.rollout.n={params.rollout_n}"]
    if params.adv_estimator == "gae":
        out += [f"critic.model.path={params.model}",
                f"critic.ppo_micro_batch_size_per_gpu={params.micro_batch_size_per_gpu}"]
    out += ["trainer.logger=[console,mlflow]" if ctx.mlflow_env else "trainer.logger=[console]",
            f"trainer.project_name={ctx.namespace}", f"trainer.experiment_name={ctx.job_name}",
            f"trainer.nnodes={nodes}", f"trainer.n_gpus_per_node={gpus}",
            f"trainer.total_epochs={params.total_epochs}"]
    if params.total_training_steps is not None:
        out.append(f"trainer.total_training_steps={params.total_training_steps}")
    out += [f"trainer.save_freq={params.save_freq}", f"trainer.test_freq={params.test_freq}",
            f"trainer.default_local_dir={ctx.job_dir}/checkpoints"]
    return out


def build(params: VerlParams, ctx: RenderContext) -> RenderedJob:
    check_names(ctx)
    if OPERATOR_KUBERAY not in ctx.operators:
        raise Conflict(f"cluster {ctx.cluster} has no KubeRay operator, which VERL runs on: turn on the "
                       "kuberay_operator feature", details={"feature": "kuberay_operator"})
    warnings: list[str] = []
    facts = pick_type(params, ctx)
    check_replicas(params.replicas, facts, warnings)
    gpus = nproc(params, facts)
    mlflow_warning(ctx, warnings)
    entrypoint = shlex.join(["python3", "-m", "verl.trainer.main_ppo",
                             *overrides(params, ctx, params.replicas, gpus)])
    env_vars = {"NCCL_DEBUG": "INFO", "INSTANTSTART_JOB": ctx.job_name, "INSTANTSTART_JOB_DIR": ctx.job_dir,
                **ctx.mlflow_env}
    runtime_env = yaml.safe_dump({"env_vars": env_vars}, sort_keys=False)
    plan = PodPlan(recipe="verl", image=params.image or IMAGES.for_kind(RAY_JOB), command=[], facts=facts,
                   replicas=params.replicas, nproc_per_node=gpus)
    manifest = ray_job(ctx, plan, RayPlan(entrypoint=entrypoint, runtime_env_yaml=runtime_env,
                                          ray_version=RAY_VERSION, max_retries=params.max_retries))
    return RenderedJob(kind=RAY_JOB.kind, api_version=RAY_JOB.api_version, plural=RAY_JOB.plural,
                       manifest=manifest, warnings=warnings)


RECIPE = Recipe(id="verl", summary="VERL reinforcement learning (GRPO, PPO ...) on a KubeRay RayJob",
                kind="RayJob", params_model=VerlParams, images=IMAGES, build=build)
