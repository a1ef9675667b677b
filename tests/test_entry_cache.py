"""The per-process entry cache (storage/entry_cache.py) on a real local root: it answers exactly
what ``ManagedLedger.read_entries`` answers (across ledger rollovers, from any start, never an
entry the given manifest state does not show), reads each entry from the store once, bounds
itself, and never serves a deleted topic's entries to the topic re-created under its name.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from filepulsar.storage import Producer, create_topic, set_topic_policies
from filepulsar.storage.blobstore import open_blob_store
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.entry_cache import EntryCache
from filepulsar.storage.ledger import EARLIEST, ManagedLedger, Position, ReadEntry
from filepulsar.storage.names import TopicName
from filepulsar.storage.topics import delete_topic

pytestmark = pytest.mark.contract


def _produce(store: BlobStore, topic: str, values: range) -> None:
    with Producer(store, topic, batching_enabled=False) as p:
        for i in values:
            p.send(b"m%d" % i)


def _ids(es: list[ReadEntry]) -> list[tuple[int, int, bytes]]:
    return [(e.ledger_id, e.entry_id, bytes(e.raw.payload)) for e in es]


def _all_positions(ml: ManagedLedger) -> list[Position]:
    m = ml.state()
    out, p = [], ml.next_position(m, EARLIEST)
    while p is not None:
        out.append(p)
        p = ml.next_position(m, p)
    return out


class _CountingLedger(ManagedLedger):
    reads = 0

    def read_entries(self, *a, **kw):  # type: ignore[no-untyped-def]
        got = super().read_entries(*a, **kw)
        _CountingLedger.reads += len(got)
        return got


def test_answers_as_the_ledger_does_and_reads_each_entry_once(tmp_path: Path) -> None:
    store = open_blob_store(str(tmp_path / "root"))
    set_topic_policies(store, "c", ledger_max_entries=4)  # rollovers every 4 entries
    create_topic(store, "c")
    _produce(store, "c", range(23))
    ml = _CountingLedger(store, TopicName.parse("c"))
    m = ml.state()
    positions = _all_positions(ml)
    assert len(positions) == 23 and len({p.ledger_id for p in positions}) >= 6
    cache = EntryCache()
    for start in [*positions[::3], positions[-1]]:
        for n in (1, 5, 40):
            want = _ids(
                ManagedLedger(store, TopicName.parse("c")).read_entries(m, start, max_entries=n)
            )
            assert _ids(cache.read_entries(ml, m, start, max_entries=n)) == want, (start, n)
    assert _CountingLedger.reads == 23  # every entry read from the store once, then cached
    # A state from before more messages: the cache (holding newer entries later) shows only
    # what that state shows.
    _produce(store, "c", range(23, 30))
    newer = ml.state()
    assert len(cache.read_entries(ml, newer, positions[0], max_entries=100)) == 30
    assert len(cache.read_entries(ml, m, positions[0], max_entries=100)) == 23


def test_bounded_by_entries_and_bytes(tmp_path: Path) -> None:
    store = open_blob_store(str(tmp_path / "root"))
    create_topic(store, "b")
    _produce(store, "b", range(50))
    ml = ManagedLedger(store, TopicName.parse("b"))
    m = ml.state()
    first = ml.next_position(m, EARLIEST)
    assert first is not None
    small = EntryCache(max_entries=10)
    assert len(small.read_entries(ml, m, first, max_entries=50)) == 50
    assert len(small) == 10
    size = ml.read_entries(m, first, max_entries=1)[0].raw.size
    tight = EntryCache(max_bytes=size * 7)
    tight.read_entries(ml, m, first, max_entries=50)
    assert len(tight) == 7


def test_a_recreated_topic_is_read_afresh(tmp_path: Path) -> None:
    store = open_blob_store(str(tmp_path / "root"))
    create_topic(store, "r")
    _produce(store, "r", range(5))
    cache = EntryCache()
    ml = ManagedLedger(store, TopicName.parse("r"))
    m = ml.state()
    old = cache.read_entries(ml, m, ml.next_position(m, EARLIEST), max_entries=10)  # type: ignore[arg-type]
    assert [bytes(e.raw.payload) for e in old] and len(old) == 5
    delete_topic(store, "r", force=True)
    create_topic(store, "r")
    _produce(store, "r", range(100, 103))
    ml = ManagedLedger(store, TopicName.parse("r"))
    m = ml.state()
    new = cache.read_entries(ml, m, ml.next_position(m, EARLIEST), max_entries=10)  # type: ignore[arg-type]
    want = ManagedLedger(store, TopicName.parse("r")).read_entries(
        m,
        ml.next_position(m, EARLIEST),
        max_entries=10,  # type: ignore[arg-type]
    )
    assert _ids(new) == _ids(want) and len(new) == 3


def test_slot_runs_give_each_owner_its_entries_of_a_window_slotted_once(tmp_path: Path) -> None:
    """Issue #27, point 4: the Key_Shared scan of a window is read and slotted once per
    process and selector; each consumer's window holds exactly the entries a scan of its own
    would find (consecutive, across rollovers, from any start), and ``own`` those of its
    slots. A consumer behind a trimmed run scans one of its own, as before."""
    from filepulsar.dispatch.hashing import hash_slot
    from filepulsar.dispatch.selectors.consistent import ConsistentHashingSelector
    from filepulsar.storage.cursor import selector_owner
    from filepulsar.storage.entry_cache import SlotRuns

    store = open_blob_store(str(tmp_path / "root"))
    set_topic_policies(store, "k", ledger_max_entries=7)
    create_topic(store, "k")
    with Producer(store, "k", batching_enabled=False) as p:
        for i in range(60):
            p.send(b"m%d" % (i % 13), partition_key=f"key-{i % 13}")
    ml = ManagedLedger(store, TopicName.parse("k"))
    m = ml.state()
    positions = _all_positions(ml)
    sel = ConsistentHashingSelector()
    for name in ("a", "b", "c"):
        sel.add_consumer(name)
    slotted: list[Position] = []

    def slot_of(e: ReadEntry) -> int:
        slotted.append(e.position)
        return hash_slot(hash(bytes(e.raw.payload)) & 0xFFFF, *sel.hash_range)

    runs = SlotRuns(run_entries=30, cache=EntryCache())
    owners = {selector_owner(sel, slot_of(e)) for e in ml.read_entries(m, positions[0])}
    slotted.clear()
    assert len(owners) >= 2
    for start in (0, 5, 14, 24):
        for owner in owners:
            w = runs.window(ml, m, positions[start], 10, sel, slot_of, owner)
            got = [w.positions[i] for i in range(w.lo, w.hi)]
            assert got == positions[start : start + 10]
            assert [w.positions[i] for i in w.own] == [
                p for p in got if selector_owner(sel, w.slots[w.positions.index(p)]) == owner
            ]
            assert w.before(positions[start]) is None
            if len(got) > 1:
                assert w.before(got[-1]) == got[-2]
    assert sorted(slotted) == positions[:34]  # each entry slotted once, for all owners
    assert runs.window(ml, m, positions[59], 10, sel, slot_of, None).last == positions[59]
    # Trimmed past a consumer that is behind: it scans a run of its own, from its start.
    w = runs.window(ml, m, positions[1], 10, sel, slot_of, None)
    assert [w.positions[i] for i in range(w.lo, w.hi)] == positions[1:11]


def test_slot_runs_without_reading_give_only_what_a_run_holds(tmp_path: Path) -> None:
    """``read=False`` (a fetch that spares the manifest read when a full window is slotted
    already): what a run holds from ``start``, never a read; None when no run holds it."""
    from filepulsar.dispatch.selectors.consistent import ConsistentHashingSelector
    from filepulsar.storage.entry_cache import SlotRuns

    store = open_blob_store(str(tmp_path / "root"))
    create_topic(store, "w")
    _produce(store, "w", range(20))
    ml = _CountingLedger(store, TopicName.parse("w"))
    m = ml.state()
    positions = _all_positions(ml)
    sel = ConsistentHashingSelector()
    sel.add_consumer("a")
    runs = SlotRuns(cache=EntryCache())
    _CountingLedger.reads = 0
    assert runs.window(ml, m, positions[0], 5, sel, lambda e: 0, None, read=False) is None
    assert _CountingLedger.reads == 0
    runs.window(ml, m, positions[0], 10, sel, lambda e: 0, None)
    assert _CountingLedger.reads == 10
    w = runs.window(ml, m, positions[4], 10, sel, lambda e: 0, None, read=False)
    assert w is not None and [w.positions[i] for i in range(w.lo, w.hi)] == positions[4:10]
    assert runs.window(ml, m, positions[12], 5, sel, lambda e: 0, None, read=False) is None
    assert _CountingLedger.reads == 10


def test_slot_runs_are_bounded_by_entries_and_bytes(tmp_path: Path) -> None:
    """The runs keep their entries (and the spans those were read in) alive: past the bound
    in entries or stored bytes, the least recently used partition's runs go."""
    from filepulsar.dispatch.selectors.consistent import ConsistentHashingSelector
    from filepulsar.storage.entry_cache import SlotRuns

    store = open_blob_store(str(tmp_path / "root"))
    sel = ConsistentHashingSelector()
    sel.add_consumer("a")
    mls = []
    for t in ("x", "y"):
        create_topic(store, t)
        _produce(store, t, range(10))
        mls.append(ManagedLedger(store, TopicName.parse(t)))
    size = mls[0].read_entries(mls[0].state(), EARLIEST, max_entries=1)[0].raw.size
    for runs in (SlotRuns(max_entries=15), SlotRuns(max_bytes=15 * size)):
        for ml in mls:
            m = ml.state()
            runs.window(ml, m, ml.next_position(m, EARLIEST), 10, sel, lambda e: 0, None)  # type: ignore[arg-type]
        x = mls[0]
        mx = x.state()
        first = x.next_position(mx, EARLIEST)
        assert first is not None
        assert runs.window(x, mx, first, 10, sel, lambda e: 0, None, read=False) is None


