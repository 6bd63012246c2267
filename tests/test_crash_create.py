"""SIGKILL of the product (not the sandbox) during each stage of ``cluster.create`` in turn, and exactly
between an act and the save of its result (the sandbox holds the act's answer: a ``hold_response`` fault):
after every restart the engine resumes the operation, it completes, and the sandbox's call ledger shows no
create-type call made twice for the same resource (AWS and Kubernetes)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.bootstrap import Services
from services.operations import TERMINAL
from tests.create_support import SandboxProduct, held_answers, sandbox_product
from tests.ledger import CallLedger
from tests.support import ROOT, wait_until

pytestmark = pytest.mark.slow
SPEED = 150.0  # slow enough that each stage lasts long enough to be killed in, fast enough for CI
CREATE_PREFIXES = ("Create", "Allocate", "Run", "Associate", "Put", "Upload")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxProduct]:
    with sandbox_product(tmp_path_factory.mktemp("crash-create"), speed=SPEED) as product:
        product.services.engine.stop()  # this installation only reads; the workers run the engine
        yield product


def worker(product: SandboxProduct, data: Path, *submit: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.crash_create_worker", str(data), str(product.aws_port),
                             str(product.kube_port), str(SPEED), *submit], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True)


def current_stage(reader: Services, op_id: str) -> str | None:
    """The first stage that has started and not finished, if any."""
    for stage in reader.engine.get(op_id).stages:
        if stage.status.value in ("running", "waiting") or (stage.status.value == "pending" and stage.attempts):
            return stage.name
        if stage.status.value != "succeeded":
            return None
    return None


def creates(ledger: CallLedger, since: int) -> Counter[tuple[str, ...]]:
    """Each successful create-type call by what it asked (a repeated create asks the same again)."""
    seen: Counter[tuple[str, ...]] = Counter()
    for entry in ledger.calls(since=since):
        if entry.get("kind") == "aws" and entry["status"] < 400 and entry["operation"].startswith(CREATE_PREFIXES):
            request: dict[str, Any] = {k: v for k, v in (entry.get("request") or {}).items()
                                       if k not in ("ClientToken", "clientRequestToken", "ClientRequestToken")}
            seen[(entry["service"], entry["operation"], json.dumps(request, sort_keys=True))] += 1
        elif entry.get("kind") != "aws" and entry.get("verb") == "create" and entry["status"] < 400:
            seen[("kube", entry["cluster"], entry["resource"], entry.get("namespace") or "", entry["name"])] += 1
    return seen


def test_a_create_killed_in_every_stage_completes_and_creates_nothing_twice(world: SandboxProduct,
                                                                           tmp_path: Path) -> None:
    data = tmp_path / "product"
    (data / "sandbox").mkdir(parents=True)
    (data / "sandbox" / "aws-secret-key").write_text((world.live.data_dir / "sandbox" / "aws-secret-key").read_text())
    ledger = CallLedger(world.live)
    mark = ledger.mark()
    request = {"name": "crashy", "zone": "us-west-2a", "instance_type": "ml.g5.8xlarge", "count": 2}
    proc = worker(world, data, "submit", json.dumps(request))
    assert proc.stdout is not None
    op_id = proc.stdout.readline().strip()
    assert op_id.startswith("op-"), op_id
    reader = world.product_reader(data)
    killed: list[str] = []
    try:
        for stage in reader.engine.get(op_id).stages:
            in_stage = wait_until(lambda s=stage.name: current_stage(reader, op_id) in (s, None)
                                  or reader.engine.get(op_id).status in TERMINAL, 300, f"stage {stage.name}")
            if reader.engine.get(op_id).status in TERMINAL or current_stage(reader, op_id) != stage.name:
                continue  # it finished before it could be caught: the next one is
            assert in_stage
            proc.kill()  # SIGKILL: no clean shutdown; the sandbox keeps running
            proc.wait(10)
            killed.append(stage.name)
            proc = worker(world, data)
        final = wait_until(lambda: (v := reader.engine.get(op_id)).status in TERMINAL and v, 600, "the create")
        assert final.status == "succeeded", (final.error, [(s.name, s.status, s.message) for s in final.stages])
    finally:
        proc.terminate()
        proc.wait(20)
        reader.stop()
    assert len(killed) >= 5, f"the product was killed in too few stages: {killed}"
    twice = {key: n for key, n in creates(ledger, mark).items() if n > 1}
    assert not twice, f"created twice after a crash: {twice}"


# each act, in the order the create makes them: the call is made and in the ledger, its answer is held
HELD_ACTS = [("ec2", "CreateVpc"), ("ec2", "AssociateVpcCidrBlock"), ("iam", "CreateRole"), ("eks", "CreateCluster"),
             ("sagemaker", "CreateCluster")]


def test_a_create_killed_between_each_act_and_the_save_of_its_result_creates_nothing_twice(
        world: SandboxProduct, tmp_path: Path) -> None:
    data = tmp_path / "product"
    (data / "sandbox").mkdir(parents=True)
    (data / "sandbox" / "aws-secret-key").write_text((world.live.data_dir / "sandbox" / "aws-secret-key").read_text())
    ledger = CallLedger(world.live)
    mark = ledger.mark()
    holds = [world.live.post("/api/v1/sandbox/faults", {"kind": "hold_response", "count": 1, "target": {
        "service": service, "operation": operation}}) for service, operation in HELD_ACTS]
    assert all(h.status_code == 201 for h in holds), [h.text for h in holds]
    # a /22 VPC is full once its four EKS subnets are made: the compute subnet needs AssociateVpcCidrBlock
    request = {"name": "held", "zone": "us-west-2a", "instance_type": "ml.g5.8xlarge", "count": 1,
               "vpc_cidr": "10.44.0.0/22"}
    proc = worker(world, data, "submit", json.dumps(request))
    assert proc.stdout is not None
    op_id = proc.stdout.readline().strip()
    assert op_id.startswith("op-"), op_id
    reader = world.product_reader(data)
    try:
        for (service, operation), hold in zip(HELD_ACTS, holds, strict=True):
            fault_id = hold.json()["id"]
            wait_until(lambda s=service, o=operation, f=fault_id: ledger.succeeded(s, o, since=mark)
                       and held_answers(world.live, f) == 1, 300, f"{service}:{operation} made, its answer held")
            proc.kill()  # SIGKILL between the act and the save of its result
            proc.wait(10)
            wait_until(lambda f=fault_id: held_answers(world.live, f) == 0, 60, "the answer dropped with the product")
            proc = worker(world, data)
        final = wait_until(lambda: (v := reader.engine.get(op_id)).status in TERMINAL and v, 600, "the create")
        assert final.status == "succeeded", (final.error, [(s.name, s.status, s.message) for s in final.stages])
    finally:
        proc.terminate()
        proc.wait(20)
        reader.stop()
    for service, operation in HELD_ACTS[:2] + HELD_ACTS[3:]:
        ledger.once(service, operation, since=mark)  # each of these is made once in a create
    twice = {key: n for key, n in creates(ledger, mark).items() if n > 1}
    assert not twice, f"created twice after a crash: {twice}"
