"""Kubeconfigs for users' ``kubectl``: the cluster's endpoint and CA, and a user that runs an exec plugin
(``instantstart kube-token``, which prints what ``aws eks get-token`` prints) for a short-lived token. No
token is ever embedded, so a kubeconfig that leaks grants nothing by itself."""

from __future__ import annotations

import yaml

EXEC_API = "client.authentication.k8s.io/v1beta1"


def kubeconfig_yaml(name: str, eks_name: str, region: str, endpoint: str, ca_data: str) -> str:
    """One cluster, one user, one context, all called ``name``; the user's token comes from the plugin."""
    document = {
        "apiVersion": "v1", "kind": "Config", "current-context": name, "preferences": {},
        "clusters": [{"name": name, "cluster": {"server": endpoint, "certificate-authority-data": ca_data}}],
        "users": [{"name": name, "user": {"exec": {
            "apiVersion": EXEC_API, "command": "instantstart",
            "args": ["kube-token", "--cluster-name", eks_name, "--region", region],
            "interactiveMode": "Never", "provideClusterInfo": False}}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
    }
    return yaml.safe_dump(document, sort_keys=False)


def exec_credential(token: str, expires_at: str) -> dict[str, object]:
    """What an exec plugin prints: an ``ExecCredential`` with the bearer token and when it expires."""
    return {"kind": "ExecCredential", "apiVersion": EXEC_API, "spec": {},
            "status": {"token": token, "expirationTimestamp": expires_at}}
