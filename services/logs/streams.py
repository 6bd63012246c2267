"""Shared live streams of a job's logs: one Kubernetes log stream per container, fanned out to every reader.

A :class:`JobStream` (one per cluster, namespace and job, while anyone reads it) watches the job's pods and
runs a :class:`Follower` thread per container instance: ``pods/log`` with ``follow=true&timestamps=true``.
A follower that starts on a running container begins at the second of its last line (``sinceTime`` of that
second, so every line of it is seen and numbered exactly); a container instance that appears later (a new
pod, a restart) is followed from its first line. A dropped connection resumes from the follower's own mark,
so it neither loses nor repeats a line. What each read brought goes to every subscribed reader through
``offer`` as one :class:`~services.logs.chunks.Chunk` (the lines are never split apart here), which must
never block: readers keep their own bounded buffers (:mod:`services.logs.views`). A follower that keeps up
reads at most every ``GATHER_SECONDS`` (the socket holds what comes meanwhile), so a busy container costs a
wake-up, a read and a chunk per interval, not per write of the kubelet.

Threads only: nothing here runs on the Tornado loop, and nothing sleeps to synchronise (a retry, and the
pause between reads, wait on the stop event).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from kubernetes import client as k8s
from kubernetes.watch.watch import iter_resp_lines
from urllib3.exceptions import ProtocolError

from services.errors import Invalid, NotFound, ServiceError
from services.kube import KubeClients
from services.logs.chunks import Chunk, read_chunk
from services.logs.cursor import Mark, since_time
from services.logs.pods import (
    JOB_LABEL,
    Container,
    JobPod,
    job_pods,
    pod_log,
    raw_job_pods,
    read_log,
)

log = logging.getLogger(__name__)

WATCH_SECONDS = 60
RETRY_SECONDS = 1.0
READ_BYTES = 1 << 20  # one read takes what the socket holds, up to this much
#: a follower reads at most this often while it keeps up (the WebSocket sends a batch every 100 ms anyway)
GATHER_SECONDS = 0.1


class Reader(Protocol):
    def offer(self, chunks: list[Chunk]) -> None: ...


class Follower:
    """Follows one container instance's log on its own thread and hands each line to ``publish``."""

    def __init__(self, stream: JobStream, pod: str, container: Container, *, from_start: bool) -> None:
        self.stream = stream
        self.pod = pod
        self.container = container
        self.mark: Mark | None = None  # the last line handed on
        self._from_start = from_start
        self._resp: Any = None
        self._stop = threading.Event()
        self.ended = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"logs-{stream.cluster}-{pod}-{container.name}")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        resp = self._resp
        if resp is not None:
            with contextlib.suppress(OSError, ValueError):  # not connected yet, or ended already
                resp.shutdown()  # ends a read blocked in the follower's thread

    def _start_second(self, api: k8s.ApiClient) -> int | None:
        if self.mark is not None:
            return self.mark.second
        if self._from_start:
            return None
        last = read_log(api, self.stream.namespace, self.pod, self.container, tail=1)
        return last[0].second if last else None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self._follow() and not self._still_running():
                    break  # the container ended (or the pod went): its log is complete
            except (Invalid, NotFound):
                break  # not started yet or gone: the pod watch starts a follower again when it changes
            except ServiceError as exc:
                log.info("log stream %s/%s/%s: %s; resuming", self.stream.namespace, self.pod,
                         self.container.name, exc.message)
            except Exception:  # a dropped connection mid-read (urllib3 raises several kinds)
                if self._stop.is_set():
                    break
                log.info("log stream %s/%s/%s dropped; resuming", self.stream.namespace, self.pod,
                         self.container.name, exc_info=True)
            self._stop.wait(RETRY_SECONDS)
        self.ended.set()

    def _still_running(self) -> bool:
        """After the stream ended: is this very instance still running (a connection the server or a proxy
        closed)? Then the follower resumes from its mark."""
        api = self.stream.kube.api_client(self.stream.cluster)
        try:
            resp: Any = k8s.CoreV1Api(api).read_namespaced_pod(self.pod, self.stream.namespace,
                                                               _preload_content=False)
        except NotFound:
            return False
        pod = json.loads(resp.data)
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            if status.get("name") == self.container.name:
                same = f"{(pod.get('metadata') or {}).get('uid')}:{int(status.get('restartCount') or 0)}" \
                    == self.container.instance
                return same and "running" in (status.get("state") or {})
        return False

    def _follow(self) -> bool:
        api = self.stream.kube.api_client(self.stream.cluster)
        start = self._start_second(api)
        resp = pod_log(api, self.stream.namespace, self.pod, self.container.name, follow=True,
                       since=since_time(start) if start is not None else None)
        self._resp = resp
        place: tuple[int, int] | None = None  # of the last line this connection gave
        try:
            if self._stop.is_set():
                return True
            for block in line_blocks(resp):
                chunk = read_chunk(self.pod, self.container.name, self.container.instance, block, place)
                if chunk is None:
                    continue
                place = chunk.last
                chunk = chunk.after(self.mark)  # lines seen before a reconnect are not handed on again
                if chunk is not None:
                    self.mark = chunk.mark()
                    self.stream.publish([chunk])
                if len(block) < READ_BYTES // 2:  # not behind: let lines gather for one read, not one per write
                    self._stop.wait(GATHER_SECONDS)
        finally:
            self._resp = None
            resp.close()
            resp.release_conn()
        return not self._stop.is_set()


