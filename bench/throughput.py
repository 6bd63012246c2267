"""Cached reads under load: ``wrk`` at 100 connections with a viewer bearer token, req/s and p99.

A: ``instantstart serve`` in sandbox mode with an imported, seeded cluster (informers synced, AWS caches
warm), reading ``GET /api/v1/status`` and ``GET /api/v1/clusters/{cluster}``.
B: a bare Tornado handler in one process with the same sha256 token check, a cached body of the same
size as A's cluster detail and the same access log policy as ``instantstart serve`` (a quick 200 read is
counted, not logged: app/edge.py) — the floor of this stack.

The machine is shared, so the three are measured in alternating rounds (B, A status, A detail, B, ...)
and each figure is the median over the rounds. Beside req/s and latency, each run reports the server
process's CPU time per request (user + system, from /proc, over the ``wrk`` run): on a machine other
developers load, it moves far less than req/s.

    python bench/throughput.py [--nodes 10] [--duration 10] [--rounds 3] [--connections 100] [--pin]

``--pin`` runs each server on CPU 0 and ``wrk`` on CPU 1 (every thread of the server process, as the issue's
"one core of this machine" figure for the bare handler), so the two do not take turns on the same cores.

Needs ``wrk`` (Debian: ``apt-get install -y wrk``).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import httpx2

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.world import seeded_world  # noqa: E402
from tests.support import free_port  # noqa: E402

INSTALL = "wrk is not installed: apt-get install -y wrk (Debian package 'wrk')"

BARE_SERVER = textwrap.dedent('''
    import hashlib, hmac, logging, sys
    import tornado.ioloop, tornado.web
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    TOKEN_HASH = hashlib.sha256(sys.argv[2].encode()).hexdigest()
    BODY = b"x" * int(sys.argv[3])
    ANSWERED = {}

    def count(handler):  # the server's access log policy for a quick 200 read: counted, not logged
        key = (handler.request.method, handler.get_status())
        ANSWERED[key] = ANSWERED.get(key, 0) + 1

    class Cached(tornado.web.RequestHandler):
        def get(self):
            presented = self.request.headers.get("Authorization", "").partition(" ")[2]
            if not hmac.compare_digest(hashlib.sha256(presented.encode()).hexdigest(), TOKEN_HASH):
                self.set_status(401)
                self.finish(b"{}")
                return
            self.set_header("Content-Type", "application/json")
            self.finish(BODY)

    tornado.web.Application([(r"/cached", Cached)], log_function=count).listen(int(sys.argv[1]), "127.0.0.1")
    tornado.ioloop.IOLoop.current().start()
''')


@dataclass
class WrkResult:
    requests_per_second: float
    p50_ms: float
    p99_ms: float
    errors: str
    requests: int = 0
    #: the server process's CPU time (user + system) per request: less swayed by other load than req/s
    cpu_us_per_request: float = 0.0

    def line(self, label: str) -> str:
        extra = f" ({self.errors})" if self.errors else ""
        cpu = f", server CPU {self.cpu_us_per_request:.0f} us/req" if self.cpu_us_per_request else ""
        return (f"{label}: {self.requests_per_second:,.0f} req/s, p50 {self.p50_ms:.1f} ms, "
                f"p99 {self.p99_ms:.1f} ms{cpu}{extra}")


def _ms(value: str, unit: str) -> float:
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}[unit]


def parse_wrk(text: str) -> WrkResult:
    rate = re.search(r"Requests/sec:\s+([\d.]+)", text)
    count = re.search(r"(\d+) requests in", text)
    p50 = re.search(r"^\s+50%\s+([\d.]+)(us|ms|s|m)\s*$", text, re.M)
    p99 = re.search(r"^\s+99%\s+([\d.]+)(us|ms|s|m)\s*$", text, re.M)
    if not (rate and p50 and p99):
        raise RuntimeError(f"unexpected wrk output:\n{text}")
    errors = [line.strip() for line in text.splitlines()
              if "Non-2xx" in line or "Socket errors" in line]
    return WrkResult(float(rate.group(1)), _ms(*p50.groups()), _ms(*p99.groups()), "; ".join(errors),
                     int(count.group(1)) if count else 0)


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of process ``pid`` (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pin(pid: int, cpu: int) -> None:
    """Every thread of process ``pid`` (sched_setaffinity on a pid moves only its main thread) on ``cpu``."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.sched_setaffinity(int(task.name), {cpu})


