"""Every operation a sandbox simulator owns, called through a real boto3 client and the AWS front.

Two things are proved for *every* owned operation, and the lists of operations are computed, so that a new
operation cannot slip in untested:

* **Invalid input gets AWS's error before the simulator acts.** From the botocore input shape we build the
  minimal request that botocore accepts client-side (required members with plausible values that also
  satisfy every server-side constraint), then break exactly one constraint that botocore does *not* check
  client-side (it checks types, required members and minimums only): a value outside an ``enum``, a string
  that misses its ``pattern``, a string or list over its ``max`` length, a number over its ``max``. One test
  per operation and kind of constraint (the shallowest such member of the input) asserts
  ``ValidationException`` (HTTP 400) naming that member in AWS's wording, that the simulator's ``handle``
  never ran and that no simulator's state changed. None of the four services models a validation error
  shape (see ``error_shapes`` in their botocore models): constraint violations are the framework-level
  ``ValidationException`` that AWS's Coral-based JSON and REST-JSON services answer; FSx's ``BadRequest``
  and EKS's ``InvalidParameterException`` are for semantic checks, which the other test files cover.
  Operations whose input has no such constraint anywhere are listed in :data:`NO_SERVER_SIDE_CONSTRAINT`
  with the reason, and the list must equal the computed set.
* **A botocore-valid request succeeds.** :data:`VALID_CALLS` holds one realistic call per operation (with
  its preconditions, e.g. an ACTIVE EKS cluster or an InService HyperPod cluster, prepared once in the
  :func:`env` fixture on the shared manual clock). Each test records what the front's simulators handled
  and asserts that its operation was handled by the simulator (not forwarded to moto) with a 2xx; the set
  of operations in :data:`VALID_CALLS` must equal every operation the world's simulators own.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import boto3
import botocore.session
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from botocore.model import ListShape, MapShape, OperationModel, Shape, StringShape, StructureShape

from sandbox.aws import AwsWorld
from sandbox.aws.base import Call
from sandbox.aws.eks import ADDON_SECONDS, CLUSTER_CREATE_SECONDS, UPDATE_SECONDS, EksSimulator
from sandbox.aws.fsx import CREATE_SECONDS, FsxSimulator
from sandbox.aws.hyperpod import HyperPodSimulator
from sandbox.aws.iam_policy import IamPolicySimulator
from sandbox.aws.mlflow import CREATE_SECONDS as MLFLOW_CREATE_SECONDS
from sandbox.aws.mlflow import STOP_SECONDS, MlflowTrackingServers
from sandbox.aws.quotas import QuotasSimulator, quota_code, quota_name
from sandbox.aws.validation import java_regex
from tests.sandbox_aws.conftest import (
    CREATOR,
    NO_RETRIES,
    POD_ROLE,
    ROLE,
    ensure_role,
    error_code,
    standard_roles,
    subnets,
)

SIMULATORS: tuple[tuple[str, frozenset[str]], ...] = tuple(
    (cls.service, cls.operations) for cls in (HyperPodSimulator, EksSimulator, QuotasSimulator, FsxSimulator,
                                              IamPolicySimulator, MlflowTrackingServers))
OWNED: tuple[tuple[str, str], ...] = tuple(sorted((service, op) for service, ops in SIMULATORS for op in ops))
CLIENT_CONFIG = NO_RETRIES.merge(Config(parameter_validation=True))
_models = botocore.session.get_session()


def operation_model(service: str, operation: str) -> OperationModel:
    return _models.get_service_model(service).operation_model(operation)


# --- requests built from the botocore model -------------------------------------------------------------------

# Plausible values, tried in order; the first that satisfies a string's enum/length/pattern is used.
PLAUSIBLE = (
    "example", "example-1", "arn:aws:iam::123456789012:role/example",
    "arn:aws:sagemaker:us-west-2:123456789012:cluster/abcdef012345",
    "arn:aws:sagemaker:us-west-2:123456789012:training-plan/example",
    "arn:aws:eks:us-west-2:123456789012:cluster/example", "ml.m5.xlarge", "subnet-0123456789abcdef0",
    "sg-0123456789abcdef0", "fs-0123456789abcdef0", "i-0123456789abcdef0", "vpc-0123456789abcdef0",
    "s3://example-bucket/prefix/", "0123abcd-4567-89ab-cdef-0123456789ab", "L-0123ABCD", "1.32", "us-west-2a",
    "usw2-az1", "10.0.0.0/16", "ami-0123456789abcdef0", "d-0123456789", "2.15", "a", "1", "A1",
)
# Strings that miss a pattern (tried in order, the first that keeps within the length limits is used).
MISMATCHES = ("bad value!", "!", "#", "bad\u0007value", "-")
NOT_IN_ENUM = ("NotAnEnumValue", "x")
UNSAFE_LOCATIONS = ("uri", "querystring", "header", "headers")  # keep these short
TIME = datetime(2026, 1, 2, tzinfo=UTC)


KINDS = ("enum", "pattern", "length", "size", "range")


class NoPlausibleValue(Exception):
    pass


def string_ok(shape: Shape, value: str) -> bool:
    meta = shape.metadata
    if isinstance(shape, StringShape) and shape.enum and value not in shape.enum:
        return False
    if not meta.get("min", 0) <= len(value) <= meta.get("max", len(value)):
        return False
    pattern = meta.get("pattern")
    return not pattern or java_regex(pattern).fullmatch(value) is not None


def minimal(shape: Shape) -> Any:
    """The smallest value of ``shape`` that botocore and the server's constraints both accept."""
    kind = shape.type_name
    meta = shape.metadata
    if isinstance(shape, StructureShape):
        if meta.get("document"):
            return {}
        if meta.get("union"):
            first = next(iter(shape.members))
            return {first: minimal(shape.members[first])}
        return {name: minimal(shape.members[name]) for name in shape.required_members}
    if isinstance(shape, ListShape):
        return [minimal(shape.member) for _ in range(meta.get("min", 0))]
    if isinstance(shape, MapShape):
        return dict(zip(map_keys(shape, meta.get("min", 0)), itertools.repeat(minimal(shape.value)), strict=False))
    if kind == "string":
        candidates = list(shape.enum) if isinstance(shape, StringShape) and shape.enum else list(PLAUSIBLE)
        candidates.append("a" * meta.get("min", 1))
        for value in candidates:
            if string_ok(shape, value):
                return value
        raise NoPlausibleValue(f"{shape.name}: {meta}")
    if kind in ("integer", "long"):
        return min(max(meta.get("min", 1), 1), meta.get("max", 1))
    if kind in ("float", "double"):
        return float(min(max(meta.get("min", 1), 1), meta.get("max", 1)))
    if kind == "boolean":
        return True
    if kind == "timestamp":
        return TIME
    if kind == "blob":
        return b"x" * max(meta.get("min", 1), 1)
    raise NoPlausibleValue(f"{shape.name}: type {kind}")