def line_blocks(resp: Any) -> Iterator[bytes]:
    """The response as blocks of whole lines, one per read (what arrived together is handed on together).

    A last line without its newline is handed on (newline added) only when the body ended cleanly, as the
    API server ends a log whose last write had none; a body cut short raises from :func:`_body` before it, so
    the follower resumes from its last whole line instead of taking a cut one for complete."""
    rest = b""
    for data in _body(resp):
        if rest:
            data = rest + data
        cut = data.rfind(b"\n") + 1
        rest = data[cut:]
        if cut:
            yield data[:cut]
    if rest:
        yield rest + b"\n"


def _body(resp: Any) -> Iterator[bytes]:
    """The response body as it arrives, one socket read (up to ``READ_BYTES``) at a time.

    The API server sends a followed log with chunked transfer encoding, a chunk per write of the kubelet
    (often a line or a few), and urllib3's ``stream`` hands each chunk on by itself after several reads and
    calls of its own: with a busy job that per-chunk cost is most of the work. So the chunked framing is
    undone here over the connection's buffered reader: one read takes whatever has arrived, however many
    chunks that is, and the framing costs a ``find`` per chunk. A connection that closes before the last
    (zero-size) chunk raises urllib3's ``ProtocolError``, as urllib3's own reader does.
    """
    raw = getattr(getattr(resp, "_fp", None), "fp", None)
    if not getattr(resp, "chunked", False) or raw is None:
        yield from (data for data in resp.stream(READ_BYTES, decode_content=False) if data)
        return
    buf = b""
    need = 0  # bytes of the current chunk's data still to come
    skip = 0  # bytes of the CRLF that ends it still to come
    while data := raw.read1(READ_BYTES):
        buf = buf + data if buf else data
        out: list[bytes] = []
        pos, end, last = 0, len(buf), False
        while pos < end:
            if need:
                take = min(need, end - pos)
                out.append(buf[pos:pos + take])
                pos, need = pos + take, need - take
                if need:
                    break
                skip = 2
            if skip:
                passed = min(skip, end - pos)
                pos, skip = pos + passed, skip - passed
                if skip:
                    break
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break  # the size line is not all here yet
            need = int(buf[pos:eol].split(b";", 1)[0], 16)
            pos = eol + 2
            if not need:
                last = True
                break
        buf = buf[pos:]
        if out:
            yield b"".join(out)
        if last:
            return
    raise ProtocolError("Response ended prematurely")


