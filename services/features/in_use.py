"""What keeps a feature from being turned off: the Kubernetes objects that still use it. Turning off a CSI
driver while PersistentVolumes of it are bound strands their pods' mounts; turning off an operator while its
custom resources exist strands them (their finalizers are the operator's); the load balancer controller holds
the AWS load balancers of Services and Ingresses. Each lister names those objects (read-only)."""

from __future__ import annotations

from collections.abc import Callable

from kubernetes.client import ApiClient

from services.components import kubeapi

#: a feature's in-use lister: the objects (``Kind namespace/name``) that must go before it is turned off
InUse = Callable[[ApiClient], list[str]]


def bound_volumes(driver: str) -> InUse:
    """The bound PersistentVolumes of the CSI ``driver``."""
    def listed(api: ApiClient) -> list[str]:
        return [f"PersistentVolume {pv['metadata']['name']}" for pv in kubeapi.items(api, "/api/v1/persistentvolumes")
                if ((pv.get("spec") or {}).get("csi") or {}).get("driver") == driver
                and (pv.get("status") or {}).get("phase") == "Bound"]
    return listed


def custom_resources(*kinds: tuple[str, str, str]) -> InUse:
    """The objects of each ``(group/version, kind, plural)`` in all namespaces."""
    def listed(api: ApiClient) -> list[str]:
        return [f"{kind} {o['metadata'].get('namespace')}/{o['metadata']['name']}"
                for api_version, kind, plural in kinds for o in kubeapi.items(api, f"/apis/{api_version}/{plural}")]
    return listed


def load_balanced(api: ApiClient) -> list[str]:
    """The Services and Ingresses the load balancer controller holds AWS load balancers for."""
    return [f"{o['kind']} {o['metadata'].get('namespace')}/{o['metadata']['name']}" for o in kubeapi.load_balanced(api)]
