"""Restarted containers and finished jobs: the previous instance's log stays readable, live and as text;
the archive copies every container's full log to the shared bucket (gzipped, under the job's ``logs/``
prefix) and reads fall back to it once the pods are gone."""

from __future__ import annotations

import gzip
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from kubernetes import client as k8s
from moto.server import ThreadedMotoServer

from services.clusters.storage_stage import s3_prefix, volume_name
from services.logs.models import LogStreamQuery, LogTextQuery
from tests.logs_support import BASE_TS, CLUSTER, NAMESPACE, VIEWER, LogWorld, log_world
from tests.support import free_port, wait_until


@pytest.fixture
def s3_url(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    for key, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                       ("AWS_DEFAULT_REGION", "us-west-2")):
        monkeypatch.setenv(key, value)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def world(tmp_path: Path, s3_url: str) -> Iterator[LogWorld]:
    with log_world(tmp_path, aws_endpoint_url=s3_url) as w:
        w.bucket = f"shared-{uuid.uuid4().hex[:12]}"  # moto keeps buckets per process: one of this test's own
        boto3.client("s3", endpoint_url=s3_url, region_name="us-west-2").create_bucket(
            Bucket=w.bucket, CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
        pv = {"metadata": {"name": volume_name(CLUSTER, "shared-s3")},  # what the storage stage makes
              "spec": {"capacity": {"storage": "1200Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                       "mountOptions": ["allow-delete", f"prefix {s3_prefix(CLUSTER)}"],
                       "csi": {"driver": "s3.csi.aws.com", "volumeHandle": f"instantstart-{CLUSTER}-s3",
                               "volumeAttributes": {"bucketName": w.bucket}}}}
        k8s.CoreV1Api(w.api).create_persistent_volume(pv)
        yield w


def _body(lines: list[str]) -> list[str]:
    return [line.split(" ", 2)[2] for line in lines if not line.startswith("#")]


def test_a_restarted_container_keeps_its_previous_log_live_and_as_text(world: LogWorld) -> None:
    world.pod("train-worker-0", "train")
    world.log("train-worker-0", "before the fault", BASE_TS)
    view = world.services.logs.open_stream(VIEWER, CLUSTER, "train", LogStreamQuery())
    try:
        wait_until(lambda: [line.text for line in view.take().lines] == ["before the fault"], 30, "the first line")
        world.restart("train-worker-0")
        world.log("train-worker-0", "after the restart", BASE_TS + 0.5)  # same second, a new instance
        wait_until(lambda: [line.text for line in view.take().lines] == ["after the restart"], 30,
                   "the restarted container's first line")
    finally:
        view.close()
    text = world.services.logs.read_text(VIEWER, CLUSTER, "train", LogTextQuery()).text.splitlines()
    assert _body(text) == ["before the fault", "after the restart"]
    fresh = world.services.logs.open_stream(VIEWER, CLUSTER, "train", LogStreamQuery())
    try:
        wait_until(fresh.caught_up.is_set, 30, "the catch-up")
        assert [line.text for line in fresh.take().lines] == ["before the fault", "after the restart"]
    finally:
        fresh.close()


def test_archive_writes_every_container_and_reads_fall_back_to_it(world: LogWorld, s3_url: str) -> None:
    world.pod("train-worker-0", "train", containers=("pytorch", "agent"))
    world.pod("train-worker-1", "train")
    world.log("train-worker-0", "w0 first run", BASE_TS)
    world.restart("train-worker-0")
    world.log("train-worker-0", "w0 second run", BASE_TS + 1)
    world.log("train-worker-0", "agent line", BASE_TS + 1, container="agent")
    world.log("train-worker-1", "w1 NCCL INFO ready", BASE_TS + 2)
    result = world.services.logs.archive_job_logs(CLUSTER, NAMESPACE, "train")
    folder = f"{s3_prefix(CLUSTER)}jobs/train/logs/"
    assert result.bucket == world.bucket and result.prefix == folder
    s3 = boto3.client("s3", endpoint_url=s3_url, region_name="us-west-2")
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=world.bucket, Prefix=folder)["Contents"])
    assert keys == [f"{folder}train-worker-0.agent.log.gz", f"{folder}train-worker-0.pytorch.log.gz",
                    f"{folder}train-worker-1.pytorch.log.gz"]
    stored = s3.get_object(Bucket=world.bucket, Key=f"{folder}train-worker-0.pytorch.log.gz")
    body = gzip.decompress(stored["Body"].read())
    assert body.decode() == ("2026-01-01T00:00:00.000000000Z w0 first run\n"
                             "2026-01-01T00:00:01.000000000Z w0 second run\n")
    core = k8s.CoreV1Api(world.api)
    for pod in ("train-worker-0", "train-worker-1"):
        core.delete_namespaced_pod(pod, NAMESPACE, grace_period_seconds=0)
    wait_until(lambda: not core.list_namespaced_pod(NAMESPACE).items, 30, "the pods to go")
    answer = world.services.logs.read_text(VIEWER, CLUSTER, "train", LogTextQuery(grep="run|nccl"))
    assert answer.source == "archive"
    assert _body(answer.text.splitlines()) == ["w0 first run", "w0 second run", "w1 NCCL INFO ready"]
    assert "from the archive" in answer.text.splitlines()[-1]
