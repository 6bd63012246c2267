"""Kubernetes client factory, one ``ApiClient`` per named cluster, and never a global context.

A cluster is known either by a kubeconfig file (any cluster, the sandbox included) or as an EKS cluster:
its endpoint and CA come from ``eks:DescribeCluster`` and its bearer token is an STS-presigned
``GetCallerIdentity`` URL, exactly what ``aws eks get-token`` prints, cached until shortly before it
expires. No child processes, no ``kubernetes.config.load_*`` that would touch the process-wide default.

Every ``ApiClient`` it hands out raises the backend's taxonomy: an ``ApiException`` classified by HTTP
status (404, 409, 422 with its field causes, 429 and 5xx transient), a connection failure as ``Transient``.
"""

from __future__ import annotations

import base64
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import urllib3
from botocore.signers import RequestSigner
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from services.aws import AwsClients
from services.clock import Clock
from services.errors import NotFound, ServiceError, Transient, classify_kube

TOKEN_LIFETIME = 15 * 60  # EKS accepts a presigned token for 15 minutes
TOKEN_REFRESH_MARGIN = 60  # refresh this long before it would expire
PRESIGN_EXPIRES = 60  # what aws-iam-authenticator and `aws eks get-token` sign with


def from_kube(exc: ApiException, action: str = "") -> ServiceError:
    """The taxonomy's reading of a Kubernetes ``ApiException`` (by status; a 429's Retry-After is kept)."""
    headers = getattr(exc, "headers", None) or {}
    retry_after: float | None = None
    try:
        retry_after = float(str(headers["Retry-After"])) if headers.get("Retry-After") else None
    except (TypeError, ValueError):
        retry_after = None
    return classify_kube(int(exc.status or 0), str(exc.reason or ""), exc.body, action, retry_after)


