"""The sandbox's own noun (info, fault injection, the call ledger) and the models its faces share: its
REST routes (``app/api/sandbox.py``), its dashboard pane and its CLI all act through :class:`SandboxControl`.

It reaches the sandbox world through whatever :class:`SandboxWorld` it is given (the server passes the
sandbox child process's control client): services never ask whether they run in the sandbox, they are
handed this noun only when one is configured. Injecting a fault changes only the simulated world (no
cluster state of the product), so it is an immediate, audited admin action, not an operation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, Protocol

from pydantic import ConfigDict, Field, field_validator, model_validator

from services.audit import AuditLog
from services.auth import Principal, Role
from services.events import Event, EventBus
from services.models import RequestModel, ResponseModel, parse
from services.verbs import verb


class SandboxWorld(Protocol):
    """The sandbox as the control plane reaches it (its control API)."""

    def info(self) -> dict[str, Any]: ...

    def faults(self) -> list[dict[str, Any]]: ...

    def inject(self, kind: str, target: dict[str, str], count: int | None) -> dict[str, Any]: ...

    def clear(self, fault_id: str) -> list[dict[str, Any]]: ...

    def calls(self, **filters: Any) -> list[dict[str, Any]]: ...

    def on_clusters_changed(self, listener: Callable[[list[str]], None]) -> None: ...


FaultKind = Literal["node_unhealthy", "insufficient_capacity", "addon_degraded", "quota_exhausted", "throttle",
                    "access_denied", "deep_health_check_failed", "spot_reclaimed", "eks_create_failed",
                    "file_system_failed", "hold_response",
                    "node_persistent_fault", "autoscaling_failed"]


class NodeUnhealthyTarget(RequestModel):
    cluster: str = Field(..., min_length=1, description="HyperPod cluster name")
    node: str = Field(..., min_length=1, description="instance id, e.g. i-0123456789abcdef0")
    recovery: Literal["Reboot", "Replace"] | None = Field(None, description="what automatic recovery does "
                                                          "(default Replace)")


class DeepHealthCheckFailedTarget(RequestModel):
    cluster: str = Field(..., min_length=1, description="HyperPod cluster name")
    node: str | None = Field(None, description="only this instance id; default any node running deep health checks")
    check: Literal["InstanceStress", "InstanceConnectivity", "MultiNodeTrainingValidation"] | None = Field(
        None, description="only this deep health check; default any")


class NodePersistentFaultTarget(RequestModel):
    cluster: str = Field(..., min_length=1, description="HyperPod cluster name")
    node: str = Field(..., min_length=1, description="instance id of the node with bad hardware")
    fault_type: str | None = Field(None, max_length=63, description="the fault-types label (default "
                                                                    "AcceleratedHardware)")
    reason: str | None = Field(None, max_length=63, description="the fault-reasons label (default NvidiaGpuXidError)")


class SpotReclaimedTarget(RequestModel):
    cluster: str = Field(..., min_length=1, description="HyperPod cluster name")
    node: str | None = Field(None, description="only this instance id; default any Spot node")
    instance_group: str | None = Field(None, description="only Spot nodes of this instance group")


class FileSystemFailedTarget(RequestModel):
    subnet: str | None = Field(None, description="only a file system created in this subnet; default any")


class InsufficientCapacityTarget(RequestModel):
    instance_type: str = Field(..., min_length=1, description="e.g. ml.g5.8xlarge")
    availability_zone: str | None = Field(None, description="only in this zone; default every zone")


class AddonDegradedTarget(RequestModel):
    cluster: str = Field(..., min_length=1, description="EKS cluster name")
    addon: str = Field(..., min_length=1, description="EKS add-on name")


class EksCreateFailedTarget(RequestModel):
    cluster: str = Field(..., min_length=1, description="EKS cluster name: its next creation ends FAILED")


class QuotaExhaustedTarget(RequestModel):
    instance_type: str = Field(..., min_length=1, description="e.g. ml.p5.48xlarge")


class ThrottleTarget(RequestModel):
    service: str = Field(..., min_length=1, description="AWS service, e.g. sagemaker or eks")
    operation: str | None = Field(None, description="only this API operation; default all of the service")
    after: int | None = Field(None, ge=0, le=10_000, description="let this many matching calls through first")


class AccessDeniedTarget(RequestModel):
    service: str = Field(..., min_length=1, description="AWS service, e.g. eks, sagemaker or ec2")
    action: str = Field(..., min_length=1, description="the API operation refused, e.g. UpdateClusterConfig "
                        "(an IAM-style eks:UpdateClusterConfig is accepted too)")

    @field_validator("action")
    @classmethod
    def _bare_operation(cls, value: str) -> str:
        return value.rpartition(":")[2] or value


class AutoscalingFailedTarget(RequestModel):
    cluster: str = Field(..., min_length=1, description="HyperPod cluster name")
    message: str | None = Field(None, max_length=1000, description="the FailureMessage HyperPod reports (default: "
                                "the cluster role could not be assumed)")


class HoldResponseTarget(RequestModel):
    service: str = Field(..., min_length=1, description="AWS service, e.g. ec2, iam, eks or sagemaker")
    operation: str = Field(..., min_length=1, description="the API operation whose answer is held, e.g. CreateVpc")
    after: int | None = Field(None, ge=0, le=10_000, description="let this many matching calls answer first (hold "
                              "the second batch of a batched act: after=1)")


FaultTarget = (NodeUnhealthyTarget | InsufficientCapacityTarget | AddonDegradedTarget | QuotaExhaustedTarget
               | ThrottleTarget | AccessDeniedTarget | DeepHealthCheckFailedTarget | SpotReclaimedTarget
               | EksCreateFailedTarget | FileSystemFailedTarget | HoldResponseTarget
               | NodePersistentFaultTarget | AutoscalingFailedTarget)
TARGET_MODELS: dict[str, type[RequestModel]] = {
    "node_unhealthy": NodeUnhealthyTarget,
    "insufficient_capacity": InsufficientCapacityTarget,
    "addon_degraded": AddonDegradedTarget,
    "quota_exhausted": QuotaExhaustedTarget,
    "throttle": ThrottleTarget,
    "access_denied": AccessDeniedTarget,
    "deep_health_check_failed": DeepHealthCheckFailedTarget,
    "spot_reclaimed": SpotReclaimedTarget,
    "eks_create_failed": EksCreateFailedTarget,
    "file_system_failed": FileSystemFailedTarget,
    "hold_response": HoldResponseTarget,
    "node_persistent_fault": NodePersistentFaultTarget,
    "autoscaling_failed": AutoscalingFailedTarget,
}
# per kind: (target keys required, target keys allowed), from the models above
FAULT_TARGETS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    kind: (frozenset(n for n, f in model.model_fields.items() if f.is_required()), frozenset(model.model_fields))
    for kind, model in TARGET_MODELS.items()
}


def _per_kind_schema(schema: dict[str, Any]) -> None:
    """State in the schema which target model goes with which kind (the bridge reads the plain properties)."""
    schema["oneOf"] = [
        {"properties": {"kind": {"const": kind}, "target": model.model_json_schema()}, "required": ["kind"]}
        for kind, model in TARGET_MODELS.items()
    ]


class FaultInject(RequestModel):
    """Make the sandbox misbehave the way AWS and HyperPod do, to rehearse recovery."""

    model_config = ConfigDict(json_schema_extra=_per_kind_schema)

    kind: FaultKind = Field(..., description="node_unhealthy (target cluster = HyperPod cluster name, node = "
                            "instance id, optional recovery = Reboot|Replace); insufficient_capacity (instance_type, "
                            "optional availability_zone); addon_degraded (cluster = EKS name, addon); "
                            "quota_exhausted (instance_type); throttle (service, optional operation, optional after "
                            "= matching calls let through first); access_denied "
                            "(service, action): the call fails at once with AWS's 403 naming the action; "
                            "deep_health_check_failed (cluster, optional node, check): the checks fail, the node is "
                            "replaced; spot_reclaimed (cluster, optional node, instance_group): EC2 takes a Spot "
                            "node back and HyperPod launches another; eks_create_failed (cluster = EKS name): its "
                            "creation ends FAILED with a health issue; file_system_failed (optional subnet): the "
                            "next FSx file system created there ends FAILED; hold_response (service, operation, "
                            "optional after): the call is made and in the ledger, its answer waits until the fault is "
                            "cleared or the caller goes away (a crash exactly between an act and the save of its "
                            "result); "
                            "node_persistent_fault (cluster, node, "
                            "optional fault_type, reason): bad hardware, unhealthy again after every reboot until "
                            "the node is replaced; autoscaling_failed (cluster, optional message): the next "
                            "managed-Karpenter AutoScaling enable on the cluster ends Failed with that FailureMessage")
    target: FaultTarget = Field(..., description="what the fault applies to: the keys of the kind's target model")
    count: int | None = Field(None, ge=1, le=10_000,
                              description="throttle, access_denied: how many calls fail (default: until cleared); "
                                          "others: uses before it clears itself")

    @model_validator(mode="before")
    @classmethod
    def _target_of_kind(cls, data: Any) -> Any:
        """Validate ``target`` against its kind's model (a plain union would accept another kind's keys)."""
        if not isinstance(data, dict) or data.get("kind") not in TARGET_MODELS:
            return data
        target = data.get("target", {})
        if not isinstance(target, dict):
            return data  # the field's own validation says what is wrong
        kind = str(data["kind"])
        required, allowed = FAULT_TARGETS[kind]
        missing = sorted(required - set(target))
        unknown = sorted(set(target) - allowed)
        if missing or unknown:
            raise ValueError(f"{kind} needs target keys {sorted(required)}"
                             + (f" (missing {missing})" if missing else "")
                             + (f"; unknown keys {unknown}, allowed {sorted(allowed)}" if unknown else ""))
        return {**data, "target": TARGET_MODELS[kind].model_validate(target)}

    def target_keys(self) -> dict[str, str]:
        return {k: str(v) for k, v in self.target.model_dump(exclude_none=True).items()}


class FaultView(ResponseModel):
    id: str
    kind: str
    target: dict[str, str]
    remaining: int | None = None
    held: int = Field(0, description="hold_response: the answers it holds now (listed until cleared)")


class SandboxInfo(ResponseModel):
    aws_endpoint_url: str
    region: str
    account_id: str
    kubernetes_url: str
    kubeconfigs: dict[str, str] = Field(..., description="cluster name -> kubeconfig path (kubectl --kubeconfig)")
    kubeconfig_dir: str
    speed: float
    simulated: dict[str, list[str]] = Field(default_factory=dict,
                                            description="operations the simulator owns, per service; everything "
                                                        "else is served by moto (only from a running server)")
    credentials: dict[str, str]
    fault_kinds: dict[str, list[str]] = Field(default_factory=dict,
                                              description="fault kind -> the target keys it needs")


class CallsQuery(RequestModel):
    """Filter the sandbox's call ledger; oldest first."""

    service: str | None = Field(None, description="AWS service (eks, sagemaker, ec2, ...) or kubernetes")
    operation: str | None = Field(None, description="AWS API operation, e.g. UpdateCluster")
    verb: str | None = Field(None, description="Kubernetes verb: get, list, watch, create, update, patch, delete, "
                                               "deletecollection")
    cluster: str | None = Field(None, description="Kubernetes requests to this emulated cluster only")
    write: bool | None = Field(None, description="true: only calls that change state; false: only reads")
    since: int = Field(0, ge=0, le=10**15, description="only entries after this seq (the last seq you saw)")
    limit: int = Field(200, ge=1, le=10_000, description="at most this many entries (the newest)")


