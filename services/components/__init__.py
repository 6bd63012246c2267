"""Cluster components as reconciled state, not Helm releases: EKS add-ons through the add-on API and the rest
as Kubernetes objects shipped in this package, applied with server-side apply under one field manager.

The registry (:data:`COMPONENTS`, :func:`components_for`) is the one list the dependencies stage of
``cluster.create``, its teardown and the verify stage reconcile or check; each entry is a
:class:`~services.components.base.Component`.
"""

from services.components.base import Component, Leftover, Observation, Target
from services.components.families import COMPONENTS, components_for

__all__ = ["COMPONENTS", "Component", "Leftover", "Observation", "Target", "components_for"]
