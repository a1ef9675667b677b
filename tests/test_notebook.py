"""The example notebook, executed top to bottom by a real Jupyter kernel (nbclient)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.spark_jvm import submit_args

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
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", submit_args())  # the kernel's JVM: spark_jvm.py
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


@pytest.mark.slow
@pytest.mark.spark
def test_topic_explorer_runs_again_on_a_kept_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue #30: run twice on the same kept root (``FILEPULSAR_NOTEBOOK_ROOT``), the notebook
    works both times (it failed at its first cell the second time, TopicAlreadyExists), each
    run on a topic of its own, and it shows the payloads as text. The Spark cells are left out
    of the runs here (the test above runs them)."""
    monkeypatch.setenv("FILEPULSAR_NOTEBOOK_ROOT", str(tmp_path / "root"))
    topics = []
    for _ in range(2):
        nb = nbformat.read(NOTEBOOK, as_version=4)
        spark_at = next(i for i, c in enumerate(nb.cells) if "local_spark" in c.source)
        nb.cells = nb.cells[:spark_at]
        client = nbclient.NotebookClient(
            nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
        )
        client.execute()
        outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
        assert not [o for o in outputs if o.get("output_type") == "error"]
        first = nb.cells[1]["outputs"][0]["data"]["text/plain"]
        topics.append(first)
        shown = "".join(o.get("data", {}).get("text/plain", "") for o in outputs)
        assert "click 0" in shown and "b'click" not in shown  # payloads shown as text
    assert topics[0] != topics[1]
    assert len(os.listdir(tmp_path / "root" / "topics" / "persistent" / "public" / "default")) >= 2
