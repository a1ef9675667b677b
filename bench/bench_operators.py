"""Benchmark of the Spark dispatch operators (:mod:`filepulsar.dispatch.spark`) against Spark's
built-ins, and of the demo's pipeline end to end.

Run with ``python -m bench.bench_operators [operators] [pipeline]`` (one JSON object per
figure) or through ``make bench``, which calls :func:`run`. ``BENCH_OPERATORS_MESSAGES``,
``BENCH_OPERATORS_ORDERS``, ``BENCH_OPERATORS_ROUNDS`` and ``BENCH_OPERATORS_CASES`` (names,
comma separated) shrink it for profiling.

Operators. Input: 1M messages of ~100 B in 20 Parquet files with the filepulsar source schema,
one topic of 4 partitions, each file a run of one partition (as the filepulsar source hands
Spark one topic partition per input partition), 8 producers (two per partition, taking turns,
each with its own sequence ids, 5% of sends repeated as exact duplicates of a recent id), 10k
distinct keys, one property per message. Each case is one ``Trigger.AvailableNow`` query into
the ``noop`` sink with a fresh checkpoint, two files (100k messages) per micro-batch, in one
local[2] session (2 shuffle partitions, RocksDB state store). Figures come from Spark's own
progress reports: the first micro-batch's time (start-up: planning, state stores, Python
workers) apart from the steady rate, the messages of the later batches over their
``triggerExecution`` time. Every case first runs once over 10 files, unmeasured but for its
first batch (``first_batch_cold_s``): a JVM compiles a case's code paths and PySpark starts its
Python workers over its first few batches, which is start-up, not steady state. Then every
case runs once per round, rounds interleaved (every second round in the reverse order), so the
host's other load falls on all alike; a ratio is taken within a round, and the median over the
5 rounds is reported (with each round's).

* ``source_noop`` and ``mapInArrow_pass_through``: the ceilings (no Python; one Python pass);
* ``dedup_by_sequence`` against ``dropDuplicatesWithinWatermark`` (10-minute watermark on
  ``publishTime``) and ``dropDuplicates``, all on ``(producerName, sequenceId)``;
  ``dedup_by_sequence_unsized_arrow`` is it with :data:`UNSIZED_ARROW_BATCHES` for its query
  (a trade a user may choose, not the default);
* ``key_shared_assign`` (10 consumers, consistent hashing) against a stateless
  ``hash(key) % n`` column (the nearest built-in; it keeps no selector) and the pass-through;
* ``delay_until_due`` with 10% of messages delayed 1-2 hours (held in state) against the
  pass-through;
* ``route_retry_dlq`` with 10% failed (plain Spark SQL);
* the first-batch overhead of each stateful operator: its first batch minus the source's, in
  the measured rounds and (``cold``) in its first run in the JVM.

Pipeline. The demo's order stream (1M orders, 2% replayed, 1% delayed an hour, 0.2% invalid)
published to a 4-partition topic with the client, then ``jobs/orders_pipeline`` as users run it
(its default ``maxMessagesPerTrigger``, one durable subscription, filepulsar sink), interleaved
with a bare copy of the topic through the same source and sink: first batch and steady
orders/s of each, and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

NUM_MESSAGES = int(os.environ.get("BENCH_OPERATORS_MESSAGES", 1_000_000))
NUM_FILES = 20
FILES_PER_BATCH = 2
ROUNDS = int(os.environ.get("BENCH_OPERATORS_ROUNDS", 5))  # operator cases: a median of 5
PIPELINE_ROUNDS = int(os.environ.get("BENCH_OPERATORS_ROUNDS", 2))
# 1M: four micro-batches of the pipeline's 250k after the first, which is start-up.
PIPELINE_ORDERS = int(os.environ.get("BENCH_OPERATORS_ORDERS", 1_000_000))
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
    """A local[2] session (RocksDB state store, 2 shuffle partitions, checkpoint files written
    through Spark's ``FileSystem`` manager as the jobs' local sessions do: every case alike);
    whether this call created it."""
    from pyspark.sql import SparkSession

    from filepulsar.dispatch.spark import NO_DATA_BATCHES_CONF
    from filepulsar.jobs.spark import local_spark

    created = SparkSession.getActiveSession() is None
    # Every run here is AvailableNow: no query should run empty batches at its end.
    return local_spark("filepulsar-bench-operators", **{NO_DATA_BATCHES_CONF: "false"}), created


@dataclass
class Run:
    """One AvailableNow query, from Spark's own progress reports."""

    first_s: float  # the first micro-batch (query start-up, state stores, Python workers)
    steady_rows: int  # messages of the batches after the first
    steady_s: float  # their triggerExecution time
    rows: int
    batches: int
    wall_s: float  # start() to termination

    @property
    def steady_rate(self) -> float:
        return self.steady_rows / self.steady_s if self.steady_s > 0 else 0.0


