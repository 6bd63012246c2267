"""Regression tests for the emulator's robustness: persistence, finalization, watches, paging, no-op writes."""

from __future__ import annotations

import json
import os
import stat
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from sandbox.kube import Emulator
from sandbox.kube.cluster import WriteOptions
from sandbox.kube.components import COMPONENTS, load_component_crds
from sandbox.kube.errors import ApiError
from sandbox.kube.selectors import jsonpath_get, jsonpath_tokens
from tests.kube.conftest import KubeServer
from tests.support import wait_until


def _configmaps(emulator: Emulator, name: str) -> list[str]:
    cluster = emulator.cluster(name)
    return [o["metadata"]["name"] for _, o in cluster.store.items(("", "configmaps"))]


def test_a_cluster_deleted_and_recreated_before_a_flush_loses_its_old_objects(tmp_path: Path) -> None:
    emulator = Emulator(tmp_path, debounce=60)
    cluster = emulator.ensure_cluster("again")
    cluster.create(cluster.builtin("", "configmaps"), "default", {"metadata": {"name": "old"}}, WriteOptions())
    emulator.flush()
    emulator.delete_cluster("again")
    emulator.ensure_cluster("again")  # the deletion is still pending in the persister
    emulator.close()
    reopened = Emulator(tmp_path)
    try:
        assert "again" in reopened.clusters
        assert "old" not in _configmaps(reopened, "again")
    finally:
        reopened.close()


def test_updating_a_terminating_namespace_does_not_remove_it_while_it_has_content() -> None:
    from sandbox.kube import deletion

    cluster = Emulator().ensure_cluster("c")
    ns, cm = cluster.builtin("", "namespaces"), cluster.builtin("", "configmaps")
    cluster.create(ns, None, {"metadata": {"name": "team"}}, WriteOptions())
    cluster.create(cm, "team", {"metadata": {"name": "held", "finalizers": ["example.com/hold"]}}, WriteOptions())
    assert deletion.delete(cluster, ns, None, "team")[0]["status"]["phase"] == "Terminating"
    cluster.patch(ns, None, "team", "merge", {"metadata": {"labels": {"x": "y"}}}, WriteOptions(manager="kubectl"))
    assert cluster.get(ns, None, "team")["metadata"]["labels"] == {"x": "y"}
    # a Terminating object without finalizers is not removed by an unrelated update either
    cluster.patch(cm, "team", "held", "merge", {"metadata": {"labels": {"a": "b"}}}, WriteOptions())
    assert cluster.get(cm, "team", "held")["metadata"]["labels"] == {"a": "b"}
    # removing the last finalizer removes the object, and then the empty namespace goes too
    cluster.patch(cm, "team", "held", "merge", {"metadata": {"finalizers": None}}, WriteOptions())
    assert cluster.store.get(("", "configmaps"), ("team", "held")) is None
    assert cluster.store.get(("", "namespaces"), ("", "team")) is None


def test_reads_of_missing_objects_do_not_grow_the_store() -> None:
    cluster = Emulator().ensure_cluster("c")
    keys = len(cluster.store.objects)
    for i in range(50):
        assert cluster.store.get(("example.com", f"kind{i}"), ("default", "x")) is None
        assert cluster.store.items(("example.com", f"other{i}")) == []
    assert len(cluster.store.objects) == keys  # a read inserting keys races with iterations under the lock


