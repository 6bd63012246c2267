"""examples/training.ipynb runs headless, top to bottom, embeds the live chart pane (Panel/Bokeh outputs) and
sees the points logged after the chart was shown arrive in it."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbconvert.preprocessors import ExecutePreprocessor

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "examples" / "training.ipynb"
PANEL_MIMETYPES = {"application/vnd.holoviews_exec.v0+json", "application/vnd.holoviews_load.v0+json"}


@pytest.mark.slow
def test_training_notebook_executes_and_charts_new_points(mlflow_url: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert nb.metadata.kernelspec.name == "python3"
    assert all(not cell.get("outputs") for cell in nb.cells if cell.cell_type == "code"), "commit it clean"
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the kernel inherits it: take the notebook's sandbox path

    ExecutePreprocessor(timeout=180, kernel_name="python3").preprocess(nb, {"metadata": {"path": str(ROOT)}})

    outs = [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs]
    errors = [out for out in outs if out.output_type == "error"]
    assert not errors, "\n".join(f"{e.ename}: {e.evalue}" for e in errors)
    assert {mime for out in outs for mime in out.get("data", {})} >= PANEL_MIMETYPES
    charts = [out for out in outs if out.output_type == "execute_result"
              and out.data.get("text/plain", "").startswith("MetricsPane(")]
    assert len(charts) == 1 and "application/vnd.holoviews_exec.v0+json" in charts[0].data
    stdout = "".join(out.text for out in outs if out.output_type == "stream" and out.name == "stdout")
    assert "charted 50 points, last step 25" in stdout, stdout
