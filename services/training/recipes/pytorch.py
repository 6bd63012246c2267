"""The plain PyTorch recipe: the user's training script, started by ``hyperpodrun`` (HyperPodPyTorchJob) or
``torchrun`` (Kubeflow PyTorchJob) on every node, with the script's own arguments passed through."""

from __future__ import annotations

from pydantic import Field

from services.training.manifests import LogRule, RenderContext, RenderedJob
from services.training.recipes.base import Images, PyTorchParams, Recipe
from services.training.recipes.torch_family import Entry, render_torch

IMAGES = Images(
    # the incumbent's HyperPod training image (PyTorch 2.6 with hyperpod-elastic-agent, so `hyperpodrun` exists):
    # public ECR gallery t5u4s6i0/hypd-training-op-torch26-pub, tag v0110 (incumbent-instantstart.md §6.2)
    hyperpod="public.ecr.aws/t5u4s6i0/hypd-training-op-torch26-pub:v0110",
    # the official PyTorch runtime image (Docker Hub pytorch/pytorch, tag 2.6.0-cuda12.4-cudnn9-runtime)
    kubeflow="pytorch/pytorch:2.6.0-cuda12.4-cudnn9-runtime",
)
#: the per-step line of a torch-style loop: "[rank0] step 10/100 | loss 2.3456 | ... | 0.412 s/step"
STEP_PATTERN = r".*step (\d+)/\d+ \|.*"
STEP_TIME_PATTERN = r".*\| ([0-9.]+) s/step.*"


class PyTorchScriptParams(PyTorchParams):
    script: str = Field(..., pattern=r"^/\S+\.py$", max_length=1024,
                        description="the training script: an absolute path in the image or under /s3 "
                                    "(e.g. /s3/code/train.py)")
    args: list[str] = Field(default_factory=list, max_length=200,
                            description="the script's own arguments, passed as given")
    slow_step_seconds: int | None = Field(60, ge=1, le=86400,
                                          description="slow-step rule: a step slower than this, 5 times in a row, "
                                                      "marks the job slow (None: no rule)")


def build(params: PyTorchScriptParams, ctx: RenderContext) -> RenderedJob:
    extra = [] if params.slow_step_seconds is None else [
        LogRule("SlowStep", STEP_TIME_PATTERN, metric_threshold=params.slow_step_seconds, operator="gt",
                data_points=5)]
    return render_torch("pytorch", params, ctx, IMAGES,
                        Entry(args=[params.script, *params.args], step_pattern=STEP_PATTERN, extra_rules=extra))


RECIPE = Recipe(id="pytorch", summary="your PyTorch training script on every node (torchrun / hyperpodrun)",
                kind="HyperPodPyTorchJob", params_model=PyTorchScriptParams, images=IMAGES, build=build)
