"""Kubeconfig documents that point ``kubectl`` and the official client at an emulated cluster.

The server URL carries the cluster's path prefix (``http://127.0.0.1:PORT/k8s/clusters/<name>``);
both kubectl and client-go/the Python client keep a path prefix on every request. Plain HTTP needs no
TLS flags. The user is a bearer token, so the same kubeconfig shape works against EKS later.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml

CLUSTER_PREFIX = "/k8s/clusters"


def server_url(base_url: str, cluster: str) -> str:
    return f"{base_url.rstrip('/')}{CLUSTER_PREFIX}/{cluster}"


def kubeconfig(cluster: str, base_url: str, token: str = "sandbox", namespace: str = "default",
               ca_pem: bytes | None = None) -> dict[str, Any]:
    """A kubeconfig with one cluster, one token user and one current context named after the cluster;
    ``ca_pem`` (for an https ``base_url``) becomes ``certificate-authority-data``."""
    user = f"{cluster}-user"
    entry: dict[str, Any] = {"server": server_url(base_url, cluster)}
    if ca_pem is not None:
        entry["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "clusters": [{"name": cluster, "cluster": entry}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": user, "namespace": namespace}}],
        "current-context": cluster,
    }


def kubeconfig_yaml(cluster: str, base_url: str, token: str = "sandbox", namespace: str = "default",
                    ca_pem: bytes | None = None) -> str:
    return yaml.safe_dump(kubeconfig(cluster, base_url, token, namespace, ca_pem), sort_keys=False)


def write_kubeconfig(path: Path, cluster: str, base_url: str, token: str = "sandbox",
                     namespace: str = "default", ca_pem: bytes | None = None) -> Path:
    """Write the kubeconfig with owner-only permissions (it holds a token) and return its path."""
    from sandbox.tls import write_private

    path.parent.mkdir(parents=True, exist_ok=True)
    write_private(path, kubeconfig_yaml(cluster, base_url, token, namespace, ca_pem).encode())
    return path
