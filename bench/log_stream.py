"""Log streaming: a 16-pod job's logs to one WebSocket client, next to one ``kubectl logs -f`` per pod.

Three processes beside this one: the *world* (the Kubernetes emulator with the job's pods, and the emitter
that appends lines to their logs at a fixed total rate; each line carries its emission time), the *product*
(the REST server with the job-logs WebSocket, built against that emulator through a kubeconfig, as for any
EKS cluster), and, for B, one ``kubectl logs -f`` subprocess per pod. Measured: lines delivered per second,
CPU-seconds and peak RSS of the reading side (A: the product process; B: all the kubectl processes) per
million lines delivered, end-to-end latency (emission to the client's read), and the product's RSS growth
while a connected client reads nothing for ``--stall`` seconds (its buffer is bounded: lines are dropped
and counted instead).

    python bench/log_stream.py [--pods 16] [--rate 20000] [--seconds 10] [--stall 60]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import tornado.httpclient
import tornado.websocket
import websocket

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CLUSTER = "bench"
NAMESPACE = "hyperpod-ns-training"
JOB = "llama"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


# ----- the world process: the emulator and the emitter -------------------------------------------------------

def run_world(pods: int, folder: Path) -> None:
    from kubernetes import client as k8s
    from kubernetes import config as kconfig

    from sandbox.kube import BackgroundServer, Emulator

    emulator = Emulator(None, debounce=0.05)
    emulator.ensure_cluster(CLUSTER)
    server = BackgroundServer(emulator).start()
    path = emulator.write_kubeconfig(CLUSTER, server.base_url, folder / "kubeconfig")
    core = k8s.CoreV1Api(kconfig.new_client_from_config(str(path)))
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    names = [f"{JOB}-worker-{i}" for i in range(pods)]
    for name in names:
        core.create_namespaced_pod(NAMESPACE, {
            "metadata": {"name": name, "labels": {"instantstart.io/job": JOB, "instantstart.io/recipe": "pytorch"}},
            "spec": {"containers": [{"name": "pytorch", "image": "busybox"}]}})
    print(json.dumps({"kubeconfig": str(path), "pods": names}), flush=True)
    for command in sys.stdin:  # "emit <rate> <seconds> <tag>": emit, then answer "done <lines>"
        _, rate, seconds, tag = command.split()
        sent = emit(emulator, names, int(rate), float(seconds), tag)
        print(f"done {sent}", flush=True)
    server.stop()


def emit(emulator: Any, names: list[str], rate: int, seconds: float, tag: str) -> int:
    tick = 0.01
    per_tick = max(1, round(rate * tick))
    start = time.monotonic()
    sent = 0
    while (elapsed := time.monotonic() - start) < seconds:
        due = round(elapsed / tick) * per_tick
        while sent < due:
            pod = names[sent % len(names)]
            emulator.append_log(CLUSTER, NAMESPACE, pod, "pytorch",
                                f"t={time.time():.6f} [rank0] {tag} {sent} | loss 2.3456 | 12345.6 tokens/s")
            sent += 1
        time.sleep(tick / 2)
    return sent


# ----- the product process -------------------------------------------------------------------------------------

def run_product(kubeconfig: Path, folder: Path) -> None:
    from app.bootstrap import build_services
    from services.clusters.models import ClusterRecord, Ownership
    from services.settings import Settings
    from tests.logs_support import rest_server

    services = build_services(Settings(data_dir=folder / "product", workers=1, sandbox=True))
    services.clusters.registry.add(ClusterRecord(
        name=CLUSTER, region="us-west-2", eks_name=CLUSTER, ownership=Ownership.IMPORTED,
        eks_arn=f"arn:aws:eks:us-west-2:123456789012:cluster/{CLUSTER}", created_at="", created_by="bench"), 0.0)
    services.kube.register_kubeconfig(CLUSTER, kubeconfig)
    with rest_server(services) as (url, token):
        print(json.dumps({"url": url, "token": token}), flush=True)
        sys.stdin.read()  # until the bench closes our stdin
    services.stop()


# ----- the bench -----------------------------------------------------------------------------------------------

class Reader:
    """Counts lines and their latency (emission time in the text to now) from any source, on a thread."""

    def __init__(self) -> None:
        self.lines = 0
        self.latencies: list[float] = []
        self.last = 0.0
        self.lock = threading.Lock()

    def saw(self, text: str) -> None:
        now = time.time()
        at = text.find("t=")
        with self.lock:
            self.lines += 1
            self.last = time.monotonic()
            if at >= 0 and self.lines % 50 == 0:  # a sample keeps the bookkeeping light
                self.latencies.append(now - float(text[at + 2:at + 19]))

    def saw_block(self, text: str) -> None:
        """Lines as one WebSocket frame carries them: counted, the latency sampled on the first (the oldest, so
        the longest wait) and the last one."""
        now = time.time()
        with self.lock:
            self.lines += text.count("\n")
            self.last = time.monotonic()
            for at in {text.find("t="), text.rfind("t=")} - {-1}:
                self.latencies.append(now - float(text[at + 2:at + 19]))


class Sampler:
    """Peak RSS (and the first sample) of a set of processes, sampled every 50 ms."""

    def __init__(self, procs: list[psutil.Process]) -> None:
        self.procs = procs
        self.first = self._rss()
        self.peak = self.first
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _rss(self) -> int:
        total = 0
        for p in self.procs:
            with contextlib.suppress(psutil.Error):
                total += p.memory_info().rss
        return total

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, self._rss())

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def cpu(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def start_child(*args: str) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    child = subprocess.Popen([sys.executable, __file__, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, cwd=ROOT)
    assert child.stdout is not None
    return child, json.loads(child.stdout.readline())


def emit_lines(world: subprocess.Popen[str], rate: int, seconds: float, tag: str = "step") -> int:
    assert world.stdin is not None and world.stdout is not None
    world.stdin.write(f"emit {rate} {seconds} {tag}\n")
    world.stdin.flush()
    return int(world.stdout.readline().split()[1])


def wait_for(reader: Reader, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while reader.lines < count and time.monotonic() < deadline:
        time.sleep(0.05)


def head(frame: str) -> dict[str, Any]:
    """A log frame's JSON line (the lines follow it)."""
    parsed: dict[str, Any] = json.loads(frame.partition("\n")[0])
    return parsed


