"""The sandbox emulator's check of EKS presigned tokens, against tokens made by the product's own code and
by the real ``aws eks update-kubeconfig`` / ``aws eks get-token`` flow with kubectl."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import boto3
import pytest
import yaml

from app.sandbox import SANDBOX_ACCESS_KEY, aws_endpoint, sandbox_secret_key
from sandbox.aws.eks_token import MAX_AGE, verify_eks_token
from services.aws import AwsClients
from services.kube import eks_token
from services.settings import Settings
from tests.sandbox_support import EKS_TRUST
from tests.support import clean_env, free_port, start_server, wait_until

KEYS = {"AKIAEXAMPLEEXAMPLE01": "the-secret"}
HOST = "127.0.0.1:4566"


def token_for(cluster: str, secret: str = "the-secret", endpoint: str = f"http://{HOST}") -> str:
    session = boto3.Session(aws_access_key_id="AKIAEXAMPLEEXAMPLE01", aws_secret_access_key=secret,
                            region_name="us-west-2")
    return eks_token(AwsClients("us-west-2", endpoint, session=session), cluster)


def test_accepts_only_its_cluster_its_key_its_sts_and_fresh_tokens() -> None:
    token = token_for("prod")
    assert verify_eks_token(token, "prod", KEYS, hosts={HOST})
    assert not verify_eks_token(token, "staging", KEYS, hosts={HOST}), "signed for another cluster"
    assert not verify_eks_token(token_for("prod", secret="guessed"), "prod", KEYS, hosts={HOST})
    assert not verify_eks_token(token_for("prod", endpoint="http://127.0.0.1:9999"), "prod", KEYS, hosts={HOST})
    assert not verify_eks_token(token, "prod", KEYS, hosts={HOST}, now=lambda: time.time() + MAX_AGE + 60)
    for junk in ("", "k8s-aws-v1.", "k8s-aws-v1.!!!", "Bearer x", token.replace("k8s-aws-v1.", "k8s-aws-v2.")):
        assert not verify_eks_token(junk, "prod", KEYS, hosts={HOST})


def test_real_sts_endpoints_sign_the_same_way() -> None:
    token = token_for("prod", endpoint="https://sts.us-west-2.amazonaws.com")
    assert verify_eks_token(token, "prod", KEYS, hosts={"sts.us-west-2.amazonaws.com"})


def test_aws_sts_hostnames_are_accepted_as_eks_does() -> None:
    for endpoint in ("https://sts.us-west-2.amazonaws.com", "https://sts.amazonaws.com"):
        assert verify_eks_token(token_for("prod", endpoint=endpoint), "prod", KEYS, hosts={HOST}), endpoint
    assert not verify_eks_token(token_for("prod", endpoint="https://sts.eu-west-1.amazonaws.com"), "prod", KEYS,
                                hosts={HOST}), "host of another region than the signature's"
    assert not verify_eks_token(token_for("prod", endpoint="https://sts.example.com"), "prod", KEYS, hosts={HOST})


@pytest.mark.slow
def test_aws_eks_update_kubeconfig_then_kubectl(tmp_path: Path) -> None:
    """The README's flow: `aws eks update-kubeconfig` against the sandbox, then plain kubectl."""
    aws_cli, kubectl = shutil.which("aws"), shutil.which("kubectl")
    if aws_cli is None:
        pytest.skip("the `aws` CLI is not on PATH: install it in its own virtual environment "
                    "(python3 -m venv ~/.aws-cli && ~/.aws-cli/bin/pip install awscli) to run this check")
    assert kubectl, "kubectl must be on PATH"
    env = {"INSTANTSTART_SANDBOX_SPEED": "3000", "INSTANTSTART_SANDBOX_AWS_PORT": str(free_port()),
           "INSTANTSTART_SANDBOX_KUBE_PORT": str(free_port())}
    live = start_server(tmp_path / "data", env=env)
    try:
        settings = Settings(data_dir=live.data_dir, sandbox=True,
                            sandbox_aws_port=int(env["INSTANTSTART_SANDBOX_AWS_PORT"]),
                            sandbox_kube_port=int(env["INSTANTSTART_SANDBOX_KUBE_PORT"]))
        endpoint, secret = aws_endpoint(settings), sandbox_secret_key(settings)
        session = boto3.Session(aws_access_key_id=SANDBOX_ACCESS_KEY, aws_secret_access_key=secret,
                                region_name="us-west-2")
        ec2, eks = session.client("ec2", endpoint_url=endpoint), session.client("eks", endpoint_url=endpoint)
        vpc = ec2.create_vpc(CidrBlock="10.8.0.0/16")["Vpc"]["VpcId"]
        subnets = [ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.8.{i}.0/24", AvailabilityZone=f"us-west-2{z}")
                   ["Subnet"]["SubnetId"] for i, z in ((1, "a"), (2, "b"))]
        role = session.client("iam", endpoint_url=endpoint).create_role(
            RoleName="eks", AssumeRolePolicyDocument=EKS_TRUST)["Role"]["Arn"]
        eks.create_cluster(name="demo", roleArn=role, resourcesVpcConfig={"subnetIds": subnets})
        wait_until(lambda: eks.describe_cluster(name="demo")["cluster"]["status"] == "ACTIVE", 60, "EKS ACTIVE")

        # the user's shell: the sandbox's credentials and region, no endpoint variable, no AWS config files
        user = clean_env(AWS_ACCESS_KEY_ID=SANDBOX_ACCESS_KEY, AWS_SECRET_ACCESS_KEY=secret,
                         AWS_DEFAULT_REGION="us-west-2", AWS_CONFIG_FILE=str(tmp_path / "none"),
                         AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"))
        kubeconfig = tmp_path / "kubeconfig"
        made = subprocess.run([aws_cli, "--endpoint-url", endpoint, "eks", "update-kubeconfig", "--name", "demo",
                               "--kubeconfig", str(kubeconfig)], env=user, capture_output=True, text=True, timeout=120)
        assert made.returncode == 0, made.stderr
        cluster = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]
        assert cluster["server"] == eks.describe_cluster(name="demo")["cluster"]["endpoint"]

        def kubectl_as(environment: dict[str, str]) -> subprocess.CompletedProcess[str]:
            return subprocess.run([kubectl, "--kubeconfig", str(kubeconfig), "--cache-dir", str(tmp_path / "cache"),
                                   "get", "namespaces", "-o", "name"], env=environment, capture_output=True,
                                  text=True, timeout=120)

        got = kubectl_as(user)
        assert got.returncode == 0, got.stderr
        assert "namespace/kube-system" in got.stdout.split()
        with_endpoint = kubectl_as({**user, "AWS_ENDPOINT_URL": endpoint})  # token presigned for the sandbox's STS
        assert with_endpoint.returncode == 0, with_endpoint.stderr
        other = kubectl_as({**user, "AWS_SECRET_ACCESS_KEY": "not-the-sandbox-secret"})
        assert other.returncode != 0 and "Unauthorized" in other.stderr + other.stdout
    finally:
        live.stop()
