"""HyperPod nodes as Kubernetes Nodes in the EKS cluster's emulator: what HyperPod's node agent and health
monitoring agent write on a real node, and nothing else.

A node joins as ``hyperpod-<instance id>`` once its lifecycle scripts finish, with the labels the
HyperPod tooling selects on (``sagemaker.amazonaws.com/node-health-status``, ``deep-health-check-status``,
``instance-group-name``, ``compute-type``, ``cluster-name``, ``node.kubernetes.io/instance-type``,
topology labels), the ``node-health-status=Unschedulable:NoSchedule`` taint while it is not schedulable,
the group's ``KubernetesConfig`` labels and taints, capacity from :mod:`.hyperpod_instances` and a Ready
condition. Writes go through the emulator's own API (merge patches, the status subresource) so watchers
and ``kubectl`` see ordinary updates. Labels and taints a user added are kept; only the keys HyperPod owns
are rewritten. The one label we read back is ``node-health-status``: setting it by hand is HyperPod's
documented manual reboot/replace trigger.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sandbox.kube import deletion
from sandbox.kube.cluster import Cluster, WriteOptions
from sandbox.kube.emulator import Emulator
from sandbox.kube.errors import ApiError

from .eks import DEFAULT_VERSION
from .hyperpod_instances import instance_resources
from .hyperpod_state import DHC, REBOOT, RUN, SHUTDOWN, UPDATE, ClusterRec, GroupRec, NodeRec

SM = "sagemaker.amazonaws.com/"
HEALTH_LABEL = SM + "node-health-status"
DHC_LABEL = SM + "deep-health-check-status"
FAULT_TYPES_LABEL = SM + "fault-types"
FAULT_REASONS_LABEL = SM + "fault-reasons"
FAULT_DETAILS_ANNOTATION = SM + "fault-details"
SCHEDULABLE = "Schedulable"
UNSCHEDULABLE = "Unschedulable"
PENDING_REBOOT = "UnschedulablePendingReboot"
PENDING_REPLACEMENT = "UnschedulablePendingReplacement"
MANAGER = "sagemaker-hyperpod"
def kubelet_version(eks_version: str) -> str:
    """The kubelet an EKS-optimised AMI for Kubernetes ``eks_version`` ships: ``v<minor>.<patch>-eks-<build>``."""
    build = hashlib.sha256(eks_version.encode()).hexdigest()[:7]
    return f"v{eks_version}.0-eks-{build}"


def node_name(instance_id: str) -> str:
    return f"hyperpod-{instance_id}"


def dns_hostname(ip: str, region: str) -> str:
    return f"ip-{ip.replace('.', '-')}.{region}.compute.internal"


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _quantity_ki(gib: float) -> str:
    return f"{int(gib * 1024 * 1024)}Ki"


def _capacity(instance_type: str) -> tuple[dict[str, str], dict[str, str]]:
    res = instance_resources(instance_type)
    capacity = {"cpu": str(res.vcpu), "memory": _quantity_ki(res.memory_gib), "pods": "110",
                "ephemeral-storage": "524275692Ki", "hugepages-1Gi": "0", "hugepages-2Mi": "0"}
    allocatable = {**capacity, "cpu": f"{res.vcpu * 1000 - 100}m", "memory": _quantity_ki(res.memory_gib * 0.93),
                   "ephemeral-storage": "482098735448"}
    for key, count in (("nvidia.com/gpu", res.gpu), ("aws.amazon.com/neurondevice", res.neuron),
                       ("vpc.amazonaws.com/efa", res.efa)):
        if count:
            capacity[key] = allocatable[key] = str(count)
    return capacity, allocatable


def _kube_config(group: GroupRec) -> tuple[dict[str, str], list[dict[str, str]]]:
    config = group.spec.get("KubernetesConfig") or {}
    labels = dict(config.get("Labels") or {})
    taints = [{k: v for k, v in (("key", t["Key"]), ("value", t.get("Value")), ("effect", t["Effect"])) if v}
              for t in config.get("Taints") or []]
    return labels, taints


def template_node(rec: ClusterRec, group: GroupRec, region: str) -> dict[str, Any]:
    """What a new, healthy node of ``group`` will look like to the scheduler (labels, taints, allocatable) before
    it launches: what an autoscaler simulates a pending pod against."""
    instance_type = group.spec.get("InstanceType") or ((group.spec.get("InstanceRequirements") or {}).get(
        "InstanceTypes") or ["ml.m5.xlarge"])[0]
    arch = instance_resources(instance_type).arch
    custom_labels, taints = _kube_config(group)
    labels = {**custom_labels, "kubernetes.io/os": "linux", "kubernetes.io/arch": arch,
              "node.kubernetes.io/instance-type": instance_type, "beta.kubernetes.io/instance-type": instance_type,
              "topology.kubernetes.io/region": region, SM + "compute-type": "hyperpod",
              SM + "cluster-name": rec.name, SM + "instance-group-name": group.name, HEALTH_LABEL: SCHEDULABLE}
    _, allocatable = _capacity(instance_type)
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"template-{group.name}", "labels": labels},
            "spec": {"taints": taints}, "status": {"allocatable": allocatable,
                                                   "conditions": [{"type": "Ready", "status": "True"}]}}


class KubeNodes:
    """Writes and reads the Kubernetes Node of each HyperPod node; a no-op without an emulator."""

    def __init__(self, emulator: Emulator | None, region: str,
                 eks_version: Callable[[str], str | None] | None = None) -> None:
        self.emulator = emulator
        self.region = region
        self.eks_version = eks_version  # emulator cluster (= EKS cluster name) -> its Kubernetes version

    def _cluster(self, rec: ClusterRec) -> Cluster | None:
        if self.emulator is None or rec.kube_cluster is None:
            return None
        return self.emulator.clusters.get(rec.kube_cluster)  # never created here: a deleted EKS cluster stays gone

    def health_label(self, rec: ClusterRec, node: NodeRec) -> str | None:
        """The node-health-status label as it is now on the Node (None: no such Node)."""
        cluster = self._cluster(rec)
        if cluster is None or node.instance_id is None:
            return None
        try:
            obj = cluster.get(cluster.builtin("", "nodes"), None, node_name(node.instance_id))
        except ApiError:
            return None
        labels: dict[str, str] = obj["metadata"].get("labels") or {}
        return labels.get(HEALTH_LABEL)

    def sync(self, rec: ClusterRec, group: GroupRec, node: NodeRec, now: float) -> None:
        """Make the Node match the record: created on first sync, patched afterwards."""
        cluster = self._cluster(rec)
        if cluster is None or node.instance_id is None or not node.health:
            return
        rt = cluster.builtin("", "nodes")
        name = node_name(node.instance_id)
        opts = WriteOptions(manager=MANAGER)
        try:
            existing: dict[str, Any] | None = cluster.get(rt, None, name)
        except ApiError:
            existing = None
        labels, annotations, taints, unschedulable = self._metadata(rec, group, node)
        status = self._status(rec, node, now, existing)
        if existing is None:
            body = {"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": name, "labels": labels, "annotations": annotations},
                    "spec": {"providerID": f"aws:///{node.zone_id}/sagemaker/cluster/hyperpod-{rec.id}-"
                                           f"{node.instance_id}",
                             "taints": taints, **({"unschedulable": True} if unschedulable else {})},
                    "status": status}
            cluster.create(rt, None, body, opts)
            return
        old_labels: dict[str, str] = existing["metadata"].get("labels") or {}
        label_patch: dict[str, str | None] = {k: None for k in old_labels if k.startswith(SM) and k not in labels}
        for key in _kube_config(group)[0].keys() - labels.keys():
            label_patch.setdefault(key, None)
        label_patch.update(labels)
        owned = {t["key"] for t in taints} | {HEALTH_LABEL, "node.kubernetes.io/unschedulable",
                                              "node.kubernetes.io/unreachable"}
        kept = [t for t in existing.get("spec", {}).get("taints") or [] if t.get("key") not in owned]
        old_annotations: dict[str, str] = existing["metadata"].get("annotations") or {}
        annotation_patch: dict[str, str | None] = {
            k: None for k in old_annotations if k.startswith(SM) and k not in annotations}
        annotation_patch.update(annotations)
        spec: dict[str, Any] = {"taints": kept + taints}
        ours = any(t.get("key") == "node.kubernetes.io/unschedulable" for t in existing.get("spec", {}).get("taints")
                   or [])
        if unschedulable or ours:  # a cordon someone else made (kubectl cordon, a drain) is theirs to lift
            spec["unschedulable"] = True if unschedulable else None
        cluster.patch(rt, None, name, "merge", {
            "metadata": {"labels": label_patch, "annotations": annotation_patch}, "spec": spec}, opts)
        cluster.patch(rt, None, name, "merge", {"status": status}, opts, subresource="status")

    def remove(self, rec: ClusterRec, node: NodeRec) -> None:
        cluster = self._cluster(rec)
        if cluster is None or node.instance_id is None:
            return
        with contextlib.suppress(ApiError):  # already gone (someone ran kubectl delete node)
            deletion.delete(cluster, cluster.builtin("", "nodes"), None, node_name(node.instance_id))

    # --- the object -------------------------------------------------------------------------------------

    def _metadata(self, rec: ClusterRec, group: GroupRec, node: NodeRec
                  ) -> tuple[dict[str, str], dict[str, str], list[dict[str, str]], bool]:
        res = instance_resources(node.instance_type)
        assert node.instance_id is not None
        labels = {
            "kubernetes.io/hostname": node_name(node.instance_id),
            "kubernetes.io/os": "linux", "beta.kubernetes.io/os": "linux",
            "kubernetes.io/arch": res.arch, "beta.kubernetes.io/arch": res.arch,
            "node.kubernetes.io/instance-type": node.instance_type,
            "beta.kubernetes.io/instance-type": node.instance_type,
            "topology.kubernetes.io/region": self.region,
            "topology.kubernetes.io/zone": node.zone,
            "topology.k8s.aws/zone-id": node.zone_id,
            SM + "compute-type": "hyperpod",
            SM + "cluster-name": rec.name,
            SM + "instance-group-name": group.name,
            HEALTH_LABEL: node.health,
        }
        if node.dhc:
            labels[DHC_LABEL] = node.dhc
        annotations: dict[str, str] = {}
        if node.fault_type:
            labels[FAULT_TYPES_LABEL] = node.fault_type
            labels[FAULT_REASONS_LABEL] = node.fault_reason
            annotations[FAULT_DETAILS_ANNOTATION] = (
                f'[{{"FaultType":"{node.fault_type}","FaultReason":"{node.fault_reason}",'
                f'"Timestamp":"{_iso(node.created)}"}}]')
        custom_labels, custom_taints = _kube_config(group)
        labels = {**custom_labels, **labels}
        taints = list(custom_taints)
        if node.health != SCHEDULABLE:
            taints.append({"key": HEALTH_LABEL, "value": UNSCHEDULABLE, "effect": "NoSchedule"})
        unschedulable = node.phase in (UPDATE, SHUTDOWN)
        if unschedulable:
            taints.append({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"})
        if node.phase in (REBOOT, UPDATE, SHUTDOWN):
            taints.append({"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"})
        return labels, annotations, taints, unschedulable

    def _status(self, rec: ClusterRec, node: NodeRec, now: float, existing: dict[str, Any] | None) -> dict[str, Any]:
        capacity, allocatable = _capacity(node.instance_type)
        ready = "True" if node.phase in (RUN, DHC) else "Unknown"
        stamp = _iso(now)
        previous = {c.get("type"): c for c in ((existing or {}).get("status") or {}).get("conditions") or []}

        def condition(ctype: str, status: str, reason: str, message: str) -> dict[str, str]:
            old = previous.get(ctype)
            since = old["lastTransitionTime"] if old and old.get("status") == status else stamp
            return {"type": ctype, "status": status, "reason": reason, "message": message,
                    "lastHeartbeatTime": stamp, "lastTransitionTime": since}

        conditions = [
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory",
                      "kubelet has sufficient memory available"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            condition("Ready", ready, "KubeletReady" if ready == "True" else "NodeStatusUnknown",
                      "kubelet is posting ready status" if ready == "True" else "Kubelet stopped posting node status."),
        ]
        if node.fault_type:
            conditions.append(condition(node.fault_type, "True", node.fault_reason,
                                        f"health monitoring agent detected {node.fault_reason}"))
        assert node.instance_id is not None
        ident = hashlib.sha256(node.instance_id.encode()).hexdigest()
        boot = hashlib.sha256(f"{node.instance_id}/{node.boots}".encode()).hexdigest()  # new after each reboot
        res = instance_resources(node.instance_type)
        hostname = dns_hostname(node.ip, self.region)
        version = (self.eks_version(rec.kube_cluster) if self.eks_version and rec.kube_cluster else None) \
            or DEFAULT_VERSION
        return {
            "capacity": capacity, "allocatable": allocatable, "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": node.ip}, {"type": "InternalDNS", "address": hostname},
                          {"type": "Hostname", "address": hostname}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"architecture": res.arch, "bootID": f"{boot[:8]}-{boot[8:12]}-{boot[12:16]}-"
                                                           f"{boot[16:20]}-{boot[20:32]}",
                         "containerRuntimeVersion": "containerd://1.7.27", "kernelVersion": "5.10.238-234.956.amzn2."
                         + ("aarch64" if res.arch == "arm64" else "x86_64"),
                         "kubeProxyVersion": "", "kubeletVersion": kubelet_version(version), "machineID": ident[:32],
                         "operatingSystem": "linux", "osImage": "Amazon Linux 2", "systemUUID": ident[32:64]},
        }
