"""Helpers for the filepulsar.dispatch.spark tests (no tests here).

Streaming inputs are Parquet files with the filepulsar source schema in a folder, read with
``spark.readStream.schema(SOURCE_SCHEMA).parquet(folder)``; a run is ``Trigger.AvailableNow``
into ``foreachBatch`` and a restart is a new query on the same checkpoint after more files were
added.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from filepulsar.connector.schema import SOURCE_ARROW_SCHEMA, SOURCE_SCHEMA

pytestmark = pytest.mark.spark

TOPIC = "persistent://public/default/orders"
_file_numbers = itertools.count()


def message(i: int, **fields: Any) -> dict[str, Any]:
    """A source row for message ``i`` of partition 0: entry ``i`` of ledger 1, sequence id ``i``."""
    partition = fields.get("partition", 0)
    ledger = fields.get("ledgerId", 1)
    entry = fields.get("entryId", i)
    row: dict[str, Any] = {
        "value": f"payload-{i}".encode(),
        "key": None,
        "orderingKey": None,
        "topic": TOPIC,
        "partition": partition,
        "messageId": f"{ledger}:{entry}:{partition}",
        "ledgerId": ledger,
        "entryId": entry,
        "batchIndex": -1,
        "publishTime": 1_700_000_000_000_000 + i * 1000,
        "eventTime": None,
        "properties": [],
        "producerName": "producer-a",
        "sequenceId": i,
        "deliverAt": None,
        "redeliveryCount": 0,
    }
    row.update(fields)
    if isinstance(row["properties"], Mapping):
        row["properties"] = list(row["properties"].items())
    return row


def write_messages(folder: Path, rows: list[dict[str, Any]]) -> Path:
    """Write ``rows`` (see :func:`message`; times in epoch µs) as one new Parquet file."""
    folder.mkdir(parents=True, exist_ok=True)
    columns = {f.name: [r[f.name] for r in rows] for f in SOURCE_ARROW_SCHEMA}
    table = pa.table(
        [pa.array(columns[f.name], f.type) for f in SOURCE_ARROW_SCHEMA],
        schema=SOURCE_ARROW_SCHEMA,
    )
    path = folder / f"part-{next(_file_numbers):05d}.parquet"
    pq.write_table(table, path)
    # Spark's file source takes files in the order of their modification times, in ms: two
    # files written within one tick of the kernel's clock tie, and were taken in either
    # order. Each file is stamped at least 10 ms after the folder's newest one before it.
    before = [f.stat().st_mtime_ns for f in folder.glob("*.parquet") if f != path]
    newest = max(before, default=0)
    stamp = max(path.stat().st_mtime_ns, newest + 10_000_000)
    os.utime(path, ns=(stamp, stamp))
    return path


def source(spark: Any, folder: Path, *, files_per_batch: int | None = None) -> Any:
    """The streaming DataFrame over ``folder``."""
    reader = spark.readStream.schema(SOURCE_SCHEMA)
    if files_per_batch:
        reader = reader.option("maxFilesPerTrigger", files_per_batch)
    return reader.parquet(str(folder))


@contextlib.contextmanager
def no_data_batches_off(spark: Any) -> Iterator[None]:
    """Turn off no-data micro-batches while a query starts (an AvailableNow run of
    delay_until_due then ends by itself, with no empty batch at its end)."""
    from filepulsar.dispatch.spark import NO_DATA_BATCHES_CONF

    previous = spark.conf.get(NO_DATA_BATCHES_CONF, "true")
    spark.conf.set(NO_DATA_BATCHES_CONF, "false")
    try:
        yield
    finally:
        spark.conf.set(NO_DATA_BATCHES_CONF, previous)


def run_available_now(df: Any, checkpoint: Path) -> list[list[Any]]:
    """Run ``df`` with Trigger.AvailableNow to the end; return each micro-batch's rows."""
    batches: list[list[Any]] = []

    def collect(batch_df: Any, batch_id: int) -> None:
        batches.append(batch_df.collect())

    query = (
        df.writeStream.foreachBatch(collect)
        .trigger(availableNow=True)
        .option("checkpointLocation", str(checkpoint))
        .start()
    )
    query.awaitTermination()
    return batches


def flat(batches: list[list[Any]]) -> list[Any]:
    """All rows of all batches."""
    return [row for batch in batches for row in batch]


def relocated(golden: Path, to: Path) -> Path:
    """A copy of a query's folder (``checkpoint/``, ``input/``) written elsewhere: Spark's
    file source log and state metadata name files by absolute path, so the copy names the
    copy's (and drops those files' checksums)."""
    shutil.copytree(golden, to)
    metadata = to / "checkpoint" / "state" / "0" / "_metadata" / "v2" / "0"
    text = metadata.read_text()
    written_at = text.split('"stateSchemaFilePaths":["file:')[1].split("/checkpoint/state/0/")[0]
    for path in [metadata, *(to / "checkpoint" / "sources" / "0").iterdir()]:
        if not path.name.startswith("."):
            path.write_text(path.read_text().replace(written_at, str(to)))
            (path.parent / f".{path.name}.crc").unlink()
    return to
