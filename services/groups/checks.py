"""Prechecks of the ``instance_groups`` verbs: pure decisions over facts read from AWS before any operation
row exists, each refusal naming the rule and the valid choices (HTTP 422 for a bad choice, 409 for a state
that forbids it).

Facts, never lists written here: which zones offer a type, its EFA interfaces and threads per core come from
EC2 (``OptionsReader``); a training plan's reservations, their zone, type, count and state from SageMaker
``DescribeTrainingPlan``. Nothing here writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from services.clusters.create_models import CapacityType
from services.clusters.options import InstanceTypeOption
from services.errors import Conflict, Invalid

PLAN_USABLE = ("Scheduled", "Active")
PLAN_TARGET = "hyperpod-cluster"  # DescribeTrainingPlan's TargetResources value a group's plan must list
#: the incumbent's rule, used only when EC2 does not say a type's threads per core (incumbent §5.5)
_TPC2_FAMILIES = ("ml.p4", "ml.p5", "ml.p6")


def capacity_of(details: dict[str, Any]) -> CapacityType:
    """A group's capacity type as DescribeCluster reports it."""
    if details.get("TrainingPlanArn"):
        return CapacityType.TRAINING_PLAN
    return CapacityType.SPOT if "Spot" in (details.get("CapacityRequirements") or {}) else CapacityType.ON_DEMAND


def efa_only_of(details: dict[str, Any]) -> bool:
    return (details.get("NetworkInterface") or {}).get("InterfaceType") == "efa-only"


def check_fixed(name: str, details: dict[str, Any], capacity: CapacityType | None, efa_only: bool | None) -> None:
    """Capacity type and EFA-only mode are fixed when a group is created (UpdateCluster refuses a change)."""
    actual = capacity_of(details)
    if capacity is not None and capacity is not actual:
        raise Conflict(f"instance group {name} is {actual.value}: a group's capacity type is fixed for its life "
                       f"and cannot become {capacity.value}; add a new group with capacity type {capacity.value} "
                       "instead", details={"field": "capacity_type", "current": actual.value})
    if efa_only is not None and efa_only != efa_only_of(details):
        raise Conflict(f"instance group {name} has efa_only={efa_only_of(details)}: EFA-only interface mode is "
                       "fixed for a group's life; add a new group instead",
                       details={"field": "efa_only", "current": efa_only_of(details)})


def autoscaling_on(cluster: dict[str, Any]) -> bool:
    """DescribeCluster says HyperPod's managed Karpenter autoscaling is enabled."""
    return (cluster.get("AutoScaling") or {}).get("Mode") == "Enable"


def check_karpenter_add(cluster: dict[str, Any], name: str, deep_health_checks: list[str]) -> None:
    """Managed Karpenter does not support instance groups with deep health checks (aws-facts §6): a cluster
    with autoscaling enabled gets none."""
    if deep_health_checks and autoscaling_on(cluster):
        raise Conflict(f"cluster {cluster.get('ClusterName')} has managed Karpenter autoscaling enabled, which does "
                       f"not support instance groups with deep health checks: add {name} without "
                       "deep_health_checks, or disable autoscaling first",
                       details={"rule": "karpenter-no-deep-health-checks", "group": name})


def check_karpenter_owned(cluster: str, group: str, in_class: list[str], node_class: str, delete: bool) -> None:
    """A group our managed-Karpenter HyperpodNodeClass names is Karpenter's to size (it sets the count from
    pending pods and would undo one set by hand), and is not deleted while named there (HyperPod marks the node
    class not Ready and Karpenter stops provisioning from it, docs autoscaling-nodeclass): both are refused with
    what to do first."""
    if group not in in_class:
        return
    act = "delete" if delete else "scale"
    why = ("deleting a group the node class names makes HyperPod mark the node class not Ready, and Karpenter "
           "then scales none of its groups" if delete else
           "Karpenter sets its count from pending pods and would undo a count set by hand")
    raise Conflict(f"instance group {group} of {cluster} is scaled by managed Karpenter (HyperpodNodeClass "
                   f"{node_class} names it): {why}. Remove it from autoscaling first (PATCH the cluster's features "
                   f"with managed_karpenter.instance_groups without {group}) or turn autoscaling off "
                   f"(managed_karpenter: false), then {act} it",
                   details={"rule": "karpenter-managed-group", "group": group, "node_class": node_class,
                            "node_class_groups": in_class})


