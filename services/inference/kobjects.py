"""Tiny accessors of Kubernetes objects the inference modules read: the watch caches' slimmed dicts
(``services/informers.py``), objects read live and serialised to dicts, and the client's typed pods. Pure
functions: nothing here reads the network."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return meta(obj).get("labels") or {}


def cached_ready(pod: Mapping[str, Any]) -> bool:
    """A pod from the pods' watch cache (``informers.slim_pod`` keeps its Ready condition as ``status.ready``):
    Running and Ready."""
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and bool(status.get("ready"))


def live_ready(pod: Mapping[str, Any]) -> bool:
    """A pod read live and serialised to a dict: Running with its Ready condition True."""
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def typed_ready(pod: Any) -> bool:
    """A pod as the ``kubernetes`` client's V1Pod: Running with its Ready condition True."""
    return pod.status is not None and pod.status.phase == "Running" and any(
        c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])
