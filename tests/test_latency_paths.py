"""The short paths of one ``send()`` -> ``receive()`` (issue 14's latency): the appender's
reusable fsync thread, the manifest link that waits for the data fsync, the manifest's cheap
copy and encoding memo, the inline ``send()`` and the consumer's single-entry fetch. Each
must give exactly what the general path gives.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from filepulsar.storage.blobstore import local as blobstore_local
from filepulsar.storage.blobstore.local import LocalBlobStore
from filepulsar.storage.errors import BlobStoreError

pytestmark = pytest.mark.unit

# ---------------------------------------------------------------- the appender's fsync thread


def test_one_fsync_thread_is_reused_and_stops_when_idle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalBlobStore(str(tmp_path))
    appender = store.open_append("data/a.entries")
    appender.write(b"a" * 100)
    appender.start_sync()
    first = appender._syncer
    assert first is not None
    appender.sync()
    assert appender._bg_synced == appender.offset == 100
    appender.write(b"b" * 50)
    appender.start_sync()
    assert appender._syncer is first  # the same thread takes the next request
    appender.sync()
    assert appender._bg_synced == 150

    # Idle: the thread ends (its idle time shortened), and a later sync starts a new one.
    monkeypatch.setattr(blobstore_local, "SYNC_THREAD_IDLE_S", 0.001)
    with appender._sync_cv:
        appender._sync_cv.notify_all()  # let it notice the shorter idle time
    first.join(30)
    assert not first.is_alive() and appender._syncer is None
    # A long idle time again: with 1 ms, the new thread could sync and end before this
    # thread looks at it (CI, a loaded host: ``_syncer`` was None); close() ends it.
    monkeypatch.setattr(blobstore_local, "SYNC_THREAD_IDLE_S", 60.0)
    appender.write(b"c" * 10)
    appender.start_sync()
    second = appender._syncer
    assert second is not None and second is not first
    appender.sync()
    assert appender._bg_synced == 160
    appender.close()
    assert not second.is_alive()
    with open(tmp_path / "data" / "a.entries", "rb") as f:
        assert f.read() == b"a" * 100 + b"b" * 50 + b"c" * 10


def test_a_failed_background_fsync_fails_the_sync(tmp_path: Path) -> None:
    store = LocalBlobStore(str(tmp_path))
    appender = store.open_append("data/a.entries")
    appender.write(b"x" * 10)
    fd = appender._fd
    assert fd is not None
    os.close(fd)  # the fsync thread's fsync fails (EBADF)
    appender.start_sync()
    try:
        with pytest.raises(BlobStoreError, match="fsync failed"):
            appender.sync()
    finally:
        appender._fd = None  # already closed above
        appender.close()


def test_sync_without_start_and_close_while_idle(tmp_path: Path) -> None:
    store = LocalBlobStore(str(tmp_path))
    appender = store.open_append("data/a.entries")
    appender.write(b"x" * 10)
    appender.sync()  # no thread needed
    assert appender._syncer is None
    appender.start_sync()
    syncer = appender._syncer
    appender.close()  # stops the thread (waiting for a running fsync first)
    assert syncer is not None and not syncer.is_alive()


# ---------------------------------------------------------------- put_if_absent's before_link


@pytest.mark.parametrize("anonymous", [True, False])
def test_before_link_runs_before_the_name_appears(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, anonymous: bool
) -> None:
    if not anonymous:
        monkeypatch.setattr(blobstore_local, "_O_TMPFILE", 0)
    store = LocalBlobStore(str(tmp_path))
    seen: list[bool] = []
    assert store.put_if_absent(
        "m/1.json", b"one", before_link=lambda: seen.append(store.exists("m/1.json"))
    )
    assert seen == [False] and store.get("m/1.json") == b"one"

    def fail() -> None:
        raise BlobStoreError("data fsync failed")

    with pytest.raises(BlobStoreError, match="data fsync failed"):
        store.put_if_absent("m/2.json", b"two", before_link=fail)
    assert not store.exists("m/2.json")
    assert sorted(os.listdir(tmp_path / "m")) == ["1.json"]  # no temporary file left
    # A lost race still runs the hook (the bytes were written) and reports False.
    assert not store.put_if_absent("m/1.json", b"other", before_link=lambda: seen.append(True))
    assert store.get("m/1.json") == b"one"


def test_a_wrapped_store_gets_before_link_before_the_put(tmp_path: Path) -> None:
    """A store whose put_if_absent is overridden without the hook still commits, with the
    data fsync before the put (as before). (Versions as files, the protocol object stores
    use: a journal does not put versions.)"""
    from filepulsar.storage import Producer

    order: list[str] = []

    class Wrapped(LocalBlobStore):
        def put_if_absent(self, key, data):  # type: ignore[no-untyped-def, override]
            if "/manifest/" in key:
                order.append("put")
            return super().put_if_absent(key, data)

    store = Wrapped(str(tmp_path), journal=False)
    p = Producer(store, "t", batching_enabled=False)
    original = blobstore_local.Appender.sync

    def sync(self: blobstore_local.Appender) -> None:
        order.append("sync")
        original(self)

    blobstore_local.Appender.sync = sync  # type: ignore[method-assign]
    try:
        order.clear()
        p.send(b"x")
    finally:
        blobstore_local.Appender.sync = original  # type: ignore[method-assign]
        p.close()
    assert "put" in order and order[0] == "sync"  # (synced before the commit, and again
    # in before_link, where nothing is left to sync)


def test_threads_are_not_left_behind(tmp_path: Path) -> None:
    from filepulsar.storage import Producer

    before = {t for t in threading.enumerate() if t.name.startswith("fsync ")}
    p = Producer(LocalBlobStore(str(tmp_path)), "t", batching_enabled=False)
    for i in range(5):
        p.send(b"%d" % i)
    p.close()
    after = {t for t in threading.enumerate() if t.name.startswith("fsync ")}
    assert after <= before


def test_the_io_thread_and_send_sync_their_writes_themselves(tmp_path: Path) -> None:
    """Issue #27: a producer's small writes (a live producer's one-message entries) fsync
    their data in the writing thread before the commit, without the appender's fsync
    thread; on a local disk a send() writing its own message does too (its blob keeps zeros
    written ahead, whose size proves nothing: the record may name only durable bytes)."""
    from filepulsar.storage import Producer

    def fsync_threads() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name.startswith("fsync ")}

    before = fsync_threads()
    store = LocalBlobStore(str(tmp_path))
    p = Producer(store, "t", batching_type="KeyBased", batching_max_publish_delay_ms=1)
    ids: list[object] = []
    for i in range(5):
        p.send_async(b"%d" % i, lambda r, m: ids.append(m), partition_key=f"k{i}")
        p.flush()
    assert len(ids) == 5 and all(m is not None for m in ids)
    assert fsync_threads() <= before  # the I/O thread synced every write itself
    p.send(b"s", partition_key="k")
    assert fsync_threads() <= before  # and so did send()
    p.close()
    assert _stored(store, "t") == [b"0", b"1", b"2", b"3", b"4", b"s"]


# ---------------------------------------------------------------- zeros written ahead


def test_write_ahead_keeps_zeros_after_the_bytes_and_cuts_them_at_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalBlobStore(str(tmp_path))
    path = tmp_path / "data" / "a.entries"
    syncs: list[str] = []
    real_fsync, real_fdatasync = os.fsync, os.fdatasync
    monkeypatch.setattr(os, "fsync", lambda fd: (syncs.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(
        os, "fdatasync", lambda fd: (syncs.append("fdatasync"), real_fdatasync(fd))[1]
    )
    appender = store.open_append("data/a.entries")
    appender.write_ahead(4096)
    syncs.clear()  # (the folder's fsync when the blob was made)
    assert appender.write(b"a" * 100) == 0
    assert appender.write_many([b"b" * 50, memoryview(b"c" * 10)]) == 100
    appender.sync()
    assert syncs == ["fdatasync"]  # data alone: the zeros' size was written ahead
    assert os.path.getsize(path) == 100 + 4096  # zeros ahead of the 160 bytes
    assert store.get_range("data/a.entries", 0, 160) == b"a" * 100 + b"b" * 50 + b"c" * 10
    assert path.read_bytes()[160:] == bytes(4096 - 60)
    pwrites: list[tuple[int, int]] = []
    real_pwrite = os.pwrite
    monkeypatch.setattr(
        os, "pwrite", lambda fd, b, at: (pwrites.append((at, len(b))), real_pwrite(fd, b, at))[1]
    )
    appender.write(b"d" * 5000)  # past the zeros: more are written ahead
    assert pwrites == [(5160, 4096)]  # after the new bytes only (they are not written twice)
    appender.start_sync()
    appender.sync()
    assert os.path.getsize(path) == 5160 + 4096
    appender.close()
    assert path.read_bytes() == b"a" * 100 + b"b" * 50 + b"c" * 10 + b"d" * 5000
    assert "fsync" not in syncs

    plain = store.open_append("data/b.entries")  # without: fsync, the size is the end
    plain.write(b"x" * 10)
    plain.sync()
    assert syncs[-1] == "fsync" and os.path.getsize(tmp_path / "data" / "b.entries") == 10
    plain.close()


def test_a_producers_data_is_durable_before_its_record_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record names bytes of a blob written ahead only once they are synced (settling
    cannot tell them by the blob's size): for send_async's I/O thread, send() and flush."""
    from filepulsar.storage import Producer
    from filepulsar.storage.blobstore.local import Appender
    from filepulsar.storage.versioned.journal import Journal

    events: list[tuple[str, int]] = []
    real_sync, real_begin = Appender._sync_fd, Journal.begin

    def sync_fd(self: Appender, fd: int) -> None:
        real_sync(self, fd)
        events.append(("synced", self.offset))

    def begin(self: Journal, *args: Any, **kwargs: Any) -> Any:
        events.append(("record", 0))
        return real_begin(self, *args, **kwargs)

    monkeypatch.setattr(Appender, "_sync_fd", sync_fd)
    monkeypatch.setattr(Journal, "begin", begin)
    store = LocalBlobStore(str(tmp_path))
    p = Producer(store, "t", batching_type="KeyBased", batching_max_publish_delay_ms=1)
    events.clear()
    p.send(b"one", partition_key="k")
    p.send_async(b"two", lambda r, m: None, partition_key="k2")
    p.flush()
    p.send(b"x" * 100_000)  # (larger than an inline sync)
    p.close()
    records = [i for i, (e, _) in enumerate(events) if e == "record"]
    assert len(records) >= 3
    for i in records:  # every record follows a sync of everything written before it
        assert any(e == "synced" for e, _ in events[:i])
    assert _stored(store, "t") == [b"one", b"two", b"x" * 100_000]


