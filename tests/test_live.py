"""Where live pane updates are delivered: on the loop the pane was made on (a notebook kernel's), and
nowhere once the pane is gone (no subscription kept alive by the bus)."""

from __future__ import annotations

import asyncio
import gc
import threading

from panels.live import LiveRefresh
from services.events import Event, EventBus
from tests.support import wait_until


class Pane:
    def __init__(self, bus: EventBus) -> None:
        self.seen: list[tuple[str, list[str]]] = []
        self.live = LiveRefresh(bus, "thing", self.on_events)

    def on_events(self, events: list[Event]) -> None:
        self.seen.append((threading.current_thread().name, [e.kind for e in events]))


def test_updates_arrive_on_the_loop_the_pane_was_made_on(kernel_loop: asyncio.AbstractEventLoop) -> None:
    bus = EventBus()

    async def make() -> Pane:
        return Pane(bus)  # made while the kernel runs a cell

    pane = asyncio.run_coroutine_threadsafe(make(), kernel_loop).result(30)
    bus.publish(Event("thing", "changed", {}))
    wait_until(lambda: pane.seen, 30, "the update to reach the pane")
    assert pane.seen[0] == ("kernel-loop", ["changed"]), "delivered on the bus thread, not the kernel's loop"

    refreshed: list[str] = []

    async def refresh() -> None:
        refreshed.append(threading.current_thread().name)

    assert pane.live.spawn(refresh)
    wait_until(lambda: refreshed, 30, "the spawned read to run")
    assert refreshed == ["kernel-loop"]
    pane.live.close()


def test_a_pane_that_is_gone_stops_listening() -> None:
    bus = EventBus()
    before = bus.subscriber_count()
    pane = Pane(bus)
    assert bus.subscriber_count() == before + 1
    del pane
    gc.collect()
    assert bus.subscriber_count() == before, "the bus kept a dropped pane (and its delivery thread) alive"
    bus.publish(Event("thing", "changed", {}))  # nobody left to deliver to
    assert bus.drain()


def test_without_a_loop_updates_arrive_on_the_delivery_thread() -> None:
    bus = EventBus()
    pane = Pane(bus)
    assert not pane.live.spawn(lambda: asyncio.sleep(0))  # nowhere to run a coroutine: the caller reads
    bus.publish(Event("thing", "changed", {}))
    assert bus.drain()
    assert [actions for _, actions in pane.seen] == [["changed"]]
    assert pane.seen[0][0] != threading.current_thread().name
    pane.live.close()
