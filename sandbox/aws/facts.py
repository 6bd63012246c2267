"""Read-only facts the simulators check against moto's world: IAM roles, security groups, S3 buckets, subnets.

AWS services validate what a request names: HyperPod's CreateCluster refuses an execution role that does
not exist or does not trust ``sagemaker.amazonaws.com``, EKS refuses a security group of another VPC. The
simulators ask these questions here, through moto's own query API (the same requests ``aws`` would send),
so they see exactly the state a client created and nothing is logged (reads are never replayed).
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlencode

from .moto_backend import MotoBackend, Subnet

_IAM_VERSION = "2010-05-08"
_EC2_VERSION = "2016-11-15"
_STS_VERSION = "2011-06-15"


@dataclass(frozen=True)
class Role:
    """An IAM role as a service sees it when it is passed one: its ARN and whom its trust policy admits."""

    name: str
    arn: str
    trust: dict[str, Any]
    attached_policies: tuple[str, ...] = field(default=())

    def trusted_services(self, action: str = "sts:AssumeRole") -> set[str]:
        """Service principals an ``Allow`` statement of the trust policy admits for ``action``."""
        found: set[str] = set()
        for statement in _statements(self.trust):
            if statement.get("Effect") != "Allow" or not _covers(statement.get("Action"), action):
                continue
            principal = statement.get("Principal")
            if not isinstance(principal, dict):
                continue
            services = principal.get("Service", [])
            found.update([services] if isinstance(services, str) else list(services))
        return found

    def trusts(self, service: str, *actions: str) -> bool:
        """Whether the trust policy lets ``service`` perform every one of ``actions`` (default AssumeRole)."""
        return all(service in self.trusted_services(action) for action in (actions or ("sts:AssumeRole",)))

    def admits(self, caller: str, account: str, action: str = "sts:AssumeRole") -> bool:
        """Whether the trust policy lets the IAM principal ``caller`` (an ARN; an assumed-role session is
        named by its session ARN) perform ``action``: an ``Allow`` naming ``*``, the caller's account (its id
        or ``:root``) or the caller, and no ``Deny`` naming it. Conditions are not evaluated."""
        names = {"*", account, f"arn:aws:iam::{account}:root", caller, iam_principal(caller)}
        verdicts = {statement.get("Effect") for statement in _statements(self.trust)
                    if _covers(statement.get("Action"), action) and names & _aws_principals(statement)}
        return "Allow" in verdicts and "Deny" not in verdicts


@dataclass(frozen=True)
class SecurityGroup:
    """An EC2 security group: its VPC and its inbound rules as (protocol, from port, to port, self-ref)."""

    group_id: str
    vpc: str
    ingress: tuple[tuple[str, int, int, bool], ...]

    def allows(self, port: int, protocol: str = "tcp") -> bool:
        """Whether an inbound rule admits ``port`` (protocol ``-1`` admits all)."""
        return any(proto == "-1" or (proto == protocol and low <= port <= high)
                   for proto, low, high, _ in self.ingress)


def iam_principal(arn: str) -> str:
    """The IAM principal behind a caller ARN: an assumed-role session is its role, an STS-style user ARN
    (moto's ``arn:aws:sts::<account>:user/<name>``) is that IAM user; anything else is itself."""
    parts = arn.split(":", 5)
    if len(parts) == 6 and parts[2] == "sts":
        kind, _, rest = parts[5].partition("/")
        if kind == "assumed-role":
            return f"arn:{parts[1]}:iam::{parts[4]}:role/{rest.split('/', 1)[0]}"
        if kind == "user":
            return f"arn:{parts[1]}:iam::{parts[4]}:user/{rest}"
    return arn


def _aws_principals(statement: dict[str, Any]) -> set[str]:
    principal = statement.get("Principal")
    if principal == "*":
        return {"*"}
    listed = principal.get("AWS", []) if isinstance(principal, dict) else []
    return {listed} if isinstance(listed, str) else {str(p) for p in listed}


def _statements(policy: dict[str, Any]) -> list[dict[str, Any]]:
    statements = policy.get("Statement", [])
    return [statements] if isinstance(statements, dict) else [s for s in statements if isinstance(s, dict)]


def _covers(actions: object, action: str) -> bool:
    listed = [actions] if isinstance(actions, str) else list(actions) if isinstance(actions, list) else []
    return any(a in (action, "*", "sts:*") for a in listed)


def _strip(tag: str) -> str:
    return tag.rpartition("}")[2]


def _find(node: ET.Element, name: str) -> ET.Element | None:
    return next((child for child in node.iter() if _strip(child.tag) == name), None)


def _text(node: ET.Element | None, name: str) -> str:
    found = _find(node, name) if node is not None else None
    return (found.text or "") if found is not None else ""


class MotoFacts:
    """Answers the simulators' questions about moto's state (every answer is a fresh read)."""

    def __init__(self, moto: MotoBackend, region: str) -> None:
        self._moto = moto
        self._region = region

    def _query(self, service: str, params: dict[str, str],
               access_key: str = "sandbox") -> tuple[int, ET.Element | None]:
        scope_region = "us-east-1" if service == "iam" else self._region
        headers = {"Content-Type": "application/x-www-form-urlencoded; charset=utf-8",
                   "Authorization": f"AWS4-HMAC-SHA256 Credential={access_key}/20260101/{scope_region}/{service}"
                                    "/aws4_request, SignedHeaders=host, Signature=sandbox"}
        forwarded = self._moto.forward("POST", "/", headers, urlencode(params).encode())
        try:
            status, text = forwarded.status, forwarded.read().decode()
        finally:
            forwarded.close()
        try:
            return status, ET.fromstring(text) if text.strip() else None
        except ET.ParseError:
            return status, None

    def role(self, name_or_arn: str) -> Role | None:
        """The IAM role named (by name, or by its exact ARN, path included), or ``None`` if moto has none: an
        ARN of another account or with the wrong path names no role, as in IAM."""
        name = name_or_arn.rpartition("/")[2] if name_or_arn.startswith("arn:") else name_or_arn
        if not name:
            return None
        status, root = self._query("iam", {"Action": "GetRole", "Version": _IAM_VERSION, "RoleName": name})
        if status != 200 or root is None:
            return None
        document = unquote(_text(root, "AssumeRolePolicyDocument"))
        try:
            trust = json.loads(document) if document else {}
        except ValueError:
            trust = {}
        status, attached = self._query("iam", {"Action": "ListAttachedRolePolicies", "Version": _IAM_VERSION,
                                               "RoleName": name})
        arns = tuple(el.text or "" for el in (attached.iter() if attached is not None and status == 200 else ())
                     if _strip(el.tag) == "PolicyArn")
        role = Role(name=name, arn=_text(root, "Arn"), trust=trust if isinstance(trust, dict) else {},
                    attached_policies=arns)
        return role if not name_or_arn.startswith("arn:") or role.arn == name_or_arn else None

    def caller(self, access_key: str) -> str:
        """Whom an access key signs as (STS ``GetCallerIdentity``, as moto answers it), e.g.
        ``arn:aws:sts::123456789012:user/moto`` for the sandbox's own credentials."""
        _, root = self._query("sts", {"Action": "GetCallerIdentity", "Version": _STS_VERSION}, access_key)
        return _text(root, "Arn")

    def own_principal(self) -> str:
        """The IAM principal the sandbox's own credentials sign as (moto's ``user/moto``, which moto's IAM
        itself does not list)."""
        return iam_principal(self.caller("sandbox"))

    def principal_exists(self, arn: str) -> bool:
        """Whether ``arn`` names an IAM user or role that exists (path included) in moto's IAM."""
        match = re.fullmatch(r"arn:aws:iam::(\d{12}):(user|role)(/(?:[^/]+/)*)?([\w+=,.@-]+)", arn)
        if match is None:
            return False
        if match.group(2) == "role":
            return self.role(arn) is not None
        status, root = self._query("iam", {"Action": "GetUser", "Version": _IAM_VERSION, "UserName": match.group(4)})
        return status == 200 and _text(root, "Arn") == arn

    def security_group(self, group_id: str) -> SecurityGroup | None:
        """The EC2 security group with this id, or ``None``."""
        if not re.fullmatch(r"sg-[0-9a-f]+", group_id):
            return None
        return self._security_group({"GroupId.1": group_id})

    def default_security_group(self, vpc: str) -> SecurityGroup | None:
        """The VPC's ``default`` security group (what FSx and EC2 use when a request names none)."""
        return self._security_group({"Filter.1.Name": "vpc-id", "Filter.1.Value.1": vpc,
                                     "Filter.2.Name": "group-name", "Filter.2.Value.1": "default"})

    def _security_group(self, select: dict[str, str]) -> SecurityGroup | None:
        status, root = self._query("ec2", {"Action": "DescribeSecurityGroups", "Version": _EC2_VERSION, **select})
        info = _find(root, "securityGroupInfo") if status == 200 and root is not None else None
        item = next((child for child in info if _strip(child.tag) == "item"), None) if info is not None else None
        if item is None:
            return None
        group_id = next((c.text or "" for c in item if _strip(c.tag) == "groupId"), "")
        ingress: list[tuple[str, int, int, bool]] = []
        permissions = next((c for c in item if _strip(c.tag) == "ipPermissions"), None)
        for rule in permissions if permissions is not None else ():
            proto = _text(rule, "ipProtocol") or "-1"
            low, high = _text(rule, "fromPort"), _text(rule, "toPort")
            self_ref = any(_text(pair, "groupId") == group_id for pair in rule.iter() if _strip(pair.tag) == "item")
            ingress.append((proto, int(low) if low.lstrip("-").isdigit() else -1,
                            int(high) if high.lstrip("-").isdigit() else 65535, self_ref))
        vpc = next((c.text or "" for c in item if _strip(c.tag) == "vpcId"), "")
        if not ingress and next((c.text for c in item if _strip(c.tag) == "groupName"), "") == "default":
            # moto's default groups have no rules; AWS's admit all inbound traffic from the group itself
            ingress.append(("-1", -1, 65535, True))
        return SecurityGroup(group_id=group_id, vpc=vpc, ingress=tuple(ingress))

    def bucket_exists(self, bucket: str) -> bool:
        """Whether moto has an S3 bucket of this name."""
        if not re.fullmatch(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]", bucket):
            return False
        headers = {"Authorization": f"AWS4-HMAC-SHA256 Credential=sandbox/20260101/{self._region}/s3"
                                    "/aws4_request, SignedHeaders=host, Signature=sandbox"}
        forwarded = self._moto.forward("HEAD", f"/{bucket}", headers, b"")
        try:
            forwarded.read()
            return forwarded.status == 200
        finally:
            forwarded.close()

    def subnet(self, subnet_id: str) -> Subnet | None:
        """The EC2 subnet's VPC, CIDR and zone, or ``None``."""
        return self._moto.subnet(subnet_id, self._region)
