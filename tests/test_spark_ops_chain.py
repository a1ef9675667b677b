"""Chained stateful operators hand their Arrow blocks on, rows never leaving Arrow between them.

``key_shared_assign(delay_until_due(dedup_by_sequence(df)))`` (the pipeline's shape) regroups
the blocks one operator returns for the next in Python, instead of turning them into rows and
back; the group names Python makes must be the JVM's, or state would be split across keys.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from filepulsar.connector.schema import SOURCE_SCHEMA
from filepulsar.dispatch.spark import dedup_by_sequence, delay_until_due, key_shared_assign
from filepulsar.dispatch.spark.blocks import GROUP_COLUMN, group_key, group_names, to_blocks
from tests.test_spark_ops_support import (
    flat,
    message,
    no_data_batches_off,
    run_available_now,
    source,
    write_messages,
)

pytestmark = pytest.mark.spark

AWKWARD = [
    "persistent://public/default/orders",
    'quote"d',
    "back\\slash",
    "\\u0041 not an escape",
    "tab\there",
    "new\nline",
    "cr\rbs\bff\f",
    "control\x01\x1f\x7f",
    "unicode é 東 \u2028 \U0001f600",
    "",
    None,
]


@pytest.mark.parametrize(
    "columns", [("topic", "partition", "producerName"), ("topic", "partition"), ()]
)
def test_python_group_names_are_the_jvms(spark: Any, columns: tuple[str, ...]) -> None:
    rows = [
        {"topic": t, "partition": p, "producerName": n}
        for t in AWKWARD
        for p, n in [(0, "p"), (-3, None), (2_147_483_647, 'x"\\\n')]
    ]
    table = pa.Table.from_pylist(
        rows,
        schema=pa.schema(
            [("topic", pa.string()), ("partition", pa.int32()), ("producerName", pa.string())]
        ),
    )
    df = spark.createDataFrame(table.to_pandas())
    jvm = [r[GROUP_COLUMN] for r in df.select(group_key(df, columns)).collect()]
    python = group_names(columns, table).cast(pa.string()).to_pylist()
    assert python == jvm


@pytest.mark.parametrize(
    ("columns", "named_on_the_jvm"),
    [(("topic", "partition", "producerName"), False), (("partition", "publishTime"), True)],
)
def test_rows_are_cut_into_blocks_under_the_jvms_group_names(
    spark: Any, tmp_path: Path, columns: tuple[str, ...], named_on_the_jvm: bool
) -> None:
    """String and integer group columns are named in Python, with no JSON made per row on
    the JVM; other types (a timestamp) still are named there. Either way a group's name is
    the JVM's, the state key an existing checkpoint holds."""
    names = [n for n in AWKWARD if n is not None]  # producerName is not nullable
    rows = [
        message(i, partition=i % 3, producerName=names[i % len(names)], publishTime=i % 2)
        for i in range(40)
    ]
    write_messages(tmp_path / "in", rows)
    df = spark.read.schema(SOURCE_SCHEMA).parquet(str(tmp_path / "in"))
    blocks = to_blocks(df, columns)
    plan = blocks._jdf.queryExecution().analyzed().toString()
    assert ("to_json" in plan) is named_on_the_jvm, plan
    got = {r[GROUP_COLUMN] for r in blocks.select(GROUP_COLUMN).collect()}
    want = {r[GROUP_COLUMN] for r in df.select(group_key(df, columns)).distinct().collect()}
    assert got == want and len(want) > 3


def _messages() -> list[dict[str, Any]]:
    """Two partitions, two producers each, replays (dropped), delays (held) and keys."""
    rows = []
    for partition in (0, 1):
        for i in range(60):
            producer = f"p{partition}-{i % 2}"
            sequence = i // 2 if i % 7 else max(i // 2 - 3, 0)  # every 7th a replay
            rows.append(
                message(
                    i,
                    partition=partition,
                    producerName=producer,
                    sequenceId=sequence,
                    key=f"k{i % 11}",
                    deliverAt=(4_000_000_000_000_000 if i % 13 == 0 else None),
                )
            )
    return rows


def test_chained_operators_keep_blocks_and_give_what_rows_give(spark: Any, tmp_path: Path) -> None:
    folder = tmp_path / "in"
    write_messages(folder, _messages()[:70])
    write_messages(folder, _messages()[70:])

    def pipeline(chained: bool) -> Any:
        def link(df: Any) -> Any:
            return df if chained else df.select("*")  # any other DataFrame breaks the chain

        df = source(spark, folder, files_per_batch=1)
        return key_shared_assign(
            link(delay_until_due(link(dedup_by_sequence(df)))), ["c1", "c2", "c3"]
        )

    got = {}
    plans = {}
    with no_data_batches_off(spark):
        for chained in (True, False):
            df = pipeline(chained)
            plans[chained] = df._jdf.queryExecution().analyzed().toString()
            rows = flat(run_available_now(df, tmp_path / f"chk-{chained}"))
            got[chained] = sorted(
                (r["partition"], r["producerName"], r["sequenceId"], r["entryId"], r["consumer"])
                for r in rows
            )
    # Rows to blocks once, blocks regrouped twice, blocks to rows once: 4 Python passes
    # instead of 6 (each link of the unchained plan turns blocks into rows and back).
    assert len(re.findall(r"MapInArrow", plans[True])) == 4, plans[True]
    assert len(re.findall(r"MapInArrow", plans[False])) == 6, plans[False]
    assert got[True] == got[False]
    kept = {(p, n, s) for p, n, s, _, _ in got[True]}
    assert len(kept) == len(got[True])  # no (producer, sequence id) twice
    assert got[True] and all(c in {"c1", "c2", "c3"} for *_, c in got[True])
