"""The front of the sandbox's SageMaker managed MLflow: ``/_sandbox/mlflow/…`` on the sandbox's AWS port.

``SAGEMAKER_MLFLOW_CUSTOM_ENDPOINT`` points the ``sagemaker-mlflow`` plugin here (the product's server sets
it for itself and for the sandbox's workloads), so a client whose tracking URI is a tracking server's ARN
sends ``<endpoint>/api/2.0/mlflow/…`` exactly as it would to ``https://<region>.experiments.sagemaker.aws``.
Each request is checked as SageMaker checks it before it is relayed to the one real ``mlflow server``
(:mod:`sandbox.mlflow_server`):

* a SigV4 ``Authorization`` header whose credential scope is the ``sagemaker-mlflow`` service in the
  tracking server's region (else 403 ``MissingAuthenticationToken`` / ``InvalidSignatureException``; like
  the rest of the sandbox's AWS endpoint, any credentials are accepted);
* the ``x-mlflow-sm-tracking-server-arn`` header naming a tracking server that exists (else 404
  ``RESOURCE_DOES_NOT_EXIST``) and is Created (else 400 ``INVALID_STATE``: still Creating, Stopped …).

``GET /_sandbox/mlflow/auth?authToken=…`` redeems a presigned UI link
(``CreatePresignedMlflowTrackingServerUrl``) once, before it expires, and redirects to the MLflow UI.
Every relayed call goes to the call ledger (service ``sagemaker-mlflow``, operation the MLflow REST path).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

from tornado.web import RequestHandler

from sandbox.mlflow_server import MlflowServer, MlflowUnavailable

if TYPE_CHECKING:
    from sandbox.aws.mlflow import MlflowTrackingServers
    from sandbox.ledger import Ledger

PREFIX = "/_sandbox/mlflow"
ARN_HEADER = "x-mlflow-sm-tracking-server-arn"
SIGNING_NAME = "sagemaker-mlflow"
_SCOPE = re.compile(r"^AWS4-HMAC-SHA256 Credential=([^/\s,]+)/(\d{8})/([^/\s,]+)/([^/\s,]+)/aws4_request,"
                    r"\s*SignedHeaders=[^,\s]+,\s*Signature=[0-9a-f]{64}$")
_ARN = re.compile(r"^arn:aws[a-z-]*:sagemaker:([a-z0-9-]+):\d{12}:mlflow-tracking-server/.+$")
_DROP = frozenset({"authorization", "host", "connection", "content-length", "transfer-encoding", "accept-encoding",
                   ARN_HEADER})  # accept-encoding: the answer is relayed as it comes, never re-encoded
_READS = ("get", "search", "list")
_log = logging.getLogger("sandbox.mlflow.proxy")


def endpoint(aws_base_url: str) -> str:
    """The value of ``SAGEMAKER_MLFLOW_CUSTOM_ENDPOINT`` for a sandbox whose AWS front is ``aws_base_url``."""
    return f"{aws_base_url.rstrip('/')}{PREFIX}"


def _refusal(headers: Any, servers: MlflowTrackingServers) -> tuple[int, str, str] | None:
    """What SageMaker answers instead of relaying: (status, error code, message), or None to relay."""
    auth = _SCOPE.match(headers.get("Authorization", ""))
    if auth is None:
        return 403, "MissingAuthenticationToken", ("Missing Authentication Token: sign the request with SigV4 "
                                                   f"for the {SIGNING_NAME} service (the sagemaker-mlflow plugin)")
    arn = headers.get(ARN_HEADER, "")
    found = _ARN.match(arn)
    if found is None:
        return 400, "INVALID_PARAMETER_VALUE", (f"the {ARN_HEADER} header must name a tracking server ARN "
                                                f"(got {arn!r}): set the tracking URI to the server's ARN")
    if auth.group(4) != SIGNING_NAME or auth.group(3) != found.group(1):
        return 403, "InvalidSignatureException", (f"Credential should be scoped to a valid region "
                                                  f"({found.group(1)}) and service ({SIGNING_NAME}), not "
                                                  f"{auth.group(3)}/{auth.group(4)}")
    ok, why = servers.serving(arn)
    if not ok:
        return (404, "RESOURCE_DOES_NOT_EXIST", why) if "does not exist" in why else (400, "INVALID_STATE", why)
    return None


class _Proxy(RequestHandler):
    def initialize(self, servers: MlflowTrackingServers, mlflow: MlflowServer, ledger: Ledger | None) -> None:
        self.servers = servers
        self.mlflow = mlflow
        self.ledger = ledger

    def check_xsrf_cookie(self) -> None:
        """SigV4-signed API calls, no cookies."""

    def compute_etag(self) -> None:
        return None

    def _error(self, status: int, code: str, message: str) -> None:
        self._record(status, code)
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"error_code": code, "message": message}))

    def _record(self, status: int, error: str | None) -> None:
        if self.ledger is None:
            return
        operation = self.path_args[0] if self.path_args else ""
        verb = operation.rpartition("/")[2]
        self.ledger.record({
            "kind": "aws", "service": SIGNING_NAME, "operation": operation,
            "target": self.request.headers.get(ARN_HEADER, ""), "request": None, "status": status, "error": error,
            "write": self.request.method != "GET" and not verb.startswith(_READS),
            "caller": {"access_key": "", "user_agent": self.request.headers.get("User-Agent", "")}})

    async def _relay(self, path: str) -> None:
        refusal = _refusal(self.request.headers, self.servers)
        if refusal is not None:
            self._error(*refusal)
            return
        headers = {k: v for k, v in self.request.headers.get_all() if k.lower() not in _DROP
                   and not k.lower().startswith("x-amz-")}
        query = f"?{self.request.query}" if self.request.query else ""
        body = self.request.body if self.request.method in ("POST", "PUT", "PATCH") else None
        method = self.request.method or "GET"
        def send() -> tuple[int, dict[str, str], bytes]:
            return self._send(method, f"/{path}{query}",
                                                                                          headers, body)
        try:
            status, answer_headers, data = await asyncio.get_running_loop().run_in_executor(None, send)
        except MlflowUnavailable as exc:
            self._error(503, "SERVICE_UNAVAILABLE", str(exc))
            return
        self._record(status, None if status < 400 else str(status))
        self.set_status(status)
        for key in ("Content-Type",):
            if key in answer_headers:
                self.set_header(key, answer_headers[key])
        self.finish(data)

    def _send(self, method: str, path: str, headers: dict[str, str],
              body: bytes | None) -> tuple[int, dict[str, str], bytes]:
        request = urllib.request.Request(f"{self.mlflow.url()}{path}", data=body, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()
        except OSError as exc:
            raise MlflowUnavailable(f"the sandbox's MLflow tracking server did not answer: {exc}") from None

    async def get(self, path: str) -> None:
        await self._relay(path)

    async def post(self, path: str) -> None:
        await self._relay(path)

    async def patch(self, path: str) -> None:
        await self._relay(path)

    async def delete(self, path: str) -> None:
        await self._relay(path)


class _PresignedLogin(RequestHandler):
    def initialize(self, servers: MlflowTrackingServers, mlflow: MlflowServer, ledger: Ledger | None) -> None:
        self.servers = servers
        self.mlflow = mlflow

    async def get(self) -> None:
        token = self.get_query_argument("authToken", "")
        if not token or not self.servers.redeem(token):
            self.set_status(403)
            self.finish("This presigned URL is invalid, expired or already used: create a new one.")
            return
        try:
            url = await asyncio.get_running_loop().run_in_executor(None, self.mlflow.url)
        except MlflowUnavailable as exc:
            self.set_status(503)
            self.finish(str(exc))
            return
        self.redirect(f"{url}/")


def mlflow_patterns(servers: MlflowTrackingServers, mlflow: MlflowServer,
                    ledger: Ledger | None) -> list[tuple[str, type, dict[str, Any]]]:
    """Tornado URL specs of the front, to go before the AWS front's catch-all."""
    args = {"servers": servers, "mlflow": mlflow, "ledger": ledger}
    return [(rf"{PREFIX}/auth", _PresignedLogin, args), (rf"{PREFIX}/(.*)", _Proxy, args)]
