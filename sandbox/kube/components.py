"""The real CRDs of the cluster components the product installs, as data, and installing them.

``COMPONENTS`` maps a component name to its CRD files under ``crds/`` (provenance in
``crds/SOURCES.md``). :func:`install_component_crds` stores them in a cluster the way
``kubectl apply --server-side`` would, so installing a component twice is a no-op.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import yaml

from .cluster import Cluster, WriteOptions
from .errors import ApiError
from .resources import CRD_KEY

CRD_DIR = Path(__file__).parent / "crds"
HPPJ_SCHEMA = "hyperpod-training-operator/hyperpodpytorchjob.partial-schema.RECONSTRUCTED.yaml"

COMPONENTS: dict[str, tuple[str, ...]] = {
    "training-operator": (
        "hyperpod-dependency-chart/pytorchjobs.kubeflow.org-CustomResourceDefinition.yaml",
        "hyperpod-dependency-chart/mpijob-crd.yaml",
    ),
    "hyperpod-training-operator": (HPPJ_SCHEMA,),
    "inference-operator": (
        "hyperpod-inference-operator/inference.sagemaker.aws.amazon.com_inferenceendpointconfigs.yaml",
        "hyperpod-inference-operator/inference.sagemaker.aws.amazon.com_jumpstartmodels.yaml",
        "hyperpod-inference-operator/inference.sagemaker.aws.amazon.com_sagemakerendpointregistrations.yaml",
    ),
    "kuberay": (
        "kuberay-v1.7.0/ray.io_rayclusters.yaml",
        "kuberay-v1.7.0/ray.io_rayjobs.yaml",
        "kuberay-v1.7.0/ray.io_rayservices.yaml",
    ),
    "keda": ("keda-v2.17.1/keda.sh_scaledobjects.yaml", "keda-v2.17.1/keda.sh_triggerauthentications.yaml"),
    "kueue": tuple(f"kueue-v0.19.2/kueue.x-k8s.io_{p}.yaml" for p in (
        "clusterqueues", "cohorts", "localqueues", "resourceflavors", "topologies", "workloadpriorityclasses")),
    "karpenter": ("karpenter-v1.14.1/karpenter.sh_nodepools.yaml",),
    "cert-manager": ("cert-manager-v1.18.2/cert-manager.io_certificates.RECONSTRUCTED.yaml",
                     "cert-manager-v1.18.2/cert-manager.io_issuers.RECONSTRUCTED.yaml"),
    # what HyperPod installs when a cluster's AutoScaling is enabled (managed Karpenter)
    "hyperpod-karpenter": ("karpenter-v1.14.1/karpenter.sh_nodepools.yaml",
                           "hyperpod-karpenter/karpenter.sagemaker.amazonaws.com_hyperpodnodeclasses.RECONSTRUCTED.yaml"),
}


def _hppj_crd(schema: dict[str, Any]) -> dict[str, Any]:
    """Wrap the reconstructed HyperPodPyTorchJob schema in a CRD (the real one is not public)."""
    schema = {k: v for k, v in schema.items() if k != "x-provenance"}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "hyperpodpytorchjobs.sagemaker.amazonaws.com",
                     "annotations": {"instantstart.io/schema": "RECONSTRUCTED from the HyperPod SDK; not the real "
                                                               "CRD"}},
        "spec": {
            "group": "sagemaker.amazonaws.com",
            "scope": "Namespaced",
            "names": {"plural": "hyperpodpytorchjobs", "singular": "hyperpodpytorchjob", "kind": "HyperPodPyTorchJob",
                      "listKind": "HyperPodPyTorchJobList", "shortNames": ["hppj"]},
            "versions": [{
                "name": "v1", "served": True, "storage": True,
                "schema": {"openAPIV3Schema": schema},
                "subresources": {"status": {}},
                "additionalPrinterColumns": [
                    {"name": "State", "type": "string",
                     "jsonPath": ".status.conditions[?(@.status==\"True\")].type"},
                    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                ],
            }],
        },
    }


@functools.lru_cache(maxsize=32)
def _load_file(relative: str) -> tuple[dict[str, Any], ...]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with (CRD_DIR / relative).open() as fh:
        docs = [d for d in yaml.load_all(fh, Loader=loader) if d]
    if relative == HPPJ_SCHEMA:
        docs = [_hppj_crd(docs[0])]
    return tuple(docs)


def load_component_crds(component: str) -> list[dict[str, Any]]:
    """The CRD objects of ``component`` (fresh dicts; the caller may modify them)."""
    if component not in COMPONENTS:
        raise KeyError(f"unknown component {component!r}; known: {', '.join(sorted(COMPONENTS))}")
    return [copy.deepcopy(d) for rel in COMPONENTS[component] for d in _load_file(rel)]


def install_component_crds(cluster: Cluster, component: str, manager: str = "instantstart") -> list[str]:
    """Server-side apply the component's CRDs into ``cluster``; returns their names."""
    crd_rt = cluster.builtin(*CRD_KEY)
    names = []
    for crd in load_component_crds(component):
        name = crd["metadata"]["name"]
        try:
            cluster.patch(crd_rt, None, name, "apply", crd, WriteOptions(manager=manager, force=True))
        except ApiError as exc:
            raise RuntimeError(f"installing CRD {name} of {component} failed: {exc}") from exc
        names.append(name)
    return names
