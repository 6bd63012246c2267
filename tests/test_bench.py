"""The benches of issue 9 run at a tiny size, so they cannot rot: each script seeds its own sandbox cluster,
imports it and prints the lines ``bench/RESULTS.md`` quotes. Figures are not asserted (no wall-clock
assertions); what is asserted is that every side ran and reported."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.support import ROOT, clean_env

pytestmark = pytest.mark.slow


def bench(script: str, *args: str) -> str:
    out = subprocess.run([sys.executable, f"bench/{script}", *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=600, env=clean_env(PYTHONUNBUFFERED="1"))
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


AWS_CLI = os.environ.get("INSTANTSTART_BENCH_AWS") or shutil.which("aws")  # tests/run.sh installs one


@pytest.mark.skipif(shutil.which("kubectl") is None or AWS_CLI is None,
                    reason="the incumbent's side needs kubectl and the aws CLI (tests/run.sh installs it)")
def test_cluster_read_bench() -> None:
    out = bench("cluster_read.py", "--nodes", "3", "-n", "3", "--incumbent-runs", "1", "--aws", str(AWS_CLI))
    assert "cluster of 3 nodes" in out
    assert re.search(r"^A GET /api/v1/clusters/\{cluster\} from the caches: median [\d.]+ ms", out, re.M), out
    assert re.search(r"^B kubectl get nodes -o json \+ aws sagemaker list-cluster-nodes: median \d+ ms", out, re.M)
    assert re.search(r"^ratio B/A: \d+x$", out, re.M), out


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed (tests/run.sh installs it as root)")
def test_throughput_bench() -> None:
    out = bench("throughput.py", "--nodes", "2", "--duration", "1", "--connections", "10")
    for label in ("A status", "A cluster detail", "B bare Tornado"):
        assert re.search(rf"^{label}: [\d,]+ req/s, p50 [\d.]+ ms, p99 [\d.]+ ms", out, re.M), out
    assert "Non-2xx" not in out, "every answer was a 200: the viewer token was accepted throughout"


def test_throughput_bench_says_how_to_install_wrk_when_missing() -> None:
    out = subprocess.run([sys.executable, "bench/throughput.py"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env=clean_env(PATH="/nonexistent"))
    assert out.returncode == 2
    assert "apt-get install -y wrk" in out.stderr


def test_push_latency_bench() -> None:
    out = bench("push_latency.py", "--nodes", "2", "-n", "5")
    assert "5 node label changes" in out
    assert re.search(r"^p50 [\d.]+ ms, p99 [\d.]+ ms", out, re.M), out


def test_agent_pipeline_bench() -> None:
    """The agent bench's machinery on cluster.import of a seeded cluster (it drives cluster.create the same
    way once the server offers clusters_create): both sides ran to the end and were counted."""
    out = bench("agent_pipeline.py", "--pipeline", "import", "--speed", "300")
    assert re.search(r"^pipeline cluster\.import succeeded: \d+ AWS s", out, re.M), out
    ours = re.search(r"^A ours .*: (\d+) calls, (\d+) tokens, (\d+) progress notifications", out, re.M)
    theirs = re.search(r"^B incumbent .*: (\d+) calls, (\d+) tokens", out, re.M)
    assert ours and theirs, out
    assert int(ours.group(3)) >= 1, "the long wait sent progress notifications"
    assert re.search(r'"operations_wait": \d+', out) and re.search(r'"wait_seconds": \d+', out), out
    assert re.search(r"^ratio B/A: calls [\d.]+x, tokens [\d.]+x$", out, re.M), out


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="side B runs kubectl logs -f")
def test_log_stream_bench() -> None:
    out = bench("log_stream.py", "--pods", "2", "--rate", "200", "--seconds", "1", "--stall", "1")
    assert re.search(r"^A instantstart WebSocket .*: ([\d,]+) of \1 lines, [\d,]+ lines/s delivered, [\d.]+ CPU-s per "
                     r"1M lines, peak RSS \d+ MB", out, re.M), out
    assert re.search(r"^B 2 x kubectl logs -f: ([\d,]+) of \1 lines", out, re.M), out
    assert re.search(r"^ratio CPU B/A: [\d.]+x", out, re.M), out
    assert re.search(r"^stall: server RSS grew -?[\d.]+ MB while a client read nothing for 1 s", out, re.M), out
