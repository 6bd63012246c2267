"""How each job kind reads (``services/training/jobs_kinds.py``): one phase vocabulary from three operators'
statuses, restarts against each kind's budget, ranks from the operators' pod names and labels, a user's manifest
made ours, and the MLflow env injected into the main containers only."""

from __future__ import annotations

from typing import Any

import pytest

from services.clock import Clock
from services.errors import Invalid
from services.stages import StageContext
from services.training.jobs_kinds import (
    KINDS,
    budget,
    config_map_refs,
    failure_reason,
    inject_env,
    phase,
    prepare_manifest,
    rank_of,
)
from services.training.jobs_models import JobPlan
from services.training.jobs_stages import injected_env
from tests.jobs_support import hppj, rayjob

HPPJ, PTJ, RAY = KINDS["HyperPodPyTorchJob"], KINDS["PyTorchJob"], KINDS["RayJob"]


def cond(*types: str, **extra: str) -> dict[str, Any]:
    return {"status": {"conditions": [{"type": t, "status": "True", **extra} for t in types]}}


@pytest.mark.parametrize(("obj", "expected"), [
    ({}, "Pending"),
    (cond("Created"), "Pending"),
    (cond("Created", "Running"), "Running"),
    (cond("PodsRunning"), "Running"),
    (cond("Running", "Restarting"), "Restarting"),
    (cond("Suspended"), "Suspended"),
    (cond("Completed"), "Succeeded"),
    (cond("Running", "Failed"), "Failed"),
    ({"spec": {"runPolicy": {"suspend": True}}}, "Suspended"),
])
def test_the_pytorch_kinds_normalise_their_conditions(obj: dict[str, Any], expected: str) -> None:
    assert phase(HPPJ, obj) == expected and phase(PTJ, obj) == expected