class JobStream:
    """The live lines of one job's pods, shared by its readers."""

    def __init__(self, kube: KubeClients, cluster: str, namespace: str, job: str,
                 on_idle: Callable[[JobStream], None]) -> None:
        self.kube = kube
        self.cluster = cluster
        self.namespace = namespace
        self.job = job
        self._on_idle = on_idle
        self._lock = threading.Lock()
        self._readers: list[Reader] = []
        self._followers: dict[tuple[str, str, str], Follower] = {}
        self._pods: dict[str, dict[str, Any]] = {}
        self.pods: list[JobPod] = []
        self._version = ""
        self._stop = threading.Event()
        self._resp: Any = None
        self._watch = threading.Thread(target=self._run_watch, daemon=True, name=f"logs-pods-{cluster}-{job}")

    # ----- readers ---------------------------------------------------------------------------------------

    def start(self) -> None:
        """List the job's pods and follow them (in the caller's worker thread), then watch for changes."""
        api = self.kube.api_client(self.cluster)
        self._version, pods = raw_job_pods(api, self.namespace, self.job)
        self._pods = {p["metadata"]["name"]: p for p in pods}
        self._refresh(api, initial=True)
        self._watch.start()

    def subscribe(self, reader: Reader) -> list[JobPod]:
        """Live lines go to ``reader`` from now on; the pods (and containers) as they are at this moment, so
        the reader catches up on exactly those."""
        with self._lock:
            self._readers.append(reader)
            return list(self.pods)

    def unsubscribe(self, reader: Reader) -> None:
        with self._lock:
            if reader in self._readers:
                self._readers.remove(reader)
            idle = not self._readers
        if idle:
            self._on_idle(self)

    def publish(self, chunks: list[Chunk]) -> None:
        with self._lock:
            readers = list(self._readers)
        for reader in readers:
            reader.offer(chunks)

    def rank_of(self, pod: str) -> int | None:
        return next((p.rank for p in self.pods if p.name == pod), None)

    @property
    def idle(self) -> bool:
        with self._lock:
            return not self._readers

    def stop(self) -> None:
        self._stop.set()
        resp = self._resp
        if resp is not None:
            with contextlib.suppress(OSError, ValueError):
                resp.shutdown()
        with self._lock:
            followers = list(self._followers.values())
            self._followers.clear()
        for follower in followers:
            follower.stop()

    # ----- pods ------------------------------------------------------------------------------------------

    def _refresh(self, api: k8s.ApiClient, *, initial: bool = False) -> None:
        pods = job_pods(api, self.namespace, self.job, list(self._pods.values()))
        start = []
        with self._lock:
            self.pods = pods
            for pod in pods:
                for container in pod.containers:
                    key = (pod.name, container.name, container.instance)
                    follower = self._followers.get(key)
                    if follower is not None and not (follower.ended.is_set() and follower.mark is None):
                        continue  # following, or ended with its log read through
                    follower = Follower(self, pod.name, container, from_start=not initial)
                    self._followers[key] = follower
                    start.append(follower)
            live = {(p.name, c.name, c.instance) for p in pods for c in p.containers}
            gone = [f for k, f in self._followers.items() if k not in live]
            self._followers = {k: f for k, f in self._followers.items() if k in live}
        for follower in gone:
            follower.stop()
        for follower in start:
            follower.start()

    def _run_watch(self) -> None:
        while not self._stop.is_set():
            try:
                api = self.kube.api_client(self.cluster)
                self._watch_once(api)
            except ServiceError as exc:
                if (exc.details or {}).get("http_status") == 410:
                    self._version = ""
                elif not self._stop.is_set():
                    log.info("job %s pod watch: %s", self.job, exc.message)
                    self._stop.wait(RETRY_SECONDS)
            except Exception:
                if self._stop.is_set():
                    return
                log.info("job %s pod watch dropped; resuming", self.job, exc_info=True)
                self._stop.wait(RETRY_SECONDS)

    def _watch_once(self, api: k8s.ApiClient) -> None:
        core = k8s.CoreV1Api(api)
        if not self._version:  # relist after a 410
            self._version, pods = raw_job_pods(api, self.namespace, self.job)
            self._pods = {p["metadata"]["name"]: p for p in pods}
            self._refresh(api)
        resp: Any = core.list_namespaced_pod(self.namespace, label_selector=f"{JOB_LABEL}={self.job}", watch=True,
                                        resource_version=self._version, timeout_seconds=WATCH_SECONDS,
                                        _request_timeout=WATCH_SECONDS + 30, _preload_content=False)
        self._resp = resp
        try:
            if self._stop.is_set():
                return
            for raw in iter_resp_lines(resp):  # type: ignore[no-untyped-call]
                event = json.loads(raw)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        self._version = ""
                    return
                meta = obj.get("metadata") or {}
                self._version = str(meta.get("resourceVersion") or self._version)
                if kind == "BOOKMARK":
                    continue
                name = str(meta.get("name"))
                if kind == "DELETED":
                    self._pods.pop(name, None)
                else:
                    self._pods[name] = obj
                self._refresh(api)
        finally:
            self._resp = None
            resp.close()
            resp.release_conn()


class LogHub:
    """The job streams being read right now: one per (cluster, namespace, job), made on first subscription
    and stopped when its last reader leaves."""

    def __init__(self, kube: KubeClients) -> None:
        self.kube = kube
        self._lock = threading.Lock()
        self._streams: dict[tuple[str, str, str], JobStream] = {}
        self._starting: dict[tuple[str, str, str], threading.Event] = {}

    def stream(self, cluster: str, namespace: str, job: str) -> JobStream:
        """The shared stream (started if new). Call from a worker thread: a new one lists the pods."""
        key = (cluster, namespace, job)
        while True:
            with self._lock:
                stream = self._streams.get(key)
                if stream is not None and key not in self._starting:
                    return stream
                starting = self._starting.get(key)
                if starting is None:
                    stream = JobStream(self.kube, cluster, namespace, job, self._idle)
                    self._starting[key] = threading.Event()
                    break
            starting.wait(30)  # another reader is listing its pods: share its stream
        try:
            stream.start()
        except BaseException:
            with self._lock:
                self._starting.pop(key).set()
            stream.stop()
            raise
        with self._lock:
            self._streams[key] = stream
            self._starting.pop(key).set()
        return stream

    def _idle(self, stream: JobStream) -> None:
        key = (stream.cluster, stream.namespace, stream.job)
        with self._lock:
            if self._streams.get(key) is not stream or not stream.idle:
                return
            del self._streams[key]
        stream.stop()

    def active(self) -> int:
        with self._lock:
            return len(self._streams)

    def stop(self) -> None:
        with self._lock:
            streams = list(self._streams.values())
            self._streams.clear()
        for stream in streams:
            stream.stop()
