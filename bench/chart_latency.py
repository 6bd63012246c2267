"""Chart update latency: an MLflow ``log_metric`` to the point pushed to the chart's subscribers.

A real MLflow tracking server (the sandbox's, ``sandbox/mlflow_server.py``) holds one run; the product's live
poller (``services/mlflow/live.py``, the one the chart pane follows, at its default interval) reads it; a bus
subscriber stands in for the pane (the pane's ``LiveRefresh`` takes the very same event). The clock starts
just before ``log_metric`` is sent and stops when the subscriber holds the event carrying that step. Points
are logged one at a time at a pseudo-random phase of the poll interval, so the figure covers the whole
interval, not a lucky alignment. Goal: under 2 s.

    python bench/chart_latency.py [-n 30] [--interval 1.0]
"""

from __future__ import annotations

import argparse
import queue
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from mlflow.tracking import MlflowClient

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sandbox.mlflow_server import MlflowServer  # noqa: E402
from services.events import Event, EventBus  # noqa: E402
from services.mlflow.live import DEFAULT_INTERVAL, TOPIC, MetricsLive  # noqa: E402
from services.mlflow.metrics import JobRun, RunReader  # noqa: E402

GOAL = 2.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=30, help="points logged, one at a time")
    parser.add_argument("--interval", type=float, default=DEFAULT_INTERVAL, help="the poller's interval (s)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="chart-latency-") as tmp:
        server = MlflowServer(Path(tmp) / "mlflow")
        try:
            url = server.url()
            client = MlflowClient(url)
            run_id = client.create_run(client.create_experiment("chart-latency")).info.run_id
            bus = EventBus()
            arrived: queue.Queue[tuple[float, Event]] = queue.Queue()
            bus.subscribe(lambda e: arrived.put((time.perf_counter(), e)), topic=TOPIC)
            reader = RunReader()
            live = MetricsLive(reader, bus, interval=args.interval)
            follow = live.follow(JobRun("bench", "ns", "bench-job", "pytorch", url, run_id))
            phase = random.Random(13)
            latencies: list[float] = []
            for step in range(1, args.n + 1):
                time.sleep(phase.uniform(0, args.interval))  # pacing the emitter, not synchronising on it
                started = time.perf_counter()
                client.log_metric(run_id, "loss", 1.0 / step, step=step)
                while True:
                    at, event = arrived.get(timeout=30)
                    if any(p["step"] == step for p in event.data["series"].get("loss", [])):
                        latencies.append(at - started)
                        break
            follow.close()
            calls = live.calls
        finally:
            server.stop()
    median, p95 = statistics.median(latencies), percentile(latencies, 0.95)
    print(f"log_metric -> pushed point over {len(latencies)} points (poll interval {args.interval:.2f} s): "
          f"median {median * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms")
    print(f"MLflow calls by the poller: {calls} ({calls / len(latencies):.1f} per point)")
    print(f"goal p95 < {GOAL:.0f} s: {'met' if p95 < GOAL else 'NOT met'}")


if __name__ == "__main__":
    main()
