"""Create and delete a cluster from the dashboard: a form that offers only what ``cluster_options`` inspected
(zones, then the instance types that zone offers, a quota warning before submit), a Plan step that shows
the derived names and resources before Create is possible, the create operation's stages live from the
event bus (status, elapsed against AWS's expected duration, the stage's message, Retry when it failed), and
Delete behind typing the cluster's name.

The pane holds no rules: the verbs precheck (a refusal shows its message and valid choices) and every verb
runs in a worker thread, so the loop never waits on AWS. Operation events carry the whole view, so
following the create reads nothing.
"""

from __future__ import annotations

import asyncio
import datetime
import html
from collections.abc import Callable
from typing import Any

import panel as pn
import param

from panels.live import LiveRefresh
from panels.tables import role_hint
from services.auth import Principal, Role
from services.clusters import Clusters
from services.clusters.create_models import CapacityType, ClusterCreate, ClusterDelete, CreatePlanView
from services.clusters.options import ClusterOptions, InstanceTypeOption
from services.errors import ServiceError
from services.events import Event, EventBus
from services.operation_verbs import Operations
from services.operation_views import OperationView, Status

CREATE_KIND = "cluster.create"
DELETE_KIND = "cluster.delete"
TICK_MS = 5000  # how often a served page redraws the running stage's elapsed time (no reads: the view is held)


def type_label(t: InstanceTypeOption) -> str:
    accel = f", {t.accelerators} x {t.accelerator}" if t.accelerator else ""
    efa = f", EFA x{t.efa_interfaces}" if t.efa_interfaces else ""
    return f"{t.instance_type}{accel}{efa}"


def quota_warning(option: InstanceTypeOption | None, count: int) -> str:
    """What to say before submit about the type's cluster-usage quota (empty: nothing to say)."""
    if option is None:
        return ""
    if option.quota is None:
        return (f"The '{option.instance_type} for cluster usage' quota could not be read: the create may be "
                "refused by AWS.")
    free = option.quota - option.in_use
    if count > free:
        return (f"Quota: {count} x {option.instance_type} asked, {free} free ({option.quota} allowed, "
                f"{option.in_use} in use). Request an increase in Service Quotas or lower the count.")
    return ""


def _seconds_between(start: str | None, end: str | None, now: datetime.datetime) -> float | None:
    if not start:
        return None
    began = datetime.datetime.fromisoformat(start)
    ended = datetime.datetime.fromisoformat(end) if end else now
    return max(0.0, (ended - began).total_seconds())


