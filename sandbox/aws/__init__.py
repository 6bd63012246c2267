"""The sandbox AWS world: moto for the generic services plus simulators for what moto lacks, behind one
HTTP endpoint that speaks AWS's wire protocols (so boto3 and ``aws --endpoint-url`` work unchanged).

Build it with :class:`AwsWorld`; register more simulators (e.g. HyperPod) with :meth:`AwsWorld.register`;
inject faults through :attr:`AwsWorld.faults`. Nothing here imports ``services/`` or ``app/``.
"""

from .base import FAULT_KINDS, AwsError, Call, Fault, FaultRegistry, ManualClock, RealClock, SimClock, SimulatedService
from .front import ACCOUNT_ID, AwsFront
from .validation import validate, violations
from .world import AwsWorld, Persistent

__all__ = [
    "ACCOUNT_ID",
    "FAULT_KINDS",
    "AwsError",
    "AwsFront",
    "AwsWorld",
    "Call",
    "Fault",
    "FaultRegistry",
    "ManualClock",
    "Persistent",
    "RealClock",
    "SimClock",
    "SimulatedService",
    "validate",
    "violations",
]
