"""Cluster import and live read against a real server in sandbox mode: a cluster made by `sandbox seed`
(as a user's own would be) is refused while our identity has no EKS access entry, imported once it has
one, read from the caches (nodes by instance group with their health, updated by watch events), and
forgotten without being touched."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx2
import pytest

from app.sandbox import SANDBOX_ACCESS_KEY
from services.clusters.checks import ADMIN_POLICY, access_entry_principal
from tests.ledger import CallLedger
from tests.sandbox_support import seeded_server
from tests.support import ROOT, LiveServer, clean_env, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, dict[str, str]]]:
    with seeded_server(tmp_path_factory.mktemp("clusters"), "hp-eks", nodes=2) as server:
        yield server.live, {"endpoint": f"http://127.0.0.1:{server.aws_port}",
                            "secret": (server.live.data_dir / "sandbox" / "aws-secret-key").read_text().strip()}


def aws(world: dict[str, str], service: str) -> Any:
    return boto3.client(service, endpoint_url=world["endpoint"], region_name="us-west-2",
                        aws_access_key_id=SANDBOX_ACCESS_KEY, aws_secret_access_key=world["secret"])


def imports(live: LiveServer) -> list[dict[str, Any]]:
    return list(live.get("/api/v1/operations?kind=cluster.import").json())


def test_import_is_refused_with_the_reason_before_any_operation(seeded: tuple[LiveServer, dict[str, str]]) -> None:
    live, world = seeded
    eks = aws(world, "eks")
    principal = access_entry_principal(aws(world, "sts").get_caller_identity()["Arn"])
    assert principal in eks.list_access_entries(clusterName="hp-eks")["accessEntries"], "seed grants its creator"
    eks.delete_access_entry(clusterName="hp-eks", principalArn=principal)  # a cluster someone else made
    missing = live.post("/api/v1/clusters/import", {"eks_cluster": "nope"})
    assert missing.status_code == 422, missing.text
    assert "no EKS cluster named 'nope'" in missing.json()["error"]["message"]
    assert missing.json()["error"]["details"]["eks_clusters"] == ["hp-eks"]
    wrong_hp = live.post("/api/v1/clusters/import", {"eks_cluster": "hp-eks", "hyperpod_cluster": "other"})
    assert wrong_hp.status_code == 422 and "clusters there: hp-eks" in wrong_hp.json()["error"]["message"]
    no_entry = live.post("/api/v1/clusters/import", {"eks_cluster": "hp-eks", "hyperpod_cluster": "hp-eks"})
    assert no_entry.status_code == 422, no_entry.text
    error = no_entry.json()["error"]
    assert "has no access entry on EKS cluster hp-eks" in error["message"]
    assert "aws eks create-access-entry --cluster-name hp-eks" in error["message"]
    assert imports(live) == [], "a refused import leaves no operation behind"


def test_import_read_live_and_forget(seeded: tuple[LiveServer, dict[str, str]]) -> None:
    live, world = seeded
    eks = aws(world, "eks")
    principal = access_entry_principal(aws(world, "sts").get_caller_identity()["Arn"])
    if principal not in eks.list_access_entries(clusterName="hp-eks")["accessEntries"]:
        eks.create_access_entry(clusterName="hp-eks", principalArn=principal)  # what the refusal told us to do
        eks.associate_access_policy(clusterName="hp-eks", principalArn=principal, policyArn=ADMIN_POLICY,
                                    accessScope={"type": "cluster"})

    made = live.post("/api/v1/clusters/import", {"eks_cluster": "hp-eks", "hyperpod_cluster": "hp-eks"})
    assert made.status_code == 202, made.text
    op = made.json()["operation"]
    done = live.get(f"/api/v1/operations/{op['id']}/wait?timeout=120").json()
    assert done["status"] == "succeeded", (done["error"], done["stages"])
    assert [s["name"] for s in done["stages"]] == ["register", "connect"]
    again = live.post("/api/v1/clusters/import", {"eks_cluster": "hp-eks", "hyperpod_cluster": "hp-eks"})
    assert again.status_code == 202
    second = live.get(f"/api/v1/operations/{again.json()['operation']['id']}/wait?timeout=120").json()
    assert second["status"] == "succeeded" and second["stages"][0]["acted"] is False, "registered once"

    by_cluster = live.get("/api/v1/operations?cluster=hp-eks").json()
    assert [o["kind"] for o in by_cluster] == ["cluster.import", "cluster.import"]
    assert live.get("/api/v1/operations?cluster=hp").json() == [], "a name prefix is not the cluster"

    listed = live.get("/api/v1/clusters").json()
    assert [(c["name"], c["ownership"], c["eks_status"], c["hyperpod_status"], c["nodes"]) for c in listed] == \
        [("hp-eks", "imported", "ACTIVE", "InService", 2)]
    assert listed[0]["health"] == {"Schedulable": 2}
    detail = live.get("/api/v1/clusters/hp-eks").json()
    assert detail["node_recovery"] == "Automatic" and detail["kubernetes_version"]
    assert [(g["name"], g["current_count"], g["target_count"]) for g in detail["instance_groups"]] == \
        [("workers", 2, 2)]
    workers = detail["nodes_by_group"]["workers"]
    assert len(workers) == 2 and all(n["ready"] and n["health"] == "Schedulable" for n in workers)
    assert detail["nodes_shown"] == 2 and detail["next_after"] is None
    first = live.get("/api/v1/clusters/hp-eks", params={"limit": 1}).json()  # paged, for agents' result caps
    assert first["nodes_shown"] == 1 and first["next_after"] == workers[0]["name"] and first["nodes"] == 2
    second = live.get("/api/v1/clusters/hp-eks", params={"limit": 1, "after": first["next_after"]}).json()
    assert [n["name"] for n in second["nodes_by_group"]["workers"]] == [workers[1]["name"]]
    assert second["next_after"] is None
    assert live.get("/api/v1/clusters/hp-eks", params={"group": "other"}).json()["nodes_shown"] == 0
    assert live.get("/api/v1/clusters/hp-eks", params={"health": "Schedulable"}).json()["nodes_shown"] == 2
    assert workers[0]["gpus"] == 1 and workers[0]["instance_type"] == "ml.g5.8xlarge"
    assert detail["cache_age_seconds"] is not None

    # a node fault reaches the read through the watch, with no refresh asked
    node = workers[0]["name"].removeprefix("hyperpod-")
    fault = live.post("/api/v1/sandbox/faults", {"kind": "node_unhealthy", "target": {"cluster": "hp-eks",
                                                                                     "node": node}})
    assert fault.status_code == 201, fault.text

    def unhealthy() -> bool:
        nodes = live.get("/api/v1/clusters/hp-eks").json()["nodes_by_group"].get("workers", [])
        return any(n["health"] not in (None, "Schedulable") for n in nodes)

    wait_until(unhealthy, 60, "the node fault to show in the cluster read")

    status = live.get("/api/v1/status").json()
    assert "hp-eks" in status["clusters"]


    out = subprocess.run([sys.executable, "-m", "app.cli", "status", "--data-dir", str(live.data_dir)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "hp-eks (imported) EKS ACTIVE, HyperPod InService: 2 nodes:" in out.stdout, out.stdout


def test_options_inspect_the_region_before_a_create(seeded: tuple[LiveServer, dict[str, str]]) -> None:
    live, _world = seeded
    ledger = CallLedger(live)
    mark = ledger.mark()
    options = live.get("/api/v1/clusters/options").json()
    assert options["region"] == "us-west-2" and "us-west-2" in options["regions"]
    zones = {z["name"]: z["zone_id"] for z in options["zones"]}
    assert zones and all(zid for zid in zones.values())
    by_type = {t["instance_type"]: t for t in options["instance_types"]}
    p5 = by_type["ml.p5.48xlarge"]  # facts from EC2, never a table of ours
    assert p5["accelerators"] == 8 and p5["accelerator"] == "NVIDIA H100" and p5["efa_interfaces"] == 32
    assert p5["accelerator_memory_gib"] == 640.0 and p5["quota"] == 0, p5
    g5 = by_type["ml.g5.8xlarge"]
    assert g5["in_use"] == 2 and g5["quota"] is not None and g5["quota"] >= 2, "the seeded cluster runs two"
    assert set(g5["zones"]) <= set(zones)
    assert {(c["name"], c["kind"]) for c in options["clusters"]} >= {("hp-eks", "eks"), ("hp-eks", "hyperpod")}
    assert options["identity"].startswith("arn:aws:iam::")
    assert options["missing_permissions"] == [], "IAM's policy simulator answers: every create action allowed"
    assert ledger.writes(since=mark) == [], "inspecting writes nothing"
    zone = next(iter(zones))
    in_zone = live.get("/api/v1/clusters/options", params={"zone": zone}).json()
    assert all(zone in t["zones"] for t in in_zone["instance_types"])
    bad = live.get("/api/v1/clusters/options", params={"zone": "us-west-2z"})
    assert bad.status_code == 422 and zone in bad.json()["error"]["message"], bad.text
    reserved = live.post("/api/v1/clusters/import", {"eks_cluster": "hp-eks", "name": "options"})
    assert reserved.status_code == 422 and "names a route" in reserved.text


def test_an_import_replayed_with_its_key_asks_aws_nothing(seeded: tuple[LiveServer, dict[str, str]]) -> None:
    """A retried request (same Idempotency-Key) answers its operation from the store: the precheck's AWS
    reads are not made again; the same key with another body is a 409."""
    live, _world = seeded
    body = {"eks_cluster": "hp-eks", "hyperpod_cluster": "hp-eks"}
    key = {"Idempotency-Key": "import-replay-1"}
    first = live.post("/api/v1/clusters/import", body, headers=key)
    assert first.status_code == 202 and first.json()["created"] is True, first.text
    op_id = first.json()["operation"]["id"]
    assert live.get(f"/api/v1/operations/{op_id}/wait?timeout=120").json()["status"] == "succeeded"
    ledger = CallLedger(live)
    mark = ledger.mark()
    again = live.post("/api/v1/clusters/import", body, headers=key)
    assert again.status_code == 202 and again.json()["created"] is False, again.text
    assert again.json()["operation"]["id"] == op_id
    asked = [e for e in ledger.calls(since=mark) if e.get("operation") in (
        "DescribeCluster", "ListClusters", "ListAccessEntries", "GetCallerIdentity", "DescribeAccessEntry")]
    assert asked == [], f"a replay re-ran the precheck: {asked}"
    other = live.post("/api/v1/clusters/import", {**body, "name": "elsewhere"}, headers=key)
    assert other.status_code == 409 and "already used for a different request" in other.text, other.text
    mark = ledger.mark()
    twice = live.post("/api/v1/clusters/import", {**body, "name": "elsewhere"})  # one cluster, one name
    assert twice.status_code == 409 and twice.json()["error"]["details"]["registered_as"] == "hp-eks", twice.text
    assert [c["name"] for c in live.get("/api/v1/clusters").json()] == ["hp-eks"]
    assert ledger.writes(since=mark) == []


def metric(live: LiveServer, name: str, **labels: str) -> float:
    text = live.get("/metrics").text
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(part in line for part in want.split(",")):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_a_hundred_reads_cost_at_most_one_refresh_per_resource(seeded: tuple[LiveServer, dict[str, str]]) -> None:
    """Asserted on what the sandbox saw (its call ledger) and on the product's own counters."""
    live, _ = seeded
    live.get("/api/v1/clusters/hp-eks")  # warm: the informers are synced and the AWS cache filled
    ledger = CallLedger(live)
    mark = ledger.mark()
    described = metric(live, "instantstart_aws_calls_total", operation="DescribeCluster")
    lists = metric(live, "instantstart_informer_lists_total", cluster="hp-eks")
    assert described > 0 and lists > 0, "the counters count"
    started = time.monotonic()
    for _ in range(100):
        assert live.get("/api/v1/clusters/hp-eks").status_code == 200
    # one refresh per 15 s TTL (services/awscache.py), two if the reads straddle an expiry; on a slow machine the
    # hundred reads may outlast a TTL or more, and each TTL they span may cost one refresh more
    refreshes = 2 + int((time.monotonic() - started) // 15.0)
    for service in ("eks", "sagemaker"):
        assert len(ledger.succeeded(service, "DescribeCluster", since=mark)) <= refreshes, service
    assert ledger.calls(cluster="hp-eks", verb="list", since=mark) == [], "nodes and pods come from the watch"
    assert ledger.calls(cluster="hp-eks", verb="get", since=mark) == []
    assert metric(live, "instantstart_informer_lists_total", cluster="hp-eks") == lists
    assert metric(live, "instantstart_aws_calls_total", operation="DescribeCluster") - described <= 2 * refreshes
    assert metric(live, "instantstart_informer_synced", cluster="hp-eks", resource="nodes") == 1
    lag = [line for line in live.get("/metrics").text.splitlines()
           if line.startswith('instantstart_informer_lag_seconds{cluster="hp-eks",resource="nodes"}')]
    assert len(lag) == 1 and float(lag[0].rsplit(" ", 1)[1]) >= 0


def test_viewers_read_but_cannot_import(seeded: tuple[LiveServer, dict[str, str]]) -> None:
    live, _ = seeded
    viewer = live.make_token("viewer")
    assert live.get("/api/v1/clusters", token=viewer).status_code == 200
    refused = live.post("/api/v1/clusters/import", {"eks_cluster": "hp-eks"}, token=viewer)
    assert refused.status_code == 403


def test_the_dashboard_shows_a_node_fault_live_and_imports(seeded: tuple[LiveServer, dict[str, str]],
                                                           tmp_path: Path) -> None:
    from playwright.sync_api import expect

    from tests.browser_support import signed_in

    live, _ = seeded
    cleared = httpx2.delete(f"{live.url}/api/v1/sandbox/faults/all", headers=live.headers(), timeout=30)
    assert cleared.status_code == 200, cleared.text  # no fault left pending from an earlier test

    def settled() -> bool:
        nodes = live.get("/api/v1/clusters/hp-eks").json()["nodes_by_group"].get("workers", [])
        return len(nodes) == 2 and all(n["health"] == "Schedulable" for n in nodes)

    wait_until(settled, 120, "both nodes Schedulable (an earlier fault's replacement done)")
    with signed_in(live, tmp_path / "profile") as (page, errors):
        expect(page.locator(".whoami")).to_contain_text("Signed in", timeout=30_000)
        page.goto(live.url + "/?page=clusters")
        table = page.locator(".clusters-table")
        expect(table).to_contain_text("hp-eks", timeout=30_000)
        chips = page.locator(".cluster-overview .node-chip")
        healthy = page.locator(".cluster-overview .node-chip[data-health='Schedulable']")
        # an earlier test's fault may still be recovering (a node being replaced): start from all healthy
        expect(chips).to_have_count(2, timeout=60_000)
        expect(healthy).to_have_count(2, timeout=60_000)
        name = chips.first.inner_text()
        made = live.post("/api/v1/sandbox/faults", {"kind": "node_unhealthy", "target": {
            "cluster": "hp-eks", "node": name.removeprefix("hyperpod-"), "recovery": "Replace"}})
        assert made.status_code == 201, made.text
        # pushed by the node watch: no reload, no click. That node's chip stops showing Schedulable (it is
        # marked for replacement, then replaced: either way its healthy chip is gone)
        expect(healthy.filter(has_text=name)).to_have_count(0, timeout=60_000)

        # forget, then import again through the form
        gone = httpx2.delete(f"{live.url}/api/v1/clusters/hp-eks/registration", headers=live.headers(),
                             timeout=30)
        assert gone.status_code == 200, gone.text
        page.reload()
        expect(table).to_contain_text("No clusters yet", timeout=30_000)
        page.locator(".import-eks input").fill("hp-eks")
        page.locator(".import-hyperpod input").fill("hp-eks")
        page.locator(".cluster-import button").click()
        expect(page.locator(".cluster-message")).to_contain_text("import of hp-eks started", timeout=30_000)
        expect(table).to_contain_text("imported", timeout=60_000)
    assert not errors, errors
    assert next(op["face"] for op in imports(live)) == "ui", "the newest import came from the dashboard"


def test_an_agent_imports_and_reads_through_mcp(seeded: tuple[LiveServer, dict[str, str]]) -> None:
    import anyio
    from mcp import Client, StdioServerParameters

    live, _ = seeded
    params = StdioServerParameters(command=sys.executable, args=["-m", "app.cli", "mcp", "--url", live.url],
                                   env={**clean_env(), "INSTANTSTART_TOKEN": live.admin_token}, cwd=str(ROOT))

    async def main() -> tuple[Any, Any, Any, Any]:
        async with Client(params) as client:
            tools = {t.name for t in (await client.list_tools()).tools}
            forgot = await client.call_tool("clusters_forget", {"cluster": "hp-eks"})
            made = await client.call_tool("clusters_import", {"eks_cluster": "hp-eks", "hyperpod_cluster": "hp-eks"})
            op_id = made.structured_content["operation"]["id"]
            await client.call_tool("operations_wait", {"id": op_id, "timeout": 60})
            got = await client.call_tool("clusters_get", {"cluster": "hp-eks"})
            return tools, forgot, made, got

    tools, forgot, made, got = anyio.run(main)
    assert {"clusters_list", "clusters_get", "clusters_import", "clusters_forget"} <= tools
    assert forgot.is_error is False and made.is_error is False
    assert made.structured_content["status_tool"] == "operations_get"
    detail = got.structured_content
    assert detail["name"] == "hp-eks" and sum(len(v) for v in detail["nodes_by_group"].values()) == 2


def test_forget_leaves_the_cluster_untouched(seeded: tuple[LiveServer, dict[str, str]]) -> None:
    live, world = seeded
    eks = aws(world, "eks")
    forgotten = httpx2.delete(f"{live.url}/api/v1/clusters/hp-eks/registration", headers=live.headers(),
                              timeout=30)
    assert forgotten.status_code == 200, forgotten.text
    assert live.get("/api/v1/clusters").json() == []
    assert eks.describe_cluster(name="hp-eks")["cluster"]["status"] == "ACTIVE", "forgetting touches nothing"
    gone = live.get("/api/v1/clusters/hp-eks")
    assert gone.status_code == 404 and "none yet" in gone.json()["error"]["message"]
    audit = live.get("/api/v1/audit?action=cluster.forget").json()
    assert audit and audit[0]["outcome"] == "succeeded"