def test_slot_runs_of_one_partition_stay_within_the_bound(tmp_path: Path) -> None:
    """Consumers of one partition far apart scan runs of their own: past the bound the
    oldest of that partition's runs go too, never the one in use (old code evicted only
    whole partitions other than the most recent: one hot partition held several times the
    bound). (Review of s22-behind.)"""
    from filepulsar.dispatch.selectors.consistent import ConsistentHashingSelector
    from filepulsar.storage.entry_cache import SlotRuns

    store = open_blob_store(str(tmp_path / "root"))
    create_topic(store, "b")
    _produce(store, "b", range(400))
    ml = ManagedLedger(store, TopicName.parse("b"))
    m = ml.state()
    ps, q = [], ml.next_position(m, EARLIEST)
    while q is not None:
        ps.append(q)
        q = ml.next_position(m, q)
    sel = ConsistentHashingSelector()
    sel.add_consumer("a")
    runs = SlotRuns(max_entries=100, cache=EntryCache())
    for start in (0, 100, 200, 300):  # four consumers behind at different points
        w = runs.window(ml, m, ps[start], 64, sel, lambda e: 0, None)  # type: ignore[arg-type]
        assert w is not None and w.positions[w.lo] == ps[start]
        held = sum(len(r.positions) for rs in runs._runs.values() for r in rs)
        assert held <= runs.max_entries, held


def test_a_cached_small_entry_holds_its_payload_not_a_view_of_the_read(tmp_path: Path) -> None:
    """What the cache keeps of a small entry is its payload's bytes: no view of the bytes
    read (kept alive by it) for the cyclic GC to go over at every pass, 50,000 entries of
    them; a large payload (a batch) stays a view of what was read (no copy). Both decode
    the same."""
    store = open_blob_store(str(tmp_path / "root"))
    _produce(store, "s", range(3))
    with Producer(
        store,
        "b",
        batching_enabled=True,
        batching_max_messages=2000,
        batching_max_publish_delay_ms=60_000,  # (one batch of 2000, cut by its count)
    ) as p:
        for i in range(2000):
            p.send_async(b"v%06d" % i, None)
    for topic, kind in (("s", bytes), ("b", memoryview)):
        ml = ManagedLedger(store, TopicName.parse(topic))
        got = EntryCache().read_entries(ml, ml.state(), EARLIEST, max_entries=10)
        assert got and all(type(e.raw.payload) is kind for e in got), topic
        assert all(e.stored().num_rows == e.raw.header.num_messages for e in got)
