"""The Spark source's options and costs users expect from Spark's Kafka source (issue 11):
narrow reads, minMessagesPerTrigger/maxTriggerDelay, endingTime, per-partition startingTime,
the rate limit split by backlog, Kafka's spellings, the backlog in query progress, and what
the driver reads per trigger."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadMaxBytes,
    ReadMaxRows,
    ReadMinRows,
)

from filepulsar.connector.source.batch import FilePulsarBatchReader, backlog_of
from filepulsar.connector.source.options import SourceOptions
from filepulsar.connector.source.stream import FilePulsarStreamReader
from filepulsar.dispatch.clock import SYSTEM, Clock, ManualClock
from filepulsar.storage import Producer, create_topic, open_blob_store, set_topic_policies
from filepulsar.storage.errors import InvalidConfiguration
from tests.test_source import produce

pytestmark = pytest.mark.unit

P0 = "persistent://public/default/t-partition-0"
P1 = "persistent://public/default/t-partition-1"


def _stream(root: str, clock: Clock = SYSTEM, **opts: Any) -> FilePulsarStreamReader:
    return FilePulsarStreamReader({"path": root, **opts}, None, clock=clock)  # type: ignore[arg-type]


def _batch(root: str, **opts: Any) -> FilePulsarBatchReader:
    return FilePulsarBatchReader({"path": root, **opts}, None)  # type: ignore[arg-type]


def _values(reader: Any, parts: list[Any]) -> list[int]:
    return [
        int(v[1:]) for p in parts for b in reader.read(p) for v in b.column("value").to_pylist()
    ]


def _per_partition(reader: Any, parts: list[Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in parts:
        out[p.topic] = out.get(p.topic, 0) + sum(b.num_rows for b in reader.read(p))
    return out


def _two_partitions(root: str, n0: int, n1: int, **kw: Any) -> None:
    """Topic t with 2 partitions holding ``n0`` and ``n1`` messages (values v0.., v1000..)."""
    store = open_blob_store(root)
    create_topic(store, "t", partitions=2)
    for part, n, base in ((P0, n0, 0), (P1, n1, 1000)):
        with Producer(store, part, **kw) as p:
            p.send_table([b"v%d" % (base + i) for i in range(n)])


class _CountingStore:
    """A BlobStore that records the keys it is asked about (gets, ranged gets, existence
    checks, listings)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.reads: list[str] = []

    def get(self, key: str) -> bytes:
        self.reads.append(key)
        return bytes(self._inner.get(key))

    def get_range(self, key: str, start: int, end: int) -> bytes:
        self.reads.append(key)
        return bytes(self._inner.get_range(key, start, end))

    def exists(self, key: str) -> bool:
        self.reads.append(key)
        return bool(self._inner.exists(key))

    def list(self, prefix: str) -> list[str]:
        self.reads.append(prefix)
        return list(self._inner.list(prefix))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def entry_reads(self) -> list[str]:
        return [k for k in self.reads if "/data/" in k]

    def manifest_reads(self) -> list[str]:
        return [k for k in self.reads if "/manifest/" in k]


# --------------------------------------------------------------------------- driver costs


def test_driver_reads_no_entry_and_each_manifest_once_per_trigger(tmp_path: Any) -> None:
    root = str(tmp_path / "root")
    _two_partitions(root, 300, 100, batching_max_messages=50)  # batch entries of 50
    r = _stream(root, topic="t", startingOffsets="earliest")
    counting = _CountingStore(r.store)
    r.store = counting  # type: ignore[assignment]
    start = r.initialOffset()
    counting.reads.clear()
    end = r.latestOffset(start, ReadAllAvailable())
    r.reportLatestOffset()
    parts = r.partitions(start, end)
    assert counting.entry_reads() == []
    # One manifest refresh per partition for the whole trigger (latestOffset, the backlog
    # report and planning): as many store calls as a single refresh of each makes.
    trigger = counting.manifest_reads()
    counting.reads.clear()
    for key in (P0, P1):
        r._streams.mls[key].state()
    assert len(trigger) == len(counting.manifest_reads())
    assert _per_partition(r, parts) == {P0: 300, P1: 100}


