"""The persistent volume controller: claims bind to volumes, statically or by dynamic provisioning.

As in Kubernetes, a pending claim first binds to an existing ``Available`` PersistentVolume of the same
``storageClassName`` (``""`` or unset matching only class-less volumes) whose capacity, access modes,
volume mode and labels (the claim's ``selector``) fit, the smallest first; a claim naming a
``volumeName`` binds to that volume only. Failing that, a volume is provisioned only when the claim's
StorageClass exists *and* the CSIDriver of its provisioner is registered (an EKS CSI add-on installs it):
without the class the claim stays Pending with a ``ProvisioningFailed`` event, without the driver with the
``ExternalProvisioning`` event "waiting for a volume to be created, either by external provisioner ...",
and a ``WaitForFirstConsumer`` class waits until the scheduler picked a node for a pod using the claim
(the ``volume.kubernetes.io/selected-node`` annotation). The scheduler's side (a pod with an unbound
immediate claim is unschedulable) is :func:`claims_block`.
"""

from __future__ import annotations

import contextlib
import hashlib
from decimal import Decimal
from typing import Any

from .cluster import Cluster, WriteOptions
from .errors import ApiError
from .scheduling import quantity
from .selectors import label_selector_from_match, labels_match, parse_label_selector
from .store import Key, Obj

PVC_KEY: Key = ("", "persistentvolumeclaims")
PV_KEY: Key = ("", "persistentvolumes")
SC_KEY: Key = ("storage.k8s.io", "storageclasses")
CONFIGMAP_KEY: Key = ("", "configmaps")
CSI_KEY: Key = ("storage.k8s.io", "csidrivers")
SELECTED_NODE = "volume.kubernetes.io/selected-node"
DEFAULT_CLASS = "storageclass.kubernetes.io/is-default-class"
MANAGER = WriteOptions(manager="persistentvolume-controller")


def default_class(cluster: Cluster) -> str | None:
    """The default StorageClass's name (the DefaultStorageClass admission plugin's choice), if any."""
    for _, sc in cluster.store.items(SC_KEY):
        if (sc["metadata"].get("annotations") or {}).get(DEFAULT_CLASS) == "true":
            return str(sc["metadata"]["name"])
    return None


def _class_of(obj: Obj) -> str:
    return str((obj.get("spec") or {}).get("storageClassName") or "")


def _request(claim: Obj) -> Decimal:
    raw = (((claim.get("spec") or {}).get("resources") or {}).get("requests") or {}).get("storage", "0")
    return quantity(raw) or Decimal(0)


def _fits(claim: Obj, pv: Obj) -> bool:
    cspec, pspec = claim.get("spec") or {}, pv.get("spec") or {}
    ref = pspec.get("claimRef")
    meta = claim["metadata"]
    if ref and (ref.get("name"), ref.get("namespace")) != (meta["name"], meta["namespace"]):
        return False
    if not ref and (pv.get("status") or {}).get("phase", "Available") != "Available":
        return False
    if _class_of(claim) != _class_of(pv) or (cspec.get("volumeMode") or "Filesystem") != \
            (pspec.get("volumeMode") or "Filesystem"):
        return False
    if not set(cspec.get("accessModes") or []) <= set(pspec.get("accessModes") or []):
        return False
    if (quantity((pspec.get("capacity") or {}).get("storage", "0")) or Decimal(0)) < _request(claim):
        return False
    selector = cspec.get("selector")
    if selector:
        try:
            return labels_match(parse_label_selector(label_selector_from_match(selector)),
                                pv["metadata"].get("labels") or {})
        except ApiError:
            return False
    return True


def reconcile_claims(cluster: Cluster) -> None:
    for _, claim in cluster.store.items(PVC_KEY):
        if claim["metadata"].get("deletionTimestamp") or (claim.get("status") or {}).get("phase") == "Bound":
            continue
        with contextlib.suppress(ApiError):  # changed meanwhile: its event brings it back
            _reconcile_claim(cluster, claim)


