"""One OpenAI-compatible request to a deployment: through the Kubernetes API's service proxy, or straight to its
load balancer.

The control plane needs no network path to the pods: the API server proxies ``/api/v1/namespaces/{ns}/services/
{name}:{port}/proxy/{path}`` to the Service, with the cluster's credentials, through the official client's
``ApiClient`` (no port-forward, no subprocess). An external deployment can also be tried the way its users reach
it, at its load balancer's DNS name: the name is resolved once by :func:`egress.check_host` (every answer
checked) and the connection goes to that checked address with the name as the Host header. Either way the call
is capped: the request body is small by construction (the request model caps the prompt), the answer is read up
to :data:`ANSWER_CAP` bytes, the whole call is cut after :data:`TIMEOUT` seconds, and redirects are never
followed (a 3xx is returned as is). Paths are checked by :mod:`services.inference.egress` first.
"""

from __future__ import annotations

import contextlib
import copy
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes import client as k8s

from services.errors import Invalid, Transient
from services.inference import egress
from services.inference.models import EndpointTest, EndpointTestResult

ANSWER_CAP = 64 * 1024
REQUEST_CAP = 16 * 1024
TIMEOUT = 60.0
HEADERS_KEPT = 20


@dataclass(frozen=True)
class Target:
    namespace: str
    service: str
    port: int
    model: str


def payload(request: EndpointTest, model: str) -> tuple[str, dict[str, Any]]:
    """The engine path and JSON body of the test request (at most :data:`REQUEST_CAP` bytes)."""
    if request.api == "chat":
        path, body = "v1/chat/completions", {"model": model, "max_tokens": request.max_tokens,
                                             "messages": [{"role": "user", "content": request.prompt}]}
    else:
        path, body = "v1/completions", {"model": model, "max_tokens": request.max_tokens, "prompt": request.prompt}
    size = len(json.dumps(body))
    if size > REQUEST_CAP:
        raise Invalid(f"the test request is {size} bytes; at most {REQUEST_CAP}")
    return path, body


def _no_redirects(api: k8s.ApiClient) -> k8s.ApiClient:
    """A client with the cluster's configuration whose pool never follows a redirect."""
    cfg = copy.deepcopy(api.configuration)
    cfg.retries = urllib3.Retry(total=0, redirect=0, raise_on_redirect=False, raise_on_status=False)
    return k8s.ApiClient(cfg)


def _text(answer: Any) -> str | None:
    try:
        choice = answer["choices"][0]
        return str(choice["message"]["content"] if "message" in choice else choice["text"])
    except (KeyError, IndexError, TypeError):
        return None


def _result(status: int, content: bytes, headers: Any, elapsed: int, path: str) -> EndpointTestResult:
    truncated = len(content) > ANSWER_CAP
    content = content[:ANSWER_CAP]
    answer: Any
    try:
        answer = json.loads(content) if not truncated else content.decode("utf-8", "replace")
    except ValueError:
        answer = content.decode("utf-8", "replace")
    kept = {k.lower(): str(v)[:200] for k, v in headers.items()
            if k.lower() == "content-type" or k.lower().startswith("x-")}
    return EndpointTestResult(status=status, text=_text(answer), answer=answer, truncated=truncated, elapsed_ms=elapsed,
                      headers=dict(sorted(kept.items())[:HEADERS_KEPT]), path=path)


def read_within(raw: Any, started: float, what: str, timeout: float) -> bytes:
    """At most :data:`ANSWER_CAP` + 1 bytes of the answer ``raw`` (urllib3's, not preloaded), read until ``timeout``
    seconds after the call ``started``: a read still blocked then is cut (the socket's reading half shut), so an
    engine that trickles its answer cannot hold the worker thread longer (a socket timeout is per read)."""
    cut = threading.Event()

    def stop() -> None:
        cut.set()
        with contextlib.suppress(ValueError, RuntimeError, OSError):
            raw.shutdown()

    timer = threading.Timer(max(0.0, started + timeout - time.monotonic()), stop)
    timer.daemon = True
    timer.start()
    try:
        content = bytes(raw.read(ANSWER_CAP + 1))
    except urllib3.exceptions.HTTPError:
        if not cut.is_set():
            raise
        content = b""
    finally:
        timer.cancel()
        raw.release_conn()
    if cut.is_set():
        raise Transient(f"the test call to {what} was still answering after {timeout:.0f} s: cut", delay=5.0)
    return content


def call_load_balancer(host: str, port: int, model: str, request: EndpointTest,
                       resolve: egress.Resolver = socket.getaddrinfo,
                       connect: Callable[..., urllib3.HTTPConnectionPool] = urllib3.HTTPConnectionPool,
                       timeout: float = TIMEOUT) -> EndpointTestResult:
    """The request at the load balancer ``host``: resolved and checked once, then sent to that address
    (``connect`` makes the connection pool to it: urllib3's), the whole answer within ``timeout`` seconds."""
    path, body = payload(request, model)
    clean = "/" + egress.check_path(path)
    address = egress.check_host(host, port, resolve)
    pool = connect(address, port, timeout=urllib3.Timeout(connect=5.0, read=timeout),
                   retries=urllib3.Retry(total=0, redirect=0, raise_on_redirect=False, raise_on_status=False),
                   maxsize=1)
    try:
        started = time.monotonic()
        raw = pool.urlopen("POST", clean, body=json.dumps(body).encode(), redirect=False, preload_content=False,
                           headers={"Host": host if port == 80 else f"{host}:{port}",
                                    "Content-Type": "application/json", "Accept": "application/json"})
        content = read_within(raw, started, host, timeout)
        elapsed = int((time.monotonic() - started) * 1000)
    except urllib3.exceptions.HTTPError as exc:
        raise Transient(f"the test call to {host} failed: {type(exc).__name__}: {exc}", delay=5.0) from exc
    finally:
        pool.close()
    return _result(int(raw.status), content, raw.headers, elapsed, f"http://{host}:{port}{clean}")


def call(api: k8s.ApiClient, target: Target, request: EndpointTest) -> EndpointTestResult:
    path, body = payload(request, target.model)
    url_path = egress.service_proxy_path(target.namespace, target.service, target.port, path)
    client = _no_redirects(api)
    try:
        method, url, headers, data, _ = client.param_serialize(
            "POST", url_path, header_params={"Content-Type": "application/json", "Accept": "application/json"},
            body=body, auth_settings=["BearerToken"])
        started = time.monotonic()
        response = client.call_api(method, url, header_params=headers, body=data, _request_timeout=TIMEOUT)
        raw: Any = response.response
        content = read_within(raw, started, target.service, TIMEOUT)
        elapsed = int((time.monotonic() - started) * 1000)
    except urllib3.exceptions.HTTPError as exc:
        raise Transient(f"the test call to {target.service} failed: {type(exc).__name__}: {exc}", delay=5.0) from exc
    finally:
        client.close()  # type: ignore[no-untyped-call]
    return _result(int(response.status), content, raw.headers, elapsed, url_path)
