"""What the API server's admission chain and create strategies add to a new object, before validation.

* ServiceAccount admission: a pod without ``serviceAccountName`` runs as ``default``; a pod naming a
  ServiceAccount that does not exist in its namespace is refused with the plugin's 403 Forbidden
  (``error looking up service account <ns>/<name>: serviceaccount "<name>" not found``).
* DefaultStorageClass: a claim naming no class gets the class annotated as the default.
* The Job create strategy: without ``manualSelector`` the Job's selector is generated from its uid and
  its pod template carries the matching ``controller-uid`` / ``job-name`` labels.
* Every new namespace gets its ``default`` ServiceAccount at once (the service account controller's
  work, done inside the create so that a pod created right after its namespace is admitted; the cluster's
  controllers recreate it when deleted).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import ApiError
from .resources import NAMESPACE_KEY, POD_KEY, ResourceType
from .store import Obj

if TYPE_CHECKING:
    from .cluster import Cluster

SA_KEY = ("", "serviceaccounts")
JOB_UID = "batch.kubernetes.io/controller-uid"
JOB_NAME = "batch.kubernetes.io/job-name"


def admit_create(cluster: Cluster, rt: ResourceType, obj: Obj) -> None:
    """Mutate and check ``obj`` (uid and name already set) as admission would; raises its refusal."""
    if rt.key == POD_KEY:
        _service_account(cluster, obj)
    elif rt.key == ("batch", "jobs"):
        _job_selector(obj)
    elif rt.key == ("", "persistentvolumeclaims"):
        _default_storage_class(cluster, obj)


def _service_account(cluster: Cluster, pod: Obj) -> None:
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return
    meta = pod["metadata"]
    account = spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
    spec["serviceAccountName"] = spec["serviceAccount"] = account
    namespace = meta.get("namespace", "default")
    if cluster.store.get(SA_KEY, (namespace, account)) is None:
        raise ApiError(403, "Forbidden", f'pods "{meta.get("name", "")}" is forbidden: error looking up service '
                       f'account {namespace}/{account}: serviceaccount "{account}" not found',
                       {"name": meta.get("name", ""), "kind": "pods"})


def _default_storage_class(cluster: Cluster, claim: Obj) -> None:
    """DefaultStorageClass: a claim that names no class (the field absent, not ``""``) gets the default one."""
    from .volumes import default_class

    spec = claim.get("spec")
    if isinstance(spec, dict) and "storageClassName" not in spec and (name := default_class(cluster)):
        spec["storageClassName"] = name


def _job_selector(job: Obj) -> None:
    spec = job.get("spec")
    if not isinstance(spec, dict) or spec.get("manualSelector"):
        return
    meta = job["metadata"]
    uid, name = meta["uid"], meta.get("name", "")
    spec["selector"] = {"matchLabels": {JOB_UID: uid}}
    template: Any = spec.setdefault("template", {})
    if isinstance(template, dict):
        tmeta = template.setdefault("metadata", {})
        if isinstance(tmeta, dict):
            tmeta["labels"] = {**(tmeta.get("labels") or {}), JOB_UID: uid, JOB_NAME: name, "controller-uid": uid,
                               "job-name": name}


def after_create(cluster: Cluster, rt: ResourceType, obj: Obj) -> None:
    """What follows a stored create: a namespace's ``default`` ServiceAccount."""
    if rt.key == NAMESPACE_KEY:
        ensure_default_service_account(cluster, obj["metadata"]["name"])


def ensure_default_service_account(cluster: Cluster, namespace: str) -> None:
    """Create ``namespace``'s ``default`` ServiceAccount unless it exists or the namespace is going."""
    from .cluster import WriteOptions

    store = cluster.store
    with store.lock:
        ns = store.get(NAMESPACE_KEY, ("", namespace))
        if ns is None or ns["metadata"].get("deletionTimestamp") or store.get(SA_KEY, (namespace, "default")):
            return
        cluster.create(cluster.builtin("", "serviceaccounts"), namespace, {"metadata": {"name": "default"}},
                       WriteOptions(manager="kube-controller-manager"))
