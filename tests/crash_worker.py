"""A separate engine process for the crash tests: python -m tests.crash_worker DATA_DIR [submit NAME]."""

from __future__ import annotations

import sys
from pathlib import Path

from services.audit import AuditLog
from services.auth import Principal, Role
from services.clock import Clock
from services.db import Database
from services.events import EventBus
from services.operations import Engine
from tests.kinds import ThingRequest, World, thing_kind
from tests.support import until_terminated


def main() -> None:
    data = Path(sys.argv[1])
    clock = Clock()
    db = Database(data / "state.db")
    engine = Engine(db, EventBus(), AuditLog(db, clock), clock, workers=2, lock_path=data / "engine.lock")
    engine.register(thing_kind(World(data / "world.json"), poll_seconds=0.05, release=data / "release",
                               block_after_act=data / "unblock"))
    engine.start()
    if len(sys.argv) > 3 and sys.argv[2] == "submit":
        op, _ = engine.submit("thing.create", ThingRequest(name=sys.argv[3]), Principal("crash", Role.OPERATOR))
        print(op.id, flush=True)
    until_terminated(engine.stop)


if __name__ == "__main__":
    main()
