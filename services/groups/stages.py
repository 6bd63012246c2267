"""The operation kinds of the ``instance_groups`` noun and their stages.

* ``subnet`` (an added group whose zone the cluster's own subnets do not cover): the compute subnet of that
  zone, from :func:`~services.clusters.network.ensure_compute_subnet` (found by its tags, else made once).
* ``update``: one UpdateCluster carrying the full, normalized group list (``services/groups/spec.py``) with
  only this group changed — or ``InstanceGroupsToDelete`` for a delete — then a wait until the group has
  settled (InService with its count, or gone), saying AWS's reason meanwhile (the group's status, its
  counts, its newest event).
* ``software``: UpdateClusterSoftware for the group, then a wait until its software update has ended.
* ``nodegroup``: an EKS managed node group's UpdateNodegroupConfig (scaling, labels, taints: only what differs,
  ``services/groups/nodegroups.py``) or DeleteNodegroup, then a wait until it is ACTIVE, or gone.

Each observes first: a group already as asked is DONE without a write (a re-sent state is a no-op), and a
crash after the call finds the change made and only waits. Stages never sleep or loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.auth import Role
from services.aws import AwsClients
from services.awscache import AwsCache
from services.clusters.create_base import cluster_tags
from services.clusters.intents import ResourceIntents
from services.clusters.network import ensure_compute_subnet, find_compute_subnet
from services.clusters.pipeline import cluster_target
from services.errors import NotFound, Permanent, Transient
from services.groups.models import GroupAction, GroupChange
from services.groups.nodegroups import nodegroup_update
from services.groups.spec import comparable, find_group, full_group_list, group_spec, update_groups
from services.stages import Done, Observed, OperationKind, Stage, StageContext, Wait

POLL_SECONDS = 15.0
MAX_RESENDS = 3  # an EKS node group's change sent again after an ACTIVE without it, before the stage gives up
ADD_KIND, UPDATE_KIND, DELETE_KIND, SOFTWARE_KIND = ("instance_group.add", "instance_group.update",
                                                     "instance_group.delete", "instance_group.software_update")
_SOFTWARE_ACTIVE = ("Pending", "InProgress", "RollbackInProgress")


def group_target(cluster: str, group: str) -> str:
    return f"{cluster_target(cluster)}/group/{group}"


def apply_patch(spec: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """``spec`` with each member of ``patch`` set (a None value removes the member)."""
    out = dict(spec)
    for member, value in patch.items():
        if value is None:
            out.pop(member, None)
        else:
            out[member] = value
    return out


def settled(details: dict[str, Any]) -> bool:
    return details.get("Status") == "InService" and int(details.get("CurrentCount", 0)) == int(
        details.get("TargetCount", 0))


def updatable(cluster: dict[str, Any]) -> bool:
    """Whether UpdateCluster is accepted now: InService, or Updating in continuous provisioning mode."""
    status = cluster.get("ClusterStatus")
    return status == "InService" or (status == "Updating" and cluster.get("NodeProvisioningMode") == "Continuous")


@dataclass
class GroupDeps:
    aws: AwsClients  # botocore retries off: the engine's backoff is the only one
    cache: AwsCache
    intents: ResourceIntents  # a CIDR block ensure_compute_subnet adds is recorded before the call


class _GroupStage(Stage[GroupChange]):
    def __init__(self, deps: GroupDeps) -> None:
        self.deps = deps

    def sagemaker(self, change: GroupChange) -> Any:
        return self.deps.aws.client("sagemaker", change.region)

    def describe(self, change: GroupChange) -> dict[str, Any]:
        try:
            return dict(self.sagemaker(change).describe_cluster(ClusterName=change.hyperpod_cluster))
        except NotFound:
            raise Permanent(f"HyperPod cluster {change.hyperpod_cluster} is gone") from None

    def look(self, change: GroupChange) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The cluster as AWS describes it now and the group in it (None: not there); the readers' cached
        answer is dropped, so they see what this stage sees."""
        self.deps.cache.invalidate(change.region, change.hyperpod_cluster)
        cluster = self.describe(change)
        return cluster, find_group(cluster, change.group)

    def reason(self, change: GroupChange, cluster: dict[str, Any], details: dict[str, Any] | None) -> str:
        """The group's state and (AWS keeps events for clusters in continuous provisioning mode only) its newest
        event, in AWS's words."""
        where = f"instance group {change.group}"
        if details is not None:
            where += (f" is {details.get('Status')}, {details.get('CurrentCount', 0)}/"
                      f"{details.get('TargetCount', 0)} instances")
        if cluster.get("NodeProvisioningMode") != "Continuous":
            return f"{where} (cluster {cluster.get('ClusterStatus')})"
        events = self.sagemaker(change).list_cluster_events(
            ClusterName=change.hyperpod_cluster, InstanceGroupName=change.group, SortOrder="Descending",
            MaxResults=1).get("Events", [])
        return f"{where}; newest event: {events[0].get('Description')}" if events else where


