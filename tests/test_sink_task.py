"""The sink without a JVM: options, input checks, routing, batching, chunking, dedup, commit and
abort, driven through the writer classes exactly as PySpark calls them (constructor on the
driver, ``write`` per task, ``commit``/``abort`` on the driver)."""

from __future__ import annotations

import datetime as dt
import itertools
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

import filepulsar.connector.sink.task as sink_task
import filepulsar.connector.sink.writers as sink
from filepulsar.connector.sink.writers import (
    FilePulsarBatchWriter,
    FilePulsarStreamWriter,
    SinkCommitMessage,
    commit_batch,
)
from filepulsar.dispatch.routing import partition_for_key
from filepulsar.storage import (
    InvalidConfiguration,
    MessageTooBig,
    Reader,
    TopicNotFound,
    create_topic,
    open_blob_store,
    set_namespace_policies,
    set_topic_policies,
)
from filepulsar.storage.blobstore.port import BlobStore

pytestmark = pytest.mark.unit

UTC = dt.UTC
_SPARK_TYPES = {
    "value": BinaryType(),
    "key": StringType(),
    "orderingKey": BinaryType(),
    "properties": MapType(StringType(), StringType()),
    "eventTime": TimestampType(),
    "deliverAt": TimestampType(),
    "sequenceId": LongType(),
    "producerName": StringType(),
    "topic": StringType(),
    "partition": IntegerType(),
}
_ARROW_TYPES = {
    "value": pa.binary(),
    "key": pa.string(),
    "orderingKey": pa.binary(),
    "properties": pa.map_(pa.field("key", pa.string(), nullable=False), pa.string()),
    "eventTime": pa.timestamp("us", tz="UTC"),
    "deliverAt": pa.timestamp("us", tz="UTC"),
    "sequenceId": pa.int64(),
    "producerName": pa.string(),
    "topic": pa.string(),
    "partition": pa.int32(),
}


def _schema(columns: list[str]) -> StructType:
    return StructType([StructField(c, _SPARK_TYPES[c], True) for c in columns])


def _batch(**columns: list[Any]) -> pa.RecordBatch:
    """A record batch shaped as Spark hands it to an Arrow writer."""
    return pa.record_batch(
        [pa.array(v, _ARROW_TYPES[k]) for k, v in columns.items()], names=list(columns)
    )


def _writer(root: str, columns: list[str], **options: Any) -> FilePulsarBatchWriter:
    opts = {"path": root, **{k: str(v) for k, v in options.items()}}
    return FilePulsarBatchWriter(opts, _schema(columns), False)


def _save(root: str, *tasks: list[pa.RecordBatch], **options: Any) -> list[SinkCommitMessage]:
    """Run a batch write: one task per argument, then commit."""
    columns = tasks[0][0].schema.names
    w = _writer(root, columns, **options)
    msgs = [w.write(iter(batches)) for batches in tasks]
    w.commit(list(msgs))
    return msgs


def _read(store: BlobStore, topic: str) -> pa.Table:
    r = Reader(store, topic)
    parts = []
    while r.has_message_available():
        parts.append(r.read_batch(1000, timeout_ms=0))
    return pa.concat_tables(parts) if parts else pa.table({"value": pa.array([], pa.binary())})


def _data_files(root: str) -> list[Path]:
    return sorted(Path(root).glob("topics/**/data/*.entries"))


@pytest.fixture
def root(tmp_path: Path) -> str:
    return str(tmp_path / "root")


@pytest.fixture
def store(root: str) -> BlobStore:
    return open_blob_store(root)


# ---------------------------------------------------------------------- options and input
def test_unknown_option_fails_listing_accepted(root: str) -> None:
    with pytest.raises(
        InvalidConfiguration, match=r"(?i)unknown option\(s\) batchSize.*batchingMaxBytes"
    ):
        _writer(root, ["value"], topic="t", batchSize=10)


