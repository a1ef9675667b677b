"""The storage contract, run on every backend (local, memory, S3 on a moto server)."""

from __future__ import annotations

import threading
from typing import Any

import pyarrow as pa
import pytest

from filepulsar.dispatch.routing import partition_for_key
from filepulsar.storage import (
    Codec,
    InvalidConfiguration,
    ManagedLedger,
    MessageId,
    MessageTooBig,
    Producer,
    ProducerBusy,
    ProducerFenced,
    Reader,
    Result,
    TopicAlreadyExists,
    TopicName,
    TopicNotFound,
    create_topic,
    delete_topic,
    list_topics,
    partitions_of,
    set_namespace_policies,
    set_topic_policies,
)
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.commit import PendingEntry
from filepulsar.storage.entry import ChunkInfo
from filepulsar.storage.entry_encode import encode_entry_parts
from filepulsar.storage.ledger import EARLIEST
from tests.conftest import s3_once

pytestmark = pytest.mark.contract


def read_all(store: BlobStore, topic: str, **kw: Any) -> pa.Table:
    r = Reader(store, topic, **kw)
    parts = []
    while True:
        t = r.read_batch(max_entries=1000, timeout_ms=0)
        if not t.num_rows:
            break
        parts.append(t)
    return pa.concat_tables(parts) if parts else t


def test_create_list_delete(blob_store: BlobStore) -> None:
    create_topic(blob_store, "plain")
    create_topic(blob_store, "persistent://public/default/parts", partitions=3)
    with pytest.raises(TopicAlreadyExists):
        create_topic(blob_store, "plain")
    with pytest.raises(TopicAlreadyExists):
        create_topic(blob_store, "parts", partitions=2)
    assert partitions_of(blob_store, "plain") == 0
    assert partitions_of(blob_store, "parts") == 3
    assert partitions_of(blob_store, "missing") is None
    names = {(str(i.name), i.partitions) for i in list_topics(blob_store)}
    assert names == {
        ("persistent://public/default/plain", 0),
        ("persistent://public/default/parts", 3),
    }
    delete_topic(blob_store, "parts")
    assert partitions_of(blob_store, "parts") is None
    assert partitions_of(blob_store, "parts-partition-0") is None
    assert [str(i.name) for i in list_topics(blob_store)] == ["persistent://public/default/plain"]
    with pytest.raises(TopicNotFound):
        delete_topic(blob_store, "parts")


def test_auto_creation_follows_policy(blob_store: BlobStore) -> None:
    set_namespace_policies(blob_store, "public", "default", allow_auto_topic_creation=False)
    with pytest.raises(TopicNotFound):
        Producer(blob_store, "nope")
    set_namespace_policies(
        blob_store,
        "public",
        "default",
        allow_auto_topic_creation=True,
        auto_topic_creation_type="partitioned",
        default_num_partitions=2,
    )
    with Producer(blob_store, "auto") as p:
        p.send(b"x")
    assert partitions_of(blob_store, "auto") == 2


def test_send_and_read_back_all_fields(blob_store: BlobStore) -> None:
    with Producer(blob_store, "fields", batching_max_publish_delay_ms=1000) as p:
        ids: list[Any] = []

        def cb(res: Result, mid: MessageId | None) -> None:
            ids.append((res, mid))

        p.send_async(b"a", cb)
        p.send_async(
            b"b",
            cb,
            properties={"k": "v", "tag": "x"},
            partition_key="key-1",
            ordering_key=b"ok",
            event_timestamp=1234,
        )
        p.send_async(b"c", cb, sequence_id=100)
        p.flush()
        last = p.send(b"d")
    t = read_all(blob_store, "fields")
    rows = t.to_pylist()
    assert [r["value"] for r in rows] == [b"a", b"b", b"c", b"d"]
    assert rows[1]["properties"] == [("k", "v"), ("tag", "x")]
    assert rows[1]["key"] == "key-1" and rows[1]["ordering_key"] == b"ok"
    assert rows[1]["event_time"] == 1234 and rows[0]["event_time"] is None
    assert [r["sequence_id"] for r in rows] == [0, 1, 100, 2]
    assert all(r["producer_name"] == p.producer_name for r in rows)
    assert [res for res, _ in ids] == [Result.Ok] * 3
    # The first three were one batch entry; "d" was flushed by send() into the next entry.
    mids = [mid for _, mid in ids] + [last]
    assert [m.batch_index for m in mids] == [0, 1, 2, 0]
    assert mids[0].entry_id == mids[1].entry_id == mids[2].entry_id != mids[3].entry_id
    assert mids == sorted(mids)
    got = [MessageId(r["partition"], r["ledger_id"], r["entry_id"], r["batch_index"]) for r in rows]
    assert got == mids


