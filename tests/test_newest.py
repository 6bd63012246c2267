"""Two overlapping reads of one pane where the one asked first finishes last: the newer answer stays (the
shared numbering, ``panels.live.Newest``, through the panes' ``panels.scoped`` refresh and redraw), on a loop
and on the no-loop path where reads run on two threads at once."""

from __future__ import annotations

import asyncio
import threading

import param

from panels.live import LiveRefresh, Newest
from panels.scoped import redraw, refresh
from services.events import EventBus


class Gated(param.Parameterized):
    """Implements the Reads protocol: read ``n`` (in the order asked) says it started, then waits for its gate."""

    shown = param.Integer(default=0)

    def __init__(self) -> None:
        super().__init__()
        self.newest = Newest()
        self.started = [threading.Event(), threading.Event()]
        self.gates = [threading.Event(), threading.Event()]
        self._count = 0
        self._lock = threading.Lock()

    def fetch(self) -> int:
        with self._lock:
            n, self._count = self._count, self._count + 1
        self.started[n].set()
        assert self.gates[n].wait(30), f"read {n + 1} was never released"
        return n + 1

    def apply(self, read: int, /) -> None:
        self.shown = read


def test_on_a_loop_an_older_read_that_finishes_last_is_dropped(kernel_loop: asyncio.AbstractEventLoop) -> None:
    part = Gated()
    first = asyncio.run_coroutine_threadsafe(refresh(part), kernel_loop)
    assert part.started[0].wait(30)
    second = asyncio.run_coroutine_threadsafe(refresh(part), kernel_loop)
    assert part.started[1].wait(30)
    part.gates[1].set()
    second.result(30)
    assert part.shown == 2
    part.gates[0].set()
    first.result(30)  # the older read has finished and tried to land
    assert part.shown == 2, "the older answer overwrote the newer one"


def test_without_a_loop_reads_on_two_threads_keep_the_newer_answer() -> None:
    bus = EventBus()
    part = Gated()
    ops = LiveRefresh(bus, "operation", lambda _events: None)
    threads = [threading.Thread(target=redraw, args=(ops, part), name=f"read-{n}") for n in (1, 2)]
    threads[0].start()
    assert part.started[0].wait(30)
    threads[1].start()
    assert part.started[1].wait(30)
    part.gates[1].set()
    threads[1].join(30)
    assert part.shown == 2
    part.gates[0].set()
    threads[0].join(30)
    assert not threads[0].is_alive()
    assert part.shown == 2, "the older answer overwrote the newer one"
    ops.close()


def test_a_read_asked_for_what_is_no_longer_shown_is_dropped() -> None:
    newest = Newest()
    shown: list[str] = []
    number = newest.ask()
    assert not newest.land(number, lambda: shown.append("old choice"), lambda: False)
    assert newest.land(newest.ask(), lambda: shown.append("newer"))
    assert not newest.land(number, lambda: shown.append("older"))
    assert shown == ["newer"]
