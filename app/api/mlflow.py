"""REST routes of the mlflow noun (a cluster's SageMaker managed MLflow tracking server): each handler is one
call of a verb in ``services/mlflow``. MCP toolset ``mlflow`` (on request: ``--toolsets mlflow``)."""

from __future__ import annotations

from typing import Any

from app.api.base import Call, Reply, Route, accepted
from app.api.clusters import CLUSTER
from app.api.pages import Page, current_principal
from app.bootstrap import Services
from services.auth import Principal
from services.mlflow import MlflowTracking
from services.mlflow.models import PresignedUrl, TrackingCreate, TrackingView
from services.replies import Accepted
from services.verbs import role_of

BASE = "/api/v1/clusters/{cluster}/mlflow"
TOOLSET = "mlflow"


def _get(call: Call) -> Reply:
    return Reply(call.services.mlflow.describe_tracking(call.principal, call.path["cluster"]))


def _create(call: Call) -> Reply:
    view, created = call.services.mlflow.create_tracking(call.principal, call.path["cluster"], call.body,
                                                         call.idempotency_key)
    return accepted(view, created)


def _delete(call: Call) -> Reply:
    view, created = call.services.mlflow.delete_tracking(call.principal, call.path["cluster"], call.idempotency_key)
    return accepted(view, created)


def _presigned(call: Call) -> Reply:
    return Reply(call.services.mlflow.presigned_url(call.principal, call.path["cluster"]))


ROUTES: list[Route] = [
    Route("GET", BASE, "mlflow_get", "A cluster's MLflow tracking server", role_of(MlflowTracking.describe_tracking),
          _get, response=TrackingView, path_params=CLUSTER, tag=TOOLSET, open_world=True,
          description="Read-only: the cluster's SageMaker managed MLflow tracking server (<cluster>-mlflow) as "
                      "SageMaker describes it: Absent, Creating, Created ...; its ARN (the tracking URI jobs get as "
                      "MLFLOW_TRACKING_URI) and size. Jobs submitted while it is not Created run without MLflow."),
    Route("POST", BASE, "mlflow_create", "Create the cluster's MLflow tracking server",
          role_of(MlflowTracking.create_tracking), _create, body=TrackingCreate, response=Accepted, path_params=CLUSTER,
          read_only=False, status=202, tag=TOOLSET, open_world=True,
          description="Operator: make the cluster's SageMaker managed MLflow tracking server: its IAM role "
                      "(trusted by SageMaker, S3 on the shared bucket's instantstart/<cluster>/mlflow/ prefix, the "
                      "artifact store), then CreateMlflowTrackingServer, and wait until it is Created (SageMaker "
                      "takes up to 25 minutes; it is billed per hour while it runs). Idempotent by name: a server "
                      "that exists already makes an operation that changes nothing. Refused (409) while it is "
                      "being deleted or when it exists with another size. Follow it with operations_wait."),
    Route("DELETE", BASE, "mlflow_delete", "Delete the cluster's MLflow tracking server",
          role_of(MlflowTracking.delete_tracking), _delete, response=Accepted, path_params=CLUSTER, read_only=False,
          destructive=True, status=202, tag=TOOLSET, open_world=True,
          description="Destructive, admin only: delete the tracking server with every experiment, run and metric "
                      "in it, then its IAM role. Confirm with the user first. 404 when there is none."),
    Route("POST", BASE + "/presigned-url", "mlflow_presigned_url", "A sign-in link to the MLflow UI",
          role_of(MlflowTracking.presigned_url), _presigned, response=PresignedUrl, path_params=CLUSTER,
          read_only=False, idempotent=False, tag=TOOLSET, open_world=True,
          description="Operator: a one-time link that signs the browser in to the tracking server's MLflow UI "
                      "(open it within 5 minutes; the session lasts 12 hours). Give it to the user as it is and "
                      "never write it anywhere else: it is a credential. 409 until the server is Created."),
]


def _page(services: Services, principal: Principal) -> Any:
    from panels.mlflow import MlflowPane

    return MlflowPane(mlflow=services.mlflow, clusters=services.clusters, operations=services.operations,
                      principal=principal, current_principal=current_principal(services, principal))


PAGES: list[Page] = [Page("mlflow", "MLflow", role_of(MlflowTracking.describe_tracking), _page)]
