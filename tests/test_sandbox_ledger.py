"""The call ledger on its own: redaction, what a Kubernetes request is, sequence numbers across restarts,
torn lines, rotation; and the AWS front writing it (reads, writes, errors, faults) in process."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import ClientError

from sandbox.aws import AwsWorld
from sandbox.ledger import REDACTED, Ledger, kube_request, read_entries, redact
from sandbox.tls import ensure_tls


def test_secret_named_fields_are_redacted_and_ids_kept() -> None:
    body = {"SecretString": "s3cr3t", "Password": "p", "nested": [{"hfToken": "hf_x", "name": "n"}],
            "clientRequestToken": "idem-1", "NextToken": "page-2", "Body": b"12345", "empty_secret": ""}
    safe = redact(body)
    assert safe["SecretString"] == safe["Password"] == safe["nested"][0]["hfToken"] == REDACTED
    assert safe["clientRequestToken"] == "idem-1" and safe["NextToken"] == "page-2", "idempotency and paging kept"
    assert safe["nested"][0]["name"] == "n" and safe["Body"] == "<5 bytes>" and safe["empty_secret"] == ""


@pytest.mark.parametrize(("method", "path", "query", "expected"), [
    ("GET", "/api/v1/nodes", {}, ("list", "nodes", "", "", False)),
    ("GET", "/api/v1/nodes", {"watch": "true"}, ("watch", "nodes", "", "", True)),
    ("GET", "/api/v1/namespaces/default/pods/p1/log", {}, ("get", "pods", "default", "p1", False)),
    ("PATCH", "/api/v1/nodes/n1", {}, ("patch", "nodes", "", "n1", False)),
    ("POST", "/apis/apps/v1/namespaces/ml/deployments", {}, ("create", "deployments.apps", "ml", "", False)),
    ("DELETE", "/api/v1/namespaces/ml/configmaps", {}, ("deletecollection", "configmaps", "ml", "", False)),
    ("DELETE", "/api/v1/namespaces/ml", {}, ("delete", "namespaces", "", "ml", False)),
    ("PUT", "/api/v1/namespaces/ml/finalize", {}, ("update", "namespaces", "", "ml", False)),
    ("GET", "/version", {}, ("get", "/version", "", "", False)),
])
def test_what_a_kubernetes_request_does(method: str, path: str, query: dict[str, str],
                                        expected: tuple[str, str, str, str, bool]) -> None:
    found = kube_request(method, path, query)
    assert (found["verb"], found["resource"], found["namespace"], found["name"], found["watch"]) == expected
    assert found["write"] == (expected[0] in ("create", "update", "patch", "delete", "deletecollection"))


def test_a_dry_run_is_no_write() -> None:
    found = kube_request("POST", "/apis/ray.io/v1/namespaces/ml/rayjobs", {"dryRun": "All"})
    assert found["verb"] == "create" and found["dry_run"] is True and found["write"] is False


def test_sequence_numbers_continue_across_restarts_and_torn_lines_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    ledger = Ledger(path)
    first = ledger.record({"kind": "aws", "service": "eks", "operation": "CreateCluster", "write": True})
    assert ledger.wait(first)
    ledger.close()
    with path.open("ab") as fh:
        fh.write(b'{"seq": 99, "kind": "aw')  # a crash mid-write
    again = Ledger(path)
    second = again.record({"kind": "aws", "service": "eks", "operation": "ListClusters", "write": False})
    assert second == first + 1
    assert [e["operation"] for e in again.entries()] == ["CreateCluster", "ListClusters"]
    assert [e["operation"] for e in again.entries(write=True)] == ["CreateCluster"]
    assert [e["seq"] for e in again.entries(since=first)] == [second]
    again.close()


def test_rotation_keeps_one_previous_file_that_is_still_read(tmp_path: Path) -> None:
    path = tmp_path / "calls.jsonl"
    ledger = Ledger(path, max_bytes=400)
    seqs = []
    for i in range(8):  # one batch each: a batch is never split across files
        seqs.append(ledger.record({"kind": "aws", "service": "s3", "operation": f"Op{i}", "write": False}))
        ledger.flush()
    assert path.with_name("calls.jsonl.1").exists()
    kept = [e["seq"] for e in read_entries(path)]
    assert kept == sorted(kept) and kept[-1] == seqs[-1] and len(kept) > 1
    assert path.stat().st_size <= 400 and path.with_name("calls.jsonl.1").stat().st_size <= 400
    ledger.close()


def test_the_front_records_calls_faults_and_errors(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "calls.jsonl")
    world = AwsWorld(tmp_path, None, None, kube_ca_pem=ensure_tls(tmp_path / "tls").ca_pem, ledger=ledger)
    world.start(ticker=False)
    try:
        session = boto3.Session(aws_access_key_id="AKIATESTLEDGER000001", aws_secret_access_key="x",
                                region_name="us-west-2")
        eks = session.client("eks", endpoint_url=world.endpoint_url)
        with pytest.raises(ClientError):
            eks.describe_cluster(name="absent")
        world.faults.inject("access_denied", {"service": "sagemaker", "action": "ListClusters"})
        with pytest.raises(ClientError) as denied:
            session.client("sagemaker", endpoint_url=world.endpoint_url).list_clusters()
        assert "sagemaker:ListClusters" in denied.value.response["Error"]["Message"]
        session.client("iam", endpoint_url=world.endpoint_url).create_role(
            RoleName="r1", AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": []}))
        entries = ledger.entries()
        summary = [(e["service"], e["operation"], e["status"], e["error"], e["write"]) for e in entries]
        assert summary == [("eks", "DescribeCluster", 404, "ResourceNotFoundException", False),
                           ("sagemaker", "ListClusters", 403, "AccessDeniedException", False),
                           ("iam", "CreateRole", 200, None, True)]
        assert entries[0]["target"] == "absent" and entries[2]["target"] == "r1"
        assert {e["caller"]["access_key"] for e in entries} == {"AKIATESTLEDGER000001"}
    finally:
        world.stop()
        ledger.close()
