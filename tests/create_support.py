"""Helpers for the tests of ``cluster.create``/``cluster.delete`` stages: a product installation against a
sandbox server, a plan with sandbox-friendly defaults, and a way to run any list of stages as one operation
through the real engine (earlier stages' results may be given instead of run, with :class:`Given`)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

from app.bootstrap import Services, build_services
from app.sandbox import SANDBOX_ACCESS_KEY
from services.clusters.create_base import StageDeps, cluster_tags
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