@pytest.mark.parametrize(
    ("option", "value", "pattern"),
    [
        ("compressionType", "GZIP", "allowed: NONE, LZ4, ZLIB, ZSTD, SNAPPY"),
        (
            "messageRoutingMode",
            "Random",
            "allowed: SinglePartition, RoundRobinPartition, CustomPartition, "
            "UseSinglePartition, RoundRobinDistribution",
        ),
        ("hashingScheme", "Murmur", "allowed: JavaStringHash, Murmur3_32Hash"),
        ("batchingType", "Time", "allowed: Default, KeyBased"),
        ("batchingMaxMessages", "0", "must be >= 1"),
        ("batchingEnabled", "maybe", "must be true or false"),
        ("writerId", "a.b", "writerId"),
        ("storageOptions", "[1]", "JSON object"),
    ],
)
def test_bad_option_values_fail_naming_the_option(
    root: str, option: str, value: str, pattern: str
) -> None:
    with pytest.raises(InvalidConfiguration, match=pattern):
        _writer(root, ["value"], topic="t", **{option: value})


def test_options_are_case_insensitive(root: str, store: BlobStore) -> None:
    w = FilePulsarBatchWriter(
        {"PATH": root, "TOPIC": "ci", "COMPRESSIONTYPE": "zstd", "batchingmaxmessages": "7"},
        _schema(["value"]),
        False,
    )
    assert w.config.batching_max_messages == 7 and w.config.codec.name == "ZSTD"


@pytest.mark.parametrize(
    ("fields", "pattern"),
    [
        ([StructField("key", StringType())], "needs a 'value' column"),
        ([StructField("value", IntegerType())], "column 'value' has type int; expected binary"),
        (
            [StructField("value", BinaryType()), StructField("key", BinaryType())],
            "column 'key' has type binary; expected string",
        ),
        (
            [
                StructField("value", BinaryType()),
                StructField("properties", MapType(StringType(), IntegerType())),
            ],
            "expected map<string, string>",
        ),
        (
            [StructField("value", BinaryType()), StructField("sequenceId", StringType())],
            "column 'sequenceId' has type string; expected an integer",
        ),
        (
            [StructField("value", BinaryType()), StructField("payload", StringType())],
            "unknown input column 'payload'",
        ),
        (
            [StructField("value", BinaryType()), StructField("partition", IntegerType())],
            "messageRoutingMode=CustomPartition",
        ),
    ],
)
def test_input_columns_are_checked_before_any_write(
    root: str, fields: list[StructField], pattern: str
) -> None:
    with pytest.raises(InvalidConfiguration, match=pattern):
        FilePulsarBatchWriter({"path": root, "topic": "t"}, StructType(fields), False)
    assert not Path(root).exists() or not _data_files(root)


def test_no_topic_and_overwrite_are_refused(root: str) -> None:
    with pytest.raises(InvalidConfiguration, match="set option 'topic'"):
        FilePulsarBatchWriter({"path": root}, _schema(["value"]), False)
    with pytest.raises(InvalidConfiguration, match="append-only"):
        FilePulsarBatchWriter({"path": root, "topic": "t"}, _schema(["value"]), True)


def test_auto_creation_follows_option_and_policy(root: str, store: BlobStore) -> None:
    with pytest.raises(TopicNotFound):
        _writer(root, ["value"], topic="absent", autoCreateTopic="false")
    set_namespace_policies(store, "public", "default", allow_auto_topic_creation=False)
    with pytest.raises(TopicNotFound):
        _writer(root, ["value"], topic="absent")
    set_namespace_policies(
        store,
        "public",
        "default",
        allow_auto_topic_creation=True,
        auto_topic_creation_type="partitioned",
        default_num_partitions=3,
    )
    _save(root, [_batch(value=[b"x"])], topic="auto")
    assert [p.name for p in sorted(Path(root).glob("topics/persistent/public/default/*"))] == [
        "auto",
        "auto-partition-0",
        "auto-partition-1",
        "auto-partition-2",
    ]


def test_max_message_size_may_not_exceed_the_policy(root: str, store: BlobStore) -> None:
    create_topic(store, "small")
    set_topic_policies(store, "small", max_message_size=1000)
    with pytest.raises(InvalidConfiguration, match="exceeds the max_message_size policy 1000"):
        _writer(root, ["value"], topic="small", maxMessageSize=2000)


