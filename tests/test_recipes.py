"""Recipes render the manifests they promise, byte for byte.

Each recipe x kind renders identically to ``tests/data/golden/<recipe>-<kind>.yaml`` (the custom resource, then
its companions, as YAML documents). After an intended change, rewrite the goldens with
``INSTANTSTART_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_recipes.py`` and review the diff. Each golden
validates against its CRD schema (the copies the product ships); bad input is a 422 naming the field, a missing
operator a 409 naming the feature; every pod template carries the contract's labels, mounts and env.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.errors import Conflict, Invalid
from services.training import RECIPES, InstanceFacts, RenderContext, render
from services.training.manifests import EFA, GPU, JOB_LABEL, MANAGED_BY, RECIPE_LABEL
from services.training.validate import check_schema, schema_errors

GOLDEN = Path(__file__).parent / "data" / "golden"
ALL = frozenset({"hyperpod-training-operator", "kubeflow", "kuberay"})
NO_HPTO = frozenset({"kubeflow", "kuberay"})
TYPES = {"ml.g5.8xlarge": InstanceFacts("ml.g5.8xlarge", nodes=2, schedulable=2, gpus=1, efa=1),
         "ml.p5.48xlarge": InstanceFacts("ml.p5.48xlarge", nodes=4, schedulable=3, gpus=8, efa=32)}
MLFLOW = {"MLFLOW_TRACKING_URI": "arn:aws:sagemaker:us-west-2:123456789012:mlflow-tracking-server/hp-eks-mlflow",
          "MLFLOW_RUN_ID": "0123456789abcdef0123456789abcdef", "MLFLOW_EXPERIMENT_NAME": "hyperpod-ns-training"}
PARAMS: dict[str, dict[str, Any]] = {
    "pytorch": {"script": "/s3/code/train.py", "args": ["--max_steps", "100", "--lr", "1e-4"],
                "instance_type": "ml.p5.48xlarge", "replicas": 2},
    "llama-factory": {"model": "/s3/models/Qwen--Qwen3-0.6B", "dataset": "alpaca_en_demo", "template": "qwen3",
                      "instance_type": "ml.p5.48xlarge", "replicas": 2, "max_steps": 200},
    "ms-swift": {"model": "/s3/models/Qwen--Qwen3-0.6B", "dataset": ["/s3/datasets/sft.jsonl"],
                 "instance_type": "ml.g5.8xlarge", "replicas": 2, "command": "sft"},
    "verl": {"model": "/s3/models/Qwen--Qwen3-0.6B", "train_files": "/s3/datasets/gsm8k/train.parquet",
             "val_files": "/s3/datasets/gsm8k/test.parquet", "instance_type": "ml.p5.48xlarge", "replicas": 2},
}
CASES = [("pytorch", ALL), ("pytorch", NO_HPTO), ("llama-factory", ALL), ("llama-factory", NO_HPTO),
         ("ms-swift", ALL), ("ms-swift", NO_HPTO), ("verl", ALL)]


def ctx(operators: frozenset[str] = ALL, mlflow: dict[str, str] | None = None, job: str = "demo") -> RenderContext:
    return RenderContext(cluster="hp-eks", namespace="hyperpod-ns-training", job_name=job, instance_types=TYPES,
                         operators=operators, mlflow_env=MLFLOW if mlflow is None else mlflow)


def documents(recipe: str, operators: frozenset[str]) -> tuple[str, str]:
    rendered = render(recipe, PARAMS[recipe], ctx(operators))
    text = yaml.safe_dump_all([rendered.manifest, *rendered.companions], sort_keys=False, width=120)
    return rendered.kind, text


def pod_templates(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    spec = manifest["spec"]
    if manifest["kind"] == "HyperPodPyTorchJob":
        return [r["template"] for r in spec["replicaSpecs"]]
    if manifest["kind"] == "PyTorchJob":
        return [r["template"] for r in spec["pytorchReplicaSpecs"].values()]
    cluster = spec["rayClusterSpec"]
    return [cluster["headGroupSpec"]["template"], *[g["template"] for g in cluster["workerGroupSpecs"]],
            spec["submitterPodTemplate"]]


@pytest.mark.parametrize(("recipe", "operators"), CASES)
def test_golden(recipe: str, operators: frozenset[str]) -> None:
    kind, text = documents(recipe, operators)
    path = GOLDEN / f"{recipe}-{kind}.yaml"
    if os.environ.get("INSTANTSTART_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.exists(), f"no golden {path.name}: run with INSTANTSTART_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{path.name} changed: review, then rewrite with INSTANTSTART_UPDATE_GOLDEN=1"


def test_every_golden_is_a_case_and_validates_against_its_crd_schema() -> None:
    expected = {f"{r}-{documents(r, ops)[0]}.yaml" for r, ops in CASES}
    assert {p.name for p in GOLDEN.glob("*.yaml")} == expected
    for path in sorted(GOLDEN.glob("*.yaml")):
        manifest = next(yaml.safe_load_all(path.read_text()))
        assert schema_errors(manifest) == [], path.name
        check_schema(manifest)


def test_schema_check_names_the_bad_field() -> None:
    manifest = render("pytorch", PARAMS["pytorch"], ctx()).manifest
    manifest["spec"]["runPolicy"]["restartPolicy"]["evalPeriodSeconds"] = "six hours"
    manifest["spec"]["runPolicy"]["logMonitoringConfiguration"][0]["operator"] = "greater"
    with pytest.raises(Invalid) as caught:
        check_schema(manifest)
    fields = {e["field"] for e in caught.value.details["fields"]}
    assert fields == {"spec.runPolicy.restartPolicy.evalPeriodSeconds",
                      "spec.runPolicy.logMonitoringConfiguration.0.operator"}
    ray = render("verl", PARAMS["verl"], ctx()).manifest
    ray["spec"]["shutdownAfterJobFinishes"] = "yes"
    assert [e["field"] for e in schema_errors(ray)] == ["spec.shutdownAfterJobFinishes"]


@pytest.mark.parametrize(("recipe", "operators"), CASES)
def test_contract_labels_mounts_env_and_devices(recipe: str, operators: frozenset[str]) -> None:
    rendered = render(recipe, PARAMS[recipe], ctx(operators))
    wanted = {MANAGED_BY: "instantstart", JOB_LABEL: "demo", RECIPE_LABEL: recipe}
    assert rendered.manifest["metadata"]["labels"] == wanted
    assert rendered.manifest["metadata"]["namespace"] == "hyperpod-ns-training"
    facts = TYPES[PARAMS[recipe]["instance_type"]]
    for template in pod_templates(rendered.manifest):
        assert template["metadata"]["labels"] == wanted
        spec = template["spec"]
        assert spec["serviceAccountName"] == "instantstart-training"
        if recipe == "verl" and spec["containers"][0]["name"] == "ray-job-submitter":
            continue
        claims = {v["name"]: v for v in spec["volumes"]}
        assert claims["shared"]["persistentVolumeClaim"]["claimName"] == "shared-s3"
        assert claims["shm"]["emptyDir"] == {"medium": "Memory"}
        main = spec["containers"][0]
        assert {"name": "shared", "mountPath": "/s3"} in main["volumeMounts"]
        env = {e["name"]: e["value"] for e in main["env"]}
        assert env["INSTANTSTART_JOB"] == "demo" and env["INSTANTSTART_JOB_DIR"] == "/s3/jobs/demo"
        assert env["NCCL_DEBUG"] == "INFO" and env["FI_PROVIDER"] == "efa"
        assert {k: env[k] for k in MLFLOW} == MLFLOW
        assert main["resources"]["requests"] == main["resources"]["limits"] == {GPU: str(facts.gpus),
                                                                                EFA: str(facts.efa)}
        assert spec["nodeSelector"] == {"node.kubernetes.io/instance-type": facts.instance_type}
        node = spec["affinity"]["nodeAffinity"]
        required = node["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
        assert required["matchExpressions"] == [{"key": "sagemaker.amazonaws.com/node-health-status",
                                                 "operator": "In", "values": ["Schedulable"]}]
        preferred = node["preferredDuringSchedulingIgnoredDuringExecution"][0]
        assert preferred["weight"] == 100
        assert preferred["preference"]["matchExpressions"][0]["values"] == ["Passed"]


def test_hyperpod_job_recovery_budget_and_log_rules() -> None:
    spec = render("pytorch", PARAMS["pytorch"], ctx()).manifest["spec"]
    assert spec["nprocPerNode"] == "8" and spec["replicaSpecs"][0]["replicas"] == 2
    policy = spec["runPolicy"]
    assert policy["jobMaxRetryCount"] == 5
    assert policy["restartPolicy"] == {"numRestartBeforeFullJobRestart": 3, "evalPeriodSeconds": 21600,
                                       "maxFullJobRestarts": 1}
    rules = {r["name"]: r for r in policy["logMonitoringConfiguration"]}
    assert rules["JobStart"]["expectedStartCutOffInSeconds"] == 1800
    assert rules["JobHangingDetection"]["expectedRecurringFrequencyInSeconds"] == 1800
    assert rules["SlowStep"]["operator"] == "gt" and rules["SlowStep"]["metricThreshold"] == 60
    import re

    line = "[rank0] step 10/100 | loss 2.3456 | lr 1.0e-04 | 12345.6 tokens/s | 0.412 s/step"
    assert re.match(rules["JobHangingDetection"]["logPattern"], line).group(1) == "10"  # type: ignore[union-attr]
    assert re.match(rules["SlowStep"]["logPattern"], line).group(1) == "0.412"  # type: ignore[union-attr]
    container = spec["replicaSpecs"][0]["template"]["spec"]["containers"][0]
    assert container["ports"] == [{"containerPort": 8080, "name": "hp-agent"}]
    assert container["command"][:7] == ["hyperpodrun", "--nnodes=2", "--nproc-per-node=8", "--server-host=0.0.0.0",
                                        "--server-port=8080", "--tee=3", "--log_dir=/tmp/hyperpod"]
    hf = render("llama-factory", PARAMS["llama-factory"], ctx()).manifest["spec"]["runPolicy"]
    hf_line = "{'loss': 1.2345, 'grad_norm': 0.87, 'learning_rate': 2e-05, 'epoch': 0.12}"
    assert re.match(hf["logMonitoringConfiguration"][1]["logPattern"], hf_line)


def test_kubeflow_fallback_is_said_and_carries_auto_resume() -> None:
    rendered = render("pytorch", PARAMS["pytorch"], ctx(NO_HPTO))
    assert rendered.kind == "PyTorchJob"
    assert any("HyperPod training operator is not installed" in w for w in rendered.warnings)
    meta = rendered.manifest["metadata"]
    assert meta["annotations"] == {"sagemaker.amazonaws.com/enable-job-auto-resume": "true",
                                   "sagemaker.amazonaws.com/job-max-retry-count": "5"}
    specs = rendered.manifest["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["replicas"] == 1 and specs["Worker"]["replicas"] == 1
    assert {s["restartPolicy"] for s in specs.values()} == {"OnFailure"}
    assert specs["Master"]["template"]["spec"]["containers"][0]["command"][0] == "torchrun"


def test_llama_factory_yaml_is_a_config_map_the_pods_mount() -> None:
    rendered = render("llama-factory", PARAMS["llama-factory"], ctx())
    (config_map,) = rendered.companions
    assert config_map["metadata"]["name"] == "demo-llama-factory"
    train = yaml.safe_load(config_map["data"]["train.yaml"])
    assert train["output_dir"] == "/s3/jobs/demo/checkpoints" and train["report_to"] == "mlflow"
    assert train["max_steps"] == 200 and train["dataset_dir"] == "/s3/datasets"
    pod = rendered.manifest["spec"]["replicaSpecs"][0]["template"]["spec"]
    assert {"name": "recipe-config", "configMap": {"name": "demo-llama-factory"}} in pod["volumes"]
    command = pod["containers"][0]["command"]
    assert command[-3:] == ["--module", "llamafactory.launcher", "/etc/instantstart/recipe/train.yaml"]
    untracked = render("llama-factory", PARAMS["llama-factory"], ctx(mlflow={}))
    assert yaml.safe_load(untracked.companions[0]["data"]["train.yaml"])["report_to"] == "none"
    assert any("no MLflow tracking server" in w for w in untracked.warnings)


def test_verl_entrypoint_and_ray_cluster() -> None:
    spec = render("verl", PARAMS["verl"], ctx()).manifest["spec"]
    words = shlex.split(spec["entrypoint"])
    assert words[:3] == ["python3", "-m", "verl.trainer.main_ppo"]
    settings = dict(w.split("=", 1) for w in words[3:])
    assert settings["trainer.nnodes"] == "2" and settings["trainer.n_gpus_per_node"] == "8"
    assert settings["trainer.logger"] == "[console,mlflow]"
    assert settings["trainer.default_local_dir"] == "/s3/jobs/demo/checkpoints"
    assert yaml.safe_load(spec["runtimeEnvYAML"])["env_vars"]["MLFLOW_RUN_ID"] == MLFLOW["MLFLOW_RUN_ID"]
    assert spec["shutdownAfterJobFinishes"] is True and spec["ttlSecondsAfterFinished"] == 3600
    cluster = spec["rayClusterSpec"]
    assert cluster["headGroupSpec"]["template"]["spec"]["containers"][0]["name"] == "ray-head"
    (group,) = cluster["workerGroupSpecs"]
    assert group["groupName"] == "gpu" and group["replicas"] == 1
    assert group["template"]["spec"]["containers"][0]["name"] == "ray-worker"


@pytest.mark.parametrize(("recipe", "params", "field"), [
    ("pytorch", {"script": "/s3/code/train.py", "replica": 2}, "params.replica"),
    ("pytorch", {"script": "train.py"}, "params.script"),
    ("pytorch", {"args": []}, "params.script"),
    ("llama-factory", {**PARAMS["llama-factory"], "learning_rate": -1}, "params.learning_rate"),
    ("llama-factory", {**PARAMS["llama-factory"], "dataset_dir": "/data"}, "params.dataset_dir"),
    ("ms-swift", {**PARAMS["ms-swift"], "command": "rlhf"}, "params"),
    ("verl", {**PARAMS["verl"], "train_files": "/s3/train.json"}, "params.train_files"),
])
def test_bad_params_are_422_naming_the_field(recipe: str, params: dict[str, Any], field: str) -> None:
    with pytest.raises(Invalid) as caught:
        render(recipe, params, ctx())
    assert caught.value.http_status == 422
    assert field in [e["field"] for e in caught.value.details["fields"]], caught.value.details
    assert field in caught.value.message


def test_unknown_field_suggests_the_known_one() -> None:
    with pytest.raises(Invalid, match="Did you mean 'replicas'"):
        render("pytorch", {"script": "/s3/code/train.py", "replica": 2}, ctx())


def test_cluster_checks_name_the_alternatives() -> None:
    with pytest.raises(Invalid, match=r"no ml\.p4d\.24xlarge nodes; it has: ml\.g5\.8xlarge \(2 nodes, 1 GPUs each\), "
                                      r"ml\.p5\.48xlarge"):
        render("pytorch", {**PARAMS["pytorch"], "instance_type": "ml.p4d.24xlarge"}, ctx())
    with pytest.raises(Invalid, match=r"choose one of the cluster's instance types") as several:
        render("pytorch", {"script": "/s3/code/train.py"}, ctx())
    assert several.value.details["choices"] == ["ml.g5.8xlarge", "ml.p5.48xlarge"]
    with pytest.raises(Invalid, match=r"replicas <= 4") as too_many:
        render("pytorch", {**PARAMS["pytorch"], "replicas": 5}, ctx())
    assert too_many.value.details["fields"][0]["field"] == "params.replicas"
    with pytest.raises(Invalid, match=r"nproc_per_node <= 1"):
        render("ms-swift", {**PARAMS["ms-swift"], "nproc_per_node": 2}, ctx())
    assert any("only 3 of 4 ml.p5.48xlarge nodes are Schedulable" in w
               for w in render("pytorch", {**PARAMS["pytorch"], "replicas": 4}, ctx()).warnings)
    with pytest.raises(Invalid, match=r"name: 'Demo_1'"):
        render("pytorch", PARAMS["pytorch"], ctx(job="Demo_1"))
    with pytest.raises(Invalid, match=r"unknown recipe 'torch'; recipes: pytorch, llama-factory, ms-swift, verl"):
        render("torch", {}, ctx())


def test_missing_operators_are_409_naming_the_feature() -> None:
    with pytest.raises(Conflict, match="kuberay_operator") as ray:
        render("verl", PARAMS["verl"], ctx(frozenset({"hyperpod-training-operator", "kubeflow"})))
    assert ray.value.http_status == 409
    with pytest.raises(Conflict, match="hyperpod_training_operator"):
        render("pytorch", PARAMS["pytorch"], ctx(frozenset({"kuberay"})))


def test_instance_facts_come_from_node_capacity() -> None:
    def node(name: str, kind: str, gpus: int, efa: int, health: str | None, cordoned: bool = False) -> dict[str, Any]:
        labels = {"node.kubernetes.io/instance-type": kind}
        if health:
            labels["sagemaker.amazonaws.com/node-health-status"] = health
        return {"metadata": {"name": name, "labels": labels}, "spec": {"unschedulable": cordoned},
                "status": {"capacity": {GPU: str(gpus), EFA: str(efa), "cpu": "32"},
                           "conditions": [{"type": "Ready", "status": "True"}]}}

    facts = InstanceFacts.from_nodes([node("a", "ml.g5.12xlarge", 4, 1, "Schedulable"),
                                      node("b", "ml.g5.12xlarge", 4, 1, "UnschedulablePendingReboot"),
                                      node("c", "ml.g5.12xlarge", 4, 1, "Schedulable", cordoned=True),
                                      node("d", "ml.m5.xlarge", 0, 0, None),
                                      {"metadata": {"name": "e", "labels": {}}, "status": {}}])
    assert facts == {"ml.g5.12xlarge": InstanceFacts("ml.g5.12xlarge", nodes=3, schedulable=1, gpus=4, efa=1),
                     "ml.m5.xlarge": InstanceFacts("ml.m5.xlarge", nodes=1, schedulable=1)}


def test_every_recipe_lists_a_schema_and_pinned_images() -> None:
    for recipe in RECIPES.values():
        schema = recipe.params_model.model_json_schema()
        assert schema["additionalProperties"] is False, recipe.id
        assert recipe.images.as_dict(), recipe.id
        assert all(":" in image.rsplit("/", 1)[-1] for image in recipe.images.as_dict().values()), recipe.id


def test_commands_pass_the_recorded_cli_specs() -> None:
    """The sandbox's simulated workloads check commands against recorded CLI specs, and recognise each recipe's
    program behind its launcher (``--module llamafactory.launcher``, ``--module swift.cli.sft``); so do we."""
    from sandbox.kube import training_cli as cli

    for recipe, operators in CASES:
        rendered = render(recipe, PARAMS[recipe], ctx(operators))
        for template in pod_templates(rendered.manifest):
            main = template["spec"]["containers"][0]
            if "command" in main:
                assert cli.check(main["command"]) == [], (recipe, main["command"])
                found = cli.identify(main["command"], {})
                assert found is not None and found.recipe == recipe, (recipe, found)
        if recipe == "verl":
            assert cli.check(shlex.split(rendered.manifest["spec"]["entrypoint"])) == []
        if recipe == "ms-swift":
            command = rendered.manifest["spec"].get("replicaSpecs", [{}])[0]
            args = (command.get("template") or pod_templates(rendered.manifest)[0])["spec"]["containers"][0]["command"]
            module = args.index("--module")
            cli.check_swift(args[module + 1].rsplit(".", 1)[-1], args[module + 2:])
        if recipe == "llama-factory":
            cli.check_llamafactory(yaml.safe_load(rendered.companions[0]["data"]["train.yaml"]))
