"""The sandbox's SageMaker HyperPod: the cluster, node and training-plan APIs moto lacks or stubs.

Moto stores a HyperPod cluster as InService at once, drops most fields, invents node ids and has no
update, batch node, software, event or training-plan calls. This simulator owns those operations for the
sandbox front: handlers check what AWS checks semantically (the front has already validated enums,
patterns and ranges against the botocore model), store every request field, answer in the model's
output shapes, and record intent; all status changes then happen in :meth:`HyperPodSimulator.tick`
(see :mod:`.hyperpod_lifecycle`). HyperPod nodes of
EKS-orchestrated clusters are Kubernetes Nodes in the emulator cluster that ``eks_lookup`` names.
Handlers never sleep and never change a status that AWS changes asynchronously.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

from sandbox.kube.emulator import Emulator

from . import hyperpod_checks as checks
from . import hyperpod_node_ops as node_ops
from .base import AwsError, Call, FaultRegistry, SimClock
from .hyperpod_access import HyperPodAccess
from .hyperpod_karpenter import ManagedKarpenter, enabled, scaling_output
from .hyperpod_lifecycle import (
    CAPACITY_RETRY,
    DELETE,
    MIN_COUNT_WINDOW,
    SETUP,
    Lifecycle,
    PlacementOf,
    default_placement_of,
)
from .hyperpod_nodes import KubeNodes
from .hyperpod_plans import TrainingPlans, _epoch
from .hyperpod_state import DHC, LAUNCH, RUN, ClusterRec, GroupRec, Ids, cluster_from_dict, cluster_to_dict, page

CLUSTER_FIELDS = ("VpcConfig", "Orchestrator", "NodeRecovery", "TieredStorageConfig", "NodeProvisioningMode",
                  "ClusterRole", "AutoScaling", "RestrictedInstanceGroupsConfig", "Tags")
LATEST_RELEASE = "2026.1.0"
RELEASE_AMIS = {"2025.6.0": "ami-0c2a1f3e5d7b9a8c6", LATEST_RELEASE: "ami-0f4b3d2c1a9e8f7d6"}
GROUP_DETAIL_ECHO = ("InstanceGroupName", "InstanceType", "LifeCycleConfig", "ExecutionRole", "InstanceStorageConfigs",
                     "OnStartDeepHealthChecks", "TrainingPlanArn", "OverrideVpcConfig", "ScheduledUpdateConfig",
                     "CapacityRequirements", "SlurmConfig", "NetworkInterface")


class Extension(Protocol):
    """Another simulator of SageMaker operations, served through this one (:meth:`HyperPodSimulator.extend`)."""

    state_key: str
    operations: frozenset[str]

    def handle(self, call: Call) -> dict[str, Any]: ...

    def tick(self, now: float) -> None: ...

    def to_state(self) -> dict[str, Any]: ...

    def load_state(self, state: dict[str, Any]) -> None: ...


class HyperPodSimulator:
    service = "sagemaker"
    operations = frozenset({
        "CreateCluster", "DescribeCluster", "ListClusters", "UpdateCluster", "DeleteCluster", "ListClusterNodes",
        "DescribeClusterNode", "BatchRebootClusterNodes", "BatchReplaceClusterNodes", "BatchDeleteClusterNodes",
        "BatchAddClusterNodes", "UpdateClusterSoftware", "StartClusterHealthCheck", "ListClusterEvents",
        "DescribeClusterEvent", "SearchTrainingPlanOfferings", "CreateTrainingPlan", "ListTrainingPlans",
        "DescribeTrainingPlan", "ListTags",
    })

    def __init__(self, clock: SimClock, faults: FaultRegistry, kube: Emulator | None,
                 eks_lookup: Callable[[str], str | None], quota: Callable[[str], int] | None = None, *,
                 account: str = "123456789012", region: str = "us-west-2", seed: str = "instantstart",
                 placement_of: PlacementOf | None = None,
                 eks_version: Callable[[str], str | None] | None = None,
                 facts: checks.WorldFacts | None = None, eks_call: checks.EksCall | None = None) -> None:
        self.clock = clock
        self.faults = faults
        self.eks_lookup = eks_lookup
        self.quota = quota
        self.account = account
        self.region = region
        self.ids = Ids(seed)
        self.clusters: dict[str, ClusterRec] = {}
        self.facts = facts  # None: the simulator alone (unit tests), no account to check requests against
        self.access = HyperPodAccess(eks_call, account)
        self.plans = TrainingPlans(account, region, self._plan_in_use)
        self.life = Lifecycle(faults, KubeNodes(kube, region, eks_version), self.ids, region,
                              placement_of or default_placement_of(region), self._ips_in_use, self._plan_gate)
        self.karpenter = ManagedKarpenter(kube, self.life, region, faults)  # autoscaling: CRDs and the controller
        self._lock = threading.RLock()
        self._extensions: dict[str, Extension] = {}

    def extend(self, extension: Extension) -> None:
        """Serve another simulator's SageMaker operations too (the MLflow tracking servers): dispatched, ticked
        and saved (under its ``state_key``) with this one's, since the front routes a service to one simulator."""
        self._extensions[extension.state_key] = extension
        self.operations = self.operations | extension.operations

    def _ips_in_use(self, subnet: str) -> set[str]:
        return {n.ip for c in self.clusters.values() for n in c.nodes if n.subnet == subnet and n.ip}

    # --- SimulatedService ------------------------------------------------------------------------------

    def handle(self, call: Call) -> dict[str, Any]:
        for extension in self._extensions.values():
            if call.operation in extension.operations:
                return extension.handle(call)
        handler: Callable[[dict[str, Any], float], dict[str, Any]] = getattr(self, "_op_" + call.operation)
        with self._lock:
            return handler(call.params, self.clock.now())

    def tick(self, now: float) -> None:
        with self._lock:
            self.plans.tick(now)
            for name, cluster in list(self.clusters.items()):
                if not self.life.advance(cluster, now):
                    del self.clusters[name]
                else:
                    self.karpenter.reconcile(cluster, now)
        for extension in self._extensions.values():
            extension.tick(now)

    def to_state(self) -> dict[str, Any]:
        with self._lock:
            return {"ids": {"seed": self.ids.seed, "counter": self.ids.counter},
                    "clusters": [cluster_to_dict(c) for c in self.clusters.values()],
                    "training_plans": self.plans.to_state(),
                    **{key: e.to_state() for key, e in self._extensions.items()}}

    def load_state(self, state: dict[str, Any]) -> None:
        with self._lock:
            self.ids.seed = state["ids"]["seed"]
            self.ids.counter = int(state["ids"]["counter"])
            self.clusters = {c["name"]: cluster_from_dict(c) for c in state.get("clusters", [])}
            self.plans.load(state.get("training_plans") or {})
            for key, extension in self._extensions.items():
                extension.load_state(state.get(key) or {})

    # --- helpers ----------------------------------------------------------------------------------------

    def _find(self, name_or_arn: str) -> ClusterRec:
        for cluster in self.clusters.values():
            if name_or_arn in (cluster.name, cluster.arn):
                return cluster
        raise AwsError("ResourceNotFound", f"Cluster {name_or_arn} not found.")

    def _plan_in_use(self, arn: str) -> int:
        return sum(self.life.current_count(c, g) for c in self.clusters.values() for g in c.groups
                   if g.spec.get("TrainingPlanArn") == arn)

    def _instance_type(self, spec: dict[str, Any]) -> str:
        return str(spec.get("InstanceType") or (spec.get("InstanceRequirements") or {}).get("InstanceTypes", [""])[0])

    def _check_quota(self, wanted: dict[str, int], exclude: ClusterRec | None = None) -> None:
        """ResourceLimitExceeded when the account's ``<type> for cluster usage`` quota would be exceeded."""
        for instance_type, delta in wanted.items():
            if delta <= 0:
                continue
            if self.quota is None:
                continue
            limit = self.quota(instance_type)
            used = sum(g.target for c in self.clusters.values() if c is not exclude and c.status != "Deleting"
                       for g in c.groups if self._instance_type(g.spec) == instance_type)
            if exclude is not None:
                used += sum(g.target for g in exclude.groups if self._instance_type(g.spec) == instance_type)
            if used + delta > limit:
                raise AwsError("ResourceLimitExceeded", f"The account-level service limit '{instance_type} for "
                               f"cluster usage' is {limit} Instances, with current utilization of {used} Instances "
                               f"and a request delta of {delta} Instances. Please use AWS Service Quotas to request "
                               "an increase for this quota. If AWS Service Quotas is not available, contact AWS "
                               "support to request an increase for this quota.")

    def _check_groups(self, c: ClusterRec | None, specs: list[dict[str, Any]], config: dict[str, Any]) -> None:
        """The group specs of a CreateCluster (``c`` None) or UpdateCluster, under the cluster configuration
        ``config`` they will run with: names, instance types, training plans, the cross-field rules."""
        seen: set[str] = set()
        plan_use: dict[str, int] = {}  # plan ARN -> instances the groups of this request already take
        for spec in specs:
            name = spec["InstanceGroupName"]
            if name in seen:
                raise AwsError("ValidationException", f"Instance group names must be unique. Duplicate instance "
                               f"group name: {name}.")
            seen.add(name)
            if ("InstanceType" in spec) == ("InstanceRequirements" in spec):
                raise AwsError("ValidationException", f"Instance group {name}: specify exactly one of InstanceType "
                               "and InstanceRequirements.")
            if c is not None and not c.config.get("Orchestrator", {}).get("Eks") and spec.get("KubernetesConfig"):
                raise AwsError("ValidationException", f"Instance group {name}: KubernetesConfig is only supported "
                               "for clusters orchestrated by Amazon EKS.")
            existing = c.group(name) if c is not None else None
            if c is not None and existing is not None:
                checks.check_unchanged(name, existing.spec, spec)
                if any(n.phase == DHC for n in c.group_nodes(name)):
                    raise AwsError("ValidationException", f"Instance group {name} cannot be updated while deep "
                                   "health checks are in progress on its instances.")
            checks.check_group_rules(spec, config)
            plan = spec.get("TrainingPlanArn")
            if plan is not None:
                found = self.plans.find(plan)
                if found is None:
                    raise AwsError("ValidationException", f"Training plan {plan} does not exist.")
                types = {rc["InstanceType"] for rc in found["ReservedCapacitySummaries"]}
                if self._instance_type(spec) not in types:
                    raise AwsError("ValidationException", f"Instance group {name}: instance type "
                                   f"{self._instance_type(spec)} does not match training plan {plan}.")
                arn = found["TrainingPlanArn"]
                subnets = list((spec.get("OverrideVpcConfig") or config.get("VpcConfig") or {}).get("Subnets") or [])
                in_use = plan_use.get(arn, 0) + sum(
                    g.target for other in self.clusters.values() if other.status != "Deleting" for g in other.groups
                    if g.spec.get("TrainingPlanArn") in (plan, arn) and not (other is c and g.name == name))
                checks.check_plan(spec, found, lambda s: self.life.placement_of(s).zone, subnets, in_use)
                plan_use[arn] = plan_use.get(arn, 0) + int(spec["InstanceCount"])

    def _check_world(self, config: dict[str, Any], specs: list[dict[str, Any]], *, check_vpc: bool = True,
                     role_changed: bool) -> None:
        """Prerequisites in the account: the EKS cluster's authentication mode, network, roles, buckets."""
        vpc_id: str | None = None
        eks = (config.get("Orchestrator") or {}).get("Eks")
        cluster = self.access.cluster(eks["ClusterArn"]) if eks else None
        if cluster is not None:
            checks.check_eks_access(cluster)
            vpc_id = (cluster.get("resourcesVpcConfig") or {}).get("vpcId")
        if self.facts is None:
            return
        if check_vpc and config.get("VpcConfig"):
            vpc_id = checks.check_network(self.facts, config["VpcConfig"], vpc_id, "VpcConfig")
        checks.check_groups_in_world(self.facts, specs, vpc_id)
        if role_changed and (config.get("AutoScaling") or {}).get("Mode") == "Enable" and config.get("ClusterRole"):
            checks.check_role(self.facts, config["ClusterRole"], checks.HYPERPOD)

    def _min_deadline(self, c: ClusterRec, g: GroupRec, now: float) -> None:
        """Continuous provisioning: a group with MinInstanceCount must reach it within 3 hours or roll back."""
        g.min_deadline = now + MIN_COUNT_WINDOW if c.continuous and g.spec.get("MinInstanceCount") else None

    def _plan_gate(self, arn: str, t: float) -> tuple[bool, float | None, str]:
        """May a node of a group on training plan ``arn`` launch at ``t``? (ok, when to retry, why not)."""
        plan = self.plans.find(arn)
        if plan is None:
            return False, None, f"Training plan {arn} does not exist."
        opens = max(float(plan["StartTime"]), float(plan.get("_due") or 0))
        if t < opens:
            return False, opens, f"Waiting for training plan {plan['TrainingPlanName']} to become Active."
        if t >= float(plan["EndTime"]):
            return False, None, f"Training plan {plan['TrainingPlanName']} has expired."
        names = (arn, plan["TrainingPlanArn"], plan["TrainingPlanName"])
        on_plan = {(c.name, g.name) for c in self.clusters.values() for g in c.groups
                   if g.spec.get("TrainingPlanArn") in names}
        launched = sum(1 for c in self.clusters.values() for n in c.nodes
                       if n.instance_id and not n.end and (c.name, n.group) in on_plan)
        if launched >= int(plan["TotalInstanceCount"]):
            return False, t + CAPACITY_RETRY, (f"All {plan['TotalInstanceCount']} instances of training plan "
                                               f"{plan['TrainingPlanName']} are in use.")
        return True, None, ""

    def _new_group(self, spec: dict[str, Any], restricted: bool) -> GroupRec:
        image = spec.get("ImageId")
        release = spec.get("ImageReleaseVersion") or LATEST_RELEASE
        ami = image if image and image != "default" else RELEASE_AMIS.get(release, RELEASE_AMIS[LATEST_RELEASE])
        return GroupRec(name=spec["InstanceGroupName"], spec=dict(spec), target=int(spec["InstanceCount"]),
                        restricted=restricted, current_release=release, desired_release=release,
                        current_image_id=ami, desired_image_id=ami)

    # --- clusters ---------------------------------------------------------------------------------------

    def _op_CreateCluster(self, p: dict[str, Any], now: float) -> dict[str, Any]:
        name = p["ClusterName"]
        if name in self.clusters:
            raise AwsError("ResourceInUse", f"Resource Already Exists: Cluster with name {name} already exists. "
                           "Choose a different name.")
        groups = list(p.get("InstanceGroups") or [])
        restricted = list(p.get("RestrictedInstanceGroups") or [])
        orchestrator = p.get("Orchestrator") or {}
        if "Eks" in orchestrator and "Slurm" in orchestrator:
            raise AwsError("ValidationException", "Specify only one orchestrator: Eks or Slurm.")
        kube_cluster = None
        eks = orchestrator.get("Eks")
        if eks is not None:
            kube_cluster = self.eks_lookup(eks["ClusterArn"])
            if kube_cluster is None:
                raise AwsError("ValidationException", f"The EKS cluster {eks['ClusterArn']} does not exist or is "
                               "not in ACTIVE state.")
            if p.get("VpcConfig") is None:
                raise AwsError("ValidationException", "VpcConfig is required for clusters orchestrated by Amazon EKS.")
        elif p.get("NodeProvisioningMode") or p.get("AutoScaling", {}).get("Mode") == "Enable":
            raise AwsError("ValidationException", "NodeProvisioningMode and AutoScaling are only supported for "
                           "clusters orchestrated by Amazon EKS.")
        if p.get("AutoScaling", {}).get("Mode") == "Enable" and not p.get("ClusterRole"):
            raise AwsError("ValidationException", "ClusterRole is required when AutoScaling is enabled.")
        config = {k: p[k] for k in CLUSTER_FIELDS if k in p}
        checks.check_cluster_rules(config)
        self._check_groups(None, groups + restricted, config)
        wanted: dict[str, int] = {}
        for spec in groups + restricted:
            wanted[self._instance_type(spec)] = wanted.get(self._instance_type(spec), 0) + int(spec["InstanceCount"])
        self._check_quota(wanted)
        self._check_world(config, groups + restricted, role_changed=True)
        if eks is not None and kube_cluster is not None:
            self.access.grant(kube_cluster, (s["ExecutionRole"] for s in groups + restricted))
        cluster_id = self.ids.cluster_id()
        config.setdefault("NodeRecovery", "Automatic")
        c = ClusterRec(name=name, id=cluster_id, arn=f"arn:aws:sagemaker:{self.region}:{self.account}:cluster/"
                       f"{cluster_id}", created=now, config=config, due=now + SETUP, kube_cluster=kube_cluster)
        for spec, is_restricted in [(s, False) for s in groups] + [(s, True) for s in restricted]:
            g = self._new_group(spec, is_restricted)
            c.groups.append(g)
            self._min_deadline(c, g, now)
            self.life.scale(c, g, now + SETUP, by_update=False)
        self.clusters[name] = c
        self.karpenter.install(c)
        self.life.event(c, now, "Info", "Cluster", "Cluster creation started.")
        return {"ClusterArn": c.arn}

    def _op_DescribeCluster(self, p: dict[str, Any], now: float) -> dict[str, Any]:
        c = self._find(p["ClusterName"])
        out: dict[str, Any] = {"ClusterArn": c.arn, "ClusterName": c.name, "ClusterStatus": c.status,
                               "CreationTime": c.created,
                               "InstanceGroups": [self._group_details(c, g) for g in c.groups if not g.restricted]}
        if c.failure:
            out["FailureMessage"] = c.failure
        restricted = [self._restricted_details(c, g) for g in c.groups if g.restricted]
        if restricted:
            out["RestrictedInstanceGroups"] = restricted
        cfg = c.config
        for key in ("VpcConfig", "Orchestrator", "TieredStorageConfig", "NodeRecovery", "NodeProvisioningMode",
                    "ClusterRole"):
            if key in cfg:
                out[key] = cfg[key]
        scaling = scaling_output(c)
        if scaling is not None:
            out["AutoScaling"] = scaling
        if "RestrictedInstanceGroupsConfig" in cfg:
            shared = cfg["RestrictedInstanceGroupsConfig"]["SharedEnvironmentConfig"]
            out["RestrictedInstanceGroupsConfig"] = {"SharedEnvironmentConfig": {
                "CurrentFSxLustreConfig": shared["FSxLustreConfig"],
                "DesiredFSxLustreConfig": shared["FSxLustreConfig"],
                "CurrentFSxLustreDeletionPolicy": shared["FSxLustreDeletionPolicy"],
                "DesiredFSxLustreDeletionPolicy": shared["FSxLustreDeletionPolicy"]}}
        return out

    def _group_details(self, c: ClusterRec, g: GroupRec) -> dict[str, Any]:
        spec = g.spec
        out: dict[str, Any] = {k: spec[k] for k in GROUP_DETAIL_ECHO if k in spec}
        out.update({"CurrentCount": self.life.current_count(c, g), "TargetCount": g.target, "Status": g.status,
                    "ThreadsPerCore": spec.get("ThreadsPerCore", 1),
                    "CurrentImageId": g.current_image_id, "DesiredImageId": g.desired_image_id,
                    "CurrentImageReleaseVersion": g.current_release, "DesiredImageReleaseVersion": g.desired_release,
                    "ImageVersionStatus": "UpToDate" if g.current_release == LATEST_RELEASE else "UpdateAvailable",
                    "TargetStateCount": sum(1 for n in c.group_nodes(g.name)
                                            if n.instance_id and n.image_release == g.desired_release)})
        if "MinInstanceCount" in spec:
            out["MinCount"] = spec["MinInstanceCount"]
        if "InstanceRequirements" in spec:
            types = spec["InstanceRequirements"]["InstanceTypes"]
            out["InstanceRequirements"] = {"CurrentInstanceTypes": types, "DesiredInstanceTypes": types}
            out["InstanceTypeDetails"] = [{"InstanceType": t, "ThreadsPerCore": spec.get("ThreadsPerCore", 1),
                                           "CurrentCount": sum(1 for n in c.group_nodes(g.name)
                                                               if n.instance_type == t and n.phase == RUN)}
                                          for t in types]
        if "TrainingPlanArn" in spec:
            out["TrainingPlanStatus"] = self.plans.status(spec["TrainingPlanArn"]) or "NotFound"
        if "AutoPatchConfig" in spec:
            auto = dict(spec["AutoPatchConfig"])
            schedule = auto.pop("PatchSchedule", None)
            if schedule is not None:
                auto["CurrentPatchSchedule"] = auto["DesiredPatchSchedule"] = schedule
            out["AutoPatchConfig"] = auto
        if "KubernetesConfig" in spec:
            kc = spec["KubernetesConfig"]
            out["KubernetesConfig"] = {"CurrentLabels": kc.get("Labels", {}), "DesiredLabels": kc.get("Labels", {}),
                                       "CurrentTaints": kc.get("Taints", []), "DesiredTaints": kc.get("Taints", [])}
        if g.status in ("Creating", "Updating") or (c.continuous and any(
                n.phase == LAUNCH or n.end for n in c.group_nodes(g.name))):
            out["ActiveOperations"] = {"Scaling": 1}
        if g.software_status:
            out["SoftwareUpdateStatus"] = g.software_status
            if g.software_config is not None:
                out["ActiveSoftwareUpdateConfig"] = g.software_config
        return out

    def _restricted_details(self, c: ClusterRec, g: GroupRec) -> dict[str, Any]:
        spec = g.spec
        keys = ("InstanceGroupName", "InstanceType", "ExecutionRole", "InstanceStorageConfigs",
                "OnStartDeepHealthChecks", "TrainingPlanArn", "OverrideVpcConfig", "ScheduledUpdateConfig")
        out: dict[str, Any] = {k: spec[k] for k in keys if k in spec}
        out.update({"CurrentCount": self.life.current_count(c, g), "TargetCount": g.target, "Status": g.status,
                    "ThreadsPerCore": spec.get("ThreadsPerCore", 1)})
        if "EnvironmentConfig" in spec:
            out["EnvironmentConfig"] = {**spec["EnvironmentConfig"],
                                        "S3OutputPath": f"s3://sagemaker-{self.region}-{self.account}/{c.name}/"}
        if "TrainingPlanArn" in spec:
            out["TrainingPlanStatus"] = self.plans.status(spec["TrainingPlanArn"]) or "NotFound"
        return out

    def _op_ListClusters(self, p: dict[str, Any], now: float) -> dict[str, Any]:
        after, before = _epoch(p.get("CreationTimeAfter")), _epoch(p.get("CreationTimeBefore"))
        sort_key: Callable[[ClusterRec], tuple[Any, ...]] = (
            (lambda c: (c.name,)) if p.get("SortBy") == "NAME" else (lambda c: (c.created, c.name)))
        window, token = page(list(self.clusters.values()), sort_key, p.get("SortOrder") == "Descending",
                             p.get("NextToken"), int(p.get("MaxResults") or 10))
        # MaxResults bounds the clusters evaluated; filters then apply within that window (as documented).
        matches = [c for c in window if (after is None or c.created > after) and (before is None or c.created < before)
                   and p.get("NameContains", "") in c.name
                   and (not p.get("TrainingPlanArn") or any(g.spec.get("TrainingPlanArn") == p["TrainingPlanArn"]
                                                            for g in c.groups))]
        summaries = []
        for c in matches:
            summary: dict[str, Any] = {"ClusterArn": c.arn, "ClusterName": c.name, "CreationTime": c.created,
                                       "ClusterStatus": c.status, "ImageVersionStatus": "UpToDate"}
            plans = sorted({g.spec["TrainingPlanArn"] for g in c.groups if "TrainingPlanArn" in g.spec})
            if plans:
                summary["TrainingPlanArns"] = plans
            summaries.append(summary)
        return {"ClusterSummaries": summaries, **({"NextToken": token} if token else {})}

    def _op_UpdateCluster(self, p: dict[str, Any], now: float) -> dict[str, Any]:
        c = self._find(p["ClusterName"])
        busy = c.status not in ("InService",) and not (c.continuous and c.status == "Updating")
        if busy:
            raise AwsError("ConflictException", f"Cluster {c.name} is in {c.status} state. UpdateCluster is only "
                           "allowed when the cluster is InService.")
        specs = list(p.get("InstanceGroups") or [])
        restricted = list(p.get("RestrictedInstanceGroups") or [])
        to_delete = list(p.get("InstanceGroupsToDelete") or [])
        for name in to_delete:
            if c.group(name) is None:
                raise AwsError("ValidationException", f"Instance group {name} does not exist in cluster {c.name}.")
            if any(s["InstanceGroupName"] == name for s in specs + restricted):
                raise AwsError("ValidationException", f"Instance group {name} cannot be both updated and deleted.")
        eks = (p.get("Orchestrator") or {}).get("Eks")
        if eks is not None and eks != c.config.get("Orchestrator", {}).get("Eks"):
            raise AwsError("ValidationException", "The orchestrator of a cluster cannot be changed.")
        scaling = p.get("AutoScaling", c.config.get("AutoScaling") or {})
        if "ClusterRole" in p and scaling.get("Mode") == "Enable" and c.config.get("AutoScaling", {}).get("Mode") == \
                "Enable":
            raise AwsError("ValidationException", "ClusterRole cannot be changed while AutoScaling is enabled.")
        if p.get("NodeProvisioningMode") and not c.config.get("Orchestrator", {}).get("Eks"):
            raise AwsError("ValidationException", "NodeProvisioningMode is only supported for clusters orchestrated "
                           "by Amazon EKS.")
        config = {**c.config, **{k: p[k] for k in CLUSTER_FIELDS if k in p}}
        checks.check_cluster_rules(config)
        self._check_groups(c, specs + restricted, config)
        sent = {s["InstanceGroupName"] for s in specs + restricted} | set(to_delete)
        for kept in c.groups:  # groups the request leaves alone must still fit the new cluster configuration
            if kept.name not in sent:
                checks.check_group_rules(kept.spec, config)
        wanted: dict[str, int] = {}
        for spec in specs + restricted:
            existing = c.group(spec["InstanceGroupName"])
            delta = int(spec["InstanceCount"]) - (existing.target if existing else 0)
            wanted[self._instance_type(spec)] = wanted.get(self._instance_type(spec), 0) + delta
        self._check_quota(wanted, exclude=c)
        self._check_world(config, specs + restricted, check_vpc=False,
                          role_changed="ClusterRole" in p or "AutoScaling" in p)
        if c.kube_cluster is not None:
            self.access.grant(c.kube_cluster, (s["ExecutionRole"] for s in specs + restricted))
        was_enabled = enabled(c)
        c.config = config
        self.karpenter.install(c)
        self.karpenter.changed(c, was_enabled, now)
        changed = False
        for spec, is_restricted in [(s, False) for s in specs] + [(s, True) for s in restricted]:
            g = c.group(spec["InstanceGroupName"])
            if g is None:
                g = self._new_group(spec, is_restricted)
                c.groups.append(g)
                g.status = "InService" if c.continuous and g.target == 0 else "Creating"
            else:
                # The spec as sent, as AWS takes it: a field left out is gone, not kept from before.
                g.previous = {"spec": g.spec, "target": g.target}
                g.spec, g.target = dict(spec), int(spec["InstanceCount"])
                g.status = "InService" if c.continuous else "Updating"
            self._min_deadline(c, g, now)
            self.life.scale(c, g, now, by_update=not c.continuous)
            changed = True
        for name in to_delete:
            g = c.group(name)
            assert g is not None
            g.status = "Deleting"
            for node in c.group_nodes(name):
                self.life.request(node, "Delete", now)
            changed = True
        if changed and not c.continuous:
            c.status = "Updating"
        c.failure = ""
        self.life.event(c, now, "Info", "Cluster", "Cluster update requested.")
        return {"ClusterArn": c.arn}

    def _op_DeleteCluster(self, p: dict[str, Any], now: float) -> dict[str, Any]:
        c = self._find(p["ClusterName"])
        if c.status == "Deleting":
            raise AwsError("ConflictException", f"Cluster {c.name} is already being deleted.")
        c.status, c.due = "Deleting", now + DELETE
        self.life.event(c, now, "Info", "Cluster", "Cluster deletion started.")
        return {"ClusterArn": c.arn}

    # --- nodes, software, health checks, events ---------------------------------------------------------

    def _op_ListClusterNodes(self, p: dict[str, Any], now: float) -> dict[str, Any]:
        return node_ops.list_nodes(self._find(p["ClusterName"]), p, self.region)

    def _op_DescribeClusterNode(self, p: dict[str, Any], now: float) -> dict[str, Any]:
        return node_ops.describe_node(self._find(p["ClusterName"]), p, self.region)

    def _op_BatchRebootClusterNodes(self, p: dict[str, Any], now: float) -> dict[str, Any]:
        return node_ops.batch_recover(self._find(p["ClusterName"]), p, now, "Reboot", self.life)

    def _op_BatchReplaceClusterNodes(self, p: dict[str, Any], now: float) -> dict[str, Any]:
        return node_ops.batch_recover(self._find(p["ClusterName"]), p, now, "Replace", self.life)

    def _op_BatchDeleteClusterNodes(self, p: dict[str, Any], now: float) -> dict[str, Any]:
        return node_ops.batch_delete(self._find(p["ClusterName"]), p, now, self.life)

    def _op_BatchAddClusterNodes(self, p: dict[str, Any], now: float) -> dict[str, Any]:
        c = self._find(p["ClusterName"])
        node_ops.check_add_total(p)
        wanted: dict[str, int] = {}
        for spec in p["NodesToAdd"]:
            g = c.group(spec["InstanceGroupName"])
            if g is not None:
                t = self._instance_type(g.spec)
                wanted[t] = wanted.get(t, 0) + int(spec["IncrementTargetCountBy"])
        if not (p.get("ClientToken") and p["ClientToken"] in c.add_tokens):
            self._check_quota(wanted, exclude=c)
        return node_ops.batch_add(c, p, now, self.life)

    def _op_UpdateClusterSoftware(self, p: dict[str, Any], now: float) -> dict[str, Any]:
        return node_ops.update_software(self._find(p["ClusterName"]), p, now, self.life, LATEST_RELEASE, RELEASE_AMIS)

    def _op_StartClusterHealthCheck(self, p: dict[str, Any], now: float) -> dict[str, Any]:
        return node_ops.start_health_check(self._find(p["ClusterName"]), p, now, self.life)

    def _op_ListTags(self, p: dict[str, Any], now: float) -> dict[str, Any]:
        """The tags a cluster was created with (``Tags`` of CreateCluster); only cluster ARNs are simulated."""
        return {"Tags": list(self._find(p["ResourceArn"]).config.get("Tags") or [])}

    def _op_ListClusterEvents(self, p: dict[str, Any], now: float) -> dict[str, Any]:
        return node_ops.list_events(self._find(p["ClusterName"]), p)

    def _op_DescribeClusterEvent(self, p: dict[str, Any], now: float) -> dict[str, Any]:
        return node_ops.describe_event(self._find(p["ClusterName"]), p)

    # --- training plans ---------------------------------------------------------------------------------

    def _op_SearchTrainingPlanOfferings(self, p: dict[str, Any], now: float) -> dict[str, Any]:
        return self.plans.search(p, now)

    def _op_CreateTrainingPlan(self, p: dict[str, Any], now: float) -> dict[str, Any]:
        return self.plans.create(p, now)

    def _op_ListTrainingPlans(self, p: dict[str, Any], now: float) -> dict[str, Any]:
        return self.plans.list(p)

    def _op_DescribeTrainingPlan(self, p: dict[str, Any], now: float) -> dict[str, Any]:
        return self.plans.describe(p["TrainingPlanName"])