# ---------------------------------------------------------------------- round trips
def test_batch_write_reads_back_every_column(root: str, store: BlobStore) -> None:
    t0 = dt.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    n = 2500
    batch = _batch(
        value=[f"v{i}".encode() for i in range(n)],
        key=[f"k{i % 5}" if i % 4 else None for i in range(n)],
        orderingKey=[b"o" if i % 3 == 0 else None for i in range(n)],
        properties=[[("a", str(i))] if i % 2 else None for i in range(n)],
        eventTime=[t0 + dt.timedelta(milliseconds=i) for i in range(n)],
    )
    _save(root, [batch.slice(0, 1000), batch.slice(1000)], [], topic="rt", compressionType="LZ4")
    got = _read(store, "rt")
    assert got.column("value").to_pylist() == batch.column("value").to_pylist()
    assert got.column("key").to_pylist() == batch.column("key").to_pylist()
    assert got.column("ordering_key").to_pylist() == batch.column("orderingKey").to_pylist()
    assert got.column("properties").to_pylist() == batch.column("properties").to_pylist()
    ms = int(t0.timestamp() * 1000)
    assert got.column("event_time").to_pylist() == [ms + i for i in range(n)]
    assert set(got.column("sequence_id").to_pylist()) == {-1}
    assert set(got.column("batch_index").to_pylist()) != {-1}
    assert len(set(got.column("producer_name").to_pylist())) == 1


def test_string_values_and_several_tasks(root: str, store: BlobStore) -> None:
    w = FilePulsarBatchWriter(
        {"path": root, "topic": "s"}, StructType([StructField("value", StringType())]), False
    )
    tasks = [
        pa.record_batch([pa.array([f"t{t}-{i}" for i in range(10)])], ["value"]) for t in (0, 1)
    ]
    msgs = [w.write(iter([b])) for b in tasks]
    w.commit(list(msgs))
    assert _read(store, "s").column("value").to_pylist() == [
        f"t{t}-{i}".encode() for t in (0, 1) for i in range(10)
    ]


def test_delayed_rows_are_single_entries_in_order(root: str, store: BlobStore) -> None:
    at = dt.datetime(2030, 1, 1, tzinfo=UTC)
    batch = _batch(
        value=[b"a", b"b", b"c", b"d"], deliverAt=[None, at, None, at + dt.timedelta(seconds=1)]
    )
    _save(root, [batch], topic="delay")
    got = _read(store, "delay")
    assert got.column("value").to_pylist() == [b"a", b"b", b"c", b"d"]
    ms = int(at.timestamp() * 1000)
    assert got.column("deliver_at").to_pylist() == [None, ms, None, ms + 1000]
    assert got.column("batch_index").to_pylist() == [0, -1, 0, -1]


def test_batching_limits_and_batching_off(root: str, store: BlobStore) -> None:
    batch = _batch(value=[bytes(10)] * 25)
    _save(root, [batch], topic="b1", batchingMaxMessages=10)
    assert _read(store, "b1").column("entry_id").to_pylist() == [0] * 10 + [1] * 10 + [2] * 5
    _save(root, [batch], topic="b2", batchingMaxBytes=35)  # crossing message closes the entry
    assert _read(store, "b2").column("entry_id").to_pylist() == sorted(list(range(7)) * 4)[:25]
    _save(root, [batch.slice(0, 3)], topic="b3", batchingEnabled="false")
    got = _read(store, "b3")
    assert got.column("entry_id").to_pylist() == [0, 1, 2]
    assert got.column("batch_index").to_pylist() == [-1, -1, -1]


def test_key_based_batching_keeps_key_order(root: str, store: BlobStore) -> None:
    keys = ["a", "b", "a", "c", "b", "a"]
    batch = _batch(value=[f"{k}{i}".encode() for i, k in enumerate(keys)], key=keys)
    _save(root, [batch], topic="kb", batchingType="KeyBased")
    got = _read(store, "kb")
    by_entry: dict[int, set[str]] = {}
    for e, k in zip(got.column("entry_id").to_pylist(), got.column("key").to_pylist()):
        by_entry.setdefault(e, set()).add(k)
    assert all(len(v) == 1 for v in by_entry.values())
    for k in "abc":
        vals = [v for v, kk in zip(got.column("value").to_pylist(), got.column("key").to_pylist())]
        mine = [v for v, kk in zip(vals, got.column("key").to_pylist()) if kk == k]
        assert mine == [f"{k}{i}".encode() for i, kk in enumerate(keys) if kk == k]


