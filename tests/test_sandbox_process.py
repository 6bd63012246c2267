"""The sandbox as the server's child process: its call ledger, its durability when the product is killed,
the ``access_denied`` fault and EKS access entries enforced by the Kubernetes emulator."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from botocore.exceptions import ClientError
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import watch as k8s_watch

from app.runtime import read_runtime
from services.settings import Settings
from tests.ledger import CallLedger
from tests.sandbox_support import eks_cluster
from tests.support import ROOT, LiveServer, clean_env, start_server, wait_until

pytestmark = pytest.mark.slow
FAST = {"INSTANTSTART_SANDBOX_SPEED": "5000"}
CREATOR = "arn:aws:iam::123456789012:user/moto"  # the IAM user the sandbox's credentials sign as (moto's STS)


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found.extend(int(p) for p in text)
    return found


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its new parent to reap it counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def summary(entry: dict[str, Any]) -> tuple[Any, ...]:
    return (entry["seq"], entry["time"], entry["service"], entry.get("operation"), entry.get("verb"),
            entry.get("target"), entry.get("name"), entry["status"])


def settings_of(live: LiveServer) -> Settings:
    runtime = read_runtime(live.data_dir)
    assert runtime is not None
    return Settings(data_dir=live.data_dir, sandbox=True, sandbox_aws_port=runtime.ports["sandbox_aws_port"],
                    sandbox_kube_port=runtime.ports["sandbox_kube_port"])


def cli(live: LiveServer, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app.cli", *args, "--data-dir", str(live.data_dir)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60,
                          env=clean_env(INSTANTSTART_TOKEN=live.admin_token))


def kube_api(settings: Settings, cluster: str) -> k8s.CoreV1Api:
    from app.sandbox import write_kubeconfig

    return k8s.CoreV1Api(k8s_config.new_client_from_config(str(write_kubeconfig(settings, cluster))))


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    server = start_server(tmp_path_factory.mktemp("sbxproc") / "data", env=FAST)
    yield server
    server.stop()


def test_the_ledger_records_aws_and_kubernetes_calls_with_callers_and_redacted_secrets(live: LiveServer) -> None:
    ledger = CallLedger(live)
    settings = settings_of(live)
    mark = ledger.mark()
    cluster = eks_cluster(settings, "ledgered")
    created = ledger.once("eks", "CreateCluster", since=mark, target="ledgered")
    assert created["request"]["version"] == "1.32" and created["write"] is True and created["status"] == 200
    assert created["caller"]["access_key"] == "AKIAINSTANTSTARTSBX1" and "Boto3" in created["caller"]["user_agent"]
    assert ledger.once("ec2", "CreateVpc", since=mark)["request"]["CidrBlock"] == "10.20.0.0/16"
    reads = ledger.calls(service="eks", operation="DescribeCluster", since=mark)
    assert reads and not any(e["write"] for e in reads)

    secrets_manager = live_client(settings, "secretsmanager")
    secrets_manager.create_secret(Name="planted", SecretString="PLANTED-SECRET-VALUE")
    entry = ledger.once("secretsmanager", "CreateSecret", since=mark)
    assert entry["request"]["SecretString"] == "<redacted>"
    assert "PLANTED-SECRET-VALUE" not in json.dumps(ledger.calls(since=mark))

    api = kube_api(settings, "ledgered")
    before = ledger.mark()
    api.create_namespaced_config_map("default", k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="seen")))
    api.read_namespaced_config_map("seen", "default")
    kube = ledger.calls(service="kubernetes", cluster="ledgered", since=before)
    assert [(e["verb"], e["resource"], e["name"], e["watch"]) for e in kube] == [
        ("create", "configmaps", "", False), ("get", "configmaps", "seen", False)]
    assert kube[0]["caller"]["identity"] == CREATOR and kube[0]["write"] and kube[0]["namespace"] == "default"
    watching = ledger.mark()
    for _event in k8s_watch.Watch().stream(api.list_namespaced_config_map, "default", timeout_seconds=30):
        watches = ledger.calls(service="kubernetes", verb="watch", since=watching)  # while it is still open
        assert [(e["resource"], e["watch"], e["write"]) for e in watches] == [("configmaps", True, False)]
        break
    else:
        raise AssertionError("the watch delivered nothing")
    assert cluster["endpoint"].endswith("/k8s/clusters/ledgered")

    for how in ([], ["--url", live.url]):  # the data directory's file, or REST
        out = cli(live, "sandbox", "calls", "--json", "--service", "eks", "--operation", "CreateCluster", *how)
        assert out.returncode == 0, out.stderr
        assert [e["target"] for e in json.loads(out.stdout)] == ["ledgered"]
    text = cli(live, "sandbox", "calls", "--writes", "--since", str(before))
    assert text.returncode == 0 and "k8s ledgered create configmaps default" in text.stdout, text.stdout
    viewer = live.make_token("viewer")
    assert live.get("/api/v1/sandbox/calls?verb=create", token=viewer).status_code == 200


def live_client(settings: Settings, service: str) -> Any:
    from tests.sandbox_support import client

    return client(settings, service)


def test_access_denied_fails_a_call_at_once_naming_the_action(live: LiveServer) -> None:
    ledger = CallLedger(live)
    settings = settings_of(live)
    eks = live_client(settings, "eks")
    fault = live.post("/api/v1/sandbox/faults", {"kind": "access_denied",
                                                 "target": {"service": "eks", "action": "eks:ListClusters"}})
    assert fault.status_code == 201, fault.text
    assert fault.json()["target"] == {"service": "eks", "action": "ListClusters"}
    mark = ledger.mark()
    with pytest.raises(ClientError) as denied:
        eks.list_clusters()
    error = denied.value.response["Error"]
    assert error["Code"] == "AccessDeniedException" and "eks:ListClusters" in error["Message"]
    assert denied.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert denied.value.response["ResponseMetadata"]["RetryAttempts"] == 0, "refused at once, never retried"
    eks.describe_addon_versions(maxResults=1)  # another action of the service still works
    entries = ledger.calls(service="eks", operation="ListClusters", since=mark)
    assert [(e["status"], e["error"]) for e in entries] == [(403, "AccessDeniedException")]
    cleared = httpx2.delete(f"{live.url}/api/v1/sandbox/faults/{fault.json()['id']}", headers=live.headers())
    assert cleared.status_code == 200, cleared.text
    eks.list_clusters()
    missing = live.post("/api/v1/sandbox/faults", {"kind": "access_denied", "target": {"service": "eks"}})
    assert missing.status_code == 422 and "action" in missing.text


def test_the_emulator_admits_only_principals_with_an_access_entry(live: LiveServer) -> None:
    settings = settings_of(live)
    eks_cluster(settings, "guarded")
    api = kube_api(settings, "guarded")
    assert api.list_namespace().items, "the sandbox's kubeconfig acts as the creator, who has an entry"
    eks = live_client(settings, "eks")
    eks.delete_access_entry(clusterName="guarded", principalArn=CREATOR)
    with pytest.raises(k8s.ApiException) as refused:
        api.list_namespace()
    assert refused.value.status == 401
    ledger = CallLedger(live)
    last = ledger.calls(service="kubernetes", cluster="guarded")[-1]
    assert (last["verb"], last["status"]) == ("list", 401)
    eks.create_access_entry(clusterName="guarded", principalArn=CREATOR)
    assert api.list_namespace().items


def test_a_killed_product_leaves_the_sandbox_state_and_ledger_intact(tmp_path: Path) -> None:
    data = tmp_path / "data"
    live = start_server(data, env=FAST)
    try:
        settings = settings_of(live)
        (sandbox_pid,) = children(live.process.pid)
        eks_cluster(settings, "kept")
        kube_api(settings, "kept").create_namespaced_config_map(
            "default", k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="kept"), data={"a": "1"}))
        before = [summary(e) for e in CallLedger(live).calls()]
        live.process.send_signal(signal.SIGKILL)  # the product only
        live.process.wait(10)
        wait_until(lambda: not alive(sandbox_pid), 30, "the orphaned sandbox saving its state and exiting")
    finally:
        live.stop()
    on_disk = [summary(e) for e in CallLedger(data).calls()]
    assert on_disk[:len(before)] == before, "every entry the product saw is on disk"

    again = start_server(data, env=FAST)
    again.admin_token = live.admin_token  # made by the first start only
    try:
        settings = settings_of(again)
        assert live_client(settings, "eks").describe_cluster(name="kept")["cluster"]["status"] == "ACTIVE"
        assert len(live_client(settings, "ec2").describe_vpcs(Filters=[{"Name": "cidr", "Values": ["10.20.0.0/16"]}])
                   ["Vpcs"]) == 1
        assert kube_api(settings, "kept").read_namespaced_config_map("kept", "default").data == {"a": "1"}
        ledger = CallLedger(again)
        assert [summary(e) for e in ledger.calls()][:len(before)] == before
        ledger.once("eks", "CreateCluster", target="kept")  # restoring replayed nothing through the front
        ledger.once("ec2", "CreateVpc")
        assert ledger.calls()[-1]["seq"] > before[-1][0]
    finally:
        again.stop()


def test_serve_stops_with_the_reason_when_its_sandbox_dies(tmp_path: Path) -> None:
    live = start_server(tmp_path / "data", env=FAST)
    try:
        (sandbox_pid,) = children(live.process.pid)
        os.kill(sandbox_pid, signal.SIGKILL)
        code = live.process.wait(60)
    finally:
        live.stop()
    assert code == 2
    assert f"the sandbox process (pid {sandbox_pid}) exited with code -9" in live.log()


def test_what_the_sandbox_answered_survives_a_sigkill_of_the_sandbox_itself(tmp_path: Path) -> None:
    from app.bootstrap import build_services
    from tests.sandbox_support import client, sandbox_settings, start_sandbox

    services = build_services(Settings(data_dir=tmp_path / "product", sandbox=True))
    settings = sandbox_settings(tmp_path / "data")
    sandbox = start_sandbox(settings)
    try:
        eks_cluster(settings, "durable")
        kube_api(settings, "durable").create_namespaced_config_map(
            "default", k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="answered"), data={"a": "1"}))
        vpc = client(settings, "ec2").create_vpc(CidrBlock="10.99.0.0/16")["Vpc"]["VpcId"]
        client(settings, "eks").tag_resource(resourceArn=client(settings, "eks").describe_cluster(
            name="durable")["cluster"]["arn"], tags={"answered": "yes"})
        assert sandbox.pid is not None
        os.kill(sandbox.pid, signal.SIGKILL)  # no chance to save anything on the way out
    finally:
        sandbox.stop()
    written = [e for e in CallLedger(settings.data_dir).calls() if e["write"]]
    assert [e.get("operation") or e.get("verb") for e in written][-3:] == ["create", "CreateVpc", "TagResource"]

    again = start_sandbox(settings)
    try:
        assert kube_api(settings, "durable").read_namespaced_config_map("answered", "default").data == {"a": "1"}
        assert client(settings, "ec2").describe_vpcs(VpcIds=[vpc])["Vpcs"][0]["CidrBlock"] == "10.99.0.0/16"
        assert client(settings, "eks").describe_cluster(name="durable")["cluster"]["tags"] == {"answered": "yes"}
    finally:
        again.stop()
        services.stop()
