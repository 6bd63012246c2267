"""Regression tests for the world's robustness: a failing simulator tick, restarts, the replay log, the clock."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from botocore.exceptions import ClientError

from sandbox.aws import AwsWorld, ManualClock, RealClock
from sandbox.aws.base import Call
from sandbox.aws.eks import ADDON_SECONDS, CLUSTER_CREATE_SECONDS
from sandbox.aws.moto_backend import BODY_INLINE_LIMIT
from sandbox.kube import BackgroundServer, Emulator, deletion
from sandbox.kube.cluster import WriteOptions
from tests.sandbox_aws.conftest import ROLE, Clients, make_client, new_world, standard_roles, subnets
from tests.support import wait_until


class _Exploding:
    service = "exploding"
    operations: frozenset[str] = frozenset()

    def handle(self, call: Call) -> dict[str, Any]:
        return {}

    def tick(self, now: float) -> None:
        raise RuntimeError("boom")


def test_a_failing_tick_neither_stops_time_nor_the_other_simulators(world: AwsWorld, aws: Clients,
                                                                     unique: Callable[[str], str]) -> None:
    name = unique("tick")
    eks = aws("eks")
    nets = subnets(aws("ec2"))
    eks.create_cluster(name=name, roleArn=ROLE, resourcesVpcConfig={"subnetIds": nets})
    assert world.kube is not None
    world.front._simulators["exploding"] = _Exploding()  # ticks before nothing else in particular; raises
    try:
        world.advance(CLUSTER_CREATE_SECONDS)  # must not raise
        assert eks.describe_cluster(name=name)["cluster"]["status"] == "ACTIVE"
        # an add-on whose install fails (its namespace is Terminating) fails; the cluster keeps ticking
        kube = world.kube.cluster(name)
        kube.create(kube.builtin("", "namespaces"), None, {"metadata": {"name": "cert-manager"}}, WriteOptions())
        kube.create(kube.builtin("", "configmaps"), "cert-manager",
                    {"metadata": {"name": "held", "finalizers": ["example.com/hold"]}}, WriteOptions())
        deletion.delete(kube, kube.builtin("", "namespaces"), None, "cert-manager")
        eks.create_addon(clusterName=name, addonName="cert-manager")
        other = unique("tick")
        eks.create_cluster(name=other, roleArn=ROLE, resourcesVpcConfig={"subnetIds": nets})
        world.advance(ADDON_SECONDS)
        addon = eks.describe_addon(clusterName=name, addonName="cert-manager")["addon"]
        assert addon["status"] == "CREATE_FAILED"
        assert addon["health"]["issues"][0]["code"] == "ConfigurationConflict"
        world.advance(CLUSTER_CREATE_SECONDS)
        assert eks.describe_cluster(name=other)["cluster"]["status"] == "ACTIVE"
    finally:
        del world.front._simulators["exploding"]


def test_the_ticker_thread_survives_a_failing_tick(kube: BackgroundServer) -> None:
    from sandbox.aws import world as world_module

    aws = AwsWorld(None, None, kube.emulator, kube_base_url=kube.base_url, kube_ca_pem=b"")
    aws.front._simulators["exploding"] = _Exploding()
    ticks = []
    aws.quotas.tick = lambda now: ticks.append(now)  # type: ignore[method-assign]
    aws.start()
    try:
        wait_until(lambda: len(ticks) >= 3, 30, "three ticks despite the failing simulator",
                   interval=world_module.TICK_SECONDS)
        assert aws._ticker is not None and aws._ticker.is_alive()
    finally:
        aws.stop()


def test_hyperpod_never_recreates_a_deleted_eks_cluster(kube: BackgroundServer) -> None:
    from sandbox.aws.hyperpod_nodes import KubeNodes
    from sandbox.aws.hyperpod_state import ClusterRec

    rec = ClusterRec.__new__(ClusterRec)
    rec.kube_cluster = "deleted-eks-cluster"
    assert KubeNodes(kube.emulator, "us-west-2")._cluster(rec) is None
    assert "deleted-eks-cluster" not in kube.emulator.clusters


def test_reads_are_not_replayed_and_parallel_creates_keep_their_ids(kube: BackgroundServer, tmp_path: Path) -> None:
    first = new_world(kube, tmp_path)
    try:
        clients = [make_client(first, "ec2") for _ in range(12)]
        for _ in range(150):  # a dashboard polling: none of this may be replayed
            clients[0].describe_vpcs()
        with pytest.raises(ClientError):  # a failed mutation is not logged either
            clients[0].create_vpc(CidrBlock="not-a-cidr")
        with ThreadPoolExecutor(12) as pool:
            before = dict(pool.map(lambda i: (f"10.{i}.0.0/16", clients[i].create_vpc(
                CidrBlock=f"10.{i}.0.0/16")["Vpc"]["VpcId"]), range(12)))
        s3 = make_client(first, "s3")
        s3.create_bucket(Bucket="big", CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
        s3.put_object(Bucket="big", Key="blob", Body=b"x" * (BODY_INLINE_LIMIT + 1))
        clients[0].describe_vpcs()
    finally:
        first.stop()
    log = (tmp_path / "aws" / "moto-requests.jsonl").read_text().splitlines()
    assert len(log) == 12 + 2
    assert len(list((tmp_path / "aws" / "moto-bodies").iterdir())) == 1
    assert all(len(line) < 100_000 for line in log)

    second = new_world(kube, tmp_path)  # start-up time with a replay is measured in bench/startup.py
    try:
        assert second.moto.replayed == 14
        after = {v["CidrBlock"]: v["VpcId"] for v in make_client(second, "ec2").describe_vpcs()["Vpcs"]}
        assert {cidr: after.get(cidr) for cidr in before} == before
        body = make_client(second, "s3").get_object(Bucket="big", Key="blob")["Body"].read()
        assert len(body) == BODY_INLINE_LIMIT + 1
    finally:
        second.stop()


def test_a_sped_up_clock_never_goes_back_across_a_restart(kube: BackgroundServer, tmp_path: Path) -> None:
    def world() -> AwsWorld:
        return AwsWorld(tmp_path, RealClock(speed=10_000), kube.emulator, kube_base_url=kube.base_url,
                        kube_ca_pem=b"")

    first = world()
    wait_until(lambda: first.clock.now() > time.time() + 1000, 30, "the sped-up clock running ahead")
    first.save()
    saved = json.loads((tmp_path / "aws" / "clock.json").read_text())["now"]
    assert saved > time.time() + 1000
    second = world()  # restored from clock.json without being started
    assert second.clock.now() >= saved


def test_the_kubeconfig_written_for_an_active_cluster_trusts_the_emulator_ca(tmp_path: Path, kube_ca: bytes) -> None:
    emulator = Emulator(tmp_path)
    aws = AwsWorld(tmp_path, ManualClock(), emulator, kube_base_url="https://127.0.0.1:1",
                   kube_ca_pem=kube_ca).start(ticker=False)
    try:
        standard_roles(aws)
        make_client(aws, "eks").create_cluster(name="tls", roleArn=ROLE,
                                               resourcesVpcConfig={"subnetIds": subnets(make_client(aws, "ec2"))})
        aws.advance(CLUSTER_CREATE_SECONDS)
        written = yaml.safe_load((tmp_path / "kube" / "kubeconfig-tls.yaml").read_text())
        entry = written["clusters"][0]["cluster"]
        assert entry["server"] == "https://127.0.0.1:1/k8s/clusters/tls"
        assert base64.b64decode(entry["certificate-authority-data"]) == kube_ca
    finally:
        aws.stop()
        emulator.close()


def test_s3_objects_over_100_mib_can_be_downloaded(aws: Clients, unique: Callable[[str], str]) -> None:
    s3 = aws("s3")
    bucket = unique("big")
    s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    size = 101 * 1024 * 1024
    s3.put_object(Bucket=bucket, Key="weights.bin", Body=b"\0" * size)
    assert s3.head_object(Bucket=bucket, Key="weights.bin")["ContentLength"] == size
    assert len(s3.get_object(Bucket=bucket, Key="weights.bin")["Body"].read()) == size
    s3.delete_object(Bucket=bucket, Key="weights.bin")