# ---------------------------------------------------------------- inline send()


def _stored(store: LocalBlobStore, topic: str) -> list[bytes]:
    from filepulsar.storage.reader import Reader

    r = Reader(store, topic)
    out: list[bytes] = []
    try:
        while (t := r.read_batch(1000)).num_rows:
            out.extend(t.column("value").to_pylist())
    finally:
        r.close()
    return out


def test_send_writes_in_the_callers_thread_when_nothing_is_queued(tmp_path: Path) -> None:
    from filepulsar.storage import Producer

    store = LocalBlobStore(str(tmp_path))
    p = Producer(store, "t", batching_enabled=False)
    writers: list[str] = []
    original = p._queue._write

    def spy(lane, queued):  # type: ignore[no-untyped-def]
        writers.append(threading.current_thread().name)
        original(lane, queued)

    p._queue._write = spy  # type: ignore[method-assign]
    ids = [p.send(b"%d" % i) for i in range(5)]
    p.close()
    assert writers == [threading.current_thread().name] * 5
    assert [(m.ledger_id, m.entry_id) for m in ids] == [(ids[0].ledger_id, i) for i in range(5)]


@pytest.mark.parametrize("batching", [False, True])
def test_inline_send_keeps_order_with_concurrent_send_async(tmp_path: Path, batching: bool) -> None:
    """send() from one thread and send_async from another: every message stored once, each
    thread's messages in the order sent, sequence ids increasing along the topic."""
    from filepulsar.storage import Producer

    store = LocalBlobStore(str(tmp_path))
    p = Producer(store, "t", batching_enabled=batching, batching_max_publish_delay_ms=1)
    results: list[object] = []
    go = threading.Barrier(2)

    def async_sender() -> None:
        go.wait()
        for i in range(300):
            p.send_async(b"a%03d" % i, lambda res, mid: results.append(res))

    t = threading.Thread(target=async_sender)
    t.start()
    go.wait()
    sync_ids = [p.send(b"s%03d" % i) for i in range(60)]
    t.join()
    p.flush()
    p.close()
    assert len(results) == 300 and all(str(r).endswith("Ok") for r in results)
    assert sync_ids == sorted(sync_ids)
    values = _stored(store, "t")
    assert sorted(values) == sorted(
        [b"a%03d" % i for i in range(300)] + [b"s%03d" % i for i in range(60)]
    )
    assert [v for v in values if v.startswith(b"a")] == [b"a%03d" % i for i in range(300)]
    assert [v for v in values if v.startswith(b"s")] == [b"s%03d" % i for i in range(60)]


