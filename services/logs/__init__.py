"""The job-logs noun: live streams, text reads and the archive of a training job's pod logs.

The pods of a job are ``instantstart.io/job=<job>`` in its namespace, whatever its kind. ``open_stream``
gives a reader a :class:`~services.logs.views.LogView` on the job's shared live stream (one Kubernetes log
stream per container however many read it); ``read_text`` answers a capped, filtered tail as text with the
query that continues it; ``archive_job_logs`` copies every container's full log to the shared bucket before
the pods go (the jobs noun calls it on delete), and reads fall back to that archive when the pods are gone.

Every call here reaches Kubernetes or S3: faces call these verbs from worker threads, never on the loop.
"""

from __future__ import annotations

from services.auth import Principal, Role
from services.aws import AwsClients
from services.clusters.registry import ClusterRegistry
from services.errors import NotFound
from services.kube import KubeClients
from services.logs.archive import archive, read_archive, shared_location
from services.logs.cursor import Cursor, Line
from services.logs.models import LogArchive, LogSelect, LogStreamQuery, LogTextQuery
from services.logs.pods import JOB_LABEL, JobPod, list_job_pods, read_log
from services.logs.streams import LogHub
from services.logs.text import LogText, pattern, render
from services.logs.views import MAX_BYTES, MAX_LINES, LogView, Selection, order_key
from services.verbs import verb

__all__ = ["JobLogs", "LogText", "LogView"]


class JobLogs:
    noun = "logs"

    def __init__(self, registry: ClusterRegistry, kube: KubeClients, aws: AwsClients,
                 shared_bucket: str | None = None, *, max_lines: int = MAX_LINES, max_bytes: int = MAX_BYTES) -> None:
        self.registry = registry
        self.kube = kube
        self.aws = aws
        self.shared_bucket = shared_bucket
        self.hub = LogHub(kube)
        self.max_lines = max_lines
        self.max_bytes = max_bytes

    @verb(Role.VIEWER)
    def open_stream(self, principal: Principal, cluster: str, job: str, query: LogStreamQuery) -> LogView:
        """A started view (close it when the reader leaves): the catch-up, then the live lines."""
        self.registry.get(cluster)
        cursor = Cursor.decode(query.cursor)
        stream = self.hub.stream(cluster, query.namespace, job)
        view = LogView(stream, Selection(query.pod, query.container, query.rank, query.tail), cursor,
                       max_lines=self.max_lines, max_bytes=self.max_bytes)
        view.start()
        return view

    @verb(Role.VIEWER)
    def read_text(self, principal: Principal, cluster: str, job: str, query: LogTextQuery) -> LogText:
        cursor = Cursor.decode(query.cursor)
        pattern(query.grep)  # a bad expression is refused before anything is read
        lines, source = self._gather(cluster, job, query, cursor)
        return render(lines, query, cursor, _multi(lines), source)

    def read_labelled_text(self, cluster: str, label: str, value: str, query: LogTextQuery) -> LogText:
        """The same text read over the pods labelled ``label=value`` in the query's namespace (another noun's
        workload, e.g. an inference deployment's pods; that noun's verb checks the role and what it may read).
        Nothing is archived for them: no pods, no lines."""
        cursor = Cursor.decode(query.cursor)
        pattern(query.grep)
        lines, source = self._gather(cluster, value, query, cursor, label=label)
        return render(lines, query, cursor, _multi(lines), source)

    @verb(Role.VIEWER)
    def read_lines(self, principal: Principal, cluster: str, job: str, select: LogSelect,
                   tail: int | None = None) -> list[Line]:
        """The job's lines oldest first (previous containers included; the archive when the pods are gone):
        all of them, or the last ``tail``. For the pane's history pages and its download."""
        lines, _ = self._gather(cluster, job, select, Cursor())
        lines.sort(key=order_key)
        return lines[-tail:] if tail is not None else lines

    def _gather(self, cluster: str, job: str, select: LogSelect, cursor: Cursor,
                label: str = JOB_LABEL) -> tuple[list[Line], str]:
        record = self.registry.get(cluster)
        api = self.kube.api_client(cluster)
        pods = _selected(list_job_pods(api, select.namespace, job, label), select)
        if not pods and label != JOB_LABEL:
            raise NotFound(f"no pods labelled {label}={job} in namespace {select.namespace}"
                           f"{' matching the selection' if select.pod else ''}")
        if not pods:
            archived = [line for line in self._archived(cluster, record.region, select.namespace, job)
                        if _wants(line, select, {})]
            if not archived:
                raise NotFound(f"job {job} has no pods in namespace {select.namespace}"
                               f"{' matching the selection' if select.pod or select.rank is not None else ''} "
                               "and no logs archived in the shared bucket")
            return archived, "archive"
        lines: list[Line] = []
        for pod in pods:
            for container in pod.containers:
                if select.container is not None and container.name != select.container:
                    continue
                mark = cursor.marks.get(f"{pod.name}/{container.name}")
                since = mark.second if mark is not None and mark.instance == container.instance else None
                if mark is None or mark.instance != container.instance:
                    lines += read_log(api, select.namespace, pod.name, container, previous=True)
                lines += read_log(api, select.namespace, pod.name, container, since_second=since)
        return lines, "pods"

    def archive_job_logs(self, cluster: str, namespace: str, job: str) -> LogArchive:
        """Copy every pod/container's full log (previous and current) of the job to the shared bucket; called
        by the jobs noun before it deletes the job's resources."""
        record = self.registry.get(cluster)
        api = self.kube.api_client(cluster)
        bucket, prefix = shared_location(api, cluster, namespace, self.shared_bucket)
        return archive(api, self.aws.client("s3", record.region), namespace, job,
                       list_job_pods(api, namespace, job), bucket, prefix)

    def _archived(self, cluster: str, region: str, namespace: str, job: str) -> list[Line]:
        try:
            bucket, prefix = shared_location(self.kube.api_client(cluster), cluster, namespace, self.shared_bucket)
        except NotFound:
            return []
        return read_archive(self.aws.client("s3", region), bucket, prefix, job)

    def stop(self) -> None:
        self.hub.stop()


def _selected(pods: list[JobPod], query: LogSelect) -> list[JobPod]:
    return [p for p in pods if (query.pod is None or p.name == query.pod)
            and (query.rank is None or p.rank == query.rank)]


def _wants(line: Line, query: LogSelect, ranks: dict[str, int]) -> bool:
    return (query.pod is None or line.pod == query.pod) \
        and (query.container is None or line.container == query.container) \
        and (query.rank is None or ranks.get(line.pod) == query.rank)


def _multi(lines: list[Line]) -> set[str]:
    """Pods whose lines come from more than one container: their lines name the container."""
    seen: dict[str, set[str]] = {}
    for line in lines:
        seen.setdefault(line.pod, set()).add(line.container)
    return {pod for pod, containers in seen.items() if len(containers) > 1}
