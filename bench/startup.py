"""Time from process start to a 200 on /healthz: `instantstart serve` next to a bare `panel serve` app.

The bare Panel app is the floor of this stack (Tornado + Bokeh + Panel import and bind); the ratio is what
our services, engine start-up, REST routes and auth add. Runs alternate (A B A B ...).

    python bench/startup.py [-n 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx2

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support import free_port  # noqa: E402

BARE_APP = "import panel as pn\npn.panel('hello').servable()\n"


def time_to_healthz(cmd: list[str], url: str) -> float:
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{cmd} exited with {proc.returncode}")
            try:
                if httpx2.get(url, timeout=1).status_code == 200:
                    return time.perf_counter() - started
            except httpx2.HTTPError:
                time.sleep(0.02)
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=5)
    runs = parser.parse_args().n
    ours: list[float] = []
    bare: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        app = Path(tmp) / "bare.py"
        app.write_text(BARE_APP)
        for i in range(runs):
            port = free_port()
            bare.append(time_to_healthz([sys.executable, "-m", "panel", "serve", str(app), "--port", str(port),
                                         "--liveness"], f"http://127.0.0.1:{port}/liveness"))
            port = free_port()
            ours.append(time_to_healthz([sys.executable, "-m", "app.cli", "serve", "--port", str(port),
                                         "--data-dir", f"{tmp}/data{i}"], f"http://127.0.0.1:{port}/healthz"))
    print(f"A bare panel serve   -> /liveness: median {statistics.median(bare):.2f} s "
          f"(min {min(bare):.2f}, max {max(bare):.2f})")
    print(f"B instantstart serve -> /healthz : median {statistics.median(ours):.2f} s "
          f"(min {min(ours):.2f}, max {max(ours):.2f})")
    print(f"ratio B/A: {statistics.median(ours) / statistics.median(bare):.2f}")


if __name__ == "__main__":
    main()
