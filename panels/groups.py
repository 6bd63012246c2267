"""Instance-groups pane: one cluster's HyperPod instance groups (and EKS node groups) in a table, and the add,
scale and delete forms — offering only inspected choices: the zones of the region, the instance types the
chosen zone offers with their quota and what is in use (``clusters_options``). It redraws when a group
operation changes state (bus topic ``operation``), never by polling.

The pane holds no rules: every refusal comes from the instance_groups verbs (``services/groups``), called in a
worker thread when served, and is shown as the verb's message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pandas as pd
import panel as pn
import param

from panels.live import LiveRefresh, Newest
from panels.tables import ReadOnlyTable, role_hint
from services.auth import Principal, Role
from services.clusters import Clusters
from services.clusters.create_models import CapacityType
from services.clusters.options import ClusterOptions, OptionsQuery
from services.errors import ServiceError
from services.events import Event, EventBus
from services.groups import InstanceGroups
from services.groups.models import GroupAdd, GroupPatch, GroupView

COLUMNS = ["group", "kind", "type", "capacity", "current", "target", "status", "efa_only"]


def groups_frame(groups: list[GroupView]) -> pd.DataFrame:
    rows = [{"group": g.name, "kind": g.kind, "type": g.instance_type or "", "capacity": g.capacity_type,
             "current": g.current_count, "target": g.target_count, "status": g.status, "efa_only": g.efa_only}
            for g in groups]
    return pd.DataFrame(rows, columns=COLUMNS)


def type_choices(options: ClusterOptions | None) -> dict[str, str]:
    """Label -> instance type, for the types the zone offers: the quota and what is in use in the label."""
    if options is None:
        return {}
    out = {}
    for t in options.instance_types:
        quota = "quota ?" if t.quota is None else f"quota {t.quota}, {t.in_use} in use"
        out[f"{t.instance_type} ({t.accelerators} accel, {t.efa_interfaces} EFA; {quota})"] = t.instance_type
    return out


class GroupsState(param.Parameterized):
    cluster: param.Selector[str | None] = param.Selector(default=None, objects=[], allow_None=True,
                                                         doc="the cluster whose groups are shown")
    groups = param.List(default=[], item_type=GroupView)
    zone: param.Selector[str | None] = param.Selector(default=None, objects=[], allow_None=True,
                                                         doc="Availability Zone of a new group")
    instance_type: param.Selector[str | None] = param.Selector(default=None, objects={}, allow_None=True,
                                                         doc="types the zone offers")
    group_name = param.String(default="", doc="new group's name")
    count = param.Integer(default=1, bounds=(0, 6758))
    capacity_type: param.Selector[str] = param.Selector(default=CapacityType.ON_DEMAND.value,
                                                        objects=[c.value for c in CapacityType])
    training_plan = param.String(default="", doc="training plan ARN or name (capacity type training-plan)")
    target: param.Selector[str | None] = param.Selector(default=None, objects=[], allow_None=True,
                                                         doc="the group to scale or delete")
    scale_to = param.Integer(default=0, bounds=(0, 6758))
    message = param.String(default="")
    busy = param.Boolean(default=False)

    def __init__(self, groups: InstanceGroups, clusters: Clusters, principal: Principal,
                 current_principal: Callable[[], Principal] | None = None, **params: Any) -> None:
        super().__init__(**params)
        self.service = groups
        self.clusters = clusters
        self.principal = principal
        self._current = current_principal or (lambda: principal)
        self.options: ClusterOptions | None = None
        self._newest = Newest()

    # ----- reads (blocking: run them in a worker) ---------------------------------------------------

    def read(self) -> tuple[list[str], list[GroupView], ClusterOptions | None, str]:
        names = [c.name for c in self.clusters.list_clusters(self.principal, wait=0)]
        cluster = self.cluster if self.cluster in names else (names[0] if names else None)
        if cluster is None:
            return names, [], None, ""
        try:
            groups = self.service.list_groups(self.principal, cluster)
            options = self.clusters.cluster_options(self.principal, OptionsQuery(zone=self.zone) if self.zone
                                                    else None)
        except ServiceError as exc:
            return names, [], None, f"{exc.code}: {exc.message}"
        return names, groups, options, ""

    def apply(self, names: list[str], groups: list[GroupView], options: ClusterOptions | None, error: str) -> None:
        self.param.cluster.objects = names
        if self.cluster not in names:
            self.cluster = names[0] if names else None
        self.groups = groups
        self.param.target.objects = [g.name for g in groups]
        if self.target not in self.param.target.objects:
            self.target = groups[0].name if groups else None
        if options is not None:
            self.options = options
            zones = [z.name for z in options.zones]
            self.param.zone.objects = zones
            if self.zone not in zones:
                self.zone = zones[0] if zones else None
            choices = type_choices(options)
            self.param.instance_type.objects = choices
            if self.instance_type not in choices.values():
                self.instance_type = next(iter(choices.values()), None)
        if error:
            self.message = error

    def reload(self) -> None:
        self._newest.read(self.read, lambda answer: self.apply(*answer))

    async def refresh(self) -> None:
        await self._newest.read_in_worker(self.read, lambda answer: self.apply(*answer))

    # ----- mutations ---------------------------------------------------------------------------------

    async def _run(self, what: str, call: Callable[[], Any]) -> None:
        self.busy = True
        try:
            answer = await asyncio.get_running_loop().run_in_executor(None, call)
            view = answer[0]
            decided = answer[2] if len(answer) > 2 else []
            self.message = f"{what}: {view.kind} {view.id} {view.status.value}" + (
                "; decided: " + "; ".join(decided) if decided else "")
        except ServiceError as exc:
            self.message = f"refused ({exc.code}): {exc.message}"
        except ValueError as exc:  # the request model's own validation
            self.message = f"refused (invalid): {exc}"
        finally:
            self.busy = False

    async def add(self) -> None:
        cluster, plan = self.cluster, self.training_plan.strip() or None

        def call() -> Any:
            request = GroupAdd(name=self.group_name.strip(), count=self.count,
                               capacity_type=CapacityType(self.capacity_type), training_plan=plan,
                               zone=None if plan else self.zone,
                               instance_type=None if plan else self.instance_type)
            return self.service.add_group(self._current(), str(cluster), request)

        await self._run(f"add {self.group_name}", call)

    async def scale(self) -> None:
        cluster, group, count = self.cluster, self.target, self.scale_to
        await self._run(f"scale {group} to {count}", lambda: self.service.update_group(
            self._current(), str(cluster), str(group), GroupPatch(count=count)))

    async def delete(self) -> None:
        cluster, group = self.cluster, self.target
        await self._run(f"delete {group}", lambda: self.service.delete_group(self._current(), str(cluster),
                                                                              str(group)))


class GroupsPane(pn.viewable.Viewer):
    def __init__(self, groups: InstanceGroups, clusters: Clusters, bus: EventBus, principal: Principal,
                 current_principal: Callable[[], Principal] | None = None, **params: Any) -> None:
        super().__init__(**params)
        self.state = GroupsState(groups, clusters, principal, current_principal)
        self.table = ReadOnlyTable(groups_frame([]), sizing_mode="stretch_width", css_classes=["groups-table"],
                                   empty="No instance groups (or no cluster registered).")
        operator, admin = principal.allows(Role.OPERATOR), principal.allows(Role.ADMIN)
        self.add_button = pn.widgets.Button(label="Add group", color="primary", disabled=not operator,
                                            css_classes=["group-add"], loading=self.state.param.busy)
        self.scale_button = pn.widgets.Button(label="Scale", disabled=not operator, css_classes=["group-scale"],
                                              loading=self.state.param.busy)
        self.delete_button = pn.widgets.Button(label="Delete group", color="danger", disabled=not admin,
                                               css_classes=["group-delete"], loading=self.state.param.busy)
        self.add_button.on_click(self._add)
        self.scale_button.on_click(self._scale)
        self.delete_button.on_click(self._delete)
        self.hints = pn.Column(role_hint(principal, Role.OPERATOR, "Adding or scaling a group"),
                               role_hint(principal, Role.ADMIN, "Deleting a group"))
        self.state.param.watch(lambda e: setattr(self.table, "value", groups_frame(e.new)), "groups")
        self.state.param.watch(lambda _e: self._refresh(), ["cluster", "zone"])
        self._ops = LiveRefresh(bus, "operation", self._on_operation)
        self._refresh()

    def _on_operation(self, events: list[Event]) -> None:
        if any(str(e.data.get("kind", "")).startswith("instance_group.") for e in events):
            self._refresh()

    def _refresh(self) -> None:
        if not self._ops.spawn(self.state.refresh):
            self.state.reload()

    async def _add(self, _event: Any) -> None:
        await self.state.add()

    async def _scale(self, _event: Any) -> None:
        await self.state.scale()

    async def _delete(self, _event: Any) -> None:
        await self.state.delete()

    def __panel__(self) -> pn.viewable.Viewable:
        s = self.state
        return pn.Column(
            pn.pane.Markdown("## Instance groups"),
            pn.widgets.Select.from_param(s.param.cluster, name="Cluster", css_classes=["groups-cluster"]),
            self.table,
            pn.pane.Markdown("**Add a group** (a training plan decides zone and type)"),
            pn.Row(pn.widgets.TextInput.from_param(s.param.group_name, name="Name", width=160,
                                                   css_classes=["group-name"]),
                   pn.widgets.Select.from_param(s.param.zone, name="Zone", width=140, css_classes=["group-zone"]),
                   pn.widgets.Select.from_param(s.param.instance_type, name="Instance type", width=360,
                                                css_classes=["group-type"]),
                   pn.widgets.IntInput.from_param(s.param.count, name="Count", width=90),
                   pn.widgets.Select.from_param(s.param.capacity_type, name="Capacity", width=130),
                   pn.widgets.TextInput.from_param(s.param.training_plan, name="Training plan", width=200),
                   self.add_button),
            pn.pane.Markdown("**Scale or delete**"),
            pn.Row(pn.widgets.Select.from_param(s.param.target, name="Group", width=160, css_classes=["group-target"]),
                   pn.widgets.IntInput.from_param(s.param.scale_to, name="Count", width=90),
                   self.scale_button, self.delete_button),
            self.hints,
            pn.pane.Markdown(s.param.message, css_classes=["groups-message"]),
            sizing_mode="stretch_width",
        )
