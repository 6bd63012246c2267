"""Service Quotas for SageMaker HyperPod cluster usage, which moto does not have, and the two network quotas a
cluster create reads (VPCs per Region, EC2-VPC Elastic IPs: AWS's real codes and defaults).

The product checks "<type> for cluster usage" before it creates a cluster, and the HyperPod simulator asks
:meth:`QuotasSimulator.limit` when a create or scale would exceed it (``ResourceLimitExceeded``), so the
sandbox shows the real first-run experience: large GPU types start at 0 and need an increase, smaller
types allow a few instances. A ``quota_exhausted`` fault (target ``instance_type``) makes a type's quota 0;
:meth:`QuotasSimulator.set_limit` plays an approved increase. Quota codes are stable, AWS-shaped
(``L-`` + 8 hex digits) but not AWS's real codes.

The network quotas are served under their own service codes (``vpc`` ``L-F678F1CE``, ``ec2`` ``L-0263D0A3``,
both 5 by default as in a new account), with the same increase rules.

Every quota here is adjustable (``Adjustable: true``, as AWS lists the HyperPod cluster-usage quotas), so
``RequestServiceQuotaIncrease`` works as in AWS, except that the sandbox approves a request at once: its
``Status`` is ``APPROVED`` and the applied value is the desired one from the next call on (a 1,000-node
sandbox cluster needs nothing else). As in AWS, a desired value must be above the applied value
(``IllegalArgumentException``), and a second open request for the same quota is refused
(``ResourceAlreadyExistsException``) — an approved one is closed, so it never blocks the next.
``GetRequestedServiceQuotaChange`` reads a request back by its id.
"""

from __future__ import annotations

import hashlib
import re
import time
import uuid
from typing import Any

from botocore.model import StringShape

from .base import AwsError, Call, FaultRegistry
from .protocol import service_model

SERVICE_CODE = "sagemaker"
SERVICE_NAME = "Amazon SageMaker"
# Types that AWS accounts start with no cluster quota for (large accelerated instances).
_ZERO_BY_DEFAULT = re.compile(r"^ml\.(p4d|p4de|p5|p5e|p5en|p6-b200|p6-b300|p6e-gb200|trn1|trn1n|trn2)\.")
_ACCELERATED = re.compile(r"^ml\.(g4dn|g5|g6|g6e|g7|g7e|gr6)\.")
ACCOUNT_WIDE = {
    "Maximum number of instances allowed per SageMaker HyperPod cluster": 100,
    "Total number of instances allowed across SageMaker HyperPod clusters": 100,
}
#: service code -> (service name, {quota code: (quota name, default)}): AWS's real codes for these
NETWORK_QUOTAS: dict[str, tuple[str, dict[str, tuple[str, float]]]] = {
    "vpc": ("Amazon Virtual Private Cloud (Amazon VPC)", {"L-F678F1CE": ("VPCs per Region", 5.0)}),
    "ec2": ("Amazon Elastic Compute Cloud (Amazon EC2)", {"L-0263D0A3": ("EC2-VPC Elastic IPs", 5.0)}),
}


def cluster_instance_types() -> list[str]:
    """Every ``InstanceType`` HyperPod accepts (the botocore ``ClusterInstanceType`` enum)."""
    shape = service_model("sagemaker").shape_for("ClusterInstanceType")
    assert isinstance(shape, StringShape)
    return list(shape.enum)


def default_limit(instance_type: str) -> int:
    """The default "for cluster usage" quota of a new account, by instance family and size."""
    if _ZERO_BY_DEFAULT.match(instance_type) or instance_type.endswith(".48xlarge"):
        return 0
    if _ACCELERATED.match(instance_type):
        return 2 if instance_type.endswith(("16xlarge", "24xlarge")) else 4
    return 10


def quota_name(instance_type: str) -> str:
    return f"{instance_type} for cluster usage"


