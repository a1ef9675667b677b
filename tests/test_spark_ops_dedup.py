"""dedup_by_sequence as a streaming operator, against DedupTracker run message by message."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from filepulsar.connector.schema import SOURCE_SCHEMA
from filepulsar.dispatch.dedup import DedupStatus, DedupTracker
from filepulsar.dispatch.spark import dedup_by_sequence
from tests.test_spark_ops_support import (
    flat,
    message,
    relocated,
    run_available_now,
    source,
    write_messages,
)

pytestmark = pytest.mark.spark


def sends(start_entry: int, partition: int, plan: list[tuple[str, int]]) -> list[dict[str, Any]]:
    """Messages of one partition in entry order; ``plan`` lists (producer, sequence id)."""
    return [
        message(
            start_entry + i,
            partition=partition,
            producerName=producer,
            sequenceId=seq,
            properties={"n": str(start_entry + i)},
            key=f"k{seq}",
        )
        for i, (producer, seq) in enumerate(plan)
    ]


def expected_kept(rows: list[dict[str, Any]], scope) -> set[tuple[int, int]]:
    """(partition, entryId) of the rows Pulsar keeps; ``rows`` in publish order."""
    trackers: dict[Any, DedupTracker] = {}
    kept = set()
    for row in sorted(rows, key=lambda r: (r["publishTime"], r["partition"], r["entryId"])):
        tracker = trackers.setdefault(scope(row), DedupTracker())
        if tracker.check(row["producerName"], row["sequenceId"]) is DedupStatus.NOT_DUP:
            tracker.record_persisted(row["producerName"], row["sequenceId"])
            kept.add((row["partition"], row["entryId"]))
    return kept


def test_drops_duplicates_and_lower_ids_across_batches_and_restarts(spark, tmp_path):
    folder, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    batch_1 = sends(0, 0, [("a", 0), ("b", 0), ("a", 1), ("a", 1), ("b", 2), ("a", 3), ("a", 2)])
    batch_1 += sends(0, 1, [("a", 0), ("a", 1), ("a", 0)])  # another partition: its own map
    batch_2 = sends(7, 0, [("b", 1), ("b", 3), ("a", 4), ("a", 4), ("c", 0)])
    for rows in (batch_1, batch_2):
        write_messages(folder, rows)
    first = flat(
        run_available_now(dedup_by_sequence(source(spark, folder, files_per_batch=1)), checkpoint)
    )

    restart = sends(12, 0, [("a", 4), ("a", 5), ("b", 3), ("c", 0), ("c", 1)])
    restart += sends(3, 1, [("a", 1), ("a", 2)])
    write_messages(folder, restart)
    second = flat(run_available_now(dedup_by_sequence(source(spark, folder)), checkpoint))

    scope = lambda r: (r["topic"], r["partition"])  # noqa: E731
    everything = batch_1 + batch_2 + restart
    want = expected_kept(everything, scope)
    got_first = {(r.partition, r.entryId) for r in first}
    got_second = {(r.partition, r.entryId) for r in second}
    assert got_first | got_second == want
    assert not got_first & got_second
    assert got_second == want & {(r["partition"], r["entryId"]) for r in restart}

    # Kept rows come out with every column unchanged.
    by_id = {(r["partition"], r["entryId"]): r for r in everything}
    for row in first + second:
        original = by_id[(row.partition, row.entryId)]
        assert row.value == original["value"]
        assert row.key == original["key"]
        assert row.properties == dict(original["properties"])
        assert row.messageId == original["messageId"]
        assert row.sequenceId == original["sequenceId"]


def test_scope_and_difference_from_drop_duplicates(spark, tmp_path):
    folder = tmp_path / "in"
    # Producer "a" publishes seq 5 on partition 0, then seq 3 on partition 1, then 3 again.
    rows = sends(0, 0, [("a", 5)]) + sends(1, 1, [("a", 3), ("a", 3)])
    write_messages(folder, rows)

    per_partition = flat(
        run_available_now(dedup_by_sequence(source(spark, folder)), tmp_path / "c1")
    )
    whole_stream = flat(
        run_available_now(dedup_by_sequence(source(spark, folder), by=()), tmp_path / "c2")
    )
    assert sorted(r.sequenceId for r in per_partition) == [3, 5]
    assert sorted(r.sequenceId for r in whole_stream) == [5]
    assert {(r.partition, r.entryId) for r in whole_stream} == expected_kept(rows, lambda r: ())

    # Spark's dropDuplicates keeps the first of each exact pair, so the lower id 3 stays.
    batch = spark.read.schema(SOURCE_SCHEMA).parquet(str(folder))
    assert sorted(
        r.sequenceId for r in batch.dropDuplicates(["producerName", "sequenceId"]).collect()
    ) == [3, 5]


def test_missing_columns_are_reported(spark, tmp_path):
    write_messages(tmp_path / "in", sends(0, 0, [("a", 0)]))
    with pytest.raises(ValueError, match="sequenceId"):
        dedup_by_sequence(source(spark, tmp_path / "in").drop("sequenceId"))


def test_a_topic_written_by_spark_passes_and_client_ids_are_still_deduped(spark, tmp_path):
    """Job A writes a topic through the Spark sink (no sequenceId column: every row stored
    with id -1 under one producer name per query); job B reads it and dedups. Every
    Spark-written row passes, while a pulsar-client producer's ids on the same topic --
    explicit ones and the ones it assigns itself (last + 1) -- are still deduplicated."""
    from filepulsar.storage import Producer, open_blob_store

    root = str(tmp_path / "root")
    for start in (0, 300):  # two writes: two sink producer names
        (
            spark.range(start, start + 300, numPartitions=2)
            .selectExpr("concat('spark-', cast(id as string)) as value")
            .write.format("filepulsar")
            .option("topic", "chain")
            .mode("append")
            .save(root)
        )
    store = open_blob_store(root)
    with Producer(store, "chain", producer_name="app", batching_enabled=False) as p:
        for seq in (0, 1, 1, 2, 0):  # a retrying producer: 1 and 0 again are duplicates
            p.send(b"app-%d" % seq, sequence_id=seq)
    for value in (b"auto-a", b"auto-b", b"auto-c"):  # ids assigned by the producer: 0, 1, 2
        with Producer(store, "chain", producer_name="auto", batching_enabled=False) as p:
            p.send(value)  # a fresh producer (no dedup policy) starts again at 0

    stream = (
        spark.readStream.format("filepulsar")
        .option("topic", "chain")
        .option("startingOffsets", "earliest")
        .load(root)
    )
    kept = flat(run_available_now(dedup_by_sequence(stream), tmp_path / "ck"))
    values = sorted(r.value for r in kept)
    spark_rows = [r for r in kept if r.value.startswith(b"spark-")]
    assert {r.sequenceId for r in spark_rows} == {-1}
    assert len({r.producerName for r in spark_rows}) == 2
    assert sorted(spark_rows_values := [r.value for r in spark_rows]) == sorted(
        b"spark-%d" % i for i in range(600)
    )
    assert len(spark_rows_values) == 600
    assert [v for v in values if not v.startswith(b"spark-")] == [
        b"app-0",
        b"app-1",
        b"app-2",
        b"auto-a",
    ]


def test_a_checkpoint_written_without_changelog_checkpointing_restores_with_it(spark, tmp_path):
    """The sessions of jobs/ turn RocksDB changelog checkpointing on; a checkpoint written
    before, with it off, must restart with its state (no id dropped or let through twice)."""
    from filepulsar.jobs.spark import ROCKSDB_CHANGELOG

    folder, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    assert spark.conf.get(ROCKSDB_CHANGELOG) == "true"
    write_messages(folder, sends(0, 0, [("a", 0), ("a", 1), ("a", 2)]))
    spark.conf.set(ROCKSDB_CHANGELOG, "false")
    try:
        first = flat(run_available_now(dedup_by_sequence(source(spark, folder)), checkpoint))
    finally:
        spark.conf.set(ROCKSDB_CHANGELOG, "true")
    assert sorted(r.sequenceId for r in first) == [0, 1, 2]
    for start in (3, 5):  # two runs with it on: the state it wrote restores as well
        write_messages(folder, sends(start, 0, [("a", 1), ("a", start), ("a", start - 1)]))
        again = flat(run_available_now(dedup_by_sequence(source(spark, folder)), checkpoint))
        assert [r.sequenceId for r in again] == [start]


SPARK_DEFAULT_CHECKPOINT_FILE_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager"
)


def checkpoint_file_manager(spark: Any, path: Path) -> str:
    """The class of the manager Spark writes a checkpoint at ``path`` with, asked of the JVM
    with the session's settings, as a query starting now would."""
    jvm = spark.sparkContext._jvm
    conf = spark._jsparkSession.sessionState().newHadoopConf()
    manager = jvm.org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager
    return str(manager.create(jvm.org.apache.hadoop.fs.Path(str(path)), conf).getClass().getName())