# ---------------------------------------------------------------- the manifest's copy and memo


def _check_manifest(ms) -> None:  # type: ignore[no-untyped-def]
    """The cached state's bytes are a full (memo-less) encoding's; its copy() and a memo
    decoding equal a memo-less decoding."""
    from filepulsar.storage.fragments import FragmentMemo
    from filepulsar.storage.manifest import ManifestState
    from filepulsar.storage.versioned import envelope

    st, raw, _ = ms.cache
    if envelope.is_delta(raw):  # (FORMAT.md, "Delta records"): the full head it stands for
        bare = st.copy()
        bare.memo = None
        raw = bare.encode()
        assert st.copy().encode() == raw  # the memo's encoding: the same bytes
    plain = ManifestState.decode(raw, "test", ms.catalog)
    assert plain.memo is None
    assert plain.encode() == raw
    assert st.copy() == plain
    assert ManifestState.decode(raw, "test", ms.catalog, ms.memo) == plain
    assert ManifestState.decode(raw, "test", ms.catalog, FragmentMemo()) == plain


def test_memo_encoding_is_byte_identical_over_rollovers_and_trims(tmp_path: Path) -> None:
    from filepulsar.storage import Producer, create_topic, set_topic_policies
    from filepulsar.storage.names import TopicName
    from filepulsar.storage.retention import enforce_retention
    from filepulsar.storage.subscription import SubscriptionConsumer

    store = LocalBlobStore(str(tmp_path))
    set_topic_policies(store, "m", ledger_max_entries=6, deduplication_enabled=True)
    create_topic(store, "m")
    sub = SubscriptionConsumer(store, TopicName.parse("m"), "s", initial_position="Earliest")
    p = Producer(store, "m", batching_enabled=False)
    ms = p._parts[0].ml.manifest
    for i in range(40):
        p.send(b"%d" % i)
        _check_manifest(ms)
    # Consume and trim: retention commits from its own store; the producer then builds on a
    # state it decoded (through its memo), not one it encoded.
    done = 0
    while done < 30:
        ds = sub.fetch(10)
        sub.acknowledge([(d.position, -1, 1) for d in ds])
        done += len(ds)
    assert enforce_retention(store, "m").deleted_ledgers
    for i in range(40, 60):
        p.send(b"%d" % i)
        _check_manifest(ms)
    # Another producer interleaves: each commit builds on the other's version.
    q = Producer(store, "m", batching_enabled=False)
    for i in range(60, 80):
        (p if i % 2 else q).send(b"%d" % i)
        _check_manifest(ms)
        _check_manifest(q._parts[0].ml.manifest)
    q.close()
    p.close()
    sub.close()
    assert _stored(store, "m")[-40:] == [b"%d" % i for i in range(40, 80)]


