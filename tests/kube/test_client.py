"""Conformance with the official Python client 37.0.1 over HTTP: typed APIs, CustomObjectsApi,
DynamicClient, watch streams, server-side apply, logs, eviction, scale, and the transport rules."""

from __future__ import annotations

import http.client
import json
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from sandbox.kube import BackgroundServer, Emulator, install_component_crds
from tests.support import wait_until

from .conftest import KubeServer
from .test_semantics import CRD


def _cm(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": labels},
            "data": {"k": "v"}}


def test_typed_api_round_trip(api: client.ApiClient, kube_server: KubeServer, cluster_name: str) -> None:
    core = client.CoreV1Api(api)
    created = core.create_namespaced_config_map("default", _cm("a", app="x"))
    assert created.metadata.uid and created.metadata.resource_version
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_config_map("default", _cm("a"))
    assert exc.value.status == 409
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_config_map("missing", "default")
    assert exc.value.status == 404
    core.create_namespaced_config_map("default", _cm("b", app="y"))
    listed = core.list_config_map_for_all_namespaces(label_selector="app in (x,z)")
    assert [i.metadata.name for i in listed.items] == ["a"]
    current = core.read_namespaced_config_map("a", "default")
    core.patch_namespaced_config_map("a", "default", {"data": {"k": "2"}})
    current.data = {"k": "3"}
    with pytest.raises(ApiException) as exc:
        core.replace_namespaced_config_map("a", "default", current)
    assert exc.value.status == 409
    core.delete_namespaced_config_map("a", "default")
    assert [i.metadata.name for i in core.list_namespaced_config_map("default").items] == ["b"]
    posts = kube_server.emulator.requests_for(cluster_name, "POST")
    assert posts and posts[0].content_type == ""  # the 37.x client sends no Content-Type


def test_version_and_discovery(api: client.ApiClient) -> None:
    info = client.VersionApi(api).get_code()
    assert (info.major, info.minor) == ("1", "31") and info.go_version and info.platform
    groups = {g.name for g in client.ApisApi(api).get_api_versions().groups}
    assert {"apps", "batch", "apiextensions.k8s.io", "rbac.authorization.k8s.io"} <= groups
    resources = {r.name: r for r in client.CoreV1Api(api).get_api_resources().resources}
    assert resources["pods"].short_names == ["po"] and "pods/log" in resources and "pods/status" in resources
    assert resources["nodes"].namespaced is False


def test_custom_objects_and_dynamic_client(api: client.ApiClient) -> None:
    client.ApiextensionsV1Api(api).create_custom_resource_definition(CRD)
    co = client.CustomObjectsApi(api)
    body = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w1", "labels": {"t": "1"}},
            "spec": {"size": "S"}}
    created = co.create_namespaced_custom_object("example.com", "v1", "default", "widgets", body)
    assert created["metadata"]["generation"] == 1 and created["spec"]["replicas"] == 1
    listed = co.list_namespaced_custom_object("example.com", "v1", "default", "widgets", label_selector="t=1")
    assert [i["metadata"]["name"] for i in listed["items"]] == ["w1"]
    everywhere = co.list_cluster_custom_object("example.com", "v1", "widgets")
    assert len(everywhere["items"]) == 1
    status = co.patch_namespaced_custom_object_status("example.com", "v1", "default", "widgets", "w1",
                                                      {"status": {"phase": "Running"}})
    assert status["status"] == {"phase": "Running"}
    dyn = DynamicClient(api)
    widgets = dyn.resources.get(api_version="example.com/v1", kind="Widget")
    assert [w.metadata.name for w in widgets.get(namespace="default").items] == ["w1"]
    applied = dyn.server_side_apply(widgets, body={**body, "metadata": {"name": "w2"}, "spec": {"size": "L"}},
                                    namespace="default", field_manager="tester")
    assert applied.metadata.managedFields[0].manager == "tester"
    again = dyn.server_side_apply(widgets, body={**body, "metadata": {"name": "w2"}, "spec": {"size": "M"}},
                                  namespace="default", field_manager="tester")
    assert again.spec.size == "M"
    _, code, _ = co.patch_namespaced_custom_object_with_http_info(
        "example.com", "v1", "default", "widgets", "w3", {**body, "metadata": {"name": "w3"}},
        field_manager="tester", _content_type="application/apply-patch+yaml")
    assert code == 201