def _reconcile_claim(cluster: Cluster, claim: Obj) -> None:
    spec = claim.get("spec") or {}
    volumes = [pv for _, pv in cluster.store.items(PV_KEY)]
    if spec.get("volumeName"):
        named = [pv for pv in volumes if pv["metadata"]["name"] == spec["volumeName"] and _fits(claim, pv)]
        if named:
            _bind(cluster, claim, named[0])
        else:
            _pending(cluster, claim)
        return
    candidates = sorted((pv for pv in volumes if _fits(claim, pv)), key=lambda pv: (
        quantity((pv.get("spec") or {}).get("capacity", {}).get("storage", "0")) or Decimal(0), pv["metadata"]["name"]))
    if candidates:
        _bind(cluster, claim, candidates[0])
        return
    _pending(cluster, claim)
    name = _class_of(claim)
    if not name:
        return
    sc = cluster.store.get(SC_KEY, ("", name))
    if sc is None:
        _event(cluster, claim, "Warning", "ProvisioningFailed", f'storageclass.storage.k8s.io "{name}" not found')
        return
    provisioner = str(sc.get("provisioner", ""))
    if sc.get("volumeBindingMode") == "WaitForFirstConsumer" and \
            not (claim["metadata"].get("annotations") or {}).get(SELECTED_NODE):
        _event(cluster, claim, "Normal", "WaitForFirstConsumer",
               "waiting for first consumer to be created before binding")
        return
    if cluster.store.get(CSI_KEY, ("", provisioner)) is None:
        _event(cluster, claim, "Normal", "ExternalProvisioning",
               f'waiting for a volume to be created, either by external provisioner "{provisioner}" or manually '
               "created by system administrator")
        return
    _bind(cluster, claim, _provision(cluster, claim, sc))


def _provision(cluster: Cluster, claim: Obj, sc: Obj) -> Obj:
    meta = claim["metadata"]
    spec = claim.get("spec") or {}
    handle = "vol-" + hashlib.sha256(meta["uid"].encode()).hexdigest()[:17]
    body = {"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": f"pvc-{meta['uid']}",
                         "annotations": {"pv.kubernetes.io/provisioned-by": sc.get("provisioner", "")}},
            "spec": {"capacity": {"storage": (spec.get("resources") or {}).get("requests", {}).get("storage", "1Gi")},
                     "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
                     "persistentVolumeReclaimPolicy": sc.get("reclaimPolicy", "Delete"),
                     "storageClassName": sc["metadata"]["name"], "volumeMode": spec.get("volumeMode", "Filesystem"),
                     "csi": {"driver": sc.get("provisioner", ""), "volumeHandle": handle}}}
    return cluster.create(cluster.builtin("", "persistentvolumes"), None, body, MANAGER).obj


def _bind(cluster: Cluster, claim: Obj, pv: Obj) -> None:
    meta = claim["metadata"]
    pv_rt, pvc_rt = cluster.builtin("", "persistentvolumes"), cluster.builtin("", "persistentvolumeclaims")
    ref = {"kind": "PersistentVolumeClaim", "namespace": meta["namespace"], "name": meta["name"],
           "uid": meta["uid"], "apiVersion": "v1", "resourceVersion": meta["resourceVersion"]}
    pv_name = pv["metadata"]["name"]
    bound_pv = cluster.patch(pv_rt, None, pv_name, "merge", {"spec": {"claimRef": ref}}, MANAGER).obj
    cluster.replace(pv_rt, None, pv_name, {**bound_pv, "status": {"phase": "Bound"}}, MANAGER, "status")
    pre_bound = bool((claim.get("spec") or {}).get("volumeName"))
    annotations = {"pv.kubernetes.io/bind-completed": "yes"}
    if not pre_bound:
        annotations["pv.kubernetes.io/bound-by-controller"] = "yes"
    provisioner = (pv["metadata"].get("annotations") or {}).get("pv.kubernetes.io/provisioned-by")
    if provisioner:
        annotations["volume.kubernetes.io/storage-provisioner"] = provisioner
    updated = cluster.patch(pvc_rt, meta["namespace"], meta["name"], "merge", {
        "metadata": {"annotations": annotations}, "spec": {"volumeName": pv_name}}, MANAGER).obj
    pspec = bound_pv.get("spec") or {}
    cluster.replace(pvc_rt, meta["namespace"], meta["name"], {**updated, "status": {
        "phase": "Bound", "accessModes": pspec.get("accessModes") or [],
        "capacity": dict(pspec.get("capacity") or {})}}, MANAGER, "status")


def _pending(cluster: Cluster, claim: Obj) -> None:
    if (claim.get("status") or {}).get("phase") == "Pending":
        return
    meta = claim["metadata"]
    cluster.replace(cluster.builtin("", "persistentvolumeclaims"), meta["namespace"], meta["name"],
                    {**claim, "status": {"phase": "Pending"}}, MANAGER, "status")