def map_keys(shape: MapShape, count: int) -> list[str]:
    keys = [k for k in (f"key{i}" for i in range(count * 4 + 8)) if string_ok(shape.key, k)][:count]
    if len(keys) < count:
        raise NoPlausibleValue(f"{shape.name}: {count} keys")
    return keys


@dataclass(frozen=True)
class Site:
    """One server-side-only constraint somewhere in an operation's input and a value that breaks only it."""

    kind: str  # enum | pattern | length | size | range
    steps: tuple[str | int, ...]  # member names, 0 for a list's first item, a key for a map's value
    wire: str  # the member path as AWS writes it in the error message
    value: Any
    constraint: str  # the start of AWS's constraint text
    # False inside a map: AWS reports a map's keys and values at the map's path ("Map value must satisfy
    # constraint: [...]"), so only the map's path and the constraint text are asserted there.
    exact: bool = True

    def request(self, operation: OperationModel) -> dict[str, Any]:
        assert operation.input_shape is not None
        built = _fill(operation.input_shape, self.steps, self.value)
        assert isinstance(built, dict)
        return built


def _fill(shape: Shape, steps: tuple[str | int, ...], leaf: Any) -> Any:
    if not steps:
        return leaf
    step, rest = steps[0], steps[1:]
    if isinstance(shape, StructureShape):
        assert isinstance(step, str)
        base: dict[str, Any] = {} if shape.metadata.get("union") else minimal(shape)
        return {**base, step: _fill(shape.members[step], rest, leaf)}
    if isinstance(shape, ListShape):
        return [_fill(shape.member, rest, leaf)] + [minimal(shape.member)] * (shape.metadata.get("min", 1) - 1)
    assert isinstance(shape, MapShape) and isinstance(step, str)
    others = map_keys(shape, shape.metadata.get("min", 1))[1:]
    return {step: _fill(shape.value, rest, leaf), **{k: minimal(shape.value) for k in others}}


def _wire(member: str, shape: Shape) -> str:
    name = str(shape.serialization.get("name", member))
    return name[:1].lower() + name[1:]


def _scalar_sites(shape: Shape, steps: tuple[str | int, ...], wire: str, short: bool,
                  exact: bool = True) -> Iterator[Site]:
    for site in _scalar_sites_of(shape, steps, wire, short):
        yield site if exact else Site(site.kind, site.steps, site.wire, site.value, site.constraint, exact=False)


def _scalar_sites_of(shape: Shape, steps: tuple[str | int, ...], wire: str, short: bool) -> Iterator[Site]:
    meta = shape.metadata
    if isinstance(shape, StringShape):
        if shape.enum:
            bogus = next((v for v in NOT_IN_ENUM if v not in shape.enum), None)
            if bogus is not None:
                yield Site("enum", steps, wire, bogus, "Member must satisfy enum value set: [")
            return
        pattern = meta.get("pattern")
        if pattern:
            bad = next((v for v in MISMATCHES if meta.get("min", 0) <= len(v) <= meta.get("max", len(v))
                        and not java_regex(pattern).fullmatch(v)), None)
            if bad is not None:
                yield Site("pattern", steps, wire, bad, "Member must satisfy regular expression pattern: ")
        limit = meta.get("max")
        if limit is not None and not (short and limit > 2000):
            try:
                base = minimal(shape)
            except NoPlausibleValue:
                base = ""
            for long in (base + "a" * (limit + 1 - len(base)), "a" * (limit + 1), "1" * (limit + 1)):
                if not pattern or java_regex(pattern).fullmatch(long):
                    yield Site("length", steps, wire, long, f"Member must have length less than or equal to {limit}")
                    break
    elif shape.type_name in ("integer", "long", "float", "double") and "max" in meta:
        over = meta["max"] + 1
        yield Site("range", steps, wire, float(over) if shape.type_name in ("float", "double") else over,
                   f"Member must have value less than or equal to {meta['max']}")


def sites(shape: Shape, steps: tuple[str | int, ...] = (), wire: str = "", short: bool = False,
          seen: tuple[str, ...] = ()) -> Iterator[Site]:
    """Every breakable constraint under ``shape``, shallowest first."""
    if shape.name in seen or len(steps) > 12:
        return
    seen = (*seen, shape.name)
    meta = shape.metadata
    if isinstance(shape, StructureShape):
        if meta.get("document"):
            return
        children: list[tuple[str, Shape, str, bool]] = []
        for name, member in shape.members.items():
            child_short = short or (not steps and member.serialization.get("location") in UNSAFE_LOCATIONS)
            child_wire = f"{wire}.{_wire(name, member)}" if wire else _wire(name, member)
            yield from _scalar_sites(member, (*steps, name), child_wire, child_short)
            if isinstance(member, ListShape | MapShape) and "max" in member.metadata and \
                    not (child_short and member.metadata["max"] > 20):
                over = member.metadata["max"] + 1
                try:
                    item = minimal(member.member) if isinstance(member, ListShape) else minimal(member.value)
                    value: Any = [item] * over if isinstance(member, ListShape) else \
                        dict.fromkeys(map_keys(member, over), item)
                except NoPlausibleValue:
                    pass
                else:
                    yield Site("size", (*steps, name), child_wire, value,
                               f"Member must have length less than or equal to {member.metadata['max']}")
            children.append((name, member, child_wire, child_short))
        for name, member, child_wire, child_short in children:
            if isinstance(member, StructureShape | ListShape | MapShape):
                yield from sites(member, (*steps, name), child_wire, child_short, seen)
    elif isinstance(shape, ListShape):
        item_wire = f"{wire}.1.member"
        yield from _scalar_sites(shape.member, (*steps, 0), item_wire, short)
        if isinstance(shape.member, StructureShape | ListShape | MapShape):
            yield from sites(shape.member, (*steps, 0), item_wire, short, seen)
    elif isinstance(shape, MapShape):
        try:
            key = map_keys(shape, 1)[0]
        except NoPlausibleValue:
            return
        yield from _scalar_sites(shape.value, (*steps, key), wire, short, exact=False)


def first_sites(service: str, operation: str) -> dict[str, Site]:
    """The shallowest breakable constraint of each kind in the operation's input."""
    model = operation_model(service, operation)
    found: dict[str, Site] = {}
    if model.input_shape is not None:
        for site in sites(model.input_shape):
            if site.kind in found:
                continue
            try:
                site.request(model)
            except NoPlausibleValue:  # a member on the way that no plausible value satisfies: try the next one
                continue
            found[site.kind] = site
            if len(found) == len(KINDS):
                break
    return found


# The query protocol (IAM) cannot carry the empty lists this harness fills required lists with (`Names=` reads
# as absent), so its invalid requests would name two violations; test_strict_iam.py covers the IAM simulator.
INVALID_CASES = [(service, op, kind) for service, op in OWNED if service != "iam" for kind in first_sites(service, op)]