def quota_code(name: str) -> str:
    return "L-" + hashlib.sha1(name.encode()).hexdigest()[:8].upper()


class QuotasSimulator:
    """``service-quotas`` for ServiceCodes ``sagemaker``, ``vpc`` and ``ec2``; other codes are unknown here."""

    service = "service-quotas"
    operations = frozenset({"GetServiceQuota", "GetAWSDefaultServiceQuota", "ListServiceQuotas",
                            "ListAWSDefaultServiceQuotas", "ListServices", "RequestServiceQuotaIncrease",
                            "GetRequestedServiceQuotaChange"})

    def __init__(self, faults: FaultRegistry, *, region: str = "us-west-2", account: str = "123456789012") -> None:
        self.faults = faults
        self.region = region
        self.account = account
        self._overrides: dict[str, float] = {}
        self._requests: dict[str, dict[str, Any]] = {}  # request id -> RequestedServiceQuotaChange
        self._defaults: dict[str, tuple[str, float]] = {}  # code -> (name, default)
        self._type_of: dict[str, str] = {}  # code -> instance type
        for instance_type in cluster_instance_types():
            name = quota_name(instance_type)
            self._defaults[quota_code(name)] = (name, float(default_limit(instance_type)))
            self._type_of[quota_code(name)] = instance_type
        for name, value in ACCOUNT_WIDE.items():
            self._defaults[quota_code(name)] = (name, float(value))
        self._service_of: dict[str, str] = dict.fromkeys(self._defaults, SERVICE_CODE)  # code -> service code
        for service, (_, quotas) in NETWORK_QUOTAS.items():
            for code, default in quotas.items():
                self._defaults[code] = default
                self._service_of[code] = service

    # --- the Python API simulators use ---------------------------------------------------------------

    def limit(self, instance_type: str) -> int:
        """How many instances of ``instance_type`` all HyperPod clusters of the account may use."""
        if self.faults.take("quota_exhausted", instance_type=instance_type) is not None:
            return 0
        code = quota_code(quota_name(instance_type))
        if code not in self._defaults:
            return 0
        return int(self._overrides.get(code, self._defaults[code][1]))

    def set_limit(self, instance_type: str, value: int) -> None:
        """An approved quota increase (or decrease)."""
        self._overrides[quota_code(quota_name(instance_type))] = float(value)

    def to_state(self) -> dict[str, Any]:
        return {"overrides": dict(self._overrides), "requests": dict(self._requests)}

    def load_state(self, state: dict[str, Any]) -> None:
        self._overrides = {str(k): float(v) for k, v in state.get("overrides", {}).items()}
        self._requests = {str(k): dict(v) for k, v in state.get("requests", {}).items()}

    def tick(self, now: float) -> None:
        """Quotas do not change with time."""

    # --- the API -------------------------------------------------------------------------------------

    def handle(self, call: Call) -> dict[str, Any]:
        params = call.params
        if call.operation == "ListServices":
            return {"Services": [{"ServiceCode": code, "ServiceName": self._service_name(code)}
                                 for code in sorted({SERVICE_CODE, *NETWORK_QUOTAS})]}
        if call.operation == "GetRequestedServiceQuotaChange":
            return {"RequestedQuota": self._request(params["RequestId"])}
        service = params["ServiceCode"]
        self._check_service(service)
        if call.operation == "RequestServiceQuotaIncrease":
            self._known(params["QuotaCode"], service)
            return {"RequestedQuota": self._increase(params["QuotaCode"], float(params["DesiredValue"]),
                                                     call.account)}
        applied = call.operation in ("GetServiceQuota", "ListServiceQuotas")
        if call.operation in ("GetServiceQuota", "GetAWSDefaultServiceQuota"):
            code = params["QuotaCode"]
            self._known(code, service)
            return {"Quota": self._quota(code, applied)}
        codes = sorted((c for c in self._defaults if self._service_of[c] == service),
                       key=lambda c: self._defaults[c][0])
        if params.get("QuotaCode"):
            codes = [c for c in codes if c == params["QuotaCode"]]
        start = int(params.get("NextToken") or 0)
        size = int(params.get("MaxResults") or 100)
        page = codes[start:start + size]
        result: dict[str, Any] = {"Quotas": [self._quota(code, applied) for code in page]}
        if start + size < len(codes):
            result["NextToken"] = str(start + size)
        return result

    def _known(self, code: str, service: str | None = None) -> None:
        if code not in self._defaults or (service is not None and self._service_of[code] != service):
            raise AwsError("NoSuchResourceException", f"The request failed because the specified quota {code} "
                                                      "does not exist.")

    def _increase(self, code: str, desired: float, account: str) -> dict[str, Any]:
        """Submit an increase; the sandbox approves it at once, so it never stays open."""
        self._known(code)
        current = self._overrides.get(code, self._defaults[code][1])
        if desired <= current:
            raise AwsError("IllegalArgumentException", f"The DesiredValue {desired:g} must be greater than the "
                                                       f"current quota value {current:g}.")
        if any(r["QuotaCode"] == code and r["Status"] in ("PENDING", "CASE_OPENED")
               for r in self._requests.values()):
            raise AwsError("ResourceAlreadyExistsException", f"A quota increase request for {code} is already "
                                                             "open.")
        quota = self._quota(code, applied=False)
        now = time.time()
        request = {
            "Id": uuid.uuid4().hex, "ServiceCode": quota["ServiceCode"],
            "ServiceName": quota["ServiceName"], "QuotaCode": code, "QuotaName": quota["QuotaName"],
            "DesiredValue": desired, "Status": "APPROVED", "Created": now, "LastUpdated": now,
            "Requester": f"arn:aws:iam::{account}:root", "QuotaArn": quota["QuotaArn"], "GlobalQuota": False,
            "Unit": "None", "QuotaRequestedAtLevel": "ACCOUNT",
        }
        self._requests[request["Id"]] = request
        self._overrides[code] = desired
        return dict(request)

    def _request(self, request_id: str) -> dict[str, Any]:
        if request_id not in self._requests:
            raise AwsError("NoSuchResourceException", f"The request failed because the specified quota "
                                                      f"increase request {request_id} does not exist.")
        return dict(self._requests[request_id])

    def _exhausted(self, instance_type: str) -> bool:
        """Whether a ``quota_exhausted`` fault applies (a read: uses none of the fault's ``remaining``)."""
        return any(f.kind == "quota_exhausted" and f.target.get("instance_type", instance_type) == instance_type
                   for f in self.faults.list())

    @staticmethod
    def _service_name(code: str) -> str:
        return NETWORK_QUOTAS[code][0] if code in NETWORK_QUOTAS else SERVICE_NAME

    def _check_service(self, code: str) -> None:
        if code != SERVICE_CODE and code not in NETWORK_QUOTAS:
            raise AwsError("NoSuchResourceException", "This service is not available in the current Region. "
                                                      "Choose a different Region or a different service.")

    def _quota(self, code: str, applied: bool) -> dict[str, Any]:
        name, default = self._defaults[code]
        value = default
        if applied:
            instance_type = self._type_of.get(code)
            value = self._overrides.get(code, default)
            if instance_type is not None and self._exhausted(instance_type):
                value = 0.0
        service = self._service_of[code]
        return {
            "ServiceCode": service, "ServiceName": self._service_name(service), "QuotaCode": code, "QuotaName": name,
            "QuotaArn": f"arn:aws:servicequotas:{self.region}:{self.account}:{service}/{code}",
            "Value": value, "Unit": "None", "Adjustable": True, "GlobalQuota": False,
            "QuotaAppliedAtLevel": "ACCOUNT",
            "Description": f"The maximum number of {name[:-len(' for cluster usage')]} instances allowed for "
                           "SageMaker HyperPod cluster usage." if code in self._type_of else name,
        }
