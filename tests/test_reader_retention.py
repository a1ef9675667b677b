"""A reader whose unread messages retention deletes (issue #31, defect 5): it goes on at the
first message that remains, as Pulsar's readers do, but never silently: each skip is logged
once with its range and counted (``Reader.skipped_by_retention``). And a consumer's fetch
that retention races (the ledger it was about to read deleted after its manifest read) reads
on, as the reader does; acknowledging again an id whose entry retention deleted does nothing."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from filepulsar.connector.client import Client, InitialPosition, MessageId
from filepulsar.storage import Reader, set_namespace_policies
from filepulsar.storage.blobstore import open_blob_store
from filepulsar.storage.blobstore.local import LocalBlobStore
from filepulsar.storage.retention import enforce_retention

pytestmark = pytest.mark.unit

TOPIC = "persistent://public/default/r"

T = TypeVar("T")


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_reader_counts_and_logs_what_retention_deleted_under_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Eleven messages in ledgers of two; a client reader reads three, then a real retention
    run deletes the closed ledgers 0-4 (no durable subscription holds them): the reader gets
    message 10 next, counts the seven after 1:0 up to 4:1 as skipped and says so once."""
    root = str(tmp_path)
    set_namespace_policies(open_blob_store(root), "public", "default", ledger_max_entries=2)
    caplog.set_level(logging.WARNING, logger="filepulsar")
    with Client(root) as client:
        producer = client.create_producer(TOPIC, batching_enabled=False)
        for i in range(11):
            producer.send(b"%d" % i)
        # one entry read ahead at a time: nothing unread is in the reader's buffer
        reader = client.create_reader(TOPIC, MessageId.earliest, receiver_queue_size=100)
        got = [reader.read_next(1000).data() for _ in range(3)]
        assert got == [b"0", b"1", b"2"] and reader.skipped_by_retention() == 0
        report = enforce_retention(open_blob_store(root), TOPIC)
        assert [d.ledger_id for d in report.deleted_ledgers] == [0, 1, 2, 3, 4]
        caplog.clear()
        assert reader.read_next(1000).data() == b"10"
        assert reader.skipped_by_retention() == 7
        (warning,) = _warnings(caplog)
        assert "retention deleted 7 messages" in warning and "after 1:0 up to 4:1" in warning
        assert TOPIC in warning
        producer.send(b"11")
        assert reader.read_next(1000).data() == b"11"
        assert reader.skipped_by_retention() == 7 and len(_warnings(caplog)) == 1
        # a reader created after the deletion lost nothing
        late = client.create_reader(TOPIC, MessageId.earliest)
        assert [late.read_next(1000).data() for _ in range(2)] == [b"10", b"11"]
        assert late.skipped_by_retention() == 0 and len(_warnings(caplog)) == 1