class CallCaller(ResponseModel):
    access_key: str | None = Field(None, description="AWS calls: the access key id that signed it")
    identity: str | None = Field(None, description="Kubernetes requests: the bearer token's principal")
    user_agent: str = ""


class CallView(ResponseModel):
    """One entry of the call ledger: an AWS call or a Kubernetes request, as the sandbox saw it."""

    seq: int
    time: float = Field(..., description="epoch seconds (wall clock)")
    kind: Literal["aws", "kubernetes"]
    service: str
    write: bool = Field(..., description="whether the call changes state")
    status: int
    caller: CallCaller
    operation: str | None = Field(None, description="AWS: the API operation")
    target: str | None = Field(None, description="AWS: what the call names, e.g. the cluster")
    request: Any = Field(None, description="AWS: the parameters, secrets redacted")
    error: str | None = Field(None, description="AWS: the error code of a failed call")
    cluster: str | None = Field(None, description="Kubernetes: the emulated cluster")
    verb: str | None = None
    resource: str | None = Field(None, description="Kubernetes: plural[.group]")
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None
    watch: bool | None = None


class SandboxControl:
    """The sandbox's own actions, shared by its REST routes and its dashboard pane (one set of rules)."""

    noun = "sandbox"

    def __init__(self, sandbox: SandboxWorld, audit: AuditLog, bus: EventBus) -> None:
        self.sandbox = sandbox
        self.audit = audit
        self.bus = bus
        # a cluster made or deleted later (EKS, sandbox seed): panes list its kubeconfig at once
        sandbox.on_clusters_changed(lambda names: bus.publish(Event("sandbox", "clusters", {"clusters": names})))

    @verb(Role.VIEWER)
    def info(self, principal: Principal) -> SandboxInfo:
        kinds = {kind: sorted(required) for kind, (required, _allowed) in FAULT_TARGETS.items()}
        return SandboxInfo(**self.sandbox.info(), fault_kinds=kinds)

    @verb(Role.VIEWER)
    def faults(self, principal: Principal) -> list[FaultView]:
        return self._faults()

    @verb(Role.VIEWER)
    def calls(self, principal: Principal, query: CallsQuery | None = None) -> list[CallView]:
        query = query or CallsQuery()
        return [CallView(**entry) for entry in self.sandbox.calls(**query.model_dump())]

    @verb(Role.ADMIN, audit_denied="sandbox.fault.inject")
    def inject(self, principal: Principal, request: FaultInject | dict[str, Any]) -> FaultView:
        body = request if isinstance(request, FaultInject) else parse(FaultInject, request)
        fault = FaultView(**self.sandbox.inject(body.kind, body.target_keys(), body.count))
        self.audit.record(principal, "sandbox.fault.inject", fault.id, body.model_dump(), "succeeded")
        self._changed()
        return fault

    @verb(Role.ADMIN, audit_denied="sandbox.fault.clear")
    def clear(self, principal: Principal, fault_id: str) -> list[FaultView]:
        left = [FaultView(**fault) for fault in self.sandbox.clear(fault_id)]
        self.audit.record(principal, "sandbox.fault.clear", fault_id, {}, "succeeded")
        self._changed(left)
        return left

    def _faults(self) -> list[FaultView]:
        return [FaultView(**fault) for fault in self.sandbox.faults()]

    def _changed(self, faults: list[FaultView] | None = None) -> None:
        current = self._faults() if faults is None else faults
        self.bus.publish(Event("sandbox", "faults", {"faults": [f.model_dump() for f in current]}))
