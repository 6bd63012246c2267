"""Sign-in throttle, measured against a real server: how long the n-th wrong try of one token id waits,
and whether a revoked token and an unknown one can be told apart by answer or by time.

Part 1 (default settings): wrong tries 1..N of one token id, on the login form and as a bearer REST call
(each path its own token id). Part 2 (a second server with the delay off, so the throttle does not skew
the times): a revoked token and an unknown token of the same shape, R tries each, alternating; the answers
are compared byte for byte and the times by median.

    python bench/signin.py [-n 8] [-r 200]
"""

from __future__ import annotations

import argparse
import re
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx2

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support import LiveServer, start_server  # noqa: E402


def login_form(server: LiveServer, token: str) -> tuple[int, str, float]:
    client = httpx2.Client(base_url=server.url, timeout=120)
    xsrf = re.search(r'name="_xsrf" value="([^"]+)"', client.get("/login").text)
    assert xsrf
    started = time.perf_counter()
    r = client.post("/login", data={"token": token, "_xsrf": xsrf.group(1)})
    elapsed = time.perf_counter() - started
    message = re.search(r'<p class="error" role="alert">([^<]*)</p>', r.text)
    return r.status_code, message.group(1) if message else "", elapsed


def bearer(server: LiveServer, token: str) -> tuple[int, str, float]:
    started = time.perf_counter()
    r = httpx2.get(server.url + "/api/v1/whoami", headers={"Authorization": f"Bearer {token}"}, timeout=120)
    return r.status_code, r.text, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("-n", type=int, default=8, help="wrong tries in a row per token id")
    parser.add_argument("-r", type=int, default=200, help="tries each of the revoked and the unknown token")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(Path(tmp) / "throttled")
        try:
            print(f"wrong tries of one token id (default settings: 0.5 s after the first failure, doubling, "
                  f"at most 30 s); n={args.n}")
            # one path after the other: interleaved, each path's wait would pass while the other one waits
            form_id, rest_id = secrets.token_hex(4), secrets.token_hex(4)
            form = [login_form(server, f"ist_{form_id}_wrong-{n}")[2] for n in range(1, args.n + 1)]
            rest = [bearer(server, f"ist_{rest_id}_wrong-{n}")[2] for n in range(1, args.n + 1)]
            print("time from sending the n-th wrong try to its answer")
            print("try  login form   bearer REST")
            for n, (f, r) in enumerate(zip(form, rest, strict=True), start=1):
                print(f"{n:>3}  {f:>9.3f} s  {r:>9.3f} s")
        finally:
            server.stop()

        server = start_server(Path(tmp) / "unthrottled", env={"INSTANTSTART_SIGNIN_DELAY_BASE": "0"})
        try:
            made = server.post("/api/v1/tokens", {"name": "bench-revoked", "role": "viewer"}).json()
            httpx2.delete(f"{server.url}/api/v1/tokens/{made['id']}", headers=server.headers(), timeout=30)
            tokens = {"revoked": made["token"], "unknown": f"ist_{'f' * 8}_{made['token'].split('_', 2)[2]}"}
            times: dict[str, list[float]] = {k: [] for k in tokens}
            answers: dict[str, set[tuple[int, str]]] = {k: set() for k in tokens}
            forms: dict[str, set[tuple[int, str]]] = {k: set() for k in tokens}
            for _ in range(args.r):
                for label, token in tokens.items():
                    status, body, elapsed = bearer(server, token)
                    answers[label].add((status, body))
                    times[label].append(elapsed)
            for label, token in tokens.items():
                status, message, _ = login_form(server, token)
                forms[label].add((status, message))
            print(f"\nrevoked vs unknown, {args.r} bearer tries each (delay off):")
            print(f"  REST answers identical: {answers['revoked'] == answers['unknown']} "
                  f"({len(answers['revoked'] | answers['unknown'])} distinct answer)")
            print(f"  login form answers identical: {forms['revoked'] == forms['unknown']}")
            for label in tokens:
                ms = sorted(t * 1000 for t in times[label])
                print(f"  {label}: median {statistics.median(ms):.2f} ms, p10 {ms[len(ms) // 10]:.2f} ms, "
                      f"p90 {ms[9 * len(ms) // 10]:.2f} ms")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
