"""Discovery documents, ``/version`` and OpenAPI, built from a cluster's resource types.

``kubectl`` and ``DynamicClient`` find resources through the legacy discovery documents
(``APIVersions``, ``APIGroupList``, ``APIResourceList``); kubectl asks for the aggregated v2 format first
but accepts the legacy one. For ``kubectl create/apply`` with default (strict) validation, kubectl only
needs to learn from ``/openapi/v3`` that the server supports the ``fieldValidation`` parameter for the
kind (cli-runtime's ``queryParamVerifierV3``): one ``patch`` operation per kind with
``x-kubernetes-group-version-kind`` is enough, the server then validates. Documents are rebuilt only
when a CRD changes the set of types.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import defaultdict
from typing import Any

from .resources import VERBS, ResourceType

SERVER_MAJOR = "1"
SERVER_MINOR = "31"  # the gcloud kubectl dispatcher picks kubectl 1.31, which sends JSON for generators
GIT_VERSION = "v1.31.0"


def version_info() -> dict[str, str]:
    return {
        "major": SERVER_MAJOR,
        "minor": SERVER_MINOR,
        "gitVersion": GIT_VERSION,
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2024-08-13T07:28:49Z",
        "goVersion": "go1.22.5",
        "compiler": "gc",
        "platform": "linux/amd64",
    }


def _version_priority(version: str) -> tuple[int, int, int, str]:
    """Kubernetes version ordering: GA > beta > alpha, higher numbers first, others last."""
    m = re.fullmatch(r"v(\d+)(?:(alpha|beta)(\d+))?", version)
    if not m:
        return (3, 0, 0, version)
    stability = {None: 0, "beta": 1, "alpha": 2}[m[2]]
    return (stability, -int(m[1]), -int(m[3] or 0), version)


def group_versions(types: list[ResourceType]) -> dict[str, list[str]]:
    versions: dict[str, set[str]] = defaultdict(set)
    for rt in types:
        versions[rt.group].add(rt.version)
    return {g: sorted(v, key=_version_priority) for g, v in versions.items()}


def api_versions() -> dict[str, Any]:
    return {"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}


def api_group_list(types: list[ResourceType]) -> dict[str, Any]:
    groups = []
    for group, versions in sorted(group_versions(types).items()):
        if not group:
            continue
        entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        groups.append({"name": group, "versions": entries, "preferredVersion": entries[0]})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def api_group(types: list[ResourceType], group: str) -> dict[str, Any] | None:
    versions = group_versions(types).get(group)
    if not versions:
        return None
    entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": entries,
            "preferredVersion": entries[0]}


def api_resource_list(types: list[ResourceType], group: str, version: str) -> dict[str, Any] | None:
    selected = sorted((rt for rt in types if rt.group == group and rt.version == version), key=lambda r: r.plural)
    if not selected:
        return None
    resources: list[dict[str, Any]] = []
    for rt in selected:
        entry: dict[str, Any] = {"name": rt.plural, "singularName": rt.singular, "namespaced": rt.namespaced,
                                 "kind": rt.kind, "verbs": list(VERBS)}
        if rt.short_names:
            entry["shortNames"] = list(rt.short_names)
        if rt.categories:
            entry["categories"] = list(rt.categories)
        resources.append(entry)
        for sub in rt.subresources:
            sub_entry: dict[str, Any] = {"name": f"{rt.plural}/{sub}", "singularName": "",
                                         "namespaced": rt.namespaced, "kind": rt.kind,
                                         "verbs": ["get", "patch", "update"]}
            if sub == "scale":
                sub_entry.update(group="autoscaling", version="v1", kind="Scale")
            elif sub == "log":
                sub_entry["verbs"] = ["get"]
            elif sub == "proxy":
                sub_entry.update(kind=f"{rt.kind}ProxyOptions", verbs=["create", "delete", "get", "patch", "update"])
            elif sub == "eviction":
                sub_entry.update(group="policy", version="v1", kind="Eviction", verbs=["create"])
            resources.append(sub_entry)
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": selected[0].api_version,
            "resources": resources}


def _gv_path(group: str, version: str) -> str:
    return f"api/{version}" if not group else f"apis/{group}/{version}"


def openapi_v3_docs(types: list[ResourceType]) -> dict[str, dict[str, Any]]:
    """Per group-version OpenAPI v3 documents, keyed like the index (``api/v1``, ``apis/apps/v1``)."""
    docs: dict[str, dict[str, Any]] = {}
    for rt in sorted(types, key=lambda r: (r.group, r.version, r.plural)):
        gv = _gv_path(rt.group, rt.version)
        doc = docs.setdefault(gv, {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": GIT_VERSION},
                                   "paths": {}, "components": {"schemas": {}}})
        scope = "/namespaces/{namespace}" if rt.namespaced else ""
        gvk = {"group": rt.group, "version": rt.version, "kind": rt.kind}
        params = [{"name": n, "in": "query", "schema": {"type": "string"}, "uniqueItems": True}
                  for n in ("dryRun", "fieldManager", "fieldValidation", "force")]
        op = {"operationId": f"patch{rt.kind}", "x-kubernetes-action": "patch",
              "x-kubernetes-group-version-kind": gvk, "parameters": params,
              "responses": {"200": {"description": "OK"}}}
        post = {**op, "operationId": f"create{rt.kind}", "x-kubernetes-action": "post"}
        doc["paths"][f"/{gv}{scope}/{rt.plural}/{{name}}"] = {"patch": op}
        doc["paths"][f"/{gv}{scope}/{rt.plural}"] = {"post": post}
        schema_name = f"{rt.group or 'core'}.{rt.version}.{rt.kind}"
        doc["components"]["schemas"][schema_name] = {"type": "object", "x-kubernetes-group-version-kind": [gvk]}
    return docs


def openapi_v3_index(docs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    paths = {}
    for gv, doc in docs.items():
        digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32].upper()
        paths[gv] = {"serverRelativeURL": f"/openapi/v3/{gv}?hash={digest}"}
    return {"paths": paths}
