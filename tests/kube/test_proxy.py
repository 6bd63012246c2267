"""The ``services/proxy`` and ``pods/proxy`` subresources through the official client: endpoint choice, the
apiserver's errors, every method relayed, hop-by-hop headers dropped, ``..`` never leaving the proxy, and
each proxied request in the call ledger (not as a write)."""

from __future__ import annotations

import http.client
import json
from typing import Any
from urllib.parse import urlparse

from kubernetes import client

from sandbox.kube import backends
from tests.kube.serving_support import Served, proxy_call, served, serving
from tests.support import wait_until

__all__ = ["served", "serving"]


def _pod(served: Served, name: str, port_name: str = "http", port: int = 8000) -> dict[str, Any]:
    body = {"metadata": {"name": name, "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "web", "image": "nginx",
                                     "ports": [{"name": port_name, "containerPort": port}]}]}}
    served.core.create_namespaced_pod("default", body)

    def ready() -> dict[str, Any] | None:
        pod = served.cluster.store.get(("", "pods"), ("default", name))
        conds = {c["type"]: c["status"] for c in ((pod or {}).get("status") or {}).get("conditions") or []}
        return pod if conds.get("Ready") == "True" else None

    return wait_until(ready, timeout=30, message=f"pod {name} Ready")


def _echo(seen: list[backends.Request], who: str) -> backends.Handler:
    def handle(request: backends.Request) -> backends.Response:
        seen.append(request)
        body = json.dumps({"who": who, "method": request.method, "path": request.path, "query": request.query,
                           "body": request.body.decode()}).encode()
        return backends.Response(201 if request.method == "POST" else 200, body,
                                 [("Content-Type", "application/json"), ("X-Backend", who),
                                  ("Connection", "close"), ("Keep-Alive", "timeout=5")])
    return handle


def _listen(served: Served, pod: dict[str, Any], port: int, seen: list[backends.Request]) -> None:
    meta = pod["metadata"]
    backends.listen(served.cluster, "default", meta["name"], meta["uid"], port, _echo(seen, meta["name"]))


