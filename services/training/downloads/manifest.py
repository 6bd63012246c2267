"""What a model download puts into the cluster, and how its progress is read back.

The download is a Kubernetes Job whose pod runs huggingface_hub's CLI (``hf download``, pinned through
``uvx --from huggingface_hub==V`` in a pinned uv image) in an init container into a scratch ``emptyDir``,
then copies the files onto the shared bucket's Mountpoint volume (claim ``shared-s3`` at ``/s3``): Mountpoint
for S3 writes new files sequentially but cannot rename, and ``hf download`` renames every file it finishes.
The token reaches the CLI only as ``HF_TOKEN`` from a ``secretKeyRef``; no value of the manifest holds it.

The job namespace gets what every training pod there needs (:func:`ensure_job_namespace`): the namespace, the
``instantstart-training`` service account and its own ``shared-s3`` claim bound to a static volume of the
same bucket and cluster prefix as the cluster's claim in ``default`` (claims are namespaced).
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import secrets
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s

from services.clusters.create_base import FIELD_MANAGER
from services.clusters.storage_stage import APPLY, MANAGED_LABEL, S3_CLAIM, S3_DRIVER, namespace_volume
from services.clusters.storage_stage import NAMESPACE as STORAGE_NAMESPACE
from services.errors import Conflict, NotFound
from services.kube import KubeClients
from services.models import TRAINING_SERVICE_ACCOUNT
from services.secrets import SecretRef, stash
from services.training.downloads.models import DownloadPlan

UV_IMAGE = "ghcr.io/astral-sh/uv:0.12.9-python3.12-bookworm-slim"
HF_HUB = "huggingface_hub==2.4.0"
SERVICE_ACCOUNT = TRAINING_SERVICE_ACCOUNT
DOWNLOAD_LABEL = "instantstart.io/download"
MODEL_LABEL = "instantstart.io/model"
MODEL_ANNOTATION = "instantstart.io/model-id"
MOUNT = "/s3"
SCRATCH = "/scratch"
LOCAL_DIR = f"{SCRATCH}/model"
DOWNLOAD_CONTAINER = "download"
PUBLISH_CONTAINER = "publish"
TOKEN_KEY = "token"
BACKOFF_LIMIT = 2
TTL_SECONDS = 24 * 3600  # the finished Job (and its pod's log) stays a day; the operation keeps the outcome
# Copy the downloaded tree onto the bucket: "$0" is the destination (an argument, never spliced into the script).
PUBLISH_SCRIPT = f'rm -rf {LOCAL_DIR}/.cache && mkdir -p "$0" && cp -rv {LOCAL_DIR}/. "$0"/'


def folder(model: str) -> str:
    """The model's folder under ``/s3/models/``: ``<org>--<name>`` (the contract every recipe reads)."""
    org, _, name = model.partition("/")
    return f"{org}--{name}"


def model_label(model: str) -> str:
    """A label value naming the model (at most 63 characters; long names end in a hash)."""
    value = folder(model)
    if len(value) > 63:
        value = value[:54].rstrip("-_.") + "-" + hashlib.sha256(model.encode()).hexdigest()[:8]
    return value


def new_id(model: str) -> str:
    """A fresh download id, the Job's name: ``hf-<model>-<random>`` as a DNS label."""
    stem = re.sub(r"[^a-z0-9]+", "-", folder(model).lower()).strip("-")[:44].strip("-")
    return f"hf-{stem}-{secrets.token_hex(3)[:5]}"


def destination(model: str) -> str:
    return f"{MOUNT}/models/{folder(model)}"


def secret_name(download_id: str) -> str:
    return f"{download_id}-hf-token"


def labels(plan: DownloadPlan) -> dict[str, str]:
    return {**MANAGED_LABEL, DOWNLOAD_LABEL: plan.id, MODEL_LABEL: model_label(plan.model)}


