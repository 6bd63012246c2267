"""MCP tool definitions that fit agent clients' limits: per-tool ``$defs``, honest wording and hints,
toolsets by noun with a small default set, and capped results that say how to read on. Built from the
live server's OpenAPI document, as the bridge builds them."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from mcp_bridge.tools import DEFAULT_TOOLSETS, cap_result, select_toolsets, tool_specs
from tests.support import ROOT, LiveServer

DEFAULT_BUDGET_TOKENS = 8_000


@pytest.fixture(scope="module")
def document(server: LiveServer) -> dict[str, Any]:
    return dict(server.get("/api/v1/openapi.json").json())


def test_each_schema_carries_only_the_defs_it_reaches(document: dict[str, Any]) -> None:
    for spec in tool_specs(document, "admin"):
        defs = spec.input_schema.get("$defs", {})
        text = json.dumps({k: v for k, v in spec.input_schema.items() if k != "$defs"})
        reached = {name for name in defs if f"#/$defs/{name}" in text or any(
            f"#/$defs/{name}" in json.dumps(other) for key, other in defs.items() if key != name)}
        assert set(defs) == reached, (spec.name, sorted(set(defs) - reached))
    listing = next(s for s in tool_specs(document, "admin") if s.name == "operations_list")
    assert listing.definition_size() < 4_000, listing.definition_size()


def test_the_default_toolset_fits_the_budget_and_every_toolset_is_reported(document: dict[str, Any]) -> None:
    specs = tool_specs(document, "admin")
    sizes: dict[str, int] = {}
    for spec in specs:
        sizes[spec.toolset] = sizes.get(spec.toolset, 0) + spec.definition_size() // 4
    default = select_toolsets(specs, None)
    tokens = sum(s.definition_size() for s in default) // 4
    print(f"MCP toolsets (estimated tokens, characters / 4): default {tokens} in {len(default)} tools; "
          + ", ".join(f"{name} {size}" for name, size in sorted(sizes.items())))
    assert tokens < DEFAULT_BUDGET_TOKENS and len(default) <= 25
    assert {s.toolset for s in default} <= set(DEFAULT_TOOLSETS)
    assert not {"tokens", "audit", "sandbox"} & {s.toolset for s in default}
    assert select_toolsets(specs, "all") == specs
    assert {s.toolset for s in select_toolsets(specs, "audit,operations")} == {"audit", "operations"}
    with pytest.raises(ValueError, match="unknown toolset"):
        select_toolsets(specs, "operations,nope")


def test_only_routes_answering_an_operation_say_so(document: dict[str, Any]) -> None:
    specs = {s.name: s for s in tool_specs(document, "admin")}
    assert specs["backups_create"].answers_operation and "names the operation id" in specs["backups_create"].description
    assert specs["operations_retry"].answers_operation
    for name in ("sandbox_faults_inject", "sandbox_faults_clear"):
        if name in specs:  # the session server runs the sandbox when this machine has no AWS credentials
            assert not specs[name].answers_operation and "operation id" not in specs[name].description
            assert "Takes effect at once" in specs[name].description
    # openWorldHint: only the tools that reach AWS or Kubernetes (forgetting a registration touches neither;
    # the status summary reads every registered cluster)
    # every inference tool reads or writes the cluster's Kubernetes objects
    assert all(s.open_world for s in specs.values() if s.name.startswith("inference_"))
    assert sorted(s.name for s in specs.values() if s.open_world and not s.name.startswith("inference_")) == \
        ["clusters_create", "clusters_delete", "clusters_events_get", "clusters_events_list", "clusters_get",
         "clusters_import", "clusters_kubeconfig", "clusters_list", "clusters_options", "downloads_cancel",
         "downloads_get", "downloads_list", "downloads_start", "features_get", "features_update",
         "instance_groups_add", "instance_groups_delete",
         "instance_groups_get", "instance_groups_list",
         "instance_groups_update", "instance_groups_update_software", "jobs_clone", "jobs_delete", "jobs_digest",
         "jobs_digest_all", "jobs_get", "jobs_list", "jobs_logs", "jobs_preview", "jobs_resume", "jobs_submit",
         "jobs_suspend", "metrics_compare", "metrics_get", "mlflow_create", "mlflow_delete", "mlflow_get",
         "mlflow_presigned_url", "nodes_cordon", "nodes_delete", "nodes_drain", "nodes_get", "nodes_health_check",
         "nodes_list", "nodes_reboot", "nodes_replace", "nodes_uncordon", "status_get"]


def test_the_cluster_lifecycle_tools_say_what_they_do(document: dict[str, Any]) -> None:
    """Inspect, create (with its dry run: the plan), describe, delete and kubeconfig are tools with honest hints;
    create and delete name their status tool, delete is admin-only and destructive."""
    specs = {s.name: s for s in tool_specs(document, "admin")}
    for name in ("clusters_options", "clusters_get", "clusters_kubeconfig"):
        assert specs[name].read_only and not specs[name].destructive, name
    create, delete = specs["clusters_create"], specs["clusters_delete"]
    assert {"name", "zone", "instance_type", "count", "capacity_type"} <= set(create.body_params)
    assert set(create.input_schema["required"]) == {"name", "zone", "instance_type", "count"}
    assert create.query_params == ("dry_run",) and "dry_run=true" in create.description
    assert create.answers_operation and not create.read_only and not create.destructive
    assert "operations_wait" in create.description and "operations_get" in create.description
    assert "clusters_options" in create.description
    assert delete.answers_operation and delete.destructive and delete.role == "admin"
    assert delete.method == "DELETE" and delete.path_params == ("cluster",) and "confirm" in delete.body_params
    assert "operations_wait" in delete.description
    operator = {s.name for s in tool_specs(document, "operator")}
    assert "clusters_create" in operator and "clusters_delete" not in operator
    assert "clusters_kubeconfig" in {s.name for s in tool_specs(document, "viewer")}


def test_a_long_result_is_cut_with_a_hint_naming_the_paging_argument(document: dict[str, Any]) -> None:
    spec = next(s for s in tool_specs(document, "admin") if s.name == "operations_list")
    rows = [{"id": f"op-{i:016x}", "kind": "backup.create", "message": "x" * 200} for i in range(2_000)]
    text, structured = cap_result(spec, rows)
    assert len(text) <= 64_000
    assert structured["truncated"] and structured["total"] == 2_000 and 0 < structured["returned"] < 2_000
    assert structured["items"] == rows[: structured["returned"]]
    assert structured["continue"].startswith("pass before=<the last item's id>")
    small, same = cap_result(spec, rows[:3])
    assert same == rows[:3] and json.loads(small) == rows[:3]
    # not a list: cut text that still fits once escaped again (quotes double in JSON)
    quoted, note = cap_result(spec, {"detail": '"' * 200_000})
    assert len(quoted) <= 64_000 and note["truncated"] and note["characters"] > 64_000


def test_the_bridge_refuses_an_unknown_toolset(server: LiveServer) -> None:
    proc = subprocess.run([sys.executable, "-m", "app.cli", "mcp", "--url", server.url, "--token",
                           server.admin_token, "--toolsets", "operations,nope"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, input="")
    assert proc.returncode == 2 and "unknown toolset(s) ['nope']" in proc.stderr