@s3_once("codec", list(Codec))  # the store sees compressed bytes, whichever codec made them
def test_compression_round_trip(blob_store: BlobStore, codec: Codec) -> None:
    values = [(b"payload-%d-" % i) * (i % 7 + 1) for i in range(500)]
    with Producer(
        blob_store, f"comp-{codec.name}", compression_type=codec, batching_max_messages=128
    ) as p:
        for v in values:
            p.send_async(v)
    assert read_all(blob_store, f"comp-{codec.name}").column("value").to_pylist() == values


def test_non_batched_and_delayed_messages(blob_store: BlobStore) -> None:
    with Producer(blob_store, "nobatch", batching_enabled=False) as p:
        a = p.send(b"one")
        b = p.send(b"two")
    assert a.batch_index == -1 and b.entry_id == a.entry_id + 1
    with Producer(blob_store, "delayed", batching_max_publish_delay_ms=1000) as p:
        p.send_async(b"now-1")
        p.send_async(b"later", deliver_at=9_999_999_999_999)
        p.send_async(b"now-2")
        p.flush()
    rows = read_all(blob_store, "delayed").to_pylist()
    later = next(r for r in rows if r["value"] == b"later")
    assert later["deliver_at"] == 9_999_999_999_999 and later["batch_index"] == -1
    assert {r["entry_id"] for r in rows if r["value"] != b"later"} != {later["entry_id"]}


def test_key_based_batching_groups_by_key(blob_store: BlobStore) -> None:
    with Producer(
        blob_store, "kb", batching_type="KeyBased", batching_max_publish_delay_ms=1000
    ) as p:
        for i in range(30):
            p.send_async(b"%d" % i, partition_key=f"k{i % 3}")
    rows = read_all(blob_store, "kb").to_pylist()
    by_entry: dict[tuple[int, int], set[str]] = {}
    for r in rows:
        by_entry.setdefault((r["ledger_id"], r["entry_id"]), set()).add(r["key"])
    assert all(len(keys) == 1 for keys in by_entry.values())
    for k in ("k0", "k1", "k2"):
        vals = [int(r["value"]) for r in rows if r["key"] == k]
        assert vals == sorted(vals) and len(vals) == 10


def test_chunking_reassembles_large_message(blob_store: BlobStore) -> None:
    set_topic_policies(blob_store, "big", max_message_size=1000)
    create_topic(blob_store, "big")
    payload = bytes(range(256)) * 17  # 4352 bytes → 5 chunks
    with (
        Producer(blob_store, "big", batching_max_publish_delay_ms=1000) as p,
        pytest.raises(MessageTooBig, match="max message size 1000"),
    ):
        p.send(payload)
    with pytest.raises(InvalidConfiguration, match="batching"):
        Producer(blob_store, "big", chunking_enabled=True)
    with Producer(blob_store, "big", chunking_enabled=True, batching_enabled=False) as p:
        p.send(b"small")
        mid = p.send(payload, properties={"p": "1"})
        p.send(b"after")
    rows = read_all(blob_store, "big").to_pylist()
    assert [r["value"] for r in rows] == [b"small", payload, b"after"]
    assert rows[1]["properties"] == [("p", "1")]
    assert MessageId(-1, rows[1]["ledger_id"], rows[1]["entry_id"]) == mid
    assert mid.entry_id == 5  # small=0, chunks 1..5


