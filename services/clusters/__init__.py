"""The ``clusters`` noun: its verbs are the only entry points for every face.

Reads (``list_clusters``, ``describe_cluster``, ``cluster_options``, ``cluster_kubeconfig``) answer from the
AWS TTL cache and the informers. Mutations (``import_cluster``, ``plan_cluster``/``create_cluster``,
``delete_cluster``, ``forget_cluster``) precheck synchronously — bad input is a 422/409 before any operation
row exists — then submit an operation (``cluster.import``, ``cluster.create``, ``cluster.delete``) or, for
forgetting a registration, which touches nothing outside this control plane, change the registry at once.
Imported clusters are never mutated beyond what a user asks, and never deleted.
"""

from __future__ import annotations

from typing import Any

from services.audit import AuditLog
from services.auth import Principal, Role
from services.aws import AwsClients
from services.awscache import AwsCache
from services.clock import Clock
from services.clusters.checks import check_import
from services.clusters.create import CreatePlanner, plan_matches
from services.clusters.create_base import ClusterDeletePlan, StageDeps
from services.clusters.create_models import ClusterCreate, ClusterCreatePlan, ClusterDelete, CreatePlanView
from services.clusters.kubeconfig import kubeconfig_yaml
from services.clusters.models import (
    ClusterDetail,
    ClusterDetailQuery,
    ClusterImport,
    ClusterImportPlan,
    ClusterRecord,
    ClusterSummary,
    Ownership,
)
from services.clusters.options import ClusterOptions, OptionsQuery, OptionsReader
from services.clusters.pipeline import (
    CREATE_KIND,
    DELETE_KIND,
    cluster_target,
    create_kind,
    create_stages,
    delete_kind,
    planned_resources,
)
from services.clusters.reads import FIRST_SYNC_SECONDS, ClusterReader
from services.clusters.registry import ClusterRegistry
from services.clusters.stages import Connect, Register
from services.errors import Conflict, Invalid, NotFound
from services.events import Event, EventBus
from services.informers import Informers
from services.kube import KubeClients
from services.operations import ACTIVE, Engine, OperationQuery, OperationView, Status
from services.settings import Settings
from services.stages import OperationKind
from services.verbs import verb

IMPORT_KIND = "cluster.import"
RESERVED_NAMES = frozenset({"options", "import"})  # /api/v1/clusters/<these> are routes
__all__ = ["CREATE_KIND", "DELETE_KIND", "IMPORT_KIND", "Clusters", "cluster_target"]