class SubnetStage(_GroupStage):
    """The compute subnet of the new group's zone (only planned when the cluster's subnets miss that zone)."""

    name = "subnet"
    expected_seconds = 5.0

    def _ec2(self, change: GroupChange) -> Any:
        return self.deps.aws.client("ec2", change.region)

    def observe(self, ctx: StageContext[GroupChange]) -> Observed:
        change = ctx.request
        assert change.vpc_id is not None and change.zone is not None
        found = find_compute_subnet(self._ec2(change), change.vpc_id, change.zone, change.cluster)
        if found is None:
            return Observed.ABSENT
        ctx.data["subnet"] = found
        return Observed.DONE

    def act(self, ctx: StageContext[GroupChange]) -> None:
        change = ctx.request
        assert change.vpc_id is not None and change.zone is not None
        ctx.data["subnet"] = ensure_compute_subnet(self._ec2(change), change.vpc_id, change.zone, change.cluster,
                                                   cluster_tags(change.cluster), intents=self.deps.intents)

    def result(self, ctx: StageContext[GroupChange]) -> dict[str, Any]:
        return {"subnet": ctx.data["subnet"]}


class UpdateStage(_GroupStage):
    """UpdateCluster for an add, a change or a delete of one group; waits until the group has settled."""

    name = "update"
    expected_seconds = 900.0  # a node's boot ~15 minutes (aws-facts); a label change is seconds
    deadline = 4 * 3600.0  # MinInstanceCount's window is 3 hours

    def desired(self, ctx: StageContext[GroupChange], cluster: dict[str, Any]) -> dict[str, Any]:
        change = ctx.request
        details = find_group(cluster, change.group)
        if change.action is GroupAction.ADD:
            assert change.spec is not None
            spec = dict(change.spec)
            subnet = (ctx.results.get("subnet") or {}).get("subnet")
            if subnet:
                spec["OverrideVpcConfig"] = {"SecurityGroupIds": list(change.security_groups), "Subnets": [subnet]}
            return spec
        if details is None:
            raise Permanent(f"instance group {change.group} is no longer in cluster {change.hyperpod_cluster}")
        return apply_patch(group_spec(details), change.patch or {})

    def observe(self, ctx: StageContext[GroupChange]) -> Observed:
        change = ctx.request
        cluster, details = self.look(change)
        if change.action is GroupAction.DELETE:
            return Observed.DONE if details is None else (
                Observed.IN_PROGRESS if details.get("Status") == "Deleting" else Observed.ABSENT)
        if change.action is GroupAction.ADD:
            return Observed.ABSENT if details is None else Observed.IN_PROGRESS
        if details is None:
            raise Permanent(f"instance group {change.group} is no longer in cluster {change.hyperpod_cluster}")
        if comparable(group_spec(details)) != comparable(self.desired(ctx, cluster)):
            return Observed.ABSENT
        return Observed.DONE if settled(details) else Observed.IN_PROGRESS

    def act(self, ctx: StageContext[GroupChange]) -> None:
        change = ctx.request

        def build(cluster: dict[str, Any]) -> dict[str, Any]:
            if not updatable(cluster):  # another change of the cluster is rolling out: AWS would refuse this one
                raise Transient(f"HyperPod cluster {change.hyperpod_cluster} is {cluster.get('ClusterStatus')}; "
                                "the change is sent once it is InService", delay=POLL_SECONDS)
            if change.action is GroupAction.DELETE:
                return {"InstanceGroupsToDelete": [change.group]}
            return {"InstanceGroups": full_group_list(cluster, replace=self.desired(ctx, cluster))}

        update_groups(change.region, change.hyperpod_cluster, lambda: self.describe(change),
                      self.sagemaker(change).update_cluster, build)
        self.deps.cache.invalidate(change.region, change.hyperpod_cluster)

    def poll(self, ctx: StageContext[GroupChange]) -> Done | Wait:
        change = ctx.request
        cluster, details = self.look(change)
        if change.action is GroupAction.DELETE:
            if details is None:
                return Done(f"instance group {change.group} deleted")
            return Wait(POLL_SECONDS, self.reason(change, cluster, details))
        if details is None:
            raise Permanent(f"instance group {change.group} disappeared from {change.hyperpod_cluster} "
                            f"({self.reason(change, cluster, None)})")
        if details.get("Status") == "Failed":
            raise Permanent(f"instance group {change.group} failed: {self.reason(change, cluster, details)}")
        if settled(details):
            return Done(f"instance group {change.group} InService with {details.get('CurrentCount', 0)} instances")
        return Wait(POLL_SECONDS, self.reason(change, cluster, details))

    def result(self, ctx: StageContext[GroupChange]) -> dict[str, Any]:
        return {"group": ctx.request.group, "action": ctx.request.action.value}