def test_partitioned_routing_by_key(blob_store: BlobStore) -> None:
    create_topic(blob_store, "routed", partitions=4)
    keys = [f"user-{i}" for i in range(40)]
    with Producer(blob_store, "routed") as p:
        mids = [p.send(b"v", partition_key=k) for k in keys]
        for _ in range(40):
            p.send_async(b"keyless")
    for k, m in zip(keys, mids):
        assert m.partition == partition_for_key(k, 4, "JavaStringHash")
    rows = read_all(blob_store, "routed").to_pylist()
    assert len(rows) == 80
    for r in rows:
        if r["key"] is not None:
            assert r["partition"] == partition_for_key(r["key"], 4, "JavaStringHash")
    with Producer(blob_store, "routed", hashing_scheme="Murmur3_32Hash") as p:
        m = p.send(b"v", partition_key="abc")
    assert m.partition == partition_for_key("abc", 4, "Murmur3_32Hash")


def test_ledger_rollover_and_closed_ledgers(blob_store: BlobStore) -> None:
    set_topic_policies(blob_store, "roll", ledger_max_entries=5)
    with Producer(blob_store, "roll", batching_enabled=False) as p:
        for i in range(23):
            p.send_async(b"%d" % i)
            if i % 3 == 0:
                p.flush()
    ml = ManagedLedger(blob_store, TopicName.parse("roll"))
    state = ml.state()
    assert len(state.ledgers) >= 4
    assert all(not lg.is_open for lg in state.ledgers[:-1])
    assert sum(lg.entries for lg in state.ledgers) == 23
    rows = read_all(blob_store, "roll").to_pylist()
    assert [int(r["value"]) for r in rows] == list(range(23))
    ids = [(r["ledger_id"], r["entry_id"]) for r in rows]
    assert ids == sorted(ids) and len(set(r["ledger_id"] for r in rows)) >= 4


def test_dedup_drops_duplicates_and_survives_restart(blob_store: BlobStore) -> None:
    set_topic_policies(blob_store, "dd", deduplication_enabled=True)
    with Producer(blob_store, "dd", producer_name="writer") as p:
        for i in range(5):
            p.send(b"m%d" % i, sequence_id=i)
        assert p.send(b"dup", sequence_id=3) == MessageId(-1, -1, -1)
    with Producer(blob_store, "dd", producer_name="writer") as p:
        assert p.last_sequence_id == 4  # continues after the persisted highest
        assert p.send(b"again", sequence_id=4) == MessageId(-1, -1, -1)
        assert p.send(b"next").ledger_id >= 0
    rows = read_all(blob_store, "dd").to_pylist()
    assert [r["value"] for r in rows] == [b"m0", b"m1", b"m2", b"m3", b"m4", b"next"]
    assert rows[-1]["sequence_id"] == 5


def test_dedup_drops_a_resent_chunked_message_whole(blob_store: BlobStore) -> None:
    """Chunk headers carry -1 but on the last chunk (the cutter's rule): a re-sent chunked
    message is still dropped, all its chunks, by the id of its last (``send`` and
    ``send_table`` alike)."""
    set_topic_policies(blob_store, "ddchunk", deduplication_enabled=True, max_message_size=100)
    payload = bytes(range(250))  # 3 chunks
    opts: dict[str, Any] = {"chunking_enabled": True, "batching_enabled": False}
    with Producer(blob_store, "ddchunk", producer_name="w", **opts) as p:
        first = p.send(payload, sequence_id=7)
        assert p.send(payload, sequence_id=7) == MessageId(-1, -1, -1)
    with Producer(blob_store, "ddchunk", producer_name="w", **opts) as p:
        assert p.send(payload, sequence_id=7) == MessageId(-1, -1, -1)
        again = p.send_table(pa.table({"value": [payload], "sequence_id": [7]}))
        assert again.column("ledger_id").to_pylist() == [-1]
        p.send(b"next")
    ml = ManagedLedger(blob_store, TopicName.parse("ddchunk"))
    headers = [e.raw.header for e in ml.read_entries(ml.state(), EARLIEST)]
    assert [(h.sequence_id, h.chunk.chunk_id if h.chunk else None) for h in headers] == [
        (-1, 0),
        (-1, 1),
        (7, 2),
        (8, None),
    ]
    rows = read_all(blob_store, "ddchunk").to_pylist()
    assert [r["value"] for r in rows] == [payload, b"next"]
    assert MessageId(-1, rows[0]["ledger_id"], rows[0]["entry_id"]) == first


