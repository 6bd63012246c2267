"""Device plugins: a node advertises GPUs, Neuron devices and EFA only while their device plugin runs there.

On a real node the kubelet learns about ``nvidia.com/gpu``, ``aws.amazon.com/neurondevice`` or
``vpc.amazonaws.com/efa`` from the device plugin's registration; without the plugin DaemonSet's pod on the
node, the resource is not in the node's capacity and no pod asking for it can schedule. With the gate on
(``Emulator(device_plugins=True)``), whoever writes a Node (HyperPod's node agent in the sandbox) writes
the hardware it has; the gate keeps those counts aside and strips each device resource from the stored
status until a pod of its plugin (recognised by image) is running on that node, then writes it in, and
takes it out again when that pod goes. The sandbox host turns it on (the product's dependencies stage
installs the plugins, and ``sandbox seed`` installs them as a user's cluster has them); off, as in a bare
``Emulator()``, nodes advertise what their writer says.
"""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, Any

from .store import Obj

if TYPE_CHECKING:
    from .cluster import Cluster

# Device resource -> image name fragments of the plugins that register it.
PLUGINS: dict[str, tuple[str, ...]] = {
    "nvidia.com/gpu": ("nvidia/k8s-device-plugin", "nvidia-device-plugin"),
    "aws.amazon.com/neurondevice": ("neuron-device-plugin",),
    "aws.amazon.com/neuroncore": ("neuron-device-plugin",),
    "vpc.amazonaws.com/efa": ("efa-k8s-device-plugin", "efa-device-plugin"),
}
_FIELDS = ("capacity", "allocatable")


def plugin_resources(pod: Obj) -> set[str]:
    """The device resources ``pod`` registers, if it is a device plugin."""
    images = [str(c.get("image", "")) for c in (pod.get("spec") or {}).get("containers") or []]
    return {res for res, names in PLUGINS.items() if any(n in image for n in names for image in images)}


class DeviceGate:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.hardware: dict[str, dict[str, dict[str, str]]] = {}  # node -> field -> resource -> count
        self.plugins: dict[str, dict[str, set[str]]] = {}  # node -> resource -> plugin pod uids

    def filter(self, node: Obj) -> None:
        """Before a Node is stored: remember its device counts, keep only the registered ones."""
        status = node.get("status")
        if not isinstance(status, dict):
            return
        name = node["metadata"]["name"]
        with self._lock:
            registered = {res for res, uids in self.plugins.get(name, {}).items() if uids}
            kept = self.hardware.setdefault(name, {})
            for field in _FIELDS:
                values = status.get(field)
                if not isinstance(values, dict):
                    continue
                for res in PLUGINS:
                    if res in values:
                        kept.setdefault(field, {})[res] = str(values[res])
                        if res not in registered:
                            del values[res]

    def observe(self, cluster: Cluster, pod: Obj, gone: bool) -> None:
        """A pod changed: (un)register its plugin on its node and rewrite the node's devices if that changed."""
        resources = plugin_resources(pod)
        node = (pod.get("spec") or {}).get("nodeName")
        if not resources or not node:
            return
        uid = pod["metadata"]["uid"]
        running = not gone and (pod.get("status") or {}).get("phase") == "Running" and \
            not pod["metadata"].get("deletionTimestamp")
        changed: dict[str, Any] = {}
        with self._lock:
            per_node = self.plugins.setdefault(node, {})
            for res in resources:
                uids = per_node.setdefault(res, set())
                before = bool(uids)
                if running:
                    uids.add(uid)
                else:
                    uids.discard(uid)
                if bool(uids) != before:
                    changed[res] = bool(uids)
            hardware = {f: dict(v) for f, v in self.hardware.get(node, {}).items()}
        if changed:
            _write_devices(cluster, node, changed, hardware)


def _write_devices(cluster: Cluster, node: str, changed: dict[str, bool], hardware: dict[str, dict[str, str]]
                   ) -> None:
    from .cluster import WriteOptions
    from .errors import ApiError

    patch: dict[str, Any] = {}
    for field in _FIELDS:
        values = {res: (hardware.get(field, {}).get(res) if on else None) for res, on in changed.items()
                  if not on or res in hardware.get(field, {})}
        if values:
            patch[field] = values
    if not patch:
        return
    with contextlib.suppress(ApiError):  # the node is gone
        cluster.patch(cluster.builtin("", "nodes"), None, node, "merge", {"status": patch},
                      WriteOptions(manager="kubelet"), subresource="status")


def plugin_daemonsets() -> list[dict[str, Any]]:
    """The device plugin DaemonSets a user's HyperPod cluster runs in ``kube-system`` (the HyperPod dependency
    chart's NVIDIA, EFA and Neuron plugins, with their upstream images), tolerating every taint; what
    ``sandbox seed`` installs, so seeded nodes advertise their GPUs, Neuron devices and EFA."""
    images = {
        "nvidia-device-plugin-daemonset": "nvcr.io/nvidia/k8s-device-plugin:v0.16.1",
        "aws-efa-k8s-device-plugin-daemonset":
            "602401143452.dkr.ecr.us-west-2.amazonaws.com/eks/aws-efa-k8s-device-plugin:v0.5.20",
        "neuron-device-plugin-daemonset": "public.ecr.aws/neuron/neuron-device-plugin:2.19.16.0",
    }
    return [{"apiVersion": "apps/v1", "kind": "DaemonSet",
             "metadata": {"name": name, "namespace": "kube-system"},
             "spec": {"selector": {"matchLabels": {"name": name}}, "template": {
                 "metadata": {"labels": {"name": name}},
                 "spec": {"priorityClassName": "system-node-critical", "tolerations": [{"operator": "Exists"}],
                          "containers": [{"name": "device-plugin", "image": image}]}}}}
            for name, image in images.items()]
