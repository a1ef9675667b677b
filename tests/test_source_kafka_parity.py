"""Spark's Kafka source suites' cases the filepulsar source must answer the same way, driven
as a Kafka user's query would be: real local Spark, AvailableNow, foreachBatch."""

from __future__ import annotations

import json
from typing import Any

import pytest

from filepulsar.connector.source.meter import apportion
from filepulsar.storage import Producer, create_topic, delete_topic, open_blob_store

pytestmark = pytest.mark.spark


def _send(root: str, topic: str, values: range | list[int]) -> None:
    with Producer(open_blob_store(root), topic, batching_enabled=False) as p:
        for v in values:
            p.send(str(v).encode())


def _batches(spark: Any, root: str, ckpt: str, **options: Any) -> list[list[int]]:
    """One AvailableNow run; each micro-batch's values, sorted."""
    out: list[list[int]] = []
    reader = spark.readStream.format("filepulsar")
    for k, v in options.items():
        reader = reader.option(k, v)
    q = (
        reader.load(root)
        .writeStream.foreachBatch(
            lambda df, _id: out.append(sorted(int(r.value) for r in df.collect()))
        )
        .option("checkpointLocation", ckpt)
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    return [b for b in out if b]


def test_apportion_gives_each_backlog_one_taken_from_the_largest_shares() -> None:
    """KafkaMicroBatchStream.rateLimit: a share under one is rounded up (``Math.ceil``), the
    others down; here the limit is kept exactly by taking the extra from the largest."""
    assert apportion({"p0": 101, "p1": 11, "p2": 1}, 10) == {"p0": 8, "p1": 1, "p2": 1}
    assert apportion({"p0": 93, "p1": 10}, 10) == {"p0": 9, "p1": 1}
    # Kafka would admit 1+1+1+4 = 7 of a limit of 5; here the big one gives two back.
    assert apportion({"a": 1, "b": 1, "c": 1, "d": 1000}, 5) == {"a": 1, "b": 1, "c": 1, "d": 2}
    # Fewer units than partitions with a backlog: one each, as Kafka (the limit is exceeded).
    assert apportion({"a": 5, "b": 5, "c": 5}, 2) == {"a": 1, "b": 1, "c": 1}
    assert apportion({"a": 0, "b": 30}, 10) == {"a": 0, "b": 10}


def test_max_messages_per_trigger_does_not_starve_a_small_partition(
    spark: Any, tmp_path: Any
) -> None:
    """KafkaMicroBatchSourceSuite "maxOffsetsPerTrigger": partition 0 holds 100..200,
    partition 1 10..20, partition 2 the single message 1; with a limit of 10 the first batch
    is 1, 10, 100..107 (one from the smallest, one from the middle, eight from the biggest)."""
    root = str(tmp_path / "root")
    create_topic(open_blob_store(root), "mopt", partitions=3)
    _send(root, "mopt-partition-0", range(100, 201))
    _send(root, "mopt-partition-1", range(10, 21))
    _send(root, "mopt-partition-2", [1])
    got = _batches(
        spark,
        root,
        str(tmp_path / "ck"),
        topic="mopt",
        startingOffsets="earliest",
        maxMessagesPerTrigger=10,
    )
    assert got[0] == [1, 10, *range(100, 108)]
    assert got[1] == [11, *range(108, 117)]
    assert all(len(b) <= 10 for b in got)
    assert sorted(v for b in got for v in b) == sorted([1, *range(10, 21), *range(100, 201)])


def test_every_partition_gone_keeps_the_offsets_and_the_query_restarts(tmp_path: Any) -> None:
    """SPARK-41375: when every partition of a running query is deleted, latestOffset gives
    the start back (no batch) rather than an empty offset; the checkpoint then still names
    the query's topic, so a restart of the same query is accepted and reads what comes.
    Driven as Spark's micro-batch engine calls the reader (the deletion has to fall between
    two triggers of one run)."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from filepulsar.connector.source.stream import FilePulsarStreamReader

    root = str(tmp_path / "root")
    create_topic(open_blob_store(root), "gone", partitions=2)
    _send(root, "gone", range(6))
    opts = {"path": root, "topic": "gone", "startingOffsets": "earliest"}
    opts["failOnDataLoss"] = "false"
    run = FilePulsarStreamReader(opts, None)  # type: ignore[arg-type]
    s0 = run.initialOffset()
    s1 = run.latestOffset(s0, ReadAllAvailable())
    assert len(s1) == 2
    delete_topic(open_blob_store(root), "gone", force=True)
    assert run.latestOffset(s1, ReadAllAvailable()) == s1  # not {}
    run.stop()
    again = FilePulsarStreamReader(opts, None)  # type: ignore[arg-type]
    s2 = again.latestOffset(s1, ReadAllAvailable())  # the restart is accepted
    _send(root, "gone", range(6, 9))  # the topic as the restarted query created it again
    s3 = again.latestOffset(s2, ReadAllAvailable())
    values = [
        int(v)
        for p in again.partitions(s2, s3)
        for b in again.read(p)
        for v in b.column("value").to_pylist()
    ]
    assert sorted(values) == [6, 7, 8]
    again.stop()


def test_batch_start_after_its_end_is_an_error(spark: Any, tmp_path: Any) -> None:
    """KafkaSourceRDD: "Beginning offset ... is after the ending offset" -- a user's swapped
    offsets fail rather than read nothing; equal offsets are an empty range."""
    from filepulsar.storage.errors import InvalidConfiguration

    root = str(tmp_path / "root")
    _send(root, "swap", range(10))
    key = "persistent://public/default/swap"
    read = spark.read.format("filepulsar").option("topic", "swap")

    def offsets(start: str, end: str) -> Any:
        return (
            read.option("startingOffsets", json.dumps({key: start}))
            .option("endingOffsets", json.dumps({key: end}))
            .load(root)
        )

    with pytest.raises(Exception, match=r"startingOffsets 0:7:-1 of .*swap is after its "):
        offsets("0:7:-1", "0:3:-1").collect()
    assert offsets("0:3:-1", "0:3:-1").count() == 0
    assert sorted(int(r.value) for r in offsets("0:3:-1", "0:7:-1").collect()) == [3, 4, 5, 6]
    from filepulsar.connector.source.batch import FilePulsarBatchReader

    r = FilePulsarBatchReader(
        {
            "path": root,
            "topic": "swap",
            "startingOffsets": json.dumps({key: "0:7:-1"}),
            "endingOffsets": json.dumps({key: "0:3:-1"}),
        },
        None,  # type: ignore[arg-type]
    )
    with pytest.raises(InvalidConfiguration, match="the start must be at or before the end"):
        r.partitions()
