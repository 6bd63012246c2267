"""The ``services/proxy`` and ``pods/proxy`` subresources, resolved as kube-apiserver resolves them.

``/api/v1/namespaces/{ns}/services/{[scheme:]name[:port]}/proxy[/{path}]`` (the service registry's
``ResourceLocation``): a port *number* is first turned into the name of the Service port that has it (none:
503 "no service port N found for service"); the endpoints are the Ready, running pods the Service's selector
matches, with the Service port's ``targetPort`` resolved against each pod's container ports (a number as is, a
name through the pod's named ``containerPort``, absent: the Service port); one endpoint is picked at random
(none: 503 "no endpoints available for service"). ``/api/v1/namespaces/{ns}/pods/{[scheme:]name[:port]}/proxy``
goes to the pod's IP at ``port``, or its first declared container port. The request then goes to whatever the
pod's simulated program listens on (:mod:`.backends`); nothing listening reads as the apiserver's dial error
(503 "error trying to reach service: ... connection refused"). Only ``http`` is served: the sandbox's
simulated servers speak no TLS.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Any

from tornado.web import RequestHandler

from . import backends
from .cluster import Cluster
from .errors import ApiError, bad_request, not_found
from .resources import POD_KEY
from .selectors import label_selector_from_match, labels_match, parse_label_selector
from .store import Obj

# RFC 7230 hop-by-hop headers: a proxy neither forwards nor relays them (Go's httputil.ReverseProxy drops these).
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
                        "te", "trailer", "transfer-encoding", "upgrade"})


@dataclass(frozen=True)
class Target:
    pod: Obj
    port: int

    @property
    def address(self) -> str:
        return f"{(self.pod.get('status') or {}).get('podIP', '')}:{self.port}"


def clean_path(path: str) -> str:
    """The request path as the apiserver routes it: empty and ``.`` segments dropped, ``..`` resolved (never
    above ``/``), a trailing slash kept. A ``..`` in a proxy path thus makes the request the API request it
    names, routed and authorized as such, never a way out of the proxy."""
    segs: list[str] = []
    for seg in path.split("/"):
        if seg == "..":
            if segs:
                segs.pop()
        elif seg not in ("", "."):
            segs.append(seg)
    cleaned = "/" + "/".join(segs)
    return cleaned + "/" if segs and path.endswith("/") else cleaned


def unavailable(message: str) -> ApiError:
    return ApiError(503, "ServiceUnavailable", message)


def split_scheme_name_port(ident: str) -> tuple[str, str, str]:
    """apimachinery's ``SplitSchemeNamePort``: ``name``, ``name:port`` or ``scheme:name:port``."""
    parts = ident.split(":")
    if len(parts) == 1:
        scheme, name, port = "", parts[0], ""
    elif len(parts) == 2:
        scheme, name, port = "", parts[0], parts[1]
    elif len(parts) == 3:
        scheme, name, port = parts
    else:
        raise bad_request(f"invalid request {ident!r}")
    if not name or scheme not in ("", "http", "https"):
        raise bad_request(f"invalid request {ident!r}")
    if scheme == "https":
        raise unavailable("error trying to reach service: the InstantStart sandbox's simulated servers speak "
                          "plain http only (use http: or no scheme)")
    return scheme or "http", name, port


def ready_endpoint(pod: Obj) -> bool:
    """A pod the Service proxy sends to: Running, Ready and not being deleted."""
    status = pod.get("status") or {}
    return not pod["metadata"].get("deletionTimestamp") and status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def service_target(cluster: Cluster, namespace: str, ident: str) -> Target:
    _, name, port = split_scheme_name_port(ident)
    service = cluster.store.get(("", "services"), (namespace, name))
    if service is None:
        raise not_found("services", "", name)
    ports: list[dict[str, Any]] = (service.get("spec") or {}).get("ports") or []
    if port.isdigit():
        by_number = next((p for p in ports if int(p.get("port", -1)) == int(port)), None)
        if by_number is None:
            raise unavailable(f'no service port {int(port)} found for service "{name}"')
        port = str(by_number.get("name") or "")
    service_port = next((p for p in ports if str(p.get("name") or "") == port), None)
    selector = (service.get("spec") or {}).get("selector") or {}
    endpoints: list[Target] = []
    if service_port is not None and selector:
        reqs = parse_label_selector(label_selector_from_match({"matchLabels": selector}))
        for _, pod in cluster.store.items(POD_KEY, namespace):
            if not ready_endpoint(pod) or not labels_match(reqs, pod["metadata"].get("labels")):
                continue
            target = str(service_port.get("targetPort", service_port.get("port")))
            number = next((n for c in (pod.get("spec") or {}).get("containers") or []
                           if (n := backends.named_port(c, target)) is not None), None)
            if number is not None:
                endpoints.append(Target(pod, number))
    if not endpoints:
        raise unavailable(f'no endpoints available for service "{ident if port else name}"')
    return random.choice(endpoints)  # the apiserver picks an endpoint at random, as here


def pod_target(cluster: Cluster, namespace: str, ident: str) -> Target:
    _, name, port = split_scheme_name_port(ident)
    pod = cluster.store.get(POD_KEY, (namespace, name))
    if pod is None:
        raise not_found("pods", "", name)
    if not port:
        declared = [p for c in (pod.get("spec") or {}).get("containers") or [] for p in c.get("ports") or []]
        port = str(declared[0]["containerPort"]) if declared else "80"
    if not port.isdigit():
        raise unavailable(f"error trying to reach service: dial tcp: address {port}: invalid port")
    return Target(pod, int(port))


def forward(cluster: Cluster, target: Target, request: backends.Request) -> backends.Response:
    """Send ``request`` to the program listening at the target (the apiserver's dial and round trip)."""
    meta = target.pod["metadata"]
    handler = backends.dial(cluster, meta["namespace"], meta["name"], meta.get("uid", ""), target.port)
    if handler is None or not (target.pod.get("status") or {}).get("podIP"):
        raise unavailable(f"error trying to reach service: dial tcp {target.address}: connect: connection refused")
    headers = [(k, v) for k, v in request.headers if k.lower() not in HOP_BY_HOP | {"authorization"}]
    response = handler(backends.Request(request.method, request.path, request.query, headers, request.body))
    response.headers = [(k, v) for k, v in response.headers if k.lower() not in HOP_BY_HOP | {"content-length"}]
    return response


async def relay(handler: RequestHandler, cluster: Cluster, to_pod: bool, namespace: str, name: str, rest: list[str],
                kube_path: str) -> None:
    """Answer ``handler``'s request to ``services/{name}/proxy/{rest}`` (``pods/`` when ``to_pod``) with the
    backend's answer. The backend runs off the event loop; repeated request headers (several ``Cookie`` or
    ``Accept`` lines) are forwarded as they came."""
    target = (pod_target if to_pod else service_target)(cluster, namespace, name)
    path = "/" + "/".join(rest) + ("/" if rest and kube_path.endswith("/") else "")
    incoming = handler.request
    request = backends.Request(incoming.method or "GET", path, incoming.query, list(incoming.headers.get_all()),
                               incoming.body or b"")
    response = await asyncio.get_running_loop().run_in_executor(None, forward, cluster, target, request)
    handler.set_status(response.status)
    handler.clear_header("Content-Type")
    for key, value in response.headers:
        handler.add_header(key, value)
    handler.finish(response.body)
