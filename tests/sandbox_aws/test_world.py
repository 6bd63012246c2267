"""The world's lifecycle: state surviving a restart (simulators and moto), and the background ticker."""

from __future__ import annotations

from pathlib import Path

from sandbox.aws import AwsWorld, RealClock
from sandbox.aws.eks import CLUSTER_CREATE_SECONDS
from sandbox.kube import BackgroundServer
from tests.sandbox_aws.conftest import ROLE, make_client, new_world, standard_roles, subnets
from tests.support import wait_until


def test_state_survives_a_restart(kube: BackgroundServer, tmp_path: Path) -> None:
    first = new_world(kube, tmp_path)
    try:
        ec2 = make_client(first, "ec2")
        nets = subnets(ec2)
        vpc = ec2.describe_subnets(SubnetIds=nets)["Subnets"][0]["VpcId"]
        make_client(first, "iam").create_role(RoleName="kept", AssumeRolePolicyDocument="{}")
        standard_roles(first)
        eks = make_client(first, "eks")
        eks.create_cluster(name="kept-eks", roleArn=ROLE, resourcesVpcConfig={"subnetIds": nets},
                           accessConfig={"authenticationMode": "API"})
        first.advance(CLUSTER_CREATE_SECONDS)
        eks.create_addon(clusterName="kept-eks", addonName="coredns")
        first.quotas.set_limit("ml.p5.48xlarge", 4)
        fs_id = make_client(first, "fsx").create_file_system(
            FileSystemType="LUSTRE", StorageCapacity=1200, SubnetIds=nets[:1])["FileSystem"]["FileSystemId"]
    finally:
        first.stop()
    assert {p.name for p in (tmp_path / "aws").iterdir()} >= {"eks.json", "fsx.json", "service-quotas.json",
                                                             "moto-requests.jsonl"}

    second = new_world(kube, tmp_path)
    try:
        eks = make_client(second, "eks")
        assert eks.describe_cluster(name="kept-eks")["cluster"]["status"] == "ACTIVE"
        assert eks.describe_addon(clusterName="kept-eks", addonName="coredns")["addon"]["status"] == "CREATING"
        assert second.quotas.limit("ml.p5.48xlarge") == 4
        fsx = make_client(second, "fsx").describe_file_systems(FileSystemIds=[fs_id])["FileSystems"][0]
        assert fsx["VpcId"] == vpc
        ec2 = make_client(second, "ec2")
        assert ec2.describe_subnets(SubnetIds=nets)["Subnets"][0]["VpcId"] == vpc  # same ids after replay
        assert make_client(second, "iam").get_role(RoleName="kept")["Role"]["RoleName"] == "kept"
    finally:
        second.stop()


def test_ticker_moves_a_sped_up_clock(kube: BackgroundServer) -> None:
    world = AwsWorld(None, RealClock(speed=2000), kube.emulator, kube_base_url=kube.base_url,
                     kube_ca_pem=b"").start()
    try:
        eks = make_client(world, "eks")
        standard_roles(world)
        eks.create_cluster(name="ticked", roleArn=ROLE, resourcesVpcConfig={"subnetIds": subnets(make_client(
            world, "ec2"))})
        wait_until(lambda: eks.describe_cluster(name="ticked")["cluster"]["status"] == "ACTIVE", 30,
                   "the ticker moving the cluster to ACTIVE")
        info = world.info()
        assert info["aws_endpoint_url"] == world.endpoint_url and info["account_id"] == "123456789012"
        assert "CreateCluster" in info["simulated"]["eks"]
    finally:
        world.stop()
