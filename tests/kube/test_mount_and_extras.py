"""The emulator mounted in Panel's Tornado server (the product's way of serving it), token auth, and API
details not covered elsewhere: deletecollection, event field selectors, watch selector transitions."""

from __future__ import annotations

import http.client
import json
import socket
import threading
from typing import Any

from kubernetes import client, watch

from sandbox.kube import Emulator
from tests.support import wait_until

from .conftest import KubeServer


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(port: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path, headers=headers or {})
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp.status, json.loads(body) if body else None


def test_mounted_in_panel_server_with_token() -> None:
    import panel as pn

    emulator = Emulator(None, token="s3cret")
    emulator.ensure_cluster("eks-a")
    port = _free_port()
    server = pn.serve({"/app": lambda: pn.pane.Markdown("hi")}, port=port, address="127.0.0.1", show=False,
                      threaded=True, start=True, extra_patterns=emulator.url_patterns())
    try:
        status, body = wait_until(lambda: _get(port, "/k8s/clusters/eks-a/version", {"Authorization": "Bearer s3cret"}),
                                  60, "the Panel server answering")
        assert status == 200 and body["minor"] == "31"
        status, body = _get(port, "/k8s/clusters/eks-a/api/v1/namespaces")
        assert status == 401 and body["reason"] == "Unauthorized"
        kubeconfig = emulator.kubeconfig("eks-a", f"http://127.0.0.1:{port}")
        assert kubeconfig["clusters"][0]["cluster"]["server"] == f"http://127.0.0.1:{port}/k8s/clusters/eks-a"
        assert kubeconfig["users"][0]["user"]["token"] == "s3cret"
    finally:
        server.stop()


def test_delete_collection_and_event_field_selectors(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    for name, app in (("a", "x"), ("b", "x"), ("c", "y")):
        core.create_namespaced_config_map("default", {"metadata": {"name": name, "labels": {"app": app}}})
    core.delete_collection_namespaced_config_map("default", label_selector="app=x")
    assert [i.metadata.name for i in core.list_namespaced_config_map("default").items] == ["c"]
    for pod in ("p1", "p2"):
        core.create_namespaced_event("default", {
            "metadata": {"name": f"{pod}.evt"}, "reason": "Scheduled", "message": f"placed {pod}", "type": "Normal",
            "involvedObject": {"kind": "Pod", "name": pod, "namespace": "default"}})
    events = core.list_namespaced_event("default", field_selector="involvedObject.name=p2,involvedObject.kind=Pod")
    assert [e.message for e in events.items] == ["placed p2"]


def test_watch_reports_objects_leaving_and_entering_the_selector(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_config_map("default", {"metadata": {"name": "m", "labels": {"team": "a"}}})

    def relabel() -> None:
        core.patch_namespaced_config_map("m", "default", {"metadata": {"labels": {"team": "b"}}})
        core.patch_namespaced_config_map("m", "default", {"metadata": {"labels": {"team": "a"}}})

    seen: list[str] = []
    thread = threading.Thread(target=relabel)
    for event in watch.Watch().stream(core.list_namespaced_config_map, "default", label_selector="team=a",
                                      timeout_seconds=3):
        seen.append(event["type"])
        if len(seen) == 1:  # the watch is established (its initial ADDED arrived): now change the label
            thread.start()
    thread.join()
    assert seen == ["ADDED", "DELETED", "ADDED"]


def test_request_log_records_every_call(api: client.ApiClient, kube_server: KubeServer, cluster_name: str) -> None:
    client.CoreV1Api(api).list_namespaced_pod("default", label_selector="app=z")
    records = kube_server.emulator.requests_for(cluster_name, "GET")
    assert any(r.path.endswith("/api/v1/namespaces/default/pods") and "labelSelector=app%3Dz" in r.query
               and r.status == 200 for r in records)
