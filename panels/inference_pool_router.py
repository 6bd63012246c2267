"""The model-pool board's router form: put an SGLang router in front of one pool service — the service of the pods
selected in the board (or the board's Service field) — with the router section's policy knobs (policy, cache
threshold; the others keep the router's defaults, the REST/MCP faces set them), a preview (its worker selector,
command and port, dry-run by the API server) and the create. The router section lists the router once made.

The form holds no rules: it calls the router noun's verbs (``services/inference/router.py``) in a worker thread,
like the board; the verbs check the role again and refuse what the REST face refuses.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any

import panel as pn
from pydantic import ValidationError

from panels.inference_router import router_fields, router_request
from panels.live import in_worker
from panels.refusals import refused
from services.auth import Principal, Role
from services.errors import ServiceError
from services.inference.router import Routers
from services.inference.router_models import RouterRequest

if TYPE_CHECKING:
    from panels.inference_pool import PoolState


class NoService(Exception):
    """The selection names no single pool service to route to."""


class PoolRouterForm(pn.viewable.Viewer):
    """Needs the board's state (``panels.inference_pool.PoolState``): its cluster, selection, pools and Service."""

    def __init__(self, routers: Routers, state: PoolState, principal: Principal) -> None:
        super().__init__()
        self.routers, self.state = routers, state
        operator = principal.allows(Role.OPERATOR)
        self.router_name, self.policy, self.cache_threshold = router_fields("<service>-router")
        self.preview_button = pn.widgets.Button(label="Preview router", disabled=not operator,
                                                css_classes=["pool-router-preview"])
        self.create_button = pn.widgets.Button(label="Route the service", disabled=not operator,
                                               css_classes=["pool-router-create"])
        if not operator:
            for button in (self.preview_button, self.create_button):
                button.description = "needs the operator role"
        self.preview_button.on_click(self._preview)
        self.create_button.on_click(self._create)
        self.message = pn.pane.Markdown("", css_classes=["pool-router-message"])

    def target(self) -> tuple[str, str]:
        """(pool, service): the pool of the selected pods and the one service holding them; when the selected pods
        are unassigned, the Service field names the service (a pod of the pool must be selected either way)."""
        picked = set(self.state.selected)
        if len({pool for pool, _ in picked}) != 1:
            raise NoService("select a pod of the service to route to in the board first")
        (pool,) = {pool for pool, _ in picked}
        holders = {pod.assigned_to for view in self.state.pools if view.name == pool for pod in view.pods
                   if (pool, pod.name) in picked and pod.assigned_to}
        if len(holders) > 1:
            raise NoService(f"the selected pods serve several services ({', '.join(sorted(holders))}): select one's")
        service = holders.pop() if holders else self.state.service
        if not service:
            raise NoService("the selected pods serve no service: select a service's pod or fill in Service")
        return pool, service

    def request(self) -> RouterRequest:
        pool, service = self.target()
        return router_request((self.router_name, self.policy, self.cache_threshold), service, deployment=pool,
                              pool_service=service)

    def preview(self) -> str:
        """What the create would make, checked by every precheck and the API server's dry run (blocking)."""
        try:
            request = self.request()
            shown = self.routers.preview_router(self.state.current(), self.state.cluster, request)
        except (ValidationError, ServiceError) as exc:
            return refused(exc)
        except NoService as exc:
            return str(exc)
        return (f"router {request.name} for {request.deployment}/{request.pool_service}: workers `{shown.selector}` "
                f"on port {shown.worker_port}\n\n`{shlex.join(shown.command)}`")

    def create(self) -> str:
        try:
            request = self.request()
            view, _ = self.routers.create_router(self.state.current(), self.state.cluster, request)
        except (ValidationError, ServiceError) as exc:
            return refused(exc)
        except NoService as exc:
            return str(exc)
        return f"routing {request.deployment}/{request.pool_service} through {request.name} ({view.id})"

    async def _preview(self, _event: Any) -> None:
        self.message.object = await in_worker(self.preview)

    async def _create(self, _event: Any) -> None:
        self.message.object = await in_worker(self.create)

    def __panel__(self) -> pn.viewable.Viewable:
        return pn.Column(
            pn.pane.Markdown("**Router for a service**: an SGLang router in front of the selected service's pods "
                             "(requests sharing a prefix go to the same pod); it follows assigns and releases."),
            pn.Row(self.router_name, self.policy, self.cache_threshold, self.preview_button, self.create_button),
            self.message, sizing_mode="stretch_width")
