"""REST routes of the recipes noun: list the training recipes, and preview a job on a cluster (rendered,
checked against its CRD schema and dry-run on the API server; nothing is created). Each handler is one verb call
in ``services/training/recipes``."""

from __future__ import annotations

from app.api.base import Call, Reply, Route
from services.training.recipes.models import Preview, PreviewRequest, RecipeList
from services.training.recipes.service import Recipes
from services.verbs import role_of

CLUSTER = {"cluster": "name the cluster is registered under (clusters_list)"}


def _list(call: Call) -> Reply:
    return Reply(call.services.recipes.list_recipes(call.principal))


def _preview(call: Call) -> Reply:
    return Reply(call.services.recipes.preview(call.principal, call.path["cluster"], call.body))


ROUTES: list[Route] = [
    Route("GET", "/api/v1/recipes", "recipes_list", "The training recipes", role_of(Recipes.list_recipes), _list,
          response=RecipeList, tag="jobs",
          description="Each recipe (pytorch, llama-factory, ms-swift, verl): the custom resource it renders, a "
                      "summary, the JSON schema of its params and its pinned images. Read this before "
                      "jobs_preview / submitting a job."),
    Route("POST", "/api/v1/clusters/{cluster}/jobs/preview", "jobs_preview", "Preview a training job's manifest",
          role_of(Recipes.preview), _preview, body=PreviewRequest, response=Preview, path_params=CLUSTER,
          tag="jobs", open_world=True,
          description="Render a recipe for this cluster (instance type present, replicas within its nodes, the "
                      "HyperPod training operator or else Kubeflow, KubeRay for verl), check the manifest against "
                      "its CRD schema and with a server-side dry run, and return it with the warnings about "
                      "choices made. Creates nothing; bad params answer 422 naming the field."),
]
