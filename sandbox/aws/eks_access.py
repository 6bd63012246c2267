"""EKS access entries, access policies and pod identity associations, split from ``eks.py``.

They are the part of the EKS API that decides *who* may use a cluster rather than what runs in it: they
keep their own records per cluster (``rec["access"]`` keyed by principal ARN, ``rec["pods"]`` keyed by
association id) and touch the rest only through the cluster record, so they live in a mixin that
:class:`sandbox.aws.eks.EksSimulator` inherits, keeping every ``_op_`` on the simulator as before. The
error and pagination shapes all EKS operations share are here too, so both modules use one copy.
"""

from __future__ import annotations

import secrets
import uuid
from typing import TYPE_CHECKING, Any

from .base import AwsError
from .eks_checks import check_access_principal, check_pod_identity_role

if TYPE_CHECKING:
    from .base import SimClock
    from .facts import MotoFacts

POLICY_PREFIX = "arn:aws:eks::aws:cluster-access-policy/"
ACCESS_POLICIES = ("AmazonEKSAdminPolicy", "AmazonEKSAdminViewPolicy", "AmazonEKSClusterAdminPolicy",
                   "AmazonEKSEditPolicy", "AmazonEKSViewPolicy", "AmazonSagemakerHyperpodClusterPolicy",
                   "AmazonSagemakerHyperpodControllerPolicy", "AmazonSagemakerHyperpodSystemNamespacePolicy",
                   "AmazonSagemakerHyperpodSpacePolicy")


def not_found(what: str) -> AwsError:
    return AwsError("ResourceNotFoundException", what, 404)


def page(items: list[Any], params: dict[str, Any], key: str, limit: int = 100) -> dict[str, Any]:
    """One page of ``items`` under ``key``, with EKS's ``maxResults`` / ``nextToken``."""
    start = int(params.get("nextToken") or 0)
    size = int(params.get("maxResults") or limit)
    out: dict[str, Any] = {key: items[start:start + size]}
    if start + size < len(items):
        out["nextToken"] = str(start + size)
    return out


