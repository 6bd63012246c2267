"""The embedded sandbox, wired in by configuration only.

When no AWS credentials are configured (or ``sandbox: true``), ``instantstart serve`` runs

* the AWS world (``sandbox/aws``): one endpoint for every service at ``http://127.0.0.1:4566``, HyperPod,
  EKS, Service Quotas and FSx simulated, the rest served by moto;
* the Kubernetes API emulator on loopback HTTPS (``https://127.0.0.1:3443/k8s/clusters/<name>``, a private
  CA made once per data directory); it accepts its own bearer token (kubeconfigs) and EKS presigned tokens
  signed with the sandbox's credentials, exactly what the EKS client factory sends.

``services/`` never learns that it talks to the sandbox: the composition root hands it an AWS endpoint
URL with fixed fake credentials, and kubeconfigs. Loopback only: the sandbox's APIs are reached from the
host or container it runs in, like the data directory.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import boto3
import botocore.session

from app.secret_files import secret_file
from services.errors import Conflict
from services.kube import KubeClients
from services.settings import Settings

log = logging.getLogger(__name__)


def sandbox_enabled(settings: Settings) -> bool:
    return sandbox_mode(settings)[0]


def sandbox_mode(settings: Settings) -> tuple[bool, str]:
    """Sandbox or AWS, and why, for the banner and the runtime file.

    The explicit setting wins. Otherwise the sandbox runs when no credentials are configured, or when the
    only credentials are this sandbox's own (a shell that ran ``eval "$(instantstart sandbox env)"``). Only
    configured sources count (environment, shared config and credential files, SSO, processes): the
    instance-metadata and container providers are skipped, because probing them sends traffic off the
    machine and waits on timeouts. On EC2 or ECS with a role, set ``sandbox: false``.
    """
    if settings.sandbox is not None:
        state = "true" if settings.sandbox else "false"
        return settings.sandbox, f"sandbox: {state} was set (--sandbox/--no-sandbox, INSTANTSTART_SANDBOX or config)"
    session = botocore.session.get_session()
    resolver = session.get_component("credential_provider")
    for provider in ("iam-role", "container-role"):
        resolver.remove(provider)
    credentials = resolver.load_credentials()
    if credentials is None:
        return True, "no AWS credentials are configured"
    if credentials.access_key == SANDBOX_ACCESS_KEY:
        return True, "the configured AWS credentials are the sandbox's own (instantstart sandbox env)"
    return False, (f"AWS credentials were found (source: {credentials.method}); "
                   "pass --sandbox to use the offline sandbox instead")


# The sandbox's AWS credentials: the AWS world accepts any, but the emulator accepts EKS tokens only when
# they are signed with this installation's secret key (made once, 0600 in the data directory).
SANDBOX_ACCESS_KEY = "AKIAINSTANTSTARTSBX1"


def sandbox_secret_key(settings: Settings) -> str:
    return secret_file(sandbox_dir(settings) / "aws-secret-key")


def aws_endpoint(settings: Settings) -> str:
    return f"http://127.0.0.1:{settings.sandbox_aws_port}"


def aws_session(settings: Settings) -> boto3.Session:
    return boto3.Session(aws_access_key_id=SANDBOX_ACCESS_KEY, aws_secret_access_key=sandbox_secret_key(settings),
                         region_name=settings.region)


def sandbox_dir(settings: Settings) -> Path:
    return settings.data_dir / "sandbox"


def kube_url(settings: Settings) -> str:
    return f"https://127.0.0.1:{settings.sandbox_kube_port}"


def kube_token(settings: Settings) -> str:
    """The emulator's bearer token: made once per installation, kept 0600 in the data directory."""
    return secret_file(sandbox_dir(settings) / "kube-token")


def kubeconfig_path(settings: Settings, cluster: str) -> Path:
    return settings.data_dir / "kubeconfigs" / f"{cluster}.yaml"


def kubeconfig_text(settings: Settings, cluster: str) -> str:
    """The cluster's kubeconfig for the emulator at ``settings.sandbox_kube_port``."""
    from sandbox.kube import kubeconfig_yaml
    from sandbox.tls import ensure_tls

    tls = ensure_tls(sandbox_dir(settings) / "tls")
    return kubeconfig_yaml(cluster, kube_url(settings), kube_token(settings), ca_pem=tls.ca_pem)


def write_kubeconfig(settings: Settings, cluster: str) -> Path:
    """The cluster's kubeconfig under the data directory, rewritten only when its content would change
    (info requests and start-up call this for every cluster)."""
    from sandbox.kube import write_kubeconfig as write
    from sandbox.tls import ensure_tls

    path = kubeconfig_path(settings, cluster)
    if path.exists() and path.read_text() == kubeconfig_text(settings, cluster):
        return path
    tls = ensure_tls(sandbox_dir(settings) / "tls")
    return write(path, cluster, kube_url(settings), kube_token(settings), ca_pem=tls.ca_pem)


