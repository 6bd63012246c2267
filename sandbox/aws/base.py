"""The contract between the sandbox AWS front and the simulated services behind it.

The front (``front.py``) speaks AWS's wire protocols: it finds the service from the SigV4 credential scope,
the operation from ``X-Amz-Target`` (JSON protocol) or the request URI (REST-JSON), validates the input
against the botocore service model as AWS does (enums, patterns, min/max, required), and then either
calls a :class:`SimulatedService` that owns the operation or forwards the request unchanged to moto.
Services receive plain validated dicts and return plain dicts (timestamps as ``datetime`` or epoch
floats); they raise :class:`AwsError` with AWS's real error codes.

Time is a :class:`SimClock`; state machines move only in :meth:`SimulatedService.tick`, which the world
calls from a background thread when served, and tests call after advancing a fake clock. Nothing here
imports ``services/`` or ``app/``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol


class AwsError(Exception):
    """An AWS error response: ``code`` is the botocore ``Error.Code`` a client will see."""

    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status


@dataclass(frozen=True)
class Call:
    """One parsed, validated AWS API call."""

    service: str  # botocore service name, e.g. "sagemaker", "eks"
    operation: str  # botocore operation name, e.g. "CreateCluster"
    params: dict[str, Any]
    region: str
    account: str


class SimClock(Protocol):
    def now(self) -> float: ...


class RealClock:
    """Wall time, optionally sped up: ``speed=60`` makes a 15-minute EKS create take 15 s.

    A sped-up clock runs ahead of wall time; :meth:`resume` continues from a saved simulated time so that
    time never goes backwards across a restart."""

    def __init__(self, speed: float = 1.0) -> None:
        self.speed = speed
        self._real_origin = time.time()
        self._sim_origin = self._real_origin

    def now(self) -> float:
        return self._sim_origin + (time.time() - self._real_origin) * self.speed

    def resume(self, saved_now: float) -> None:
        """Continue from ``saved_now`` (or from wall time, if that is later)."""
        self._real_origin = time.time()
        self._sim_origin = max(saved_now, self._real_origin)


class ManualClock:
    """A clock tests move by hand."""

    def __init__(self, start: float = 1_767_225_600.0) -> None:  # 2026-01-01T00:00:00Z
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds


class SimulatedService(Protocol):
    """A simulator for the operations of one AWS service that moto lacks or does thinly."""

    service: str  # botocore service name
    operations: frozenset[str]  # operations this simulator owns; the service's others go to moto

    def handle(self, call: Call) -> dict[str, Any]: ...

    def tick(self, now: float) -> None: ...


@dataclass
class Fault:
    """An injected fault. ``kind`` is one of FAULT_KINDS; ``target`` narrows it; ``remaining`` counts uses."""

    id: str
    kind: str
    target: dict[str, str] = field(default_factory=dict)
    remaining: int | None = None


FAULT_KINDS = frozenset({
    "node_unhealthy",  # target: cluster, node (instance id)
    "node_persistent_fault",  # target: cluster (HyperPod name), node: unhealthy across reboots, cleared by a replace
    "deep_health_check_failed",  # target: cluster (HyperPod name), node, check (optional): the checks fail
    "spot_reclaimed",  # target: cluster (HyperPod name), node, instance_group (optional): EC2 takes a Spot node
    "insufficient_capacity",  # target: instance_type, availability_zone (optional)
    "addon_degraded",  # target: cluster (EKS name), addon
    "eks_create_failed",  # target: cluster (EKS name): a CreateCluster ends FAILED (a health issue says why)
    "quota_exhausted",  # target: instance_type
    "throttle",  # target: service, operation (optional), after (optional: calls let through first); remaining: calls
    "access_denied",  # target: service, action (an API operation); the call fails at once with a 403
    "file_system_failed",  # target: subnet (optional): the next FSx file system created there ends FAILED
    "autoscaling_failed",  # target: cluster (HyperPod name), message (optional): the next autoscaling enable fails
    "hold_response",  # target: service, operation, after (optional): the call is made and in the ledger; its answer
    # waits for a clear
})


class FaultRegistry:
    """Injected faults, shared by the front (throttling) and the simulators (everything else)."""

    def __init__(self) -> None:
        self._faults: dict[str, Fault] = {}
        # a hold_response fault that held an answer: the fault and the event set when it is cleared
        self._held: dict[str, tuple[Fault, threading.Event]] = {}
        self._waiting: dict[str, int] = {}  # how many answers each of them holds now
        self._lock = threading.Lock()
        self._next = 0

    def inject(self, kind: str, target: dict[str, str] | None = None, remaining: int | None = None) -> Fault:
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; one of {sorted(FAULT_KINDS)}")
        with self._lock:
            self._next += 1
            fault = Fault(f"fault-{self._next}", kind, dict(target or {}), remaining)
            self._faults[fault.id] = fault
        return fault

    def clear(self, fault_id: str | None = None) -> None:
        """Drop one fault (or all), and release the answers its holds keep."""
        with self._lock:
            if fault_id is None:
                self._faults.clear()
            else:
                self._faults.pop(fault_id, None)
            for held in [i for i in self._held if fault_id in (None, i)]:
                self._held.pop(held)[1].set()

    def hold(self, fault: Fault) -> threading.Event:
        """One more answer held by ``fault``: the event it waits on, set when the fault is cleared (also once
        it has no uses left). Each hold ends with :meth:`unhold`."""
        with self._lock:
            _, released = self._held.setdefault(fault.id, (fault, threading.Event()))
            self._waiting[fault.id] = self._waiting.get(fault.id, 0) + 1
            return released

    def unhold(self, fault: Fault) -> None:
        """One answer ``fault`` held no longer waits (released, or its caller went away)."""
        with self._lock:
            left = self._waiting.pop(fault.id, 0) - 1
            if left > 0:
                self._waiting[fault.id] = left

    def holding(self) -> list[tuple[Fault, int]]:
        """The hold faults that held an answer and are not cleared yet, with how many answers wait now."""
        with self._lock:
            return [(fault, self._waiting.get(i, 0)) for i, (fault, _) in sorted(self._held.items())]

    def list(self) -> list[Fault]:
        with self._lock:
            return list(self._faults.values())

    def take(self, kind: str, **match: str) -> Fault | None:
        """The first active fault of ``kind`` whose target fields all match ``match`` (a target field that
        is absent matches anything; ``after`` is no match key: it counts matching calls let through first); uses
        one of its ``remaining`` and drops it when none are left."""
        with self._lock:
            for fault in self._faults.values():
                if fault.kind != kind:
                    continue
                if any(key in fault.target and fault.target[key] != value for key, value in match.items()):
                    continue
                if int(fault.target.get("after") or 0) > 0:  # matching calls it lets through before it applies
                    fault.target["after"] = str(int(fault.target["after"]) - 1)
                    continue
                if fault.remaining is not None:
                    fault.remaining -= 1
                    if fault.remaining <= 0:
                        del self._faults[fault.id]
                return fault
        return None