class SoftwareStage(_GroupStage):
    """UpdateClusterSoftware for one group; waits until its software update has ended."""

    name = "software"
    expected_seconds = 1800.0
    deadline = 12 * 3600.0

    def observe(self, ctx: StageContext[GroupChange]) -> Observed:
        change = ctx.request
        details = find_group(self.describe(change), change.group)
        if details is None:
            raise Permanent(f"instance group {change.group} is no longer in cluster {change.hyperpod_cluster}")
        if details.get("SoftwareUpdateStatus") in _SOFTWARE_ACTIVE:
            return Observed.IN_PROGRESS
        wanted = change.image_release
        current = details.get("CurrentImageReleaseVersion")
        if (wanted is not None and current == wanted) or (wanted is None and details.get("ImageVersionStatus")
                                                          == "UpToDate"):
            return Observed.DONE
        return Observed.ABSENT

    def act(self, ctx: StageContext[GroupChange]) -> None:
        change = ctx.request
        group: dict[str, Any] = {"InstanceGroupName": change.group}
        if change.image_release is not None:
            group["ImageReleaseVersion"] = change.image_release
        self.sagemaker(change).update_cluster_software(ClusterName=change.hyperpod_cluster, InstanceGroups=[group])
        self.deps.cache.invalidate(change.region, change.hyperpod_cluster)

    def poll(self, ctx: StageContext[GroupChange]) -> Done | Wait:
        change = ctx.request
        cluster, details = self.look(change)
        if details is None:
            raise Permanent(f"instance group {change.group} disappeared during its software update")
        status = details.get("SoftwareUpdateStatus")
        if status in _SOFTWARE_ACTIVE:
            return Wait(POLL_SECONDS, f"software update {status}: {self.reason(change, cluster, details)}")
        if status in ("Failed", "RollbackComplete"):
            raise Permanent(f"software update of {change.group} ended {status}: "
                            f"{self.reason(change, cluster, details)}")
        return Done(f"instance group {change.group} runs image release {details.get('CurrentImageReleaseVersion')}")

    def result(self, ctx: StageContext[GroupChange]) -> dict[str, Any]:
        return {"group": ctx.request.group}


