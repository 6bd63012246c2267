"""The MS-Swift recipe: ``swift sft|pt|rlhf`` with its command-line flags.

Under the launcher the entry point is ``--module swift.cli.<command>``: what ``swift <command>`` itself runs under
torchrun (``swift/cli/sft.py`` ...), started by the kind's launcher so HyperPod's agent (``hyperpodrun``) and
Kubeflow's PET_* rendezvous variables (read by torchrun) apply; the flags are swift's own.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, model_validator

from services.training.manifests import RenderContext, RenderedJob
from services.training.recipes.base import MODEL_REF, Images, PyTorchParams, Recipe
from services.training.recipes.torch_family import Entry, render_torch

IMAGES = Images(
    # the incumbent's HyperPod training image (ms-swift recipes and hyperpod-elastic-agent;
    # public ECR gallery t5u4s6i0/hypd-training-op-torch26-pub:v0110, incumbent-instantstart.md §6.2)
    hyperpod="public.ecr.aws/t5u4s6i0/hypd-training-op-torch26-pub:v0110",
    # ModelScope's ms-swift image as listed in ms-swift's SWIFT-installation docs (swift 3.10.1, us-west-1 mirror)
    kubeflow="modelscope-registry.us-west-1.cr.aliyuncs.com/modelscope-repo/modelscope:"
             "ubuntu22.04-cuda12.8.1-py311-torch2.8.0-vllm0.11.0-modelscope1.31.0-swift3.10.1",
)
#: HF Trainer's per-logging-step dict, which swift prints too: {'loss': 1.2345, 'grad_norm': ...}
STEP_PATTERN = r".*\{'loss': ([0-9.]+),.*"
_DATASET = r"^(/s3/\S+|[A-Za-z0-9][\w.-]*/[\w.-]+(#\d+)?)$"


class MsSwiftParams(PyTorchParams):
    command: Literal["sft", "pt", "rlhf"] = Field("sft", description="swift sft, swift pt or swift rlhf")
    rlhf_type: Literal["dpo", "orpo", "simpo", "kto", "cpo", "grpo"] | None = Field(
        None, description="the RLHF algorithm (command rlhf only; required there)")
    model: str = Field(..., pattern=MODEL_REF, max_length=1024,
                       description="model: a path under /s3 or a ModelScope / Hub id")
    dataset: list[str] = Field(..., min_length=1, max_length=32,
                               description="datasets: files under /s3 (jsonl/json/csv) or hub ids (id#samples)")
    train_type: Literal["lora", "full"] = "lora"
    lora_rank: int = Field(8, ge=1, le=1024)
    learning_rate: float = Field(1e-4, gt=0, le=1)
    num_train_epochs: float = Field(1.0, gt=0, le=1000)
    max_steps: int | None = Field(None, ge=1, le=10_000_000)
    per_device_train_batch_size: int = Field(1, ge=1, le=1024)
    gradient_accumulation_steps: int = Field(16, ge=1, le=1024)
    max_length: int = Field(2048, ge=16, le=1_048_576)
    logging_steps: int = Field(5, ge=1, le=100_000)
    save_steps: int = Field(500, ge=1, le=10_000_000)
    torch_dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"

    @model_validator(mode="after")
    def _rlhf(self) -> MsSwiftParams:
        if self.command == "rlhf" and self.rlhf_type is None:
            raise ValueError("rlhf_type is required with command rlhf (dpo, orpo, simpo, kto, cpo, grpo)")
        if self.command != "rlhf" and self.rlhf_type is not None:
            raise ValueError(f"rlhf_type applies to command rlhf only, not {self.command}")
        for item in self.dataset:
            if not re.match(_DATASET, item):
                raise ValueError(f"dataset {item!r}: a path under /s3 or a hub id (org/name[#samples])")
        return self


def swift_args(params: MsSwiftParams, ctx: RenderContext) -> list[str]:
    args = [f"swift.cli.{params.command}"]
    if params.rlhf_type:
        args += ["--rlhf_type", params.rlhf_type]
    args += ["--model", params.model, "--dataset", *params.dataset, "--train_type", params.train_type]
    if params.train_type == "lora":
        args += ["--lora_rank", str(params.lora_rank)]
    args += ["--torch_dtype", params.torch_dtype, "--learning_rate", str(params.learning_rate),
             "--num_train_epochs", str(params.num_train_epochs)]
    if params.max_steps is not None:
        args += ["--max_steps", str(params.max_steps)]
    args += ["--per_device_train_batch_size", str(params.per_device_train_batch_size),
             "--gradient_accumulation_steps", str(params.gradient_accumulation_steps),
             "--max_length", str(params.max_length), "--logging_steps", str(params.logging_steps),
             "--save_steps", str(params.save_steps), "--output_dir", f"{ctx.job_dir}/checkpoints",
             "--add_version", "false", "--report_to", "mlflow" if ctx.mlflow_env else "none",
             "--run_name", ctx.job_name]
    return args


def build(params: MsSwiftParams, ctx: RenderContext) -> RenderedJob:
    entry = Entry(args=["--module", *swift_args(params, ctx)], step_pattern=STEP_PATTERN)
    return render_torch("ms-swift", params, ctx, IMAGES, entry)


RECIPE = Recipe(id="ms-swift", summary="MS-Swift fine-tuning: swift sft, pt or rlhf (DPO, ORPO, SimPO, KTO, CPO, "
                                       "GRPO) with its flags", kind="HyperPodPyTorchJob",
                params_model=MsSwiftParams, images=IMAGES, build=build)
