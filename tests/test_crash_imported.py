"""SIGKILL of the product (not the sandbox) while an operation on an imported cluster waits: after a
restart its cluster's client comes from the registry, the operation finishes, and the sandbox's call
ledger shows no write made twice."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s

from services.auth import Principal, Role
from services.clusters.models import ClusterImport
from tests.crash_cluster_worker import LABEL
from tests.ledger import CallLedger
from tests.sandbox_support import SeededServer, seeded_server
from tests.support import ROOT, wait_until

pytestmark = pytest.mark.slow
OPERATOR = Principal("crash-tester", Role.OPERATOR, "t-crash", "api")


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeededServer]:
    with seeded_server(tmp_path_factory.mktemp("crash"), "crashy") as seeded:
        yield seeded


def worker(data: Path, aws_port: int, kube_port: int, *submit: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.crash_cluster_worker", str(data), str(aws_port),
                             str(kube_port), *submit], cwd=ROOT, stdout=subprocess.PIPE, text=True)


def test_a_killed_product_resumes_on_an_imported_cluster_and_writes_nothing_twice(
        sandbox: SeededServer, tmp_path: Path) -> None:
    live, aws_port, kube_port = sandbox.live, sandbox.aws_port, sandbox.kube_port
    data = tmp_path / "product"
    reader = sandbox.product(data)  # never started: reads the state the workers write
    try:
        imported, _ = reader.clusters.import_cluster(OPERATOR, ClusterImport(eks_cluster="crashy"))
        wait_until(lambda: reader.engine.run_until_idle(imported.id).status == "succeeded", 60, "the import")
        reader.informers.stop()
        ledger = CallLedger(live)
        mark = ledger.mark()

        first = worker(data, aws_port, kube_port, "submit", "crashy")
        try:
            assert first.stdout is not None
            op_id = first.stdout.readline().strip()
            assert op_id.startswith("op-"), op_id

            def paused() -> bool:
                stages = {s.name: s for s in reader.engine.get(op_id).stages}
                return stages["tag"].status == "succeeded" and stages["pause"].status != "pending"

            wait_until(paused, 60, "the operation to tag the cluster and pause")
        finally:
            first.kill()  # SIGKILL: no clean shutdown, the sandbox keeps running
            first.wait(10)
        (data / "release").touch()

        second = worker(data, aws_port, kube_port)  # a fresh process: the cluster's client from the registry
        try:
            wait_until(lambda: reader.engine.get(op_id).status == "succeeded", 90, "the resumed operation")
        finally:
            second.terminate()
            second.wait(20)

        eks_arn = reader.clusters.registry.get("crashy").eks_arn
        ledger.once("eks", "TagResource", since=mark, target=eks_arn)
        patches = [e for e in ledger.writes(mark, cluster="crashy") if e.get("resource") == "nodes"]
        assert len(patches) == 1 and patches[0]["verb"] == "patch", patches
        core = k8s.CoreV1Api(reader.kube.api_client("crashy"))
        assert core.read_node(patches[0]["name"]).metadata.labels[LABEL] == op_id
    finally:
        reader.stop()
