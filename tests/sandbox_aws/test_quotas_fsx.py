"""Service Quotas for HyperPod cluster usage, and FSx for Lustre's lifecycle and validation."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError

from sandbox.aws import AwsWorld
from sandbox.aws.fsx import CREATE_SECONDS, DELETE_SECONDS
from sandbox.aws.quotas import quota_code
from tests.sandbox_aws.conftest import Clients, error_code, subnets

P5 = quota_code("ml.p5.48xlarge for cluster usage")
G5 = quota_code("ml.g5.8xlarge for cluster usage")


def test_cluster_usage_quotas(world: AwsWorld, aws: Clients) -> None:
    sq = aws("service-quotas")
    pages = sq.get_paginator("list_service_quotas").paginate(ServiceCode="sagemaker", PaginationConfig={"PageSize": 50})
    quotas = {q["QuotaName"]: q for page in pages for q in page["Quotas"]}
    assert len(quotas) == 209 + 2
    assert quotas["ml.p5.48xlarge for cluster usage"]["Value"] == 0.0
    assert quotas["ml.g5.8xlarge for cluster usage"]["Value"] == 4.0
    assert quotas["ml.t3.medium for cluster usage"]["Value"] == 10.0
    quota = sq.get_service_quota(ServiceCode="sagemaker", QuotaCode=G5)["Quota"]
    assert quota["QuotaName"] == "ml.g5.8xlarge for cluster usage" and quota["Adjustable"] is True
    assert world.quotas.limit("ml.g5.8xlarge") == 4


def test_quota_exhausted_fault_and_increase(world: AwsWorld, aws: Clients) -> None:
    sq = aws("service-quotas")
    fault = world.faults.inject("quota_exhausted", {"instance_type": "ml.g5.8xlarge"})
    assert sq.get_service_quota(ServiceCode="sagemaker", QuotaCode=G5)["Quota"]["Value"] == 0.0
    assert sq.get_aws_default_service_quota(ServiceCode="sagemaker", QuotaCode=G5)["Quota"]["Value"] == 4.0
    assert world.quotas.limit("ml.g5.8xlarge") == 0
    world.faults.clear(fault.id)
    world.quotas.set_limit("ml.p5.48xlarge", 2)
    assert sq.get_service_quota(ServiceCode="sagemaker", QuotaCode=P5)["Quota"]["Value"] == 2.0
    world.quotas.set_limit("ml.p5.48xlarge", 0)


def test_quota_errors(aws: Clients) -> None:
    sq = aws("service-quotas")
    with pytest.raises(ClientError) as info:
        sq.get_service_quota(ServiceCode="ec2", QuotaCode="L-1216C47A")
    assert error_code(info.value) == "NoSuchResourceException"
    with pytest.raises(ClientError) as info:
        sq.get_service_quota(ServiceCode="sagemaker", QuotaCode="L-00000000")
    assert error_code(info.value) == "NoSuchResourceException"


def test_fsx_lustre_lifecycle(world: AwsWorld, aws: Clients) -> None:
    fsx = aws("fsx")
    subnet = subnets(aws("ec2"), 1)[0]
    created = fsx.create_file_system(FileSystemType="LUSTRE", StorageCapacity=2400, SubnetIds=[subnet],
                                     LustreConfiguration={"DeploymentType": "PERSISTENT_2",
                                                          "PerUnitStorageThroughput": 250,
                                                          "DataCompressionType": "LZ4"})["FileSystem"]
    fs_id = created["FileSystemId"]
    assert created["Lifecycle"] == "CREATING" and created["VpcId"].startswith("vpc-")
    mount = created["LustreConfiguration"]["MountName"]
    assert len(mount) == 8 and created["DNSName"] == f"{fs_id}.fsx.us-west-2.amazonaws.com"
    with pytest.raises(ClientError) as info:
        fsx.delete_file_system(FileSystemId=fs_id)
    assert error_code(info.value) == "BadRequest"
    world.advance(CREATE_SECONDS)
    described = fsx.describe_file_systems(FileSystemIds=[fs_id])["FileSystems"][0]
    assert described["Lifecycle"] == "AVAILABLE" and described["LustreConfiguration"]["MountName"] == mount
    assert fsx.delete_file_system(FileSystemId=fs_id)["Lifecycle"] == "DELETING"
    world.advance(DELETE_SECONDS)
    with pytest.raises(ClientError) as info:
        fsx.describe_file_systems(FileSystemIds=[fs_id])
    assert error_code(info.value) == "FileSystemNotFound"


@pytest.mark.parametrize(("capacity", "lustre", "code"), [
    (1000, {"DeploymentType": "PERSISTENT_2", "PerUnitStorageThroughput": 125}, "BadRequest"),
    (3600, {"DeploymentType": "SCRATCH_2"}, "BadRequest"),
    (1200, {"DeploymentType": "PERSISTENT_2", "PerUnitStorageThroughput": 200}, "InvalidPerUnitStorageThroughput"),
    (1200, {"DeploymentType": "PERSISTENT_2"}, "BadRequest"),
    (1200, {"DeploymentType": "SCRATCH_9"}, "ValidationException"),
    (1200, {"DeploymentType": "SCRATCH_2", "PerUnitStorageThroughput": 5000}, "ValidationException"),
])
def test_fsx_capacity_and_throughput_rules(aws: Clients, capacity: int, lustre: dict[str, object],
                                           code: str) -> None:
    with pytest.raises(ClientError) as info:
        aws("fsx").create_file_system(FileSystemType="LUSTRE", StorageCapacity=capacity,
                                      SubnetIds=["subnet-0123456789abcdef0"], LustreConfiguration=lustre)
    assert error_code(info.value) == code


def test_fsx_scratch_sizes_and_unknown_subnet(aws: Clients) -> None:
    fsx = aws("fsx")
    subnet = subnets(aws("ec2"), 1)[0]
    created = fsx.create_file_system(FileSystemType="LUSTRE", StorageCapacity=3600, SubnetIds=[subnet])["FileSystem"]
    assert created["LustreConfiguration"]["MountName"] == "fsx"
    with pytest.raises(ClientError) as info:
        fsx.create_file_system(FileSystemType="LUSTRE", StorageCapacity=1200, SubnetIds=["subnet-0123456789abcdef0"])
    assert error_code(info.value) == "InvalidNetworkSettings"
