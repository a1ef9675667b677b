"""Reading a topic that several producers write one entry at a time: every commit is a fragment
of one entry, and the writers' blobs interleave in the topic's order (``bench_iot``'s gateways
write every topic so). A read of many of them (a backlog) must give exactly what reads of one
entry at a time give, and report damage and loss with the entry and blob they hit."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from filepulsar.connector.client import Client
from filepulsar.storage import TopicName, open_blob_store
from filepulsar.storage.errors import CorruptDataError, DataLossError
from filepulsar.storage.ledger import EARLIEST, ManagedLedger, Position, ReadEntry
from filepulsar.storage.manifest import LedgerInfo, ManifestState
from tests.test_journal_damage import flip

pytestmark = pytest.mark.unit

TOPIC = "persistent://public/default/interleaved"
WRITERS = 3
PER_WRITER = 12


def _write(root: Path, batches: bool = False) -> list[bytes]:
    """Three producers send in turn, each message its own commit; the values in topic order."""
    client = Client(str(root))
    try:
        producers = [
            client.create_producer(TOPIC, producer_name=f"w{i}", batching_enabled=False)
            for i in range(WRITERS)
        ]
        sent = []
        for k in range(PER_WRITER):
            for i, p in enumerate(producers):
                v = f"w{i}-{k}".encode()
                p.send(v, partition_key=f"key-{k % 5}")
                sent.append(v)
        if batches:
            # Then each producer a few messages at a time: fragments of several entries.
            for k in range(4):
                for i, p in enumerate(producers):
                    vs = [f"w{i}-b{k}-{m}".encode() for m in range(3)]
                    for v in vs:
                        p.send_async(v, None)
                    p.flush()
                    sent.extend(vs)
        for p in producers:
            p.close()
    finally:
        client.close()
    return sent


def _ledger(root: Path) -> ManagedLedger:
    return ManagedLedger(open_blob_store(str(root)), TopicName.parse(TOPIC))


def _opened(root: Path) -> tuple[ManagedLedger, ManifestState, LedgerInfo]:
    """The topic's ledger, its state and its (open) ledger."""
    ml = _ledger(root)
    state = ml.state()
    lg = state.open_ledger
    assert lg is not None
    return ml, state, lg


def _one_at_a_time(root: Path, state: ManifestState, lg: LedgerInfo) -> list[ReadEntry]:
    """Every entry read by itself (each fragment on its own: the read the runs must match)."""
    ml = _ledger(root)
    return [
        ml.read_entries(state, Position(lg.ledger_id, i), max_entries=1)[0]
        for i in range(lg.entries)
    ]


def test_interleaved_one_entry_fragments_read_as_one_at_a_time(tmp_path: Path) -> None:
    sent = _write(tmp_path)
    ml, state, lg = _opened(tmp_path)
    frags = ml.fragments(lg)
    # The shape under test: one entry a fragment, consecutive fragments in other blobs.
    assert len(frags) == len(sent) and all(f.count == 1 for f in frags)
    assert len({f.blob for f in frags}) == WRITERS
    assert all(a.blob != b.blob for a, b in itertools.pairwise(frags))

    every = _one_at_a_time(tmp_path, state, lg)
    assert [e.stored().column(0)[0].as_py() for e in every] == sent
    assert [e.position for e in every] == [Position(lg.ledger_id, i) for i in range(len(sent))]
    at_once = ml.read_entries(state, EARLIEST, max_entries=1000)
    assert [e.raw for e in at_once] == [e.raw for e in every]
    # Every window of every size (from a fresh ledger object: nothing cached) gives the same.
    for size in (1, 2, 5, 17):
        for at in range(0, len(sent), 7):
            fresh = _ledger(tmp_path)
            got = fresh.read_entries(state, Position(lg.ledger_id, at), max_entries=size)
            assert [e.position for e in got] == [e.position for e in every[at : at + size]]
            assert [e.raw for e in got] == [e.raw for e in every[at : at + size]]
    # And without a bound, to an end.
    end = Position(lg.ledger_id, 20)
    got = _ledger(tmp_path).read_entries(state, Position(lg.ledger_id, 3), end=end)
    assert [e.position.entry_id for e in got] == list(range(3, 21))


def test_a_read_of_them_fetches_each_writers_blob_once(tmp_path: Path) -> None:
    """A read of many interleaved one-entry fragments fetches each blob's run of them at
    once (its bytes from the first to the last), not each entry by itself: a fetch is a
    system call or a request, dearer than the entry's own work (the code before: 36
    fetches for 36 entries)."""
    sent = _write(tmp_path)
    ml, state, _ = _opened(tmp_path)
    fetched: list[tuple[str, int, int]] = []
    get = ml.store.get_range_view

    def counted(key: str, lo: int, hi: int) -> object:
        fetched.append((key, lo, hi))
        return get(key, lo, hi)

    ml.store.get_range_view = counted  # type: ignore[method-assign]
    got = ml.read_entries(state, EARLIEST, max_entries=1000)
    assert len(got) == len(sent)
    # (One fetch a blob, and one more for the open ledger's last fragment, which may grow:
    # read through the path that caches its offsets.)
    assert len(fetched) == WRITERS + 1 and len({k for k, _, _ in fetched}) == WRITERS


