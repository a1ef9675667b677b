"""Storage's one way out of the ledger (:func:`filepulsar.storage.read_range.read_range`), on
every backend and without Spark: a range's messages, chunked messages begun before the range,
explicit entries, and lost data reported or skipped as the caller asked."""

from __future__ import annotations

import pyarrow as pa
import pytest

from filepulsar.storage import (
    DataLossError,
    Producer,
    TopicName,
    create_topic,
    delete_topic,
    set_topic_policies,
)
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.read_range import WHOLE, MessageRange, read_range

pytestmark = pytest.mark.contract

EVERYTHING = (-1, -1, WHOLE)


def _values(tables: list[pa.Table]) -> list[bytes]:
    return [v for t in tables for v in t.column("value").to_pylist()]


def test_a_range_reads_after_its_start_through_its_end(blob_store: BlobStore) -> None:
    create_topic(blob_store, "r")
    with Producer(blob_store, "r", batching_enabled=False) as p:
        ids = [p.send(b"m%d" % i) for i in range(6)]
    t = TopicName.parse("r")
    start = (ids[1].ledger_id, ids[1].entry_id, WHOLE)
    end = (ids[4].ledger_id, ids[4].entry_id, WHOLE)
    got = list(read_range(blob_store, t, MessageRange(start=start, end=end)))
    assert _values(got) == [b"m2", b"m3", b"m4"]
    # Explicit entries, in the order given; "latest" resolved when read.
    listed = ((ids[5].ledger_id, ids[5].entry_id, 0), (ids[0].ledger_id, ids[0].entry_id, 2))
    got = list(read_range(blob_store, t, MessageRange(EVERYTHING, EVERYTHING, positions=listed)))
    assert _values(got) == [b"m5", b"m0"]
    whole = MessageRange(EVERYTHING, EVERYTHING, end_latest=True)
    assert len(_values(list(read_range(blob_store, t, whole)))) == 6
    latest = MessageRange(EVERYTHING, EVERYTHING, start_latest=True, end_latest=True)
    assert _values(list(read_range(blob_store, t, latest))) == []


def test_a_chunked_message_begun_before_the_range_is_read_whole(blob_store: BlobStore) -> None:
    set_topic_policies(blob_store, "big", max_message_size=1000)
    create_topic(blob_store, "big")
    payload = bytes(range(256)) * 17  # 5 chunks
    with Producer(blob_store, "big", chunking_enabled=True, batching_enabled=False) as p:
        p.send(b"before")
        last = p.send(payload)  # the id of its last chunk
        p.send(b"after")
    t = TopicName.parse("big")
    # The range starts after the message's third chunk: the lookback finds chunks 0..2.
    start = (last.ledger_id, last.entry_id - 2, WHOLE)
    got = list(read_range(blob_store, t, MessageRange(start, EVERYTHING, end_latest=True)))
    assert _values(got) == [payload, b"after"]
    assert got[0].column("entry_id").to_pylist()[0] == last.entry_id


def test_a_deleted_topic_is_lost_unless_the_caller_reads_on(blob_store: BlobStore) -> None:
    create_topic(blob_store, "gone")
    with Producer(blob_store, "gone") as p:
        p.send(b"x")
    t = TopicName.parse("gone")
    planned = MessageRange(EVERYTHING, EVERYTHING, end_latest=True)
    delete_topic(blob_store, "gone", force=True)
    with pytest.raises(DataLossError, match="deleted before this task read it"):
        list(read_range(blob_store, t, planned))
    lenient = MessageRange(EVERYTHING, EVERYTHING, end_latest=True, fail_on_data_loss=False)
    assert list(read_range(blob_store, t, lenient)) == []
    # Created again: another incarnation than the one the range was planned on.
    create_topic(blob_store, "gone")
    with pytest.raises(DataLossError, match="deleted and created again"):
        list(read_range(blob_store, t, MessageRange(EVERYTHING, EVERYTHING, incarnation="old")))
