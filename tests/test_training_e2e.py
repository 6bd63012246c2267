"""Training end to end: each recipe, submitted through REST on a seeded, imported cluster whose sandbox runs the
training operators (HyperPod training operator, Kubeflow, KubeRay), renders from what the cluster has, passes its
CRD schema and the API server's dry run, is run by the sandbox's operator and simulated trainer (which checks the
rendered command against the real CLI's flags) to completion; its logs read back through the text route, and
deleting it archives them to the shared bucket first."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from tests.jobs_support import BASE, BUCKET, CLUSTER, NS, JobWorld, job_world
from tests.ledger import CallLedger
from tests.mcp_support import bridge, call, follow, playbook_tools
from tests.node_support import aws
from tests.support import wait_until

pytestmark = pytest.mark.slow
PARAMS: dict[str, dict[str, Any]] = {
    "pytorch": {"script": "/s3/code/train.py", "args": ["--max_steps", "20"], "replicas": 2},
    "llama-factory": {"model": "/s3/models/Qwen--Qwen3-0.6B", "dataset": "alpaca_en_demo", "template": "qwen3"},
    "ms-swift": {"model": "/s3/models/Qwen--Qwen3-0.6B", "dataset": ["/s3/datasets/sft.jsonl"]},
    "verl": {"model": "/s3/models/Qwen--Qwen3-0.6B", "train_files": "/s3/datasets/gsm8k/train.parquet"},
}
PLAYBOOK = Path(__file__).resolve().parents[1] / "skills" / "train-model.md"
KINDS = {"pytorch": "HyperPodPyTorchJob", "llama-factory": "HyperPodPyTorchJob", "ms-swift": "HyperPodPyTorchJob",
         "verl": "RayJob"}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, mlflow_url: str) -> Iterator[JobWorld]:
    with job_world(tmp_path_factory.mktemp("e2e"), ("hyperpod-training-operator", "training-operator",
                                                     "kuberay")) as made:
        aws(made.server, "s3").create_bucket(Bucket=BUCKET, CreateBucketConfiguration={
            "LocationConstraint": "us-west-2"})
        yield made


def _phase(world: JobWorld, name: str) -> dict[str, Any] | None:
    got = world.live.get(f"{BASE}/{name}")
    assert got.status_code == 200, got.text
    detail = dict(got.json())
    return detail if detail["phase"] in ("Succeeded", "Failed") else None


@pytest.mark.parametrize("recipe", sorted(PARAMS))
def test_each_recipe_runs_to_completion_through_rest(world: JobWorld, recipe: str) -> None:
    name = f"e2e-{recipe}"
    answer = world.live.post(BASE, {"recipe": recipe, "name": name, "params": PARAMS[recipe]})
    assert answer.status_code == 202, answer.text
    op = world.finished(str(answer.json()["operation"]["id"]), timeout=300)
    assert op["status"] == "succeeded", (op.get("error"), op.get("stages"))
    assert world.job(KINDS[recipe], name)["metadata"]["labels"]["instantstart.io/recipe"] == recipe
    detail = wait_until(lambda: _phase(world, name), 300, f"{name} to finish")
    assert detail["phase"] == "Succeeded", detail
    text = world.live.get(f"{BASE}/{name}/logs", params={"tail": 200})
    assert text.status_code == 200, text.text
    assert "loss" in text.text, text.text[-2000:]
    assert "unrecognized arguments" not in text.text


def test_an_agent_runs_each_recipe_to_completion_with_the_playbooks_tools(world: JobWorld) -> None:
    """skills/train-model.md through a real MCP client: per recipe, the preview, the submit, the operation, then
    polling the job's digest until it ends."""
    playbook = playbook_tools(PLAYBOOK)
    used: list[str] = []

    async def agent() -> dict[str, dict[str, Any]]:
        ended: dict[str, dict[str, Any]] = {}
        async with bridge(world.live.url, world.live.make_token("operator"),
                          "jobs,features,clusters,operations,system") as client:
            recipes = await call(client, "recipes_list", {}, used)
            assert sorted(r["id"] for r in recipes["recipes"]) == sorted(PARAMS), recipes
            for recipe, params in sorted(PARAMS.items()):
                request = {"cluster": CLUSTER, "name": f"mcp-{recipe}", "recipe": recipe, "params": params}
                preview = await call(client, "jobs_preview", request, used)
                assert preview["kind"] == KINDS[recipe], preview
                started = await call(client, "jobs_submit", request, used)
                assert (await follow(client, started["operation"]["id"], used))["status"] == "succeeded"
                with anyio.fail_after(300):
                    while (digest := await call(client, "jobs_digest", {"cluster": CLUSTER, "job": f"mcp-{recipe}"},
                                                used))["phase"] not in ("Succeeded", "Failed"):
                        await anyio.sleep(0.5)
                ended[recipe] = digest
        return ended

    ended = anyio.run(agent)
    assert {r: d["phase"] for r, d in ended.items()} == dict.fromkeys(sorted(PARAMS), "Succeeded"), ended
    for recipe, kind in KINDS.items():
        assert world.job(kind, f"mcp-{recipe}")["metadata"]["labels"]["instantstart.io/recipe"] == recipe
    assert set(used) <= playbook, f"tools outside the playbook: {set(used) - playbook}"


