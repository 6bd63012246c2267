"""The persistent volume controller: a static PV binds to its claim by class name; dynamic provisioning
happens only once the StorageClass and its CSI driver exist; pods wait for their claims."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from sandbox.kube import Cluster
from tests.support import wait_until

from .conftest import KubeServer
from .nodes import add_node


def _claim(name: str, storage_class: str | None, size: str = "10Gi") -> dict[str, Any]:
    spec: dict[str, Any] = {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": size}}}
    if storage_class is not None:
        spec["storageClassName"] = storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name}, "spec": spec}


def _events(core: client.CoreV1Api, name: str) -> dict[str, str]:
    return {e.reason: e.message for e in core.list_namespaced_event("default").items
            if e.involved_object.name == name}


def test_static_volume_binds_by_class_name(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    for name, klass in (("other-pv", "ebs-sc"), ("fsx-pv", "fsx-sc")):
        core.create_persistent_volume({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
                                       "spec": {"capacity": {"storage": "1200Gi"}, "accessModes": ["ReadWriteMany"],
                                                "storageClassName": klass, "csi": {
                                                    "driver": "fsx.csi.aws.com", "volumeHandle": "fs-0123"}}})
    core.create_namespaced_persistent_volume_claim("default", _claim("fsx-claim", "fsx-sc", "1200Gi"))
    claim = wait_until(lambda: (c := core.read_namespaced_persistent_volume_claim("fsx-claim", "default"))
                       .status.phase == "Bound" and c)
    assert claim.spec.volume_name == "fsx-pv" and claim.status.capacity == {"storage": "1200Gi"}
    pv = core.read_persistent_volume("fsx-pv")
    assert pv.status.phase == "Bound" and pv.spec.claim_ref.name == "fsx-claim"
    assert core.read_persistent_volume("other-pv").spec.claim_ref is None
    core.create_namespaced_persistent_volume_claim("default", _claim("too-big", "fsx-sc", "2400Gi"))
    wait_until(lambda: core.read_namespaced_persistent_volume_claim("too-big", "default").status.phase == "Pending")


def test_dynamic_provisioning_needs_the_class_and_its_csi_driver(api: client.ApiClient, kube_server: KubeServer,
                                                                 cluster_name: str) -> None:
    core, storage = client.CoreV1Api(api), client.StorageV1Api(api)
    core.create_namespaced_persistent_volume_claim("default", _claim("data", "gp3"))
    wait_until(lambda: _events(core, "data").get("ProvisioningFailed") == 'storageclass.storage.k8s.io "gp3" not found')
    storage.create_storage_class({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                                  "metadata": {"name": "gp3"}, "provisioner": "ebs.csi.aws.com"})
    wait_until(lambda: "ExternalProvisioning" in _events(core, "data"))
    assert _events(core, "data")["ExternalProvisioning"] == (
        'waiting for a volume to be created, either by external provisioner "ebs.csi.aws.com" or manually created '
        "by system administrator")
    assert core.read_namespaced_persistent_volume_claim("data", "default").status.phase == "Pending"
    storage.create_csi_driver({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
                               "metadata": {"name": "ebs.csi.aws.com"}, "spec": {"attachRequired": True}})
    claim = wait_until(lambda: (c := core.read_namespaced_persistent_volume_claim("data", "default"))
                       .status.phase == "Bound" and c)
    pv = core.read_persistent_volume(claim.spec.volume_name)
    assert pv.spec.csi.driver == "ebs.csi.aws.com" and pv.spec.capacity == {"storage": "10Gi"}
    assert pv.metadata.annotations["pv.kubernetes.io/provisioned-by"] == "ebs.csi.aws.com"


def test_pods_wait_for_their_claims(api: client.ApiClient, kube_server: KubeServer, cluster_name: str) -> None:
    cluster: Cluster = kube_server.emulator.cluster(cluster_name)
    add_node(cluster, "n1")
    core, storage = client.CoreV1Api(api), client.StorageV1Api(api)
    storage.create_csi_driver({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
                               "metadata": {"name": "ebs.csi.aws.com"}, "spec": {}})
    storage.create_storage_class({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                                  "metadata": {"name": "gp3",
                                               "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
                                  "provisioner": "ebs.csi.aws.com", "volumeBindingMode": "WaitForFirstConsumer"})

    def pod(name: str, claim: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
            "containers": [{"name": "m", "image": "busybox:1.36"}],
            "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": claim}}]}}

    core.create_namespaced_pod("default", pod("orphan", "missing"))
    refused = wait_until(lambda: next((c for c in core.read_namespaced_pod("orphan", "default").status.conditions or []
                                       if c.type == "PodScheduled"), None))
    assert refused.message.startswith('0/1 nodes are available: persistentvolumeclaim "missing" not found.')
    created = core.create_namespaced_persistent_volume_claim("default", _claim("scratch", None))
    assert created.spec.storage_class_name == "gp3"  # the default class
    wait_until(lambda: "WaitForFirstConsumer" in _events(core, "scratch"))
    core.create_namespaced_pod("default", pod("user", "scratch"))
    running = wait_until(lambda: (p := core.read_namespaced_pod("user", "default")).status.phase == "Running" and p)
    claim = core.read_namespaced_persistent_volume_claim("scratch", "default")
    assert claim.status.phase == "Bound" and claim.metadata.annotations["volume.kubernetes.io/selected-node"] == \
        running.spec.node_name
