"""The live log stream of a job against the Kubernetes emulator, through the official client: order, exact
resumption from a cursor (lines within one second included), tails, new pods joining, one Kubernetes
stream per container however many read, a bounded buffer for a reader that does not read, and a followed
body cut mid-line resumed with that line whole, once."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import closing, suppress
from pathlib import Path

import pytest

from services.logs import LogView
from services.logs.cursor import Line
from services.logs.models import LogStreamQuery
from tests.logs_support import BASE_TS, CLUSTER, VIEWER, LogWorld, log_world
from tests.support import free_port, wait_until


@pytest.fixture
def world(tmp_path: Path) -> Iterator[LogWorld]:
    with log_world(tmp_path) as w:
        yield w


def _open(world: LogWorld, job: str = "train", **query: object) -> LogView:
    return world.services.logs.open_stream(VIEWER, CLUSTER, job, LogStreamQuery(**query))  # type: ignore[arg-type]


def _collect(view: LogView, count: int, limit: int = 5_000) -> list[Line]:
    got: list[Line] = []

    def enough() -> bool:
        got.extend(view.take(limit).lines)
        return len(got) >= count

    wait_until(enough, 30, f"{count} lines")
    return got


def texts(lines: list[Line]) -> list[str]:
    return [f"{line.pod} {line.text}" for line in lines]


def test_history_then_live_lines_arrive_in_order(world: LogWorld) -> None:
    world.pod("train-worker-0", "train")
    world.pod("train-worker-1", "train")
    world.pod("other-worker-0", "other")  # another job's pod: never in this stream
    for i in range(3):
        world.log("train-worker-0", f"old {i}", BASE_TS + i)
        world.log("train-worker-1", f"old {i}", BASE_TS + i + 0.5)
        world.log("other-worker-0", f"other {i}", BASE_TS + i)
    view = _open(world)
    try:
        assert texts(_collect(view, 6)) == [f"train-worker-{p} old {i}" for i in range(3) for p in (0, 1)]
        wait_until(view.caught_up.is_set, 30, "the catch-up to end")
        for i in range(50):
            world.log(f"train-worker-{i % 2}", f"live {i}", BASE_TS + 10 + i * 0.01)
        live = _collect(view, 50)
        for pod in (0, 1):  # each pod's lines in order; pods interleave as their streams deliver
            assert [line.text for line in live if line.pod == f"train-worker-{pod}"] == \
                [f"live {i}" for i in range(pod, 50, 2)]
        assert len(live) == 50
    finally:
        view.close()


def test_reconnect_resumes_without_loss_or_repeat_within_one_second(world: LogWorld) -> None:
    world.pod("train-worker-0", "train")
    for i in range(5):  # five lines in one second, then more in that same second after the reconnect
        world.log("train-worker-0", f"a{i}", BASE_TS + 0.1 + i * 0.001)
    first = _open(world)
    try:
        got = _collect(first, 3, limit=3)[:3]  # read three, leave two waiting
        cursor = first.take(0).cursor
    finally:
        first.close()
    for i in range(3):
        world.log("train-worker-0", f"b{i}", BASE_TS + 0.5)  # same second, even the same timestamp
    world.log("train-worker-0", "c0", BASE_TS + 1.2)
    second = _open(world, cursor=cursor)
    try:
        rest = _collect(second, 6)
        assert [line.text for line in got + rest] == ["a0", "a1", "a2", "a3", "a4", "b0", "b1", "b2", "c0"]
        wait_until(second.caught_up.is_set, 30, "the catch-up to end")
        world.log("train-worker-0", "c1", BASE_TS + 1.2)
        assert [line.text for line in _collect(second, 1)] == ["c1"]
        cursor = second.take(0).cursor
    finally:
        second.close()
    third = _open(world, cursor=cursor)  # nothing new: nothing repeated
    try:
        wait_until(third.caught_up.is_set, 30, "the catch-up to end")
        world.log("train-worker-0", "d0", BASE_TS + 1.2)
        assert [line.text for line in _collect(third, 1)] == ["d0"]
    finally:
        third.close()


def test_tail_starts_with_the_last_lines_of_the_job(world: LogWorld) -> None:
    world.pod("train-worker-0", "train")
    world.pod("train-worker-1", "train")
    for i in range(20):
        world.log(f"train-worker-{i % 2}", f"l{i}", BASE_TS + i * 0.25)  # four lines a second, two pods
    view = _open(world, tail=5)
    try:
        wait_until(view.caught_up.is_set, 30, "the catch-up to end")
        assert [line.text for line in view.take().lines] == [f"l{i}" for i in range(15, 20)]
        world.log("train-worker-0", "next", BASE_TS + 4)
        assert [line.text for line in _collect(view, 1)] == ["next"]
    finally:
        view.close()


def test_a_new_pod_of_the_job_joins_the_stream_from_its_first_line(world: LogWorld) -> None:
    world.pod("train-worker-0", "train")
    world.log("train-worker-0", "first", BASE_TS)
    view = _open(world)
    try:
        assert [line.text for line in _collect(view, 1)] == ["first"]
        world.pod("train-worker-1", "train")  # e.g. the operator re-created a pod after a fault
        world.log("train-worker-1", "restarted 0", BASE_TS + 5)
        world.log("train-worker-1", "restarted 1", BASE_TS + 5)
        assert texts(_collect(view, 2)) == ["train-worker-1 restarted 0", "train-worker-1 restarted 1"]
    finally:
        view.close()


def test_one_pod_one_container_or_one_rank(world: LogWorld) -> None:
    world.pod("train-master-0", "train", labels={"training.kubeflow.org/replica-type": "master",
                                                 "training.kubeflow.org/replica-index": "0"})
    world.pod("train-worker-0", "train", labels={"training.kubeflow.org/replica-type": "worker",
                                                 "training.kubeflow.org/replica-index": "0"})
    world.pod("train-sidecar", "train", containers=("pytorch", "agent"))
    world.log("train-master-0", "m", BASE_TS)
    world.log("train-worker-0", "w", BASE_TS)
    world.log("train-sidecar", "s-main", BASE_TS)
    world.log("train-sidecar", "s-agent", BASE_TS, container="agent")
    for query, expected in (({"rank": 1}, ["train-worker-0 w"]), ({"pod": "train-master-0"}, ["train-master-0 m"]),
                            ({"container": "agent"}, ["train-sidecar s-agent"])):
        view = _open(world, **query)
        try:
            wait_until(view.caught_up.is_set, 30, "the catch-up to end")
            assert texts(view.take().lines) == expected, query
        finally:
            view.close()


def test_readers_of_one_job_share_one_kubernetes_stream_per_container(world: LogWorld) -> None:
    world.pod("train-worker-0", "train")
    views = [_open(world) for _ in range(5)]
    try:
        for view in views:
            wait_until(view.caught_up.is_set, 30, "the catch-up to end")
        world.log("train-worker-0", "to all", BASE_TS)
        for view in views:
            assert [line.text for line in _collect(view, 1)] == ["to all"]
        assert world.services.logs.hub.active() == 1
    finally:
        for view in views:
            view.close()
    assert world.services.logs.hub.active() == 0

    def follows() -> list[str]:
        return [r.query for r in world.emulator.requests_for(CLUSTER, "GET")
                if r.path.endswith("/log") and "follow=true" in r.query]

    assert len(wait_until(follows, 30, "the follow stream to end")) == 1  # one stream, five readers


def test_a_reader_that_reads_nothing_gets_a_dropped_count_and_bounded_memory(tmp_path: Path) -> None:
    with log_world(tmp_path, max_lines=100) as world:
        world.pod("train-worker-0", "train")
        view = _open(world)
        try:
            wait_until(view.caught_up.is_set, 30, "the catch-up to end")
            for i in range(1_000):
                world.log("train-worker-0", f"line {i}", BASE_TS + i * 0.001)

            def all_offered() -> bool:
                return view.take(0).dropped == 900

            wait_until(all_offered, 30, "900 of 1,000 lines counted as dropped")
            batch = view.take()
            assert [line.text for line in batch.lines] == [f"line {i}" for i in range(900, 1_000)]
            assert batch.dropped == 900
        finally:
            view.close()
        resumed = _open(world, cursor=batch.cursor)  # the cursor covers the dropped lines too: none come back
        try:
            wait_until(resumed.caught_up.is_set, 30, "the catch-up to end")
            assert resumed.take().lines == []
        finally:
            resumed.close()


class _CuttingProxy:
    """A TCP proxy in front of the emulator that, once armed, closes a followed log connection in the middle of
    the next line containing ``marker`` (the kubelet's stream broken mid-chunk)."""

    def __init__(self, upstream: str, marker: bytes) -> None:
        host, port = upstream.rsplit("//", 1)[1].split(":")
        self.upstream, self.marker, self.port = (host, int(port)), marker, free_port()
        self.armed, self.cut = threading.Event(), threading.Event()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        with suppress(OSError):
            while True:
                conn, _ = self._listener.accept()
                up = socket.create_connection(self.upstream)
                follow = threading.Event()
                threading.Thread(target=self._pump, args=(conn, up, follow, True), daemon=True).start()
                threading.Thread(target=self._pump, args=(up, conn, follow, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, follow: threading.Event, request: bool) -> None:
        with closing(src), closing(dst), suppress(OSError):
            while data := src.recv(65536):
                if request and b"follow=true" in data:
                    follow.set()
                at = data.find(self.marker) if not request and follow.is_set() and self.armed.is_set() else -1
                if at >= 0 and not self.cut.is_set():
                    self.cut.set()
                    dst.sendall(data[:at + 4])  # a few bytes of the line, then the connection ends
                    for sock in (src, dst):  # (a close alone leaves the other pump's recv holding it open)
                        sock.shutdown(socket.SHUT_RDWR)
                    return
                dst.sendall(data)


def test_a_body_cut_mid_line_resumes_with_that_line_whole_and_once(world: LogWorld, tmp_path: Path) -> None:
    proxy = _CuttingProxy(world.server.base_url, b"cut here")
    try:
        path = world.emulator.write_kubeconfig(CLUSTER, f"http://127.0.0.1:{proxy.port}", tmp_path / "proxied")
        world.services.kube.register_kubeconfig(CLUSTER, path)
        world.pod("train-worker-0", "train")
        world.log("train-worker-0", "before", BASE_TS + 0.1)
        view = _open(world)
        try:
            assert [line.text for line in _collect(view, 1)] == ["before"]
            wait_until(view.caught_up.is_set, 30, "the catch-up to end")
            proxy.armed.set()
            world.log("train-worker-0", "cut here, a line with more after the cut", BASE_TS + 0.2)  # same second
            wait_until(proxy.cut.is_set, 30, "the follow stream cut mid-line")
            world.log("train-worker-0", "after", BASE_TS + 0.3)
            got = _collect(view, 2)
            wait_until(lambda: len([r for r in world.emulator.requests_for(CLUSTER, "GET")
                                    if r.path.endswith("/log") and "follow=true" in r.query]) >= 2, 30,
                       "the follower to resume")
            got += view.take().lines
            assert [line.text for line in got] == ["cut here, a line with more after the cut", "after"]
        finally:
            view.close()
    finally:
        proxy.close()
