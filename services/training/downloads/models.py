"""Request and response models of model downloads: shared by REST, panes and MCP tools, so the field
descriptions below are what an agent reads."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field, SecretStr

from services.models import TRAINING_NAMESPACE, RequestModel, ResponseModel
from services.secrets import SecretRef

#: a Hugging Face repository id: ``org/name`` (the Hub's own rules: letters, digits, ``-``, ``_``, ``.``)
MODEL_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$"
NAMESPACE_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
DEFAULT_NAMESPACE = TRAINING_NAMESPACE
Glob = Annotated[str, Field(pattern=r"^[^\s'\"`$\\;|&<>]{1,200}$")]  # no whitespace, quotes or shell characters


class DownloadRequest(RequestModel):
    """Download a Hugging Face model to the cluster's shared bucket as a Kubernetes Job."""

    model: str = Field(..., pattern=MODEL_PATTERN,
                       description="the Hugging Face model id, org/name, e.g. Qwen/Qwen2.5-0.5B-Instruct")
    revision: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_./-]{0,127}$",
                                 description="a branch, tag or commit hash (default: main)")
    namespace: str = Field(DEFAULT_NAMESPACE, pattern=NAMESPACE_PATTERN,
                           description="the Kubernetes namespace the download Job runs in (made if missing, with "
                                       "the shared-s3 claim); the same namespace training jobs use")
    hf_token: SecretStr | None = Field(None, description="a Hugging Face access token (hf_...), needed for gated "
                                       "or private models; kept only in a Kubernetes Secret that is deleted when "
                                       "the download ends, never stored or shown")
    include: list[Glob] = Field(default_factory=list, max_length=20, description="only files matching these glob "
                               "patterns, e.g. ['*.safetensors', '*.json']")
    exclude: list[Glob] = Field(default_factory=list, max_length=20, description="skip files matching these glob "
                               "patterns, e.g. ['*.bin', 'original/*']")


class DownloadPlan(RequestModel):
    """What a ``model.download`` operation stores: the request with the token replaced by its Secret."""

    cluster: str
    id: str = Field(..., description="the download's id: its Job's name")
    model: str
    revision: str | None = None
    namespace: str
    include: list[str] = Field(default_factory=list)
    exclude: list[str] = Field(default_factory=list)
    token: SecretRef | None = Field(None, description="where the Hugging Face token is kept (never its value)")
    bucket: str = Field(..., description="the shared bucket the files land in")
    key_prefix: str = Field(..., description="the key prefix of the model's folder in the bucket")
    requested_by: str


class DownloadPhase(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"


class Progress(ResponseModel):
    """How far the download is, from its pod's log (the CLI's progress lines)."""

    files_done: int = 0
    files_total: int | None = Field(None, description="files to fetch, once the CLI has listed them")
    bytes_done: int = Field(0, description="bytes of the files fetched so far")
    current_file: str | None = Field(None, description="the file being fetched now")
    copied: int = Field(0, description="files copied onto the shared bucket so far")
    last_line: str | None = Field(None, description="the newest log line")
    error: str | None = Field(None, description="the first error line the CLI printed, e.g. a GatedRepoError 401")


class DownloadView(ResponseModel):
    """One model download as every face shows it."""

    id: str
    cluster: str
    model: str
    revision: str | None = None
    namespace: str
    phase: DownloadPhase
    message: str = ""
    operation_id: str
    destination: str = Field(..., description="where pods see the files: /s3/models/<org>--<name>")
    s3_uri: str = Field(..., description="where the files are in the shared bucket")
    job: str
    pods: list[str] = Field(default_factory=list)
    progress: Progress = Field(default_factory=Progress)
    token_used: bool = Field(False, description="whether a Hugging Face token was given (never the token)")
    created_at: str
    updated_at: str


class DownloadList(ResponseModel):
    cluster: str
    downloads: list[DownloadView]
