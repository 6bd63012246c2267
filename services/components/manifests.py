"""A component made of Kubernetes objects shipped in this package: YAML under ``manifests/`` (written from the
upstream charts' templates and values, see ``deploy/components.md``; ``${region}``, ``${eks_cluster}``,
``${vpc_id}`` and ``${hma_image}`` are filled in per cluster, ``${nvidia_types}`` and ``${neuron_types}`` with
every instance type of those families that HyperPod's API accepts) and byte-for-byte upstream CRDs under
``crds/`` (``SOURCES.md``).

Each object is labelled as ours and carries the sha256 of what we applied (``instantstart.io/applied``), so
observing is one GET per object and a rerun whose objects match applies nothing. Apply is server-side apply
under one field manager. Teardown deletes only objects with our label, in reverse order.
"""

from __future__ import annotations

import functools
import hashlib
import json
import string
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal

import botocore.session
import yaml

from services.components import kubeapi
from services.components.base import Component, Leftover, Observation, Target
from services.components.identity import PodRole, blocked_by
from services.errors import Permanent

MANAGED_LABEL = "app.kubernetes.io/managed-by"
COMPONENT_LABEL = "instantstart.io/component"
APPLIED = "instantstart.io/applied"  # annotation: sha256 of the object as we applied it
OURS = "instantstart"
WORKLOADS = ("DaemonSet", "Deployment")
IDENTITY_PIECES = ("role", "trust", "policies", "association")  # what of ``missing`` is the PodRole's

#: the health-monitoring agent's ECR account per region (HyperPod chart readme, aws/sagemaker-hyperpod-cli)
HMA_ACCOUNTS = {
    "us-east-1": "767398015722", "us-west-2": "905418368575", "us-east-2": "851725546812",
    "us-west-1": "011528288828", "eu-central-1": "211125453373", "eu-north-1": "654654141839",
    "eu-west-1": "533267293120", "eu-west-2": "011528288831",
}
HMA_TAG = "1.0.1892.0_1.0.424.0"


def hma_image(region: str) -> str:
    account = HMA_ACCOUNTS.get(region)
    if account is None:
        raise Permanent(f"the HyperPod health-monitoring agent has no published image in {region}; regions with "
                        f"one: {', '.join(sorted(HMA_ACCOUNTS))}")
    return f"{account}.dkr.ecr.{region}.amazonaws.com/hyperpod-health-monitoring-agent:{HMA_TAG}"


#: the accelerator families of HyperPod's instance types, by the family part of ``ml.<family>.<size>``: every
#: ``g``/``p`` family is NVIDIA (g4dn ... p6e), every ``trn``/``inf`` family AWS Neuron
ACCELERATOR_FAMILIES = {"nvidia_types": ("g", "p"), "neuron_types": ("trn", "inf")}


@functools.lru_cache(maxsize=1)
def hyperpod_instance_types() -> tuple[str, ...]:
    """Every instance type HyperPod's CreateCluster accepts (botocore's ``ClusterInstanceType`` enum)."""
    model = botocore.session.get_session().get_service_model("sagemaker")
    enum: list[str] = model.shape_for("ClusterInstanceType").enum  # type: ignore[attr-defined]
    return tuple(enum)


def family_types(key: str) -> list[str]:
    """The HyperPod instance types of the accelerator family ``key`` of :data:`ACCELERATOR_FAMILIES`."""
    return [t for t in hyperpod_instance_types() if t.split(".")[1].startswith(ACCELERATOR_FAMILIES[key])]


@functools.lru_cache(maxsize=16)
def _text(folder: str, name: str) -> str:
    return (resources.files("services.components") / folder / name).read_text()


@functools.lru_cache(maxsize=16)
def _crd(name: str) -> tuple[dict[str, Any], ...]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return tuple(d for d in yaml.load_all(_text("crds", name), Loader=loader) if d)


