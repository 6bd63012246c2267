"""REST routes of the downloads noun (models downloaded to the shared bucket): each handler is one call of a
verb in ``services/training/downloads``."""

from __future__ import annotations

from typing import Any

from app.api.base import Call, Reply, Route, accepted
from app.api.pages import Page, current_principal
from app.bootstrap import Services
from services.auth import Principal
from services.replies import Accepted
from services.training.downloads import Downloads
from services.training.downloads.models import DownloadList, DownloadRequest, DownloadView
from services.verbs import role_of

CLUSTER = {"cluster": "name the cluster is registered under (clusters_list)"}
ONE = {**CLUSTER, "id": "the download's id (downloads_list), also its Job's name"}
BASE = "/api/v1/clusters/{cluster}/models/downloads"
TAG = "downloads"


def _start(call: Call) -> Reply:
    view, created = call.services.downloads.download_model(call.principal, call.path["cluster"], call.body,
                                                           call.idempotency_key)
    return accepted(view, created)


def _list(call: Call) -> Reply:
    return Reply(call.services.downloads.list_downloads(call.principal, call.path["cluster"]))


def _get(call: Call) -> Reply:
    return Reply(call.services.downloads.describe_download(call.principal, call.path["cluster"], call.path["id"]))


def _cancel(call: Call) -> Reply:
    return Reply(call.services.downloads.cancel_download(call.principal, call.path["cluster"], call.path["id"]))


ROUTES: list[Route] = [
    Route("POST", BASE, "downloads_start", "Download a Hugging Face model to the shared bucket",
          role_of(Downloads.download_model), _start, body=DownloadRequest, response=Accepted, path_params=CLUSTER,
          read_only=False, idempotent=False, status=202, tag=TAG, open_world=True,
          description="Operator: run `hf download` as a Kubernetes Job in the job namespace (default "
                      "hyperpod-ns-training) and copy the files onto the cluster's shared bucket, where every pod "
                      "mounting claim shared-s3 at /s3 sees them under /s3/models/<org>--<name>/ (the path recipes "
                      "read a model from). Gated or private models need hf_token: it goes into a Kubernetes Secret "
                      "deleted when the download ends, and is never stored or shown. include/exclude take glob "
                      "patterns (e.g. ['*.safetensors', '*.json']). Refused (409) while the same model is being "
                      "downloaded in the cluster, or when the cluster has no shared S3 storage. Follow it with "
                      "downloads_get (files and bytes so far) or operations_wait."),
    Route("GET", BASE, "downloads_list", "A cluster's model downloads", role_of(Downloads.list_downloads), _list,
          response=DownloadList, path_params=CLUSTER, tag=TAG, open_world=True,
          description="Every model download of the cluster, newest first: phase (Pending, Running, Succeeded, "
                      "Failed, Cancelled), progress (files done/total, bytes) read from the download pod's log "
                      "while it runs, where the files are (/s3/models/... in pods, the s3:// URI), the operation."),
    Route("GET", BASE + "/{id}", "downloads_get", "One model download with its progress",
          role_of(Downloads.describe_download), _get, response=DownloadView, path_params=ONE, tag=TAG,
          open_world=True,
          description="One download: phase, message (a failure quotes the CLI, e.g. a 401 for a gated model "
                      "without a token), progress (files done/total, bytes, the file being fetched, files copied to "
                      "the bucket), its Job and pods, where the files are."),
    Route("DELETE", BASE + "/{id}", "downloads_cancel", "Cancel a running model download",
          role_of(Downloads.cancel_download), _cancel, response=DownloadView, path_params=ONE, read_only=False,
          destructive=True, idempotent=False, tag=TAG, open_world=True,
          description="Operator: stop a download that is still running: its operation is cancelled, its Job and "
                      "pod and its token Secret are deleted. Files already copied to the bucket stay. 409 when it "
                      "already ended."),
]


def _page(services: Services, principal: Principal) -> Any:
    from panels.downloads import DownloadsPane

    return DownloadsPane(downloads=services.downloads, clusters=services.clusters, bus=services.bus,
                         principal=principal, current_principal=current_principal(services, principal))


PAGES: list[Page] = [Page("downloads", "Model downloads", role_of(Downloads.list_downloads), _page)]
