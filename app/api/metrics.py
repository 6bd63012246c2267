"""REST routes of the training metrics noun: each handler is one call of a verb in ``services/mlflow/metrics``;
the live chart pages."""

from __future__ import annotations

from typing import Any

from app.api.base import Call, Reply, Route
from app.api.pages import Page
from app.bootstrap import Services
from services.auth import Principal
from services.mlflow.metrics import CompareQuery, Comparison, JobMetrics, MetricsQuery, TrainingMetrics
from services.verbs import role_of

CLUSTER = {"cluster": "name the cluster is registered under (clusters_list)"}
JOB = {**CLUSTER, "job": "the training job's name (its custom resource's name)"}


def _job(call: Call) -> Reply:
    return Reply(call.services.training_metrics.job_metrics(call.principal, call.path["cluster"], call.path["job"],
                                                            call.query))


def _compare(call: Call) -> Reply:
    return Reply(call.services.training_metrics.compare(call.principal, call.path["cluster"], call.query))


ROUTES: list[Route] = [
    Route("GET", "/api/v1/clusters/{cluster}/jobs/{job}/metrics", "metrics_get", "A training job's metrics",
          role_of(TrainingMetrics.job_metrics), _job, query=MetricsQuery, response=JobMetrics, path_params=JOB,
          tag="metrics", open_world=True,
          description="The job's MLflow run (named by MLFLOW_RUN_ID in its pod template), normalised to four "
                      "series: throughput (tokens/s; derived from num_input_tokens_seen deltas for recipes that log "
                      "it only at the end), loss, step_time (s), learning_rate, each point as logged (step, value, "
                      "timestamp ms). `last` has the latest values. Poll with since=<cursor of the previous answer> "
                      "to get only new points. 404 when the job does not exist or has no MLflow run."),
    Route("GET", "/api/v1/clusters/{cluster}/metrics/compare", "metrics_compare", "Compare training jobs' runs",
          role_of(TrainingMetrics.compare), _compare, query=CompareQuery, response=Comparison, path_params=CLUSTER,
          tag="metrics", open_world=True,
          description="Several jobs of one namespace side by side (jobs=a,b): each job's last values (loss, "
                      "throughput, step time, learning rate) and, unless points=false, every series' points."),
]


def _page(services: Services, principal: Principal) -> Any:
    from panels.metrics import MetricsPane

    return MetricsPane(services.training_metrics, services.metrics_live, services.bus, principal)


def _compare_page(services: Services, principal: Principal) -> Any:
    from panels.metrics import ComparePane

    return ComparePane(services.training_metrics, principal)


PAGES: list[Page] = [Page("metrics", "Training metrics", role_of(TrainingMetrics.job_metrics), _page),
                     Page("metrics-compare", "Compare runs", role_of(TrainingMetrics.compare), _compare_page)]
