"""Manifest format 2: the ledger catalog, bounded dedup and sink state, reading format 1.

A commit rewrites only a small head; closed ledgers live in immutable catalog segments
written at rollover and retention (storage/catalog.py, FORMAT.md "Ledger catalog").
"""

from __future__ import annotations

import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow as pa
import pytest

from filepulsar.connector.client import Client, ConsumerType, InitialPosition, MessageId
from filepulsar.storage import Producer, catalog, create_topic, set_topic_policies
from filepulsar.storage.blobstore import open_blob_store
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.catalog import SegmentRef
from filepulsar.storage.commit import PendingEntry
from filepulsar.storage.entry_encode import encode_entry_parts
from filepulsar.storage.errors import IncompatibleFormat
from filepulsar.storage.ledger import ManagedLedger, Position
from filepulsar.storage.manifest import ManifestState
from filepulsar.storage.names import TopicName
from filepulsar.storage.policies import effective_policies
from filepulsar.storage.retention import enforce_retention, sweep_orphans
from filepulsar.storage.staged import commit_staged, last_committed_batch, stage
from filepulsar.storage.versioned import envelope

pytestmark = pytest.mark.unit

GOLDEN_V1 = Path(__file__).parent / "golden" / "v1topic"
TOPIC_DIR = "topics/persistent/public/default"
T0 = 1_700_000_000_000
MIN = 60_000


SEG = 16  # ledgers per catalog segment in these tests (512 by default)


@pytest.fixture(autouse=True)
def _small_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(catalog, "SEGMENT_LEDGERS", SEG)


def _seg_file(r: list) -> str:
    return SegmentRef.from_json(r).name.split("/")[-1]


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


class _Head(NamedTuple):
    where: str  # the file, or a journal segment and offset
    raw: bytes


def _newest_head(root: Path, topic: str) -> tuple[_Head, dict]:
    """The newest stored manifest version, as stored (a file, or a journal record); where
    that is a delta record, the full head it stands for (the folded state encoded: the bytes
    a full record would hold, tests/test_manifest_delta.py)."""
    ml = ManagedLedger(open_blob_store(str(root)), TopicName.parse(topic))
    *_, (where, raw) = ml.manifest.stored()
    if envelope.is_delta(raw):
        raw = ml.manifest.latest(strict=True).copy().encode()
    return _Head(where, raw), json.loads(raw.split(b"\n")[0])


def _catalog_files(root: Path, topic: str) -> set[str]:
    d = root / TOPIC_DIR / topic / "catalog"
    return {p.name for p in d.iterdir()} if d.exists() else set()


def _produce(store: BlobStore, topic: str, n: int, clock: Clock, start: int = 0) -> None:
    with Producer(store, topic, batching_enabled=False, clock=clock) as p:
        for i in range(start, start + n):
            p.send(b"%d" % i)


def _read_all(store: BlobStore, topic: str) -> list[bytes]:
    ml = ManagedLedger(store, TopicName.parse(topic))
    m = ml.state()
    out = []
    for e in ml.read_entries(m, Position(-1, -1)):
        out.extend(e.raw.messages().column("value").to_pylist())
    return out


def golden_client(root: Path, updated_ms: int) -> Client:
    """A client on a golden topic's copy whose wall clock runs from a minute after the topic
    was last written (its ``updated``), so a test means the same on any day: on the real
    clock the open ledger would be past its maximum age (a rollover) and the dedup state past
    the producer inactivity bound."""
    since = time.monotonic()
    return Client(
        str(root), clock=lambda: updated_ms + MIN + int((time.monotonic() - since) * 1000)
    )


def read_golden_scenario(client: Client, topic: str, before_acks: Callable[[], None]) -> Any:
    """What tests/golden/make_v*_topic.py left, read back: a reader from the start gets
    m0..m9; the Shared subscription 'audit' delivers m4 (negatively acknowledged) and m6..m9
    (m0..m3 and m5 were acknowledged), acknowledged here (``before_acks`` runs before the
    first acknowledgement). Returns the consumer."""
    reader = client.create_reader(topic, start_message_id=MessageId.earliest)
    values = []
    while reader.has_message_available():
        values.append(reader.read_next(timeout_millis=5000).data())
    assert values == [b"m%d" % i for i in range(10)]
    consumer = client.subscribe(
        topic, "audit", consumer_type=ConsumerType.Shared, initial_position=InitialPosition.Earliest
    )
    before_acks()
    got = []
    for _ in range(5):
        msg = consumer.receive(timeout_millis=10_000)
        got.append(msg.data())
        consumer.acknowledge(msg)
    assert sorted(got) == [b"m4", b"m6", b"m7", b"m8", b"m9"]
    return consumer


