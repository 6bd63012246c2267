"""One OpenAI-compatible request to a deployment, through the Kubernetes API's service proxy.

The control plane needs no network path to the pods: the API server proxies ``/api/v1/namespaces/{ns}/services/
{name}:{port}/proxy/{path}`` to the Service, with the cluster's credentials, through the official client's
``ApiClient`` (no port-forward, no subprocess). The call is capped: the request body is small by construction
(the request model caps the prompt), the answer is read up to :data:`ANSWER_CAP` bytes, the whole call is cut
after :data:`TIMEOUT` seconds, and the client is built never to follow a redirect (a 3xx is returned as is).
The path is checked by :mod:`services.inference.egress` first.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes import client as k8s

from services.errors import Invalid, Transient
from services.inference import egress
from services.inference.models import TestRequest, TestResult

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


def payload(request: TestRequest, model: str) -> tuple[str, dict[str, Any]]:
    if request.api == "chat":
        return "v1/chat/completions", {"model": model, "max_tokens": request.max_tokens,
                                       "messages": [{"role": "user", "content": request.prompt}]}
    return "v1/completions", {"model": model, "max_tokens": request.max_tokens, "prompt": request.prompt}


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


def call(api: k8s.ApiClient, target: Target, request: TestRequest) -> TestResult:
    path, body = payload(request, target.model)
    url_path = egress.service_proxy_path(target.namespace, target.service, target.port, path)
    encoded = json.dumps(body)
    if len(encoded) > REQUEST_CAP:
        raise Invalid(f"the test request is {len(encoded)} bytes; at most {REQUEST_CAP}")
    client = _no_redirects(api)
    try:
        method, url, headers, data, _ = client.param_serialize(
            "POST", url_path, header_params={"Content-Type": "application/json", "Accept": "application/json"},
            body=body, auth_settings=["BearerToken"])
        started = time.monotonic()
        response = client.call_api(method, url, header_params=headers, body=data, _request_timeout=TIMEOUT)
        raw: Any = response.response
        try:
            content = raw.read(ANSWER_CAP + 1)
        finally:
            raw.release_conn()
        elapsed = int((time.monotonic() - started) * 1000)
    except urllib3.exceptions.HTTPError as exc:
        raise Transient(f"the test call to {target.service} failed: {type(exc).__name__}: {exc}", delay=5.0) from exc
    finally:
        client.close()  # type: ignore[no-untyped-call]
    truncated = len(content) > ANSWER_CAP
    content = content[:ANSWER_CAP]
    answer: Any
    try:
        answer = json.loads(content) if not truncated else content.decode("utf-8", "replace")
    except ValueError:
        answer = content.decode("utf-8", "replace")
    kept = {k.lower(): str(v)[:200] for k, v in raw.headers.items()
            if k.lower() == "content-type" or k.lower().startswith("x-")}
    return TestResult(status=int(response.status), text=_text(answer), answer=answer,
                      headers=dict(sorted(kept.items())[:HEADERS_KEPT]), truncated=truncated, elapsed_ms=elapsed,
                      path=url_path)