def stored_clusters(settings: Settings) -> list[str]:
    from sandbox.kube.persistence import stored_cluster_names

    return stored_cluster_names(sandbox_dir(settings) / "kube" / "state.sqlite3")


def describe(settings: Settings, clusters: list[str], *, write: bool = True) -> dict[str, Any]:
    """What the banner, ``instantstart sandbox info`` and ``GET /api/v1/sandbox`` report; writes each
    cluster's kubeconfig so the paths it lists exist (``write=False`` when no server runs: the files the last
    server wrote stay as they are, and only those that exist are listed)."""
    from sandbox.aws.front import ACCOUNT_ID

    if write:
        kubeconfigs = {name: str(write_kubeconfig(settings, name)) for name in clusters}
    else:
        kubeconfigs = {name: str(kubeconfig_path(settings, name)) for name in clusters
                       if kubeconfig_path(settings, name).exists()}
    return {
        "aws_endpoint_url": aws_endpoint(settings), "region": settings.region, "account_id": ACCOUNT_ID,
        "kubernetes_url": f"{kube_url(settings)}/k8s/clusters/<name>",
        "kubeconfigs": kubeconfigs,
        "kubeconfig_dir": str(kubeconfig_path(settings, "x").parent), "speed": settings.sandbox_speed,
        "credentials": {"aws_access_key_id": SANDBOX_ACCESS_KEY,
                        "note": "the AWS endpoint accepts any credentials; the product signs with its own"},
    }


def register_written_kubeconfigs(settings: Settings, kube: KubeClients, names: list[str]) -> None:
    """Register the kubeconfigs the running (or last) server wrote, without writing any: a CLI command or
    a notebook must not rewrite them with its own idea of the ports."""
    for name in names:
        path = kubeconfig_path(settings, name)
        if path.exists():
            kube.register_kubeconfig(name, path)


def register_clusters(settings: Settings, kube: KubeClients, names: list[str]) -> None:
    """Write a kubeconfig per emulated cluster and register it with the client factory."""
    for name in names:
        kube.register_kubeconfig(name, write_kubeconfig(settings, name))


class Sandbox:
    """The running sandbox world inside ``instantstart serve``."""

    def __init__(self, settings: Settings, kube: KubeClients) -> None:
        from sandbox.aws import AwsWorld
        from sandbox.aws.eks_token import verify_eks_token
        from sandbox.kube import BackgroundServer, Emulator
        from sandbox.tls import ensure_tls

        self.settings = settings
        secrets_by_key = {SANDBOX_ACCESS_KEY: sandbox_secret_key(settings)}
        sts_hosts = {urlsplit(aws_endpoint(settings)).netloc}  # presigned against the sandbox's own STS only
        self.emulator = Emulator(sandbox_dir(settings), token=kube_token(settings),
                                 accept=lambda cluster, token: verify_eks_token(token, cluster, secrets_by_key,
                                                                                hosts=sts_hosts))
        tls = ensure_tls(sandbox_dir(settings) / "tls")
        self.kube_server = BackgroundServer(self.emulator, "127.0.0.1", settings.sandbox_kube_port,
                                            ssl_context=tls.server_context())
        self.world = AwsWorld(sandbox_dir(settings), None, self.emulator, kube_base_url=kube_url(settings),
                              kube_ca_pem=tls.ca_pem, speed=settings.sandbox_speed, region=settings.region)
        register_clusters(settings, kube, sorted(self.emulator.clusters))
        # a cluster made later (an EKS create, sandbox seed) gets its kubeconfig and client at once
        self.emulator.on_clusters_changed(lambda names: register_clusters(settings, kube, names))

    def on_clusters_changed(self, listener: Callable[[list[str]], None]) -> None:
        self.emulator.on_clusters_changed(listener)

    def start(self) -> None:
        try:
            self.kube_server.start()
            self.world.start(port=self.settings.sandbox_aws_port)
        except OSError as exc:
            self.stop()
            raise Conflict(f"a sandbox port cannot be used ({exc.strerror}): set sandbox_kube_port "
                           f"({self.settings.sandbox_kube_port}) / sandbox_aws_port "
                           f"({self.settings.sandbox_aws_port})") from None
        log.info("sandbox: AWS at %s, Kubernetes at %s/k8s/clusters/<name>", self.world.endpoint_url,
                 self.kube_server.base_url)

    def info(self) -> dict[str, Any]:
        return {**describe(self.settings, sorted(self.emulator.clusters)),
                "simulated": self.world.info()["simulated"]}

    def stop(self) -> None:
        self.world.stop()
        self.kube_server.stop()
        self.emulator.close()
