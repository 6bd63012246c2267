"""What the managed-endpoint test modules share: a world (a seeded, imported cluster of three ml.g5.8xlarge nodes)
whose inference operator CRDs arrive with the first test that asks for :func:`operator`, the request shapes, and
readers of what the operator and KEDA made."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from kubernetes import client as k8s

from tests.jobs_support import CLUSTER, JobWorld, job_world
from tests.ledger import CallLedger

BASE = f"/api/v1/clusters/{CLUSTER}/inference/endpoints"
NS = "hyperpod-ns-inference"
GROUP, VERSION = "inference.sagemaker.aws.amazon.com", "v1"
WORKER = {"image": "lmcache/vllm-openai:v0.3.7", "args": ["/opt/ml/model", "--max-model-len", "4096"], "port": 8000,
          "gpus": 1}
KINDS = ("managed.deploy", "managed.update", "managed.delete")
S3 = {"type": "s3", "bucket": "models-bucket", "region": "us-west-2", "location": "llama31_8b"}
EXTERNAL_METRICS = "v1beta1.external.metrics.k8s.io"
#: the simulated vLLM's completed-requests counter, over the endpoint's pods (their `app` label is its name); at the
#: tests' clock (500x) a 600 s polling interval is about a second and any test call crosses 1 request per 1000 s
RATE_QUERY = 'sum(rate(vllm:request_success_total{{namespace="{ns}",app="{name}"}}[1m]))'
#: what the product writes when it installs KEDA (services/components/manifests/keda.yaml, CRDs from the registry)
KEDA_OBJECTS = {("deployments.apps", "keda", "keda-operator"),
                ("customresourcedefinitions.apiextensions.k8s.io", None, "scaledobjects.keda.sh"),
                ("customresourcedefinitions.apiextensions.k8s.io", None, "triggerauthentications.keda.sh"),
                ("apiservices.apiregistration.k8s.io", None, EXTERNAL_METRICS)}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JobWorld]:
    """One per test module that imports it. The operator's CRDs arrive with the first test that needs them
    (:func:`operator`): the first test sees a cluster without the feature."""
    with job_world(tmp_path_factory.mktemp("managed"), components=(), nodes=3) as made:
        yield made


@pytest.fixture(scope="module")
def operator(world: JobWorld) -> JobWorld:
    world.install("inference-operator")
    return world


def endpoint(name: str = "llama", **extra: Any) -> dict[str, Any]:
    return {"name": name, "source": S3, "worker": WORKER, "instance_types": ["ml.g5.8xlarge"], **extra}


def triggered(name: str, **extra: Any) -> dict[str, Any]:
    """An endpoint scaled 1-2 on its request rate (a Prometheus trigger)."""
    scaling = {"min_replicas": 1, "max_replicas": 2, "polling_interval": 600,
               "prometheus": [{"name": "request-rate", "query": RATE_QUERY.format(ns=NS, name=name),
                               "target_value": 0.001}], **extra}
    return endpoint(name, autoscaling=scaling)


def patch(world: JobWorld, path: str, body: dict[str, Any]) -> httpx2.Response:
    return httpx2.patch(world.live.url + path, json=body, headers=world.live.headers(), timeout=30)


def delete(world: JobWorld, path: str) -> httpx2.Response:
    return httpx2.delete(world.live.url + path, headers=world.live.headers(), timeout=30)


def assert_no_operations(world: JobWorld) -> None:
    for kind in KINDS:
        assert world.live.get(f"/api/v1/operations?kind={kind}").json() == [], kind


def finished(world: JobWorld, op_id: str) -> dict[str, Any]:
    return world.finished(op_id, timeout=180)


def deployment(world: JobWorld, name: str) -> Any:
    """The operator's Deployment of an endpoint, read live."""
    return k8s.AppsV1Api(world.api).read_namespaced_deployment(name, NS)


def replicas(world: JobWorld, name: str) -> int:
    return int(deployment(world, name).spec.replicas)


def keda_writes(ledger: CallLedger, since: int) -> list[tuple[str, str | None, str]]:
    """The ledger's writes to KEDA's own objects since ``since`` (subresources left out)."""
    found = [(str(e.get("resource")), e.get("namespace") or None, str(e.get("name")))
             for e in ledger.writes(since=since, service="kubernetes") if not e.get("subresource")]
    return sorted(w for w in found if w in KEDA_OBJECTS)
