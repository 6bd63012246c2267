"""The Hugging Face token's Secrets of a self-managed deployment.

Each deploy request that carries a token makes its own Secret, ``<name>-hf-token-<random>``: created, never
replaced, labelled ours for that deployment (managed-by and the inference label), and named by the request's
plan. Two requests for one name therefore never touch each other's Secret: one refused before its operation
deletes only its own. The apply stage makes the Deployment the owner of the Secret it now reads and deletes the
older token Secrets of that name; the delete stage deletes every token Secret of the name; a cancelled deploy
deletes the one it made unless the Deployment already reads it. Secrets without our labels are never touched.
"""

from __future__ import annotations

import base64
import contextlib
import secrets
from typing import Any

from kubernetes import client as k8s

from services.errors import NotFound
from services.inference.manifest import INFERENCE_LABEL, labels
from services.kube import KubeClients
from services.secrets import SecretRef
from services.training.manifests import MANAGED_BY

KEY = "token"


def _core(kube: KubeClients, cluster: str) -> k8s.CoreV1Api:
    return k8s.CoreV1Api(kube.api_client(cluster))


def new_ref(cluster: str, namespace: str, deployment: str) -> SecretRef:
    """A fresh name for one request's token Secret."""
    return SecretRef(cluster=cluster, namespace=namespace, name=f"{deployment}-hf-token-{secrets.token_hex(3)}",
                     key=KEY)


def create(kube: KubeClients, ref: SecretRef, deployment: str, value: str) -> None:
    """Create (never replace: a name already taken is the API's 409) the Secret ``ref`` names."""
    data = {ref.key: base64.b64encode(value.encode()).decode()}
    body = k8s.V1Secret(api_version="v1", kind="Secret", type="Opaque", data=data,
                        metadata=k8s.V1ObjectMeta(name=ref.name, namespace=ref.namespace, labels=labels(deployment)))
    _core(kube, ref.cluster).create_namespaced_secret(ref.namespace, body)


def delete(kube: KubeClients, ref: SecretRef) -> None:
    with contextlib.suppress(NotFound):
        _core(kube, ref.cluster).delete_namespaced_secret(ref.name, ref.namespace)


def listed(kube: KubeClients, cluster: str, namespace: str, deployment: str) -> list[Any]:
    """The token Secrets labelled ours for ``deployment``."""
    selector = f"{MANAGED_BY}=instantstart,{INFERENCE_LABEL}={deployment}"
    return list(_core(kube, cluster).list_namespaced_secret(namespace, label_selector=selector).items)


def delete_older(kube: KubeClients, cluster: str, namespace: str, deployment: str, current: Any) -> list[str]:
    """Delete the token Secrets of ``deployment`` made before ``current`` (the one its Deployment reads now);
    a newer one belongs to a request not yet submitted and stays. The names deleted."""
    gone = []
    for secret in listed(kube, cluster, namespace, deployment):
        made = secret.metadata.creation_timestamp
        if secret.metadata.name != current.metadata.name and made is not None \
                and made < current.metadata.creation_timestamp:
            delete(kube, SecretRef(cluster=cluster, namespace=namespace, name=secret.metadata.name, key=KEY))
            gone.append(str(secret.metadata.name))
    return gone


def delete_all(kube: KubeClients, cluster: str, namespace: str, deployment: str) -> list[str]:
    names = [str(s.metadata.name) for s in listed(kube, cluster, namespace, deployment)]
    for name in names:
        delete(kube, SecretRef(cluster=cluster, namespace=namespace, name=name, key=KEY))
    return names
