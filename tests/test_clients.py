"""AWS and Kubernetes client factories: endpoints, user agent, per-cluster clients, EKS tokens and their cache."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
import yaml
from kubernetes import client as k8s
from moto import mock_aws

from services.aws import AwsClients
from services.clock import FakeClock
from services.errors import NotFound
from services.kube import TOKEN_LIFETIME, KubeClients


@pytest.fixture(autouse=True)
def fake_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-west-2"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


def test_aws_clients_are_cached_and_carry_region_endpoint_and_user_agent() -> None:
    aws = AwsClients("eu-west-1", endpoint_url="http://127.0.0.1:5999")
    sts = aws.client("sts")
    assert sts is aws.client("sts") and sts is not aws.client("sts", "us-east-1")
    assert sts.meta.region_name == "eu-west-1" and sts.meta.endpoint_url == "http://127.0.0.1:5999"
    assert "instantstart/" in sts.meta.config.user_agent_extra
    assert sts.meta.config.retries["mode"] == "standard"


def write_kubeconfig(path: Path, server: str, token: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))
    return path


def test_kubeconfig_clusters_are_independent_and_leave_the_global_default_alone(tmp_path: Path) -> None:
    before = k8s.Configuration.get_default_copy().host
    kube = KubeClients(AwsClients("us-west-2"), FakeClock(), ca_dir=tmp_path)
    kube.register_kubeconfig("one", write_kubeconfig(tmp_path / "one.yaml", "http://127.0.0.1:7001/k8s/one", "t1"))
    kube.register_kubeconfig("two", write_kubeconfig(tmp_path / "two.yaml", "http://127.0.0.1:7002", "t2"))
    one, two = kube.api_client("one"), kube.api_client("two")
    assert one.configuration.host == "http://127.0.0.1:7001/k8s/one"
    assert two.configuration.host == "http://127.0.0.1:7002"
    assert one.configuration.auth_settings()["BearerToken"]["value"] == "Bearer t1"
    assert kube.api_client("one") is one
    assert k8s.Configuration.get_default_copy().host == before
    assert kube.clusters() == ["one", "two"]
    kube.forget("two")
    with pytest.raises(NotFound):
        kube.api_client("two")


def test_eks_client_from_describe_cluster_with_presigned_token_refreshed_before_expiry(tmp_path: Path) -> None:
    with mock_aws():
        aws = AwsClients("us-west-2")
        iam = aws.client("iam")
        role = iam.create_role(RoleName="eks", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
        eks = aws.client("eks")
        eks.create_cluster(name="hp-eks", roleArn=role, resourcesVpcConfig={"subnetIds": []})
        described = eks.describe_cluster(name="hp-eks")["cluster"]
        clock = FakeClock()
        kube = KubeClients(aws, clock, ca_dir=tmp_path)
        kube.register_eks("prod", "hp-eks")
        api = kube.api_client("prod")
        assert api.configuration.host == described["endpoint"]
        assert os.path.exists(api.configuration.ssl_ca_cert)
        header = api.configuration.auth_settings()["BearerToken"]
        assert header["key"] == "authorization" and header["value"].startswith("Bearer k8s-aws-v1.")
        token = header["value"].removeprefix("Bearer ")
        url = base64.urlsafe_b64decode(token.removeprefix("k8s-aws-v1.") + "==").decode()
        query = parse_qs(urlparse(url).query)
        assert query["Action"] == ["GetCallerIdentity"] and query["X-Amz-Expires"] == ["60"]
        assert "x-k8s-aws-id" in query["X-Amz-SignedHeaders"][0]
        clock.advance(TOKEN_LIFETIME - 120)
        assert kube.api_client("prod") is api, "cached while the token is fresh"
        clock.advance(90)
        assert kube.api_client("prod") is not api, "rebuilt shortly before the token expires"
