"""The sandbox AWS world: moto, the front, the simulators, their clock and their saved state.

``instantstart serve`` without AWS credentials builds one :class:`AwsWorld`; tests build one with a
:class:`~sandbox.aws.base.ManualClock` and call :meth:`AwsWorld.advance`. The world owns the lifecycle
(start moto, restore state, serve the front, tick the simulators) so that nothing else has to know the
order. State survives restarts in two ways, because moto has no persistence of its own:

* simulators that offer ``to_state()``/``load_state(state)`` are saved as JSON under ``<data_dir>/aws/``
  after every mutating call they answer, before the answer leaves (written, fsync'd, renamed), whenever
  their state changed otherwise (checked about once a second: the ticker's transitions) and on
  :meth:`AwsWorld.stop`;
* every mutating request forwarded to moto is appended (and fsync'd) to
  ``<data_dir>/aws/moto-requests.jsonl`` before moto's answer is relayed, and replayed into a freshly
  reset moto on the next start, reseeded per request as it was live, which recreates the same resources
  with the same ids (see :mod:`.moto_backend`);
* the simulated time is saved too (``clock.json``), so a sped-up clock never goes back after a restart.

There is one clock: the world hands its clock to the Kubernetes emulator it drives, so an EKS cluster's
``createdAt``, a HyperPod node's ``LaunchTime`` and the matching Node's ``creationTimestamp`` and age all
tell the same simulated time.

moto's state is global to the process, so only one world may run in a process at a time.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .base import FaultRegistry, ManualClock, RealClock, SimClock, SimulatedService
from .facts import MotoFacts
from .forwarded import ForwardedChecks
from .front import ACCOUNT_ID, AwsFront
from .moto_backend import MOTO_SEED, MotoBackend

if TYPE_CHECKING:
    from sandbox.kube import Emulator
    from sandbox.ledger import Ledger

    from .eks import EksSimulator
    from .fsx import FsxSimulator
    from .hyperpod import HyperPodSimulator
    from .hyperpod_lifecycle import Placement
    from .mlflow import MlflowTrackingServers
    from .quotas import QuotasSimulator

_log = logging.getLogger("sandbox.aws.world")
TICK_SECONDS = 0.2
SAVE_EVERY_SECONDS = 1.0
DEFAULT_SPEED = 40.0  # a ~10-minute EKS create takes ~15 s


@runtime_checkable
class Persistent(Protocol):
    """A simulator whose state the world saves and restores (plain JSON values only)."""

    def to_state(self) -> dict[str, Any]: ...

    def load_state(self, state: dict[str, Any]) -> None: ...


class AwsWorld:
    """Every sandbox AWS service behind one endpoint.

    ``data_dir``: where state is kept (``<data_dir>/aws/``); ``None`` keeps it in memory.
    ``clock``: simulated time; by default wall time sped up by ``speed``.
    ``kube``/``kube_base_url``/``kube_ca_pem``: the Kubernetes emulator, the base URL it is served at and the
    CA of its TLS certificate; an EKS cluster's endpoint is ``<kube_base_url>/k8s/clusters/<name>`` and its
    ``certificateAuthority`` is that CA.
    """

    def __init__(self, data_dir: Path | None = None, clock: SimClock | None = None, kube: Emulator | None = None,
                 *, kube_base_url: str = "http://127.0.0.1:3099", kube_ca_pem: bytes, speed: float = DEFAULT_SPEED,
                 region: str = "us-west-2", account: str = ACCOUNT_ID, moto_seed: int = MOTO_SEED,
                 ledger: Ledger | None = None) -> None:
        from .eks import EksSimulator
        from .fsx import FsxSimulator
        from .hyperpod import HyperPodSimulator
        from .iam_policy import IamPolicySimulator
        from .mlflow import MlflowTrackingServers
        from .quotas import QuotasSimulator

        self.state_dir = Path(data_dir) / "aws" if data_dir is not None else None
        if self.state_dir is not None:
            self.state_dir.mkdir(parents=True, exist_ok=True)
        self.clock: SimClock = clock if clock is not None else RealClock(speed)
        clock_path = self._state_path("clock")
        if isinstance(self.clock, RealClock) and clock_path is not None and clock_path.exists():
            self.clock.resume(float(json.loads(clock_path.read_text())["now"]))
        self.region = region
        self.account = account
        self.faults = FaultRegistry()
        self.kube = kube
        if kube is not None:
            kube.use_clock(self.clock.now)
        self.moto = MotoBackend(self.state_dir / "moto-requests.jsonl" if self.state_dir else None, moto_seed,
                                region=region, account=account)
        self.facts = MotoFacts(self.moto, region)
        self.front = AwsFront(self.moto, self.faults, account=account, region=region, ledger=ledger)
        self.front.forwarded = ForwardedChecks(self.facts, account)
        if self.state_dir is not None:
            self.front.after_write = self.save_service
        self._saved: dict[str, str] = {}
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._last_save = 0.0
        self.quotas: QuotasSimulator = QuotasSimulator(self.faults, region=region, account=account)
        self.eks: EksSimulator = EksSimulator(self.clock, self.faults, kube, kube_base_url=kube_base_url,
                                              region=region, account=account, facts=self.facts,
                                              ca_pem=kube_ca_pem)
        self.fsx: FsxSimulator = FsxSimulator(self.clock, region=region, account=account, facts=self.facts,
                                               faults=self.faults)
        self.hyperpod: HyperPodSimulator = HyperPodSimulator(self.clock, self.faults, kube, self.eks.active_cluster,
                                                             self.quotas.limit, account=account, region=region,
                                                             placement_of=self._placement_of,
                                                             eks_version=self.eks.version_of,
                                                             facts=self.facts, eks_call=self._eks_call)
        self.iam_policy = IamPolicySimulator(self.faults, self.facts, account)
        self.mlflow: MlflowTrackingServers = MlflowTrackingServers(self.clock, self.facts, account=account,
                                                                   region=region)
        self.hyperpod.extend(self.mlflow)  # SageMaker's MLflow operations: the front routes sagemaker to one simulator
        for simulator in (self.quotas, self.eks, self.fsx, self.hyperpod, self.iam_policy):
            self.register(simulator)

    # --- simulators ----------------------------------------------------------------------------------

    def register(self, simulator: SimulatedService) -> None:
        """Route the simulator's operations to it, restoring its saved state if there is any."""
        path = self._state_path(simulator.service)
        if isinstance(simulator, Persistent) and path is not None and path.exists():
            text = path.read_text()
            simulator.load_state(json.loads(text))
            self._saved[simulator.service] = text
        self.front.register(simulator)

    def _eks_call(self, operation: str, params: dict[str, Any]) -> dict[str, Any]:
        """One call into the EKS simulator from another simulator (HyperPod reading its orchestrator, writing
        access entries): under EKS's lock, saved as a client's write would be."""
        from .base import Call

        with self.front.lock(self.eks.service):
            if operation == "CreateAccessEntry":  # the service's own entry, not a client's request
                answer = self.eks.create_service_access_entry(params)
            else:
                answer = self.eks.handle(Call(self.eks.service, operation, params, self.region, self.account))
        if self.state_dir is not None and operation.startswith(("Create", "Update", "Delete", "Associate")):
            self.save_service(self.eks.service)
        return answer

    def _placement_of(self, subnet_id: str) -> Placement:
        """A HyperPod node's zone and CIDR block from its EC2 subnet (moto's), else a stable made-up zone."""
        from .hyperpod_lifecycle import Placement, default_placement_of

        made_up = default_placement_of(self.region)(subnet_id)
        found = self.moto.subnet(subnet_id, self.region) if subnet_id else None
        if found is None or not found.cidr:
            return made_up
        return Placement(found.zone or made_up.zone, found.zone_id or made_up.zone_id, found.cidr)

    def _state_path(self, service: str) -> Path | None:
        return self.state_dir / f"{service}.json" if self.state_dir is not None else None

    # --- lifecycle -----------------------------------------------------------------------------------

    @property
    def endpoint_url(self) -> str:
        return self.front.endpoint_url

    def start(self, *, port: int = 0, ticker: bool = True,
              extra_patterns: list[tuple[str, type, dict[str, Any]]] | None = None) -> AwsWorld:
        """Start moto (replaying its log), serve the front on ``port`` (with ``extra_patterns`` before it)
        and, unless told not to, the ticker."""
        self.moto.start()
        self.front.start(port=port, extra_patterns=extra_patterns)
        if self.kube is not None:  # the clusters' AWS controllers call this world
            self.kube.use_cloud(self.endpoint_url, self.region)
        if ticker:
            self._stop.clear()
            self._ticker = threading.Thread(target=self._tick_loop, name="aws-ticker", daemon=True)
            self._ticker.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(5)
            self._ticker = None
        self.front.stop()
        self.moto.stop()
        self.save()

    def __enter__(self) -> AwsWorld:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _tick_loop(self) -> None:
        while not self._stop.wait(TICK_SECONDS):
            self.tick()
            if time.monotonic() - self._last_save >= SAVE_EVERY_SECONDS:
                try:
                    self.save()
                except Exception:
                    _log.exception("sandbox AWS: saving the simulators' state failed")

    def tick(self) -> None:
        """Move every simulator to the clock's now (each under its service lock). A simulator whose tick
        raises is logged with its traceback and the others still tick: one bad resource must not stop time."""
        now = self.clock.now()
        for simulator in self.front.simulators:
            try:
                with self.front.lock(simulator.service):
                    simulator.tick(now)
            except Exception:
                _log.exception("sandbox AWS: the %s simulator failed to tick", simulator.service)

    def advance(self, seconds: float) -> None:
        """Tests: move a :class:`ManualClock` on and tick synchronously."""
        if not isinstance(self.clock, ManualClock):
            raise TypeError("advance() needs a ManualClock")
        self.clock.advance(seconds)
        self.tick()

    def save(self) -> None:
        """Write the state of every persistent simulator whose state changed since the last save, and the
        simulated time (a sped-up clock resumes from it)."""
        self._last_save = time.monotonic()
        clock_path = self._state_path("clock")
        if clock_path is not None and isinstance(self.clock, RealClock):
            _write(clock_path, json.dumps({"now": self.clock.now()}))
        for simulator in self.front.simulators:
            self.save_service(simulator.service)

    def save_service(self, service: str) -> None:
        """Write one simulator's state if it changed since it was last saved (the front calls this under
        the service's lock after each mutating call, so the state is on disk before the answer leaves)."""
        simulator = self.front.owner_of(service)
        path = self._state_path(service)
        if path is None or simulator is None or not isinstance(simulator, Persistent):
            return
        with self.front.lock(service):
            text = json.dumps(simulator.to_state(), sort_keys=True)
            if self._saved.get(service) == text:
                return
            _write(path, text)
            self._saved[service] = text

    def info(self) -> dict[str, Any]:
        """What the banner and ``instantstart sandbox info`` print about the AWS side."""
        return {"aws_endpoint_url": self.endpoint_url, "region": self.region, "account_id": self.account,
                "simulated": {sim.service: sorted(sim.operations) for sim in self.front.simulators}}


def _write(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically and durably (a crash leaves the old or the new file)."""
    tmp = path.with_name(f".{path.name}.{threading.get_ident()}.tmp")
    with tmp.open("w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