def ws_url(product: dict[str, Any]) -> str:
    return product["url"].replace("http://", "ws://") + f"/api/v1/clusters/{CLUSTER}/jobs/{JOB}/logs/ws" \
        f"?namespace={NAMESPACE}&tail=0"


def ws_connect(product: dict[str, Any]) -> websocket.WebSocket:
    ws = websocket.create_connection(ws_url(product), header=[f"Authorization: Bearer {product['token']}"], timeout=60,
                                     suppress_origin=True)
    while not head(ws.recv()).get("caught_up"):  # the stream is live: emission may start
        pass
    return ws


def side_a(world: subprocess.Popen[str], product_proc: psutil.Process, product: dict[str, Any], rate: int,
           seconds: float) -> dict[str, Any]:
    """The client reads with Tornado's WebSocket client on a loop of its own (websocket-client's pure-Python
    frame reading is slower than the server under test)."""
    reader = Reader()
    dropped = [0]
    live = threading.Event()
    done = threading.Event()
    loop = asyncio.new_event_loop()
    sockets: list[Any] = []

    async def read() -> None:
        request = tornado.httpclient.HTTPRequest(ws_url(product), headers={
            "Authorization": f"Bearer {product['token']}"})
        ws = await tornado.websocket.websocket_connect(request, max_message_size=256 * 2**20)
        sockets.append(ws)
        while not done.is_set():
            message = await ws.read_message()
            if message is None:
                return
            head, _, body = message.partition("\n")
            frame = json.loads(head)
            if frame.get("caught_up"):
                live.set()
            dropped[0] = frame["dropped"]
            if body:
                reader.saw_block(body)
        ws.close()

    thread = threading.Thread(target=lambda: loop.run_until_complete(read()), daemon=True)
    thread.start()
    live.wait(60)
    sampler = Sampler([product_proc])
    cpu0, start = cpu([product_proc]), time.monotonic()
    sent = emit_lines(world, rate, seconds)
    wait_for(reader, sent, 60)
    result = {"sent": sent, "got": reader.lines, "cpu": cpu([product_proc]) - cpu0, "peak": sampler.stop(),
              "elapsed": max(reader.last, start + 1e-3) - start, "lat": reader.latencies, "dropped": dropped[0]}
    done.set()
    for ws in sockets:
        loop.call_soon_threadsafe(ws.close)
    thread.join(10)
    return result


