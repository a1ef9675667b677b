"""A bit flipped in a stored journal file (issue #31, defect 1; storage/FORMAT.md, "Journal",
"Damage and torn tails").

A topic written by a real producer and a subscription acknowledged by a real consumer; then one
bit of one of their journal segments is flipped in place on the disk, at every byte offset of
every segment: a reader either gets exactly the state it got before, or CorruptDataError naming
the segment and the offset of the damaged record; a writer refuses what a reader refuses and
writes over nothing. Damage at the true tail that a crash leaves (a record cut short, garbage
after the last record) is still written over as a torn write."""

from __future__ import annotations

import os
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from filepulsar.storage import Producer, create_topic, paths
from filepulsar.storage.blobstore import open_blob_store
from filepulsar.storage.errors import CorruptDataError
from filepulsar.storage.ledger import ManagedLedger, Position
from filepulsar.storage.names import TopicName
from filepulsar.storage.subscription import SubscriptionConsumer
from filepulsar.storage.subscriptions import SubscriptionStore
from filepulsar.storage.versioned import journal, record

pytestmark = pytest.mark.unit

TOPIC = TopicName.parse("t")
TOPIC_DIR = Path("topics/persistent/public/default/t")
FOLDERS = {"manifest": TOPIC_DIR / "manifest", "subscription": TOPIC_DIR / "subscriptions/s/state"}
N = 30
#: Small segments, so that each journal spans a sealed segment and the newest one.
SMALL_SEGMENT = 8 * 1024


def _messages(root: Path) -> list[tuple[int, int, bytes]]:
    """Every message of the topic: (ledger id, entry id, value), read by a fresh reader."""
    ml = ManagedLedger(open_blob_store(str(root)), TOPIC)
    out = []
    for e in ml.read_entries(ml.state(), Position(-1, -1)):
        for v in e.raw.messages().column("value").to_pylist():
            out.append((e.ledger_id, e.entry_id, v))
    return out