def test_copy_is_private(tmp_path: Path) -> None:
    from filepulsar.storage import Producer

    store = LocalBlobStore(str(tmp_path))
    p = Producer(store, "c", batching_enabled=False)
    p.send(b"x")
    ms = p._parts[0].ml.manifest
    st = ms.cache[0]
    before = ms.cache[1]
    c = st.copy()
    c.open_ledger.fragments.append(c.open_ledger.fragments[0])
    c.open_ledger.entries += 1
    name, lease = next(iter(c.producers.items()))  # (leases never change: a renewal replaces)
    c.producers[name] = lease.renewed(lease.expires_ms + 1)
    c.dedup["z"] = 1
    c.catalog_refs.append(None)
    assert st.encode() == before
    p.close()


# ---------------------------------------------------------------- one fetched entry


def _mixed_entries(tmp_path: Path) -> list[Any]:
    """Real entries of every kind a fetch meets: plain, keyed with properties, event time and
    a delay, a null value, keyed alone, keyed with an ordering key, a batch with explicit
    sequence ids, one written with a schema."""
    from filepulsar.storage import Producer
    from filepulsar.storage.ledger import ManagedLedger, Position
    from filepulsar.storage.names import TopicName

    store = LocalBlobStore(str(tmp_path))
    p = Producer(store, "t", batching_enabled=False)
    p.send(b"x" * 100)
    p.send(b"y", properties={"a": "b"}, partition_key="k", event_timestamp=5, deliver_after=1000)
    p.send(None)
    p.send(b"k", partition_key="dévice-1")  # keyed one-message entries (read without pyarrow)
    p.send(b"ko", partition_key="k2", ordering_key=b"\x00o")
    p.close()
    q = Producer(store, "t", batching_max_publish_delay_ms=60_000, producer_name="batchy")
    for i in range(7):
        q.send_async(b"b%d" % i, None, sequence_id=100 + 2 * i)
    q.flush()
    q.close()
    r = Producer(store, "t", batching_enabled=False, producer_name="typed")
    r.schema_version = (3).to_bytes(8, "big")  # as the client sets it once it registered one
    r.send(b"{}", ordering_key=b"ok")
    r.close()
    ml = ManagedLedger(store, TopicName.parse("t"))
    entries = ml.read_entries(ml.state(), Position(0, 0))
    assert len(entries) == 7
    return entries


