"""A cluster's events timeline against a real server in sandbox mode: HyperPod's ListClusterEvents merged with
the Kubernetes Events about its nodes and its pods' warnings, newest first, filtered by node, group, severity,
source, kind, namespace and time, paged with next_cursor (each event once, ties in one second too), the
Kubernetes part from the watch cache alone; the HyperPod part read through the AWS TTL cache (the same question
again costs no AWS call) and paged; a part that cannot be read named in ``errors`` while the rest is answered;
one event's details from DescribeClusterEvent; the same answers through a real MCP client holding a viewer token.

The cluster is made by ``sandbox seed`` (as a user's own would be) and imported. The Kubernetes Events are
written as the node's kubelet, the scheduler and the health agent write them (``core/v1`` Events about a Node
or a Pod).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import boto3
import pytest
from kubernetes import client as k8s
from mcp import Client, StdioServerParameters

from app.bootstrap import Services
from app.sandbox import SANDBOX_ACCESS_KEY
from panels.clusters import ClustersPane
from panels.events import LIMIT, EventsPane
from services.auth import Principal, Role
from services.clusters.events import ClusterEventsQuery, ClusterTimeline, EventSource
from services.clusters.models import ClusterImport
from services.informers import Informers
from services.kube import KubeClients
from tests.ledger import CallLedger
from tests.sandbox_support import SeededServer, seeded_server
from tests.support import ROOT, LiveServer, clean_env, wait_until

pytestmark = pytest.mark.slow
NAME = "ev-eks"
EVENTS = f"/api/v1/clusters/{NAME}/events"
ADMIN = Principal("events-admin", Role.ADMIN, "t-adm", "api")
VIEWER = Principal("events-viewer", Role.VIEWER, "t-view", "ui")


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SeededServer, Services]]:
    """The seeded cluster imported; a second installation of the product (the cluster imported there too)
    stands for the node's kubelet and health agent (it writes Events through the cluster's Kubernetes API) and
    serves the panes."""
    folder = tmp_path_factory.mktemp("events")
    with seeded_server(folder, NAME, nodes=2) as server:
        accepted = server.live.post("/api/v1/clusters/import", {"eks_cluster": NAME, "hyperpod_cluster": NAME})
        assert accepted.status_code == 202, accepted.text
        done = server.live.get(f"/api/v1/operations/{accepted.json()['operation']['id']}/wait?timeout=120").json()
        assert done["status"] == "succeeded", done
        writer = server.product(folder / "writer")
        try:
            view, _ = writer.clusters.import_cluster(ADMIN, ClusterImport(eks_cluster=NAME, hyperpod_cluster=NAME))
            wait_until(lambda: writer.engine.run_until_idle(view.id).status == "succeeded", 60,
                       "the second installation's import")
            yield server, writer
        finally:
            writer.stop()


def aws(server: SeededServer, service: str) -> Any:
    secret = (server.live.data_dir / "sandbox" / "aws-secret-key").read_text().strip()
    return boto3.client(service, endpoint_url=f"http://127.0.0.1:{server.aws_port}", region_name="us-west-2",
                        aws_access_key_id=SANDBOX_ACCESS_KEY, aws_secret_access_key=secret)


def node_event(writer: Services, name: str, kind: str, about: str, kind_of: str = "Node", reason: str = "",
               message: str = "", at: dt.datetime | None = None, namespace: str = "default",
               host: str | None = None) -> None:
    """An Event as the kubelet (on ``host``), the scheduler, the node controller or the health agent records it."""
    stamp = (at or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    k8s.CoreV1Api(writer.kube.api_client(NAME)).create_namespaced_event(namespace, {
        "metadata": {"name": name, "namespace": namespace}, "type": kind, "reason": reason, "message": message,
        "involvedObject": {"kind": kind_of, "name": about, **({"namespace": namespace} if kind_of != "Node" else {})},
        "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 3 if kind == "Warning" else 1,
        "source": {"component": "health-monitoring-agent", **({"host": host} if host else {})}})


def nodes(live: LiveServer) -> list[str]:
    detail = live.get(f"/api/v1/clusters/{NAME}").json()
    return sorted(n["name"] for n in detail["nodes_by_group"]["workers"])


def read(live: LiveServer, token: str | None = None, **params: Any) -> dict[str, Any]:
    answer = live.get(EVENTS, token=token, params=params)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def test_a_cluster_without_continuous_provisioning_still_shows_its_node_events(
        seeded: tuple[SeededServer, Services]) -> None:
    server, writer = seeded
    live, ledger = server.live, CallLedger(server.live)
    first, _second = nodes(live)
    node_event(writer, "xid-1", "Warning", first, reason="NvidiaXidError", message="GPU 0 reported Xid 79")
    node_event(writer, "pod-noise", "Normal", "some-pod", kind_of="Pod", reason="Scheduled", message="not a node")
    mark = ledger.mark()
    # The pod event, written last, is in the watch cache (one watch, in order): both events have arrived, so
    # "no pod events" below is the timeline's filter and not a stream that has not caught up yet.
    wait_until(lambda: any(e["reason"] == "Scheduled" for e in read(live, kind="pod")["events"]), 60,
               "the pod event in the watch cache")
    view = read(live)
    assert any(e["reason"] == "NvidiaXidError" for e in view["events"]), view["events"]
    assert any("NodeProvisioningMode set to Continuous" in e for e in view["errors"]), view["errors"]
    assert [e["source"] for e in view["events"]] == ["kubernetes"], "only the node event: no pod events"
    xid = view["events"][0]
    assert (xid["node"], xid["severity"], xid["resource"], xid["count"]) == (first, "warning", "Node", 3)
    assert xid["group"] == "workers" and xid["instance_id"] == first.removeprefix("hyperpod-")
    assert xid["message"] == "GPU 0 reported Xid 79"
    refused = ledger.calls(service="sagemaker", operation="ListClusterEvents", since=mark)
    assert refused and all(e["status"] == 400 for e in refused), refused
    again = ledger.mark()
    for _ in range(3):
        assert read(live)["errors"] == view["errors"]
    assert len(ledger.calls(service="sagemaker", operation="ListClusterEvents", since=again)) <= 1, \
        "the refusal is cached like an answer: asked again within the TTL, AWS is not"
    ledger.assert_no_writes(since=mark)


def test_the_timeline_merges_filters_and_is_read_once_per_ttl(seeded: tuple[SeededServer, Services]) -> None:
    server, writer = seeded
    live, ledger = server.live, CallLedger(server.live)
    first, second = nodes(live)
    aws(server, "sagemaker").update_cluster(ClusterName=NAME, NodeProvisioningMode="Continuous")  # the user's
    node_event(writer, "ready-2", "Normal", second, reason="NodeReady", message="Node became ready")
    node_event(writer, "ecc-1", "Warning", first, reason="GpuEccError", message="GPU 1 reported an ECC error")
    wait_until(lambda: {"NodeReady", "GpuEccError"} <= {e["reason"] for e in read(live, source="kubernetes")["events"]},
               60, "both node events in the timeline")

    mark = ledger.mark()
    view = read(live, refresh="true")
    assert view["errors"] == [], view["errors"]
    times = [e["time"] for e in view["events"]]
    assert times == sorted(times, reverse=True), "newest first"
    assert {e["source"] for e in view["events"]} == {"hyperpod", "kubernetes"}
    hyperpod = [e for e in view["events"] if e["source"] == "hyperpod"]
    assert hyperpod[0]["message"] == "Cluster update requested." and hyperpod[0]["resource"] == "Cluster"
    joined = {e["node"] for e in hyperpod if e["message"] == "Instance is Running and joined the cluster."}
    assert joined == {first, second}, "HyperPod's instance ids shown as the Kubernetes nodes they are"
    assert all(e["group"] == "workers" and e["event_id"] for e in hyperpod if e["resource"] == "Instance")
    for _ in range(5):
        assert read(live)["events"] == view["events"]
    listed = ledger.succeeded("sagemaker", "ListClusterEvents", since=mark)
    assert len(listed) == 1, "five reads within the TTL cost one AWS call"
    assert listed[0]["request"]["SortOrder"] == "Descending"

    only = read(live, node=first.removeprefix("hyperpod-"))  # the node by its instance id
    assert only["events"] and {e["node"] for e in only["events"]} == {first}
    assert {e["source"] for e in only["events"]} == {"hyperpod", "kubernetes"}
    sent = ledger.succeeded("sagemaker", "ListClusterEvents", since=mark)[-1]["request"]
    assert sent["NodeId"] == first.removeprefix("hyperpod-"), "HyperPod filters the instance itself"
    assert {e["node"] for e in read(live, node=first)["events"]} == {first}, "or by its node name"
    warnings = read(live, severity="warning")["events"]
    assert warnings and all(e["severity"] in ("warning", "error") for e in warnings)
    assert any(e["reason"] == "GpuEccError" for e in warnings)
    assert not any(e["reason"] == "NodeReady" for e in warnings)
    assert {e["source"] for e in read(live, source="hyperpod")["events"]} == {"hyperpod"}
    group = read(live, group="workers")["events"]
    assert group and all(e["group"] == "workers" for e in group)
    assert any(e["source"] == "kubernetes" for e in group), "the group's node events come with it"
    assert read(live, group="nobody")["events"] == []
    middle = view["events"][len(view["events"]) // 2]["time"]
    later = read(live, since=middle)["events"]
    assert later and len(later) < len(view["events"]) and all(e["time"] >= middle for e in later)
    newest = dt.datetime.fromisoformat(view["events"][0]["time"].replace("Z", "+00:00"))
    assert read(live, since=(newest + dt.timedelta(seconds=1)).isoformat())["events"] == []
    cut = read(live, limit=2)
    assert len(cut["events"]) == 2 and cut["truncated"] and cut["events"] == view["events"][:2]

    event_id = next(e["event_id"] for e in hyperpod if e["resource"] == "Instance")
    before = ledger.mark()
    detail = live.get(f"{EVENTS}/{event_id}").json()
    assert detail["event"]["event_id"] == event_id and detail["event"]["node"] in (first, second)
    assert live.get(f"{EVENTS}/{event_id}").json() == detail
    assert len(ledger.succeeded("sagemaker", "DescribeClusterEvent", since=before)) == 1
    ledger.assert_no_writes(since=mark)


def test_pod_warnings_join_the_timeline_from_the_watch_cache_filtered_and_paged(
        seeded: tuple[SeededServer, Services]) -> None:
    server, writer = seeded
    live, ledger = server.live, CallLedger(server.live)
    first, second = nodes(live)
    core = k8s.CoreV1Api(writer.kube.api_client(NAME))
    for namespace in ("team-a", "team-b"):
        core.create_namespace({"metadata": {"name": namespace}})
    core.create_namespaced_pod("team-a", {"metadata": {"name": "trainer-0"}, "spec": {
        "nodeName": first, "containers": [{"name": "main", "image": "busybox"}]}})
    now = dt.datetime.now(dt.UTC)
    node_event(writer, "backoff-1", "Warning", "trainer-0", kind_of="Pod", namespace="team-a", reason="BackOff",
               message="Back-off restarting failed container main")
    node_event(writer, "pulled-1", "Normal", "trainer-0", kind_of="Pod", namespace="team-a", reason="Pulled",
               message="Container image busybox pulled")
    node_event(writer, "evicted-1", "Warning", "gone-0", kind_of="Pod", namespace="team-a", reason="Evicted",
               message="The node was low on resource: memory.", host=second)  # the pod is gone: the kubelet's node
    for minutes, reason in ((3, "FailedScheduling"), (2, "FailedMount"), (1, "BackOff")):
        node_event(writer, f"ghost-{minutes}", "Warning", "ghost-0", kind_of="Pod", namespace="team-b",
                   reason=reason, message=f"{reason} of ghost-0", at=now - dt.timedelta(minutes=minutes))
    wait_until(lambda: len(read(live, kind="pod", namespace="team-b")["events"]) == 3
               and any(e["pod"] == "trainer-0" and e["node"] for e in read(live, kind="pod")["events"]), 60,
               "the pod events in the timeline, trainer-0 on its node")

    mark = ledger.mark()
    shown = read(live)["events"]
    reasons = {(e["pod"], e["reason"]) for e in shown if e["resource"] == "Pod"}
    assert {("trainer-0", "BackOff"), ("gone-0", "Evicted"), ("ghost-0", "FailedScheduling")} <= reasons
    assert ("trainer-0", "Pulled") not in reasons, "a pod's Normal events only when pods are asked for"
    backoff = next(e for e in shown if e["pod"] == "trainer-0" and e["reason"] == "BackOff")
    assert (backoff["namespace"], backoff["node"], backoff["group"], backoff["severity"], backoff["source"]) == (
        "team-a", first, "workers", "warning", "kubernetes")

    pods = read(live, kind="pod")["events"]
    assert pods and all(e["resource"] == "Pod" for e in pods), "no node or HyperPod events"
    assert ("trainer-0", "Pulled") in {(e["pod"], e["reason"]) for e in pods}
    assert all(e["resource"] == "Node" for e in read(live, kind="node")["events"])
    team_a = read(live, namespace="team-a")["events"]
    assert {(e["pod"], e["reason"]) for e in team_a} == {("trainer-0", "BackOff"), ("gone-0", "Evicted")}
    on_first = read(live, node=first, source="kubernetes")["events"]
    assert ("trainer-0", "BackOff") in {(e["pod"], e["reason"]) for e in on_first}
    assert not any(e["pod"] in ("gone-0", "ghost-0") for e in on_first), "another node's and an unscheduled pod's"
    assert ("gone-0", "Evicted") in {(e["pod"], e["reason"]) for e in read(live, node=second)["events"]}

    page = read(live, namespace="team-b", limit=2)
    assert [e["reason"] for e in page["events"]] == ["BackOff", "FailedMount"] and page["truncated"]
    older = read(live, namespace="team-b", limit=2, cursor=page["next_cursor"])
    assert [e["reason"] for e in older["events"]] == ["FailedScheduling"], "the boundary is exclusive"
    assert not older["truncated"] and older["next_cursor"] is None

    lists = [e for e in ledger.calls(since=mark, verb="list") if e.get("resource") in ("events", "pods")]
    assert lists == [], "the pod events and their nodes come from the watch caches: no list per read"
    ledger.assert_no_writes(since=mark)

    second_ago = now - dt.timedelta(minutes=5)
    for number in range(7):  # more than a page of events in one second (Kubernetes' timestamps are seconds)
        node_event(writer, f"mount-{number}", "Warning", "loader-0", kind_of="Pod", namespace="team-b",
                   reason="FailedMount", message=f"volume {number} not attached", at=second_ago)
    wait_until(lambda: len(read(live, namespace="team-b", kind="pod", limit=20)["events"]) == 10, 60,
               "the seven events in the timeline")
    seen: list[str] = []
    pages = 0
    cursor: str | None = None
    while pages < 10:  # a cursor that does not move on fails here instead of looping
        page = read(live, namespace="team-b", kind="pod", since=(second_ago - dt.timedelta(seconds=1)).isoformat(),
                    limit=3, **({"cursor": cursor} if cursor else {}))
        seen += [e["message"] for e in page["events"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    mounts = sorted(f"volume {n} not attached" for n in range(7))
    assert sorted(m for m in seen if m.startswith("volume")) == mounts, "each event of the second exactly once"
    assert len(seen) == 10 and len(set(seen)) == 10 and pages == 4, (pages, seen)


def test_a_long_history_is_read_page_by_page_until_the_answer_is_full(seeded: tuple[SeededServer, Services]) -> None:
    server = seeded[0]
    live, ledger = server.live, CallLedger(server.live)
    sagemaker = aws(server, "sagemaker")
    for _ in range(120):  # each update the user makes is one HyperPod event
        sagemaker.update_cluster(ClusterName=NAME, NodeProvisioningMode="Continuous")
    mark = ledger.mark()
    view = read(live, source="hyperpod", limit=110, refresh="true")
    calls = ledger.succeeded("sagemaker", "ListClusterEvents", since=mark)
    assert len(calls) == 2, "110 events are two pages of 100"
    assert calls[0]["request"]["MaxResults"] == 100 and "NextToken" not in calls[0]["request"]
    assert calls[1]["request"]["NextToken"], "the second page continues the first"
    assert len(view["events"]) == 110 and view["truncated"], "more than 110 events exist"
    assert [e["message"] for e in view["events"]] == ["Cluster update requested."] * 110
    times = [e["time"] for e in view["events"]]
    assert times == sorted(times, reverse=True)
    one_page = ledger.mark()
    assert len(read(live, source="hyperpod", limit=20)["events"]) == 20
    assert len(ledger.succeeded("sagemaker", "ListClusterEvents", since=one_page)) == 1, "20 events: one page"
    ids: list[str] = []
    cursor: str | None = None
    for _ in range(10):  # every HyperPod event once, by the cursor (EventTimeBefore plus the EventId tie-break)
        page = read(live, source="hyperpod", limit=100, **({"cursor": cursor} if cursor else {"refresh": "true"}))
        ids += [e["event_id"] for e in page["events"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert cursor is None and len(ids) == len(set(ids)) >= 120, (len(ids), len(set(ids)))


def test_bad_filters_are_refused_with_the_reason(seeded: tuple[SeededServer, Services]) -> None:
    live = seeded[0].live
    bad_node = live.get(EVENTS, params={"node": "worker-7"})
    assert bad_node.status_code == 422 and "neither a HyperPod node" in bad_node.json()["error"]["message"]
    assert bad_node.json()["error"]["details"]["nodes"] == nodes(live)
    naive = live.get(EVENTS, params={"since": "2026-12-01T18:00:00"})
    assert naive.status_code == 422 and "since" in naive.text, naive.text
    assert live.get(EVENTS, params={"severity": "fatal"}).status_code == 422
    for cursor in ("not-a-cursor", "W10", "WyJ4IiwgInkiXQ"):  # not base64 JSON; []; ["x", "y"] (no time)
        bad_cursor = live.get(EVENTS, params={"cursor": cursor})
        assert bad_cursor.status_code == 422 and "not a next_cursor" in bad_cursor.text, (cursor, bad_cursor.text)
    for malformed in ("not-an-event", "-" * 36, "0" * 36, "00000000-0000-0000-0000-00000000000G",
                      "ABCDEF00-0000-0000-0000-000000000000"):  # the API's EventId: lowercase 8-4-4-4-12
        bad_id = live.get(f"{EVENTS}/{malformed}")
        assert bad_id.status_code == 422 and "not a HyperPod event id" in bad_id.text, (malformed, bad_id.text)
    unknown = live.get(f"{EVENTS}/00000000-0000-0000-0000-000000000000")
    assert unknown.status_code == 404, unknown.text
    missing = live.get("/api/v1/clusters/nowhere/events")
    assert missing.status_code == 404 and "no cluster named 'nowhere'" in missing.text


def test_hyperpod_events_do_not_wait_for_a_node_list_that_hangs(seeded: tuple[SeededServer, Services],
                                                                  tmp_path: Path) -> None:
    """source=hyperpod answers while the nodes informer's first list is still unanswered: it never waits
    for it (the Kubernetes API here accepts connections and never replies)."""
    writer = seeded[1]
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "silent",
        "clusters": [{"name": "silent", "cluster": {"server": f"http://127.0.0.1:{silent.getsockname()[1]}"}}],
        "contexts": [{"name": "silent", "context": {"cluster": "silent", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    kube = KubeClients(writer.aws, writer.clock)
    kube.register_kubeconfig(NAME, kubeconfig)
    informers = Informers(kube, writer.bus)
    timeline = ClusterTimeline(writer.clusters.registry, writer.aws, writer.clusters.cache, informers)
    try:
        view = timeline.list_events(VIEWER, NAME, ClusterEventsQuery(source=EventSource.HYPERPOD), wait=3600.0)
        assert not informers.get(NAME, "nodes").attempted.is_set(), "answered before the node list gave up"
        assert all(e.source == EventSource.HYPERPOD for e in view.events)
    finally:
        informers.stop()
        silent.close()


async def _tool(client: Client, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    text = "".join(getattr(c, "text", "") for c in result.content)
    assert not result.is_error, f"{tool} {json.dumps(arguments)}: {text[:2000]}"
    return dict(result.structured_content or {})


def test_an_agent_with_a_viewer_token_reads_the_timeline_through_the_bridge(
        seeded: tuple[SeededServer, Services], tmp_path: Path) -> None:
    live = seeded[0].live
    viewer = live.make_token("viewer")
    first = nodes(live)[0]
    node_event(seeded[1], "oom-1", "Warning", first, reason="SystemOOM", message="System OOM encountered")
    wait_until(lambda: any(e["reason"] == "SystemOOM" for e in read(live, source="kubernetes")["events"]), 60,
               "the agent's node event in the timeline")

    async def agent() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        params = StdioServerParameters(command=sys.executable, args=["-m", "app.cli", "mcp", "--url", live.url,
                                                                      "--toolsets", "all"],
                                       env={**clean_env(), "INSTANTSTART_TOKEN": viewer}, cwd=str(ROOT))
        async with Client(params) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            for name in ("clusters_events_list", "clusters_events_get"):
                hints = tools[name].annotations
                assert hints is not None and hints.read_only_hint and not hints.destructive_hint, name
            timeline = await _tool(client, "clusters_events_list", {"cluster": NAME, "severity": "warning"})
            event_id = next(e["event_id"] for e in (await _tool(client, "clusters_events_list", {
                "cluster": NAME, "source": "hyperpod", "limit": 5}))["events"])
            detail = await _tool(client, "clusters_events_get", {"cluster": NAME, "event_id": event_id})
            refused = await client.call_tool("clusters_events_list", {"cluster": NAME, "node": "worker-7"})
            return timeline, detail, {"is_error": refused.is_error,
                                      "text": "".join(getattr(c, "text", "") for c in refused.content)}

    timeline, detail, refused = anyio.run(agent)
    assert timeline["cluster"] == NAME and any(e["reason"] == "SystemOOM" for e in timeline["events"])
    assert all(e["severity"] in ("warning", "error") for e in timeline["events"])
    assert detail["event"]["source"] == "hyperpod" and detail["event"]["event_id"]
    assert refused["is_error"] and "neither a HyperPod node" in refused["text"]


def test_the_cluster_page_shows_the_timeline_filters_it_and_redraws_on_a_node_event(
        seeded: tuple[SeededServer, Services]) -> None:
    """Rendered without a browser and without a loop (as in a script): reads are synchronous, a bus event
    redraws on its delivery thread."""
    live, writer = seeded[0].live, seeded[1]
    first = nodes(live)[0]
    node_event(writer, "pane-info-1", "Normal", first, reason="NodeHasSufficientMemory", message="memory ok")
    node_event(writer, "pane-warn-1", "Warning", first, reason="NodeHasDiskPressure", message="disk pressure")
    wait_until(lambda: {"NodeHasSufficientMemory", "NodeHasDiskPressure"} <= {
        e.reason for e in writer.timeline.list_events(VIEWER, NAME, ClusterEventsQuery(source=EventSource.KUBERNETES))
        .events}, 60, "the node events in the cache")
    page = ClustersPane(writer.clusters, writer.bus, VIEWER, operations=writer.operations, timeline=writer.timeline)
    assert page.events is not None and page.events.state.cluster == NAME, "the selected cluster's timeline"
    pane = page.events
    assert pane.state.view is not None and pane.state.view.events, pane.state.message
    assert "<table class='events-table'>" in pane.timeline.object
    assert "data-severity='info'" in pane.timeline.object
    pane.state.severity = "warning"
    assert pane.state.view.events and all(e.severity != "info" for e in pane.state.view.events)
    assert "data-severity='info'" not in pane.timeline.object
    pane.state.node = "worker 7"  # not a node name: said in the message, the timeline kept
    assert pane.state.message.startswith("invalid filter") and pane.state.view.events
    pane.state.node = ""

    node_event(writer, "script-1", "Warning", first, reason="Probe", message="<b>disk</b> pressure")
    wait_until(lambda: "&lt;b&gt;disk&lt;/b&gt; pressure" in pane.timeline.object, 60,
               "the new node event drawn, escaped, without a refresh asked")
    alone = EventsPane(writer.timeline, writer.bus, VIEWER, cluster=NAME)  # embeddable: a notebook shows it alone
    alone.state.source = "kubernetes"  # the sandbox's HyperPod clock runs ahead: its events sort first
    assert alone.state.view is not None and any(e.reason == "Probe" for e in alone.state.view.events)


def test_a_read_in_flight_when_a_filter_is_refused_does_not_clear_the_refusal(
        seeded: tuple[SeededServer, Services]) -> None:
    """A read asked with the filters as they were (a kube event's) lands after the user typed a malformed node:
    the refusal stays said and the timeline it kept stays shown."""
    writer = seeded[1]
    pane = EventsPane(writer.timeline, writer.bus, VIEWER, cluster=NAME)  # no loop: the first read is here
    pane._kube.close()  # the only reads below are the two this test starts
    kept = pane.state.view
    assert kept is not None and pane.state.message == "", pane.state.message

    async def main() -> None:
        asked = pane.state._newest._asked
        in_flight = asyncio.ensure_future(pane.state.refresh())
        await asyncio.sleep(0)  # the task's first step: it asks, then waits on its worker
        assert pane.state._newest._asked == asked + 1, "the read was not asked before the filter changed"
        pane.state.node = "worker 7"  # refused at once, here (the pane has no loop to read on)
        assert pane.state.message.startswith("invalid filter")
        await in_flight

    asyncio.run(main())
    assert pane.state.message.startswith("invalid filter"), "an answer to the earlier filters cleared the refusal"
    assert pane.state.view is kept


def test_the_pane_pages_older_and_back_to_the_newest(seeded: tuple[SeededServer, Services]) -> None:
    server, writer = seeded
    sagemaker = aws(server, "sagemaker")
    listed = read(server.live, source="hyperpod", limit=500, refresh="true")["events"]
    for _ in range(LIMIT + 1 - len(listed)):  # more HyperPod events than one page of the pane
        sagemaker.update_cluster(ClusterName=NAME, NodeProvisioningMode="Continuous")
    pane = EventsPane(writer.timeline, writer.bus, VIEWER, cluster=NAME)
    pane.state.source = "hyperpod"
    newest = pane.state.view
    assert newest is not None and newest.truncated and newest.next_cursor, pane.state.message
    assert len(newest.events) == LIMIT and not pane.older_button.disabled and pane.newest_button.disabled
    pane.older_button.clicks += 1  # a bus event may redraw meanwhile from its own thread: wait for the page
    shown = {e.event_id for e in newest.events}
    older = wait_until(lambda: (v := pane.state.view) is not None and v.events and v.events[0].event_id not in shown
                       and v, 60, "the older page")
    assert pane.state.cursor == newest.next_cursor
    assert not {e.event_id for e in older.events} & shown, "no event shown twice"
    assert older.events[0].time <= newest.events[-1].time and not pane.newest_button.disabled
    pane.newest_button.clicks += 1
    wait_until(lambda: (v := pane.state.view) is not None and [e.event_id for e in v.events] == [
        e.event_id for e in newest.events], 60, "the newest page again")
    assert pane.state.cursor == "" and pane.newest_button.disabled
    pane.older_button.clicks += 1
    pane.state.severity = "warning"  # a filter change starts at the newest again
    assert pane.state.cursor == "" and pane.newest_button.disabled