def test_topic_and_producer_columns(root: str, store: BlobStore) -> None:
    batch = _batch(
        value=[b"1", b"2", b"3", b"4"],
        topic=["x", "persistent://public/default/y", "x", "y"],
        producerName=["p1", None, "p2", ""],
    )
    w = _writer(root, batch.schema.names)
    w.commit([w.write(iter([batch]))])
    x = _read(store, "x")
    assert x.column("value").to_pylist() == [b"1", b"3"]
    assert x.column("producer_name").to_pylist() == ["p1", "p2"]
    y = _read(store, "y")
    assert y.column("value").to_pylist() == [b"2", b"4"]
    assert set(y.column("producer_name").to_pylist()) == {f"spark-{w.writer_id}"}
    bad = _batch(value=[b"1"], topic=[None], producerName=[None])
    with pytest.raises(InvalidConfiguration, match="column 'topic' is null"):
        w.write(iter([bad]))


# ---------------------------------------------------------------------- routing
@pytest.mark.parametrize("scheme", ["JavaStringHash", "Murmur3_32Hash"])
def test_keyed_rows_go_to_the_router_partition_in_order(
    root: str, store: BlobStore, scheme: str
) -> None:
    create_topic(store, "keyed", 5)
    keys = [f"order-{i % 37}" if i % 10 else None for i in range(3000)]
    batch = _batch(value=[str(i).encode() for i in range(3000)], key=keys)
    _save(root, [batch.slice(0, 1500), batch.slice(1500)], topic="keyed", hashingScheme=scheme)
    got = _read(store, "keyed")
    assert got.num_rows == 3000
    for k, p in zip(got.column("key").to_pylist(), got.column("partition").to_pylist()):
        if k is not None:
            assert p == partition_for_key(k, 5, scheme)
    seen: dict[str, list[int]] = {}
    for k, v in zip(got.column("key").to_pylist(), got.column("value").to_pylist()):
        seen.setdefault(str(k), []).append(int(v))
    assert all(vals == sorted(vals) for vals in seen.values())


