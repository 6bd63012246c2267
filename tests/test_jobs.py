"""The jobs noun through REST against a real server in sandbox mode, on a seeded, imported cluster with the job
CRDs installed. The test plays the operator (this branch's sandbox runs none): it writes the job's status and
makes its pods with the operator's names and labels, then asserts what the Kubernetes API received and what list,
describe and the digest show. Refusals are checked on the call ledger: zero writes."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest

from tests.jobs_support import BASE, BUCKET, CLUSTER, NS, JobWorld, hppj, job_world, rayjob
from tests.ledger import CallLedger
from tests.support import ROOT, clean_env, wait_until

pytestmark = pytest.mark.slow
OURS = {"app.kubernetes.io/managed-by": "instantstart", "instantstart.io/job": "llama-sft",
        "instantstart.io/recipe": "manifest"}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JobWorld]:
    with job_world(tmp_path_factory.mktemp("jobs")) as made:
        yield made


def submit(world: JobWorld, body: dict[str, Any]) -> httpx2.Response:
    return world.live.post(BASE, body)


def operation_of(response: httpx2.Response) -> str:
    assert response.status_code == 202, response.text
    return str(response.json()["operation"]["id"])


def describe(world: JobWorld, name: str) -> dict[str, Any]:
    got = world.live.get(f"{BASE}/{name}")
    assert got.status_code == 200, got.text
    return dict(got.json())


def test_refusals_come_before_any_write(world: JobWorld) -> None:
    ledger = CallLedger(world.live)
    mark = ledger.mark()
    bad_name = submit(world, {"name": "Llama_SFT", "manifest": hppj()})
    assert bad_name.status_code == 422 and "DNS-1123" in bad_name.text
    wrong_kind = submit(world, {"name": "a-job", "manifest": {"apiVersion": "batch/v1", "kind": "Job", "spec": {}}})
    assert wrong_kind.status_code == 422 and "HyperPodPyTorchJob" in wrong_kind.text
    no_ray = submit(world, {"name": "a-job", "manifest": rayjob()})
    assert no_ray.status_code == 409 and "kuberay_operator" in no_ray.json()["error"]["message"], no_ray.text
    other_ns = submit(world, {"name": "a-job", "manifest": {**hppj(), "metadata": {"namespace": "kube-system"}}})
    assert other_ns.status_code == 422 and "namespace" in other_ns.text
    unknown_recipe = submit(world, {"name": "a-job", "recipe": "pytorch", "params": {"script": "train.py"}})
    assert unknown_recipe.status_code == 422 and "manifest" in unknown_recipe.text
    ledger.assert_no_writes(since=mark, service="kubernetes")
    assert world.live.get("/api/v1/operations?kind=job.submit").json() == []
    # the API server's dry run checks the manifest against the CRD's schema; it stores nothing
    broken = hppj()
    broken["spec"]["replicaSpecs"][0]["replicas"] = "two"
    invalid = submit(world, {"name": "a-job", "manifest": broken})
    assert invalid.status_code == 422, invalid.text
    assert "spec.replicaSpecs[0].replicas" in invalid.json()["error"]["message"], invalid.text
    assert world.live.get("/api/v1/operations?kind=job.submit").json() == []
    assert _maybe(world, "HyperPodPyTorchJob", "a-job", "default") is None


def test_a_manifest_job_is_submitted_made_ours_and_described_as_its_operator_runs_it(world: JobWorld) -> None:
    ledger = CallLedger(world.live)
    mark = ledger.mark()
    op = operation_of(submit(world, {"name": "llama-sft", "manifest": hppj()}))
    job = wait_until(lambda: _maybe(world, "HyperPodPyTorchJob", "llama-sft"), 60, "the job to be created")
    # what the API received: ours, in the job namespace, labels on the job and every pod template, the SA
    assert {k: job["metadata"]["labels"][k] for k in OURS} == OURS and job["metadata"]["labels"]["team"] == "research"
    template = job["spec"]["replicaSpecs"][0]["template"]
    assert {k: template["metadata"]["labels"][k] for k in OURS} == OURS
    assert template["spec"]["serviceAccountName"] == "instantstart-training"
    assert world.core.read_namespaced_service_account("instantstart-training", NS).metadata.name
    claim = world.core.read_namespaced_persistent_volume_claim("shared-s3", NS)
    volume = world.core.read_persistent_volume(claim.spec.volume_name)
    assert volume.metadata.name == f"instantstart-{CLUSTER}-{NS}-shared-s3"
    assert volume.spec.csi.volume_attributes["bucketName"] == BUCKET
    assert volume.spec.csi.volume_handle == f"instantstart-{CLUSTER}-{NS}-s3"
    assert f"prefix instantstart/{CLUSTER}/data/" in volume.spec.mount_options
    assert volume.spec.claim_ref.namespace == NS
    creates = [e for e in ledger.writes(since=mark, service="kubernetes", verb="create")
               if "hyperpodpytorchjobs" in json.dumps(e)]
    assert len(creates) == 1, creates
    # the operation waits for the operator: no status yet
    wait_until(lambda: "no status from the operator" in (world.stage(op, "started")["message"] or ""), 60,
               "the started stage to say what it waits for")
    # play the operator: two pods on the two nodes, then Running with one restart used
    nodes = world.nodes()
    for i, node in enumerate(nodes):
        world.pod(f"llama-sft-worker-{i}", OURS, node)
    world.event("llama-sft.1", "HyperPodPyTorchJob", "llama-sft", "NodeFault", "restarting after a node fault")
    world.set_status("HyperPodPyTorchJob", "llama-sft", {
        "conditions": [{"type": "Created", "status": "True", "lastTransitionTime": "2026-12-01T10:00:00Z"},
                       {"type": "Running", "status": "True", "lastTransitionTime": "2026-12-01T10:01:00Z"}],
        "restartCount": 1, "restartStatus": {"restartCount": 1, "fullJobRestartCount": 0,
                                                   "currentEvalPeriod": 1}})
    assert world.finished(op)["status"] == "succeeded"
    detail = wait_until(lambda: (d := describe(world, "llama-sft"))["events"] and len(d["pods"]) == 2 and d, 60,
                        "describe to show the pods and events")
    assert detail["phase"] == "Running" and detail["kind"] == "HyperPodPyTorchJob" and detail["recipe"] == "manifest"
    assert detail["restarts"]["used"] == 1 and detail["restarts"]["limit"] == 5
    assert detail["restarts"]["full_job_restarts_limit"] == 1
    assert [(p["name"], p["rank"], p["node"]) for p in detail["pods"]] == [
        (f"llama-sft-worker-{i}", i, node) for i, node in enumerate(nodes)]
    assert [e["reason"] for e in detail["events"]] == ["NodeFault"]
    assert {c["type"] for c in detail["conditions"]} == {"Created", "Running"}
    listed = world.live.get(BASE).json()
    assert [(j["name"], j["phase"]) for j in listed["jobs"]] == [("llama-sft", "Running")]
    assert listed["phases"] == {"Running": 1}
    assert set(listed["kinds_installed"]) == {"HyperPodPyTorchJob", "PyTorchJob"}
    # the name is taken now, in any namespace: refused before any write
    mark = ledger.mark()
    again = submit(world, {"name": "llama-sft", "namespace": "hyperpod-ns-other", "manifest": hppj()})
    assert again.status_code == 409 and "already has a job" in again.text
    ledger.assert_no_writes(since=mark, service="kubernetes")


def test_suspend_and_resume_set_the_flag_and_wait_for_the_operator(world: JobWorld) -> None:
    _running(world, "susp-job")
    op = operation_of(world.live.post(f"{BASE}/susp-job/suspend", {}))
    wait_until(lambda: world.job("HyperPodPyTorchJob", "susp-job")["spec"]["runPolicy"].get("suspend") is True, 60,
               "the suspend flag")
    assert "waiting for the operator" in (wait_until(
        lambda: world.stage(op, "suspend")["message"], 60, "the suspend stage to wait") or "")
    for i in range(2):  # the operator stops the pods and says so
        world.core.delete_namespaced_pod(f"susp-job-worker-{i}", NS, grace_period_seconds=0)
    world.set_status("HyperPodPyTorchJob", "susp-job", {"conditions": [
        {"type": "Suspended", "status": "True", "lastTransitionTime": "2026-12-01T10:05:00Z"}]})
    assert world.finished(op)["status"] == "succeeded"
    assert describe(world, "susp-job")["phase"] == "Suspended"
    op = operation_of(world.live.post(f"{BASE}/susp-job/resume", {}))
    wait_until(lambda: world.job("HyperPodPyTorchJob", "susp-job")["spec"]["runPolicy"].get("suspend") is False, 60,
               "the flag cleared")
    world.set_status("HyperPodPyTorchJob", "susp-job", {"conditions": [
        {"type": "Running", "status": "True", "lastTransitionTime": "2026-12-01T10:06:00Z"}]})
    assert world.finished(op)["status"] == "succeeded"


def test_a_failed_job_shows_its_reason_and_is_cloned_then_deleted(world: JobWorld) -> None:
    _running(world, "fail-job")
    world.set_status("HyperPodPyTorchJob", "fail-job", {
        "conditions": [{"type": "Failed", "status": "True", "reason": "RestartBudgetExhausted",
                        "message": "jobMaxRetryCount 5 reached", "lastTransitionTime": "2026-12-01T11:00:00Z"}],
        "restartCount": 5})
    detail = wait_until(lambda: (d := describe(world, "fail-job"))["phase"] == "Failed" and d, 60, "Failed")
    assert detail["reason"] == "RestartBudgetExhausted: jobMaxRetryCount 5 reached"
    assert detail["restarts"]["used"] == 5 and detail["restarts"]["limit"] == 5
    digest = world.live.get(f"{BASE}/fail-job/digest").json()
    assert digest["phase"] == "Failed" and "restarts 5/5" in digest["line"]
    assert "RestartBudgetExhausted" in digest["line"]
    refused = world.live.post(f"{BASE}/fail-job/suspend", {})
    assert refused.status_code == 409 and "finished" in refused.text
    op = operation_of(world.live.post(f"{BASE}/fail-job/clone", {"name": "fail-job-2"}))
    clone = wait_until(lambda: _maybe(world, "HyperPodPyTorchJob", "fail-job-2"), 60, "the clone")
    source = world.job("HyperPodPyTorchJob", "fail-job")
    assert clone["spec"]["replicaSpecs"][0]["template"]["spec"]["containers"] == \
        source["spec"]["replicaSpecs"][0]["template"]["spec"]["containers"]
    assert clone["metadata"]["labels"]["instantstart.io/job"] == "fail-job-2" and not clone.get("status")
    assert clone["spec"]["replicaSpecs"][0]["template"]["metadata"]["labels"]["instantstart.io/job"] == "fail-job-2"
    # events of a pod gone since (an earlier restart's) are the job's; the clone's pods' are not
    world.event("fail-job-2-worker-0.1", "Pod", "fail-job-2-worker-0", "Scheduled", "the clone's pod")
    world.event("fail-job-worker-7.1", "Pod", "fail-job-worker-7", "Killing", "a pod of an earlier attempt")
    events = wait_until(lambda: (e := [x["reason"] for x in describe(world, "fail-job")["events"]]) and e, 60,
                        "fail-job's events (the watch delivers them in order: the clone's came first)")
    assert events == ["Killing"], events
    world.set_status("HyperPodPyTorchJob", "fail-job-2", {"conditions": [
        {"type": "Running", "status": "True", "lastTransitionTime": "2026-12-01T11:01:00Z"}]})
    assert world.finished(op)["status"] == "succeeded"
    op = operation_of(httpx2.delete(world.live.url + f"{BASE}/fail-job", headers=world.live.headers(), timeout=30))
    assert world.finished(op)["status"] == "succeeded"
    assert _maybe(world, "HyperPodPyTorchJob", "fail-job") is None
    wait_until(lambda: world.live.get(f"{BASE}/fail-job").status_code == 404, 60, "the job gone from describe")


def test_a_rayjob_once_kuberay_is_installed(world: JobWorld) -> None:
    world.install("kuberay")
    wait_until(lambda: "RayJob" in world.live.get(BASE).json()["kinds_installed"], 60, "the RayJob CRD listed")
    op = operation_of(submit(world, {"name": "verl-ppo", "manifest": rayjob()}))
    job = wait_until(lambda: _maybe(world, "RayJob", "verl-ppo"), 60, "the RayJob")
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]
    assert head["metadata"]["labels"]["instantstart.io/job"] == "verl-ppo"
    labels = {**OURS, "instantstart.io/job": "verl-ppo", "ray.io/cluster": "verl-ppo-raycluster"}
    world.pod("verl-ppo-raycluster-head", {**labels, "ray.io/node-type": "head"}, world.nodes()[0],
              container="ray-head")
    world.set_status("RayJob", "verl-ppo", {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "failed": 1})
    assert world.finished(op)["status"] == "succeeded"
    detail = describe(world, "verl-ppo")
    assert detail["phase"] == "Running" and detail["restarts"] == {**detail["restarts"], "used": 1, "limit": 2}
    assert [(p["replica"], p["rank"]) for p in detail["pods"]] == [("head", 0)]
    world.set_status("RayJob", "verl-ppo", {"jobDeploymentStatus": "Failed", "jobStatus": "FAILED",
                                            "reason": "AppFailed", "message": "the driver exited with 1"})
    failed = wait_until(lambda: (d := describe(world, "verl-ppo"))["phase"] == "Failed" and d, 60, "Failed")
    assert failed["reason"] == "AppFailed the driver exited with 1"


def cli(world: JobWorld, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app.cli", *args, "--url", world.live.url, "--token",
                           world.live.admin_token], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=clean_env())


def test_the_cli_lists_describes_and_watches_a_job_until_it_ends(world: JobWorld) -> None:
    _running(world, "cli-job")
    listed = cli(world, "jobs", "list", CLUSTER)
    assert listed.returncode == 0, listed.stderr
    assert any(line.startswith(f"{NS}/cli-job ") and "Running" in line and "restarts 0/5" in line
               for line in listed.stdout.splitlines()), listed.stdout
    described = cli(world, "jobs", "describe", CLUSTER, "cli-job")
    assert described.returncode == 0, described.stderr
    assert "pod cli-job-worker-0" in described.stdout and "rank 0" in described.stdout
    as_json = json.loads(cli(world, "jobs", "describe", CLUSTER, "cli-job", "--json").stdout)
    assert as_json["name"] == "cli-job" and len(as_json["pods"]) == 2
    watch = subprocess.Popen([sys.executable, "-m", "app.cli", "jobs", "watch", CLUSTER, "cli-job", "--interval",
                              "0.2", "--json", "--url", world.live.url, "--token", world.live.admin_token], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
    try:
        assert watch.stdout is not None
        first = json.loads(watch.stdout.readline())  # the watch printed the running job before it ended
        assert first["phase"] == "Running" and first["restarts_limit"] == 5 and first["pods_running"] == 2
        world.set_status("HyperPodPyTorchJob", "cli-job", {"conditions": [
            {"type": "Succeeded", "status": "True", "lastTransitionTime": "2026-12-01T12:00:00Z"}]})
        rest, _ = watch.communicate(timeout=60)
    finally:
        if watch.poll() is None:
            watch.kill()
    assert watch.returncode == 0, "a watch ends with the job, 0 for Succeeded"
    assert json.loads(rest.splitlines()[-1])["phase"] == "Succeeded"
    status = json.loads(cli(world, "status", "--json").stdout)
    assert any(j["name"] == "cli-job" and j["phase"] == "Succeeded" for j in status["jobs"]), status["jobs"]
    text = cli(world, "status").stdout
    assert "jobs:" in text and f"{CLUSTER}/{NS}/cli-job  Succeeded" in text


def _maybe(world: JobWorld, kind: str, name: str, namespace: str = NS) -> dict[str, Any] | None:
    try:
        return world.job(kind, name, namespace)
    except Exception as exc:  # the kubernetes client's ApiException: 404 until it exists
        if getattr(exc, "status", None) == 404:
            return None
        raise


def _running(world: JobWorld, name: str) -> None:
    """Submit a HyperPodPyTorchJob and play its operator to Running with two pods."""
    op = operation_of(submit(world, {"name": name, "manifest": hppj()}))
    wait_until(lambda: _maybe(world, "HyperPodPyTorchJob", name), 60, f"{name} created")
    labels = {**OURS, "instantstart.io/job": name}
    for i, node in enumerate(world.nodes()):
        world.pod(f"{name}-worker-{i}", labels, node)
    world.set_status("HyperPodPyTorchJob", name, {"conditions": [
        {"type": "Running", "status": "True", "lastTransitionTime": "2026-12-01T10:00:00Z"}]})
    assert world.finished(op)["status"] == "succeeded"
    wait_until(lambda: sum(p["phase"] == "Running" for p in describe(world, name)["pods"]) == 2, 60,
               f"{name}'s pods running")
