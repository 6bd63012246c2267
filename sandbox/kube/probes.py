"""The kubelet's readiness and startup probes, for containers a simulated program runs.

A container without probes is ready as soon as it runs (the kubelet's plain behaviour, :mod:`.scheduler`). A
program container with a ``readinessProbe`` or ``startupProbe`` starts not ready (``started: false`` under a
startup probe) and the pod's ``Ready``/``ContainersReady`` conditions ``False`` (``ContainersNotReady``); a
program that serves HTTP runs :func:`serve`, the kubelet's prober for it: every ``periodSeconds`` (simulated
time, after ``initialDelaySeconds``) the probe is sent to what the pod listens on (:mod:`.backends`); the
startup probe first, until it passes once, then the readiness probe. An ``httpGet`` passes on a status from 200
to 399, a ``tcpSocket`` when something listens on the port; nothing listening fails. Readiness goes True on
``successThreshold`` consecutive passes and back to False on ``failureThreshold`` consecutive failures.
``exec`` and ``grpc`` probes are not run (they pass); a failed startup probe does not restart the container,
and liveness probes are not simulated.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from . import backends, processes
from .resources import POD_KEY

DEFAULT_PERIOD = 10.0


def _port(container: dict[str, Any], value: Any) -> int | None:
    if str(value).isdigit():
        return int(value)
    return next((int(p["containerPort"]) for p in container.get("ports") or [] if p.get("name") == value), None)


def passes(proc: processes.Process, probe: dict[str, Any]) -> bool:
    """One probe, sent to the pod as the kubelet sends it."""
    action = probe.get("httpGet") or probe.get("tcpSocket")
    if action is None:
        return True  # exec and grpc probes are not simulated
    port = _port(proc.spec, action.get("port"))
    handler = None if port is None else backends.dial(proc.cluster, proc.namespace, proc.pod, proc.uid, port)
    if handler is None:
        return False
    if "httpGet" not in probe:
        return True
    path, _, query = str(action.get("path") or "/").partition("?")
    response = handler(backends.Request("GET", path, query, {"User-Agent": "kube-probe/1.31"}))
    return 200 <= response.status < 400


def _set(proc: processes.Process, *, ready: bool, started: bool) -> None:
    cluster = proc.cluster
    with cluster.store.lock:
        pod = cluster.store.get(POD_KEY, (proc.namespace, proc.pod))
        if pod is None or pod["metadata"].get("uid") != proc.uid:
            return
        status = dict(pod.get("status") or {})
        containers = [{**c, "ready": ready, "started": started} if c.get("name") == proc.container else c
                      for c in status.get("containerStatuses") or []]
        if containers == status.get("containerStatuses"):
            return
        status["containerStatuses"] = containers
        all_ready = all(c.get("ready") for c in containers)
        now = cluster.now_iso()
        conditions = []
        for cond in status.get("conditions") or []:
            if cond.get("type") in ("Ready", "ContainersReady"):
                value = "True" if all_ready else "False"
                if cond.get("status") != value:
                    cond = {k: v for k, v in cond.items() if k not in ("reason", "message")}
                    cond.update(status=value, lastTransitionTime=now)
                    if not all_ready:
                        cond["reason"] = "ContainersNotReady"
                        cond["message"] = f"containers with unready status: [{proc.container}]"
            conditions.append(cond)
        status["conditions"] = conditions
        processes.write_status(cluster, pod, status)


def serve(proc: processes.Process) -> None:
    """Probe the container for as long as its process runs (returns only by :class:`.Killed`)."""
    startup, readiness = proc.spec.get("startupProbe"), proc.spec.get("readinessProbe")
    started = startup is None
    ready = False
    passed = failed = 0
    first = startup or readiness or {}
    proc.sleep(max(float(first.get("initialDelaySeconds") or 0) - _age(proc), 0.0))
    while True:
        if not started:
            assert startup is not None
            started = passes(proc, startup)
            if started:
                _set(proc, ready=readiness is None, started=True)
                ready = readiness is None
            period = float(startup.get("periodSeconds") or DEFAULT_PERIOD)
        elif readiness is not None:
            if passes(proc, readiness):
                passed, failed = passed + 1, 0
                if not ready and passed >= int(readiness.get("successThreshold") or 1):
                    ready = True
                    _set(proc, ready=True, started=True)
            else:
                passed, failed = 0, failed + 1
                if ready and failed >= int(readiness.get("failureThreshold") or 3):
                    ready = False
                    _set(proc, ready=False, started=True)
            period = float(readiness.get("periodSeconds") or DEFAULT_PERIOD)
        else:
            period = DEFAULT_PERIOD
        proc.sleep(period)


def _age(proc: processes.Process) -> float:
    """Simulated seconds since the container started (the initial delay counts from there)."""
    if not proc.started_at:
        return 0.0
    try:
        started = datetime.fromisoformat(proc.started_at.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0
    return max(proc.now() - started, 0.0)