def test_a_clone_gets_its_own_copy_of_the_recipes_config_map(world: JobWorld) -> None:
    """LLaMA-Factory's training YAML is a ConfigMap the source job owns; the clone mounts a copy it owns, so
    deleting the source (the garbage collector takes its ConfigMap) leaves the clone whole."""
    answer = world.live.post(BASE, {"recipe": "llama-factory", "name": "lf-source", "params": PARAMS["llama-factory"]})
    assert answer.status_code == 202, answer.text
    assert world.finished(str(answer.json()["operation"]["id"]), timeout=300)["status"] == "succeeded"
    key = {"Idempotency-Key": "clone-lf-source-once"}
    cloned = world.live.post(f"{BASE}/lf-source/clone", {"name": "lf-copy"}, headers=key)
    assert cloned.status_code == 202, cloned.text
    assert world.finished(str(cloned.json()["operation"]["id"]), timeout=300)["status"] == "succeeded"
    clone = world.job("HyperPodPyTorchJob", "lf-copy")
    pod = clone["spec"]["replicaSpecs"][0]["template"]["spec"]
    assert [v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v] == ["lf-copy-llama-factory"], pod
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert (env["INSTANTSTART_JOB"], env["INSTANTSTART_JOB_DIR"]) == ("lf-copy", "/s3/jobs/lf-copy")
    source_map = world.core.read_namespaced_config_map("lf-source-llama-factory", NS)
    copy_map = world.core.read_namespaced_config_map("lf-copy-llama-factory", NS)
    assert copy_map.data == {k: v.replace("/s3/jobs/lf-source/", "/s3/jobs/lf-copy/")
                             for k, v in source_map.data.items()}
    assert "output_dir: /s3/jobs/lf-copy/checkpoints" in copy_map.data["train.yaml"], copy_map.data
    assert [(o.kind, o.name, o.uid) for o in copy_map.metadata.owner_references] == [
        ("HyperPodPyTorchJob", "lf-copy", clone["metadata"]["uid"])]
    gone = httpx2.delete(world.live.url + f"{BASE}/lf-source", headers=world.live.headers(), timeout=30)
    assert gone.status_code == 202, gone.text
    assert world.finished(str(gone.json()["operation"]["id"]), timeout=300)["status"] == "succeeded"
    # a retry of the clone (its answer lost) answers the first operation, though the source is gone now
    again = world.live.post(f"{BASE}/lf-source/clone", {"name": "lf-copy"}, headers=key)
    assert again.status_code == 202 and again.json()["operation"]["id"] == cloned.json()["operation"]["id"], again.text
    assert [m.metadata.name for m in world.core.list_namespaced_config_map(NS).items
            if m.metadata.name.startswith("lf-")] == ["lf-copy-llama-factory"], "the source's went with it"
    assert world.core.read_namespaced_config_map("lf-copy-llama-factory", NS).data == copy_map.data
    detail = wait_until(lambda: _phase(world, "lf-copy"), 300, "the clone to finish")
    assert detail["phase"] == "Succeeded", detail


