"""``cluster.import``: record an existing cluster, then connect to it (its node list synced into memory).

Importing changes nothing in AWS or Kubernetes: the first stage writes the registry row (observed first, so
a retry after a crash never writes it twice), the second starts the cluster's node informer and waits until
its first list is in.
"""

from __future__ import annotations

from typing import Any

from services.clusters.models import ClusterImportPlan, ClusterRecord, Ownership
from services.clusters.registry import ClusterRegistry
from services.informers import Informers
from services.stages import Done, Observed, Stage, StageContext, Wait


class Register(Stage[ClusterImportPlan]):
    name = "register"

    def __init__(self, registry: ClusterRegistry) -> None:
        self.registry = registry

    def observe(self, ctx: StageContext[ClusterImportPlan]) -> Observed:
        found = self.registry.find(ctx.request.name)
        return Observed.DONE if found is not None and found.eks_arn == ctx.request.eks_arn else Observed.ABSENT

    def act(self, ctx: StageContext[ClusterImportPlan]) -> None:
        r = ctx.request
        self.registry.add(ClusterRecord(
            name=r.name, region=r.region, eks_name=r.eks_cluster, eks_arn=r.eks_arn,
            hyperpod_name=r.hyperpod_cluster, hyperpod_arn=r.hyperpod_arn,
            ownership=Ownership.IMPORTED, created_at="", created_by=r.requested_by), ctx.clock.now())

    def result(self, ctx: StageContext[ClusterImportPlan]) -> dict[str, Any]:
        return {"name": ctx.request.name, "eks_arn": ctx.request.eks_arn}


class Connect(Stage[ClusterImportPlan]):
    name = "connect"
    deadline = 300.0  # the first node list of a large cluster over a slow link, in real seconds
    real_time_deadline = True

    def __init__(self, informers: Informers) -> None:
        self.informers = informers

    def observe(self, ctx: StageContext[ClusterImportPlan]) -> Observed:
        informer = self.informers.get(ctx.request.name, "nodes")
        return Observed.DONE if informer.synced.is_set() else Observed.IN_PROGRESS

    def poll(self, ctx: StageContext[ClusterImportPlan]) -> Done | Wait:
        informer = self.informers.get(ctx.request.name, "nodes")
        if informer.synced.is_set():
            return Done()
        if informer.fatal is not None:  # access refused, or a failure nothing classified: waiting cures neither
            raise informer.fatal
        return Wait(2.0, f"waiting for the cluster's node list ({informer.error or 'listing'})")

    def result(self, ctx: StageContext[ClusterImportPlan]) -> dict[str, Any]:
        return {"nodes": len(self.informers.get(ctx.request.name, "nodes").items())}
