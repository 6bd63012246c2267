"""The model-pool board of the inference pane: one row per pool pod (pool, pod, node, Ready, restarts, the service
holding it), an Assign button that gives the selected pods to the named service, a Release button that gives them
back, Scale for the selected pod's pool, a test of the service, and (given the router noun) a router for the selected
pod's service (``panels/inference_pool_router.py``). It follows the inference pane's cluster and
is redrawn from ``inference.pool.*`` operation events, no polling; a failed assign's reason is shown (its
operation event).

The board holds no rules: it calls the pool verbs (``services/inference/pool.py``) in a worker thread, so the
event loop never waits on Kubernetes; the verbs check the role again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd
import panel as pn
import param
from pydantic import ValidationError

from panels.inference_pool_router import PoolRouterForm
from panels.live import LiveRefresh
from panels.refusals import refused
from panels.scoped import ClusterScoped, ScopedPane
from panels.tables import ReadOnlyTable
from services.auth import Principal, Role
from services.clusters import Clusters
from services.errors import ServiceError
from services.events import Event, EventBus
from services.inference.models import EndpointTest
from services.inference.pool import ASSIGN_KIND, CREATE_KIND, DELETE_KIND, RELEASE_KIND, SCALE_KIND, Pools
from services.inference.pool_models import PoolAssign, PoolRelease, PoolScale, PoolView
from services.inference.router import Routers

COLUMNS = ["pool", "pod", "node", "ready", "restarts", "service"]
KINDS = {CREATE_KIND, SCALE_KIND, ASSIGN_KIND, RELEASE_KIND, DELETE_KIND}


def pods_frame(pools: list[PoolView]) -> pd.DataFrame:
    rows = [{"pool": pool.name, "pod": pod.name, "node": pod.node or "", "ready": "yes" if pod.ready else "no",
             "restarts": pod.restarts, "service": pod.assigned_to or "(unassigned)"}
            for pool in pools for pod in pool.pods]
    return pd.DataFrame(rows, columns=COLUMNS)


class NoSelection(Exception):
    """The board's buttons act on pods of one pool: none, or several pools, are selected."""


class PoolState(ClusterScoped):
    items_param = "pools"

    pools = param.List(default=[], item_type=PoolView)
    selected = param.List(default=[], item_type=tuple, doc="(pool, pod) of the rows chosen in the table")
    service = param.String(default="", doc="the model service the Assign and Release buttons act for")
    replicas = param.Integer(default=1, bounds=(0, 64), doc="Scale: the pool's new pod count")
    answer = param.String(default="")

    def __init__(self, pools: Pools, clusters: Clusters, principal: Principal,
                 current_principal: Callable[[], Principal] | None = None, **params: Any) -> None:
        super().__init__(clusters, principal, current_principal,
                         lambda who, cluster: list(pools.list_pools(who, cluster).pools), **params)
        self.verbs = pools

    def _pool(self) -> tuple[str, list[str]]:
        pools = {pool for pool, _ in self.selected}
        if len(pools) != 1:
            raise NoSelection("select pods of one pool in the board first")
        return pools.pop(), [pod for _, pod in self.selected]

    def act(self, principal: Principal, cluster: str, what: str) -> str:
        """``assign``, ``release`` or ``scale`` for the selection (blocking: the verbs read the caches)."""
        try:
            pool, pods = self._pool()
            if what == "assign":
                view, _ = self.verbs.assign(principal, cluster, pool, PoolAssign(service=self.service, pods=pods))
            elif what == "release":
                view, _ = self.verbs.release(principal, cluster, pool, PoolRelease(service=self.service, pods=pods))
            else:
                view, _ = self.verbs.scale_pool(principal, cluster, pool, PoolScale(replicas=self.replicas))
        except (ValidationError, ServiceError) as exc:
            return refused(exc)
        except NoSelection as exc:
            return str(exc)
        return f"{what} {pool}: {', '.join(pods) if what != 'scale' else self.replicas} ({view.id})"

    def test(self, principal: Principal, cluster: str) -> tuple[str, str]:
        try:
            pool, _ = self._pool()
            result = self.verbs.test_service(principal, cluster, pool, self.service, EndpointTest(max_tokens=16))
        except (ValidationError, ServiceError) as exc:
            return refused(exc), ""
        except NoSelection as exc:
            return str(exc), ""
        pod = result.headers.get("x-sandbox-pod")
        return f"HTTP {result.status} in {result.elapsed_ms} ms" + (f" from {pod}" if pod else ""), result.text or ""


