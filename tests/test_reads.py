"""The read path's guarantees, unit by unit: the AWS cache never stores a value an invalidation
superseded and loads a key once however many ask; an informer that cannot list answers at once; a
sandbox kubeconfig never replaces how a registered cluster is reached."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from sandbox.kube import BackgroundServer, Emulator, kubeconfig_yaml
from services.aws import AwsClients
from services.awscache import AwsCache
from services.clock import Clock, FakeClock
from services.errors import NotFound
from services.events import EventBus
from services.informers import Informers
from services.kube import KubeClients
from tests.support import free_port, wait_until


def test_an_invalidation_during_a_load_is_not_undone() -> None:
    cache = AwsCache(FakeClock(), ttl=60)
    started, finish = threading.Event(), threading.Event()

    def slow_old() -> str:
        started.set()
        assert finish.wait(30)
        return "old"

    reader = threading.Thread(target=lambda: cache.get(("eks", "DescribeCluster", "r", "c"), slow_old))
    reader.start()
    assert started.wait(30)
    cache.invalidate("r", "c")  # the operation changed the cluster while the read was in flight
    finish.set()
    reader.join(30)
    value, _age = cache.get(("eks", "DescribeCluster", "r", "c"), lambda: "new")
    assert value == "new", "the pre-change value was not kept as fresh"


def test_concurrent_misses_of_one_key_make_one_call() -> None:
    cache = AwsCache(FakeClock(), ttl=60)
    gate = threading.Event()
    calls: list[int] = []

    def load() -> str:
        calls.append(1)
        assert gate.wait(30)
        return "v"

    readers = [threading.Thread(target=lambda: cache.get(("eks", "DescribeCluster", "r", "c"), load))
               for _ in range(10)]
    for t in readers:
        t.start()
    gate.set()
    for t in readers:
        t.join(30)
    assert len(calls) == 1 and cache.loads[("eks", "DescribeCluster")] == 1


def test_an_informer_that_cannot_list_answers_at_once(tmp_path: Path) -> None:
    kube = KubeClients(AwsClients("us-west-2"), Clock(), ca_dir=tmp_path / "ca")
    dead = tmp_path / "dead.yaml"  # nothing listens there
    dead.write_text(kubeconfig_yaml("dead", f"http://127.0.0.1:{free_port()}", "t"))
    kube.register_kubeconfig("dead", dead)
    informers = Informers(kube, EventBus())
    try:
        nodes = informers.get("dead", "nodes")
        # a generous timeout that the test's own limit (300 s) would never reach: it returns on the failure
        assert nodes.wait_synced(timeout=3_600) is False
        assert nodes.error and not nodes.synced.is_set()
        with pytest.raises(NotFound):
            informers.get("never-registered", "nodes")  # no informer for a cluster nobody knows
    finally:
        informers.stop()


def test_a_refresh_wakes_an_informer_pausing_after_a_failure(tmp_path: Path) -> None:
    """An informer that failed waits before trying again; a refresh (resync) lists at once instead."""
    emulator = Emulator()
    server = BackgroundServer(emulator).start()
    emulator.ensure_cluster("c")
    kube = KubeClients(AwsClients("us-west-2"), Clock(), ca_dir=tmp_path / "ca")
    dead = tmp_path / "dead.yaml"
    dead.write_text(kubeconfig_yaml("c", f"http://127.0.0.1:{free_port()}", "t"))
    kube.register_kubeconfig("c", dead)
    informers = Informers(kube, EventBus(), retry_seconds=(3_600.0,))  # an hour's pause after a failure
    try:
        nodes = informers.get("c", "nodes")
        assert nodes.wait_synced(timeout=300) is False and nodes.error  # failed: now pausing for an hour
        kube.register_kubeconfig("c", emulator.write_kubeconfig("c", server.base_url, tmp_path / "live.yaml"))
        assert nodes.resync(timeout=300) is True, "the refresh waited out the pause"
        assert nodes.synced.is_set() and nodes.error is None
    finally:
        informers.stop()
        server.stop()


def test_refused_access_and_unclassified_failures_are_fatal_for_waiters(tmp_path: Path) -> None:
    """A refused token (401) and an exception nothing classifies are not cured by waiting: ``fatal`` says so at
    once (a stage waiting on the informer fails with it); an unreachable server only sets ``error``."""
    emulator = Emulator(token="right")
    server = BackgroundServer(emulator).start()
    emulator.ensure_cluster("c")
    kube = KubeClients(AwsClients("us-west-2"), Clock(), ca_dir=tmp_path / "ca")
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(kubeconfig_yaml("c", server.base_url, "wrong"))
    kube.register_kubeconfig("c", wrong)
    broken = tmp_path / "broken.yaml"
    broken.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    kube.register_kubeconfig("broken", broken)
    dead = tmp_path / "dead.yaml"
    dead.write_text(kubeconfig_yaml("dead", f"http://127.0.0.1:{free_port()}", "t"))
    kube.register_kubeconfig("dead", dead)
    informers = Informers(kube, EventBus(), retry_seconds=(3_600.0,))
    try:
        refused = informers.get("c", "nodes")
        assert refused.wait_synced(timeout=300) is False
        assert refused.fatal is not None and refused.fatal.code == "unauthorized", refused.error
        unusable = informers.get("broken", "nodes")
        assert unusable.wait_synced(timeout=300) is False
        assert unusable.fatal is not None and unusable.fatal.code == "internal", unusable.error
        unreachable = informers.get("dead", "nodes")
        assert unreachable.wait_synced(timeout=300) is False
        assert unreachable.error and unreachable.fatal is None, "a network failure may heal: keep waiting"
    finally:
        informers.stop()
        server.stop()


def test_an_informer_resumes_and_lists_again_when_its_version_is_gone(tmp_path: Path) -> None:
    """Reconnecting after a dropped watch resumes from the last version; when the server has forgotten that
    version (410 Gone) the informer lists again and the cache holds what changed while it was away."""
    emulator = Emulator()
    port = free_port()
    server = BackgroundServer(emulator, port=port).start()
    cluster = emulator.ensure_cluster("c")
    node_type = cluster.builtin("", "nodes")
    cluster.create(node_type, None, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
    kube = KubeClients(AwsClients("us-west-2"), Clock(), ca_dir=tmp_path / "ca")
    kube.register_kubeconfig("c", emulator.write_kubeconfig("c", server.base_url, tmp_path / "c.yaml"))
    announced: list[str | None] = []  # the informer's error as each list is announced (on_list)
    informers = Informers(kube, EventBus(), retry_seconds=(0.05,),
                          on_list=lambda name, resource: announced.append(informers.get(name, resource).error))
    try:
        nodes = informers.get("c", "nodes")
        assert nodes.wait_synced(timeout=300) and [n["metadata"]["name"] for n in nodes.items()] == ["n1"]
        lists = nodes.lists
        cluster.create(node_type, None, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n2"}})
        wait_until(lambda: len(nodes.items()) == 2, 60, "the watch to bring n2")
        assert nodes.lists == lists, "a watch event, not a list"
        server.stop()  # the connection drops; while the informer is away the cluster moves on and forgets
        wait_until(lambda: nodes.error is not None, 60, "the informer to notice")
        cluster.create(node_type, None, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n3"}})
        cluster.store.compact()
        server = BackgroundServer(emulator, port=port).start()
        wait_until(lambda: nodes.lists == lists + 1, 60, "a relist after 410 Gone")
        assert sorted(n["metadata"]["name"] for n in nodes.items()) == ["n1", "n2", "n3"]
        assert nodes.error is None
        wait_until(lambda: len(announced) == 2, 60, "the relist announced")
        assert announced == [None, None], "a list is announced (and waiters woken) with the old failure cleared"
    finally:
        informers.stop()
        server.stop()
