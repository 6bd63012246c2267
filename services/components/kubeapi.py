"""The few Kubernetes requests the manifest components make, through the official client's ``ApiClient``:
get, server-side apply (``application/apply-patch+yaml`` under our one field manager, forced: these objects
are ours) and delete, for the object kinds the shipped manifests use. A fixed kind table instead of
discovery keeps a reconcile at one request per object.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from kubernetes.client import ApiClient

from services.clusters.create_base import FIELD_MANAGER
from services.errors import NotFound

#: (apiVersion, kind) -> (plural, namespaced)
KINDS: dict[tuple[str, str], tuple[str, bool]] = {
    ("v1", "Namespace"): ("namespaces", False),
    ("v1", "ServiceAccount"): ("serviceaccounts", True),
    ("v1", "Service"): ("services", True),
    ("v1", "ConfigMap"): ("configmaps", True),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): ("clusterroles", False),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): ("clusterrolebindings", False),
    ("rbac.authorization.k8s.io/v1", "Role"): ("roles", True),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): ("rolebindings", True),
    ("apps/v1", "DaemonSet"): ("daemonsets", True),
    ("apps/v1", "Deployment"): ("deployments", True),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): ("customresourcedefinitions", False),
    ("apiregistration.k8s.io/v1", "APIService"): ("apiservices", False),
    ("networking.k8s.io/v1", "Ingress"): ("ingresses", True),
    ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration"): ("mutatingwebhookconfigurations", False),
    ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration"): ("validatingwebhookconfigurations", False),
    ("cert-manager.io/v1", "Issuer"): ("issuers", True),
    ("cert-manager.io/v1", "Certificate"): ("certificates", True),
    ("karpenter.sh/v1", "NodePool"): ("nodepools", False),
    ("karpenter.sagemaker.amazonaws.com/v1", "HyperpodNodeClass"): ("hyperpodnodeclasses", False),
}
#: API versions another component's CRDs serve (what installs them): objects of these kinds are applied once
#: the API is served
FROM_CRDS: dict[str, str] = {"cert-manager.io/v1": "the cert-manager add-on"}
#: what the load balancer controller makes AWS load balancers for (its finalizers hold them until it has
#: deleted those): (apiVersion, kind, the path listing them in all namespaces)
LOAD_BALANCED = (("v1", "Service", "/api/v1/services"),
                 ("networking.k8s.io/v1", "Ingress", "/apis/networking.k8s.io/v1/ingresses"))


def object_path(obj: dict[str, Any]) -> str:
    """The API path of ``obj`` (its apiVersion, kind, namespace and name)."""
    api_version, kind = obj["apiVersion"], obj["kind"]
    plural, namespaced = KINDS[(api_version, kind)]
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    meta = obj["metadata"]
    scope = f"/namespaces/{quote(meta['namespace'], safe='')}" if namespaced else ""
    return f"{base}{scope}/{plural}/{quote(meta['name'], safe='')}"


def _call(api: ApiClient, method: str, path: str, query: list[tuple[str, str]] | None = None,
          body: str | None = None, content_type: str | None = None) -> dict[str, Any] | None:
    headers = {"Accept": "application/json", **({"Content-Type": content_type} if content_type else {})}
    method, url, headers, _, _ = api.param_serialize(method=method, resource_path=path, query_params=query or [],
                                                     header_params=headers, auth_settings=["BearerToken"])
    response = api.call_api(method, url, header_params=headers, body=body)
    data = response.read()  # type: ignore[no-untyped-call]
    parsed: dict[str, Any] | None = json.loads(data) if data else None
    return parsed


def get(api: ApiClient, obj: dict[str, Any]) -> dict[str, Any] | None:
    """The live object at ``obj``'s path, or None."""
    try:
        return _call(api, "GET", object_path(obj))
    except NotFound:
        return None


def apply(api: ApiClient, obj: dict[str, Any]) -> dict[str, Any] | None:
    """Server-side apply ``obj`` under :data:`FIELD_MANAGER`."""
    return _call(api, "PATCH", object_path(obj), [("fieldManager", FIELD_MANAGER), ("force", "true")],
                 body=json.dumps(obj), content_type="application/apply-patch+yaml")


def served(api: ApiClient, api_version: str) -> bool:
    """Whether the cluster serves ``api_version`` (a group's CRDs are established)."""
    try:
        _call(api, "GET", f"/apis/{api_version}")
    except NotFound:
        return False
    return True


def delete(api: ApiClient, obj: dict[str, Any]) -> None:
    """Delete ``obj`` (background propagation: its pods go with it); already gone is fine."""
    try:
        _call(api, "DELETE", object_path(obj), [("propagationPolicy", "Background")])
    except NotFound:
        return


def ready_nodes(api: ApiClient) -> int:
    """How many nodes of the cluster are Ready (0 before HyperPod adds any)."""
    listed = _call(api, "GET", "/api/v1/nodes") or {}
    return sum(1 for node in listed.get("items") or []
               if any(c.get("type") == "Ready" and c.get("status") == "True"
                      for c in (node.get("status") or {}).get("conditions") or []))


def load_balanced(api: ApiClient) -> list[dict[str, Any]]:
    """Every Service of type LoadBalancer and every Ingress of the cluster (all namespaces); an API that does not
    serve Ingresses has none."""
    out: list[dict[str, Any]] = []
    for api_version, kind, path in LOAD_BALANCED:
        try:
            listed = _call(api, "GET", path) or {}
        except NotFound:
            continue
        for item in listed.get("items") or []:
            if kind == "Service" and (item.get("spec") or {}).get("type") != "LoadBalancer":
                continue
            out.append({**item, "apiVersion": api_version, "kind": kind})
    return out


def items(api: ApiClient, path: str) -> list[dict[str, Any]]:
    """The items of the list at ``path`` (a kind in all namespaces); a kind the API does not serve has none."""
    try:
        listed = _call(api, "GET", path) or {}
    except NotFound:
        return []
    found: list[dict[str, Any]] = listed.get("items") or []
    return found
