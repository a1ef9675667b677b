"""An open ledger's last fragment grows when the next entries of its blob follow it
(``filepulsar.storage.commit._extends``; ``storage/FORMAT.md``, "Manifest"): a producer sending one
message at a time keeps the manifest head a few fragments long, and readers follow a grown
fragment by locating only its new entries.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filepulsar.storage import Producer, create_topic
from filepulsar.storage.blobstore.local import LocalBlobStore
from filepulsar.storage.commit import MERGE_MAX_BYTES
from filepulsar.storage.errors import CorruptDataError
from filepulsar.storage.ledger import ManagedLedger, Position
from filepulsar.storage.names import TopicName

pytestmark = pytest.mark.unit

T = TopicName.parse("grow")


class _CountingStore(LocalBlobStore):
    """A local store that records the byte ranges read from data blobs."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.ranges: list[tuple[int, int]] = []

    def get_range(self, key: str, start: int, end: int) -> bytes:
        if key.endswith(".entries"):
            self.ranges.append((start, end))
        return super().get_range(key, start, end)

    def get_range_view(self, key: str, start: int, end: int) -> Any:
        if key.endswith(".entries") and end - start >= 256 * 1024:
            self.ranges.append((start, end))
        return super().get_range_view(key, start, end)


def _values(ml: ManagedLedger) -> list[bytes]:
    s = ml.state()
    return [e.stored(["value"]).column(0)[0].as_py() for e in ml.iter_entries(s, Position(0, 0))]


def _topic(tmp_path: Path) -> tuple[LocalBlobStore, ManagedLedger]:
    store = LocalBlobStore(str(tmp_path))
    create_topic(store, "grow")
    return store, ManagedLedger(store, T)


def _frags(ml: ManagedLedger) -> list[Any]:
    return list(ml.state().open_ledger.fragments or [])


def test_one_message_sends_grow_one_fragment(tmp_path: Path) -> None:
    store, ml = _topic(tmp_path)
    with Producer(store, "grow", batching_enabled=False) as p:
        for i in range(300):
            p.send(b"m%d" % i)
    (f,) = _frags(ml)
    assert (f.first_entry, f.count, f.messages) == (0, 300, 300)
    assert f.offset == 0
    assert f.min_publish <= f.max_publish
    assert _values(ml) == [b"m%d" % i for i in range(300)]
    # The head stays small: one fragment, whatever the number of sends.
    *_, (_, newest) = ml.manifest.stored()
    assert len(newest) < 1500


def test_a_reader_reads_only_the_new_bytes_of_a_grown_fragment(tmp_path: Path) -> None:
    store = _CountingStore(str(tmp_path))
    create_topic(store, "grow")
    reader = ManagedLedger(store, T)
    got: list[bytes] = []
    with Producer(store, "grow", batching_enabled=False) as p:
        for i in range(200):
            p.send(b"%05d" % i + b"x" * 200)
            s = reader.state()
            got += [
                e.stored(["value"]).column(0)[0].as_py()[:5]
                for e in reader.iter_entries(s, Position(0, i))
            ]
    assert got == [b"%05d" % i for i in range(200)]
    (f,) = _frags(reader)
    # Every byte of the blob was read about once (locating the new entries, then reading
    # the one asked for), not the whole fragment again at every growth.
    assert sum(b - a for a, b in store.ranges) <= 2 * f.length


def test_a_reader_on_an_older_state_reads_the_shorter_fragment(tmp_path: Path) -> None:
    store, ml = _topic(tmp_path)
    with Producer(store, "grow", batching_enabled=False) as p:
        for i in range(5):
            p.send(b"a%d" % i)
        old = ml.state()
        for i in range(5):
            p.send(b"b%d" % i)
    new = ml.state()
    assert old.open_ledger.fragments[0].count == 5
    assert new.open_ledger.fragments[0].count == 10
    # Offsets located in the longer fragment first, then the older state's shorter one.
    assert len(ml.read_entries(new, Position(0, 0))) == 10
    olds = [e.entry_id for e in ml.read_entries(old, Position(0, 2))]
    assert olds == [2, 3, 4]
    # The cached states the producer built on were not changed by the growth.
    assert old.open_ledger.fragments[0].count == 5


