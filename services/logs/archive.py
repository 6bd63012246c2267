"""Job logs kept in the shared bucket once the pods are gone.

``archive`` writes each pod/container's full log (the previous instance's lines first, then the current
ones, with their kubelet timestamps) gzipped to ``<cluster prefix>/jobs/<job>/logs/<pod>.<container>.log.gz``:
the per-job ``logs/`` folder pods see at ``/s3/jobs/<job>/logs/``. The bucket and prefix are the ones the
cluster's shared-storage volume mounts (read from its PersistentVolume; the installation's shared bucket and
``instantstart/<cluster>/data/`` when there is none). ``read_archive`` gives the lines back for reads.
"""

from __future__ import annotations

import gzip
import json
from typing import Any

from kubernetes import client as k8s

from services.clusters.storage_stage import S3_CLAIM, s3_prefix, volume_name
from services.errors import NotFound
from services.logs.cursor import Line
from services.logs.models import ArchivedLog, LogArchive
from services.logs.pods import Container, JobPod, numbered, read_log

SUFFIX = ".log.gz"


def shared_location(api: k8s.ApiClient, cluster: str, namespace: str, fallback_bucket: str | None) -> tuple[str, str]:
    """(bucket, key prefix) of the cluster's shared storage: the job namespace's volume, else ``default``'s."""
    core = k8s.CoreV1Api(api)
    for name in (volume_name(cluster, f"{namespace}-{S3_CLAIM}"), volume_name(cluster, S3_CLAIM)):
        try:
            resp: Any = core.read_persistent_volume(name, _preload_content=False)
            pv = json.loads(resp.data)
        except NotFound:
            continue
        spec = pv.get("spec") or {}
        bucket = ((spec.get("csi") or {}).get("volumeAttributes") or {}).get("bucketName")
        prefix = next((o.split(" ", 1)[1] for o in spec.get("mountOptions") or [] if o.startswith("prefix ")),
                      "")
        if bucket:
            return str(bucket), prefix
    if not fallback_bucket:
        raise NotFound(f"cluster {cluster} has no shared S3 volume ({volume_name(cluster, S3_CLAIM)}) and no "
                       "shared_bucket is set: there is nowhere to archive logs")
    return fallback_bucket, s3_prefix(cluster)


def job_prefix(prefix: str, job: str) -> str:
    return f"{prefix.rstrip('/')}/jobs/{job}/logs/".lstrip("/")


def _stamped(lines: list[Line]) -> bytes:
    return "".join(f"{line.ts} {line.text}\n" for line in lines).encode()


def archive(api: k8s.ApiClient, s3: Any, namespace: str, job: str, pods: list[JobPod], bucket: str,
            prefix: str) -> LogArchive:
    folder = job_prefix(prefix, job)
    files = []
    for pod in pods:
        for container in pod.containers:
            lines = read_log(api, namespace, pod.name, container, previous=True) \
                + read_log(api, namespace, pod.name, container)
            key = f"{folder}{pod.name}.{container.name}{SUFFIX}"
            s3.put_object(Bucket=bucket, Key=key, Body=gzip.compress(_stamped(lines)),
                          ContentType="text/plain", ContentEncoding="gzip")
            files.append(ArchivedLog(pod=pod.name, container=container.name, key=key, lines=len(lines)))
    return LogArchive(bucket=bucket, prefix=folder, files=files)


def read_archive(s3: Any, bucket: str, prefix: str, job: str) -> list[Line]:
    """Every archived line of the job (numbered per file), or [] when nothing was archived."""
    folder = job_prefix(prefix, job)
    lines: list[Line] = []
    for obj in s3.all_pages("list_objects_v2", "Contents", Bucket=bucket, Prefix=folder):
        name = str(obj["Key"])[len(folder):]
        if not name.endswith(SUFFIX) or "." not in name[: -len(SUFFIX)]:
            continue
        pod, _, container = name[: -len(SUFFIX)].rpartition(".")
        body = s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
        text = gzip.decompress(body).decode("utf-8", "replace")
        lines += numbered(pod, container, Container(container, "archive", None).instance, text.splitlines())
    return lines
