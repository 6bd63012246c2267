"""The ``downloads`` noun: Hugging Face models downloaded to the cluster's shared bucket as Kubernetes Jobs.

``download_model`` prechecks synchronously — the cluster is registered, it has shared S3 storage, no download
of the same model is running (an operation here, or a Job in the cluster) — then, when a token is given, puts
it in a Secret in the job namespace (the only value of the request that is never stored: the operation holds a
reference) and submits ``model.download`` on ``cluster/<c>/download/<model>``. Reads join each operation with
what its Job and pod show now (phase, progress from the log). ``cancel_download`` stops the operation and
deletes the Job (its pods go with it) and the token's Secret.
"""

from __future__ import annotations

import contextlib
from typing import Any

from kubernetes import client as k8s

from services.audit import AuditLog
from services.auth import Principal, Role
from services.clusters.pipeline import cluster_target
from services.clusters.registry import ClusterRegistry
from services.errors import Conflict, NotFound
from services.kube import KubeClients
from services.operations import Engine, OperationKind, OperationQuery, OperationView, Status
from services.training.downloads import manifest
from services.training.downloads.models import (
    DownloadList,
    DownloadPhase,
    DownloadPlan,
    DownloadRequest,
    DownloadView,
    Progress,
)
from services.training.downloads.stages import (
    CleanupStage,
    DownloadDeps,
    JobStage,
    JobState,
    NamespaceStage,
    describe,
    job_state,
)
from services.verbs import verb

__all__ = ["KIND", "Downloads", "download_target"]
KIND = "model.download"
LISTED = 100  # downloads a list shows (newest first)
_ENDED = {Status.SUCCEEDED: DownloadPhase.SUCCEEDED, Status.FAILED: DownloadPhase.FAILED,
          Status.CANCELLED: DownloadPhase.CANCELLED}


def download_target(cluster: str, model: str) -> str:
    """One model locks itself in a cluster: a second download of it conflicts while the first runs."""
    return f"{cluster_target(cluster)}/download/{manifest.model_label(model)}"


