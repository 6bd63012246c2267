"""The instance-group prechecks as pure decisions over AWS's answers: a training plan holding several
reservations (the sandbox sells one per plan), the threads-per-core rule and its fallback."""

from __future__ import annotations

from typing import Any

import pytest

from services.clusters.options import InstanceTypeOption
from services.errors import Invalid
from services.groups.checks import choose_reservation, threads_per_core

RC = "arn:aws:sagemaker:us-west-2:123456789012:reserved-capacity/rc-"
PLAN: dict[str, Any] = {  # DescribeTrainingPlan's answer for a plan of two reservations
    "TrainingPlanName": "two", "TrainingPlanArn": "arn:aws:sagemaker:us-west-2:123456789012:training-plan/two",
    "Status": "Active", "TotalInstanceCount": 6, "AvailableInstanceCount": 6,
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
