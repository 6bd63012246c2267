"""The ``instance_groups`` noun: a cluster's HyperPod instance groups and its EKS managed node groups (those
are listed, scaled, relabelled, retainted and deleted; nothing else of theirs changes here). Its verbs are the
only entry points for every face. A group our managed-Karpenter HyperpodNodeClass names is neither scaled nor
deleted by hand (``check_karpenter_owned``: its node class is read fresh from the cluster's Kubernetes API).

Reads answer from the AWS TTL cache (the entry the clusters reader uses, so an operation's invalidation
refreshes both). Mutations — add, update (scale, labels, taints, automatic patching), delete, software
update — precheck synchronously against fresh AWS reads (a bad choice is a 422, a state that forbids it a
409, before any operation row exists), then submit an operation on the group's own target
(``cluster/<c>/group/<g>``), whose stages (``stages.py``) send UpdateCluster with the full normalized group
list (``spec.py``) and wait for the group to settle.
"""

from __future__ import annotations

from typing import Any

from services.auth import Principal, Role
from services.aws import AwsClients
from services.awscache import AwsCache
from services.clusters import Clusters
from services.clusters.create_models import CapacityType
from services.clusters.intents import ResourceIntents
from services.clusters.models import ClusterRecord
from services.clusters.options import OptionsQuery
from services.components.karpenter import OBJECT_NAME as NODE_CLASS
from services.components.karpenter import nodeclass_groups
from services.errors import Conflict, Invalid, NotFound
from services.groups.checks import (
    autoscaling_on,
    capacity_of,
    check_fixed,
    check_karpenter_add,
    check_karpenter_owned,
    check_type,
    choose_reservation,
    efa_only_of,
    reservation_cap,
    reservation_of,
    threads_per_core,
)
from services.groups.models import (
    GroupAction,
    GroupAdd,
    GroupChange,
    GroupPatch,
    GroupView,
    SoftwareUpdate,
)
from services.groups.nodegroups import check_lengths, eks_taints, view_taints
from services.groups.spec import find_group, group_spec, patch_date
from services.groups.stages import (
    ADD_KIND,
    DELETE_KIND,
    SOFTWARE_KIND,
    UPDATE_KIND,
    GroupDeps,
    group_kinds,
    updatable,
)
from services.kube import KubeClients
from services.operations import Engine, OperationView
from services.stages import OperationKind
from services.verbs import verb

__all__ = ["ADD_KIND", "DELETE_KIND", "SOFTWARE_KIND", "UPDATE_KIND", "InstanceGroups"]


def group_view(details: dict[str, Any]) -> GroupView:
    spec = group_spec(details)
    ebs = [c["EbsVolumeConfig"] for c in spec.get("InstanceStorageConfigs") or [] if "EbsVolumeConfig" in c]
    kubernetes = spec.get("KubernetesConfig") or {}
    return GroupView(
        name=details["InstanceGroupName"], instance_type=details.get("InstanceType"),
        status=str(details.get("Status", "")), current_count=int(details.get("CurrentCount", 0)),
        target_count=int(details.get("TargetCount", 0)), min_count=details.get("MinCount"),
        capacity_type=capacity_of(details).value, training_plan=details.get("TrainingPlanArn"),
        training_plan_status=details.get("TrainingPlanStatus"), efa_only=efa_only_of(details),
        threads_per_core=details.get("ThreadsPerCore"),
        ebs_volume_gib=int(ebs[0]["VolumeSizeInGB"]) if ebs and "VolumeSizeInGB" in ebs[0] else None,
        deep_health_checks=list(details.get("OnStartDeepHealthChecks") or []),
        labels=dict(kubernetes.get("Labels") or {}), taints=list(kubernetes.get("Taints") or []),
        auto_patch=spec.get("AutoPatchConfig"), image_release=details.get("CurrentImageReleaseVersion"),
        image_status=details.get("ImageVersionStatus"), software_update_status=details.get("SoftwareUpdateStatus"),
        subnets=list((details.get("OverrideVpcConfig") or {}).get("Subnets") or []))


def _plan_name(plan: str) -> str:
    return plan.rsplit("/", 1)[-1] if plan.startswith("arn:") else plan