def test_rate_limit_is_cut_from_fragment_metadata(tmp_path: Any) -> None:
    """Entries of one message each: the cut is exact without reading an entry."""
    root = str(tmp_path / "root")
    _two_partitions(root, 300, 100, batching_enabled=False)
    r = _stream(root, topic="t", startingOffsets="earliest")
    counting = _CountingStore(r.store)
    r.store = counting  # type: ignore[assignment]
    start = r.initialOffset()
    end = r.latestOffset(start, ReadMaxRows(40))
    parts = r.partitions(start, end)
    assert counting.entry_reads() == []
    assert _per_partition(r, parts) == {P0: 30, P1: 10}  # in proportion to the backlogs


def test_rate_limit_split_by_backlog_exact_inside_batch_entries(tmp_path: Any) -> None:
    root = str(tmp_path / "root")
    _two_partitions(root, 300, 100, batching_max_messages=64)
    r = _stream(root, topic="t", startingOffsets="earliest")
    start = r.initialOffset()
    seen: list[int] = []
    sizes = []
    while True:
        end = r.latestOffset(start, ReadMaxRows(40))
        if end == start:
            break
        parts = r.partitions(start, end)
        got = _per_partition(r, parts)
        sizes.append(got)
        seen += _values(r, parts)
        start = end
    assert sizes[0] == {P0: 30, P1: 10}
    assert all(sum(s.values()) == 40 for s in sizes)
    assert sorted(seen) == list(range(300)) + list(range(1000, 1100))
    # the driver read only fragments a cut fell into (each once), never the whole topic
    assert r._meter.entry_reads <= len(sizes) * 2


def test_max_bytes_per_trigger_reads_no_entry_on_the_driver(tmp_path: Any) -> None:
    root = str(tmp_path / "root")
    _two_partitions(root, 300, 100, batching_max_messages=10)
    r = _stream(root, topic="t", startingOffsets="earliest")
    counting = _CountingStore(r.store)
    r.store = counting  # type: ignore[assignment]
    start = r.initialOffset()
    end = r.latestOffset(start, ReadMaxBytes(2000))
    parts = r.partitions(start, end)
    assert counting.entry_reads() == []
    got = _per_partition(r, parts)
    assert 0 < sum(got.values()) < 400
    assert got[P0] >= got.get(P1, 0)


# --------------------------------------------------------------------------- minimum per trigger


def test_min_messages_per_trigger_waits_for_enough_or_the_delay(tmp_path: Any) -> None:
    root = str(tmp_path / "root")
    produce(root, "m", 30)
    clock = ManualClock()
    r = _stream(
        root,
        clock,
        topic="m",
        startingOffsets="earliest",
        minMessagesPerTrigger=100,
        maxTriggerDelay="1h",
    )
    limit = r.getDefaultReadLimit()
    assert limit == ReadMinRows(100)
    start = r.initialOffset()
    first = r.latestOffset(start, limit)  # the first trigger of a query does not wait
    assert _values(r, r.partitions(start, first)) == list(range(30))
    produce(root, "m", 30, start=30)
    clock.advance(60_000)
    assert r.latestOffset(first, limit) == first  # 30 < 100 and 1 min < 1 h: wait
    produce(root, "m", 80, start=60)
    clock.advance(60_000)
    second = r.latestOffset(first, limit)  # 110 >= 100
    assert _values(r, r.partitions(first, second)) == list(range(30, 140))
    produce(root, "m", 5, start=140)
    clock.advance(3_599_000)
    assert r.latestOffset(second, limit) == second
    clock.advance(1_000)  # an hour since the last batch
    third = r.latestOffset(second, limit)
    assert _values(r, r.partitions(second, third)) == list(range(140, 145))


def test_min_with_max_messages_per_trigger_in_spark(spark: Any, tmp_path: Any) -> None:
    """Spark hands the minimum back as the limit; the maximum comes from the options, and
    AvailableNow reads everything without waiting for the minimum (the last batch of 10)."""
    from tests.test_source import run_stream

    root = str(tmp_path / "root")
    produce(root, "mm", 250, batching_max_messages=100)
    rows, sizes = run_stream(
        spark,
        root,
        str(tmp_path / "ck"),
        topic="mm",
        startingOffsets="earliest",
        minOffsetsPerTrigger=50,
        maxOffsetsPerTrigger=60,
    )
    assert sizes == [60, 60, 60, 60, 10]
    assert sorted(int(r.value[1:]) for r in rows) == list(range(250))