@dataclass
class PlanChoice:
    """What a training plan decided for a new group."""

    arn: str
    zone: str
    instance_type: str
    cap: int
    decided: list[str] = field(default_factory=list)


def check_plan_target(plan: dict[str, Any]) -> None:
    """The plan was bought for HyperPod clusters (a plan for training jobs or endpoints cannot back a group)."""
    targets = list(plan.get("TargetResources") or [])
    if PLAN_TARGET not in targets:
        raise Invalid(f"training plan {plan['TrainingPlanName']} reserves capacity for {', '.join(targets) or 'no'} "
                      f"resources, not {PLAN_TARGET}: only a plan bought for HyperPod clusters can back an instance "
                      "group", details={"target_resources": targets})


def on_reservation(groups: list[dict[str, Any]], plan_arn: str, rc: dict[str, Any]) -> int:
    """Instances the cluster's groups (DescribeCluster's details) already run on the reservation ``rc`` of the
    plan: the groups on the plan with the reservation's instance type, counted at their target."""
    return sum(int(g.get("TargetCount", 0)) for g in groups
               if g.get("TrainingPlanArn") == plan_arn and g.get("InstanceType") == rc["InstanceType"])


def reservation_of(plan: dict[str, Any], details: dict[str, Any]) -> dict[str, Any] | None:
    """The reservation of the plan an existing group runs on: the one of its instance type."""
    return next((s for s in plan.get("ReservedCapacitySummaries") or []
                 if s.get("InstanceType") == details.get("InstanceType")), None)


def reservation_cap(plan: dict[str, Any], rc: dict[str, Any], groups: list[dict[str, Any]]) -> tuple[int, int]:
    """(the reservation's total, the instances still free on it): its total less what the cluster's groups run
    on it, and never more than the plan's own free count."""
    total = int(rc["TotalInstanceCount"])
    free = max(0, total - on_reservation(groups, plan["TrainingPlanArn"], rc))
    return total, min(free, int(plan.get("AvailableInstanceCount", free)))


