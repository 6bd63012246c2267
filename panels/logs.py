"""Job logs pane: a job's live logs in a terminal (``pn.widgets.Terminal``), opening on its last 1,000 lines,
with older history paged in on demand, a search (grep) over the whole log and a gzipped download of it.

Param-driven (``cluster``, ``job``, ``namespace``, ``pod``), so it embeds in a notebook as it renders in the
dashboard. Lines come from the logs noun's live view (``services/logs``): the pane takes what is waiting at
most every ``FLUSH_MS`` and writes it to the terminal in one write, never inside ``pn.io.hold()``. Memory
stays bounded on both ends: the view's buffer drops (and counts) what a stalled pane does not take, the
browser keeps ``SCROLLBACK`` lines, and the server-side copy the terminal renders from on a reload is cut to
its last ``MAX_OUTPUT_CHARS``. Reads of Kubernetes or S3 run in worker threads, never on the loop.
"""

from __future__ import annotations

import asyncio
import gzip
import html
import io
import re
from collections.abc import Callable
from typing import Any

import panel as pn
import param

from panels.live import in_worker
from services.auth import Principal
from services.errors import ServiceError
from services.logs import JobLogs, LogView
from services.logs.chunks import Chunk
from services.logs.cursor import Line
from services.logs.models import DEFAULT_NAMESPACE, LogSelect, LogStreamQuery, LogTextQuery
from services.logs.views import order_key

OPEN_LINES = 1_000
PAGE_LINES = 1_000
FLUSH_MS = 100
BATCH_LINES = 5_000
SCROLLBACK = 20_000
MAX_OUTPUT_CHARS = 2_000_000


_STAMPED = re.compile(r"^\S{11}(\S{1,12})\S* (.*)$", re.MULTILINE)


def terminal_text(chunk: Chunk) -> str:
    """A chunk's lines for xterm: time, pod, text (CRLF ends a terminal line); one C pass, no per-line Python."""
    pod = chunk.pod.replace("\\", "\\\\")
    return _STAMPED.sub(f"\x1b[2m\\1\x1b[0m \x1b[36m{pod}\x1b[0m \\2\r", chunk.data.decode("utf-8", "replace"))


class LogsState(param.Parameterized):
    cluster = param.String(default="", doc="the cluster the job runs on")
    job = param.String(default="", doc="the training job")
    namespace = param.String(default=DEFAULT_NAMESPACE, doc="the job's namespace")
    pod = param.String(default="", doc="only this pod (empty: every pod of the job)")
    grep = param.String(default="", doc="search the job's whole log (a case-insensitive regular expression)")
    dropped = param.Integer(default=0, doc="lines the pane did not take in time (its buffer is bounded)")
    history = param.String(default="", doc="older lines paged in, or search results")
    message = param.String(default="")

    def __init__(self, logs: JobLogs, principal: Principal, **params: Any) -> None:
        super().__init__(**params)
        self.logs = logs
        self.principal = principal

    def select(self) -> LogSelect:
        return LogSelect(namespace=self.namespace, pod=self.pod or None)

    def open_view(self) -> LogView:
        return self.logs.open_stream(self.principal, self.cluster, self.job,
                                     LogStreamQuery(namespace=self.namespace, pod=self.pod or None, tail=OPEN_LINES))

    def older(self, before: tuple[int, float, str, int] | None, shown: int) -> list[Line]:
        """The page of lines just before ``before`` (the oldest line on screen or in the history)."""
        window = self.logs.read_lines(self.principal, self.cluster, self.job, self.select(),
                                      tail=shown + PAGE_LINES)
        earlier = [line for line in window if before is None or order_key(line) < before]
        return earlier[-PAGE_LINES:]

    def search(self) -> str:
        return self.logs.read_text(self.principal, self.cluster, self.job,
                                   LogTextQuery(namespace=self.namespace, pod=self.pod or None,
                                                grep=self.grep or None, tail=2_000)).text

    def full_log(self) -> bytes:
        lines = self.logs.read_lines(self.principal, self.cluster, self.job, self.select())
        return gzip.compress("".join(f"{line.ts} {line.pod}/{line.container} {line.text}\n"
                                     for line in lines).encode())


