"""Shutdown waits for the verb calls REST handlers run on the loop's executor before the services close: it stops
listening first, drops what is only queued, and waits (bounded) for what is under way."""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from app.server import drain_workers, serve_workers
from tests.support import wait_until


class Listening:
    """Bokeh's server as drain_workers sees it: its loop, and stop() (which asserts it runs once)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.io_loop = type("IOLoop", (), {"asyncio_loop": self.loop})()
        self.stops = 0

    def stop(self, wait: bool = True) -> None:
        assert self.stops == 0, "Already stopped"
        self.stops += 1


def test_a_running_call_is_waited_for_and_a_queued_one_is_dropped() -> None:
    server = Listening()
    workers = serve_workers(server)
    assert server.loop._default_executor is workers  # type: ignore[attr-defined]
    workers.shutdown()
    workers = ThreadPoolExecutor(max_workers=1)
    release, started, finished = threading.Event(), threading.Event(), threading.Event()

    def call() -> None:
        started.set()
        release.wait(60)
        finished.set()

    running = workers.submit(call)
    queued = workers.submit(lambda: None)
    assert started.wait(60)
    drain = threading.Thread(target=drain_workers, args=(server, workers, 120.0))
    drain.start()
    wait_until(lambda: queued.cancelled() or None, 60, "the queued call to be dropped")
    assert drain.is_alive() and not finished.is_set(), "the drain returned while a call was under way"
    release.set()
    drain.join(120)
    assert not drain.is_alive() and finished.is_set() and running.done()
    assert server.stops == 1
    server.loop.close()


def test_a_call_that_outlasts_the_bound_is_named_and_shutdown_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    server: Any = Listening()
    server.stop()  # stopped already: drain_workers must not fail on Bokeh's assertion
    workers = ThreadPoolExecutor(max_workers=1)
    release = threading.Event()
    workers.submit(release.wait, 60)
    with caplog.at_level(logging.WARNING, logger="app.server"):
        drain_workers(server, workers, 0.05)
    assert "verb calls still running" in caplog.text
    release.set()
    workers.shutdown()
    server.loop.close()
