"""HyperPod's managed Karpenter autoscaling as a managed feature (docs sagemaker-hyperpod-eks-autoscaling;
aws-facts §5, §6): HyperPod runs Karpenter itself; we give it a cluster role, switch it on and tell it which
instance groups it may scale.

* :meth:`ManagedKarpenter.preflight` names EACH missing prerequisite: continuous node provisioning
  (``NodeProvisioningMode=Continuous``, chosen at cluster creation), automatic node recovery, a health-monitoring
  agent of at least :data:`MIN_HMA`, Karpenter CRDs at ``v1`` if a Karpenter is already installed, and for each
  chosen instance group the eligibility rules (it starts at 0 nodes, runs no deep health checks on start, uses
  no training plan) — a group already in our node class is past its start and keeps its nodes.
* The IAM role ``<cluster>-karpenter`` trusting ``hyperpod.sagemaker.amazonaws.com``, with the documented
  permissions (``sagemaker:BatchAddClusterNodes`` / ``BatchDeleteClusterNodes`` on this cluster, in this
  account; ``kms:CreateGrant`` / ``kms:DescribeKey`` through SageMaker only) as its inline policy.
* ``UpdateCluster`` with only ``AutoScaling {Mode: Enable, AutoScalerType: Karpenter}`` and ``ClusterRole``,
  once IAM has propagated the role.
* A ``HyperpodNodeClass`` and a ``NodePool`` named :data:`OBJECT_NAME`, labelled ours and stamped with the
  digest of what we applied, listing only the chosen groups (and their instance types); applied once HyperPod
  has installed Karpenter's CRDs. NodePools and node classes we did not create are never read into a decision,
  changed or deleted; one of our name that is not ours is refused.

Settings choose the groups (up to 10) and an optional cap on the NodePool's nodes; capacity is HyperPod's
only (asking for EC2 capacity is refused: that is open-source Karpenter with an EC2NodeClass, not this).
Disabling deletes our NodePool and node class first, then (once they are gone, and once the cluster takes
updates) sets ``Mode=Disable``, and deletes the role only once autoscaling reads Disable and is no longer
``Deleting``. ``AutoScaling.Status`` ``Failed`` is reported as failed (with its ``FailureMessage``);
``Creating`` and ``Deleting`` are not settled. :func:`preflight` is the read-only check the features
precheck calls; each problem starts with the rule it breaks.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal

from kubernetes import client as k8s
from pydantic import BaseModel, ConfigDict, Field, field_validator

from services.clusters.create_base import owned, tag_list
from services.components import kubeapi
from services.components.base import Component, Leftover, Observation, Target
from services.components.identity import find_role, role_tags
from services.components.manifests import APPLIED, COMPONENT_LABEL, MANAGED_LABEL, OURS
from services.errors import NotFound, Permanent

NAME = "managed-karpenter"
#: the managed features this one needs first: HyperPod's health-monitoring agent (the registry's component)
PREREQUISITES: tuple[str, ...] = ("health-monitoring-agent",)
OBJECT_NAME = "instantstart"  # our HyperpodNodeClass and NodePool
TRUSTED = "hyperpod.sagemaker.amazonaws.com"
INLINE_POLICY = "instantstart"
HEALTH_AGENT_NAMESPACE = "aws-hyperpod"  # where the health-monitoring agent's DaemonSets run
MIN_HMA = "1.0.742.0_1.0.241.0"  # the oldest health-monitoring agent managed Karpenter accepts (AWS docs)
MAX_GROUPS = 10  # instance groups one HyperpodNodeClass may name
NODECLASS_API = "karpenter.sagemaker.amazonaws.com/v1"
NODEPOOL_API = "karpenter.sh/v1"
KARPENTER_CRDS = ("nodepools.karpenter.sh", "hyperpodnodeclasses.karpenter.sagemaker.amazonaws.com")
EXISTING_KARPENTER_CRDS = ("nodepools.karpenter.sh", "nodeclaims.karpenter.sh")  # must serve v1 when present
UPDATABLE = ("InService",)


class KarpenterSettings(BaseModel):
    """Which HyperPod instance groups Karpenter may scale, and how far."""

    model_config = ConfigDict(extra="forbid")

    instance_groups: list[str] = Field(default_factory=list, max_length=MAX_GROUPS, description=(
        f"the HyperPod instance groups Karpenter scales (1-{MAX_GROUPS}; each must start at 0 nodes, run no deep "
        "health checks and use no training plan)"))
    capacity: str = Field("hyperpod", description="where nodes come from: HyperPod instance groups only")
    max_nodes: int | None = Field(None, ge=1, description="the NodePool's limits.nodes (unset: no cap)")

    @field_validator("capacity")
    @classmethod
    def _capacity(cls, value: str) -> str:
        if value.lower() != "hyperpod":
            raise ValueError(f"capacity {value!r}: managed Karpenter scales HyperPod instance groups only "
                             "(capacity 'hyperpod'); EC2 capacity is open-source Karpenter with an EC2NodeClass, "
                             "which this feature does not install")
        return "hyperpod"

    @field_validator("instance_groups")
    @classmethod
    def _unique(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("instance_groups names a group twice")
        return value


def _version(tag: str) -> tuple[int, ...]:
    return tuple(int(p) for p in tag.replace("_", ".").split(".") if p.isdigit())


def _digest(obj: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _instance_types(group: dict[str, Any]) -> list[str]:
    """A group's instance types as DescribeCluster shows them: its InstanceType, or the types its
    InstanceRequirements currently run (or are moving to)."""
    if group.get("InstanceType"):
        return [str(group["InstanceType"])]
    requirements = group.get("InstanceRequirements") or {}
    return [str(t) for t in requirements.get("CurrentInstanceTypes") or requirements.get("DesiredInstanceTypes")
            or requirements.get("InstanceTypes") or []]


def preflight(target: Target, settings: KarpenterSettings) -> list[str]:
    """Each reason ``target`` cannot get managed Karpenter with ``settings`` (empty: it can), each message
    starting with the rule it breaks; only reads (DescribeCluster, the Kubernetes API), never raises for them."""
    return ManagedKarpenter(settings).problems(target)


def nodeclass_groups(api: k8s.ApiClient) -> list[str]:
    """The instance groups our live HyperpodNodeClass names (empty: there is none of ours); one GET, no write.
    The instance-groups verbs ask it before a group is scaled or deleted under Karpenter's feet."""
    live = kubeapi.get(api, ManagedKarpenter().objects([])[0])
    if live is None or (live["metadata"].get("labels") or {}).get(MANAGED_LABEL) != OURS:
        return []
    return list((live.get("spec") or {}).get("instanceGroups") or [])


