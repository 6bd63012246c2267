"""A Kubernetes API server emulator for the sandbox, good enough for ``kubectl`` and the official client.

No real kube-apiserver can be installed where the sandbox runs, yet the product must reach Kubernetes
exactly as it reaches EKS: over HTTP, through the official client and a kubeconfig, so that a user can
also inspect everything with plain ``kubectl``. This package serves many in-memory clusters under
``/k8s/clusters/<name>`` with the API semantics clients depend on (see ``cluster.py``, ``deletion.py``),
validation against real schemas (``validation.py``), watches, logs and persistence.

It imports only the standard library, Tornado, PyYAML, jsonschema/referencing and the schemas shipped by
``kubernetes-validate``; never ``services/`` or ``app/``.
"""

from .cluster import Cluster, WriteOptions
from .components import COMPONENTS, install_component_crds, load_component_crds
from .emulator import Emulator
from .errors import ApiError
from .kubeconfig import kubeconfig, kubeconfig_yaml, write_kubeconfig
from .server import BackgroundServer, serve

__all__ = [
    "COMPONENTS",
    "ApiError",
    "BackgroundServer",
    "Cluster",
    "Emulator",
    "WriteOptions",
    "install_component_crds",
    "kubeconfig",
    "kubeconfig_yaml",
    "load_component_crds",
    "serve",
    "write_kubeconfig",
]