def test_one_entry_table_equals_the_general_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from filepulsar.storage.reader import entries_to_table

    entries = _mixed_entries(tmp_path)
    for e in entries:
        for cols in (
            None,
            ["value"],
            ["partition", "batch_index", "ledger_id", "entry_id"],
            ["publish_time", "producer_name", "deliver_at", "schema_version", "sequence_id"],
        ):
            one = entries_to_table([e], 3, cols)
            general = entries_to_table([e, e], 3, cols).slice(0, one.num_rows)
            assert one.num_rows == e.raw.header.num_messages
            assert one.schema == general.schema
            assert one.equals(general)
    # A few messages are packed directly; the same tables as through NumPy.
    from filepulsar.storage import entry as entry_mod
    from filepulsar.storage import reader as reader_mod

    groups = [[e] for e in entries] + [entries, entries[:2], entries[1:3]]
    cases = [None, ["partition", "batch_index", "ledger_id", "entry_id", "sequence_id"]]
    cases.append(["publish_time", "deliver_at", "schema_version", "key", "event_time"])
    packed = [entries_to_table(g, 3, cols) for g in groups for cols in cases]
    monkeypatch.setattr(entry_mod, "SMALL_ROWS", 0)
    monkeypatch.setattr(reader_mod, "SMALL_ROWS", 0)
    plain = [entries_to_table(g, 3, cols) for g in groups for cols in cases]
    assert any(t.num_rows > 1 for t in packed)
    for a, b in zip(packed, plain):
        assert a.schema == b.schema
        assert a.equals(b)