def test_damage_in_one_of_them_names_that_entry_and_its_blob(tmp_path: Path) -> None:
    _write(tmp_path)
    ml, state, lg = _opened(tmp_path)
    frag = ml.fragments(lg)[10]  # the 11th entry, in the middle of a read of them all
    key = ml._data_blob(frag.blob)
    flip(tmp_path / key, frag.offset + frag.length - 3, 2)  # a byte of its payload
    with pytest.raises(CorruptDataError) as info:
        _ledger(tmp_path).read_entries(state, EARLIEST, max_entries=1000)
    assert info.value.entry_id == 10 and info.value.ledger_id == lg.ledger_id
    assert key in str(info.value)
    # What comes before it reads as before.
    got = _ledger(tmp_path).read_entries(state, EARLIEST, max_entries=10)
    assert [e.position.entry_id for e in got] == list(range(10))


def test_a_lost_blob_is_reported_with_the_first_entry_it_held(tmp_path: Path) -> None:
    _write(tmp_path)
    ml, state, lg = _opened(tmp_path)
    frags = ml.fragments(lg)
    gone = frags[4]  # the blob of the second writer's entries (4, 7, 10, ...)
    (tmp_path / ml._data_blob(gone.blob)).unlink()
    with pytest.raises(DataLossError) as info:
        _ledger(tmp_path).read_entries(state, Position(lg.ledger_id, 2), max_entries=1000)
    assert f"entries {frags[4].first_entry}..{frags[4].first_entry}" in str(info.value)
    assert ml._data_blob(gone.blob) in str(info.value)
    # Entries before it are read.
    got = _ledger(tmp_path).read_entries(state, Position(lg.ledger_id, 2), max_entries=2)
    assert [e.position.entry_id for e in got] == [2, 3]


def test_fragments_of_several_entries_among_them_read_as_one_at_a_time(tmp_path: Path) -> None:
    sent = _write(tmp_path, batches=True)
    ml, state, lg = _opened(tmp_path)
    assert any(f.count > 1 for f in ml.fragments(lg))
    every = _one_at_a_time(tmp_path, state, lg)
    assert [e.stored().column(0)[0].as_py() for e in every] == sent
    at_once = ml.read_entries(state, EARLIEST, max_entries=1000)
    assert [e.raw for e in at_once] == [e.raw for e in every]
    for size in (1, 3, 8, 40):
        for at in range(0, len(sent), 5):
            got = _ledger(tmp_path).read_entries(
                state, Position(lg.ledger_id, at), max_entries=size
            )
            assert [e.raw for e in got] == [e.raw for e in every[at : at + size]]


def test_fragments_of_several_entries_are_fetched_with_their_blobs_run(tmp_path: Path) -> None:
    """A whole fragment of several entries (a producer's commit of a few) among interleaved
    ones comes from its blob's one fetch too, not a fetch of its own that also ended the
    blob's run (the code before: 15 fetches for the 3 blobs of this topic)."""
    sent = _write(tmp_path, batches=True)
    ml, state, lg = _opened(tmp_path)
    assert any(f.count > 1 for f in ml.fragments(lg))
    fetched: list[str] = []
    get = ml.store.get_range_view

    def counted(key: str, lo: int, hi: int) -> object:
        fetched.append(key)
        return get(key, lo, hi)

    ml.store.get_range_view = counted  # type: ignore[method-assign]
    got = ml.read_entries(state, EARLIEST, max_entries=1000)
    assert [e.raw for e in got] == [e.raw for e in _one_at_a_time(tmp_path, state, lg)]
    assert len(got) == len(sent)
    # (One fetch a blob, and one more for the open ledger's last fragment, which may grow.)
    assert len(fetched) == WRITERS + 1 and len(set(fetched)) == WRITERS


def test_damage_in_a_fragment_of_several_entries_names_that_entry(tmp_path: Path) -> None:
    """A fragment of several entries read whole from its blob's run is verified entry by
    entry: a damaged second entry is named (its ledger, entry and blob), and a read that
    stops before it reads as before."""
    _write(tmp_path, batches=True)
    ml, state, lg = _opened(tmp_path)
    frags = ml.fragments(lg)
    k = next(i for i, f in enumerate(frags) if f.count > 1)
    frag = frags[k]
    second = frag.first_entry + 1
    nxt = _ledger(tmp_path).read_entries(state, Position(lg.ledger_id, second), max_entries=1)
    assert nxt
    key = ml._data_blob(frag.blob)
    flip(tmp_path / key, nxt[0].offset + nxt[0].size - 3, 2)  # a byte of the second's payload
    with pytest.raises(CorruptDataError) as info:
        _ledger(tmp_path).read_entries(state, EARLIEST, max_entries=1000)
    assert info.value.entry_id == second and info.value.ledger_id == lg.ledger_id
    assert key in str(info.value)
    got = _ledger(tmp_path).read_entries(state, EARLIEST, max_entries=second)
    assert [e.position.entry_id for e in got] == list(range(second))