def job_manifest(plan: DownloadPlan) -> dict[str, Any]:
    """The download Job (see the module docstring)."""
    argv = ["uvx", "--from", HF_HUB, "hf", "download", plan.model, "--local-dir", LOCAL_DIR]
    if plan.revision:
        argv += ["--revision", plan.revision]
    for pattern in plan.include:
        argv += ["--include", pattern]
    for pattern in plan.exclude:
        argv += ["--exclude", pattern]
    env: list[dict[str, Any]] = [{"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"},
                                 {"name": "UV_CACHE_DIR", "value": f"{SCRATCH}/.uv"}]
    if plan.token is not None:
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": plan.token.name,
                                                                       "key": plan.token.key}}})
    meta = {"labels": labels(plan), "annotations": {MODEL_ANNOTATION: plan.model}}
    scratch = {"name": "scratch", "mountPath": SCRATCH}
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": plan.id, "namespace": plan.namespace, **meta},
        "spec": {
            "backoffLimit": BACKOFF_LIMIT, "ttlSecondsAfterFinished": TTL_SECONDS,
            "template": {"metadata": meta, "spec": {
                "restartPolicy": "Never", "serviceAccountName": SERVICE_ACCOUNT,
                "initContainers": [{
                    "name": DOWNLOAD_CONTAINER, "image": UV_IMAGE, "command": argv, "env": env,
                    "volumeMounts": [scratch],
                    "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "8Gi"}}}],
                "containers": [{
                    "name": PUBLISH_CONTAINER, "image": UV_IMAGE,
                    "command": ["sh", "-c", PUBLISH_SCRIPT, destination(plan.model)],
                    "volumeMounts": [scratch, {"name": "shared-s3", "mountPath": MOUNT}],
                    "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}}}],
                "volumes": [{"name": "scratch", "emptyDir": {}},
                            {"name": "shared-s3", "persistentVolumeClaim": {"claimName": S3_CLAIM}}]}}}}


# ----- the job namespace ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SharedStorage:
    """The cluster's shared bucket as its ``default/shared-s3`` claim mounts it."""

    volume: str
    bucket: str
    prefix: str  # Mountpoint's ``prefix`` mount option ("" for the whole bucket)
    spec: dict[str, Any]  # the volume's spec as the API returned it (camelCase)


def shared_storage(kube: KubeClients, cluster: str) -> SharedStorage:
    """The bucket behind the cluster's ``default/shared-s3`` claim; 409 when the cluster has none."""
    api = kube.api_client(cluster)
    core = k8s.CoreV1Api(api)
    pv: Any = None
    try:
        claim: Any = core.read_namespaced_persistent_volume_claim(S3_CLAIM, STORAGE_NAMESPACE)
        name = claim.spec.volume_name if claim.spec else None
        pv = core.read_persistent_volume(name) if name else None
    except NotFound:
        pv = None
    csi: Any = pv.spec.csi if pv is not None and pv.spec is not None else None
    bucket = (csi.volume_attributes or {}).get("bucketName") if csi is not None else None
    if pv is None or csi is None or csi.driver != S3_DRIVER or not bucket:
        raise Conflict(f"{cluster} has no shared S3 storage: a model is downloaded onto the bucket its claim "
                       f"{STORAGE_NAMESPACE}/{S3_CLAIM} mounts (Mountpoint for S3, made by cluster creation's "
                       "storage stage); create that claim bound to an s3.csi.aws.com volume first",
                       details={"claim": f"{STORAGE_NAMESPACE}/{S3_CLAIM}"})
    prefix = next((o.split(" ", 1)[1] for o in pv.spec.mount_options or [] if o.startswith("prefix ")), "")
    return SharedStorage(volume=str(pv.metadata.name), bucket=str(bucket), prefix=prefix,
                         spec=api.sanitize_for_serialization(pv.spec))  # type: ignore[no-untyped-call]


def ensure_namespace(kube: KubeClients, cluster: str, namespace: str) -> None:
    """The namespace (labelled as ours when we make it); server-side apply, so a second call changes nothing."""
    core = k8s.CoreV1Api(kube.api_client(cluster))
    try:
        core.read_namespace(namespace)
    except NotFound:
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": MANAGED_LABEL}}
        core.patch_namespace(namespace, body, field_manager=FIELD_MANAGER, _content_type=APPLY)


def ensure_job_namespace(kube: KubeClients, cluster: str, namespace: str) -> str:
    """Namespace, service account ``instantstart-training`` and claim ``shared-s3`` in it (see the module);
    what it already has is left alone. Returns the claim's volume name."""
    storage = shared_storage(kube, cluster)
    ensure_namespace(kube, cluster, namespace)
    core = k8s.CoreV1Api(kube.api_client(cluster))
    meta = {"labels": {**MANAGED_LABEL, "instantstart/cluster": cluster}}
    try:
        core.read_namespaced_service_account(SERVICE_ACCOUNT, namespace)
    except NotFound:
        core.patch_namespaced_service_account(
            SERVICE_ACCOUNT, namespace, {"apiVersion": "v1", "kind": "ServiceAccount",
                                         "metadata": {"name": SERVICE_ACCOUNT, "namespace": namespace, **meta}},
            field_manager=FIELD_MANAGER, _content_type=APPLY)
    if namespace == STORAGE_NAMESPACE:
        return storage.volume
    with contextlib.suppress(NotFound):
        existing: Any = core.read_namespaced_persistent_volume_claim(S3_CLAIM, namespace)
        return str(existing.spec.volume_name or "")
    pv, pvc = namespace_volume({"spec": storage.spec}, cluster, namespace)
    pv_name = str(pv["metadata"]["name"])
    core.patch_persistent_volume(pv_name, pv, field_manager=FIELD_MANAGER, force=True, _content_type=APPLY)
    core.patch_namespaced_persistent_volume_claim(S3_CLAIM, namespace, pvc, field_manager=FIELD_MANAGER, force=True,
                                                  _content_type=APPLY)
    return pv_name


def stash_token(kube: KubeClients, cluster: str, namespace: str, download_id: str, token: str) -> SecretRef:
    """The token as an Opaque Secret ``<id>-hf-token`` (key ``token``) in the job namespace; its reference."""
    return stash(kube, cluster, namespace, secret_name(download_id), {TOKEN_KEY: token})[TOKEN_KEY]


def own_token(kube: KubeClients, ref: SecretRef, job: str, uid: str) -> None:
    """Make the Job the Secret's owner, so the garbage collector deletes it with the Job (its TTL, a user's
    delete): the token outlives no Job, even one whose operation was cancelled without ``downloads_cancel``."""
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": uid, "blockOwnerDeletion": False}
    with contextlib.suppress(NotFound):  # already deleted: nothing to own
        k8s.CoreV1Api(kube.api_client(ref.cluster)).patch_namespaced_secret(
            ref.name, ref.namespace, {"metadata": {"ownerReferences": [owner]}})


def delete_token(kube: KubeClients, ref: SecretRef) -> bool:
    """Delete the token's Secret; False if it was already gone."""
    try:
        k8s.CoreV1Api(kube.api_client(ref.cluster)).delete_namespaced_secret(ref.name, ref.namespace)
    except NotFound:
        return False
    return True
