"""The IAM role a component's pods run as through EKS Pod Identity: trusted by ``pods.eks.amazonaws.com``
(``sts:AssumeRole`` + ``sts:TagSession``), tagged in ``CreateRole``, with its policies; and, for components
that are not add-ons, the pod identity association tying it to the component's service account. A role marked
``irsa`` is trusted instead through the cluster's IAM OIDC provider for that one service account (IRSA).

Each piece is observed before it is made, so a reconcile that finds everything in place writes nothing, and
teardown deletes a role or association only when it carries our tags.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from services.clusters.create_base import owned, tag_list
from services.components.base import Target
from services.errors import NotFound, Permanent

POD_IDENTITY_TRUST = json.dumps({"Version": "2012-10-17", "Statement": [{
    "Effect": "Allow", "Principal": {"Service": "pods.eks.amazonaws.com"},
    "Action": ["sts:AssumeRole", "sts:TagSession"]}]})
INLINE_POLICY = "instantstart"  # the name of the inline policy a role carries, when it has one


def find_role(target: Target, name: str) -> dict[str, Any] | None:
    """IAM's GetRole of ``name``, None when there is none (every component that owns a role observes it so)."""
    try:
        role: dict[str, Any] = target.client("iam").get_role(RoleName=name)["Role"]
    except NotFound:
        return None
    return role


def oidc_provider(target: Target) -> tuple[str, str, str | None]:
    """The EKS cluster's OIDC issuer, the ARN IAM gives its provider, and why a role cannot trust the cluster's
    service accounts through IRSA (None: IAM has the provider). Only reads: every component with an IRSA role
    (the inference operator's, tiered checkpointing's) asks this one function, in its preflight and its trust."""
    from services.clusters.eks_stage import OIDC_AUDIENCE, provider_arn
    try:
        issuer = str(((target.client("eks").describe_cluster(name=target.eks_cluster)["cluster"].get("identity")
                       or {}).get("oidc") or {}).get("issuer") or "")
    except NotFound:
        return "", "", f"EKS cluster {target.eks_cluster} does not exist"
    if not issuer:
        return "", "", f"EKS cluster {target.eks_cluster} has no OIDC issuer"
    arn = provider_arn(target.account, target.region, issuer)
    try:
        target.client("iam").get_open_id_connect_provider(OpenIDConnectProviderArn=arn)
    except NotFound:
        return issuer, arn, (
            f"oidc-provider: EKS cluster {target.eks_cluster} has no IAM OIDC provider for its issuer {issuer} "
            f"(expected {arn}): IAM roles for service accounts trust the cluster's service accounts through it. "
            f"Create it (IAM CreateOpenIDConnectProvider): aws iam create-open-id-connect-provider --url {issuer} "
            f"--client-id-list {OIDC_AUDIENCE} — or in the IAM console, Identity providers, Add provider, OpenID "
            f"Connect, with that URL and audience — then retry")
    return issuer, arn, None


def role_tags(target: Target, name: str) -> dict[str, str]:
    """The tags of role ``name`` (GetRole's answer may omit them), as a dict for :func:`owned`."""
    tags = target.client("iam").list_role_tags(RoleName=name).get("Tags", [])
    return {t["Key"]: t["Value"] for t in tags}


