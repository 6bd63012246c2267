"""The instance-group prechecks as pure decisions over AWS's answers: a training plan holding several
reservations (the sandbox sells one per plan), the threads-per-core rule and its fallback."""

from __future__ import annotations

from typing import Any

import pytest

from services.clusters.options import InstanceTypeOption
from services.errors import Conflict, Invalid
from services.groups.checks import (
    check_karpenter_add,
    choose_reservation,
    reservation_cap,
    reservation_of,
    threads_per_core,
)

RC = "arn:aws:sagemaker:us-west-2:123456789012:reserved-capacity/rc-"
PLAN: dict[str, Any] = {  # DescribeTrainingPlan's answer for a plan of two reservations
    "TrainingPlanName": "two", "TrainingPlanArn": "arn:aws:sagemaker:us-west-2:123456789012:training-plan/two",
    "Status": "Active", "TotalInstanceCount": 6, "AvailableInstanceCount": 6, "TargetResources": ["hyperpod-cluster"],
    "ReservedCapacitySummaries": [
        {"ReservedCapacityArn": RC + "a", "InstanceType": "ml.p5.48xlarge", "TotalInstanceCount": 2,
         "Status": "Active", "AvailabilityZone": "us-west-2a"},
        {"ReservedCapacityArn": RC + "b", "InstanceType": "ml.p5en.48xlarge", "TotalInstanceCount": 4,
         "Status": "Active", "AvailabilityZone": "us-west-2b"}],
}


def test_a_plan_with_several_reservations_asks_which_one() -> None:
    with pytest.raises(Invalid) as asked:
        choose_reservation(PLAN, None, None, None, 1, spot=False)
    assert "holds 2 reservations" in asked.value.message
    assert [r["zone"] for r in asked.value.details["reservations"]] == ["us-west-2a", "us-west-2b"]


def test_the_chosen_reservation_decides_zone_type_and_cap() -> None:
    choice = choose_reservation(PLAN, RC + "b", None, None, 4, spot=False)
    assert (choice.zone, choice.instance_type, choice.cap) == ("us-west-2b", "ml.p5en.48xlarge", 4)
    assert "us-west-2b" in choice.decided[0] and RC + "b" in choice.decided[0]
    with pytest.raises(Invalid, match="at most 2 instances"):
        choose_reservation(PLAN, RC + "a", None, None, 3, spot=False)
    with pytest.raises(Invalid, match="reserves capacity in us-west-2a"):
        choose_reservation(PLAN, RC + "a", "us-west-2b", None, 1, spot=False)
    with pytest.raises(Invalid, match="no reservation"):
        choose_reservation(PLAN, RC + "z", None, None, 1, spot=False)


def test_the_plan_state_and_spot_rules() -> None:
    with pytest.raises(Invalid, match="Scheduled or Active"):
        choose_reservation({**PLAN, "Status": "Pending"}, RC + "a", None, None, 1, spot=False)
    with pytest.raises(Invalid, match="Spot"):
        choose_reservation(PLAN, RC + "a", None, None, 1, spot=True)


def test_a_plan_not_bought_for_hyperpod_clusters_is_refused() -> None:
    for targets in (["training-job"], []):
        with pytest.raises(Invalid, match="not hyperpod-cluster") as refused:
            choose_reservation({**PLAN, "TargetResources": targets}, RC + "a", None, None, 1, spot=False)
        assert refused.value.details["target_resources"] == targets
    without = {k: v for k, v in PLAN.items() if k != "TargetResources"}
    with pytest.raises(Invalid, match="not hyperpod-cluster"):
        choose_reservation(without, RC + "a", None, None, 1, spot=False)


def test_the_cap_is_the_chosen_reservations_free_instances() -> None:
    """Plan-wide 6 are free, but reservation b (4 x p5en) already runs 3 in a group of the cluster: 1 is left
    on it, whatever the other reservation holds."""
    groups = [{"InstanceGroupName": "g", "TrainingPlanArn": PLAN["TrainingPlanArn"],
               "InstanceType": "ml.p5en.48xlarge", "TargetCount": 3},
              {"InstanceGroupName": "od", "InstanceType": "ml.p5en.48xlarge", "TargetCount": 5}]
    assert choose_reservation(PLAN, RC + "b", None, None, 1, spot=False, groups=groups).cap == 1
    with pytest.raises(Invalid, match="at most 1 instances") as refused:
        choose_reservation(PLAN, RC + "b", None, None, 2, spot=False, groups=groups)
    assert refused.value.details["max_count"] == 1
    assert choose_reservation(PLAN, RC + "a", None, None, 2, spot=False, groups=groups).cap == 2
    rc = reservation_of(PLAN, groups[0])
    assert rc is not None and rc["ReservedCapacityArn"] == RC + "b"
    assert reservation_cap(PLAN, rc, groups) == (4, 1), "scaling g: its own reservation's free instances"
    assert reservation_cap({**PLAN, "AvailableInstanceCount": 0}, rc, groups) == (4, 0), "never above the plan's"


def option(name: str, valid: list[int], default: int | None) -> InstanceTypeOption:
    return InstanceTypeOption(instance_type=name, zones=["us-west-2a"], threads_per_core=valid,
                              default_threads_per_core=default)


def test_threads_per_core_come_from_the_types_facts_else_the_heuristic() -> None:
    assert threads_per_core(None, option("ml.g5.8xlarge", [1, 2], 2), False)[0] == 2
    assert threads_per_core(None, option("ml.c7g.16xlarge", [1], 1), False)[0] == 1
    assert threads_per_core(1, option("ml.g5.8xlarge", [1, 2], 2), False)[0] == 1
    with pytest.raises(Invalid, match="accepts threads per core"):
        threads_per_core(2, option("ml.c7g.16xlarge", [1], 1), False)
    value, why = threads_per_core(None, option("ml.p5.48xlarge", [], None), False)
    assert value == 2 and "heuristic" in why
    assert threads_per_core(None, option("ml.g5.8xlarge", [], None), True)[0] == 2
    assert threads_per_core(None, option("ml.g5.8xlarge", [], None), False)[0] == 1


def test_managed_karpenter_refuses_a_group_with_deep_health_checks() -> None:
    on = {"ClusterName": "c", "AutoScaling": {"Mode": "Enable", "AutoScalerType": "Karpenter"}}
    with pytest.raises(Conflict, match="deep health checks") as refused:
        check_karpenter_add(on, "g", ["InstanceStress"])
    assert refused.value.details["rule"] == "karpenter-no-deep-health-checks"
    check_karpenter_add(on, "g", [])
    check_karpenter_add({**on, "AutoScaling": {"Mode": "Disable"}}, "g", ["InstanceStress"])
    check_karpenter_add({"ClusterName": "c"}, "g", ["InstanceStress"])