def test_message_rows_equal_the_tables_columns(tmp_path: Path) -> None:
    """What a consumer woken by a commit delivers without building a table (MessageRows)
    equals the table's columns, for every read column, entry by entry and together."""
    from filepulsar.storage.reader import READ_SCHEMA, MessageRows, entries_to_table

    entries = _mixed_entries(tmp_path)
    for group in [[e] for e in entries] + [entries, entries[1:4]]:
        rows = MessageRows(group, 3)
        table = entries_to_table(group, 3)
        assert rows.num_rows == table.num_rows
        for name in READ_SCHEMA.names:
            assert rows.column(name) == table.column(name).to_pylist(), name
    versions = MessageRows(entries, 3).column("schema_version")
    assert versions[-1] == 3 and versions[0] is None
    with pytest.raises(KeyError, match="not a read column"):
        MessageRows(entries, 3).column("publishTime")
    with pytest.raises(KeyError, match="stored column"):
        MessageRows(entries, 3, stored=False).column("value")


@pytest.mark.parametrize("value", [b"", b"abc", b"x" * 1000, None])
def test_one_value_binary_array_equals_pyarrows(value: bytes | None) -> None:
    import pyarrow as pa

    from filepulsar.storage.producer.messages import binary_array as _binary_array

    got = _binary_array([value])
    got.validate(full=True)
    assert got.type == pa.binary() and got.equals(pa.array([value], pa.binary()))


def test_an_error_in_send_hands_its_sealed_entry_to_the_io_thread(tmp_path: Path) -> None:
    """send() claims its entry while it seals it; if it fails before writing it (an
    interrupt), the claim is released and flush() gets the entry written."""
    from filepulsar.storage import Producer

    store = LocalBlobStore(str(tmp_path))
    p = Producer(store, "t", batching_enabled=False)

    def interrupted(done):  # type: ignore[no-untyped-def]
        raise RuntimeError("interrupted")

    p._queue.wait_inline = interrupted  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="interrupted"):
        p.send(b"x")
    del p._queue.wait_inline
    flusher = threading.Thread(target=p.flush)
    flusher.start()
    flusher.join(60)
    assert not flusher.is_alive()
    p.send(b"y")
    p.close()
    assert _stored(store, "t") == [b"x", b"y"]


_FSIZE_CHILD = r"""
import resource, signal, sys
from filepulsar.storage.blobstore.local import LocalBlobStore
from filepulsar.storage.errors import BlobStoreError

# Files may not grow past 8 KiB: a write crossing the limit is cut short, one starting at it
# fails with EFBIG (SIGXFSZ ignored, as a service would).
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))
store = LocalBlobStore(sys.argv[1])
appender = store.open_append("data/a.entries")
appender.write_ahead(4096)
appender.write(b"a" * int(sys.argv[2]))
appender.sync()
try:
    appender.write(b"b" * int(sys.argv[3]))
except BlobStoreError as e:
    print("BlobStoreError", e)
else:
    print("no error")
try:
    appender.write(b"c")
except BlobStoreError as e:
    print("then", e)
appender.close()
"""


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (100, 5000),  # the zeros after it cross the limit: a short write, then EFBIG
        (100, 9000),  # the zeros after it start beyond the limit: EFBIG at once
    ],
)
@pytest.mark.procs
def test_a_failed_write_of_the_zeros_ahead_fails_the_appender(
    tmp_path: Path, first: int, second: int
) -> None:
    """Writing the zeros ahead is part of the append: its failure (here a real one, a file
    size limit) is a BlobStoreError naming the blob, the appender is failed (close leaves
    the file as it is), and a short write of the zeros is not taken for a whole one."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _FSIZE_CHILD, str(tmp_path), str(first), str(second)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    url = f"file://{tmp_path}/data/a.entries"
    assert lines[0].startswith("BlobStoreError append at offset 100 failed for " + url), lines
    assert lines[1] == f"then write on failed appender for {url}", lines
    data = (tmp_path / "data" / "a.entries").read_bytes()
    assert data[:first] == b"a" * first  # the synced append is there
