"""Training on HyperPod: recipes render jobs (``recipes/``) as the custom resources ``manifests.py`` builds,
checked by ``validate.py`` before anything is sent; the jobs noun (``jobs*.py``) submits and follows them, in
any of the three job kinds; ``downloads.py`` brings the models they start from."""

from services.training.jobs import Jobs, Rendered, Renderer, RenderRequest, digest_line
from services.training.jobs_stages import DELETE_KIND, RESUME_KIND, SUBMIT_KIND, SUSPEND_KIND
from services.training.manifests import InstanceFacts, RenderContext, RenderedJob
from services.training.recipes import RECIPES, Recipe, render

__all__ = ["DELETE_KIND", "RECIPES", "RESUME_KIND", "SUBMIT_KIND", "SUSPEND_KIND", "InstanceFacts", "Jobs", "Recipe",
           "RenderContext", "RenderRequest", "Rendered", "RenderedJob", "Renderer", "digest_line", "render"]
