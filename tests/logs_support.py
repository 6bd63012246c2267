"""A world for the job-logs tests: an in-process Kubernetes emulator (so a test writes log lines with exact
timestamps through ``Emulator.append_log``) and the product built against it, the cluster registered and
reached through the official client and a kubeconfig, as any EKS cluster."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tornado.web
from kubernetes import client as k8s

from app.bootstrap import Services, build_services
from sandbox.kube import BackgroundServer, Emulator
from services.auth import Principal, Role, TokenCreate
from services.clusters.models import ClusterRecord, Ownership
from services.settings import Settings
from tests.support import free_port

CLUSTER = "logs"
NAMESPACE = "hyperpod-ns-training"
VIEWER = Principal("viewer", Role.VIEWER)
BASE_TS = 1_767_225_600.0  # 2026-01-01T00:00:00Z


@dataclass
class LogWorld:
    emulator: Emulator
    server: BackgroundServer
    services: Services
    api: k8s.ApiClient
    bucket: str = ""

    def pod(self, name: str, job: str, containers: tuple[str, ...] = ("pytorch",),
            labels: dict[str, str] | None = None, namespace: str = NAMESPACE) -> None:
        body: dict[str, Any] = {
            "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "instantstart",
                                                  "instantstart.io/job": job, "instantstart.io/recipe": "pytorch",
                                                  **(labels or {})}},
            "spec": {"containers": [{"name": c, "image": "busybox"} for c in containers]}}
        k8s.CoreV1Api(self.api).create_namespaced_pod(namespace, body)

    def restart(self, pod: str, container: str = "pytorch", count: int = 1) -> None:
        """The container restarted (its log becomes ``previous``), as the pod's status then says."""
        self.emulator.end_log(CLUSTER, NAMESPACE, pod, container)  # the old instance's followers see its end
        self.emulator.restart_container(CLUSTER, NAMESPACE, pod, container)
        core = k8s.CoreV1Api(self.api)
        status = {"status": {"containerStatuses": [
            {"name": container, "restartCount": count, "ready": True, "image": "busybox", "imageID": "",
             "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}}
        core.patch_namespaced_pod_status(pod, NAMESPACE, status)

    def log(self, pod: str, text: str, ts: float, container: str = "pytorch", namespace: str = NAMESPACE) -> None:
        self.emulator.append_log(CLUSTER, namespace, pod, container, text, ts=ts)


@contextmanager
def log_world(tmp_path: Path, aws_endpoint_url: str | None = None, **logs_options: Any) -> Iterator[LogWorld]:
    emulator = Emulator(None, debounce=0.05)
    emulator.ensure_cluster(CLUSTER)
    server = BackgroundServer(emulator).start()
    services = build_services(Settings(data_dir=tmp_path / "data", workers=1, sandbox=True,
                                       aws_endpoint_url=aws_endpoint_url))
    try:
        services.clusters.registry.add(ClusterRecord(
            name=CLUSTER, region="us-west-2", eks_name=CLUSTER, ownership=Ownership("imported"),
            eks_arn=f"arn:aws:eks:us-west-2:123456789012:cluster/{CLUSTER}", created_at="", created_by="t"), 0.0)
        path = emulator.write_kubeconfig(CLUSTER, server.base_url, tmp_path / "kubeconfig")
        services.kube.register_kubeconfig(CLUSTER, path)
        for option, value in logs_options.items():
            setattr(services.logs, option, value)
        api = services.kube.api_client(CLUSTER)
        k8s.CoreV1Api(api).create_namespace({"metadata": {"name": NAMESPACE}})
        yield LogWorld(emulator, server, services, api)
    finally:
        services.logs.stop()
        services.stop()
        server.stop()
        emulator.close()


@contextmanager
def rest_server(services: Services) -> Iterator[tuple[str, str]]:
    """The REST routes and WebSockets served in-process on a free loopback port: (base URL, a viewer token)."""
    from app.rest import rest_patterns

    token = services.tokens.create(TokenCreate(name="reader", role=Role.VIEWER), "test").token
    port = free_port()
    loop = asyncio.new_event_loop()
    started = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        tornado.web.Application(rest_patterns(services)).listen(port, "127.0.0.1")
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(60), "the server listening"
    try:
        yield f"http://127.0.0.1:{port}", token
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
