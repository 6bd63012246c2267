"""Model downloads end to end against a real server on the sandbox: the Job runs the simulated ``hf download``,
the files land in the shared bucket (read back with boto3, as a user would), progress and status show on
REST, a planted token appears nowhere it must not, a gated model without a token fails with the Hub's 401,
an unknown CLI flag fails the pod, a second download of a running model is refused, and cancel stops one."""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import panel as pn
import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from mcp import Client, StdioServerParameters

from panels.downloads import DownloadsPane
from services.auth import Principal, Role
from services.operations import OperationQuery
from tests.ledger import CallLedger
from tests.node_support import aws, kube, node_cluster
from tests.sandbox_support import SeededServer
from tests.support import ROOT, clean_env, wait_until

pytestmark = pytest.mark.slow
BUCKET = "team-shared-models"
PREFIX = "team-a/"  # the user's own claim mounts only this prefix (Mountpoint's prefix option)
BASE = "/api/v1/clusters/hp-eks/models/downloads"
NS = "hyperpod-ns-training"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SeededServer, k8s.ApiClient]]:
    """An imported cluster with the user's own shared storage: a bucket and a static Mountpoint volume bound to
    the claim default/shared-s3 (named unlike ours: the product follows the claim)."""
    folder = tmp_path_factory.mktemp("downloads")
    with node_cluster(folder, 1) as server:
        aws(server, "s3").create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
        api = kube(server, folder)
        core = k8s.CoreV1Api(api)
        core.create_persistent_volume({
            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "team-bucket"},
            "spec": {"capacity": {"storage": "1200Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                     "claimRef": {"namespace": "default", "name": "shared-s3"},
                     "mountOptions": ["allow-delete", "region us-west-2", f"prefix {PREFIX}"],
                     "csi": {"driver": "s3.csi.aws.com", "volumeHandle": "team-bucket",
                             "volumeAttributes": {"bucketName": BUCKET}}}})
        core.create_namespaced_persistent_volume_claim("default", {
            "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "shared-s3"},
            "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": "team-bucket",
                     "resources": {"requests": {"storage": "1200Gi"}}}})
        yield server, api


def finish(server: SeededServer, op_id: str) -> dict[str, Any]:
    last: dict[str, Any] = {}

    def ended() -> dict[str, Any] | None:
        view = server.live.get(f"/api/v1/operations/{op_id}/wait?timeout=120").json()
        last.update(view)
        return view if view["status"] in ("succeeded", "failed", "cancelled") else None
    try:
        return wait_until(ended, 120, f"operation {op_id} to end")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; it was: {last}") from None


def start(server: SeededServer, body: dict[str, Any], seen: list[str] | None = None) -> dict[str, Any]:
    answer = server.live.post(BASE, body)
    assert answer.status_code == 202, answer.text
    if seen is not None:
        seen.append(answer.text)
    return dict(answer.json())