def _label(obj: dict[str, Any]) -> str:
    return f"{obj['kind']} {obj['metadata']['name']}"


class ManagedKarpenter(Component):
    """The feature, reconciling toward one :class:`KarpenterSettings` (no groups unless :meth:`configured`)."""

    name = NAME
    kind: Literal["addon", "manifest"] = "manifest"
    version = "karpenter.sh/v1"
    resource_type = "HyperPod AutoScaling + IAM role + Karpenter HyperpodNodeClass/NodePool"
    settings_model: ClassVar[type[BaseModel] | None] = KarpenterSettings

    def __init__(self, settings: KarpenterSettings | None = None) -> None:
        self.settings = settings or KarpenterSettings()

    def configured(self, settings: BaseModel | None) -> ManagedKarpenter:
        if settings is None:
            return ManagedKarpenter()
        return ManagedKarpenter(KarpenterSettings.model_validate(settings.model_dump()))

    # ----- names and documents ------------------------------------------------------------------------------

    @staticmethod
    def role_name(target: Target) -> str:
        return f"{target.cluster}-karpenter"

    def role_arn(self, target: Target) -> str:
        from services.clusters.iam_stage import partition  # at call time: iam_stage imports this package
        return f"arn:{partition(target.region)}:iam::{target.account}:role/{self.role_name(target)}"

    @staticmethod
    def trust() -> dict[str, Any]:
        return {"Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Principal": {"Service": [TRUSTED]}, "Action": "sts:AssumeRole"}]}

    @staticmethod
    def policy(cluster_arn: str) -> dict[str, Any]:
        """The documented permissions, on this cluster only."""
        return {"Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Action": ["sagemaker:BatchAddClusterNodes", "sagemaker:BatchDeleteClusterNodes"],
             "Resource": cluster_arn,
             "Condition": {"StringEquals": {"aws:ResourceAccount": "${aws:PrincipalAccount}"}}},
            {"Effect": "Allow", "Action": ["kms:CreateGrant", "kms:DescribeKey"], "Resource": "*",
             "Condition": {"StringLike": {"kms:ViaService": "sagemaker.*.amazonaws.com"}}}]}

    def objects(self, groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Our HyperpodNodeClass and NodePool for the chosen ``groups`` (DescribeCluster's group details),
        labelled ours and stamped."""
        names = list(self.settings.instance_groups)
        types = sorted({t for g in groups if g["InstanceGroupName"] in names for t in _instance_types(g)})
        node_class: dict[str, Any] = {"apiVersion": NODECLASS_API, "kind": "HyperpodNodeClass",
                                      "metadata": {"name": OBJECT_NAME}, "spec": {"instanceGroups": names}}
        pool_spec: dict[str, Any] = {
            "template": {"spec": {
                "nodeClassRef": {"group": NODECLASS_API.split("/")[0], "kind": "HyperpodNodeClass",
                                 "name": OBJECT_NAME},
                "requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": types}],
                "expireAfter": "Never"}},
            "disruption": {"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "30s"}}
        if self.settings.max_nodes is not None:
            pool_spec["limits"] = {"nodes": self.settings.max_nodes}
        pool: dict[str, Any] = {"apiVersion": NODEPOOL_API, "kind": "NodePool", "metadata": {"name": OBJECT_NAME},
                                "spec": pool_spec}
        for obj in (node_class, pool):
            obj["metadata"]["labels"] = {MANAGED_LABEL: OURS, COMPONENT_LABEL: NAME}
            obj["metadata"]["annotations"] = {APPLIED: _digest(obj)}
        return [node_class, pool]

    # ----- reads --------------------------------------------------------------------------------------------

    @staticmethod
    def _hyperpod(target: Target) -> tuple[dict[str, Any], str | None]:
        """DescribeCluster's answer, and why there is nothing to scale (None: there is a cluster)."""
        if not target.hyperpod_cluster:
            return {}, (f"hyperpod-cluster: {target.cluster} has no HyperPod cluster: managed Karpenter scales "
                        "HyperPod instance groups")
        try:
            cluster: dict[str, Any] = target.client("sagemaker").describe_cluster(
                ClusterName=target.hyperpod_cluster)
        except NotFound:
            return {}, f"hyperpod-cluster: HyperPod cluster {target.hyperpod_cluster} does not exist"
        return cluster, None

    def _role(self, target: Target) -> dict[str, Any] | None:
        return find_role(target, self.role_name(target))

    def _role_ours(self, target: Target) -> bool:
        return owned(role_tags(target, self.role_name(target)), target.cluster)

    def _has_policy(self, target: Target) -> bool:
        names = target.client("iam").all_pages("list_role_policies", "PolicyNames", RoleName=self.role_name(target))
        return INLINE_POLICY in names

    def _propagating(self, target: Target) -> bool:
        from services.clusters.iam_stage import PROPAGATION_SECONDS
        role = self._role(target)
        if role is None:
            return True
        created: datetime = role["CreateDate"]
        return (datetime.now(UTC) - created).total_seconds() < PROPAGATION_SECONDS

    @staticmethod
    def _kube(target: Target) -> Any:
        if target.kube is None:
            raise Permanent(f"{NAME}: the cluster's Kubernetes API is not registered")
        return target.kube

    def _crd(self, target: Target, name: str) -> Any | None:
        try:
            return k8s.ApiextensionsV1Api(self._kube(target)).read_custom_resource_definition(name)
        except NotFound:
            return None

    def _crds_ready(self, target: Target) -> bool:
        for name in KARPENTER_CRDS:
            crd = self._crd(target, name)
            if crd is None or not any(c.type == "Established" and c.status == "True"
                                      for c in (crd.status.conditions or [])):
                return False
        return True

    def _agent_versions(self, target: Target) -> list[str]:
        """The image tags of the health-monitoring agent's DaemonSets."""
        listed = k8s.AppsV1Api(self._kube(target)).list_namespaced_daemon_set(HEALTH_AGENT_NAMESPACE)
        tags: list[str] = []
        for ds in listed.items or []:
            pod = ds.spec.template.spec if ds.spec is not None else None
            if ds.metadata is None or not (ds.metadata.name or "").startswith("health-monitoring-agent") or \
                    pod is None:
                continue
            tags += [c.image.rpartition(":")[2] for c in pod.containers or [] if c.image]
        return tags

    # ----- preflight ----------------------------------------------------------------------------------------

    def preflight(self, target: Target, settings: BaseModel | None) -> list[str]:
        """The managed-features precheck's hook: :meth:`problems` of this feature with ``settings``."""
        return self.configured(settings).problems(target) if settings is not None else self.problems(target)

    def problems(self, target: Target, cluster: dict[str, Any] | None = None,
                 in_class: list[str] | None = None) -> list[str]:
        """Each reason this cluster cannot get managed Karpenter for the chosen groups (empty: it can).
        ``in_class``: the groups already in our live node class (past their start)."""
        if cluster is None:
            cluster, unusable = self._hyperpod(target)
            if unusable:
                return [unusable]
        if target.kube is None:
            return [f"kubernetes-api: the Kubernetes API of {target.cluster} is not registered: the preflight reads "
                    "the health-monitoring agent and Karpenter's CRDs there"]
        in_class = in_class if in_class is not None else self._live_groups(target)
        problems: list[str] = []
        if "Eks" not in (cluster.get("Orchestrator") or {}):
            problems.append("eks-orchestrator: the HyperPod cluster is not orchestrated by EKS: managed Karpenter "
                            "is EKS-only")
        if cluster.get("NodeProvisioningMode") != "Continuous":
            problems.append("continuous-provisioning: continuous node provisioning is off: managed Karpenter builds "
                            "on NodeProvisioningMode=Continuous, which is chosen when the cluster is created")
        if cluster.get("NodeRecovery") != "Automatic":
            problems.append("node-recovery: automatic node recovery is off "
                            f"(NodeRecovery={cluster.get('NodeRecovery', 'None')}): managed Karpenter needs "
                            "NodeRecovery=Automatic")
        versions = self._agent_versions(target)
        if not versions:
            problems.append(f"health-monitoring-agent: the HyperPod health-monitoring agent is not installed (needs "
                            f"{MIN_HMA} or later; the health-monitoring-agent component installs it)")
        elif min(_version(v) for v in versions) < _version(MIN_HMA):
            problems.append(f"health-monitoring-agent: the health-monitoring agent is "
                            f"{min(versions, key=_version)}: managed Karpenter needs {MIN_HMA} or later")
        for name in EXISTING_KARPENTER_CRDS:
            crd = self._crd(target, name)
            if crd is not None and not any(v.name == "v1" and v.served for v in crd.spec.versions or []):
                served = ", ".join(v.name for v in crd.spec.versions or [] if v.served)
                problems.append(f"karpenter-v1: a Karpenter is installed whose {name} CRD serves {served}, not v1: "
                                "managed Karpenter needs v1 NodePools and NodeClaims (upgrade or remove it)")
        problems += self._group_rules(cluster, in_class)
        return problems

    def eligible(self, cluster: dict[str, Any], in_class: list[str]) -> list[str]:
        """The cluster's groups that could be chosen now."""
        return [g["InstanceGroupName"] for g in cluster.get("InstanceGroups") or []
                if not self._group_problem(g, g["InstanceGroupName"] in in_class)]

    @staticmethod
    def _group_problem(group: dict[str, Any], started: bool) -> str | None:
        name = group["InstanceGroupName"]
        if not _instance_types(group):
            return (f"group-instance-types: instance group {name} shows no instance type (neither InstanceType nor "
                    "InstanceRequirements' current types): the NodePool must name them; retry once it has one")
        if group.get("OnStartDeepHealthChecks"):
            return (f"group-deep-health-checks: instance group {name} runs deep health checks on start "
                    f"({', '.join(group['OnStartDeepHealthChecks'])}): not supported with Karpenter (a check takes "
                    "60-90 minutes while pods wait)")
        if group.get("TrainingPlanArn"):
            return (f"group-training-plan: instance group {name} uses training plan {group['TrainingPlanArn']}: "
                    "managed Karpenter provisions on-demand capacity only")
        count = max(int(group.get("TargetCount") or 0), int(group.get("CurrentCount") or 0))
        if count and not started:
            return (f"group-starts-empty: instance group {name} has {count} node(s): managed Karpenter needs groups "
                    "that start at 0 nodes (it would scale them down to 0); scale it to 0 or add an empty group")
        return None

    def _group_rules(self, cluster: dict[str, Any], in_class: list[str]) -> list[str]:
        groups = {g["InstanceGroupName"]: g for g in cluster.get("InstanceGroups") or []}
        problems: list[str] = []
        chosen = self.settings.instance_groups
        if not chosen:
            problems.append("groups-chosen: no instance group chosen: name the groups Karpenter may scale (eligible: "
                            f"{', '.join(self.eligible(cluster, in_class)) or 'none'})")
        for name in chosen:
            group = groups.get(name)
            if group is None:
                problems.append(f"group-exists: HyperPod cluster {cluster.get('ClusterName')} has no instance group "
                                f"{name} "
                                f"(its groups: {', '.join(groups) or 'none'})")
                continue
            why = self._group_problem(group, name in in_class)
            if why:
                problems.append(why)
        if (cluster.get("AutoScaling") or {}).get("Mode") != "Enable":
            for name, group in groups.items():
                if name not in chosen and group.get("OnStartDeepHealthChecks"):
                    problems.append(f"other-groups-deep-health-checks: instance group {name} (not chosen) runs deep "
                                    "health checks on start, which HyperPod refuses on a cluster with AutoScaling "
                                    "enabled")
        return problems

    def _live(self, target: Target) -> dict[str, dict[str, Any] | None]:
        return {_label(o): kubeapi.get(self._kube(target), o) for o in self.objects([])}

    def _live_groups(self, target: Target) -> list[str]:
        return nodeclass_groups(self._kube(target))

    # ----- the component ------------------------------------------------------------------------------------

    def observe(self, target: Target) -> Observation:
        cluster, unusable = self._hyperpod(target)
        role = None if unusable else self._role(target)
        if unusable is None and role is not None and not self._role_ours(target):
            unusable = (f"the IAM role {self.role_name(target)} exists and is not {target.cluster}'s (no "
                        "instantstart tags): it is left alone; delete or rename it, then retry")
        if unusable is None and target.kube is None:
            unusable = f"{NAME}: the cluster's Kubernetes API is not registered"
        if unusable:
            return Observation(status="ABSENT", missing=[], settled=False, healthy=False, detail=unusable,
                               version=self.version, failed=unusable)
        in_class = self._live_groups(target)
        problems = self.problems(target, cluster, in_class)
        scaling = cluster.get("AutoScaling") or {}
        enabled = scaling.get("Mode") == "Enable"
        foreign = enabled and cluster.get("ClusterRole") != self.role_arn(target)
        missing: list[str] = []
        if not foreign:
            if role is None:
                missing += ["role", "policy"]
            else:
                if role.get("AssumeRolePolicyDocument") != self.trust():
                    missing.append("trust")
                if not self._has_policy(target):
                    missing.append("policy")
            if not enabled or scaling.get("AutoScalerType") != "Karpenter":
                missing.append("autoscaling")
        if enabled and scaling.get("Status") == "Failed":
            problems.append(f"HyperPod's autoscaling failed: {scaling.get('FailureMessage') or 'no reason given'} "
                            "(disable managed Karpenter, fix the cause, then enable it again)")
        for obj in self.objects(cluster.get("InstanceGroups") or []):
            live = kubeapi.get(self._kube(target), obj)
            if live is not None and (live["metadata"].get("labels") or {}).get(MANAGED_LABEL) != OURS:
                problems.append(f"a {_label(obj)} exists that is not ours (no instantstart label): it is left "
                                "alone; rename or delete it, then retry")
            elif live is None or (live["metadata"].get("annotations") or {}).get(APPLIED) != \
                    obj["metadata"]["annotations"][APPLIED]:
                missing.append(_label(obj))
        pool = kubeapi.get(self._kube(target), self.objects([])[1]) or {}
        settings = {"instance_groups": in_class, "capacity": "hyperpod",
                    "max_nodes": ((pool.get("spec") or {}).get("limits") or {}).get("nodes")} if enabled else {}
        # AutoScaling.Status: InService | Failed | Creating | Deleting; only InService is settled
        in_service = not enabled or scaling.get("Status", "InService") == "InService"
        settled = not missing and not problems and in_service
        detail = "; ".join(problems) or (f"to do: {', '.join(missing)}" if missing else "") or (
            "" if in_service else f"HyperPod's autoscaling is {scaling.get('Status')}")
        return Observation(status="ABSENT" if not enabled else ("Enabled" if not missing else "Enabled (incomplete)"),
                           missing=missing, settled=settled, healthy=settled, detail=detail,
                           failed="; ".join(problems) or None, version=self.version, settings=settings,
                           foreign=foreign)

    def blocked(self, target: Target) -> str | None:
        """What waits: UpdateCluster for IAM to propagate our new role and for the cluster to take updates; the
        node class and pool for HyperPod to install Karpenter's CRDs (it does once autoscaling is on)."""
        cluster, unusable = self._hyperpod(target)
        return unusable or self._update_blocked(target, cluster) or (
            None if self._crds_ready(target) else
            "waiting for HyperPod to install Karpenter's CRDs (NodePool, HyperpodNodeClass)")

    @staticmethod
    def _busy(target: Target, cluster: dict[str, Any]) -> str | None:
        """Why the cluster takes no UpdateCluster now (None: it does)."""
        status = cluster.get("ClusterStatus")
        if status in UPDATABLE or (status == "Updating" and cluster.get("NodeProvisioningMode") == "Continuous"):
            return None
        return f"HyperPod cluster {target.hyperpod_cluster} is {status}: AutoScaling waits until InService"

    def _update_blocked(self, target: Target, cluster: dict[str, Any]) -> str | None:
        """Why the UpdateCluster that enables autoscaling waits (None: it may go now, or is not needed)."""
        scaling = cluster.get("AutoScaling") or {}
        if scaling.get("Mode") == "Enable":
            return None
        if scaling.get("Status") == "Deleting":
            return "waiting for HyperPod to finish disabling its autoscaling (AutoScaling is Deleting)"
        if self._propagating(target):
            return f"waiting for IAM to propagate the role {self.role_name(target)}"
        return self._busy(target, cluster)

    def apply(self, target: Target, observed: Observation) -> None:
        if observed.failed:
            raise Permanent(f"managed Karpenter cannot be enabled: {observed.failed}")
        todo = set(observed.missing)
        iam = target.client("iam")
        name = self.role_name(target)
        cluster, _ = self._hyperpod(target)
        if "role" in todo:
            iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(self.trust()),
                            Tags=tag_list(target.tags),
                            Description=f"HyperPod managed Karpenter of {target.cluster} (adds and removes nodes)")
        if "trust" in todo:
            iam.update_assume_role_policy(RoleName=name, PolicyDocument=json.dumps(self.trust()))
        if "policy" in todo:
            iam.put_role_policy(RoleName=name, PolicyName=INLINE_POLICY,
                                PolicyDocument=json.dumps(self.policy(cluster["ClusterArn"])))
        if "autoscaling" in todo and self._update_blocked(target, cluster) is None:
            target.client("sagemaker").update_cluster(
                ClusterName=target.hyperpod_cluster, AutoScaling={"Mode": "Enable", "AutoScalerType": "Karpenter"},
                ClusterRole=self.role_arn(target))
        if self._crds_ready(target):
            for obj in self.objects(cluster.get("InstanceGroups") or []):
                if _label(obj) in todo:
                    kubeapi.apply(self._kube(target), obj)

    def leftover(self, target: Target) -> Leftover:
        """Our NodePool and node class; HyperPod's autoscaling while it names our role (``going`` while it is
        Deleting or the cluster takes no update); our role."""
        left = Leftover()
        if target.kube is not None:
            for label, live in self._live(target).items():
                if live is None or (live["metadata"].get("labels") or {}).get(MANAGED_LABEL) != OURS:
                    continue
                (left.going if live["metadata"].get("deletionTimestamp") else left.to_delete).append(label)
        cluster, _ = self._hyperpod(target)
        scaling = cluster.get("AutoScaling") or {}
        if scaling.get("Status") == "Deleting":
            left.going.append("autoscaling")
        elif scaling.get("Mode") == "Enable" and cluster.get("ClusterRole") == self.role_arn(target):
            (left.going if self._busy(target, cluster) else left.to_delete).append("autoscaling")
        if self._role(target) is not None and self._role_ours(target):
            left.to_delete.append(f"role:{self.role_name(target)}")
        return left

    def delete(self, target: Target, left: Leftover) -> None:
        """Our NodePool and node class first (Karpenter removes their nodes); then, in a later round, Mode=Disable
        alone; the role only once autoscaling reads Disable and is no longer Deleting."""
        objects = [o for o in self.objects([]) if _label(o) in left.to_delete]
        for obj in reversed(objects):
            kubeapi.delete(self._kube(target), obj)
        if objects or any(p.startswith(("NodePool", "HyperpodNodeClass")) for p in left.going) or \
                "autoscaling" in left.going:
            return
        if "autoscaling" in left.to_delete:
            target.client("sagemaker").update_cluster(ClusterName=target.hyperpod_cluster,
                                                      AutoScaling={"Mode": "Disable"})
            return
        iam = target.client("iam")
        for piece in left.to_delete:
            if piece.startswith("role:"):
                if self._has_policy(target):
                    iam.delete_role_policy(RoleName=self.role_name(target), PolicyName=INLINE_POLICY)
                iam.delete_role(RoleName=self.role_name(target))
