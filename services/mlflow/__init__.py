"""The ``mlflow`` noun: a cluster's SageMaker managed MLflow tracking server (``<cluster>-mlflow``, at most one)
as a managed resource, the identity of a job namespace's pods, and the MLflow run of each job.

Reads ask SageMaker (``describe_tracking``). ``create_tracking`` and ``delete_tracking`` precheck synchronously
(409 while the server is being deleted, or when it exists with another size; 404 when there is nothing to
delete) and submit ``mlflow.create`` / ``mlflow.delete`` (``services/mlflow/server.py``). ``presigned_url`` is
the MLflow UI's one-time sign-in link: it goes to the caller and nowhere else (no log, record or audit detail).
``job_identity`` and ``open_run`` are the synchronous forms of the two stages the jobs' ``job.submit``
includes (:meth:`MlflowTracking.job_stages`).
"""

from __future__ import annotations

from typing import Any

from services.auth import Principal, Role
from services.aws import AwsClients
from services.clusters.create_base import cluster_tags
from services.clusters.models import ClusterRecord
from services.clusters.pipeline import cluster_target
from services.clusters.registry import ClusterRegistry
from services.components.base import Target
from services.components.identity import PodRole
from services.errors import Conflict, Invalid, NotFound
from services.kube import KubeClients
from services.mlflow.identity import DEFAULT_SERVICE_ACCOUNT, JobIdentityStage, ensure_job_identity, job_role
from services.mlflow.models import JobIdentityView, JobRun, PresignedUrl, TrackingCreate, TrackingPlan, TrackingView
from services.mlflow.runs import JobRunStage, no_run, open_job_run
from services.mlflow.server import (
    SERVING,
    TrackingDeleteStage,
    TrackingRoleStage,
    TrackingServerStage,
    describe_server,
    server_name,
)
from services.operations import Engine, OperationView
from services.settings import Settings
from services.stages import OperationKind, Stage
from services.verbs import verb

CREATE = "mlflow.create"
DELETE = "mlflow.delete"
URL_SECONDS = 300  # the longest a presigned link may wait to be opened (SageMaker's maximum)
SESSION_SECONDS = 43_200  # the UI session it starts: 12 hours (SageMaker's maximum)

__all__ = ["CREATE", "DELETE", "MlflowTracking", "tracking_target"]


def tracking_target(cluster: str) -> str:
    return f"{cluster_target(cluster)}/mlflow"