def wrk(url: str, token: str, connections: int, duration: float, threads: int = 2,
        cpu: int | None = None, server_pid: int | None = None) -> WrkResult:
    before = cpu_seconds(server_pid) if server_pid else 0.0
    out = subprocess.run(["wrk", f"-t{threads}", f"-c{connections}", f"-d{max(1, round(duration))}s", "--latency",
                          "-H", f"Authorization: Bearer {token}", url],
                         capture_output=True, text=True, timeout=duration + 60,
                         preexec_fn=None if cpu is None else lambda: os.sched_setaffinity(0, {cpu}))
    if out.returncode != 0:
        raise RuntimeError(f"wrk failed: {out.stderr}")
    result = parse_wrk(out.stdout)
    if server_pid and result.requests:
        result.cpu_us_per_request = (cpu_seconds(server_pid) - before) / result.requests * 1e6
    return result


def median(runs: list[WrkResult]) -> WrkResult:
    return WrkResult(statistics.median(r.requests_per_second for r in runs), statistics.median(r.p50_ms for r in runs),
                     statistics.median(r.p99_ms for r in runs), "; ".join(r.errors for r in runs if r.errors),
                     sum(r.requests for r in runs), statistics.median(r.cpu_us_per_request for r in runs))


BARE_TOKEN = "ist_0123abcd_bench-token-of-the-usual-length-0123456789ab"


def start_bare(body_bytes: int) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", BARE_SERVER, str(port), BARE_TOKEN, str(body_bytes)],
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/cached"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx2.get(url, headers={"Authorization": f"Bearer {BARE_TOKEN}"}, timeout=1).status_code == 200:
                return proc, url
        except httpx2.HTTPError:
            if time.monotonic() > deadline:
                proc.kill()
                raise
            time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=10, help="HyperPod nodes of the seeded cluster (default 10)")
    parser.add_argument("--duration", type=float, default=10, help="seconds per wrk run (default 10)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument("--connections", type=int, default=100)
    parser.add_argument("--pin", action="store_true", help="servers on CPU 0, wrk on CPU 1")
    args = parser.parse_args(argv)
    if shutil.which("wrk") is None:
        print(INSTALL, file=sys.stderr)
        return 2
    runs: dict[str, list[WrkResult]] = {"B bare Tornado": [], "A status": [], "A cluster detail": []}
    with tempfile.TemporaryDirectory() as tmp, seeded_world(Path(tmp), args.nodes) as world:
        viewer = world.live.make_token("viewer", "bench-viewer")
        detail_path = f"/api/v1/clusters/{world.cluster}"
        size = len(world.live.get(detail_path, viewer).content)
        world.live.get("/api/v1/status", viewer)  # its token is now admitted
        proc, bare_url = start_bare(size)
        wrk_cpu = None
        if args.pin:
            pin(proc.pid, 0)
            pin(world.live.process.pid, 0)
            wrk_cpu = 1
        try:
            targets = {"B bare Tornado": (bare_url, BARE_TOKEN, proc.pid),
                       "A status": (world.live.url + "/api/v1/status", viewer, world.live.process.pid),
                       "A cluster detail": (world.live.url + detail_path, viewer, world.live.process.pid)}
            for number in range(1, args.rounds + 1):
                for label, (url, token, pid) in targets.items():
                    runs[label].append(wrk(url, token, args.connections, args.duration, cpu=wrk_cpu, server_pid=pid))
                    print(runs[label][-1].line(f"round {number}, {label}"), flush=True)
        finally:
            proc.terminate()
            proc.wait(10)
    results = {label: median(r) for label, r in runs.items()}
    pinned = ", servers on CPU 0 and wrk on CPU 1" if args.pin else ""
    print(f"wrk -c{args.connections} -d{args.duration:g}s x {args.rounds} alternating rounds (medians){pinned}, "
          f"viewer token; cluster of {args.nodes} nodes, detail body {size:,} bytes (B serves the same size)")
    for label, result in results.items():
        print(result.line(label))
    best = results["B bare Tornado"].requests_per_second
    for label in ("A status", "A cluster detail"):
        per_round = ", ".join(f"{a.requests_per_second / b.requests_per_second:.2f}"
                              for a, b in zip(runs[label], runs["B bare Tornado"], strict=True))
        print(f"{label} / B: {results[label].requests_per_second / best:.2f} (rounds: {per_round}); server CPU per "
              f"request {results[label].cpu_us_per_request / results['B bare Tornado'].cpu_us_per_request:.2f} of B's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
