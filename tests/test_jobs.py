"""The jobs noun through REST against a real server in sandbox mode, on a seeded, imported cluster with the job
CRDs installed, run by the sandbox's operators and simulated trainers: the test submits, waits on the conditions
the operator produces, and asserts what the Kubernetes API received and what list, describe and the digest show.
Refusals are checked on the call ledger: zero writes."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest

from tests.jobs_support import BASE, BUCKET, CLUSTER, NS, JobWorld, cli, hppj, job_world, rayjob
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
    unknown_recipe = submit(world, {"name": "a-job", "recipe": "torch", "params": {"script": "/s3/train.py"}})
    assert unknown_recipe.status_code == 422 and "unknown recipe 'torch'" in unknown_recipe.text, unknown_recipe.text
    both = submit(world, {"name": "a-job", "recipe": "pytorch", "manifest": hppj()})
    assert both.status_code == 422 and "drop field manifest" in both.text, both.text
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
    crash_once = {"SANDBOX_FAIL_AT_STEP": "2", "SANDBOX_FAIL_RUNS": "1"}
    op = operation_of(submit(world, {"name": "llama-sft", "manifest": hppj(env=crash_once)}))
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
    # the operator runs it: each pod's first training process crashes at step 2 and the HyperPod agent restarts
    # it in place, once per pod, against the job's budget
    assert world.finished(op)["status"] == "succeeded"
    # the restart count (the job's status), its events and the pods come from three watch caches, and the
    # operator writes each restart's event after the status that counts it: wait for all of them
    detail = wait_until(lambda: (d := describe(world, "llama-sft"))["restarts"]["used"] == 2 and all(
        p["phase"] == "Running" for p in d["pods"]) and len(d["pods"]) == 2 and [
        e["reason"] for e in d["events"]].count("ProcessLevelRestart") == 2 and d, 120,
                        "describe to show two running pods and two process-level restarts with their events")
    assert detail["phase"] == "Running" and detail["kind"] == "HyperPodPyTorchJob" and detail["recipe"] == "manifest"
    assert detail["restarts"]["limit"] == 5 and detail["restarts"]["full_job_restarts_limit"] == 1
    assert detail["restarts"]["full_job_restarts_used"] == 0
    assert [(p["name"], p["rank"]) for p in detail["pods"]] == [(f"llama-sft-worker-{i}", i) for i in range(2)]
    assert sorted(p["node"] for p in detail["pods"]) == world.nodes()
    assert [e["reason"] for e in detail["events"]].count("ProcessLevelRestart") == 2, detail["events"]
    assert {"Created", "PodsRunning", "Running"} <= {c["type"] for c in detail["conditions"]}
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
    assert world.finished(op)["status"] == "succeeded"
    assert world.job("HyperPodPyTorchJob", "susp-job")["spec"]["runPolicy"]["suspend"] is True
    detail = describe(world, "susp-job")
    assert detail["phase"] == "Suspended" and detail["pods"] == [], detail  # the operator stopped the pods
    op = operation_of(world.live.post(f"{BASE}/susp-job/resume", {}))
    assert world.finished(op)["status"] == "succeeded"
    assert world.job("HyperPodPyTorchJob", "susp-job")["spec"]["runPolicy"]["suspend"] is False
    wait_until(lambda: (d := describe(world, "susp-job"))["phase"] == "Running" and sum(
        p["phase"] == "Running" for p in d["pods"]) == 2, 120, "the operator to run the pods again")


def test_a_failed_job_shows_its_reason_and_is_cloned_then_deleted(world: JobWorld) -> None:
    # hyperpodrun refuses a flag it lacks (exit 2, before any agent): the operator restarts the whole job once
    # (maxFullJobRestarts 1), the new pods fail the same way, and the operator ends the job Failed
    op = operation_of(submit(world, {"name": "fail-job", "manifest": hppj(launcher_flags=("--no-such-flag",))}))
    ended = world.finished(op)
    detail = wait_until(lambda: (d := describe(world, "fail-job"))["phase"] == "Failed" and "Failed" in {
        e["reason"] for e in d["events"]} and d, 120, "Failed, with its Failed event (written after the status)")
    assert detail["reason"].startswith("RestartBudgetExhausted: maxFullJobRestarts (1) exhausted"), detail["reason"]
    assert "fail-job-worker-" in detail["reason"]
    assert ended["status"] in ("succeeded", "failed"), ended  # it may have been Running for a moment
    if ended["status"] == "failed":
        assert "RestartBudgetExhausted" in json.dumps(ended) or "maxFullJobRestarts" in json.dumps(ended), ended
    assert detail["restarts"]["full_job_restarts_used"] == 1 and detail["restarts"]["limit"] == 5
    reasons = [e["reason"] for e in detail["events"]]
    assert "JobLevelRestart" in reasons and "Failed" in reasons, reasons
    logs = world.live.get(f"{BASE}/fail-job/logs", params={"tail": 50})
    assert logs.status_code == 200 and "hyperpodrun: error: unrecognized arguments: --no-such-flag" in logs.text, \
        logs.text[-2000:]
    digest = world.live.get(f"{BASE}/fail-job/digest").json()
    assert digest["phase"] == "Failed" and "RestartBudgetExhausted" in digest["line"], digest
    refused = world.live.post(f"{BASE}/fail-job/suspend", {})
    assert refused.status_code == 409 and "finished" in refused.text
    op = operation_of(world.live.post(f"{BASE}/fail-job/clone", {"name": "fail-job-2"}))
    clone = wait_until(lambda: _maybe(world, "HyperPodPyTorchJob", "fail-job-2"), 60, "the clone")
    source = world.job("HyperPodPyTorchJob", "fail-job")
    assert clone["spec"]["replicaSpecs"][0]["template"]["spec"]["containers"] == \
        source["spec"]["replicaSpecs"][0]["template"]["spec"]["containers"]
    assert clone["metadata"]["labels"]["instantstart.io/job"] == "fail-job-2"
    assert clone["spec"]["replicaSpecs"][0]["template"]["metadata"]["labels"]["instantstart.io/job"] == "fail-job-2"
    # the clone runs the same refused command: it fails on its own, and its events stay its own
    world.finished(op)
    # the operator writes the Failed status before its Failed event: wait for both
    clone_events = wait_until(lambda: (d := describe(world, "fail-job-2"))["phase"] == "Failed" and "Failed" in {
        e["reason"] for e in d["events"]} and d["events"], 120, "the clone to fail too, with its Failed event")
    assert {"JobLevelRestart", "Failed"} <= {e["reason"] for e in clone_events}, clone_events
    assert all("fail-job-2" not in f"{e['object']} {e['message']}" for e in describe(world, "fail-job")["events"])
    op = operation_of(httpx2.delete(world.live.url + f"{BASE}/fail-job", headers=world.live.headers(), timeout=30))
    assert world.finished(op)["status"] == "succeeded"
    assert _maybe(world, "HyperPodPyTorchJob", "fail-job") is None
    wait_until(lambda: world.live.get(f"{BASE}/fail-job").status_code == 404, 60, "the job gone from describe")
    assert describe(world, "fail-job-2")["phase"] == "Failed", "deleting one job leaves its clone"


def test_a_rayjob_once_kuberay_is_installed(world: JobWorld) -> None:
    world.install("kuberay")
    wait_until(lambda: "RayJob" in world.live.get(BASE).json()["kinds_installed"], 60, "the RayJob CRD listed")
    # a Hydra override outside VERL's config: the driver exits 1 each try, KubeRay retries backoffLimit times
    op = operation_of(submit(world, {"name": "verl-ppo", "manifest": rayjob(("no_such_group.key=1",))}))
    job = wait_until(lambda: _maybe(world, "RayJob", "verl-ppo"), 60, "the RayJob")
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]
    assert head["metadata"]["labels"]["instantstart.io/job"] == "verl-ppo"
    world.finished(op)
    failed = wait_until(lambda: (d := describe(world, "verl-ppo"))["phase"] == "Failed" and d, 120, "Failed")
    assert failed["restarts"]["limit"] == 2 and failed["restarts"]["used"] == 2, failed["restarts"]
    assert world.job("RayJob", "verl-ppo")["status"]["failed"] == 3, "one try and two retries"
    assert failed["reason"].startswith("AppFailed Job entrypoint command failed with exit code 1"), failed["reason"]
    pods = {p["replica"]: p for p in failed["pods"]}
    assert pods["head"]["name"] == "verl-ppo-raycluster-head" and pods["head"]["rank"] == 0
    assert pods["gpu"]["name"] == "verl-ppo-raycluster-gpu-worker-0" and pods["submitter"]["phase"] == "Failed"
    driver = world.core.read_namespaced_pod_log(pods["submitter"]["name"], NS)
    assert "Could not override 'no_such_group.key'" in driver, driver[-2000:]


def test_the_cli_lists_describes_and_watches_a_job_until_it_ends(world: JobWorld) -> None:
    # 50 steps of 200 simulated seconds: about 20 s at the tests' clock speed, then the job completes by itself
    _running(world, "cli-job", hppj(steps=50, env={"SANDBOX_STEP_SECONDS": "200"}))
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
        rest, _ = watch.communicate(timeout=180)  # until the trainer finishes and the operator says Completed
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


def _running(world: JobWorld, name: str, manifest: dict[str, Any] | None = None) -> None:
    """Submit a HyperPodPyTorchJob and wait for the operator to run its two pods."""
    op = operation_of(submit(world, {"name": name, "manifest": manifest or hppj()}))
    assert world.finished(op)["status"] == "succeeded"
    wait_until(lambda: sum(p["phase"] == "Running" for p in describe(world, name)["pods"]) == 2, 120,
               f"{name}'s pods running")
