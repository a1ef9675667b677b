"""Crash safety and corruption detection with real processes and real bytes on disk."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap

import pytest

from filepulsar.storage import (
    ChecksumError,
    CorruptDataError,
    ManagedLedger,
    Producer,
    Reader,
    TopicName,
    open_blob_store,
    set_topic_policies,
)
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.compaction import compact
from filepulsar.storage.retention import enforce_retention, sweep_orphans

pytestmark = pytest.mark.contract

PRODUCER_SCRIPT = textwrap.dedent(
    """
    import sys
    from filepulsar.storage import Producer, open_blob_store
    store = open_blob_store(sys.argv[1])
    p = Producer(store, "crash", producer_name=sys.argv[2], batching_max_messages=50,
                 batching_max_publish_delay_ms=2)
    def acked(res, mid, i):
        if mid is not None:
            sys.stdout.write(f"{i} {mid}\\n")
            sys.stdout.flush()
    print("ready", flush=True)
    i = 0
    while True:
        p.send_async(b"msg-%08d" % i, lambda r, m, i=i: acked(r, m, i),
                     properties={"i": str(i)})
        i += 1
        if i % 500 == 0:
            p.flush()
    """
)


def _read_values(store: BlobStore, topic: str) -> list[bytes]:
    r = Reader(store, topic)
    out: list[bytes] = []
    while True:
        t = r.read_batch(1000, timeout_ms=0)
        if not t.num_rows:
            return out
        out.extend(t.column("value").to_pylist())


@pytest.mark.slow
@pytest.mark.parametrize("round_", range(3))
@pytest.mark.procs
def test_sigkill_mid_stream_loses_no_acknowledged_message(tmp_path, round_: int) -> None:
    root = str(tmp_path / "root")
    store = open_blob_store(root)
    set_topic_policies(store, "crash", ledger_max_entries=40)  # also kill across rollovers
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    proc = subprocess.Popen(
        [sys.executable, "-c", PRODUCER_SCRIPT, root, f"p{round_}"],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    acked: dict[int, str] = {}
    target = random.Random(round_).randint(2000, 8000)
    for line in proc.stdout:
        i, mid = line.split()
        acked[int(i)] = mid
        if len(acked) >= target:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    values = _read_values(store, "crash")
    # Every acknowledged message is there, in order, and nothing partial or out of order is.
    assert values == [b"msg-%08d" % i for i in range(len(values))]
    assert len(values) >= len(acked)
    assert max(acked) < len(values)
    # New writes work after the crash (a new producer name: the old lease is still live).
    with Producer(store, "crash") as p:
        p.send(b"after-crash")
    assert _read_values(store, "crash")[-1] == b"after-crash"


def _closed_ledger_blob(store: BlobStore) -> tuple[ManagedLedger, int, str]:
    ml = ManagedLedger(store, TopicName.parse("corrupt"))
    state = ml.state()
    lg = state.ledgers[0]
    assert not lg.is_open
    frags = ml.fragments(lg)
    blobs = {f.blob for f in frags}
    assert len(blobs) == 1
    path = store.local_path(f"topics/persistent/public/default/corrupt/data/{blobs.pop()}.entries")
    assert path is not None
    return ml, lg.ledger_id, path


def test_any_flipped_byte_of_a_closed_ledger_is_detected(tmp_path) -> None:
    store = open_blob_store(str(tmp_path))
    set_topic_policies(store, "corrupt", ledger_max_entries=3)
    with Producer(store, "corrupt", batching_max_messages=4) as p:
        for i in range(20):
            p.send_async(b"v%d" % i, properties={"n": str(i)}, partition_key=f"k{i}")
    ml, ledger_id, path = _closed_ledger_blob(store)
    with open(path, "rb") as f:
        original = f.read()
    state = ml.state()
    lg = state.ledgers[0]
    size = lg.size
    assert size == len(original)
    for pos in range(size):
        damaged = bytearray(original)
        damaged[pos] ^= 0x5A
        with open(path, "wb") as f:
            f.write(damaged)
        reader = ManagedLedger(store, TopicName.parse("corrupt"))
        with pytest.raises(CorruptDataError) as info:
            reader.read_entries(reader.state(), reader.next_position(reader.state(), _before()))
        err = info.value
        assert err.ledger_id == ledger_id
        assert "corrupt" in str(err) and f"ledger {ledger_id}" in str(err)
        assert f"entry {err.entry_id}" in str(err) and 0 <= err.entry_id < lg.entries
    with open(path, "wb") as f:
        f.write(original)
    assert len(_read_values(store, "corrupt")) == 20


def _before():
    from filepulsar.storage.ledger import EARLIEST

    return EARLIEST


def test_checksum_error_names_the_entry(tmp_path) -> None:
    store = open_blob_store(str(tmp_path))
    set_topic_policies(store, "corrupt", ledger_max_entries=3)
    with Producer(store, "corrupt", batching_enabled=False) as p:
        for i in range(6):
            p.send(b"value-%d" % i)
    _, ledger_id, path = _closed_ledger_blob(store)
    with open(path, "r+b") as f:
        data = f.read()
        second = data.index(b"value-1")
        f.seek(second)
        f.write(b"VALUE")
    with pytest.raises(ChecksumError, match=rf"ledger {ledger_id}, entry 1\b"):
        _read_values(store, "corrupt")


def test_a_reader_that_skips_loss_loses_only_the_damaged_entry(tmp_path) -> None:
    """With on_error (failOnDataLoss=false), a damaged entry is skipped alone when its framing
    is intact; when it is not, the entries after it in the fragment are reported lost."""
    from filepulsar.connector.source.partition import FilePulsarPartition
    from filepulsar.connector.source.read import read_partition
    from filepulsar.storage.ledger import EARLIEST, Position

    def first(ml: ManagedLedger) -> Position:
        pos = ml.next_position(ml.state(), EARLIEST)
        assert pos is not None
        return pos

    store = open_blob_store(str(tmp_path))
    set_topic_policies(store, "corrupt", ledger_max_entries=10)
    with Producer(store, "corrupt", batching_enabled=False) as p:
        for i in range(10):
            p.send_async(b"value-%d" % i)  # one fragment of ten entries
    _, ledger_id, path = _closed_ledger_blob(store)
    with open(path, "rb") as f:
        original = f.read()
    fifth = original.index(b"value-5")

    def read(damaged: bytes) -> tuple[list[int], list[str]]:
        with open(path, "wb") as f:
            f.write(damaged)
        ml = ManagedLedger(store, TopicName.parse("corrupt"))
        errors: list[str] = []
        got = ml.read_entries(ml.state(), first(ml), on_error=lambda e: errors.append(str(e)))
        return [e.entry_id for e in got], errors

    bad_payload = original[:fifth] + b"VALUE" + original[fifth + 5 :]
    ids, errors = read(bad_payload)
    assert ids == [0, 1, 2, 3, 4, 6, 7, 8, 9]
    assert len(errors) == 1 and f"ledger {ledger_id}, entry 5" in errors[0]
    # The source with failOnDataLoss=false hands Spark the other nine messages.
    part = FilePulsarPartition(
        str(tmp_path), {}, "corrupt", (-1, -1, -1), (ledger_id, 9, -1), fail_on_data_loss=False
    )
    values = [v for b in read_partition(part) for v in b.column("value").to_pylist()]
    assert values == [b"value-%d" % i for i in range(10) if i != 5]
    # A damaged length field hides where the next entries start: they are reported lost.
    with open(path, "wb") as f:
        f.write(original)
    ml = ManagedLedger(store, TopicName.parse("corrupt"))
    start5 = ml.read_entries(ml.state(), first(ml))[5].raw.offset
    bad_magic = bytearray(original)
    bad_magic[start5] ^= 0xFF
    ids, errors = read(bytes(bad_magic))
    # The I/O thread may have cut the ten entries into several fragments: what is lost is the
    # rest of the fragment holding entry 5.
    frag = next(
        f
        for f in ml.fragments(ml.state().ledgers[0])
        if f.first_entry <= 5 < f.first_entry + f.count
    )
    last = frag.first_entry + frag.count - 1
    assert ids == [i for i in range(10) if not 5 <= i <= last]
    assert len(errors) == 1 and f"ledger {ledger_id}, entry 5 " in errors[0]
    assert last == 5 or f"entries 5..{last} cannot be located" in errors[0]
    with pytest.raises(CorruptDataError):  # without on_error nothing changes: it fails
        ml2 = ManagedLedger(store, TopicName.parse("corrupt"))
        ml2.read_entries(ml2.state(), first(ml2))


SHARED_WRITER = textwrap.dedent(
    """
    import json, sys
    from filepulsar.storage import Producer, open_blob_store
    root, opts, tag = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    store = open_blob_store(root, storage_options=opts or None)
    with Producer(store, "shared", producer_name=f"w{tag}", batching_max_messages=8,
                  batching_max_publish_delay_ms=1) as p:
        for i in range(150):
            p.send_async(b"%s:%d" % (tag.encode(), i))
            if i % 20 == 19:
                p.flush()
    """
)


@pytest.mark.slow
@pytest.mark.procs
def test_producer_processes_share_a_topic(store_root) -> None:
    """Several processes commit to one managed ledger; put-if-absent serialises them."""
    import json

    from filepulsar.storage import create_topic

    root, opts = store_root
    if root.startswith("memory://"):
        pytest.skip("memory:// is process-local")
    store = open_blob_store(root, storage_options=opts or None)
    create_topic(store, "shared")
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SHARED_WRITER, root, json.dumps(opts or {}), str(t)], env=env
        )
        for t in range(3)
    ]
    assert [p.wait(timeout=300) for p in procs] == [0, 0, 0]
    values = _read_values(store, "shared")
    assert len(values) == 450
    for t in range(3):
        mine = [int(v.split(b":")[1]) for v in values if v.startswith(b"%d:" % t)]
        assert mine == list(range(150))


DEAD_WRITER_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from filepulsar.storage import Producer, open_blob_store
    store = open_blob_store(sys.argv[1])
    p = Producer(store, "zeros", producer_name="dead", batching_enabled=False)
    for i in range(7):
        p.send(b"v%d" % i, partition_key=f"k{i % 3}")
    print("sent", flush=True)
    time.sleep(600)
    """
)


