"""What every stage of ``cluster.create`` and ``cluster.delete`` shares: the services it may use
(:class:`StageDeps`), its base classes (each create stage lists the resources it will make, for the plan;
each says how long it takes in AWS), the tags every resource carries in its create call, and typed access
to an earlier stage's result.

Tags are set in the create call itself (EC2 ``TagSpecifications``, IAM/EKS/SageMaker/FSx ``Tags``), never
with a separate tagging call a crash could skip: teardown finds a cluster's resources by these tags.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import Field

from services.aws import AwsClients
from services.clock import Clock
from services.clusters.create_models import ClusterCreatePlan, PlannedResource
from services.clusters.options import CLUSTER_TAG, MANAGED_TAG
from services.clusters.registry import ClusterRegistry
from services.errors import Permanent
from services.informers import Informers
from services.kube import KubeClients
from services.models import RequestModel, ResponseModel
from services.settings import Settings
from services.stages import Stage, StageContext

MANAGED_BY = "instantstart"  # the value of the managed-by tag
FIELD_MANAGER = "instantstart"  # the one server-side apply field manager of everything we apply

T = TypeVar("T", bound=ResponseModel)


@dataclass(frozen=True)
class StageDeps:
    """The services a create or delete stage may use (built once by the clusters noun)."""

    aws: AwsClients  # botocore retries off: the engine's backoff is the only one
    kube: KubeClients
    registry: ClusterRegistry
    informers: Informers
    settings: Settings
    clock: Clock


class ClusterDeletePlan(RequestModel):
    """What ``cluster.delete`` carries out: the registry row's facts, fixed at submit time."""

    name: str
    region: str
    account: str
    eks_cluster: str
    hyperpod_cluster: str | None = None
    bucket: str = Field(..., description="the shared bucket: its objects under our prefix are kept, never deleted")
    requested_by: str


class CreateStage(Stage[ClusterCreatePlan]):
    """A stage of ``cluster.create``: besides observe/act/poll it lists what it will make (the dry-run plan)
    and says how long it takes in AWS (shown while it runs)."""

    expected_seconds: float | None = 60.0  # AWS's real duration of this stage (services/stages.py)

    def __init__(self, deps: StageDeps) -> None:
        self.deps = deps

    def resources(self, plan: ClusterCreatePlan) -> list[PlannedResource]:
        """What this stage will create (or reuse, or apply) for ``plan``; nothing is read or made."""
        return []


class DeleteStage(Stage[ClusterDeletePlan]):
    """A stage of ``cluster.delete``: observes what is left that carries the cluster's tags, deletes it in
    dependency order, waits until it is gone. Imported and foreign resources (no managed-by tag) are never
    touched; the shared bucket is never deleted."""

    expected_seconds: float | None = 60.0

    def __init__(self, deps: StageDeps) -> None:
        self.deps = deps


def cluster_tags(cluster: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The tags of every resource ``cluster`` owns: the user's, then ours (ours win)."""
    return {**(extra or {}), MANAGED_TAG: MANAGED_BY, CLUSTER_TAG: cluster}


def tag_list(tags: dict[str, str]) -> list[dict[str, str]]:
    """``[{"Key": k, "Value": v}]``: the tag shape of EC2, IAM, SageMaker and FSx create calls."""
    return [{"Key": k, "Value": v} for k, v in sorted(tags.items())]


def ec2_tag_specs(resource_type: str, tags: dict[str, str], name: str | None = None) -> list[dict[str, Any]]:
    """EC2 ``TagSpecifications`` for one created resource (``Name`` tag included when given)."""
    merged = {**tags, **({"Name": name} if name else {})}
    return [{"ResourceType": resource_type, "Tags": tag_list(merged)}]


def ec2_cluster_filters(cluster: str) -> list[dict[str, Any]]:
    """EC2 ``Filters`` that find what ``cluster`` owns (both of our tags)."""
    return [{"Name": f"tag:{MANAGED_TAG}", "Values": [MANAGED_BY]}, {"Name": f"tag:{CLUSTER_TAG}", "Values": [cluster]}]


def owned(tags: dict[str, str] | list[dict[str, str]] | None, cluster: str) -> bool:
    """Whether a resource with ``tags`` (a map, or EC2's Key/Value list) belongs to ``cluster`` and to us."""
    if isinstance(tags, list):
        tags = {t.get("Key", ""): t.get("Value", "") for t in tags}
    tags = tags or {}
    return tags.get(MANAGED_TAG) == MANAGED_BY and tags.get(CLUSTER_TAG) == cluster


def result_of(ctx: StageContext[Any], stage: str, model: type[T]) -> T:
    """An earlier stage's result, typed; a missing one is a bug in the kind's stage order."""
    raw = ctx.results.get(stage)
    if raw is None:
        raise Permanent(f"stage {stage} has no result yet, but a later stage needs it; this is a bug")
    return model.model_validate(raw)