def test_download_lands_in_the_bucket_and_the_token_is_nowhere(world: tuple[SeededServer, k8s.ApiClient]) -> None:
    server, api = world
    token = "hf_" + secrets.token_urlsafe(24)
    ledger = CallLedger(server.live)
    mark = ledger.mark()
    seen: list[str] = []
    started = start(server, {"model": "meta-llama/Llama-3.2-1B", "revision": "main", "hf_token": token}, seen)
    op = finish(server, started["operation"]["id"])
    seen.append(str(op))
    assert op["status"] == "succeeded", op
    download_id = op["request"]["id"]

    one = server.live.get(f"{BASE}/{download_id}")
    seen.append(one.text)
    view = one.json()
    assert view["phase"] == "Succeeded" and view["token_used"] is True
    assert view["destination"] == "/s3/models/meta-llama--Llama-3.2-1B"
    assert view["s3_uri"] == f"s3://{BUCKET}/{PREFIX}models/meta-llama--Llama-3.2-1B/"

    # the files, where Mountpoint would have put them: the claim's bucket and prefix + the path under /s3
    s3 = aws(server, "s3")
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{PREFIX}models/meta-llama--Llama-3.2-1B/")["Contents"]
    names = {o["Key"].rsplit("/", 1)[1]: o["Size"] for o in listed}
    assert {"config.json", "tokenizer.json", "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors", "model.safetensors.index.json"} <= set(names)
    config = s3.get_object(Bucket=BUCKET, Key=f"{PREFIX}models/meta-llama--Llama-3.2-1B/config.json")["Body"].read()
    assert b"meta-llama/Llama-3.2-1B" in config
    # the progress the status shows is what the CLI printed: every file, every byte
    progress = view["progress"]
    assert progress["files_total"] == progress["files_done"] == len(names) == progress["copied"]
    assert progress["bytes_done"] == sum(names.values())
    listing = server.live.get(BASE)
    seen.append(listing.text)
    assert download_id in {d["id"] for d in listing.json()["downloads"]}

    # the Job as submitted: labels, the token only by reference, the claim at /s3
    job = k8s.BatchV1Api(api).read_namespaced_job(download_id, NS)
    assert job.metadata.labels["app.kubernetes.io/managed-by"] == "instantstart"
    assert job.metadata.labels["instantstart.io/download"] == download_id
    assert job.spec.backoff_limit == 2 and job.spec.ttl_seconds_after_finished
    init = job.spec.template.spec.init_containers[0]
    assert init.command[3:6] == ["hf", "download", "meta-llama/Llama-3.2-1B"]
    hf_env = next(e for e in init.env if e.name == "HF_TOKEN")
    assert hf_env.value is None and hf_env.value_from.secret_key_ref.key == "token"
    main = job.spec.template.spec.containers[0]
    assert {m.mount_path for m in main.volume_mounts} >= {"/s3"}
    assert job.spec.template.spec.volumes[1].persistent_volume_claim.claim_name == "shared-s3"
    # the job namespace got its own claim on the same bucket and prefix, and its service account
    core = k8s.CoreV1Api(api)
    claim = core.read_namespaced_persistent_volume_claim("shared-s3", NS)
    pv = core.read_persistent_volume(claim.spec.volume_name)
    assert pv.spec.csi.volume_attributes["bucketName"] == BUCKET and f"prefix {PREFIX}" in pv.spec.mount_options
    assert pv.spec.csi.volume_handle != "team-bucket"
    core.read_namespaced_service_account("instantstart-training", NS)
    # nothing keeps the token: its Secret is gone once the Job ended
    secret_name = job.spec.template.spec.init_containers[0].env[-1].value_from.secret_key_ref.name
    with pytest.raises(ApiException) as gone:
        core.read_namespaced_secret(secret_name, NS)
    assert gone.value.status == 404
    secret_calls = [(c["verb"], c["name"]) for c in ledger.writes(mark, service="kubernetes")
                    if c.get("resource") == "secrets" and c["status"] < 400]
    # made, owned by the Job (the garbage collector would delete it with the Job), deleted when the Job ended
    assert [v for v, _ in secret_calls] == ["create", "patch", "delete"], secret_calls
    assert secret_calls[1][1] == secret_calls[2][1] == secret_name, secret_calls

    # the planted token in no log line, record, audit row, manifest value, response or log file
    pods = core.list_namespaced_pod(NS, label_selector=f"instantstart.io/download={download_id}").items
    logs = [core.read_namespaced_pod_log(p.metadata.name, NS, container=c) for p in pods
            for c in ("download", "publish")]
    assert any("Fetching" in text for text in logs)
    seen += logs
    seen.append(server.live.get("/api/v1/operations?kind=model.download").text)
    seen.append(server.live.get("/api/v1/audit?limit=500").text)
    seen.append(str(api.sanitize_for_serialization(job)))
    seen.append(server.live.log())
    for path in server.live.data_dir.glob("state.db*"):
        seen.append(path.read_bytes().decode("latin-1"))
    seen.append((server.live.data_dir / "sandbox" / "calls.jsonl").read_text())
    encoded = base64.b64encode(token.encode()).decode()
    for text in seen:
        assert token not in text and encoded not in text


def test_gated_model_without_a_token_fails_with_the_hubs_401(world: tuple[SeededServer, k8s.ApiClient]) -> None:
    server, api = world
    op = finish(server, start(server, {"model": "meta-llama/Llama-3.1-8B"})["operation"]["id"])
    assert op["status"] == "failed"
    said = op["error"]["message"]
    assert "GatedRepoError: 401 Client Error" in said and "meta-llama/Llama-3.1-8B is restricted" in said, said
    view = server.live.get(f"{BASE}/{op['request']['id']}").json()
    assert view["phase"] == "Failed" and view["token_used"] is False
    job = k8s.BatchV1Api(api).read_namespaced_job(op["request"]["id"], NS)
    failed = next(c for c in job.status.conditions if c.type == "Failed")
    assert failed.reason == "BackoffLimitExceeded"
    assert len(view["pods"]) == 3  # the first try and backoffLimit 2 retries
    assert aws(server, "s3").list_objects_v2(Bucket=BUCKET, Prefix=f"{PREFIX}models/meta-llama--Llama-3.1-8B/")[
        "KeyCount"] == 0