class Downloads:
    """Verbs of the downloads noun (the service object the composition root builds once)."""

    noun = "downloads"

    def __init__(self, registry: ClusterRegistry, kube: KubeClients, engine: Engine, audit: AuditLog) -> None:
        self.registry = registry
        self.kube = kube
        self._engine = engine
        self.audit = audit
        self.deps = DownloadDeps(kube=kube)

    def kinds(self) -> list[OperationKind[Any]]:
        d = self.deps
        return [OperationKind(KIND, DownloadPlan, (NamespaceStage(d), JobStage(d), CleanupStage(d)),
                              target=lambda p: download_target(p.cluster, p.model), role=Role.OPERATOR,
                              description="download a Hugging Face model to the shared bucket as a Kubernetes Job",
                              on_cancel=self._stop)]

    # ----- mutations ---------------------------------------------------------------------------------

    @verb(Role.OPERATOR)
    def download_model(self, principal: Principal, cluster: str, request: DownloadRequest,
                       idempotency_key: str | None = None) -> tuple[OperationView, bool]:
        """Start downloading a model onto the shared bucket (``/s3/models/<org>--<name>`` in pods)."""
        self.registry.get(cluster)

        def same(stored: dict[str, Any]) -> bool:
            return all(stored.get(k) == v for k, v in request.model_dump(mode="json", exclude={"hf_token"}).items()) \
                and stored.get("cluster") == cluster
        replay = self._engine.replayed(KIND, principal, idempotency_key, same)
        if replay is not None:
            return replay, False
        self._refuse_running(cluster, request.model)
        storage = manifest.shared_storage(self.kube, cluster)
        download_id = manifest.new_id(request.model)
        token = request.hf_token.get_secret_value() if request.hf_token is not None else ""
        ref = None
        if token:
            manifest.ensure_namespace(self.kube, cluster, request.namespace)
            ref = manifest.stash_token(self.kube, cluster, request.namespace, download_id, token)
        plan = DownloadPlan(cluster=cluster, id=download_id, model=request.model, revision=request.revision,
                            namespace=request.namespace, include=request.include, exclude=request.exclude,
                            token=ref, bucket=storage.bucket,
                            key_prefix=f"{storage.prefix}models/{manifest.folder(request.model)}/",
                            requested_by=principal.name)
        try:
            return self._engine.submit(KIND, plan, principal, idempotency_key)
        except BaseException:
            if ref is not None:  # refused after all: the token does not stay behind
                manifest.delete_token(self.kube, ref)
            raise

    def _refuse_running(self, cluster: str, model: str) -> None:
        """409 while a download of ``model`` runs: an operation here, or a Job of ours in the cluster."""
        target = download_target(cluster, model)
        active = self._engine.list(OperationQuery(kind=KIND, target=target, active=True, limit=1))
        if active:
            raise Conflict(f"{model} is already being downloaded in {cluster} (operation {active[0].id}); follow "
                           "it, or cancel it first", details={"operation_id": active[0].id})
        jobs: list[Any] = k8s.BatchV1Api(self.kube.api_client(cluster)).list_job_for_all_namespaces(
            label_selector=f"{manifest.MODEL_LABEL}={manifest.model_label(model)},"
                           "app.kubernetes.io/managed-by=instantstart").items
        running = [j for j in jobs if not any(c.status == "True" and c.type in ("Complete", "Failed")
                                              for c in (j.status.conditions if j.status else None) or [])]
        if running:
            job = running[0].metadata
            raise Conflict(f"{model} is already being downloaded in {cluster} by Job {job.namespace}/{job.name}",
                           details={"job": job.name, "namespace": job.namespace})

    @verb(Role.OPERATOR)
    def cancel_download(self, principal: Principal, cluster: str, download_id: str) -> DownloadView:
        """Stop a running download: its operation is cancelled, its Job (and pod) and token Secret deleted.
        The files already copied stay in the bucket."""
        op = self._operation(cluster, download_id)
        if op.status.terminal and op.status is not Status.CANCELLED:  # cancelling again stops its Job again
            raise Conflict(f"download {download_id} already ended ({op.status.value})",
                           details={"operation_id": op.id})
        self._engine.cancel(op.id, principal)  # the kind's on_cancel stops the Job
        self.audit.record(principal, "model.download.cancel", op.target, {"id": download_id}, "accepted", op.id)
        return self._view(self._engine.get(op.id))

    def _stop(self, plan: DownloadPlan) -> None:
        """A cancelled download, whichever face cancelled it (downloads_cancel or operations_cancel): its Job
        (and pod) and its token Secret are deleted; the files already copied stay."""
        with contextlib.suppress(NotFound):
            k8s.BatchV1Api(self.kube.api_client(plan.cluster)).delete_namespaced_job(
                plan.id, plan.namespace, propagation_policy="Background")
        if plan.token is not None:
            manifest.delete_token(self.kube, plan.token)

    # ----- reads -------------------------------------------------------------------------------------

    @verb(Role.VIEWER)
    def list_downloads(self, principal: Principal, cluster: str) -> DownloadList:
        """The cluster's downloads, newest first, with live progress for those still running."""
        self.registry.get(cluster)
        ops = self._engine.list(OperationQuery(kind=KIND, cluster=cluster, limit=LISTED))
        return DownloadList(cluster=cluster, downloads=[self._view(op) for op in ops])

    @verb(Role.VIEWER)
    def describe_download(self, principal: Principal, cluster: str, download_id: str) -> DownloadView:
        """One download: phase, progress (files, bytes), pods, where the files are."""
        return self._view(self._operation(cluster, download_id), live=True)

    def _operation(self, cluster: str, download_id: str) -> OperationView:
        self.registry.get(cluster)
        for op in self._engine.list(OperationQuery(kind=KIND, cluster=cluster, limit=500)):
            if op.request.get("id") == download_id:
                return op
        raise NotFound(f"no download {download_id!r} in {cluster}; downloads_list lists them")

    def _view(self, op: OperationView, *, live: bool = False) -> DownloadView:
        plan = DownloadPlan.model_validate(op.request)
        stage = next((s for s in op.stages if s.name == JobStage.name), None)
        done = (stage.result or {}) if stage is not None else {}
        state = JobState(exists=False)
        if live or not op.status.terminal:
            state = job_state(self.kube, plan.cluster, plan.namespace, plan.id)
        progress = state.progress if state.exists else Progress.model_validate(done.get("progress") or {})
        phase = _ENDED.get(op.status) or (state.phase if state.exists else DownloadPhase.PENDING)
        if op.status is Status.FAILED:
            message = str((op.error or {}).get("message", "failed"))
        elif op.status is Status.CANCELLED:
            message = "cancelled"
        elif op.status is Status.SUCCEEDED:
            message = f"downloaded: {describe(progress)}"
        else:
            message = state.message or (stage.message if stage is not None else "") or "waiting to start"
        return DownloadView(id=plan.id, cluster=plan.cluster, model=plan.model, revision=plan.revision,
                            namespace=plan.namespace, phase=phase, message=message, operation_id=op.id,
                            destination=manifest.destination(plan.model),
                            s3_uri=f"s3://{plan.bucket}/{plan.key_prefix}", job=plan.id,
                            pods=state.pods or list(done.get("pods") or []), progress=progress,
                            token_used=plan.token is not None, created_at=op.created_at, updated_at=op.updated_at)
