"""The pods of a job as the log readers see them, and one-shot reads of a container's log as numbered lines.

A job's pods are those labelled ``instantstart.io/job=<job>`` in its namespace, whatever its kind (the
operators copy pod-template labels to the pods they make). Each container's log is read with timestamps
and numbered per second (see :mod:`services.logs.cursor`). Node ranks follow the operators' pod naming:
Kubeflow's replica-type/replica-index labels, a HyperPodPyTorchJob's replicaSpecs order, a RayJob's head
then its workers. Nothing here follows a stream (that is :mod:`services.logs.streams`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s

from services.errors import Invalid, NotFound, Permanent
from services.logs.cursor import Line, parse_stamped, since_time

JOB_LABEL = "instantstart.io/job"
KUBEFLOW_TYPE = "training.kubeflow.org/replica-type"
KUBEFLOW_INDEX = "training.kubeflow.org/replica-index"
RAY_NODE_TYPE = "ray.io/node-type"
MAX_LINE_CHARS = 16_384
#: a follow read that hears nothing for this long reconnects (from its mark: nothing is lost)
FOLLOW_READ_TIMEOUT = 300  # a longer line is cut (the kubelet's own line limit is 16 KiB too)


@dataclass(frozen=True)
class Container:
    name: str
    instance: str  # "<pod uid>:<restart count>"
    previous: str | None  # the instance before a restart, whose log Kubernetes keeps as ``previous``


@dataclass(frozen=True)
class JobPod:
    name: str
    uid: str
    node: str | None
    phase: str
    containers: tuple[Container, ...]
    rank: int | None


def raw_job_pods(api: k8s.ApiClient, namespace: str, job: str,
                 label: str = JOB_LABEL) -> tuple[str, list[dict[str, Any]]]:
    """The pods labelled ``label=job`` (a job's, or another workload's) as JSON, and the list's resourceVersion
    (to watch from)."""
    resp: Any = k8s.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=f"{label}={job}",
                                                       _preload_content=False)
    listing = json.loads(resp.data)
    return str((listing.get("metadata") or {}).get("resourceVersion") or ""), list(listing.get("items") or [])


def list_job_pods(api: k8s.ApiClient, namespace: str, job: str, label: str = JOB_LABEL) -> list[JobPod]:
    """The pods labelled ``label=job``; node ranks only for a training job's (``instantstart.io/job``)."""
    return job_pods(api, namespace, job, raw_job_pods(api, namespace, job, label)[1], ranked=label == JOB_LABEL)


def job_pods(api: k8s.ApiClient, namespace: str, job: str, pods: list[dict[str, Any]],
             ranked: bool = True) -> list[JobPod]:
    """``pods`` (JSON dicts) as :class:`JobPod`, with their node ranks (``ranked``), in rank (then name) order."""
    ranks = _ranks(api, namespace, job, pods) if ranked else {}
    out = []
    for pod in pods:
        meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
        restarts = {s.get("name"): int(s.get("restartCount") or 0) for s in status.get("containerStatuses") or []}
        uid = str(meta.get("uid") or meta.get("name"))
        containers = []
        for c in spec.get("containers") or []:
            count = restarts.get(c["name"], 0)
            containers.append(Container(c["name"], f"{uid}:{count}", f"{uid}:{count - 1}" if count else None))
        out.append(JobPod(meta["name"], uid, spec.get("nodeName"), str(status.get("phase") or "Pending"),
                          tuple(containers), ranks.get(meta["name"])))
    return sorted(out, key=lambda p: (p.rank if p.rank is not None else 1 << 30, p.name))


def _ranks(api: k8s.ApiClient, namespace: str, job: str, pods: list[dict[str, Any]]) -> dict[str, int]:
    labels = {p["metadata"]["name"]: (p["metadata"].get("labels") or {}) for p in pods}
    ranks: dict[str, int] = {}
    workers = []
    for name, lab in labels.items():
        if lab.get(KUBEFLOW_TYPE):  # Kubeflow PyTorchJob: master 0, worker i -> i + 1
            index = int(lab.get(KUBEFLOW_INDEX) or 0)
            ranks[name] = index + (0 if lab[KUBEFLOW_TYPE] == "master" else 1)
        elif lab.get(RAY_NODE_TYPE) == "head":
            ranks[name] = 0
        elif lab.get(RAY_NODE_TYPE) == "worker":
            workers.append(name)
    for i, name in enumerate(sorted(workers)):
        ranks[name] = i + 1
    rest = [n for n in labels if n not in ranks]
    if rest:
        ranks.update(_hyperpod_ranks(api, namespace, job, rest))
    return ranks