def test_private_files_are_never_readable_by_others(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sandbox.kube.kubeconfig import write_kubeconfig
    from sandbox.tls import ensure_tls

    real_chmod = Path.chmod

    def chmod(self: Path, mode: int, **kwargs: Any) -> None:  # a later chmod means a moment of wide access
        assert stat.S_IMODE(self.stat().st_mode) & 0o077 == 0, f"{self} was created readable by others"
        real_chmod(self, mode, **kwargs)

    monkeypatch.setattr(Path, "chmod", chmod)
    old_umask = os.umask(0)
    try:
        existing = tmp_path / "kc.yaml"
        existing.write_text("old")
        real_chmod(existing, 0o644)
        for path in (write_kubeconfig(existing, "c", "http://127.0.0.1:1"),
                     write_kubeconfig(tmp_path / "new.yaml", "c", "http://127.0.0.1:1")):
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
        tls = ensure_tls(tmp_path / "tls")
        assert stat.S_IMODE(tls.key_path.stat().st_mode) == 0o600
    finally:
        os.umask(old_umask)


def _url(kube_server: KubeServer, cluster: str, query: str) -> str:
    return f"{kube_server.base_url}/k8s/clusters/{cluster}/api/v1/namespaces/default/configmaps?{query}"


def _events(response: Any) -> list[tuple[str, str]]:
    return [(e["type"], e["object"]["metadata"].get("name", "")) for e in map(json.loads, response.read().splitlines())]


def test_a_watch_from_a_resource_version_sees_objects_leave_its_selector(kube_server: KubeServer,
                                                                          cluster_name: str) -> None:
    cluster = kube_server.emulator.cluster(cluster_name)
    cm = cluster.builtin("", "configmaps")
    cluster.create(cm, "default", {"metadata": {"name": "x", "labels": {"app": "a"}}}, WriteOptions())
    cluster.create(cm, "default", {"metadata": {"name": "y", "labels": {"app": "b"}}}, WriteOptions())
    rv = cluster.list(cm, "default", label_selector="app=a").resource_version
    cluster.patch(cm, "default", "x", "merge", {"metadata": {"labels": {"app": "b"}}}, WriteOptions())
    cluster.patch(cm, "default", "y", "merge", {"metadata": {"labels": {"app": "a"}}}, WriteOptions())
    cluster.patch(cm, "default", "y", "merge", {"data": {"k": "v"}}, WriteOptions())
    with urllib.request.urlopen(_url(kube_server, cluster_name, f"watch=1&labelSelector=app%3Da&"
                                                               f"resourceVersion={rv}&timeoutSeconds=1")) as r:
        assert _events(r) == [("DELETED", "x"), ("ADDED", "y"), ("MODIFIED", "y")]


def test_a_bad_watch_timeout_is_a_bad_request(kube_server: KubeServer, cluster_name: str) -> None:
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(_url(kube_server, cluster_name, "watch=1&timeoutSeconds=soon"))
    assert info.value.code == 400
    assert json.loads(info.value.read())["reason"] == "BadRequest"


def test_a_watch_too_slow_to_keep_up_is_closed(kube_server: KubeServer, cluster_name: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from sandbox.kube import http

    monkeypatch.setattr(http, "WATCH_QUEUE_LIMIT", 5)
    cluster = kube_server.emulator.cluster(cluster_name)
    cm = cluster.builtin("", "configmaps")
    # The server's own timeout is far beyond the socket's: the read ends only if the overflow closes the watch.
    url = _url(kube_server, cluster_name, "watch=1&resourceVersion=0&timeoutSeconds=1800")
    with urllib.request.urlopen(url, timeout=60) as r:
        loop = kube_server.server._http._loop
        assert loop is not None
        blocked, release = threading.Event(), threading.Event()
        loop.call_soon_threadsafe(lambda: (blocked.set(), release.wait(30)))  # the watcher falls behind...
        assert blocked.wait(30)
        for i in range(40):  # ...while 40 events arrive
            cluster.create(cm, "default", {"metadata": {"name": f"burst-{i}"}}, WriteOptions())
        release.set()
        events = _events(r)
    assert len([e for e in events if e[1].startswith("burst-")]) < 40


def test_combinator_branches_do_not_close_objects() -> None:
    cluster = Emulator().ensure_cluster("c")
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": "widgets.example.com"},
           "spec": {"group": "example.com", "scope": "Namespaced", "names": {"plural": "widgets", "kind": "Widget"},
                    "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                        "type": "object", "properties": {"spec": {
                            "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
                            "anyOf": [{"properties": {"a": {"minimum": 1}}}]}}}}}]}}
    cluster.create(cluster.builtin("apiextensions.k8s.io", "customresourcedefinitions"), None, crd)
    rt = cluster.lookup("example.com", "v1", "widgets")
    body = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {"a": 2, "b": "x"}}
    cluster.create(rt, "default", body, WriteOptions(validation="Strict"))
    with pytest.raises(ApiError) as info:  # the branch still constrains what it names
        cluster.create(rt, "default", {**body, "metadata": {"name": "v"}, "spec": {"a": 0}},
                       WriteOptions(validation="Strict"))
    assert info.value.code == 422