class PoolBoard(ScopedPane, pn.viewable.Viewer):
    """The model-pool board; ``follow``: the inference pane's state, whose cluster the board shows; ``routers``:
    the router noun, for the board's router form."""

    def __init__(self, pools: Pools, clusters: Clusters, bus: EventBus, principal: Principal,
                 current_principal: Callable[[], Principal] | None = None, follow: param.Parameterized | None = None,
                 routers: Routers | None = None, **params: Any) -> None:
        super().__init__(**params)
        self.state = PoolState(pools, clusters, principal, current_principal)
        self.router_form = PoolRouterForm(routers, self.state, principal) if routers is not None else None
        s = self.state.param
        operator = principal.allows(Role.OPERATOR)
        self.service = pn.widgets.TextInput.from_param(s.service, name="Service", placeholder="chat")
        self.replicas = pn.widgets.IntInput.from_param(s.replicas, name="Pool pods", width=120)
        self.assign_button = pn.widgets.Button(label="Assign selected", color="primary", disabled=not operator,
                                               css_classes=["pool-assign"])
        self.release_button = pn.widgets.Button(label="Release selected", disabled=not operator,
                                                css_classes=["pool-release"])
        self.scale_button = pn.widgets.Button(label="Scale pool", disabled=not operator, css_classes=["pool-scale"])
        self.test_button = pn.widgets.Button(label="Test service", disabled=not operator, css_classes=["pool-test"])
        buttons = (self.assign_button, self.release_button, self.scale_button, self.test_button)
        if not operator:
            for button in buttons:
                button.description = "needs the operator role"
        for button, handler in zip(buttons, (self._assign, self._release, self._scale, self._test), strict=True):
            button.on_click(handler)
        self.table = ReadOnlyTable(pods_frame([]), selectable=True, sizing_mode="stretch_width",
                                   css_classes=["pool-table"], empty="No model pools yet (inference_pool_create).")
        self.table.param.watch(self._on_selection, "selection")
        s.watch(lambda e: setattr(self.table, "value", pods_frame(e.new)), "pools")
        if follow is not None:
            follow.param.watch(self._on_cluster, "cluster")
            self.state.cluster = str(getattr(follow, "cluster", ""))
        self._ops = LiveRefresh(bus, "operation", self._on_operation)
        self._refresh()

    def _on_cluster(self, event: param.parameterized.Event) -> None:
        if event.new != self.state.cluster:
            self.state.cluster = event.new
            self._refresh()

    def _on_selection(self, event: param.parameterized.Event) -> None:
        rows = pods_frame(self.state.pools)
        self.state.selected = [(rows.iloc[i]["pool"], rows.iloc[i]["pod"]) for i in event.new or [] if i < len(rows)]

    def _on_operation(self, events: list[Event]) -> None:
        failed = [e.data for e in events if e.data.get("kind") == ASSIGN_KIND and e.data.get("status") == "failed"
                  and e.data.get("cluster") == self.state.cluster]
        if failed:  # e.g. a pod another writer took meanwhile: the assign gave back what it had claimed
            self.state.message = f"assign failed ({failed[-1].get('id')}): " \
                                 f"{(failed[-1].get('error') or {}).get('message', '')}"
        if any(e.data.get("kind") in KINDS for e in events):
            self._refresh()

    async def _act(self, what: str) -> None:
        self.state.message = await self._run(self.state.act, what)
        await self.state.refresh()

    async def _assign(self, _event: Any) -> None:
        await self._act("assign")

    async def _release(self, _event: Any) -> None:
        await self._act("release")

    async def _scale(self, _event: Any) -> None:
        await self._act("scale")

    async def _test(self, _event: Any) -> None:
        self.state.message, self.state.answer = await self._run(self.state.test)

    def __panel__(self) -> pn.viewable.Viewable:
        return pn.Column(
            pn.pane.Markdown("### Model-pool board\nWarm engine pods of each pool; select pods and assign them to a "
                             "service (they serve it at once, no restart), or release them back to the pool."),
            self.table,
            pn.Row(self.service, self.assign_button, self.release_button, self.test_button),
            pn.Row(self.replicas, self.scale_button),
            *([self.router_form] if self.router_form is not None else []),
            pn.pane.Markdown(self.state.param.message, css_classes=["pool-message"]),
            pn.pane.Markdown(self.state.param.answer, css_classes=["pool-answer"]),
            sizing_mode="stretch_width",
        )
