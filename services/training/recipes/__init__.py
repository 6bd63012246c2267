"""Training recipes: a typed parameter model, pinned images and a renderer per recipe, behind one entry point.

``render(recipe, params, ctx)`` checks the parameters (422 naming each bad field, with did-you-mean hints for
unknown ones) and what they ask of the cluster (instance type present, enough nodes, the operator the kind needs:
422 / 409 naming the valid alternatives), then returns the custom resource to submit. It never reads the cluster
itself: the caller's :class:`RenderContext` says what is there.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from services.errors import Invalid
from services.models import field_errors
from services.training.manifests import RenderContext, RenderedJob
from services.training.recipes import llama_factory, ms_swift, pytorch, verl
from services.training.recipes.base import Recipe

RECIPES: dict[str, Recipe] = {r.id: r for r in (pytorch.RECIPE, llama_factory.RECIPE, ms_swift.RECIPE,
                                                verl.RECIPE)}


def recipe_of(recipe: str) -> Recipe:
    found = RECIPES.get(recipe)
    if found is None:
        raise Invalid(f"recipe: unknown recipe {recipe!r}; recipes: {', '.join(RECIPES)}",
                      details={"fields": [{"field": "recipe", "message": "unknown recipe", "type": "enum"}],
                               "choices": list(RECIPES)})
    return found


def parse_params(recipe: Recipe, params: dict[str, Any] | BaseModel | None) -> BaseModel:
    """The recipe's parameter model from a dict (or a model of another type, re-read as a dict)."""
    model = recipe.params_model
    if isinstance(params, model):
        return params
    data = params.model_dump(exclude_unset=True) if isinstance(params, BaseModel) else (params or {})
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = [{**e, "field": f"params.{e['field']}" if e["field"] != "(body)" else "params"}
                  for e in field_errors(model, exc)]
        summary = "; ".join(f"{e['field']}: {e['message']}" for e in errors[:5])
        raise Invalid(f"invalid {recipe.id} parameters: {summary}", details={"fields": errors}) from None


def render(recipe: str, params: dict[str, Any] | BaseModel | None, ctx: RenderContext) -> RenderedJob:
    """The job ``recipe`` renders for ``params`` in ``ctx`` (raises Invalid / Conflict; nothing is sent)."""
    found = recipe_of(recipe)
    return found.build(parse_params(found, params), ctx)


__all__ = ["RECIPES", "Recipe", "RenderContext", "RenderedJob", "parse_params", "recipe_of", "render"]