def test_a_storage_reader_whose_whole_backlog_was_deleted_counts_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A storage reader created at the start reads nothing before retention deletes every
    closed ledger: all their messages (batched: several per entry) count as skipped."""
    from filepulsar.storage import Producer

    root = str(tmp_path)
    store = open_blob_store(root)
    set_namespace_policies(store, "public", "default", ledger_max_entries=2)
    with Producer(store, TOPIC, batching_enabled=False) as p:
        p.send(b"first")
    r = Reader(store, TOPIC)
    with Producer(store, TOPIC, batching_enabled=True) as p:
        for i in range(4):  # entries of four messages each
            for j in range(4):
                p.send_async(b"%d-%d" % (i, j), None)
            p.flush()
    caplog.set_level(logging.WARNING, logger="filepulsar")
    report = enforce_retention(store, TOPIC)
    deleted = sum(d.messages for d in report.deleted_ledgers)
    assert len(report.deleted_ledgers) >= 2 and deleted >= 9
    everything = [b"first"] + [b"%d-%d" % (i, j) for i in range(4) for j in range(4)]
    got = r.read_batch(100).column("value").to_pylist()
    assert got == everything[deleted:]
    assert r.skipped_by_retention == deleted
    (warning,) = _warnings(caplog)
    assert f"retention deleted {deleted} messages" in warning and "from the start up to" in warning
    r.close()
    assert r.skipped_by_retention == deleted


class _PausedAt(LocalBlobStore):
    """A real local store that, once armed, stops before its next read of a blob whose name
    ends with ``suffix`` (``.entries``: entry data; ``.index``: a closed ledger's index) until
    :attr:`go` is set (the reader has read the manifest; retention runs meanwhile)."""

    def __init__(self, directory: str, suffix: str) -> None:
        super().__init__(directory)
        self.suffix = suffix
        self.armed = False
        self.paused = threading.Event()
        self.go = threading.Event()

    def _pause(self, key: str) -> None:
        if self.armed and key.endswith(self.suffix) and not self.paused.is_set():
            self.paused.set()
            assert self.go.wait(30)

    def get(self, key: str) -> bytes:
        self._pause(key)
        return super().get(key)

    def get_range_view(self, key: str, start: int, end: int) -> bytes | memoryview:
        self._pause(key)
        return super().get_range_view(key, start, end)


def _paused(store: _PausedAt, call: Callable[[], T], meanwhile: Callable[[], None]) -> T:
    """``call()`` on another thread, paused at ``store``'s next read of its kind of blob while
    ``meanwhile()`` runs on this one; what ``call`` returned (or raised)."""
    store.armed = True
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = call()
        except BaseException as e:  # handed to the test's thread
            out["error"] = e

    th = threading.Thread(target=run)
    th.start()
    try:
        assert store.paused.wait(30)
        meanwhile()
    finally:
        store.go.set()
        th.join(30)
    if "error" in out:
        raise out["error"]
    return out["result"]  # type: ignore[no-any-return]


def test_retention_deleting_between_the_manifest_and_the_data_is_a_skip_not_an_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The reader read the manifest naming the next entry; retention deletes its ledger before
    the reader reads its bytes: the reader finds the ledger trimmed in the newest manifest,
    counts the skip and reads on (was: DataLossError 'data of ledger 1 ... is gone')."""
    from filepulsar.storage import Producer

    root = str(tmp_path)
    store = _PausedAt(root, ".entries")
    set_namespace_policies(store, "public", "default", ledger_max_entries=2)
    with Producer(store, TOPIC, batching_enabled=False) as p:
        for i in range(11):
            p.send(b"%d" % i)
    r = Reader(store, TOPIC)
    got = [r.read_batch(1).column("value")[0].as_py() for _ in range(3)]
    assert got == [b"0", b"1", b"2"]
    caplog.set_level(logging.WARNING, logger="filepulsar")

    def retention() -> None:
        report = enforce_retention(open_blob_store(root), TOPIC)
        assert [d.ledger_id for d in report.deleted_ledgers] == [0, 1, 2, 3, 4]

    rows = _paused(store, lambda: r.read_batch(1).column("value").to_pylist(), retention)
    assert rows == [b"10"]
    assert r.skipped_by_retention == 7
    (warning,) = _warnings(caplog)
    assert "retention deleted 7 messages" in warning and "after 1:0 up to 4:1" in warning
    r.close()


class _CountingStore(LocalBlobStore):
    """A real local store counting reads of ledger indexes and entry data."""

    def __init__(self, directory: str) -> None:
        super().__init__(directory)
        self.reads = 0

    def _count(self, key: str) -> None:
        if key.endswith((".entries", ".index")):
            self.reads += 1

    def get(self, key: str) -> bytes:
        self._count(key)
        return super().get(key)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        self._count(key)
        return super().get_range(key, start, end)

    def get_range_view(self, key: str, start: int, end: int) -> bytes | memoryview:
        self._count(key)
        return super().get_range_view(key, start, end)


@pytest.mark.parametrize("ledgers", [3, 60])
def test_a_seek_reads_no_index_or_data_and_a_later_skip_is_still_exact(
    tmp_path: Path, ledgers: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Seeking reads no ledger index and no entry data, however long the history (the count
    of messages before the position, needed only if retention passes the reader, is worked
    out then); when retention then deletes from under the position, the count is exact once
    the reader has read in that ledger, and a lower bound (the ledgers after it) if not."""
    from filepulsar.storage import Producer

    root = str(tmp_path)
    store = _CountingStore(root)
    set_namespace_policies(store, "public", "default", ledger_max_entries=4)
    n = 4 * ledgers + 2  # the last ledger open, holding two entries
    with Producer(store, TOPIC, batching_enabled=False) as p:
        ids = [p.send(b"%d" % i) for i in range(n)]
    r = Reader(store, TOPIC)
    mid = ids[4 * (ledgers - 2) + 1]  # inside the second-to-last closed ledger
    store.reads = 0
    r.seek(mid)
    r.seek(ids[-2])
    r.seek(mid)
    assert store.reads == 0
    late = Reader(store, TOPIC)
    late.seek(mid)
    assert late.read_batch(2).column("value").to_pylist() == [b"%d" % (4 * (ledgers - 2) + 2)]
    caplog.set_level(logging.WARNING, logger="filepulsar")
    report = enforce_retention(open_blob_store(root), TOPIC)
    assert [d.ledger_id for d in report.deleted_ledgers] == list(range(ledgers))
    last_two = [b"%d" % (n - 2), b"%d" % (n - 1)]
    assert late.read_batch(100).column("value").to_pylist() == last_two
    # read up to the message after ``mid``: the last one of its ledger and the last closed
    # ledger's four were deleted unread
    assert late.skipped_by_retention == 5
    assert r.read_batch(100).column("value").to_pylist() == last_two
    # ``r`` read nothing in the ledger of ``mid``: the last closed ledger's four counted
    assert r.skipped_by_retention == 4
    first, second = _warnings(caplog)
    assert "retention deleted 5 messages it had not read" in first
    assert f"at least 4 messages (and the rest of ledger {ledgers - 2}" in second
    r.close()
    late.close()


class _RetentionAtEveryData(LocalBlobStore):
    """A real local store that, once armed, before each of its next ``times`` reads of entry
    data has a producer close the ledger being read (two messages in ledgers of two entries)
    and runs a real retention pass, which deletes it."""

    def __init__(self, directory: str, times: int) -> None:
        super().__init__(directory)
        self.armed = False
        self.times = times
        self.races = 0

    def get_range_view(self, key: str, start: int, end: int) -> bytes | memoryview:
        if self.armed and key.endswith(".entries") and self.times > 0:
            from filepulsar.storage import Producer

            self.times -= 1
            other = open_blob_store(str(self.root))
            with Producer(other, TOPIC, batching_enabled=False) as p:
                for j in range(2):
                    p.send(b"r%d-%d" % (self.races, j))
            assert enforce_retention(other, TOPIC).deleted_ledgers
            self.races += 1
        return super().get_range_view(key, start, end)


def test_a_reader_meeting_retention_three_times_in_one_read_reads_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Retention deletes the ledger the reader is about to read three times in a row within
    one read_batch call: the call still returns the first message that remains (was: an
    empty table, silently), the skips are counted exactly (3 + 2 + 2) and the races are
    logged once."""
    from filepulsar.storage import Producer

    root = str(tmp_path)
    store = _RetentionAtEveryData(root, times=3)
    set_namespace_policies(store, "public", "default", ledger_max_entries=2)
    with Producer(store, TOPIC, batching_enabled=False) as p:
        for i in range(3):
            p.send(b"%d" % i)
    r = Reader(store, TOPIC)
    assert r.read_batch(1).column("value").to_pylist() == [b"0"]
    caplog.set_level(logging.WARNING, logger="filepulsar")
    store.armed = True
    got = r.read_batch(1, timeout_ms=0).column("value").to_pylist()
    assert store.races == 3
    assert got == [b"r2-1"]
    assert r.skipped_by_retention == 7
    warnings = _warnings(caplog)
    assert [w.split(" it had not read")[0].rsplit(": ", 1)[1] for w in warnings[:3]] == [
        "retention deleted 3 messages",
        "retention deleted 2 messages",
        "retention deleted 2 messages",
    ]
    assert len(warnings) == 4 and "three times in one read" in warnings[3]
    r.close()


def test_retention_deleting_what_a_consumer_was_about_to_read_is_not_an_error(
    tmp_path: Path,
) -> None:
    """Two consumers share a durable Shared subscription. One fetches: it reads the manifest,
    which names the closed ledgers 0-4; before it reads ledger 0's index, the other consumer
    takes and acknowledges all eleven messages and a real retention run deletes ledgers 0-4
    (consumed by every subscription). The paused fetch finds them deleted in the newest
    manifest: it reads on from its subscription's state, where nothing is left, and the
    consumer goes on with the next message (was: DataLossError 'index of ledger 0 ... is
    gone', seen in the concurrency suite's retention race)."""
    from filepulsar.storage import Producer, TopicName
    from filepulsar.storage.subscription import SubscriptionConsumer

    root = str(tmp_path)
    set_namespace_policies(open_blob_store(root), "public", "default", ledger_max_entries=2)
    with Producer(open_blob_store(root), TOPIC, batching_enabled=False) as p:
        for i in range(11):
            p.send(b"%d" % i)

    def consumer(store: LocalBlobStore, name: str) -> SubscriptionConsumer:
        return SubscriptionConsumer(
            store,
            TopicName.parse(TOPIC),
            "s",
            sub_type="Shared",
            consumer_name=name,
            initial_position="Earliest",
        )

    paused_store = _PausedAt(root, ".index")
    slow = consumer(paused_store, "slow")
    fast = consumer(open_blob_store(root), "fast")

    def take_everything_and_retention() -> None:
        got = fast.fetch(100)
        assert [d.entry.entry_id for d in got] == [0, 1] * 5 + [0]
        fast.acknowledge([(d.position, -1, 1) for d in got])
        report = enforce_retention(open_blob_store(root), TOPIC)
        assert [d.ledger_id for d in report.deleted_ledgers] == [0, 1, 2, 3, 4]

    got = _paused(paused_store, lambda: slow.fetch(100), take_everything_and_retention)
    assert got == []  # everything was taken, acknowledged and deleted meanwhile
    with Producer(open_blob_store(root), TOPIC, batching_enabled=False) as p:
        p.send(b"11")
    (d,) = slow.fetch(100)
    assert d.entry.stored(["value"]).column(0)[0].as_py() == b"11"
    slow.close()
    fast.close()


def test_acknowledging_again_a_message_retention_deleted_is_a_no_op(tmp_path: Path) -> None:
    """Pulsar acknowledges a message id at or before the cursor without a word. A batched
    message acknowledged, then its ledger deleted by a real retention run: acknowledging its
    id again, one by one or cumulatively, changes nothing and raises nothing (was:
    DataLossError, reading the gone entry for its batch size)."""
    root = str(tmp_path)
    set_namespace_policies(open_blob_store(root), "public", "default", ledger_max_entries=2)
    with Client(root) as client:
        producer = client.create_producer(TOPIC, batching_enabled=True)
        for i in range(12):  # entries of three messages each, ledgers of two entries
            producer.send_async(b"%d" % i, None)
            if i % 3 == 2:
                producer.flush()
        consumer = client.subscribe(TOPIC, "s", initial_position=InitialPosition.Earliest)
        msgs = [consumer.receive(1000) for _ in range(12)]
        consumer.acknowledge_cumulative(msgs[-1])
        report = enforce_retention(open_blob_store(root), TOPIC)
        assert [d.ledger_id for d in report.deleted_ledgers] == [0, 1]
        old = msgs[1].message_id()  # a batch index inside ledger 0's first entry
        assert old.ledger_id() == 0 and old.batch_index() == 1
        consumer.acknowledge(old)
        consumer.acknowledge_cumulative(old)
        producer.send(b"12")
        assert consumer.receive(1000).data() == b"12"
