"""REST routes of the sandbox itself (info, fault injection, the call ledger), mounted only when the sandbox
runs. The sandbox is a child process of the server (``app/sandbox.py``): these act through its control API.

They are generated into the OpenAPI document and the MCP tool list like any route, so an agent can
rehearse recovery playbooks against injected faults. Injecting a fault changes only the simulated world
(no cluster state of the product), so it is an immediate, audited admin action, not an operation.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from app.api.base import Call, Reply, Route
from app.sandbox import Sandbox
from services.audit import AuditLog
from services.auth import Principal, Role
from services.errors import Forbidden
from services.events import Event, EventBus
from services.models import RequestModel, ResponseModel, parse

FaultKind = Literal["node_unhealthy", "insufficient_capacity", "addon_degraded", "quota_exhausted", "throttle",
                    "access_denied", "deep_health_check_failed", "spot_reclaimed"]


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


class SpotReclaimedTarget(RequestModel):
    cluster: str = Field(..., min_length=1, description="HyperPod cluster name")
    node: str | None = Field(None, description="only this instance id; default any Spot node")
    instance_group: str | None = Field(None, description="only Spot nodes of this instance group")


class InsufficientCapacityTarget(RequestModel):
    instance_type: str = Field(..., min_length=1, description="e.g. ml.g5.8xlarge")
    availability_zone: str | None = Field(None, description="only in this zone; default every zone")


class AddonDegradedTarget(RequestModel):
    cluster: str = Field(..., min_length=1, description="EKS cluster name")
    addon: str = Field(..., min_length=1, description="EKS add-on name")


class QuotaExhaustedTarget(RequestModel):
    instance_type: str = Field(..., min_length=1, description="e.g. ml.p5.48xlarge")


class ThrottleTarget(RequestModel):
    service: str = Field(..., min_length=1, description="AWS service, e.g. sagemaker or eks")
    operation: str | None = Field(None, description="only this API operation; default all of the service")


class AccessDeniedTarget(RequestModel):
    service: str = Field(..., min_length=1, description="AWS service, e.g. eks, sagemaker or ec2")
    action: str = Field(..., min_length=1, description="the API operation refused, e.g. UpdateClusterConfig "
                        "(an IAM-style eks:UpdateClusterConfig is accepted too)")

    @field_validator("action")
    @classmethod
    def _bare_operation(cls, value: str) -> str:
        return value.rpartition(":")[2] or value


FaultTarget = (NodeUnhealthyTarget | InsufficientCapacityTarget | AddonDegradedTarget | QuotaExhaustedTarget
               | ThrottleTarget | AccessDeniedTarget | DeepHealthCheckFailedTarget | SpotReclaimedTarget)
TARGET_MODELS: dict[str, type[RequestModel]] = {
    "node_unhealthy": NodeUnhealthyTarget,
    "insufficient_capacity": InsufficientCapacityTarget,
    "addon_degraded": AddonDegradedTarget,
    "quota_exhausted": QuotaExhaustedTarget,
    "throttle": ThrottleTarget,
    "access_denied": AccessDeniedTarget,
    "deep_health_check_failed": DeepHealthCheckFailedTarget,
    "spot_reclaimed": SpotReclaimedTarget,
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
                            "quota_exhausted (instance_type); throttle (service, optional operation); access_denied "
                            "(service, action): the call fails at once with AWS's 403 naming the action; "
                            "deep_health_check_failed (cluster, optional node, check): the checks fail, the node is "
                            "replaced; spot_reclaimed (cluster, optional node, instance_group): EC2 takes a Spot "
                            "node back and HyperPod launches another")
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

    def __init__(self, sandbox: Sandbox, audit: AuditLog, bus: EventBus) -> None:
        self.sandbox = sandbox
        self.audit = audit
        self.bus = bus
        # a cluster made or deleted later (EKS, sandbox seed): panes list its kubeconfig at once
        sandbox.on_clusters_changed(lambda names: bus.publish(Event("sandbox", "clusters", {"clusters": names})))

    def info(self) -> SandboxInfo:
        kinds = {kind: sorted(required) for kind, (required, _allowed) in FAULT_TARGETS.items()}
        return SandboxInfo(**self.sandbox.info(), fault_kinds=kinds)

    def faults(self) -> list[FaultView]:
        return [FaultView(**fault) for fault in self.sandbox.faults()]

    def calls(self, query: CallsQuery | None = None) -> list[CallView]:
        query = query or CallsQuery()
        return [CallView(**entry) for entry in self.sandbox.calls(**query.model_dump())]

    def _admin(self, principal: Principal, action: str) -> None:
        try:
            principal.require(Role.ADMIN)
        except Forbidden as exc:
            self.audit.record(principal, action, "sandbox", {}, "denied", detail=exc.message)
            raise

    def inject(self, principal: Principal, request: FaultInject | dict[str, Any]) -> FaultView:
        self._admin(principal, "sandbox.fault.inject")
        body = request if isinstance(request, FaultInject) else parse(FaultInject, request)
        fault = FaultView(**self.sandbox.inject(body.kind, body.target_keys(), body.count))
        self.audit.record(principal, "sandbox.fault.inject", fault.id, body.model_dump(), "succeeded")
        self._changed()
        return fault

    def clear(self, principal: Principal, fault_id: str) -> list[FaultView]:
        self._admin(principal, "sandbox.fault.clear")
        left = [FaultView(**fault) for fault in self.sandbox.clear(fault_id)]
        self.audit.record(principal, "sandbox.fault.clear", fault_id, {}, "succeeded")
        self._changed(left)
        return left

    def _changed(self, faults: list[FaultView] | None = None) -> None:
        current = self.faults() if faults is None else faults
        self.bus.publish(Event("sandbox", "faults", {"faults": [f.model_dump() for f in current]}))


def sandbox_routes(control: SandboxControl) -> list[Route]:
    def info(call: Call) -> Reply:
        return Reply(control.info())

    def list_faults(call: Call) -> Reply:
        return Reply(control.faults())

    def inject(call: Call) -> Reply:
        return Reply(control.inject(call.principal, call.body), status=201)

    def clear(call: Call) -> Reply:
        return Reply(control.clear(call.principal, call.path["id"]))

    def calls(call: Call) -> Reply:
        return Reply(control.calls(call.query))

    return [
        Route("GET", "/api/v1/sandbox", "sandbox_info", "Sandbox endpoints and what it simulates", Role.VIEWER,
              info, response=SandboxInfo, tag="sandbox",
              description="Only in sandbox mode: the AWS endpoint (aws --endpoint-url), the Kubernetes emulator "
                          "URL, the simulated operations and the clock speed."),
        Route("GET", "/api/v1/sandbox/faults", "sandbox_faults_list", "List injected sandbox faults", Role.VIEWER,
              list_faults, response=FaultView, many=True, tag="sandbox"),
        Route("POST", "/api/v1/sandbox/faults", "sandbox_faults_inject", "Inject a sandbox fault", Role.ADMIN,
              inject, body=FaultInject, response=FaultView, read_only=False, idempotent=False, status=201,
              tag="sandbox",
              description="Sandbox only: make a node unhealthy, a capacity or quota run out, an add-on degrade, "
                          "an AWS API throttle or an access denial, to rehearse diagnosis and recovery."),
        Route("DELETE", "/api/v1/sandbox/faults/{id}", "sandbox_faults_clear", "Clear sandbox faults", Role.ADMIN,
              clear, response=FaultView, many=True, read_only=False, path_params={"id": "fault id, or 'all'"},
              tag="sandbox"),
        Route("GET", "/api/v1/sandbox/calls", "sandbox_calls", "The sandbox's call ledger", Role.VIEWER, calls,
              query=CallsQuery, response=CallView, many=True, tag="sandbox",
              description="Sandbox only: every AWS call (service, operation, target, parameters with secrets "
                          "redacted, result) and Kubernetes request (verb, resource, name, watch) the sandbox "
                          "received, with time and caller, oldest first; page with since=<last seq>."),
    ]
