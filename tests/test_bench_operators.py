"""``bench.bench_operators``: a case's own session settings apply to its query only."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bench import bench_operators

pytestmark = pytest.mark.spark

KEY = "spark.sql.execution.arrow.maxBytesPerBatch"


def _note_batch_rows(path: str, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A pass-through that appends the rows of every Arrow batch it gets to ``path``."""
    for batch in batches:
        with open(path, "a") as f:
            f.write(f"{batch.num_rows}\n")
        yield batch


def test_a_case_conf_holds_for_its_query_only(spark: Any, tmp_path: Path) -> None:
    """``dedup_by_sequence_unsized_arrow`` runs its query with :data:`UNSIZED_ARROW_BATCHES`
    (the trade it measures), the cases after it with the session's own settings: with a 1 kB
    bound, 2 kB rows reach Python one per batch; unsized, the ten rows come in one batch."""
    assert bench_operators.CASE_CONF["dedup_by_sequence_unsized_arrow"] == {KEY: "2147483647"}
    data = tmp_path / "in"
    data.mkdir()
    pq.write_table(pa.table({"v": [b"x" * 2000] * 10}), data / "0.parquet")
    notes = tmp_path / "batches.txt"

    def run(conf: dict[str, str] | None) -> list[int]:
        notes.unlink(missing_ok=True)
        note = functools.partial(_note_batch_rows, str(notes))
        df = spark.readStream.schema("v binary").parquet(str(data)).mapInArrow(note, "v binary")
        assert bench_operators._noop_run(df, tmp_path, conf).rows == 10
        return [int(n) for n in notes.read_text().split()]

    spark.conf.set(KEY, "1k")
    try:
        assert run(None) == [1] * 10
        assert run(bench_operators.UNSIZED_ARROW_BATCHES) == [10]
        assert spark.conf.get(KEY) == "1k"
        assert run(None) == [1] * 10
    finally:
        spark.conf.unset(KEY)
