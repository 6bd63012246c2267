"""Sandbox pane: where the embedded world is (endpoints, kubeconfigs) and its faults, for demos and for
rehearsing recovery. Shown only when ``serve`` runs the sandbox.

The pane holds no rules: it calls the same control object as the sandbox's REST routes (role checks,
validation of fault targets, audit), through a small protocol so ``panels/`` needs nothing from ``app/``.
Fault changes arrive as ``sandbox`` events on the bus.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pandas as pd
import panel as pn
import param

from panels.live import LiveRefresh
from panels.tables import ReadOnlyTable, role_hint
from services.auth import Principal, Role
from services.errors import ServiceError
from services.events import Event, EventBus
from services.sandbox_control import SandboxControl


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


# what each target key looks like, for the form's placeholder (the control validates the keys themselves)
TARGET_EXAMPLES = {"cluster": "hp-eks", "node": "i-0123456789abcdef0", "recovery": "Replace",
                   "instance_type": "ml.g5.8xlarge", "availability_zone": "us-west-2a",
                   "addon": "amazon-cloudwatch-observability", "service": "eks", "operation": "CreateCluster"}


def target_placeholder(required: list[str]) -> str:
    return ", ".join(f"{key}={TARGET_EXAMPLES.get(key, '...')}" for key in required)


class SandboxState(param.Parameterized):
    kind: param.Selector[str | None] = param.Selector(default=None, objects=[], doc="what to break")
    target = param.String(default="", doc="key=value pairs, comma separated")
    count = param.Integer(default=None, allow_None=True, bounds=(1, 10_000), doc="throttle: calls to fail")
    faults = param.List(default=[], doc="active faults")
    info = param.Parameter(default=None, doc="endpoints and kubeconfigs (SandboxInfo)")
    message = param.String(default="")

    def __init__(self, control: SandboxControl, principal: Principal,
                 current_principal: Callable[[], Principal] | None = None, **params: Any) -> None:
        super().__init__(**params)
        self.control = control
        self.principal = principal
        # asked again at every action, so a token revoked while the page is open acts no more
        self._current_principal = current_principal or (lambda: principal)
        info = control.info(principal)
        self.info = info
        self.param.kind.objects = sorted(info.fault_kinds)
        self.kind = self.param.kind.objects[0] if self.param.kind.objects else None
        self.faults = [f.model_dump() for f in control.faults(principal)]

    def required_keys(self) -> list[str]:
        return list(self.info.fault_kinds.get(self.kind, [])) if self.kind else []

    async def inject(self) -> None:
        try:
            target = parse_target(self.target)
        except ValueError as exc:
            self.message = str(exc)
            return
        missing = [key for key in self.required_keys() if key not in target]
        if missing:
            self.message = (f"{self.kind} needs a target with {', '.join(missing)}: for example "
                            f"{target_placeholder(self.required_keys())}")
            return
        request = {"kind": self.kind, "target": target, "count": self.count}
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

    def clusters_changed(self, names: list[str]) -> None:
        """A cluster appeared or went: list its kubeconfig (the server wrote it before telling us)."""
        folder = self.info.kubeconfig_dir
        kubeconfigs = {name: f"{folder}/{name}.yaml" for name in names}
        self.info = self.info.model_copy(update={"kubeconfigs": kubeconfigs})


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
    if not info.kubeconfigs:
        lines.append("No clusters yet: `instantstart sandbox seed` makes a ready EKS + HyperPod cluster; "
                     "its kubeconfig appears here.")
    return "\n\n".join(lines)


class SandboxPane(pn.viewable.Viewer):
    def __init__(self, control: SandboxControl, bus: EventBus, principal: Principal,
                 current_principal: Callable[[], Principal] | None = None, **params: Any) -> None:
        super().__init__(**params)
        self.state = SandboxState(control, principal, current_principal)
        self._live = LiveRefresh(bus, "sandbox", self._on_event)
        admin = principal.allows(Role.ADMIN)
        self.table = ReadOnlyTable(faults_frame(self.state.faults), sizing_mode="stretch_width", height=200,
                                   css_classes=["sandbox-faults"],
                                   empty="No faults injected: pick a kind and a target below, or run "
                                         "'instantstart sandbox inject'.")
        self.inject_button = pn.widgets.Button(label="Inject", color="warning", disabled=not admin,
                                               css_classes=["sandbox-inject"])
        self.clear_button = pn.widgets.Button(label="Clear all", color="default", disabled=not admin,
                                              css_classes=["sandbox-clear"])
        if not admin:
            for button in (self.inject_button, self.clear_button):
                button.description = "needs the admin role"
        self.target_input = pn.widgets.TextInput.from_param(
            self.state.param.target, name="Target", width=320, css_classes=["sandbox-target"],
            placeholder=target_placeholder(self.state.required_keys()))
        self.state.param.watch(lambda _e: setattr(self.target_input, "placeholder",
                                                  target_placeholder(self.state.required_keys())), "kind")
        self.inject_button.on_click(self._inject)
        self.clear_button.on_click(self._clear)
        self.role_hint = role_hint(principal, Role.ADMIN, "Injecting and clearing faults")
        self.state.param.watch(lambda e: setattr(self.table, "value", faults_frame(e.new)), "faults")

    def _on_event(self, events: list[Event]) -> None:
        faults = [e for e in events if e.kind == "faults"]
        clusters = [e for e in events if e.kind == "clusters"]
        if faults:
            self.state.apply(faults[-1].data["faults"])
        if clusters:
            self.state.clusters_changed(clusters[-1].data["clusters"])

    async def _inject(self, _event: Any) -> None:
        await self.state.inject()

    async def _clear(self, _event: Any) -> None:
        await self.state.clear_all()

    def __panel__(self) -> pn.viewable.Viewable:
        return pn.Column(
            pn.pane.Markdown("## Sandbox"),
            pn.pane.Markdown(self.state.param.info.rx.pipe(info_markdown), css_classes=["sandbox-info"]),
            pn.pane.Markdown("**Faults**"),
            self.table,
            pn.Row(pn.widgets.Select.from_param(self.state.param.kind, name="Kind", width=200),
                   self.target_input,
                   pn.widgets.IntInput.from_param(self.state.param.count, name="Count", width=100)),
            pn.Row(self.inject_button, self.clear_button),
            self.role_hint,
            pn.pane.Markdown(self.state.param.message, css_classes=["sandbox-message"]),
            sizing_mode="stretch_width",
        )