def test_min_and_delay_options_are_checked(tmp_path: Any) -> None:
    root = str(tmp_path)
    base = {"path": root, "topic": "x"}
    with pytest.raises(InvalidConfiguration, match=r"maxTriggerDelay.*minMessagesPerTrigger"):
        SourceOptions.parse({**base, "maxTriggerDelay": "5s"}, streaming=True)
    with pytest.raises(InvalidConfiguration, match="duration"):
        SourceOptions.parse(
            {**base, "minMessagesPerTrigger": "5", "maxTriggerDelay": "soon"}, streaming=True
        )
    with pytest.raises(InvalidConfiguration, match="more than"):
        SourceOptions.parse(
            {**base, "minMessagesPerTrigger": "50", "maxMessagesPerTrigger": "5"}, streaming=True
        )
    with pytest.raises(InvalidConfiguration, match="streaming"):
        SourceOptions.parse({**base, "minMessagesPerTrigger": "5"}, streaming=False)
    # with a minimum, the maximum in bytes still caps each batch
    produce(root, "x", 50, batching_enabled=False)
    r = _stream(root, topic="x", startingOffsets="earliest", minMessagesPerTrigger=5)
    r2 = _stream(
        root, topic="x", startingOffsets="earliest", minMessagesPerTrigger=5, maxBytesPerTrigger=1
    )
    start = r.initialOffset()
    assert len(_values(r, r.partitions(start, r.latestOffset(start, ReadMinRows(5))))) == 50
    start = r2.initialOffset()
    assert len(_values(r2, r2.partitions(start, r2.latestOffset(start, ReadMinRows(5))))) == 1
    o = SourceOptions.parse(
        {**base, "minMessagesPerTrigger": "5", "maxTriggerDelay": "15m"}, streaming=True
    )
    assert o.max_trigger_delay_ms == 15 * 60 * 1000
    o = SourceOptions.parse(
        {**base, "minMessagesPerTrigger": "5", "maxTriggerDelay": "250"}, streaming=True
    )
    assert o.max_trigger_delay_ms == 250


# --------------------------------------------------------------------------- time bounds


def _publish_times(spark: Any, root: str) -> list[tuple[str, int, int]]:
    """(partition topic, value number, publish time ms) of every message of t."""
    df = spark.read.format("filepulsar").option("topic", "t").load(root)
    out = []
    for row in df.select("partition", "value", "publishTime").collect():
        pt = int(row.publishTime.timestamp() * 1000 + 0.5)
        out.append((P0 if row.partition == 0 else P1, int(row.value[1:]), pt))
    return out