def send_after_golden_scenario(client: Client, topic: str) -> None:
    """The golden producer 'gold' again: sequence id 9 (stored by the older code) is a
    duplicate, 10 is new."""
    producer = client.create_producer(topic, producer_name="gold", batching_enabled=False)
    producer.send(b"dup", sequence_id=9)
    producer.send(b"m10", sequence_id=10)
    producer.close()


def test_v1_topic_reads_end_to_end_then_upgrades_on_first_commit(tmp_path: Path) -> None:
    """A topic written by the format-1 code (tests/golden/make_v1_topic.py): its messages, its
    subscription's cursor, ack hole and negative ack, and its dedup state all carry over; the
    first commit writes a format-2 head with the closed ledgers in the catalog."""
    root = tmp_path / "root"
    shutil.copytree(GOLDEN_V1, root)
    head, d = _newest_head(root, "golden-v1")
    assert d["format"] == 1 and len(d["ledgers"]) == 4
    client = golden_client(root, d["updated"])
    consumer = read_golden_scenario(client, "golden-v1", lambda: None)
    assert _newest_head(root, "golden-v1")[0] == head  # reading commits nothing to the topic
    send_after_golden_scenario(client, "golden-v1")
    consumer.close()
    _, d = _newest_head(root, "golden-v1")
    assert d["format"] == 2
    assert [lg["id"] for lg in d["ledgers"]] == [3]  # only the open ledger is left in the head
    assert [r[:3] for r in d["catalog"]] == [[0, 2, 3]]
    assert d["dedup"]["gold"][0] == 10
    client.close()
    # A fresh process-level view (nothing cached) reads the upgraded topic end to end.
    store = open_blob_store(str(root))
    assert _read_all(store, "golden-v1") == [b"m%d" % i for i in range(11)]


def test_commit_rewrites_a_head_whose_size_does_not_grow_with_closed_ledgers(
    tmp_path: Path,
) -> None:
    """Fails on format 1 (every closed ledger was rewritten by every commit)."""
    root = tmp_path / "root"
    store = open_blob_store(str(root))
    clock = Clock()
    set_topic_policies(store, "h", ledger_max_entries=1)
    create_topic(store, "h")
    _produce(store, "h", 4, clock)
    small = len(_newest_head(root, "h")[0].raw)
    _produce(store, "h", 2 * SEG + 4, clock, start=4)
    path, d = _newest_head(root, "h")
    assert len(d["catalog"]) == 3 and sum(r[2] for r in d["catalog"]) == 2 * SEG + 8
    # 3 short references instead of 2 * SEG + 8 ledgers: the head stays small.
    assert len(path.raw) < small + 3 * 60, (small, len(path.raw))
    # A commit that does not roll over writes no catalog segment; a rollover writes one of
    # the ledgers it closes, every segment before it carried over by name.
    set_topic_policies(store, "h", ledger_max_entries=1000)
    before = _catalog_files(root, "h")
    refs_before = d["catalog"]
    _produce(store, "h", 3, clock, start=2 * SEG + 8)
    _, d = _newest_head(root, "h")
    assert _catalog_files(root, "h") == before  # 3 sends into the open ledger: no segment
    assert d["catalog"] == refs_before
    set_topic_policies(store, "h", ledger_max_entries=1)
    _produce(store, "h", 1, clock, start=2 * SEG + 11)  # closes the open ledger
    _, d = _newest_head(root, "h")
    assert len(_catalog_files(root, "h") - before) == 1
    assert d["catalog"][:3] == refs_before  # carried over by name
    assert d["catalog"][3][:3] == [2 * SEG + 8, 2 * SEG + 9, 2]  # the two ledgers it closed
    assert _read_all(store, "h") == [b"%d" % i for i in range(2 * SEG + 12)]


