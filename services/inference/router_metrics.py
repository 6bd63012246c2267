"""The SGLang router pod's own ``/metrics`` page, read through the Kubernetes API's pod proxy with the bounds the
deployments' metrics use (:func:`services.inference.endpoint_metrics.fetch`: at most ``MAX_BYTES``, each read
within ``TIMEOUT``) and kept per router pod for ``FRESH_SECONDS``: however many viewers describe a router (the
pane's "Request counts" included), one of them reads its pod in that window and the others wait for its answer."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kubernetes import client as k8s

from services.inference.endpoint_metrics import FRESH_SECONDS, PodTarget, fetch
from services.inference.router_manifest import METRICS_PORT
from services.kube import KubeClients


@dataclass
class _Kept:
    lock: threading.Lock = field(default_factory=threading.Lock)
    at: float = -math.inf
    text: str = ""


class RouterMetricsReader:
    """The latest ``/metrics`` text of each router pod read lately (those older than ``FRESH_SECONDS`` and not
    being read are forgotten at the next read of any)."""

    def __init__(self, kube: KubeClients, clock: Callable[[], float] = time.monotonic) -> None:
        self.kube = kube
        self.clock = clock
        self._lock = threading.Lock()
        self._kept: dict[tuple[str, str, str], _Kept] = {}

    def text(self, cluster: str, namespace: str, pod: str) -> str:
        """The pod's page, read when none younger than ``FRESH_SECONDS`` is kept; the fetch's errors pass
        through (ServiceError, urllib3's HTTPError, ValueError for an oversized page) and nothing is kept."""
        key = (cluster, namespace, pod)
        with self._lock:
            now = self.clock()
            for stale in [k for k, kept in self._kept.items()
                          if k != key and now - kept.at >= FRESH_SECONDS and not kept.lock.locked()]:
                del self._kept[stale]
            entry = self._kept.setdefault(key, _Kept())
        with entry.lock:
            if self.clock() - entry.at >= FRESH_SECONDS:
                entry.text = fetch(k8s.CoreV1Api(self.kube.api_client(cluster)),
                                   PodTarget(namespace, pod, METRICS_PORT))
                entry.at = self.clock()
            return entry.text
