"""Speed and memory of the sandbox Kubernetes API emulator, next to a ``kubectl`` subprocess per call.

The emulator runs as its own process (``python -m sandbox.kube``) so its memory can be read from
``/proc`` and client and server do not share a GIL. Python-side numbers use the official client 37.0.1
over one kept-alive connection; kubectl numbers start one ``kubectl`` process per operation, which is
what the incumbent tool does for every status read. Ratios are kubectl time / client time per operation.

Run: ``.venv/bin/python -m bench.kube.bench_kube [--objects 10000] [--out bench/kube/RESULTS.md]``
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client, config

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = "bench"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def timed(fn: Callable[[], object], n: int) -> float:
    """Seconds per call, over n calls."""
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n


def watch_fanout(port: int, watchers: int, events: int, create: Callable[[int], object]) -> float:
    """Seconds from the first write until every watcher has seen all ``events`` ADDED events."""
    ready = threading.Barrier(watchers + 1)
    done = [0.0] * watchers

    def watch(i: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("GET", f"/k8s/clusters/{CLUSTER}/api/v1/namespaces/fanout/configmaps?watch=true"
                     "&resourceVersion=1000000000&timeoutSeconds=60")
        resp = conn.getresponse()
        ready.wait()
        seen = 0
        while seen < events:
            line = resp.readline()
            if not line:
                break
            if json.loads(line)["type"] == "ADDED":
                seen += 1
        done[i] = time.perf_counter()
        conn.close()

    threads = [threading.Thread(target=watch, args=(i,)) for i in range(watchers)]
    for t in threads:
        t.start()
    ready.wait()
    time.sleep(0.2)
    start = time.perf_counter()
    for i in range(events):
        create(i)
    for t in threads:
        t.join(60)
    return max(done) - start


def kubectl_runner(kubeconfig: Path, cache: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    binary = shutil.which("kubectl")
    if binary is None:
        raise SystemExit("kubectl is not on PATH")

    def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([binary, f"--kubeconfig={kubeconfig}", f"--cache-dir={cache}", *args], input=stdin,
                              capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {proc.stderr}")
        return proc

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--objects", type=int, default=10_000)
    ap.add_argument("--gets", type=int, default=2_000)
    ap.add_argument("--kubectl-calls", type=int, default=20)
    ap.add_argument("--watchers", type=int, default=50)
    ap.add_argument("--events", type=int, default=500)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="kube-bench-"))
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "sandbox.kube", "--port", str(port), "--data-dir",
                               str(work / "data"), "--cluster", CLUSTER], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        assert server.stdout is not None
        server.stdout.readline()  # "cluster bench: ..." once listening
        kubeconfig = work / "data" / "kube" / f"kubeconfig-{CLUSTER}.yaml"
        api = config.new_client_from_config(str(kubeconfig))  # type: ignore[no-untyped-call]
        core: Any = client.CoreV1Api(api)  # dict bodies: the typed signatures want models
        rss_idle = rss_mib(server.pid)
        results: dict[str, float] = {}

        def cm(name: str, ns: str = "default") -> dict[str, object]:
            return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns,
                    "labels": {"app": "bench", "shard": str(hash(name) % 10)}}, "data": {"k": "v" * 64}}

        counter = iter(range(10**9))
        start = time.perf_counter()
        for i in range(args.objects):
            core.create_namespaced_config_map("default", cm(f"cm-{i:05d}"))
        results["create"] = (time.perf_counter() - start) / args.objects
        rss_loaded = rss_mib(server.pid)
        results["get"] = timed(lambda: core.read_namespaced_config_map(f"cm-{next(counter) % args.objects:05d}",
                                                                       "default"), args.gets)
        results["list"] = timed(lambda: core.list_namespaced_config_map("default"), 3)
        results["list_raw"] = timed(lambda: json.loads(core.list_namespaced_config_map(
            "default", _preload_content=False).data), 5)
        results["list_selector"] = timed(lambda: core.list_namespaced_config_map("default",
                                                                                 label_selector="shard in (1,2)"), 5)
        core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "fanout"}})
        fan = watch_fanout(port, args.watchers, args.events,
                           lambda i: core.create_namespaced_config_map("fanout", cm(f"w-{i}", "fanout")))
        results["watch_fanout"] = fan
        rss_after = rss_mib(server.pid)

        kubectl = kubectl_runner(kubeconfig, work / "kubectl-cache")
        kubectl("version")  # warm the discovery cache, as a user's second command would be
        n = args.kubectl_calls
        manifests = [json.dumps(cm(f"kc-{i}")) for i in range(n)]
        it = iter(manifests)
        results["kubectl_create"] = timed(lambda: kubectl("create", "-f", "-", stdin=next(it)), n)
        results["kubectl_get"] = timed(lambda: kubectl("get", "cm", f"cm-{next(counter) % args.objects:05d}",
                                                       "-o", "json"), n)
        results["kubectl_list"] = timed(lambda: kubectl("get", "cm", "-o", "json"), 3)
        results["kubectl_list_table"] = timed(lambda: kubectl("get", "cm"), 3)
        kubectl_watchers = 5
        kubectl_events = 20
        kubectl_bin = shutil.which("kubectl") or "kubectl"
        procs = [subprocess.Popen([kubectl_bin, f"--kubeconfig={kubeconfig}",
                                   f"--cache-dir={work / 'kubectl-cache'}", "get", "cm", "-n", "fanout", "-w",
                                   "--watch-only", "-o", "name"],
                                  stdout=subprocess.PIPE, text=True) for _ in range(kubectl_watchers)]
        time.sleep(2.0)
        start = time.perf_counter()
        for i in range(kubectl_events):
            core.create_namespaced_config_map("fanout", cm(f"kw-{i}", "fanout"))
        for p in procs:
            assert p.stdout is not None
            for _ in range(kubectl_events):
                p.stdout.readline()
        results["kubectl_watch_fanout"] = time.perf_counter() - start
        for p in procs:
            p.terminate()
        api.close()
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(work, ignore_errors=True)

    per_event_client = results["watch_fanout"] / (args.watchers * args.events)
    per_event_kubectl = results["kubectl_watch_fanout"] / (kubectl_watchers * kubectl_events)
    rows = [
        ("create ConfigMap", results["create"], results["kubectl_create"]),
        ("get ConfigMap by name", results["get"], results["kubectl_get"]),
        (f"list {args.objects:,} ConfigMaps, typed models / `-o json`", results["list"], results["kubectl_list"]),
        (f"list {args.objects:,} ConfigMaps, raw JSON / `-o json`", results["list_raw"], results["kubectl_list"]),
        (f"list {args.objects:,} ConfigMaps, raw JSON / table", results["list_raw"], results["kubectl_list_table"]),
        ("watch delivery, per event per watcher", per_event_client, per_event_kubectl),
    ]
    lines = [
        "# Kubernetes API emulator benchmark",
        "",
        f"Reproduce: `.venv/bin/python -m bench.kube.bench_kube --objects {args.objects} --out bench/kube/RESULTS.md`",
        "",
        f"Machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
        f"measured {time.strftime('%Y-%m-%d')}. These machines are shared: quote the ratios, not the times.",
        "",
        "Client: official `kubernetes` 37.0.1 over one kept-alive connection. kubectl: one process per",
        "operation (the discovery cache warm, as for a user's second command). Ratio = kubectl / client.",
        "",
        "| operation | client | kubectl per call | ratio |",
        "|---|---|---|---|",
    ]
    for label, ours, theirs in rows:
        lines.append(f"| {label} | {ours * 1000:.2f} ms | {theirs * 1000:.1f} ms | {theirs / ours:.1f}x |")
    lines += [
        "",
        f"- create rate: {1 / results['create']:,.0f}/s; get rate: {1 / results['get']:,.0f}/s; "
        f"list with a set-based label selector over {args.objects:,} objects: "
        f"{results['list_selector'] * 1000:.0f} ms.",
        f"- watch fan-out: {args.watchers} raw watch streams x {args.events} creates delivered in "
        f"{results['watch_fanout']:.2f} s ({args.watchers * args.events / results['watch_fanout']:,.0f} deliveries/s);"
        f" kubectl: {kubectl_watchers} `kubectl get -w` x {kubectl_events} creates in "
        f"{results['kubectl_watch_fanout']:.2f} s.",
        f"- server RSS: {rss_idle:.0f} MiB idle, {rss_loaded:.0f} MiB with {args.objects:,} ConfigMaps, "
        f"{rss_after:.0f} MiB after the watch test.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
