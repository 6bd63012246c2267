"""The ``jobs`` noun: training jobs of a cluster, whatever their kind (HyperPodPyTorchJob, Kubeflow PyTorchJob,
KubeRay RayJob). Its verbs are the only entry points for every face.

Reads answer from watch-backed caches (the CRDs, one informer per installed job kind, pods, events): a list
costs no API call. Describe adds one GET of the job and one pod list (the fields the caches leave out);
a digest adds one log read (the rank-0 pod's last line). Mutations precheck synchronously — a bad name, an
unknown cluster, a kind whose CRD is missing (409 naming what installs it), a name already taken — before
any operation row exists, then submit an operation on the job's own target (``cluster/<c>/job/<name>``).
A recipe is rendered by the recipes' renderer the composition root passes in; ``recipe='manifest'``
submits a custom resource the user wrote, made ours (labels, name, namespace, service account).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kubernetes import client as k8s

from services.audit import AuditLog
from services.auth import Principal, Role
from services.clusters.registry import ClusterRegistry
from services.errors import Conflict, Invalid, NotFound, ServiceError, Transient
from services.informers import Informers
from services.kube import KubeClients
from services.operations import Engine, OperationView
from services.stages import OperationKind, Stage
from services.training.jobs_kinds import (
    JOB_LABEL,
    KINDS,
    MANAGED,
    MANAGED_BY,
    RECIPE_LABEL,
    JobKind,
    budget,
    conditions,
    config_map_refs,
    dns_label,
    failure_reason,
    phase,
    pod_templates,
    prepare_manifest,
    rank_of,
    renamed_job,
    suspended,
)
from services.training.jobs_models import (
    NAME_LIMIT,
    SERVICE_ACCOUNT,
    JobClone,
    JobDetail,
    JobDigest,
    JobDigests,
    JobEvent,
    JobList,
    JobPlan,
    JobPod,
    JobQuery,
    JobRef,
    JobSubmit,
    JobSummary,
    JobTarget,
    RestartBudget,
)
from services.training.jobs_stages import (
    DELETE_KIND,
    RESUME_KIND,
    SUBMIT_KIND,
    SUSPEND_KIND,
    JobDeps,
    config_map_owners,
    is_ours,
    job_kinds,
    read_job,
)
from services.verbs import verb

SYNC_SECONDS = 20.0
#: what each job kind's CRD says about the operators present (the renderer's choice of kind)
OPERATORS = {"HyperPodPyTorchJob": "hyperpod-training-operator", "PyTorchJob": "kubeflow", "RayJob": "kuberay"}


@dataclass(frozen=True)
class RenderRequest:
    """What a recipe renderer is asked: the composition root adapts it to the recipes' ``RenderContext``."""

    cluster: str
    namespace: str
    name: str
    recipe: str
    params: dict[str, Any]
    operators: frozenset[str]
    service_account: str = SERVICE_ACCOUNT
    mlflow_env: dict[str, str] = field(default_factory=dict)


class Rendered(Protocol):
    kind: str
    manifest: dict[str, Any]
    companions: list[dict[str, Any]]
    warnings: list[str]


Renderer = Callable[[RenderRequest], Rendered]
#: (cluster, namespace, job) -> step, loss, tokens_per_second ... from the job's MLflow run
ProgressReader = Callable[[str, str, str], dict[str, float | None]]


def digest_line(d: JobDigest) -> str:
    """One line per job for a terminal: phase, restarts used/budget, pods, progress, the last log line."""
    budget_text = f"{d.restarts_used}/{d.restarts_limit}" if d.restarts_limit is not None else f"{d.restarts_used}/-"
    parts = [f"{d.cluster}/{d.namespace}/{d.name}", d.phase, f"restarts {budget_text}",
             f"pods {d.pods_running}/{d.pods} running"]
    parts += [f"{k} {v:g}" for k, v in d.progress.items() if v is not None]
    if d.reason:
        parts.append(f"reason: {d.reason}")
    if d.last_log_line:
        parts.append(f"| {d.last_log_line}")
    return "  ".join(parts)


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


