"""Instance groups through REST against a real server in sandbox mode, on the seeded cluster imported here:
add (each capacity type, a zone the cluster's subnets miss), scale to 0 and back, labels and taints, a
re-sent state that writes nothing, the fixed-field refusal, delete — asserting the UpdateCluster payloads
the sandbox's ledger recorded (every other group sent unchanged)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx2
import pytest
from kubernetes import client as k8s

from services.groups.spec import group_spec
from services.settings import Settings
from tests.create_support import held_answers
from tests.ledger import CallLedger
from tests.node_support import kube
from tests.sandbox_support import SeededServer, client, seeded_server
from tests.support import LiveServer, wait_until

pytestmark = pytest.mark.slow
EKS = "groups-eks"
BASE = f"/api/v1/clusters/{EKS}/instance-groups"


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeededServer]:
    with seeded_server(tmp_path_factory.mktemp("groups"), EKS, nodes=1) as server:
        accepted = server.live.post("/api/v1/clusters/import", {"eks_cluster": EKS, "hyperpod_cluster": EKS})
        assert accepted.status_code == 202, accepted.text
        done = server.live.get(f"/api/v1/operations/{accepted.json()['operation']['id']}/wait?timeout=120").json()
        assert done["status"] == "succeeded", done
        yield server


def request(live: LiveServer, method: str, path: str, body: Any = None, token: str | None = None) -> httpx2.Response:
    return httpx2.request(method, live.url + path, json=body if body is not None else {},
                          headers=live.headers(token), timeout=60)


def finished(live: LiveServer, reply: httpx2.Response) -> dict[str, Any]:
    assert reply.status_code == 202, reply.text
    op_id = reply.json()["operation"]["id"]
    for _ in range(20):
        view = dict(live.get(f"/api/v1/operations/{op_id}/wait?timeout=120").json())
        if view["status"] in ("succeeded", "failed", "cancelled"):
            return view
    raise AssertionError(f"{op_id} did not end")


def brief(view: dict[str, Any]) -> str:
    return f"{view['status']}: {view.get('error')}; " + "; ".join(f"{s['name']}: {s.get('message')}"
                                                              for s in view.get("stages", []))


def sagemaker(seeded: SeededServer) -> Any:
    return client(settings_of(seeded), "sagemaker")


def described(seeded: SeededServer) -> dict[str, Any]:
    return dict(sagemaker(seeded).describe_cluster(ClusterName=EKS))


def group(seeded: SeededServer, name: str) -> dict[str, Any] | None:
    return next((g for g in described(seeded)["InstanceGroups"] if g["InstanceGroupName"] == name), None)


def others_unchanged(sent: list[dict[str, Any]], before: dict[str, Any], changed: str) -> None:
    """Every group but ``changed`` went out exactly as DescribeCluster described it before."""
    expected = {g["InstanceGroupName"]: group_spec(g) for g in before["InstanceGroups"] if g["InstanceGroupName"]
                != changed}
    got = {g["InstanceGroupName"]: g for g in sent if g["InstanceGroupName"] != changed}
    assert got == expected


def zones(seeded: SeededServer) -> tuple[str, str]:
    """(the zone of the cluster's own subnet, another zone)."""
    ec2 = client_ec2(seeded)
    subnet = described(seeded)["VpcConfig"]["Subnets"][0]
    home = ec2.describe_subnets(SubnetIds=[subnet])["Subnets"][0]["AvailabilityZone"]
    other = next(z["ZoneName"] for z in ec2.describe_availability_zones()["AvailabilityZones"] if z["ZoneName"] != home)
    return home, other


def settings_of(seeded: SeededServer) -> Settings:
    return Settings(data_dir=seeded.live.data_dir, sandbox=True, sandbox_aws_port=seeded.aws_port)


def client_ec2(seeded: SeededServer) -> Any:
    return client(settings_of(seeded), "ec2")


def test_add_scale_to_zero_and_back_relabel_and_delete(seeded: SeededServer) -> None:
    live, ledger = seeded.live, CallLedger(seeded.live)
    home, _ = zones(seeded)
    before = described(seeded)
    mark = ledger.mark()
    added = request(live, "POST", BASE, {"name": "extra", "instance_type": "ml.g5.8xlarge", "count": 1, "zone": home,
                                         "ebs_volume_gib": 200, "labels": {"team": "a"},
                                         "taints": [{"key": "dedicated", "value": "a", "effect": "NoSchedule"}]})
    assert added.status_code == 202, added.text
    assert any("the cluster's, in" in d for d in added.json()["decided"]), added.json()
    view = finished(live, added)
    assert view["status"] == "succeeded", brief(view)
    assert view["target"] == f"cluster/{EKS}/group/extra"
    sent = ledger.once("sagemaker", "UpdateCluster", since=mark)["request"]
    others_unchanged(sent["InstanceGroups"], before, "extra")
    new = next(g for g in sent["InstanceGroups"] if g["InstanceGroupName"] == "extra")
    assert new["InstanceType"] == "ml.g5.8xlarge" and new["InstanceCount"] == 1
    assert new["CapacityRequirements"] == {"OnDemand": {}} and "OverrideVpcConfig" not in new
    assert new["InstanceStorageConfigs"] == [{"EbsVolumeConfig": {"VolumeSizeInGB": 200}}]
    assert new["KubernetesConfig"] == {"Labels": {"team": "a"},
                                       "Taints": [{"Key": "dedicated", "Value": "a", "Effect": "NoSchedule"}]}
    assert ledger.writes(mark, service="ec2") == [], "the cluster's own subnet serves the zone: no subnet made"
    listed = {g["name"]: g for g in live.get(BASE + "?refresh=true").json()}
    assert listed["extra"]["current_count"] == 1 and listed["extra"]["labels"] == {"team": "a"}

    # scale to zero: InstanceCount 0 with MinInstanceCount 0, every other group unchanged
    before, mark = described(seeded), ledger.mark()
    view = finished(live, request(live, "PATCH", BASE + "/extra", {"count": 0}))
    assert view["status"] == "succeeded", brief(view)
    sent = ledger.once("sagemaker", "UpdateCluster", since=mark)["request"]["InstanceGroups"]
    others_unchanged(sent, before, "extra")
    scaled = next(g for g in sent if g["InstanceGroupName"] == "extra")
    assert scaled == {**group_spec(group_of(before, "extra")), "InstanceCount": 0, "MinInstanceCount": 0}
    now = group(seeded, "extra")
    assert now is not None and now["CurrentCount"] == 0 and now["TargetCount"] == 0

    # and back to one
    mark = ledger.mark()
    view = finished(live, request(live, "PATCH", BASE + "/extra", {"count": 1}))
    assert view["status"] == "succeeded", brief(view)
    back = next(g for g in ledger.once("sagemaker", "UpdateCluster", since=mark)["request"]["InstanceGroups"]
                if g["InstanceGroupName"] == "extra")
    assert back["InstanceCount"] == 1 and back["KubernetesConfig"]["Labels"] == {"team": "a"}, "nothing dropped"
    assert (group(seeded, "extra") or {}).get("CurrentCount") == 1

    # the current state again: a no-op operation, no AWS write
    mark = ledger.mark()
    view = finished(live, request(live, "PATCH", BASE + "/extra", {"count": 1, "labels": {"team": "a"}}))
    assert view["status"] == "succeeded" and view["stages"][0]["message"] == "already in the desired state", view
    ledger.assert_no_writes(mark)

    # labels and taints replace the sets; the taints left out are removed
    mark = ledger.mark()
    view = finished(live, request(live, "PATCH", BASE + "/extra", {"labels": {"team": "b"}, "taints": []}))
    assert view["status"] == "succeeded", brief(view)
    relabelled = next(g for g in ledger.once("sagemaker", "UpdateCluster", since=mark)["request"]["InstanceGroups"]
                      if g["InstanceGroupName"] == "extra")
    assert relabelled["KubernetesConfig"] == {"Labels": {"team": "b"}, "Taints": []}, "a cleared set is sent empty"
    mark = ledger.mark()
    view = finished(live, request(live, "PATCH", BASE + "/extra", {"labels": {}, "taints": []}))
    assert view["status"] == "succeeded", brief(view)
    cleared = next(g for g in ledger.once("sagemaker", "UpdateCluster", since=mark)["request"]["InstanceGroups"]
                   if g["InstanceGroupName"] == "extra")
    assert cleared["KubernetesConfig"] == {"Labels": {}, "Taints": []}
    assert not (group(seeded, "extra") or {}).get("KubernetesConfig", {}).get("DesiredLabels")
    mark = ledger.mark()
    view = finished(live, request(live, "PATCH", BASE + "/extra", {"labels": {}, "taints": []}))
    assert view["status"] == "succeeded" and view["stages"][0]["message"] == "already in the desired state", view
    ledger.assert_no_writes(mark)

    # delete: admin only, InstanceGroupsToDelete, the group gone
    operator = live.make_token("operator")
    mark = ledger.mark()
    refused = request(live, "DELETE", BASE + "/extra", token=operator)
    assert refused.status_code == 403, refused.text
    view = finished(live, request(live, "DELETE", BASE + "/extra"))
    assert view["status"] == "succeeded", brief(view)
    deleted = ledger.once("sagemaker", "UpdateCluster", since=mark)["request"]
    assert deleted["InstanceGroupsToDelete"] == ["extra"] and "InstanceGroups" not in deleted
    assert group(seeded, "extra") is None
    assert "extra" not in {g["name"] for g in live.get(BASE + "?refresh=true").json()}


def group_of(cluster: dict[str, Any], name: str) -> dict[str, Any]:
    """The group ``name`` of a DescribeCluster answer or an UpdateCluster request."""
    return next(g for g in cluster["InstanceGroups"] if g["InstanceGroupName"] == name)


def test_a_spot_group_in_another_zone_gets_a_compute_subnet_there(seeded: SeededServer) -> None:
    live, ledger = seeded.live, CallLedger(seeded.live)
    _, other = zones(seeded)
    mark = ledger.mark()
    added = request(live, "POST", BASE, {"name": "spot", "instance_type": "ml.g5.8xlarge", "count": 1, "zone": other,
                                         "capacity_type": "spot", "deep_health_checks": ["InstanceStress"]})
    assert added.status_code == 202, added.text
    view = finished(live, added)
    assert view["status"] == "succeeded", brief(view)
    assert [s["name"] for s in view["stages"]] == ["subnet", "update"]
    made = ledger.once("ec2", "CreateSubnet", since=mark)["request"]
    assert made.get("AvailabilityZone") == other or made.get("AvailabilityZoneId"), made
    subnet = view["stages"][0]["result"]["subnet"]
    new = group_of({"InstanceGroups": ledger.once("sagemaker", "UpdateCluster", since=mark)["request"]
                    ["InstanceGroups"]}, "spot")
    assert new["CapacityRequirements"] == {"Spot": {}} and new["OnStartDeepHealthChecks"] == ["InstanceStress"]
    assert new["OverrideVpcConfig"]["Subnets"] == [subnet]
    assert new["OverrideVpcConfig"]["SecurityGroupIds"] == described(seeded)["VpcConfig"]["SecurityGroupIds"]
    shown = live.get(BASE + "/spot?refresh=true").json()
    assert shown["capacity_type"] == "spot" and shown["subnets"] == [subnet]
    assert shown["deep_health_checks"] == ["InstanceStress"] and shown["current_count"] == 1

    # capacity type and EFA-only are fixed for the group's life: refused before anything is written
    mark = ledger.mark()
    for body, field in (({"capacity_type": "on-demand"}, "capacity_type"), ({"efa_only": True}, "efa_only")):
        refused = request(live, "PATCH", BASE + "/spot", body)
        assert refused.status_code == 409, refused.text
        error = refused.json()["error"]
        assert "fixed for" in error["message"] and error["details"]["field"] == field, error
    ledger.assert_no_writes(mark)
    assert live.get("/api/v1/operations?kind=instance_group.update&target=" + f"cluster/{EKS}/group/spot").json() == []
    finished(live, request(live, "DELETE", BASE + "/spot"))


def test_bad_choices_are_refused_with_the_valid_ones(seeded: SeededServer) -> None:
    live, ledger = seeded.live, CallLedger(seeded.live)
    home, _ = zones(seeded)
    mark = ledger.mark()
    efa = request(live, "POST", BASE, {"name": "efa", "instance_type": "ml.g5.8xlarge", "count": 1, "zone": home,
                                       "efa_only": True})
    assert efa.status_code == 422, efa.text
    assert "more than one EFA interface" in efa.json()["error"]["message"]
    able = efa.json()["error"]["details"]["instance_types"]
    assert able and "ml.g5.8xlarge" not in able
    unknown = request(live, "POST", BASE, {"name": "nope", "instance_type": "ml.g5.9xlarge", "count": 1, "zone": home})
    assert unknown.status_code == 422 and "ml.g5.8xlarge" in unknown.json()["error"]["details"]["instance_types"]
    quota = request(live, "POST", BASE, {"name": "big", "instance_type": "ml.g5.8xlarge", "count": 50, "zone": home})
    assert quota.status_code == 422 and "quota" in quota.json()["error"]["message"], quota.text
    exists = request(live, "POST", BASE, {"name": "workers", "instance_type": "ml.g5.8xlarge", "count": 1,
                                          "zone": home})
    assert exists.status_code == 409, exists.text
    missing = request(live, "PATCH", BASE + "/ghost", {"count": 1})
    assert missing.status_code == 404 and "workers" in missing.json()["error"]["message"]
    ledger.assert_no_writes(mark)


RESERVABLE = ("ml.p5.4xlarge", "ml.p4d.24xlarge", "ml.p5.48xlarge", "ml.trn1.32xlarge")  # SearchTrainingPlan...


def reservable(seeded: SeededServer, zone: str = "us-west-2a") -> str:
    """A type training plans reserve that ``zone`` offers, with a cluster-usage quota raised to 8 (a new account
    has none for these: the sandbox approves the increase at once)."""
    offered = {t["instance_type"] for t in seeded.live.get(f"/api/v1/clusters/options?zone={zone}").json()[
        "instance_types"]}
    kind = next(t for t in RESERVABLE if t in offered)
    quotas = client(settings_of(seeded), "service-quotas")
    quota = next(q for page in quotas.get_paginator("list_service_quotas").paginate(ServiceCode="sagemaker")
                 for q in page["Quotas"] if q["QuotaName"] == f"{kind} for cluster usage")
    if quota["Value"] < 8:
        quotas.request_service_quota_increase(ServiceCode="sagemaker", QuotaCode=quota["QuotaCode"], DesiredValue=8)
    return kind


def plan(seeded: SeededServer, name: str, kind: str, count: int = 2, hours: int = 24,
         target: str = "hyperpod-cluster") -> dict[str, Any]:
    """A training plan bought through the sandbox's SageMaker API (its first offering), once it is Scheduled or
    Active."""
    sm = sagemaker(seeded)
    offerings = sm.search_training_plan_offerings(InstanceType=kind, InstanceCount=count, DurationHours=hours,
                                                  TargetResources=[target])
    offering = offerings["TrainingPlanOfferings"][0]
    sm.create_training_plan(TrainingPlanName=name, TrainingPlanOfferingId=offering["TrainingPlanOfferingId"])
    return dict(wait_until(lambda: (p := sm.describe_training_plan(TrainingPlanName=name))["Status"] != "Pending"
                           and p, 60, f"training plan {name} bought"))


def test_a_training_plan_decides_zone_and_type_and_caps_the_count(seeded: SeededServer) -> None:
    live, ledger = seeded.live, CallLedger(seeded.live)
    kind = reservable(seeded)
    bought = plan(seeded, "plan-a", kind)
    reserved = bought["ReservedCapacitySummaries"][0]
    other_zone = next(z for z in ("us-west-2a", "us-west-2b") if z != reserved["AvailabilityZone"])
    mark = ledger.mark()
    refusals = {
        "zone": ({"zone": other_zone}, "reserves capacity in"),
        "instance_type": ({"instance_type": "ml.g5.4xlarge"}, f"reserves {kind}"),
        "max_count": ({"count": 3}, "at most 2 instances"),
        "spot": ({"capacity_type": "spot"}, "cannot be combined with Spot"),
    }
    for what, (extra, said) in refusals.items():
        refused = request(live, "POST", BASE, {"name": "planned", "count": 1, "training_plan": "plan-a", **extra})
        assert refused.status_code == 422, (what, refused.text)
        assert said in refused.json()["error"]["message"], (what, refused.json())
    ledger.assert_no_writes(mark)

    added = request(live, "POST", BASE, {"name": "planned", "count": 2, "training_plan": bought["TrainingPlanArn"]})
    assert added.status_code == 202, added.text
    decided = " ".join(added.json()["decided"])
    assert f"zone {reserved['AvailabilityZone']} and instance type {kind}" in decided, decided
    assert "capacity type training-plan" in decided
    assert all(item in added.json()["message"] for item in added.json()["decided"])
    view = finished(live, added)
    assert view["status"] == "succeeded", brief(view)
    new = group_of({"InstanceGroups": ledger.once("sagemaker", "UpdateCluster", since=mark)["request"]
                    ["InstanceGroups"]}, "planned")
    assert new["TrainingPlanArn"] == bought["TrainingPlanArn"] and new["InstanceType"] == kind
    assert "CapacityRequirements" not in new and new["InstanceCount"] == 2
    shown = live.get(BASE + "/planned?refresh=true").json()
    assert shown["capacity_type"] == "training-plan" and shown["training_plan_status"] in ("Scheduled", "Active")

    # the plan is fully used now: growing the group is refused with the plan's free count
    grow = request(live, "PATCH", BASE + "/planned", {"count": 3})
    assert grow.status_code == 422 and grow.json()["error"]["details"]["max_count"] == 2, grow.text
    fixed = request(live, "PATCH", BASE + "/planned", {"capacity_type": "on-demand"})
    assert fixed.status_code == 409 and "training-plan" in fixed.json()["error"]["message"], fixed.text
    finished(live, request(live, "DELETE", BASE + "/planned"))


def test_a_plan_that_is_not_scheduled_or_active_is_refused(seeded: SeededServer) -> None:
    live, ledger = seeded.live, CallLedger(seeded.live)
    plan(seeded, "plan-short", reservable(seeded), hours=1)
    sm = sagemaker(seeded)
    wait_until(lambda: sm.describe_training_plan(TrainingPlanName="plan-short")["Status"] == "Expired", 60,
               "the one-hour plan to expire")
    mark = ledger.mark()
    refused = request(live, "POST", BASE, {"name": "late", "count": 1, "training_plan": "plan-short"})
    assert refused.status_code == 422, refused.text
    assert "Expired" in refused.json()["error"]["message"] and "Scheduled or Active" in refused.json()["error"][
        "message"]
    ledger.assert_no_writes(mark)


def test_a_plan_bought_for_training_jobs_is_refused(seeded: SeededServer) -> None:
    live, ledger = seeded.live, CallLedger(seeded.live)
    bought = plan(seeded, "plan-jobs", reservable(seeded), target="training-job")
    assert bought["TargetResources"] == ["training-job"]
    mark = ledger.mark()
    refused = request(live, "POST", BASE, {"name": "jobs", "count": 1, "training_plan": "plan-jobs"})
    assert refused.status_code == 422, refused.text
    assert "not hyperpod-cluster" in refused.json()["error"]["message"], refused.json()
    assert refused.json()["error"]["details"]["target_resources"] == ["training-job"]
    ledger.assert_no_writes(mark)


def test_an_eks_managed_node_group_is_listed_scaled_and_deleted(seeded: SeededServer, tmp_path: Path) -> None:
    live, ledger = seeded.live, CallLedger(seeded.live)
    eks = client(settings_of(seeded), "eks")
    subnets = eks.describe_cluster(name=EKS)["cluster"]["resourcesVpcConfig"]["subnetIds"]
    eks.create_nodegroup(clusterName=EKS, nodegroupName="system", subnets=subnets, instanceTypes=["m5.large"],
                         nodeRole="arn:aws:iam::123456789012:role/eks-node",
                         scalingConfig={"minSize": 1, "maxSize": 2, "desiredSize": 1})
    wait_until(lambda: eks.describe_nodegroup(clusterName=EKS, nodegroupName="system")["nodegroup"]["status"]
               == "ACTIVE", 60, "the node group ACTIVE")
    listed = {g["name"]: g for g in live.get(BASE + "?refresh=true").json()}
    assert listed["system"]["kind"] == "eks-nodegroup" and listed["system"]["target_count"] == 1
    assert listed["workers"]["kind"] == "hyperpod"

    mark = ledger.mark()
    refused = request(live, "PATCH", BASE + "/system", {"auto_patch_off": True})
    assert refused.status_code == 422 and "only its count, labels and taints" in refused.text, refused.text
    too_long = request(live, "PATCH", BASE + "/system", {"labels": {"example.com/" + "k" * 60: "v"}})
    assert too_long.status_code == 422 and "at most 63 characters" in too_long.text, too_long.text
    ledger.assert_no_writes(mark)

    # labels and taints (whole sets, as for a HyperPod group): UpdateNodegroupConfig with only the difference,
    # and EKS relabels the group's Nodes (one joined here, as EKS labels it), keeping what it does not set
    core = k8s.CoreV1Api(kube(seeded, tmp_path, EKS))
    core.create_node({"metadata": {"name": "ip-10-0-0-9", "labels": {"eks.amazonaws.com/nodegroup": "system",
                                                                      "mine": "kept"}},
                      "spec": {"taints": [{"key": "theirs", "effect": "NoSchedule"}]}})
    body = {"labels": {"tier": "system", "team": "infra"}, "taints": [{"key": "dedicated", "value": "system",
                                                                      "effect": "NoSchedule"}]}
    view = finished(live, request(live, "PATCH", BASE + "/system", body))
    assert view["status"] == "succeeded" and [s["name"] for s in view["stages"]] == ["nodegroup"], brief(view)
    sent = ledger.once("eks", "UpdateNodegroupConfig", since=mark)["request"]
    sent.pop("clientRequestToken")  # botocore's idempotency token
    assert sent == {"clusterName": EKS, "nodegroupName": "system",
                    "labels": {"addOrUpdateLabels": {"tier": "system", "team": "infra"}},
                    "taints": {"addOrUpdateTaints": [{"key": "dedicated", "value": "system", "effect": "NO_SCHEDULE"}]}}
    shown = next(g for g in live.get(BASE + "?refresh=true").json() if g["name"] == "system")
    assert shown["labels"] == body["labels"] and shown["taints"] == [
        {"Key": "dedicated", "Value": "system", "Effect": "NoSchedule"}]
    node = core.read_node("ip-10-0-0-9")
    assert {"tier": "system", "team": "infra", "mine": "kept"}.items() <= node.metadata.labels.items()
    assert {(t.key, t.value, t.effect) for t in node.spec.taints} == {("theirs", None, "NoSchedule"),
                                                                      ("dedicated", "system", "NoSchedule")}
    again = ledger.mark()
    view = finished(live, request(live, "PATCH", BASE + "/system", body))
    assert view["status"] == "succeeded" and view["stages"][0]["message"] == "already in the desired state", view
    ledger.assert_no_writes(again)
    mark = ledger.mark()
    view = finished(live, request(live, "PATCH", BASE + "/system", {"labels": {"tier": "system"}, "taints": []}))
    assert view["status"] == "succeeded", brief(view)
    sent = ledger.once("eks", "UpdateNodegroupConfig", since=mark)["request"]
    assert {k: v for k, v in sent.items() if k != "clientRequestToken"} == {
        "clusterName": EKS, "nodegroupName": "system", "labels": {"removeLabels": ["team"]},
        "taints": {"removeTaints": [{"key": "dedicated", "value": "system", "effect": "NO_SCHEDULE"}]}}
    node = core.read_node("ip-10-0-0-9")
    assert "team" not in node.metadata.labels and [t.key for t in node.spec.taints] == ["theirs"]
    core.delete_node("ip-10-0-0-9")

    mark = ledger.mark()
    view = finished(live, request(live, "PATCH", BASE + "/system", {"count": 0}))
    assert view["status"] == "succeeded" and [s["name"] for s in view["stages"]] == ["nodegroup"], brief(view)
    scaled = ledger.once("eks", "UpdateNodegroupConfig", since=mark)["request"]
    assert scaled["scalingConfig"] == {"desiredSize": 0, "minSize": 0, "maxSize": 2}
    assert ledger.succeeded("sagemaker", "UpdateCluster", since=mark) == []

    view = finished(live, request(live, "DELETE", BASE + "/system"))
    assert view["status"] == "succeeded", brief(view)
    ledger.once("eks", "DeleteNodegroup", since=mark)
    assert "system" not in {g["name"] for g in live.get(BASE + "?refresh=true").json()}


def test_an_eks_node_group_busy_with_another_update(seeded: SeededServer) -> None:
    """Refused while UPDATING (as EKS would, nothing written); and a change accepted just before another
    update began is sent once that one ends, not taken as done because the group came back ACTIVE."""
    live, ledger = seeded.live, CallLedger(seeded.live)
    eks = client(settings_of(seeded), "eks")
    subnets = eks.describe_cluster(name=EKS)["cluster"]["resourcesVpcConfig"]["subnetIds"]
    eks.create_nodegroup(clusterName=EKS, nodegroupName="busy", subnets=subnets, instanceTypes=["m5.large"],
                         nodeRole="arn:aws:iam::123456789012:role/eks-node",
                         scalingConfig={"minSize": 1, "maxSize": 2, "desiredSize": 1})

    def status() -> str:
        return str(eks.describe_nodegroup(clusterName=EKS, nodegroupName="busy")["nodegroup"]["status"])

    # the sandbox's clock runs fast (an update lasts a few of its ms): an update the verb did not see in time
    # goes through, and the next try starts another
    for attempt in range(20):
        wait_until(lambda: status() == "ACTIVE", 60, "the node group ACTIVE")
        eks.update_nodegroup_config(clusterName=EKS, nodegroupName="busy", scalingConfig={"maxSize": 3 + attempt % 2})
        mark = ledger.mark()
        refused = request(live, "PATCH", BASE + "/busy", {"labels": {"try": str(attempt)}})
        if refused.status_code == 202:
            assert finished(live, refused)["status"] == "succeeded"
            continue
        assert refused.status_code == 409 and "is UPDATING" in refused.text, refused.text
        assert refused.json()["error"]["details"]["status"] == "UPDATING", refused.text
        ledger.assert_no_writes(mark)
        break
    else:
        raise AssertionError("the verb never read the node group UPDATING in 20 tries")
    wait_until(lambda: status() == "ACTIVE", 60, "the other update to end")

    # the verb reads the group ACTIVE; its answer is held while another update starts, then let go
    fault = live.post("/api/v1/sandbox/faults", {"kind": "hold_response", "count": 1, "target": {
        "service": "eks", "operation": "DescribeNodegroup"}})
    assert fault.status_code == 201, fault.text
    fault_id = fault.json()["id"]
    mark = ledger.mark()
    with ThreadPoolExecutor(1) as pool:
        reply = pool.submit(request, live, "PATCH", BASE + "/busy", {"labels": {"tier": "busy"}})
        wait_until(lambda: held_answers(live, fault_id) == 1, 60, "the verb's DescribeNodegroup held")
        eks.update_nodegroup_config(clusterName=EKS, nodegroupName="busy", scalingConfig={"maxSize": 5})
        released = httpx2.delete(f"{live.url}/api/v1/sandbox/faults/{fault_id}", headers=live.headers(), timeout=30)
        assert released.status_code == 200, released.text
        view = finished(live, reply.result(60))
    assert view["status"] == "succeeded", brief(view)
    sent = ledger.succeeded("eks", "UpdateNodegroupConfig", since=mark)
    ours = [c["request"] for c in sent if "labels" in c["request"]]
    assert len(ours) == 1 and ours[0]["labels"]["addOrUpdateLabels"] == {"tier": "busy"}, ours
    group = eks.describe_nodegroup(clusterName=EKS, nodegroupName="busy")["nodegroup"]
    assert group["labels"] == {"tier": "busy"} and group["scalingConfig"]["maxSize"] == 5, group
    eks.delete_nodegroup(clusterName=EKS, nodegroupName="busy")
    wait_until(lambda: "busy" not in eks.list_nodegroups(clusterName=EKS)["nodegroups"], 60, "the node group gone")


def test_automatic_patching_and_a_software_update(seeded: SeededServer) -> None:
    live, ledger = seeded.live, CallLedger(seeded.live)
    mark = ledger.mark()
    patch = {"strategy": "DrainFirst", "drain_timeout_seconds": 600, "on_drain_timeout": "Skip"}
    view = finished(live, request(live, "PATCH", BASE + "/workers", {"auto_patch": patch}))
    assert view["status"] == "succeeded", brief(view)
    sent = group_of(ledger.once("sagemaker", "UpdateCluster", since=mark)["request"], "workers")
    assert sent["AutoPatchConfig"] == {"PatchingStrategy": "DrainFirst",
                                       "DrainPolicy": {"DrainTimeoutInSeconds": 600, "OnDrainTimeout": "Skip"}}
    assert live.get(BASE + "/workers?refresh=true").json()["auto_patch"]["PatchingStrategy"] == "DrainFirst"
    # a next patch date: parsed (422 when it is not ISO 8601 with an offset), and a re-send in another
    # spelling of the same moment is a no-op without a write
    mark = ledger.mark()
    for bad in ("next week", "2026-12-24T03:00:00"):
        refused = request(live, "PATCH", BASE + "/workers", {"auto_patch": {**patch, "next_patch_date": bad}})
        assert refused.status_code == 422, refused.text
    ledger.assert_no_writes(mark)
    dated = {**patch, "next_patch_date": "2026-12-24T05:00:00+02:00"}
    view = finished(live, request(live, "PATCH", BASE + "/workers", {"auto_patch": dated}))
    assert view["status"] == "succeeded", brief(view)
    sent = group_of(ledger.once("sagemaker", "UpdateCluster", since=mark)["request"], "workers")
    moment = datetime(2026, 12, 24, 3, tzinfo=UTC).timestamp()  # the wire's epoch seconds
    assert sent["AutoPatchConfig"]["PatchSchedule"] == {"NextPatchDate": moment}
    mark = ledger.mark()
    again = {**patch, "next_patch_date": "2026-12-24T03:00:00Z"}
    view = finished(live, request(live, "PATCH", BASE + "/workers", {"auto_patch": again}))
    assert view["status"] == "succeeded" and view["stages"][0]["message"] == "already in the desired state", view
    ledger.assert_no_writes(mark)
    mark = ledger.mark()
    view = finished(live, request(live, "PATCH", BASE + "/workers", {"auto_patch_off": True}))
    assert view["status"] == "succeeded", brief(view)
    assert "AutoPatchConfig" not in group_of(ledger.once("sagemaker", "UpdateCluster", since=mark)["request"],
                                             "workers")

    mark = ledger.mark()
    view = finished(live, request(live, "POST", BASE + "/workers/software-update", {"image_release": "2025.6.0"}))
    assert view["status"] == "succeeded", brief(view)
    assert ledger.once("sagemaker", "UpdateClusterSoftware", since=mark)["request"]["InstanceGroups"] == [
        {"InstanceGroupName": "workers", "ImageReleaseVersion": "2025.6.0"}]
    assert (group(seeded, "workers") or {})["CurrentImageReleaseVersion"] == "2025.6.0"
    view = finished(live, request(live, "POST", BASE + "/workers/software-update", {}))
    assert view["status"] == "succeeded", brief(view)
    shown = live.get(BASE + "/workers?refresh=true").json()
    assert shown["image_status"] == "UpToDate", shown
    mark = ledger.mark()
    view = finished(live, request(live, "POST", BASE + "/workers/software-update", {}))
    assert view["stages"][0]["message"] == "already in the desired state", brief(view)
    ledger.assert_no_writes(mark)


def test_an_efa_only_group_for_a_type_with_several_efa_interfaces(seeded: SeededServer) -> None:
    live, ledger = seeded.live, CallLedger(seeded.live)
    home, _ = zones(seeded)
    options = live.get(f"/api/v1/clusters/options?zone={home}").json()["instance_types"]
    able = sorted(t["instance_type"] for t in options if t["efa_interfaces"] > 1)
    assert able, "the zone offers types with more than one EFA interface"
    mark = ledger.mark()
    view = finished(live, request(live, "POST", BASE, {"name": "fabric", "instance_type": able[0], "count": 0,
                                                       "zone": home, "efa_only": True}))
    assert view["status"] == "succeeded", brief(view)
    new = group_of(ledger.once("sagemaker", "UpdateCluster", since=mark)["request"], "fabric")
    assert new["NetworkInterface"] == {"InterfaceType": "efa-only"} and new["InstanceCount"] == 0
    shown = live.get(BASE + "/fabric?refresh=true").json()
    assert shown["efa_only"] is True and shown["current_count"] == 0
    finished(live, request(live, "DELETE", BASE + "/fabric"))
