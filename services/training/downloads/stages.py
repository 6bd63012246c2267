"""The ``model.download`` operation: namespace → download → cleanup.

``namespace`` gives the job namespace its service account and ``shared-s3`` claim; ``download`` creates the
Job once (its name is the download id) and waits for it, keeping the progress its pod's log shows; a Job that
fails ends the stage with the CLI's own last words (a 401 for a gated model, a usage error), after deleting the
token's Secret. ``cleanup`` deletes the Secret when the Job succeeded: whichever way a download ends, nothing
keeps the token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s

from services.clusters.create_base import FIELD_MANAGER
from services.clusters.storage_stage import S3_CLAIM
from services.errors import Conflict, NotFound, Permanent, ServiceError
from services.kube import KubeClients
from services.stages import Done, Observed, Stage, StageContext, Wait
from services.training.downloads import manifest
from services.training.downloads.models import DownloadPhase, DownloadPlan, Progress
from services.training.downloads.progress import parse

POLL = 5.0
LOG_TAIL = 2000  # lines of each container's log read for progress


@dataclass
class JobState:
    """What the cluster shows of one download now."""

    exists: bool
    phase: DownloadPhase = DownloadPhase.PENDING
    message: str = ""
    pods: list[str] = field(default_factory=list)
    progress: Progress = field(default_factory=Progress)


def _condition(job: Any, ctype: str) -> Any:
    return next((c for c in (job.status.conditions or []) if c.type == ctype and c.status == "True"), None) \
        if job.status is not None else None


def job_state(kube: KubeClients, cluster: str, namespace: str, download_id: str) -> JobState:
    """The Job's phase and message, its pods (newest last) and the newest pod's progress."""
    api = kube.api_client(cluster)
    try:
        job: Any = k8s.BatchV1Api(api).read_namespaced_job(download_id, namespace)
    except NotFound:
        return JobState(exists=False)
    core = k8s.CoreV1Api(api)
    listed: list[Any] = core.list_namespaced_pod(namespace,
                                                 label_selector=f"{manifest.DOWNLOAD_LABEL}={download_id}").items
    pods = sorted(listed, key=lambda p: (str(p.metadata.creation_timestamp or ""), p.metadata.name))
    state = JobState(exists=True, pods=[str(p.metadata.name) for p in pods])
    if pods:
        state.progress = parse(_log(core, pods[-1], manifest.DOWNLOAD_CONTAINER),
                               _log(core, pods[-1], manifest.PUBLISH_CONTAINER))
    failed, complete = _condition(job, "Failed"), _condition(job, "Complete")
    if complete is not None:
        state.phase, state.message = DownloadPhase.SUCCEEDED, "downloaded"
    elif failed is not None:
        state.phase = DownloadPhase.FAILED
        state.message = f"{failed.reason}: {failed.message}" if failed.reason else str(failed.message or "failed")
        said = [line for line in (state.progress.error, state.progress.last_line) if line]
        if said:
            state.message += "; the download's log says: " + " … ".join(dict.fromkeys(said))
    elif pods and (pods[-1].status.phase if pods[-1].status else "Pending") == "Pending":
        scheduled = next((c for c in (pods[-1].status.conditions or []) if c.type == "PodScheduled"), None) \
            if pods[-1].status else None
        state.message = f"its pod waits: {scheduled.message}" if scheduled is not None and scheduled.message \
            else "its pod is starting"
    elif job.status is not None and (job.status.active or 0) > 0:
        state.phase = DownloadPhase.RUNNING
        state.message = describe(state.progress)
    return state


def _log(core: k8s.CoreV1Api, pod: Any, container: str) -> list[str]:
    if (pod.status.phase if pod.status else "Pending") == "Pending":
        return []
    try:
        text = core.read_namespaced_pod_log(pod.metadata.name, pod.metadata.namespace, container=container,
                                            tail_lines=LOG_TAIL)
    except ServiceError:  # not started yet, or gone meanwhile: no lines
        return []
    return str(text or "").splitlines()


def describe(progress: Progress) -> str:
    if progress.files_total is None:
        return "starting (listing the model's files)"
    text = f"{progress.files_done}/{progress.files_total} files, {progress.bytes_done:,} bytes"
    if progress.copied:
        text += f"; {progress.copied} copied to the bucket"
    return text + (f"; fetching {progress.current_file}" if progress.current_file else "")


@dataclass(frozen=True)
class DownloadDeps:
    kube: KubeClients


class DownloadStage(Stage[DownloadPlan]):
    def __init__(self, deps: DownloadDeps) -> None:
        self.deps = deps


class NamespaceStage(DownloadStage):
    """The job namespace's service account and ``shared-s3`` claim (:func:`manifest.ensure_job_namespace`)."""

    name = "namespace"
    expected_seconds = 5.0

    def observe(self, ctx: StageContext[DownloadPlan]) -> Observed:
        core = k8s.CoreV1Api(self.deps.kube.api_client(ctx.request.cluster))
        try:
            core.read_namespaced_service_account(manifest.SERVICE_ACCOUNT, ctx.request.namespace)
            core.read_namespaced_persistent_volume_claim(S3_CLAIM, ctx.request.namespace)
        except NotFound:
            return Observed.ABSENT
        return Observed.DONE

    def act(self, ctx: StageContext[DownloadPlan]) -> None:
        ctx.data["volume"] = manifest.ensure_job_namespace(self.deps.kube, ctx.request.cluster, ctx.request.namespace)

    def result(self, ctx: StageContext[DownloadPlan]) -> dict[str, Any]:
        return {"namespace": ctx.request.namespace, "service_account": manifest.SERVICE_ACCOUNT,
                "claim": f"{ctx.request.namespace}/{S3_CLAIM}"}