class InstanceGroups:
    """Verbs of the instance_groups noun (built once by the composition root, beside ``Clusters``)."""

    noun = "instance_groups"

    def __init__(self, clusters: Clusters, aws: AwsClients, kube: KubeClients, cache: AwsCache,
                 engine: Engine) -> None:
        self.clusters = clusters
        self.aws = aws
        self.kube = kube
        self.cache = cache
        self.audit = clusters.audit
        self._engine = engine
        self._deps = GroupDeps(aws=aws.for_stages(), cache=cache,
                               intents=ResourceIntents(clusters.registry.db, clusters.clock))

    def kinds(self) -> list[OperationKind[Any]]:
        return list(group_kinds(self._deps))

    # ----- reads -------------------------------------------------------------------------------------

    def _record(self, cluster: str) -> tuple[ClusterRecord, str]:
        record = self.clusters.registry.get(cluster)
        if not record.hyperpod_name:
            raise Conflict(f"cluster {cluster} has no HyperPod cluster registered: it has no instance groups")
        return record, record.hyperpod_name

    def _describe(self, record: ClusterRecord, hyperpod: str, fresh: bool) -> dict[str, Any]:
        def load() -> dict[str, Any]:
            return dict(self.aws.client("sagemaker", record.region).describe_cluster(ClusterName=hyperpod))

        if fresh:
            self.cache.invalidate(record.region, hyperpod)
        value, _ = self.cache.get(("sagemaker", "describe_cluster", record.region, hyperpod), load, refresh=fresh)
        return dict(value)

    @verb(Role.VIEWER)
    def list_groups(self, principal: Principal, cluster: str, refresh: bool = False) -> list[GroupView]:
        """The cluster's HyperPod instance groups (also those at 0 instances) and EKS managed node groups."""
        record, hyperpod = self._record(cluster)
        described = self._describe(record, hyperpod, refresh)
        return [group_view(g) for g in described.get("InstanceGroups") or []] + self._nodegroups(record, refresh)

    def _nodegroups(self, record: ClusterRecord, refresh: bool) -> list[GroupView]:
        def load() -> list[dict[str, Any]]:
            eks = self.aws.client("eks", record.region)
            names = eks.all_pages("list_nodegroups", "nodegroups", clusterName=record.eks_name)
            return [eks.describe_nodegroup(clusterName=record.eks_name, nodegroupName=n)["nodegroup"] for n in names]

        groups, _ = self.cache.get(("eks", "list_nodegroups", record.region, record.eks_name), load, refresh=refresh)
        out = []
        for g in groups:
            scaling = g.get("scalingConfig") or {}
            out.append(GroupView(name=g["nodegroupName"], kind="eks-nodegroup",
                                 instance_type=",".join(g.get("instanceTypes") or []) or None,
                                 status=str(g.get("status", "")), current_count=int(scaling.get("desiredSize", 0)),
                                 target_count=int(scaling.get("desiredSize", 0)), min_count=scaling.get("minSize"),
                                 capacity_type="spot" if g.get("capacityType") == "SPOT" else "on-demand",
                                 labels=dict(g.get("labels") or {}), taints=view_taints(g),
                                 subnets=list(g.get("subnets") or [])))
        return out

    @verb(Role.VIEWER)
    def describe_group(self, principal: Principal, cluster: str, group: str, refresh: bool = False) -> GroupView:
        record, hyperpod = self._record(cluster)
        return group_view(self._details(self._describe(record, hyperpod, refresh), cluster, group))

    @staticmethod
    def _details(described: dict[str, Any], cluster: str, group: str) -> dict[str, Any]:
        details = find_group(described, group)
        if details is None:
            names = [g["InstanceGroupName"] for g in described.get("InstanceGroups") or []]
            raise NotFound(f"cluster {cluster} has no instance group {group!r}; its groups: "
                           + (", ".join(names) or "none"), details={"groups": names})
        return details

    # ----- mutations ---------------------------------------------------------------------------------

    def _updatable(self, cluster: str, described: dict[str, Any]) -> None:
        if not updatable(described):
            raise Conflict(f"HyperPod cluster of {cluster} is {described.get('ClusterStatus')}: instance groups "
                           "change only while it is InService; wait for the change under way to finish",
                           details={"status": described.get("ClusterStatus")})

    def _karpenter_groups(self, cluster: str, described: dict[str, Any]) -> list[str]:
        """The groups our managed-Karpenter HyperpodNodeClass names, read fresh from the cluster's Kubernetes API
        (through the registry's client, never a kubeconfig context) only while HyperPod's autoscaling is on."""
        if not autoscaling_on(described):
            return []
        try:
            api = self.kube.api_client(cluster)
        except NotFound:
            raise Conflict(f"cluster {cluster} has managed Karpenter autoscaling on and its Kubernetes API is not "
                           "registered: whether Karpenter scales the group cannot be checked; reconnect the cluster "
                           "(import it again), then retry") from None
        return nodeclass_groups(api)

    @verb(Role.OPERATOR)
    def add_group(self, principal: Principal, cluster: str, request: GroupAdd,
                  idempotency_key: str | None = None) -> tuple[OperationView, bool, list[str]]:
        """Precheck (type offered in the zone, quota, EFA-only support, the training plan's rules), then submit
        ``instance_group.add``. Answers the operation and what was decided for the caller."""
        record, hyperpod = self._record(cluster)
        described = self._describe(record, hyperpod, fresh=True)
        self._updatable(cluster, described)
        groups = described.get("InstanceGroups") or []
        if find_group(described, request.name) is not None:
            raise Conflict(f"cluster {cluster} already has an instance group {request.name}; scale or change it "
                           "instead (PATCH), or choose another name", details={"group": request.name})
        if not groups:
            raise Conflict(f"cluster {cluster} has no instance group to take the execution role and lifecycle "
                           "scripts from")
        check_karpenter_add(described, request.name, list(request.deep_health_checks))
        capacity, decided = request.capacity_type, []
        if request.training_plan is not None and capacity is CapacityType.ON_DEMAND:
            capacity = CapacityType.TRAINING_PLAN
            decided.append("capacity type training-plan (a training plan was given)")
        if capacity is CapacityType.TRAINING_PLAN and request.training_plan is None:
            raise Invalid("capacity type training-plan needs the plan (training_plan: its ARN or name)")
        zone, instance_type, plan_arn = request.zone, request.instance_type, None
        if request.training_plan is not None:
            plan = self.aws.client("sagemaker", record.region).describe_training_plan(
                TrainingPlanName=_plan_name(request.training_plan))
            choice = choose_reservation(plan, request.reservation, zone, instance_type, request.count,
                                        spot=capacity is CapacityType.SPOT, groups=groups)
            zone, instance_type, plan_arn = choice.zone, choice.instance_type, choice.arn
            decided += choice.decided
        elif request.reservation is not None:
            raise Invalid("a reservation belongs to a training plan: give the plan too (training_plan)")
        if zone is None or instance_type is None:
            raise Invalid("give the group's zone and instance_type (or a training plan, which decides both)")
        # fresh facts: a quota raised a moment ago counts (a mutation's precheck is worth the reads)
        options = self.clusters.options.read(OptionsQuery(region=record.region, zone=zone, refresh=True))
        option = check_type(options.instance_types, instance_type, zone, request.count, request.efa_only)
        threads, why = threads_per_core(request.threads_per_core, option, plan_arn is not None)
        decided.append(why)
        template = groups[0]
        spec: dict[str, Any] = {
            "InstanceGroupName": request.name, "InstanceType": instance_type, "InstanceCount": request.count,
            "ExecutionRole": template["ExecutionRole"], "ThreadsPerCore": threads,
            "InstanceStorageConfigs": [{"EbsVolumeConfig": {"VolumeSizeInGB": request.ebs_volume_gib}}]}
        if template.get("LifeCycleConfig"):
            spec["LifeCycleConfig"] = dict(template["LifeCycleConfig"])
        if request.deep_health_checks:
            spec["OnStartDeepHealthChecks"] = list(dict.fromkeys(request.deep_health_checks))
        if plan_arn is not None:
            spec["TrainingPlanArn"] = plan_arn
        else:
            spec["CapacityRequirements"] = {"Spot": {}} if capacity is CapacityType.SPOT else {"OnDemand": {}}
        if request.efa_only:
            spec["NetworkInterface"] = {"InterfaceType": "efa-only"}
        kubernetes = self._kubernetes(request.labels, [t.model_dump() for t in request.taints])
        if kubernetes:
            spec["KubernetesConfig"] = kubernetes
        vpc_id, security_groups = self._placement(record, described, zone, decided)
        change = GroupChange(cluster=cluster, region=record.region, hyperpod_cluster=hyperpod, group=request.name,
                             action=GroupAction.ADD, spec=spec, zone=zone, vpc_id=vpc_id,
                             security_groups=security_groups, requested_by=principal.name)
        view, created = self._engine.submit(ADD_KIND, change, principal, idempotency_key)
        return view, created, decided

    def _placement(self, record: ClusterRecord, described: dict[str, Any], zone: str,
                   decided: list[str]) -> tuple[str | None, list[str]]:
        """(VPC, security groups) when the group needs a compute subnet of its own in ``zone``; (None, []) when
        one of the cluster's subnets is in that zone."""
        vpc = described.get("VpcConfig") or {}
        subnets = self.aws.client("ec2", record.region).describe_subnets(SubnetIds=list(vpc.get("Subnets") or []))
        found = subnets["Subnets"]
        if not found:
            raise Conflict(f"HyperPod cluster {record.hyperpod_name} has no subnets in its VpcConfig")
        here = [s for s in found if zone in (s.get("AvailabilityZone"), s.get("AvailabilityZoneId"))]
        if here:
            decided.append(f"subnet {here[0]['SubnetId']} (the cluster's, in {zone})")
            return None, []
        decided.append(f"a compute subnet of its own in {zone} (the cluster's subnets are in "
                       + ", ".join(sorted({str(s.get('AvailabilityZone')) for s in found})) + ")")
        return str(found[0]["VpcId"]), list(vpc.get("SecurityGroupIds") or [])

    @staticmethod
    def _kubernetes(labels: dict[str, str], taints: list[dict[str, Any]], given: tuple[str, ...] = ()) -> dict[
            str, Any]:
        """``KubernetesConfig`` for the sets; a set named in ``given`` (the caller's) is sent even when empty, so
        clearing it says so (``"Labels": {}`` / ``"Taints": []``) instead of relying on an absent member."""
        out: dict[str, Any] = {}
        if labels or "labels" in given:
            out["Labels"] = dict(labels)
        if taints or "taints" in given:
            out["Taints"] = [{"Key": t["key"], **({"Value": t["value"]} if t.get("value") is not None else {}),
                              "Effect": t["effect"]} for t in taints]
        return out

    @verb(Role.OPERATOR)
    def update_group(self, principal: Principal, cluster: str, group: str, request: GroupPatch,
                     idempotency_key: str | None = None) -> tuple[OperationView, bool]:
        """Scale (to 0 too), set labels/taints, set or stop automatic patching: only the fields given. Capacity
        type and EFA-only are refused when they differ (fixed for the group's life). The operation ends as a
        no-op without a write when the group already is as asked."""
        record, hyperpod = self._record(cluster)
        described = self._describe(record, hyperpod, fresh=True)
        if find_group(described, group) is None and (nodegroup := self._nodegroup(record, group)) is not None:
            return self._update_nodegroup(principal, record, nodegroup, request, idempotency_key)
        details = self._details(described, cluster, group)
        check_fixed(group, details, request.capacity_type, request.efa_only)
        if request.count is not None and request.count != int(details.get("TargetCount", 0)):
            check_karpenter_owned(cluster, group, self._karpenter_groups(cluster, described), NODE_CLASS,
                                  delete=False)
        if request.auto_patch is not None and request.auto_patch_off:
            raise Invalid("give auto_patch or auto_patch_off, not both")
        patch = self._patch(record, described, details, request)
        if not patch and request.capacity_type is None and request.efa_only is None:
            raise Invalid("nothing to change: give count, labels, taints, auto_patch or auto_patch_off")
        self._updatable(cluster, described)
        change = GroupChange(cluster=cluster, region=record.region, hyperpod_cluster=hyperpod, group=group,
                             action=GroupAction.UPDATE, patch=patch, requested_by=principal.name)
        return self._engine.submit(UPDATE_KIND, change, principal, idempotency_key)

    def _patch(self, record: ClusterRecord, described: dict[str, Any], details: dict[str, Any],
               request: GroupPatch) -> dict[str, Any]:
        spec = group_spec(details)
        patch: dict[str, Any] = {}
        if request.count is not None:
            self._check_count(record, described.get("InstanceGroups") or [], details, request.count)
            patch["InstanceCount"] = request.count
            minimum = spec.get("MinInstanceCount")
            if request.count == 0:
                patch["MinInstanceCount"] = 0  # an empty group: HyperPod needs its minimum at 0 too
            elif minimum is not None and int(minimum) > request.count:
                patch["MinInstanceCount"] = request.count
        if request.labels is not None or request.taints is not None:
            current = spec.get("KubernetesConfig") or {}
            labels = request.labels if request.labels is not None else current.get("Labels") or {}
            taints = [t.model_dump() for t in request.taints] if request.taints is not None else [
                {"key": t["Key"], "value": t.get("Value"), "effect": t["Effect"]} for t in current.get("Taints") or []]
            given = tuple(k for k in ("labels", "taints") if getattr(request, k) is not None)
            patch["KubernetesConfig"] = self._kubernetes(labels, taints, given)
        if request.auto_patch is not None:
            a = request.auto_patch
            auto: dict[str, Any] = {"PatchingStrategy": a.strategy}
            if a.next_patch_date is not None:
                auto["PatchSchedule"] = {"NextPatchDate": patch_date(a.next_patch_date)}
            if a.idle_wait_seconds is not None:
                auto["IdleWaitWindowInSeconds"] = a.idle_wait_seconds
            drain = {k: v for k, v in (("DrainTimeoutInSeconds", a.drain_timeout_seconds),
                                       ("OnDrainTimeout", a.on_drain_timeout)) if v is not None}
            if drain:
                auto["DrainPolicy"] = drain
            patch["AutoPatchConfig"] = auto
        elif request.auto_patch_off:
            patch["AutoPatchConfig"] = None
        return patch

    def _check_count(self, record: ClusterRecord, groups: list[dict[str, Any]], details: dict[str, Any],
                     count: int) -> None:
        """A larger count fits the free instances of the group's reservation (its total less what the cluster's
        ``groups`` run on it, at most the plan's free count) and the type's cluster-usage quota."""
        grow = count - int(details.get("TargetCount", 0))
        if grow <= 0:
            return
        plan_arn = details.get("TrainingPlanArn")
        if plan_arn:
            plan = self.aws.client("sagemaker", record.region).describe_training_plan(
                TrainingPlanName=_plan_name(str(plan_arn)))
            rc = reservation_of(plan, details)
            if rc is None:
                raise Conflict(f"training plan {plan['TrainingPlanName']} holds no reservation of "
                               f"{details.get('InstanceType')}: instance group {details['InstanceGroupName']} "
                               "cannot grow on it")
            total, available = reservation_cap(plan, rc, groups)
            if grow > available:
                raise Invalid(f"training plan {plan['TrainingPlanName']}'s reservation {rc['ReservedCapacityArn']} "
                              f"has {available} free instances of {total}: the group can grow by at most "
                              f"{available}, to {int(details.get('TargetCount', 0)) + available}",
                              details={"max_count": int(details.get("TargetCount", 0)) + available})
        instance_type = details.get("InstanceType")
        options = self.clusters.options.read(OptionsQuery(region=record.region, refresh=True))
        option = next((t for t in options.instance_types if t.instance_type == instance_type), None)
        if option is not None and option.quota is not None and option.in_use + grow > option.quota:
            raise Invalid(f"the account's '{instance_type} for cluster usage' quota is {option.quota} and "
                          f"{option.in_use} are in use: {grow} more do not fit (ask Service Quotas for more)",
                          details={"quota": option.quota, "in_use": option.in_use})

    def _nodegroup(self, record: ClusterRecord, name: str) -> dict[str, Any] | None:
        """The EKS managed node group ``name`` of the cluster, read now; None when it has none of that name."""
        try:
            return dict(self.aws.client("eks", record.region).describe_nodegroup(
                clusterName=record.eks_name, nodegroupName=name)["nodegroup"])
        except NotFound:
            return None

    def _update_nodegroup(self, principal: Principal, record: ClusterRecord, nodegroup: dict[str, Any],
                          request: GroupPatch, idempotency_key: str | None) -> tuple[OperationView, bool]:
        """An EKS managed node group: its count, labels and taints (whole sets, as for a HyperPod group) change
        through UpdateNodegroupConfig; nothing else of it changes here."""
        name = nodegroup["nodegroupName"]
        asked = request.model_dump(exclude={"count", "labels", "taints", "capacity_type"})
        others = {k for k, v in asked.items() if v not in (None, False)}
        if others or (request.count is None and request.labels is None and request.taints is None):
            raise Invalid(f"{name} is an EKS managed node group: only its count, labels and taints change here (not "
                          + (", ".join(sorted(others)) or "nothing") + ")", details={"kind": "eks-nodegroup"})
        capacity = CapacityType.SPOT if nodegroup.get("capacityType") == "SPOT" else CapacityType.ON_DEMAND
        if request.capacity_type is not None and request.capacity_type is not capacity:
            raise Conflict(f"EKS node group {name} is {capacity.value}: its capacity type is fixed for its life",
                           details={"field": "capacity_type", "current": capacity.value})
        taints = [t.model_dump() for t in request.taints] if request.taints is not None else None
        check_lengths(name, request.labels, taints)
        if nodegroup["status"] != "ACTIVE":  # as EKS's ResourceInUseException: one update at a time
            raise Conflict(f"EKS node group {name} is {nodegroup['status']}: it changes once it is ACTIVE",
                           details={"status": nodegroup["status"]})
        scaling = None
        if request.count is not None:
            current = nodegroup.get("scalingConfig") or {}
            scaling = {"desiredSize": request.count, "minSize": min(int(current.get("minSize", 0)), request.count),
                       "maxSize": max(int(current.get("maxSize", 1)), request.count, 1)}
        change = GroupChange(cluster=record.name, region=record.region, hyperpod_cluster=str(record.hyperpod_name),
                             group=name, action=GroupAction.UPDATE, eks_cluster=record.eks_name, scaling=scaling,
                             nodegroup_labels=request.labels, nodegroup_taints=eks_taints(taints)
                             if taints is not None else None, requested_by=principal.name)
        return self._engine.submit(UPDATE_KIND, change, principal, idempotency_key)

    @verb(Role.ADMIN)
    def delete_group(self, principal: Principal, cluster: str, group: str,
                     idempotency_key: str | None = None) -> tuple[OperationView, bool]:
        """Delete the group and its instances (their volumes are wiped) with InstanceGroupsToDelete."""
        record, hyperpod = self._record(cluster)
        described = self._describe(record, hyperpod, fresh=True)
        if find_group(described, group) is None and (nodegroup := self._nodegroup(record, group)) is not None:
            if nodegroup["status"] not in ("ACTIVE", "DEGRADED", "CREATE_FAILED"):
                raise Conflict(f"EKS node group {group} is {nodegroup['status']}: it can be deleted once that ends")
            change = GroupChange(cluster=cluster, region=record.region, hyperpod_cluster=hyperpod, group=group,
                                 action=GroupAction.DELETE, eks_cluster=record.eks_name, requested_by=principal.name)
            return self._engine.submit(DELETE_KIND, change, principal, idempotency_key)
        self._details(described, cluster, group)
        check_karpenter_owned(cluster, group, self._karpenter_groups(cluster, described), NODE_CLASS, delete=True)
        self._updatable(cluster, described)
        change = GroupChange(cluster=cluster, region=record.region, hyperpod_cluster=hyperpod, group=group,
                             action=GroupAction.DELETE, requested_by=principal.name)
        return self._engine.submit(DELETE_KIND, change, principal, idempotency_key)

    @verb(Role.OPERATOR)
    def update_software(self, principal: Principal, cluster: str, group: str, request: SoftwareUpdate,
                        idempotency_key: str | None = None) -> tuple[OperationView, bool]:
        """UpdateClusterSoftware for the group: its nodes move to the HyperPod AMI release asked (the latest
        by default), rolling; a no-op when it already runs it."""
        record, hyperpod = self._record(cluster)
        described = self._describe(record, hyperpod, fresh=True)
        details = self._details(described, cluster, group)
        if details.get("SoftwareUpdateStatus") in ("Pending", "InProgress", "RollbackInProgress"):
            raise Conflict(f"instance group {group}'s software update is {details['SoftwareUpdateStatus']} already",
                           details={"status": details["SoftwareUpdateStatus"]})
        self._updatable(cluster, described)
        change = GroupChange(cluster=cluster, region=record.region, hyperpod_cluster=hyperpod, group=group,
                             action=GroupAction.SOFTWARE, image_release=request.image_release,
                             requested_by=principal.name)
        return self._engine.submit(SOFTWARE_KIND, change, principal, idempotency_key)
