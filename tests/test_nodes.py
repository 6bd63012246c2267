"""Nodes through REST against a real server in sandbox mode, on a cluster made by `sandbox seed` and imported:
the list from the watch cache (health, group, capacity, filters, paging, no AWS call), the detail with
DescribeClusterNode, reboots batched 25 per call (ledger), a deep health check that fails and shows its status
label and reason, a drain that lists the pods it would evict and that a PodDisruptionBudget holds up, cordon
no-ops, and the refusals (role, confirmation, unknown nodes, selectors) made before any operation exists."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from tests.ledger import CallLedger
from tests.node_support import aws, kube, node_cluster
from tests.sandbox_support import SeededServer
from tests.support import LiveServer, wait_until

pytestmark = pytest.mark.slow
NODES = 60
GROUP = "sagemaker.amazonaws.com/instance-group-name"
BASE = "/api/v1/clusters/hp-eks/nodes"


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeededServer]:
    with node_cluster(tmp_path_factory.mktemp("nodes"), NODES) as server:
        yield server


def nodes(live: LiveServer, **params: Any) -> dict[str, Any]:
    answer = live.get(BASE, params=params)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def finished(live: LiveServer, answer: Any) -> dict[str, Any]:
    assert answer.status_code == 202, answer.text
    op_id = answer.json()["operation"]["id"]
    return dict(wait_until(lambda: (v := live.get(f"/api/v1/operations/{op_id}").json())["status"] in (
        "succeeded", "failed", "cancelled") and v, 120, f"operation {op_id} to end"))


def test_the_list_comes_from_the_watch_cache_with_health_filters_and_paging(seeded: SeededServer) -> None:
    live = seeded.live
    ledger = CallLedger(live)
    wait_until(lambda: nodes(live)["matched"] == NODES, 60, "every node in the cache")
    mark = ledger.mark()
    listed = nodes(live, limit=NODES)
    assert listed["health"] == {"Schedulable": NODES} and listed["next_after"] is None
    first = listed["nodes"][0]
    assert first["instance_group"] == "workers" and first["instance_type"] == "ml.g5.8xlarge"
    assert first["instance_id"] and first["name"] == f"hyperpod-{first['instance_id']}"
    assert first["gpus"] == 1 and first["ready"] and not first["cordoned"] and first["pods"] >= 1
    assert first["deep_health_check"] is None and first["fault_reasons"] == []
    assert ledger.calls(service="sagemaker", since=mark) == [], "the list reads no AWS"

    page = nodes(live, limit=25)
    assert len(page["nodes"]) == 25 and page["matched"] == NODES and page["next_after"] == page["nodes"][-1]["name"]
    rest = nodes(live, limit=100, after=page["next_after"])
    assert len(rest["nodes"]) == NODES - 25 and rest["nodes"][0]["name"] > page["next_after"]
    assert nodes(live, selector=f"{GROUP}=workers")["matched"] == NODES
    assert nodes(live, selector=f"{GROUP} notin (workers)")["matched"] == 0
    assert nodes(live, selector=f"kubernetes.io/hostname={first['name']}")["nodes"][0]["name"] == first["name"]
    assert nodes(live, group="other")["matched"] == 0 and nodes(live, health="Schedulable")["matched"] == NODES
    bad = live.get(BASE, params={"selector": "a in b"})
    assert bad.status_code == 422 and "invalid label selector" in bad.json()["error"]["message"]

    detail = live.get(f"{BASE}/{first['instance_id']}").json()  # by instance id too
    assert detail["name"] == first["name"] and detail["hyperpod"]["InstanceStatus"]["Status"] == "Running"
    assert detail["hyperpod"]["InstanceGroupName"] == "workers" and detail["labels"][GROUP] == "workers"
    assert detail["hyperpod"]["LaunchTime"].startswith("20"), "times as ISO 8601"
    assert any(c["type"] == "Ready" and c["status"] == "True" for c in detail["conditions"])
    missing = live.get(f"{BASE}/hyperpod-i-0000000000000000")
    assert missing.status_code == 404 and "nodes_list" in missing.json()["error"]["message"]


def test_refusals_come_before_any_operation(seeded: SeededServer) -> None:
    live = seeded.live
    ledger = CallLedger(live)
    name = nodes(live, limit=1)["nodes"][0]["name"]
    before = len(live.get("/api/v1/operations", params={"limit": 500}).json())
    mark = ledger.mark()
    operator = live.make_token("operator")
    refused = live.post(f"{BASE}/replace", {"nodes": [name], "confirm": True}, token=operator)
    assert refused.status_code == 403, refused.text
    unconfirmed = live.post(f"{BASE}/replace", {"nodes": [name]})
    assert unconfirmed.status_code == 422 and "root and secondary volumes" in unconfirmed.json()["error"]["message"]
    assert live.post(f"{BASE}/delete", {"nodes": [name]}).status_code == 422
    assert live.post(f"{BASE}/reboot", {"nodes": ["nope"]}).status_code == 404
    both = live.post(f"{BASE}/reboot", {"nodes": [name], "selector": f"{GROUP}=workers"})
    assert both.status_code == 422 and "not both" in both.text
    none = live.post(f"{BASE}/reboot", {"selector": f"{GROUP}=gone"})
    assert none.status_code == 422 and "matches no node" in none.json()["error"]["message"]
    checks = live.post(f"{BASE}/health-checks", {"nodes": [name], "checks": ["Vibes"]})
    assert checks.status_code == 422 and "InstanceStress" in checks.text
    assert len(live.get("/api/v1/operations", params={"limit": 500}).json()) == before
    ledger.assert_no_writes(since=mark)
    denied = live.get("/api/v1/audit", params={"action": "nodes_replace"}).json()
    assert any(r["outcome"] == "denied" for r in denied), "a refused replace leaves a trace"


def test_sixty_reboots_are_three_calls_and_each_node_comes_back(seeded: SeededServer) -> None:
    """The second batch is throttled: the retry sends it and the third, never the first batch again."""
    live = seeded.live
    ledger = CallLedger(live)
    throttled = live.post("/api/v1/sandbox/faults", {"kind": "throttle", "count": 1, "target": {
        "service": "sagemaker", "operation": "BatchRebootClusterNodes", "after": 1}})
    assert throttled.status_code == 201, throttled.text
    mark = ledger.mark()
    done = finished(live, live.post(f"{BASE}/reboot", {"selector": f"{GROUP}=workers"}))
    assert done["status"] == "succeeded", (done["error"], done["stages"])
    assert done["target"] == "cluster/hp-eks/node" and done["stages"][0]["retries"] >= 1
    tries = ledger.calls(service="sagemaker", operation="BatchRebootClusterNodes", since=mark)
    assert [(len(c["request"]["NodeIds"]), c["status"] >= 400) for c in tries] == [
        (25, False), (25, True), (25, False), (10, False)]
    calls = ledger.succeeded("sagemaker", "BatchRebootClusterNodes", since=mark)
    sent = [i for c in calls for i in c["request"]["NodeIds"]]
    assert len(sent) == len(set(sent)) == NODES, "each node rebooted once"
    assert tries[1]["request"]["NodeIds"] == tries[2]["request"]["NodeIds"], "the throttled batch is sent again"
    result = done["stages"][0]["result"]
    assert len(result["accepted"]) == NODES and result["failed"] == []
    assert set(result["health_after"].values()) == {"Schedulable"}


def test_a_failing_deep_health_check_shows_its_status_label_and_reason(seeded: SeededServer) -> None:
    live = seeded.live
    ledger = CallLedger(live)
    node = nodes(live, limit=3)["nodes"][2]
    fault = live.post("/api/v1/sandbox/faults", {"kind": "deep_health_check_failed", "target": {
        "cluster": "hp-eks", "node": node["instance_id"], "check": "InstanceStress"}})
    assert fault.status_code == 201, fault.text
    mark = ledger.mark()
    done = finished(live, live.post(f"{BASE}/health-checks", {"nodes": [node["name"]], "checks": ["InstanceStress"]}))
    assert done["status"] == "succeeded", (done["error"], done["stages"])
    assert done["target"] == f"cluster/hp-eks/node/{node['name']}"
    assert done["stages"][0]["result"]["verdicts"] == {node["name"]: "Failed"}
    started = ledger.once("sagemaker", "StartClusterHealthCheck", since=mark)["request"]
    assert started["DeepHealthCheckConfigurations"] == [{"InstanceGroupName": "workers", "InstanceIds": [
        node["instance_id"]], "DeepHealthChecks": ["InstanceStress"]}]
    failed = nodes(live, health="UnschedulablePendingReplacement")["nodes"]
    assert [(n["name"], n["deep_health_check"], n["fault_types"], n["fault_reasons"]) for n in failed] == [
        (node["name"], "Failed", ["DeepHealthCheck"], ["InstanceStressFailed"])]


def test_checks_a_reboot_ends_unfinished_are_a_failed_verdict_not_a_two_hour_wait(seeded: SeededServer) -> None:
    live = seeded.live
    node = nodes(live, limit=8)["nodes"][7]
    op = live.post(f"{BASE}/health-checks", {"nodes": [node["name"]], "checks": [
        "InstanceStress", "InstanceConnectivity", "MultiNodeTrainingValidation"]})
    assert op.status_code == 202, op.text
    op_id = op.json()["operation"]["id"]
    wait_until(lambda: "(1 seen under way)" in (live.get(f"/api/v1/operations/{op_id}").json()["stages"][0][
        "message"] or ""), 60, "the checks under way")
    aws(seeded, "sagemaker").batch_reboot_cluster_nodes(ClusterName="hp-eks", NodeIds=[node["instance_id"]])
    done = wait_until(lambda: (v := live.get(f"/api/v1/operations/{op_id}").json())["status"] in (
        "succeeded", "failed") and v, 120, "the check to end")
    assert done["status"] == "succeeded", (done["error"], done["stages"])
    assert done["stages"][0]["result"]["verdicts"] == {node["name"]: "Failed"}


def test_the_group_comes_from_hyperpod_and_logical_ids_are_checked(seeded: SeededServer, tmp_path: Path) -> None:
    live = seeded.live
    ledger = CallLedger(live)
    node = nodes(live, limit=10)["nodes"][9]
    core = k8s.CoreV1Api(kube(seeded, tmp_path))
    core.patch_node(node["name"], {"metadata": {"labels": {GROUP: None}}})
    wait_until(lambda: nodes(live, selector=f"kubernetes.io/hostname={node['name']}")["nodes"][0][
        "instance_group"] is None, 30, "the label gone from the cache")
    before = len(live.get("/api/v1/operations", params={"limit": 500}).json())
    pattern = live.post(f"{BASE}/delete", {"logical_ids": ["bad_id!"], "confirm": True})
    assert pattern.status_code == 422, pattern.text
    mode = live.post(f"{BASE}/delete", {"logical_ids": ["workers-0001"], "confirm": True})
    assert mode.status_code == 409 and "Continuous" in mode.json()["error"]["message"], mode.text
    assert len(live.get("/api/v1/operations", params={"limit": 500}).json()) == before
    mark = ledger.mark()
    done = finished(live, live.post(f"{BASE}/health-checks", {"nodes": [node["name"]], "checks": ["InstanceStress"]}))
    assert done["status"] == "succeeded", (done["error"], done["stages"])
    started = ledger.once("sagemaker", "StartClusterHealthCheck", since=mark)["request"]
    assert [c["InstanceGroupName"] for c in started["DeepHealthCheckConfigurations"]] == ["workers"]


def test_drain_lists_the_pods_first_and_waits_on_a_blocking_budget(seeded: SeededServer, tmp_path: Path) -> None:
    live = seeded.live
    ledger = CallLedger(live)
    api = kube(seeded, tmp_path)
    apps, core, policy = k8s.AppsV1Api(api), k8s.CoreV1Api(api), k8s.PolicyV1Api(api)
    node = nodes(live, limit=5)["nodes"][4]["name"]
    labels = {"app": "trainer"}
    apps.create_namespaced_deployment("default", {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "trainer"},
        "spec": {"replicas": 2, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels}, "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                                                     "containers": [{"name": "c", "image": "busybox"}]}}}})
    policy.create_namespaced_pod_disruption_budget("default", {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "trainer-pdb"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": labels}}})

    def running() -> list[Any]:
        return [p for p in core.list_namespaced_pod("default", label_selector="app=trainer").items
                if p.spec.node_name == node and p.status.phase == "Running"]

    wait_until(lambda: len(running()) == 2, 60, "the trainer pods running on the node")
    wait_until(lambda: policy.read_namespaced_pod_disruption_budget("trainer-pdb", "default").status.expected_pods
               == 2, 60, "the budget's status")
    mark = ledger.mark()
    plan = live.post(f"{BASE}/drain", {"nodes": [node], "dry_run": True})
    assert plan.status_code == 200, plan.text
    body = plan.json()
    trainers = [p for p in body["pods"] if p["name"].startswith("trainer-")]
    assert len(trainers) == 2 and all(p["budgets"] == ["default/trainer-pdb"] and p["blocked"] for p in trainers)
    assert all(p["owner"].startswith("ReplicaSet/trainer-") for p in trainers)
    assert body["blocked_by"] == ["default/trainer-pdb"] and any(j.startswith("ReplicaSet/default/trainer-")
                                                                 for j in body["jobs"])
    assert body["skipped"], "the DaemonSet pods (device plugins) stay"
    ledger.assert_no_writes(since=mark)

    op = live.post(f"{BASE}/drain", {"nodes": [node]})
    assert op.status_code == 202, op.text
    op_id = op.json()["operation"]["id"]

    def waiting_on_budget() -> bool:
        view = live.get(f"/api/v1/operations/{op_id}").json()
        assert view["status"] not in ("succeeded", "failed"), view
        return "PodDisruptionBudget default/trainer-pdb" in (view["stages"][1]["message"] or "")

    wait_until(waiting_on_budget, 60, "the drain to wait on the budget, naming it")
    assert nodes(live, selector=f"kubernetes.io/hostname={node}")["nodes"][0]["cordoned"]
    assert len(running()) == 2, "the budget held both pods"
    policy.patch_namespaced_pod_disruption_budget("trainer-pdb", "default", {"spec": {"minAvailable": 0}})
    done = wait_until(lambda: (v := live.get(f"/api/v1/operations/{op_id}").json())["status"] in (
        "succeeded", "failed") and v, 60, "the drain to finish once the budget allows it")
    assert done["status"] == "succeeded", (done["error"], done["stages"])
    assert sorted(done["stages"][1]["result"]["evicted"]) == sorted(f"default/{p['name']}" for p in trainers)
    evictions = [e for e in ledger.writes(since=mark) if e.get("kind") != "aws" and "eviction" in str(e)]
    assert evictions, "pods left through the eviction subresource"
    assert running() == []

    quiet = ledger.mark()
    again = finished(live, live.post(f"{BASE}/cordon", {"nodes": [node]}))
    assert again["status"] == "succeeded" and again["stages"][0]["message"] == "already in the desired state"
    ledger.assert_no_writes(since=quiet)
    uncordoned = finished(live, live.post(f"{BASE}/uncordon", {"nodes": [node]}))
    assert uncordoned["status"] == "succeeded" and uncordoned["stages"][0]["result"]["changed"] == [node]
    wait_until(lambda: not nodes(live, selector=f"kubernetes.io/hostname={node}")["nodes"][0]["cordoned"], 30,
               "the node schedulable again")