def test_local_sessions_write_checkpoints_without_a_process_per_path(spark, tmp_path):
    """The jobs' local sessions (``local_spark``, and ``prepare_session`` on a ``local``
    master) make Spark write checkpoint files through Hadoop's ``FileSystem`` API: its default
    ``FileContext`` manager starts a ``readlink`` process for each path of every rename on
    the local filesystem. A session that chose a manager keeps it."""
    from filepulsar.jobs.spark import (
        CHECKPOINT_FILE_MANAGER,
        FILESYSTEM_CHECKPOINT_FILE_MANAGER,
        prepare_session,
    )

    assert checkpoint_file_manager(spark, tmp_path) == FILESYSTEM_CHECKPOINT_FILE_MANAGER
    try:
        spark.conf.unset(CHECKPOINT_FILE_MANAGER)
        assert checkpoint_file_manager(spark, tmp_path) == SPARK_DEFAULT_CHECKPOINT_FILE_MANAGER
        prepare_session(spark)
        assert checkpoint_file_manager(spark, tmp_path) == FILESYSTEM_CHECKPOINT_FILE_MANAGER
        spark.conf.set(CHECKPOINT_FILE_MANAGER, SPARK_DEFAULT_CHECKPOINT_FILE_MANAGER)
        prepare_session(spark)
        assert checkpoint_file_manager(spark, tmp_path) == SPARK_DEFAULT_CHECKPOINT_FILE_MANAGER
    finally:
        spark.conf.set(CHECKPOINT_FILE_MANAGER, FILESYSTEM_CHECKPOINT_FILE_MANAGER)