def test_a_live_read_of_the_newest_fragments_reads_as_one_at_a_time(tmp_path: Path) -> None:
    """A live reader's read: the few fragments committed since its last one, each from the
    first entry of one (``ManagedLedger._read_tail``): the same entries as reads of one at a
    time, with a fetch per fragment."""
    sent = _write(tmp_path)
    _, state, lg = _opened(tmp_path)
    every = _one_at_a_time(tmp_path, state, lg)
    n = len(sent)
    for at in range(n - 9, n):
        fresh = _ledger(tmp_path)
        fetched: list[tuple[str, int, int]] = []
        get = fresh.store.get_range_view

        def counted(key: str, lo: int, hi: int, get=get, fetched=fetched) -> object:
            fetched.append((key, lo, hi))
            return get(key, lo, hi)

        fresh.store.get_range_view = counted  # type: ignore[method-assign]
        got = fresh.read_entries(state, Position(lg.ledger_id, at), max_entries=64)
        assert [e.position for e in got] == [e.position for e in every[at:]]
        assert [e.raw for e in got] == [e.raw for e in every[at:]]
        # One fetch a fragment where at most 8 are read, each exactly its bytes; 9 go the
        # way of a backlog (a fetch per blob's run, the last fragment by itself).
        frags = fresh.fragments(lg)[at:]
        if len(frags) <= 8:
            assert fetched == [
                (fresh._data_blob(f.blob), f.offset, f.offset + f.length) for f in frags
            ]
        else:
            assert len(fetched) == WRITERS + 1
        # A bound below the entries there: the general path, the same entries.
        got = fresh.read_entries(state, Position(lg.ledger_id, at), max_entries=2)
        assert [e.raw for e in got] == [e.raw for e in every[at : at + 2]]


def test_a_live_reader_then_reads_the_last_fragments_growth_alone(tmp_path: Path) -> None:
    """After a live read of the newest fragments, the last one grows (its writer sends
    again, nobody between): the next read fetches only its new bytes (the offsets the live
    read cached)."""
    client = Client(str(tmp_path))
    try:
        producers = [
            client.create_producer(TOPIC, producer_name=f"w{i}", batching_enabled=False)
            for i in range(WRITERS)
        ]
        for k in range(3):
            for i, p in enumerate(producers):
                p.send(f"w{i}-{k}".encode())
        reader = _ledger(tmp_path)
        state = reader.state()
        lg = state.open_ledger
        assert lg is not None
        n = lg.entries
        got = reader.read_entries(state, Position(lg.ledger_id, n - 3), max_entries=64)
        assert [e.stored().column(0)[0].as_py() for e in got] == [b"w0-2", b"w1-2", b"w2-2"]
        producers[-1].send(b"more-1")
        producers[-1].send(b"more-2")
        grown = reader.state()
        glg = grown.open_ledger
        assert glg is not None and glg.ledger_id == lg.ledger_id
        last = reader.fragments(glg)[-1]
        assert last.first_entry == n - 1 and last.count == 3  # (it grew)
        fetched: list[tuple[int, int]] = []
        get = reader.store.get_range_view

        def counted(key: str, lo: int, hi: int) -> object:
            fetched.append((lo, hi))
            return get(key, lo, hi)

        reader.store.get_range_view = counted  # type: ignore[method-assign]
        got = reader.read_entries(grown, Position(lg.ledger_id, n), max_entries=64)
        assert [e.stored().column(0)[0].as_py() for e in got] == [b"more-1", b"more-2"]
        old_end = reader.fragments(lg)[-1].offset + reader.fragments(lg)[-1].length
        assert fetched == [(old_end, last.offset + last.length)]
        for p in producers:
            p.close()
    finally:
        client.close()


def test_damage_in_one_of_the_newest_fragments_names_that_entry(tmp_path: Path) -> None:
    _write(tmp_path)
    ml, state, lg = _opened(tmp_path)
    n = lg.entries
    frag = ml.fragments(lg)[n - 2]
    key = ml._data_blob(frag.blob)
    flip(tmp_path / key, frag.offset + frag.length - 3, 2)  # a byte of its payload
    with pytest.raises(CorruptDataError) as info:
        _ledger(tmp_path).read_entries(state, Position(lg.ledger_id, n - 4), max_entries=64)
    assert info.value.entry_id == n - 2 and info.value.ledger_id == lg.ledger_id
    assert key in str(info.value)
    (tmp_path / ml._data_blob(ml.fragments(lg)[n - 1].blob)).unlink()
    with pytest.raises(DataLossError) as lost:
        _ledger(tmp_path).read_entries(state, Position(lg.ledger_id, n - 1), max_entries=64)
    assert f"entries {n - 1}..{n - 1}" in str(lost.value)
