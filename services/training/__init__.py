"""Training on HyperPod: recipes render jobs (``recipes/``) as the custom resources ``manifests.py`` builds,
checked by ``validate.py`` before anything is sent; the jobs noun submits and follows them."""

from services.training.manifests import InstanceFacts, RenderContext, RenderedJob
from services.training.recipes import RECIPES, Recipe, render

__all__ = ["RECIPES", "InstanceFacts", "Recipe", "RenderContext", "RenderedJob", "render"]