def test_keyless_round_robin_moves_per_batch(root: str, store: BlobStore) -> None:
    create_topic(store, "rr", 3)
    _save(
        root,
        [_batch(value=[str(i).encode() for i in range(60)])],
        topic="rr",
        batchingMaxMessages=10,
    )
    got = _read(store, "rr")
    part_of = dict(zip(got.column("value").to_pylist(), got.column("partition").to_pylist()))
    runs = [part_of[str(i).encode()] for i in range(0, 60, 10)]
    assert all(part_of[str(i).encode()] == runs[i // 10] for i in range(60))
    assert [(b - a) % 3 for a, b in itertools.pairwise(runs)] == [1] * 5
    _save(root, [_batch(value=[b"x"] * 6)], topic="rr", batchingEnabled="false")
    _save(root, [_batch(value=[b"s"] * 20)], topic="rr", messageRoutingMode="SinglePartition")
    got = _read(store, "rr")
    xs = [p for v, p in zip(got.column("value").to_pylist(), got.column("partition").to_pylist())]
    assert sorted(p for v, p in zip(got.column("value").to_pylist(), xs) if v == b"x") == [
        0,
        0,
        1,
        1,
        2,
        2,
    ]
    assert len({p for v, p in zip(got.column("value").to_pylist(), xs) if v == b"s"}) == 1


def test_custom_partition_column(root: str, store: BlobStore) -> None:
    create_topic(store, "cp", 4)
    batch = _batch(value=[b"a", b"b", b"c"], key=["k", None, "k"], partition=[3, 0, 1])
    _save(root, [batch], topic="cp", messageRoutingMode="CustomPartition")
    got = _read(store, "cp").sort_by("value")
    assert got.column("partition").to_pylist() == [3, 0, 1]
    bad = _batch(value=[b"a"], partition=[4])
    w = _writer(root, ["value", "partition"], topic="cp", messageRoutingMode="CustomPartition")
    with pytest.raises(InvalidConfiguration, match=r"Illegal partition index.*holds 4"):
        w.write(iter([bad]))


# ---------------------------------------------------------------------- chunking and size
def test_oversized_value_without_chunking_fails_and_leaves_nothing(
    root: str, store: BlobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    create_topic(store, "big")
    set_topic_policies(store, "big", max_message_size=1000)
    w = _writer(root, ["value"], topic="big")
    monkeypatch.setattr(sink_task, "STAGE_BYTES", 1)  # stage every round at once
    monkeypatch.setattr(sink_task, "ROUND_ROWS", 10)
    with pytest.raises(MessageTooBig, match=r"1001 bytes.*max message size 1000"):
        # The first round is staged before the bad row arrives; the failure deletes it too.
        w.write(iter([_batch(value=[b"ok"] * 10), _batch(value=[bytes(1001)])]))
    assert _data_files(root) == []
    monkeypatch.undo()
    # Compressed under the limit is fine, as Pulsar checks the compressed size.
    _save(root, [_batch(value=[bytes(5000)])], topic="big", compressionType="ZSTD")
    assert _read(store, "big").column("value").to_pylist() == [bytes(5000)]


def test_chunking_splits_and_reassembles(root: str, store: BlobStore) -> None:
    rng = np.random.default_rng(3)
    big = rng.integers(0, 256, 2500, dtype=np.uint8).tobytes()
    batch = _batch(value=[b"small-1", big, b"small-2"], key=["a", "b", "c"])
    _save(root, [batch], topic="chunky", chunkingEnabled="true", maxMessageSize=1000)
    got = _read(store, "chunky")
    assert got.column("value").to_pylist() == [b"small-1", big, b"small-2"]
    assert got.column("key").to_pylist() == ["a", "b", "c"]


# ---------------------------------------------------------------------- dedup
def test_dedup_drops_replayed_sequence_ids(root: str, store: BlobStore) -> None:
    create_topic(store, "dd", 2)
    set_topic_policies(store, "dd", deduplication_enabled=True)

    def rows(lo: int, hi: int) -> pa.RecordBatch:
        return _batch(
            value=[str(i).encode() for i in range(lo, hi)],
            key=[f"k{i % 3}" for i in range(lo, hi)],
            sequenceId=list(range(lo, hi)),
        )

    _save(root, [rows(0, 100)], topic="dd", producerName="orders-job")
    # A new query (new writer id) re-sends 50..149: the broker-side dedup drops 50..99.
    _save(root, [rows(50, 150)], topic="dd", producerName="orders-job")
    got = _read(store, "dd")
    assert sorted(int(v) for v in got.column("value").to_pylist()) == list(range(150))
    assert set(got.column("producer_name").to_pylist()) == {"orders-job"}


def test_sequence_id_is_non_negative_or_none(root: str) -> None:
    w = _writer(root, ["value", "sequenceId"], topic="s")
    with pytest.raises(InvalidConfiguration, match=r"holds -5; sequence ids must be >= 0, or -1"):
        w.write(iter([_batch(value=[b"a"], sequenceId=[-5])]))


def test_rows_read_back_without_a_sequence_id_are_written_on_and_kept_by_dedup(
    root: str, store: BlobStore
) -> None:
    """Job A writes rows without ids (stored as -1); job B reads them, keeps every column and
    writes them on to a topic with deduplication: none is a duplicate (null too), and ids a
    producer did assign are still deduplicated beside them."""
    create_topic(store, "chain")
    set_topic_policies(store, "chain", deduplication_enabled=True)
    first = _batch(value=[b"a", b"b", b"c", b"d"], sequenceId=[-1, -1, None, 5])
    _save(root, [first], topic="chain", producerName="job-b")
    again = _batch(value=[b"e", b"f", b"g"], sequenceId=[-1, None, 5])
    _save(root, [again], topic="chain", producerName="job-b")
    got = _read(store, "chain")
    assert got.column("value").to_pylist() == [b"a", b"b", b"c", b"d", b"e", b"f"]
    assert got.column("sequence_id").to_pylist() == [-1, -1, -1, 5, -1, -1]


def test_chunked_rows_without_a_sequence_id_keep_apart(root: str, store: BlobStore) -> None:
    """Two large rows without ids in one write are two chunked messages, not one uuid."""
    create_topic(store, "cnone")
    set_topic_policies(store, "cnone", max_message_size=100)
    batch = _batch(value=[b"a" * 250, b"b" * 250], sequenceId=[-1, None])
    _save(root, [batch], topic="cnone", chunkingEnabled="true", producerName="p")
    assert _read(store, "cnone").column("value").to_pylist() == [b"a" * 250, b"b" * 250]


def test_chunked_duplicate_is_dropped_whole(root: str, store: BlobStore) -> None:
    create_topic(store, "cdd")
    set_topic_policies(store, "cdd", deduplication_enabled=True, max_message_size=100)
    batch = _batch(value=[bytes(250), b"x"], sequenceId=[7, 8])
    opts = {"topic": "cdd", "chunkingEnabled": "true", "producerName": "p"}
    _save(root, [batch], **opts)
    _save(root, [batch], **opts)
    got = _read(store, "cdd")
    assert got.column("value").to_pylist() == [bytes(250), b"x"]


# ---------------------------------------------------------------------- exactly-once
def test_replayed_commit_is_a_no_op_and_deletes_its_blobs(root: str, store: BlobStore) -> None:
    w = _writer(root, ["value"], topic="once", writerId="job-1")
    first = w.write(iter([_batch(value=[b"a", b"b"])]))
    w.commit([first])
    again = _writer(root, ["value"], topic="once", writerId="job-1")
    replay = again.write(iter([_batch(value=[b"a", b"b"])]))
    again.commit([replay])
    assert _read(store, "once").column("value").to_pylist() == [b"a", b"b"]
    names = {p.name for p in _data_files(root)}
    assert names == {f"{first.blobs[0].blob}.entries"}


def test_abort_deletes_staged_and_stray_blobs(root: str, store: BlobStore) -> None:
    create_topic(store, "ab", 2)
    w = _writer(root, ["value"], topic="ab")
    ok = w.write(iter([_batch(value=[b"1"] * 20)]))
    # A failed attempt of another task left a blob named for this writer and batch.
    lost = w.write(iter([_batch(value=[b"2"] * 20)]))
    assert len(_data_files(root)) == 2 * len(ok.blobs)
    w.abort([ok, None])
    assert _data_files(root) == [] and lost.blobs
    assert _read(store, "ab").num_rows == 0


def test_batch_commit_deletes_blobs_of_lost_attempts(root: str, store: BlobStore) -> None:
    w = _writer(root, ["value"], topic="lost")
    kept = w.write(iter([_batch(value=[b"1"])]))
    w.write(iter([_batch(value=[b"2"])]))  # an attempt whose result Spark never used
    w.commit([kept])
    assert [p.name for p in _data_files(root)] == [f"{kept.blobs[0].blob}.entries"]
    assert _read(store, "lost").column("value").to_pylist() == [b"1"]


def test_abort_after_partial_commit_keeps_published_ledgers(root: str, store: BlobStore) -> None:
    create_topic(store, "half", 2)
    w = _writer(root, ["value", "key"], topic="half", writerId="half-job")
    keys = ["a", "b", "c", "d", "e", "f"]
    msg = w.write(iter([_batch(value=[k.encode() for k in keys], key=keys)]))
    assert len(msg.blobs) == 2
    # The commit published partition 0 only, then failed; Spark calls abort.
    first = SinkCommitMessage(msg.writer_id, 0, 0, 0, msg.blobs[:1], 3)
    commit_batch(w.config, [first], batch_id=0, writer_id="half-job")
    w.abort([msg])
    assert {p.name for p in _data_files(root)} == {f"{msg.blobs[0].blob}.entries"}
    # The retried batch publishes partition 1 and leaves partition 0 as it was.
    retry = _writer(root, ["value", "key"], topic="half", writerId="half-job")
    retry.commit([retry.write(iter([_batch(value=[k.encode() for k in keys], key=keys)]))])
    assert sorted(_read(store, "half").column("value").to_pylist()) == sorted(
        k.encode() for k in keys
    )


class _FakeTaskContext:
    def __init__(self, props: dict[str, str]) -> None:
        self.props = props

    def partitionId(self) -> int:
        return 1

    def attemptNumber(self) -> int:
        return 2

    def getLocalProperty(self, key: str) -> str | None:
        return self.props.get(key)


def test_stream_writer_takes_the_query_id_from_the_task(
    root: str, store: BlobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    qid = "c816ee3f-3763-405c-a046-a1be2aaafe9c"
    ctx = _FakeTaskContext({sink.QUERY_ID_PROPERTY: qid, sink.BATCH_ID_PROPERTY: "4"})
    monkeypatch.setattr(sink, "_task_context", lambda: ctx)
    opts = {"path": root, "topic": "st", "checkpointLocation": "/chk"}

    def run(batch_id: int, values: list[bytes]) -> None:
        w = FilePulsarStreamWriter(opts, _schema(["value"]), False)
        msg = w.write(iter([_batch(value=values)]))
        assert msg.writer_id == qid and msg.blobs[0].blob.startswith(f"{qid}.4.1.2.")
        # The commit runs in a fresh writer, as PySpark builds one per commit.
        FilePulsarStreamWriter(opts, _schema(["value"]), False).commit([msg], batch_id)

    run(4, [b"a"])
    run(4, [b"a"])  # batch 4 replayed after a restart: no-op
    assert _read(store, "st").column("value").to_pylist() == [b"a"]
    w = FilePulsarStreamWriter(opts, _schema(["value"]), False)
    msg = w.write(iter([_batch(value=[b"b"])]))
    with pytest.raises(Exception, match="staged for batch"):
        w.commit([msg], 5)


def test_stream_writer_id_falls_back_to_the_checkpoint(root: str) -> None:
    cfg = FilePulsarStreamWriter(
        {"path": root, "topic": "t", "checkpointLocation": "/chk/a"}, _schema(["value"]), False
    ).config
    a = sink.stream_writer_id(cfg, _FakeTaskContext({}))
    assert a.startswith("ckpt-") and a == sink.stream_writer_id(cfg, None)
    cfg2 = FilePulsarStreamWriter({"path": root, "topic": "t"}, _schema(["value"]), False).config
    with pytest.raises(InvalidConfiguration, match="writerId"):
        sink.stream_writer_id(cfg2, None)


def test_commit_refuses_mixed_writer_ids(root: str) -> None:
    w = _writer(root, ["value"], topic="mix")
    msg = w.write(iter([_batch(value=[b"a"])]))
    other = SinkCommitMessage("someone-else", 0, 1, 0, (), 0)
    with pytest.raises(Exception, match="writer ids"):
        w.commit([msg, other])


def test_stores_without_append_stage_whole_blobs(monkeypatch: pytest.MonkeyPatch) -> None:
    root = f"memory://sink-{uuid.uuid4().hex}"
    store = open_blob_store(root)
    create_topic(store, "mem", 2)
    monkeypatch.setattr(sink_task, "STAGE_BYTES", 200)  # a new blob after every round
    monkeypatch.setattr(sink_task, "ROUND_ROWS", 50)
    batch = _batch(
        value=[f"m{i}".encode() for i in range(300)], key=[f"k{i % 4}" for i in range(300)]
    )
    rounds = [batch.slice(i, 50) for i in range(0, 300, 50)]
    msgs = _save(root, rounds[:3], rounds[3:], topic="mem")
    assert sum(len(m.blobs) for m in msgs) == 12
    got = _read(store, "mem")
    assert sorted(got.column("value").to_pylist()) == sorted(batch.column("value").to_pylist())
    w = _writer(root, ["value", "key"], topic="mem")
    staged = w.write(iter([batch]))
    w.abort([staged])
    keys = store.list("topics/persistent/public/default")
    assert not [k for k in keys if w.writer_id in k]
    store.delete_prefix("topics")