class AccessOperations:
    """The access-entry and pod-identity operations of :class:`~sandbox.aws.eks.EksSimulator`."""

    if TYPE_CHECKING:  # provided by EksSimulator
        clock: SimClock
        account: str
        facts: MotoFacts | None
        _clusters: dict[str, dict[str, Any]]

        def _rec(self, name: str) -> dict[str, Any]: ...
        def _active(self, name: str) -> dict[str, Any]: ...
        def _arn(self, kind: str, *parts: str) -> str: ...
        @staticmethod
        def _public(obj: dict[str, Any]) -> dict[str, Any]: ...

    # --- access entries --------------------------------------------------------------------------------

    @property
    def creator_arn(self) -> str:
        """The IAM principal every sandbox cluster is created by: the one the sandbox's credentials sign as.
        moto's STS answers ``arn:aws:sts::<account>:user/moto`` for them, the IAM user ``moto``; EKS names the
        creator's access entry by that IAM principal, not by the account root."""
        return f"arn:aws:iam::{self.account}:user/moto"

    def admits(self, name: str, principal: str) -> bool:
        """Whether ``principal`` (an IAM ARN) may use the cluster's Kubernetes API, as EKS decides it: with an
        access entry (modes API, API_AND_CONFIG_MAP); in CONFIG_MAP mode only the creator (the sandbox keeps
        no ``aws-auth`` mappings). A cluster EKS does not know (the emulator used alone) admits anyone."""
        rec = self._clusters.get(name)
        if rec is None:
            return True
        if rec["cluster"]["accessConfig"]["authenticationMode"] == "CONFIG_MAP":
            return principal == self.creator_arn
        return principal in rec["access"]

    def _bootstrap_creator_admin(self, name: str, rec: dict[str, Any], now: float) -> None:
        """The cluster creator's access entry with cluster-admin (``bootstrapClusterCreatorAdminPermissions``)."""
        creator = self.creator_arn
        self._new_access_entry(name, rec, {"principalArn": creator})
        rec["access"][creator]["_policies"][POLICY_PREFIX + "AmazonEKSClusterAdminPolicy"] = {
            "policyArn": POLICY_PREFIX + "AmazonEKSClusterAdminPolicy", "accessScope": {"type": "cluster"},
            "associatedAt": now, "modifiedAt": now}

    def _access_rec(self, name: str) -> dict[str, Any]:
        rec = self._rec(name)
        if rec["cluster"]["accessConfig"]["authenticationMode"] == "CONFIG_MAP":
            raise AwsError("InvalidRequestException", "The cluster's authentication mode must be set to one of "
                                                      "[API, API_AND_CONFIG_MAP] to perform this operation.")
        return rec

    def _new_access_entry(self, name: str, rec: dict[str, Any], p: dict[str, Any]) -> dict[str, Any]:
        principal = p["principalArn"]
        now = self.clock.now()
        kind = p.get("type", "STANDARD")
        noun = "user" if ":user/" in principal else "role"
        entry = {"clusterName": name, "principalArn": principal, "kubernetesGroups": p.get("kubernetesGroups") or [],
                 "accessEntryArn": self._arn("access-entry", name, noun, self.account, principal.rsplit("/", 1)[-1],
                                             str(uuid.uuid4())),
                 "createdAt": now, "modifiedAt": now, "tags": p.get("tags") or {},
                 "username": p.get("username") or principal, "type": kind, "_policies": {}}
        rec["access"][principal] = entry
        return entry

    def _entry(self, p: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        rec = self._access_rec(p["clusterName"])
        entry = rec["access"].get(p["principalArn"])
        if entry is None:
            raise not_found(f"The specified principalArn could not be found. You can view your available access "
                             f"entries with 'list-access-entries'. ({p['principalArn']})")
        return rec, entry

    def _op_CreateAccessEntry(self, p: dict[str, Any]) -> dict[str, Any]:
        rec = self._access_rec(p["clusterName"])
        if p["principalArn"] in rec["access"]:
            raise AwsError("ResourceInUseException", "The specified access entry resource is already in use on this "
                                                     "cluster.", 409)
        check_access_principal(self.facts, p["principalArn"], p.get("type", "STANDARD"), self.account,
                               self.creator_arn)
        if p.get("type", "STANDARD") != "STANDARD" and (p.get("kubernetesGroups") or p.get("username")):
            raise AwsError("InvalidParameterException",
                           "kubernetesGroups and username can only be set for access entries of type STANDARD")
        return {"accessEntry": self._public(self._new_access_entry(p["clusterName"], rec, p))}

    def create_service_access_entry(self, p: dict[str, Any]) -> dict[str, Any]:
        """An entry an AWS service makes for itself (HyperPod's service-linked role and its execution roles):
        not a client call, so none of CreateAccessEntry's refusals of client-named principals apply."""
        rec = self._access_rec(p["clusterName"])
        if p["principalArn"] in rec["access"]:
            return {"accessEntry": self._public(rec["access"][p["principalArn"]])}
        return {"accessEntry": self._public(self._new_access_entry(p["clusterName"], rec, p))}

    def _op_DescribeAccessEntry(self, p: dict[str, Any]) -> dict[str, Any]:
        return {"accessEntry": self._public(self._entry(p)[1])}

    def _op_ListAccessEntries(self, p: dict[str, Any]) -> dict[str, Any]:
        rec = self._access_rec(p["clusterName"])
        wanted = p.get("associatedPolicyArn")
        names = sorted(arn for arn, entry in rec["access"].items() if not wanted or wanted in entry["_policies"])
        return page(names, p, "accessEntries")

    def _op_UpdateAccessEntry(self, p: dict[str, Any]) -> dict[str, Any]:
        _, entry = self._entry(p)
        for key in ("kubernetesGroups", "username"):
            if key in p:
                entry[key] = p[key]
        entry["modifiedAt"] = self.clock.now()
        return {"accessEntry": self._public(entry)}

    def _op_DeleteAccessEntry(self, p: dict[str, Any]) -> dict[str, Any]:
        rec, _ = self._entry(p)
        del rec["access"][p["principalArn"]]
        return {}

    def _op_AssociateAccessPolicy(self, p: dict[str, Any]) -> dict[str, Any]:
        _, entry = self._entry(p)
        policy = p["policyArn"]
        if not policy.startswith(POLICY_PREFIX) or policy[len(POLICY_PREFIX):] not in ACCESS_POLICIES:
            raise not_found(f"The specified policy could not be found: {policy}")
        scope = p["accessScope"]
        if scope.get("type") == "namespace" and not scope.get("namespaces"):
            raise AwsError("InvalidParameterException", "namespaces must be provided for access scope type namespace")
        now = self.clock.now()
        previous = entry["_policies"].get(policy)
        associated = {"policyArn": policy, "accessScope": scope,
                      "associatedAt": previous["associatedAt"] if previous else now, "modifiedAt": now}
        entry["_policies"][policy] = associated
        return {"clusterName": p["clusterName"], "principalArn": p["principalArn"],
                "associatedAccessPolicy": associated}

    def _op_DisassociateAccessPolicy(self, p: dict[str, Any]) -> dict[str, Any]:
        _, entry = self._entry(p)
        if entry["_policies"].pop(p["policyArn"], None) is None:
            raise not_found(f"The specified policy is not associated: {p['policyArn']}")
        return {}

    def _op_ListAssociatedAccessPolicies(self, p: dict[str, Any]) -> dict[str, Any]:
        _, entry = self._entry(p)
        policies = [entry["_policies"][k] for k in sorted(entry["_policies"])]
        return {"clusterName": p["clusterName"], "principalArn": p["principalArn"],
                **page(policies, p, "associatedAccessPolicies")}

    def _op_ListAccessPolicies(self, p: dict[str, Any]) -> dict[str, Any]:
        return page([{"name": n, "arn": POLICY_PREFIX + n} for n in ACCESS_POLICIES], p, "accessPolicies")

    # --- pod identity ---------------------------------------------------------------------------------

    def _new_pod_identity(self, name: str, rec: dict[str, Any], p: dict[str, Any],
                          owner: str | None = None) -> dict[str, Any]:
        namespace, account = p["namespace"], p["serviceAccount"]
        if self.facts is not None:
            check_pod_identity_role(self.facts, p["roleArn"])
        if any(a["namespace"] == namespace and a["serviceAccount"] == account for a in rec["pods"].values()):
            raise AwsError("ResourceInUseException", f"Association already exists for service account "
                                                     f"{namespace}/{account}", 409)
        assoc_id = "a-" + secrets.token_hex(9)[:17]
        now = self.clock.now()
        assoc = {"clusterName": name, "namespace": namespace, "serviceAccount": account, "roleArn": p["roleArn"],
                 "associationArn": self._arn("podidentityassociation", name, assoc_id), "associationId": assoc_id,
                 "tags": p.get("tags") or {}, "createdAt": now, "modifiedAt": now,
                 "disableSessionTags": bool(p.get("disableSessionTags", False))}
        for key in ("targetRoleArn", "policy"):
            if p.get(key):
                assoc[key] = p[key]
        if owner:
            assoc["ownerArn"] = owner
        rec["pods"][assoc_id] = assoc
        return assoc

    def _op_CreatePodIdentityAssociation(self, p: dict[str, Any]) -> dict[str, Any]:
        rec = self._active(p["clusterName"])
        return {"association": self._new_pod_identity(p["clusterName"], rec, p)}

    def _association(self, p: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        rec = self._rec(p["clusterName"])
        assoc = rec["pods"].get(p["associationId"])
        if assoc is None:
            raise not_found(f"Association {p['associationId']} not found")
        return rec, assoc

    def _op_DescribePodIdentityAssociation(self, p: dict[str, Any]) -> dict[str, Any]:
        return {"association": self._association(p)[1]}

    def _op_ListPodIdentityAssociations(self, p: dict[str, Any]) -> dict[str, Any]:
        rec = self._rec(p["clusterName"])
        keys = ("clusterName", "namespace", "serviceAccount", "associationArn", "associationId", "ownerArn")
        items = [{k: a[k] for k in keys if k in a} for a in sorted(rec["pods"].values(), key=lambda a: a["createdAt"])
                 if p.get("namespace") in (None, a["namespace"]) and p.get("serviceAccount") in (None,
                                                                                                  a["serviceAccount"])]
        return page(items, p, "associations")

    def _op_DeletePodIdentityAssociation(self, p: dict[str, Any]) -> dict[str, Any]:
        rec, assoc = self._association(p)
        del rec["pods"][p["associationId"]]
        return {"association": assoc}

