"""One function from what DescribeCluster says of an instance group (``ClusterInstanceGroupDetails``) to what
UpdateCluster takes for it (``ClusterInstanceGroupSpecification``): :func:`group_spec`.

UpdateCluster's ``InstanceGroups`` replaces each group it names with the spec as sent, so a field left out is
gone (a scale that forgets ``OnStartDeepHealthChecks`` or ``NetworkInterface`` changes the group; the
incumbent lost whole groups by sending a partial list). Every mutation of a group, and every other capability
that sends ``InstanceGroups`` (managed features: autoscaling, tiered storage), builds its list with
:func:`full_group_list`: all groups, each normalized here, with only the changed one replaced.

Normalized means: every member the specification allows, carried over from the details (renamed where the
details spell it differently: ``TargetCount`` -> ``InstanceCount``, ``MinCount`` -> ``MinInstanceCount``, the
*desired* image, instance types, patch schedule, labels and taints -> the spec's single value), and nothing
the details only report (``Status``, ``CurrentCount``, ``ActiveOperations``, ``TrainingPlanStatus``, ...).
``SPEC_MEMBERS`` lists the specification's members; a test checks it against botocore's own model, so a new
member AWS adds fails the suite instead of being dropped silently.

Every such UpdateCluster goes through :func:`update_groups`, which holds a per-cluster lock from its
DescribeCluster to its UpdateCluster: two operations on sibling groups (which do not conflict as operations)
would otherwise both describe the old list and the later one would resend the earlier one's group as it was
(UpdateCluster is accepted while Updating in continuous provisioning mode), losing that change.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

#: members of ClusterInstanceGroupSpecification (sagemaker 2017-07-24) this module carries over
SPEC_MEMBERS = (
    "InstanceCount", "MinInstanceCount", "InstanceGroupName", "InstanceType", "InstanceRequirements",
    "LifeCycleConfig", "ExecutionRole", "ThreadsPerCore", "InstanceStorageConfigs", "OnStartDeepHealthChecks",
    "TrainingPlanArn", "OverrideVpcConfig", "ScheduledUpdateConfig", "ImageId", "AutoPatchConfig",
    "ImageReleaseVersion", "KubernetesConfig", "SlurmConfig", "CapacityRequirements", "NetworkInterface",
)
#: members with the same name and shape in the details and the specification
_SAME = ("InstanceGroupName", "InstanceType", "LifeCycleConfig", "ExecutionRole", "ThreadsPerCore",
         "InstanceStorageConfigs", "OnStartDeepHealthChecks", "TrainingPlanArn", "OverrideVpcConfig",
         "ScheduledUpdateConfig", "CapacityRequirements", "SlurmConfig")


def _desired(details: dict[str, Any], desired: str, current: str) -> Any:
    value = details.get(desired)
    return details.get(current) if value is None else value


def _auto_patch(details: dict[str, Any]) -> dict[str, Any]:
    kept = ("PatchingStrategy", "DeploymentConfig", "IdleWaitWindowInSeconds", "DrainPolicy")
    spec: dict[str, Any] = {k: copy.deepcopy(details[k]) for k in kept if k in details}
    schedule = _desired(details, "DesiredPatchSchedule", "CurrentPatchSchedule")
    if schedule:
        spec["PatchSchedule"] = copy.deepcopy(schedule)
    return spec


def _kubernetes(details: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    labels = _desired(details, "DesiredLabels", "CurrentLabels")
    taints = _desired(details, "DesiredTaints", "CurrentTaints")
    if labels:
        spec["Labels"] = dict(labels)
    if taints:
        spec["Taints"] = [dict(t) for t in taints]
    return spec


_MAPPED: dict[str, Callable[[dict[str, Any]], Any]] = {
    "InstanceCount": lambda d: d.get("TargetCount", d.get("CurrentCount", 0)),
    "MinInstanceCount": lambda d: d.get("MinCount"),
    "InstanceRequirements": lambda d: ({"InstanceTypes": list(types)} if (types := _desired(
        d.get("InstanceRequirements") or {}, "DesiredInstanceTypes", "CurrentInstanceTypes")) else None),
    "ImageId": lambda d: _desired(d, "DesiredImageId", "CurrentImageId"),
    "ImageReleaseVersion": lambda d: _desired(d, "DesiredImageReleaseVersion", "CurrentImageReleaseVersion"),
    "AutoPatchConfig": lambda d: _auto_patch(d["AutoPatchConfig"]) if d.get("AutoPatchConfig") else None,
    "KubernetesConfig": lambda d: _kubernetes(d["KubernetesConfig"]) if d.get("KubernetesConfig") else None,
    "NetworkInterface": lambda d: ({"InterfaceType": d["NetworkInterface"]["InterfaceType"]}
                                   if (d.get("NetworkInterface") or {}).get("InterfaceType") else None),
}
assert set(_SAME) | set(_MAPPED) == set(SPEC_MEMBERS) and not set(_SAME) & set(_MAPPED)


def group_spec(details: dict[str, Any]) -> dict[str, Any]:
    """The ``ClusterInstanceGroupSpecification`` that keeps the group exactly as DescribeCluster describes it
    (its desired state: a change AWS is still rolling out is kept, not undone)."""
    spec: dict[str, Any] = {k: copy.deepcopy(details[k]) for k in _SAME if details.get(k) is not None}
    for member, read in _MAPPED.items():
        value = read(details)
        if value is not None and value != {}:
            spec[member] = value
    if "InstanceRequirements" in spec:  # the two are mutually exclusive; the details report both
        spec.pop("InstanceType", None)
    return spec


def patch_date(value: datetime | str) -> str:
    """A ``NextPatchDate`` (DescribeCluster's timestamp, or the ISO 8601 text sent) as one normal form: UTC, to
    the second."""
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(value)
    return moment.astimezone(UTC).replace(microsecond=0).isoformat()


def comparable(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` in the form two specs are compared in: an explicitly empty label or taint set (how a clear is
    sent) is the same as none, and ``NextPatchDate`` is normalized (:func:`patch_date`), so a re-sent state is
    seen as already done."""
    out = copy.deepcopy(spec)
    schedule = (out.get("AutoPatchConfig") or {}).get("PatchSchedule") or {}
    if schedule.get("NextPatchDate") is not None:
        schedule["NextPatchDate"] = patch_date(schedule["NextPatchDate"])
    kubernetes = {k: v for k, v in (out.get("KubernetesConfig") or {}).items() if v}
    out.pop("KubernetesConfig", None)
    if kubernetes:
        out["KubernetesConfig"] = kubernetes
    return out


def full_group_list(cluster: dict[str, Any], replace: dict[str, Any] | None = None,
                    without: str | None = None) -> list[dict[str, Any]]:
    """UpdateCluster's ``InstanceGroups`` for DescribeCluster's answer ``cluster``: every group normalized by
    :func:`group_spec`, in AWS's order, with the group named like ``replace`` swapped for it (appended when
    it is new) and the one named ``without`` left out (it goes in ``InstanceGroupsToDelete``)."""
    out = []
    for details in cluster.get("InstanceGroups") or []:
        name = details["InstanceGroupName"]
        if name == without:
            continue
        if replace is not None and name == replace["InstanceGroupName"]:
            out.append(copy.deepcopy(replace))
        else:
            out.append(group_spec(details))
    if replace is not None and all(g["InstanceGroupName"] != replace["InstanceGroupName"] for g in out):
        out.append(copy.deepcopy(replace))
    return out


def find_group(cluster: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The details of the group ``name`` in DescribeCluster's answer, if it has one."""
    return next((g for g in cluster.get("InstanceGroups") or [] if g["InstanceGroupName"] == name), None)


_LOCKS: dict[tuple[str, str], threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def cluster_lock(region: str, cluster: str) -> threading.Lock:
    """The lock every group-list UpdateCluster of HyperPod cluster ``cluster`` in ``region`` holds."""
    with _LOCKS_GUARD:
        return _LOCKS.setdefault((region, cluster), threading.Lock())


def update_groups(region: str, cluster: str, describe: Callable[[], dict[str, Any]],
                  update: Callable[..., Any], build: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """DescribeCluster (``describe``), the UpdateCluster arguments ``build`` makes from its answer, and
    UpdateCluster (``update``), with no other group change of the cluster in between."""
    with cluster_lock(region, cluster):
        request = build(describe())
        update(ClusterName=cluster, **request)