def _acked(root: Path, ids: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Which of ``ids`` the subscription's newest state holds acknowledged (a fresh reader)."""
    state = SubscriptionStore(open_blob_store(str(root)), TOPIC, "s").latest()
    return [p for p in ids if state.is_acked(p)]


def _consumer(root: Path) -> SubscriptionConsumer:
    return SubscriptionConsumer(
        open_blob_store(str(root)), TOPIC, "s", sub_type="Shared", initial_position="Earliest"
    )


@dataclass
class Scenario:
    root: Path
    ids: list[tuple[int, int]]  # the messages' ids, in order
    acked: list[tuple[int, int]]  # those the subscription acknowledged


def _write(root: Path) -> Scenario:
    """N messages, each its own send (one commit each); a Shared consumer receives them all
    and acknowledges every other one (one commit each), then leaves."""
    store = open_blob_store(str(root))
    create_topic(store, "t")
    c = _consumer(root)
    with Producer(store, "t", batching_enabled=False) as p:
        ids = [(m.ledger_id, m.entry_id) for m in (p.send(b"m%d" % i) for i in range(N))]
    got = []
    while ds := c.fetch(10):
        got.extend(ds)
    assert [(d.position.ledger_id, d.position.entry_id) for d in got] == ids
    for d in got[::2]:
        c.acknowledge([(d.position, -1, 1)])
    c.close()
    return Scenario(root, ids, ids[::2])


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    """The scenario with small segments (each journal: a sealed segment and the newest)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(journal, "SEGMENT_BYTES", SMALL_SEGMENT)
        return _write(tmp_path_factory.mktemp("small") / "root")


@pytest.fixture(scope="module")
def _big(tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    return _write(tmp_path_factory.mktemp("big") / "root")


@pytest.fixture
def big(_big: Scenario, tmp_path: Path) -> Scenario:
    """The scenario with the default segments (each journal: one segment), a copy of its own
    (its folders are damaged and written to)."""
    shutil.copytree(_big.root, tmp_path / "root")
    return Scenario(tmp_path / "root", _big.ids, _big.acked)


def _segments(root: Path, kind: str) -> list[Path]:
    return sorted((root / FOLDERS[kind]).glob("*" + paths.JOURNAL_SUFFIX))


def flip(path: Path, offset: int, bit: int) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        b = os.pread(fd, 1, offset)[0]
        os.pwrite(fd, bytes((b ^ (1 << bit),)), offset)
    finally:
        os.close(fd)


def _scan(path: Path) -> tuple[list[record.Record], record.Tail]:
    """The records of segment ``path`` and where they end, as a scan from its start reads
    them."""
    first = paths.journal_first(path.name)
    assert first is not None
    s = journal._Segment(str(path), first)
    try:
        recs: list[record.Record] = []
        return recs, s.scan(0, None, recs)
    finally:
        s.close()


def _layout(path: Path) -> tuple[list[tuple[int, int]], bool]:
    """The (start, end) of every record of segment ``path`` and of its seal, if any; whether
    it has one."""
    recs, tail = _scan(path)
    spans = [(r.offset, r.end) for r in recs]
    if tail.sealed >= 0:
        spans.append((tail.end, tail.end + record.SEAL_SIZE))
    return spans, tail.sealed >= 0


def _read(root: Path, kind: str, pos: tuple[int, int, int, int] | None) -> tuple[int, bytes] | None:
    """The newest record of a journal, read from ``pos`` by a fresh reader (the reading
    primitive of every versioned state on a local disk); None if there is none after it."""
    store = open_blob_store(str(root))
    j = journal.Journal(str(root / FOLDERS[kind]), store.local_path, kind)
    try:
        rec, _ = j.read_from(pos)
    finally:
        j.close()
    return None if rec is None else (rec.version, rec.payload)


@pytest.mark.parametrize("kind", ["manifest", "subscription"])
def test_every_flipped_bit_of_a_journal_is_reported_where_it_is_or_changes_nothing(
    small: Scenario, kind: str
) -> None:
    """One bit flipped at every byte offset of every segment of the topic's and the
    subscription's journals (bit ``offset % 8``), read by a fresh reader from the start of
    the segment (of the sealed one: a reader that read up to there before); in record headers
    and mark bytes, each of their 8 bits in turn. A bit in a record
    makes CorruptDataError naming the segment and that record's offset, never a shorter log;
    a bit past the records (the zeros, what follows a seal) changes nothing. Reading never
    writes to a damaged segment."""
    segs = _segments(small.root, kind)
    assert len(segs) == 2, segs  # a sealed segment and the newest
    want = _read(small.root, kind, None)
    for seg in segs:
        first = paths.journal_first(seg.name)
        assert first is not None
        pos = None if seg == segs[-1] else (first, 0, first, -1)
        assert _read(small.root, kind, pos) == want
        spans, sealed = _layout(seg)
        seal_mark = spans[-1][1] - 1 if sealed else -1  # (never read)
        size = seg.stat().st_size
        owner = [-1] * size  # the start of the record (or seal) holding each byte
        every_bit = set()  # header and mark bytes: each of their bits; other bytes: one
        for start, end in spans:
            owner[start:end] = [start] * (end - start)
            every_bit.update(range(start, start + record.HEAD_SIZE), (end - 1,))
        trials = [(o, b) for o in range(size) for b in (range(8) if o in every_bit else (o % 8,))]
        for off, bit in trials:
            flip(seg, off, bit)
            damaged = seg.read_bytes()
            try:
                got = _read(small.root, kind, pos)
            except CorruptDataError as e:
                at = owner[off]
                assert at >= 0, f"{seg.name}: bit {bit} at {off}, past the records: {e}"
                assert re.search(rf"{re.escape(str(seg))} at offset {at}\b", str(e)), (off, e)
            else:
                assert got == want, f"{seg.name}: bit {bit} at {off} changed what is read"
                assert owner[off] < 0 or off == seal_mark, f"{seg.name}: bit {bit} at {off} missed"
            assert seg.read_bytes() == damaged, f"reading wrote to {seg.name} (bit {bit} at {off})"
            flip(seg, off, bit)


def _fields(seg: Path) -> dict[str, int]:
    """Byte offsets of ``seg`` to damage: each header field and the mark of its middle and
    last records, a payload byte, the first byte after the records."""
    spans, _ = _layout(seg)
    mid, last = spans[len(spans) // 2], spans[-1]
    out = {}
    for name, (start, end) in (("middle", mid), ("last", last)):
        for field, at in (("magic", 1), ("version", 4), ("deps-length", 12), ("length", 17)):
            out[f"{name}-{field}"] = start + at
        out[f"{name}-crc"] = start + 22
        out[f"{name}-payload"] = (start + end) // 2
        out[f"{name}-mark"] = end - 1
    out["after-the-records"] = last[1]
    return out


DAMAGE = [
    f"{rec}-{field}"
    for rec in ("middle", "last")
    for field in ("magic", "version", "deps-length", "length", "crc", "payload", "mark")
]


def test_the_issue_a_flipped_length_bit_mid_segment_is_reported_not_a_shorter_topic(
    big: Scenario,
) -> None:
    """Issue #31's report: a bit of the payload length of a record in the middle of the topic's
    segment. The topic read 14 of its 30 messages, and the next send was written over the
    records after the bit (reusing an id already given). Now: reading and sending fail with
    CorruptDataError naming the segment and the record's offset, and nothing is written; with
    the bit repaired every message is there and the next send gets a new id."""
    (seg,) = _segments(big.root, "manifest")
    at = _fields(seg)["middle-length"]
    start = max(s for s, _ in _layout(seg)[0] if s <= at)
    before = _messages(big.root)
    assert [(lg, e) for lg, e, _ in before] == big.ids
    flip(seg, at, 0)
    damaged = seg.read_bytes()
    where = rf"{re.escape(str(seg))} at offset {start}\b"
    with pytest.raises(CorruptDataError, match=where):
        _messages(big.root)
    with (
        pytest.raises(CorruptDataError, match=where),
        Producer(open_blob_store(str(big.root)), "t", batching_enabled=False) as p,
    ):
        p.send(b"after")
    assert seg.read_bytes() == damaged, "a writer wrote past the damage"
    flip(seg, at, 0)  # repaired
    assert _messages(big.root) == before
    with Producer(open_blob_store(str(big.root)), "t", batching_enabled=False) as p:
        new = p.send(b"after")
    assert (new.ledger_id, new.entry_id) not in big.ids
    assert _messages(big.root) == [*before, (new.ledger_id, new.entry_id, b"after")]


def test_a_flipped_bit_in_a_subscription_journal_does_not_undo_acknowledgements(
    big: Scenario,
) -> None:
    """A bit of the payload length of a record in the middle of the subscription's journal:
    the acknowledgements after it used to be silently undone (acknowledged messages delivered
    again). Now a consumer connecting fails with CorruptDataError naming the segment and
    offset, and writes nothing; repaired, it is handed exactly the unacknowledged messages."""
    (seg,) = _segments(big.root, "subscription")
    at = _fields(seg)["middle-length"]
    start = max(s for s, _ in _layout(seg)[0] if s <= at)
    assert _acked(big.root, big.ids) == big.acked
    flip(seg, at, 0)
    damaged = seg.read_bytes()
    where = rf"{re.escape(str(seg))} at offset {start}\b"
    with pytest.raises(CorruptDataError, match=where):
        _acked(big.root, big.ids)
    with pytest.raises(CorruptDataError, match=where):
        _consumer(big.root)
    assert seg.read_bytes() == damaged, "a writer wrote past the damage"
    flip(seg, at, 0)
    c = _consumer(big.root)
    got = []
    while ds := c.fetch(10):
        got.extend((d.position.ledger_id, d.position.entry_id) for d in ds)
    c.close()
    assert got == [p for p in big.ids if p not in big.acked]


@pytest.mark.parametrize("kind", ["manifest", "subscription"])
@pytest.mark.parametrize("damage", [*DAMAGE, "after-the-records"])
def test_a_writer_after_a_flipped_bit_refuses_or_writes_over_nothing(
    big: Scenario, kind: str, damage: str
) -> None:
    """A bit flipped in one field of a record (the middle or the last of its segment), or
    just after the records; then a real writer (a producer's send; a consumer connecting and
    acknowledging). Where a reader reports the damage the writer fails with the same error
    and the folder is byte for byte as it was; where the bit is harmless, the write lands
    after the records and everything acknowledged is still there, each id given once."""
    root = big.root
    (seg,) = _segments(root, kind)
    at = _fields(seg)[damage]
    flip(seg, at, at % 8)
    folder = root / FOLDERS[kind]
    files = {p.name: p.read_bytes() for p in folder.iterdir()}
    try:
        _read(root, kind, None)
        harmless = True
    except CorruptDataError:
        harmless = False
    assert harmless == (damage == "after-the-records"), damage
    if not harmless:
        with pytest.raises(CorruptDataError, match=re.escape(str(seg))):
            if kind == "manifest":
                with Producer(open_blob_store(str(root)), "t", batching_enabled=False) as p:
                    p.send(b"after")
            else:
                _consumer(root)
        assert {p.name: p.read_bytes() for p in folder.iterdir()} == files
        flip(seg, at, at % 8)  # repaired: all there, as before
    if kind == "manifest":
        with Producer(open_blob_store(str(root)), "t", batching_enabled=False) as p:
            new = p.send(b"after")
        assert (new.ledger_id, new.entry_id) not in big.ids
        assert [(lg, e) for lg, e, _ in _messages(root)] == [
            *big.ids,
            (new.ledger_id, new.entry_id),
        ]
    else:
        c = _consumer(root)
        got = []
        while ds := c.fetch(10):
            got.extend(ds)
            c.acknowledge([(d.position, -1, 1) for d in ds])
        c.close()
        assert [(d.position.ledger_id, d.position.entry_id) for d in got] == [
            p for p in big.ids if p not in big.acked
        ]
        assert _acked(root, big.ids) == big.ids


# --------------------------------------------------------------------------- torn tails
def _tail(seg: Path) -> tuple[int, bytes]:
    """The offset after the last record of ``seg`` and a record that could follow it (the
    last record again, as the next version, not marked): what a writer appends next."""
    recs, tail = _scan(seg)
    last = recs[-1]
    deps = record.decode_deps(last.deps, str(seg), last.offset)
    return tail.end, record.encode_record(last.version + 1, last.payload, deps, marked=False)


TORN = {
    # the header and half the rest written, the mark not: the writer died writing it
    "record-cut-short": lambda rec: rec[: len(rec) // 2],
    # only part of the header written
    "header-cut-short": lambda rec: rec[:10],
    # whole, but one byte of its payload not written (still zero)
    "a-byte-missing": lambda rec: rec[:40] + b"\0" + rec[41:],
    # garbage after the last record (what an older torn write left)
    "garbage": lambda rec: random.Random(31).randbytes(300),
}


@pytest.mark.parametrize("kind", ["manifest", "subscription"])
@pytest.mark.parametrize("torn", sorted(TORN))
@pytest.mark.parametrize("at_eof", [False, True], ids=["in-zeros", "cut-by-eof"])
def test_a_torn_tail_is_still_written_over(
    big: Scenario, kind: str, torn: str, at_eof: bool
) -> None:
    """What a crash mid-append leaves after the last record (a record cut short, part of a
    header, a record with a byte missing, garbage), in the segment's zeros or with the file
    ending there: readers read what they read before, and the next writer writes over it;
    every acknowledged message and acknowledgement is still there."""
    (seg,) = _segments(big.root, kind)
    end, rec = _tail(seg)
    junk = TORN[torn](rec)
    with open(seg, "r+b") as f:
        f.seek(end)
        f.write(junk)
        if at_eof:
            f.truncate(end + len(junk))
    assert _messages(big.root) == [(*p, b"m%d" % i) for i, p in enumerate(big.ids)]
    assert _acked(big.root, big.ids) == big.acked
    if kind == "manifest":
        with Producer(open_blob_store(str(big.root)), "t", batching_enabled=False) as p:
            new = p.send(b"after")
        assert [(lg, e) for lg, e, _ in _messages(big.root)] == [
            *big.ids,
            (new.ledger_id, new.entry_id),
        ]
    else:
        c = _consumer(big.root)
        while ds := c.fetch(10):
            c.acknowledge([(d.position, -1, 1) for d in ds])
        c.close()
        assert _acked(big.root, big.ids) == big.ids


def test_a_follower_that_met_damage_does_not_serve_the_state_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader following a watched journal (a consumer's topic) that meets a damaged record
    reports it at every look, not once: the failing look must not count as having read what
    landed (old code advanced its inotify stamp first, and the next look within the recheck
    interval returned the state before the damage as the newest, silently)."""
    from filepulsar.storage.versioned.watch import CommitWaiter

    monkeypatch.setenv("FILEPULSAR_WATCH_RECHECK_MS", "60000")
    store = open_blob_store(str(tmp_path))
    create_topic(store, "t")
    writer, reader = ManagedLedger(store, TOPIC), ManagedLedger(store, TOPIC)
    waiter = CommitWaiter(store, [paths.manifest_dir(TOPIC)])  # the folder is watched
    try:
        writer.manifest.commit(lambda s: s.note_dedup("p", 1, 1))
        assert reader.state().dedup == {"p": 1}
        folder = tmp_path / FOLDERS["manifest"]
        before = {f: f.read_bytes() for f in folder.iterdir()}
        writer.manifest.commit(lambda s: s.note_dedup("p", 2, 2))
        (seg,) = [f for f in folder.iterdir() if f.read_bytes() != before.get(f)]
        old, new = before[seg], seg.read_bytes()
        first = next(i for i in range(len(new)) if old[i : i + 1] != new[i : i + 1])
        last = max(i for i in range(len(new)) if old[i : i + 1] != new[i : i + 1])
        with open(seg, "r+b") as f:  # one bit of the new record, in place
            at = (first + last) // 2
            f.seek(at)
            f.write(bytes((new[at] ^ 0x10,)))
        for _ in range(2):
            with pytest.raises(CorruptDataError):
                reader.state()
    finally:
        waiter.close()


def test_a_follower_whose_fold_failed_reads_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same where the record's bytes are whole but this reader cannot fold it: a delta
    record of a newer delta format, as a writer of a later version would write it (here this
    version's record with its format number raised, its checksums made anew). Each look reads
    it again and refuses it, never serving the state before it as the newest (old code did,
    until the recheck interval passed); once the record is one it folds (the bytes as this
    version wrote them), the next look folds it."""
    from filepulsar.storage import jsontext
    from filepulsar.storage.errors import IncompatibleFormat
    from filepulsar.storage.manifest import DELTA_FORMAT
    from filepulsar.storage.versioned import envelope
    from filepulsar.storage.versioned.watch import CommitWaiter

    monkeypatch.setenv("FILEPULSAR_WATCH_RECHECK_MS", "60000")
    store = open_blob_store(str(tmp_path))
    create_topic(store, "t")
    writer, reader = ManagedLedger(store, TOPIC), ManagedLedger(store, TOPIC)
    waiter = CommitWaiter(store, [paths.manifest_dir(TOPIC)])
    try:
        writer.manifest.commit(lambda s: s.note_dedup("p", 1, 1))
        assert reader.state().dedup == {"p": 1}
        writer.manifest.commit(lambda s: s.note_dedup("p", 2, 2))
        folder = tmp_path / FOLDERS["manifest"]
        rec = _records(folder)[-1]
        assert envelope.is_delta(rec.payload) and rec.deps == b""
        seg = folder / paths.journal_segment(rec.segment)
        ours = record.encode_record(rec.version, rec.payload, marked=True)
        assert seg.read_bytes()[rec.offset : rec.end] == ours  # the record, re-encoded
        body = jsontext.unframe(rec.payload, "the delta")
        newer = body.replace(b'"delta":%d' % DELTA_FORMAT, b'"delta":%d' % (DELTA_FORMAT + 1))
        assert newer != body
        theirs = record.encode_record(rec.version, jsontext.frame(newer), marked=True)
        assert len(theirs) == len(ours)
        _write_at(seg, rec.offset, theirs)
        for _ in range(2):
            with pytest.raises(IncompatibleFormat, match=f"this code reads {DELTA_FORMAT}"):
                reader.state()
        _write_at(seg, rec.offset, ours)
        assert reader.state().dedup == {"p": 2}
    finally:
        waiter.close()


def _records(folder: Path) -> list[record.Record]:
    """The journal records of ``folder``, oldest first."""
    j = journal.Journal(str(folder), lambda k: None, "t")
    try:
        return list(j.records())
    finally:
        j.close()


def _write_at(path: Path, offset: int, data: bytes) -> None:
    """``data`` over the bytes of ``path`` at ``offset``, in place."""
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)
