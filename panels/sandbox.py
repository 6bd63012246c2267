"""Sandbox pane: where the embedded world is (endpoints, kubeconfigs) and its faults, for demos and for
rehearsing recovery. Shown only when ``serve`` runs the sandbox.

The pane holds no rules: it calls the same control object as the sandbox's REST routes (role checks,
validation of fault targets, audit), through a small protocol so ``panels/`` needs nothing from ``app/``.
Fault changes arrive as ``sandbox`` events on the bus.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

import pandas as pd
import panel as pn
import param

from panels.live import LiveRefresh
from panels.tables import ReadOnlyTable
from services.auth import Principal, Role
from services.errors import ServiceError
from services.events import Event, EventBus


class SandboxPort(Protocol):
    def info(self) -> Any: ...

    def faults(self) -> list[Any]: ...

    def inject(self, principal: Principal, request: dict[str, Any]) -> Any: ...

    def clear(self, principal: Principal, fault_id: str) -> list[Any]: ...


def parse_target(text: str) -> dict[str, str]:
    """'cluster=hp, node=i-0abc' -> {'cluster': 'hp', 'node': 'i-0abc'} (the control validates the keys)."""
    pairs = [part.strip() for part in text.replace("\n", ",").split(",") if part.strip()]
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"write the target as key=value pairs, got {pair!r}")
        out[key.strip()] = value.strip()
    return out


class SandboxState(param.Parameterized):
    kind = param.Selector(default=None, objects=[], doc="what to break")
    target = param.String(default="", doc="key=value pairs, comma separated")
    count = param.Integer(default=None, allow_None=True, bounds=(1, 10_000), doc="throttle: calls to fail")
    faults = param.List(default=[], doc="active faults")
    message = param.String(default="")

    def __init__(self, control: SandboxPort, principal: Principal,
                 current_principal: Callable[[], Principal] | None = None, **params: Any) -> None:
        super().__init__(**params)
        self.control = control
        self.principal = principal
        # asked again at every action, so a token revoked while the page is open acts no more
        self._current_principal = current_principal or (lambda: principal)
        info = control.info()
        self.info = info
        self.param.kind.objects = sorted(info.fault_kinds)
        self.kind = self.param.kind.objects[0] if self.param.kind.objects else None
        self.faults = [f.model_dump() for f in control.faults()]

    async def inject(self) -> None:
        try:
            request = {"kind": self.kind, "target": parse_target(self.target), "count": self.count}
        except ValueError as exc:
            self.message = str(exc)
            return
        await self._run(lambda: self.control.inject(self._current_principal(), request), "injected")

    async def clear_all(self) -> None:
        await self._run(lambda: self.control.clear(self._current_principal(), "all"), "cleared")

    async def _run(self, action: Callable[[], Any], verb: str) -> None:
        try:
            await asyncio.get_running_loop().run_in_executor(None, action)
            self.message = verb
        except ServiceError as exc:
            self.message = f"refused ({exc.code}): {exc.message}"

    def apply(self, faults: list[dict[str, Any]]) -> None:
        self.faults = faults


def faults_frame(faults: list[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame([{"id": f["id"], "kind": f["kind"],
                          "target": ", ".join(f"{k}={v}" for k, v in sorted(f["target"].items())),
                          "remaining": "" if f["remaining"] is None else f["remaining"]} for f in faults],
                        columns=["id", "kind", "target", "remaining"])


def info_markdown(info: Any) -> str:
    lines = [f"**AWS endpoint** `{info.aws_endpoint_url}` · account `{info.account_id}` · region `{info.region}`",
             f"`aws --endpoint-url {info.aws_endpoint_url} sagemaker list-clusters`",
             f"**Kubernetes** `{info.kubernetes_url}` · simulated time runs {info.speed:g}x faster"]
    for name, path in sorted(info.kubeconfigs.items()):
        lines.append(f"- `{name}`: `kubectl --kubeconfig {path} get nodes`")
    return "\n\n".join(lines)


class SandboxPane(pn.viewable.Viewer):
    def __init__(self, control: SandboxPort, bus: EventBus, principal: Principal,
                 current_principal: Callable[[], Principal] | None = None, **params: Any) -> None:
        super().__init__(**params)
        self.state = SandboxState(control, principal, current_principal)
        self._live = LiveRefresh(bus, "sandbox", self._on_event)
        admin = principal.allows(Role.ADMIN)
        self.table = ReadOnlyTable(faults_frame(self.state.faults), sizing_mode="stretch_width", height=200,
                                   css_classes=["sandbox-faults"])
        self.inject_button = pn.widgets.Button(label="Inject", color="warning", disabled=not admin,
                                               css_classes=["sandbox-inject"])
        self.clear_button = pn.widgets.Button(label="Clear all", color="default", disabled=not admin,
                                              css_classes=["sandbox-clear"])
        self.inject_button.on_click(self._inject)
        self.clear_button.on_click(self._clear)
        self.state.param.watch(lambda e: setattr(self.table, "value", faults_frame(e.new)), "faults")

    def _on_event(self, events: list[Event]) -> None:
        self.state.apply(events[-1].data["faults"])

    async def _inject(self, _event: Any) -> None:
        await self.state.inject()

    async def _clear(self, _event: Any) -> None:
        await self.state.clear_all()

    def __panel__(self) -> pn.viewable.Viewable:
        return pn.Column(
            pn.pane.Markdown("## Sandbox"),
            pn.pane.Markdown(info_markdown(self.state.info), css_classes=["sandbox-info"]),
            pn.pane.Markdown("**Faults**"),
            self.table,
            pn.Row(pn.widgets.Select.from_param(self.state.param.kind, name="Kind", width=200),
                   pn.widgets.TextInput.from_param(self.state.param.target, name="Target",
                                                   placeholder="cluster=hp, node=i-0123456789abcdef0", width=320),
                   pn.widgets.IntInput.from_param(self.state.param.count, name="Count", width=100)),
            pn.Row(self.inject_button, self.clear_button),
            pn.pane.Markdown(self.state.param.message, css_classes=["sandbox-message"]),
            sizing_mode="stretch_width",
        )
