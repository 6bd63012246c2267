"""Request and response models of job logs (REST query strings, the WebSocket's query, MCP tool schemas)."""

from __future__ import annotations

from pydantic import Field

from services.models import TRAINING_NAMESPACE, RequestModel, ResponseModel

DEFAULT_NAMESPACE = TRAINING_NAMESPACE
TEXT_MAX_LINES = 2_000
TEXT_MAX_BYTES = 256 * 1024
NAMESPACE_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class LogSelect(RequestModel):
    namespace: str = Field(DEFAULT_NAMESPACE, max_length=63, pattern=NAMESPACE_PATTERN,
                           description="the job's namespace (default hyperpod-ns-training)")
    pod: str | None = Field(None, max_length=253, description="only this pod of the job (default: all its pods)")
    container: str | None = Field(None, max_length=63,
                                  description="only this container (pytorch, ray-head, ray-worker ...)")
    rank: int | None = Field(None, ge=0, le=100_000,
                             description="only the pod of this node rank (HyperPodPyTorchJob: replicaSpecs order; "
                                         "PyTorchJob: master 0, worker i is i+1; RayJob: head 0, then workers)")


class LogStreamQuery(LogSelect):
    tail: int | None = Field(None, ge=0, le=100_000,
                             description="start with the last N lines of the job (default: from the start)")
    cursor: str | None = Field(None, max_length=65_536,
                               description="the 'cursor' of the last batch received: resume exactly after it")


class LogTextQuery(LogSelect):
    tail: int = Field(200, ge=1, le=TEXT_MAX_LINES,
                      description=f"the last N matching lines (at most {TEXT_MAX_LINES})")
    since: str | None = Field(None, pattern=r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z$",
                              description="only lines at or after this UTC time (RFC 3339, e.g. 2026-01-01T10:00:00Z)")
    cursor: str | None = Field(None, max_length=65_536,
                               description="only lines after a previous read (the X-Log-Cursor header or the "
                                           "'next' hint at its end): poll with it for new output")
    grep: str | None = Field(None, min_length=1, max_length=200,
                             description="only lines matching this regular expression (case-insensitive), "
                                         "e.g. 'error|nccl'")


class ArchivedLog(ResponseModel):
    pod: str
    container: str
    key: str = Field(..., description="S3 key of the gzipped log")
    lines: int


class LogArchive(ResponseModel):
    bucket: str
    prefix: str = Field(..., description="S3 key prefix of the job's archived logs")
    files: list[ArchivedLog]
