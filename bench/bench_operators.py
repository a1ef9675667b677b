"""Benchmark of the Spark dispatch operators (:mod:`filepulsar.dispatch.spark`).

Run with ``python -m bench.bench_operators`` (prints one JSON object per measurement) or through
``make bench``, which calls :func:`run`.

Input: 1M messages of ~100 B in 10 Parquet files with the filepulsar source schema, one topic
of 4 partitions, each file holding a run of one partition (as the filepulsar source hands Spark
one topic partition per input partition), 8 producers (two per partition, taking turns, each
with its own sequence ids, 5% of sends repeated as exact duplicates of a recent id), 10k
distinct keys, one property per message.
Every measurement is one ``Trigger.AvailableNow`` query from the Parquet folder to the ``noop``
sink with a fresh checkpoint, timed from ``start()`` to termination (query start included),
in one local[2] SparkSession with the RocksDB state store:

* ``source_noop`` -- the source alone, the ceiling for everything else;
* ``dropDuplicates`` on ``(producerName, sequenceId)`` and :func:`dedup_by_sequence` over the
  same messages, measured alternately, twice each; the ratio uses the best run of each;
* :func:`key_shared_assign` with 10 consumers (consistent hashing);
* :func:`delay_until_due` with 10% of messages delayed 1-2 hours (held in state);
* :func:`route_retry_dlq` with 10% of messages failed.

The machine's other load shows in absolute figures; the dedup ratio compares runs made minutes
apart in the same session.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

NUM_MESSAGES = 1_000_000
NUM_FILES = 10
NUM_PRODUCERS = 8
NUM_PARTITIONS = 4
NUM_KEYS = 10_000
DUPLICATE_FRACTION = 0.05
DELAYED_FRACTION = 0.10
FAILED_FRACTION = 0.10
NUM_CONSUMERS = 10
TOPIC = "persistent://public/default/bench-operators"
SEED = 20240607


def _messages(
    partition_index: int, start: int, count: int, now_ms: int, rng: np.random.Generator
) -> pa.Table:
    """``count`` rows of one topic partition from its message number ``start`` (vectorised).

    The partition's producers (``p`` with ``p % NUM_PARTITIONS == partition_index``) take turns.
    """
    from filepulsar.connector.schema import SOURCE_ARROW_SCHEMA

    per_partition = NUM_PRODUCERS // NUM_PARTITIONS
    idx = np.arange(start, start + count, dtype=np.int64)
    producer = partition_index + NUM_PARTITIONS * (idx % per_partition)
    sequence = idx // per_partition
    repeat = rng.random(count) < DUPLICATE_FRACTION
    sequence = np.where(repeat, np.maximum(sequence - rng.integers(1, 50, count), 0), sequence)
    partition = np.full(count, partition_index, dtype=np.int32)
    entry = idx
    delayed = rng.random(count) < DELAYED_FRACTION
    deliver_us = (now_ms + rng.integers(3_600_000, 7_200_000, count)) * 1000
    key_ids = rng.integers(0, NUM_KEYS, count)
    keys = np.char.add("key-", key_ids.astype(str))
    message_ids = np.char.add(
        np.char.add("1:", entry.astype(str)), np.char.add(":", partition.astype(str))
    )
    prop_type = SOURCE_ARROW_SCHEMA.field("properties").type
    props = pa.MapArray.from_arrays(
        pa.array(np.arange(count + 1, dtype=np.int32)),
        pa.array(np.full(count, "source"), pa.string()),
        pa.array(np.full(count, "bench"), pa.string()),
        type=prop_type,
    )
    columns = {
        "value": pa.array(np.full(count, b"x" * 100, dtype=object), pa.binary()),
        "key": pa.array(keys, pa.string()),
        "orderingKey": pa.nulls(count, pa.binary()),
        "topic": pa.array(np.full(count, TOPIC), pa.string()),
        "partition": pa.array(partition),
        "messageId": pa.array(message_ids, pa.string()),
        "ledgerId": pa.array(np.ones(count, dtype=np.int64)),
        "entryId": pa.array(entry),
        "batchIndex": pa.array(np.full(count, -1, dtype=np.int32)),
        "publishTime": pa.array((1_700_000_000_000 + idx) * 1000, pa.timestamp("us", tz="UTC")),
        "eventTime": pa.nulls(count, pa.timestamp("us", tz="UTC")),
        "properties": props,
        "producerName": pa.array(np.char.add("producer-", producer.astype(str)), pa.string()),
        "sequenceId": pa.array(sequence),
        "deliverAt": pa.array(
            np.where(delayed, deliver_us, 0), pa.timestamp("us", tz="UTC"), mask=~delayed
        ),
        "redeliveryCount": pa.array(np.zeros(count, dtype=np.int32)),
        "failed": pa.array(rng.random(count) < FAILED_FRACTION),
    }
    schema = pa.schema([*SOURCE_ARROW_SCHEMA, pa.field("failed", pa.bool_())])
    return pa.table([columns[f.name] for f in schema], schema=schema)


def write_input(folder: Path) -> None:
    """Write the benchmark's messages as :data:`NUM_FILES` Parquet files into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    now_ms = int(time.time() * 1000)
    per_file = NUM_MESSAGES // NUM_FILES
    for i in range(NUM_FILES):
        # As the filepulsar source hands Spark one topic partition per input partition.
        partition_index = i % NUM_PARTITIONS
        start = (i // NUM_PARTITIONS) * per_file
        table = _messages(partition_index, start, per_file, now_ms, rng)
        pq.write_table(table, folder / f"{i:03d}.parquet")


def _session() -> tuple[Any, bool]:
    """A local[2] session with the RocksDB state store; whether this call created it."""
    from pyspark.sql import SparkSession

    from filepulsar.dispatch.spark import NO_DATA_BATCHES_CONF
    from filepulsar.jobs.spark import local_spark

    created = SparkSession.getActiveSession() is None
    # delay_until_due under AvailableNow (see its Notes); no other query here needs them.
    return local_spark("filepulsar-bench-operators", **{NO_DATA_BATCHES_CONF: "false"}), created


def _timed_run(df: Any, scratch: Path) -> tuple[float, int]:
    """Seconds from start() to termination of an AvailableNow query into ``noop``; input rows."""
    checkpoint = Path(tempfile.mkdtemp(dir=scratch))
    start = time.perf_counter()
    query = (
        df.writeStream.format("noop")
        .trigger(availableNow=True)
        .option("checkpointLocation", str(checkpoint))
        .start()
    )
    query.awaitTermination()
    seconds = time.perf_counter() - start
    rows = sum(p["numInputRows"] for p in query.recentProgress)
    shutil.rmtree(checkpoint, ignore_errors=True)
    return seconds, rows


def _record(name: str, seconds: float, rows: int, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "value": round(NUM_MESSAGES / seconds / 1e6, 3),
        "unit": "M msg/s",
        "messages": NUM_MESSAGES,
        "input_rows": rows,
        "seconds": round(seconds, 2),
        **extra,
    }


def run() -> list[dict[str, Any]]:
    """Run every measurement and return one record per measurement."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BooleanType, StructField, StructType

    from filepulsar.connector.schema import SOURCE_SCHEMA
    from filepulsar.dispatch.spark import (
        dedup_by_sequence,
        delay_until_due,
        key_shared_assign,
        route_retry_dlq,
    )

    spark, created = _session()
    scratch = Path(tempfile.mkdtemp(prefix="bench-operators-"))
    try:
        data = scratch / "input"
        write_input(data)
        schema = StructType([*SOURCE_SCHEMA.fields, StructField("failed", BooleanType())])

        def source() -> Any:
            return spark.readStream.schema(schema).parquet(str(data))

        def dedup_source() -> Any:
            return source().drop("failed")

        records = []
        _timed_run(source(), scratch)  # warm-up: JVM, Python workers, file listing
        seconds, rows = _timed_run(source(), scratch)
        records.append(_record("spark_ops_source_noop", seconds, rows))

        candidates: dict[str, Callable[[], Any]] = {
            "dropDuplicates": lambda: dedup_source().dropDuplicates(["producerName", "sequenceId"]),
            "dedup_by_sequence": lambda: dedup_by_sequence(dedup_source()),
        }
        best: dict[str, tuple[float, int]] = {}
        for _ in range(2):
            for name, build in candidates.items():
                seconds, rows = _timed_run(build(), scratch)
                if name not in best or seconds < best[name][0]:
                    best[name] = (seconds, rows)
        records.append(_record("spark_dropDuplicates_producer_sequence", *best["dropDuplicates"]))
        ratio = best["dropDuplicates"][0] / best["dedup_by_sequence"][0]
        records.append(
            _record(
                "spark_ops_dedup_by_sequence",
                *best["dedup_by_sequence"],
                ratio_vs_dropDuplicates=round(ratio, 3),
                producers=NUM_PRODUCERS,
            )
        )
        records.append(
            {
                "name": "spark_ops_dedup_vs_dropDuplicates_ratio",
                "value": round(ratio, 3),
                "unit": "x",
                "goal": ">= 0.5",
            }
        )

        consumers = [f"consumer-{i}" for i in range(NUM_CONSUMERS)]
        seconds, rows = _timed_run(key_shared_assign(source(), consumers), scratch)
        records.append(
            _record("spark_ops_key_shared_assign", seconds, rows, consumers=NUM_CONSUMERS)
        )

        seconds, rows = _timed_run(delay_until_due(source()), scratch)
        records.append(
            _record(
                "spark_ops_delay_until_due_10pct_delayed",
                seconds,
                rows,
                delayed_fraction=DELAYED_FRACTION,
            )
        )

        retried = route_retry_dlq(
            source().withColumn("failed", F.col("failed")), subscription="bench", delay_ms=5000
        )
        seconds, rows = _timed_run(retried, scratch)
        records.append(
            _record(
                "spark_ops_route_retry_dlq_10pct_failed",
                seconds,
                rows,
                failed_fraction=FAILED_FRACTION,
            )
        )
        return records
    finally:
        if created:
            spark.stop()
        shutil.rmtree(scratch, ignore_errors=True)


def main() -> None:
    for record in run():
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