def test_batched_entries_and_other_blobs_start_new_fragments(tmp_path: Path) -> None:
    store, ml = _topic(tmp_path)
    with Producer(store, "grow", batching_enabled=False) as a:
        a.send(b"a0")
        a.send(b"a1")
        with Producer(store, "grow", batching_enabled=False) as b:
            b.send(b"b0")  # another session's blob
            a.send(b"a2")  # back to a's blob: not right after a's fragment in the ledger
    with Producer(store, "grow", batching_enabled=True, batching_max_messages=10) as c:
        for i in range(3):
            c.send_async(b"c%d" % i, None)
        c.flush()  # one entry of 3 messages
        c.send(b"c3")  # a batch of one: one message per entry, but after a batched one
        c.send(b"c4")  # grows c3's fragment
    frags = _frags(ml)
    assert [(f.count, f.messages) for f in frags] == [(2, 2), (1, 1), (1, 1), (1, 3), (2, 2)]
    assert len({f.blob for f in frags}) == 3


def test_a_dropped_duplicate_leaves_a_gap_no_fragment_spans(tmp_path: Path) -> None:
    from filepulsar.storage import set_topic_policies

    store = LocalBlobStore(str(tmp_path))
    set_topic_policies(store, "grow", deduplication_enabled=True)
    create_topic(store, "grow")
    ml = ManagedLedger(store, T)
    with Producer(store, "grow", batching_enabled=False, producer_name="p") as p:
        p.send(b"x0", sequence_id=0)
        p.send(b"x1", sequence_id=1)
        p.send(b"dup", sequence_id=1)  # written to the blob, dropped by the commit
        p.send(b"x2", sequence_id=2)
    frags = _frags(ml)
    assert [(f.first_entry, f.count) for f in frags] == [(0, 2), (2, 1)]
    assert frags[1].offset > frags[0].offset + frags[0].length  # the duplicate's bytes
    assert _values(ml) == [b"x0", b"x1", b"x2"]


def test_growth_stops_at_the_size_cap(tmp_path: Path) -> None:
    store, ml = _topic(tmp_path)
    big = b"v" * 1000
    n = MERGE_MAX_BYTES // 1000 // 2 + 10  # two of these runs are over the cap
    with Producer(store, "grow", batching_enabled=False) as p:
        p.send_table(pa.table({"value": [big] * n}))
        p.send_table(pa.table({"value": [big] * n}))
        p.send(big)
    frags = _frags(ml)
    assert [f.count for f in frags] == [n, n + 1]
    assert all(f.length <= MERGE_MAX_BYTES for f in frags)
    assert len(_values(ml)) == 2 * n + 1


