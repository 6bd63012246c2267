"""The state a pane keeps for one noun's objects in the cluster the user picked (downloads, inference
deployments): the registered clusters, the chosen one, its objects as the noun's list verb answers them, and
the message to show. Reading assigns nothing (it may run in a worker thread); ``apply`` assigns on the pane's
loop. A subclass names the parameter its objects go to (``items_param``) and how they are listed."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ClassVar, Protocol

import panel as pn
import param

from panels.live import LiveRefresh, Newest, in_worker
from services.auth import Principal
from services.clusters import Clusters
from services.errors import ServiceError

Read = tuple[list[str], str, list[Any], str]


class Reads(Protocol):
    """A pane's part that reads in ``fetch`` (blocking; assigns nothing, so it may run in a worker thread) and
    assigns what it read in ``apply`` (on the pane's loop), its reads numbered by ``newest``."""

    newest: Newest

    def fetch(self) -> Any: ...

    def apply(self, read: Any, /) -> None: ...


async def refresh(part: Reads) -> None:
    """Read in a worker thread, assign on the loop (unless a newer read landed first)."""
    await part.newest.read_in_worker(part.fetch, part.apply)


def redraw(ops: LiveRefresh, part: Reads) -> None:
    """Read again where the pane lives (a worker thread, then its loop), or at once where it has no loop."""
    if not ops.spawn(functools.partial(refresh, part)):
        part.newest.read(part.fetch, part.apply)


class ClusterScoped(param.Parameterized):
    items_param: ClassVar[str]

    cluster = param.String(default="", doc="the cluster whose objects are shown")
    clusters = param.List(default=[], item_type=str)
    message = param.String(default="")
    busy = param.Boolean(default=False)

    def __init__(self, clusters: Clusters, principal: Principal, current_principal: Callable[[], Principal] | None,
                 lister: Callable[[Principal, str], list[Any]], **params: Any) -> None:
        super().__init__(**params)
        self.clusters_service = clusters
        self.principal = principal
        self._current_principal = current_principal or (lambda: principal)
        self._lister = lister
        self.newest = Newest()

    def current(self) -> Principal:
        """Who acts now (a dashboard session's role may have changed since the pane was made)."""
        return self._current_principal()

    def fetch(self) -> Read:
        """Ask the verbs; assigns nothing, so it may run in a worker thread."""
        names = [c.name for c in self.clusters_service.list_clusters(self.principal, wait=0)]
        cluster = self.cluster if self.cluster in names else (names[0] if names else "")
        if not cluster:
            return names, "", [], ""
        try:
            return names, cluster, self._lister(self.principal, cluster), ""
        except ServiceError as exc:
            return names, cluster, [], f"{exc.code}: {exc.message}"

    def apply(self, read: Read) -> None:
        self.clusters, self.cluster, items, error = read
        setattr(self, self.items_param, items)
        if error:
            self.message = error

    def reload(self) -> None:
        self.newest.read(self.fetch, self.apply)

    async def refresh(self) -> None:
        await refresh(self)


class ScopedPane:
    """The handlers a pane over a :class:`ClusterScoped` state shares (the downloads pane, the inference pane, its
    managed section and its model-pool board): the cluster picker, a refresh that reads in a worker thread when
    the pane has a loop, a verb called in a worker thread as the current principal on the chosen cluster, preview,
    and a submit that sends the token widget's value once and clears it first."""

    state: Any  # the pane's ClusterScoped subclass, with the verbs' wrappers the handlers below call
    token: pn.widgets.PasswordInput
    picker: pn.widgets.Select
    _ops: LiveRefresh

    def _on_clusters(self, _event: param.parameterized.Event) -> None:
        self.picker.options = list(self.state.clusters)
        self.picker.value = self.state.cluster or None

    def _refresh(self) -> None:
        redraw(self._ops, self.state)

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await in_worker(fn, self.state.current(), self.state.cluster, *args)

    async def _preview(self, _event: Any) -> None:
        self.state.busy = True
        try:
            self.state.message, self.state.preview = await self._run(self.state.do_preview)
        finally:
            self.state.busy = False

    async def _submit(self, fn: Callable[..., str]) -> None:
        token, self.token.value = self.token.value or "", ""
        self.state.busy = True
        try:
            self.state.message = await self._run(fn, token)
        finally:
            self.state.busy = False
        await self.state.refresh()