def _batch_rows(progress: Any) -> int:
    """A batch's messages: the most any one source scan read (a plan that scans a source twice
    reports both scans)."""
    return max((int(s["numInputRows"]) for s in progress["sources"]), default=0)


def measure(query: Any, started: float) -> Run:
    """Wait for an AvailableNow ``query`` and read its progress."""
    query.awaitTermination()
    wall = time.perf_counter() - started
    progress = [p for p in query.recentProgress if _batch_rows(p) or p["batchId"] == 0]
    if not progress:
        return Run(wall, 0, 0.0, 0, 0, wall)
    first = progress[0]["durationMs"]["triggerExecution"] / 1000
    later = progress[1:]
    return Run(
        first_s=first,
        steady_rows=sum(_batch_rows(p) for p in later),
        steady_s=sum(p["durationMs"]["triggerExecution"] for p in later) / 1000,
        rows=sum(_batch_rows(p) for p in progress),
        batches=len(progress),
        wall_s=wall,
    )


def _noop_run(df: Any, scratch: Path, conf: dict[str, str] | None = None) -> Run:
    """``df`` into the ``noop`` sink, AvailableNow; ``conf``: session settings for this query
    only (a streaming query takes the session's settings when it starts)."""
    checkpoint = Path(tempfile.mkdtemp(dir=scratch))
    spark = df.sparkSession
    before = {k: spark.conf.get(k, None) for k in conf or {}}
    for k, v in (conf or {}).items():
        spark.conf.set(k, v)
    started = time.perf_counter()
    try:
        query = (
            df.writeStream.format("noop")
            .trigger(availableNow=True)
            .option("checkpointLocation", str(checkpoint))
            .start()
        )
        return measure(query, started)
    finally:
        for k, v in before.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)
        shutil.rmtree(checkpoint, ignore_errors=True)