def test_validation_error_is_422_with_causes(api: client.ApiClient) -> None:
    # The typed API validates client-side (pydantic), so send the bad object through DynamicClient.
    deployments = DynamicClient(api).resources.get(api_version="apps/v1", kind="Deployment")
    bad = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
           "spec": {"replicas": "two", "template": {"spec": {"containers": [{"image": "x"}]}}}}
    with pytest.raises(ApiException) as exc:
        deployments.create(body=bad, namespace="default", query_params=[("fieldValidation", "Strict")])
    assert exc.value.status == 422
    status = json.loads(exc.value.body)
    assert status["reason"] == "Invalid"
    assert {c["field"] for c in status["details"]["causes"]} == {
        "spec.replicas", "spec.template.spec.containers[0].name", "spec.selector"}


def test_watch_stream_filters_and_times_out(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_config_map("default", _cm("before", app="ctl"))

    def writer() -> None:
        core.create_namespaced_config_map("default", _cm("w1", app="ctl"))
        core.patch_namespaced_config_map("w1", "default", {"data": {"k": "2"}})
        core.create_namespaced_config_map("default", _cm("other", app="nope"))
        core.delete_namespaced_config_map("w1", "default")

    thread = threading.Thread(target=writer)
    seen: list[tuple[str, str]] = []
    # The stream ends by itself when the server's timeoutSeconds passes (else this loop would never end).
    for event in watch.Watch().stream(core.list_namespaced_config_map, "default", label_selector="app=ctl",
                                      timeout_seconds=2):
        seen.append((event["type"], event["object"].metadata.name))
        if len(seen) == 1:  # the watch is established (its initial ADDED arrived): now write
            thread.start()
    thread.join()
    assert seen == [("ADDED", "before"), ("ADDED", "w1"), ("MODIFIED", "w1"), ("DELETED", "w1")]


def test_watch_from_resource_version_and_410(api: client.ApiClient, kube_server: KubeServer,
                                             cluster_name: str) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_config_map("default", _cm("old"))
    rv = core.list_namespaced_config_map("default").metadata.resource_version
    core.create_namespaced_config_map("default", _cm("new"))
    events = [(e["type"], e["object"].metadata.name) for e in watch.Watch().stream(
        core.list_namespaced_config_map, "default", resource_version=rv, timeout_seconds=1)]
    assert events == [("ADDED", "new")]
    kube_server.emulator.cluster(cluster_name).store.compact()
    with pytest.raises(ApiException) as exc:
        list(watch.Watch().stream(core.list_namespaced_config_map, "default", resource_version=rv,
                                  timeout_seconds=1))
    assert exc.value.status == 410


def test_watch_bookmarks(kube_server: KubeServer, cluster_name: str) -> None:
    status, body = _raw(kube_server, cluster_name, "GET", "/api/v1/namespaces?watch=true&allowWatchBookmarks=true"
                        "&timeoutSeconds=1&resourceVersion=1")
    types = [json.loads(line)["type"] for line in body.decode().splitlines()]
    assert status == 200 and "BOOKMARK" in types


def test_pod_logs_eviction_and_scale(api: client.ApiClient, kube_server: KubeServer, cluster_name: str) -> None:
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"containers": [{"name": "main", "image": "busybox"}]}}
    core.create_namespaced_pod("default", pod)
    emu = kube_server.emulator
    for i in range(5):
        emu.append_log(cluster_name, "default", "p", "main", f"line {i}")
    assert core.read_namespaced_pod_log("p", "default") == "".join(f"line {i}\n" for i in range(5))
    assert core.read_namespaced_pod_log("p", "default", tail_lines=2) == "line 3\nline 4\n"
    stamped = core.read_namespaced_pod_log("p", "default", tail_lines=1, timestamps=True)
    assert stamped.endswith("Z line 4\n")
    emu.append_log(cluster_name, "default", "p", "main", "ancient", ts=time.time() - 3600)
    assert "ancient" not in core.read_namespaced_pod_log("p", "default", since_seconds=60)
    emu.restart_container(cluster_name, "default", "p", "main")
    emu.append_log(cluster_name, "default", "p", "main", "fresh")
    assert core.read_namespaced_pod_log("p", "default") == "fresh\n"
    assert "line 0" in core.read_namespaced_pod_log("p", "default", previous=True)

    def later() -> None:
        emu.append_log(cluster_name, "default", "p", "main", "streamed")
        emu.end_log(cluster_name, "default", "p", "main")

    followed: list[str] = []
    for line in watch.Watch().stream(core.read_namespaced_pod_log, "p", "default"):
        followed.append(line)
        if len(followed) == 1:  # following (the existing line arrived): now the container writes and ends
            threading.Thread(target=later).start()
    assert followed == ["fresh", "streamed"]

    core.create_namespaced_pod_eviction("p", "default", {"apiVersion": "policy/v1", "kind": "Eviction",
                                                         "metadata": {"name": "p", "namespace": "default"}})
    assert core.list_namespaced_pod("default").items == []

    dep = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
           "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "d"}}, "template": {
               "metadata": {"labels": {"app": "d"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}}
    apps.create_namespaced_deployment("default", dep)
    scale = apps.patch_namespaced_deployment_scale("d", "default", {"spec": {"replicas": 4}})
    assert scale.spec.replicas == 4 and apps.read_namespaced_deployment("d", "default").spec.replicas == 4


