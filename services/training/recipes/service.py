"""The recipes noun: list the recipes and preview a job on a cluster (render, schema check, server-side dry run;
nothing is created). Previewing reads the cluster (its nodes from the watch cache, which training CRDs are
installed) and calls its API server, so it needs the operator role."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from kubernetes import client as k8s

from services.auth import Principal, Role
from services.clusters.registry import ClusterRegistry
from services.errors import NotFound, Transient
from services.informers import Informers
from services.kube import KubeClients
from services.training.jobs import RenderRequest
from services.training.manifests import (
    OPERATOR_HPTO,
    OPERATOR_KUBEFLOW,
    OPERATOR_KUBERAY,
    InstanceFacts,
    RenderContext,
    RenderedJob,
)
from services.training.recipes import RECIPES, recipe_of, render
from services.training.recipes.models import Preview, PreviewRequest, RecipeInfo, RecipeList
from services.training.validate import check_schema, dry_run
from services.verbs import verb

#: the CRD whose presence means the operator is installed
OPERATOR_CRDS: dict[str, str] = {OPERATOR_HPTO: "hyperpodpytorchjobs.sagemaker.amazonaws.com",
                                 OPERATOR_KUBEFLOW: "pytorchjobs.kubeflow.org",
                                 OPERATOR_KUBERAY: "rayjobs.ray.io"}
SYNC_SECONDS = 10.0
#: where a dry run goes while the job's namespace does not exist yet (submit creates it)
FALLBACK_NAMESPACE = "default"
#: (cluster, namespace, job) -> the MLflow env a preview shows (the lead wires the MLflow service in)
MlflowEnv = Callable[[str, str, str], Mapping[str, str]]


def recipe_list() -> RecipeList:
    return RecipeList(recipes=[RecipeInfo(id=r.id, kind=r.kind, summary=r.summary,
                                          params_schema=r.params_model.model_json_schema(),
                                          images=r.images.as_dict()) for r in RECIPES.values()])


class Recipes:
    noun = "recipes"

    def __init__(self, registry: ClusterRegistry, informers: Informers, kube: KubeClients,
                 mlflow_env: MlflowEnv | None = None) -> None:
        self.registry = registry
        self.informers = informers
        self.kube = kube
        self.mlflow_env = mlflow_env

    @verb(Role.VIEWER)
    def list_recipes(self, principal: Principal) -> RecipeList:
        """Every recipe with its kind, parameter schema and pinned images."""
        return recipe_list()

    def operators(self, cluster: str) -> set[str]:
        """The training operators whose CRDs the cluster serves."""
        api = k8s.ApiextensionsV1Api(self.kube.api_client(cluster))
        found: set[str] = set()
        for operator, crd in OPERATOR_CRDS.items():
            try:
                api.read_custom_resource_definition(crd)
            except NotFound:
                continue
            found.add(operator)
        return found

    def instance_types(self, cluster: str) -> dict[str, InstanceFacts]:
        informer = self.informers.get(cluster, "nodes")
        if not informer.wait_synced(SYNC_SECONDS):
            raise Transient(f"the nodes of {cluster} have not been listed yet ({informer.error or 'listing'}); "
                            "ask again shortly", delay=2.0)
        return InstanceFacts.from_nodes(informer.items())

    def context(self, cluster: str, namespace: str, name: str) -> RenderContext:
        """What a job on ``cluster`` is rendered against, read now."""
        env = dict(self.mlflow_env(cluster, namespace, name)) if self.mlflow_env else {}
        return RenderContext(cluster=cluster, namespace=namespace, job_name=name,
                             instance_types=self.instance_types(cluster), operators=frozenset(self.operators(cluster)),
                             mlflow_env=env)

    def render_job(self, request: RenderRequest) -> RenderedJob:
        """The jobs noun's renderer (``job.submit``): the recipe rendered for the cluster's nodes and the operators
        the jobs noun found, checked against its CRD schema. The MLflow variables are not rendered here: the
        submit operation's MLflow stage makes the run and injects them when it creates the resource."""
        recipe_of(request.recipe)
        ctx = RenderContext(cluster=request.cluster, namespace=request.namespace, job_name=request.name,
                            instance_types=self.instance_types(request.cluster), operators=request.operators,
                            service_account=request.service_account)
        rendered = render(request.recipe, request.params, ctx)
        check_schema(rendered.manifest)
        return rendered

    @verb(Role.OPERATOR)
    def preview(self, principal: Principal, cluster: str, request: PreviewRequest) -> Preview:
        """Render ``request`` for ``cluster``, check it against its CRD schema and with a server-side dry run;
        create nothing."""
        self.registry.get(cluster)
        recipe_of(request.recipe)
        rendered = render(request.recipe, request.params, self.context(cluster, request.namespace, request.name))
        check_schema(rendered.manifest)
        warnings = list(rendered.warnings)
        target = request.namespace
        try:
            k8s.CoreV1Api(self.kube.api_client(cluster)).read_namespace(request.namespace)
        except NotFound:
            target = FALLBACK_NAMESPACE
            warnings.append(f"namespace {request.namespace} does not exist yet (submit creates it): the dry run ran "
                            f"in {FALLBACK_NAMESPACE}")
        dry_run(self.kube.api_client(cluster), rendered, target)
        return Preview(cluster=cluster, recipe=request.recipe, kind=rendered.kind, api_version=rendered.api_version,
                       plural=rendered.plural, namespace=request.namespace, manifest=rendered.manifest,
                       companions=rendered.companions, warnings=warnings, dry_run_namespace=target)