def _event(cluster: Cluster, obj: Obj, kind: str, reason: str, message: str,
           component: str = "persistentvolume-controller") -> None:
    """Record an Event about ``obj`` once per reason (``kubectl describe`` shows it)."""
    meta = obj["metadata"]
    name = f"{meta['name']}.{hashlib.sha256((meta['uid'] + reason).encode()).hexdigest()[:16]}"
    if cluster.store.get(("", "events"), (meta["namespace"], name)) is not None:
        return
    now = cluster.now_iso()
    body: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Event", "metadata": {"name": name, "namespace": meta["namespace"]},
        "involvedObject": {"kind": obj["kind"], "namespace": meta["namespace"], "name": meta["name"],
                           "uid": meta["uid"], "apiVersion": obj["apiVersion"],
                           "resourceVersion": meta.get("resourceVersion", "")},
        "reason": reason, "message": message, "type": kind, "count": 1, "firstTimestamp": now, "lastTimestamp": now,
        "source": {"component": component}, "reportingComponent": component}
    with contextlib.suppress(ApiError):
        cluster.create(cluster.builtin("", "events"), meta["namespace"], body, MANAGER)


def missing_config_maps(cluster: Cluster, pod: Obj) -> list[tuple[str, str]]:
    """(volume, ConfigMap) of the pod's ``configMap`` volumes (not ``optional``) whose ConfigMap does not exist:
    the kubelet cannot mount them, so the pod's containers wait (``ContainerCreating``) until it does."""
    namespace = pod["metadata"]["namespace"]
    out = []
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        source = volume.get("configMap")
        if isinstance(source, dict) and not source.get("optional") and \
                cluster.store.get(CONFIGMAP_KEY, (namespace, str(source.get("name", "")))) is None:
            out.append((str(volume.get("name", "")), str(source.get("name", ""))))
    return out


def mount_failed(cluster: Cluster, pod: Obj, missing: list[tuple[str, str]]) -> None:
    """The kubelet's ``FailedMount`` warning (once per pod) for the first volume it cannot set up."""
    volume, name = missing[0]
    _event(cluster, pod, "Warning", "FailedMount",
           f'MountVolume.SetUp failed for volume "{volume}" : configmap "{name}" not found', component="kubelet")


def claims_block(cluster: Cluster, pod: Obj) -> str | None:
    """Why the scheduler cannot place ``pod`` for its claims (its PreFilter message), if it cannot. A claim of a
    ``WaitForFirstConsumer`` class does not block: the scheduler selects a node for it (:func:`select_node`)."""
    namespace = pod["metadata"]["namespace"]
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        name = (volume.get("persistentVolumeClaim") or {}).get("claimName")
        if not name:
            continue
        claim = cluster.store.get(PVC_KEY, (namespace, name))
        if claim is None:
            return f'persistentvolumeclaim "{name}" not found'
        if (claim.get("status") or {}).get("phase") == "Bound":
            continue
        sc = cluster.store.get(SC_KEY, ("", _class_of(claim))) if _class_of(claim) else None
        if sc is None or sc.get("volumeBindingMode") != "WaitForFirstConsumer":
            return "pod has unbound immediate PersistentVolumeClaims"
    return None


def unbound_delayed_claims(cluster: Cluster, pod: Obj) -> list[Obj]:
    """The pod's claims that wait for their first consumer (bind once a node is selected)."""
    namespace = pod["metadata"]["namespace"]
    out = []
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        name = (volume.get("persistentVolumeClaim") or {}).get("claimName")
        claim = cluster.store.get(PVC_KEY, (namespace, name)) if name else None
        if claim is not None and (claim.get("status") or {}).get("phase") != "Bound":
            out.append(claim)
    return out


def select_node(cluster: Cluster, claims: list[Obj], node: str) -> None:
    """The scheduler chose ``node``: tell the provisioner (the claim's ``selected-node`` annotation)."""
    rt = cluster.builtin("", "persistentvolumeclaims")
    for claim in claims:
        meta = claim["metadata"]
        if (meta.get("annotations") or {}).get(SELECTED_NODE) != node:
            with contextlib.suppress(ApiError):
                cluster.patch(rt, meta["namespace"], meta["name"], "merge",
                              {"metadata": {"annotations": {SELECTED_NODE: node}}}, MANAGER)
