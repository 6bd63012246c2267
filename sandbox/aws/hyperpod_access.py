"""HyperPod's side of EKS access: reading the orchestrator cluster and writing the access entries AWS writes.

After CreateCluster the EKS cluster's access entries include one for HyperPod's service-linked role (which
Kubernetes RBAC sees as the user ``hyperpod-service-linked-role``, the name the HyperPod dependency chart
binds its ClusterRoles to) and one for each instance group's execution role (aws-facts §4). The sandbox
writes them through the EKS simulator's own API, as a service principal of the same account would, so
``ListAccessEntries`` and the Kubernetes emulator's authenticator see them like any other entry. Without an
EKS simulator (the HyperPod simulator alone) there is nothing to read or write.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .base import AwsError
from .hyperpod_checks import EksCall

SLR_NAME = "AWSServiceRoleForSageMakerHyperPod"
SLR_USERNAME = "hyperpod-service-linked-role"


class HyperPodAccess:
    def __init__(self, eks_call: EksCall | None, account: str) -> None:
        self.eks_call = eks_call
        self.account = account

    @property
    def service_linked_role(self) -> str:
        return f"arn:aws:iam::{self.account}:role/aws-service-role/hyperpod.sagemaker.amazonaws.com/{SLR_NAME}"

    def cluster(self, arn: str) -> dict[str, Any] | None:
        """The EKS cluster an orchestrator ARN names, as EKS's DescribeCluster answers (None: no EKS here, or
        no such cluster any more: CreateCluster has already refused a missing one in HyperPod's own words)."""
        if self.eks_call is None:
            return None
        try:
            return dict(self.eks_call("DescribeCluster", {"name": arn.rsplit("/", 1)[-1]})["cluster"])
        except AwsError as exc:
            if exc.code == "ResourceNotFoundException":
                return None
            raise

    def grant(self, eks_name: str, execution_roles: Iterable[str]) -> None:
        """The service-linked role's entry and one ``HYPERPOD_LINUX`` entry per execution role, each once."""
        if self.eks_call is None:
            return
        wanted: list[dict[str, Any]] = [{"clusterName": eks_name, "principalArn": self.service_linked_role,
                                         "username": SLR_USERNAME}]
        wanted += [{"clusterName": eks_name, "principalArn": role, "type": "HYPERPOD_LINUX"}
                   for role in sorted(set(execution_roles))]
        try:
            existing = set(self.eks_call("ListAccessEntries", {"clusterName": eks_name}).get("accessEntries") or [])
        except AwsError as exc:
            if exc.code == "ResourceNotFoundException":
                return  # the EKS cluster is gone: there is nothing to grant access to
            raise
        for entry in wanted:
            if entry["principalArn"] in existing:
                continue
            try:
                self.eks_call("CreateAccessEntry", entry)
            except AwsError as exc:
                if exc.code != "ResourceInUseException":
                    raise