def _read_all(store: BlobStore, topic: str, *, compacted: bool = False) -> list[tuple[str, bytes]]:
    r = Reader(store, topic, read_compacted=compacted)
    out: list[tuple[str, bytes]] = []
    while True:
        t = r.read_batch(1000, timeout_ms=0)
        if not t.num_rows:
            return out
        out.extend(zip(t.column("key").to_pylist(), t.column("value").to_pylist()))


@pytest.mark.procs
def test_a_closed_ledger_whose_blob_ends_in_zeros_reads_compacts_and_retains(tmp_path) -> None:
    """A durable producer's blob keeps zeros written after its entries; an OS crash after its
    close (the cut is not synced) leaves them, as does a writer killed before close, the case
    made here: the ledger is then closed by another producer. Reading, compaction, the orphan
    sweep and retention go by the ranges the manifest names and delete whole blobs."""
    root = tmp_path / "root"
    store = open_blob_store(str(root))
    set_topic_policies(store, "zeros", ledger_max_entries=5)  # retention 0/0 (default)
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    proc = subprocess.Popen(
        [sys.executable, "-c", DEAD_WRITER_SCRIPT, str(root)],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    assert proc.stdout is not None
    try:
        assert proc.stdout.readline().strip() == "sent"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    data = root / "topics" / "persistent" / "public" / "default" / "zeros" / "data"
    # Ledger 0 (5 entries) rolled over and its blob was cut; ledger 1's (2 entries) was not.
    ending_in_zeros = [f for f in data.iterdir() if f.read_bytes()[-4096:] == bytes(4096)]
    assert len(ending_in_zeros) == 1, sorted(data.iterdir())
    zero_blob = ending_in_zeros[0]
    with Producer(store, "zeros", producer_name="alive", batching_enabled=False) as p:
        for i in range(4):  # closes ledger 1 (with the zero-ended blob in it), opens 2
            p.send(b"a%d" % i, partition_key=f"k{i % 3}")
    ml = ManagedLedger(store, TopicName.parse("zeros"))
    state = ml.state()
    assert [(lg.ledger_id, lg.is_open) for lg in state.ledgers[:2]] == [(0, False), (1, False)]
    assert zero_blob.name.removesuffix(".entries") in {
        f.blob for f in ml.fragments(state.ledgers[1])
    }
    assert zero_blob.read_bytes()[-4096:] == bytes(4096)  # the state after an OS crash

    written = [(f"k{i % 3}", b"v%d" % i) for i in range(7)]
    written += [(f"k{i % 3}", b"a%d" % i) for i in range(4)]
    assert _read_all(store, "zeros") == written

    report = compact(store, "zeros")
    assert report.keys == 3 and report.messages_read == 11
    assert _read_all(store, "zeros", compacted=True) == written[-3:]

    swept = sweep_orphans(store, "zeros", min_age_ms=0)
    assert not any(key.endswith(zero_blob.name) for key, _ in swept.deleted)
    assert zero_blob.exists()

    retained = enforce_retention(store, "zeros")  # no subscription: closed ledgers go
    assert [d.ledger_id for d in retained.deleted_ledgers] == [0, 1]
    assert not zero_blob.exists()
    assert _read_all(store, "zeros") == written[-1:]
