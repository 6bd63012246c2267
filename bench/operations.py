"""Operation bookkeeping: our SQLite (WAL) engine next to the obvious alternative, one JSON state file.

The incumbent keeps its state in JSON files that are read, changed and rewritten whole on every update.
Both sides here record N operations and drive each through the same 6 state changes (pending, running,
acting, waiting, done, succeeded), then read one operation's status R times. The JSON side does no
locking at all, so it is the *fast* version of that approach (a correct one would add a file lock).

    python bench/operations.py [-n 1000] [-r 2000]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.audit import AuditLog  # noqa: E402
from services.auth import Principal, Role  # noqa: E402
from services.clock import Clock  # noqa: E402
from services.db import Database  # noqa: E402
from services.events import EventBus  # noqa: E402
from services.models import RequestModel  # noqa: E402
from services.operations import Engine, Observed, OperationKind, Stage, StageContext  # noqa: E402

WHO = Principal("bench", Role.OPERATOR)


class Req(RequestModel):
    name: str


class Once(Stage):
    name = "once"

    def observe(self, ctx: StageContext) -> Observed:
        return Observed.DONE if ctx.data.get("did") else Observed.ABSENT

    def act(self, ctx: StageContext) -> None:
        ctx.data["did"] = True


def ours(tmp: Path, n: int, reads: int) -> tuple[float, float, int]:
    db = Database(tmp / "state.db")
    clock = Clock()
    engine = Engine(db, EventBus(), AuditLog(db, clock), clock)
    engine.register(OperationKind("bench.op", Req, (Once(),), target=lambda r: r.name))
    started = time.perf_counter()
    ids = []
    for i in range(n):
        view, _ = engine.submit("bench.op", Req(name=f"op{i}"), WHO)
        engine.run_until_idle(view.id)
        ids.append(view.id)
    write = time.perf_counter() - started
    started = time.perf_counter()
    for i in range(reads):
        assert engine.get(ids[i % n]).status.value == "succeeded"
    read = time.perf_counter() - started
    return write, read, (tmp / "state.db").stat().st_size


def json_file(tmp: Path, n: int, reads: int) -> tuple[float, float, int]:
    path = tmp / "operations.json"
    path.write_text("{}")

    def change(op_id: str, **fields: object) -> None:
        state = json.loads(path.read_text())
        state.setdefault(op_id, {}).update(fields)
        path.write_text(json.dumps(state))

    started = time.perf_counter()
    for i in range(n):
        op_id = f"op{i}"
        change(op_id, kind="bench.op", status="pending", stages=[{"name": "once", "phase": "observe"}])
        for status in ("running", "acting", "waiting", "done", "succeeded"):
            change(op_id, status=status, updated=time.time())
    write = time.perf_counter() - started
    started = time.perf_counter()
    for i in range(reads):
        assert json.loads(path.read_text())[f"op{i % n}"]["status"] == "succeeded"
    read = time.perf_counter() - started
    return write, read, path.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=1000)
    parser.add_argument("-r", type=int, default=2000)
    a = parser.parse_args()
    with tempfile.TemporaryDirectory() as t1, tempfile.TemporaryDirectory() as t2:
        tracemalloc.start()
        w_ours, r_ours, size_ours = ours(Path(t1), a.n, a.r)
        peak_ours = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        w_json, r_json, size_json = json_file(Path(t2), a.n, a.r)
        peak_json = tracemalloc.get_traced_memory()[1]
    print(f"{a.n} operations, each through its state changes; then {a.r} status reads")
    print(f"A sqlite engine : {a.n / w_ours:8.0f} ops/s, {a.r / r_ours:8.0f} reads/s, peak {peak_ours / 1e6:.1f} MB, "
          f"file {size_ours / 1e6:.2f} MB (with stages, conditions, audit)")
    print(f"B json file     : {a.n / w_json:8.0f} ops/s, {a.r / r_json:8.0f} reads/s, peak {peak_json / 1e6:.1f} MB, "
          f"file {size_json / 1e6:.2f} MB")
    print(f"ratio A/B: ops {w_json / w_ours:.2f}x, reads {r_json / r_ours:.2f}x")


if __name__ == "__main__":
    main()