def _service(served: Served, target: int | str = "http", selector: str = "web") -> None:
    served.core.create_namespaced_service("default", {
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": selector}, "ports": [{"name": "api", "port": 80, "targetPort": target}]}})


def test_discovery_lists_the_proxy_subresources(served: Served) -> None:
    resources = {r.name: r for r in served.core.get_api_resources().resources}
    assert "get" in resources["services/proxy"].verbs and "create" in resources["pods/proxy"].verbs


def test_the_service_proxy_relays_every_method_to_a_ready_endpoint(served: Served) -> None:
    seen: list[backends.Request] = []
    _listen(served, _pod(served, "web-a"), 8000, seen)
    _service(served)
    mark = served.ledger.mark()
    base = "/api/v1/namespaces/default/services"
    status, headers, text = proxy_call(served.api, "POST", f"{base}/web:api/proxy/v1/echo?x=1&y=2", {"a": 1},
                                       {"Content-Type": "application/json", "X-Trace": "t1"})
    assert status == 201 and json.loads(text) == {"who": "web-a", "method": "POST", "path": "/v1/echo",
                                                  "query": "x=1&y=2", "body": '{"a": 1}'}
    assert headers["x-backend"] == "web-a" and "keep-alive" not in headers and headers.get("connection") != "close"
    assert seen[-1].header("X-Trace") == "t1" and seen[-1].header("Authorization") == ""  # the token stays here
    for method in ("GET", "PUT", "PATCH", "DELETE", "OPTIONS"):
        status, _, text = proxy_call(served.api, method, f"{base}/http:web:80/proxy/items/", {"b": 2})
        assert status == 200 and json.loads(text)["method"] == method and json.loads(text)["path"] == "/items/"
    status, _, text = proxy_call(served.api, "HEAD", f"{base}/web:80/proxy/")
    assert (status, text, seen[-1].method, seen[-1].path) == (200, "", "HEAD", "/")
    # the generated client's connect_* call reaches the same backend (it encodes the path's slashes; it hands
    # back the JSON it parsed as a str of the Python value)
    answer = served.core.connect_get_namespaced_service_proxy_with_path("web:api", "default", "v1/models")
    assert "'path': '/v1/models'" in answer
    entries = served.ledger.calls(cluster=served.name, since=mark)
    assert [(e["verb"], e["resource"], e["subresource"], e["name"], e["status"], e["write"]) for e in entries][:2] \
        == [("create", "services", "proxy", "web:api", 201, False), ("get", "services", "proxy", "http:web:80", 200,
                                                                      False)]


def test_the_service_proxy_spreads_over_ready_pods_and_resolves_numeric_target_ports(served: Served) -> None:
    seen: list[backends.Request] = []
    for name in ("web-a", "web-b"):
        _listen(served, _pod(served, name, port_name="serve", port=9000), 9000, seen)
    _service(served, target=9000)
    landed = {json.loads(proxy_call(served.api, "GET", "/api/v1/namespaces/default/services/web:api/proxy/")[2])
              ["who"] for _ in range(40)}
    assert landed == {"web-a", "web-b"}


def test_the_proxies_answer_as_the_apiserver_when_nothing_can_answer(served: Served) -> None:
    base = "/api/v1/namespaces/default"
    status, _, text = proxy_call(served.api, "GET", f"{base}/services/nope/proxy/")
    assert status == 404 and json.loads(text)["message"] == 'services "nope" not found'
    _service(served)
    status, _, text = proxy_call(served.api, "GET", f"{base}/services/web:api/proxy/")
    assert (status, json.loads(text)["message"]) == (503, 'no endpoints available for service "web:api"')
    status, _, text = proxy_call(served.api, "GET", f"{base}/services/web:81/proxy/")
    assert (status, json.loads(text)["message"]) == (503, 'no service port 81 found for service "web"')
    pod = _pod(served, "web-a")  # Ready, but nothing listens on its port yet
    status, _, text = proxy_call(served.api, "GET", f"{base}/services/web:api/proxy/")
    assert status == 503 and "connect: connection refused" in json.loads(text)["message"]
    status, _, text = proxy_call(served.api, "GET", f"{base}/services/https:web:api/proxy/")
    assert status == 503 and "plain http only" in json.loads(text)["message"]
    seen: list[backends.Request] = []
    _listen(served, pod, 8000, seen)
    status, _, text = proxy_call(served.api, "GET", f"{base}/pods/web-a/proxy/health")  # its first declared port
    assert status == 200 and json.loads(text)["path"] == "/health"
    status, _, text = proxy_call(served.api, "GET", f"{base}/pods/web-a:8001/proxy/health")
    assert status == 503 and "10.1." in json.loads(text)["message"]
    served.core.delete_namespaced_pod("web-a", "default")
    wait_until(lambda: served.cluster.store.get(("", "pods"), ("default", "web-a")) is None, timeout=30)
    status, _, _ = proxy_call(served.api, "GET", f"{base}/services/web:api/proxy/")
    assert status == 503


def test_dot_dot_segments_never_leave_the_proxy(served: Served) -> None:
    seen: list[backends.Request] = []
    _listen(served, _pod(served, "web-a"), 8000, seen)
    _service(served)
    served.core.create_namespaced_config_map("default", {"metadata": {"name": "c1"}, "data": {"k": "v"}})
    url = urlparse(served.api.configuration.host)
    auth = {"Authorization": served.api.configuration.api_key["BearerToken"]}
    mark = served.ledger.mark()
    answers = {}
    for escape in ("../../../configmaps/c1", "%2e%2e/%2E%2E/..%2fconfigmaps/c1"):
        conn = http.client.HTTPConnection(url.hostname or "", url.port)
        conn.request("GET", f"{url.path}/api/v1/namespaces/default/services/web:api/proxy/{escape}", headers=auth)
        response = conn.getresponse()
        answers[escape] = (response.status, json.loads(response.read()).get("kind"))
        conn.close()
    assert set(answers.values()) == {(200, "ConfigMap")}  # the API request the path names, not the backend
    assert seen == []
    entries = served.ledger.calls(cluster=served.name, since=mark)
    assert {(e["resource"], e["name"], e["subresource"]) for e in entries} == {("configmaps", "c1", "")}
    status, _, text = proxy_call(served.api, "GET", "/api/v1/namespaces/default/services/web:api/proxy/a/./b/../c")
    assert status == 200 and json.loads(text)["path"] == "/a/c"
    client.CoreV1Api(served.api).delete_namespaced_config_map("c1", "default")


def test_repeated_request_headers_reach_the_backend_as_sent(served: Served) -> None:
    seen: list[backends.Request] = []
    _listen(served, _pod(served, "web-a"), 8000, seen)
    url = urlparse(served.api.configuration.host)
    conn = http.client.HTTPConnection(url.hostname or "", url.port)
    conn.putrequest("GET", f"{url.path}/api/v1/namespaces/default/pods/web-a/proxy/page")
    conn.putheader("Authorization", served.api.configuration.api_key["BearerToken"])
    for header, value in (("Cookie", "a=1"), ("Accept", "text/html"), ("Cookie", "b=2"), ("Accept", "*/*")):
        conn.putheader(header, value)
    conn.endheaders()
    assert conn.getresponse().status == 200
    conn.close()
    forwarded = seen[-1].headers  # each line, in order per name (as Go's http.Header keeps them)
    assert [v for k, v in forwarded if k.lower() == "cookie"] == ["a=1", "b=2"]
    assert [v for k, v in forwarded if k.lower() == "accept"] == ["text/html", "*/*"]
