"""Request and response models of the jobs noun (shared by REST, the pane, the CLI and the MCP tools: the
field descriptions are the tools' documentation)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from services.models import TRAINING_NAMESPACE, TRAINING_SERVICE_ACCOUNT, RequestModel, ResponseModel

DEFAULT_NAMESPACE = TRAINING_NAMESPACE
SERVICE_ACCOUNT = TRAINING_SERVICE_ACCOUNT
#: pod names are ``<job>-<replica>-<index>`` (or ``<job>-raycluster-<group>-worker-<i>``) and must stay DNS
#: labels of at most 63 characters, so the job's own name leaves room for those suffixes
NAME_LIMIT = 40


class JobSubmit(RequestModel):
    recipe: str = Field("manifest", description="the recipe id (GET /api/v1/recipes: pytorch, llama-factory, "
                        "ms-swift, verl) or 'manifest' to submit a custom resource you wrote (field manifest)")
    name: str = Field(..., description=f"the job's name: a DNS-1123 label of at most {NAME_LIMIT} characters, "
                      "unique among the cluster's jobs (its pods are named after it)")
    namespace: str = Field(DEFAULT_NAMESPACE, description="where the job runs; made with the service account "
                           f"{SERVICE_ACCOUNT} and the shared-s3 claim if missing. HyperPod's auto-resume needs "
                           "'kubeflow' or a name starting with 'hyperpod'")
    params: dict[str, Any] = Field(default_factory=dict, description="the recipe's parameters (its JSON schema is "
                                   "in GET /api/v1/recipes); empty for recipe 'manifest'")
    manifest: dict[str, Any] | None = Field(None, description="recipe 'manifest' only: a HyperPodPyTorchJob "
                                            "(sagemaker.amazonaws.com/v1), PyTorchJob (kubeflow.org/v1) or RayJob "
                                            "(ray.io/v1); its name and namespace are set from this request and our "
                                            "labels added to it and to every pod template")


class JobClone(RequestModel):
    name: str = Field(..., description="the new job's name (same rules as a submit); it runs in the source's "
                      "namespace")
    namespace: str | None = Field(None, description="the source job's namespace, only needed when two namespaces "
                                  "hold a job of that name")


class JobTarget(RequestModel):
    namespace: str | None = Field(None, description="the job's namespace, only needed when two namespaces hold a "
                                  "job of that name")


class JobQuery(RequestModel):
    namespace: str | None = Field(None, description="only jobs of this namespace")
    phase: str | None = Field(None, description="only jobs in this phase (Pending, Running, Suspended, Restarting, "
                              "Succeeded, Failed)")


class JobPlan(RequestModel):
    """What ``job.submit`` stores: the manifest exactly as it will be created (less the injected env)."""

    cluster: str
    region: str
    name: str
    namespace: str
    recipe: str
    kind: str
    plural: str
    api_version: str
    manifest: dict[str, Any]
    companions: list[dict[str, Any]] = Field(
        default_factory=list, description="ConfigMaps the job reads (a recipe's training config), created with it "
                                          "and owned by it")
    warnings: list[str] = Field(default_factory=list)
    requested_by: str = ""
    cloned_from: str | None = None


class JobRef(RequestModel):
    """What ``job.suspend``, ``job.resume`` and ``job.delete`` store: the job they act on."""

    cluster: str
    name: str
    namespace: str
    kind: str
    plural: str
    api_version: str
    uid: str = ""
    requested_by: str = ""


class RestartBudget(ResponseModel):
    used: int = Field(0, description="restarts used so far")
    limit: int | None = Field(None, description="restarts allowed before the job fails (None: no budget set)")
    full_job_restarts_used: int | None = Field(None, description="HyperPodPyTorchJob: full-job restarts so far")
    full_job_restarts_limit: int | None = Field(None, description="HyperPodPyTorchJob: "
                                                "restartPolicy.maxFullJobRestarts")
    source: str = Field("", description="where the numbers are read from")


class JobSummary(ResponseModel):
    name: str
    namespace: str
    kind: str
    recipe: str
    phase: str = Field(..., description="Pending, Running, Suspended, Restarting, Succeeded or Failed")
    suspended: bool = False
    restarts: RestartBudget
    reason: str | None = Field(None, description="why it failed (its Failed condition or RayJob status.message)")
    created: str | None = None


class JobList(ResponseModel):
    cluster: str
    jobs: list[JobSummary]
    phases: dict[str, int] = Field(default_factory=dict, description="job count per phase")
    kinds_installed: list[str] = Field(default_factory=list, description="job kinds whose CRD the cluster has")
    cache_age_seconds: float | None = None


class JobPod(ResponseModel):
    name: str
    node: str | None = None
    phase: str | None = None
    restarts: int = Field(0, description="container restarts (the sum over its containers)")
    replica: str | None = Field(None, description="replica spec, replica type or Ray group")
    rank: int | None = Field(None, description="global node rank (PyTorch kinds), 0 for a Ray head")
    containers: list[str] = Field(default_factory=list)
    reason: str | None = Field(None, description="why a container is waiting or terminated, if it is")


class JobEvent(ResponseModel):
    type: str | None = None
    reason: str | None = None
    message: str | None = None
    object: str = Field("", description="kind/name of the object the event is about")
    count: int | None = None
    last_timestamp: str | None = None


class JobDetail(JobSummary):
    conditions: list[dict[str, str]] = Field(default_factory=list)
    pods: list[JobPod] = Field(default_factory=list)
    events: list[JobEvent] = Field(default_factory=list, description="events of the job and its pods, newest last")
    manifest: dict[str, Any] = Field(default_factory=dict, description="the custom resource as the API has it")


class JobDigest(ResponseModel):
    """The one-line view of a job for terminals and agents (``jobs watch``, ``instantstart status``)."""

    cluster: str
    name: str
    namespace: str
    phase: str
    restarts_used: int
    restarts_limit: int | None = None
    pods_running: int = 0
    pods: int = 0
    reason: str | None = None
    last_log_line: str | None = Field(None, description="the rank-0 pod's last log line, if it has one")
    progress: dict[str, float | None] = Field(default_factory=dict, description="step, loss, tokens_per_second "
                                              "from the job's MLflow run, when a metrics reader is wired")
    line: str = Field("", description="all of the above as one line of text")


class JobDigests(ResponseModel):
    jobs: list[JobDigest]
    errors: dict[str, str] = Field(default_factory=dict, description="clusters that could not be read, and why")
