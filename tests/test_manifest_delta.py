"""Delta records of the manifest (storage/FORMAT.md, "Delta records"): a commit whose change a
delta says is written as that change, and a reader holding the version before folds it on.
The folded state must be the state a full record would have decoded to, byte for byte once
encoded again; a delta that does not follow the record before it, or is damaged, is an error
naming its segment and offset, never a state silently folded.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filepulsar.storage import Producer, create_topic, jsontext, paths, set_topic_policies
from filepulsar.storage.blobstore import open_blob_store
from filepulsar.storage.catalog import Catalog, SegmentRef
from filepulsar.storage.errors import CorruptDataError
from filepulsar.storage.fragments import Fragment, FragmentMemo
from filepulsar.storage.ledger import ManagedLedger
from filepulsar.storage.manifest import LedgerInfo, ManifestState, ManifestStore, ProducerLease
from filepulsar.storage.names import TopicName
from filepulsar.storage.position import Position
from filepulsar.storage.versioned import NoBase, envelope, journal, record
from tests.test_journal_damage import flip

pytestmark = pytest.mark.property

TOPIC = "persistent://public/default/delta"


def _base() -> ManifestState:
    s = ManifestState(
        topic=TOPIC,
        partition=-1,
        version=5,
        next_ledger_id=2,
        ledgers=[
            LedgerInfo(0, 4, 7, 512, 1, 2, 1, 4, None, "ledgers/x.index"),
            LedgerInfo(1, 1, 1, 10, 5, None, 5, 5, [Fragment("b-0", 0, 1, 0, 10, 1, 5, 5)]),
        ],
        producers={"p0": ProducerLease.from_json("p0", ["s0", "Shared", 0, 99])},
        dedup={"p0": 3},
        dedup_used={"p0": 5},
        updated_ms=5,
        commit_id=uuid.uuid4().hex,
    )
    return ManifestState.decode(s.encode(), "base")


# One step of a commit sequence: what a change may do to the state.
_STEPS = st.lists(
    st.sampled_from(
        [
            "append",
            "grow",
            "dedup",
            "dedup_new",
            "dedup_del",
            "dedup_readd",
            "producer",
            "producer_del",
            "sink",
            "epoch",
            "trim",
            "rollover",
            "nothing",
        ]
    ),
    min_size=1,
    max_size=3,
)


def _change(s: ManifestState, steps: list[str], n: int, rnd: st.DataObject) -> None:
    lg = s.open_ledger
    assert lg is not None and lg.fragments is not None
    for step in steps:
        names = list(s.dedup)
        if step == "append":
            last = lg.fragments[-1]
            k = rnd.draw(st.integers(1, 3))
            lg.fragments.append(Fragment(f"b-{n}", lg.entries, k, 0, 10 * k, k, n, n + 1))
            lg.entries += k
            lg.messages += k
            lg.size += 10 * k
            lg.max_publish = max(lg.max_publish, last.max_publish, n + 1)
        elif step == "grow":
            f = lg.fragments[-1]
            lg.fragments[-1] = Fragment(
                f.blob, f.first_entry, f.count + 1, f.offset, f.length + 7, f.messages + 1,
                f.min_publish, n,
            )  # fmt: skip
            lg.entries += 1
            lg.messages += 1
        elif step == "dedup" and names:
            s.note_dedup(rnd.draw(st.sampled_from(names)), n, s.updated_ms + n)
        elif step == "dedup_new":
            s.note_dedup(f"p{n}-{rnd.draw(st.integers(0, 9))}", n, n)
        elif step == "dedup_del" and names:
            name = rnd.draw(st.sampled_from(names))
            del s.dedup[name]
            s.dedup_used.pop(name, None)
        elif step == "dedup_readd" and len(names) > 1:
            name = names[0]  # removed and added again: it moves to the end of the map
            del s.dedup[name]
            s.note_dedup(name, n, n)
        elif step == "producer":
            name = f"p{rnd.draw(st.integers(0, 3))}"
            s.producers[name] = ProducerLease.from_json(name, [f"s{n}", "Shared", n, n + 1000])
        elif step == "producer_del" and s.producers:
            del s.producers[rnd.draw(st.sampled_from(sorted(s.producers)))]
        elif step == "sink":
            s.note_sink_batch(f"q{rnd.draw(st.integers(0, 2))}", n, n)
        elif step == "epoch":
            s.topic_epoch += 1
        elif step == "trim":
            s.trimmed_messages += 1
            s.trimmed_last = (0, n)
        elif step == "rollover":
            lg.closed_ms = n
            lg.index = f"ledgers/i{n}.index"
            lg.fragments = None
            lg = LedgerInfo(s.next_ledger_id, 1, 1, 10, n, None, n, n)
            lg.fragments = [Fragment(f"b-{n}", 0, 1, 0, 10, 1, n, n)]
            s.ledgers.append(lg)
            s.next_ledger_id += 1


@settings(max_examples=60, deadline=None)
@given(st.lists(_STEPS, min_size=1, max_size=40), st.data())
def test_folded_deltas_equal_full_records_byte_for_byte(
    commits: list[list[str]], rnd: st.DataObject
) -> None:
    """A random run of commits: each is written as a delta where one says it, and a reader
    holding the version before folds it on; the folded state encodes to exactly the full
    record's bytes, and equals the full record decoded."""
    writer = _base()
    reader = ManifestState.decode(writer.encode(), "reader")
    deltas = 0
    for n, steps in enumerate(commits, start=10):
        new = writer.copy()
        _change(new, steps, n, rnd)
        raw = envelope.stamp_next(new, writer, 1000 + n, None, lambda s: s.encode())
        delta = new.delta_from(writer)
        if "rollover" in steps:
            assert delta is None  # a ledger added: a full record
        if set(steps) <= {"append", "grow", "dedup", "epoch", "nothing"}:
            assert delta is not None  # what one append changes is always a delta
        if delta is None:
            reader = ManifestState.decode(raw, f"full {n}")
        else:
            deltas += 1
            assert envelope.is_delta(delta)
            reader = reader.fold(delta, f"delta {n}")
            assert reader.encode() == raw
            assert reader == ManifestState.decode(raw, f"full {n}")
        writer = new
    assert reader.encode() == writer.encode()


