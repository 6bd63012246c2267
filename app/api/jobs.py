"""REST routes of the jobs noun: each handler is one call of a verb in ``services/training/jobs.py``."""

from __future__ import annotations

from typing import Any

from app.api.base import Call, Reply, Route, accepted
from app.api.pages import Page, current_principal
from app.bootstrap import Services
from services.auth import Principal
from services.replies import Accepted
from services.training import Jobs
from services.training.jobs_models import (
    JobClone,
    JobDetail,
    JobDigest,
    JobDigests,
    JobList,
    JobQuery,
    JobSubmit,
    JobTarget,
)
from services.verbs import role_of

BASE = "/api/v1/clusters/{cluster}/jobs"
CLUSTER = {"cluster": "name the cluster is registered under (clusters_list)"}
JOB = {**CLUSTER, "job": "the job's name (jobs_list)"}
TAG = "jobs"


def _list(call: Call) -> Reply:
    return Reply(call.services.jobs.list_jobs(call.principal, call.path["cluster"], call.query))


def _get(call: Call) -> Reply:
    return Reply(call.services.jobs.describe_job(call.principal, call.path["cluster"], call.path["job"],
                                                 call.query.namespace))


def _digest(call: Call) -> Reply:
    return Reply(call.services.jobs.digest_job(call.principal, call.path["cluster"], call.path["job"],
                                               call.query.namespace))


def _digests(call: Call) -> Reply:
    return Reply(call.services.jobs.digests(call.principal))


def _submit(call: Call) -> Reply:
    return accepted(*call.services.jobs.submit_job(call.principal, call.path["cluster"], call.body,
                                                   call.idempotency_key))


def _clone(call: Call) -> Reply:
    return accepted(*call.services.jobs.clone_job(call.principal, call.path["cluster"], call.path["job"], call.body,
                                                  call.idempotency_key))


def _suspend(call: Call) -> Reply:
    return accepted(*call.services.jobs.suspend_job(call.principal, call.path["cluster"], call.path["job"], call.body,
                                                    call.idempotency_key))


def _resume(call: Call) -> Reply:
    return accepted(*call.services.jobs.resume_job(call.principal, call.path["cluster"], call.path["job"], call.body,
                                                   call.idempotency_key))


def _delete(call: Call) -> Reply:
    return accepted(*call.services.jobs.delete_job(call.principal, call.path["cluster"], call.path["job"], call.query,
                                                   call.idempotency_key))


def _mutation(method: str, path: str, name: str, summary: str, verb_fn: Any, handler: Any, description: str,
              **extra: Any) -> Route:
    return Route(method, path, name, summary, role_of(verb_fn), handler, response=Accepted, read_only=False,
                 status=202, tag=TAG, open_world=True, description=description, **extra)


ROUTES: list[Route] = [
    Route("GET", BASE, "jobs_list", "A cluster's training jobs", role_of(Jobs.list_jobs), _list, query=JobQuery,
          response=JobList, path_params=CLUSTER, tag=TAG, open_world=True,
          description="Every InstantStart training job of the cluster (HyperPodPyTorchJob, PyTorchJob, RayJob; all "
                      "namespaces) from the watch caches: phase (Pending, Running, Suspended, Restarting, Succeeded, "
                      "Failed), restarts used against the recovery budget, the failure reason. kinds_installed says "
                      "which job kinds the cluster can run."),
    Route("GET", BASE + "/{job}", "jobs_get", "One training job in detail", role_of(Jobs.describe_job), _get,
          query=JobTarget, response=JobDetail, path_params=JOB, tag=TAG, open_world=True,
          description="One job: phase, conditions, restarts used against the budget (and where they are read "
                      "from), the failure reason, its pods (node, phase, restarts, replica, global rank, why a "
                      "container waits or ended), the events of the job and its pods, and the custom resource."),
    Route("GET", BASE + "/{job}/digest", "jobs_digest", "A job's progress in one line", role_of(Jobs.digest_job),
          _digest, query=JobTarget, response=JobDigest, path_params=JOB, tag=TAG, open_world=True,
          description="The job as one line for a terminal or an agent: phase, restarts used/budget, pods running, "
                      "the failure reason and the main pod's last log line (field line), with the same facts as "
                      "fields. Poll it to watch a job without screenshots."),
    Route("GET", "/api/v1/jobs/digest", "jobs_digest_all", "Every cluster's jobs in one line each",
          role_of(Jobs.digests), _digests, response=JobDigests, tag=TAG, open_world=True,
          description="jobs_digest for every job of every registered cluster (the last log line only for running "
                      "jobs); clusters that could not be read are named in errors."),
    _mutation("POST", BASE, "jobs_submit", "Submit a training job", Jobs.submit_job, _submit,
              "Operator: submit a job from a recipe (params) or a custom manifest (recipe 'manifest'). Refused at "
              "once (422/409) for a bad name, a name already used, or a kind whose CRD the cluster lacks (naming "
              "the feature to turn on). The operation makes the namespace, the service account "
              "instantstart-training and the shared-s3 claim when missing, creates the custom resource once, and "
              "ends when the operator reports the job started. Follow it with operations_wait, then jobs_get.",
              body=JobSubmit, path_params=CLUSTER, idempotent=False),
    _mutation("POST", BASE + "/{job}/suspend", "jobs_suspend", "Suspend a training job", Jobs.suspend_job, _suspend,
              "Operator: set the job's suspend flag; the operator stops its pods and keeps the job. Ends when no pod "
              "of it runs. Refused for a finished job. jobs_resume starts it again.", body=JobTarget,
              path_params=JOB),
    _mutation("POST", BASE + "/{job}/resume", "jobs_resume", "Resume a suspended training job", Jobs.resume_job,
              _resume, "Operator: clear the job's suspend flag; ends when the operator no longer reports it "
              "Suspended.", body=JobTarget, path_params=JOB),
    _mutation("POST", BASE + "/{job}/clone", "jobs_clone", "Resubmit a copy of a job under a new name",
              Jobs.clone_job, _clone,
              "Operator: submit the job's spec again (pod templates included) with fresh metadata under a new name, "
              "in the same namespace: how a finished or failed job runs again. Follow it with operations_wait.",
              body=JobClone, path_params=JOB, idempotent=False),
    _mutation("DELETE", BASE + "/{job}", "jobs_delete", "Delete a training job", Jobs.delete_job, _delete,
              "Operator, destructive: delete the job; its pods and their logs go with it. Confirm with the user "
              "first. Follow it with operations_wait: it ends when the job is gone.", query=JobTarget,
              path_params=JOB, destructive=True),
]


def _page(services: Services, principal: Principal) -> Any:
    from panels.jobs import JobsPane, job_views
    from panels.logs import LogsPane
    from panels.metrics import MetricsPane

    jobs = JobsPane(jobs=services.jobs, clusters=services.clusters, bus=services.bus, principal=principal,
                    current_principal=current_principal(services, principal))
    charts = MetricsPane(services.training_metrics, services.metrics_live, services.bus, principal)
    return job_views(jobs, ("Logs", LogsPane(services.logs, principal)), ("Metrics", charts))


PAGES: list[Page] = [Page("jobs", "Training jobs", role_of(Jobs.list_jobs), _page)]
