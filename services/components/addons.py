"""A component that is an EKS add-on: ``CreateAddon`` (tagged, ``resolveConflicts=OVERWRITE``, its pod identity
association in the same call), ``DescribeAddon`` for state and health, ``DeleteAddon`` at teardown. An add-on
someone else installed and we adopted gets what CreateAddon would have given it: its role, and its pod identity
association (``CreatePodIdentityAssociation``, tagged ours, deleted at teardown) when its service account has none.

An add-on is settled for the dependencies stage once it is ACTIVE, or DEGRADED only because its replicas
cannot run yet (``InsufficientNumberOfReplicas`` while the cluster has no Ready node: the nodes come with the
HyperPod stage, as in AWS). ``CREATE_FAILED`` fails the stage with EKS's own issue text. An add-on that exists
without our tags (installed by someone else) is used as it is and never deleted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from services.clusters.create_base import owned
from services.components.base import Component, Leftover, Observation, Target
from services.components.identity import PodRole, blocked_by, irsa_problems
from services.components.kubeapi import ready_nodes
from services.errors import NotFound

RESOLVE_CONFLICTS = "OVERWRITE"  # our field manager's values win over a self-managed install's (EKS's advice)
NO_NODES_ISSUE = "InsufficientNumberOfReplicas"
FAILED = ("CREATE_FAILED", "DELETE_FAILED", "UPDATE_FAILED")


@dataclass(frozen=True, eq=False)
class Addon(Component):
    name: str
    version: str = "default"  # the add-on's default version for the cluster's Kubernetes version
    identity: PodRole | None = None
    kind: Literal["addon", "manifest"] = "addon"
    resource_type: str = "EKS add-on"

    def _describe(self, target: Target) -> dict[str, Any] | None:
        try:
            addon: dict[str, Any] = target.client("eks").describe_addon(
                clusterName=target.eks_cluster, addonName=self.name)["addon"]
        except NotFound:
            return None
        return addon

    def observe(self, target: Target) -> Observation:
        role_missing = self.identity.missing(target) if self.identity is not None else []
        addon = self._describe(target)
        if addon is None:
            return Observation(status="ABSENT", missing=[*role_missing, "addon"], detail="not installed")
        status = str(addon["status"])
        issues = (addon.get("health") or {}).get("issues") or []
        detail = "; ".join(f"{i.get('code')}: {i.get('message')}" for i in issues)
        ours = owned(addon.get("tags"), target.cluster)
        obs = Observation(status=status, version=str(addon.get("addonVersion", "")), detail=detail,
                          missing=role_missing if ours else [], foreign=not ours)
        if ours and self._unassociated(target, role_missing):
            obs.missing.append("association")  # an adopted add-on: made as CreateAddon would have
        obs.healthy = status == "ACTIVE"
        if status in FAILED:
            obs.failed = f"EKS add-on {self.name} is {status}: {detail or 'no detail from EKS'}"
        elif status == "ACTIVE":
            obs.settled = True
        elif status == "DEGRADED" and issues and all(i.get("code") == NO_NODES_ISSUE for i in issues) \
                and target.kube is not None and ready_nodes(target.kube) == 0:
            obs.settled = True
            obs.detail = f"{detail} (no node yet: the HyperPod stage adds them)"
        return obs

    def _unassociated(self, target: Target, role_missing: list[str]) -> bool:
        """An add-on of ours whose role EKS Pod Identity hands its service account has no association: one
        someone else installed without it and we adopted (CreateAddon makes it for an add-on we install)."""
        return (self.identity is not None and not self.identity.irsa and not self.identity.associate
                and "association" not in role_missing and self.identity.association(target) is None)

    def apply(self, target: Target, observed: Observation) -> None:
        if self.identity is not None:
            self.identity.ensure(target, [m for m in observed.missing if m != "addon"])
        if "addon" not in observed.missing or self.blocked(target):
            return
        params: dict[str, Any] = {"clusterName": target.eks_cluster, "addonName": self.name,
                                  "resolveConflicts": RESOLVE_CONFLICTS, "tags": target.tags}
        params.update(self.create_params(target))
        if self.identity is not None and not self.identity.irsa:
            params["podIdentityAssociations"] = [{"serviceAccount": self.identity.service_account,
                                                  "roleArn": self.identity.role_arn(target)}]
        target.client("eks").create_addon(**params)

    def preflight(self, target: Target, settings: BaseModel | None) -> list[str]:
        """The features precheck's hook: a role trusted through IRSA needs the cluster's IAM OIDC provider."""
        return irsa_problems(self.identity, target)

    def create_params(self, target: Target) -> dict[str, Any]:
        """More ``CreateAddon`` parameters (a pinned version, configuration values); none by default."""
        return {}

    def adopt(self, target: Target, observed: Observation) -> None:
        """Tag the add-on someone else installed as ours (its configuration is then reconciled as ours)."""
        addon = self._describe(target)
        if addon is not None:
            target.client("eks").tag_resource(resourceArn=addon["addonArn"], tags=target.tags)

    def blocked(self, target: Target) -> str | None:
        return blocked_by(self.identity, target)

    def leftover(self, target: Target) -> Leftover:
        left = Leftover()
        if target.kube is not None:  # the EKS cluster is there: its add-on may be
            addon = self._describe(target)
            if addon is not None and owned(addon.get("tags"), target.cluster):
                (left.going if addon["status"] == "DELETING" else left.to_delete).append(f"addon:{self.name}")
        if self.identity is not None:  # DeleteAddon removes the add-on's association; the role is ours to delete
            left.to_delete.extend(self.identity.leftover(target))
            assoc = self.identity.association(target) if not self.identity.associate and not self.identity.irsa \
                and target.kube is not None else None
            if assoc is not None and owned(assoc.get("tags"), target.cluster):  # the one adopting it made
                left.to_delete.append(f"association:{assoc['associationId']}")
        return left

    def delete(self, target: Target, left: Leftover) -> None:
        for piece in left.to_delete:
            if piece.startswith("addon:"):
                target.client("eks").delete_addon(clusterName=target.eks_cluster, addonName=self.name)
        if self.identity is not None:
            self.identity.delete(target, [p for p in left.to_delete if not p.startswith("addon:")])