def test_a_delta_folds_only_onto_its_base() -> None:
    base = _base()
    new = base.copy()
    new.dedup["p0"] = 4
    envelope.stamp_next(new, base, 10, None, lambda s: b"")
    delta = new.delta_from(base)
    assert delta is not None
    with pytest.raises(NoBase, match="follows version 5"):
        new.fold(delta, "x")  # (version 6 is not its base)
    other = base.copy()
    other.commit_id = "another"
    with pytest.raises(NoBase):
        other.fold(delta, "x")
    assert base.fold(delta, "x").dedup == {"p0": 4}
    assert base.dedup == {"p0": 3}  # the base is not changed


def _topic(tmp_path: Path, name: str) -> tuple[str, Path]:
    root = str(tmp_path / "root")
    create_topic(open_blob_store(root), name)
    folder = Path(root) / paths.manifest_dir(TopicName.parse(name))
    return root, folder


def _producer(root: str, topic: str, name: str) -> Producer:
    store = open_blob_store(root)
    set_topic_policies(store, topic, deduplication_enabled=True)
    return Producer(store, topic, producer_name=name, batching_enabled=False)


def _send_all(root: str, topic: str, name: str, n: int) -> None:
    """``n`` one-message commits by producer ``name`` (dedup on, sequence ids 0..n-1)."""
    p = _producer(root, topic, name)
    try:
        for i in range(n):
            p.send(b"m%d" % i, sequence_id=i)
    finally:
        p.close()


def _records(folder: Path) -> list[record.Record]:
    return list(journal.Journal(str(folder), lambda k: None, "t").records())


