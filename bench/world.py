"""What the sandbox benches share: a real ``instantstart serve`` in sandbox mode with a seeded HyperPod
cluster of N nodes, imported through REST and read once (informers synced, AWS caches filled).

A cluster larger than the account's default quota is made the way a user would make it in AWS: a Service
Quotas increase for ``<type> for cluster usage`` first (the sandbox approves it at once), then
``instantstart sandbox seed``. Nothing here reads the product's internals: it speaks REST, boto3 and the CLI.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import httpx2

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.sandbox import SANDBOX_ACCESS_KEY  # noqa: E402
from sandbox.aws.quotas import quota_code, quota_name  # noqa: E402
from sandbox.seed import iam_principal  # noqa: E402
from tests.support import LiveServer, free_port, start_server, wait_until  # noqa: E402

INSTANCE_TYPE = "ml.g5.8xlarge"
ADMIN_POLICY = "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"


@dataclass
class World:
    live: LiveServer
    cluster: str
    nodes: int
    aws_env: dict[str, str]
    seed_seconds: float
    kubeconfig: Path

    def aws(self, service: str) -> Any:
        return boto3.client(service, endpoint_url=self.aws_env["AWS_ENDPOINT_URL"],  # type: ignore[call-overload]
                            region_name=self.aws_env["AWS_REGION"], aws_access_key_id=SANDBOX_ACCESS_KEY,
                            aws_secret_access_key=self.aws_env["AWS_SECRET_ACCESS_KEY"])

    def detail(self, token: str | None = None) -> dict[str, Any]:
        r = self.live.get(f"/api/v1/clusters/{self.cluster}", token)
        if r.status_code != 200:
            raise RuntimeError(f"GET /api/v1/clusters/{self.cluster}: {r.status_code} {r.text[:300]}")
        return dict(r.json())


def cli(live: LiveServer, *args: str, timeout: float = 1800) -> str:
    out = subprocess.run([sys.executable, "-m", "app.cli", *args, "--data-dir", str(live.data_dir)], cwd=ROOT,
                         capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"instantstart {' '.join(args)} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    return out.stdout


def sandbox_env(live: LiveServer) -> dict[str, str]:
    """The exports of ``instantstart sandbox env`` (the sandbox's AWS endpoint and credentials)."""
    env: dict[str, str] = {}
    for line in cli(live, "sandbox", "env", timeout=60).splitlines():
        if line.startswith("export "):
            key, _, value = line.removeprefix("export ").partition("=")
            env[key] = shlex.split(value)[0] if value else ""
    return env


def raise_quota(world_env: dict[str, str], instance_type: str, wanted: int) -> None:
    """Ask Service Quotas for ``wanted`` instances of ``instance_type`` when the applied value is lower."""
    sq = boto3.client("service-quotas", endpoint_url=world_env["AWS_ENDPOINT_URL"], region_name=world_env["AWS_REGION"],
                      aws_access_key_id=SANDBOX_ACCESS_KEY, aws_secret_access_key=world_env["AWS_SECRET_ACCESS_KEY"])
    code = quota_code(quota_name(instance_type))
    if sq.get_service_quota(ServiceCode="sagemaker", QuotaCode=code)["Quota"]["Value"] < wanted:
        asked = sq.request_service_quota_increase(ServiceCode="sagemaker", QuotaCode=code, DesiredValue=wanted)
        if asked["RequestedQuota"]["Status"] != "APPROVED":
            raise RuntimeError(f"quota increase for {instance_type} is {asked['RequestedQuota']['Status']}")


@contextmanager
def seeded_world(folder: Path, nodes: int, name: str = "bench", speed: int = 300,
                 say: Any = print) -> Iterator[World]:
    """A server with an imported ``nodes``-node cluster whose detail was read once (caches warm)."""
    live = start_server(folder / "data", env={"INSTANTSTART_SANDBOX_SPEED": str(speed),
                                              "INSTANTSTART_SANDBOX_AWS_PORT": str(free_port()),
                                              "INSTANTSTART_SANDBOX_KUBE_PORT": str(free_port())})
    try:
        env = sandbox_env(live)
        raise_quota(env, INSTANCE_TYPE, nodes)
        started = time.perf_counter()
        cli(live, "sandbox", "seed", "--name", name, "--nodes", str(nodes), "--instance-type", INSTANCE_TYPE)
        seed_seconds = time.perf_counter() - started
        say(f"seeded {name}: {nodes} x {INSTANCE_TYPE} in {seed_seconds:.1f} s")
        kubeconfig = folder / f"{name}.kubeconfig"
        cli(live, "kubeconfig", name, "-o", str(kubeconfig), timeout=60)
        world = World(live, name, nodes, env, seed_seconds, kubeconfig)
        _import(world)
        yield world
    finally:
        live.stop()


def _import(world: World) -> None:
    live = world.live
    eks = world.aws("eks")
    principal = iam_principal(world.aws("sts").get_caller_identity()["Arn"])
    if principal not in eks.list_access_entries(clusterName=world.cluster)["accessEntries"]:
        eks.create_access_entry(clusterName=world.cluster, principalArn=principal)
        eks.associate_access_policy(clusterName=world.cluster, principalArn=principal, policyArn=ADMIN_POLICY,
                                    accessScope={"type": "cluster"})
    made = live.post("/api/v1/clusters/import", {"eks_cluster": world.cluster, "hyperpod_cluster": world.cluster})
    if made.status_code != 202:
        raise RuntimeError(f"import refused: {made.status_code} {made.text[:500]}")
    op = made.json()["operation"]
    done = live.get(f"/api/v1/operations/{op['id']}/wait?timeout=120").json()
    if done["status"] != "succeeded":
        raise RuntimeError(f"import did not succeed: {done}")

    def synced() -> bool:
        detail = world.detail()
        return sum(len(v) for v in detail["nodes_by_group"].values()) == world.nodes

    wait_until(synced, 600, f"the informers to hold all {world.nodes} nodes")


def timed_get(client: httpx2.Client, url: str) -> float:
    started = time.perf_counter()
    r = client.get(url)
    elapsed = time.perf_counter() - started
    if r.status_code != 200:
        raise RuntimeError(f"GET {url}: {r.status_code} {r.text[:300]}")
    return elapsed
