"""Rendering shared by the recipes on the PyTorch kinds (plain PyTorch, LLaMA-Factory, MS-Swift): the kind is
HyperPodPyTorchJob when HyperPod's training operator is installed, else Kubeflow's PyTorchJob; the command is the
kind's launcher (``hyperpodrun`` / ``torchrun``) followed by the recipe's entry point and its arguments."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from services.training.manifests import (
    HYPERPOD_PYTORCH_JOB,
    LogRule,
    PodPlan,
    RenderContext,
    RenderedJob,
    hyperpod_pytorch_job,
    pytorch_job,
)
from services.training.recipes.base import (
    Images,
    PyTorchParams,
    budget,
    check_names,
    check_replicas,
    hang_rules,
    launcher,
    mlflow_warning,
    nproc,
    pick_type,
    pytorch_kind,
)


@dataclass(frozen=True)
class Entry:
    """What a recipe runs under the launcher, and what it logs once per step (for HyperPod's rules)."""

    args: list[str]
    step_pattern: str
    extra_rules: list[LogRule] = field(default_factory=list)
    env: Mapping[str, str] = field(default_factory=dict)
    companions: list[dict[str, Any]] = field(default_factory=list)
    config_map: str | None = None
    config_mount: str = "/etc/instantstart/recipe"


def render_torch(recipe: str, params: PyTorchParams, ctx: RenderContext, images: Images,
                 entry: Entry) -> RenderedJob:
    check_names(ctx)
    warnings: list[str] = []
    kind = pytorch_kind(ctx, warnings)
    facts = pick_type(params, ctx)
    check_replicas(params.replicas, facts, warnings)
    procs = nproc(params, facts)
    mlflow_warning(ctx, warnings)
    plan = PodPlan(recipe=recipe, image=params.image or images.for_kind(kind),
                   command=[*launcher(kind, params.replicas, procs), *entry.args], facts=facts,
                   replicas=params.replicas, nproc_per_node=procs, env=entry.env, config_map=entry.config_map,
                   config_mount=entry.config_mount)
    if kind is HYPERPOD_PYTORCH_JOB:
        rules = [*hang_rules(params, entry.step_pattern), *entry.extra_rules]
        manifest = hyperpod_pytorch_job(ctx, plan, budget(params), rules)
    else:
        manifest = pytorch_job(ctx, plan, params.max_retries)
    return RenderedJob(kind=kind.kind, api_version=kind.api_version, plural=kind.plural, manifest=manifest,
                       companions=entry.companions, warnings=warnings)
