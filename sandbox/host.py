"""The whole sandbox world in one process: ``python -m sandbox``, which ``instantstart serve`` starts as its child.

It runs the AWS front (moto and the simulators) on the AWS port, the Kubernetes emulator over TLS on the
Kubernetes port, and the sandbox's own control API under ``/_sandbox/`` on the AWS port (S3 bucket names
cannot start with ``_``), all writing to one call ledger (:mod:`sandbox.ledger`). Running apart from the
product means a crash of the product (``kill -9`` in a crash test) leaves the sandbox's state and ledger
as they were, as an outage of the control plane would leave AWS.

The parent writes the configuration as one JSON line on the child's stdin (the secrets never appear on a
command line or in the environment) and keeps stdin open: when it closes (the parent exited, however it
died) the child saves its state and exits, so no sandbox outlives its server. SIGTERM does the same.

Who the Kubernetes callers are: the emulator's own bearer token (the kubeconfigs the sandbox writes) and
EKS tokens signed with the sandbox's credentials both act as the account principal that created every
sandbox cluster; the emulator admits a caller only with an EKS access entry for that principal (the
creator's, from ``bootstrapClusterCreatorAdminPermissions``), answering 401 otherwise, as EKS does.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox.aws import AwsWorld
from sandbox.aws.eks_token import eks_token_access_key
from sandbox.control import ClusterFeed, control_patterns
from sandbox.kube import BackgroundServer, Emulator
from sandbox.kube.downloader import moto_object_store
from sandbox.ledger import Ledger
from sandbox.mlflow_proxy import endpoint, mlflow_patterns
from sandbox.mlflow_server import MlflowServer
from sandbox.tls import ensure_tls

_log = logging.getLogger("sandbox.host")


@dataclass(frozen=True)
class HostConfig:
    """What the parent tells its sandbox (one JSON object on stdin)."""

    data_dir: Path
    aws_port: int
    kube_port: int
    speed: float
    region: str
    access_keys: dict[str, str]  # access key id -> secret key: the credentials EKS tokens may be signed with
    kube_token: str
    control_token: str

    @classmethod
    def parse(cls, text: str) -> HostConfig:
        raw: dict[str, Any] = json.loads(text)
        return cls(data_dir=Path(raw["data_dir"]), aws_port=int(raw["aws_port"]), kube_port=int(raw["kube_port"]),
                   speed=float(raw["speed"]), region=str(raw["region"]),
                   access_keys={str(k): str(v) for k, v in raw["access_keys"].items()},
                   kube_token=str(raw["kube_token"]), control_token=str(raw["control_token"]))


class SandboxHost:
    """The AWS world, the emulator, the ledger and the control API of one sandbox data directory."""

    def __init__(self, config: HostConfig) -> None:
        self.config = config
        tls = ensure_tls(config.data_dir / "tls")
        self.ledger = Ledger(config.data_dir / "calls.jsonl")
        self._sts_hosts = {f"127.0.0.1:{config.aws_port}"}  # presigned against the sandbox's own STS only
        self.emulator = Emulator(config.data_dir, token=config.kube_token, accept=self._eks_principal,
                                 admit=self._admits, ledger=self.ledger, device_plugins=True)
        self.kube_server = BackgroundServer(self.emulator, "127.0.0.1", config.kube_port,
                                            ssl_context=tls.server_context())
        self.world = AwsWorld(config.data_dir, None, self.emulator,
                              kube_base_url=f"https://127.0.0.1:{config.kube_port}", kube_ca_pem=tls.ca_pem,
                              speed=config.speed, region=config.region, ledger=self.ledger)
        self.emulator.token_identity = self.world.eks.creator_arn
        self.emulator.use_object_store(moto_object_store(self.world.moto.forward, config.region))
        self.feed = ClusterFeed(self.emulator)
        self.mlflow = MlflowServer(config.data_dir / "mlflow")  # behind every managed MLflow tracking server
        self.world.mlflow.ui_base = endpoint(f"http://127.0.0.1:{config.aws_port}")

    def _eks_principal(self, cluster: str, token: str) -> str | None:
        key = eks_token_access_key(token, cluster, self.config.access_keys, hosts=self._sts_hosts)
        return self.world.eks.creator_arn if key is not None else None

    def _admits(self, cluster: str, principal: str) -> bool:
        with self.world.front.lock("eks"):
            return self.world.eks.admits(cluster, principal)

    def start(self) -> SandboxHost:
        self.kube_server.start()
        self.world.start(port=self.config.aws_port,
                         extra_patterns=[*control_patterns(self, self.config.control_token),
                                         *mlflow_patterns(self.world.mlflow, self.mlflow, self.ledger)])
        return self

    def info(self) -> dict[str, Any]:
        return {**self.world.info(), "kube_base_url": self.kube_server.base_url,
                "clusters": sorted(self.emulator.clusters), "ledger": str(self.ledger.path)}

    def stop(self) -> None:
        """Stop serving first (the ports are free for the next sandbox at once), then save everything."""
        self.feed.close()
        self.kube_server.stop()
        self.world.stop()
        self.mlflow.stop()
        self.emulator.close()
        self.ledger.close()


LOCK_WAIT_SECONDS = 30.0


def lock_data_dir(data_dir: Path, wait: float = LOCK_WAIT_SECONDS) -> int | None:
    """Hold ``<data dir>/sandbox.lock`` for this process's lifetime (one sandbox per data directory): waits
    for a previous sandbox still saving its state (its server was killed); ``None`` if it never lets go."""
    import fcntl
    import os
    import time

    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(data_dir / "sandbox.lock", os.O_RDWR | os.O_CREAT, 0o600)
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                return None
            time.sleep(0.05)
            continue
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        return fd


def main() -> int:
    """``python -m sandbox``: read the configuration from stdin, serve until stdin closes or SIGTERM."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    line = sys.stdin.readline()
    if not line.strip():
        print("python -m sandbox reads its configuration as one JSON line on stdin (instantstart serve "
              "starts it; to run the AWS world alone, use python -m sandbox.aws)", file=sys.stderr)
        return 2
    config = HostConfig.parse(line)
    if lock_data_dir(config.data_dir) is None:
        print(f"error: another sandbox keeps running on {config.data_dir} (its sandbox.lock stayed held for "
              f"{LOCK_WAIT_SECONDS:.0f}s)", file=sys.stderr, flush=True)
        return 4
    host = SandboxHost(config)
    try:
        host.start()
    except OSError as exc:
        host.stop()
        print(f"error: a sandbox port cannot be used ({exc.strerror}): AWS port {config.aws_port}, Kubernetes port "
              f"{config.kube_port}", file=sys.stderr, flush=True)
        return 3
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    def parent_gone() -> None:
        sys.stdin.read()  # returns at EOF: the parent closed the pipe or died
        stop.set()

    threading.Thread(target=parent_gone, name="sandbox-parent", daemon=True).start()
    _log.info("sandbox ready: AWS at %s, Kubernetes at %s, ledger %s", host.world.endpoint_url,
              host.kube_server.base_url, host.ledger.path)
    stop.wait()
    _log.info("sandbox stopping: saving state")
    host.stop()
    return 0