def test_a_config_map_of_the_jobs_name_that_is_not_its_own_is_refused_before_anything_is_made(
        world: JobWorld) -> None:
    """The pods mount the recipe's ConfigMap by name: one that exists already (someone's, or a deleted job's the
    garbage collector has not taken) would be read as the job's own, so submit refuses it, making nothing."""
    if NS not in [n.metadata.name for n in world.core.list_namespace().items]:  # this test may run first
        world.core.create_namespace({"metadata": {"name": NS}})
    world.core.create_namespaced_config_map(NS, {"metadata": {"name": "lf-taken-llama-factory"},
                                                 "data": {"train.yaml": "someone else's"}})
    ledger = CallLedger(world.live)
    mark = ledger.mark()
    answer = world.live.post(BASE, {"recipe": "llama-factory", "name": "lf-taken", "params": PARAMS["llama-factory"]})
    assert answer.status_code == 409, answer.text
    error = answer.json()["error"]
    assert "ConfigMap hyperpod-ns-training/lf-taken-llama-factory already exists (owned by nothing)" in error["message"]
    assert error["details"]["config_map"] == "lf-taken-llama-factory"
    ledger.assert_no_writes(since=mark)
    assert world.core.read_namespaced_config_map("lf-taken-llama-factory", NS).data == {
        "train.yaml": "someone else's"}


def test_deleting_a_finished_job_archives_its_logs_first(world: JobWorld) -> None:
    name = "e2e-archive"
    answer = world.live.post(BASE, {"recipe": "pytorch", "name": name, "params": PARAMS["pytorch"]})
    assert answer.status_code == 202, answer.text
    assert world.finished(str(answer.json()["operation"]["id"]), timeout=300)["status"] == "succeeded"
    wait_until(lambda: _phase(world, name), 300, f"{name} to finish")
    gone = httpx2.delete(world.live.url + f"{BASE}/{name}", headers=world.live.headers(), timeout=30)
    assert gone.status_code == 202, gone.text
    op = world.finished(str(gone.json()["operation"]["id"]), timeout=300)
    assert op["status"] == "succeeded", op
    archived = world.stage(op["id"], "archive-logs")
    assert archived["status"] == "succeeded", archived
    keys = [o["Key"] for o in aws(world.server, "s3").list_objects_v2(Bucket=BUCKET).get("Contents", [])]
    assert any(f"/jobs/{name}/logs/" in k and k.endswith(".log.gz") for k in keys), keys


def test_a_job_logs_its_metrics_to_the_clusters_tracking_server(world: JobWorld) -> None:
    """With a tracking server, submit makes the job's run and injects it; the sandbox's trainer finds the run only
    through those variables and logs through the sagemaker-mlflow plugin; the product reads the numbers back."""
    made = world.live.post(f"/api/v1/clusters/{CLUSTER}/mlflow", {"size": "Small"})
    assert made.status_code == 202, made.text
    assert world.finished(str(made.json()["operation"]["id"]), timeout=300)["status"] == "succeeded"
    name = "e2e-metrics"
    answer = world.live.post(BASE, {"recipe": "pytorch", "name": name, "params": PARAMS["pytorch"]})
    assert answer.status_code == 202, answer.text
    op = world.finished(str(answer.json()["operation"]["id"]), timeout=300)
    assert op["status"] == "succeeded", op
    env = {e["name"]: e.get("value") for e in
           world.job("HyperPodPyTorchJob", name)["spec"]["replicaSpecs"][0]["template"]["spec"]["containers"][0]["env"]}
    assert env["MLFLOW_TRACKING_URI"].startswith("arn:aws:sagemaker:") and env["MLFLOW_RUN_ID"]
    wait_until(lambda: _phase(world, name), 300, f"{name} to finish")

    seen: dict[str, Any] = {}

    def logged() -> dict[str, Any] | None:
        got = world.live.get(f"{BASE}/{name}/metrics")
        assert got.status_code == 200, got.text
        seen.update(got.json())
        series = {s["name"]: s["points"] for s in got.json()["series"]}
        # throughput comes in the same batches as loss but is its own series: wait for both
        return series if min(len(series.get(n, [])) for n in ("loss", "throughput")) >= 20 else None
    try:
        series = wait_until(logged, 120, f"{name}'s metrics")
    except AssertionError as exc:  # say what the trainer printed about MLflow
        text = world.live.get(f"{BASE}/{name}/logs", params={"tail": 40}).text
        raise AssertionError(f"{exc}; last read {str(seen)[:1500]}; the job's last log lines: {text}") from exc
    assert [p["step"] for p in series["loss"]] == list(range(1, 21))
    assert [p["step"] for p in series["throughput"]] == list(range(1, 21))
    assert all(p["value"] > 0 for p in series["throughput"])
