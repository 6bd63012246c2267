"""Events pane: one cluster's timeline (HyperPod's cluster events, Kubernetes node events and pod warnings, newest
first) with its filters — severity, source, kind, namespace, node, group — paged with Older/Newest (the verb's
``next_cursor``; a filter change starts again at the newest), redrawn when a Kubernetes event arrives on the bus
(topic ``kube``, resource ``events``), never polled. Embeddable: the cluster page shows it under the overview, and a
notebook can show it alone.

The pane holds no rules: it calls the ``list_events`` verb (``services/clusters/events.py``), in a worker
thread when served, so the loop never waits on AWS.
"""

from __future__ import annotations

import html
import threading
from typing import Any

import panel as pn
import param

from panels.live import LiveRefresh, Newest, in_worker
from services.auth import Principal
from services.clusters.events import (
    ClusterEventsQuery,
    ClusterEventsView,
    ClusterTimeline,
    EventKind,
    EventSource,
    Severity,
)
from services.errors import ServiceError
from services.events import Event, EventBus

COLOURS = {Severity.INFO: "#6e7781", Severity.WARNING: "#bf8700", Severity.ERROR: "#cf222e"}
ANY = "any"
LIMIT = 100


def timeline_html(view: ClusterEventsView | None) -> str:
    """The timeline as a table (every value escaped: it comes from AWS and the cluster)."""
    if view is None:
        return "<p>Select a cluster to see its events.</p>"
    esc = html.escape
    parts = [f"<p class='events-error'>{esc(e)}</p>" for e in view.errors]
    if not view.events:
        parts.append("<p class='events-empty'>No events match.</p>")
        return "".join(parts)
    rows = []
    for e in view.events:
        pod = f"{e.namespace}/{e.pod}" if e.pod else None
        where = " / ".join(x for x in (e.group, e.node or e.instance_id, pod) if x) or e.resource
        what = f"<b>{esc(e.reason)}</b>: {esc(e.message)}" if e.reason else esc(e.message)
        count = f" ({e.count} times)" if e.count > 1 else ""
        rows.append(f"<tr data-severity='{e.severity.value}'><td>{esc(e.time)}</td><td>{e.source.value}</td>"
                    f"<td style='color:{COLOURS[e.severity]};font-weight:bold'>{e.severity.value}</td>"
                    f"<td>{esc(e.resource)}</td><td>{esc(where)}</td><td>{what}{count}</td></tr>")
    parts.append("<table class='events-table'><tr><th>time (UTC)</th><th>source</th><th>severity</th>"
                 "<th>resource</th><th>group / node</th><th>event</th></tr>" + "".join(rows) + "</table>")
    if view.truncated:
        parts.append("<p class='events-more'>More events match: narrow the filters, or page on with Older.</p>")
    return "".join(parts)


class EventsState(param.Parameterized):
    cluster = param.String(default="", doc="the cluster whose events are shown")
    severity: param.Selector[str] = param.Selector(default=ANY, objects=[ANY, *[s.value for s in Severity]],
                                                   doc="at least this severity")
    source: param.Selector[str] = param.Selector(default=ANY, objects=[ANY, *[s.value for s in EventSource]],
                                                 doc="only this source")
    kind: param.Selector[str] = param.Selector(default=ANY, objects=[ANY, *[k.value for k in EventKind]],
                                               doc="only Kubernetes events about nodes, or every pod event")
    namespace = param.String(default="", doc="only events of pods in this namespace")
    node = param.String(default="", doc="only this node (name or instance id)")
    group = param.String(default="", doc="only this instance group")
    cursor = param.String(default="", doc="the page shown: empty for the newest events, else a next_cursor")
    view = param.ClassSelector(class_=ClusterEventsView, default=None, allow_None=True)
    message = param.String(default="")

    def __init__(self, timeline: ClusterTimeline, principal: Principal, **params: Any) -> None:
        super().__init__(**params)
        self.service = timeline
        self.principal = principal
        self._newest = Newest()
        self._asking = threading.RLock()  # a bus thread and the caller may ask at once (no loop)

    def query(self) -> ClusterEventsQuery:
        return ClusterEventsQuery(severity=None if self.severity == ANY else Severity(self.severity),
                                  source=None if self.source == ANY else EventSource(self.source),
                                  kind=None if self.kind == ANY else EventKind(self.kind),
                                  namespace=self.namespace.strip() or None, node=self.node.strip() or None,
                                  group=self.group.strip() or None, cursor=self.cursor or None, limit=LIMIT)

    def older(self) -> None:
        """Show the next, older page (when the answer shown has one)."""
        if self.view is not None and self.view.next_cursor:
            self.cursor = self.view.next_cursor

    def fetch(self, cluster: str, query: ClusterEventsQuery) -> tuple[ClusterEventsView | None, str]:
        """Ask the verb (blocking: AWS on a cache miss); assigns nothing, so it may run in a worker thread."""
        if not cluster:
            return None, ""
        try:
            return self.service.list_events(self.principal, cluster, query, wait=2), ""
        except ServiceError as exc:
            return None, f"{exc.code}: {exc.message}"

    def _ask(self) -> tuple[int, str, ClusterEventsQuery] | None:
        with self._asking:  # the query and its number together: the last number asked holds the latest filters
            try:
                query = self.query()
            except ValueError as exc:  # the query model's own validation (a malformed node or group)
                refused = f"invalid filter: {exc}"
                # told, numbered now: an answer to the filters before this one would clear what is said here
                self._newest.tell(lambda: setattr(self, "message", refused))
                return None
            return self._newest.ask(), self.cluster, query

    def _asked_with(self, cluster: str, query: ClusterEventsQuery) -> bool:
        """Whether the cluster and filters shown are still those a read was asked with (if not, its own read
        follows)."""
        try:
            return cluster == self.cluster and query == self.query()
        except ValueError:
            return False

    def _apply(self, number: int, cluster: str, query: ClusterEventsQuery,
               answer: tuple[ClusterEventsView | None, str]) -> None:
        def show() -> None:
            self.view, self.message = answer

        self._newest.land(number, show, lambda: self._asked_with(cluster, query))

    def reload(self) -> None:
        """Read and assign synchronously (a script, a synchronous test)."""
        asked = self._ask()
        if asked is not None:
            self._apply(*asked, self.fetch(asked[1], asked[2]))

    async def refresh(self) -> None:
        asked = self._ask()
        if asked is None:
            return
        self._apply(*asked, await in_worker(self.fetch, asked[1], asked[2]))


