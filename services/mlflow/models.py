"""Request and response models of the MLflow noun (the tracking server of a cluster, and the runs of its jobs),
shared by REST, the pane and the MCP tools."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from services.models import RequestModel, ResponseModel


class TrackingSize(StrEnum):
    SMALL = "Small"
    MEDIUM = "Medium"
    LARGE = "Large"


class TrackingCreate(RequestModel):
    """A cluster's SageMaker managed MLflow tracking server (named ``<cluster>-mlflow``)."""

    size: TrackingSize = Field(TrackingSize.SMALL, description="SageMaker's size: Small (up to 25 users), Medium "
                                                               "(up to 50) or Large (up to 100)")


class TrackingView(ResponseModel):
    """The tracking server of one cluster as SageMaker describes it now."""

    cluster: str
    name: str = Field(..., description="the tracking server's name: <cluster>-mlflow")
    exists: bool
    status: str = Field(..., description="SageMaker's TrackingServerStatus (Creating, Created, Stopped, ...) or "
                                         "Absent")
    ready: bool = Field(False, description="Created (or Started): jobs get its run and tracking settings")
    arn: str = Field("", description="the tracking URI jobs and the product use (the sagemaker-mlflow plugin)")
    url: str = Field("", description="the server's URL (the UI needs a presigned link: mlflow_presigned_url)")
    size: str = ""
    mlflow_version: str = ""
    artifact_store_uri: str = ""
    role_arn: str = ""


class TrackingPlan(RequestModel):
    """The ``mlflow.create`` / ``mlflow.delete`` operations' request, computed by the precheck."""

    cluster: str
    region: str
    account: str
    name: str
    bucket: str
    size: TrackingSize = TrackingSize.SMALL
    requested_by: str = ""


class PresignedUrl(ResponseModel):
    """A one-time sign-in link to the tracking server's MLflow UI: treat it as a secret (it is never logged)."""

    cluster: str
    url: str
    expires_in_seconds: int = Field(..., description="the link must be opened within this time; the session it "
                                                     "starts lasts longer")
    session_seconds: int


class JobRun(ResponseModel):
    """A job's MLflow run and what its main container gets in its environment (the issue-13 contract)."""

    tracking_uri: str = Field(..., description="the tracking server's ARN")
    run_id: str
    experiment: str = Field(..., description="the experiment: the job's namespace")
    experiment_id: str
    env: dict[str, str] = Field(..., description="MLFLOW_TRACKING_URI, MLFLOW_RUN_ID, MLFLOW_EXPERIMENT_NAME")
    created: bool = Field(..., description="false: the run of this job already existed (a retry) and is reused")
    note: str = Field("", description="why there is no run (no Created tracking server on the cluster)")


class JobIdentityView(ResponseModel):
    """The IAM role a job namespace's pods run as (EKS Pod Identity) and its association."""

    cluster: str
    namespace: str
    service_account: str
    role_name: str
    role_arn: str
    association_id: str = ""
