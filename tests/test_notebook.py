"""The example notebook, executed top to bottom by a real Jupyter kernel (nbclient)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

nbclient = pytest.importorskip("nbclient", reason="the test extra installs nbclient")
nbformat = pytest.importorskip("nbformat", reason="the test extra installs nbformat")

NOTEBOOK = Path(__file__).resolve().parent.parent / "examples" / "topic_explorer.ipynb"


@pytest.mark.slow
@pytest.mark.spark
def test_topic_explorer_notebook_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every cell runs without error (the notebook asserts its own figures: the backlog
    samples, the row count of the Arrow table, the peeked messages, Spark's counts equal to
    pandas'), and the plots are drawn."""
    monkeypatch.setenv("FILEPULSAR_NOTEBOOK_ROOT", str(tmp_path / "root"))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert images, "the publish-rate and backlog plots"
    last = nb.cells[-2]["outputs"][0]["data"]["text/plain"]
    assert "/checkout" in last and "count" in last
    assert os.path.isdir(tmp_path / "root" / "topics")