@dataclass(frozen=True)
class PodRole:
    """The role ``<cluster>-<suffix>`` for the service account ``namespace/service_account``."""

    suffix: str
    namespace: str
    service_account: str
    managed_policies: tuple[str, ...] = ()
    inline: Callable[[Target], dict[str, Any]] | None = None
    #: make the pod identity association here (False: the add-on's CreateAddon makes it and deletes it)
    associate: bool = False
    #: trusted through IRSA (the cluster's IAM OIDC provider, for this service account) instead of EKS Pod
    #: Identity: no pod identity association at all, the component is handed the role's ARN
    irsa: bool = False
    description: str = field(default="")

    # services.clusters.iam_stage imports services.clusters.create, which imports this package: its
    # partition() and PROPAGATION_SECONDS are imported where used, after both modules are loaded

    def role_name(self, target: Target) -> str:
        return f"{target.cluster}-{self.suffix}"

    def role_arn(self, target: Target) -> str:
        from services.clusters.iam_stage import partition
        return f"arn:{partition(target.region)}:iam::{target.account}:role/{self.role_name(target)}"

    def trust(self, target: Target) -> dict[str, Any]:
        """The trust policy: EKS Pod Identity, or (:attr:`irsa`) ``sts:AssumeRoleWithWebIdentity`` from the
        cluster's OIDC provider for ``system:serviceaccount:<namespace>:<service account>`` only."""
        if not self.irsa:
            trust: dict[str, Any] = json.loads(POD_IDENTITY_TRUST)
            return trust
        from services.clusters.eks_stage import OIDC_AUDIENCE
        issuer, provider, missing = oidc_provider(target)
        if not issuer:  # (a missing provider is the preflight's refusal; the document names it all the same)
            raise Permanent(f"the role {self.role_name(target)} (IAM roles for service accounts) cannot be "
                            f"trusted: {missing}")
        host = issuer.removeprefix("https://")
        return {"Version": "2012-10-17", "Statement": [{
            "Effect": "Allow", "Principal": {"Federated": provider},
            "Action": "sts:AssumeRoleWithWebIdentity",
            "Condition": {"StringEquals": {f"{host}:sub": f"system:serviceaccount:{self.namespace}:"
                                                          f"{self.service_account}",
                                           f"{host}:aud": OIDC_AUDIENCE}}}]}

    def policy_arns(self, target: Target) -> list[str]:
        """The ARNs of :attr:`managed_policies` (AWS managed policy names) in ``target``'s partition."""
        from services.clusters.iam_stage import partition
        return [f"arn:{partition(target.region)}:iam::aws:policy/{name}" for name in self.managed_policies]

    # ----- observe ------------------------------------------------------------------------------------------

    def _role(self, target: Target) -> dict[str, Any] | None:
        return find_role(target, self.role_name(target))

    def _role_tags(self, target: Target) -> dict[str, str]:
        return role_tags(target, self.role_name(target))

    def _attached(self, target: Target) -> set[str]:
        pages = target.client("iam").all_pages("list_attached_role_policies", "AttachedPolicies",
                                               RoleName=self.role_name(target))
        return {p["PolicyArn"] for p in pages}

    def _has_inline(self, target: Target) -> bool:
        names = target.client("iam").all_pages("list_role_policies", "PolicyNames", RoleName=self.role_name(target))
        return INLINE_POLICY in names

    def _association(self, target: Target) -> dict[str, Any] | None:
        found = target.client("eks").all_pages(
            "list_pod_identity_associations", "associations", clusterName=target.eks_cluster,
            namespace=self.namespace, serviceAccount=self.service_account)
        if not found:
            return None
        described: dict[str, Any] = target.client("eks").describe_pod_identity_association(
            clusterName=target.eks_cluster, associationId=found[0]["associationId"])["association"]
        return described

    def association(self, target: Target) -> dict[str, Any] | None:
        """The pod identity association of the service account (whoever made it), None when it has none."""
        return self._association(target)

    def propagating(self, target: Target) -> bool:
        """Whether the role is younger than IAM's propagation time (by its ``CreateDate``): EKS handed it now
        may not be able to assume it yet, so the add-on or association that uses it waits. Read from the role
        itself, so a crash between CreateRole and that wait does not skip it."""
        from services.clusters.iam_stage import PROPAGATION_SECONDS
        role = self._role(target)
        if role is None:
            return True
        created: datetime = role["CreateDate"]
        return (datetime.now(UTC) - created).total_seconds() < PROPAGATION_SECONDS

    def missing(self, target: Target) -> list[str]:
        """The pieces not there yet or not as wanted: ``role``, ``trust``, ``policies``, ``association``. A role
        of our name without our tags is someone else's: refused (Permanent), never adopted or changed."""
        role = self._role(target)
        if role is None:
            return ["role", "policies"] + (["association"] if self.associate else [])
        if not owned(self._role_tags(target), target.cluster):
            raise Permanent(f"the IAM role {self.role_name(target)} exists and is not {target.cluster}'s (no "
                            "instantstart tags): it is left alone; delete or rename it, then retry",
                            details={"role": self.role_name(target), "arn": role.get("Arn")})
        out = []
        if role.get("AssumeRolePolicyDocument") != self.trust(target):
            out.append("trust")
        if not set(self.policy_arns(target)) <= self._attached(target) or (
                self.inline is not None and not self._has_inline(target)):
            out.append("policies")
        if self.associate and target.kube is not None and self._association(target) is None:
            out.append("association")
        return out

    # ----- act ----------------------------------------------------------------------------------------------

    def ensure(self, target: Target, missing: list[str]) -> None:
        iam = target.client("iam")
        name = self.role_name(target)
        if "role" in missing:
            how = "IRSA" if self.irsa else "EKS Pod Identity"
            iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(self.trust(target)),
                            Tags=tag_list(target.tags), Description=self.description or
                            f"{self.namespace}/{self.service_account} of {target.cluster} ({how})")
        if "trust" in missing:  # ours, but not trusting what it should (edited since): put our trust back
            iam.update_assume_role_policy(RoleName=name, PolicyDocument=json.dumps(self.trust(target)))
        if "policies" in missing:
            attached = set() if "role" in missing else self._attached(target)
            for arn in self.policy_arns(target):
                if arn not in attached:
                    iam.attach_role_policy(RoleName=name, PolicyArn=arn)
            if self.inline is not None:
                iam.put_role_policy(RoleName=name, PolicyName=INLINE_POLICY,
                                    PolicyDocument=json.dumps(self.inline(target)))
        if "association" in missing and not self.propagating(target):  # else the stage applies it once IAM has
            target.client("eks").create_pod_identity_association(
                clusterName=target.eks_cluster, namespace=self.namespace, serviceAccount=self.service_account,
                roleArn=self.role_arn(target), tags=target.tags)

    # ----- teardown -----------------------------------------------------------------------------------------

    def leftover(self, target: Target) -> list[str]:
        out = []
        if self.associate and target.kube is not None:
            assoc = self._association(target)
            if assoc is not None and owned(assoc.get("tags"), target.cluster):
                out.append(f"association:{assoc['associationId']}")
        if self._role(target) is not None and owned(self._role_tags(target), target.cluster):
            out.append(f"role:{self.role_name(target)}")
        return out

    def delete(self, target: Target, pieces: list[str]) -> None:
        iam = target.client("iam")
        for piece in pieces:
            kind, _, ident = piece.partition(":")
            if kind == "association":
                target.client("eks").delete_pod_identity_association(clusterName=target.eks_cluster,
                                                                      associationId=ident)
            elif kind == "role":
                for arn in self._attached(target):
                    iam.detach_role_policy(RoleName=ident, PolicyArn=arn)
                if self._has_inline(target):
                    iam.delete_role_policy(RoleName=ident, PolicyName=INLINE_POLICY)
                iam.delete_role(RoleName=ident)


def blocked_by(identity: PodRole | None, target: Target) -> str | None:
    """What :meth:`~services.components.base.Component.blocked` says for a component with ``identity``."""
    if identity is not None and identity.propagating(target):
        return f"waiting for IAM to propagate the role {identity.role_name(target)}"
    return None


def irsa_problems(identity: PodRole | None, target: Target) -> list[str]:
    """A preflight's problems for a component whose role is trusted through IRSA: the missing OIDC provider."""
    if identity is None or not identity.irsa:
        return []
    _, _, missing = oidc_provider(target)
    return [missing] if missing else []
