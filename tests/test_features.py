"""Managed features through REST against a real server in sandbox mode, on a cluster made by `sandbox seed` and
imported: the explicit diff turns one feature on with its prerequisites (resource by resource on the ledger),
re-sending it writes nothing to AWS or Kubernetes, a setting change is one UpdateAddon, a change that breaks a
dependency is refused naming the dependent, and turning it off removes everything it made. A component
installed by the user before is shown as foreign and adopted only on request."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import anyio
import boto3
import httpx2
import pytest
from mcp import Client, StdioServerParameters

from app.sandbox import SANDBOX_ACCESS_KEY
from services.clusters.checks import ADMIN_POLICY, access_entry_principal
from tests.create_support import leftovers
from tests.ledger import CallLedger
from tests.sandbox_support import seeded_server
from tests.support import ROOT, LiveServer, clean_env, wait_until

pytestmark = pytest.mark.slow
CLUSTER = "hp-eks"
URL = f"/api/v1/clusters/{CLUSTER}/features"
TRAINING = "amazon-sagemaker-hyperpod-training-operator"
TRAINING_ROLE = f"{CLUSTER}-hp-training-operator-role"


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, dict[str, str]]]:
    with seeded_server(tmp_path_factory.mktemp("features"), CLUSTER, nodes=1) as server:
        world = {"endpoint": f"http://127.0.0.1:{server.aws_port}",
                 "secret": (server.live.data_dir / "sandbox" / "aws-secret-key").read_text().strip()}
        eks = aws(world, "eks")
        principal = access_entry_principal(aws(world, "sts").get_caller_identity()["Arn"])
        if principal not in eks.list_access_entries(clusterName=CLUSTER)["accessEntries"]:
            eks.create_access_entry(clusterName=CLUSTER, principalArn=principal)
            eks.associate_access_policy(clusterName=CLUSTER, principalArn=principal, policyArn=ADMIN_POLICY,
                                        accessScope={"type": "cluster"})
        made = server.live.post("/api/v1/clusters/import", {"eks_cluster": CLUSTER, "hyperpod_cluster": CLUSTER})
        assert made.status_code == 202, made.text
        assert finished(server.live, made.json()["operation"]["id"])["status"] == "succeeded"
        yield server.live, world


def aws(world: dict[str, str], service: str) -> Any:
    return boto3.client(service, endpoint_url=world["endpoint"], region_name="us-west-2",
                        aws_access_key_id=SANDBOX_ACCESS_KEY, aws_secret_access_key=world["secret"])


def finished(live: LiveServer, op_id: str, timeout: float = 240) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        view = live.get(f"/api/v1/operations/{op_id}", params={"wait": 30}).json()
        return view if view["status"] in ("succeeded", "failed", "cancelled") else None

    return wait_until(done, timeout, f"operation {op_id} to end")


def features(live: LiveServer) -> dict[str, dict[str, Any]]:
    got = live.get(URL)
    assert got.status_code == 200, got.text
    return {f["name"]: f for f in got.json()["features"]}


def patch(live: LiveServer, body: dict[str, Any], url: str = URL) -> httpx2.Response:
    return httpx2.patch(live.url + url, json=body, headers=live.headers(), timeout=70)


def toggle(live: LiveServer, body: dict[str, Any]) -> dict[str, Any]:
    """PATCH ``body`` and follow its operation to the end; it must succeed."""
    sent = patch(live, body)
    assert sent.status_code == 202, sent.text
    view = finished(live, sent.json()["operation"]["id"])
    assert view["status"] == "succeeded", json.dumps(view["error"] or view["stages"], indent=1)[:3000]
    return view


def addon_calls(ledger: CallLedger, operation: str, since: int) -> list[str]:
    return [e["request"]["addonName"] for e in ledger.succeeded("eks", operation, since)]


def test_every_feature_is_listed_off_with_its_dependencies(seeded: tuple[LiveServer, dict[str, str]]) -> None:
    live, _ = seeded
    listed = features(live)
    assert {"cert_manager", "fsx_csi_driver", "kuberay_operator", "hyperpod_training_operator",
            "hyperpod_inference_operator"} <= set(listed)
    assert not any(f["enabled"] for f in listed.values()), listed
    training = listed["hyperpod_training_operator"]
    assert training["depends_on"] == ["cert_manager", "pod_identity_agent"]
    assert set(training["settings_schema"]["properties"]) >= {"cpu_limit", "memory_limit", "node_selector"}
    assert listed["cert_manager"]["settings_schema"] is None


def test_bad_requests_are_refused_before_any_operation(seeded: tuple[LiveServer, dict[str, str]]) -> None:
    live, _ = seeded
    ledger = CallLedger(live)
    mark = ledger.mark()
    before = len(live.get("/api/v1/operations", params={"kind": "features.update"}).json())
    empty = patch(live, {})
    assert empty.status_code == 422 and "name at least one feature" in empty.json()["error"]["message"]
    typo = patch(live, {"cert_manger": True})
    assert typo.status_code == 422 and "cert_manager" in typo.text, typo.text
    unknown_setting = patch(live, {"hyperpod_training_operator": {"cpu_limt": "3"}})
    assert unknown_setting.status_code == 422, unknown_setting.text
    assert "cpu_limt" in unknown_setting.json()["error"]["message"]
    no_settings = patch(live, {"cert_manager": {"replicas": 2}})
    assert no_settings.status_code == 422 and "has no settings" in no_settings.json()["error"]["message"]
    assert patch(live, {"cert_manager": True}, "/api/v1/clusters/nope/features").status_code == 404
    assert len(live.get("/api/v1/operations", params={"kind": "features.update"}).json()) == before
    ledger.assert_no_writes(since=mark)


def test_enable_resend_configure_refuse_and_disable(seeded: tuple[LiveServer, dict[str, str]]) -> None:
    live, world = seeded
    ledger = CallLedger(live)
    start = ledger.mark()

    # on: its prerequisites first, each one add-on; its role and pod identity association in CreateAddon
    view = toggle(live, {"hyperpod_training_operator": True})
    assert [s["name"] for s in view["stages"]] == ["pod_identity_agent", "cert_manager", "hyperpod_training_operator"]
    assert all(s["acted"] for s in view["stages"])
    assert addon_calls(ledger, "CreateAddon", start) == ["eks-pod-identity-agent", "cert-manager", TRAINING]
    created = ledger.succeeded("eks", "CreateAddon", start)[-1]["request"]
    assert created["tags"]["instantstart:cluster"] == CLUSTER
    assert created["podIdentityAssociations"] == [{"serviceAccount": "hp-training-operator-controller-manager",
                                                   "roleArn": f"arn:aws:iam::123456789012:role/{TRAINING_ROLE}"}]
    assert json.loads(created["configurationValues"])["hpTrainingControllerManager"]["manager"]["resources"] == {
        "requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}}
    assert ledger.once("iam", "CreateRole", start)["request"]["RoleName"] == TRAINING_ROLE
    assert ledger.once("iam", "AttachRolePolicy", start)["request"]["PolicyArn"].endswith(
        "AmazonSageMakerHyperPodTrainingOperatorAccess")
    listed = features(live)
    assert listed["hyperpod_training_operator"]["enabled"] and not listed["hyperpod_training_operator"]["foreign"]
    assert listed["cert_manager"]["required_by"] == ["hyperpod_training_operator"]

    # the same state again: an operation that changes nothing, zero writes to AWS and Kubernetes
    mark = ledger.mark()
    again = toggle(live, {"hyperpod_training_operator": True, "cert_manager": True})
    assert not any(s["acted"] for s in again["stages"])
    assert {s["message"] for s in again["stages"]} == {"already in the desired state"}
    ledger.assert_no_writes(since=mark)

    # one setting: one UpdateAddon carrying it and the others as they were
    mark = ledger.mark()
    toggle(live, {"hyperpod_training_operator": {"cpu_limit": "3", "node_selector": {"pool": "system"}}})
    update = ledger.once("eks", "UpdateAddon", mark)["request"]
    manager = json.loads(update["configurationValues"])["hpTrainingControllerManager"]
    assert manager["manager"]["resources"]["limits"] == {"cpu": "3", "memory": "4Gi"}
    assert manager["nodeSelector"] == {"pool": "system"}
    assert [e["request"]["addonName"] for e in ledger.writes(mark) if e.get("kind") == "aws"] == [TRAINING]
    assert features(live)["hyperpod_training_operator"]["settings"]["cpu_limit"] == "3"

    # breaking a dependency is refused, naming the dependent; nothing is written
    mark = ledger.mark()
    refused = patch(live, {"cert_manager": False})
    assert refused.status_code == 409, refused.text
    assert "hyperpod_training_operator" in refused.json()["error"]["message"]
    ledger.assert_no_writes(since=mark)

    # off, dependents first, everything it made goes
    mark = ledger.mark()
    off = toggle(live, {"hyperpod_training_operator": False, "cert_manager": False, "pod_identity_agent": False})
    assert [s["name"] for s in off["stages"]] == ["remove-hyperpod_training_operator", "remove-cert_manager",
                                                  "remove-pod_identity_agent"]
    assert addon_calls(ledger, "DeleteAddon", mark) == [TRAINING, "cert-manager", "eks-pod-identity-agent"]
    assert ledger.once("iam", "DeleteRole", mark)["request"]["RoleName"] == TRAINING_ROLE
    assert not any(f["enabled"] for f in features(live).values())
    assert leftovers(lambda s: aws(world, s), ledger.calls(since=start), CLUSTER) == []
    assert aws(world, "eks").list_addons(clusterName=CLUSTER)["addons"] == []
    assert aws(world, "eks").list_pod_identity_associations(clusterName=CLUSTER)["associations"] == []


def test_foreign_is_shown_and_adopted_only_on_request(seeded: tuple[LiveServer, dict[str, str]]) -> None:
    live, world = seeded
    eks = aws(world, "eks")
    eks.create_addon(clusterName=CLUSTER, addonName="cert-manager")  # the user's own, before us
    wait_until(lambda: features(live)["cert_manager"]["status"] == "ACTIVE", 60, "the user's cert-manager ACTIVE")
    ledger = CallLedger(live)
    mark = ledger.mark()
    shown = features(live)["cert_manager"]
    assert shown["enabled"] and shown["foreign"]

    refused = patch(live, {"cert_manager": False})
    assert refused.status_code == 409 and "adopt" in refused.json()["error"]["message"], refused.text
    kept = toggle(live, {"cert_manager": True})  # on already: used as it is, not adopted
    assert not kept["stages"][0]["acted"]
    ledger.assert_no_writes(since=mark)
    assert features(live)["cert_manager"]["foreign"]

    adopted = toggle(live, {"cert_manager": {"adopt": True}})
    assert adopted["stages"][0]["acted"]
    tagged = ledger.once("eks", "TagResource", mark)["request"]
    assert tagged["tags"]["instantstart:cluster"] == CLUSTER
    assert not features(live)["cert_manager"]["foreign"]
    toggle(live, {"cert_manager": False})  # ours now: it may go
    assert eks.list_addons(clusterName=CLUSTER)["addons"] == []


def test_an_adopted_addon_gets_its_pod_identity_association_like_a_fresh_install(
        seeded: tuple[LiveServer, dict[str, str]]) -> None:
    live, world = seeded
    eks = aws(world, "eks")
    eks.create_addon(clusterName=CLUSTER, addonName="aws-mountpoint-s3-csi-driver")  # the user's, no association
    wait_until(lambda: features(live)["s3_csi_driver"]["status"] == "ACTIVE", 60, "the user's S3 CSI driver ACTIVE")
    assert features(live)["s3_csi_driver"]["foreign"]
    ledger = CallLedger(live)
    mark = ledger.mark()
    toggle(live, {"s3_csi_driver": {"adopt": True}})
    association = ledger.once("eks", "CreatePodIdentityAssociation", mark)["request"]
    role = f"arn:aws:iam::123456789012:role/{CLUSTER}-s3-csi-role"
    assert (association["namespace"], association["serviceAccount"], association["roleArn"]) == (
        "kube-system", "s3-csi-driver-sa", role)
    assert association["tags"]["instantstart:cluster"] == CLUSTER
    ledger.once("iam", "CreateRole", mark)
    listed = eks.list_pod_identity_associations(clusterName=CLUSTER, namespace="kube-system",
                                                serviceAccount="s3-csi-driver-sa")["associations"]
    assert len(listed) == 1 and not features(live)["s3_csi_driver"]["foreign"]

    again = ledger.mark()
    toggle(live, {"s3_csi_driver": {"adopt": True}})  # re-sent: ours now, as wanted
    ledger.assert_no_writes(since=again)

    toggle(live, {"s3_csi_driver": False, "pod_identity_agent": False})  # ours: all of it goes, the association too
    assert eks.list_pod_identity_associations(clusterName=CLUSTER, namespace="kube-system")["associations"] == []
    assert "aws-mountpoint-s3-csi-driver" not in eks.list_addons(clusterName=CLUSTER)["addons"]


def test_a_manifest_feature_on_again_and_off_in_kubernetes(seeded: tuple[LiveServer, dict[str, str]]) -> None:
    live, _ = seeded
    ledger = CallLedger(live)
    mark = ledger.mark()
    toggle(live, {"kuberay_operator": True})
    applied = [e for e in ledger.writes(mark) if e.get("kind") != "aws"]
    assert applied and {e["verb"] for e in applied} == {"patch"}, applied  # server-side apply, object by object
    assert any(e.get("name") == "rayclusters.ray.io" for e in applied)
    assert features(live)["kuberay_operator"]["enabled"]

    again = ledger.mark()
    toggle(live, {"kuberay_operator": True})
    ledger.assert_no_writes(since=again)  # neither AWS nor Kubernetes

    gone = ledger.mark()
    toggle(live, {"kuberay_operator": False})
    deleted = {e.get("name") for e in ledger.writes(gone) if e.get("verb") == "delete"}
    assert {"rayclusters.ray.io", "kuberay-operator"} <= deleted, deleted
    assert not features(live)["kuberay_operator"]["enabled"]


def test_the_inference_operator_brings_its_prerequisites_and_one_copy_of_each(
        seeded: tuple[LiveServer, dict[str, str]]) -> None:
    live, world = seeded
    ledger = CallLedger(live)
    # an imported cluster without the IAM OIDC provider its execution role (IRSA) trusts: refused, naming it
    mark = ledger.mark()
    refused = patch(live, {"hyperpod_inference_operator": True})
    assert refused.status_code == 409 and "aws iam create-open-id-connect-provider" in refused.text, refused.text
    ledger.assert_no_writes(since=mark)
    issuer = aws(world, "eks").describe_cluster(name=CLUSTER)["cluster"]["identity"]["oidc"]["issuer"]
    aws(world, "iam").create_open_id_connect_provider(Url=issuer, ClientIDList=["sts.amazonaws.com"])
    start = ledger.mark()
    view = toggle(live, {"hyperpod_inference_operator": True})
    assert [s["name"] for s in view["stages"]] == [
        "pod_identity_agent", "cert_manager", "metrics_server", "s3_csi_driver", "fsx_csi_driver",
        "load_balancer_controller", "hyperpod_inference_operator"]
    created = next(e["request"] for e in ledger.succeeded("eks", "CreateAddon", start)
                   if e["request"]["addonName"] == "amazon-sagemaker-hyperpod-inference")
    assert created["addonVersion"] == "v1.3.0-eksbuild.1"  # operator v3.2, the CRDs this project ships
    values = json.loads(created["configurationValues"])
    cluster_arn = aws(world, "sagemaker").describe_cluster(ClusterName=CLUSTER)["ClusterArn"]
    assert values == {"executionRoleArn": f"arn:aws:iam::123456789012:role/{CLUSTER}-hp-inference-operator-role",
                      "tlsCertificateS3Bucket": "instantstart-shared-123456789012-us-west-2",
                      "hyperpodClusterArn": cluster_arn, "alb": {"enabled": False}, "keda": {"enabled": False}}
    roles = {e["request"]["RoleName"] for e in ledger.succeeded("iam", "CreateRole", start)}
    assert roles == {f"{CLUSTER}-{suffix}" for suffix in ("s3-csi-role", "fsx-csi-role", "lbc-role",
                                                          "hp-inference-operator-role")}
    # its execution role trusts IRSA (the cluster's OIDC provider, its controller's service account only), and
    # the add-on gets no pod identity association
    assert "podIdentityAssociations" not in created
    issuer = aws(world, "eks").describe_cluster(name=CLUSTER)["cluster"]["identity"]["oidc"]["issuer"]
    host = issuer.removeprefix("https://")
    trust = aws(world, "iam").get_role(RoleName=f"{CLUSTER}-hp-inference-operator-role")["Role"][
        "AssumeRolePolicyDocument"]
    assert trust == {"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Principal": {"Federated": f"arn:aws:iam::123456789012:oidc-provider/{host}"},
        "Action": "sts:AssumeRoleWithWebIdentity", "Condition": {"StringEquals": {
            f"{host}:sub": "system:serviceaccount:hyperpod-inference-system:hyperpod-inference-controller-manager",
            f"{host}:aud": "sts.amazonaws.com"}}}]}
    assert not [a for a in aws(world, "eks").list_pod_identity_associations(clusterName=CLUSTER)["associations"]
                if a["namespace"] == "hyperpod-inference-system"]
    listed = features(live)
    assert set(listed["metrics_server"]["required_by"]) == {"hyperpod_inference_operator"}

    mark = ledger.mark()
    toggle(live, {"hyperpod_inference_operator": True})
    ledger.assert_no_writes(since=mark)

    off = toggle(live, {name: False for name in ("hyperpod_inference_operator", "load_balancer_controller",
                                                  "fsx_csi_driver", "s3_csi_driver", "metrics_server", "cert_manager",
                                                  "pod_identity_agent")})
    assert off["stages"][0]["name"] == "remove-hyperpod_inference_operator"
    assert leftovers(lambda s: aws(world, s), ledger.calls(since=start), CLUSTER) == []
    assert aws(world, "eks").list_addons(clusterName=CLUSTER)["addons"] == []
    assert not any(f["enabled"] for f in features(live).values())


def test_an_agent_toggles_a_feature_through_the_mcp_bridge(seeded: tuple[LiveServer, dict[str, str]]) -> None:
    """Following skills/managed-features.md: read the features, turn one on, follow it, re-send it (nothing
    changes), turn it off; a refused change comes back as the tool's error with the dependent named."""
    live, _ = seeded
    ledger = CallLedger(live)

    async def call(client: Client, tool: str, arguments: dict[str, Any]) -> tuple[bool, dict[str, Any], str]:
        result = await client.call_tool(tool, arguments)
        text = "".join(getattr(c, "text", "") for c in result.content)
        return bool(result.is_error), dict(result.structured_content or {}), text

    async def follow(client: Client, op_id: str) -> dict[str, Any]:
        for _ in range(10):
            failed, view, text = await call(client, "operations_wait", {"id": op_id, "timeout": 60})
            assert not failed, text
            if view["status"] in ("succeeded", "failed", "cancelled"):
                return view
        raise AssertionError(f"{op_id} did not end")

    async def agent() -> dict[str, Any]:
        params = StdioServerParameters(command=sys.executable, args=[
            "-m", "app.cli", "mcp", "--url", live.url, "--toolsets", "system,operations,clusters,features"],
                                       env={**clean_env(), "INSTANTSTART_TOKEN": live.admin_token}, cwd=str(ROOT))
        async with Client(params) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert tools["features_get"].annotations and tools["features_get"].annotations.read_only_hint
            update = tools["features_update"]
            assert update.annotations and update.annotations.destructive_hint
            assert "hyperpod_training_operator" in update.input_schema["properties"]
            failed, listed, text = await call(client, "features_get", {"cluster": CLUSTER})
            assert not failed, text
            assert not {f["name"]: f for f in listed["features"]}["hyperpod_training_operator"]["enabled"]
            failed, made, text = await call(client, "features_update",
                                            {"cluster": CLUSTER, "hyperpod_training_operator": True})
            assert not failed, text
            on = await follow(client, made["operation"]["id"])
            assert on["status"] == "succeeded", on
            mark = ledger.mark()
            failed, again, text = await call(client, "features_update",
                                             {"cluster": CLUSTER, "hyperpod_training_operator": True})
            assert not failed, text
            assert not any(s["acted"] for s in (await follow(client, again["operation"]["id"]))["stages"])
            ledger.assert_no_writes(since=mark)
            failed, _, text = await call(client, "features_update", {"cluster": CLUSTER, "cert_manager": False})
            assert failed and "hyperpod_training_operator" in text, text
            failed, gone, text = await call(client, "features_update", {
                "cluster": CLUSTER, "hyperpod_training_operator": False, "cert_manager": False,
                "pod_identity_agent": False})
            assert not failed, text
            return await follow(client, gone["operation"]["id"])

    off = anyio.run(agent)
    assert off["status"] == "succeeded", off
    assert not any(f["enabled"] for f in features(live).values())


def test_a_users_install_lacking_a_prerequisite_blocks_no_other_change(
        seeded: tuple[LiveServer, dict[str, str]]) -> None:
    live, world = seeded
    eks = aws(world, "eks")
    eks.create_addon(clusterName=CLUSTER, addonName="aws-mountpoint-s3-csi-driver")  # theirs, no pod identity agent
    wait_until(lambda: features(live)["s3_csi_driver"]["foreign"], 60, "the user's S3 CSI driver listed")
    assert not features(live)["pod_identity_agent"]["enabled"]
    toggle(live, {"metrics_server": True})  # not refused for a prerequisite this request does not touch
    toggle(live, {"metrics_server": False})
    eks.delete_addon(clusterName=CLUSTER, addonName="aws-mountpoint-s3-csi-driver")
    wait_until(lambda: eks.list_addons(clusterName=CLUSTER)["addons"] == [], 60, "the user's add-on gone")
