"""The resource types the emulator serves: built-ins with their real scopes and short names, and CRD types.

A ``ResourceType`` is everything discovery, routing, tables and validation need to know about one
group/version/plural. Built-ins are declared here once; custom types are derived from a stored
``CustomResourceDefinition`` by :func:`types_from_crd`, so registering a CRD is just storing it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclass(frozen=True)
class PrinterColumn:
    """A CRD ``additionalPrinterColumns`` entry."""

    name: str
    type: str
    json_path: str
    description: str = ""
    priority: int = 0
    format: str = ""


@dataclass(frozen=True)
class ScalePaths:
    """Where the ``/scale`` subresource reads and writes replica counts (JSON paths without ``$``)."""

    spec_replicas: str = ".spec.replicas"
    status_replicas: str = ".status.replicas"
    label_selector: str | None = None


@dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    plural: str
    singular: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    status: bool = False
    scale: ScalePaths | None = None
    extra_subresources: tuple[str, ...] = ()
    printer_columns: tuple[PrinterColumn, ...] = ()
    crd: str | None = None  # name of the CRD that defines it
    schema: dict[str, Any] | None = field(default=None, compare=False, hash=False)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> tuple[str, str]:
        """Storage key: objects are shared by every served version of a group/plural."""
        return (self.group, self.plural)

    @property
    def subresources(self) -> tuple[str, ...]:
        subs = list(self.extra_subresources)
        if self.status:
            subs.append("status")
        if self.scale is not None:
            subs.append("scale")
        return tuple(sorted(subs))

    @property
    def list_kind(self) -> str:
        return self.kind + "List"


def _rt(
    group: str,
    version: str,
    plural: str,
    kind: str,
    namespaced: bool,
    short: tuple[str, ...] = (),
    *,
    status: bool = False,
    scale: bool = False,
    extra: tuple[str, ...] = (),
    categories: tuple[str, ...] = (),
) -> ResourceType:
    return ResourceType(
        group=group,
        version=version,
        plural=plural,
        singular=kind.lower(),
        kind=kind,
        namespaced=namespaced,
        short_names=short,
        categories=categories,
        status=status,
        scale=ScalePaths(label_selector=".status.selector") if scale else None,
        extra_subresources=extra,
    )


_ALL = ("all",)

BUILTINS: tuple[ResourceType, ...] = (
    _rt("", "v1", "namespaces", "Namespace", False, ("ns",), status=True),
    _rt("", "v1", "nodes", "Node", False, ("no",), status=True),
    _rt("", "v1", "pods", "Pod", True, ("po",), status=True, extra=("eviction", "log", "proxy"),
        categories=_ALL),
    _rt("", "v1", "services", "Service", True, ("svc",), status=True, extra=("proxy",), categories=_ALL),
    _rt("", "v1", "endpoints", "Endpoints", True, ("ep",)),
    _rt("", "v1", "configmaps", "ConfigMap", True, ("cm",)),
    _rt("", "v1", "secrets", "Secret", True),
    _rt("", "v1", "serviceaccounts", "ServiceAccount", True, ("sa",)),
    _rt("", "v1", "events", "Event", True, ("ev",)),
    _rt("", "v1", "persistentvolumes", "PersistentVolume", False, ("pv",), status=True),
    _rt("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", True, ("pvc",), status=True),
    _rt("storage.k8s.io", "v1", "storageclasses", "StorageClass", False, ("sc",)),
    _rt("storage.k8s.io", "v1", "csidrivers", "CSIDriver", False),
    _rt("apps", "v1", "deployments", "Deployment", True, ("deploy",), status=True, scale=True, categories=_ALL),
    _rt("apps", "v1", "replicasets", "ReplicaSet", True, ("rs",), status=True, scale=True, categories=_ALL),
    _rt("apps", "v1", "daemonsets", "DaemonSet", True, ("ds",), status=True, categories=_ALL),
    _rt("apps", "v1", "statefulsets", "StatefulSet", True, ("sts",), status=True, scale=True, categories=_ALL),
    _rt("batch", "v1", "jobs", "Job", True, status=True, categories=_ALL),
    _rt("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler", True, ("hpa",), status=True,
        categories=_ALL),
    _rt("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, ("pdb",), status=True),
    _rt("rbac.authorization.k8s.io", "v1", "roles", "Role", True),
    _rt("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True),
    _rt("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False),
    _rt("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False),
    _rt("coordination.k8s.io", "v1", "leases", "Lease", True),
    _rt("networking.k8s.io", "v1", "ingresses", "Ingress", True, ("ing",), status=True),
    _rt("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False,
        ("crd", "crds"), status=True),
    # registered and checked for availability (aggregator.py): the groups of unavailable ones answer 503, the
    # others are not proxied
    _rt("apiregistration.k8s.io", "v1", "apiservices", "APIService", False, status=True),
    # stored and served, never called: no request is sent to a webhook (sandbox/README.md)
    _rt("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations", "MutatingWebhookConfiguration",
        False),
    _rt("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations", "ValidatingWebhookConfiguration",
        False),
)

CRD_KEY = ("apiextensions.k8s.io", "customresourcedefinitions")
NAMESPACE_KEY = ("", "namespaces")
POD_KEY = ("", "pods")
EVENT_KEY = ("", "events")


def _columns(raw: list[dict[str, Any]] | None) -> tuple[PrinterColumn, ...]:
    return tuple(
        PrinterColumn(
            name=c["name"],
            type=c.get("type", "string"),
            json_path=c["jsonPath"],
            description=c.get("description", ""),
            priority=int(c.get("priority", 0)),
            format=c.get("format", ""),
        )
        for c in raw or []
    )


def types_from_crd(crd: dict[str, Any]) -> list[ResourceType]:
    """One ``ResourceType`` per served version of a CustomResourceDefinition object."""
    spec = crd.get("spec", {})
    names = spec.get("names", {})
    out = []
    for ver in spec.get("versions", []):
        if not ver.get("served", True):
            continue
        subs = ver.get("subresources") or {}
        scale = subs.get("scale")
        out.append(
            ResourceType(
                group=spec["group"],
                version=ver["name"],
                plural=names["plural"],
                singular=names.get("singular") or names["kind"].lower(),
                kind=names["kind"],
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                short_names=tuple(names.get("shortNames") or ()),
                categories=tuple(names.get("categories") or ()),
                status="status" in subs,
                scale=ScalePaths(
                    spec_replicas=scale["specReplicasPath"],
                    status_replicas=scale["statusReplicasPath"],
                    label_selector=scale.get("labelSelectorPath"),
                )
                if scale
                else None,
                printer_columns=_columns(ver.get("additionalPrinterColumns")),
                crd=crd["metadata"]["name"],
                schema=(ver.get("schema") or {}).get("openAPIV3Schema"),
            )
        )
    return out
