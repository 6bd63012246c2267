"""Jobs pane: one cluster's training jobs as a table (phase, restarts used against the budget, the failure
reason), and the page of the job chosen in it: status, budget, conditions, pods with node and rank, events,
and the job actions — suspend, resume, clone under a new name, delete — each behind a confirmation that says
what it does. Live from the informers' watch events (topic ``kube``: the job kinds, pods, events), no polling.
The logs and chart panes of a job are other panes, placed beside this one by the page that embeds it.

The pane holds no rules: it calls the jobs noun's verbs (``services/training/jobs.py``), in a worker thread when
served, so the event loop never waits on Kubernetes; the verbs check the role again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

import pandas as pd
import panel as pn
import param

from panels.live import LiveRefresh, Newest
from panels.tables import ReadOnlyTable
from services.auth import Principal, Role
from services.clusters import Clusters
from services.errors import ServiceError
from services.events import Event, EventBus
from services.training import Jobs
from services.training.jobs_models import JobClone, JobDetail, JobSummary, JobTarget
from services.training.recipes.models import DEFAULT_NAMESPACE

COLUMNS = ["namespace", "name", "kind", "recipe", "phase", "restarts", "reason"]
POD_COLUMNS = ["rank", "name", "replica", "node", "phase", "restarts", "reason"]
EVENT_COLUMNS = ["last seen", "type", "reason", "object", "message"]
RESOURCES = ("hyperpodpytorchjobs", "pytorchjobs", "rayjobs", "pods", "events", "customresourcedefinitions")
#: action -> what the confirmation says it does
ACTIONS = {"suspend": "stops its pods and keeps the job (resume starts them again)",
           "resume": "starts its pods again",
           "clone": "submits the same spec again under the new name",
           "delete": "DELETES the job, its pods and their logs"}


def budget_text(restarts: Any) -> str:
    return f"{restarts.used}/{restarts.limit if restarts.limit is not None else '-'}"


def jobs_frame(jobs: list[JobSummary]) -> pd.DataFrame:
    rows = [{"namespace": j.namespace, "name": j.name, "kind": j.kind, "recipe": j.recipe, "phase": j.phase,
             "restarts": budget_text(j.restarts), "reason": j.reason or ""} for j in jobs]
    return pd.DataFrame(rows, columns=COLUMNS)


def pods_frame(detail: JobDetail | None) -> pd.DataFrame:
    rows = [{"rank": "" if p.rank is None else p.rank, "name": p.name, "replica": p.replica or "",
             "node": p.node or "", "phase": p.phase or "", "restarts": p.restarts, "reason": p.reason or ""}
            for p in (detail.pods if detail else [])]
    return pd.DataFrame(rows, columns=POD_COLUMNS)


def events_frame(detail: JobDetail | None) -> pd.DataFrame:
    rows = [{"last seen": e.last_timestamp or "", "type": e.type or "", "reason": e.reason or "",
             "object": e.object, "message": e.message or ""} for e in (detail.events if detail else [])]
    return pd.DataFrame(rows, columns=EVENT_COLUMNS)


def status_markdown(detail: JobDetail | None) -> str:
    if detail is None:
        return "Choose a job in the table."
    lines = [f"### {detail.namespace}/{detail.name}",
             f"**{detail.phase}** · {detail.kind} · recipe {detail.recipe} · restarts "
             f"**{budget_text(detail.restarts)}** ({detail.restarts.source})"]
    if detail.restarts.full_job_restarts_limit is not None:
        lines.append(f"full-job restarts {detail.restarts.full_job_restarts_used or 0}/"
                     f"{detail.restarts.full_job_restarts_limit}")
    if detail.reason:
        lines.append(f"**Failed:** {detail.reason}")
    lines += [f"- {c['type']} = {c['status']} {c['reason']} {c['message']}".rstrip() for c in detail.conditions]
    return "\n\n".join(lines[:3]) + ("\n\n" + "\n".join(lines[3:]) if lines[3:] else "")


class JobsState(param.Parameterized):
    cluster = param.String(default="", doc="the cluster whose jobs are shown")
    clusters = param.List(default=[], item_type=str)
    jobs = param.List(default=[], item_type=JobSummary)
    job = param.String(default="", doc="the job whose page is shown ('namespace/name')")
    detail = param.ClassSelector(class_=JobDetail, default=None, allow_None=True)
    pending = param.String(default="", doc="the action awaiting confirmation")
    clone_name = param.String(default="", doc="the new name of a clone")
    message = param.String(default="")
    busy = param.Boolean(default=False)

    def __init__(self, jobs: Jobs, clusters: Clusters, principal: Principal,
                 current_principal: Callable[[], Principal] | None = None, **params: Any) -> None:
        super().__init__(**params)
        self.service = jobs
        self.clusters_service = clusters
        self.principal = principal
        self._current_principal = current_principal or (lambda: principal)
        self._newest = Newest()

    def fetch(self) -> tuple[list[str], str, list[JobSummary], JobDetail | None, str]:
        """Ask the verbs; assigns nothing, so it may run in a worker thread."""
        names = [c.name for c in self.clusters_service.list_clusters(self.principal, wait=0)]
        cluster = self.cluster if self.cluster in names else (names[0] if names else "")
        if not cluster:
            return names, "", [], None, ""
        try:
            listed = self.service.list_jobs(self.principal, cluster).jobs
            chosen = next((j for j in listed if f"{j.namespace}/{j.name}" == self.job), None)
            detail = (self.service.describe_job(self.principal, cluster, chosen.name, chosen.namespace)
                      if chosen else None)
        except ServiceError as exc:
            return names, cluster, [], None, f"{exc.code}: {exc.message}"
        return names, cluster, listed, detail, ""

    def apply(self, read: tuple[list[str], str, list[JobSummary], JobDetail | None, str]) -> None:
        self.clusters, self.cluster, self.jobs, self.detail, error = read
        if error:
            self.message = error

    def reload(self) -> None:
        self._newest.read(self.fetch, self.apply)

    async def refresh(self) -> None:
        await self._newest.read_in_worker(self.fetch, self.apply)

    def ask(self, action: str) -> None:
        """First step of an action: say what it will do; nothing happens before confirm."""
        if self.detail is None:
            self.message = "Choose a job in the table first."
            return
        if action == "clone" and not self.clone_name:
            self.message = "Type the clone's name first."
            return
        self.pending = action
        target = f"{self.detail.namespace}/{self.detail.name}"
        extra = f" {self.clone_name}" if action == "clone" else ""
        self.message = f"**{action}** {target}{extra}: {ACTIONS[action]}. Confirm or cancel."

    def cancel(self) -> None:
        self.pending, self.message = "", "Cancelled; nothing was done."

    def act(self, principal: Principal, cluster: str, action: str, name: str, namespace: str, clone: str) -> str:
        """Run a confirmed action (blocking: the verb's precheck reads the caches); answers the message."""
        try:
            if action == "clone":
                view, _ = self.service.clone_job(principal, cluster, name, JobClone(name=clone, namespace=namespace))
            else:
                verb = getattr(self.service, f"{action}_job")
                view, _ = verb(principal, cluster, name, JobTarget(namespace=namespace))
            return f"{action} started: {view.id} ({view.kind})"
        except ServiceError as exc:
            return f"refused ({exc.code}): {exc.message}"

    async def confirm(self) -> None:
        action, self.pending = self.pending, ""
        if not action or self.detail is None:
            return
        self.busy = True
        try:
            self.message = await asyncio.get_running_loop().run_in_executor(
                None, self.act, self._current_principal(), self.cluster, action, self.detail.name,
                self.detail.namespace, self.clone_name)
        finally:
            self.busy = False


class JobsPane(pn.viewable.Viewer):
    def __init__(self, jobs: Jobs, clusters: Clusters, bus: EventBus, principal: Principal,
                 current_principal: Callable[[], Principal] | None = None, **params: Any) -> None:
        super().__init__(**params)
        self.state = JobsState(jobs, clusters, principal, current_principal)
        self.picker = pn.widgets.Select(label="Cluster", options=[], width=240, css_classes=["jobs-cluster"])
        self.table = ReadOnlyTable(jobs_frame([]), selectable=1, sizing_mode="stretch_width",
                                   css_classes=["jobs-table"], empty="No training jobs: submit one (jobs_submit).")
        self.status = pn.pane.Markdown(status_markdown(None), css_classes=["job-status"])
        self.pods = ReadOnlyTable(pods_frame(None), sizing_mode="stretch_width", css_classes=["job-pods"],
                                  empty="No pods yet.")
        self.events = ReadOnlyTable(events_frame(None), sizing_mode="stretch_width", css_classes=["job-events"],
                                    empty="No events.")
        self.clone_name = pn.widgets.TextInput.from_param(self.state.param.clone_name, name="Clone as", width=240)
        allowed = principal.allows(Role.OPERATOR)
        self.buttons = {a: pn.widgets.Button(label=a.capitalize(), disabled=not allowed,
                                             color="danger" if a == "delete" else "default",
                                             css_classes=[f"job-action-{a}"]) for a in ACTIONS}
        for action, button in self.buttons.items():
            button.on_click(self._asker(action))
        self.confirm_button = pn.widgets.Button(label="Confirm", color="primary", visible=False,
                                                css_classes=["job-confirm"], loading=self.state.param.busy)
        self.cancel_button = pn.widgets.Button(label="Cancel", visible=False, css_classes=["job-cancel"])
        self.confirm_button.on_click(self._confirm)
        self.cancel_button.on_click(lambda _e: self.state.cancel())
        self.picker.param.watch(self._on_pick, "value")
        self.table.param.watch(self._on_selection, "selection")
        self.state.param.watch(self._on_jobs, "jobs")
        self.state.param.watch(self._on_detail, "detail")
        self.state.param.watch(self._on_clusters, ["clusters", "cluster"])
        self.state.param.watch(self._on_pending, "pending")
        self._kube = LiveRefresh(bus, "kube", self._on_kube)
        self._refresh()

    def _asker(self, action: str) -> Callable[[Any], None]:
        def ask(_event: Any) -> None:
            self.state.ask(action)
        return ask

    def _on_jobs(self, event: param.parameterized.Event) -> None:
        self.table.value = jobs_frame(event.new)
        keys = [f"{j.namespace}/{j.name}" for j in event.new]
        self.table.selection = [keys.index(self.state.job)] if self.state.job in keys else []

    def _on_detail(self, event: param.parameterized.Event) -> None:
        self.status.object = status_markdown(event.new)
        self.pods.value = pods_frame(event.new)
        self.events.value = events_frame(event.new)

    def _on_clusters(self, _event: param.parameterized.Event) -> None:
        self.picker.options = list(self.state.clusters)
        self.picker.value = self.state.cluster or None

    def _on_pick(self, event: param.parameterized.Event) -> None:
        if event.new and event.new != self.state.cluster:
            self.state.cluster, self.state.job = event.new, ""
            self._refresh()

    def _on_selection(self, event: param.parameterized.Event) -> None:
        jobs = self.state.jobs
        chosen = [f"{jobs[i].namespace}/{jobs[i].name}" for i in event.new if i < len(jobs)]
        if chosen and chosen[0] != self.state.job:
            self.state.job = chosen[0]
            self._refresh()

    def _on_pending(self, event: param.parameterized.Event) -> None:
        self.confirm_button.visible = self.cancel_button.visible = bool(event.new)

    def _on_kube(self, events: list[Event]) -> None:
        if any(e.data.get("cluster") == self.state.cluster and e.data.get("resource") in RESOURCES for e in events):
            self._refresh()

    def _refresh(self) -> None:
        if not self._kube.spawn(self.state.refresh):
            self.state.reload()

    async def _confirm(self, _event: Any) -> None:
        await self.state.confirm()

    def select(self, namespace: str, name: str) -> None:
        """Open a job's page (what a click on its row does; a notebook may call it)."""
        self.state.job = f"{namespace}/{name}"
        self._refresh()

    def __panel__(self) -> pn.viewable.Viewable:
        return pn.Column(
            pn.pane.Markdown("## Training jobs"),
            self.picker,
            self.table,
            self.status,
            pn.pane.Markdown("#### Pods"),
            self.pods,
            pn.pane.Markdown("#### Events"),
            self.events,
            pn.Row(self.buttons["suspend"], self.buttons["resume"], self.clone_name, self.buttons["clone"],
                   self.buttons["delete"]),
            pn.pane.Markdown(self.state.param.message, css_classes=["job-message"]),
            pn.Row(self.confirm_button, self.cancel_button),
            sizing_mode="stretch_width",
        )


class _FollowsAJob(Protocol):
    """A pane that follows one job through its state's ``cluster``, ``namespace`` and ``job`` (logs, charts)."""

    @property
    def state(self) -> param.Parameterized: ...

    def __panel__(self) -> pn.viewable.Viewable: ...


def job_views(jobs: JobsPane, *views: tuple[str, _FollowsAJob]) -> pn.viewable.Viewable:
    """The jobs page with the picked job's other views (its live logs, its live charts) in tabs below it; each
    follows the job picked in the table."""
    def follow(*_events: Any) -> None:
        namespace, _, name = jobs.state.job.partition("/")
        for _title, view in views:
            view.state.param.update(cluster=jobs.state.cluster, namespace=namespace or DEFAULT_NAMESPACE, job=name)
    jobs.state.param.watch(follow, ["cluster", "job"])
    return pn.Column(jobs, pn.Tabs(*[(title, view) for title, view in views], dynamic=True),
                     sizing_mode="stretch_width")