def _minutes(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def plan_html(view: CreatePlanView | None) -> str:
    if view is None:
        return ""
    esc = html.escape
    p = view.plan
    names = "".join(f"<tr><td>{esc(k)}</td><td><code>{esc(str(v))}</code></td></tr>"
                    for k, v in view.plan.names.model_dump().items() if v)
    rows = "".join(f"<tr><td>{esc(r.stage)}</td><td>{esc(r.action)}</td><td>{esc(r.type)}</td>"
                   f"<td><code>{esc(r.name)}</code></td><td>{esc(r.detail)}</td></tr>" for r in view.resources)
    warnings = "".join(f"<li class='plan-warning'>{esc(w)}</li>" for w in view.warnings)
    total = sum(view.expected_seconds.values())
    return (f"<h4>Plan for {esc(p.name)}</h4><p>{p.count} x {esc(p.instance_type)} ({esc(p.capacity_type.value)}) "
            f"in {esc(p.zone)}, {esc(p.region)}; Kubernetes {esc(p.kubernetes_version)}, VPC {esc(p.vpc_cidr)}. "
            f"Expected about {total / 60:.0f} minutes. Nothing has been made yet.</p>"
            f"{'<ul>' + warnings + '</ul>' if warnings else ''}"
            f"<table class='plan-names'><tr><th>name</th><th>value</th></tr>{names}</table>"
            f"<table class='plan-resources'><tr><th>stage</th><th>action</th><th>type</th><th>name</th>"
            f"<th>detail</th></tr>{rows}</table>")


def progress_html(op: OperationView | None, now: datetime.datetime) -> str:
    """One row per stage: status, elapsed against expected (the stage's own, in this world: AWS's durations,
    the sandbox's scaled ones), and the stage's message (what it waits for)."""
    if op is None:
        return ""
    esc = html.escape
    rows = "".join(
        f"<tr class='stage-row' data-stage='{esc(s.name)}' data-status='{esc(s.status)}'><td>{esc(s.name)}</td>"
        f"<td>{esc(s.status)}</td><td>{_minutes(_seconds_between(s.started_at, s.finished_at, now))}"
        f" / {_minutes(s.expected_seconds)}</td><td>{esc(s.message)}</td></tr>" for s in op.stages)
    error = f"<p class='op-error'>{esc(str((op.error or {}).get('message', '')))}</p>" if op.error else ""
    return (f"<h4>{esc(op.kind)} <code>{esc(op.id)}</code>: <span class='op-status'>{esc(op.status.value)}"
            f"</span></h4>{error}<table class='create-stages'><tr><th>stage</th><th>status</th>"
            f"<th>elapsed / expected</th><th>message</th></tr>{rows}</table>")


class CreateState(param.Parameterized):
    """The form's decisions, the plan shown for them, and the operation followed."""

    cluster_name = param.String(default="", doc="names the cluster and everything it owns")
    zone: param.Selector[str | None] = param.Selector(default=None, objects=[], allow_None=True,
                                                      doc="zones the region offers")
    instance_type: param.Selector[str | None] = param.Selector(default=None, objects=[], allow_None=True,
                                                               doc="types offered in the zone")
    count = param.Integer(default=1, bounds=(1, 6758))
    capacity_type: param.Selector[str] = param.Selector(default=CapacityType.ON_DEMAND.value,
                                                        objects=[c.value for c in CapacityType])
    training_plan_arn = param.String(default="")
    options = param.ClassSelector(class_=ClusterOptions, default=None, allow_None=True)
    quota_note = param.String(default="", doc="the quota warning for the chosen type and count")
    plan = param.ClassSelector(class_=CreatePlanView, default=None, allow_None=True,
                               doc="the plan of exactly the current decisions (None once one changes)")
    operation = param.ClassSelector(class_=OperationView, default=None, allow_None=True)
    target = param.String(default="", doc="the cluster a Delete would remove (the list's selection)")
    confirm = param.String(default="", doc="the cluster's name typed again")
    message = param.String(default="")
    busy = param.Boolean(default=False)

    def __init__(self, clusters: Clusters, operations: Operations, principal: Principal,
                 current_principal: Callable[[], Principal] | None = None, **params: Any) -> None:
        super().__init__(**params)
        self.service = clusters
        self.operations = operations
        self.principal = principal
        self._current_principal = current_principal or (lambda: principal)

    # ----- inspected choices -------------------------------------------------------------------------

    def read_options(self) -> ClusterOptions:
        """Blocking (AWS on a cache miss): run it in a worker thread when served."""
        return self.service.cluster_options(self.principal)

    def apply_options(self, options: ClusterOptions) -> None:
        zones = [z.name for z in options.zones if z.state == "available"]
        self.options = options
        self.param.zone.objects = zones
        self.zone = self.zone if self.zone in zones else (zones[0] if zones else None)
        self._types_for_zone()
        if options.notes:
            self.message = "Some reads failed: " + "; ".join(options.notes)

    def type_option(self) -> InstanceTypeOption | None:
        if self.options is None:
            return None
        return next((t for t in self.options.instance_types if t.instance_type == self.instance_type), None)

    @param.depends("zone", watch=True)
    def _types_for_zone(self) -> None:
        offered = {} if self.options is None else {type_label(t): t.instance_type
                                                   for t in self.options.instance_types if self.zone in t.zones}
        self.param.instance_type.objects = offered  # labels (accelerator, EFA) shown, the type's name chosen
        names = list(offered.values())
        self.instance_type = self.instance_type if self.instance_type in names else (names[0] if names else None)
        self._decisions_changed()

    @param.depends("cluster_name", "instance_type", "count", "capacity_type", "training_plan_arn", watch=True)
    def _decisions_changed(self) -> None:
        self.quota_note = quota_warning(self.type_option(), self.count)
        self.plan = None  # Create follows only the plan of what is on the form now

    def request(self) -> ClusterCreate:
        """The decisions as the verbs' request (a ValueError names what is wrong)."""
        return ClusterCreate(name=self.cluster_name.strip(), zone=self.zone or "",
                             instance_type=self.instance_type or "", count=self.count,
                             capacity_type=CapacityType(self.capacity_type),
                             training_plan_arn=self.training_plan_arn.strip() or None)

    # ----- actions (verbs in a worker thread) --------------------------------------------------------

    async def _run(self, what: str, call: Callable[[], Any]) -> Any:
        self.busy = True
        try:
            return await asyncio.get_running_loop().run_in_executor(None, call)
        except ServiceError as exc:
            details = f" Valid: {exc.details}" if exc.details else ""
            self.message = f"{what} refused ({exc.code}): {exc.message}{details}"
        except ValueError as exc:  # the request model's own validation
            self.message = f"{what} refused (invalid): {exc}"
        finally:
            self.busy = False
        return None

    def _on_form(self, request: ClusterCreate) -> bool:
        """The form still says ``request`` (a decision changed while it was planned: that plan is not shown)."""
        try:
            return self.request() == request
        except ValueError:
            return False

    async def make_plan(self) -> None:
        self.message = ""
        try:
            request = self.request()
        except ValueError as exc:  # the request model's own validation
            self.message = f"Plan refused (invalid): {exc}"
            return
        view = await self._run("Plan", lambda: self.service.plan_cluster(self._current_principal(), request))
        if isinstance(view, CreatePlanView) and self._on_form(request):
            self.plan = view

    async def create(self) -> None:
        if self.plan is None:
            self.message = "Plan first: Create starts what the plan shows."
            return
        answer = await self._run("Create", lambda: self.service.create_cluster(self._current_principal(),
                                                                                self.request()))
        if answer is not None:
            view, created = answer
            self.follow(view)
            self.message = f"{'started' if created else 'already running'}: {view.id}"

    async def retry(self) -> None:
        op = self.operation
        if op is None or op.status != Status.FAILED:
            self.message = "Retry: the followed operation has not failed"
            return
        view = await self._run("Retry", lambda: self.operations.retry_operation(self._current_principal(), op.id))
        if isinstance(view, OperationView):
            self.follow(view)
            self.message = f"retry of {op.id} requested: it resumes at the failed stage"

    async def delete(self) -> None:
        name = self.target
        if not name or self.confirm.strip() != name:
            self.message = f"Type the cluster's name ({name or 'select one'}) to delete it."
            return
        answer = await self._run("Delete", lambda: self.service.delete_cluster(
            self._current_principal(), name, ClusterDelete(confirm=self.confirm.strip())))
        if answer is not None:
            view, _created = answer
            self.follow(view)
            self.confirm = ""
            self.message = f"delete of {name} started: {view.id}"

    # ----- the followed operation --------------------------------------------------------------------

    def follow(self, view: OperationView) -> None:
        """Show ``view`` unless an event already brought a newer version of it."""
        current = self.operation
        if current is None or current.id != view.id or view.version >= current.version:
            self.operation = view

    def on_events(self, views: list[OperationView]) -> None:
        """Update the followed operation; with none followed yet, follow the first active one that arrives (a
        create or delete started elsewhere: another tab, the CLI, an agent)."""
        for view in views:
            if self.operation is None and not view.status.terminal:
                self.operation = view
            elif self.operation is not None and view.id == self.operation.id:
                self.follow(view)


class ClusterCreatePane(pn.viewable.Viewer):
    """The create form, its plan, the followed operation's stages and the Delete box, live from the bus."""

    def __init__(self, clusters: Clusters, operations: Operations, bus: EventBus, principal: Principal,
                 current_principal: Callable[[], Principal] | None = None, **params: Any) -> None:
        super().__init__(**params)
        self.state = state = CreateState(clusters, operations, principal, current_principal)
        operator, admin = principal.allows(Role.OPERATOR), principal.allows(Role.ADMIN)
        self.plan_button = pn.widgets.Button(label="Plan", disabled=not operator, css_classes=["create-plan"],
                                             loading=state.param.busy)
        self.create_button = pn.widgets.Button(label="Create", color="primary", disabled=True,
                                               css_classes=["create-submit"], loading=state.param.busy)
        self.retry_button = pn.widgets.Button(label="Retry", color="warning", visible=False,
                                              css_classes=["create-retry"], disabled=not operator)
        self.delete_button = pn.widgets.Button(label="Delete", color="danger", disabled=True,
                                               css_classes=["cluster-delete"])
        self.plan_view = pn.pane.HTML("", sizing_mode="stretch_width", css_classes=["create-plan-view"])
        self.progress = pn.pane.HTML("", sizing_mode="stretch_width", css_classes=["create-progress"])
        self.role_hint = role_hint(principal, Role.OPERATOR, "Creating a cluster")
        self.delete_hint = role_hint(principal, Role.ADMIN, "Deleting a cluster")
        self._admin = admin
        self.plan_button.on_click(self._plan)
        self.create_button.on_click(self._create)
        self.retry_button.on_click(self._retry)
        self.delete_button.on_click(self._delete)
        state.param.watch(self._on_plan, "plan")
        state.param.watch(self._on_operation, "operation")
        state.param.watch(self._on_confirm, ["confirm", "target"])
        self._live = LiveRefresh(bus, "operation", self._on_events)
        if self._live.in_session:  # the running stage's elapsed time moves between events
            pn.state.add_periodic_callback(self._tick, period=TICK_MS)
        if not self._live.spawn(self._load_options):
            state.apply_options(state.read_options())

    async def _load_options(self) -> None:
        try:
            options = await asyncio.get_running_loop().run_in_executor(None, self.state.read_options)
        except ServiceError as exc:
            self.state.message = f"Could not inspect the region ({exc.code}): {exc.message}"
            return
        self.state.apply_options(options)

    def _on_events(self, events: list[Event]) -> None:
        views = []
        for event in events:
            if str(event.data.get("kind", "")) in (CREATE_KIND, DELETE_KIND):
                try:
                    views.append(OperationView.model_validate(event.data))
                except ValueError:
                    continue
        self.state.on_events(views)

    def _tick(self) -> None:
        op = self.state.operation
        if op is not None and not op.status.terminal:
            self._render(op)

    def _render(self, op: OperationView | None) -> None:
        self.progress.object = progress_html(op, datetime.datetime.now(datetime.UTC))
        self.retry_button.visible = op is not None and op.status == Status.FAILED

    def _on_plan(self, event: param.parameterized.Event) -> None:
        self.plan_view.object = plan_html(event.new)
        self.create_button.disabled = event.new is None or not self.state.principal.allows(Role.OPERATOR)

    def _on_operation(self, event: param.parameterized.Event) -> None:
        self._render(event.new)

    def _on_confirm(self, _event: param.parameterized.Event) -> None:
        state = self.state
        self.delete_button.disabled = not (self._admin and state.target and state.confirm.strip() == state.target)

    async def _plan(self, _event: Any) -> None:
        await self.state.make_plan()

    async def _create(self, _event: Any) -> None:
        await self.state.create()

    async def _retry(self, _event: Any) -> None:
        await self.state.retry()

    async def _delete(self, _event: Any) -> None:
        await self.state.delete()

    def __panel__(self) -> pn.viewable.Viewable:
        state = self.state
        return pn.Column(
            pn.pane.Markdown("### Create a cluster"),
            pn.Row(pn.widgets.TextInput.from_param(state.param.cluster_name, name="Name", width=180,
                                                   placeholder="demo", css_classes=["create-name"]),
                   pn.widgets.Select.from_param(state.param.zone, name="Zone", width=160,
                                                css_classes=["create-zone"]),
                   pn.widgets.Select.from_param(state.param.instance_type, name="Instance type", width=200,
                                                css_classes=["create-type"]),
                   pn.widgets.IntInput.from_param(state.param.count, name="Nodes", width=90,
                                                  css_classes=["create-count"]),
                   pn.widgets.Select.from_param(state.param.capacity_type, name="Capacity", width=140,
                                                css_classes=["create-capacity"])),
            pn.widgets.TextInput.from_param(state.param.training_plan_arn, name="Training plan ARN", width=480,
                                            visible=state.param.capacity_type.rx.pipe(
                                                lambda c: c == CapacityType.TRAINING_PLAN.value)),
            pn.pane.Markdown(state.param.quota_note, css_classes=["create-warning"]),
            pn.Row(self.plan_button, self.create_button),
            self.role_hint,
            self.plan_view,
            self.progress,
            self.retry_button,
            pn.pane.Markdown(state.param.message, css_classes=["create-message"]),
            pn.pane.Markdown(state.param.target.rx.pipe(
                lambda t: f"### Delete {t}" if t else "### Delete: select a cluster above")),
            pn.Row(pn.widgets.TextInput.from_param(state.param.confirm, name="Type the cluster's name to delete it",
                                                   width=300, css_classes=["delete-confirm"]),
                   self.delete_button),
            self.delete_hint,
            sizing_mode="stretch_width",
        )
