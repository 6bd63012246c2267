"""Training: jobs (any of the three job kinds) and, beside them, the recipes that render their manifests."""

# ----- jobs (services/training/jobs*.py) -----
from services.training.jobs import Jobs, Rendered, Renderer, RenderRequest, digest_line
from services.training.jobs_stages import DELETE_KIND, RESUME_KIND, SUBMIT_KIND, SUSPEND_KIND

__all__ = ["DELETE_KIND", "RESUME_KIND", "SUBMIT_KIND", "SUSPEND_KIND", "Jobs", "RenderRequest", "Rendered", "Renderer",
           "digest_line"]
