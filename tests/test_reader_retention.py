"""A reader whose unread messages retention deletes (issue #31, defect 5): it goes on at the
first message that remains, as Pulsar's readers do, but never silently: each skip is logged
once with its range and counted (``Reader.skipped_by_retention``)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from filepulsar.connector.client import Client, MessageId
from filepulsar.storage import Reader, set_namespace_policies
from filepulsar.storage.blobstore import open_blob_store
from filepulsar.storage.blobstore.local import LocalBlobStore
from filepulsar.storage.retention import enforce_retention

pytestmark = pytest.mark.unit

TOPIC = "persistent://public/default/r"


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


class _PausedAtData(LocalBlobStore):
    """A real local store that, once armed, stops before its next read of a data blob until
    :attr:`go` is set (the reader has read the manifest; retention runs meanwhile)."""

    def __init__(self, directory: str) -> None:
        super().__init__(directory)
        self.armed = False
        self.paused = threading.Event()
        self.go = threading.Event()

    def get_range_view(self, key: str, start: int, end: int) -> bytes | memoryview:
        if self.armed and key.endswith(".entries") and not self.paused.is_set():
            self.paused.set()
            assert self.go.wait(30)
        return super().get_range_view(key, start, end)


def test_retention_deleting_between_the_manifest_and_the_data_is_a_skip_not_an_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The reader read the manifest naming the next entry; retention deletes its ledger before
    the reader reads its bytes: the reader finds the ledger trimmed in the newest manifest,
    counts the skip and reads on (was: DataLossError 'data of ledger 1 ... is gone')."""
    from filepulsar.storage import Producer

    root = str(tmp_path)
    store = _PausedAtData(root)
    set_namespace_policies(store, "public", "default", ledger_max_entries=2)
    with Producer(store, TOPIC, batching_enabled=False) as p:
        for i in range(11):
            p.send(b"%d" % i)
    r = Reader(store, TOPIC)
    got = [r.read_batch(1).column("value")[0].as_py() for _ in range(3)]
    assert got == [b"0", b"1", b"2"]
    caplog.set_level(logging.WARNING, logger="filepulsar")
    store.armed = True
    out: dict[str, object] = {}

    def read() -> None:
        try:
            out["rows"] = r.read_batch(1).column("value").to_pylist()
        except BaseException as e:  # handed to the test's thread
            out["error"] = e

    th = threading.Thread(target=read)
    th.start()
    try:
        assert store.paused.wait(30)
        report = enforce_retention(open_blob_store(root), TOPIC)
        assert [d.ledger_id for d in report.deleted_ledgers] == [0, 1, 2, 3, 4]
    finally:
        store.go.set()
        th.join(30)
    if "error" in out:
        raise out["error"]  # type: ignore[misc]
    assert out["rows"] == [b"10"]
    assert r.skipped_by_retention == 7
    (warning,) = _warnings(caplog)
    assert "retention deleted 7 messages" in warning and "after 1:0 up to 4:1" in warning
    r.close()
