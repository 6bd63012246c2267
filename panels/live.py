"""Push event-bus events into a pane without polling and without blocking anyone.

Worker threads publish; this coalesces a burst into one callback, delivered where the pane lives:

* in a served Panel session, on the session's document (Bokeh's ``add_next_tick_callback`` is the
  thread-safe door into a document), and the subscription ends with the session;
* in a notebook, on the kernel's event loop — the loop that was running when the pane was made — through
  ``call_soon_threadsafe``, so widget updates never race the kernel's own thread;
* elsewhere (a script, a synchronous test) at once on the bus subscription's delivery thread
  (``services/events.py``; tests ``bus.drain()`` before asserting).

Two reads of one pane may overlap (an event's and the user's own), and the older may finish last: a pane numbers
its reads with :class:`Newest`, which assigns an answer only when no newer one has been assigned.

The callback may be a coroutine function in the first two cases (it may hand slow reads to an executor).
A bound method is held weakly: once its pane is garbage (a notebook cell run again, a closed output),
the subscription ends by itself instead of keeping the pane and a delivery thread alive for good.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import panel as pn

from services.events import Event, EventBus

Callback = Callable[[list[Event]], Awaitable[None] | None]
T = TypeVar("T")


async def in_worker(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a worker thread (the loop's default executor): a pane's event loop never waits on a verb."""
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


class Newest:
    """Numbers a pane's reads when they are asked and assigns an answer only when no newer answer has been
    assigned, so an older read that finishes last never overwrites what a newer one showed. Thread-safe: with no
    loop, reads run at once on the bus's delivery thread and on the caller's (the check and the assignment are
    one step under a lock; on a loop everything lands on the loop's thread)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # re-entrant: an assignment's watchers may ask again on the same thread
        self._asked = 0
        self._applied = 0

    def ask(self) -> int:
        """The number of a read asked now (take it before reading)."""
        with self._lock:
            self._asked += 1
            return self._asked

    def land(self, number: int, assign: Callable[[], None], still: Callable[[], bool] = lambda: True) -> bool:
        """Call ``assign`` for read ``number`` unless a newer read has already landed or ``still()`` says what
        the read was asked for is no longer shown (the choice changed meanwhile); True when it was assigned."""
        with self._lock:
            if number <= self._applied or not still():
                return False
            self._applied = number
            assign()
            return True

    def tell(self, assign: Callable[[], None]) -> None:
        """Assign the answer to the user's own action (a change, not a read): numbered when it is given, after
        the action, so it lands over every read asked before it (an event the action itself published)."""
        self.land(self.ask(), assign)

    def read(self, fetch: Callable[[], T], assign: Callable[[T], None]) -> None:
        """Read and assign here (no loop to read on: a script, a synchronous test, the bus's thread)."""
        number = self.ask()
        answer = fetch()
        self.land(number, lambda: assign(answer))

    async def read_in_worker(self, fetch: Callable[[], T], assign: Callable[[T], None],
                             still: Callable[[], bool] = lambda: True) -> None:
        """Read in a worker thread, assign here on the pane's loop."""
        number = self.ask()
        answer = await in_worker(fetch)
        self.land(number, lambda: assign(answer), still)


class LiveRefresh:
    def __init__(self, bus: EventBus, topic: str, callback: Callback) -> None:
        self._callback: Callable[[], Callback | None]
        if inspect.ismethod(callback):
            self._callback = weakref.WeakMethod(callback)
        else:
            self._callback = lambda: callback
        self._pending: list[Event] = []
        self._lock = threading.Lock()
        self._scheduled = False
        self._closed = False
        self._doc: Any = pn.state.curdoc if pn.state.curdoc and pn.state.curdoc.session_context else None
        self._loop: asyncio.AbstractEventLoop | None = None
        if self._doc is None:
            try:
                self._loop = asyncio.get_running_loop()  # a notebook kernel runs cells on its loop
            except RuntimeError:
                self._loop = None
        self._unsubscribe = bus.subscribe(self._on_event, topic=topic)
        if self._doc is not None:
            self._doc.on_session_destroyed(lambda _ctx: self.close())
        if inspect.ismethod(callback):
            weakref.finalize(callback.__self__, self.close)

    @property
    def in_session(self) -> bool:
        """True inside a served Panel session (updates hop onto its document's loop)."""
        return self._doc is not None

    @property
    def closed(self) -> bool:
        return self._closed

    def spawn(self, coroutine: Callable[[], Coroutine[Any, Any, None]]) -> bool:
        """Run ``coroutine()`` where this pane lives (session or notebook loop); False when there is no loop
        to run it on, and the caller reads synchronously instead."""
        if self._doc is not None:
            pn.state.execute(coroutine)
            return True
        if self._loop is not None and not self._loop.is_closed():
            loop = self._loop
            loop.call_soon_threadsafe(lambda: loop.create_task(coroutine()))
            return True
        return False

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
            return
        if self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._flush_on_loop)
                return
            except RuntimeError:  # the loop the pane was made on has ended: deliver here from now on
                self._loop = None
        if inspect.isawaitable(self._flush()):
            raise TypeError("an async LiveRefresh callback needs a served session or a running loop")

    def _take(self) -> list[Event]:
        with self._lock:
            events, self._pending = self._pending, []
            self._scheduled = False
        return events

    def _flush(self) -> Awaitable[None] | None:
        events = self._take()
        callback = self._callback()
        if callback is None:  # its pane is gone
            self.close()
            return None
        return callback(events) if events else None

    def _flush_on_loop(self) -> None:
        result = self._flush()
        if inspect.isawaitable(result) and self._loop is not None:
            self._loop.create_task(_awaited(result))

    async def _flush_async(self) -> None:
        result = self._flush()
        if inspect.isawaitable(result):
            await result

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._unsubscribe()


async def _awaited(result: Awaitable[None]) -> None:
    await result
