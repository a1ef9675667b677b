"""The sink through Spark: ``df.write`` and ``df.writeStream`` ``.format("filepulsar")`` end to
end, read back with ``storage.Reader`` (small data; the shared local[2] session)."""

from __future__ import annotations

import datetime as dt
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from filepulsar.dispatch.routing import partition_for_key
from filepulsar.storage import Reader, create_topic, open_blob_store, set_topic_policies
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.retention import sweep_orphans

pytestmark = pytest.mark.spark


def _read(store: BlobStore, topic: str) -> pa.Table:
    r = Reader(store, topic)
    parts = []
    while r.has_message_available():
        parts.append(r.read_batch(1000, timeout_ms=0))
    return pa.concat_tables(parts)


def _entries(root: Path) -> list[Path]:
    return sorted(root.glob("topics/**/data/*.entries"))


def _nothing_left(spark: Any, store: BlobStore, root: Path, topic: str) -> None:
    """After a failed write: nothing of it is visible, and nothing of it stays on disk once
    the orphan sweep ran. Spark reports the failure while it still cancels the job's other
    tasks, and a cancelled task's Python worker may finish writing its staged blob after the
    driver's abort deleted the staged blobs it could see (CI saw one such blob): such a blob
    is named by no manifest, and the sweep is what reclaims it. So: wait until the tasks are
    gone, then check."""
    tracker = spark.sparkContext.statusTracker()
    deadline = time.monotonic() + 60
    while tracker.getActiveStageIds() and time.monotonic() < deadline:
        time.sleep(0.05)  # polls a real condition: the cancelled tasks ending
    assert not tracker.getActiveStageIds()
    assert not Reader(store, topic).has_message_available()
    sweep_orphans(store, topic, min_age_ms=0)
    assert _entries(root) == []


def test_batch_write_reads_back_equal_to_the_input(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    root = tmp_path / "root"
    t0 = dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.UTC)
    df = spark.range(0, 3000, numPartitions=3).select(
        F.concat(F.lit("v-"), F.col("id").cast("string")).alias("value"),
        F.when(F.col("id") % 4 != 0, F.concat(F.lit("k"), (F.col("id") % 11).cast("string"))).alias(
            "key"
        ),
        F.when(F.col("id") % 3 == 0, F.create_map(F.lit("n"), F.col("id").cast("string"))).alias(
            "properties"
        ),
        (F.lit(t0) + F.make_interval(secs=F.col("id"))).alias("eventTime"),
    )
    (
        df.write.format("filepulsar")
        .option("topic", "persistent://public/default/back")
        .option("compressionType", "ZSTD")
        .mode("append")
        .save(str(root))
    )
    got = _read(open_blob_store(str(root)), "back")
    rows = {r["value"]: (r["key"], r["properties"], r["event_time"]) for r in got.to_pylist()}
    assert len(rows) == got.num_rows == 3000
    base = int(t0.timestamp() * 1000)
    for i in range(3000):
        key, props, evt = rows[f"v-{i}".encode()]
        assert key == (f"k{i % 11}" if i % 4 else None)
        assert props == ([("n", str(i))] if i % 3 == 0 else None)
        assert evt == base + 1000 * i


