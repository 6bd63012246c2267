"""Push event-bus events into a Panel session without polling and without blocking anyone.

Worker threads publish; this coalesces a burst into one callback on the session's document (Bokeh's
``add_next_tick_callback`` is the thread-safe door into a document). The callback may be a coroutine
function: it then runs on the session's loop and can hand slow reads to an executor. Outside a server
session (a notebook, a test) the callback runs at once on the bus subscription's own delivery thread
(``services/events.py``; tests ``bus.drain()`` before asserting), and a coroutine is not accepted there
(pass a plain function for that case).
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import panel as pn

from services.events import Event, EventBus


class LiveRefresh:
    def __init__(self, bus: EventBus, topic: str,
                 callback: Callable[[list[Event]], Awaitable[None] | None]) -> None:
        self._callback = callback
        self._pending: list[Event] = []
        self._lock = threading.Lock()
        self._scheduled = False
        self._closed = False
        self._doc: Any = pn.state.curdoc if pn.state.curdoc and pn.state.curdoc.session_context else None
        self._unsubscribe = bus.subscribe(self._on_event, topic=topic)
        if self._doc is not None:
            self._doc.on_session_destroyed(lambda _ctx: self.close())

    @property
    def in_session(self) -> bool:
        """True inside a served Panel session (updates hop onto its document's loop)."""
        return self._doc is not None

    def _on_event(self, event: Event) -> None:
        with self._lock:
            if self._closed:
                return
            self._pending.append(event)
            if self._scheduled:
                return
            self._scheduled = True
        if self._doc is not None:
            self._doc.add_next_tick_callback(self._flush_async)
        else:
            result = self._flush()
            if inspect.isawaitable(result):
                raise TypeError("an async LiveRefresh callback needs a served session")

    def _take(self) -> list[Event]:
        with self._lock:
            events, self._pending = self._pending, []
            self._scheduled = False
        return events

    def _flush(self) -> Awaitable[None] | None:
        events = self._take()
        return self._callback(events) if events else None

    async def _flush_async(self) -> None:
        result = self._flush()
        if inspect.isawaitable(result):
            await result

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._unsubscribe()
