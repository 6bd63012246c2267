"""Push latency: a node label change in the emulator to the event on the product's events WebSocket.

A node's label is changed with a strategic-merge PATCH through the sandbox Kubernetes API (the official
client, the way any controller or ``kubectl label`` would); the product's node informer sees it on its watch
and publishes it on the bus; ``/api/v1/events`` pushes it to a WebSocket client holding a viewer token. The
clock starts just before the PATCH is sent and stops when the client has read the ``kube``/``modified``
event naming that node. One change at a time, nodes in turn.

    python bench/push_latency.py [--nodes 10] [-n 200]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import websocket
from kubernetes import client as kube_client
from kubernetes import config as kube_config

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.world import World, seeded_world  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def wait_for(ws: websocket.WebSocket, cluster: str, node: str, deadline: float) -> None:
    while True:
        ws.settimeout(max(0.01, deadline - time.monotonic()))
        event = json.loads(ws.recv())
        data = event.get("data", {})
        if (event.get("topic"), event.get("kind"), data.get("cluster"), data.get("resource"), data.get("name")) == \
                ("kube", "modified", cluster, "nodes", node):
            return


def subscribed(ws: websocket.WebSocket, api: kube_client.CoreV1Api, cluster: str, node: str, timeout: float) -> None:
    """Wait until the socket's subscription is live: the server subscribes in ``open()``, which may run after
    the client has seen the handshake, so a change made at once can precede it. Change a warm-up label until
    its event arrives (not timed)."""
    deadline = time.monotonic() + timeout
    for attempt in range(1_000_000):
        api.patch_node(node, {"metadata": {"labels": {"bench.instantstart.dev/warm": str(attempt)}}})
        try:
            wait_for(ws, cluster, node, min(deadline, time.monotonic() + 1.0))
            return
        except websocket.WebSocketTimeoutException:
            if time.monotonic() >= deadline:
                raise


def measure(world: World, changes: int, timeout: float = 30) -> list[float]:
    viewer = world.live.make_token("viewer", "bench-push")
    api = kube_client.CoreV1Api(kube_config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(world.kubeconfig)))
    nodes = [str(n.metadata.name) for n in api.list_node().items if n.metadata is not None]
    ws_url = world.live.url.replace("http://", "ws://") + "/api/v1/events"
    ws = websocket.create_connection(ws_url, header=[f"Authorization: Bearer {viewer}"], timeout=10)
    latencies: list[float] = []
    try:
        subscribed(ws, api, world.cluster, nodes[0], timeout)
        for i in range(changes):
            node = nodes[i % len(nodes)]
            started = time.perf_counter()
            api.patch_node(node, {"metadata": {"labels": {"bench.instantstart.dev/seq": str(i)}}})
            wait_for(ws, world.cluster, node, time.monotonic() + timeout)
            latencies.append(time.perf_counter() - started)
    finally:
        ws.close()
    return latencies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=10, help="HyperPod nodes of the seeded cluster")
    parser.add_argument("-n", type=int, default=200, help="label changes (one at a time)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp, seeded_world(Path(tmp), args.nodes) as world:
        latencies = measure(world, args.n)
    ms = [v * 1000 for v in latencies]
    print(f"{len(ms)} node label changes (cluster of {args.nodes} nodes): PATCH through the emulator's Kubernetes "
          "API -> event on /api/v1/events")
    print(f"p50 {percentile(ms, 0.5):.1f} ms, p99 {percentile(ms, 0.99):.1f} ms, "
          f"mean {statistics.mean(ms):.1f} ms, max {max(ms):.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