def test_an_unknown_cli_flag_fails_the_pod_with_the_clis_error(world: tuple[SeededServer, k8s.ApiClient]) -> None:
    """The simulator checks argv as the real CLI does (a Job written by hand, not by the product)."""
    _, api = world
    name = "hand-written-" + secrets.token_hex(3)
    k8s.BatchV1Api(api).create_namespaced_job(NS, {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never",
            "initContainers": [{"name": "download", "image": "python:3.12-slim",
                                "command": ["hf", "download", "Qwen/Qwen2.5-0.5B", "--locl-dir", "/scratch"]}],
            "containers": [{"name": "publish", "image": "python:3.12-slim", "command": ["true"]}]}}}})
    core = k8s.CoreV1Api(api)

    def failed_pod() -> Any:
        return next((p for p in core.list_namespaced_pod(NS).items
                     if p.metadata.name.startswith(name) and p.status.phase == "Failed"), None)
    pod = wait_until(failed_pod, 60, "the hand-written download pod to fail")
    log = core.read_namespaced_pod_log(pod.metadata.name, NS, container="download")
    assert "Error: No such option: --locl-dir" in log and "Usage: hf download" in log
    assert pod.status.init_container_statuses[0].state.terminated.exit_code == 2


def gone(read: Any) -> bool:
    """Whether ``read`` answers 404."""
    try:
        read()
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


def test_a_second_download_of_a_running_model_is_refused_and_cancel_stops_it(
        world: tuple[SeededServer, k8s.ApiClient]) -> None:
    """With every node cordoned the download's pod waits for capacity, so it is running for as long as the test
    needs (no timing)."""
    server, api = world
    core = k8s.CoreV1Api(api)
    nodes = [n.metadata.name for n in core.list_node().items]
    for node in nodes:
        core.patch_node(node, {"spec": {"unschedulable": True}})
    try:
        token = "hf_" + secrets.token_urlsafe(24)
        first = start(server, {"model": "Qwen/Qwen2.5-0.5B-Instruct", "hf_token": token})
        again = server.live.post(BASE, {"model": "Qwen/Qwen2.5-0.5B-Instruct"})
        assert again.status_code == 409, again.text
        assert first["operation"]["id"] in again.text
        download_id = first["operation"]["request"]["id"]
        wait_until(lambda: core.list_namespaced_pod(NS, label_selector=f"instantstart.io/download={download_id}")
                   .items, 60, "the download's pod")
        owners = wait_until(lambda: core.read_namespaced_secret(f"{download_id}-hf-token", NS).metadata
                            .owner_references, 60, "the Job to own the token's Secret")
        assert [(o.kind, o.name) for o in owners] == [("Job", download_id)]
        waiting = server.live.get(f"{BASE}/{download_id}").json()
        assert waiting["phase"] == "Pending" and "unschedulable" in waiting["message"], waiting
        cancelled = httpx2.delete(server.live.url + f"{BASE}/{download_id}", headers=server.live.headers(), timeout=30)
        assert cancelled.status_code == 200, cancelled.text
        assert token not in cancelled.text
        op = finish(server, first["operation"]["id"])  # at once, or after the step a worker was in
        assert op["status"] == "cancelled"
        assert server.live.get(f"{BASE}/{download_id}").json()["phase"] == "Cancelled"
        # a worker mid-step ends the operation, then stops its Job: wait for that, never longer than a minute
        wait_until(lambda: gone(lambda: k8s.BatchV1Api(api).read_namespaced_job(download_id, NS)), 60,
                   "the Job deleted")
        assert gone(lambda: core.read_namespaced_secret(f"{download_id}-hf-token", NS)), "the token's Secret"
        # the model is free again: a new download of it is accepted
        retry = server.live.post(BASE, {"model": "Qwen/Qwen2.5-0.5B-Instruct"})
        assert retry.status_code == 202, retry.text
        # cancelled through the generic operations face instead, it stops its Job all the same
        second = retry.json()["operation"]
        wait_until(lambda: k8s.BatchV1Api(api).list_namespaced_job(
            NS, label_selector=f"instantstart.io/download={second['request']['id']}").items, 60, "the second Job")
        generic = server.live.post(f"/api/v1/operations/{second['id']}/cancel", {})
        assert generic.status_code == 200, generic.text
        assert finish(server, second["id"])["status"] == "cancelled"
        wait_until(lambda: gone(lambda: k8s.BatchV1Api(api).read_namespaced_job(second["request"]["id"], NS)), 60,
                   "the second Job deleted")
    finally:
        for node in nodes:
            core.patch_node(node, {"spec": {"unschedulable": False}})
    third = server.live.post(BASE, {"model": "Qwen/Qwen2.5-0.5B-Instruct"})
    assert third.status_code == 202, third.text
    assert finish(server, third.json()["operation"]["id"])["status"] == "succeeded"


