"""A KEDA someone else installed, the way a Helm chart (or the inference operator's chart) does it outside the
``keda`` namespace: its CRDs and the cluster's one external metrics APIService, neither labelled as ours."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kubernetes import client as k8s

from tests.jobs_support import JobWorld
from tests.support import wait_until

EXTERNAL_METRICS = "v1beta1.external.metrics.k8s.io"
KEDA_CRDS = ("scaledobjects.keda.sh", "triggerauthentications.keda.sh")
#: where their KEDA's metrics server runs (the APIService's Service)
THEIR_SERVER = "kube-system/keda-operator-metrics-apiserver"


@contextmanager
def their_keda(world: JobWorld) -> Iterator[None]:
    """KEDA's CRDs and the external metrics APIService (pointing at :data:`THEIR_SERVER`), not ours, while the block
    runs; both are deleted after it."""
    world.install("keda")
    registration = k8s.ApiregistrationV1Api(world.api)
    namespace, name = THEIR_SERVER.split("/")
    api_service: Any = {
        "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": {"name": EXTERNAL_METRICS},
        "spec": {"group": "external.metrics.k8s.io", "version": "v1beta1", "groupPriorityMinimum": 100,
                 "versionPriority": 100, "insecureSkipTLSVerify": True,
                 "service": {"namespace": namespace, "name": name, "port": 443}}}
    registration.create_api_service(api_service)
    try:
        yield
    finally:
        registration.delete_api_service(EXTERNAL_METRICS)
        extensions = k8s.ApiextensionsV1Api(world.api)
        for crd in KEDA_CRDS:
            extensions.delete_custom_resource_definition(crd)
        def left() -> list[Any]:
            crds: Any = extensions.list_custom_resource_definition()
            return [c for c in crds.items if c.metadata.name in KEDA_CRDS]
        wait_until(lambda: not left(), 60, "their KEDA's CRDs gone")