class MlflowTracking:
    """Verbs of the mlflow noun."""

    noun = "mlflow"

    def __init__(self, settings: Settings, aws: AwsClients, kube: KubeClients, registry: ClusterRegistry,
                 engine: Engine) -> None:
        self.settings = settings
        self.aws = aws
        self.kube = kube
        self.registry = registry
        self._engine = engine
        self.audit = engine.audit

    def kinds(self) -> list[OperationKind[Any]]:
        stages = self.aws.for_stages()
        return [
            OperationKind(CREATE, TrackingPlan, (TrackingRoleStage(stages), TrackingServerStage(stages)),
                          target=lambda plan: tracking_target(plan.cluster), role=Role.OPERATOR,
                          description="make a cluster's SageMaker managed MLflow tracking server"),
            OperationKind(DELETE, TrackingPlan, (TrackingDeleteStage(stages),),
                          target=lambda plan: tracking_target(plan.cluster), role=Role.ADMIN,
                          description="delete a cluster's MLflow tracking server (its runs go with it)"),
        ]

    def job_stages(self) -> tuple[Stage[Any], Stage[Any]]:
        """The stages ``job.submit`` includes, in this order: the namespace's pod identity, then the job's run.
        Their request must have ``cluster``, ``namespace``, ``name`` (the job), ``recipe`` and optionally
        ``service_account``."""
        return JobIdentityStage(self._identity), JobRunStage(self.tracking_arn, self.aws.session)

    # ----- facts ---------------------------------------------------------------------------------------------

    def _record(self, cluster: str) -> ClusterRecord:
        return self.registry.get(cluster)

    @staticmethod
    def _account(record: ClusterRecord) -> str:
        return record.eks_arn.split(":")[4]

    def _bucket(self, record: ClusterRecord) -> str:
        return self.settings.shared_bucket or f"instantstart-shared-{self._account(record)}-{record.region}"

    def _plan(self, record: ClusterRecord, principal: Principal, request: TrackingCreate | None = None
              ) -> TrackingPlan:
        return TrackingPlan(cluster=record.name, region=record.region, account=self._account(record),
                            name=server_name(record.name), bucket=self._bucket(record),
                            size=(request or TrackingCreate()).size, requested_by=principal.name)

    def _server(self, record: ClusterRecord) -> dict[str, Any] | None:
        return describe_server(self.aws, record.region, server_name(record.name))

    def tracking_arn(self, cluster: str) -> tuple[str | None, str]:
        """The cluster's tracking server ARN when it is Created; else (None, why)."""
        server = self._server(self._record(cluster))
        if server is None:
            return None, f"cluster {cluster} has no MLflow tracking server"
        status = str(server.get("TrackingServerStatus"))
        if status not in SERVING:
            return None, f"the tracking server {server_name(cluster)} is {status}"
        return str(server["TrackingServerArn"]), ""

    def _identity(self, cluster: str, namespace: str, service_account: str) -> tuple[PodRole, Target]:
        record = self._record(cluster)
        arn, _ = self.tracking_arn(cluster)
        target = Target(cluster=record.name, eks_cluster=record.eks_name, region=record.region,
                        account=self._account(record), tags=cluster_tags(record.name), aws=self.aws.for_stages(),
                        kube=self.kube.api_client(record.name), bucket=self._bucket(record))
        return job_role(namespace, service_account, arn or "", self._bucket(record), record.name), target

    # ----- reads ---------------------------------------------------------------------------------------------

    @verb(Role.VIEWER)
    def describe_tracking(self, principal: Principal, cluster: str) -> TrackingView:
        """The cluster's tracking server as SageMaker describes it now (``Absent`` when there is none)."""
        record = self._record(cluster)
        server = self._server(record)
        name = server_name(record.name)
        if server is None:
            return TrackingView(cluster=record.name, name=name, exists=False, status="Absent")
        status = str(server.get("TrackingServerStatus", ""))
        return TrackingView(cluster=record.name, name=name, exists=True, status=status, ready=status in SERVING,
                            arn=server.get("TrackingServerArn", ""), url=server.get("TrackingServerUrl", ""),
                            size=server.get("TrackingServerSize", ""), mlflow_version=server.get("MlflowVersion", ""),
                            artifact_store_uri=server.get("ArtifactStoreUri", ""), role_arn=server.get("RoleArn", ""))

    # ----- mutations -----------------------------------------------------------------------------------------

    @verb(Role.OPERATOR, audit_denied=CREATE)
    def create_tracking(self, principal: Principal, cluster: str, request: TrackingCreate,
                        idempotency_key: str | None = None) -> tuple[OperationView, bool]:
        """Precheck, then submit ``mlflow.create`` (a server that is there already makes a no-op operation)."""
        record = self._record(cluster)
        server = self._server(record)
        if server is not None:
            status = str(server.get("TrackingServerStatus"))
            if status == "Deleting":
                raise Conflict(f"the tracking server {server_name(cluster)} is being deleted: create it again once "
                               "it is gone", details={"status": status})
            if server.get("TrackingServerSize") != request.size.value:
                raise Conflict(f"the tracking server {server_name(cluster)} exists with size "
                               f"{server.get('TrackingServerSize')}, not {request.size.value}: a cluster has one",
                               details={"size": server.get("TrackingServerSize")})
        return self._engine.submit(CREATE, self._plan(record, principal, request), principal, idempotency_key)

    @verb(Role.ADMIN, audit_denied=DELETE)
    def delete_tracking(self, principal: Principal, cluster: str,
                        idempotency_key: str | None = None) -> tuple[OperationView, bool]:
        """Submit ``mlflow.delete``: the server, its runs and its role go."""
        record = self._record(cluster)
        if self._server(record) is None:
            raise NotFound(f"cluster {cluster} has no MLflow tracking server ({server_name(cluster)})")
        return self._engine.submit(DELETE, self._plan(record, principal), principal, idempotency_key)

    @verb(Role.OPERATOR)
    def presigned_url(self, principal: Principal, cluster: str) -> PresignedUrl:
        """A one-time link to the MLflow UI (opened within 5 minutes; the session lasts 12 hours)."""
        record = self._record(cluster)
        server = self._server(record)
        if server is None:
            raise NotFound(f"cluster {cluster} has no MLflow tracking server: create one first (mlflow_create)")
        if server.get("TrackingServerStatus") not in SERVING:
            raise Conflict(f"the tracking server {server_name(cluster)} is {server.get('TrackingServerStatus')}: "
                           "its UI opens once it is Created", details={"status": server.get("TrackingServerStatus")})
        answer = self.aws.client("sagemaker", record.region).create_presigned_mlflow_tracking_server_url(
            TrackingServerName=server_name(cluster), ExpiresInSeconds=URL_SECONDS,
            SessionExpirationDurationInSeconds=SESSION_SECONDS)
        return PresignedUrl(cluster=record.name, url=answer["AuthorizedUrl"], expires_in_seconds=URL_SECONDS,
                            session_seconds=SESSION_SECONDS)

    @verb(Role.OPERATOR)
    def job_identity(self, principal: Principal, cluster: str, namespace: str,
                     service_account: str = DEFAULT_SERVICE_ACCOUNT) -> JobIdentityView:
        """The role the pods of ``namespace``/``service_account`` run as, made where missing (idempotent)."""
        if not namespace or not service_account:
            raise Invalid("name the namespace and the service account")
        role, target = self._identity(cluster, namespace, service_account)
        return ensure_job_identity(role, target)

    @verb(Role.OPERATOR)
    def open_run(self, principal: Principal, cluster: str, namespace: str, job: str, recipe: str) -> JobRun:
        """The job's run (found by its tags, else made), with the env its main container gets; an empty ``env``
        and a ``note`` when the cluster has no Created tracking server."""
        arn, why = self.tracking_arn(cluster)
        if arn is None:
            return no_run(cluster, namespace, why)
        return open_job_run(arn, self.aws.session, cluster=cluster, namespace=namespace, job=job, recipe=recipe)
