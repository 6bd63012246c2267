"""The kubelet's prober: startup, readiness and liveness probes of the containers a simulated program runs.

Beside each run of a program container (:mod:`.processes`) the kubelet runs its probes, each every
``periodSeconds`` (simulated time, default 10) from ``initialDelaySeconds`` after the container started; the
readiness and liveness probes wait until the startup probe has passed once. A probe is sent to what the pod
listens on (:mod:`.backends`): an ``httpGet`` passes on a status from 200 to 399, a ``tcpSocket`` when something
listens on the port; nothing listening fails as the kubelet's dial does. ``exec`` and ``grpc`` probes pass
while the program runs (no command runs in a simulated container). Every failure is an ``Unhealthy`` warning
on the pod (``Startup probe failed: ...``, counted when it repeats).

A container with a ``readinessProbe`` or ``startupProbe`` starts not ready (``started: false`` under a startup
probe); it is ``started`` once its startup probe passes and ready on ``successThreshold`` consecutive readiness
passes (at once without a readiness probe), unready again on ``failureThreshold`` consecutive failures. A
startup probe failing ``failureThreshold`` times in a row (default 3), or a liveness probe doing so, gets the
container killed (a ``Killing`` event: ``Container c failed startup probe, will be restarted``): exit 137,
then a restart as the pod's ``restartPolicy`` says (``restartCount`` + 1, ``lastState.terminated``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from . import backends, processes
from . import operator_support as ops
from .resources import POD_KEY

DEFAULT_PERIOD = 10.0
KINDS = (("startup", "startupProbe"), ("readiness", "readinessProbe"), ("liveness", "livenessProbe"))


def failure(proc: processes.Process, probe: dict[str, Any]) -> str:
    """Send one probe to the pod as the kubelet sends it: "" when it passes, else the kubelet's failure text."""
    action = probe.get("httpGet") or probe.get("tcpSocket")
    if action is None:
        return ""  # exec and grpc probes: pass while the program runs
    port = backends.named_port(proc.spec, action.get("port"))
    ip = (proc.pod_obj.get("status") or {}).get("podIP", "")
    address = f"{ip}:{port if port is not None else action.get('port')}"
    handler = None if port is None else backends.dial(proc.cluster, proc.namespace, proc.pod, proc.uid, port)
    refused = f"dial tcp {address}: connect: connection refused"
    path, _, query = str(action.get("path") or "/").partition("?")
    if handler is None:
        return f'Get "http://{address}{action.get("path") or "/"}": {refused}' if "httpGet" in probe else refused
    if "httpGet" not in probe:
        return ""
    response = handler(backends.Request("GET", path, query, [("User-Agent", "kube-probe/1.31")]))
    return "" if 200 <= response.status < 400 else f"HTTP probe failed with statuscode: {response.status}"


def _set(proc: processes.Process, *, ready: bool, started: bool) -> None:
    cluster = proc.cluster
    with cluster.store.lock:
        pod = cluster.store.get(POD_KEY, (proc.namespace, proc.pod))
        if pod is None or pod["metadata"].get("uid") != proc.uid or proc.ended.is_set():
            return
        status = dict(pod.get("status") or {})
        containers = [{**c, "ready": ready, "started": started} if c.get("name") == proc.container else c
                      for c in status.get("containerStatuses") or []]
        if containers == status.get("containerStatuses"):
            return
        status["containerStatuses"] = containers
        status["conditions"] = processes.ready_conditions(status, cluster.now_iso())
        processes.write_status(cluster, pod, status)


def run(proc: processes.Process) -> None:
    """Probe one run of the container until it ends (returns, or :class:`.Killed`), killing it where its
    startup or liveness probe fails ``failureThreshold`` times in a row."""
    probes = {kind: proc.spec[field] for kind, field in KINDS if proc.spec.get(field)}
    if not probes:
        return
    began = proc.now() - _age(proc)
    due = {kind: began + float(probe.get("initialDelaySeconds") or 0) for kind, probe in probes.items()}
    started, ready = "startup" not in probes, False
    passed = dict.fromkeys(probes, 0)
    failed = dict.fromkeys(probes, 0)
    while True:
        kind, at = min(((k, t) for k, t in due.items() if started or k == "startup"), key=lambda kt: kt[1])
        proc.sleep(at - proc.now())
        if proc.ended.is_set():
            return
        probe = probes[kind]
        due[kind] = max(at, proc.now()) + float(probe.get("periodSeconds") or DEFAULT_PERIOD)
        why = failure(proc, probe)
        if why:
            passed[kind], failed[kind] = 0, failed[kind] + 1
            ops.event(proc.cluster, proc.pod_obj, "Unhealthy", f"{kind.capitalize()} probe failed: {why}", "kubelet",
                      "Warning")
        else:
            passed[kind], failed[kind] = passed[kind] + 1, 0
        threshold = int(probe.get("failureThreshold") or 3)
        if kind in ("startup", "liveness") and failed[kind] >= threshold:
            ops.event(proc.cluster, proc.pod_obj, "Killing",
                      f"Container {proc.container} failed {kind} probe, will be restarted", "kubelet")
            proc.kill(f"{kind} probe failed")
            return
        if kind == "startup" and not why:
            started = True  # the startup probe is done for this run
            del due["startup"]
            for other in due:
                due[other] = max(due[other], proc.now())
            ready = "readiness" not in probes
            _set(proc, ready=ready, started=True)
        elif kind == "readiness":
            if not ready and passed[kind] >= int(probe.get("successThreshold") or 1):
                ready = True
                _set(proc, ready=True, started=True)
            elif ready and failed[kind] >= threshold:
                ready = False
                _set(proc, ready=False, started=True)


def _age(proc: processes.Process) -> float:
    """Simulated seconds since the container started (the initial delay counts from there)."""
    if not proc.started_at:
        return 0.0
    try:
        started = datetime.fromisoformat(proc.started_at.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0
    return max(proc.now() - started, 0.0)