def test_retention_rewrites_only_the_segment_it_cuts_and_the_sweep_frees_the_rest(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    store = open_blob_store(str(root))
    clock = Clock()
    set_topic_policies(store, "r", ledger_max_entries=1, retention_size_mb=-1)
    create_topic(store, "r")
    n = SEG + 6
    _produce(store, "r", n, clock)
    _, d = _newest_head(root, "r")
    assert [r[2] for r in d["catalog"]] == [SEG] + [1] * 6  # a full segment, then one a ledger
    # Ledgers n and n + 1 close 200 minutes later, and their segments and the 6 before merge
    # into one of 8; then keep 100 minutes of closed ledgers.
    clock.now += 200 * MIN
    _produce(store, "r", 2, clock, start=n)
    _, d = _newest_head(root, "r")
    assert [r[2] for r in d["catalog"]] == [SEG, 8]
    set_topic_policies(store, "r", retention_time_minutes=100)
    report = enforce_retention(store, "r", now=clock.now)
    assert len(report.deleted_ledgers) == n  # every ledger closed at T0
    _, d = _newest_head(root, "r")
    assert [r[:3] for r in d["catalog"]] == [[n, n + 1, 2]]  # one new segment, the old are unnamed
    assert _read_all(store, "r") == [b"%d" % i for i in (n, n + 1)]
    referenced = {_seg_file(r) for r in d["catalog"]}
    sweep_orphans(store, "r", min_age_ms=0)
    left = _catalog_files(root, "r")
    assert referenced <= left
    # Segments still named by one of the newest 64 manifest versions are kept (a reader may
    # load it); this topic has fewer versions than that.
    stored = list(ManagedLedger(store, TopicName.parse("r")).manifest.stored())
    assert len(stored) < 64
    named = set()
    for _, raw in stored:
        if not envelope.is_delta(raw):  # (a delta names the catalog of the head before it)
            named |= {_seg_file(r) for r in json.loads(raw.split(b"\n")[0])["catalog"]}
    assert left == named


def test_dedup_entries_of_producers_gone_longer_than_the_timeout_are_pruned(
    tmp_path: Path,
) -> None:
    """Pulsar's brokerDeduplicationProducerInactivityTimeoutMinutes; fails on format 1,
    whose dedup map kept one entry per producer name ever seen."""
    store = open_blob_store(str(tmp_path / "root"))
    clock = Clock()
    set_topic_policies(store, "d", deduplication_enabled=True, dedup_producer_inactivity_minutes=60)
    create_topic(store, "d")
    for i in range(5):
        with Producer(store, "d", producer_name=f"p{i}", batching_enabled=False, clock=clock) as p:
            p.send(b"x", sequence_id=7)
    ml = ManagedLedger(store, TopicName.parse("d"))
    assert sorted(ml.state().dedup) == [f"p{i}" for i in range(5)]
    clock.now += 30 * MIN
    with Producer(store, "d", producer_name="p0", batching_enabled=False, clock=clock) as p:
        p.send(b"y", sequence_id=7)  # a duplicate within the window: dropped
        clock.now += 31 * MIN
        p.send(b"z", sequence_id=8)  # p0 is connected: kept; p1..p4 idle for 61 min: pruned
        assert sorted(ml.state().dedup) == ["p0"]
    assert _read_all(store, "d") == [b"x"] * 5 + [b"z"]


def test_sink_batches_keep_the_newest_queries_within_the_age_limit(tmp_path: Path) -> None:
    """Fails on format 1 (one sinkBatches entry per Spark query id, forever)."""
    store = open_blob_store(str(tmp_path / "root"))
    clock = Clock()
    set_topic_policies(store, "s", sink_batches_max=3, sink_batches_max_age_minutes=60)
    create_topic(store, "s")
    ml = ManagedLedger(store, TopicName.parse("s"), clock=clock)
    pol = effective_policies(store, ml.topic)
    attempts = itertools.count()

    def commit(query: str, batch: int) -> object:
        rb = pa.record_batch([pa.array([b"v"], pa.binary())], names=["value"])
        parts = encode_entry_parts(rb, producer_name=query, publish_time=1, first_sequence_id=0)
        staged = [
            stage(
                ml,
                [PendingEntry.of(parts, 1, 1, query, -1, -1)],
                f"{query}-{batch}-{next(attempts)}",
            )
        ]
        return commit_staged(ml, staged, policies=pol, dedup=False, writer_id=query, batch_id=batch)

    for q in "abcde":
        clock.now += 1000
        commit(q, 0)
    assert sorted(ml.state().sink_batches) == ["c", "d", "e"]  # the 3 most recently used
    assert commit("e", 0) is None  # a replayed batch of a kept query is still recognised
    assert last_committed_batch(ml, "e") == 0
    clock.now += 59 * MIN
    commit("e", 1)
    clock.now += 2 * MIN
    commit("e", 2)
    assert ml.state().sink_batches == {"e": 2}  # c and d unused for 61 minutes


def test_head_without_catalog_cannot_be_read_without_a_store(tmp_path: Path) -> None:
    root = tmp_path / "root"
    store = open_blob_store(str(root))
    set_topic_policies(store, "c", ledger_max_entries=1)
    create_topic(store, "c")
    _produce(store, "c", 3, Clock())
    path, _ = _newest_head(root, "c")
    with pytest.raises(IncompatibleFormat, match="catalog"):
        ManifestState.decode(path.raw, path.where)


UPGRADE_WRITER = textwrap.dedent(
    """
    import sys
    from filepulsar.storage import Producer, open_blob_store
    store = open_blob_store(sys.argv[1])
    p = Producer(store, "golden-v1", producer_name=sys.argv[2], batching_enabled=False)
    print("ready", flush=True)
    i = 0
    while True:
        p.send(b"c%d" % i)  # one commit each; every third closes a ledger (catalog write)
        print(i, flush=True)
        i += 1
    """
)


@pytest.mark.parametrize("round_", range(6))
@pytest.mark.procs
def test_sigkill_during_upgrade_and_catalog_writes_loses_no_acknowledged_message(
    tmp_path: Path, round_: int
) -> None:
    """A real writer process on a format-1 topic (ledgers of 3 entries) is killed with SIGKILL
    at a random instant: during its first commit (the upgrade: catalog segments, then the
    format-2 head) or a later rollover. Every acknowledged message is read back once, in
    order, after the format-1 history; the topic takes writes again; the orphan sweep removes
    only what no manifest names."""
    root = tmp_path / "root"
    shutil.copytree(GOLDEN_V1, root)
    rnd = random.Random(round_)
    proc = subprocess.Popen(
        [sys.executable, "-c", UPGRADE_WRITER, str(root), f"crash{round_}"],
        stdout=subprocess.PIPE,
        env=dict(os.environ),
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    acked = -1
    target = rnd.choice([-1, -1, 0, 2, 5, 11])  # -1: during the first send (the upgrade is
    # the producer's registration, before "ready": test_sigkill_at_each_write_of_the_upgrade)
    while acked < target:
        acked = int(proc.stdout.readline())
    time.sleep(rnd.uniform(0, 0.01))  # the kill instant, not synchronisation
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    store = open_blob_store(str(root))
    history = [b"m%d" % i for i in range(10)]
    values = _read_all(store, "golden-v1")
    assert values[:10] == history
    assert values[10:] == [b"c%d" % i for i in range(len(values) - 10)]  # once, in order
    assert len(values) - 10 >= acked + 1  # every acknowledged message
    sweep_orphans(store, "golden-v1", min_age_ms=0)
    with Producer(store, "golden-v1", batching_enabled=False) as p:
        for i in range(4):
            p.send(b"after-%d" % i)
    after = _read_all(open_blob_store(str(root)), "golden-v1")
    assert after == values + [b"after-%d" % i for i in range(4)]
    assert _newest_head(root, "golden-v1")[1]["format"] == 2
    sweep_orphans(store, "golden-v1", min_age_ms=0)
    assert _read_all(open_blob_store(str(root)), "golden-v1") == after


PAUSING_WRITER = textwrap.dedent(
    """
    import sys
    from filepulsar.storage import Producer
    from filepulsar.storage.blobstore.local import LocalBlobStore

    STOP, WHEN = int(sys.argv[3]), sys.argv[4]

    class Pausing(LocalBlobStore):
        # Counts the writes (puts, appends, deletes); at write STOP it reports and blocks
        # until the test kills the process: before the write starts or after it returned.
        writes = 0

        def _at(self, op, key, call):
            n = Pausing.writes
            Pausing.writes += 1
            if n == STOP and WHEN == "before":
                print("paused", op, key, flush=True)
                sys.stdin.readline()
            out = call()
            if n == STOP and WHEN == "after":
                print("paused", op, key, flush=True)
                sys.stdin.readline()
            return out

        def put(self, key, data):
            return self._at("put", key, lambda: super(Pausing, self).put(key, data))

        def put_if_absent(self, key, data):
            write = super().put_if_absent
            return self._at("put_if_absent", key, lambda: write(key, data))

        def delete(self, key):
            return self._at("delete", key, lambda: super(Pausing, self).delete(key))

        def open_append(self, key):
            return self._at("open_append", key, lambda: super(Pausing, self).open_append(key))

    store = Pausing(sys.argv[1])
    p = Producer(store, "golden-v1", producer_name=sys.argv[2], batching_enabled=False)
    for i in range(8):
        p.send(b"c%d" % i)  # one commit each; ledgers of 3 entries roll over (index, catalog)
        print("acked", i, flush=True)
    print("done", flush=True)
    """
)


def kill_at_pause(code: str, *args: str) -> tuple[int, str]:
    """Run a writer (``code``, with ``args``) that prints ``acked`` per acknowledged send and
    ``paused ...`` where it stops; SIGKILL it there. Returns (sends acknowledged, the pause)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    acked = 0
    paused = ""
    for line in proc.stdout:
        if line.startswith("acked"):
            acked += 1
        elif line.startswith("paused"):
            paused = line
            break
    assert paused, "the writer finished without reaching the write to stop at"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return acked, paused


def check_after_kill(root: Path, topic: str, acked: int) -> tuple[list[bytes], list[bytes]]:
    """A golden topic after its writer (sending c0, c1, ...) was killed: read by a fresh
    store, the history m0..m9 and at least the ``acked`` sends, once, in order; after the
    orphan sweep it takes a send again. Returns the values before and after that send."""
    values = _read_all(open_blob_store(str(root)), topic)
    assert values[:10] == [b"m%d" % i for i in range(10)]
    assert values[10:] == [b"c%d" % i for i in range(len(values) - 10)]  # once, in order
    assert len(values) - 10 >= acked  # every acknowledged send
    store = open_blob_store(str(root))
    sweep_orphans(store, topic, min_age_ms=0)
    with Producer(store, topic, batching_enabled=False) as p:
        p.send(b"after")
    after = _read_all(open_blob_store(str(root)), topic)
    assert after == [*values, b"after"]
    return values, after


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("stop", range(8))
@pytest.mark.procs
def test_sigkill_at_each_write_of_the_upgrade_loses_no_acknowledged_message(
    tmp_path: Path, stop: int, when: str
) -> None:
    """A real writer on a format-1 topic is killed with SIGKILL at each of its first writes,
    before or after the write: write 0 is the upgrade (the producer's registration is the
    first format-2 commit: the catalog segment, then the head, which on a local disk is the
    journal's first record, not a store write: tests/test_journal.py kills the writer at each
    journal write), then the first sends and a rollover (data append; ledger index, catalog
    segment; ...). Read back by a fresh store: the format-1 history and every acknowledged
    send, once, in order; the topic takes writes again and the orphan sweep removes nothing
    anyone needs."""
    root = tmp_path / "root"
    shutil.copytree(GOLDEN_V1, root)
    acked, paused = kill_at_pause(PAUSING_WRITER, str(root), f"kill{stop}{when}", str(stop), when)
    if stop < 2:
        assert "/catalog/" in paused if stop == 0 else "/data/" in paused
        assert acked == 0
    _, after = check_after_kill(root, "golden-v1", acked)
    assert _newest_head(root, "golden-v1")[1]["format"] == 2
    sweep_orphans(open_blob_store(str(root)), "golden-v1", min_age_ms=0)
    assert _read_all(open_blob_store(str(root)), "golden-v1") == after
