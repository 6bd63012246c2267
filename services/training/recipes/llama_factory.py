"""The LLaMA-Factory recipe: supervised fine-tuning (and the other stages) from a training YAML.

The YAML is rendered into a ConfigMap ``<job>-llama-factory`` mounted read-only at
``/etc/instantstart/recipe/train.yaml``, not written under the job's S3 prefix: it is then part of what the
preview shows and the dry run checks, exists before any pod starts without a write to the bucket, and goes away
with the job (the jobs verb creates it first, owned by the job). Under the launcher the entry point is
``--module llamafactory.launcher <yaml>``: exactly what ``llamafactory-cli train <yaml>`` runs under torchrun itself,
but started by the kind's launcher (HyperPod's operator requires ``hyperpodrun`` to start training, and
Kubeflow's PET_* rendezvous variables are read by torchrun, not by ``llamafactory-cli``).
"""

from __future__ import annotations

from typing import Any, Literal

import yaml
from pydantic import Field

from services.training.manifests import RenderContext, RenderedJob, labels
from services.training.recipes.base import MODEL_REF, S3_PATH, Images, PyTorchParams, Recipe
from services.training.recipes.torch_family import Entry, render_torch

IMAGES = Images(
    # the incumbent's HyperPod training image: LLaMA-Factory under /docker_workspace and hyperpod-elastic-agent
    # (public ECR gallery t5u4s6i0/hypd-training-op-torch26-pub:v0110, incumbent-instantstart.md §6.2)
    hyperpod="public.ecr.aws/t5u4s6i0/hypd-training-op-torch26-pub:v0110",
    # LLaMA-Factory's own image (Docker Hub hiyouga/llamafactory, the README's "Build with Docker"; tag = release)
    kubeflow="hiyouga/llamafactory:0.9.3",
)
CONFIG_MOUNT = "/etc/instantstart/recipe"
CONFIG_KEY = "train.yaml"
#: HF Trainer's per-logging-step line: {'loss': 1.2345, 'grad_norm': 0.87, 'learning_rate': 2e-05, ...}
STEP_PATTERN = r".*\{'loss': ([0-9.]+),.*"


class LlamaFactoryParams(PyTorchParams):
    model: str = Field(..., pattern=MODEL_REF, max_length=1024,
                       description="model: a path under /s3 (e.g. /s3/models/Qwen--Qwen3-0.6B) or a Hub id")
    dataset: str = Field(..., pattern=r"^[\w.-]+(,[\w.-]+)*$", max_length=512,
                         description="dataset name(s) from dataset_info.json in dataset_dir, comma-separated")
    dataset_dir: str = Field("/s3/datasets", pattern=S3_PATH, max_length=1024,
                             description="folder under /s3 holding dataset_info.json and the data files")
    template: str = Field(..., pattern=r"^[\w.-]+$", max_length=64,
                          description="LLaMA-Factory chat template of the model family (e.g. qwen3, llama3)")
    stage: Literal["sft", "pt", "dpo", "kto", "rm"] = Field("sft", description="training stage")
    finetuning_type: Literal["lora", "full", "freeze"] = "lora"
    lora_rank: int = Field(8, ge=1, le=1024, description="LoRA rank (finetuning_type lora)")
    learning_rate: float = Field(1e-4, gt=0, le=1)
    num_train_epochs: float = Field(3.0, gt=0, le=1000)
    max_steps: int | None = Field(None, ge=1, le=10_000_000, description="stop after this many steps "
                                                                         "(overrides num_train_epochs)")
    per_device_train_batch_size: int = Field(1, ge=1, le=1024)
    gradient_accumulation_steps: int = Field(8, ge=1, le=1024)
    cutoff_len: int = Field(2048, ge=16, le=1_048_576, description="max tokens per sample")
    logging_steps: int = Field(10, ge=1, le=100_000)
    save_steps: int = Field(500, ge=1, le=10_000_000, description="checkpoint every this many steps")
    bf16: bool = True


def train_config(params: LlamaFactoryParams, ctx: RenderContext) -> dict[str, Any]:
    config: dict[str, Any] = {
        "model_name_or_path": params.model, "trust_remote_code": True,
        "stage": params.stage, "do_train": True, "finetuning_type": params.finetuning_type,
    }
    if params.finetuning_type == "lora":
        config.update(lora_rank=params.lora_rank, lora_target="all")
    config.update({
        "dataset": params.dataset, "dataset_dir": params.dataset_dir, "template": params.template,
        "cutoff_len": params.cutoff_len, "overwrite_cache": True, "preprocessing_num_workers": 16,
        "output_dir": f"{ctx.job_dir}/checkpoints", "logging_steps": params.logging_steps,
        "save_steps": params.save_steps, "plot_loss": True, "overwrite_output_dir": False,
        "per_device_train_batch_size": params.per_device_train_batch_size,
        "gradient_accumulation_steps": params.gradient_accumulation_steps,
        "learning_rate": params.learning_rate, "num_train_epochs": params.num_train_epochs,
        "lr_scheduler_type": "cosine", "warmup_ratio": 0.1, "bf16": params.bf16, "ddp_timeout": 180000000,
        "report_to": "mlflow" if ctx.mlflow_env else "none", "run_name": ctx.job_name,
    })
    if params.max_steps is not None:
        config["max_steps"] = params.max_steps
    return config


def build(params: LlamaFactoryParams, ctx: RenderContext) -> RenderedJob:
    name = f"{ctx.job_name}-llama-factory"
    text = yaml.safe_dump(train_config(params, ctx), sort_keys=False)
    config_map = {"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": name, "namespace": ctx.namespace, "labels": labels(ctx, "llama-factory")},
                  "data": {CONFIG_KEY: text}}
    entry = Entry(args=["--module", "llamafactory.launcher", f"{CONFIG_MOUNT}/{CONFIG_KEY}"],
                  step_pattern=STEP_PATTERN, companions=[config_map], config_map=name, config_mount=CONFIG_MOUNT)
    return render_torch("llama-factory", params, ctx, IMAGES, entry)


RECIPE = Recipe(id="llama-factory", summary="LLaMA-Factory fine-tuning (SFT, pre-training, DPO, KTO, RM) from a "
                                            "rendered training YAML", kind="HyperPodPyTorchJob",
                params_model=LlamaFactoryParams, images=IMAGES, build=build)
