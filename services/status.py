"""A compact summary of what the control plane is doing, for a terminal, an agent or a health view."""

from __future__ import annotations

from pydantic import Field

from services.clusters.models import ClusterSummary
from services.models import ReusedResponse
from services.operation_views import OperationView


class StatusSummary(ReusedResponse):
    version: str
    operations: dict[str, int] = Field(..., description="operation count per status")
    active: list[OperationView] = Field(..., description="pending, running and waiting operations")
    recent_failures: list[OperationView] = Field(..., description="the latest failed operations")
    clusters: list[str] = Field(default_factory=list, description="Kubernetes clusters this server knows")
    registered: list[ClusterSummary] = Field(
        default_factory=list, description="registered clusters with node health (from the caches)")


def render_text(summary: StatusSummary) -> str:
    """The summary as a few plain lines: no colour, no box drawing, stable for screen readers and agents."""
    counts = ", ".join(f"{k} {v}" for k, v in sorted(summary.operations.items())) or "none yet"
    lines = [f"instantstart {summary.version}", f"operations: {counts}"]
    if summary.active:
        lines.append("active:")
        for op in summary.active:
            stage = next((s for s in op.stages if s.status != "succeeded"), None)
            where = f" stage {stage.name} ({stage.message})" if stage else ""
            lines.append(f"  {op.id} {op.kind} {op.target} {op.status.value}{where}")
    if summary.recent_failures:
        lines.append("recent failures:")
        for op in summary.recent_failures:
            message = (op.error or {}).get("message", "")
            lines.append(f"  {op.id} {op.kind} {op.target}: {message}")
    if summary.registered:
        lines.append("clusters:")
        for c in summary.registered:
            health = ", ".join(f"{k} {v}" for k, v in sorted(c.health.items())) or "no nodes read yet"
            problem = f" [{c.error}]" if c.error else ""
            lines.append(f"  {c.name} ({c.ownership.value}) EKS {c.eks_status or '?'}, HyperPod "
                         f"{c.hyperpod_status or '-'}: {c.nodes} nodes: {health}{problem}")
    others = [name for name in summary.clusters if name not in {c.name for c in summary.registered}]
    if others or not summary.registered:
        label = "kubeconfigs (not imported)" if summary.registered or others else "clusters"
        none = "none registered (instantstart sandbox seed, then POST /api/v1/clusters/import)"
        lines.append(f"{label}: " + (", ".join(others) if others else none))
    return "\n".join(lines)