def _pass_through(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The ceiling of any Python operator: every Arrow batch to a Python worker and back."""
    yield from batches


def _cases(spark: Any, data: Path) -> dict[str, Callable[[], Any]]:
    """What is measured, by name: each builds a fresh streaming DataFrame over ``data``."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BooleanType, StructField, StructType

    from filepulsar.connector.schema import SOURCE_SCHEMA
    from filepulsar.dispatch.spark import (
        dedup_by_sequence,
        delay_until_due,
        key_shared_assign,
        route_retry_dlq,
    )

    schema = StructType([*SOURCE_SCHEMA.fields, StructField("failed", BooleanType())])
    consumers = [f"consumer-{i}" for i in range(NUM_CONSUMERS)]

    def source() -> Any:
        return (
            spark.readStream.schema(schema)
            .option("maxFilesPerTrigger", FILES_PER_BATCH)
            .parquet(str(data))
        )

    def messages() -> Any:
        return source().drop("failed")

    by_hash = F.element_at(
        F.array(*[F.lit(c) for c in consumers]), F.pmod(F.hash("key"), F.lit(NUM_CONSUMERS)) + 1
    )
    return {
        "source_noop": messages,
        "mapInArrow_pass_through": lambda: messages().mapInArrow(_pass_through, messages().schema),
        "dropDuplicates": lambda: messages().dropDuplicates(["producerName", "sequenceId"]),
        "dropDuplicatesWithinWatermark": lambda: (
            messages()
            .withWatermark("publishTime", "10 minutes")
            .dropDuplicatesWithinWatermark(["producerName", "sequenceId"])
        ),
        "dedup_by_sequence": lambda: dedup_by_sequence(messages()),
        "dedup_by_sequence_unsized_arrow": lambda: dedup_by_sequence(messages()),
        "hash_assign_builtin": lambda: messages().withColumn("consumer", by_hash),
        "key_shared_assign": lambda: key_shared_assign(messages(), consumers),
        "delay_until_due": lambda: delay_until_due(messages()),
        "route_retry_dlq": lambda: route_retry_dlq(source(), subscription="bench", delay_ms=5000),
    }


UNSIZED_ARROW_BATCHES = {"spark.sql.execution.arrow.maxBytesPerBatch": "2147483647"}
"""The session setting with which Spark stops sizing every Arrow batch it hands Python after
each row (docs/dispatch-operators.md, Speed): a user's trade, measured as a case of its own."""
CASE_CONF = {"dedup_by_sequence_unsized_arrow": UNSIZED_ARROW_BATCHES}

STATEFUL = ("dedup_by_sequence", "key_shared_assign", "delay_until_due")
BUILTIN_OF = {
    "dedup_by_sequence": ("dropDuplicatesWithinWatermark", "dropDuplicates"),
    "dedup_by_sequence_unsized_arrow": ("dropDuplicatesWithinWatermark", "dedup_by_sequence"),
    "key_shared_assign": ("hash_assign_builtin", "mapInArrow_pass_through"),
    "delay_until_due": ("mapInArrow_pass_through",),
    "mapInArrow_pass_through": ("source_noop",),
}
GOAL_MSG_PER_S = {"key_shared_assign": 100_000, "delay_until_due": 100_000}


WARM_UP_FILES = 5 * FILES_PER_BATCH
"""Input of each case's warm-up run: a first micro-batch and four steady ones (with two, the
JVM was still compiling ``dedup_by_sequence``'s paths in the first measured round: 3.4-3.8 us
of JIT CPU a message there against 1.2-1.6 in the next)."""


def _warm_up_input(data: Path, scratch: Path) -> Path:
    """A folder with the first :data:`WARM_UP_FILES` input files (copies)."""
    folder = scratch / "warm-up-input"
    folder.mkdir(parents=True, exist_ok=True)
    for path in sorted(data.glob("*.parquet"))[:WARM_UP_FILES]:
        shutil.copyfile(path, folder / path.name)
    return folder


def round_order(names: Sequence[str], round_index: int) -> list[str]:
    """The order the cases run in, in round ``round_index``: as given in even rounds, reversed
    in odd ones, so a host whose load rises (or falls) through a round does not always favour
    the cases that run first; a case and its built-in then run first as often as each other
    over an even number of rounds (and within one of it over the bench's 5)."""
    return list(names) if round_index % 2 == 0 else list(reversed(names))


def operator_records(spark: Any, scratch: Path, rounds: int = ROUNDS) -> list[dict[str, Any]]:
    """Every case of :func:`_cases`, ``rounds`` times, interleaved (case A, B, ... then again),
    so the machine's other load falls on all of them alike.

    Each case first runs once over :data:`WARM_UP_FILES` files (its cold start, reported as
    ``first_batch_cold_s``): the JVM compiles a case's code paths and PySpark starts its
    Python workers during its first few micro-batches, not only the first, so without it the
    first measured round of the first case to use a code path (the first
    ``transformWithStateInPandas`` of the JVM) counted start-up as steady state."""
    data = scratch / "input"
    write_input(data)
    only = os.environ.get("BENCH_OPERATORS_CASES")  # a comma-separated subset, for profiling

    def selected(cases: dict[str, Callable[[], Any]]) -> dict[str, Callable[[], Any]]:
        if not only:
            return cases
        return {n: b for n, b in cases.items() if n in only.split(",") or n == "source_noop"}

    cases = selected(_cases(spark, data))
    # source_noop first: it also starts the JVM's Python workers and lists the input files.
    cold = {
        name: _noop_run(build(), scratch, CASE_CONF.get(name))
        for name, build in selected(_cases(spark, _warm_up_input(data, scratch))).items()
    }
    runs: dict[str, list[Run]] = {name: [] for name in cases}
    for round_index in range(rounds):
        for name in round_order(list(cases), round_index):
            runs[name].append(_noop_run(cases[name](), scratch, CASE_CONF.get(name)))
    records = []
    for name, done in runs.items():
        rates = [r.steady_rate for r in done]
        firsts = [r.first_s for r in done]
        record: dict[str, Any] = {
            "name": f"spark_ops_steady_{name}",
            "value": round(float(np.median(rates)) / 1e6, 4),  # the median round
            "unit": "M msg/s",
            "best": round(max(rates) / 1e6, 4),
            "steady_rates": [round(x) for x in rates],
            "first_batch_s": [round(x, 2) for x in firsts],
            "first_batch_cold_s": round(cold[name].first_s, 2),
            "batches": done[0].batches,
            "rows": done[0].rows,
            "wall_s": [round(r.wall_s, 1) for r in done],
        }
        if name in GOAL_MSG_PER_S:
            record["goal"] = f">= {GOAL_MSG_PER_S[name] / 1e6:g}"
            if "mapInArrow_pass_through" in runs:
                # The goal as a share of what one Python pass does on this host now: the
                # host-independent reading of an absolute rate on a loaded machine.
                record["goal_vs_pass_through"] = [
                    round(GOAL_MSG_PER_S[name] / base.steady_rate, 3)
                    for base in runs["mapInArrow_pass_through"]
                    if base.steady_rate
                ]
        records.append(record)
        for builtin in [b for b in BUILTIN_OF.get(name, ()) if b in runs]:
            # The ratio of each round (same round, minutes apart at most), then their median.
            ratios = [
                ours.steady_rate / base.steady_rate
                for ours, base in zip(done, runs[builtin], strict=True)
                if base.steady_rate
            ]
            records.append(
                {
                    "name": f"spark_ops_ratio_{name}_vs_{builtin}",
                    "value": round(float(np.median(ratios)), 3) if ratios else 0.0,
                    "unit": "x",
                    "per_round": [round(x, 3) for x in ratios],
                    **({"goal": ">= 1.0"} if name == "dedup_by_sequence" else {}),
                }
            )
        if name in STATEFUL:
            extra = [
                ours.first_s - base.first_s
                for ours, base in zip(done, runs["source_noop"], strict=True)
            ]
            records.append(
                {
                    "name": f"spark_ops_first_batch_overhead_{name}",
                    "value": round(float(np.median(extra)), 2),
                    "unit": "s",
                    "per_round": [round(x, 2) for x in extra],
                    # Its first run in this JVM, against the source's warm first batch.
                    "cold": round(
                        cold[name].first_s
                        - float(np.median([r.first_s for r in runs["source_noop"]])),
                        2,
                    ),
                }
            )
    return records


def _publish_orders(root: str, orders: int) -> int:
    """The demo's order stream (keyed, delayed, invalid and replayed orders) into ``orders``;
    returns the messages published."""
    from filepulsar.connector import Client
    from filepulsar.jobs import demo
    from filepulsar.storage import create_topic

    client = Client(root)
    try:
        create_topic(client.store, demo.INPUT, partitions=4)
        args = argparse.Namespace(
            orders=orders,
            duplicates=orders // 50,
            delayed=orders // 100,
            delay_ms=3_600_000,
            invalid=orders // 500,
        )
        pub = demo.publish(client, args)
    finally:
        client.close()
    return pub.orders + pub.duplicates


def _pipeline_run(spark: Any, root: str, scratch: Path, tag: str) -> Run:
    """``jobs/orders_pipeline`` as users run it (its default ``maxMessagesPerTrigger``), from
    the start of the input, under a subscription and checkpoint of its own."""
    from filepulsar.jobs import demo, orders_pipeline

    args = orders_pipeline.parse_args(
        [
            *("--url", root, "--input", demo.INPUT, "--output", f"out-{tag}"),
            *("--subscription", f"sub-{tag}", "--checkpoint", str(scratch / f"chk-{tag}")),
            *("--consumers", "c1,c2,c3", "--max-redeliver", "1"),
        ]
    )
    started = time.perf_counter()
    return measure(orders_pipeline.start(spark, args), started)


def _copy_run(spark: Any, root: str, scratch: Path, tag: str) -> Run:
    """The same source into the same sink with no operator: the pipeline's ceiling."""
    from filepulsar.jobs import demo, orders_pipeline

    df = (
        spark.readStream.format("filepulsar")
        .option("topics", demo.INPUT)
        .option("subscription", f"sub-{tag}")
        .option("subscriptionInitialPosition", "Earliest")
        .option(
            "maxMessagesPerTrigger",
            orders_pipeline.parser().get_default("max_messages_per_trigger"),
        )
        .load(root)
        .select("value", "key", "properties")
    )
    started = time.perf_counter()
    query = (
        df.writeStream.format("filepulsar")
        .option("topic", f"out-{tag}")
        .option("checkpointLocation", str(scratch / f"chk-{tag}"))
        .trigger(availableNow=True)
        .start(root)
    )
    return measure(query, started)


def pipeline_records(
    spark: Any, scratch: Path, rounds: int = PIPELINE_ROUNDS
) -> list[dict[str, Any]]:
    """The demo's pipeline end to end over :data:`PIPELINE_ORDERS` orders, interleaved with a
    bare copy of the same topic (source to sink, no operator)."""
    from filepulsar.jobs.spark import prepare_session

    prepare_session(spark)
    root = str(scratch / "pulsar")
    t0 = time.perf_counter()
    published = _publish_orders(root, PIPELINE_ORDERS)
    publish_s = time.perf_counter() - t0
    runs: dict[str, list[Run]] = {"copy": [], "pipeline": []}
    for r in range(rounds):
        runs["copy"].append(_copy_run(spark, root, scratch, f"copy{r}"))
        runs["pipeline"].append(_pipeline_run(spark, root, scratch, f"pipe{r}"))
    records = []
    for name, done in runs.items():
        rates = [x.steady_rate for x in done]
        records.append(
            {
                "name": f"orders_pipeline_steady_{name}",
                "value": round(float(np.median(rates))),  # the median round
                "unit": "orders/s",
                "best": round(max(rates)),
                "steady_rates": [round(x) for x in rates],
                "first_batch_s": [round(x.first_s, 2) for x in done],
                "batches": done[0].batches,
                "rows": done[0].rows,
                "published": published,
                "publish_s": round(publish_s, 1),
                "wall_s": [round(x.wall_s, 1) for x in done],
                **({"goal": ">= 20000"} if name == "pipeline" else {}),
            }
        )
    ratios = [
        p.steady_rate / c.steady_rate
        for p, c in zip(runs["pipeline"], runs["copy"], strict=True)
        if c.steady_rate
    ]
    records.append(
        {
            "name": "orders_pipeline_ratio_vs_copy",
            "value": round(float(np.median(ratios)), 3) if ratios else 0.0,
            "unit": "x",
            "per_round": [round(x, 3) for x in ratios],
        }
    )
    extra = [p.first_s - c.first_s for p, c in zip(runs["pipeline"], runs["copy"], strict=True)]
    records.append(
        {
            "name": "orders_pipeline_first_batch_overhead",
            "value": round(float(np.median(extra)), 2),
            "unit": "s",
            "per_round": [round(x, 2) for x in extra],
        }
    )
    return records


def run(parts: Sequence[str] = ("operators", "pipeline")) -> list[dict[str, Any]]:
    """Run every measurement and return one record per figure."""
    spark, created = _session()
    scratch = Path(tempfile.mkdtemp(prefix="bench-operators-"))
    try:
        records = []
        if "operators" in parts:
            records += operator_records(spark, scratch)
        if "pipeline" in parts:
            records += pipeline_records(spark, scratch)
        return records
    finally:
        if created:
            spark.stop()
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Spark dispatch operators against Spark's built-ins")
    ap.add_argument("parts", nargs="*", default=["operators", "pipeline"])
    args = ap.parse_args(argv)
    for record in run(args.parts):
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
