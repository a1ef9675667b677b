"""Staged writes published by one idempotent commit (the Spark sink's exactly-once path)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from filepulsar.storage import ManagedLedger, Reader, TopicName, create_topic, effective_policies
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.commit import PendingEntry
from filepulsar.storage.entry_encode import encode_entry_parts
from filepulsar.storage.staged import commit_staged, discard_staged, last_committed_batch, stage

pytestmark = pytest.mark.contract


def _entry(values: list[bytes], seq: int, producer: str = "sink") -> PendingEntry:
    rb = pa.record_batch([pa.array(values, pa.binary())], names=["value"])
    parts = encode_entry_parts(rb, producer_name=producer, publish_time=1, first_sequence_id=seq)
    return PendingEntry.of(parts, len(values), 1, producer, seq, seq + len(values) - 1)


def _values(store: BlobStore, topic: str) -> list[bytes]:
    r = Reader(store, topic)
    out: list[bytes] = []
    while (t := r.read_batch(100, timeout_ms=0)).num_rows:
        out.extend(t.column("value").to_pylist())
    return out


def test_staged_blobs_are_invisible_until_committed_once(blob_store: BlobStore) -> None:
    create_topic(blob_store, "st")
    ml = ManagedLedger(blob_store, TopicName.parse("st"))
    pol = effective_policies(blob_store, ml.topic)
    a = stage(ml, [_entry([b"a1", b"a2"], 0), _entry([b"a3"], 2)], "q1-b0-t0")
    b = stage(ml, [_entry([b"b1"], 3)], "q1-b0-t1")
    assert _values(blob_store, "st") == []
    pos = commit_staged(ml, [a, b], policies=pol, dedup=False, writer_id="q1", batch_id=0)
    assert pos is not None and [len(p) for p in pos] == [2, 1]
    assert _values(blob_store, "st") == [b"a1", b"a2", b"a3", b"b1"]
    # A replay of batch 0 (new task attempts) changes nothing; its blobs are discarded.
    again = stage(ml, [_entry([b"a1", b"a2"], 0)], "q1-b0-t0-retry")
    assert commit_staged(ml, [again], policies=pol, dedup=False, writer_id="q1", batch_id=0) is None
    discard_staged(ml, [again])
    assert not blob_store.exists(f"topics/persistent/public/default/st/data/{again.blob}.entries")
    assert _values(blob_store, "st") == [b"a1", b"a2", b"a3", b"b1"]
    assert last_committed_batch(ml, "q1") == 0
    c = stage(ml, [_entry([b"c1"], 4)], "q1-b1-t0")
    assert commit_staged(ml, [c], policies=pol, dedup=False, writer_id="q1", batch_id=1)
    assert _values(blob_store, "st")[-1] == b"c1"


def test_staged_commit_applies_dedup(blob_store: BlobStore) -> None:
    create_topic(blob_store, "stdd")
    ml = ManagedLedger(blob_store, TopicName.parse("stdd"))
    pol = effective_policies(blob_store, ml.topic)
    a = stage(ml, [_entry([b"x"], 5)], "w-b0-t0")
    commit_staged(ml, [a], policies=pol, dedup=True, writer_id="w", batch_id=0)
    b = stage(ml, [_entry([b"x-again"], 5), _entry([b"y"], 6)], "w-b1-t0")
    pos = commit_staged(ml, [b], policies=pol, dedup=True, writer_id="w", batch_id=1)
    assert pos is not None and pos[0][0] is None and pos[0][1] is not None
    assert _values(blob_store, "stdd") == [b"x", b"y"]


def _ledgers(ml: ManagedLedger) -> list[tuple[int, int, int, int, bool]]:
    return [
        (lg.ledger_id, lg.entries, lg.messages, lg.size, lg.closed_ms is not None)
        for lg in ml.state().ledgers
    ]


def test_producer_and_sink_publish_alike(blob_store: BlobStore) -> None:
    """One publish (#28): the same entries committed by a producer's writer and by the sink's
    staged commit land alike -- positions, dedup, ledgers rolled over (their index blobs
    written on both paths) and what a reader reads; only blob names and the record of who
    wrote (a lease, a sink batch) differ."""
    from dataclasses import replace

    from filepulsar.storage import Producer

    create_topic(blob_store, "via-writer")
    create_topic(blob_store, "via-sink")
    prod = Producer(blob_store, "via-writer", producer_name="p")
    writer = prod._parts[0].writer
    small = replace(writer.policies, ledger_max_entries=3)
    writer.policies = small
    sink = ManagedLedger(blob_store, TopicName.parse("via-sink"))

    def batches() -> list[list[PendingEntry]]:
        # The second batch repeats the first's last entry: a duplicate on both paths.
        return [
            [_entry([b"a"], 0, "p"), _entry([b"b", b"c"], 1, "p"), _entry([b"d"], 3, "p")],
            [_entry([b"d"], 3, "p"), _entry([b"e"], 4, "p")],
        ]

    by_writer = [writer.append(b, dedup=True) for b in batches()]
    by_sink = []
    for k, b in enumerate(batches()):
        staged = stage(sink, b, f"q-b{k}-t0")
        pos = commit_staged(sink, [staged], policies=small, dedup=True, writer_id="q", batch_id=k)
        assert pos is not None
        by_sink.append(pos[0])
    prod.close()
    assert by_writer == by_sink
    assert by_writer[1][0] is None  # the duplicate
    wml = ManagedLedger(blob_store, TopicName.parse("via-writer"))
    assert _ledgers(wml) == _ledgers(sink)
    assert _ledgers(sink)[0][4]  # the first ledger was closed (its index written)
    assert wml.state().dedup == sink.state().dedup == {"p": 4}
    assert _values(blob_store, "via-writer") == _values(blob_store, "via-sink")
    assert _values(blob_store, "via-sink") == [b"a", b"b", b"c", b"d", b"e"]