_PLAIN = "every input member is a plain String (no enum, pattern or maximum) in the botocore model"
NO_SERVER_SIDE_CONSTRAINT: dict[tuple[str, str], str] = {
    ("eks", "DeleteAccessEntry"): _PLAIN,
    ("eks", "DeleteCluster"): _PLAIN,
    ("eks", "DeleteNodegroup"): _PLAIN,
    ("eks", "DeletePodIdentityAssociation"): _PLAIN,
    ("eks", "DescribeAccessEntry"): _PLAIN,
    ("eks", "DescribeAddonConfiguration"): _PLAIN,
    ("eks", "DescribeCluster"): _PLAIN,
    ("eks", "DescribeNodegroup"): _PLAIN,
    ("eks", "DescribePodIdentityAssociation"): _PLAIN,
    ("eks", "DescribeUpdate"): _PLAIN,
    ("eks", "DisassociateAccessPolicy"): _PLAIN,
    ("eks", "ListTagsForResource"): _PLAIN,
    ("eks", "UpdateAccessEntry"): _PLAIN + " or list of them; clientRequestToken has no constraint either",
}


# --- world helpers ----------------------------------------------------------------------------------------------


def client(world: AwsWorld, service: str) -> Any:
    return boto3.client(service, endpoint_url=world.endpoint_url, region_name="us-west-2",  # type: ignore[call-overload]
                        aws_access_key_id="testing", aws_secret_access_key="testing", config=CLIENT_CONFIG)


def simulator_states(world: AwsWorld) -> dict[str, str]:
    states: dict[str, str] = {}
    for sim in world.front.simulators:
        to_state = getattr(sim, "to_state", None)
        states[sim.service] = json.dumps(to_state(), sort_keys=True, default=str) if to_state else ""
    return states


@pytest.fixture(scope="module")
def clients(shared_world: AwsWorld) -> dict[str, Any]:
    return {service: client(shared_world, service)
            for service in ("sagemaker", "eks", "service-quotas", "fsx", "ec2", "iam")}


def test_the_world_simulates_exactly_these_operations(world: AwsWorld) -> None:
    assert sorted((sim.service, op) for sim in world.front.simulators for op in sim.operations) == list(OWNED)


def test_operations_without_a_server_side_constraint_are_listed() -> None:
    computed = {(service, op) for service, op in OWNED if not first_sites(service, op)}
    assert computed == set(NO_SERVER_SIDE_CONSTRAINT)


@pytest.mark.parametrize(("service", "operation", "kind"), INVALID_CASES,
                         ids=[f"{s}.{o}-{k}" for s, o, k in INVALID_CASES])
def test_server_side_constraint_is_enforced(world: AwsWorld, clients: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
                                            service: str, operation: str, kind: str) -> None:
    model = operation_model(service, operation)
    site = first_sites(service, operation)[kind]
    params = site.request(model)
    handled: list[Call] = []
    sim = next(s for s in world.front.simulators if s.service == service)
    real_handle = sim.handle

    def spy(call: Call) -> dict[str, Any]:
        handled.append(call)
        return real_handle(call)

    monkeypatch.setattr(sim, "handle", spy)
    before = simulator_states(world)
    method = getattr(clients[service], botocore.xform_name(operation))
    with pytest.raises(ClientError) as info:
        method(**params)
    response = info.value.response
    assert error_code(info.value) == "ValidationException", response["Error"]
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 400
    message = response["Error"]["Message"]
    assert message.startswith("1 validation error detected: "), message
    if site.exact:
        assert f"at '{site.wire}' failed to satisfy constraint: {site.constraint}" in message, message
    else:
        assert f"at '{site.wire}" in message and site.constraint in message, message
    assert handled == []
    assert simulator_states(world) == before


# --- a botocore-valid request for every operation -----------------------------------------------------------

_ids = itertools.count()
POLICY = "arn:aws:eks::aws:cluster-access-policy/"
LCC = {"SourceS3Uri": "s3://sagemaker-lifecycle/scripts/", "OnCreate": "on_create.sh"}
HP_EXEC = "every-hp-exec"  # the HyperPod execution role (trusts sagemaker.amazonaws.com)


def fresh(prefix: str) -> str:
    return f"every-{prefix}-{next(_ids)}"


def role(name: str) -> str:
    return f"arn:aws:iam::123456789012:role/{name}"


@dataclass
class Env:
    """Resources every valid-request test may rely on, each used by one test only where a test changes it."""

    world: AwsWorld
    clients: dict[str, Any]
    subnets: list[str]
    eks: str  # ACTIVE, API authentication: node groups, add-ons, access entries, pod identity, tags, HyperPod
    eks_arn: str
    eks_doomed: str  # ACTIVE, for DeleteCluster
    eks_config: str  # ACTIVE after an access-config update (update_id), for UpdateClusterConfig/DescribeUpdate
    update_id: str
    hp: str  # InService, EKS-orchestrated, Continuous provisioning: groups "workers" (4 nodes) and "system"
    nodes: list[str]  # the workers: [0] read and health-checked, [1] rebooted, [2] replaced, [3] deleted
    plan: str  # a Scheduled training plan
    fsx: str  # AVAILABLE
    fsx_doomed: str  # AVAILABLE, for DeleteFileSystem
    principal: str  # an access entry, described, updated, given a policy
    principal_doomed: str  # an access entry to delete
    principal_policy: str  # an access entry with AmazonEKSEditPolicy, to disassociate
    association: str  # a pod identity association to describe and list
    association_doomed: str  # one to delete
    security_group: str = ""  # of the subnets' VPC, for HyperPod clusters

    def __getitem__(self, service: str) -> Any:
        return self.clients[service]


