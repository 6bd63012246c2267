"""examples/dashboard.ipynb runs headless, top to bottom, and embeds the panes (Panel/Bokeh outputs)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbconvert.preprocessors import ExecutePreprocessor

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "examples" / "dashboard.ipynb"
PANEL_MIMETYPES = {"application/vnd.holoviews_exec.v0+json", "application/vnd.holoviews_load.v0+json"}


def outputs(nb: Any) -> list[tuple[int, Any]]:
    return [(i, out) for i, cell in enumerate(nb.cells) if cell.cell_type == "code" for out in cell.outputs]


@pytest.mark.slow
def test_dashboard_notebook_executes_and_embeds_the_panes() -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert nb.metadata.kernelspec.name == "python3"  # Lab opens it without a "Select Kernel" dialog
    assert all(not cell.get("outputs") for cell in nb.cells if cell.cell_type == "code"), "commit it clean"

    # the kernelspec's argv says "python": jupyter_client runs it as this interpreter (sys.executable)
    ExecutePreprocessor(timeout=120, kernel_name="python3").preprocess(nb, {"metadata": {"path": str(ROOT)}})

    outs = outputs(nb)
    errors = [out for _, out in outs if out.output_type == "error"]
    assert not errors, "\n".join(f"{e.ename}: {e.evalue}" for e in errors)
    stderr = "".join(out.text for _, out in outs if out.output_type == "stream" and out.name == "stderr")
    assert "Traceback" not in stderr, stderr

    mimetypes = {mime for _, out in outs for mime in out.get("data", {})}
    assert mimetypes >= PANEL_MIMETYPES, mimetypes

    stdout = "".join(out.text for _, out in outs if out.output_type == "stream" and out.name == "stdout")
    match = re.search(r"(op-[0-9a-f]{16}) succeeded", stdout)
    assert match, stdout
    op_id = match.group(1)

    # the three panes rendered as Panel roots, and the audit pane lists the backup it just watched
    panes = [(i, out) for i, out in outs if out.output_type == "execute_result"
             and "application/vnd.holoviews_exec.v0+json" in out.get("data", {})]
    reprs = [out.data.get("text/plain", "") for _, out in panes]
    assert any(r.startswith("OperationsPane(") for r in reprs) and any(r.startswith("AuditPane(") for r in reprs)
    assert any(r.startswith("ClustersPane(") for r in reprs), reprs
    audit_html = next(out.data["text/html"] for _, out in panes if out.data["text/plain"].startswith("AuditPane("))
    assert op_id in audit_html and "backup.create" in audit_html
    # no cluster is registered here: the clusters pane embeds its empty state, which says how to get one
    clusters_html = next(out.data["text/html"] for _, out in panes
                         if out.data["text/plain"].startswith("ClustersPane("))
    assert "clusters-table" in clusters_html and "No clusters yet: import one below" in clusters_html
