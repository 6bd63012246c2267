"""The ``pods/log`` subresource as the kubelet serves it through the apiserver: one container's log (``container``,
``previous``, ``sinceSeconds``/``sinceTime``, ``tailLines``, ``limitBytes``, ``timestamps``), or with ``follow``
a stream of its lines until the container's log ends or the client goes."""

from __future__ import annotations

import asyncio
from collections import deque
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from .cluster import Cluster
from .errors import bad_request
from .logs import LogLine
from .resources import ResourceType

if TYPE_CHECKING:
    from .http import KubeHandler


async def serve(handler: KubeHandler, cluster: Cluster, rt: ResourceType, namespace: str | None, name: str) -> None:
    """``GET pods/{name}/log``: the container's log, or its stream with ``follow`` until it ends or the client
    goes."""
    pod = cluster.get(rt, namespace, name)
    containers = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
    init = [c.get("name") for c in (pod.get("spec") or {}).get("initContainers") or []]
    container = handler._arg("container")
    if not container:
        if len(containers) != 1:
            raise bad_request(f"a container name must be specified for pod {name}, choose one of: "
                              f"[{' '.join(str(c) for c in containers)}]")
        container = str(containers[0])
    elif container not in containers + init:
        raise bad_request(f"container {container} is not valid for pod {name}")
    key = (pod["metadata"]["namespace"], name, container)
    since: float | None = None
    if handler._arg("sinceSeconds").isdigit():
        since = cluster.clock() - int(handler._arg("sinceSeconds"))
    elif handler._arg("sinceTime"):
        since = since_time(handler._arg("sinceTime"))
    tail_arg = handler._arg("tailLines")
    tail = int(tail_arg) if tail_arg.lstrip("-").isdigit() and int(tail_arg) >= 0 else None
    timestamps = handler._bool("timestamps")
    previous = handler._bool("previous")
    limit = int(handler._arg("limitBytes")) if handler._arg("limitBytes").isdigit() else None
    if not handler._bool("follow") or previous:
        lines = cluster.logs.read(key, previous=previous, tail=tail, since=since)
        text = "".join(line.render(timestamps) for line in lines)
        handler.set_header("Content-Type", "text/plain")
        handler.finish(text[:limit] if limit is not None else text)
        return
    loop = asyncio.get_running_loop()
    queued: deque[LogLine | None] = deque()
    woken = asyncio.Event()
    waking = [False]  # a wake-up is on its way: lines written meanwhile need none of their own

    def on_line(line: LogLine | None) -> None:  # the writer's thread, under the log's lock
        queued.append(line)
        if not waking[0]:
            waking[0] = True
            loop.call_soon_threadsafe(woken.set)

    lines, following = cluster.logs.read_and_follow(key, on_line, tail=tail, since=since)
    try:
        await handler._start_stream("text/plain")
        for line in lines:
            handler.write(line.render(timestamps))
        await handler.flush()
        closed = asyncio.ensure_future(handler._closed.wait())
        ended = False
        while following and not ended:
            getter = asyncio.ensure_future(woken.wait())
            done, _ = await asyncio.wait({getter, closed}, return_when=asyncio.FIRST_COMPLETED)
            if closed in done:
                getter.cancel()
                break
            woken.clear()
            waking[0] = False  # before draining: a line written from here on wakes the loop again
            while queued:  # what is queued goes out in one flush
                item = queued.popleft()
                if item is None:
                    ended = True
                    break
                handler.write(item.render(timestamps))
            await handler.flush()
        closed.cancel()
        if not handler._finished:
            handler.finish()
    finally:
        cluster.logs.unfollow(key, on_line)


def since_time(value: str) -> float:
    """``sinceTime`` as the API server takes it: RFC 3339, honoured to the second (a fraction is dropped)."""
    try:
        stamp = datetime.strptime(value[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
    except ValueError:
        raise bad_request(f"sinceTime {value!r} is not an RFC 3339 time") from None
    return stamp.timestamp()