class LogsPane(pn.viewable.Viewer):
    def __init__(self, logs: JobLogs, principal: Principal, **params: Any) -> None:
        super().__init__()
        self.state = LogsState(logs, principal, **params)
        self.terminal = pn.widgets.Terminal(options={"scrollback": SCROLLBACK, "convertEol": False},
                                            height=480, sizing_mode="stretch_width")
        self.search_box = pn.widgets.TextInput.from_param(self.state.param.grep, label="Search",
                                                          placeholder="regular expression, e.g. error|nccl")
        self.search_button = pn.widgets.Button(label="Search", color="primary")
        self.older_button = pn.widgets.Button(label=f"Older {PAGE_LINES} lines")
        self.prepare_button = pn.widgets.Button(label="Prepare download (.log.gz)")
        self.download = pn.widgets.FileDownload(visible=False, filename="job.log.gz", label="Download")
        self.history = pn.pane.HTML("", sizing_mode="stretch_width", styles={"max-height": "320px",
                                                                              "overflow": "auto"})
        self.status = pn.pane.Markdown("")
        self._view: LogView | None = None
        self._oldest: tuple[int, float, str, int] | None = None
        self._shown = 0
        self._paged = 0
        self._callback: Any = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.search_button.on_click(lambda _e: self._spawn(self.run_search))
        self.older_button.on_click(lambda _e: self._spawn(self.page_older))
        self.prepare_button.on_click(lambda _e: self._spawn(self.prepare_download))
        self.state.param.watch(lambda _e: self._spawn(self.restart), ["cluster", "job", "namespace", "pod"])
        self.state.param.watch(self._on_status, ["dropped", "message"])
        self.state.param.watch(self._on_history, "history")
        self._layout = pn.Column(
            self.status, pn.Row(self.search_box, self.search_button, self.older_button, self.prepare_button,
                                self.download), self.history, self.terminal, sizing_mode="stretch_width")
        if pn.state.curdoc is not None and pn.state.curdoc.session_context is not None:
            pn.state.onload(lambda: self._spawn(self.restart))

    def __panel__(self) -> pn.Column:
        return self._layout

    # ----- the live part -----------------------------------------------------------------------------------

    async def restart(self) -> None:
        """(Re)open the stream for the current cluster/job/pod: the terminal starts on the last lines."""
        self.stop()
        self.terminal.clear()
        self.terminal.output = ""
        self._oldest, self._shown, self._paged = None, 0, 0
        self.state.history, self.state.dropped = "", 0
        if not (self.state.cluster and self.state.job):
            self.state.message = "Choose a cluster and a job."
            return
        try:
            self._view = await in_worker(self.state.open_view)
        except ServiceError as exc:
            self.state.message = exc.message
            return
        self.state.message = ""
        self.download.filename = f"{self.state.job}.log.gz"
        if pn.state.curdoc is not None:  # served or in a notebook; elsewhere the caller pumps
            self._callback = pn.state.add_periodic_callback(self._tick, period=FLUSH_MS)

    def pump(self) -> int:
        """Write what is waiting in one terminal write; the number of lines written (memory only)."""
        view = self._view
        if view is None:
            return 0
        batch = view.take(BATCH_LINES)
        count = batch.count
        if count:
            if self._oldest is None:
                self._oldest = order_key(batch.chunks[0].lines()[0])
            self.terminal.write("".join(terminal_text(chunk) for chunk in batch.chunks))
            self._shown += count
            if len(self.terminal.output) > MAX_OUTPUT_CHARS:  # the copy a reload renders from (not synced)
                cut = self.terminal.output[-MAX_OUTPUT_CHARS // 2:]
                self.terminal.output = cut[cut.find("\n") + 1:]
        if batch.dropped != self.state.dropped:
            self.state.dropped = batch.dropped
        return count

    def _tick(self) -> None:
        self.pump()

    def stop(self) -> None:
        if self._callback is not None:
            self._callback.stop()
            self._callback = None
        view, self._view = self._view, None
        if view is not None:
            view.close()

    # ----- on demand ---------------------------------------------------------------------------------------

    async def page_older(self) -> None:
        before = self._oldest
        try:
            page = await in_worker(self.state.older, before, self._shown + self._paged)
        except ServiceError as exc:
            self.state.message = exc.message
            return
        if not page:
            self.state.message = "No older lines."
            return
        self._oldest = order_key(page[0])
        self._paged += len(page)
        older = "".join(f"{line.ts[11:23]} {line.pod} {line.text}\n" for line in page)
        self.state.history = older + self.state.history

    async def run_search(self) -> None:
        try:
            self.state.history = await in_worker(self.state.search)
        except ServiceError as exc:
            self.state.message = exc.message

    async def prepare_download(self) -> None:
        try:
            data = await in_worker(self.state.full_log)
        except ServiceError as exc:
            self.state.message = exc.message
            return
        self.download.file = io.BytesIO(data)
        self.download.visible = True

    # ----- view ---------------------------------------------------------------------------------------------

    def _on_status(self, _event: Any) -> None:
        parts = [self.state.message] if self.state.message else []
        if self.state.dropped:
            parts.append(f"**{self.state.dropped} lines dropped** (the pane fell behind; search or download "
                         "for the full log)")
        self.status.object = " · ".join(parts)

    def _on_history(self, _event: Any) -> None:
        text = self.state.history
        self.history.object = f"<pre class='log-history'>{html.escape(text)}</pre>" if text else ""

    def _spawn(self, coroutine: Callable[[], Any]) -> None:
        if pn.state.curdoc is not None and pn.state.curdoc.session_context is not None:
            pn.state.execute(coroutine)  # served: on the session's loop, holding its document
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a script or a test: run it here
            asyncio.run(coroutine())
            return
        task = loop.create_task(coroutine())  # a notebook's kernel loop: keep the task until it ends
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
