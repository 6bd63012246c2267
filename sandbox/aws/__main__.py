"""``python -m sandbox.aws``: the sandbox AWS world (with its Kubernetes emulator) on its own, for poking at
it with ``aws --endpoint-url`` and ``kubectl`` without running the product."""

from __future__ import annotations

import argparse
import json
import signal
import tempfile
import threading
from pathlib import Path

from sandbox.kube import BackgroundServer, Emulator
from sandbox.tls import ensure_tls

from .world import DEFAULT_SPEED, AwsWorld


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m sandbox.aws", description=__doc__)
    parser.add_argument("--port", type=int, default=4566, help="AWS endpoint port (0: any free port)")
    parser.add_argument("--kube-port", type=int, default=0, help="Kubernetes emulator port (0: any free port)")
    parser.add_argument("--data-dir", type=Path, default=None, help="keep state here across restarts")
    parser.add_argument("--speed", type=float, default=DEFAULT_SPEED, help="simulated seconds per real second")
    parser.add_argument("--region", default="us-west-2")
    args = parser.parse_args()

    emulator = Emulator(args.data_dir)
    kube = BackgroundServer(emulator, port=args.kube_port).start()
    # plain HTTP here, so the CA is only what DescribeCluster reports
    ca = ensure_tls(args.data_dir / "tls" if args.data_dir else Path(tempfile.mkdtemp()) / "tls").ca_pem
    world = AwsWorld(args.data_dir, None, emulator, kube_base_url=kube.base_url, kube_ca_pem=ca, speed=args.speed,
                     region=args.region).start(port=args.port)
    print(json.dumps({**world.info(), "kube_base_url": kube.base_url}, indent=2), flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    world.stop()
    kube.stop()
    emulator.close()


if __name__ == "__main__":
    main()
