"""A job's MLflow run (the issue-13 contract): experiment = the job's namespace, run name = the job's name, tags
``instantstart.job`` / ``instantstart.cluster`` / ``instantstart.recipe``; the main container gets
``MLFLOW_TRACKING_URI`` (the tracking server's ARN), ``MLFLOW_RUN_ID`` and ``MLFLOW_EXPERIMENT_NAME``.

Opening is idempotent: the run is looked up by its tags first (with ``instantstart.submission``, the submitting
operation, when given: a retry after a crash between CreateRun and the engine's record finds the run it made)
and made only when there is none. With no Created tracking server there is no run: the answer has an empty
``env`` and says why, and the job is submitted without the variables.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import boto3

from services.errors import Permanent, Transient
from services.mlflow.client import tracking_client
from services.mlflow.models import JobRun
from services.stages import Observed, Stage, StageContext

JOB_TAG = "instantstart.job"
CLUSTER_TAG = "instantstart.cluster"
RECIPE_TAG = "instantstart.recipe"
SUBMISSION_TAG = "instantstart.submission"

#: the tracking server of a cluster: its ARN when it is Created, else (None, why)
TrackingLookup = Callable[[str], tuple[str | None, str]]


def run_env(arn: str, run_id: str, experiment: str) -> dict[str, str]:
    return {"MLFLOW_TRACKING_URI": arn, "MLFLOW_RUN_ID": run_id, "MLFLOW_EXPERIMENT_NAME": experiment}


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


def _classified(exc: Exception, what: str) -> Exception:
    from mlflow.exceptions import MlflowException

    if isinstance(exc, MlflowException):
        status = int(exc.get_http_status_code())  # type: ignore[no-untyped-call]
        if status >= 500 or status == 429:
            return Transient(f"MLflow {what}: {exc.message}")
        return Permanent(f"MLflow {what}: {exc.message}", details={"error_code": exc.error_code})
    return Transient(f"MLflow {what}: {exc}")


def open_job_run(arn: str, session: boto3.Session, *, cluster: str, namespace: str, job: str, recipe: str,
                 submission: str | None = None) -> JobRun:
    """The job's run on tracking server ``arn``: found by its tags, else created."""
    from mlflow.exceptions import MlflowException

    tags = {JOB_TAG: job, CLUSTER_TAG: cluster, RECIPE_TAG: recipe}
    if submission:
        tags[SUBMISSION_TAG] = submission
    try:
        with tracking_client(arn, session) as client:
            experiment = client.get_experiment_by_name(namespace)
            if experiment is None:
                try:
                    experiment_id = client.create_experiment(namespace, tags={CLUSTER_TAG: cluster})
                except MlflowException as exc:
                    if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                        raise
                    experiment_id = client.get_experiment_by_name(namespace).experiment_id
            else:
                experiment_id = experiment.experiment_id
            query = " and ".join(f"tags.`{k}` = '{_quote(v)}'" for k, v in tags.items() if k != RECIPE_TAG)
            found = client.search_runs([experiment_id], filter_string=query, max_results=1,
                                       order_by=["attributes.start_time DESC"])
            created = not found
            run = found[0] if found else client.create_run(experiment_id, run_name=job, tags=tags)
    except (Permanent, Transient):
        raise
    except Exception as exc:  # MLflow's and the transport's errors, classified for the engine
        raise _classified(exc, f"opening the run of job {job}") from None
    run_id = str(run.info.run_id)
    return JobRun(tracking_uri=arn, run_id=run_id, experiment=namespace, experiment_id=str(experiment_id),
                  env=run_env(arn, run_id, namespace), created=created)


def no_run(cluster: str, namespace: str, why: str) -> JobRun:
    """The answer when the cluster has no usable tracking server: no run, no variables, and why."""
    return JobRun(tracking_uri="", run_id="", experiment=namespace, experiment_id="", env={}, created=False,
                  note=f"no MLflow run: {why}; the job runs without MLFLOW_* variables (create the tracking "
                       f"server with mlflow_create on {cluster})")


class JobRunStage(Stage[Any]):
    """Opens the job's run as a stage of ``job.submit``: reads ``cluster``, ``namespace``, ``name`` (the job) and
    ``recipe`` from the operation's request; :meth:`result` is the :class:`JobRun` dump (``env`` empty when the
    cluster has no Created tracking server)."""

    name = "mlflow_run"
    expected_seconds = 5.0
    deadline = 600.0
    real_time_deadline = True

    def __init__(self, lookup: TrackingLookup, session: boto3.Session) -> None:
        self.lookup = lookup
        self.session = session

    def observe(self, ctx: StageContext[Any]) -> Observed:
        return Observed.DONE if "run" in ctx.data else Observed.ABSENT

    def act(self, ctx: StageContext[Any]) -> None:
        request = ctx.request
        cluster, namespace, job = str(request.cluster), str(request.namespace), str(request.name)
        arn, why = self.lookup(cluster)
        if arn is None:
            ctx.data["run"] = no_run(cluster, namespace, why).model_dump()
            return
        run = open_job_run(arn, self.session, cluster=cluster, namespace=namespace, job=job,
                           recipe=str(request.recipe), submission=ctx.operation_id)
        ctx.data["run"] = run.model_dump()

    def result(self, ctx: StageContext[Any]) -> dict[str, Any]:
        run: dict[str, Any] = ctx.data.get("run") or {}
        return run
