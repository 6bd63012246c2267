"""Helpers for the tests of ``cluster.create``/``cluster.delete`` stages: a product installation against a
sandbox server, a plan with sandbox-friendly defaults, and a way to run any list of stages as one operation
through the real engine (earlier stages' results may be given instead of run, with :class:`Given`)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

from app.bootstrap import Services, build_services
from app.sandbox import SANDBOX_ACCESS_KEY
from services.clusters.create_base import StageDeps, cluster_tags, owned
from services.clusters.create_models import INSTANCE_GROUP, CapacityType, ClusterCreatePlan, DerivedNames
from services.operations import TERMINAL, OperationView
from services.settings import Settings
from services.stages import Observed, OperationKind, Stage, StageContext
from tests.conftest import ADMIN
from tests.support import LiveServer, free_port, start_server, wait_until

_kinds = itertools.count()


@dataclass
class SandboxProduct:
    """A sandbox server (the world) and a started product installation against it (the code under test)."""

    live: LiveServer
    services: Services
    aws_port: int
    kube_port: int

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.aws_port}"

    def deps(self) -> StageDeps:
        s = self.services
        return StageDeps(aws=s.aws.for_stages(), kube=s.kube, registry=s.clusters.registry, informers=s.informers,
                         settings=s.settings, clock=s.clock)

    def product_reader(self, data: Path) -> Services:
        """Another installation's services on ``data`` (its state database), not started: to read what a
        product process running there records."""
        return build_services(Settings(data_dir=data, sandbox=True, sandbox_aws_port=self.aws_port,
                                       sandbox_kube_port=self.kube_port, workers=1))

    def client(self, service: str) -> Any:
        """A boto3 client as a user would have one (the sandbox's own credentials), retries off."""
        secret = (self.live.data_dir / "sandbox" / "aws-secret-key").read_text().strip()
        return boto3.client(service, endpoint_url=self.endpoint, region_name="us-west-2",
                            aws_access_key_id=SANDBOX_ACCESS_KEY, aws_secret_access_key=secret,
                            config=Config(retries={"total_max_attempts": 1}))


@contextmanager
def sandbox_product(folder: Path, speed: float = 3000.0) -> Iterator[SandboxProduct]:
    """``instantstart serve`` in sandbox mode on free ports, and a second installation of the product against
    its world (its own state database, the sandbox's credentials copied), engine started."""
    aws_port, kube_port = free_port(), free_port()
    live = start_server(folder / "world", env={"INSTANTSTART_SANDBOX_SPEED": str(speed),
                                               "INSTANTSTART_SANDBOX_AWS_PORT": str(aws_port),
                                               "INSTANTSTART_SANDBOX_KUBE_PORT": str(kube_port)})
    services: Services | None = None
    try:
        data = folder / "product"
        (data / "sandbox").mkdir(parents=True, exist_ok=True)
        (data / "sandbox" / "aws-secret-key").write_text(
            (live.data_dir / "sandbox" / "aws-secret-key").read_text())
        services = build_services(Settings(data_dir=data, sandbox=True, sandbox_aws_port=aws_port,
                                           sandbox_kube_port=kube_port, sandbox_speed=speed, workers=2))
        services.start()
        yield SandboxProduct(live, services, aws_port, kube_port)
    finally:
        if services is not None:
            services.stop()
        live.stop()


def held_answers(live: LiveServer, fault_id: str) -> int:
    """How many answers the sandbox's ``hold_response`` fault ``fault_id`` holds now (0 once released or
    their callers went away)."""
    faults = live.get("/api/v1/sandbox/faults").json()
    return int(next((f.get("held", 0) for f in faults if f["id"] == fault_id), 0))


@contextmanager
def live_sandbox(folder: Path, speed: float) -> Iterator[tuple[LiveServer, int]]:
    """A product server running its own sandbox at ``speed`` (REST-level tests); answers it and the sandbox's
    AWS port."""
    aws_port = free_port()
    server = start_server(folder / "data", env={"INSTANTSTART_SANDBOX_SPEED": str(speed),
                                                "INSTANTSTART_SANDBOX_AWS_PORT": str(aws_port)})
    try:
        yield server, aws_port
    finally:
        server.stop()


def live_aws(live: LiveServer, aws_port: int, service: str) -> Any:
    """A boto3 client of ``live``'s sandbox, as a user of it."""
    secret = (live.data_dir / "sandbox" / "aws-secret-key").read_text().strip()
    return boto3.client(service, endpoint_url=f"http://127.0.0.1:{aws_port}", region_name="us-west-2",
                        aws_access_key_id=SANDBOX_ACCESS_KEY, aws_secret_access_key=secret)


def operation_end(live: LiveServer, op_id: str, timeout: float = 600) -> dict[str, Any]:
    """The operation's view once it is terminal, followed through the REST long-poll."""
    def done() -> dict[str, Any] | None:
        view = live.get(f"/api/v1/operations/{op_id}", params={"wait": 30}).json()
        return view if view["status"] in ("succeeded", "failed", "cancelled") else None

    result: dict[str, Any] = wait_until(done, timeout, f"operation {op_id} to end")
    return result


def make_plan(name: str = "demo", **overrides: Any) -> ClusterCreatePlan:
    """A plan as the precheck would compute it for the sandbox (us-west-2a, 2 x ml.g5.8xlarge)."""
    names = DerivedNames(eks_cluster=name, hyperpod_cluster=name, vpc=f"{name}-vpc", security_group=f"{name}-efa",
                         eks_role=f"{name}-eks-cluster-role", execution_role=f"{name}-hyperpod-exec-role",
                         instance_group=INSTANCE_GROUP, lifecycle_prefix=f"instantstart/{name}/lifecycle/")
    fields: dict[str, Any] = dict(
        name=name, region="us-west-2", account="123456789012", zone="us-west-2a", zone_id="usw2-az1",
        second_zone="us-west-2b", instance_type="ml.g5.8xlarge", count=2, capacity_type=CapacityType.ON_DEMAND,
        deep_health_checks=[], kubernetes_version="1.32", vpc_cidr="10.192.0.0/16",
        endpoint_public_access_cidrs=["0.0.0.0/0"], ebs_volume_gib=500,
        bucket="instantstart-shared-123456789012-us-west-2", efa=True, accelerator="NVIDIA A10G",
        control_plane_principal="arn:aws:iam::123456789012:user/moto", admin_principals=[],
        tags=cluster_tags(name), names=names, requested_by="tester")
    fields.update(overrides)
    return ClusterCreatePlan(**fields)


class Given(Stage[Any]):
    """A stand-in for an earlier stage that has run: its result is given (for testing a later stage alone)."""

    read_only = True

    def __init__(self, name: str, result: dict[str, Any]) -> None:
        self.name = name
        self._result = result

    def observe(self, ctx: StageContext[Any]) -> Observed:
        return Observed.DONE

    def result(self, ctx: StageContext[Any]) -> dict[str, Any]:
        return self._result

    def report(self, ctx: StageContext[Any]) -> str:
        return "given by the test"


def run_stages(services: Services, stages: Sequence[Stage[Any]], request: Any, timeout: float = 180) -> OperationView:
    """Run ``stages`` in order as one operation of a kind made for this call; answer it once terminal."""
    kind = f"test.create.{next(_kinds)}"
    services.engine.register(OperationKind(kind, type(request), tuple(stages), target=lambda r: f"test/{kind}"))
    view, _ = services.engine.submit(kind, request, ADMIN)
    return wait_until(lambda: (v := services.engine.get(view.id)).status in TERMINAL and v, timeout,
                      f"operation {view.id} ({kind}) terminal")


EC2_DESCRIBE = {  # create operation -> (describe method, result key, a state that counts as gone)
    "CreateVpc": ("describe_vpcs", "Vpcs", None), "CreateSubnet": ("describe_subnets", "Subnets", None),
    "CreateInternetGateway": ("describe_internet_gateways", "InternetGateways", None),
    "CreateNatGateway": ("describe_nat_gateways", "NatGateways", "deleted"),
    "CreateRouteTable": ("describe_route_tables", "RouteTables", None),
    "CreateSecurityGroup": ("describe_security_groups", "SecurityGroups", None),
    "CreateVpcEndpoint": ("describe_vpc_endpoints", "VpcEndpoints", "deleted"),
    "AllocateAddress": ("describe_addresses", "Addresses", None),
    "CreateNetworkInterface": ("describe_network_interfaces", "NetworkInterfaces", None),
}
#: create-type calls that make nothing of their own to delete (a rule, a route, an association, an object
#: under the shared bucket, which stays), or whose result goes with its parent (an add-on with its cluster)
NOTHING_LEFT = {("ec2", "AuthorizeSecurityGroupIngress"), ("ec2", "AuthorizeSecurityGroupEgress"),
                ("ec2", "CreateRoute"), ("ec2", "AssociateRouteTable"), ("ec2", "AttachInternetGateway"),
                ("s3", "PutObject"), ("s3", "CreateBucket"),
                ("iam", "AttachRolePolicy"), ("iam", "PutRolePolicy"), ("eks", "CreateAddon"),
                ("eks", "CreateAccessEntry"), ("eks", "AssociateAccessPolicy"),
                ("eks", "CreatePodIdentityAssociation"), ("sts", "AssumeRole")}


def leftovers(client: Any, entries: list[dict[str, Any]], cluster: str) -> list[str]:
    """What still exists of everything the ledger's successful create-type calls made for ``cluster``
    (``client(service)`` gives a boto3 client). A create call this cannot check is itself a leftover: a new
    kind of resource must be added here, so "everything is gone" keeps meaning everything. EC2 resources are
    found by our tag, so an EC2 create whose ``TagSpecifications`` lack our two tags is a leftover itself."""
    left: list[str] = []
    tag_filter = [{"Name": "tag:instantstart:cluster", "Values": [cluster]}]
    for entry in entries:
        service, operation = entry.get("service"), entry.get("operation", "")
        if entry.get("kind") != "aws" or entry["status"] >= 400 or not entry.get("write"):
            continue
        if (service, operation) == ("ec2", "AssociateVpcCidrBlock"):
            left += _cidr_left(client("ec2"), entry.get("request") or {})
            continue
        if not operation.startswith(("Create", "Allocate", "Run")) or (service, operation) in NOTHING_LEFT:
            continue
        request = entry.get("request") or {}
        if service == "ec2" and operation in EC2_DESCRIBE and not owned(_spec_tags(request), cluster):
            left.append(f"untagged create: ec2 {operation} #{entry['seq']} without both of our tags in its "
                        f"TagSpecifications: {request}")
        if service == "ec2" and operation in EC2_DESCRIBE:
            method, key, gone = EC2_DESCRIBE[operation]
            found = [r for r in getattr(client("ec2"), method)(Filters=tag_filter)[key]
                     if gone is None or r.get("State") != gone]
            left += [f"ec2 {operation}: {r}" for r in found]
        elif (service, operation) == ("iam", "CreateRole"):
            names = {r["RoleName"] for r in client("iam").list_roles()["Roles"]}
            left += [f"iam role {request['RoleName']}"] if request.get("RoleName") in names else []
        elif (service, operation) == ("iam", "CreateOpenIDConnectProvider"):
            iam = client("iam")
            for arn in (p["Arn"] for p in iam.list_open_id_connect_providers()["OpenIDConnectProviderList"]):
                url = iam.get_open_id_connect_provider(OpenIDConnectProviderArn=arn)["Url"]
                if request.get("Url", "").removeprefix("https://") == url.removeprefix("https://"):
                    left.append(f"iam OIDC provider {arn}")
        elif (service, operation) == ("eks", "CreateCluster"):
            left += [f"eks cluster {request['name']}"] if request.get("name") in client("eks").list_clusters()[
                "clusters"] else []
        elif (service, operation) == ("sagemaker", "CreateCluster"):
            names = {c["ClusterName"] for c in client("sagemaker").list_clusters()["ClusterSummaries"]}
            left += [f"HyperPod cluster {request['ClusterName']}"] if request.get("ClusterName") in names else []
        elif (service, operation) == ("fsx", "CreateFileSystem"):
            left += [f"fsx {f['FileSystemId']}" for f in client("fsx").describe_file_systems()["FileSystems"]
                     if {t["Key"]: t["Value"] for t in f.get("Tags", [])}.get("instantstart:cluster") == cluster
                     and f.get("Lifecycle") != "DELETING"]
        else:
            left.append(f"no leftover check for {service} {operation}: add one to tests/create_support.py")
    return sorted(set(left))


def _spec_tags(request: dict[str, Any]) -> dict[str, str]:
    """The tags of an EC2 create call's ``TagSpecifications`` as the ledger has them (flat query fields:
    ``TagSpecification.1.Tag.2.Key``)."""
    pairs: dict[tuple[str, str], dict[str, str]] = {}
    for key, value in request.items():
        found = re.fullmatch(r"TagSpecification\.(\d+)\.Tag\.(\d+)\.(Key|Value)", key)
        if found:
            pairs.setdefault((found[1], found[2]), {})[found[3]] = str(value)
    return {p.get("Key", ""): p.get("Value", "") for p in pairs.values()}


def _cidr_left(ec2: Any, request: dict[str, Any]) -> list[str]:
    """The CIDR block an ``AssociateVpcCidrBlock`` added, if its VPC still has it."""
    try:
        vpcs = ec2.describe_vpcs(VpcIds=[request["VpcId"]])["Vpcs"]
    except ec2.exceptions.ClientError as exc:
        if exc.response["Error"]["Code"] == "InvalidVpcID.NotFound":
            return []  # the VPC is gone, and its blocks with it
        raise
    return [f"ec2 CIDR block {a['CidrBlock']} ({a['AssociationId']}) on VPC {request['VpcId']}"
            for v in vpcs for a in v.get("CidrBlockAssociationSet", [])
            if a["CidrBlock"] == request.get("CidrBlock")
            and a["CidrBlockState"]["State"] in ("associated", "associating")]