def test_a_checkpoint_written_by_sparks_default_file_manager_restores(spark, tmp_path):
    """A checkpoint written before the jobs' sessions switched managers (Spark's default,
    ``FileContext``) restarts under theirs with its state: no id dropped or let through
    twice."""
    from filepulsar.jobs.spark import CHECKPOINT_FILE_MANAGER, FILESYSTEM_CHECKPOINT_FILE_MANAGER

    folder, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    write_messages(folder, sends(0, 0, [("a", 0), ("a", 1), ("a", 2)]))
    spark.conf.set(CHECKPOINT_FILE_MANAGER, SPARK_DEFAULT_CHECKPOINT_FILE_MANAGER)
    try:
        first = flat(run_available_now(dedup_by_sequence(source(spark, folder)), checkpoint))
    finally:
        spark.conf.set(CHECKPOINT_FILE_MANAGER, FILESYSTEM_CHECKPOINT_FILE_MANAGER)
    assert sorted(r.sequenceId for r in first) == [0, 1, 2]
    for start in (3, 5):
        write_messages(folder, sends(start, 0, [("a", 1), ("a", start), ("a", start - 1)]))
        again = flat(run_available_now(dedup_by_sequence(source(spark, folder)), checkpoint))
        assert [r.sequenceId for r in again] == [start]


GOLDEN_JVM_KEYS = Path(__file__).parent / "golden" / "dedup-jvm-keys"


def test_a_checkpoint_whose_groups_the_jvm_named_restores(spark, tmp_path):
    """A checkpoint written when the JVM named the state groups (``to_json`` per row;
    tests/golden/make_dedup_jvm_keys.py: partition 0 producers ``a`` up to 3, ``b`` 0 and an
    awkward name JSON escapes at 5, partition 1 ``a`` at 0) restarts with the group names
    Python makes: every stored highest id is found again, so nothing at or below it passes."""
    query = relocated(GOLDEN_JVM_KEYS, tmp_path / "query")
    folder, checkpoint = query / "input", query / "checkpoint"
    awkward = 'q"\\\n\x01é'
    plan = [(0, "a", 2), (0, "a", 4), (0, awkward, 5), (0, awkward, 6), (0, "b", 0)]
    plan += [(1, "a", 0), (1, "a", 1), (0, "new", 0)]
    rows = [
        message(100 + i, partition=partition, producerName=producer, sequenceId=seq)
        for i, (partition, producer, seq) in enumerate(plan)
    ]
    write_messages(folder, rows)
    out = flat(run_available_now(dedup_by_sequence(source(spark, folder)), checkpoint))
    assert sorted((r.partition, r.producerName, r.sequenceId) for r in out) == sorted(
        [(0, "a", 4), (0, awkward, 6), (1, "a", 1), (0, "new", 0)]
    )