class ClassifiedApiClient(k8s.ApiClient):
    """An ``ApiClient`` whose calls raise the taxonomy instead of ``ApiException`` and urllib3 errors."""

    def call_api(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        action = f"{method} {urlsplit(url).path}"
        try:
            response = super().call_api(method, url, *args, **kwargs)
        except ApiException as exc:
            raise from_kube(exc, action) from exc
        except urllib3.exceptions.HTTPError as exc:
            raise Transient(f"Kubernetes unreachable for {action}: {exc}", delay=2.0,
                            details={"exception": type(exc).__name__, "action": action}) from exc
        if not 200 <= int(response.status) <= 299:  # classified here, where the request is still known
            body = response.read()  # type: ignore[no-untyped-call]
            text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
            try:
                ApiException.from_response(http_resp=response, body=text, data=None)  # raises the status's subclass
            except ApiException as exc:
                raise from_kube(exc, action) from exc
        return response

    def response_deserialize(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().response_deserialize(*args, **kwargs)
        except ApiException as exc:
            raise from_kube(exc) from exc


@dataclass(frozen=True)
class KubeconfigSource:
    path: Path
    context: str | None = None


@dataclass(frozen=True)
class EksSource:
    eks_name: str
    region: str | None = None


@dataclass
class _Cached:
    client: k8s.ApiClient
    expires_at: float | None


def eks_token(clients: AwsClients, eks_name: str, region: str | None = None) -> str:
    """A bearer token for EKS: ``k8s-aws-v1.`` + base64url(presigned STS GetCallerIdentity URL)."""
    sts = clients.client("sts", region)
    signer = RequestSigner(sts.meta.service_model.service_id, sts.meta.region_name, "sts", "v4",
                           sts._request_signer._credentials, sts.meta.events)
    params = {
        "method": "GET",
        "url": f"{sts.meta.endpoint_url}/?Action=GetCallerIdentity&Version=2011-06-15",
        "body": {},
        "headers": {"x-k8s-aws-id": eks_name},
        "context": {},
    }
    url = signer.generate_presigned_url(params, region_name=sts.meta.region_name, expires_in=PRESIGN_EXPIRES,
                                        operation_name="")
    return "k8s-aws-v1." + base64.urlsafe_b64encode(url.encode()).decode().rstrip("=")


class KubeClients:
    """Named clusters to ``ApiClient``s. Register a source per cluster, then ask by name."""

    def __init__(self, aws: AwsClients, clock: Clock, ca_dir: Path | None = None,
                 token_source: Callable[[AwsClients, str, str | None], str] = eks_token) -> None:
        self.aws = aws
        self.clock = clock
        self.ca_dir = Path(ca_dir or tempfile.mkdtemp(prefix="instantstart-ca-"))
        self._token_source = token_source
        self._sources: dict[str, KubeconfigSource | EksSource] = {}
        self._cache: dict[str, _Cached] = {}
        self._lock = threading.Lock()

    def register_kubeconfig(self, cluster: str, path: Path, context: str | None = None) -> None:
        """Reach ``cluster`` through a kubeconfig file (tests and notebooks; the product's clusters are EKS
        sources from the registry)."""
        with self._lock:
            self._sources[cluster] = KubeconfigSource(Path(path), context)
            old = self._cache.pop(cluster, None)
        if old is not None:
            old.client.close()  # type: ignore[no-untyped-call]

    def register_eks(self, cluster: str, eks_name: str | None = None, region: str | None = None) -> None:
        with self._lock:
            self._sources[cluster] = EksSource(eks_name or cluster, region)
            self._cache.pop(cluster, None)

    def forget(self, cluster: str) -> None:
        with self._lock:
            self._sources.pop(cluster, None)
            cached = self._cache.pop(cluster, None)
        if cached is not None:
            cached.client.close()  # type: ignore[no-untyped-call]

    def source_kind(self, cluster: str) -> str | None:
        """How ``cluster`` is reached: ``eks`` (the registry's), ``kubeconfig``, or None when unknown."""
        with self._lock:
            source = self._sources.get(cluster)
        return None if source is None else ("eks" if isinstance(source, EksSource) else "kubeconfig")

    def clusters(self) -> list[str]:
        with self._lock:
            return sorted(self._sources)

    def api_client(self, cluster: str) -> k8s.ApiClient:
        """The ``ApiClient`` for ``cluster``; EKS clients are rebuilt when their token nears expiry."""
        with self._lock:
            source = self._sources.get(cluster)
            cached = self._cache.get(cluster)
        if source is None:
            raise NotFound(f"no Kubernetes cluster named {cluster!r} is registered")
        now = self.clock.now()
        if cached is not None and (cached.expires_at is None or now < cached.expires_at - TOKEN_REFRESH_MARGIN):
            return cached.client
        fresh = self._build(cluster, source, now)
        with self._lock:
            self._cache[cluster] = fresh
        return fresh.client

    def _build(self, cluster: str, source: KubeconfigSource | EksSource, now: float) -> _Cached:
        if isinstance(source, KubeconfigSource):
            loaded = k8s.Configuration()
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=str(source.path), context=source.context, client_configuration=loaded,
                persist_config=False)
            return _Cached(ClassifiedApiClient(loaded), None)
        described: dict[str, Any] = self.aws.client("eks", source.region).describe_cluster(
            name=source.eks_name)["cluster"]
        self.ca_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        ca_file = self.ca_dir / f"{cluster}.crt"
        ca_file.write_bytes(base64.b64decode(described["certificateAuthority"]["data"]))
        cfg = k8s.Configuration()
        cfg.host = described["endpoint"]
        cfg.ssl_ca_cert = str(ca_file)
        # kubernetes 37.x reads the bearer token from api_key["BearerToken"] (see Configuration.auth_settings)
        cfg.api_key = {"BearerToken": self._token_source(self.aws, source.eks_name, source.region)}
        cfg.api_key_prefix = {"BearerToken": "Bearer"}
        return _Cached(ClassifiedApiClient(cfg), now + TOKEN_LIFETIME)