def _digest(obj: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass(frozen=True, eq=False)
class Manifests(Component):
    name: str
    version: str
    files: tuple[str, ...] = ()  # under manifests/, templated
    crds: tuple[str, ...] = ()  # under crds/, verbatim
    resource_type: str = "Kubernetes manifests"
    identity: PodRole | None = None
    kind: Literal["addon", "manifest"] = "manifest"

    def objects(self, target: Target) -> list[dict[str, Any]]:
        """What this component applies for ``target``, labelled and stamped, CRDs first."""
        values = {"region": target.region, "eks_cluster": target.eks_cluster, "vpc_id": target.vpc_id,
                  **{key: json.dumps(family_types(key)) for key in ACCELERATOR_FAMILIES}}
        if any("${hma_image}" in _text("manifests", f) for f in self.files):
            values["hma_image"] = hma_image(target.region)
        docs: list[dict[str, Any]] = [json.loads(json.dumps(d)) for name in self.crds for d in _crd(name)]
        for name in self.files:
            rendered = string.Template(_text("manifests", name)).substitute(values)
            docs.extend(d for d in yaml.safe_load_all(rendered) if d)
        for obj in docs:
            meta = obj.setdefault("metadata", {})
            meta.setdefault("labels", {}).update({MANAGED_LABEL: OURS, COMPONENT_LABEL: self.name})
            digest = _digest(obj)
            meta.setdefault("annotations", {})[APPLIED] = digest
        return docs

    @staticmethod
    def label(obj: dict[str, Any]) -> str:
        meta = obj["metadata"]
        where = f"{meta['namespace']}/" if meta.get("namespace") else ""
        return f"{obj['kind']} {where}{meta['name']}"

    def observe(self, target: Target) -> Observation:
        if target.kube is None:
            raise Permanent(f"component {self.name}: the cluster's Kubernetes API is not registered")
        missing = self.identity.missing(target) if self.identity is not None else []
        waiting: list[str] = []  # what the dependencies stage waits for (a CRD being established)
        unready: list[str] = []  # workloads whose pods are not ready (they may wait for the nodes)
        idle: list[str] = []  # DaemonSets no node matches (yet, or a variant for other instance types)
        daemonsets = 0
        foreign = False  # an object of ours by name, not by label: someone else installed the component
        for obj in self.objects(target):
            live = kubeapi.get(target.kube, obj)
            label = self.label(obj)
            if live is not None and (live["metadata"].get("labels") or {}).get(MANAGED_LABEL) != OURS:
                foreign = True
            if live is None or (live["metadata"].get("annotations") or {}).get(APPLIED) != \
                    obj["metadata"]["annotations"][APPLIED]:
                missing.append(label)
                continue
            if live["kind"] == "DaemonSet":
                daemonsets += 1
                if int((live.get("status") or {}).get("desiredNumberScheduled", 0)) == 0:
                    idle.append(label)
                    continue
            ok, why = _object_health(live)
            if not ok:
                (unready if obj["kind"] in WORKLOADS else waiting).append(f"{label}: {why}")
        if daemonsets and len(idle) == daemonsets:  # a variant idles only while another one runs somewhere
            unready += [f"{label}: no node to run on" for label in idle]
        status = "ABSENT" if missing else ("Ready" if not waiting and not unready else "Applied")
        return Observation(status=status, missing=missing, settled=not missing and not waiting,
                           healthy=not missing and not waiting and not unready,
                           detail="; ".join(waiting + unready), version=self.version, foreign=foreign)

    def pods_ready(self, target: Target) -> int:
        """Ready pods of this component's DaemonSets (a device plugin's: one per node whose devices it advertises)."""
        assert target.kube is not None
        return sum(int(((kubeapi.get(target.kube, obj) or {}).get("status") or {}).get("numberReady", 0))
                   for obj in self.objects(target) if obj["kind"] == "DaemonSet")

    def apply(self, target: Target, observed: Observation) -> None:
        assert target.kube is not None
        if self.identity is not None:
            self.identity.ensure(target, [m for m in observed.missing if m in IDENTITY_PIECES])
        wanted = set(observed.missing)
        unserved = set(self.unserved(target))
        for obj in self.objects(target):
            if self.label(obj) in wanted and obj["apiVersion"] not in unserved:
                kubeapi.apply(target.kube, obj)

    def later(self, target: Target) -> set[str]:
        """The objects of kinds another component's CRDs serve (:data:`kubeapi.FROM_CRDS`): applied once served."""
        return {self.label(o) for o in self.objects(target) if o["apiVersion"] in kubeapi.FROM_CRDS}

    def unserved(self, target: Target) -> list[str]:
        """The API versions of :meth:`later` objects the cluster does not serve yet."""
        assert target.kube is not None
        wanted = sorted({o["apiVersion"] for o in self.objects(target)} & set(kubeapi.FROM_CRDS))
        return [v for v in wanted if not kubeapi.served(target.kube, v)]
    def adopt(self, target: Target, observed: Observation) -> None:
        """Apply every object over what someone else installed: server-side apply with our field manager and
        labels takes them over."""
        assert target.kube is not None
        for obj in self.objects(target):
            kubeapi.apply(target.kube, obj)

    def blocked(self, target: Target) -> str | None:
        unserved = self.unserved(target) if target.kube is not None and self.later(target) else []
        if unserved:
            return "; ".join(f"waiting for {v} (CRDs of {kubeapi.FROM_CRDS[v]}) to be served" for v in unserved)
        return blocked_by(self.identity, target)

    def leftover(self, target: Target) -> Leftover:
        left = Leftover()
        if target.kube is not None:
            for obj in self.objects(target):
                live = kubeapi.get(target.kube, obj)
                if live is None or (live["metadata"].get("labels") or {}).get(MANAGED_LABEL) != OURS:
                    continue
                (left.going if live["metadata"].get("deletionTimestamp") else left.to_delete).append(
                    self.label(obj))
        if self.identity is not None:
            left.to_delete.extend(self.identity.leftover(target))
        return left

    def delete(self, target: Target, left: Leftover) -> None:
        wanted = set(left.to_delete)
        if target.kube is not None:
            for obj in reversed(self.objects(target)):
                if self.label(obj) in wanted:
                    kubeapi.delete(target.kube, obj)
        if self.identity is not None:
            self.identity.delete(target, [p for p in left.to_delete if p.startswith(("association:", "role:"))])


def _object_health(live: dict[str, Any]) -> tuple[bool, str]:
    """Whether one live object is doing its job: a CRD established, an APIService available (the aggregator
    reaches the server behind it), a workload's pods ready."""
    kind, status = live["kind"], live.get("status") or {}
    if kind == "CustomResourceDefinition":
        ok = any(c.get("type") == "Established" and c.get("status") == "True" for c in status.get("conditions") or [])
        return ok, "" if ok else "not established yet"
    if kind == "APIService":
        cond: dict[str, Any] = next((c for c in status.get("conditions") or [] if c.get("type") == "Available"), {})
        ok = cond.get("status") == "True"
        return ok, "" if ok else f"not available yet ({cond.get('reason') or 'not checked'}: " \
                                 f"{cond.get('message') or 'no status yet'})"
    if kind == "DaemonSet":
        desired, ready = int(status.get("desiredNumberScheduled", 0)), int(status.get("numberReady", 0))
        return ready >= desired, f"{ready}/{desired} pods ready"
    if kind == "Deployment":
        wanted, available = int((live.get("spec") or {}).get("replicas", 1)), int(status.get("availableReplicas", 0))
        return available >= wanted, f"{available}/{wanted} replicas available"
    return True, ""