@pytest.mark.parametrize("follow", [True, False])
def test_one_message_per_commit_writes_deltas_and_readers_fold_them(
    tmp_path: Path, follow: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A producer sending one message per commit, with deduplication: between full records
    every ``delta_every`` versions, its commits are deltas; a reader following every commit
    (``follow``) and one that opens the topic at the end read the writer's state, and the
    messages. (A full record every 32 versions here, not the default's: so that 80 commits
    hold full records between deltas, which readers decode and fold on from.)"""
    monkeypatch.setattr(ManifestStore, "delta_every", 32)
    root, folder = _topic(tmp_path, "t")
    follower = ManagedLedger(open_blob_store(root), TopicName.parse("t"))
    p = _producer(root, "t", "gw-1")
    n = 80
    try:
        for i in range(n):
            p.send(b"m%d" % i, sequence_id=i)
            if follow:
                got = follower.state()
                assert got.total_messages == i + 1 and got.dedup == {"gw-1": i}
                fresh = ManagedLedger(open_blob_store(root), TopicName.parse("t")).state()
                assert got.version == fresh.version and got.encode() == fresh.encode()
    finally:
        p.close()
    recs = _records(folder)
    kinds = [(r.version, envelope.is_delta(r.payload)) for r in recs]
    every = follower.manifest.delta_every
    assert all(not d for v, d in kinds if v % every == 0 or v == recs[0].version), kinds
    assert sum(d for _, d in kinds) >= n - n // every - 4, kinds
    fresh = ManagedLedger(open_blob_store(root), TopicName.parse("t"))
    want = ManagedLedger(open_blob_store(root), TopicName.parse("t")).manifest
    assert fresh.state().encode() == want.latest().encode()
    assert fresh.state().dedup == {"gw-1": n - 1}
    assert fresh.state().total_messages == n


def test_a_cold_reader_folds_up_to_a_whole_period_of_deltas_at_the_default_period(
    tmp_path: Path,
) -> None:
    """At the default period (a full record every ``delta_every`` = 256 versions) a reader
    opening the topic without a state decodes the newest full record and folds every delta
    after it: up to 255 of them (one by one; a follower's looks fold theirs in runs). Opened
    just before the second full record and again after it, it reads exactly the state a
    follower (folding as it goes) and the writer's store read."""
    root, folder = _topic(tmp_path, "t")
    topic = TopicName.parse("t")
    follower = ManagedLedger(open_blob_store(root), topic)
    every = follower.manifest.delta_every
    p = _producer(root, "t", "gw-1")
    n = every + 40
    try:
        for i in range(n):
            p.send(b"m%d" % i, sequence_id=i)
            if i % 7 == 0:
                follower.state()
            if i in (every - 3, n - 1):  # before the second full record, and after it
                cold = ManagedLedger(open_blob_store(root), topic).state()
                want = ManagedLedger(open_blob_store(root), topic).manifest.latest()
                assert cold.encode() == follower.state().encode() == want.encode()
                assert cold.total_messages == i + 1 and cold.dedup == {"gw-1": i}
    finally:
        p.close()
    kinds = [(r.version, envelope.is_delta(r.payload)) for r in _records(folder)]
    fulls = [v for v, d in kinds if not d]
    assert len(fulls) >= 2 and sum(d for _, d in kinds) >= n - 4, fulls


def test_a_delta_that_does_not_follow_its_record_is_damage_naming_segment_and_offset(
    tmp_path: Path,
) -> None:
    """A delta record whose base (version, commit) is not the record before it, checksums
    holding (a writer's bug, not a flipped bit): reading it is a CorruptDataError naming the
    segment and offset, never a state folded onto the wrong base."""
    folder = tmp_path / "j"
    folder.mkdir()
    base = _base()
    new = base.copy()
    new.dedup["p0"] = 9
    envelope.stamp_next(new, base, 10, None, lambda s: b"")
    new.prev_commit_id = "not-the-base"
    base2 = base.copy()
    base2.commit_id = "not-the-base"
    delta = new.delta_from(base2)
    assert delta is not None
    first = base.version
    data = record.encode_record(first, base.encode(), (), marked=True) + record.encode_record(
        first + 1, delta, (), marked=True
    )
    seg = folder / paths.journal_segment(first)
    seg.write_bytes(data + bytes(4096))
    root = str(tmp_path)

    from filepulsar.storage.manifest import ManifestStore

    class _Here(ManifestStore):
        def __init__(self) -> None:
            super().__init__(open_blob_store(root), TopicName.parse("x"))

    store = _Here()
    store.engine.journal = journal.Journal(str(folder), lambda k: None, "t")  # type: ignore[attr-defined]
    offset = len(record.encode_record(first, base.encode(), (), marked=True))
    with pytest.raises(CorruptDataError, match=rf"{seg.name} at offset {offset} does not follow"):
        store.latest()


def test_a_flipped_bit_in_a_delta_record_is_detected(tmp_path: Path) -> None:
    """Every bit of a committed delta record's payload flipped in turn: each read is a
    CorruptDataError naming the segment and offset, never a folded state."""
    root, folder = _topic(tmp_path, "f")
    _send_all(root, "f", "gw", 3)
    recs = _records(folder)
    d = next(r for r in recs if envelope.is_delta(r.payload))
    seg = folder / paths.journal_segment(d.segment)
    start = d.offset + record.HEAD_SIZE + len(d.deps)
    for at in range(start, start + len(d.payload), 7):
        for bit in (0, 5):
            flip(seg, at, bit)
            try:
                with pytest.raises(CorruptDataError, match=rf"{seg.name}.*offset"):
                    ManagedLedger(open_blob_store(root), TopicName.parse("f")).state()
            finally:
                flip(seg, at, bit)
    ManagedLedger(open_blob_store(root), TopicName.parse("f")).state()  # intact again


@settings(max_examples=60, deadline=None)
@given(st.lists(_STEPS, min_size=1, max_size=30), st.data())
def test_folds_share_what_they_do_not_change_and_never_change_an_earlier_state(
    commits: list[list[str]], rnd: st.DataObject
) -> None:
    """A reader hands out the states it folds (``VersionedStore.latest``: read-only, held by
    other threads) and folds several records of one read in place. A fold shares with its
    base what its record does not change (copy on write: the work follows the record, not
    the state), so no later fold, in place or not, changes a state once handed out."""
    writer = _base()
    reader = ManifestState.decode(writer.encode(), "reader")
    held = [(reader, reader.encode())]
    for n, steps in enumerate(commits, start=10):
        new = writer.copy()
        _change(new, steps, n, rnd)
        raw = envelope.stamp_next(new, writer, 1000 + n, None, lambda s: s.encode())
        delta = new.delta_from(writer)
        if delta is None:
            reader = ManifestState.decode(raw, f"full {n}")
        elif reader is held[-1][0]:
            base = reader
            reader = base.fold(delta, f"delta {n}")
            ops = json.loads(delta.splitlines()[0])
            assert (reader.producers is base.producers) == ("producers" not in ops)
            assert (reader.dedup is base.dedup) == ("dedup" not in ops)
            assert (reader.ledgers is base.ledgers) == ("open" not in ops)
        else:
            reader = reader.fold(delta, f"delta {n}", in_place=True)  # not handed out yet
        assert reader.encode() == raw
        if rnd.draw(st.booleans()):
            held.append((reader, raw))
        writer = new
    for state, raw in held:
        assert state.encode() == raw


def _distinct_state(tmp_path: Path) -> ManifestState:
    """A state whose every field holds a value no other holds (distinct objects)."""
    return ManifestState(
        topic=TOPIC,
        partition=70_001,
        version=70_002,
        next_ledger_id=70_003,
        ledgers=[LedgerInfo(0, 1, 1, 10, 5, None, 5, 5, [Fragment("b-0", 0, 1, 0, 10, 1, 5, 5)])],
        producers={"p0": ProducerLease.from_json("p0", ["s0", "Shared", 0, 99])},
        topic_epoch=70_004,
        dedup={"p0": 70_005},
        sink_batches={"q0": 70_006},
        trimmed_before=70_007,
        trimmed_messages=70_008,
        trimmed_last=Position(70_009, 70_010),
        updated_ms=70_011,
        commit_id="c" * 32,
        prev_commit_id="d" * 32,
        incarnation="e" * 32,
        created_ms=70_012,
        dedup_used={"p0": 70_013},
        sink_used={"q0": 70_014},
        catalog_refs=[SegmentRef(70_015, 70_016, 1, "n")],
        catalog=Catalog(open_blob_store(str(tmp_path)), TopicName.parse(TOPIC)),
        memo=FragmentMemo(),
    )


def test_a_fold_carries_every_field_by_its_name(tmp_path: Path) -> None:
    """A fold builds its new state field by field: every field holds a value no other holds
    (distinct objects), and each must come out under its own name, the record's stamp
    changed and nothing else. A copy by position would swap two fields on any reordering of
    their declarations; a field the copy forgets would be missing here."""
    base = _distinct_state(tmp_path)
    new = base.copy()
    envelope.stamp_next(new, base, 70_017, None, lambda s: b"")
    delta = new.delta_from(base)
    assert delta is not None
    folded = base.fold(delta, "delta")
    stamp = ("version", "updated_ms", "commit_id", "prev_commit_id")
    for f in fields(ManifestState):
        if f.name in stamp:
            assert getattr(folded, f.name) == getattr(new, f.name), f.name
        elif f.name != "shares":
            assert getattr(folded, f.name) is getattr(base, f.name), f.name


def test_a_copy_carries_every_field_by_its_name(tmp_path: Path) -> None:
    """A copy builds its state field by field: each comes out under its own name, equal to
    the original's, and what a change may mutate (the ledgers' list, the producers' map, the
    maps, the catalog refs' list) is the copy's own; the leases are shared, and no change can
    change one (a renewal replaces it); a use a map lacks is the state's ``updated_ms``, as
    decoding the state's encoding gives it."""
    base = _distinct_state(tmp_path)
    new = base.copy()
    own = {
        "ledgers",
        "producers",
        "dedup",
        "sink_batches",
        "dedup_used",
        "sink_used",
        "catalog_refs",
    }
    for f in fields(ManifestState):
        assert getattr(new, f.name) == getattr(base, f.name), f.name
        if f.name in own:
            assert getattr(new, f.name) is not getattr(base, f.name), f.name
    lease = base.producers["p0"]
    assert new.producers["p0"] is lease
    with pytest.raises(AttributeError):
        lease.expires_ms = 1  # type: ignore[misc]
    new.producers["p0"] = lease.renewed(1)
    assert base.producers["p0"].expires_ms == 99 and new.producers["p0"].expires_ms == 1
    assert new.ledgers[-1] is not base.ledgers[-1]
    base.dedup["p1"] = 1
    base.sink_batches["q1"] = 2
    assert base.copy().dedup_used == {"p0": 70_013, "p1": 70_011}
    assert base.copy().sink_used == {"q0": 70_014, "q1": 70_011}


def _grown(base: ManifestState) -> bytes:
    """A delta from ``base``: its open ledger's last fragment grown and one added."""
    new = base.copy()
    lg = new.open_ledger
    assert lg is not None and lg.fragments is not None
    f = lg.fragments[-1]
    lg.fragments[-1] = Fragment(f.blob, 0, 2, 0, 20, 2, 5, 6)
    lg.fragments.append(Fragment(f.blob, 2, 1, 20, 10, 1, 6, 6))
    lg.entries, lg.messages, lg.size, lg.max_publish = 3, 3, 30, 6
    envelope.stamp_next(new, base, 10, None, lambda s: b"")
    delta = new.delta_from(base)
    assert delta is not None and b'"open"' in delta
    return delta


@pytest.mark.parametrize("at", range(1, 8))
@pytest.mark.parametrize("bad", [True, -1, 1 << 63, 1.5, "1", None])
@pytest.mark.parametrize("in_place", [False, True])
def test_a_delta_fragment_of_a_known_blob_is_still_checked_field_by_field(
    at: int, bad: object, in_place: bool
) -> None:
    """A delta's added fragment whose blob id was seen before (checked once per blob) still
    has each other field checked: a boolean, a float, a string, null, a negative count or a
    value beyond 64 bits anywhere is damage, in a fold that copies the open ledger and in
    one in place alike; the same record intact folds to the full state."""
    base = _base()
    delta = _grown(base)
    full = base.copy()
    full.fold(delta, "intact", in_place=True)  # (the blob id is now a known one)
    body = json.loads(delta.splitlines()[0])
    frag = body["open"][7][-1]
    if bad == -1 and at >= 6:
        bad = -(1 << 63) - 1  # (publish times may be negative: beyond 64 bits instead)
    frag[at] = bad
    raw = envelope.frame(json.dumps(body, separators=(",", ":")).encode())
    state = base.copy()
    with pytest.raises(CorruptDataError, match="manifest delta bad is malformed"):
        state.fold(raw, "bad", in_place=in_place)
    assert base.fold(delta, "again", in_place=in_place).encode() == full.encode()


@settings(max_examples=60, deadline=None)
@given(st.lists(_STEPS, min_size=1, max_size=30), st.data())
def test_a_run_of_deltas_folded_in_one_pass_equals_folding_them_one_by_one(
    commits: list[list[str]], rnd: st.DataObject
) -> None:
    """A reader that finds several delta records after the state it holds folds them in one
    pass (``ManifestState.fold_run``, its look's usual path): where it folds them, the state
    is the one the folds one by one make (equal, and encoding to the same bytes), the state
    it started from is unchanged; where it does not (None), the folds one by one do. A
    producer's usual commits (an entry appended or grown, a dedup name set, its lease set:
    a registration or a renewal) are folded so."""
    writer = _base()
    states = [writer]
    deltas: list[bytes | None] = []
    for n, steps in enumerate(commits, start=10):
        new = writer.copy()
        _change(new, steps, n, rnd)
        envelope.stamp_next(new, writer, 1000 + n, None, lambda s: s.encode())
        deltas.append(new.delta_from(writer))
        states.append(ManifestState.decode(new.encode(), f"full {n}"))
        writer = new
    for i in range(len(deltas)):
        for k in range(1, 5):
            run = deltas[i : i + k]
            if len(run) < k or any(d is None for d in run):
                break
            base = states[i]
            before = base.encode()
            one = base
            for d in run:
                assert d is not None
                one = one.fold(d, "delta")
            got = base.fold_run([d for d in run if d is not None])
            usual = all(
                set(steps) <= {"append", "grow", "dedup", "producer"}
                for steps in commits[i : i + k]
            )
            if got is None:
                assert not usual
                continue
            assert got == one == states[i + k]
            assert got.encode() == one.encode()
            assert base.encode() == before


def _with_leases(body: dict[str, Any], leases: dict[str, Any]) -> dict[str, Any]:
    """A delta record's ``body`` with ``producers`` set to ``leases``, where its writer
    writes them (after the envelope)."""
    out: dict[str, Any] = {}
    for k, v in body.items():
        out[k] = v
        if k == "prevCommitId":
            out["producers"] = leases
    return out


def test_a_run_that_does_not_follow_or_is_malformed_is_left_to_the_folds_one_by_one() -> None:
    """``fold_run`` folds nothing it cannot vouch for: a run not built on the state, a
    record whose text is not a writer's (a number beyond 64 bits, a blob id that is not one,
    a lease of no access mode, a checksum that does not hold) give None, and the fold one by
    one says why."""
    base = _base()
    new = base.copy()
    lg = new.open_ledger
    assert lg is not None and lg.fragments is not None
    lg.fragments.append(Fragment("b-9", 1, 1, 10, 10, 1, 6, 6))
    lg.entries += 1
    lg.messages += 1
    envelope.stamp_next(new, base, 1000, None, lambda s: s.encode())
    delta = new.delta_from(base)
    assert delta is not None
    assert base.fold_run([delta]) == base.fold(delta, "x")
    assert base.fold_run([delta, delta]) is None  # the second does not follow the first
    assert new.fold_run([delta]) is None  # not built on ``new``
    body = json.loads(jsontext.unframe(delta, "x"))
    good = envelope.frame(
        json.dumps(
            _with_leases(body, {"p9": ["s9", "Shared", 0, 99]}), separators=(",", ":")
        ).encode()
    )
    assert base.fold_run([good]) == base.fold(good, "x")  # (a lease set is usual)
    for bad in (
        {**body, "open": [*body["open"][:7], [["b-9", 1, 1, 10, 10, 1, 6, 1 << 64]]]},
        {**body, "open": [*body["open"][:7], [["..", 1, 1, 10, 10, 1, 6, 6]]]},
        # (a lease whose access mode is none, or whose expiry is no integer)
        _with_leases(body, {"p9": ["s9", "Sharing", 0, 99]}),
        _with_leases(body, {"p9": ["s9", "Shared", 0, "99"]}),
    ):
        raw = envelope.frame(json.dumps(bad, separators=(",", ":")).encode())
        assert base.fold_run([raw]) is None
        with pytest.raises(CorruptDataError):
            base.fold(raw, "bad")
    # (The checksum's last two hex digits changed: "00", or "11" where they were "00", as
    # they are in one record of 256.)
    wrong = b"11" if delta[-3:-1] == b"00" else b"00"
    assert base.fold_run([delta[:-3] + wrong + b"\n"]) is None
    # A number with a leading zero is no JSON number: the run's text shape leaves it to the
    # parse, which refuses it, as the fold one by one does.
    zero = envelope.frame(jsontext.unframe(delta, "x").replace(b'"open":[', b'"open":[0', 1))
    assert base.fold_run([zero]) is None
    with pytest.raises(CorruptDataError):
        base.fold(zero, "bad")


def test_a_look_s_one_read_finds_what_the_general_read_finds(tmp_path: Path) -> None:
    """``Journal.read_new`` (a look's usual path: the marked records after a position, in
    one read and one scan) returns, from every record's position, the records and the
    position ``read_from`` returns; where it cannot (an in-flight record's settling, a torn
    tail, damage) it returns None and ``read_from`` decides. A zeroed mark (a record not
    marked, its writer gone) ends it there or leaves it to ``read_from``, never skipped."""
    root, folder = _topic(tmp_path, "n")
    _send_all(root, "n", "gw-1", 40)
    every = _records(folder)
    recs = [r for r in every if r.segment == every[-1].segment]
    j = journal.Journal(str(folder), lambda k: None, "t")
    try:
        for r in recs[:-1]:
            into: list[record.Record] = []
            _, here = j.read_from((r.segment, r.offset, r.version, -1), into=into)
            assert here is not None
            pos = (r.segment, r.end, r.version + 1, here[3])
            want: list[record.Record] = []
            _, want_pos = j.read_from(pos, into=want)
            got = j.read_new(pos)
            assert got is not None
            assert got[0] == want and got[1] == want_pos
        # The last record's mark zeroed: whoever reads it finds it pending, never past it.
        last = recs[-1]
        seg = folder / paths.journal_segment(last.segment)
        with open(seg, "r+b") as f:
            f.seek(last.end - 1)
            f.write(b"\0")
        pos = (recs[-2].segment, recs[-2].end, last.version, here[3])
        got = j.read_new(pos)
        assert got is None or (got[0] == [] and got[1] == pos)
        into = []
        rec, _ = j.read_from(pos, into=into)
        assert rec is None or rec.version == last.version  # settled (marked) by the reader
    finally:
        j.close()