def choose_reservation(plan: dict[str, Any], reservation: str | None, zone: str | None,
                       instance_type: str | None, count: int, spot: bool,
                       groups: list[dict[str, Any]] | None = None) -> PlanChoice:
    """The plan's reservation a new group uses, and what it fixes: the group's zone and type, the count cap
    (the reservation's instances the cluster's ``groups`` do not already run)."""
    name, arn = plan["TrainingPlanName"], plan["TrainingPlanArn"]
    check_plan_target(plan)
    if spot:
        raise Invalid("a training plan is reserved capacity: it cannot be combined with Spot; choose capacity type "
                      "training-plan (with the plan) or spot (without one)")
    if plan["Status"] not in PLAN_USABLE:
        raise Invalid(f"training plan {name} is {plan['Status']}: a group can use a plan only while it is "
                      f"{' or '.join(PLAN_USABLE)}", details={"status": plan["Status"]})
    summaries = [s for s in plan.get("ReservedCapacitySummaries") or [] if s.get("Status") in (*PLAN_USABLE, None)]
    summaries = summaries or list(plan.get("ReservedCapacitySummaries") or [])
    listed = [{"reservation": s["ReservedCapacityArn"], "zone": s.get("AvailabilityZone"),
               "instance_type": s["InstanceType"], "count": s["TotalInstanceCount"]} for s in summaries]
    if reservation is not None:
        chosen = [s for s in summaries if s["ReservedCapacityArn"] == reservation]
        if not chosen:
            raise Invalid(f"training plan {name} has no reservation {reservation}", details={"reservations": listed})
    elif len(summaries) > 1:
        raise Invalid(f"training plan {name} holds {len(summaries)} reservations: choose one (reservation)",
                      details={"reservations": listed})
    else:
        chosen = summaries
    if not chosen:
        raise Invalid(f"training plan {name} holds no reserved capacity", details={"reservations": listed})
    rc = chosen[0]
    plan_zone, plan_type = str(rc.get("AvailabilityZone") or ""), str(rc["InstanceType"])
    total, cap = reservation_cap(plan, rc, groups or [])
    if zone is not None and zone not in (plan_zone, rc.get("AvailabilityZoneId")):
        raise Invalid(f"training plan {name} reserves capacity in {plan_zone}, not {zone}: leave the zone out (the "
                      "plan decides it) or give its zone", details={"zone": plan_zone})
    if instance_type is not None and instance_type != plan_type:
        raise Invalid(f"training plan {name} reserves {plan_type}, not {instance_type}: leave the type out (the "
                      "plan decides it) or give its type", details={"instance_type": plan_type})
    if count > cap:
        raise Invalid(f"training plan {name}'s reservation {rc['ReservedCapacityArn']} holds {total} x {plan_type} "
                      f"({cap} free): a group on it may have at most {cap} instances, not {count}",
                      details={"max_count": cap})
    decided = [f"zone {plan_zone} and instance type {plan_type} from training plan {name}'s reservation "
               f"{rc['ReservedCapacityArn']} ({total} instances reserved, {cap} free; plan {plan['Status']})"]
    return PlanChoice(arn=arn, zone=plan_zone, instance_type=plan_type, cap=cap, decided=decided)


def check_type(facts: list[InstanceTypeOption], instance_type: str, zone: str, count: int,
               efa_only: bool) -> InstanceTypeOption:
    """The type is offered in the zone, fits its quota, and supports EFA-only when asked."""
    offered = {t.instance_type: t for t in facts}
    option = offered.get(instance_type)
    if option is None:
        raise Invalid(f"{zone} offers no HyperPod instance type {instance_type}; it offers: "
                      + ", ".join(sorted(offered)), details={"instance_types": sorted(offered)})
    if option.quota is not None and option.in_use + count > option.quota:
        raise Invalid(f"the account's '{instance_type} for cluster usage' quota is {option.quota} and "
                      f"{option.in_use} are in use: {count} more do not fit (ask Service Quotas for more)",
                      details={"quota": option.quota, "in_use": option.in_use})
    if efa_only and option.efa_interfaces <= 1:
        able = sorted(t.instance_type for t in facts if t.efa_interfaces > 1)
        raise Invalid(f"EFA-only interface mode needs a type with more than one EFA interface; {instance_type} has "
                      f"{option.efa_interfaces}. Types in {zone} that support it: " + (", ".join(able) or "none"),
                      details={"instance_types": able})
    return option


def threads_per_core(asked: int | None, option: InstanceTypeOption, on_plan: bool) -> tuple[int, str]:
    """ThreadsPerCore for a new group and why: the caller's (if the type accepts it), else the type's default
    (EC2), else the incumbent's heuristic (2 on a plan or p4/p5/p6, else 1)."""
    valid = option.threads_per_core
    if asked is not None:
        if valid and asked not in valid:
            raise Invalid(f"{option.instance_type} accepts threads per core {valid}, not {asked}",
                          details={"threads_per_core": valid})
        return asked, f"threads per core {asked} (asked)"
    if option.default_threads_per_core is not None:
        return int(option.default_threads_per_core), \
            f"threads per core {option.default_threads_per_core} ({option.instance_type}'s default)"
    value = 2 if on_plan or option.instance_type.startswith(_TPC2_FAMILIES) else 1
    return value, f"threads per core {value} (EC2 does not say {option.instance_type}'s; heuristic)"
