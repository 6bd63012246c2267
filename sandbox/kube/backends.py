"""In-process servers: what a simulated program listens on, reached by the apiserver's proxy.

The sandbox opens no sockets for simulated pods. A program (:mod:`.processes`) that serves HTTP calls
:meth:`.Process.listen` with a port and a handler; the handler is registered here under the pod (its uid, so a
new pod of the same name never answers for an old one) and the port, and dropped when the process ends.
:func:`dial` is the pod network as the apiserver's proxy sees it: the handler listening at a pod's port,
or None (connection refused).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .cluster import Cluster


@dataclass(frozen=True)
class Request:
    """One HTTP request as the backend receives it (``path`` starts with ``/``; ``query`` without ``?``)."""

    method: str
    path: str
    query: str = ""
    headers: list[tuple[str, str]] = field(default_factory=list)  # in order, a repeated header repeated
    body: bytes = b""

    def header(self, name: str, default: str = "") -> str:
        return next((v for k, v in self.headers if k.lower() == name.lower()), default)


@dataclass
class Response:
    status: int
    body: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=list)


Handler = Callable[[Request], Response]
Address = tuple[str, str, int]  # namespace, pod, port

_lock = threading.Lock()
_servers: weakref.WeakKeyDictionary[Cluster, dict[Address, tuple[str, Handler]]] = weakref.WeakKeyDictionary()


def listen(cluster: Cluster, namespace: str, pod: str, uid: str, port: int, handler: Handler) -> None:
    """Serve ``handler`` at the pod's ``port`` (replacing what an earlier run of the same pod left there)."""
    with _lock:
        _servers.setdefault(cluster, {})[(namespace, pod, port)] = (uid, handler)


def close(cluster: Cluster, namespace: str, pod: str, uid: str, port: int) -> None:
    with _lock:
        table = _servers.get(cluster, {})
        if table.get((namespace, pod, port), ("", None))[0] == uid:
            del table[(namespace, pod, port)]


def dial(cluster: Cluster, namespace: str, pod: str, uid: str, port: int) -> Handler | None:
    """The handler listening at the pod's ``port`` now, or None (nothing listens: connection refused)."""
    with _lock:
        found = _servers.get(cluster, {}).get((namespace, pod, port))
    return found[1] if found is not None and found[0] == uid else None


def named_port(container: dict[str, Any], value: Any) -> int | None:
    """The port a probe or a Service's ``targetPort`` names in ``container``: a number as is, a name through the
    container's named ``containerPort`` (None where it declares no such name)."""
    if str(value).isdigit():
        return int(value)
    return next((int(p["containerPort"]) for p in container.get("ports") or [] if p.get("name") == value), None)