def test_jsonpath_negative_indexes_and_slices() -> None:
    obj = {"status": {"conditions": [{"type": "Created"}, {"type": "Running"}, {"type": "Succeeded"}]}}
    assert jsonpath_get(obj, ".status.conditions[-1:].type") == ["Succeeded"]
    assert jsonpath_get(obj, "{.status.conditions[-1].type}") == ["Succeeded"]
    assert jsonpath_get(obj, ".status.conditions[0:2].type") == ["Created", "Running"]
    assert jsonpath_get(obj, ".status.conditions[-9].type") == []
    for component in COMPONENTS:  # every printer column of the bundled CRDs parses
        for crd in load_component_crds(component):
            for version in crd["spec"]["versions"]:
                for column in version.get("additionalPrinterColumns") or []:
                    jsonpath_tokens(column["jsonPath"])


def test_writes_that_change_nothing_keep_the_resource_version() -> None:
    cluster = Emulator().ensure_cluster("c")
    cm = cluster.builtin("", "configmaps")
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "same"}, "data": {"k": "v"}}
    created = cluster.patch(cm, "default", "same", "apply", body, WriteOptions(manager="kubectl")).obj
    rv = created["metadata"]["resourceVersion"]
    store_rv = cluster.store.rv
    assert cluster.patch(cm, "default", "same", "apply", body, WriteOptions(manager="kubectl")).obj[
        "metadata"]["resourceVersion"] == rv
    assert cluster.patch(cm, "default", "same", "merge", {}, WriteOptions(manager="kubectl")).obj[
        "metadata"]["resourceVersion"] == rv
    assert cluster.replace(cm, "default", "same", created).obj["metadata"]["resourceVersion"] == rv
    assert cluster.store.rv == store_rv  # nothing stored, no MODIFIED event
    changed = cluster.patch(cm, "default", "same", "merge", {"data": {"k": "w"}}, WriteOptions()).obj
    assert changed["metadata"]["resourceVersion"] != rv


def test_continued_pages_are_a_snapshot_at_the_first_page() -> None:
    cluster = Emulator().ensure_cluster("c")
    cm = cluster.builtin("", "configmaps")
    for name in ("a", "b", "d"):
        cluster.create(cm, "default", {"metadata": {"name": name}, "data": {"v": "0"}}, WriteOptions())
    first = cluster.list(cm, "default", limit=1)
    cluster.patch(cm, "default", "b", "merge", {"data": {"v": "1"}}, WriteOptions())  # not yet returned
    cluster.create(cm, "default", {"metadata": {"name": "c"}}, WriteOptions())  # created after the list began
    from sandbox.kube import deletion

    deletion.delete(cluster, cm, "default", "d")  # deleted after the list began
    second = cluster.list(cm, "default", limit=1, continue_token=first.continue_token)
    third = cluster.list(cm, "default", limit=1, continue_token=second.continue_token)
    assert first.resource_version == second.resource_version == third.resource_version
    assert [o["metadata"]["name"] for o in first.items + second.items + third.items] == ["a", "b", "d"]
    assert second.items[0]["data"] == {"v": "0"} and not third.continue_token


class _LetsAWriterIn:
    """Stands in for ``PodLogs``' lock: when the server's thread first releases it, a line is appended
    (from another thread, as workloads do) before the server can take it again, forcing the interleaving
    that used to lose the line between the initial read of ``logs -f`` and its subscription."""

    def __init__(self, logs: Any, key: tuple[str, str, str], line: str) -> None:
        self._real = threading.Lock()
        self._logs, self._key, self._line = logs, key, line
        self._armed = True

    def __enter__(self) -> None:
        self._real.acquire()

    def __exit__(self, *exc: object) -> None:
        self._real.release()
        if self._armed and threading.current_thread() is not threading.main_thread():
            self._armed = False
            writer = threading.Thread(target=self._logs.append, args=(self._key, self._line, time.time()))
            writer.start()
            writer.join()