def test_prechecks_answer_before_any_operation(world: tuple[SeededServer, k8s.ApiClient], tmp_path: Path) -> None:
    server, _ = world
    bad = server.live.post(BASE, {"model": "not-a-model-id"})
    assert bad.status_code == 422 and "model" in bad.text
    unknown = server.live.post("/api/v1/clusters/nope/models/downloads", {"model": "Qwen/Qwen2.5-0.5B"})
    assert unknown.status_code == 404, unknown.text
    typo = server.live.post(BASE, {"model": "Qwen/Qwen2.5-0.5B", "revison": "main"})
    assert typo.status_code == 422 and "revision" in typo.text


def test_an_agent_downloads_a_gated_model_through_the_mcp_tools(world: tuple[SeededServer, k8s.ApiClient]) -> None:
    """A real MCP client (the bridge over stdio, an operator token) starts a download with a token, follows it
    and reads its status; no tool answer carries the token."""
    server, _ = world
    operator = server.live.make_token("operator")
    token = "hf_" + secrets.token_urlsafe(24)
    said: list[str] = []

    async def agent() -> dict[str, Any]:
        params = StdioServerParameters(command=sys.executable, args=[
            "-m", "app.cli", "mcp", "--url", server.live.url, "--toolsets", "downloads,operations,system"],
            env={**clean_env(), "INSTANTSTART_TOKEN": operator}, cwd=str(ROOT))
        async with Client(params) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert {"downloads_start", "downloads_list", "downloads_get", "downloads_cancel"} <= set(tools)
            assert tools["downloads_get"].annotations and tools["downloads_get"].annotations.read_only_hint
            assert tools["downloads_cancel"].annotations and tools["downloads_cancel"].annotations.destructive_hint

            async def call(tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
                result = await client.call_tool(tool, arguments)
                text = "".join(getattr(c, "text", "") for c in result.content)
                said.append(text + json.dumps(result.structured_content or {}))
                assert not result.is_error, f"{tool}: {text[:2000]}"
                return dict(result.structured_content or json.loads(text))

            started = await call("downloads_start", {"cluster": "hp-eks", "model": "mistralai/Mistral-7B-v0.3",
                                                     "hf_token": token, "include": ["*.json", "*.safetensors"]})
            op_id = started["operation"]["id"]
            for _ in range(20):
                view = await call("operations_wait", {"id": op_id, "timeout": 30})
                if view["status"] in ("succeeded", "failed", "cancelled"):
                    break
            assert view["status"] == "succeeded", view
            return await call("downloads_get", {"cluster": "hp-eks", "id": view["request"]["id"]})

    got = anyio.run(agent)
    assert got["phase"] == "Succeeded" and got["progress"]["files_done"] == got["progress"]["files_total"] == 7
    keys = {o["Key"].rsplit("/", 1)[1] for o in aws(server, "s3").list_objects_v2(
        Bucket=BUCKET, Prefix=f"{PREFIX}models/mistralai--Mistral-7B-v0.3/")["Contents"]}
    assert "README.md" not in keys and "config.json" in keys, "include patterns reached the CLI"
    assert all(token not in text for text in said)


def test_the_pane_starts_a_download_and_shows_its_progress(world: tuple[SeededServer, k8s.ApiClient],
                                                           tmp_path: Path) -> None:
    """The pane rendered without a browser against a product installation on the same sandbox: the token typed
    into it is sent once and cleared, the table shows the finished download with every file."""
    server, _ = world
    operator = Principal("pane-operator", Role.OPERATOR, "t-op", "api")
    viewer = Principal("pane-viewer", Role.VIEWER, "t-view", "api")
    token = "hf_" + secrets.token_urlsafe(24)
    with server.imported(tmp_path / "product", "hp-eks", operator) as services:
        assert DownloadsPane(services.downloads, services.clusters, services.bus, viewer).start_button.disabled
        pane = DownloadsPane(services.downloads, services.clusters, services.bus, operator)
        pn.panel(pane).get_root()  # renders alone, as in a notebook
        assert pane.picker.value == "hp-eks"
        pane.state.model = "google/gemma-2-2b"
        pane.token.value = token
        asyncio.run(pane._start(None))
        assert pane.token.value == "" and "download started" in pane.state.message, pane.state.message
        op = services.engine.list(OperationQuery(kind="model.download", limit=1))[0]
        wait_until(lambda: services.engine.run_until_idle(op.id).status == "succeeded", 60, "the pane's download")
        # its events re-read the pane on the bus's thread (no loop): a read from while it ran, landing after the
        # reload below, would show the download unfinished; let those reads land first
        services.bus.drain()
        pane.state.reload()
        row = pane.table.value.iloc[0]
        assert row["model"] == "google/gemma-2-2b" and row["phase"] == "Succeeded" and row["files"] == "9/9"
        assert row["destination"] == "/s3/models/google--gemma-2-2b"
        assert token not in pane.table.value.to_csv() + pane.state.message
