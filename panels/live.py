"""Push event-bus events into a Panel session without polling and without blocking anyone.

Worker threads publish; this coalesces a burst into one callback on the session's document (Bokeh's
``add_next_tick_callback`` is the thread-safe door into a document). Outside a server session (a
notebook, a test) the callback runs at once in the publishing thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import panel as pn

from services.events import Event, EventBus


class LiveRefresh:
    def __init__(self, bus: EventBus, topic: str, callback: Callable[[list[Event]], None]) -> None:
        self._callback = callback
        self._pending: list[Event] = []
        self._lock = threading.Lock()
        self._scheduled = False
        self._doc: Any = pn.state.curdoc if pn.state.curdoc and pn.state.curdoc.session_context else None
        self._unsubscribe = bus.subscribe(self._on_event, topic=topic)
        if self._doc is not None:
            self._doc.on_session_destroyed(lambda _ctx: self.close())

    def _on_event(self, event: Event) -> None:
        with self._lock:
            self._pending.append(event)
            if self._scheduled:
                return
            self._scheduled = True
        if self._doc is not None:
            self._doc.add_next_tick_callback(self._flush)
        else:
            self._flush()

    def _flush(self) -> None:
        with self._lock:
            events, self._pending = self._pending, []
            self._scheduled = False
        if events:
            self._callback(events)

    def close(self) -> None:
        self._unsubscribe()