class Jobs:
    """Verbs of the jobs noun (built once by the composition root)."""

    noun = "jobs"

    def __init__(self, registry: ClusterRegistry, informers: Informers, kube: KubeClients, engine: Engine,
                 audit: AuditLog, *, renderer: Renderer | None = None,
                 submit_stages: Sequence[Stage[JobPlan]] = (), delete_stages: Sequence[Stage[JobRef]] = (),
                 progress: ProgressReader | None = None) -> None:
        self.registry = registry
        self.informers = informers
        self.kube = kube
        self.audit = audit
        self._engine = engine
        self.renderer = renderer
        self.progress = progress
        self.deps = JobDeps(kube=kube, informers=informers)
        self._submit_stages = tuple(submit_stages)
        self._delete_stages = tuple(delete_stages)

    def kinds(self) -> list[OperationKind[Any]]:
        return job_kinds(self.deps, self._precheck, self._submit_stages, self._delete_stages)

    # ----- caches ------------------------------------------------------------------------------------------

    def _synced(self, cluster: str, resource: str) -> Any:
        informer = self.informers.get(cluster, resource)
        if not informer.wait_synced(SYNC_SECONDS):
            raise Transient(f"the {resource} of {cluster} have not been listed yet ({informer.error or 'listing'}); "
                            "ask again shortly", delay=2.0)
        return informer

    def installed(self, cluster: str) -> list[JobKind]:
        """The job kinds whose CRD the cluster has (from the CRD cache)."""
        names = {c["metadata"]["name"] for c in self._synced(cluster, "customresourcedefinitions").items()}
        return [k for k in KINDS.values() if k.crd in names]

    def _jobs(self, cluster: str) -> tuple[list[tuple[JobKind, dict[str, Any]]], float | None]:
        """Every job of ours in the cluster (all installed kinds, all namespaces) and the oldest cache age."""
        out: list[tuple[JobKind, dict[str, Any]]] = []
        ages: list[float] = []
        for kind in self.installed(cluster):
            informer = self._synced(cluster, kind.plural)
            age = informer.age()
            if age is not None:
                ages.append(age)
            out += [(kind, o) for o in informer.items() if _labels(o).get(MANAGED_BY) == MANAGED]
        return out, max(ages) if ages else None

    def _pod_restarts(self, cluster: str) -> Counter[tuple[str, str]]:
        """(namespace, job) -> the most any of its pods' containers restarted, from the pods cache."""
        most: Counter[tuple[str, str]] = Counter()
        for pod in self._synced(cluster, "pods").items():
            job = _labels(pod).get(JOB_LABEL)
            if job:
                key = (str(pod["metadata"].get("namespace")), job)
                most[key] = max(most[key], int(pod["status"].get("restarts") or 0))
        return most

    def _find(self, cluster: str, name: str, namespace: str | None) -> tuple[JobKind, dict[str, Any]]:
        jobs, _ = self._jobs(cluster)
        found = [(k, o) for k, o in jobs if o["metadata"]["name"] == name
                 and (namespace is None or o["metadata"].get("namespace") == namespace)]
        if not found:
            where = f" in namespace {namespace}" if namespace else ""
            raise NotFound(f"no job {name!r}{where} in cluster {cluster}; jobs_list lists its jobs",
                           details={"known": sorted(o["metadata"]["name"] for _, o in jobs)[:50]})
        if len(found) > 1:
            spaces = sorted(str(o["metadata"].get("namespace")) for _, o in found)
            raise Invalid(f"jobs named {name!r} run in namespaces {spaces}: pass namespace",
                          details={"namespaces": spaces})
        return found[0]

    def _summary(self, kind: JobKind, obj: dict[str, Any], pod_restarts: int) -> JobSummary:
        meta = obj.get("metadata") or {}
        return JobSummary(name=meta["name"], namespace=str(meta.get("namespace")), kind=kind.kind,
                          recipe=_labels(obj).get(RECIPE_LABEL, "manifest"), phase=phase(kind, obj),
                          suspended=suspended(kind, obj),
                          restarts=RestartBudget(**budget(kind, obj, pod_restarts)),
                          reason=failure_reason(kind, obj), created=meta.get("creationTimestamp"))

    # ----- reads -------------------------------------------------------------------------------------------

    @verb(Role.VIEWER)
    def list_jobs(self, principal: Principal, cluster: str, query: JobQuery | None = None) -> JobList:
        """Every job of ours in the cluster, from the watch caches (no API call)."""
        query = query or JobQuery()
        self.registry.get(cluster)
        jobs, age = self._jobs(cluster)
        restarts = self._pod_restarts(cluster) if any(k.kind == "PyTorchJob" for k, _ in jobs) else Counter()
        items = [self._summary(k, o, restarts[(str(o["metadata"].get("namespace")), o["metadata"]["name"])])
                 for k, o in jobs if query.namespace in (None, o["metadata"].get("namespace"))]
        items = sorted((i for i in items if query.phase in (None, i.phase)), key=lambda i: (i.namespace, i.name))
        return JobList(cluster=cluster, jobs=items, phases=dict(Counter(i.phase for i in items)),
                       kinds_installed=[k.kind for k in self.installed(cluster)], cache_age_seconds=age)

    @verb(Role.VIEWER)
    def describe_job(self, principal: Principal, cluster: str, job: str, namespace: str | None = None) -> JobDetail:
        """One job: phase, conditions, restarts against its budget, the failure reason, its pods (node, phase,
        restarts, rank) and the events of the job and its pods."""
        self.registry.get(cluster)
        kind, cached = self._find(cluster, job, namespace)
        ns = str(cached["metadata"].get("namespace"))
        obj = read_job(self.deps, cluster, kind, ns, job) or cached
        pods = self._pods(cluster, kind, obj, ns, job)
        summary = self._summary(kind, obj, max((p.restarts for p in pods), default=0))
        return JobDetail(**summary.model_dump(), conditions=conditions(obj), pods=pods,
                         events=self._events(cluster, kind, obj, job, {p.name for p in pods}), manifest=obj)

    def _pods(self, cluster: str, kind: JobKind, obj: dict[str, Any], namespace: str, job: str) -> list[JobPod]:
        response: Any = k8s.CoreV1Api(self.kube.api_client(cluster)).list_namespaced_pod(
            namespace, label_selector=f"{JOB_LABEL}={job}", _preload_content=False)
        listed = json.loads(response.data)
        out: list[JobPod] = []
        for raw in listed.get("items") or []:
            statuses = (raw.get("status") or {}).get("containerStatuses") or []
            reasons = [str(s.get("reason")) for st in statuses for s in (st.get("state") or {}).values()
                       if isinstance(s, dict) and s.get("reason")]
            replica, rank = rank_of(kind, obj, raw)
            out.append(JobPod(name=raw["metadata"]["name"], node=(raw.get("spec") or {}).get("nodeName"),
                              phase=(raw.get("status") or {}).get("phase"),
                              restarts=sum(int(s.get("restartCount") or 0) for s in statuses),
                              replica=replica, rank=rank,
                              containers=[c["name"] for c in (raw.get("spec") or {}).get("containers") or []],
                              reason=", ".join(reasons) or None))
        return sorted(out, key=lambda p: (p.rank is None, p.rank or 0, p.name))

    def _events(self, cluster: str, kind: JobKind, obj: dict[str, Any], job: str, pods: set[str]) -> list[JobEvent]:
        """Events about the job, its pods (also those gone: the operator's pod names) and what its operator made
        for it (a RayJob's RayCluster and submitter Job), oldest first — not a sibling job's named ``<job>-2``."""
        namespace = str(obj["metadata"].get("namespace"))
        replicas = [re.escape(str(r.get("name", ""))) for r in (obj.get("spec") or {}).get("replicaSpecs") or []
                    if isinstance(r, dict) and r.get("name")]
        pattern = {"HyperPodPyTorchJob": rf"{re.escape(job)}-({'|'.join(replicas) or '(?!)'})-\d+",
                   "PyTorchJob": rf"{re.escape(job)}-(master|worker)-\d+",
                   "RayJob": rf"{re.escape(job)}-raycluster(-.+)?"}[kind.kind]
        ours = re.compile(pattern)
        out = []
        for event in self._synced(cluster, "events").items():
            involved = event.get("involvedObject") or {}
            name = str(involved.get("name") or "")
            if involved.get("namespace") != namespace or not (
                    name == job or name in pods or ours.fullmatch(name)):
                continue
            out.append(JobEvent(type=event.get("type"), reason=event.get("reason"), message=event.get("message"),
                                object=f"{involved.get('kind')}/{name}", count=event.get("count"),
                                last_timestamp=event.get("lastTimestamp")))
        return sorted(out, key=lambda e: e.last_timestamp or "")

    @verb(Role.VIEWER)
    def digest_job(self, principal: Principal, cluster: str, job: str, namespace: str | None = None) -> JobDigest:
        """The job in one line: phase, restarts used/budget, pods running, the rank-0 pod's last log line."""
        detail = self.describe_job(principal, cluster, job, namespace)
        return self._digest(cluster, detail)

    def _digest(self, cluster: str, detail: JobDetail) -> JobDigest:
        d = JobDigest(cluster=cluster, name=detail.name, namespace=detail.namespace, phase=detail.phase,
                      restarts_used=detail.restarts.used, restarts_limit=detail.restarts.limit,
                      pods=len(detail.pods), pods_running=sum(p.phase == "Running" for p in detail.pods),
                      reason=detail.reason, last_log_line=self._last_line(cluster, detail))
        if self.progress is not None:
            d.progress = self.progress(cluster, detail.namespace, detail.name)
        d.line = digest_line(d)
        return d

    def _last_line(self, cluster: str, detail: JobDetail) -> str | None:
        """The last line the job's main log has: the Ray submitter's (the driver), else rank 0's."""
        chosen = next((p for p in detail.pods if p.replica == "submitter"), None) or next(
            (p for p in detail.pods if p.rank == 0), None) or (detail.pods[0] if detail.pods else None)
        if chosen is None or not chosen.containers or chosen.phase == "Pending":
            return None
        main = KINDS[detail.kind].main_containers
        container = next((c for c in chosen.containers if c in main), chosen.containers[0])
        try:
            text = k8s.CoreV1Api(self.kube.api_client(cluster)).read_namespaced_pod_log(
                chosen.name, detail.namespace, container=container, tail_lines=1)
        except ServiceError:  # a pod gone or not started: no line to show
            return None
        lines = str(text or "").strip().splitlines()
        return lines[-1][:300] if lines else None

    @verb(Role.VIEWER)
    def digests(self, principal: Principal) -> JobDigests:
        """Every registered cluster's jobs as digests (the last log line only for running jobs)."""
        out: list[JobDigest] = []
        errors: dict[str, str] = {}
        for record in self.registry.list():
            try:
                listed = self.list_jobs(principal, record.name)
                for item in listed.jobs:
                    if item.phase in ("Running", "Restarting"):
                        out.append(self.digest_job(principal, record.name, item.name, item.namespace))
                        continue
                    d = JobDigest(cluster=record.name, name=item.name, namespace=item.namespace, phase=item.phase,
                                  restarts_used=item.restarts.used, restarts_limit=item.restarts.limit,
                                  reason=item.reason)
                    d.line = digest_line(d)
                    out.append(d)
            except ServiceError as exc:
                errors[record.name] = exc.message
        return JobDigests(jobs=out, errors=errors)

    # ----- mutations ---------------------------------------------------------------------------------------

    def _precheck(self, plan: JobPlan) -> None:
        """Refusals before any row: the cluster, the kind's CRD, a name already taken by any job kind."""
        self.registry.get(plan.cluster)
        installed = self.installed(plan.cluster)
        kind = KINDS[plan.kind]
        if kind not in installed:
            raise Conflict(f"cluster {plan.cluster} has no {kind.kind} CRD ({kind.crd}): turn on "
                           f"{kind.installed_by.replace('{cluster}', plan.cluster)}, then submit again",
                           details={"crd": kind.crd, "installed": [k.kind for k in installed]})
        jobs, _ = self._jobs(plan.cluster)
        taken = [(k, o) for k, o in jobs if o["metadata"]["name"] == plan.name]
        if taken:
            k, o = taken[0]
            raise Conflict(f"cluster {plan.cluster} already has a job {plan.name!r} ({k.kind} in "
                           f"{o['metadata'].get('namespace')}): choose another name, or delete it first",
                           details={"kind": k.kind, "namespace": o["metadata"].get("namespace")})
        other = read_job(self.deps, plan.cluster, kind, plan.namespace, plan.name)
        if other is not None and not is_ours(other, plan.name):
            raise Conflict(f"a {kind.kind} named {plan.name} already exists in {plan.namespace} and is not "
                           "InstantStart's: choose another name")
        self._companions_free(plan)
        self._dry_run(kind, plan)

    def _companions_free(self, plan: JobPlan) -> None:
        """A ConfigMap the job would make (a recipe's training YAML) must not exist yet: its pods mount it by name,
        so a foreign one, or a deleted job's that the garbage collector has not taken yet, would be read instead
        of the job's own."""
        core = k8s.CoreV1Api(self.kube.api_client(plan.cluster))
        for obj in plan.companions:
            name = obj["metadata"]["name"]
            found = config_map_owners(core, plan.namespace, name)
            if found is None:
                continue
            owners = [f"{o.get('kind')} {o.get('name')}" for o in found]
            held = f"owned by {', '.join(owners)}" if owners else "owned by nothing"
            raise Conflict(f"ConfigMap {plan.namespace}/{name} already exists ({held}): the job's pods would read it "
                           "instead of the job's own; delete it (or wait until a deleted job's is collected), or "
                           "choose another job name", details={"config_map": name, "owners": owners})

    def _dry_run(self, kind: JobKind, plan: JobPlan) -> None:
        """The API server validates the manifest (its CRD's schema, admission) and stores nothing: a 422 names the
        fields. Before the job's namespace exists (the operation makes it) the check runs in ``default``: the
        schema is the same in every namespace."""
        namespace = plan.namespace
        try:
            k8s.CoreV1Api(self.kube.api_client(plan.cluster)).read_namespace(namespace)
        except NotFound:
            namespace = "default"
        body = {**plan.manifest, "metadata": {**plan.manifest["metadata"], "namespace": namespace}}
        k8s.CustomObjectsApi(self.kube.api_client(plan.cluster)).create_namespaced_custom_object(
            kind.group, kind.version, namespace, kind.plural, body, dry_run="All")

    def _plan(self, principal: Principal, cluster: str, request: JobSubmit, cloned_from: str | None = None,
              manifest_recipe: str = "manifest", companions: list[dict[str, Any]] | None = None) -> JobPlan:
        """The stored request: the manifest rendered (or the user's) and made ours; ``manifest_recipe`` is the
        recipe label a raw manifest carries and ``companions`` the ConfigMaps it comes with (a clone keeps its
        source's)."""
        record = self.registry.get(cluster)
        name = dns_label(request.name, "the job name", NAME_LIMIT)
        namespace = dns_label(request.namespace, "the namespace")
        warnings: list[str] = []
        companions = list(companions or [])
        if request.recipe == "manifest":
            if request.manifest is None:
                raise Invalid("recipe 'manifest' needs the custom resource in field manifest")
            if request.params:
                raise Invalid("recipe 'manifest' takes no params: the manifest is the whole job")
            manifest, recipe = request.manifest, manifest_recipe
        else:
            if request.manifest is not None:
                raise Invalid(f"recipe {request.recipe!r} renders its own manifest: drop field manifest, or use "
                              "recipe 'manifest'")
            if self.renderer is None:
                raise Invalid(f"unknown recipe {request.recipe!r}: this server submits recipe 'manifest' only",
                              details={"valid": ["manifest"]})
            operators = frozenset(OPERATORS[k.kind] for k in self.installed(cluster))
            rendered = self.renderer(RenderRequest(cluster=cluster, namespace=namespace, name=name,
                                                   recipe=request.recipe, params=request.params,
                                                   operators=operators))
            manifest, recipe, warnings = rendered.manifest, request.recipe, list(rendered.warnings)
            companions = [c for c in rendered.companions if c.get("kind") == "ConfigMap"]
        kind, prepared = prepare_manifest(manifest, name, namespace, recipe, SERVICE_ACCOUNT)
        return JobPlan(cluster=cluster, region=record.region, name=name, namespace=namespace, recipe=recipe,
                       kind=kind.kind, plural=kind.plural, api_version=kind.api_version, manifest=prepared,
                       companions=companions, warnings=warnings, requested_by=principal.name,
                       cloned_from=cloned_from)

    @verb(Role.OPERATOR)
    def submit_job(self, principal: Principal, cluster: str, request: JobSubmit,
                   idempotency_key: str | None = None) -> tuple[OperationView, bool]:
        """Submit a training job from a recipe or a custom manifest (prechecked; then ``job.submit``)."""
        return self._engine.submit(SUBMIT_KIND, self._plan(principal, cluster, request), principal, idempotency_key)

    @verb(Role.OPERATOR)
    def clone_job(self, principal: Principal, cluster: str, job: str, request: JobClone,
                  idempotency_key: str | None = None) -> tuple[OperationView, bool]:
        """Submit a copy of a job under a new name: the same spec (pod templates included), fresh metadata, its
        own copies of the ConfigMaps the source owns, and the job's folder (``/s3/jobs/<job>``) renamed."""
        def same(stored: dict[str, Any]) -> bool:
            source = str(stored.get("cloned_from") or "")
            return stored.get("cluster") == cluster and stored.get("name") == request.name and (
                source == f"{request.namespace}/{job}" if request.namespace else source.endswith(f"/{job}"))
        replay = self._engine.replayed(SUBMIT_KIND, principal, idempotency_key, same)
        if replay is not None:  # the source may be gone by now: the retry answers what the first call made
            return replay, False
        self.registry.get(cluster)
        kind, cached = self._find(cluster, job, request.namespace)
        ns = str(cached["metadata"].get("namespace"))
        source = read_job(self.deps, cluster, kind, ns, job)
        if source is None:
            raise NotFound(f"job {job} is gone from {ns}")
        name = dns_label(request.name, "the job name", NAME_LIMIT)
        meta = source.get("metadata") or {}
        ours = (MANAGED_BY, JOB_LABEL, RECIPE_LABEL)
        manifest = {"apiVersion": kind.api_version, "kind": kind.kind,
                    "spec": renamed_job(source.get("spec") or {}, job, name),
                    "metadata": {"labels": {k: v for k, v in (meta.get("labels") or {}).items() if k not in ours},
                                 "annotations": {k: v for k, v in (meta.get("annotations") or {}).items()
                                                 if not k.startswith("kubectl.kubernetes.io/")}}}
        for _, template in pod_templates(kind, manifest):  # the copy starts like the source did: labels re-made
            labels = (template.get("metadata") or {}).get("labels") or {}
            for key in ours:
                labels.pop(key, None)
        companions = self._cloned_companions(cluster, kind, source, manifest, name)
        plan = self._plan(principal, cluster, JobSubmit(recipe="manifest", name=name, namespace=ns,
                                                        manifest=manifest), cloned_from=f"{ns}/{job}",
                          manifest_recipe=_labels(source).get(RECIPE_LABEL, "manifest"), companions=companions)
        return self._engine.submit(SUBMIT_KIND, plan, principal, idempotency_key)

    def _cloned_companions(self, cluster: str, kind: JobKind, source: dict[str, Any], manifest: dict[str, Any],
                           name: str) -> list[dict[str, Any]]:
        """Copies of the ConfigMaps the source job owns and its pods read (a recipe's training YAML, mounted or as
        env), renamed for the clone (their job folder too), every reference of the clone's pointed at them: the
        source's go with the source when it is deleted, and the clone must not lose its configuration then."""
        meta = source.get("metadata") or {}
        ns, uid, old = str(meta.get("namespace")), meta.get("uid"), str(meta.get("name"))
        core = k8s.CoreV1Api(self.kube.api_client(cluster))
        copies: dict[str, dict[str, Any]] = {}
        for ref in config_map_refs(kind, manifest):
            original = str(ref.get("name") or "")
            if original not in copies:
                try:
                    raw: Any = core.read_namespaced_config_map(original, ns, _preload_content=False)
                except NotFound:
                    continue  # the pods would wait for it as the source's did; nothing to copy
                found: dict[str, Any] = json.loads(raw.data)
                if not any(o.get("uid") == uid for o in found["metadata"].get("ownerReferences") or []):
                    continue  # not the source's own: shared with other jobs, the clone mounts it as it is
                renamed = name + original[len(old):] if original.startswith(old + "-") else f"{name}-{original}"
                labels = {**(found["metadata"].get("labels") or {})}
                if JOB_LABEL in labels:
                    labels[JOB_LABEL] = name
                copy = {"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": renamed, "namespace": ns, "labels": labels},
                        "data": renamed_job(dict(found.get("data") or {}), old, name)}
                copy.update({k: found[k] for k in ("binaryData", "immutable") if k in found})
                copies[original] = copy
            ref["name"] = copies[original]["metadata"]["name"]
        return list(copies.values())

    def _ref(self, principal: Principal, cluster: str, job: str, target: JobTarget | None) -> JobRef:
        self.registry.get(cluster)
        kind, obj = self._find(cluster, job, (target or JobTarget()).namespace)
        return JobRef(cluster=cluster, name=job, namespace=str(obj["metadata"].get("namespace")), kind=kind.kind,
                      plural=kind.plural, api_version=kind.api_version, uid=str(obj["metadata"].get("uid") or ""),
                      requested_by=principal.name)

    def _suspension(self, principal: Principal, cluster: str, job: str, target: JobTarget | None,
                    key: str | None, suspend: bool) -> tuple[OperationView, bool]:
        ref = self._ref(principal, cluster, job, target)
        kind, obj = self._find(cluster, job, ref.namespace)
        now = phase(kind, obj)
        if now in ("Succeeded", "Failed"):
            raise Conflict(f"job {job} is {now}: a finished job cannot be {'suspended' if suspend else 'resumed'} "
                           "(jobs_clone runs it again)", details={"phase": now})
        return self._engine.submit(SUSPEND_KIND if suspend else RESUME_KIND, ref, principal, key)

    @verb(Role.OPERATOR)
    def suspend_job(self, principal: Principal, cluster: str, job: str, target: JobTarget | None = None,
                    idempotency_key: str | None = None) -> tuple[OperationView, bool]:
        """Suspend a job: the operator stops its pods and keeps the job (resume starts them again)."""
        return self._suspension(principal, cluster, job, target, idempotency_key, True)

    @verb(Role.OPERATOR)
    def resume_job(self, principal: Principal, cluster: str, job: str, target: JobTarget | None = None,
                   idempotency_key: str | None = None) -> tuple[OperationView, bool]:
        return self._suspension(principal, cluster, job, target, idempotency_key, False)

    @verb(Role.OPERATOR)
    def delete_job(self, principal: Principal, cluster: str, job: str, target: JobTarget | None = None,
                   idempotency_key: str | None = None) -> tuple[OperationView, bool]:
        """Delete a job; its pods go with it (owner references)."""
        return self._engine.submit(DELETE_KIND, self._ref(principal, cluster, job, target), principal,
                                   idempotency_key)


__all__ = ["Jobs", "RenderRequest", "Rendered", "Renderer", "digest_line"]
