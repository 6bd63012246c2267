"""Fixtures: one sandbox AWS world for the session on a manual clock, reached through real boto3 clients.

Starting moto fresh costs about two seconds (reset, then the EC2 backend's first use), so the world is
shared and tests use their own resource names; faults are cleared after every test. Tests that need a world
of their own (persistence) build one with :func:`new_world`. The Kubernetes emulator is shared too.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config

from sandbox.aws import AwsWorld, ManualClock
from sandbox.kube import BackgroundServer, Emulator
from sandbox.tls import ensure_tls

NO_RETRIES = Config(retries={"total_max_attempts": 1, "mode": "standard"})
ACCOUNT = "123456789012"
# roles every test world has (new_world makes them), with the trust AWS wants of them
ROLE = f"arn:aws:iam::{ACCOUNT}:role/eks-cluster"  # EKS cluster role: trusts eks.amazonaws.com
POD_ROLE = f"arn:aws:iam::{ACCOUNT}:role/eks-pods"  # pod identity: pods.eks.amazonaws.com, AssumeRole + TagSession
CREATOR = f"arn:aws:iam::{ACCOUNT}:user/moto"  # whom the sandbox's credentials sign as (moto's STS), as IAM names it
_names = itertools.count()

Clients = Callable[[str], Any]


@pytest.fixture(scope="session")
def kube() -> Iterator[BackgroundServer]:
    server = BackgroundServer(Emulator()).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def kube_ca(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return ensure_tls(tmp_path_factory.mktemp("tls")).ca_pem


def trust(service: str, *actions: str) -> str:
    """A trust policy letting ``service`` perform ``actions`` (default ``sts:AssumeRole``)."""
    return json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"Service": service}, "Action": list(actions or ("sts:AssumeRole",))}]})


def ensure_role(world: AwsWorld, name: str, service: str, *actions: str) -> str:
    """The ARN of IAM role ``name`` trusting ``service``, created if the world has none of that name."""
    iam = make_client(world, "iam")
    try:
        return str(iam.get_role(RoleName=name)["Role"]["Arn"])
    except iam.exceptions.NoSuchEntityException:
        return str(iam.create_role(RoleName=name, AssumeRolePolicyDocument=trust(service, *actions))["Role"]["Arn"])


def standard_roles(world: AwsWorld) -> None:
    """Make :data:`ROLE` and :data:`POD_ROLE` (the ``world`` fixture does, for every test)."""
    ensure_role(world, "eks-cluster", "eks.amazonaws.com")
    ensure_role(world, "eks-pods", "pods.eks.amazonaws.com", "sts:AssumeRole", "sts:TagSession")


def new_world(kube: BackgroundServer, data_dir: Path | None = None, ca_pem: bytes = b"") -> AwsWorld:
    return AwsWorld(data_dir, ManualClock(), kube.emulator, kube_base_url=kube.base_url,
                    kube_ca_pem=ca_pem).start(ticker=False)


@pytest.fixture(scope="session")
def shared_world(kube: BackgroundServer, kube_ca: bytes) -> Iterator[AwsWorld]:
    aws = new_world(kube, ca_pem=kube_ca)
    yield aws
    aws.stop()


@pytest.fixture
def world(shared_world: AwsWorld) -> Iterator[AwsWorld]:
    # A world tells its emulator what time it is and where its AWS endpoint is; worlds of their own (new_world)
    # take the shared emulator over, so give its clock and endpoint back to the shared world.
    shared_world.kube.use_clock(shared_world.clock.now)  # type: ignore[union-attr]
    shared_world.kube.use_cloud(shared_world.endpoint_url, shared_world.region)  # type: ignore[union-attr]
    standard_roles(shared_world)  # a world of its own (new_world) resets moto, the shared world's IAM too
    yield shared_world
    shared_world.faults.clear()


def make_client(world: AwsWorld, service: str) -> Any:
    return boto3.client(service, endpoint_url=world.endpoint_url, region_name="us-west-2",
                        aws_access_key_id="testing", aws_secret_access_key="testing", config=NO_RETRIES)


@pytest.fixture
def aws(world: AwsWorld) -> Clients:
    return lambda service: make_client(world, service)


@pytest.fixture
def unique() -> Callable[[str], str]:
    return lambda prefix: f"{prefix}-{next(_names)}"


def subnets(ec2: Any, count: int = 2) -> list[str]:
    vpc = ec2.create_vpc(CidrBlock="10.20.0.0/16")["Vpc"]["VpcId"]
    return [ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.20.{16 * i}.0/20",
                              AvailabilityZone=f"us-west-2{'abcd'[i]}")["Subnet"]["SubnetId"] for i in range(count)]


def error_code(exc: Exception) -> str:
    return str(exc.response["Error"]["Code"])  # type: ignore[attr-defined]
