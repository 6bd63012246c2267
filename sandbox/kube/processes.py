"""Simulated container processes: what runs inside a container the kubelet started.

The sandbox runs no real containers. A module registers a simulated *program* with :func:`program`
(``@program(matcher)`` on a function ``Process -> exit code``); the kubelet (:func:`.scheduler.run_pod`)
hands every started pod to :func:`run`, which starts each container a registered matcher claims as a
process on its own daemon thread. The process tells time by the cluster's clock (wall time, or the
sandbox's sped-up simulated clock): :meth:`Process.sleep` waits simulated seconds, converting them to real
waits at the pace the clock is observed to run, so a sped-up sandbox runs a 30-minute training in seconds
and nothing busy-waits. It writes its log through the cluster's pod logs (``kubectl logs``, with timestamps)
and ends with an exit code, which the kubelet side of this module turns into the container's
``state.terminated`` (exitCode, reason) and the pod's phase: ``Succeeded`` when every program container
exited 0, else ``Failed``, or — for ``restartPolicy: Always``, or ``OnFailure`` after a non-zero exit — an
in-place restart: ``lastState.terminated``, ``restartCount`` + 1, the log rotated to ``previous``, a
``CrashLoopBackOff`` wait (10 s, doubling to 300 s) and a new process.

Beside each run the kubelet's prober (:mod:`.probes`, handed to :func:`run`) probes the container; a failed
startup or liveness probe kills the run (:meth:`Process.kill`: exit 137, then a restart as above).

A process is killed when its pod is deleted (nothing more is written: the pod is gone) or its node goes
away or stops being Ready (exit 137, ``reason: Error``; the pod ends ``Failed`` with reason ``NodeLost``,
since the node cannot run it any more). Containers no program claims keep the kubelet's plain behaviour.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import logging
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import backends
from .cluster import Cluster, WriteOptions
from .errors import ApiError
from .resources import POD_KEY
from .scheduling import is_ready
from .store import Loc, Obj

log = logging.getLogger(__name__)

KUBELET = WriteOptions(manager="kubelet")
KILLED_EXIT = 137
MAX_REAL_WAIT = 0.25  # seconds: how long a sleeping process goes without checking its pod and node
LEARN_PACE = 0.05  # real seconds of observing the clock before its pace is trusted
BACKOFF_START, BACKOFF_MAX = 10.0, 300.0

Matcher = Callable[[Obj, dict[str, Any]], bool]


class Killed(Exception):
    """The process was killed: ``exit_code`` 137, or ``None`` when its pod is gone (nothing to report)."""

    def __init__(self, exit_code: int | None, reason: str = "") -> None:
        super().__init__(reason)
        self.exit_code = exit_code
        self.reason = reason


@dataclass
class Process:
    """One run of a simulated program in one container of one pod."""

    cluster: Cluster
    namespace: str
    pod: str
    uid: str
    container: str
    spec: dict[str, Any]
    pod_obj: Obj
    restart_count: int = 0
    killed: threading.Event = field(default_factory=threading.Event)
    started_at: str = ""
    ports: set[int] = field(default_factory=set)
    prober: Callable[[Process], None] | None = None  # the kubelet's prober, run beside each run (.probes)
    ended: threading.Event = field(default_factory=threading.Event)  # this run is over: its prober stops
    kill_reason: str = ""  # why the kubelet kills this run (a failed liveness or startup probe)
    wake: threading.Event = field(default_factory=threading.Event)  # a sleeping run wakes to be killed

    @property
    def argv(self) -> list[str]:
        return [str(w) for w in (self.spec.get("command") or []) + (self.spec.get("args") or [])]

    @property
    def env(self) -> dict[str, str]:
        """The container's environment (literal values; ``fieldRef`` to the pod's name, namespace, uid and
        node; ``secretKeyRef`` to a Secret's key; other sources are not simulated)."""
        meta, spec = self.pod_obj["metadata"], self.pod_obj.get("spec") or {}
        fields = {"metadata.name": meta["name"], "metadata.namespace": meta.get("namespace", ""),
                  "metadata.uid": meta.get("uid", ""), "spec.nodeName": spec.get("nodeName", ""),
                  "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
                  "status.podIP": (self.pod_obj.get("status") or {}).get("podIP", "")}
        env: dict[str, str] = {}
        for item in self.spec.get("env") or []:
            if "value" in item:
                env[item["name"]] = str(item["value"])
            elif secret_ref := (item.get("valueFrom") or {}).get("secretKeyRef"):
                value = self._secret_value(str(secret_ref.get("name", "")), str(secret_ref.get("key", "")))
                if value is not None:
                    env[item["name"]] = value
            else:
                ref = ((item.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath", "")
                if ref in fields:
                    env[item["name"]] = fields[ref]
        return env

    def _secret_value(self, name: str, key: str) -> str | None:
        secret = self.cluster.store.get(("", "secrets"), (self.namespace, name)) or {}
        if key in (secret.get("stringData") or {}):
            return str(secret["stringData"][key])
        encoded = (secret.get("data") or {}).get(key)
        return None if encoded is None else base64.b64decode(str(encoded)).decode(errors="replace")

    def now(self) -> float:
        return self.cluster.clock()

    def read_file(self, path: str) -> str | None:
        """The text at ``path`` in the container, where a ConfigMap volume provides it (the mount with the
        longest matching path; ``items`` map keys to paths); None where no simulated volume holds it."""
        def holds(mount: dict[str, Any]) -> bool:
            where = str(mount.get("mountPath", "")).rstrip("/")
            return path.startswith(where + "/") or (path == where and bool(mount.get("subPath")))

        mounts = sorted((m for m in self.spec.get("volumeMounts") or [] if holds(m)),
                        key=lambda m: len(str(m.get("mountPath", ""))), reverse=True)
        volumes = {v.get("name"): v for v in (self.pod_obj.get("spec") or {}).get("volumes") or []}
        for mount in mounts[:1]:
            relative = path[len(str(mount["mountPath"]).rstrip("/")) + 1:]
            if mount.get("subPath"):  # the volume's entry at subPath, mounted at mountPath (a file, or below it)
                relative = "/".join(p for p in (str(mount["subPath"]), relative) if p)
            source = (volumes.get(mount.get("name")) or {}).get("configMap")
            if not isinstance(source, dict):
                return None
            found = self.cluster.store.get(("", "configmaps"), (self.namespace, str(source.get("name", ""))))
            if found is None:
                return None
            items = {str(i.get("path")): str(i.get("key")) for i in source.get("items") or []}
            key = items.get(relative, relative if not items else "")
            value = (found.get("data") or {}).get(key)
            return None if value is None else str(value)
        return None

    def listen(self, port: int, handler: backends.Handler) -> None:
        """Serve HTTP at the pod's ``port`` until this run of the process ends (:mod:`.backends`)."""
        self.ports.add(port)
        backends.listen(self.cluster, self.namespace, self.pod, self.uid, port, handler)

    def log(self, text: str) -> None:
        self.cluster.logs.append((self.namespace, self.pod, self.container), text, self.now())

    def check(self) -> None:
        """Raise :class:`Killed` when the pod is gone, its node cannot run it any more, or the kubelet kills it."""
        if self.killed.is_set():
            raise Killed(None, "pod deleted")
        if self.kill_reason:
            raise Killed(KILLED_EXIT, self.kill_reason)
        pod = self.cluster.store.get(POD_KEY, (self.namespace, self.pod))
        if pod is None or pod["metadata"].get("uid") != self.uid or pod["metadata"].get("deletionTimestamp"):
            raise Killed(None, "pod deleted")
        node_name = (pod.get("spec") or {}).get("nodeName", "")
        node = self.cluster.store.get(("", "nodes"), ("", node_name))
        if node is None or not is_ready(node):
            raise Killed(KILLED_EXIT, f"node {node_name} is not ready")

    def kill(self, reason: str) -> None:
        """The kubelet kills this run (SIGKILL: exit 137); the container then restarts as its policy says. A run
        that already ended is left alone."""
        with _lock:
            if self.ended.is_set():
                return
            self.kill_reason = reason
        self.wake.set()

    def stop(self) -> None:
        """Its pod is gone: the run ends at once, reporting nothing."""
        self.killed.set()
        self.wake.set()

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of the cluster's time (``inf``: until killed); :class:`Killed` when killed meanwhile."""
        target = self.now() + max(seconds, 0.0)
        pace = _pace(self.cluster)
        while True:
            self.check()
            remaining = target - self.now()
            if remaining <= 0:
                return
            self.wake.wait(pace.wait(remaining))


Program = Callable[[Process], int]
_PROGRAMS: list[tuple[Matcher, Program]] = []


def program(matcher: Matcher) -> Callable[[Program], Program]:
    """Register a simulated program for the containers ``matcher(pod, container)`` claims (first match wins,
    in registration order)."""

    def register(fn: Program) -> Program:
        _PROGRAMS.append((matcher, fn))
        return fn

    return register


def probed(pod: Obj, container: dict[str, Any]) -> bool:
    """Whether the container is ready only once its probes pass: a program runs it and it has a readiness or
    startup probe (the kubelet's prober runs them, :mod:`.probes`); other containers are ready as they run."""
    return bool(container.get("readinessProbe") or container.get("startupProbe")) and find(pod, container) is not None


def find(pod: Obj, container: dict[str, Any]) -> Program | None:
    return next((fn for matcher, fn in _PROGRAMS if _safe_match(matcher, pod, container)), None)


def _safe_match(matcher: Matcher, pod: Obj, container: dict[str, Any]) -> bool:
    try:
        return matcher(pod, container)
    except Exception:  # a matcher bug must not take the kubelet down
        log.exception("program matcher failed")
        return False


class _Pace:
    """How many simulated seconds the cluster's clock moves per real second, as observed."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.real0, self.sim0 = time.monotonic(), clock()

    def wait(self, remaining: float) -> float:
        """The real seconds to wait for ``remaining`` simulated ones (short while the pace is not known yet)."""
        real = time.monotonic() - self.real0
        if real < LEARN_PACE:
            return min(remaining, 0.005)
        rate = max((self.clock() - self.sim0) / real, 1e-9)
        return min(MAX_REAL_WAIT, max(remaining / rate, 0.0005))


_lock = threading.Lock()
_paces: weakref.WeakKeyDictionary[Cluster, _Pace] = weakref.WeakKeyDictionary()
_running: weakref.WeakKeyDictionary[Cluster, dict[tuple[str, str, str], Process]] = weakref.WeakKeyDictionary()


def _pace(cluster: Cluster) -> _Pace:
    with _lock:
        pace = _paces.get(cluster)
        if pace is None:
            pace = _paces[cluster] = _Pace(cluster.clock)
        return pace


def real_wait(cluster: Cluster, simulated: float) -> float:
    """The real seconds to wait for ``simulated`` seconds of ``cluster``'s clock (at most a short step)."""
    return _pace(cluster).wait(simulated)


def running(cluster: Cluster) -> list[Process]:
    """The processes running in ``cluster`` now."""
    with _lock:
        return list(_running.get(cluster, {}).values())


def program_containers(pod: Obj) -> list[tuple[dict[str, Any], Program]]:
    return [(c, fn) for c in (pod.get("spec") or {}).get("containers") or [] if (fn := find(pod, c)) is not None]


def run(cluster: Cluster, pod: Obj, prober: Callable[[Process], None] | None = None) -> bool:
    """The kubelet's hook for a started (``Running``) pod: start a process for each program container whose
    status says running and that has none yet, with ``prober`` running beside each run of it. True when the
    pod runs any program (its end is then the programs' to decide)."""
    claimed = program_containers(pod)
    if not claimed:
        return False
    meta = pod["metadata"]
    statuses = {c.get("name"): c for c in (pod.get("status") or {}).get("containerStatuses") or []}
    for container, fn in claimed:
        status = statuses.get(container.get("name"), {})
        if "running" not in (status.get("state") or {}):
            continue
        key = (meta["namespace"], meta["name"], str(container.get("name")))
        proc = Process(cluster, key[0], key[1], meta["uid"], key[2], container, pod,
                       int(status.get("restartCount") or 0),
                       started_at=str((status["state"]["running"] or {}).get("startedAt", "")), prober=prober)
        with _lock:
            table = _running.setdefault(cluster, {})
            current = table.get(key)
            if current is not None and current.uid == proc.uid:
                continue
            table[key] = proc
        threading.Thread(target=_supervise, args=(proc, fn), name=f"proc-{key[1]}-{key[2]}", daemon=True).start()
    return True


def pod_gone(cluster: Cluster, loc: Loc, uid: str | None = None) -> None:
    """The pod was deleted (or is being deleted): kill its processes, report nothing."""
    with _lock:
        table = _running.get(cluster, {})
        for key in [k for k, p in table.items() if k[:2] == loc and (uid is None or p.uid != uid)]:
            table.pop(key).stop()


def stop_cluster(cluster: Cluster) -> None:
    """The cluster's control loops stop (the emulator closes or deletes it): kill every process in it."""
    with _lock:
        for proc in _running.pop(cluster, {}).values():
            proc.stop()


def _supervise(proc: Process, fn: Program) -> None:
    while True:
        if proc.prober is not None:
            threading.Thread(target=_probe, args=(proc, proc.prober), name=f"probe-{proc.pod}-{proc.container}",
                             daemon=True).start()
        try:
            code: int | None = fn(proc)
            reason = ""
        except Killed as exc:
            code, reason = exc.exit_code, exc.reason
        except Exception as exc:  # the program's bug is the container's crash, as in a real one
            log.exception("simulated program in %s/%s failed", proc.pod, proc.container)
            for line in traceback.format_exception_only(exc):
                proc.log(line.rstrip("\n"))
            code, reason = 1, "crashed"
        with _lock:
            proc.ended.set()  # its prober stops with it (and can kill it no more)
            proc.kill_reason = ""  # the kill is done: the back-off sleeps undisturbed
        proc.wake.clear()
        for port in proc.ports:  # the process is gone: nothing listens on its ports any more
            backends.close(proc.cluster, proc.namespace, proc.pod, proc.uid, port)
        if code is None:
            _forget(proc)
            return
        nxt = _exited(proc, int(code), node_lost=reason.startswith("node"))
        if nxt is None:
            return
        proc = nxt


def _probe(proc: Process, prober: Callable[[Process], None]) -> None:
    """Run the kubelet's prober for one run of a container, until that run ends."""
    try:
        prober(proc)
    except Killed:
        return
    except Exception:  # a prober bug must not take the kubelet down
        log.exception("prober of %s/%s failed", proc.pod, proc.container)


def _forget(proc: Process) -> None:
    with _lock:
        table = _running.get(proc.cluster, {})
        key = (proc.namespace, proc.pod, proc.container)
        if table.get(key) is proc:
            del table[key]


def _digest(*parts: object) -> str:
    return hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()


def _exited(proc: Process, code: int, *, node_lost: bool) -> Process | None:
    """Write what the kubelet reports when ``proc`` ended with ``code``; the next run when it restarts."""
    cluster = proc.cluster
    now = cluster.now_iso()
    terminated = {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                  "startedAt": proc.started_at or now, "finishedAt": now,
                  "containerID": f"containerd://{_digest(proc.uid, proc.container, proc.restart_count)}"}
    key = (proc.namespace, proc.pod, proc.container)
    with cluster.store.lock:
        pod = cluster.store.get(POD_KEY, key[:2])
        if pod is None or pod["metadata"].get("uid") != proc.uid or pod["metadata"].get("deletionTimestamp"):
            _forget(proc)
            return None
        policy = (pod.get("spec") or {}).get("restartPolicy", "Always")
        restart = not node_lost and (policy == "Always" or (policy == "OnFailure" and code != 0))
        status = dict(pod.get("status") or {})
        containers = []
        for c in status.get("containerStatuses") or []:
            if c.get("name") == proc.container:
                if restart:
                    backoff = min(BACKOFF_START * 2 ** proc.restart_count, BACKOFF_MAX)
                    c = {**c, "ready": False, "started": False, "restartCount": proc.restart_count + 1,
                         "lastState": {"terminated": terminated},
                         "state": {"waiting": {"reason": "CrashLoopBackOff", "message":
                                               f"back-off {int(backoff)}s restarting failed container="
                                               f"{proc.container} pod={proc.pod}_{proc.namespace}({proc.uid})"}}}
                else:
                    c = {**c, "ready": False, "started": False, "state": {"terminated": terminated}}
            containers.append(c)
        status["containerStatuses"] = containers
        if restart:
            status["conditions"] = ready_conditions(status, now)
        else:
            _settle_phase(pod, status, now, node_lost)
        write_status(cluster, pod, status)
    if not restart:
        cluster.logs.terminate(key)
        _forget(proc)
        return None
    cluster.logs.restart(key)
    try:
        proc.sleep(min(BACKOFF_START * 2 ** proc.restart_count, BACKOFF_MAX))
    except Killed as exc:
        if exc.exit_code is None:
            _forget(proc)
            return None
        return _exited(proc, exc.exit_code, node_lost=True)  # its node went away during the back-off
    return _restarted(proc)


def _settle_phase(pod: Obj, status: dict[str, Any], now: str, node_lost: bool) -> None:
    """The pod's phase once a program container terminated without restart."""
    programs = {c.get("name") for c, _ in program_containers(pod)}
    states = [c.get("state") or {} for c in status["containerStatuses"] if c.get("name") in programs]
    if any("terminated" not in s for s in states):
        status["conditions"] = _conditions(status, now, "ContainersNotReady", ("Ready", "ContainersReady"))
        return
    ok = all(s["terminated"].get("exitCode") == 0 for s in states)
    status["phase"] = "Succeeded" if ok else "Failed"
    if node_lost:
        status["reason"] = "NodeLost"
        node = (pod.get("spec") or {}).get("nodeName")
        status["message"] = f"Node {node} which was running pod {pod['metadata']['name']} is unresponsive"
    status["containerStatuses"] = [
        c if c.get("name") in programs else
        {**c, "ready": False, "started": False, "state": {"terminated": {
            "exitCode": 0 if ok else KILLED_EXIT, "reason": "Completed" if ok else "Error", "finishedAt": now,
            "startedAt": ((c.get("state") or {}).get("running") or {}).get("startedAt", now)}}}
        for c in status["containerStatuses"]]
    status["conditions"] = _conditions(status, now, "PodCompleted" if ok else "PodFailed",
                                       ("Ready", "ContainersReady", "PodReadyToStartContainers"))


def _conditions(status: dict[str, Any], now: str, reason: str, falsify: tuple[str, ...]) -> list[dict[str, Any]]:
    out = []
    for cond in status.get("conditions") or []:
        if cond.get("type") in falsify and cond.get("status") != "False":
            cond = {**cond, "status": "False", "reason": reason, "lastTransitionTime": now}
        out.append(cond)
    return out


def _restarted(proc: Process) -> Process | None:
    """The container's next run after its back-off: state running again, a new process."""
    cluster = proc.cluster
    now = cluster.now_iso()
    with cluster.store.lock:
        pod = cluster.store.get(POD_KEY, (proc.namespace, proc.pod))
        if pod is None or pod["metadata"].get("uid") != proc.uid or pod["metadata"].get("deletionTimestamp"):
            _forget(proc)
            return None
        status = dict(pod.get("status") or {})
        restarts = proc.restart_count + 1
        ready = not probed(pod, proc.spec)  # a probed container waits for its probes again (.probes)
        status["containerStatuses"] = [
            {**c, "ready": ready, "started": ready or not proc.spec.get("startupProbe"),
             "state": {"running": {"startedAt": now}},
             "containerID": f"containerd://{_digest(proc.uid, proc.container, restarts)}"}
            if c.get("name") == proc.container else c for c in status.get("containerStatuses") or []]
        status["conditions"] = ready_conditions(status, now)
        write_status(cluster, pod, status)
        fresh = cluster.store.get(POD_KEY, (proc.namespace, proc.pod)) or pod
    nxt = Process(cluster, proc.namespace, proc.pod, proc.uid, proc.container, proc.spec, fresh, restarts,
                  killed=proc.killed, started_at=now, prober=proc.prober)
    with _lock:
        table = _running.setdefault(cluster, {})
        key = (proc.namespace, proc.pod, proc.container)
        if table.get(key) is not proc:
            return None
        table[key] = nxt
    return nxt


def ready_conditions(status: dict[str, Any], now: str) -> list[dict[str, Any]]:
    """The pod's ``Ready`` and ``ContainersReady`` conditions as the kubelet derives them from its container
    statuses: True when every container is ready, else False (``ContainersNotReady``, naming the unready ones);
    the transition time moves only when the status does."""
    containers = status.get("containerStatuses") or []
    unready = [str(c.get("name")) for c in containers if not c.get("ready")]
    out = []
    for cond in status.get("conditions") or []:
        if cond.get("type") in ("Ready", "ContainersReady"):
            value = "False" if unready else "True"
            since = cond.get("lastTransitionTime") if cond.get("status") == value else now
            cond = {k: v for k, v in cond.items() if k not in ("reason", "message")}
            cond.update(status=value, lastTransitionTime=since or now)
            if unready:
                cond.update(reason="ContainersNotReady",
                            message=f"containers with unready status: [{' '.join(unready)}]")
        out.append(cond)
    return out


def write_status(cluster: Cluster, pod: Obj, status: dict[str, Any]) -> None:
    """Replace the pod's status as the kubelet does (a pod deleted meanwhile is left alone)."""
    meta = pod["metadata"]
    body = {**pod, "metadata": {**meta}, "status": status}
    with contextlib.suppress(ApiError):  # deleted meanwhile (the store lock is held: nothing else changed it)
        cluster.replace(cluster.builtin("", "pods"), meta["namespace"], meta["name"], body, KUBELET, "status")
