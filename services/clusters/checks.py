"""Prechecks of the clusters noun: facts read from AWS, judged before any operation row exists (the AWS
clients raise the error taxonomy themselves, services/aws.py).

A refusal names what is wrong and what would be right (the clusters that do exist, the command that adds
a missing access entry), so a user or an agent can act on it without another round trip.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from services.aws import AwsClients
from services.errors import Conflict, Invalid, NotFound

ADMIN_POLICY = "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"
_ASSUMED = re.compile(r"^arn:(?P<p>aws[\w-]*):sts::(?P<a>\d{12}):assumed-role/(?P<role>[^/]+)/[^/]+$")
_STS_USER = re.compile(r"^arn:(?P<p>aws[\w-]*):sts::(?P<a>\d{12}):user/(?P<user>.+)$")


@dataclass(frozen=True)
class ImportFacts:
    name: str
    region: str
    eks_name: str
    eks_arn: str
    hyperpod_name: str | None
    hyperpod_arn: str | None
    principal_arn: str


def access_entry_principal(caller_arn: str) -> str:
    """The IAM principal an access entry names for this caller: access entries cannot name STS sessions,
    so an assumed-role session maps to its role (a role with a path must be named with its path by hand)."""
    assumed = _ASSUMED.match(caller_arn)
    if assumed:
        return f"arn:{assumed['p']}:iam::{assumed['a']}:role/{assumed['role']}"
    user = _STS_USER.match(caller_arn)
    if user:
        return f"arn:{user['p']}:iam::{user['a']}:user/{user['user']}"
    return caller_arn


def check_import(aws: AwsClients, *, name: str, region: str, eks_name: str, hyperpod_name: str | None,
                 registered_arn: str | None, registered_as: Callable[[str], str | None]) -> ImportFacts:
    """``registered_as(eks arn)``: the name that EKS cluster is registered under here, if any."""
    eks = aws.client("eks", region)
    try:
        cluster = eks.describe_cluster(name=eks_name)["cluster"]
    except NotFound:
        names = eks.all_pages("list_clusters", "clusters")
        raise Invalid(f"no EKS cluster named {eks_name!r} in {region}; clusters there: "
                      f"{', '.join(names) or 'none'}", details={"eks_clusters": names}) from None
    if registered_arn is not None and registered_arn != cluster["arn"]:
        raise Conflict(f"the name {name!r} is registered for {registered_arn} already; choose another name")
    known_as = registered_as(cluster["arn"])
    if known_as is not None and known_as != name:
        raise Conflict(f"EKS cluster {eks_name} is registered here already as {known_as!r}: use that name (or "
                       "forget it first)", details={"registered_as": known_as})
    if cluster["status"] != "ACTIVE":
        raise Conflict(f"EKS cluster {eks_name} is {cluster['status']}; import it once it is ACTIVE")
    hyperpod_arn = None
    if hyperpod_name:
        sagemaker = aws.client("sagemaker", region)
        try:
            described = sagemaker.describe_cluster(ClusterName=hyperpod_name)
        except NotFound:
            names = [c["ClusterName"] for c in sagemaker.all_pages("list_clusters", "ClusterSummaries")]
            raise Invalid(f"no HyperPod cluster named {hyperpod_name!r} in {region}; clusters there: "
                          f"{', '.join(names) or 'none'}", details={"hyperpod_clusters": names}) from None
        orchestrator = ((described.get("Orchestrator") or {}).get("Eks") or {}).get("ClusterArn")
        if orchestrator != cluster["arn"]:
            raise Invalid(f"HyperPod cluster {hyperpod_name} is orchestrated by {orchestrator or 'Slurm'}, "
                          f"not by EKS cluster {eks_name}")
        hyperpod_arn = described["ClusterArn"]
    caller = aws.client("sts", region).get_caller_identity()["Arn"]
    principal = access_entry_principal(caller)
    mode = (cluster.get("accessConfig") or {}).get("authenticationMode", "CONFIG_MAP")
    if mode == "CONFIG_MAP":
        raise Invalid(f"EKS cluster {eks_name} authenticates through the aws-auth ConfigMap only: switch it to "
                      f"API_AND_CONFIG_MAP (aws eks update-cluster-config --name {eks_name} --access-config "
                      "authenticationMode=API_AND_CONFIG_MAP) so access entries can grant this control plane access")
    entries: list[str] = eks.all_pages("list_access_entries", "accessEntries", clusterName=eks_name)
    if principal not in entries:
        raise Invalid(
            f"{principal} (this control plane's identity) has no access entry on EKS cluster {eks_name}: add one "
            f"with 'aws eks create-access-entry --cluster-name {eks_name} --principal-arn {principal}' and "
            f"'aws eks associate-access-policy --cluster-name {eks_name} --principal-arn {principal} --policy-arn "
            f"{ADMIN_POLICY} --access-scope type=cluster'",
            details={"missing_access_entry": principal, "eks_cluster": eks_name})
    return ImportFacts(name, region, eks_name, cluster["arn"], hyperpod_name, hyperpod_arn, principal)
