"""The two operation kinds of a cluster's life: ``cluster.create`` (network → iam → eks → dependencies →
hyperpod → storage → verify) and ``cluster.delete`` (storage → hyperpod → dependencies → eks → network →
iam: the reverse of what depends on what). Each stage lives in its own module; this one only orders them."""

from __future__ import annotations

from services.auth import Role
from services.clusters.create_base import ClusterDeletePlan, CreateStage, DeleteStage, StageDeps
from services.clusters.create_models import ClusterCreatePlan, PlannedResource
from services.stages import OperationKind

CREATE_KIND = "cluster.create"
DELETE_KIND = "cluster.delete"


def cluster_target(name: str) -> str:
    return f"cluster/{name}"


def create_stages(deps: StageDeps) -> tuple[CreateStage, ...]:
    return ()  # being built: network, iam, eks, dependencies, hyperpod, storage, verify land in that order


def delete_stages(deps: StageDeps) -> tuple[DeleteStage, ...]:
    return ()  # being built: storage, hyperpod, dependencies, eks, network, iam


def create_kind(deps: StageDeps) -> OperationKind[ClusterCreatePlan]:
    return OperationKind(CREATE_KIND, ClusterCreatePlan, create_stages(deps),
                         target=lambda plan: cluster_target(plan.name), role=Role.OPERATOR,
                         description="create a HyperPod cluster on a new EKS cluster, with its network, roles, "
                                     "dependencies and shared storage")


def delete_kind(deps: StageDeps) -> OperationKind[ClusterDeletePlan]:
    return OperationKind(DELETE_KIND, ClusterDeletePlan, delete_stages(deps),
                         target=lambda plan: cluster_target(plan.name), role=Role.ADMIN,
                         description="delete a cluster this control plane created and everything tagged with it "
                                     "(the shared bucket stays)")


def planned_resources(stages: tuple[CreateStage, ...], plan: ClusterCreatePlan) -> list[PlannedResource]:
    return [resource for stage in stages for resource in stage.resources(plan)]