def side_b(world: subprocess.Popen[str], names: list[str], kubeconfig: str, rate: int,
           seconds: float) -> dict[str, Any]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is not installed"
    reader = Reader()
    procs = [subprocess.Popen([kubectl, "--kubeconfig", kubeconfig, "logs", "-f", "-n", NAMESPACE, name,
                               "-c", "pytorch", "--tail=0"], stdout=subprocess.PIPE, text=True) for name in names]

    heard: set[int] = set()

    def read(proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "warm-up" in line:
                heard.add(proc.pid)
            else:
                reader.saw(line)

    for proc in procs:
        threading.Thread(target=read, args=(proc,), daemon=True).start()
    ps = [psutil.Process(p.pid) for p in procs]
    deadline = time.monotonic() + 60
    while len(heard) < len(procs) and time.monotonic() < deadline:  # every kubectl connected and reading
        emit_lines(world, len(names) * 4, 0.5, "warm-up")
    sampler = Sampler(ps)
    cpu0, start = cpu(ps), time.monotonic()
    sent = emit_lines(world, rate, seconds)
    wait_for(reader, sent, 60)
    result = {"sent": sent, "got": reader.lines, "cpu": cpu(ps) - cpu0, "peak": sampler.stop(),
              "elapsed": max(reader.last, start + 1e-3) - start, "lat": reader.latencies, "dropped": 0}
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait(10)
    return result


def stall(world: subprocess.Popen[str], product_proc: psutil.Process, product: dict[str, Any], rate: int,
          seconds: float) -> tuple[float, int, int]:
    ws = ws_connect(product)  # connected, then reads nothing while the job writes
    sampler = Sampler([product_proc])
    sent = emit_lines(world, rate, seconds)
    grown = (sampler.stop() - sampler.first) / 2**20
    dropped, deadline = 0, time.monotonic() + 10
    ws.settimeout(2)
    try:  # what the client reads once it reads again: the drop count after the lines still buffered
        while dropped == 0 and time.monotonic() < deadline:
            dropped = max(dropped, int(head(ws.recv()).get("dropped", 0)))
    except (websocket.WebSocketException, OSError):
        pass
    ws.close()
    return grown, sent, dropped


def report(label: str, r: dict[str, Any]) -> float:
    per_million = r["cpu"] / max(r["got"], 1) * 1e6
    print(f"{label}: {r['got']:,} of {r['sent']:,} lines, {r['got'] / r['elapsed']:,.0f} lines/s delivered, "
          f"{per_million:.1f} CPU-s per 1M lines, peak RSS {r['peak'] / 2**20:.0f} MB "
          f"({r['peak'] / 2**20 / max(r['got'], 1) * 1e6:.0f} MB per 1M lines), latency p50 "
          f"{percentile(r['lat'], 0.5) * 1000:.0f} ms, p99 {percentile(r['lat'], 0.99) * 1000:.0f} ms"
          + (f", dropped {r['dropped']}" if r["dropped"] else ""))
    return per_million


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=16)
    parser.add_argument("--rate", type=int, default=20_000, help="lines per second, all pods together")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--stall", type=float, default=60.0, help="seconds a connected client reads nothing")
    parser.add_argument("--role", choices=["world", "product"], help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    parser.add_argument("--kubeconfig", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "world":
        run_world(args.pods, Path(args.dir))
        return 0
    if args.role == "product":
        run_product(Path(args.kubeconfig), Path(args.dir))
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-logs-") as tmp:
        world, facts = start_child("--role", "world", "--pods", str(args.pods), "--dir", tmp)
        product_child, product = start_child("--role", "product", "--kubeconfig", facts["kubeconfig"],
                                             "--dir", tmp)
        try:
            print(f"{args.pods} pods, {args.rate:,} lines/s for {args.seconds:g} s")
            a = side_a(world, psutil.Process(product_child.pid), product, args.rate, args.seconds)
            b = side_b(world, facts["pods"], facts["kubeconfig"], args.rate, args.seconds)
            cost_a = report("A instantstart WebSocket (one client, all pods)", a)
            cost_b = report(f"B {args.pods} x kubectl logs -f", b)
            print(f"ratio CPU B/A: {cost_b / max(cost_a, 1e-9):.1f}x, peak RSS B/A: "
                  f"{b['peak'] / max(a['peak'], 1):.1f}x")
            grown, sent, dropped = stall(world, psutil.Process(product_child.pid), product, args.rate, args.stall)
            print(f"stall: server RSS grew {grown:.1f} MB while a client read nothing for {args.stall:g} s "
                  f"({sent:,} lines written, {dropped:,} dropped for that client)")
        finally:
            for child in (product_child, world):
                assert child.stdin is not None
                child.stdin.close()
                child.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
