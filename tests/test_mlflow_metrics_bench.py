"""``bench/chart_latency.py`` runs at a tiny size, so it cannot rot; figures are printed, not asserted (no
wall-clock assertions): what is asserted is that every point was pushed and the report was written."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.support import ROOT, clean_env

pytestmark = pytest.mark.slow


def test_chart_latency_bench_reports_median_and_p95() -> None:
    out = subprocess.run([sys.executable, "bench/chart_latency.py", "-n", "3", "--interval", "0.2"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, env=clean_env(PYTHONUNBUFFERED="1"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"^log_metric -> pushed point over 3 points \(poll interval 0\.20 s\): median \d+ ms, "
                     r"p95 \d+ ms, max \d+ ms$", out.stdout, re.M), out.stdout
    assert re.search(r"^MLflow calls by the poller: \d+ ", out.stdout, re.M), out.stdout
