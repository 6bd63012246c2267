"""The sandbox AWS world inside `instantstart serve`: boto3 against its endpoint creates EKS and HyperPod,
the nodes show in kubectl, the product's own EKS client path reaches them, and faults injected over REST
drive HyperPod's automatic recovery."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx2
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from kubernetes import client as k8s

from app.sandbox import aws_endpoint, aws_session
from services.aws import AwsClients
from services.clock import Clock
from services.errors import Unauthorized
from services.kube import KubeClients
from services.settings import Settings
from tests.support import ROOT, LiveServer, free_port, start_server, wait_until

pytestmark = pytest.mark.slow
HEALTH = "sagemaker.amazonaws.com/node-health-status"


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, dict[str, str]]]:
    env = {"INSTANTSTART_SANDBOX": "true", "INSTANTSTART_SANDBOX_SPEED": "3000",
           "INSTANTSTART_SANDBOX_AWS_PORT": str(free_port()), "INSTANTSTART_SANDBOX_KUBE_PORT": str(free_port())}
    live = start_server(tmp_path_factory.mktemp("sandbox") / "data", env=env)
    yield live, env
    live.stop()


def settings_for(live: LiveServer, env: dict[str, str]) -> Settings:
    return Settings(data_dir=live.data_dir, sandbox_aws_port=int(env["INSTANTSTART_SANDBOX_AWS_PORT"]),
                    sandbox_kube_port=int(env["INSTANTSTART_SANDBOX_KUBE_PORT"]))


def until(read: Callable[[], Any], ok: Callable[[Any], bool], timeout: float = 30) -> Any:
    """``read()`` once ``ok`` holds for it (waited on with :func:`tests.support.wait_until`)."""
    def check() -> list[Any]:
        value = read()
        assert ok(value), f"last seen: {value!r}"  # reported by wait_until if it never holds
        return [value]

    return wait_until(check, timeout, "reaching the expected state")[0]


def test_eks_then_hyperpod_nodes_in_kubectl_and_recovery(sandbox: tuple[LiveServer, dict[str, str]],
                                                        tmp_path: Path) -> None:
    live, env = sandbox
    settings = settings_for(live, env)
    kw: dict[str, Any] = {"endpoint_url": aws_endpoint(settings), "region_name": "us-west-2",
                          "aws_access_key_id": "anything", "aws_secret_access_key": "anything",
                          "config": Config(retries={"total_max_attempts": 1})}
    ec2, eks, sm, iam, s3 = (boto3.client(s, **kw) for s in ("ec2", "eks", "sagemaker", "iam", "s3"))
    vpc = ec2.create_vpc(CidrBlock="10.7.0.0/16")["Vpc"]["VpcId"]
    subnets = [ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.7.{i}.0/24", AvailabilityZone=f"us-west-2{z}")
               ["Subnet"]["SubnetId"] for i, z in ((1, "a"), (2, "b"))]
    sg = ec2.create_security_group(GroupName="hp-nodes", Description="HyperPod nodes", VpcId=vpc)["GroupId"]
    s3.create_bucket(Bucket="bucket", CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole", "Principal": {
        "Service": ["eks.amazonaws.com", "sagemaker.amazonaws.com"]}}]}  # the EKS cluster role and HyperPod's
    role = iam.create_role(RoleName="hp-exec", AssumeRolePolicyDocument=json.dumps(trust))["Role"]["Arn"]
    arn = eks.create_cluster(name="hp-eks", roleArn=role, resourcesVpcConfig={"subnetIds": subnets},
                             accessConfig={"authenticationMode": "API_AND_CONFIG_MAP"})["cluster"]["arn"]
    until(lambda: eks.describe_cluster(name="hp-eks")["cluster"]["status"], lambda s: s == "ACTIVE")

    with pytest.raises(ClientError) as bad:
        sm.create_cluster(ClusterName="hp", NodeRecovery="Sometimes")
    assert bad.value.response["Error"]["Code"] == "ValidationException"
    sm.create_cluster(
        ClusterName="hp", Orchestrator={"Eks": {"ClusterArn": arn}}, NodeRecovery="Automatic",
        InstanceGroups=[{"InstanceGroupName": "workers", "InstanceType": "ml.g5.8xlarge", "InstanceCount": 2,
                         "ExecutionRole": role,
                         "LifeCycleConfig": {"SourceS3Uri": "s3://bucket/lcc/", "OnCreate": "on_create.sh"}}],
        VpcConfig={"SecurityGroupIds": [sg], "Subnets": subnets})
    until(lambda: sm.describe_cluster(ClusterName="hp")["ClusterStatus"], lambda s: s == "InService")
    nodes = [n["InstanceId"] for n in sm.list_cluster_nodes(ClusterName="hp")["ClusterNodeSummaries"]]
    assert len(nodes) == 2

    # kubectl against the emulator, through `instantstart kubeconfig`
    kubeconfig = tmp_path / "kc.yaml"
    made = subprocess.run([sys.executable, "-m", "app.cli", "kubeconfig", "hp-eks", "--data-dir", str(live.data_dir),
                           "-o", str(kubeconfig)], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})
    assert made.returncode == 0, made.stderr
    assert shutil.which("kubectl"), "kubectl must be on PATH"
    shown = until(lambda: subprocess.run(
        ["kubectl", "--kubeconfig", str(kubeconfig), "--cache-dir", str(tmp_path / "cache"), "get", "nodes",
         "-L", HEALTH, "--no-headers"], capture_output=True, text=True, timeout=60).stdout,
        lambda out: out.count("Schedulable") == 2)
    assert all(f"hyperpod-{n}" in shown for n in nodes)

    # the product's own EKS path: DescribeCluster -> endpoint + CA, presigned STS token checked by the emulator
    aws = AwsClients(settings.region, aws_endpoint(settings), session=aws_session(settings))
    kube = KubeClients(aws, Clock(), ca_dir=tmp_path / "ca")
    kube.register_eks("prod", "hp-eks")
    names = {n.metadata.name for n in k8s.CoreV1Api(kube.api_client("prod")).list_node().items}
    assert names == {f"hyperpod-{n}" for n in nodes}
    bad_kube = KubeClients(AwsClients(settings.region, aws_endpoint(settings),
                                      session=boto3.Session(aws_access_key_id="AKIAOTHER", aws_secret_access_key="x",
                                                            region_name="us-west-2")), Clock(), ca_dir=tmp_path / "ca2")
    bad_kube.register_eks("prod", "hp-eks")
    with pytest.raises(Unauthorized) as refused:  # the adapter classifies the ApiException by status
        k8s.CoreV1Api(bad_kube.api_client("prod")).list_node()
    assert refused.value.details["http_status"] == 401  # a token signed with other credentials

    # a node fault over REST: labels flip, automatic recovery replaces the node
    viewer = live.make_token("viewer")
    assert live.post("/api/v1/sandbox/faults", {"kind": "node_unhealthy", "target": {"cluster": "hp"}},
                     token=viewer).status_code == 403
    r = live.post("/api/v1/sandbox/faults", {"kind": "node_unhealthy", "target": {"cluster": "hp", "node": nodes[0]}})
    assert r.status_code == 201, r.text
    after = until(lambda: {n["InstanceId"] for n in sm.list_cluster_nodes(ClusterName="hp")["ClusterNodeSummaries"]},
                  lambda ids: nodes[0] not in ids and len(ids) == 2)
    replacement = (after - {nodes[1]}).pop()
    until(lambda: {n.metadata.name: n.metadata.labels.get(HEALTH) for n in
                   k8s.CoreV1Api(kube.api_client("prod")).list_node().items},
          lambda labels: labels.get(f"hyperpod-{replacement}") == "Schedulable"
          and f"hyperpod-{nodes[0]}" not in labels)
    audit = live.get("/api/v1/audit?action=sandbox.fault.inject").json()
    assert audit and audit[0]["outcome"] == "succeeded"


def test_sandbox_info_from_rest_and_from_the_data_dir_agree(sandbox: tuple[LiveServer, dict[str, str]]) -> None:
    live, env = sandbox
    served = live.get("/api/v1/sandbox").json()
    assert {"CreateCluster", "BatchReplaceClusterNodes"} <= set(served["simulated"]["sagemaker"])
    local = subprocess.run([sys.executable, "-m", "app.cli", "sandbox", "info", "--json", "--data-dir",
                            str(live.data_dir)], cwd=ROOT, capture_output=True, text=True, timeout=60,
                           env={**{k: v for k, v in os.environ.items() if k != "INSTANTSTART_URL"}, **env})
    assert local.returncode == 0, local.stderr
    offline = json.loads(local.stdout)
    for key in ("aws_endpoint_url", "region", "account_id", "kubeconfigs"):
        assert offline[key] == served[key], key
    assert offline["account_id"] == "123456789012"
    for path in offline["kubeconfigs"].values():
        assert Path(path).is_file()
    assert "account 123456789012" in live.log() and "kubeconfigs in" in live.log()


def test_sandbox_routes_are_tools_and_validate(sandbox: tuple[LiveServer, dict[str, str]]) -> None:
    live, _ = sandbox
    document = live.get("/api/v1/openapi.json").json()
    assert document["paths"]["/api/v1/sandbox/faults"]["post"]["x-mcp-tool"]["name"] == "sandbox_faults_inject"
    r = live.post("/api/v1/sandbox/faults", {"kind": "throttle", "target": {"service": "eks", "bogus": "x"}})
    assert r.status_code == 422 and "unknown keys ['bogus']" in r.json()["error"]["message"]
    made = live.post("/api/v1/sandbox/faults", {"kind": "throttle", "target": {"service": "eks"}, "count": 2}).json()
    listed = live.get("/api/v1/sandbox/faults").json()
    assert [f["id"] for f in listed] == [made["id"]] and listed[0]["remaining"] == 2
    cleared = httpx2.delete(f"{live.url}/api/v1/sandbox/faults/all", headers=live.headers())
    assert cleared.status_code == 200 and cleared.json() == []


def test_sandbox_cli_injects_lists_and_clears(sandbox: tuple[LiveServer, dict[str, str]]) -> None:
    live, _ = sandbox

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "app.cli", "sandbox", *args, "--url", live.url,
                               "--token", live.admin_token], cwd=ROOT, capture_output=True, text=True, timeout=60)

    made = cli("inject", "quota_exhausted", "--target", "instance_type=ml.p5.48xlarge")
    assert made.returncode == 0, made.stderr
    fault_id = made.stdout.split()[1]
    assert f"{fault_id}  quota_exhausted  instance_type=ml.p5.48xlarge" in cli("faults").stdout
    info = cli("info", "--json")
    assert info.returncode == 0 and json.loads(info.stdout)["simulated"]["sagemaker"]
    refused = cli("inject", "throttle", "--target", "operation=ListClusters")
    assert refused.returncode == 1 and "needs target keys ['service']" in refused.stderr
    assert cli("clear", fault_id).returncode == 0
    assert cli("faults").stdout.startswith("no faults injected")
    assert "404" in cli("clear", fault_id).stderr