class EventsPane(pn.viewable.Viewer):
    def __init__(self, timeline: ClusterTimeline, bus: EventBus, principal: Principal, cluster: str = "",
                 **params: Any) -> None:
        super().__init__(**params)
        self.state = EventsState(timeline, principal, cluster=cluster)
        self.timeline = pn.pane.HTML(timeline_html(None), sizing_mode="stretch_width", css_classes=["cluster-events"])
        self.older_button = pn.widgets.Button(label="Older", disabled=True, css_classes=["events-older"])
        self.newest_button = pn.widgets.Button(label="Newest", disabled=True, css_classes=["events-newest"])
        self.older_button.on_click(lambda _e: self.state.older())
        self.newest_button.on_click(lambda _e: setattr(self.state, "cursor", ""))
        self.state.param.watch(self._shown, "view")
        self.state.param.watch(lambda _e: self._newest(), ["cluster", "severity", "source", "kind", "namespace",
                                                           "node", "group"])
        self.state.param.watch(self._paged, "cursor")
        self._kube = LiveRefresh(bus, "kube", self._on_kube)
        self._refresh()

    def _shown(self, event: Any) -> None:
        self.timeline.object = timeline_html(event.new)
        self.older_button.disabled = not (event.new is not None and event.new.next_cursor)

    def _paged(self, event: Any) -> None:
        self.newest_button.disabled = not event.new
        self._refresh()

    def _newest(self) -> None:
        """A filter changed: its timeline starts at the newest events (clearing the cursor reads them)."""
        if self.state.cursor:
            self.state.cursor = ""
        else:
            self._refresh()

    def _on_kube(self, events: list[Event]) -> None:
        if any(e.data.get("cluster") == self.state.cluster and e.data.get("resource") == "events" for e in events):
            self._refresh()

    def _refresh(self) -> None:
        if not self._kube.spawn(self.state.refresh):
            self.state.reload()

    def __panel__(self) -> pn.viewable.Viewable:
        state = self.state
        return pn.Column(
            pn.pane.Markdown("**Events** (HyperPod, Kubernetes node events and pod warnings, newest first)"),
            pn.Row(pn.widgets.Select.from_param(state.param.severity, name="Severity", width=120),
                   pn.widgets.Select.from_param(state.param.source, name="Source", width=120),
                   pn.widgets.Select.from_param(state.param.kind, name="Kind", width=100),
                   pn.widgets.TextInput.from_param(state.param.namespace, name="Namespace", width=160),
                   pn.widgets.TextInput.from_param(state.param.node, name="Node", width=200,
                                                   placeholder="hyperpod-i-… or i-…"),
                   pn.widgets.TextInput.from_param(state.param.group, name="Instance group", width=160)),
            pn.pane.Markdown(state.param.message, css_classes=["events-message"]),
            self.timeline,
            pn.Row(self.newest_button, self.older_button),
            sizing_mode="stretch_width",
        )