@pytest.mark.parametrize(("status", "expected"), [
    ({}, "Pending"), ({"jobDeploymentStatus": "Initializing"}, "Pending"),
    ({"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}, "Running"),
    ({"jobDeploymentStatus": "Retrying"}, "Restarting"), ({"jobDeploymentStatus": "Suspended"}, "Suspended"),
    ({"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}, "Succeeded"),
    ({"jobDeploymentStatus": "Failed", "message": "backoffLimit reached"}, "Failed"),
])
def test_a_rayjob_reads_its_deployment_and_job_status(status: dict[str, Any], expected: str) -> None:
    assert phase(RAY, {"status": status}) == expected


def test_failure_reasons_come_from_the_failed_condition_or_the_rayjob_message() -> None:
    failed = cond("Failed", reason="NodeFault", message="budget exhausted")
    assert failure_reason(HPPJ, failed) == "NodeFault: budget exhausted"
    assert failure_reason(HPPJ, cond("Running")) is None
    assert failure_reason(RAY, {"status": {"jobDeploymentStatus": "Failed", "message": "driver exited 1"}}) == \
        "driver exited 1"
    assert failure_reason(RAY, {"status": {"jobDeploymentStatus": "Running", "message": "fine"}}) is None


def test_restarts_are_read_against_each_kinds_budget() -> None:
    job = {**hppj(), "status": {"restartCount": 3, "restartStatus": {"fullJobRestartCount": 1}}}
    assert budget(HPPJ, job) | {"source": ""} == {"used": 3, "limit": 5, "full_job_restarts_used": 1,
                                                  "full_job_restarts_limit": 1, "source": ""}
    annotated = {"metadata": {"annotations": {"sagemaker.amazonaws.com/enable-job-auto-resume": "true",
                                              "sagemaker.amazonaws.com/job-max-retry-count": "4"}}}
    assert (budget(PTJ, annotated, pod_restarts=2)["used"], budget(PTJ, annotated)["limit"]) == (2, 4)
    assert budget(PTJ, {}, pod_restarts=1)["limit"] is None, "no auto-resume: no budget"
    assert (budget(RAY, {**rayjob(), "status": {"failed": 1}})["used"], budget(RAY, rayjob())["limit"]) == (1, 2)
    assert budget(RAY, {**rayjob(), "status": {"failed": 3}})["used"] == 2, "the last failed try is no retry"


def test_ranks_follow_the_operators_names_and_labels() -> None:
    job = {"metadata": {"name": "j"}, "spec": {"replicaSpecs": [{"name": "a", "replicas": 2},
                                                                {"name": "b", "replicas": 3}]}}
    assert rank_of(HPPJ, job, {"metadata": {"name": "j-a-1"}}) == ("a", 1)
    assert rank_of(HPPJ, job, {"metadata": {"name": "j-b-0"}}) == ("b", 2)

    def kubeflow(kind: str, index: str) -> dict[str, Any]:
        return {"metadata": {"labels": {"training.kubeflow.org/replica-type": kind,
                                        "training.kubeflow.org/replica-index": index}}}
    assert rank_of(PTJ, {}, kubeflow("master", "0")) == ("master", 0)
    assert rank_of(PTJ, {}, kubeflow("worker", "2")) == ("worker", 3)
    assert rank_of(RAY, {}, {"metadata": {"labels": {"ray.io/node-type": "head"}}}) == ("head", 0)
    assert rank_of(RAY, {}, {"metadata": {"labels": {"ray.io/node-type": "worker", "ray.io/group": "gpu"}}}) == \
        ("gpu", None)
    assert rank_of(RAY, {}, {"metadata": {"labels": {"job-name": "j"}}}) == ("submitter", None)


def test_a_manifest_is_made_ours_and_env_goes_to_the_main_containers_only() -> None:
    manifest = rayjob()
    manifest["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"].append(
        {"name": "sidecar", "image": "busybox"})
    manifest["spec"]["submitterPodTemplate"] = {"spec": {"containers": [{"name": "submitter", "image": "ray"}]}}
    kind, made = prepare_manifest(manifest, "verl", "hyperpod-ns-x", "verl", "instantstart-training")
    assert made["metadata"] == {"name": "verl", "namespace": "hyperpod-ns-x", "labels": {
        "app.kubernetes.io/managed-by": "instantstart", "instantstart.io/job": "verl",
        "instantstart.io/recipe": "verl"}}
    head = made["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]
    assert head["metadata"]["labels"]["instantstart.io/job"] == "verl"
    assert head["spec"]["serviceAccountName"] == "instantstart-training"
    assert "metadata" not in manifest["spec"]["rayClusterSpec"]["headGroupSpec"]["template"], "the input is untouched"
    env = {"MLFLOW_RUN_ID": "r1", "MLFLOW_TRACKING_URI": "arn:aws:sagemaker:us-west-2:1:mlflow-tracking-server/x"}
    injected = inject_env(kind, made, env)
    containers = {c["name"]: c.get("env") for t in (
        injected["spec"]["rayClusterSpec"]["headGroupSpec"]["template"],
        injected["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"],
        injected["spec"]["submitterPodTemplate"]) for c in t["spec"]["containers"]}
    assert containers["ray-head"] == containers["ray-worker"] == [
        {"name": "MLFLOW_RUN_ID", "value": "r1"}, {"name": "MLFLOW_TRACKING_URI", "value": env["MLFLOW_TRACKING_URI"]}]
    assert containers["sidecar"] is None, "a sidecar is no main container"
    assert containers["submitter"] == containers["ray-head"], "a template without a main container: its first one"
    with pytest.raises(Invalid, match="namespace"):
        prepare_manifest({**hppj(), "metadata": {"namespace": "default"}}, "j", "hyperpod-ns-x", "manifest", "sa")
    with pytest.raises(Invalid, match="apiVersion"):
        prepare_manifest({**hppj(), "apiVersion": "sagemaker.amazonaws.com/v2"}, "j", "ns", "manifest", "sa")
    with pytest.raises(Invalid, match="no pod template"):
        prepare_manifest({**hppj(), "spec": {"replicaSpecs": []}}, "j", "ns", "manifest", "sa")


def test_the_env_earlier_submit_stages_return_is_what_the_create_stage_injects() -> None:
    """The slot for the MLflow run's stage (wired by the composition root): its result's ``env``."""
    plan = JobPlan(cluster="c", region="us-west-2", name="j", namespace="ns", recipe="manifest", kind="RayJob",
                   plural="rayjobs", api_version="ray.io/v1", manifest=rayjob())
    ctx = StageContext(operation_id="op", kind="job.submit", target="cluster/c/job/j", request=plan, data={},
                       results={"namespace": {"namespace": "ns"}, "mlflow": {"env": {"MLFLOW_RUN_ID": "r1"}}},
                       clock=Clock(), attempt=0)
    assert injected_env(ctx) == {"MLFLOW_RUN_ID": "r1"}


def test_every_config_map_reference_of_every_pod_template_is_found_and_renamable() -> None:
    """A clone points each reference at its own copy: mounted, projected, envFrom and single keys, init
    containers too (the clone used to rename only plain configMap volumes)."""
    template = {"spec": {
        "volumes": [{"name": "a", "configMap": {"name": "j-cfg"}},
                    {"name": "b", "projected": {"sources": [{"configMap": {"name": "j-proj"}},
                                                            {"secret": {"name": "s"}}]}},
                    {"name": "c", "emptyDir": {}}],
        "initContainers": [{"name": "init", "envFrom": [{"configMapRef": {"name": "j-init"}}]}],
        "containers": [{"name": "main", "envFrom": [{"secretRef": {"name": "s"}}, {"configMapRef": {"name": "j-env"}}],
                        "env": [{"name": "K", "valueFrom": {"configMapKeyRef": {"name": "j-key", "key": "k"}}},
                                {"name": "V", "value": "plain"}]}]}}
    manifest = {"apiVersion": "sagemaker.amazonaws.com/v1", "kind": "HyperPodPyTorchJob",
                "spec": {"replicaSpecs": [{"name": "pods", "template": template}]}}
    refs = config_map_refs(HPPJ, manifest)
    assert sorted(r["name"] for r in refs) == ["j-cfg", "j-env", "j-init", "j-key", "j-proj"]
    for ref in refs:
        ref["name"] = "copy-" + ref["name"]
    spec = manifest["spec"]["replicaSpecs"][0]["template"]["spec"]  # type: ignore[index]
    assert spec["volumes"][1]["projected"]["sources"][0]["configMap"]["name"] == "copy-j-proj"
    assert spec["containers"][0]["env"][0]["valueFrom"]["configMapKeyRef"] == {"name": "copy-j-key", "key": "k"}
    assert spec["initContainers"][0]["envFrom"][0]["configMapRef"]["name"] == "copy-j-init"