def _hyperpod_ranks(api: k8s.ApiClient, namespace: str, job: str, names: list[str]) -> dict[str, int]:
    """HyperPodPyTorchJob pods ``<job>-<replicaSpec>-<i>``: the global rank is the index in replicaSpecs order."""
    try:
        resp: Any = k8s.CustomObjectsApi(api).get_namespaced_custom_object(
            "sagemaker.amazonaws.com", "v1", namespace, "hyperpodpytorchjobs", job, _preload_content=False)
        cr: dict[str, Any] = json.loads(resp.data)
    except (NotFound, Permanent, Invalid):
        return {}
    offset, ranks = 0, {}
    for spec in (cr.get("spec") or {}).get("replicaSpecs") or []:
        replicas = int(spec.get("replicas") or 1)
        for i in range(replicas):
            name = f"{job}-{spec.get('name')}-{i}"
            if name in names:
                ranks[name] = offset + i
        offset += replicas
    return ranks


def pod_log(api: k8s.ApiClient, namespace: str, pod: str, container: str, *, follow: bool = False,
            previous: bool = False, since: str | None = None, tail: int | None = None) -> Any:
    """``GET pods/{pod}/log?timestamps=true`` with ``sinceTime`` (which the generated client's
    ``read_namespaced_pod_log`` leaves out). Following: the open urllib3 response to read lines from; else
    the log's text."""
    query: list[tuple[str, Any]] = [("container", container), ("timestamps", True)]
    if follow:
        query.append(("follow", True))
    if previous:
        query.append(("previous", True))
    if since is not None:
        query.append(("sinceTime", since))
    if tail is not None:
        query.append(("tailLines", tail))
    request = api.param_serialize("GET", "/api/v1/namespaces/{namespace}/pods/{name}/log",
                                  path_params={"namespace": namespace, "name": pod}, query_params=query,
                                  header_params={"Accept": "text/plain"}, auth_settings=["BearerToken"])
    response = api.call_api(*request, _request_timeout=(10, FOLLOW_READ_TIMEOUT) if follow else (10, 120))
    if follow:
        return response.response
    return bytes(response.read()).decode("utf-8", "replace")  # type: ignore[no-untyped-call]


def numbered(pod: str, container: str, instance: str, raw: Iterable[str]) -> list[Line]:
    """Stamped lines as :class:`Line` with their index within each second. Exact when ``raw`` begins at the
    start of its first second (a ``sinceTime`` read)."""
    lines: list[Line] = []
    second, index = -1, 0
    for text in raw:
        parsed = parse_stamped(text)
        if parsed is None:
            continue
        ts, sec, body = parsed
        index = index + 1 if sec == second else 0
        second = sec
        lines.append(Line(pod, container, instance, ts, sec, index, body[:MAX_LINE_CHARS]))
    return lines


def read_log(api: k8s.ApiClient, namespace: str, pod: str, container: Container, *, previous: bool = False,
             since_second: int | None = None, tail: int | None = None) -> list[Line]:
    """One container's log as numbered lines: all of it, from ``since_second``, or its last ``tail`` lines
    (read from the start of the tail's first second, so the indices are exact). A container that has not
    started, or has no previous instance, reads as empty."""
    instance = container.previous if previous else container.instance
    if instance is None:
        return []

    def read(**kwargs: Any) -> list[str]:
        try:
            text = pod_log(api, namespace, pod, container.name, previous=previous, **kwargs)
        except (Invalid, NotFound):  # waiting to start, no previous instance, or gone since the listing
            return []
        return str(text).splitlines()

    if tail is not None:
        last = read(tail=tail)
        if not last or (first := parse_stamped(last[0])) is None:
            return []
        return numbered(pod, container.name, instance, read(since=since_time(first[1])))[-tail:] \
            if tail > 0 else []
    if since_second is not None:
        return numbered(pod, container.name, instance, read(since=since_time(since_second)))
    return numbered(pod, container.name, instance, read())
