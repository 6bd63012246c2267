"""The job operation kinds: ``job.submit`` (namespace, service account and shared storage of the job's
namespace; optional stages the composition root adds, e.g. the MLflow run; the custom resource, created
once; then the operator's start), ``job.suspend``, ``job.resume`` and ``job.delete`` (optional stages first,
e.g. archiving the logs; then the custom resource, whose pods go with it by owner references).

Every stage observes first (a GET by the job's deterministic name), acts once, and polls. The custom resource
is only ever created with our labels, and never deleted or patched unless it carries them and the uid the
operation saw when it was submitted (a job deleted and recreated under the same name meanwhile is not ours
to touch).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s

from services.clusters.create_base import FIELD_MANAGER
from services.clusters.storage_stage import APPLY, MANAGED_LABEL, S3_CLAIM, namespace_volume, volume_name
from services.clusters.storage_stage import NAMESPACE as STORAGE_NAMESPACE
from services.errors import Conflict, NotFound, Permanent
from services.informers import Informers
from services.kube import KubeClients
from services.stages import Done, Observed, OperationKind, Stage, StageContext, Wait
from services.training.jobs_kinds import (
    JOB_LABEL,
    KINDS,
    JobKind,
    failure_reason,
    inject_env,
    phase,
    suspend_patch,
    suspended,
)
from services.training.jobs_models import SERVICE_ACCOUNT, JobPlan, JobRef

SUBMIT_KIND, SUSPEND_KIND, RESUME_KIND, DELETE_KIND = "job.submit", "job.suspend", "job.resume", "job.delete"
POLL = 10.0


def job_target(cluster: str, name: str) -> str:
    return f"cluster/{cluster}/job/{name}"


@dataclass(frozen=True)
class JobDeps:
    kube: KubeClients
    informers: Informers


def custom(deps: JobDeps, cluster: str) -> k8s.CustomObjectsApi:
    return k8s.CustomObjectsApi(deps.kube.api_client(cluster))


def read_job(deps: JobDeps, cluster: str, kind: JobKind, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        found: Any = custom(deps, cluster).get_namespaced_custom_object(kind.group, kind.version, namespace,
                                                                        kind.plural, name)
        return dict(found)
    except NotFound:
        return None


def config_map_owners(core: k8s.CoreV1Api, namespace: str, name: str) -> list[dict[str, Any]] | None:
    """The owner references of ConfigMap ``namespace/name``; None when there is no such ConfigMap."""
    try:
        raw: Any = core.read_namespaced_config_map(name, namespace, _preload_content=False)
    except NotFound:
        return None
    return list(json.loads(raw.data)["metadata"].get("ownerReferences") or [])


def is_ours(obj: dict[str, Any], name: str) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in MANAGED_LABEL.items()) and labels.get(JOB_LABEL) == name


# ----- job.submit ------------------------------------------------------------------------------------------


class NamespaceStage(Stage[JobPlan]):
    """The job's namespace, the service account its pods run as and the ``shared-s3`` claim, applied
    (server-side, our field manager) when any is missing. Without the cluster's shared volume in ``default``
    there is nothing to share: the claim is left out and the stage says so."""

    name = "namespace"
    expected_seconds = 5.0

    def __init__(self, deps: JobDeps) -> None:
        self.deps = deps

    def _core(self, plan: JobPlan) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.deps.kube.api_client(plan.cluster))

    def _missing(self, plan: JobPlan) -> list[str]:
        core, ns = self._core(plan), plan.namespace
        checks: list[tuple[str, Callable[[], Any]]] = [
            ("namespace", lambda: core.read_namespace(ns)),
            ("serviceaccount", lambda: core.read_namespaced_service_account(SERVICE_ACCOUNT, ns)),
            ("claim", lambda: core.read_namespaced_persistent_volume_claim(S3_CLAIM, ns))]
        missing = []
        for what, read in checks:
            try:
                read()
            except NotFound:
                missing.append(what)
        return missing

    def observe(self, ctx: StageContext[JobPlan]) -> Observed:
        missing = self._missing(ctx.request)
        if "claim" in missing and self._default_volume(ctx.request) is None:
            missing.remove("claim")  # nothing to share: see act
            ctx.data["shared_storage"] = False
        return Observed.ABSENT if missing else Observed.DONE

    def _default_volume(self, plan: JobPlan) -> dict[str, Any] | None:
        try:
            pv: Any = self._core(plan).read_persistent_volume(volume_name(plan.cluster, S3_CLAIM),
                                                              _preload_content=False)
        except NotFound:
            return None
        found: dict[str, Any] = json.loads(pv.data)
        return found

    def act(self, ctx: StageContext[JobPlan]) -> None:
        plan, core = ctx.request, self._core(ctx.request)
        labels = {**MANAGED_LABEL}
        core.patch_namespace(plan.namespace, {"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": plan.namespace, "labels": labels}}, field_manager=FIELD_MANAGER, _content_type=APPLY)
        core.patch_namespaced_service_account(SERVICE_ACCOUNT, plan.namespace, {
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": SERVICE_ACCOUNT, "namespace": plan.namespace, "labels": labels}},
            field_manager=FIELD_MANAGER, _content_type=APPLY)
        default_pv = self._default_volume(plan)
        ctx.data["shared_storage"] = default_pv is not None
        if default_pv is None:
            return
        pv, pvc = namespace_volume(default_pv, plan.cluster, plan.namespace)
        core.patch_persistent_volume(pv["metadata"]["name"], pv, field_manager=FIELD_MANAGER, force=True,
                                     _content_type=APPLY)
        core.patch_namespaced_persistent_volume_claim(S3_CLAIM, plan.namespace, pvc, field_manager=FIELD_MANAGER,
                                                      force=True, _content_type=APPLY)

    def poll(self, ctx: StageContext[JobPlan]) -> Done:
        if ctx.data.get("shared_storage") is False:
            return Done(f"namespace {ctx.request.namespace} and service account {SERVICE_ACCOUNT} ready; no shared "
                        f"storage: the cluster has no {S3_CLAIM} volume in {STORAGE_NAMESPACE}")
        return Done(f"namespace {ctx.request.namespace}, service account {SERVICE_ACCOUNT} and claim {S3_CLAIM} ready")

    def result(self, ctx: StageContext[JobPlan]) -> dict[str, Any]:
        return {"namespace": ctx.request.namespace, "service_account": SERVICE_ACCOUNT,
                "shared_storage": ctx.data.get("shared_storage", True)}


def injected_env(ctx: StageContext[JobPlan]) -> dict[str, str]:
    """The env that earlier stages (the MLflow run's, wired by the composition root) put in their result's
    ``env``, merged in stage order."""
    env: dict[str, str] = {}
    for result in ctx.results.values():
        env.update({str(k): str(v) for k, v in (result.get("env") or {}).items()})
    return env


class CreateStage(Stage[JobPlan]):
    """The custom resource, created once under its deterministic name, with the env earlier stages provided."""

    name = "create"
    expected_seconds = 2.0

    def __init__(self, deps: JobDeps) -> None:
        self.deps = deps

    def observe(self, ctx: StageContext[JobPlan]) -> Observed:
        plan = ctx.request
        found = read_job(self.deps, plan.cluster, KINDS[plan.kind], plan.namespace, plan.name)
        if found is None:
            return Observed.ABSENT
        if not is_ours(found, plan.name):
            raise Permanent(f"a {plan.kind} named {plan.name} already exists in {plan.namespace} and is not "
                            "InstantStart's: choose another name", details={"kind": plan.kind})
        ctx.data["uid"] = found["metadata"].get("uid")
        return Observed.DONE

    def act(self, ctx: StageContext[JobPlan]) -> None:
        plan = ctx.request
        kind = KINDS[plan.kind]
        env = injected_env(ctx)
        body = inject_env(kind, plan.manifest, env)
        try:
            made: Any = custom(self.deps, plan.cluster).create_namespaced_custom_object(
                kind.group, kind.version, plan.namespace, kind.plural, body, field_manager=FIELD_MANAGER)
        except Conflict:  # made by an earlier attempt whose answer was lost: observe again
            made = read_job(self.deps, plan.cluster, kind, plan.namespace, plan.name) or {}
            if not is_ours(made, plan.name):
                raise
        ctx.data["uid"] = (made.get("metadata") or {}).get("uid")
        ctx.data["env"] = sorted(env)

    def result(self, ctx: StageContext[JobPlan]) -> dict[str, Any]:
        plan = ctx.request
        return {"kind": plan.kind, "name": plan.name, "namespace": plan.namespace, "uid": ctx.data.get("uid"),
                "env_injected": ctx.data.get("env") or []}


class CompanionsStage(Stage[JobPlan]):
    """The ConfigMaps a rendered job reads (LLaMA-Factory's training YAML), made after the custom resource and
    owned by it, so the garbage collector deletes them with the job. Pods that start first wait for their
    volume, as the kubelet retries a missing ConfigMap."""

    name = "companions"
    expected_seconds = 2.0

    def __init__(self, deps: JobDeps) -> None:
        self.deps = deps

    def _missing(self, plan: JobPlan, uid: str) -> list[dict[str, Any]]:
        """The companions not made yet; one of that name that the job (``uid``) does not own fails the stage: the
        precheck refused it, so someone made it since, and the pods must not read it as the job's own."""
        core = k8s.CoreV1Api(self.deps.kube.api_client(plan.cluster))
        return [obj for obj in plan.companions if self._owned(core, plan, obj["metadata"]["name"], uid) is None]

    @staticmethod
    def _owned(core: k8s.CoreV1Api, plan: JobPlan, name: str, uid: str) -> bool | None:
        """True when the job owns ConfigMap ``name``, None when there is none; Permanent when someone else's."""
        owners = config_map_owners(core, plan.namespace, name)
        if owners is None:
            return None
        if not any(o.get("uid") == uid for o in owners):
            raise Permanent(f"ConfigMap {plan.namespace}/{name} exists and is not job {plan.name}'s: delete it, "
                            "then retry", details={"config_map": name})
        return True

    def _uid(self, plan: JobPlan) -> str:
        job = read_job(self.deps, plan.cluster, KINDS[plan.kind], plan.namespace, plan.name)
        if job is None:
            raise Permanent(f"{plan.kind} {plan.namespace}/{plan.name} is gone (deleted by someone else?)")
        return str(job["metadata"]["uid"])

    def observe(self, ctx: StageContext[JobPlan]) -> Observed:
        if not ctx.request.companions:
            return Observed.DONE
        return Observed.ABSENT if self._missing(ctx.request, self._uid(ctx.request)) else Observed.DONE

    def act(self, ctx: StageContext[JobPlan]) -> None:
        plan = ctx.request
        kind = KINDS[plan.kind]
        uid = self._uid(plan)
        owner = {"apiVersion": kind.api_version, "kind": kind.kind, "name": plan.name,
                 "uid": uid, "controller": False, "blockOwnerDeletion": True}
        core = k8s.CoreV1Api(self.deps.kube.api_client(plan.cluster))
        for obj in self._missing(plan, uid):
            body = {**obj, "metadata": {**obj["metadata"], "namespace": plan.namespace, "ownerReferences": [owner]}}
            try:
                core.create_namespaced_config_map(plan.namespace, body,  # type: ignore[arg-type]
                                                  field_manager=FIELD_MANAGER)
            except Conflict:  # made by an earlier attempt whose answer was lost, or by someone else just now
                self._owned(core, plan, obj["metadata"]["name"], uid)

    def poll(self, ctx: StageContext[JobPlan]) -> Done:
        plan = ctx.request
        if plan.companions and self._missing(plan, self._uid(plan)):
            raise Permanent(f"a ConfigMap of job {plan.name} was deleted while it was made: retry")
        names = [o["metadata"]["name"] for o in plan.companions]
        return Done(f"config maps {', '.join(names)} ready" if names else "no config maps to make")


class StartedStage(Stage[JobPlan]):
    """Waits until the operator reports the job started (Running, or already finished or suspended); a job
    that fails before it runs fails the operation with the operator's reason."""

    name = "started"
    expected_seconds = 60.0

    def __init__(self, deps: JobDeps) -> None:
        self.deps = deps

    def observe(self, ctx: StageContext[JobPlan]) -> Observed:
        return Observed.IN_PROGRESS

    def poll(self, ctx: StageContext[JobPlan]) -> Done | Wait:
        plan = ctx.request
        kind = KINDS[plan.kind]
        obj = read_job(self.deps, plan.cluster, kind, plan.namespace, plan.name)
        if obj is None:
            raise Permanent(f"{plan.kind} {plan.namespace}/{plan.name} is gone (deleted by someone else?)")
        now = phase(kind, obj)
        ctx.data["phase"] = now
        if now == "Failed":
            raise Permanent(f"{plan.kind} {plan.name} failed: {failure_reason(kind, obj)}",
                            details={"phase": now, "reason": failure_reason(kind, obj)})
        if now in ("Running", "Succeeded", "Suspended", "Restarting"):
            return Done(f"{plan.kind} {plan.name} is {now}")
        status = obj.get("status") or {}
        waiting = "no status from the operator yet" if not status else f"the operator reports {now}"
        return Wait(POLL, f"{waiting}; {pending_pods(self.deps, plan.cluster, plan.namespace, plan.name)}")

    def result(self, ctx: StageContext[JobPlan]) -> dict[str, Any]:
        return {"phase": ctx.data.get("phase")}


def pending_pods(deps: JobDeps, cluster: str, namespace: str, name: str) -> str:
    pods = [p for p in deps.informers.get(cluster, "pods").items() if p["metadata"].get("namespace") == namespace
            and (p["metadata"].get("labels") or {}).get(JOB_LABEL) == name]
    if not pods:
        return "no pods yet"
    phases: dict[str, int] = {}
    for p in pods:
        phases[str(p["status"].get("phase"))] = phases.get(str(p["status"].get("phase")), 0) + 1
    return "pods: " + ", ".join(f"{v} {k}" for k, v in sorted(phases.items()))


# ----- job.suspend / job.resume / job.delete ----------------------------------------------------------------


class RefStage(Stage[JobRef]):
    def __init__(self, deps: JobDeps) -> None:
        self.deps = deps

    def current(self, ref: JobRef) -> dict[str, Any] | None:
        """The job if it is still the one the operation was submitted for (ours, same uid), else None."""
        obj = read_job(self.deps, ref.cluster, KINDS[ref.kind], ref.namespace, ref.name)
        if obj is None or not is_ours(obj, ref.name):
            return None
        if ref.uid and (obj.get("metadata") or {}).get("uid") != ref.uid:
            return None
        return obj


class SuspendStage(RefStage):
    """Sets the kind's suspend flag (``runPolicy.suspend``, a RayJob's ``spec.suspend``), then waits for the
    operator: suspended once no pod of the job runs, resumed once the job is no longer Suspended."""

    def __init__(self, deps: JobDeps, suspend: bool) -> None:
        super().__init__(deps)
        self.suspend = suspend
        self.name = "suspend" if suspend else "resume"

    def _obj(self, ref: JobRef) -> dict[str, Any]:
        obj = self.current(ref)
        if obj is None:
            raise Permanent(f"{ref.kind} {ref.namespace}/{ref.name} is gone (or was replaced by another of that name)")
        return obj

    def observe(self, ctx: StageContext[JobRef]) -> Observed:
        obj = self._obj(ctx.request)
        return Observed.IN_PROGRESS if suspended(KINDS[ctx.request.kind], obj) == self.suspend else Observed.ABSENT

    def act(self, ctx: StageContext[JobRef]) -> None:
        ref = ctx.request
        kind = KINDS[ref.kind]
        custom(self.deps, ref.cluster).patch_namespaced_custom_object(
            kind.group, kind.version, ref.namespace, kind.plural, ref.name, suspend_patch(kind, self.suspend))

    def poll(self, ctx: StageContext[JobRef]) -> Done | Wait:
        ref = ctx.request
        kind = KINDS[ref.kind]
        obj = self._obj(ref)
        now = phase(kind, obj)
        ctx.data["phase"] = now
        if self.suspend:
            running = [p for p in self.deps.informers.get(ref.cluster, "pods").items()
                       if p["metadata"].get("namespace") == ref.namespace
                       and (p["metadata"].get("labels") or {}).get(JOB_LABEL) == ref.name
                       and p["status"].get("phase") in ("Running", "Pending")]
            if running and now != "Suspended":
                return Wait(2.0, f"suspend set; waiting for the operator to stop {len(running)} pod(s) (job {now})")
            return Done(f"{ref.name} suspended (job {now})")
        if now == "Suspended":
            return Wait(2.0, "resume set; waiting for the operator to start the job again")
        return Done(f"{ref.name} resumed (job {now})")

    def result(self, ctx: StageContext[JobRef]) -> dict[str, Any]:
        return {"phase": ctx.data.get("phase")}


class DeleteStage(RefStage):
    """Deletes the custom resource (only ours, only the uid the operation saw); its pods go with it by owner
    references. Done once the API no longer has it."""

    name = "delete"
    expected_seconds = 10.0

    def observe(self, ctx: StageContext[JobRef]) -> Observed:
        return Observed.ABSENT if self.current(ctx.request) is not None else Observed.DONE

    def act(self, ctx: StageContext[JobRef]) -> None:
        ref = ctx.request
        kind = KINDS[ref.kind]
        preconditions = k8s.V1Preconditions(uid=ref.uid) if ref.uid else None
        try:
            custom(self.deps, ref.cluster).delete_namespaced_custom_object(
                kind.group, kind.version, ref.namespace, kind.plural, ref.name, propagation_policy="Background",
                body=k8s.V1DeleteOptions(preconditions=preconditions, propagation_policy="Background"))
        except NotFound:
            return

    def poll(self, ctx: StageContext[JobRef]) -> Done | Wait:
        if self.current(ctx.request) is not None:
            return Wait(2.0, f"waiting for {ctx.request.name} to be gone")
        return Done(f"{ctx.request.kind} {ctx.request.namespace}/{ctx.request.name} deleted")


def job_kinds(deps: JobDeps, precheck: Callable[[JobPlan], None], submit_extra: Sequence[Stage[JobPlan]] = (),
              delete_extra: Sequence[Stage[JobRef]] = ()) -> list[OperationKind[Any]]:
    """The four kinds. ``submit_extra`` run after the namespace and before the create (the MLflow run: a
    result ``env`` is injected into the main containers); ``delete_extra`` before the delete (the logs'
    archive)."""
    def ref_target(ref: JobRef) -> str:
        return job_target(ref.cluster, ref.name)

    return [
        OperationKind(SUBMIT_KIND, JobPlan, (NamespaceStage(deps), *submit_extra, CreateStage(deps),
                                             CompanionsStage(deps), StartedStage(deps)),
                      target=lambda p: job_target(p.cluster, p.name), precheck=precheck,
                      description="submit a training job: its namespace, service account and shared storage, "
                                  "the custom resource, then wait until the operator starts it"),
        OperationKind(SUSPEND_KIND, JobRef, (SuspendStage(deps, True),), target=ref_target,
                      description="suspend a training job (its pods stop; resume starts them again)"),
        OperationKind(RESUME_KIND, JobRef, (SuspendStage(deps, False),), target=ref_target,
                      description="resume a suspended training job"),
        OperationKind(DELETE_KIND, JobRef, (*delete_extra, DeleteStage(deps)), target=ref_target,
                      description="delete a training job (its pods go with it)"),
    ]