def test_chunks_with_the_id_in_every_header_still_read_and_dedup(blob_store: BlobStore) -> None:
    """Chunks as ``send_async`` wrote them before it took the cutter's rules (the message's
    sequence id in every chunk header): they still reassemble, and a re-send of the message
    is still dropped whole."""
    set_topic_policies(blob_store, "oldchunks", deduplication_enabled=True, max_message_size=100)
    payload = bytes(range(250))
    opts: dict[str, Any] = {"chunking_enabled": True, "batching_enabled": False}
    with Producer(blob_store, "oldchunks", producer_name="w", **opts) as p:
        old = []
        for cid in range(3):
            piece = pa.record_batch([pa.array([payload[cid * 100 : (cid + 1) * 100]])], ["value"])
            parts = encode_entry_parts(
                piece,
                producer_name="w",
                publish_time=1_700_000_000_000,
                batched=False,
                chunk=ChunkInfo("w-7", cid, 3, len(payload)),
                first_sequence_id=7,
            )
            old.append(PendingEntry.of(parts, 1, 1_700_000_000_000, "w", 7, 7))
        p._parts[0].writer.append(old, dedup=True, follows=[False, True, True])
    with Producer(blob_store, "oldchunks", producer_name="w", **opts) as p:
        assert p.last_sequence_id == 7
        assert p.send(payload, sequence_id=7) == MessageId(-1, -1, -1)
        p.send(b"next")
    ml = ManagedLedger(blob_store, TopicName.parse("oldchunks"))
    headers = [e.raw.header for e in ml.read_entries(ml.state(), EARLIEST)]
    assert [h.sequence_id for h in headers] == [7, 7, 7, 8]
    rows = read_all(blob_store, "oldchunks").to_pylist()
    assert [r["value"] for r in rows] == [payload, b"next"]
    assert rows[0]["sequence_id"] == 7


def test_a_null_value_with_too_many_property_bytes_is_too_big(blob_store: BlobStore) -> None:
    """The size rule counts key and property bytes for a null value too (send and
    send_table alike), and chunking cannot split them."""
    set_topic_policies(blob_store, "nullbig", max_message_size=100)
    big = {"k": "v" * 200}
    props = pa.map_(pa.string(), pa.string())
    table = pa.table(
        {"value": pa.array([None], pa.binary()), "properties": pa.array([list(big.items())], props)}
    )
    for opts in ({}, {"chunking_enabled": True, "batching_enabled": False}):
        with Producer(blob_store, "nullbig", **opts) as p:
            with pytest.raises(MessageTooBig, match="max message size 100"):
                p.send(None, properties=big)
            with pytest.raises(MessageTooBig, match="max message size 100"):
                p.send_table(table)
    assert read_all(blob_store, "nullbig").num_rows == 0


def test_access_modes(blob_store: BlobStore) -> None:
    create_topic(blob_store, "acc")
    shared = Producer(blob_store, "acc", producer_name="s1")
    with pytest.raises(ProducerBusy, match="existing shared producers"):
        Producer(blob_store, "acc", access_mode="Exclusive")
    with pytest.raises(ProducerBusy, match="already connected"):
        Producer(blob_store, "acc", producer_name="s1")
    shared.close()
    ex = Producer(blob_store, "acc", producer_name="ex", access_mode="Exclusive")
    with pytest.raises(ProducerFenced, match="exclusive producer: ex"):
        Producer(blob_store, "acc")
    acquired = threading.Event()
    waiter: list[Producer] = []

    def wait_for_exclusive() -> None:
        waiter.append(
            Producer(blob_store, "acc", producer_name="w", access_mode="WaitForExclusive")
        )
        acquired.set()

    th = threading.Thread(target=wait_for_exclusive)
    th.start()
    assert not acquired.is_set()
    ex.send(b"from-ex")
    ex.close()
    th.join(timeout=30)
    assert acquired.is_set()
    waiter[0].send(b"from-w")
    waiter[0].close()
    assert read_all(blob_store, "acc").column("value").to_pylist() == [b"from-ex", b"from-w"]


