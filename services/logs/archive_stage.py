"""``job.delete``'s first stage: the job's logs go to the shared bucket before its pods do.

A job without shared storage (no ``shared-s3`` volume and no ``shared_bucket`` setting) is deleted anyway: the
stage says its logs were not archived and why, rather than keep a user from deleting a job.
"""

from __future__ import annotations

from typing import Any, Protocol

from services.errors import NotFound
from services.logs.models import LogArchive
from services.stages import Done, Observed, Stage, StageContext


class JobRefLike(Protocol):
    cluster: str
    namespace: str
    name: str


class Archiver(Protocol):
    def archive_job_logs(self, cluster: str, namespace: str, job: str) -> LogArchive: ...


class ArchiveLogsStage(Stage[Any]):
    name = "archive-logs"
    expected_seconds = 5.0

    def __init__(self, logs: Archiver) -> None:
        self.logs = logs

    def observe(self, ctx: StageContext[Any]) -> Observed:
        return Observed.DONE if "archived" in ctx.data else Observed.ABSENT

    def act(self, ctx: StageContext[Any]) -> None:
        ref: JobRefLike = ctx.request
        try:
            made = self.logs.archive_job_logs(ref.cluster, ref.namespace, ref.name)
        except NotFound as exc:
            ctx.data["archived"] = {"files": 0, "skipped": exc.message}
            return
        ctx.data["archived"] = {"files": len(made.files), "bucket": made.bucket, "prefix": made.prefix}

    def poll(self, ctx: StageContext[Any]) -> Done:
        done = ctx.data.get("archived") or {}
        if done.get("skipped"):
            return Done(f"logs not archived: {done['skipped']}")
        return Done(f"{done.get('files', 0)} log files archived to s3://{done.get('bucket')}/{done.get('prefix')}")

    def result(self, ctx: StageContext[Any]) -> dict[str, Any]:
        return dict(ctx.data.get("archived") or {})
