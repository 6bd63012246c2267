"""Fixtures: one sandbox AWS world for the session on a manual clock, reached through real boto3 clients.

Starting moto fresh costs about two seconds (reset, then the EC2 backend's first use), so the world is
shared and tests use their own resource names; faults are cleared after every test. Tests that need a world
of their own (persistence) build one with :func:`new_world`. The Kubernetes emulator is shared too.
"""

from __future__ import annotations

import itertools
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
ROLE = "arn:aws:iam::123456789012:role/eks-cluster"
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
    # A world tells its emulator what time it is; worlds of their own (new_world) take the shared emulator
    # over, so give its clock back to the shared world.
    shared_world.kube.use_clock(shared_world.clock.now)  # type: ignore[union-attr]
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