def test_exclusive_takeover_fences_the_old_producer(blob_store: BlobStore) -> None:
    """A producer whose lease lapsed is fenced once an exclusive producer takes over."""
    now = [1_000_000]
    create_topic(blob_store, "fence")
    set_topic_policies(blob_store, "fence", producer_lease_ms=60_000)
    old = Producer(blob_store, "fence", producer_name="old", clock=lambda: now[0])
    old.send(b"1")
    # old's lease lapses: it renews every lease/3 of real time (20 s), so no renewal lands
    # while the test runs, even on a loaded machine or S3; the clock's jump is a producer
    # that stopped renewing (e.g. a long GC pause). A 1 s lease raced real renewals.
    now[0] += 120_000
    new = Producer(
        blob_store, "fence", producer_name="new", access_mode="Exclusive", clock=lambda: now[0]
    )
    with pytest.raises(ProducerFenced):
        old.send(b"2")
    old.close()  # a fenced producer is still open until closed (its queue on the I/O thread)
    new.send(b"3")
    new.close()
    assert read_all(blob_store, "fence").column("value").to_pylist() == [b"1", b"3"]


def test_shared_producers_interleave(blob_store: BlobStore) -> None:
    create_topic(blob_store, "multi")
    producers = [Producer(blob_store, "multi", batching_max_messages=7) for _ in range(3)]

    def run(p: Producer, tag: int) -> None:
        for i in range(60):
            p.send_async(b"%d:%d" % (tag, i))
            if i % 10 == 9:
                p.flush()
        p.close()

    threads = [threading.Thread(target=run, args=(p, i)) for i, p in enumerate(producers)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    rows = read_all(blob_store, "multi").to_pylist()
    assert len(rows) == 180
    for tag in range(3):
        mine = [int(r["value"].split(b":")[1]) for r in rows if r["value"].startswith(b"%d:" % tag)]
        assert mine == list(range(60))  # each producer's order is kept


def test_reader_seek_and_tail(blob_store: BlobStore) -> None:
    now = [1_000_000]
    with Producer(blob_store, "seek", batching_enabled=False, clock=lambda: now[0]) as p:
        mids = []
        for i in range(10):
            mids.append(p.send(b"%d" % i))
            now[0] += 1000
    r = Reader(blob_store, "seek", mids[4])
    assert r.read_batch(100).column("value").to_pylist() == [b"%d" % i for i in range(5, 10)]
    r = Reader(blob_store, "seek", mids[4], start_message_id_inclusive=True)
    assert r.read_batch(100).column("value").to_pylist()[0] == b"4"
    r.seek(1_000_000 + 7000)
    assert r.read_batch(100).column("value").to_pylist() == [b"7", b"8", b"9"]
    r = Reader(blob_store, "seek", MessageId.latest)
    assert not r.has_message_available()
    assert r.read_batch(10, timeout_ms=0).num_rows == 0
    with Producer(blob_store, "seek") as p:
        p.send(b"new")
    assert r.has_message_available()
    assert r.read_batch(10).column("value").to_pylist() == [b"new"]


def test_reader_sees_only_committed_prefixes(blob_store: BlobStore) -> None:
    create_topic(blob_store, "live")
    stop = threading.Event()
    seen: list[int] = []

    def consume() -> None:
        r = Reader(blob_store, "live")
        while not stop.is_set() or r.has_message_available():
            for v in r.read_batch(50, timeout_ms=5).column("value").to_pylist():
                seen.append(int(v))

    th = threading.Thread(target=consume)
    th.start()
    with Producer(blob_store, "live", batching_max_messages=10) as p:
        for i in range(300):
            p.send_async(b"%d" % i)
    stop.set()
    th.join()
    assert seen == list(range(300))


def test_bad_input_is_refused_clearly(blob_store: BlobStore) -> None:
    with pytest.raises(InvalidConfiguration, match="access_mode 'Sometimes'"):
        Producer(blob_store, "bad", access_mode="Sometimes")
    with pytest.raises(InvalidConfiguration, match="compression 'brotli'"):
        Producer(blob_store, "bad", compression_type="brotli")
    with Producer(blob_store, "bad") as p:
        with pytest.raises(TypeError, match="bytes"):
            p.send("text")  # type: ignore[arg-type]
        # A wrongly typed argument is a ValueError (InvalidConfiguration), as pulsar-client's.
        with pytest.raises(InvalidConfiguration, match="properties must be a dict of str to str"):
            p.send(b"x", properties={"a": 1})  # type: ignore[dict-item]
        p.send(b"ok")
    assert read_all(blob_store, "bad").column("value").to_pylist() == [b"ok"]


def test_send_table_unpartitioned_ids_align_with_rows(blob_store: BlobStore) -> None:
    values = [b"v%05d" % i for i in range(2500)]
    with Producer(blob_store, "bulk", batching_max_messages=1000, compression_type="LZ4") as p:
        p.send(b"before")
        ids = p.send_table(values)
    rows = read_all(blob_store, "bulk").to_pylist()
    assert [r["value"] for r in rows] == [b"before", *values]
    assert ids.num_rows == 2500
    got = [(r["ledger_id"], r["entry_id"], r["batch_index"]) for r in rows[1:]]
    want = list(zip(*(ids.column(c).to_pylist() for c in ("ledger_id", "entry_id", "batch_index"))))
    assert got == want
    assert len({e for _, e, _ in got}) == 3  # 1000 + 1000 + 500
    assert [r["sequence_id"] for r in rows] == list(range(2501))


def test_send_table_splits_entries_by_bytes(blob_store: BlobStore) -> None:
    values = [b"x" * 1000] * 50
    with Producer(blob_store, "bulkbytes", batching_max_allowed_size_in_bytes=4500) as p:
        ids = p.send_table(values)
    per_entry: dict[int, int] = {}
    for e in ids.column("entry_id").to_pylist():
        per_entry[e] = per_entry.get(e, 0) + 1
    assert set(per_entry.values()) <= {5}  # the 5th message crosses 4500 bytes and ends it


def test_send_table_partitioned_keys_delays_and_columns(blob_store: BlobStore) -> None:
    create_topic(blob_store, "bulkparts", partitions=3)
    n = 300
    table = pa.table(
        {
            "value": [f"m{i}" for i in range(n)],
            "key": [f"k{i % 7}" if i % 5 else None for i in range(n)],
            "properties": pa.array(
                [[("i", str(i))] for i in range(n)], pa.map_(pa.string(), pa.string())
            ),
            "event_time": pa.array([1000 + i for i in range(n)], pa.timestamp("ms", tz="UTC")),
            "deliver_at": [5_000_000_000_000 if i == 10 else None for i in range(n)],
        }
    )
    with Producer(blob_store, "bulkparts", batching_max_messages=16) as p:
        ids = p.send_table(table)
    rows = {r["value"]: r for r in read_all(blob_store, "bulkparts").to_pylist()}
    assert len(rows) == n
    for i, (part, led, ent, bidx) in enumerate(
        zip(
            *(
                ids.column(c).to_pylist()
                for c in ("partition", "ledger_id", "entry_id", "batch_index")
            )
        )
    ):
        r = rows[f"m{i}".encode()]
        assert (r["partition"], r["ledger_id"], r["entry_id"], r["batch_index"]) == (
            part,
            led,
            ent,
            bidx,
        )
        assert r["properties"] == [("i", str(i))] and r["event_time"] == 1000 + i
        if r["key"] is not None:
            assert part == partition_for_key(r["key"], 3, "JavaStringHash")
    assert rows[b"m10"]["deliver_at"] == 5_000_000_000_000 and rows[b"m10"]["batch_index"] == -1
    for k in range(7):  # per-key order within its partition
        mine = [i for i in range(n) if i % 5 and i % 7 == k]
        pos = [
            (
                rows[f"m{i}".encode()]["ledger_id"],
                rows[f"m{i}".encode()]["entry_id"],
                rows[f"m{i}".encode()]["batch_index"],
            )
            for i in mine
        ]
        assert pos == sorted(pos)


def test_send_table_dedup_and_bad_columns(blob_store: BlobStore) -> None:
    set_topic_policies(blob_store, "bulkdd", deduplication_enabled=True)
    with Producer(blob_store, "bulkdd", producer_name="bw") as p:
        p.send_table(pa.table({"value": [b"a", b"b", b"c"], "sequence_id": [1, 2, 3]}))
        ids = p.send_table(pa.table({"value": [b"b2", b"c2", b"d"], "sequence_id": [2, 3, 4]}))
        with pytest.raises(InvalidConfiguration, match="column 'key' has type int64"):
            p.send_table(pa.table({"value": [b"x"], "key": [1]}))
        with pytest.raises(InvalidConfiguration, match="needs a 'value' column"):
            p.send_table(pa.table({"key": ["x"]}))
        with pytest.raises(InvalidConfiguration, match="unknown column"):
            p.send_table(pa.table({"value": [b"x"], "colour": ["red"]}))
    # One entry holding 2..4: Pulsar compares the entry's first sequence id (2 <= 3 persisted),
    # so the whole entry is a duplicate, even though 4 is new (PULSAR_RULES, Deduplication).
    assert ids.column("ledger_id").to_pylist() == [-1, -1, -1]
    values = read_all(blob_store, "bulkdd").column("value").to_pylist()
    assert values == [b"a", b"b", b"c"]
    with Producer(blob_store, "bulkdd", producer_name="bw", batching_max_messages=1) as p:
        ids = p.send_table(pa.table({"value": [b"c3", b"e"], "sequence_id": [3, 5]}))
    assert ids.column("ledger_id").to_pylist() == [-1, ids.column("ledger_id")[1].as_py()]
    assert read_all(blob_store, "bulkdd").column("value").to_pylist()[-1] == b"e"


def test_key_based_batching_keeps_sequence_ids_exact(blob_store: BlobStore) -> None:
    """Key batches interleave, so their sequence ids are not contiguous; each is kept."""
    set_topic_policies(blob_store, "kbseq", deduplication_enabled=True)
    with Producer(
        blob_store,
        "kbseq",
        producer_name="kbs",
        batching_type="KeyBased",
        batching_max_publish_delay_ms=1000,
    ) as p:
        for i in range(12):
            p.send_async(b"%d" % i, partition_key=f"k{i % 2}")
    rows = read_all(blob_store, "kbseq").to_pylist()
    assert sorted((int(r["value"]), r["sequence_id"]) for r in rows) == [(i, i) for i in range(12)]


def test_send_table_key_based_with_dedup_keeps_everything(blob_store: BlobStore) -> None:
    set_topic_policies(blob_store, "kbbulk", deduplication_enabled=True)
    table = pa.table(
        {"value": [b"%d" % i for i in range(40)], "key": [f"k{i % 3}" for i in range(40)]}
    )
    with Producer(
        blob_store, "kbbulk", producer_name="kbb", batching_type="KeyBased", batching_max_messages=5
    ) as p:
        ids = p.send_table(table)
        p.send_table(table.slice(0, 7))
    assert min(ids.column("ledger_id").to_pylist()) >= 0
    rows = read_all(blob_store, "kbbulk").to_pylist()
    assert sorted(r["sequence_id"] for r in rows) == list(range(47))
    for k in ("k0", "k1", "k2"):
        seqs = [r["sequence_id"] for r in rows if r["key"] == k]
        assert seqs == sorted(seqs)