class JobStage(DownloadStage):
    """Create the download Job once, then wait for it to end."""

    name = "download"
    expected_seconds = 600.0  # a 7B model in bf16 (about 15 GB) at 25 MB/s; larger models take longer
    deadline = 24 * 3600.0

    def observe(self, ctx: StageContext[DownloadPlan]) -> Observed:
        try:
            k8s.BatchV1Api(self.deps.kube.api_client(ctx.request.cluster)).read_namespaced_job(
                ctx.request.id, ctx.request.namespace)
        except NotFound:
            if ctx.data.get("created"):
                raise Permanent(f"the download Job {ctx.request.namespace}/{ctx.request.id} was deleted before it "
                                "ended (cancelled?)") from None
            return Observed.ABSENT
        return Observed.IN_PROGRESS

    def act(self, ctx: StageContext[DownloadPlan]) -> None:
        plan = ctx.request
        body: Any = manifest.job_manifest(plan)
        batch = k8s.BatchV1Api(self.deps.kube.api_client(plan.cluster))
        try:
            job: Any = batch.create_namespaced_job(plan.namespace, body, field_manager=FIELD_MANAGER)
        except Conflict:  # made by this stage before a crash lost the record of it
            job = batch.read_namespaced_job(plan.id, plan.namespace)
        ctx.data["created"] = True
        if plan.token is not None:  # the Job owns its token: whoever deletes the Job deletes the Secret too
            manifest.own_token(self.deps.kube, plan.token, plan.id, str(job.metadata.uid))

    def poll(self, ctx: StageContext[DownloadPlan]) -> Done | Wait:
        plan = ctx.request
        state = job_state(self.deps.kube, plan.cluster, plan.namespace, plan.id)
        ctx.data["progress"] = state.progress.model_dump()
        ctx.data["pods"] = state.pods
        if not state.exists:
            raise Permanent(f"the download Job {plan.namespace}/{plan.id} was deleted before it ended (cancelled?)")
        if state.phase is DownloadPhase.SUCCEEDED:
            return Done(f"{plan.model} is in s3://{plan.bucket}/{plan.key_prefix} ({describe(state.progress)})")
        if state.phase is DownloadPhase.FAILED:
            if plan.token is not None:
                manifest.delete_token(self.deps.kube, plan.token)  # nothing keeps the token, even on failure
            raise Permanent(f"downloading {plan.model} failed: {state.message}",
                            details={"job": plan.id, "pods": state.pods})
        return Wait(POLL, f"{plan.model}: {describe(state.progress)}")

    def result(self, ctx: StageContext[DownloadPlan]) -> dict[str, Any]:
        plan = ctx.request
        return {"job": plan.id, "destination": manifest.destination(plan.model),
                "s3_uri": f"s3://{plan.bucket}/{plan.key_prefix}", "progress": ctx.data.get("progress") or {},
                "pods": ctx.data.get("pods") or []}


class CleanupStage(DownloadStage):
    """Delete the token's Secret (the Job no longer needs it)."""

    name = "cleanup"
    expected_seconds = 1.0

    def observe(self, ctx: StageContext[DownloadPlan]) -> Observed:
        ref = ctx.request.token
        if ref is None:
            return Observed.DONE
        try:
            k8s.CoreV1Api(self.deps.kube.api_client(ref.cluster)).read_namespaced_secret(ref.name, ref.namespace)
        except NotFound:
            return Observed.DONE
        return Observed.ABSENT

    def act(self, ctx: StageContext[DownloadPlan]) -> None:
        if ctx.request.token is not None:
            manifest.delete_token(self.deps.kube, ctx.request.token)

    def result(self, ctx: StageContext[DownloadPlan]) -> dict[str, Any]:
        return {"token_secret_deleted": ctx.request.token is not None}
