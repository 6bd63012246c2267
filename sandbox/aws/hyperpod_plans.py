"""SageMaker training plans (reserved GPU capacity) as HyperPod instance groups reference them.

Moto has none of these calls. The product searches offerings, buys one and puts the plan's ARN on an
instance group, and a cluster created with an unknown plan must fail as on AWS; so the sandbox keeps
plans with their real status sequence (Pending -> Scheduled -> Active -> Expired on the clock) and
offerings derived deterministically from the search (same search, same offering ids and prices).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from typing import Any

from .base import AwsError
from .hyperpod_state import page

PURCHASE = 120.0  # Pending while the reservation is being confirmed
# Rough on-demand-equivalent hourly USD prices for the reservable types (for UpfrontFee only).
HOURLY_USD = {"ml.p4d.24xlarge": 25.0, "ml.p4de.24xlarge": 28.0, "ml.p5.48xlarge": 55.0, "ml.p5e.48xlarge": 60.0,
              "ml.p5en.48xlarge": 63.0, "ml.p5.4xlarge": 7.0, "ml.trn1.32xlarge": 21.0, "ml.trn2.48xlarge": 45.0,
              "ml.p6-b200.48xlarge": 80.0, "ml.p6-b300.48xlarge": 110.0, "ml.p6e-gb200.36xlarge": 70.0}


class TrainingPlans:
    def __init__(self, account: str, region: str, in_use: Callable[[str], int]) -> None:
        self.account = account
        self.region = region
        self.in_use = in_use
        self.plans: dict[str, dict[str, Any]] = {}
        self.offerings: dict[str, dict[str, Any]] = {}

    def arn(self, name: str) -> str:
        return f"arn:aws:sagemaker:{self.region}:{self.account}:training-plan/{name}"

    def find(self, name_or_arn: str) -> dict[str, Any] | None:
        return self.plans.get(name_or_arn.rsplit("/", 1)[-1] if name_or_arn.startswith("arn:") else name_or_arn)

    def status(self, arn: str) -> str | None:
        plan = self.find(arn)
        return None if plan is None else str(plan["Status"])

    def search(self, params: dict[str, Any], now: float) -> dict[str, Any]:
        instance_type = params.get("InstanceType")
        count = params.get("InstanceCount")
        if instance_type is None or count is None:
            raise AwsError("ValidationException", "InstanceType and InstanceCount are required to search "
                           "instance-based training plan offerings.")
        hours = int(params.get("DurationHours") or 24)
        earliest = max(float(_epoch(params.get("StartTimeAfter")) or now), now)
        start0 = math.ceil((earliest + 3600) / 3600) * 3600
        end_limit = _epoch(params.get("EndTimeBefore"))
        targets = list(params.get("TargetResources") or ["hyperpod-cluster"])
        offerings = []
        for index, delay in enumerate((0, 86_400, 3 * 86_400)):
            start = start0 + delay
            end = start + hours * 3600
            if end_limit is not None and end > end_limit:
                continue
            key = f"{instance_type}/{count}/{hours}/{start}/{','.join(targets)}"
            offering_id = "tpo-" + hashlib.sha256(key.encode()).hexdigest()[:24]
            zone = f"{self.region}{'abc'[index]}"
            fee = HOURLY_USD.get(instance_type, 30.0) * count * hours
            offering = {
                "TrainingPlanOfferingId": offering_id, "TargetResources": targets,
                "RequestedStartTimeAfter": earliest, "DurationHours": hours, "DurationMinutes": 0,
                "UpfrontFee": f"{fee:.2f}", "CurrencyCode": "USD",
                "ReservedCapacityOfferings": [{
                    "ReservedCapacityType": "Instance", "InstanceType": instance_type, "InstanceCount": count,
                    "AvailabilityZone": zone, "DurationHours": hours, "DurationMinutes": 0,
                    "StartTime": start, "EndTime": end}],
            }
            if end_limit is not None:
                offering["RequestedEndTimeBefore"] = end_limit
            self.offerings[offering_id] = offering
            offerings.append(offering)
        return {"TrainingPlanOfferings": offerings}

    def create(self, params: dict[str, Any], now: float) -> dict[str, Any]:
        name = params["TrainingPlanName"]
        if name in self.plans:
            raise AwsError("ResourceInUse", f"Training plan with name {name} already exists.")
        offering = self.offerings.get(params["TrainingPlanOfferingId"])
        if offering is None:
            raise AwsError("ResourceNotFound", f"Training plan offering {params['TrainingPlanOfferingId']} "
                           "not found.")
        rc = offering["ReservedCapacityOfferings"][0]
        rc_id = hashlib.sha256(f"{name}/{offering['TrainingPlanOfferingId']}".encode()).hexdigest()[:16]
        self.plans[name] = {
            "TrainingPlanArn": self.arn(name), "TrainingPlanName": name, "Status": "Pending",
            "StatusMessage": "Reservation is being confirmed.", "DurationHours": offering["DurationHours"],
            "DurationMinutes": 0, "StartTime": rc["StartTime"], "EndTime": rc["EndTime"],
            "UpfrontFee": offering["UpfrontFee"], "CurrencyCode": "USD", "TotalInstanceCount": rc["InstanceCount"],
            "TargetResources": offering["TargetResources"], "Tags": params.get("Tags", []), "_due": now + PURCHASE,
            "ReservedCapacitySummaries": [{
                "ReservedCapacityArn": f"arn:aws:sagemaker:{self.region}:{self.account}:reserved-capacity/"
                                       f"rc-{rc_id}",
                "ReservedCapacityType": "Instance", "InstanceType": rc["InstanceType"],
                "TotalInstanceCount": rc["InstanceCount"], "Status": "Pending",
                "AvailabilityZone": rc["AvailabilityZone"], "DurationHours": rc["DurationHours"],
                "DurationMinutes": 0, "StartTime": rc["StartTime"], "EndTime": rc["EndTime"]}],
        }
        return {"TrainingPlanArn": self.arn(name)}

    def tick(self, now: float) -> None:
        for plan in self.plans.values():
            if plan["Status"] == "Pending" and now < plan["_due"]:
                continue
            status = "Scheduled" if now < plan["StartTime"] else "Active" if now < plan["EndTime"] else "Expired"
            plan["Status"] = status
            plan["StatusMessage"] = ""
            for rc in plan["ReservedCapacitySummaries"]:
                rc["Status"] = status

    def describe(self, name_or_arn: str) -> dict[str, Any]:
        plan = self.find(name_or_arn)
        if plan is None:
            raise AwsError("ResourceNotFound", f"Training plan {name_or_arn} not found.")
        total = int(plan["TotalInstanceCount"])
        used = min(self.in_use(plan["TrainingPlanArn"]), total)
        out = {k: v for k, v in plan.items() if not k.startswith("_") and k != "Tags"}
        return {**out, "InUseInstanceCount": used, "AvailableInstanceCount": total - used,
                "UnhealthyInstanceCount": 0, "AvailableSpareInstanceCount": 0}

    def list(self, params: dict[str, Any]) -> dict[str, Any]:
        plans = [self.describe(name) for name in self.plans]
        after, before = _epoch(params.get("StartTimeAfter")), _epoch(params.get("StartTimeBefore"))
        plans = [p for p in plans if (after is None or p["StartTime"] > after)
                 and (before is None or p["StartTime"] < before)]
        for flt in params.get("Filters") or []:
            plans = [p for p in plans if p.get(flt["Name"]) == flt["Value"]]
        sort_by = params.get("SortBy", "StartTime")
        field = {"TrainingPlanName": "TrainingPlanName", "StartTime": "StartTime", "Status": "Status"}[sort_by]
        items, token = page(plans, lambda p: (p[field], p["TrainingPlanName"]),
                            params.get("SortOrder") == "Descending", params.get("NextToken"),
                            int(params.get("MaxResults") or 10))
        summaries = [{k: v for k, v in p.items() if k not in ("UnhealthyInstanceCount", "AvailableSpareInstanceCount")}
                     for p in items]
        return {"TrainingPlanSummaries": summaries, **({"NextToken": token} if token else {})}

    def to_state(self) -> dict[str, Any]:
        return {"plans": self.plans, "offerings": self.offerings}

    def load(self, state: dict[str, Any]) -> None:
        self.plans = dict(state.get("plans") or {})
        self.offerings = dict(state.get("offerings") or {})


def _epoch(value: Any) -> float | None:
    """Timestamps arrive as datetime (from the front) or epoch numbers (from tests)."""
    if value is None:
        return None
    if hasattr(value, "timestamp"):
        return float(value.timestamp())
    return float(value)