def test_ending_time_and_per_partition_starting_time(spark: Any, tmp_path: Any) -> None:
    root = str(tmp_path / "root")
    store = open_blob_store(root)
    create_topic(store, "t", partitions=2)
    for k in range(6):  # six commits per partition, publish times increasing
        for part, base in ((P0, 0), (P1, 1000)):
            with Producer(store, part, batching_enabled=False) as p:
                p.send_table([b"v%d" % (base + k * 10 + i) for i in range(10)])
    msgs = _publish_times(spark, root)
    times = sorted({t for _, _, t in msgs})
    cut = times[len(times) // 2]
    got = _values(r := _batch(root, topic="t", endingTime=cut), r.partitions())
    assert sorted(got) == sorted(v for _, v, t in msgs if t < cut)
    assert got, "the cut falls inside the topic"
    # Kafka's spelling of the same option
    got2 = _values(r := _batch(root, topic="t", endingTimestamp=cut), r.partitions())
    assert sorted(got2) == sorted(got)
    # per-partition start times: partition 0 from the cut, partition 1 from the beginning
    spec = json.dumps({P0: cut, P1: 0})
    got = _values(r := _batch(root, topic="t", startingTime=spec), r.partitions())
    want = [v for p, v, t in msgs if (p == P0 and t >= cut) or p == P1]
    assert sorted(got) == sorted(want)
    # the same JSON starts a stream
    s = _stream(root, topic="t", startingTimestamp=spec)
    start = s.initialOffset()
    end = s.latestOffset(start, ReadAllAvailable())
    assert sorted(_values(s, s.partitions(start, end))) == sorted(want)
    # every partition must be named, as for startingOffsets
    with pytest.raises(InvalidConfiguration, match="every partition"):
        _batch(root, topic="t", startingTime=json.dumps({P0: cut})).partitions()
    with pytest.raises(InvalidConfiguration, match="batch reads only"):
        SourceOptions.parse({"path": root, "topic": "t", "endingTime": "5"}, streaming=True)


# --------------------------------------------------------------------------- Kafka's spellings


def test_kafka_spellings_are_aliases(tmp_path: Any) -> None:
    root = str(tmp_path)
    base = {"path": root}

    def parse(**o: Any) -> SourceOptions:
        return SourceOptions.parse({**base, **o}, streaming=True)

    assert parse(topic="x", maxOffsetsPerTrigger="7").max_messages == 7
    assert parse(topic="x", minOffsetsPerTrigger="7").min_messages == 7
    assert parse(topic="x", startingTimestamp="12").starting_time == 12
    assert parse(subscribe="a, b").topics == parse(topics="a,b").topics
    assert parse(subscribePattern="a.*").pattern == "a.*"
    with pytest.raises(InvalidConfiguration, match="one option"):
        parse(topic="x", maxOffsetsPerTrigger="7", maxMessagesPerTrigger="7")
    with pytest.raises(InvalidConfiguration, match="one option"):
        parse(topic="x", startingTime="1", startingTimestamp="1")


# --------------------------------------------------------------------------- narrow reads


def test_user_schema_and_columns_option_narrow_the_read(spark: Any, tmp_path: Any) -> None:
    root = str(tmp_path / "root")
    produce(root, "nr", 120, batching_max_messages=50)
    # streaming, user schema (its order, its nullability)
    q = (
        spark.readStream.format("filepulsar")
        .schema("publishTime timestamp, value binary, key string")
        .option("topic", "nr")
        .option("startingOffsets", "earliest")
        .load(root)
        .writeStream.format("memory")
        .queryName("narrow_schema")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    df = spark.table("narrow_schema")
    assert df.columns == ["publishTime", "value", "key"]
    rows = df.collect()
    assert sorted(int(r.value[1:]) for r in rows) == list(range(120))
    assert {r.key for r in rows} == {f"k{i}" for i in range(7)}
    # batch, the columns option
    df = (
        spark.read.format("filepulsar")
        .option("topic", "nr")
        .option("columns", "value,messageId")
        .load(root)
    )
    assert df.columns == ["value", "messageId"]
    got = df.collect()
    assert len(got) == 120 and all(r.messageId.count(":") >= 2 for r in got)
    # the reader emits only those columns
    r = _batch(root, topic="nr", columns="key,value")
    b = next(iter(r.read(r.partitions()[0])))
    assert b.schema.names == ["key", "value"]


def _mixed_topic(root: str) -> None:
    """Topic ``mx`` (2 partitions) with what a narrow read could get wrong: null and present
    keys, ordering keys, properties, event times and explicit sequence ids on some messages
    only; batched LZ4 entries, non-batched ZSTD entries with delivery times, chunked
    messages; entries of different stored columns back to back."""
    store = open_blob_store(root)
    create_topic(store, "mx", partitions=2)
    set_topic_policies(store, "mx", max_message_size=1000)
    with Producer(store, "mx", batching_max_messages=16, compression_type="LZ4") as p:
        for i in range(100):
            p.send_async(
                b"b%d" % i,
                partition_key=None if i % 3 == 0 else f"k{i % 5}",
                ordering_key=b"o%d" % i if i % 4 == 0 else None,
                properties={"i": str(i)} if i % 2 == 0 else None,
                event_timestamp=1_600_000_000_000 + i if i % 5 else None,
                sequence_id=10_000 + i if 40 <= i < 60 else None,
            )
    with Producer(store, "mx", batching_enabled=False, compression_type="ZSTD") as p:
        for i in range(20):
            p.send(
                b"n%d" % i,
                partition_key=None if i % 2 else "nk",
                properties={"n": str(i)} if i % 3 == 0 else None,
                deliver_at=1_700_000_000_000 + i if i % 4 == 0 else None,
            )
    with Producer(store, "mx", batching_enabled=False, chunking_enabled=True) as p:
        for i in range(6):
            p.send(bytes([i]) * 2500 if i % 2 == 0 else b"c%d" % i, properties={"c": str(i)})


def _rows(reader: Any, parts: list[Any]) -> list[Any]:
    return [b for p in parts for b in reader.read(p)]


def _as_columns(batches: list[Any], names: list[str]) -> dict[str, list[Any]]:
    return {n: [v for b in batches for v in b.column(n).to_pylist()] for n in names}


def test_narrow_read_equals_the_full_read_column_for_column(tmp_path: Any) -> None:
    """Every column read alone, the benchmark's three and other subsets equal the full read's
    values, batch and streaming (triggers cut inside batch entries), with a property filter."""
    from filepulsar.connector.schema import SOURCE_SCHEMA

    root = str(tmp_path / "root")
    _mixed_topic(root)
    full_reader = _batch(root, topic="mx", maxEntriesPerPartition=3)
    full = _rows(full_reader, full_reader.partitions())
    names = [f.name for f in SOURCE_SCHEMA.fields]
    assert full[0].schema.names == names
    everything = _as_columns(full, names)
    assert len(everything["value"]) == 126
    assert None in everything["key"] and None in everything["properties"]
    assert any(v is not None and len(v) == 2500 for v in everything["value"])  # chunked
    subsets = [[n] for n in names] + [
        ["value", "key", "publishTime"],
        ["properties", "eventTime"],
        ["redeliveryCount", "topic"],
        ["sequenceId", "messageId", "deliverAt", "producerName"],
    ]
    for cols in subsets:
        r = _batch(root, topic="mx", maxEntriesPerPartition=3, columns=",".join(cols))
        got = _rows(r, r.partitions())
        assert all(b.schema.names == cols for b in got), cols
        assert _as_columns(got, cols) == {n: everything[n] for n in cols}, cols

    def stream(**opts: Any) -> list[Any]:
        r = _stream(root, topic="mx", startingOffsets="earliest", **opts)
        start, out = r.initialOffset(), []
        while (end := r.latestOffset(start, ReadMaxRows(7))) != start:
            out += _rows(r, r.partitions(start, end))
            start = end
        return out

    full_stream = _as_columns(stream(), names)
    assert sorted(full_stream["value"]) == sorted(everything["value"])
    for cols in (["publishTime"], ["properties"], ["value", "key", "publishTime"]):
        got = _as_columns(stream(columns=",".join(cols)), cols)
        assert got == {n: full_stream[n] for n in cols}, cols
    # A property filter looks at properties that the read does not emit.
    filt = {"propertyFilter": json.dumps({"i": ["0", "2", "4"]})}
    want = [
        v
        for v, p in zip(everything["value"], everything["properties"])
        if p and dict(p).get("i") in ("0", "2", "4")
    ]
    got = _as_columns(stream(columns="value", **filt), ["value"])["value"]
    assert sorted(got) == sorted(want) and len(want) == 3


def test_narrow_read_errors_name_the_column(spark: Any, tmp_path: Any) -> None:
    root = str(tmp_path / "root")
    produce(root, "ne", 3)
    with pytest.raises(Exception, match=r"payload.*not a source column"):
        spark.read.format("filepulsar").schema("payload binary").option("topic", "ne").load(
            root
        ).collect()
    with pytest.raises(Exception, match=r"key binary; the source.s key is string"):
        spark.read.format("filepulsar").schema("key binary").option("topic", "ne").load(
            root
        ).collect()
    with pytest.raises(InvalidConfiguration, match=r"'columns'.*nope"):
        SourceOptions.parse({"path": root, "topic": "ne", "columns": "value,nope"}, streaming=None)


# --------------------------------------------------------------------------- backlog


def test_backlog_in_progress_is_what_each_batch_left(spark: Any, tmp_path: Any) -> None:
    root = str(tmp_path / "root")
    _two_partitions(root, 150, 100, batching_max_messages=20)
    ckpt = str(tmp_path / "ck")

    def run() -> Any:
        q = (
            spark.readStream.format("filepulsar")
            .option("topic", "t")
            .option("startingOffsets", "earliest")
            .option("maxMessagesPerTrigger", 60)
            .load(root)
            .writeStream.format("noop")
            .option("checkpointLocation", ckpt)
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()
        return q

    q = run()
    batches = [p for p in q.recentProgress if p["numInputRows"]]
    assert [p["numInputRows"] for p in batches] == [60, 60, 60, 60, 10]
    backlogs = [backlog_of(p) for p in batches]
    assert [b["messages"] for b in backlogs] == [190, 130, 70, 10, 0]  # type: ignore[index]
    last = backlog_of(q.lastProgress)
    assert last == {"messages": 0, "partitions": {P0: 0, P1: 0}}
    assert backlog_of(batches[0])["partitions"] == {P0: 114, P1: 76}  # type: ignore[index]
    # restart: the backlog does not disturb the checkpointed offsets
    store = open_blob_store(root)
    with Producer(store, P1) as p:
        p.send_table([b"v%d" % i for i in range(2000, 2025)])
    q = run()
    batches = [p for p in q.recentProgress if p["numInputRows"]]
    assert [p["numInputRows"] for p in batches] == [25]
    assert backlog_of(q.lastProgress) == {"messages": 0, "partitions": {P0: 0, P1: 0}}
    assert backlog_of(None) is None


def test_a_batch_range_orders_message_ids_as_pulsar_does() -> None:
    """The start/end check of a batch read compares message ids by MessageId's own order
    (Pulsar's: ledger, entry, partition, batch index, a non-batched id before batch index 0)
    rather than an order of its own."""
    from filepulsar.connector.source.offsets import check_start_not_after_end
    from filepulsar.storage.errors import InvalidConfiguration
    from filepulsar.storage.messageid import MessageId

    key = "persistent://public/default/t"
    for start, end in [("0:3:0", "0:3:0:0"), ("0:3:0:1", "0:3:0:2"), ("0:3:0", "0:3:0")]:
        assert MessageId.parse(start) <= MessageId.parse(end)
        check_start_not_after_end(key, start, end)  # in order: no error
    for start, end in [("0:3:0:0", "0:3:0"), ("0:3:0:2", "0:3:0:1"), ("1:0:0", "0:9:0")]:
        assert MessageId.parse(start) > MessageId.parse(end)
        with pytest.raises(InvalidConfiguration, match=f"startingOffsets {start} of {key}"):
            check_start_not_after_end(key, start, end)


#: The offsets main's code (the list form, before PartitionOffset) wrote in triggers 4 to 10 of
#: a maxMessagesPerTrigger=40 stream over ``_two_partitions(root, 300, 100,
#: batching_max_messages=64)``, resumed from its trigger 3 end ``[[0, 1, 26], [0, 0, 30]]``
#: (each followed by the topic's incarnation, which differs per run).
MAIN_OFFSETS = [
    ([0, 1, 56], [0, 0, 40]),
    ([0, 2, 22], [0, 0, 50]),
    ([0, 2, 52], [0, 0, 60]),
    ([0, 3, 18], [0, 1, 6]),
    ([0, 3, 48], [0, 1, 16]),
    ([0, 4, 14], [0, 1, 26]),
    ([0, 4, -1], [0, 1, -1]),
]


@pytest.mark.parametrize("incarnation", [True, False], ids=["with-incarnation", "before-them"])
def test_a_checkpoint_from_the_list_form_resumes_the_same(tmp_path: Any, incarnation: bool) -> None:
    """The checkpoint's offset JSON is unchanged by typed offsets: a stream resumed from an
    offset main's code wrote (through JSON text, as Spark hands it over) writes the same
    offsets main's code wrote next, and reads exactly the messages after it."""
    root = str(tmp_path / "root")
    _two_partitions(root, 300, 100, batching_max_messages=64)
    r = _stream(root, topic="t", startingOffsets="earliest")
    inc = r.initialOffset()[P0][3]
    tail = [inc] if incarnation else []
    start = json.loads(json.dumps({P0: [0, 1, 26, *tail], P1: [0, 0, 30, *tail]}))
    written, seen = [], []
    while (end := json.loads(json.dumps(r.latestOffset(start, ReadMaxRows(40))))) != start:
        written.append((end[P0], end[P1]))
        seen += _values(r, r.partitions(start, end))
        start = end
    assert written == [([*a, inc], [*b, inc]) for a, b in MAIN_OFFSETS]
    assert sorted(seen) == [*range(90, 300), *range(1030, 1100)]