def test_damage_in_the_grown_part_is_reported_where_it_is(tmp_path: Path) -> None:
    store, ml = _topic(tmp_path)
    with Producer(store, "grow", batching_enabled=False) as p:
        for i in range(3):
            p.send(b"ok%d" % i)
        before = ml.state()
        assert len(ml.read_entries(before, Position(0, 0))) == 3  # offsets located
        for i in range(3):
            p.send(b"ok%d" % (3 + i))
    (f,) = _frags(ml)
    assert f.count == 6
    path = tmp_path / "topics/persistent/public/default/grow/data" / f"{f.blob}.entries"
    data = bytearray(path.read_bytes())
    data[f.offset + 4 * (f.length // 6)] ^= 0xFF  # bit rot in entry 4's magic (equal sizes)
    path.write_bytes(bytes(data))
    for reader in (ml, ManagedLedger(store, T)):  # offsets of the shorter fragment / none
        with pytest.raises(CorruptDataError) as info:
            reader.read_entries(reader.state(), Position(0, 3))
        assert (info.value.ledger_id, info.value.entry_id) == (0, 4)
        assert "grow" in str(info.value)
    # What a state from before the growth names is read as it was.
    assert [e.entry_id for e in ml.read_entries(before, Position(0, 0))] == [0, 1, 2]


def test_a_checksum_failure_in_the_grown_part_is_reported_where_it_is(tmp_path: Path) -> None:
    """A live reader verifies and locates the new entries of a grown fragment in one pass: a
    damaged payload there (framing intact) still fails on that entry, naming it, at every
    read; the entry before it still reads."""
    from filepulsar.storage import ChecksumError

    store, ml = _topic(tmp_path)
    with Producer(store, "grow", batching_enabled=False) as p:
        for i in range(3):
            p.send(b"ok%d" % i)
        assert len(ml.read_entries(ml.state(), Position(0, 0))) == 3  # offsets located
        for i in range(3):
            p.send(b"ok%d" % (3 + i))
    (f,) = _frags(ml)
    path = tmp_path / "topics/persistent/public/default/grow/data" / f"{f.blob}.entries"
    data = bytearray(path.read_bytes())
    data[f.offset + 5 * (f.length // 6) - 8] ^= 0xFF  # the end of entry 4's payload
    path.write_bytes(bytes(data))
    for _ in range(2):
        with pytest.raises(ChecksumError) as info:
            ml.read_entries(ml.state(), Position(0, 3))
        assert (info.value.ledger_id, info.value.entry_id) == (0, 4)
    assert [e.entry_id for e in ml.read_entries(ml.state(), Position(0, 3), max_entries=1)] == [3]


def test_a_whole_fragment_scan_locates_its_entries_once(tmp_path: Path) -> None:
    """A first read of a whole fragment fetches it once and verifies its entries without a
    separate framing pass; where they start is remembered, so a later read of a few entries
    fetches only theirs. A scan that skipped a damaged entry remembers nothing, and later
    reads still find every intact entry."""
    store = _CountingStore(str(tmp_path))
    create_topic(store, "grow")
    with Producer(store, "grow", batching_enabled=False) as p:
        for i in range(50):
            p.send(b"%03d" % i + b"x" * 8000)
    (f,) = _frags(ManagedLedger(store, T))
    reader = ManagedLedger(store, T)
    s = reader.state()
    scanned = reader.read_entries(s, Position(0, 0))
    assert [e.entry_id for e in scanned] == list(range(50))
    assert store.ranges == [(f.offset, f.offset + f.length)]
    few = reader.read_entries(s, Position(0, 10), end=Position(0, 12))
    assert [e.stored(["value"]).column(0)[0].as_py()[:3] for e in few] == [b"010", b"011", b"012"]
    lo, hi = scanned[10].raw.offset, scanned[13].raw.offset
    assert store.ranges[1:] in ([], [(lo, hi)])  # 3 entries: under get_range_view's threshold

    path = tmp_path / "topics/persistent/public/default/grow/data" / f"{f.blob}.entries"
    data = bytearray(path.read_bytes())
    data[scanned[5].raw.offset + scanned[5].raw.size - 16] ^= 0xFF  # entry 5's payload
    path.write_bytes(bytes(data))
    skipped: list[Exception] = []
    fresh = ManagedLedger(store, T)
    got = [e.entry_id for e in fresh.iter_entries(s, Position(0, 0), on_error=skipped.append)]
    assert got == [i for i in range(50) if i != 5]
    assert len(skipped) == 1 and "entry 5" in str(skipped[0])
    with pytest.raises(CorruptDataError) as info:
        fresh.read_entries(s, Position(0, 3), end=Position(0, 7))
    assert info.value.entry_id == 5
    assert [e.entry_id for e in fresh.read_entries(s, Position(0, 6), end=Position(0, 8))] == [
        6,
        7,
        8,
    ]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 3), max_size=12),
    st.lists(st.integers(0, 3), max_size=12),
)
def testcommon_prefix_equals_the_plain_loop(a: list[int], b: list[int]) -> None:
    """The memo's prefix check (one pass of C for the usual case: all but the last item the
    same) counts what a plain item-by-item loop counts, for any two lists."""
    import operator

    from filepulsar.storage.fragments import common_prefix

    plain = 0
    for x, y in zip(a, b):
        if x != y:
            break
        plain += 1
    assert common_prefix(a, b, operator.eq) == plain
    assert common_prefix(b, a, operator.eq) == plain


def test_a_live_reader_fetches_each_new_entry_once_and_extends_its_offsets_in_place(
    tmp_path: Path,
) -> None:
    """A reader following a fragment entry by entry (a live consumer's look: the entries from
    the one after its last) fetches the new bytes once per read, and the fragment's cached
    offsets grow in place: a copy of them per read grew with the fragment (up to
    ``ledger_max_entries``, 50,000 entries)."""
    store = _CountingStore(str(tmp_path))
    create_topic(store, "grow")
    reader = ManagedLedger(store, T)
    with Producer(store, "grow", batching_enabled=False) as p:
        p.send(b"first")
        assert len(reader.read_entries(reader.state(), Position(0, 0))) == 1
        (f,) = _frags(reader)
        offsets = reader._offsets[(f.blob, f.offset)]
        store.ranges.clear()
        for i in range(1, 40):
            p.send(b"m%d" % i)
            if i % 3:
                p.send(b"n%d" % i)  # (two new entries for some reads)
            s = reader.state()
            start = Position(0, len(offsets) - 1)
            got = reader.read_entries(s, start)
            assert [e.entry_id for e in got] == list(
                range(start.entry_id, s.last_position().entry_id + 1)
            )
            assert reader._offsets[(f.blob, f.offset)] is offsets
    (f,) = _frags(reader)
    assert len(store.ranges) == 39 and sum(b - a for a, b in store.ranges) == f.length - offsets[1]
    assert list(offsets) == [
        e.raw.offset for e in reader.read_entries(reader.state(), Position(0, 0))
    ] + [f.offset + f.length]


def test_readers_sharing_a_ledger_follow_a_growing_fragment_on_threads(tmp_path: Path) -> None:
    """The offsets of a fragment grow in place while other threads read through the same
    managed ledger (a process's consumers share one): every reader, live or on an older
    state, gets every entry with its own value, in order."""
    store, ml = _topic(tmp_path)
    n = 150
    done = threading.Event()
    got: dict[int, list[bytes]] = {}
    errors: list[BaseException] = []

    def follow(k: int) -> None:
        seen: list[bytes] = []
        try:
            while len(seen) < n:
                finished = done.is_set()  # (before the read: then it holds every entry)
                s = ml.state()
                if s.last_position().entry_id < len(seen):
                    if finished:
                        break  # (a reader that lost entries: the assertion says so)
                    continue
                for e in ml.read_entries(s, Position(0, len(seen)), max_entries=k):
                    seen.append(e.stored(["value"]).column(0)[0].as_py())
        except BaseException as e:  # reported by the main thread
            errors.append(e)
        got[k] = seen

    readers = [threading.Thread(target=follow, args=(k,)) for k in (1, 2, 3, 1000)]
    with Producer(store, "grow", batching_enabled=False) as p:
        p.send(b"v0")
        for t in readers:
            t.start()
        olds = []
        for i in range(1, n):
            p.send(b"v%d" % i)
            if i % 25 == 0:
                olds.append(ml.state())
    done.set()
    for t in readers:
        t.join()
    assert not errors
    assert all(v == [b"v%d" % i for i in range(n)] for v in got.values())
    for old in olds:  # (states from before later growths read as they were)
        last = old.last_position().entry_id
        assert [e.entry_id for e in ml.read_entries(old, Position(0, 0))] == list(range(last + 1))
