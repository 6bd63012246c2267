"""Request and response models of the recipes noun (shared by REST, MCP and panes)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from services.models import TRAINING_NAMESPACE, RequestModel, ResponseModel

DEFAULT_NAMESPACE = TRAINING_NAMESPACE


class RecipeInfo(ResponseModel):
    id: str = Field(..., description="the recipe id to preview or submit with (pytorch, llama-factory, ms-swift, "
                                     "verl)")
    kind: str = Field(..., description="the custom resource it renders: HyperPodPyTorchJob (PyTorchJob where the "
                                       "HyperPod training operator is not installed) or RayJob")
    summary: str
    params_schema: dict[str, Any] = Field(..., description="JSON schema of the recipe's params")
    images: dict[str, str] = Field(..., description="the pinned image per kind")


class RecipeList(ResponseModel):
    recipes: list[RecipeInfo]


class PreviewRequest(RequestModel):
    recipe: str = Field(..., min_length=1, max_length=64, description="recipe id (recipes_list)")
    name: str = Field(..., min_length=1, max_length=52, description="the job's name (DNS-1123 label)")
    namespace: str = Field(DEFAULT_NAMESPACE, min_length=1, max_length=63,
                           description="namespace the job runs in (HyperPod auto-resume wants a hyperpod- prefix "
                                       "or kubeflow)")
    params: dict[str, Any] = Field(default_factory=dict, description="the recipe's parameters (its params_schema "
                                                                     "in recipes_list)")


class Preview(ResponseModel):
    cluster: str
    recipe: str
    kind: str
    api_version: str
    plural: str
    namespace: str
    manifest: dict[str, Any] = Field(..., description="the custom resource submit would create")
    companions: list[dict[str, Any]] = Field(default_factory=list,
                                             description="objects created with it (a recipe's ConfigMap)")
    warnings: list[str] = Field(default_factory=list, description="choices made for you, and why")
    dry_run_namespace: str = Field(..., description="where the server-side dry run ran (the job's namespace, or "
                                                    "default while the job's namespace does not exist yet)")
