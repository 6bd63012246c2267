"""Previewing jobs against a seeded, imported sandbox cluster: the training CRDs installed on it (as the operators'
add-ons install them), each recipe is rendered from what the cluster really has (its nodes' instance type and
devices, which CRDs it serves), checked against its schema and dry-run on its API server, through REST and through
a real MCP client; the dry run stores nothing."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from kubernetes import client as k8s
from mcp import Client, StdioServerParameters

from sandbox.kube.components import load_component_crds
from services.errors import Invalid, NotFound
from services.training import InstanceFacts, RenderContext, render
from services.training.validate import dry_run
from tests.conftest import OPERATOR
from tests.node_support import node_cluster
from tests.sandbox_support import SeededServer
from tests.support import ROOT, clean_env

pytestmark = pytest.mark.slow
CLUSTER = "hp-eks"
CRD_API = ("apiextensions.k8s.io", "v1", "customresourcedefinitions")
PREVIEW = f"/api/v1/clusters/{CLUSTER}/jobs/preview"
PARAMS: dict[str, dict[str, Any]] = {
    "pytorch": {"script": "/s3/code/train.py", "args": ["--max_steps", "20"], "replicas": 2},
    "llama-factory": {"model": "/s3/models/Qwen--Qwen3-0.6B", "dataset": "alpaca_en_demo", "template": "qwen3"},
    "ms-swift": {"model": "/s3/models/Qwen--Qwen3-0.6B", "dataset": ["/s3/datasets/sft.jsonl"]},
    "verl": {"model": "/s3/models/Qwen--Qwen3-0.6B", "train_files": "/s3/datasets/gsm8k/train.parquet"},
}


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SeededServer, k8s.ApiClient]]:
    """The seeded cluster, imported, with the CRDs the HyperPod training operator and KubeRay add-ons install."""
    folder = tmp_path_factory.mktemp("recipes")
    with node_cluster(folder, 2) as server, server.imported(folder / "product", CLUSTER, OPERATOR) as product:
        api = product.kube.api_client(CLUSTER)
        objects = k8s.CustomObjectsApi(api)
        for component in ("hyperpod-training-operator", "kuberay"):
            for crd in load_component_crds(component):
                try:
                    objects.get_cluster_custom_object(*CRD_API, crd["metadata"]["name"])
                except NotFound:
                    objects.create_cluster_custom_object(*CRD_API, crd)
        yield server, api


def test_recipes_list_shows_schemas_and_images(seeded: tuple[SeededServer, k8s.ApiClient]) -> None:
    server, _ = seeded
    listed = server.live.get("/api/v1/recipes")
    assert listed.status_code == 200, listed.text
    recipes = {r["id"]: r for r in listed.json()["recipes"]}
    assert sorted(recipes) == ["llama-factory", "ms-swift", "pytorch", "verl"]
    assert recipes["verl"]["kind"] == "RayJob" and recipes["verl"]["images"]["RayJob"].startswith("verlai/verl:")
    assert "script" in recipes["pytorch"]["params_schema"]["required"]


@pytest.mark.parametrize("recipe", sorted(PARAMS))
def test_preview_renders_from_the_cluster_and_dry_runs(seeded: tuple[SeededServer, k8s.ApiClient],
                                                       recipe: str) -> None:
    server, api = seeded
    answer = server.live.post(PREVIEW, {"recipe": recipe, "name": f"pv-{recipe}", "params": PARAMS[recipe]})
    assert answer.status_code == 200, answer.text
    preview = answer.json()
    assert preview["kind"] == ("RayJob" if recipe == "verl" else "HyperPodPyTorchJob")
    text = json.dumps(preview["manifest"])
    assert '"node.kubernetes.io/instance-type": "ml.g5.8xlarge"' in text  # the seeded nodes' type, found alone
    assert '"nvidia.com/gpu": "1"' in text and '"vpc.amazonaws.com/efa": "1"' in text  # their capacity
    assert preview["dry_run_namespace"] == "default"  # the job namespace is made at submit
    assert any("does not exist yet" in w for w in preview["warnings"])
    plural = preview["plural"]
    group, version = preview["api_version"].split("/")
    stored = k8s.CustomObjectsApi(api).list_namespaced_custom_object(group, version, "default", plural)
    assert stored["items"] == []  # a dry run stores nothing
    assert k8s.CoreV1Api(api).list_namespaced_config_map("default", label_selector="instantstart.io/job").items == []


def test_preview_refusals(seeded: tuple[SeededServer, k8s.ApiClient]) -> None:
    live = seeded[0].live
    too_many = live.post(PREVIEW, {"recipe": "pytorch", "name": "pv-big", "params": {**PARAMS["pytorch"],
                                                                                     "replicas": 3}})
    assert too_many.status_code == 422, too_many.text
    assert "the cluster has 2" in too_many.json()["error"]["message"]
    unknown = live.post(PREVIEW, {"recipe": "pytorch", "name": "pv-x", "params": {"script": "/s3/a.py",
                                                                                  "instance_type": "ml.p5.48xlarge"}})
    assert unknown.status_code == 422 and "it has: ml.g5.8xlarge" in unknown.json()["error"]["message"]
    viewer = live.make_token("viewer")
    denied = live.post(PREVIEW, {"recipe": "pytorch", "name": "pv-v", "params": PARAMS["pytorch"]}, token=viewer)
    assert denied.status_code == 403, denied.text


def test_each_recipe_previews_through_a_real_mcp_client(seeded: tuple[SeededServer, k8s.ApiClient]) -> None:
    live = seeded[0].live
    params = StdioServerParameters(command=sys.executable, args=["-m", "app.cli", "mcp", "--url", live.url,
                                                                 "--toolsets", "jobs,system"],
                                   env={**clean_env(), "INSTANTSTART_TOKEN": live.make_token("operator")},
                                   cwd=str(ROOT))

    async def agent() -> dict[str, str]:
        kinds: dict[str, str] = {}
        async with Client(params) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            assert {"recipes_list", "jobs_preview"} <= names
            for recipe, values in PARAMS.items():
                result = await client.call_tool("jobs_preview", {"cluster": CLUSTER, "recipe": recipe,
                                                                 "name": f"mcp-{recipe}", "params": values})
                text = "".join(getattr(c, "text", "") for c in result.content)
                assert not result.is_error, text[:2000]
                answer = dict(result.structured_content or json.loads(text))
                kinds[recipe] = answer["kind"]
                assert answer["manifest"]["metadata"]["labels"]["instantstart.io/recipe"] == recipe
        return kinds

    assert anyio.run(agent) == {"pytorch": "HyperPodPyTorchJob", "llama-factory": "HyperPodPyTorchJob",
                                "ms-swift": "HyperPodPyTorchJob", "verl": "RayJob"}


def test_dry_run_rejections_come_back_with_the_api_servers_causes(seeded: tuple[SeededServer, k8s.ApiClient]) -> None:
    _, api = seeded
    facts = InstanceFacts("ml.g5.8xlarge", nodes=2, schedulable=2, gpus=1, efa=1)
    context = RenderContext(CLUSTER, "default", "pv-broken", {facts.instance_type: facts},
                            frozenset({"hyperpod-training-operator"}))
    rendered = render("pytorch", PARAMS["pytorch"], context)
    rendered.manifest["spec"]["runPolicy"]["jobMaxRetryCount"] = "five"  # what the schema check would also refuse
    with pytest.raises(Invalid) as caught:
        dry_run(api, rendered, "default")
    assert caught.value.http_status == 422
    assert "spec.runPolicy.jobMaxRetryCount" in {c["field"] for c in caught.value.details["causes"]}
    assert k8s.CustomObjectsApi(api).list_namespaced_custom_object(
        "sagemaker.amazonaws.com", "v1", "default", "hyperpodpytorchjobs")["items"] == []