def _raw(server: KubeServer, cluster: str, method: str, path: str, body: bytes | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    url = urlparse(server.base_url)
    conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=10)
    conn.request(method, f"/k8s/clusters/{cluster}{path}", body=body, headers=headers or {})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, data


def test_table_protobuf_and_keep_alive(kube_server: KubeServer, cluster_name: str) -> None:
    table_accept = {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"}
    status, body = _raw(kube_server, cluster_name, "GET", "/api/v1/namespaces", headers=table_accept)
    doc = json.loads(body)
    assert status == 200 and doc["kind"] == "Table"
    assert [c["name"] for c in doc["columnDefinitions"]] == ["Name", "Status", "Age"]
    assert doc["rows"][0]["cells"][:2] == ["default", "Active"]
    status, body = _raw(kube_server, cluster_name, "POST", "/api/v1/namespaces/default/configmaps",
                        body=b"k8s\x00\x0a\x0f", headers={"Content-Type": "application/vnd.kubernetes.protobuf"})
    assert status == 415 and b"kubectl create -f" in body
    # A DELETE with a body on a kept-alive connection must not corrupt the next response.
    url = urlparse(kube_server.base_url)
    conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=10)
    prefix = f"/k8s/clusters/{cluster_name}/api/v1/namespaces/default/configmaps"
    conn.request("POST", prefix, body=json.dumps(_cm("ka")))
    assert conn.getresponse().read() and True
    conn.request("DELETE", f"{prefix}/ka", body=json.dumps({"propagationPolicy": "Background"}),
                 headers={"Content-Type": "application/json"})
    first = conn.getresponse()
    first.read()
    conn.request("GET", prefix)
    second = conn.getresponse()
    assert (first.status, second.status) == (200, 200) and json.loads(second.read())["items"] == []
    conn.close()