class NodegroupStage(_GroupStage):
    """An EKS managed node group: UpdateNodegroupConfig (its scaling, labels, taints) or DeleteNodegroup, then a
    wait until it is ACTIVE, or gone."""

    name = "nodegroup"
    expected_seconds = 300.0

    def _eks(self, change: GroupChange) -> Any:
        return self.deps.aws.client("eks", change.region)

    def _describe(self, change: GroupChange) -> dict[str, Any] | None:
        try:
            return dict(self._eks(change).describe_nodegroup(clusterName=change.eks_cluster,
                                                             nodegroupName=change.group)["nodegroup"])
        except NotFound:
            return None

    def observe(self, ctx: StageContext[GroupChange]) -> Observed:
        change = ctx.request
        group = self._describe(change)
        if change.action is GroupAction.DELETE:
            if group is None:
                return Observed.DONE
            return Observed.IN_PROGRESS if group["status"] == "DELETING" else Observed.ABSENT
        if group is None:
            raise Permanent(f"EKS node group {change.group} is gone")
        if group["status"] == "UPDATING":
            return Observed.IN_PROGRESS
        same = not nodegroup_update(group, change.scaling, change.nodegroup_labels, change.nodegroup_taints)
        return Observed.DONE if same and group["status"] == "ACTIVE" else Observed.ABSENT

    def act(self, ctx: StageContext[GroupChange]) -> None:
        change = ctx.request
        eks = self._eks(change)
        if change.action is GroupAction.DELETE:
            eks.delete_nodegroup(clusterName=change.eks_cluster, nodegroupName=change.group)
        else:
            group = self._describe(change)
            if group is None:
                raise Permanent(f"EKS node group {change.group} is gone")
            self._update(change, group)  # (observed ABSENT on a difference; a crash after it finds it made)
        self.deps.cache.invalidate(change.region, str(change.eks_cluster))

    def _update(self, change: GroupChange, group: dict[str, Any]) -> bool:
        """Send what still differs from the asked state; False when nothing does."""
        params = nodegroup_update(group, change.scaling, change.nodegroup_labels, change.nodegroup_taints)
        if params:
            self._eks(change).update_nodegroup_config(clusterName=change.eks_cluster, nodegroupName=change.group,
                                                      **params)
        return bool(params)

    def poll(self, ctx: StageContext[GroupChange]) -> Done | Wait:
        change = ctx.request
        self.deps.cache.invalidate(change.region, str(change.eks_cluster))
        group = self._describe(change)
        if change.action is GroupAction.DELETE:
            if group is None:
                return Done(f"EKS node group {change.group} deleted")
            return Wait(POLL_SECONDS, f"EKS node group {change.group} is {group['status']}")
        if group is None:
            raise Permanent(f"EKS node group {change.group} disappeared")
        if group["status"] == "ACTIVE":
            # ACTIVE may end another update than ours (observed UPDATING, not acted): done only with nothing left
            # to send, else send the rest, a bounded number of times
            resent = int(ctx.data.get("resent", 0))
            if resent < MAX_RESENDS and self._update(change, group):
                ctx.data["resent"] = resent + 1  # saved with the Wait
                self.deps.cache.invalidate(change.region, str(change.eks_cluster))
                return Wait(POLL_SECONDS, f"EKS node group {change.group}: the change sent again (it was not there "
                                          "once the group was ACTIVE)")
            if resent >= MAX_RESENDS and nodegroup_update(group, change.scaling, change.nodegroup_labels,
                                                          change.nodegroup_taints):
                raise Permanent(f"EKS node group {change.group} is ACTIVE without the change after it was sent "
                                f"{MAX_RESENDS + 1} times (something else changes it back)")
            return Done(f"EKS node group {change.group} ACTIVE at {group['scalingConfig'].get('desiredSize')} nodes")
        issues = "; ".join(str(i.get("message")) for i in (group.get("health") or {}).get("issues") or [])
        return Wait(POLL_SECONDS, f"EKS node group {change.group} is {group['status']}"
                    + (f": {issues}" if issues else ""))

    def result(self, ctx: StageContext[GroupChange]) -> dict[str, Any]:
        return {"group": ctx.request.group, "action": ctx.request.action.value, "kind": "eks-nodegroup"}


def group_kinds(deps: GroupDeps) -> list[OperationKind[GroupChange]]:
    subnet, update, software, nodegroup = SubnetStage(deps), UpdateStage(deps), SoftwareStage(deps), \
        NodegroupStage(deps)

    def target(change: GroupChange) -> str:
        return group_target(change.cluster, change.group)

    def add_stages(change: GroupChange) -> list[str]:
        return ["subnet", "update"] if change.vpc_id is not None else ["update"]

    def which(change: GroupChange) -> list[str]:  # a HyperPod group, or an EKS managed node group
        return ["nodegroup"] if change.eks_cluster is not None else ["update"]

    return [
        OperationKind(ADD_KIND, GroupChange, (subnet, update), target=target, plan=add_stages,
                      description="add a HyperPod instance group (its zone's compute subnet first when needed)"),
        OperationKind(UPDATE_KIND, GroupChange, (update, nodegroup), target=target, plan=which,
                      description="scale an instance group (or EKS node group) or change its labels, taints or "
                                  "automatic patching"),
        OperationKind(DELETE_KIND, GroupChange, (update, nodegroup), target=target, role=Role.ADMIN, plan=which,
                      description="delete an instance group (or EKS node group) and its instances"),
        OperationKind(SOFTWARE_KIND, GroupChange, (software,), target=target,
                      description="update an instance group's software (its HyperPod AMI)"),
    ]