class Clusters:
    """Verbs of the clusters noun (the service object the composition root builds once)."""

    def __init__(self, settings: Settings, clock: Clock, aws: AwsClients, registry: ClusterRegistry,
                 informers: Informers, cache: AwsCache, engine: Engine, audit: AuditLog, bus: EventBus,
                 kube: KubeClients) -> None:
        self.settings = settings
        self.clock = clock
        self.aws = aws
        self.registry = registry
        self.informers = informers
        self.cache = cache
        self._engine = engine
        self.audit = audit
        self.bus = bus
        self.reader = ClusterReader(aws, cache, informers)
        self.options = OptionsReader(aws, cache, registry, settings.region)
        self.planner = CreatePlanner(aws, self.options, registry, settings)
        self.deps = StageDeps(aws=aws.for_stages(), kube=kube, registry=registry, informers=informers,
                              settings=settings, clock=clock)
        self._create_stages = create_stages(self.deps)

    def kinds(self) -> list[OperationKind[Any]]:
        return [OperationKind(IMPORT_KIND, ClusterImportPlan, (Register(self.registry), Connect(self.informers)),
                              target=lambda plan: cluster_target(plan.name), role=Role.OPERATOR,
                              description="register an existing EKS (+ HyperPod) cluster and connect to it"),
                create_kind(self.deps), delete_kind(self.deps)]

    # ----- reads -------------------------------------------------------------------------------------

    @verb(Role.VIEWER)
    def list_clusters(self, principal: Principal, refresh: bool = False,
                      wait: float = FIRST_SYNC_SECONDS) -> list[ClusterSummary]:
        """Every registered cluster; ``wait``: how long a cluster not yet read may take (status uses 0)."""
        return [self.reader.summary(r, refresh, wait) for r in self.registry.list()]

    @verb(Role.VIEWER)
    def describe_cluster(self, principal: Principal, name: str, refresh: bool = False,
                         wait: float = FIRST_SYNC_SECONDS, page: ClusterDetailQuery | None = None) -> ClusterDetail:
        """The cluster with its nodes by group; ``page`` narrows (group, health) and pages (after, limit)."""
        return self.reader.detail(self.registry.get(name), refresh, wait, page)

    @verb(Role.VIEWER)
    def cluster_options(self, principal: Principal, query: OptionsQuery | None = None) -> ClusterOptions:
        """Inspect before create: zones, instance types per zone with their accelerator/EFA facts and quota,
        VPC and Elastic IP quotas, existing VPCs and clusters, the service-linked role, our permissions."""
        return self.options.read(query or OptionsQuery())

    # ----- mutations ---------------------------------------------------------------------------------

    @verb(Role.OPERATOR)
    def import_cluster(self, principal: Principal, request: ClusterImport,
                       idempotency_key: str | None = None) -> tuple[OperationView, bool]:
        """Precheck (EKS ACTIVE, HyperPod on it, our access entry), then submit ``cluster.import``. A replay
        with the same Idempotency-Key answers its operation without asking AWS again."""
        name = request.name or request.eks_cluster
        region = request.region or self.settings.region
        if name in RESERVED_NAMES:
            raise Invalid(f"{name!r} names a route under /api/v1/clusters/, not a cluster: register it under "
                          "another name (the 'name' field)", details={"reserved": sorted(RESERVED_NAMES)})

        def same(stored: dict[str, Any]) -> bool:
            return (stored.get("name"), stored.get("region"), stored.get("eks_cluster")) == (
                name, region, request.eks_cluster) and request.hyperpod_cluster in (
                None, stored.get("hyperpod_cluster"))

        prior = self._engine.replayed(IMPORT_KIND, principal, idempotency_key, same)
        if prior is not None:
            return prior, False
        known = self.registry.find(name)
        facts = check_import(self.aws, name=name, region=region, eks_name=request.eks_cluster,
                             hyperpod_name=request.hyperpod_cluster,
                             registered_arn=known.eks_arn if known else None,
                             registered_as=self._registered_as)
        plan = ClusterImportPlan(name=facts.name, region=facts.region, eks_cluster=facts.eks_name,
                                 eks_arn=facts.eks_arn, hyperpod_cluster=facts.hyperpod_name,
                                 hyperpod_arn=facts.hyperpod_arn, requested_by=principal.name)
        self.cache.invalidate(region, request.eks_cluster)
        return self._engine.submit(IMPORT_KIND, plan, principal, idempotency_key)

    @verb(Role.OPERATOR)
    def plan_cluster(self, principal: Principal, request: ClusterCreate) -> CreatePlanView:
        """The dry run of ``create_cluster``: the same precheck, then every resource it would make; nothing
        is made and no operation is recorded."""
        plan, warnings = self.planner.plan(request, principal.name, RESERVED_NAMES, fresh=False)
        return CreatePlanView(plan=plan, resources=planned_resources(self._create_stages, plan),
                              stages=[s.name for s in self._create_stages],
                              expected_seconds={s.name: s.expected_for(plan) for s in self._create_stages},
                              warnings=warnings)

    @verb(Role.OPERATOR)
    def create_cluster(self, principal: Principal, request: ClusterCreate,
                       idempotency_key: str | None = None) -> tuple[OperationView, bool]:
        """Precheck and plan (see ``plan_cluster``), then submit ``cluster.create``. A replay with the same
        Idempotency-Key answers its operation without asking AWS again."""
        prior = self._engine.replayed(CREATE_KIND, principal, idempotency_key,
                                      lambda stored: plan_matches(request, stored))
        if prior is not None:
            return prior, False
        plan, _ = self.planner.plan(request, principal.name, RESERVED_NAMES)
        self.cache.invalidate(plan.region, plan.names.eks_cluster)
        return self._engine.submit(CREATE_KIND, plan, principal, idempotency_key)

    @verb(Role.ADMIN)
    def delete_cluster(self, principal: Principal, name: str, request: ClusterDelete | None = None,
                       idempotency_key: str | None = None) -> tuple[OperationView, bool]:
        """Delete a cluster this control plane created (also a failed or cancelled create) and everything
        tagged with it; imported clusters are refused (forget them instead); the shared bucket stays."""
        if request is not None and request.confirm is not None and request.confirm != name:
            raise Invalid(f"the confirmation {request.confirm!r} is not the cluster's name {name!r}")
        record = self.registry.find(name)
        if record is not None and record.ownership is not Ownership.MANAGED:
            raise Conflict(f"{name} was imported: this control plane never deletes it. Forget its registration "
                           f"instead (DELETE /api/v1/clusters/{name}/registration)", details={"cluster": name})
        created = self._engine.list(OperationQuery(kind=CREATE_KIND, target=cluster_target(name), limit=1))
        if not created and record is None:
            raise NotFound(f"no cluster named {name!r} was created here; known: "
                           + (", ".join(r.name for r in self.registry.list()) or "none"))
        if created and created[0].status in {Status(s) for s in ACTIVE}:
            raise Conflict(f"{name} is being created by {created[0].id}: cancel it first (operations_cancel), "
                           "then delete", details={"operation_id": created[0].id, "status_tool": "operations_get"})
        if created:
            plan = ClusterCreatePlan.model_validate(created[0].request)
            delete = ClusterDeletePlan(name=name, region=plan.region, account=plan.account,
                                       eks_cluster=plan.names.eks_cluster, hyperpod_cluster=plan.names.hyperpod_cluster,
                                       bucket=plan.bucket, requested_by=principal.name)
        else:
            assert record is not None
            account = record.eks_arn.split(":")[4]
            delete = ClusterDeletePlan(name=name, region=record.region, account=account, eks_cluster=record.eks_name,
                                       hyperpod_cluster=record.hyperpod_name, requested_by=principal.name,
                                       bucket=self.settings.shared_bucket
                                       or f"instantstart-shared-{account}-{record.region}")
        return self._engine.submit(DELETE_KIND, delete, principal, idempotency_key)

    @verb(Role.VIEWER)
    def cluster_kubeconfig(self, principal: Principal, name: str) -> str:
        """A kubeconfig for a registered cluster whose user runs an exec plugin (``instantstart kube-token``)
        for a short-lived EKS token: no long-lived secret is written into it."""
        record = self.registry.get(name)
        cluster = self.aws.client("eks", record.region).describe_cluster(name=record.eks_name)["cluster"]
        if "endpoint" not in cluster:
            raise Conflict(f"EKS cluster {record.eks_name} has no endpoint yet (status {cluster.get('status')})")
        return kubeconfig_yaml(name, record.eks_name, record.region, cluster["endpoint"],
                               cluster["certificateAuthority"]["data"])

    def _registered_as(self, eks_arn: str) -> str | None:
        record = self.registry.find_by_arn(eks_arn)
        return record.name if record is not None else None

    @verb(Role.OPERATOR)
    def forget_cluster(self, principal: Principal, name: str) -> ClusterRecord:
        """Forget an imported cluster's registration; the cluster itself is not touched."""
        record = self.registry.get(name)
        if record.ownership is not Ownership.IMPORTED:
            raise Conflict(f"{name} was created by this control plane: delete it, or keep it registered")
        self.registry.remove_if_idle(name, [s.value for s in ACTIVE])
        self.informers.forget(name)
        self.cache.invalidate(record.region, record.eks_name)
        self.audit.record(principal, "cluster.forget", cluster_target(name), {"name": name}, "succeeded")
        self.bus.publish(Event("cluster", "forgotten", {"cluster": name}))
        return record
