"""API semantics of one emulated cluster, exercised in-process (no HTTP): the rules of cluster.py,
deletion.py, patch.py and apply.py."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox.kube import ApiError, Cluster, WriteOptions
from sandbox.kube.resources import ResourceType

CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.example.com"},
    "spec": {
        "group": "example.com",
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
        "versions": [{
            "name": "v1", "served": True, "storage": True,
            "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.replicas",
                                                     "statusReplicasPath": ".status.replicas"}},
            "additionalPrinterColumns": [{"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"}],
            "schema": {"openAPIV3Schema": {
                "type": "object",
                "properties": {
                    "spec": {"type": "object", "required": ["size"], "properties": {
                        "size": {"type": "string", "enum": ["S", "M", "L"]},
                        "replicas": {"type": "integer", "minimum": 0, "default": 1},
                        "port": {"x-kubernetes-int-or-string": True},
                        "note": {"type": "string", "nullable": True},
                        "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                    }},
                    "status": {"type": "object", "properties": {"replicas": {"type": "integer"},
                                                                "phase": {"type": "string"}}},
                },
            }},
        }],
    },
}


@pytest.fixture
def c() -> Cluster:
    cluster = Cluster("t")
    cluster.bootstrap()
    return cluster


def rt(c: Cluster, group: str, plural: str, version: str = "v1") -> ResourceType:
    return c.lookup(group, version, plural)


def cm(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}, "data": {"k": "v"}}


def test_create_sets_identity_and_increasing_resource_versions(c: Cluster) -> None:
    cms = rt(c, "", "configmaps")
    a = c.create(cms, "default", cm("a")).obj
    b = c.create(cms, "default", cm("b")).obj
    assert a["metadata"]["uid"] != b["metadata"]["uid"]
    assert int(b["metadata"]["resourceVersion"]) > int(a["metadata"]["resourceVersion"])
    assert a["metadata"]["creationTimestamp"].endswith("Z")
    assert a["apiVersion"] == "v1" and a["kind"] == "ConfigMap" and a["metadata"]["namespace"] == "default"
    with pytest.raises(ApiError) as exc:
        c.create(cms, "default", cm("a"))
    assert exc.value.code == 409 and exc.value.reason == "AlreadyExists"


def test_generate_name_and_missing_namespace(c: Cluster) -> None:
    cms = rt(c, "", "configmaps")
    obj = c.create(cms, "default", {"metadata": {"generateName": "job-"}}).obj
    assert obj["metadata"]["name"].startswith("job-") and len(obj["metadata"]["name"]) == 9
    with pytest.raises(ApiError) as exc:
        c.create(cms, "nope", cm("x"))
    assert exc.value.code == 404 and 'namespaces "nope" not found' in exc.value.message


def test_optimistic_concurrency_and_generation(c: Cluster) -> None:
    deps = rt(c, "apps", "deployments")
    body = {"metadata": {"name": "web"}, "spec": {"replicas": 1, "selector": {"matchLabels": {"a": "b"}},
            "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}}
    first = c.create(deps, "default", body).obj
    assert first["metadata"]["generation"] == 1
    stale = dict(first, metadata=dict(first["metadata"]))
    relabelled = c.patch(deps, "default", "web", "merge", {"metadata": {"labels": {"x": "y"}}}).obj
    assert relabelled["metadata"]["generation"] == 1  # metadata-only change
    scaled = c.patch(deps, "default", "web", "merge", {"spec": {"replicas": 3}}).obj
    assert scaled["metadata"]["generation"] == 2
    with pytest.raises(ApiError) as exc:
        c.replace(deps, "default", "web", stale)
    assert exc.value.code == 409 and exc.value.reason == "Conflict"


def test_status_subresource_isolation(c: Cluster) -> None:
    deps = rt(c, "apps", "deployments")
    c.create(deps, "default", {"metadata": {"name": "w"}, "spec": {"selector": {"matchLabels": {"a": "b"}},
             "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c"}]}}},
             "status": {"replicas": 9}})
    assert c.get(deps, "default", "w")["status"] == {}
    c.patch(deps, "default", "w", "merge", {"status": {"readyReplicas": 1}}, subresource="status")
    c.patch(deps, "default", "w", "merge", {"status": {"readyReplicas": 5}, "spec": {"replicas": 4}})
    obj = c.patch(deps, "default", "w", "merge", {"status": {"replicas": 2}, "spec": {"paused": True}},
                  subresource="status").obj
    assert obj["status"] == {"readyReplicas": 1, "replicas": 2}
    assert obj["spec"]["replicas"] == 4 and "paused" not in obj["spec"]


def test_scale_subresource(c: Cluster) -> None:
    deps = rt(c, "apps", "deployments")
    c.create(deps, "default", {"metadata": {"name": "w"}, "spec": {"replicas": 1, "selector": {
        "matchLabels": {"app": "w"}}, "template": {"metadata": {"labels": {"app": "w"}},
                                                   "spec": {"containers": [{"name": "c"}]}}}})
    scale = c.update_scale(deps, "default", "w", "merge", {"spec": {"replicas": 5}})
    assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == 5 and scale["status"]["selector"] == "app=w"
    assert c.get(deps, "default", "w")["spec"]["replicas"] == 5


def test_label_and_field_selectors_and_pagination(c: Cluster) -> None:
    cms = rt(c, "", "configmaps")
    for i in range(7):
        c.create(cms, "default", cm(f"c{i}", app="a" if i % 2 else "b", tier=str(i)))
    names = lambda **kw: [o["metadata"]["name"] for o in c.list(cms, "default", **kw).items]  # noqa: E731
    assert names(label_selector="app=a") == ["c1", "c3", "c5"]
    assert names(label_selector="app==a,tier!=3") == ["c1", "c5"]
    assert names(label_selector="tier in (1, 2)") == ["c1", "c2"]
    assert names(label_selector="tier notin (0,1,2,3,4)") == ["c5", "c6"]
    assert names(label_selector="!app") == []
    assert names(label_selector="app") == [f"c{i}" for i in range(7)]
    assert names(field_selector="metadata.name=c4") == ["c4"]
    assert names(field_selector="metadata.name!=c4,metadata.namespace=default") == ["c0", "c1", "c2", "c3", "c5",
                                                                                     "c6"]
    with pytest.raises(ApiError) as exc:
        c.list(cms, "default", label_selector="app in (a")
    assert exc.value.code == 400
    page = c.list(cms, "default", limit=3)
    seen = [o["metadata"]["name"] for o in page.items]
    while page.continue_token:
        page = c.list(cms, "default", limit=3, continue_token=page.continue_token)
        seen += [o["metadata"]["name"] for o in page.items]
    assert seen == [f"c{i}" for i in range(7)]


def test_strategic_merge_patch_merges_lists_by_key(c: Cluster) -> None:
    pods = rt(c, "", "pods")
    c.create(pods, "default", {"metadata": {"name": "p"}, "spec": {
        "containers": [{"name": "a", "image": "a:1", "env": [{"name": "X", "value": "1"}],
                        "ports": [{"containerPort": 80}], "volumeMounts": [{"name": "v", "mountPath": "/v"}]},
                       {"name": "b", "image": "b:1"}],
        "volumes": [{"name": "v", "emptyDir": {}}],
        "tolerations": [{"key": "gpu", "operator": "Exists"}]}})
    obj = c.patch(pods, "default", "p", "strategic", {"spec": {
        "containers": [{"name": "a", "image": "a:2", "env": [{"name": "Y", "value": "2"}],
                        "ports": [{"containerPort": 81}]}, {"name": "b", "$patch": "delete"}],
        "volumes": [{"name": "w", "emptyDir": {}}],
        "tolerations": [{"key": "spot", "operator": "Exists"}],
        "$setElementOrder/containers": [{"name": "a"}]}}).obj
    spec = obj["spec"]
    assert [x["name"] for x in spec["containers"]] == ["a"]
    a = spec["containers"][0]
    assert a["image"] == "a:2" and [e["name"] for e in a["env"]] == ["X", "Y"]
    assert [p["containerPort"] for p in a["ports"]] == [80, 81]
    assert a["volumeMounts"] == [{"name": "v", "mountPath": "/v"}]
    assert [v["name"] for v in spec["volumes"]] == ["v", "w"]
    assert [t["key"] for t in spec["tolerations"]] == ["spot"]  # no patch merge key: replaced whole


def test_json_patch_and_merge_patch(c: Cluster) -> None:
    cms = rt(c, "", "configmaps")
    c.create(cms, "default", {"metadata": {"name": "j"}, "data": {"a": "1", "b": "2"}})
    obj = c.patch(cms, "default", "j", "json", [{"op": "replace", "path": "/data/a", "value": "9"},
                                                {"op": "remove", "path": "/data/b"},
                                                {"op": "add", "path": "/metadata/labels", "value": {"l": "x"}}]).obj
    assert obj["data"] == {"a": "9"} and obj["metadata"]["labels"] == {"l": "x"}
    obj = c.patch(cms, "default", "j", "merge", {"data": {"a": None, "c": "3"}}).obj
    assert obj["data"] == {"c": "3"}
    with pytest.raises(ApiError) as exc:
        c.patch(cms, "default", "j", "json", [{"op": "remove", "path": "/data/zzz"}])
    assert exc.value.code == 422


def test_server_side_apply_creates_records_manager_and_prunes(c: Cluster) -> None:
    cms = rt(c, "", "configmaps")
    opts = WriteOptions(manager="ctl")
    res = c.patch(cms, "default", "s", "apply", {"apiVersion": "v1", "kind": "ConfigMap",
                                                 "metadata": {"name": "s"}, "data": {"a": "1", "b": "2"}}, opts)
    assert res.created
    mf = res.obj["metadata"]["managedFields"]
    assert mf[0]["manager"] == "ctl" and mf[0]["operation"] == "Apply"
    assert mf[0]["fieldsV1"] == {"f:data": {"f:a": {}, "f:b": {}}}
    res = c.patch(cms, "default", "s", "apply", {"apiVersion": "v1", "kind": "ConfigMap",
                                                 "metadata": {"name": "s"}, "data": {"a": "1"}}, opts)
    assert not res.created and res.obj["data"] == {"a": "1"}
    c.patch(cms, "default", "s", "apply", {"metadata": {"name": "s"}, "data": {"z": "0"}},
            WriteOptions(manager="other"))
    with pytest.raises(ApiError) as exc:
        c.patch(cms, "default", "s", "apply", {"metadata": {"name": "s"}, "data": {"z": "1"}}, opts)
    assert exc.value.code == 409
    forced = c.patch(cms, "default", "s", "apply", {"metadata": {"name": "s"}, "data": {"a": "1", "z": "1"}},
                     WriteOptions(manager="ctl", force=True)).obj
    assert forced["data"] == {"a": "1", "z": "1"}


def test_finalizers_block_deletion_until_removed(c: Cluster) -> None:
    cms = rt(c, "", "configmaps")
    c.create(cms, "default", {"metadata": {"name": "f", "finalizers": ["example.com/keep"]}})
    obj, gone = c_delete(c, cms, "f")
    assert not gone and obj["metadata"]["deletionTimestamp"]
    assert c.get(cms, "default", "f")["metadata"]["deletionTimestamp"]
    c.patch(cms, "default", "f", "merge", {"metadata": {"finalizers": None}})
    with pytest.raises(ApiError):
        c.get(cms, "default", "f")


def c_delete(c: Cluster, r: ResourceType, name: str, ns: str | None = "default",
             policy: str | None = None) -> tuple[dict[str, Any], bool]:
    from sandbox.kube import deletion

    return deletion.delete(c, r, ns, name, propagation=policy)


def _owned(c: Cluster, owner: dict[str, Any], name: str) -> None:
    ref = {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": owner["metadata"]["name"],
           "uid": owner["metadata"]["uid"], "blockOwnerDeletion": True}
    c.create(rt(c, "", "configmaps"), "default", {"metadata": {"name": name, "ownerReferences": [ref]}})


@pytest.mark.parametrize("policy", ["Background", "Foreground", "Orphan"])
def test_owner_reference_garbage_collection(c: Cluster, policy: str) -> None:
    cms = rt(c, "", "configmaps")
    owner = c.create(cms, "default", cm("owner")).obj
    _owned(c, owner, "child")
    child = c.get(cms, "default", "child")
    _owned(c, child, "grandchild")
    events: list[tuple[str, str]] = []
    c.store.subscribe(None, lambda e: events.append((e.type, e.obj["metadata"]["name"])))
    _, gone = c_delete(c, cms, "owner", policy=policy)
    assert gone
    left = {o["metadata"]["name"] for o in c.list(cms, "default").items}
    if policy == "Orphan":
        assert left == {"child", "grandchild"}
        assert "ownerReferences" not in c.get(cms, "default", "child")["metadata"]
    else:
        assert left == set()
    if policy == "Foreground":
        # The owner is marked first and removed last.
        assert events[0] == ("MODIFIED", "owner") and events[-1] == ("DELETED", "owner")


def test_namespace_deletion_cascades(c: Cluster) -> None:
    nss, cms = rt(c, "", "namespaces"), rt(c, "", "configmaps")
    c.create(nss, None, {"metadata": {"name": "team"}})
    c.create(cms, "team", cm("a"))
    c.create(cms, "team", {"metadata": {"name": "held", "finalizers": ["x/y"]}})
    obj, gone = c_delete(c, nss, "team", ns=None)
    assert not gone and obj["status"]["phase"] == "Terminating"
    with pytest.raises(ApiError) as exc:
        c.create(cms, "team", cm("late"))
    assert exc.value.code == 403
    assert [o["metadata"]["name"] for o in c.list(cms, "team").items] == ["held"]
    c.patch(cms, "team", "held", "merge", {"metadata": {"finalizers": []}})
    with pytest.raises(ApiError):
        c.get(nss, None, "team")
    with pytest.raises(ApiError) as exc:
        c_delete(c, nss, "default", ns=None)
    assert exc.value.code == 403


def test_crd_registration_validation_defaults_and_removal(c: Cluster) -> None:
    crds = rt(c, "apiextensions.k8s.io", "customresourcedefinitions")
    crd = c.create(crds, None, CRD).obj
    assert {x["type"] for x in crd["status"]["conditions"]} == {"Established", "NamesAccepted"}
    widgets = c.lookup("example.com", "v1", "widgets")
    assert widgets.short_names == ("wd",) and widgets.subresources == ("scale", "status")
    w = c.create(widgets, "default", {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"},
                                      "spec": {"size": "M", "port": "http", "note": None, "extra": {"any": 1}},
                                      "status": {"phase": "x"}}).obj
    assert w["spec"]["replicas"] == 1 and "status" not in w
    with pytest.raises(ApiError) as exc:
        c.create(widgets, "default", {"metadata": {"name": "bad"}, "spec": {"size": "XL", "replicas": -1,
                                                                             "typo": 1}},
                 WriteOptions(validation="Strict"))
    causes = {(x["field"], x["reason"]) for x in exc.value.details["causes"]}
    assert causes == {("spec.size", "FieldValueNotSupported"), ("spec.replicas", "FieldValueInvalid"),
                      ("spec.typo", "FieldValueInvalid")}
    assert exc.value.code == 422
    pruned = c.create(widgets, "default", {"metadata": {"name": "p"}, "spec": {"size": "S", "typo": 1}},
                      WriteOptions(validation="Warn"))
    assert "typo" not in pruned.obj["spec"] and pruned.warnings == ['unknown field "spec.typo"']
    assert c.get_scale(widgets, "default", "w")["spec"]["replicas"] == 1
    from sandbox.kube import deletion

    deletion.delete(c, crds, None, "widgets.example.com")
    with pytest.raises(ApiError):
        c.lookup("example.com", "v1", "widgets")
    c.create(crds, None, CRD)
    assert c.list(c.lookup("example.com", "v1", "widgets"), "default").items == []


def test_builtin_validation_reports_every_error(c: Cluster) -> None:
    deps = rt(c, "apps", "deployments")
    bad = {"metadata": {"name": "Bad_Name"}, "spec": {"replicas": "two", "template": {"spec": {
        "typoField": 1, "containers": [{"image": "x", "ports": [{"containerPort": "http"}]}]}}}}
    with pytest.raises(ApiError) as exc:
        c.create(deps, "default", bad, WriteOptions(validation="Strict"))
    fields = {x["field"] for x in exc.value.details["causes"]}
    assert fields == {"metadata.name", "spec.replicas", "spec.template.spec.containers[0].ports[0].containerPort",
                      "spec.template.spec.containers[0].name", "spec.template.spec.typoField", "spec.selector"}
    assert exc.value.status()["reason"] == "Invalid"


def test_watch_history_compaction(c: Cluster) -> None:
    cms = rt(c, "", "configmaps")
    c.create(cms, "default", cm("a"))
    rv = c.store.rv
    c.create(cms, "default", cm("b"))
    got: list[Any] = []
    backlog = c.store.subscribe(rv, got.append)
    assert backlog is not None and [e.obj["metadata"]["name"] for e in backlog] == ["b"]
    c.store.compact()
    assert c.store.subscribe(rv, got.append) is None