@pytest.fixture(scope="module")
def env(shared_world: AwsWorld, clients: dict[str, Any]) -> Env:
    world = shared_world
    standard_roles(world)
    eks, sm, fsx = clients["eks"], clients["sagemaker"], clients["fsx"]
    nets = subnets(clients["ec2"])
    # What HyperPod's CreateCluster checks exists: a security group of the subnets' VPC, the execution role
    # trusting sagemaker.amazonaws.com, the lifecycle-script bucket.
    vpc_id = clients["ec2"].describe_subnets(SubnetIds=nets)["Subnets"][0]["VpcId"]
    sg = clients["ec2"].create_security_group(GroupName=fresh("nodes"), Description="HyperPod nodes",
                                              VpcId=vpc_id)["GroupId"]
    client(world, "iam").create_role(RoleName=HP_EXEC, AssumeRolePolicyDocument=json.dumps({"Statement": [
        {"Effect": "Allow", "Principal": {"Service": "sagemaker.amazonaws.com"}, "Action": "sts:AssumeRole"}]}))
    client(world, "s3").create_bucket(Bucket="sagemaker-lifecycle",
                                      CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    names = {key: fresh(key) for key in ("eks", "eksdel", "ekscfg", "hp", "plan")}
    vpc = {"subnetIds": nets}
    eks_arn = eks.create_cluster(name=names["eks"], version="1.32", roleArn=ROLE, resourcesVpcConfig=vpc,
                                 accessConfig={"authenticationMode": "API"})["cluster"]["arn"]
    eks.create_cluster(name=names["eksdel"], version="1.32", roleArn=ROLE, resourcesVpcConfig=vpc)
    eks.create_cluster(name=names["ekscfg"], version="1.32", roleArn=ROLE, resourcesVpcConfig=vpc,
                       accessConfig={"authenticationMode": "CONFIG_MAP"})
    world.advance(CLUSTER_CREATE_SECONDS)

    name = names["eks"]
    for group in ("ng-keep", "ng-doomed", "ng-scaled"):
        eks.create_nodegroup(clusterName=name, nodegroupName=group, subnets=nets, nodeRole=role("eks-node"),
                             scalingConfig={"minSize": 1, "maxSize": 2, "desiredSize": 1})
    for addon in ("kube-proxy", "coredns", "eks-pod-identity-agent"):
        eks.create_addon(clusterName=name, addonName=addon)
    principals = [ensure_role(world, fresh("entry"), "ec2.amazonaws.com") for _ in range(3)]
    for principal in principals:
        eks.create_access_entry(clusterName=name, principalArn=principal)
    eks.associate_access_policy(clusterName=name, principalArn=principals[2], policyArn=POLICY + "AmazonEKSEditPolicy",
                                accessScope={"type": "cluster"})
    associations = [eks.create_pod_identity_association(
        clusterName=name, namespace="training", serviceAccount=account, roleArn=POD_ROLE)["association"][
        "associationId"] for account in ("reader", "doomed")]
    eks.tag_resource(resourceArn=eks_arn, tags={"keep": "yes", "drop": "yes"})
    update_id = eks.update_cluster_config(name=names["ekscfg"], accessConfig={
        "authenticationMode": "API_AND_CONFIG_MAP"})["update"]["id"]

    sm.create_cluster(ClusterName=names["hp"], Orchestrator={"Eks": {"ClusterArn": eks_arn}},
                      VpcConfig={"SecurityGroupIds": [sg], "Subnets": nets},
                      NodeProvisioningMode="Continuous", InstanceGroups=[
                          {"InstanceGroupName": "workers", "InstanceType": "ml.m5.xlarge", "InstanceCount": 4,
                           "ExecutionRole": role(HP_EXEC), "LifeCycleConfig": LCC},
                          {"InstanceGroupName": "system", "InstanceType": "ml.t3.medium", "InstanceCount": 1,
                           "ExecutionRole": role(HP_EXEC), "LifeCycleConfig": LCC}])
    offering = sm.search_training_plan_offerings(InstanceType="ml.p5.48xlarge", InstanceCount=1, DurationHours=24,
                                                 TargetResources=["hyperpod-cluster"])["TrainingPlanOfferings"][0]
    sm.create_training_plan(TrainingPlanName=names["plan"], TrainingPlanOfferingId=offering["TrainingPlanOfferingId"])
    file_systems = [fsx.create_file_system(FileSystemType="LUSTRE", StorageCapacity=1200, SubnetIds=nets[:1],
                                           LustreConfiguration={"DeploymentType": "SCRATCH_2"})["FileSystem"][
                        "FileSystemId"] for _ in range(2)]
    for _ in range(60):  # 30 minutes in the steps the product's pollers would see
        world.advance(30)
    assert max(UPDATE_SECONDS, ADDON_SECONDS, CREATE_SECONDS) < 1800

    assert sm.describe_cluster(ClusterName=names["hp"])["ClusterStatus"] == "InService"
    workers = [n["InstanceId"] for n in sm.list_cluster_nodes(ClusterName=names["hp"], SortBy="NAME")[
        "ClusterNodeSummaries"] if n["InstanceGroupName"] == "workers"]
    assert len(workers) == 4
    return Env(world, clients, nets, name, eks_arn, names["eksdel"], names["ekscfg"], update_id, names["hp"],
               workers, names["plan"], file_systems[0], file_systems[1], principals[0], principals[1], principals[2],
               associations[0], associations[1], security_group=sg)


VALID_CALLS: dict[tuple[str, str], Callable[[Env], None]] = {}


def valid(service: str, operation: str) -> Callable[[Callable[[Env], None]], Callable[[Env], None]]:
    def register(scenario: Callable[[Env], None]) -> Callable[[Env], None]:
        assert (service, operation) not in VALID_CALLS
        VALID_CALLS[(service, operation)] = scenario
        return scenario
    return register


def hp_group(name: str, instance_type: str = "ml.t3.medium", count: int = 1) -> dict[str, Any]:
    return {"InstanceGroupName": name, "InstanceType": instance_type, "InstanceCount": count,
            "ExecutionRole": role(HP_EXEC), "LifeCycleConfig": LCC}


def new_hp_cluster(e: Env) -> str:
    name = fresh("hp")
    e["sagemaker"].create_cluster(ClusterName=name, Orchestrator={"Eks": {"ClusterArn": e.eks_arn}},
                                  VpcConfig={"SecurityGroupIds": [e.security_group], "Subnets": e.subnets},
                                  InstanceGroups=[hp_group("workers")])
    return name


# SageMaker HyperPod ---------------------------------------------------------------------------------------------


@valid("sagemaker", "CreateCluster")
def _create_hp_cluster(e: Env) -> None:
    name = new_hp_cluster(e)
    described = e["sagemaker"].describe_cluster(ClusterName=name)
    assert described["ClusterStatus"] == "Creating" and described["Orchestrator"]["Eks"]["ClusterArn"] == e.eks_arn


@valid("sagemaker", "DescribeCluster")
def _describe_hp_cluster(e: Env) -> None:
    described = e["sagemaker"].describe_cluster(ClusterName=e.hp)
    assert described["ClusterStatus"] == "InService" and described["NodeProvisioningMode"] == "Continuous"
    assert {g["InstanceGroupName"] for g in described["InstanceGroups"]} == {"workers", "system"}


@valid("sagemaker", "ListClusters")
def _list_hp_clusters(e: Env) -> None:
    summaries = e["sagemaker"].list_clusters(NameContains=e.hp, MaxResults=100)["ClusterSummaries"]
    assert [s["ClusterName"] for s in summaries] == [e.hp]


@valid("sagemaker", "UpdateCluster")
def _update_hp_cluster(e: Env) -> None:
    sm = e["sagemaker"]
    sm.update_cluster(ClusterName=e.hp, NodeRecovery="None")
    assert sm.describe_cluster(ClusterName=e.hp)["NodeRecovery"] == "None"
    sm.update_cluster(ClusterName=e.hp, NodeRecovery="Automatic")
    assert sm.describe_cluster(ClusterName=e.hp)["ClusterStatus"] == "InService"


@valid("sagemaker", "DeleteCluster")
def _delete_hp_cluster(e: Env) -> None:
    name = new_hp_cluster(e)
    arn = e["sagemaker"].delete_cluster(ClusterName=name)["ClusterArn"]
    assert e["sagemaker"].describe_cluster(ClusterName=arn)["ClusterStatus"] == "Deleting"


@valid("sagemaker", "ListClusterNodes")
def _list_hp_nodes(e: Env) -> None:
    pages = e["sagemaker"].get_paginator("list_cluster_nodes").paginate(
        ClusterName=e.hp, InstanceGroupNameContains="workers", PaginationConfig={"PageSize": 1})
    ids = [n["InstanceId"] for page in pages for n in page["ClusterNodeSummaries"]]
    assert set(e.nodes) <= set(ids)


@valid("sagemaker", "DescribeClusterNode")
def _describe_hp_node(e: Env) -> None:
    node = e["sagemaker"].describe_cluster_node(ClusterName=e.hp, NodeId=e.nodes[0])["NodeDetails"]
    assert node["InstanceGroupName"] == "workers" and node["InstanceType"] == "ml.m5.xlarge"


@valid("sagemaker", "BatchRebootClusterNodes")
def _reboot_hp_node(e: Env) -> None:
    out = e["sagemaker"].batch_reboot_cluster_nodes(ClusterName=e.hp, NodeIds=[e.nodes[1]])
    assert out["Successful"] == [e.nodes[1]] and out["Failed"] == []


@valid("sagemaker", "BatchReplaceClusterNodes")
def _replace_hp_node(e: Env) -> None:
    out = e["sagemaker"].batch_replace_cluster_nodes(ClusterName=e.hp, NodeIds=[e.nodes[2]])
    assert out["Successful"] == [e.nodes[2]] and out["Failed"] == []


@valid("sagemaker", "BatchDeleteClusterNodes")
def _delete_hp_node(e: Env) -> None:
    out = e["sagemaker"].batch_delete_cluster_nodes(ClusterName=e.hp, NodeIds=[e.nodes[3]])
    assert out["Successful"] == [e.nodes[3]] and out["Failed"] == []


@valid("sagemaker", "BatchAddClusterNodes")
def _add_hp_node(e: Env) -> None:
    out = e["sagemaker"].batch_add_cluster_nodes(ClusterName=e.hp, NodesToAdd=[
        {"InstanceGroupName": "workers", "IncrementTargetCountBy": 1}])
    assert [(n["InstanceGroupName"], n["Status"]) for n in out["Successful"]] == [("workers", "Pending")]


@valid("sagemaker", "UpdateClusterSoftware")
def _update_hp_software(e: Env) -> None:
    sm = e["sagemaker"]
    assert sm.update_cluster_software(ClusterName=e.hp, InstanceGroups=[{"InstanceGroupName": "system"}])[
        "ClusterArn"].startswith("arn:aws:sagemaker:us-west-2:123456789012:cluster/")
    system = next(g for g in sm.describe_cluster(ClusterName=e.hp)["InstanceGroups"]
                  if g["InstanceGroupName"] == "system")
    assert system["SoftwareUpdateStatus"] == "Pending"


@valid("sagemaker", "StartClusterHealthCheck")
def _start_hp_health_check(e: Env) -> None:
    e["sagemaker"].start_cluster_health_check(ClusterName=e.hp, DeepHealthCheckConfigurations=[
        {"InstanceGroupName": "workers", "InstanceIds": [e.nodes[0]], "DeepHealthChecks": ["InstanceStress"]}])
    e.world.advance(1)
    status = e["sagemaker"].describe_cluster_node(ClusterName=e.hp, NodeId=e.nodes[0])["NodeDetails"]
    assert status["InstanceStatus"]["Status"] == "DeepHealthCheckInProgress"


@valid("sagemaker", "ListTags")
def _list_hp_tags(e: Env) -> None:
    name = fresh("hp")
    tags = [{"Key": "team", "Value": "ml"}]
    arn = e["sagemaker"].create_cluster(ClusterName=name, Orchestrator={"Eks": {"ClusterArn": e.eks_arn}},
                                        VpcConfig={"SecurityGroupIds": [e.security_group], "Subnets": e.subnets},
                                        InstanceGroups=[hp_group("workers")], Tags=tags)["ClusterArn"]
    assert e["sagemaker"].list_tags(ResourceArn=arn)["Tags"] == tags


@valid("sagemaker", "ListClusterEvents")
def _list_hp_events(e: Env) -> None:
    events = e["sagemaker"].list_cluster_events(ClusterName=e.hp, MaxResults=100)["Events"]
    assert {"Cluster creation started.", "Cluster is InService."} <= {ev["Description"] for ev in events}


@valid("sagemaker", "DescribeClusterEvent")
def _describe_hp_event(e: Env) -> None:
    sm = e["sagemaker"]
    first = sm.list_cluster_events(ClusterName=e.hp, MaxResults=1, SortOrder="Ascending")["Events"][0]
    details = sm.describe_cluster_event(ClusterName=e.hp, EventId=first["EventId"])["EventDetails"]
    assert details["EventId"] == first["EventId"] and details["Description"] == "Cluster creation started."


@valid("sagemaker", "SearchTrainingPlanOfferings")
def _search_offerings(e: Env) -> None:
    offerings = e["sagemaker"].search_training_plan_offerings(
        InstanceType="ml.p5.48xlarge", InstanceCount=2, DurationHours=48,
        TargetResources=["hyperpod-cluster"])["TrainingPlanOfferings"]
    assert len(offerings) == 3
    assert all(o["ReservedCapacityOfferings"][0]["InstanceCount"] == 2 for o in offerings)


@valid("sagemaker", "CreateTrainingPlan")
def _create_training_plan(e: Env) -> None:
    sm = e["sagemaker"]
    offering = sm.search_training_plan_offerings(InstanceType="ml.p5.48xlarge", InstanceCount=1, DurationHours=24)[
        "TrainingPlanOfferings"][0]
    name = fresh("plan")
    arn = sm.create_training_plan(TrainingPlanName=name,
                                  TrainingPlanOfferingId=offering["TrainingPlanOfferingId"])["TrainingPlanArn"]
    assert arn.endswith(f":training-plan/{name}")
    assert sm.describe_training_plan(TrainingPlanName=name)["Status"] == "Pending"


@valid("sagemaker", "ListTrainingPlans")
def _list_training_plans(e: Env) -> None:
    summaries = e["sagemaker"].list_training_plans(MaxResults=100, SortBy="TrainingPlanName")["TrainingPlanSummaries"]
    assert e.plan in [p["TrainingPlanName"] for p in summaries]


@valid("sagemaker", "DescribeTrainingPlan")
def _describe_training_plan(e: Env) -> None:
    plan = e["sagemaker"].describe_training_plan(TrainingPlanName=e.plan)
    assert plan["Status"] == "Scheduled" and plan["TotalInstanceCount"] == 1


def settle_tracking(e: Env, seconds: float) -> None:
    """Move only the MLflow tracking servers ``seconds`` on (the shared clock stays: the HyperPod nodes of the
    other scenarios must not move)."""
    with e.world.front.lock("sagemaker"):
        e.world.mlflow.tick(e.world.clock.now() + seconds)


def tracking_server(e: Env, created: bool = True) -> str:
    """A new MLflow tracking server (its role trusts sagemaker.amazonaws.com; the bucket exists), Created."""
    name = fresh("mlflow")
    e["sagemaker"].create_mlflow_tracking_server(TrackingServerName=name, RoleArn=role(HP_EXEC),
                                                 ArtifactStoreUri="s3://sagemaker-lifecycle/mlflow/")
    if created:
        settle_tracking(e, MLFLOW_CREATE_SECONDS)
    return name


@valid("sagemaker", "CreateMlflowTrackingServer")
def _create_tracking(e: Env) -> None:
    name = tracking_server(e, created=False)
    assert e["sagemaker"].describe_mlflow_tracking_server(TrackingServerName=name)["TrackingServerStatus"] == "Creating"


@valid("sagemaker", "DescribeMlflowTrackingServer")
def _describe_tracking(e: Env) -> None:
    name = tracking_server(e)
    server = e["sagemaker"].describe_mlflow_tracking_server(TrackingServerName=name)
    assert server["TrackingServerStatus"] == "Created" and server["IsActive"] == "Active"


@valid("sagemaker", "ListMlflowTrackingServers")
def _list_tracking(e: Env) -> None:
    name = tracking_server(e)
    listed = e["sagemaker"].list_mlflow_tracking_servers(SortBy="Name")["TrackingServerSummaries"]
    assert name in [s["TrackingServerName"] for s in listed]


@valid("sagemaker", "DeleteMlflowTrackingServer")
def _delete_tracking(e: Env) -> None:
    name = tracking_server(e)
    e["sagemaker"].delete_mlflow_tracking_server(TrackingServerName=name)
    assert e["sagemaker"].describe_mlflow_tracking_server(TrackingServerName=name)["TrackingServerStatus"] == "Deleting"


@valid("sagemaker", "StopMlflowTrackingServer")
def _stop_tracking(e: Env) -> None:
    e["sagemaker"].stop_mlflow_tracking_server(TrackingServerName=tracking_server(e))


@valid("sagemaker", "StartMlflowTrackingServer")
def _start_tracking(e: Env) -> None:
    name = tracking_server(e)
    e["sagemaker"].stop_mlflow_tracking_server(TrackingServerName=name)
    settle_tracking(e, STOP_SECONDS)
    e["sagemaker"].start_mlflow_tracking_server(TrackingServerName=name)


@valid("sagemaker", "CreatePresignedMlflowTrackingServerUrl")
def _presigned_tracking(e: Env) -> None:
    url = e["sagemaker"].create_presigned_mlflow_tracking_server_url(TrackingServerName=tracking_server(e))
    assert "authToken=" in url["AuthorizedUrl"]


# EKS ------------------------------------------------------------------------------------------------------------


@valid("eks", "CreateCluster")
def _create_eks_cluster(e: Env) -> None:
    cluster = e["eks"].create_cluster(name=fresh("eks"), version="1.32", roleArn=ROLE,
                                      resourcesVpcConfig={"subnetIds": e.subnets})["cluster"]
    assert cluster["status"] == "CREATING" and "endpoint" not in cluster


@valid("eks", "DescribeCluster")
def _describe_eks_cluster(e: Env) -> None:
    cluster = e["eks"].describe_cluster(name=e.eks)["cluster"]
    assert cluster["status"] == "ACTIVE" and cluster["endpoint"].endswith(f"/k8s/clusters/{e.eks}")


@valid("eks", "DescribeClusterVersions")
def _describe_cluster_versions(e: Env) -> None:
    versions = e["eks"].describe_cluster_versions(defaultOnly=True)["clusterVersions"]
    assert [v["defaultVersion"] for v in versions] == [True]


@valid("iam", "SimulatePrincipalPolicy")
def _simulate_principal_policy(e: Env) -> None:
    results = e["iam"].simulate_principal_policy(PolicySourceArn=CREATOR,
                                                 ActionNames=["eks:CreateCluster"])["EvaluationResults"]
    assert [r["EvalDecision"] for r in results] == ["allowed"]


@valid("eks", "ListClusters")
def _list_eks_clusters(e: Env) -> None:
    pages = e["eks"].get_paginator("list_clusters").paginate(PaginationConfig={"PageSize": 5})
    assert {e.eks, e.eks_config} <= {name for page in pages for name in page["clusters"]}


@valid("eks", "DeleteCluster")
def _delete_eks_cluster(e: Env) -> None:
    assert e["eks"].delete_cluster(name=e.eks_doomed)["cluster"]["status"] == "DELETING"


@valid("eks", "UpdateClusterConfig")
def _update_eks_cluster_config(e: Env) -> None:
    update = e["eks"].update_cluster_config(name=e.eks_config, logging={"clusterLogging": [
        {"types": ["api", "audit"], "enabled": True}]})["update"]
    assert update["status"] == "InProgress" and update["type"] == "ConfigUpdate"
    assert e["eks"].describe_cluster(name=e.eks_config)["cluster"]["status"] == "UPDATING"


@valid("eks", "DescribeUpdate")
def _describe_eks_update(e: Env) -> None:
    update = e["eks"].describe_update(name=e.eks_config, updateId=e.update_id)["update"]
    assert update["status"] == "Successful" and update["type"] == "AccessConfigUpdate"


@valid("eks", "CreateNodegroup")
def _create_nodegroup(e: Env) -> None:
    group = e["eks"].create_nodegroup(clusterName=e.eks, nodegroupName=fresh("ng"), subnets=e.subnets,
                                      nodeRole=role("eks-node"), instanceTypes=["m5.large"])["nodegroup"]
    assert group["status"] == "CREATING" and group["instanceTypes"] == ["m5.large"]


@valid("eks", "DescribeNodegroup")
def _describe_nodegroup(e: Env) -> None:
    group = e["eks"].describe_nodegroup(clusterName=e.eks, nodegroupName="ng-keep")["nodegroup"]
    assert group["status"] == "ACTIVE" and group["scalingConfig"]["desiredSize"] == 1


@valid("eks", "ListNodegroups")
def _list_nodegroups(e: Env) -> None:
    assert "ng-keep" in e["eks"].list_nodegroups(clusterName=e.eks)["nodegroups"]


@valid("eks", "UpdateNodegroupConfig")
def _update_nodegroup_config(e: Env) -> None:
    update = e["eks"].update_nodegroup_config(clusterName=e.eks, nodegroupName="ng-scaled",
                                              scalingConfig={"minSize": 0, "maxSize": 2, "desiredSize": 0})["update"]
    assert update["type"] == "ConfigUpdate"
    group = e["eks"].describe_nodegroup(clusterName=e.eks, nodegroupName="ng-scaled")["nodegroup"]
    assert group["status"] == "UPDATING" and group["scalingConfig"]["desiredSize"] == 0


@valid("eks", "DeleteNodegroup")
def _delete_nodegroup(e: Env) -> None:
    group = e["eks"].delete_nodegroup(clusterName=e.eks, nodegroupName="ng-doomed")["nodegroup"]
    assert group["status"] == "DELETING"


@valid("eks", "DescribeAddonVersions")
def _describe_addon_versions(e: Env) -> None:
    addons = e["eks"].describe_addon_versions(kubernetesVersion="1.32", addonName="eks-pod-identity-agent")["addons"]
    assert [a["addonName"] for a in addons] == ["eks-pod-identity-agent"] and addons[0]["addonVersions"]


@valid("eks", "DescribeAddonConfiguration")
def _describe_addon_configuration(e: Env) -> None:
    got = e["eks"].describe_addon_configuration(addonName="coredns", addonVersion="v1.11.4-eksbuild.14")
    assert json.loads(got["configurationSchema"])["additionalProperties"] is False


@valid("eks", "CreateAddon")
def _create_addon(e: Env) -> None:
    addon = e["eks"].create_addon(clusterName=e.eks, addonName="metrics-server")["addon"]
    assert addon["status"] == "CREATING" and addon["addonVersion"]


@valid("eks", "DescribeAddon")
def _describe_addon(e: Env) -> None:
    assert e["eks"].describe_addon(clusterName=e.eks, addonName="kube-proxy")["addon"]["status"] == "ACTIVE"


@valid("eks", "ListAddons")
def _list_addons(e: Env) -> None:
    assert "kube-proxy" in e["eks"].list_addons(clusterName=e.eks)["addons"]


@valid("eks", "UpdateAddon")
def _update_addon(e: Env) -> None:
    eks = e["eks"]
    update = eks.update_addon(clusterName=e.eks, addonName="eks-pod-identity-agent", resolveConflicts="OVERWRITE",
                              configurationValues='{"resources": {"limits": {"memory": "256Mi"}}}')["update"]
    assert update["type"] == "AddonUpdate" and update["status"] == "InProgress"
    addon = eks.describe_addon(clusterName=e.eks, addonName="eks-pod-identity-agent")["addon"]
    assert addon["status"] == "UPDATING" and "256Mi" in addon["configurationValues"]


@valid("eks", "DeleteAddon")
def _delete_addon(e: Env) -> None:
    assert e["eks"].delete_addon(clusterName=e.eks, addonName="coredns")["addon"]["status"] == "DELETING"


@valid("eks", "CreateAccessEntry")
def _create_access_entry(e: Env) -> None:
    principal = ensure_role(e.world, fresh("entry"), "ec2.amazonaws.com")
    entry = e["eks"].create_access_entry(clusterName=e.eks, principalArn=principal,
                                         kubernetesGroups=["ml-engineers"])["accessEntry"]
    assert entry["principalArn"] == principal and entry["type"] == "STANDARD"


@valid("eks", "DescribeAccessEntry")
def _describe_access_entry(e: Env) -> None:
    entry = e["eks"].describe_access_entry(clusterName=e.eks, principalArn=e.principal)["accessEntry"]
    assert entry["principalArn"] == e.principal and entry["clusterName"] == e.eks


@valid("eks", "ListAccessEntries")
def _list_access_entries(e: Env) -> None:
    entries = e["eks"].list_access_entries(clusterName=e.eks)["accessEntries"]
    assert {CREATOR, e.principal} <= set(entries)


@valid("eks", "UpdateAccessEntry")
def _update_access_entry(e: Env) -> None:
    entry = e["eks"].update_access_entry(clusterName=e.eks, principalArn=e.principal, kubernetesGroups=["ops"],
                                         username="ops-user")["accessEntry"]
    assert entry["kubernetesGroups"] == ["ops"] and entry["username"] == "ops-user"


@valid("eks", "DeleteAccessEntry")
def _delete_access_entry(e: Env) -> None:
    eks = e["eks"]
    eks.delete_access_entry(clusterName=e.eks, principalArn=e.principal_doomed)
    assert e.principal_doomed not in eks.list_access_entries(clusterName=e.eks)["accessEntries"]


@valid("eks", "AssociateAccessPolicy")
def _associate_access_policy(e: Env) -> None:
    out = e["eks"].associate_access_policy(clusterName=e.eks, principalArn=e.principal,
                                           policyArn=POLICY + "AmazonEKSViewPolicy",
                                           accessScope={"type": "namespace", "namespaces": ["training"]})
    assert out["associatedAccessPolicy"]["accessScope"] == {"type": "namespace", "namespaces": ["training"]}


@valid("eks", "DisassociateAccessPolicy")
def _disassociate_access_policy(e: Env) -> None:
    eks = e["eks"]
    eks.disassociate_access_policy(clusterName=e.eks, principalArn=e.principal_policy,
                                   policyArn=POLICY + "AmazonEKSEditPolicy")
    listed = eks.list_associated_access_policies(clusterName=e.eks, principalArn=e.principal_policy)
    assert listed["associatedAccessPolicies"] == []


@valid("eks", "ListAssociatedAccessPolicies")
def _list_associated_access_policies(e: Env) -> None:
    listed = e["eks"].list_associated_access_policies(clusterName=e.eks, principalArn=CREATOR)
    assert [p["policyArn"] for p in listed["associatedAccessPolicies"]] == [POLICY + "AmazonEKSClusterAdminPolicy"]


@valid("eks", "ListAccessPolicies")
def _list_access_policies(e: Env) -> None:
    names = {p["name"] for p in e["eks"].list_access_policies()["accessPolicies"]}
    assert {"AmazonEKSClusterAdminPolicy", "AmazonSagemakerHyperpodClusterPolicy"} <= names


@valid("eks", "CreatePodIdentityAssociation")
def _create_pod_identity(e: Env) -> None:
    assoc = e["eks"].create_pod_identity_association(clusterName=e.eks, namespace="training",
                                                     serviceAccount=fresh("sa"), roleArn=POD_ROLE)["association"]
    assert assoc["associationId"].startswith("a-") and assoc["roleArn"] == POD_ROLE


@valid("eks", "DescribePodIdentityAssociation")
def _describe_pod_identity(e: Env) -> None:
    assoc = e["eks"].describe_pod_identity_association(clusterName=e.eks, associationId=e.association)["association"]
    assert (assoc["namespace"], assoc["serviceAccount"]) == ("training", "reader")


@valid("eks", "ListPodIdentityAssociations")
def _list_pod_identities(e: Env) -> None:
    listed = e["eks"].list_pod_identity_associations(clusterName=e.eks, namespace="training",
                                                     serviceAccount="reader")["associations"]
    assert [a["associationId"] for a in listed] == [e.association]


@valid("eks", "DeletePodIdentityAssociation")
def _delete_pod_identity(e: Env) -> None:
    eks = e["eks"]
    eks.delete_pod_identity_association(clusterName=e.eks, associationId=e.association_doomed)
    ids = [a["associationId"] for a in eks.list_pod_identity_associations(clusterName=e.eks)["associations"]]
    assert e.association_doomed not in ids


@valid("eks", "TagResource")
def _tag_resource(e: Env) -> None:
    e["eks"].tag_resource(resourceArn=e.eks_arn, tags={"team": "ml"})
    assert e["eks"].list_tags_for_resource(resourceArn=e.eks_arn)["tags"]["team"] == "ml"


@valid("eks", "UntagResource")
def _untag_resource(e: Env) -> None:
    e["eks"].untag_resource(resourceArn=e.eks_arn, tagKeys=["drop"])
    assert "drop" not in e["eks"].list_tags_for_resource(resourceArn=e.eks_arn)["tags"]


@valid("eks", "ListTagsForResource")
def _list_tags(e: Env) -> None:
    assert e["eks"].list_tags_for_resource(resourceArn=e.eks_arn)["tags"]["keep"] == "yes"


# Service Quotas and FSx -----------------------------------------------------------------------------------------

T3 = quota_code(quota_name("ml.t3.medium"))


@valid("service-quotas", "GetServiceQuota")
def _get_quota(e: Env) -> None:
    quota = e["service-quotas"].get_service_quota(ServiceCode="sagemaker", QuotaCode=T3)["Quota"]
    assert (quota["QuotaName"], quota["Value"]) == ("ml.t3.medium for cluster usage", 10.0)


@valid("service-quotas", "GetAWSDefaultServiceQuota")
def _get_default_quota(e: Env) -> None:
    quota = e["service-quotas"].get_aws_default_service_quota(ServiceCode="sagemaker", QuotaCode=T3)["Quota"]
    assert (quota["QuotaCode"], quota["Value"]) == (T3, 10.0)


@valid("service-quotas", "ListServiceQuotas")
def _list_quotas(e: Env) -> None:
    pages = e["service-quotas"].get_paginator("list_service_quotas").paginate(ServiceCode="sagemaker")
    assert len([q for page in pages for q in page["Quotas"]]) == len(world_quota_codes(e))


@valid("service-quotas", "ListAWSDefaultServiceQuotas")
def _list_default_quotas(e: Env) -> None:
    page = e["service-quotas"].list_aws_default_service_quotas(ServiceCode="sagemaker", MaxResults=100)
    assert len(page["Quotas"]) == 100 and page["NextToken"]


@valid("service-quotas", "ListServices")
def _list_services(e: Env) -> None:
    assert [s["ServiceCode"] for s in e["service-quotas"].list_services()["Services"]] == ["ec2", "sagemaker", "vpc"]


C5 = quota_code(quota_name("ml.c5.xlarge"))  # raised here only: other tests read t3/g5/p5 defaults


@valid("service-quotas", "RequestServiceQuotaIncrease")
def _request_increase(e: Env) -> None:
    sq = e["service-quotas"]
    current = sq.get_service_quota(ServiceCode="sagemaker", QuotaCode=C5)["Quota"]["Value"]
    asked = sq.request_service_quota_increase(ServiceCode="sagemaker", QuotaCode=C5, DesiredValue=current + 1)
    assert asked["RequestedQuota"]["Status"] == "APPROVED"
    assert sq.get_service_quota(ServiceCode="sagemaker", QuotaCode=C5)["Quota"]["Value"] == current + 1


@valid("service-quotas", "GetRequestedServiceQuotaChange")
def _get_requested_change(e: Env) -> None:
    sq = e["service-quotas"]
    current = sq.get_service_quota(ServiceCode="sagemaker", QuotaCode=C5)["Quota"]["Value"]
    request_id = sq.request_service_quota_increase(ServiceCode="sagemaker", QuotaCode=C5,
                                                   DesiredValue=current + 1)["RequestedQuota"]["Id"]
    got = sq.get_requested_service_quota_change(RequestId=request_id)["RequestedQuota"]
    assert (got["QuotaCode"], got["DesiredValue"], got["Status"]) == (C5, current + 1, "APPROVED")


def world_quota_codes(e: Env) -> set[str]:
    sq = e["service-quotas"]
    return {q["QuotaCode"] for page in sq.get_paginator("list_aws_default_service_quotas").paginate(
        ServiceCode="sagemaker") for q in page["Quotas"]}


@valid("fsx", "CreateFileSystem")
def _create_file_system(e: Env) -> None:
    fs = e["fsx"].create_file_system(FileSystemType="LUSTRE", StorageCapacity=1200, SubnetIds=e.subnets[:1],
                                     LustreConfiguration={"DeploymentType": "SCRATCH_2"})["FileSystem"]
    assert fs["Lifecycle"] == "CREATING" and fs["LustreConfiguration"]["MountName"]


@valid("fsx", "DescribeFileSystems")
def _describe_file_systems(e: Env) -> None:
    fs = e["fsx"].describe_file_systems(FileSystemIds=[e.fsx])["FileSystems"][0]
    assert fs["Lifecycle"] == "AVAILABLE" and fs["DNSName"] == f"{e.fsx}.fsx.us-west-2.amazonaws.com"


@valid("fsx", "DeleteFileSystem")
def _delete_file_system(e: Env) -> None:
    assert e["fsx"].delete_file_system(FileSystemId=e.fsx_doomed)["Lifecycle"] == "DELETING"


@dataclass
class Handled:
    """What the simulators handled (service, operation) and what the clients got back (service, operation, HTTP
    status)."""

    by_simulators: list[tuple[str, str]] = field(default_factory=list)
    by_clients: list[tuple[str, str, int]] = field(default_factory=list)


@pytest.fixture
def handled(world: AwsWorld, clients: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Iterator[Handled]:
    seen = Handled()
    real_call = world.front.call

    def record(call: Call) -> dict[str, Any]:
        result = real_call(call)
        seen.by_simulators.append((call.service, call.operation))
        return result

    def after_call(http_response: Any, model: OperationModel, **_: Any) -> None:
        seen.by_clients.append((model.service_model.service_name, model.name, int(http_response.status_code)))

    monkeypatch.setattr(world.front, "call", record)
    for c in clients.values():
        c.meta.events.register("after-call", after_call, unique_id="every-operation-recorder")
    yield seen
    for c in clients.values():
        c.meta.events.unregister("after-call", unique_id="every-operation-recorder")


def test_every_owned_operation_has_a_valid_request_test() -> None:
    assert sorted(VALID_CALLS) == list(OWNED)


@pytest.mark.parametrize(("service", "operation"), OWNED, ids=[f"{s}.{o}" for s, o in OWNED])
def test_valid_request_succeeds(env: Env, handled: Handled, service: str, operation: str) -> None:
    scenario = VALID_CALLS.get((service, operation))
    assert scenario is not None, f"no valid-request test for {service}.{operation}"
    scenario(env)
    assert (service, operation) in handled.by_simulators
    statuses = {status for svc, op, status in handled.by_clients if (svc, op) == (service, operation)}
    assert statuses and all(200 <= status < 300 for status in statuses), handled.by_clients
