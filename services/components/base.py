"""What every cluster component is: a reconciler over one piece of a cluster's software (an EKS add-on, or a set
of Kubernetes objects shipped as YAML in this package), with the IAM role and pod identity it owns.

A component observes the cluster (:meth:`Component.observe`), says what differs from what it wants
(:meth:`Component.diff`, empty when nothing is to be done), acts once on that difference
(:meth:`Component.apply`), reports its health, and deletes what it made (ours by tag or label only). It never
sleeps or loops: the operation engine schedules the waits. It knows nothing of stages or operations, so the
managed-features capability can reconcile the same components one by one.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from kubernetes.client import ApiClient
from pydantic import BaseModel

from services.aws import AwsClients
from services.clusters.create_models import ComponentState
from services.errors import Permanent


@dataclass(frozen=True)
class Target:
    """The cluster a component is reconciled on: names, where, whose tags, and how Kubernetes is reached."""

    cluster: str  # our name for it (tags, derived IAM names)
    eks_cluster: str
    region: str
    account: str
    tags: dict[str, str]
    aws: AwsClients
    kube: ApiClient | None = None  # None: the Kubernetes API is not reachable (the EKS cluster is gone)
    bucket: str | None = None  # the shared bucket the S3 CSI driver may mount
    vpc_id: str = ""  # the cluster's VPC (the load balancer controller's --aws-vpc-id); "" at teardown
    hyperpod_cluster: str = ""  # the HyperPod cluster's name, for the features that configure it ("" if none)
    hyperpod_arn: str | None = None  # the HyperPod cluster on it (the inference operator's configuration)

    def client(self, service: str) -> Any:
        return self.aws.client(service, self.region)


@dataclass
class Observation:
    """What a component found: a status word for people, whether it is settled for the dependencies stage
    (applied, and healthy or only waiting for nodes), healthy (ready to serve now), and what is missing."""

    status: str
    missing: list[str] = field(default_factory=list)  # what apply would create or change ("" when nothing)
    settled: bool = False
    healthy: bool = False
    detail: str = ""
    failed: str | None = None  # a failure no retry of this stage fixes (CREATE_FAILED and the like)
    version: str = ""
    settings: dict[str, Any] = field(default_factory=dict)  # a configurable feature's actual settings
    foreign: bool = False  # installed, but not by us (no tag or label of ours): adopted only on request


@dataclass
class Leftover:
    """What teardown still finds of a component: pieces to delete now, pieces already going away."""

    to_delete: list[str] = field(default_factory=list)
    going: list[str] = field(default_factory=list)

    @property
    def gone(self) -> bool:
        return not self.to_delete and not self.going


class Component(abc.ABC):
    """One component of the registry: a name, a kind, a version, and its reconcile verbs."""

    name: str
    kind: Literal["addon", "manifest"]
    version: str
    resource_type: str  # shown in the dry-run plan, e.g. "EKS add-on", "Kubernetes DaemonSet"
    settings_model: ClassVar[type[BaseModel] | None] = None  # a managed feature's user settings, if it has any

    def configured(self, settings: BaseModel | None) -> Component:
        """This component reconciling toward ``settings`` (an instance of :attr:`settings_model`); a
        component without settings is itself."""
        return self

    @abc.abstractmethod
    def observe(self, target: Target) -> Observation: ...

    def diff(self, observed: Observation) -> list[str]:
        """What apply would do about ``observed`` (empty: the component is as wanted)."""
        return list(observed.missing)

    @abc.abstractmethod
    def apply(self, target: Target, observed: Observation) -> None:
        """Create or change what ``observed`` says is missing (each piece once, by deterministic name)."""

    def adopt(self, target: Target, observed: Observation) -> None:
        """Take over what ``observed`` found installed by someone else (``observed.foreign``): mark it ours, so
        it is reconciled and deleted like what we made. Only on a user's explicit request."""
        raise Permanent(f"{self.name} cannot be adopted: remove the existing installation, then enable it here")

    def blocked(self, target: Target) -> str | None:
        """Why :meth:`apply` holds back part of what is missing for now (None: it does not): the IAM role it
        made is still propagating. The dependencies stage applies the rest once this clears."""
        return None

    @abc.abstractmethod
    def leftover(self, target: Target) -> Leftover:
        """What of ours is still there (teardown): never anything without our tag or label."""

    @abc.abstractmethod
    def delete(self, target: Target, left: Leftover) -> None:
        """Delete ``left.to_delete`` (ours only), each once."""

    def state(self, observed: Observation) -> ComponentState:
        return ComponentState(name=self.name, kind=self.kind, version=observed.version or self.version,
                              status=observed.status, detail=observed.detail, healthy=observed.healthy)
