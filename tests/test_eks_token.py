"""The sandbox emulator's check of EKS presigned tokens, against tokens made by the product's own code."""

from __future__ import annotations

import time

import boto3

from sandbox.aws.eks_token import MAX_AGE, verify_eks_token
from services.aws import AwsClients
from services.kube import eks_token

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
