"""What AWS checks on the requests the front forwards to moto, before moto sees them.

moto takes almost anything: a 65-character role name, a trust policy of ``{not json``, a VPC tagged as a
subnet, an ``aws:`` tag key, an AssumeRole on a role that does not exist. AWS refuses each, so the front
runs every request it forwards through :meth:`ForwardedChecks.check` first:

* the input is validated against the operation's botocore model (:mod:`.validation`: enums, patterns,
  lengths, ranges) for the JSON, REST-JSON and query protocols, answered as each service does:
  ``ValidationError`` (query: IAM, STS) or ``ValidationException`` (JSON). EC2 is not Coral-validated
  (its model carries almost no constraints) and S3 (REST-XML) answers its own errors, which moto has;
* IAM policy documents must be JSON (``MalformedPolicyDocument: This policy contains invalid Json``);
* EC2 ``TagSpecifications`` must name the resource type the operation creates, and no tag key may start
  with ``aws:`` (``InvalidParameterValue``, EC2's wording);
* STS ``AssumeRole`` needs a role that exists and whose trust policy admits the caller
  (``AccessDenied``, 403, worded as STS does; a missing role reads the same, STS does not tell them apart).

Query-protocol parameters (``TagSpecification.1.Tag.1.Key``, ``Tags.member.1.Key``) are turned back into
the operation's input structure by :func:`query_params`, following botocore's query and EC2 serializers.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from botocore.model import ListShape, MapShape, OperationModel, Shape, StructureShape

from .base import AwsError
from .facts import iam_principal
from .validation import violations

if TYPE_CHECKING:
    from .facts import MotoFacts

# the resource types an EC2 create operation tags (TagSpecifications); operations not listed are not checked
EC2_TAGGABLE: dict[str, frozenset[str]] = {
    "CreateVpc": frozenset({"vpc"}), "CreateSubnet": frozenset({"subnet"}),
    "CreateSecurityGroup": frozenset({"security-group"}), "CreateInternetGateway": frozenset({"internet-gateway"}),
    "CreateRouteTable": frozenset({"route-table"}), "CreateNatGateway": frozenset({"natgateway"}),
    "AllocateAddress": frozenset({"elastic-ip"}), "CreateVpcEndpoint": frozenset({"vpc-endpoint"}),
    "CreateKeyPair": frozenset({"key-pair"}), "CreateLaunchTemplate": frozenset({"launch-template"}),
    "CreateVolume": frozenset({"volume"}), "CreateNetworkInterface": frozenset({"network-interface"}),
    "CreatePlacementGroup": frozenset({"placement-group"}),
    "RunInstances": frozenset({"instance", "volume", "network-interface", "spot-instances-request"}),
}
# IAM members that carry a policy document (JSON)
POLICY_MEMBERS = ("AssumeRolePolicyDocument", "PolicyDocument")
VALIDATION_CODES = {"query": "ValidationError", "json": "ValidationException", "rest-json": "ValidationException"}


def _wire(name: str, shape: Shape, ec2: bool) -> str:
    if ec2:
        if "queryName" in shape.serialization:
            return str(shape.serialization["queryName"])
        wire = str(shape.serialization.get("name", name))
        return wire[:1].upper() + wire[1:]
    return str(shape.serialization.get("name", name))


class _Query:
    """The flat form fields of one query/EC2 request, read back into nested values."""

    def __init__(self, fields: dict[str, str], ec2: bool) -> None:
        self.fields = fields
        self.ec2 = ec2
        self.prefixes = {key[:i] for key in fields for i, ch in enumerate(key) if ch == "."}

    def present(self, key: str) -> bool:
        return key in self.fields or key in self.prefixes

    def value(self, shape: Shape, key: str) -> Any:
        if isinstance(shape, StructureShape):
            out: dict[str, Any] = {}
            for name, member in shape.members.items():
                child = f"{key}.{_wire(name, member, self.ec2)}" if key else _wire(name, member, self.ec2)
                if self.present(child):
                    out[name] = self.value(member, child)
            return out
        if isinstance(shape, ListShape):
            if self.fields.get(key) == "":
                return []
            item = key if self.ec2 or shape.serialization.get("flattened") else \
                f"{key}.{shape.member.serialization.get('name', 'member')}"
            items: list[Any] = []
            while self.present(f"{item}.{len(items) + 1}"):
                items.append(self.value(shape.member, f"{item}.{len(items) + 1}"))
            return items
        if isinstance(shape, MapShape):
            entry = key if shape.serialization.get("flattened") else f"{key}.entry"
            key_name = shape.key.serialization.get("name", "key")
            value_name = shape.value.serialization.get("name", "value")
            out = {}
            index = 1
            while self.present(f"{entry}.{index}"):
                out[str(self.fields.get(f"{entry}.{index}.{key_name}", ""))] = self.value(
                    shape.value, f"{entry}.{index}.{value_name}")
                index += 1
            return out
        return _scalar(shape, self.fields.get(key, ""))


def _scalar(shape: Shape, text: str) -> Any:
    try:
        if shape.type_name in ("integer", "long"):
            return int(text)
        if shape.type_name in ("float", "double"):
            return float(text)
    except ValueError:
        return text
    if shape.type_name == "boolean":
        return text.lower() == "true"
    return text


def query_params(op: OperationModel, fields: dict[str, str]) -> dict[str, Any]:
    """A query or EC2 protocol request's form fields as the operation's input (botocore member names)."""
    if op.input_shape is None:
        return {}
    reader = _Query({k: v for k, v in fields.items() if k not in ("Action", "Version")},
                    op.metadata["protocol"] == "ec2")
    return dict(reader.value(op.input_shape, ""))


class ForwardedChecks:
    """The checks of the module docstring; ``facts`` answers what exists in moto (roles, callers)."""

    def __init__(self, facts: MotoFacts, account: str) -> None:
        self.facts = facts
        self.account = account

    def check(self, op: OperationModel, params: dict[str, Any], access_key: str) -> None:
        """Raise the :class:`AwsError` AWS would answer ``params`` with, or return when AWS would take it."""
        protocol = op.metadata["protocol"]
        code = VALIDATION_CODES.get(protocol)
        if code is not None:
            errors = violations(op, params)
            if errors:
                noun = "error" if len(errors) == 1 else "errors"
                raise AwsError(code, f"{len(errors)} validation {noun} detected: " + "; ".join(errors))
        service = op.service_model.service_name
        if service == "iam":
            self._policies(params)
        elif service == "ec2":
            self._tags(op.name, params)
        elif service == "sts" and op.name == "AssumeRole":
            self._assume_role(params, access_key)

    @staticmethod
    def _policies(params: dict[str, Any]) -> None:
        for member in POLICY_MEMBERS:
            document = params.get(member)
            if not isinstance(document, str):
                continue
            try:
                parsed = json.loads(document)
            except ValueError:
                raise AwsError("MalformedPolicyDocument", "This policy contains invalid Json") from None
            if not isinstance(parsed, dict):
                raise AwsError("MalformedPolicyDocument", "This policy contains invalid Json")

    @staticmethod
    def _tags(operation: str, params: dict[str, Any]) -> None:
        allowed = EC2_TAGGABLE.get(operation)
        tag_lists = [params.get("Tags") or []] if operation == "CreateTags" else []
        for spec in params.get("TagSpecifications") or []:
            kind = spec.get("ResourceType")
            if allowed is not None and kind not in allowed:
                raise AwsError("InvalidParameterValue", f"'{kind}' is not a valid taggable resource type for this "
                                                        "operation.")
            tag_lists.append(spec.get("Tags") or [])
        for tags in tag_lists:
            for tag in tags:
                key = str(tag.get("Key", ""))
                if key.lower().startswith("aws:"):
                    raise AwsError("InvalidParameterValue", f"Value ( {key} ) for parameter key is invalid. Tag keys "
                                                            "starting with 'aws:' are reserved for internal use")

    def _assume_role(self, params: dict[str, Any], access_key: str) -> None:
        role_arn = str(params.get("RoleArn", ""))
        caller = self.facts.caller(access_key)
        role = self.facts.role(role_arn) if role_arn.startswith("arn:") else None
        if role is None or not role.admits(caller, self.account):
            shown = caller if ":assumed-role/" in caller else iam_principal(caller)
            raise AwsError("AccessDenied", f"User: {shown} is not authorized to perform: sts:AssumeRole on "
                                           f"resource: {role_arn}", 403)