def test_logs_follow_never_drops_a_line_written_between_the_read_and_the_subscription(
        kube_server: KubeServer, cluster_name: str) -> None:
    cluster = kube_server.emulator.cluster(cluster_name)
    cluster.create(cluster.builtin("", "pods"), "default", {"metadata": {"name": "p"}, "spec": {
        "containers": [{"name": "main", "image": "busybox"}]}}, WriteOptions())
    key = ("default", "p", "main")
    cluster.logs.append(key, "before", time.time())
    cluster.logs._lock = _LetsAWriterIn(cluster.logs, key, "racing")  # type: ignore[assignment]
    url = f"{kube_server.base_url}/k8s/clusters/{cluster_name}/api/v1/namespaces/default/pods/p/log?follow=true"
    with urllib.request.urlopen(url, timeout=60) as r:
        wait_until(lambda: cluster.logs._followers.get(key), 60, "the log follower's subscription")
        kube_server.emulator.end_log(cluster_name, "default", "p", "main")
        assert r.read().decode() == "before\nracing\n"


def _record(emulator: Emulator, i: int) -> None:
    emulator.record_request(cluster="c", method="GET", path=f"/api/v1/namespaces/default/pods/p{i}", query="",
                            status=200, user_agent="test", content_type="", duration_ms=1.0)


def test_recording_a_request_never_waits_for_the_disk(tmp_path: Path) -> None:
    log = tmp_path / "kube" / "requests.jsonl"
    log.parent.mkdir()
    os.mkfifo(log)  # a "disk" that takes one pipe buffer (64 KiB) and then blocks until read
    reader = os.open(log, os.O_RDONLY | os.O_NONBLOCK)
    emulator = Emulator(tmp_path)
    done = threading.Event()

    def record_many() -> None:
        for i in range(2000):  # about 400 KB
            _record(emulator, i)
        done.set()

    threading.Thread(target=record_many, daemon=True).start()
    try:
        assert done.wait(10), "record_request (on the event loop) blocked on a slow request log"
        assert len(emulator.requests_for("c")) == 2000
    finally:
        os.set_blocking(reader, True)
        drain = threading.Thread(target=lambda: [None for _ in iter(lambda: os.read(reader, 65536), b"")])
        drain.start()
        done.wait(10)
        emulator.close()
        drain.join(10)
        os.close(reader)


def test_the_request_log_rotates_keeping_one_previous_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sandbox.kube.requestlog.MAX_BYTES", 4000)
    emulator = Emulator(tmp_path)
    try:
        for i in range(200):
            _record(emulator, i)
        emulator.flush()
        log = tmp_path / "kube" / "requests.jsonl"
        previous = tmp_path / "kube" / "requests.jsonl.1"
        assert 0 < log.stat().st_size <= 4000 and 3000 < previous.stat().st_size <= 4000
        assert sorted(p.name for p in log.parent.glob("requests.jsonl*")) == ["requests.jsonl", "requests.jsonl.1"]
        on_disk = [json.loads(line)["path"] for f in (previous, log) for line in f.read_text().splitlines()]
        assert on_disk == [f"/api/v1/namespaces/default/pods/p{i}" for i in range(200 - len(on_disk), 200)]
        assert len(emulator.requests_for("c", "GET")) == 200  # the in-memory deque keeps answering
    finally:
        emulator.close()


def test_openapi_built_while_a_crd_registers_is_not_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    from sandbox.kube import emulator as emulator_module

    from .test_semantics import CRD

    emulator = Emulator()
    cluster = emulator.ensure_cluster("racy")
    real_docs = emulator_module.openapi_v3_docs
    raced = []

    def docs_while_a_crd_lands(types: Any) -> Any:
        docs = real_docs(types)
        if not raced:  # the CRD registers on another thread after the types were read, before the store
            raced.append(True)
            writer = threading.Thread(target=cluster.create, args=(
                cluster.builtin("apiextensions.k8s.io", "customresourcedefinitions"), None, CRD))
            writer.start()
            writer.join()
        return docs

    monkeypatch.setattr(emulator_module, "openapi_v3_docs", docs_while_a_crd_lands)
    assert "apis/example.com/v1" not in emulator.openapi(cluster)[0]  # built before the CRD: fine to answer once
    assert "apis/example.com/v1" in emulator.openapi(cluster)[0]  # but never kept
    first = emulator.openapi(cluster)
    assert emulator.openapi(cluster) is first  # an up-to-date document is cached