def test_clusters_are_isolated_and_unknown_cluster_is_404(kube_server: KubeServer, cluster_name: str) -> None:
    emu = kube_server.emulator
    emu.ensure_cluster(cluster_name + "-b")
    try:
        _raw(kube_server, cluster_name, "POST", "/api/v1/namespaces/default/configmaps", json.dumps(_cm("only-a"))
             .encode())
        status, body = _raw(kube_server, cluster_name + "-b", "GET", "/api/v1/namespaces/default/configmaps")
        assert status == 200 and json.loads(body)["items"] == []
    finally:
        emu.delete_cluster(cluster_name + "-b")
    status, body = _raw(kube_server, "no-such-cluster", "GET", "/api/v1/namespaces")
    assert status == 404 and json.loads(body)["kind"] == "Status"


def test_state_survives_restart(tmp_path: Path) -> None:
    first = Emulator(tmp_path, debounce=0.01)
    c = first.ensure_cluster("persist")
    install_component_crds(c, "keda")
    so = c.lookup("keda.sh", "v1alpha1", "scaledobjects")
    c.create(so, "default", {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "s"},
                             "spec": {"scaleTargetRef": {"name": "web"}, "triggers": []}})
    wait_until(lambda: not first.controllers("persist").busy(), 30, "KEDA's status written")  # no target: not Ready
    rv = c.store.rv
    first.close()
    second = Emulator(tmp_path)
    try:
        again = second.cluster("persist")
        assert again.store.rv == rv
        so2 = again.lookup("keda.sh", "v1alpha1", "scaledobjects")
        assert again.get(so2, "default", "s")["spec"]["scaleTargetRef"] == {"name": "web"}
        server = BackgroundServer(second).start()
        try:
            kc = second.write_kubeconfig("persist", server.base_url)
            assert kc.exists() and oct(kc.stat().st_mode & 0o777) == "0o600"
        finally:
            server.stop()
    finally:
        second.close()
    assert (tmp_path / "kube" / "requests.jsonl").exists()


def test_every_timestamp_and_age_comes_from_the_emulators_clock(tmp_path: Path) -> None:
    """One clock: given the sandbox's simulated time, objects, managed fields, ages and logs all tell it."""
    now = [1_767_225_600.0]  # 2026-01-01T00:00:00Z, far from the wall clock
    emulator = Emulator(clock=lambda: now[0])
    emulator.ensure_cluster("sim")
    server = BackgroundServer(emulator).start()
    api = config.new_client_from_config(str(emulator.write_kubeconfig("sim", server.base_url, tmp_path / "kc")))
    try:
        core = client.CoreV1Api(api)
        made = core.create_namespaced_config_map("default", _cm("x"), field_manager="tester")
        start = datetime(2026, 1, 1, tzinfo=UTC)
        assert made.metadata.creation_timestamp == start and made.metadata.managed_fields[0].time == start
        now[0] += 7200
        url = urlparse(server.base_url)
        conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=10)
        conn.request("GET", "/k8s/clusters/sim/api/v1/namespaces/default/configmaps/x",
                     headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"})
        table = json.loads(conn.getresponse().read())
        conn.close()
        ages = [cell for column, cell in zip(table["columnDefinitions"], table["rows"][0]["cells"], strict=True)
                if column["name"] == "Age"]
        assert ages == ["120m"]
        core.create_namespaced_pod("default", {"metadata": {"name": "p"},
                                               "spec": {"containers": [{"name": "main", "image": "busybox"}]}})
        emulator.append_log("sim", "default", "p", "main", "old", ts=now[0] - 3600)
        emulator.append_log("sim", "default", "p", "main", "new")
        assert core.read_namespaced_pod_log("p", "default", since_seconds=60) == "new\n"
        assert core.read_namespaced_pod_log("p", "default", timestamps=True, tail_lines=1).startswith(
            "2026-01-01T02:00:00.")
        emulator.use_clock(lambda: now[0] + 86_400)  # handed another clock: existing clusters follow it
        core.create_namespace({"metadata": {"name": "doomed"}})
        deleted = core.delete_namespace("doomed", _preload_content=False)
        assert json.loads(deleted.data)["metadata"]["deletionTimestamp"] == "2026-01-02T02:00:00Z"
    finally:
        api.close()
        server.stop()