def test_keyed_messages_land_on_the_router_partition(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "root"
    store = open_blob_store(str(root))
    create_topic(store, "routed", 4)
    df = spark.range(0, 2000, numPartitions=2).selectExpr(
        "cast(id as string) as value", "concat('order-', cast(id % 97 as string)) as key"
    )
    (
        df.write.format("filepulsar")
        .option("topic", "routed")
        .option("hashingScheme", "Murmur3_32Hash")
        .mode("append")
        .save(str(root))
    )
    got = _read(store, "routed")
    assert got.num_rows == 2000
    for key, part in zip(got.column("key").to_pylist(), got.column("partition").to_pylist()):
        assert part == partition_for_key(key, 4, "Murmur3_32Hash")
    # Rows of one key keep their order (one Spark partition per id range here).
    per_key: dict[str, list[int]] = {}
    for v, k in zip(got.column("value").to_pylist(), got.column("key").to_pylist()):
        per_key.setdefault(k, []).append(int(v))
    for ids in per_key.values():
        firsts = [i for i in ids if i < 1000]
        assert firsts == sorted(firsts)


def test_bad_input_fails_before_any_write(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "root"
    no_value = spark.range(3).selectExpr("cast(id as string) as key")
    with pytest.raises(Exception, match="needs a 'value' column"):
        no_value.write.format("filepulsar").option("topic", "t").mode("append").save(str(root))
    bad_type = spark.range(3).selectExpr("cast(id as string) as value", "id as key")
    with pytest.raises(Exception, match="column 'key' has type bigint; expected string"):
        bad_type.write.format("filepulsar").option("topic", "t").mode("append").save(str(root))
    with pytest.raises(Exception, match="unknown option"):
        (
            spark.range(3)
            .selectExpr("cast(id as string) as value")
            .write.format("filepulsar")
            .option("topic", "t")
            .option("batchSize", "3")
            .mode("append")
            .save(str(root))
        )
    assert not root.exists() or _entries(root) == []


def test_too_big_message_fails_the_job_and_leaves_nothing(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "root"
    store = open_blob_store(str(root))
    create_topic(store, "small")
    set_topic_policies(store, "small", max_message_size=512)
    df = spark.range(0, 200, numPartitions=2).selectExpr(
        "case when id = 150 then repeat('x', 600) else cast(id as string) end as value"
    )
    with pytest.raises(Exception, match=r"600 bytes .* exceeds the max message size 512"):
        df.write.format("filepulsar").option("topic", "small").mode("append").save(str(root))
    _nothing_left(spark, store, root, "small")


def test_dedup_drops_sequence_ids_written_before(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "root"
    store = open_blob_store(str(root))
    create_topic(store, "dd", 2)
    set_topic_policies(store, "dd", deduplication_enabled=True)

    def save(lo: int, hi: int) -> None:
        (
            spark.range(lo, hi, numPartitions=1)
            .selectExpr(
                "cast(id as string) as value",
                "concat('k', cast(id % 5 as string)) as key",
                "id as sequenceId",
                "'orders-job' as producerName",
            )
            .write.format("filepulsar")
            .option("topic", "dd")
            .mode("append")
            .save(str(root))
        )

    save(0, 300)
    save(200, 400)  # a re-run that repeats 200..299
    values = Counter(int(v) for v in _read(store, "dd").column("value").to_pylist())
    assert sorted(values) == list(range(400)) and set(values.values()) == {1}


def test_streaming_available_now_and_restart(spark: Any, tmp_path: Path) -> None:
    src = tmp_path / "src"
    root = tmp_path / "root"
    chk = tmp_path / "chk"
    store = open_blob_store(str(root))
    create_topic(store, "events", 3)

    def add_file(lo: int, hi: int) -> None:
        spark.range(lo, hi, numPartitions=1).selectExpr(
            "cast(id as string) as value", "concat('u', cast(id % 7 as string)) as key"
        ).write.mode("append").parquet(str(src))

    def run() -> None:
        q = (
            spark.readStream.schema("value string, key string")
            .option("maxFilesPerTrigger", 1)
            .parquet(str(src))
            .writeStream.format("filepulsar")
            .option("topic", "events")
            .option("checkpointLocation", str(chk))
            .trigger(availableNow=True)
            .start(str(root))
        )
        q.awaitTermination()
        assert q.exception() is None

    add_file(0, 100)
    add_file(100, 250)
    run()
    add_file(250, 300)
    run()  # restarted from the checkpoint: only the new file is written
    values = Counter(int(v) for v in _read(store, "events").column("value").to_pylist())
    assert sorted(values) == list(range(300)) and set(values.values()) == {1}
    writers = {wid for p in range(3) for wid in _state(store, f"events-partition-{p}").sink_batches}
    assert len(writers) == 1  # the query id, stable across the restart


def _state(store: BlobStore, topic: str) -> Any:
    from filepulsar.storage import ManagedLedger, TopicName

    return ManagedLedger(store, TopicName.parse(topic)).state()


def test_a_deliver_at_beyond_the_max_delay_fails_the_job_and_leaves_nothing(
    spark: Any, tmp_path: Path
) -> None:
    """PIP-315 in the sink: a row whose deliverAt is further ahead than the topic's
    delayed_delivery_max_delay_ms fails the write (the broker's NotAllowed), nothing lands;
    rows within the limit are written."""
    root = tmp_path / "root"
    store = open_blob_store(str(root))
    create_topic(store, "later")
    set_topic_policies(store, "later", delayed_delivery_max_delay_ms=60_000)
    far = spark.range(0, 20, numPartitions=2).selectExpr(
        "cast(id as string) as value",
        "current_timestamp() + case when id = 7 then interval 1 hour "
        "else interval 10 seconds end as deliverAt",
    )
    with pytest.raises(Exception, match=r"Exceeds max allowed delivery delay of 60000 milli"):
        far.write.format("filepulsar").option("topic", "later").mode("append").save(str(root))
    _nothing_left(spark, store, root, "later")
    near = far.where("id != 7")
    near.write.format("filepulsar").option("topic", "later").mode("append").save(str(root))
    assert _read(store, "later").num_rows == 19
