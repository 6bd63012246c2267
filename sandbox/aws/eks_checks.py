"""What EKS checks about the IAM roles, subnets, security groups and principals a request names.

EKS reads them from IAM and EC2 (here: moto, through :class:`~sandbox.aws.facts.MotoFacts`) and refuses,
with ``InvalidParameterException``:

* a cluster role that does not exist or does not trust ``eks.amazonaws.com``;
* cluster subnets that do not exist, that are not in one VPC or not in at least two Availability Zones,
  and security groups that do not exist or belong to another VPC;
* a pod identity role that does not exist, or whose trust policy does not let ``pods.eks.amazonaws.com``
  perform both ``sts:AssumeRole`` and ``sts:TagSession``;
* an access entry of an unknown type, for an STS session, for something that is not an IAM user or role
  (or the account root), for a service-linked role, for a non-role with a node type, or for a principal of
  this account that does not exist.

Messages are EKS's where they are known (cluster role, AZs, security groups of another VPC, pod identity);
the others name the rule in the same style.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from .base import AwsError

if TYPE_CHECKING:
    from .facts import MotoFacts

ACCESS_ENTRY_TYPES = ("STANDARD", "FARGATE_LINUX", "EC2_LINUX", "EC2_WINDOWS", "EC2", "HYBRID_LINUX",
                      "HYPERPOD_LINUX")
_PRINCIPAL = re.compile(r"arn:aws[a-z\-]*:iam::(?P<account>\d{12}):(?:root|(?P<kind>user|role)(?P<path>/(?:[^/]+/)*)"
                        r"[\w+=,.@-]+)")


def _invalid(message: str) -> AwsError:
    return AwsError("InvalidParameterException", message)


def check_cluster_role(facts: MotoFacts, arn: str) -> None:
    role = facts.role(arn)
    if role is None or not role.trusts("eks.amazonaws.com"):
        raise _invalid(f"Role with arn: {arn}, could not be assumed because it does not exist or the trusted "
                       "entity is not correct")


def check_cluster_network(facts: MotoFacts, subnet_ids: list[str], group_ids: list[str]) -> str:
    """The cluster's VPC, once its subnets and security groups pass EKS's checks."""
    vpcs: set[str] = set()
    zones: set[str] = set()
    for subnet_id in subnet_ids:
        subnet = facts.subnet(subnet_id)
        if subnet is None:
            raise _invalid(f"The subnet ID '{subnet_id}' does not exist")
        vpcs.add(subnet.vpc)
        zones.add(subnet.zone)
    if len(vpcs) > 1:
        raise _invalid(f"Subnets specified must belong to the same VPC; they are in {', '.join(sorted(vpcs))}")
    if len(zones) < 2:
        raise _invalid("Subnets specified must be in at least two different AZs")
    vpc = vpcs.pop()
    elsewhere: list[str] = []
    for group_id in group_ids:
        group = facts.security_group(group_id)
        if group is None:
            raise _invalid(f"The security group '{group_id}' does not exist")
        if group.vpc != vpc:
            elsewhere.append(group_id)
    if elsewhere:
        raise _invalid(f"Security group(s) [{', '.join(elsewhere)}] are not in the same VPC as the subnets. Please "
                       f"specify a security group that is associated with the VPC: {vpc}.")
    return vpc


def check_pod_identity_role(facts: MotoFacts, arn: str) -> None:
    role = facts.role(arn)
    if role is None:
        raise _invalid("Role provided in the request does not exist")
    if not role.trusts("pods.eks.amazonaws.com", "sts:AssumeRole", "sts:TagSession"):
        raise _invalid("Trust policy of the role provided is invalid")


def check_access_principal(facts: MotoFacts | None, principal: str, kind: str, account: str,
                           creator: str) -> None:
    """``principal`` and ``kind`` of a CreateAccessEntry (``creator``: the caller, who always exists)."""
    if kind not in ACCESS_ENTRY_TYPES:
        raise _invalid(f"The access entry type '{kind}' is not valid; valid types: {', '.join(ACCESS_ENTRY_TYPES)}")
    if re.match(r"arn:aws[a-z\-]*:sts::", principal):
        raise _invalid(f"The principalArn {principal} is an STS session, a temporary principal: access entries "
                       "take the IAM role or user (for an assumed-role session, arn:aws:iam::<account>:role/<role>)")
    match = _PRINCIPAL.fullmatch(principal)
    if match is None:
        raise _invalid(f"The principalArn {principal} is not a valid IAM principal ARN (an IAM role or user)")
    if (match["path"] or "").startswith("/aws-service-role/"):
        raise _invalid(f"The principalArn {principal} is a service-linked role; access entries cannot be created "
                       "for service-linked roles")
    if kind != "STANDARD" and (match["kind"] != "role" or match["account"] != account):
        raise _invalid(f"Access entries of type {kind} take an IAM role of account {account}, not {principal}")
    if match["account"] == account and match["kind"] and principal != creator and facts is not None \
            and not facts.principal_exists(principal):
        raise _invalid(f"The principalArn {principal} does not exist in IAM")
