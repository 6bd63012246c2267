"""The sandbox AWS world: moto, the front, the simulators, their clock and their saved state.

``instantstart serve`` without AWS credentials builds one :class:`AwsWorld`; tests build one with a
:class:`~sandbox.aws.base.ManualClock` and call :meth:`AwsWorld.advance`. The world owns the lifecycle
(start moto, restore state, serve the front, tick the simulators) so that nothing else has to know the
order. State survives restarts in two ways, because moto has no persistence of its own:

* simulators that offer ``to_state()``/``load_state(state)`` are saved as JSON under ``<data_dir>/aws/``
  whenever their state changed (checked about once a second) and on :meth:`AwsWorld.stop`;
* every request forwarded to moto is appended to ``<data_dir>/aws/moto-requests.jsonl`` and replayed into
  a freshly reset and seeded moto on the next start, which recreates the same resources with the same ids
  (moto's ids come from its seeded random generator).

moto's state is global to the process, so only one world may run in a process at a time.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import os
import re
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable
from urllib.parse import urlencode

from .base import FaultRegistry, ManualClock, RealClock, SimClock, SimulatedService
from .front import ACCOUNT_ID, AwsFront

if TYPE_CHECKING:
    from sandbox.kube import Emulator

    from .eks import EksSimulator
    from .fsx import FsxSimulator
    from .hyperpod import HyperPodSimulator
    from .quotas import QuotasSimulator

TICK_SECONDS = 0.2
SAVE_EVERY_SECONDS = 1.0
DEFAULT_SPEED = 40.0  # a ~10-minute EKS create takes ~15 s
MOTO_SEED = 20260101


@runtime_checkable
class Persistent(Protocol):
    """A simulator whose state the world saves and restores (plain JSON values only)."""

    def to_state(self) -> dict[str, Any]: ...

    def load_state(self, state: dict[str, Any]) -> None: ...


class MotoBackend:
    """moto's in-process server, reset and seeded on start, with a request log it can replay."""

    def __init__(self, log_path: Path | None, seed: int = MOTO_SEED) -> None:
        os.environ.setdefault("MOTO_IAM_LOAD_MANAGED_POLICIES", "true")
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's per-request access log
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._log_path = log_path
        self._seed = seed
        self._log_lock = threading.Lock()
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> int:
        """Start, reset, seed and replay the log; returns how many requests were replayed."""
        self._server.start()
        self.port = self._server.get_host_and_port()[1]
        self._send("POST", "/moto-api/reset", {}, b"")
        self._send("POST", f"/moto-api/seed?a={self._seed}", {}, b"")
        return self._replay()

    def stop(self) -> None:
        if self.port:
            self._server.stop()
            self.port = 0

    def _send(self, method: str, uri: str, headers: Mapping[str, str], body: bytes) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request(method, uri, body=body or None, headers=dict(headers))
            response = conn.getresponse()
            response.read()
            return response.status
        finally:
            conn.close()

    def _replay(self) -> int:
        if self._log_path is None or not self._log_path.exists():
            return 0
        count = 0
        with self._log_path.open() as fh:
            for line in fh:
                if not line.strip():
                    continue
                entry = json.loads(line)
                self._send(entry["method"], entry["uri"], entry["headers"], base64.b64decode(entry["body"]))
                count += 1
        return count

    def subnet_vpc(self, subnet_id: str, region: str) -> str | None:
        """The VPC of a moto subnet (``None`` if there is none); logged like any request so replay stays exact."""
        body = urlencode({"Action": "DescribeSubnets", "Version": "2016-11-15", "SubnetId.1": subnet_id}).encode()
        headers = {"Content-Type": "application/x-www-form-urlencoded; charset=utf-8",
                   "Authorization": f"AWS4-HMAC-SHA256 Credential=testing/20260101/{region}/ec2/aws4_request, "
                                    "SignedHeaders=host, Signature=sandbox"}
        self.record("POST", "/", headers, body)
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request("POST", "/", body=body, headers=headers)
            text = conn.getresponse().read().decode()
        finally:
            conn.close()
        match = re.search(r"<vpcId>(vpc-[0-9a-f]+)</vpcId>", text)
        return match.group(1) if match else None

    def record(self, method: str, uri: str, headers: Mapping[str, str], body: bytes) -> None:
        """The front's forward hook: append one request to the log."""
        if self._log_path is None:
            return
        entry = {"method": method, "uri": uri, "headers": dict(headers), "body": base64.b64encode(body).decode()}
        with self._log_lock, self._log_path.open("a") as fh:
            fh.write(json.dumps(entry) + "\n")


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
                 region: str = "us-west-2", account: str = ACCOUNT_ID, moto_seed: int = MOTO_SEED) -> None:
        from .eks import EksSimulator
        from .fsx import FsxSimulator
        from .hyperpod import HyperPodSimulator
        from .quotas import QuotasSimulator

        self.state_dir = Path(data_dir) / "aws" if data_dir is not None else None
        if self.state_dir is not None:
            self.state_dir.mkdir(parents=True, exist_ok=True)
        self.clock: SimClock = clock if clock is not None else RealClock(speed)
        self.region = region
        self.account = account
        self.faults = FaultRegistry()
        self.kube = kube
        self.moto = MotoBackend(self.state_dir / "moto-requests.jsonl" if self.state_dir else None, moto_seed)
        self.front = AwsFront("http://127.0.0.1:0", self.faults, account=account, region=region,
                              on_forward=self.moto.record)
        self._saved: dict[str, str] = {}
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._last_save = 0.0
        self.quotas: QuotasSimulator = QuotasSimulator(self.faults, region=region, account=account)
        self.eks: EksSimulator = EksSimulator(self.clock, self.faults, kube, kube_base_url=kube_base_url,
                                              region=region, account=account, subnet_vpc=self._subnet_vpc,
                                              ca_pem=kube_ca_pem)
        self.fsx: FsxSimulator = FsxSimulator(self.clock, region=region, account=account,
                                              subnet_vpc=self._subnet_vpc)
        self.hyperpod: HyperPodSimulator = HyperPodSimulator(self.clock, self.faults, kube, self.eks.active_cluster,
                                                             self.quotas.limit, account=account, region=region)
        for simulator in (self.quotas, self.eks, self.fsx, self.hyperpod):
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

    def _subnet_vpc(self, subnet_id: str) -> str | None:
        return self.moto.subnet_vpc(subnet_id, self.region)

    def _state_path(self, service: str) -> Path | None:
        return self.state_dir / f"{service}.json" if self.state_dir is not None else None

    # --- lifecycle -----------------------------------------------------------------------------------

    @property
    def endpoint_url(self) -> str:
        return self.front.endpoint_url

    def start(self, *, port: int = 0, ticker: bool = True) -> AwsWorld:
        """Start moto (replaying its log), serve the front on ``port`` and, unless told not to, the ticker."""
        self.moto.start()
        self.front.moto_url = self.moto.url
        self.front.start(port=port)
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
                self.save()

    def tick(self) -> None:
        """Move every simulator to the clock's now (each under its service lock)."""
        now = self.clock.now()
        for simulator in self.front.simulators:
            with self.front.lock(simulator.service):
                simulator.tick(now)

    def advance(self, seconds: float) -> None:
        """Tests: move a :class:`ManualClock` on and tick synchronously."""
        if not isinstance(self.clock, ManualClock):
            raise TypeError("advance() needs a ManualClock")
        self.clock.advance(seconds)
        self.tick()

    def save(self) -> None:
        """Write the state of every persistent simulator whose state changed since the last save."""
        self._last_save = time.monotonic()
        for simulator in self.front.simulators:
            path = self._state_path(simulator.service)
            if path is None or not isinstance(simulator, Persistent):
                continue
            with self.front.lock(simulator.service):
                text = json.dumps(simulator.to_state(), sort_keys=True)
            if self._saved.get(simulator.service) == text:
                continue
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(path)
            self._saved[simulator.service] = text

    def info(self) -> dict[str, Any]:
        """What the banner and ``instantstart sandbox info`` print about the AWS side."""
        return {"aws_endpoint_url": self.endpoint_url, "region": self.region, "account_id": self.account,
                "simulated": {sim.service: sorted(sim.operations) for sim in self.front.simulators}}
