"""Test helpers for the sandbox child process: start one on free ports, make an EKS cluster through it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.bootstrap import Services, build_services
from app.sandbox import Sandbox, aws_session
from services.auth import Principal
from services.clusters.models import ClusterImport
from services.settings import Settings
from tests.support import ROOT, LiveServer, free_port, start_server, wait_until

ROLE = "arn:aws:iam::123456789012:role/eks-cluster"
EKS_TRUST = json.dumps({"Version": "2012-10-17", "Statement": [
    {"Effect": "Allow", "Principal": {"Service": "eks.amazonaws.com"}, "Action": "sts:AssumeRole"}]})
FAST = 5_000.0  # simulated seconds per second: an EKS create (600 s) takes a tenth of a second


def sandbox_settings(data_dir: Path, speed: float = FAST) -> Settings:
    return Settings(data_dir=data_dir, sandbox=True, sandbox_kube_port=free_port(), sandbox_aws_port=free_port(),
                    sandbox_speed=speed)


def start_sandbox(settings: Settings) -> Sandbox:
    """The sandbox child process, started and answering (stop it with ``.stop()``)."""
    sandbox = Sandbox(settings)
    sandbox.start()
    return sandbox


def client(settings: Settings, service: str, endpoint: str | None = None) -> Any:
    from app.sandbox import aws_endpoint

    return aws_session(settings).client(service, endpoint_url=endpoint or aws_endpoint(settings))


def eks_cluster(settings: Settings, name: str, mode: str = "API", endpoint: str | None = None) -> dict[str, Any]:
    """An ACTIVE EKS cluster made through the sandbox's AWS endpoint, as a user would."""
    ec2 = client(settings, "ec2", endpoint)
    vpc = ec2.create_vpc(CidrBlock="10.20.0.0/16")["Vpc"]["VpcId"]
    subnets = [ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.20.{16 * i}.0/20",
                                 AvailabilityZone=f"us-west-2{'ab'[i]}")["Subnet"]["SubnetId"] for i in range(2)]
    iam = client(settings, "iam", endpoint)
    try:  # EKS refuses a cluster role that does not exist or does not trust eks.amazonaws.com
        iam.get_role(RoleName=ROLE.rpartition("/")[2])
    except iam.exceptions.NoSuchEntityException:
        iam.create_role(RoleName=ROLE.rpartition("/")[2], AssumeRolePolicyDocument=EKS_TRUST)
    eks = client(settings, "eks", endpoint)
    eks.create_cluster(name=name, version="1.32", roleArn=ROLE, resourcesVpcConfig={"subnetIds": subnets},
                       accessConfig={"authenticationMode": mode})
    return dict(wait_until(lambda: (c := eks.describe_cluster(name=name)["cluster"])["status"] == "ACTIVE" and c,
                           60, f"EKS cluster {name} ACTIVE"))


@dataclass
class SeededServer:
    """A real ``instantstart serve`` in sandbox mode with a cluster made by ``sandbox seed``."""

    live: LiveServer
    aws_port: int
    kube_port: int

    def product(self, data_dir: Path) -> Services:
        """A second installation of the product against this sandbox (its credentials copied), not started."""
        (data_dir / "sandbox").mkdir(parents=True, exist_ok=True)
        shutil.copy(self.live.data_dir / "sandbox" / "aws-secret-key", data_dir / "sandbox" / "aws-secret-key")
        return build_services(Settings(data_dir=data_dir, sandbox=True, sandbox_aws_port=self.aws_port,
                                       sandbox_kube_port=self.kube_port, workers=1))

    @contextmanager
    def imported(self, data_dir: Path, cluster: str, principal: Principal) -> Iterator[Services]:
        """:meth:`product` with the seeded ``cluster`` (EKS and HyperPod of that name) imported and connected,
        stopped on exit."""
        services = self.product(data_dir)
        try:
            view, _ = services.clusters.import_cluster(principal, ClusterImport(eks_cluster=cluster,
                                                                                hyperpod_cluster=cluster))
            wait_until(lambda: services.engine.run_until_idle(view.id).status == "succeeded", 60,
                       "the import to connect (its node list synced)")
            yield services
        finally:
            services.stop()


@contextmanager
def seeded_server(folder: Path, name: str, nodes: int = 1) -> Iterator[SeededServer]:
    aws_port, kube_port = free_port(), free_port()
    live = start_server(folder / "data", env={"INSTANTSTART_SANDBOX_SPEED": "3000",
                                              "INSTANTSTART_SANDBOX_AWS_PORT": str(aws_port),
                                              "INSTANTSTART_SANDBOX_KUBE_PORT": str(kube_port)})
    try:
        seed = subprocess.run([sys.executable, "-m", "app.cli", "sandbox", "seed", "--name", name, "--nodes",
                               str(nodes), "--data-dir", str(live.data_dir)], cwd=ROOT, capture_output=True,
                              text=True, timeout=300)
        assert seed.returncode == 0, seed.stderr
        yield SeededServer(live, aws_port, kube_port)
    finally:
        live.stop()
