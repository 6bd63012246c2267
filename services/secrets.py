"""Secrets stay out of records: a request field that carries one (a Hugging Face token, MLflow credentials)
is typed ``SecretStr``; the verb puts its value into a Kubernetes Secret in the target cluster and submits
a plan that holds only a :class:`SecretRef`. So the operation's stored request, the audit log, logs,
responses and the sandbox's call ledger never see the value (pydantic prints ``SecretStr`` as
``**********`` and the engine refuses a request that still holds one).
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from typing import Any

from kubernetes import client as k8s
from pydantic import BaseModel, Field, SecretStr

from services.errors import NotFound, Permanent
from services.kube import KubeClients
from services.models import ResponseModel

MANAGED_BY = {"app.kubernetes.io/managed-by": "instantstart"}


class SecretRef(ResponseModel):
    """Where a secret value lives: a key of a Kubernetes Secret (never the value itself)."""

    cluster: str
    namespace: str
    name: str
    key: str = Field(..., description="the key of the Secret's data holding the value")


def secret_values(model: BaseModel) -> dict[str, str]:
    """The set ``SecretStr`` values of a request anywhere in it, by dotted path (``token``, ``mlflow.password``,
    ``env.HF_TOKEN``, ``mounts.0.key``): nested models, dicts, lists and tuples are walked, so a secret cannot
    hide one level down (for the verb that stashes them, and the engine's guard)."""
    found: dict[str, str] = {}
    _walk(model, "", found)
    return found


def _walk(value: Any, path: str, found: dict[str, str]) -> None:
    if isinstance(value, SecretStr):
        if value:
            found[path] = value.get_secret_value()
        return
    if isinstance(value, BaseModel):
        items: Iterable[tuple[Any, Any]] = iter(value)  # its fields (and extra keys, if it allows them)
    elif isinstance(value, dict):
        items = value.items()
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = enumerate(value)
    else:
        return
    for key, item in items:
        _walk(item, f"{path}.{key}" if path else str(key), found)


def refuse_secrets(model: BaseModel) -> None:
    """The engine's guard: a request that still holds a secret value (at any depth) is a bug in its verb,
    never stored."""
    held = sorted(secret_values(model))
    if held:
        raise Permanent(f"{type(model).__name__} still holds secret fields {held}: its verb must put them in a "
                        "Kubernetes Secret (services/secrets.py) and submit references; this is a bug")


def stash(kube: KubeClients, cluster: str, namespace: str, name: str, values: dict[str, str]) -> dict[str, SecretRef]:
    """Create or replace the Secret ``namespace/name`` in ``cluster`` with ``values``; their references."""
    core = k8s.CoreV1Api(kube.api_client(cluster))
    data = {key: base64.b64encode(value.encode()).decode() for key, value in values.items()}
    secret = k8s.V1Secret(api_version="v1", kind="Secret", type="Opaque", data=data,
                          metadata=k8s.V1ObjectMeta(name=name, namespace=namespace, labels=MANAGED_BY))
    try:
        core.replace_namespaced_secret(name, namespace, secret)
    except NotFound:  # the client factory's clients raise the taxonomy
        core.create_namespaced_secret(namespace, secret)
    return {key: SecretRef(cluster=cluster, namespace=namespace, name=name, key=key) for key in values}


def read(kube: KubeClients, ref: SecretRef) -> str:
    """The value behind ``ref`` (for the stage that hands it to a workload, never to a record)."""
    secret = k8s.CoreV1Api(kube.api_client(ref.cluster)).read_namespaced_secret(ref.name, ref.namespace)
    return base64.b64decode((secret.data or {})[ref.key]).decode()
