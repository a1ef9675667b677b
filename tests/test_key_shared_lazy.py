"""Key_Shared consumers that record what they hand out only when membership changes
(``lazy_claims``, issue #27): no commit per delivery with stable membership, and Pulsar's
guarantees as with a claim per fetch: per-key order under reassignment (a key's message is
never handed out while an earlier one of that key is held, unacknowledged, by another
consumer), nothing lost, nothing delivered twice but what was handed back. Real storage, a
``ManualClock``; the multi-process and SIGKILL cases are in test_concurrency_procs.py and
test_client_procs.py (the client's Key_Shared consumers use this mode).
"""

from __future__ import annotations

import functools
import random
from pathlib import Path
from typing import Any

import pytest

from filepulsar.dispatch.clock import ManualClock
from filepulsar.dispatch.hashing import murmur3_32, sticky_key
from filepulsar.storage import Producer, TopicName, create_topic, delivery, entry_cache, paths
from filepulsar.storage.blobstore import open_blob_store
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.cursor import SubscriptionState, pos_key
from filepulsar.storage.delivery import Delivery, KeySharedFilter, key_hash_of
from filepulsar.storage.ledger import Position
from filepulsar.storage.subscription import SubscriptionConsumer
from filepulsar.storage.subscriptions import SubscriptionStore
from filepulsar.storage.versioned.watch import CommitWaiter, drain_events
from tests.conftest import s3_once

pytestmark = pytest.mark.contract

T = TopicName.parse("lazy")
KEYS = [f"k{i}" for i in range(8)]


def _produce(store: BlobStore, start: int, n: int) -> None:
    with Producer(store, "lazy", batching_enabled=False) as p:
        for i in range(start, start + n):
            p.send_async(b"%d" % i, partition_key=KEYS[i % len(KEYS)])


def _consumer(
    store: BlobStore,
    clock: ManualClock,
    name: str,
    sub: str = "s",
    *,
    together: bool = False,
    **kw: Any,
) -> SubscriptionConsumer:
    """A lazy Key_Shared consumer (``together``: renewing with the others of its clock, as the
    client's consumers of one process do; ``kw``: more of its settings)."""
    return SubscriptionConsumer(
        store,
        T,
        sub,
        sub_type="Key_Shared",
        consumer_name=name,
        initial_position="Earliest",
        lease_ms=10_000,
        clock=clock,
        lazy_claims=True,
        renew_together=together,
        **kw,
    )


def _value(d: Delivery) -> int:
    return int(d.entry.raw.messages().column("value")[0].as_py())


def _version(store: BlobStore) -> int:
    return SubscriptionStore(store, T, "s").latest().version


def test_stable_membership_delivers_without_commits(blob_store: BlobStore) -> None:
    """Two consumers, membership settled: fetching writes nothing, acknowledging does."""
    clock = ManualClock()
    create_topic(blob_store, "lazy")
    a, b = _consumer(blob_store, clock, "a"), _consumer(blob_store, clock, "b")
    a.fetch(10)  # a records for b's join (nothing held): one commit
    before = _version(blob_store)
    _produce(blob_store, 0, 40)
    got = [_value(d) for c in (a, b) for d in c.fetch(100)]
    assert sorted(got) == list(range(40)) and _version(blob_store) == before
    a.close()
    b.close()


def test_a_join_waits_for_the_holders_record_then_drains(blob_store: BlobStore) -> None:
    """b joins while a holds messages of every key: b hands out nothing until a recorded
    them, then nothing of a key a still holds, until a acknowledges."""
    clock = ManualClock()
    create_topic(blob_store, "lazy")
    _produce(blob_store, 0, 16)
    a = _consumer(blob_store, clock, "a")
    held = a.fetch(100)
    assert len(held) == 16
    b = _consumer(blob_store, clock, "b")
    _produce(blob_store, 16, 16)
    assert b.fetch(100) == []  # a has not recorded what it holds yet
    a_more = a.fetch(100)  # a records (every key's earlier messages are held at a)
    assert b.fetch(100) == []  # b's keys are draining at a
    a.acknowledge([(d.position, -1, 1) for d in held + a_more])
    got_b = [_value(d) for d in b.fetch(100)]
    got_a = [_value(d) for d in a_more + a.fetch(100)]
    assert got_b and sorted(got_a + got_b) == list(range(16, 32))
    a.close()
    b.close()


def test_draining_ends_on_an_acknowledgement_made_in_this_process_before_it_is_written(
    blob_store: BlobStore,
) -> None:
    """As above, but a's acknowledgements are made in this process and not written (the
    client's grouped acknowledgements, ``count_acked_here``): b names what it waits on, and
    once a acknowledged those here, b gets its keys without a write, and never an entry
    acknowledged here. Another process (without the hook) still waits for the write."""
    clock = ManualClock()
    create_topic(blob_store, "lazy")
    _produce(blob_store, 0, 16)
    a = _consumer(blob_store, clock, "a")
    held = a.fetch(100)
    b = _consumer(blob_store, clock, "b")
    elsewhere = _consumer(blob_store, clock, "elsewhere")
    _produce(blob_store, 16, 16)
    a_more = a.fetch(100)  # a records what it holds for the new membership
    acked_here: set[Position] = set()
    b.count_acked_here(lambda ps: {p for p in ps if p in acked_here})
    assert b.fetch(100) == []  # draining at a
    assert b.waiting_on and b.waiting_on <= {pos_key(d.position) for d in held}
    before = _version(blob_store)
    acked_here.update(d.position for d in held + a_more)
    got_b = b.fetch(100)
    assert got_b and not {d.position for d in got_b} & acked_here
    assert b.waiting_on == frozenset()
    assert elsewhere.fetch(100) == []  # the stored state still drains there
    assert _version(blob_store) == before  # nothing written for it
    got = [_value(d) for d in got_b + a_more + a.fetch(100)]
    assert len(got) == len(set(got))
    for c in (a, b, elsewhere):
        c.close()


def test_scan_more_says_the_scan_stopped_at_its_window_not_the_ledger(
    blob_store: BlobStore,
) -> None:
    """A fetch scans a window of entries (4 x what it asks, at least 64): ``scan_more`` says
    there are entries after it, so a fetch that gave less than asked may give more at once
    (the push dispatcher's fill goes on); at the ledger's end it is False."""
    clock = ManualClock()
    create_topic(blob_store, "lazy")
    _produce(blob_store, 0, 200)
    a = _consumer(blob_store, clock, "a")
    b = _consumer(blob_store, clock, "b")
    a.fetch(1)  # a records for b's join
    b.fetch(5)
    assert b.scan_more
    while b.scan_more:
        b.fetch(5)
    assert b.fetch(5) == [] or not b.scan_more
    assert not b.scan_more
    a.close()
    b.close()


# Every seed on the local and memory stores, the first on S3 too (s3_once): the seeds draw
# other interleavings of the same consumers, and each S3 seed took as much CPU as the eight
# local and memory cases together.
@s3_once("seed", range(4))
def test_joins_and_leaves_mid_stream_keep_per_key_order_lose_nothing(
    blob_store: BlobStore, seed: int
) -> None:
    """Random interleavings of consumers joining, leaving (with messages unacknowledged),
    fetching and acknowledging while messages arrive: a key's message is never handed out
    while an earlier message of that key is held by another consumer (or not yet handed
    out at all), a message comes again only after its holder left, and every message is
    acknowledged in the end."""
    rng = random.Random(seed)
    clock = ManualClock()
    create_topic(blob_store, "lazy")
    live: dict[str, SubscriptionConsumer] = {}
    holding: dict[str, dict[int, Delivery]] = {}  # consumer -> value -> delivery unacked
    acked: set[int] = set()
    handed_back: set[int] = set()
    delivered: dict[int, int] = {}
    produced = 0
    joined = 0

    def join() -> None:
        nonlocal joined
        name = f"c{joined}"
        joined += 1
        live[name] = _consumer(blob_store, clock, name)
        holding[name] = {}

    def fetch(name: str) -> None:
        for d in live[name].fetch(rng.randint(1, 6)):
            v = _value(d)
            key = v % len(KEYS)
            for other, held in holding.items():
                assert not [w for w in held if w % len(KEYS) == key and w < v and other != name]
            earlier = [w for w in range(key, v, len(KEYS)) if w not in delivered]
            assert not earlier, f"{v} handed out before {earlier} of its key"
            if v in delivered:
                assert v in handed_back and v not in acked, f"{v} delivered twice"
            delivered[v] = delivered.get(v, 0) + 1
            handed_back.discard(v)
            holding[name][v] = d

    def ack(name: str) -> None:
        held = holding[name]
        chosen = [v for v in held if rng.random() < 0.6]
        live[name].acknowledge([(held[v].position, -1, 1) for v in chosen])
        for v in chosen:
            del held[v]
            acked.add(v)

    def leave(name: str) -> None:
        live.pop(name).close()
        handed_back.update(holding.pop(name))

    join()
    for _ in range(150):
        r = rng.random()
        if r < 0.15:
            _produce(blob_store, produced, 6)
            produced += 6
        elif r < 0.22 and len(live) < 4:
            join()
        elif r < 0.27 and len(live) > 1:
            leave(rng.choice(sorted(live)))
        elif r < 0.65:
            fetch(rng.choice(sorted(live)))
        else:
            ack(rng.choice(sorted(live)))
    for _ in range(200):  # settle: everyone fetches and acknowledges what it holds
        if len(acked) == produced:
            break
        for name in sorted(live):
            fetch(name)
            holding[name] and live[name].acknowledge(
                [(d.position, -1, 1) for d in holding[name].values()]
            )
            acked.update(holding[name])
            holding[name].clear()
    assert acked == set(range(produced))  # nothing lost
    for c in live.values():
        c.close()


def test_a_watched_idle_partition_skips_reads_and_misses_no_commit(tmp_path: Path) -> None:
    """On a watched local folder (the client's waiter watches its partitions' manifest and
    state folders), a fetch that found nothing remembers the folders' change stamps and the
    next fetch with the same stamps reads nothing; any commit changes them, so an entry
    produced in between is handed out by the very next fetch."""
    store = open_blob_store(str(tmp_path / "root"))
    create_topic(store, "lazy")
    c = SubscriptionConsumer(
        store, T, "s", sub_type="Key_Shared", initial_position="Earliest", lazy_claims=True
    )
    waiter = CommitWaiter(store, [paths.manifest_dir(T), paths.subscription_state_dir(T, "s")])
    reads = [0]
    latest = c._store.latest

    def counted(**kw: Any) -> SubscriptionState:
        reads[0] += 1
        return latest(**kw)

    c._store.latest = counted  # type: ignore[method-assign]  # counts the real reads
    try:
        assert waiter.watched and c.ml.manifest.change_stamp() is not None
        for i in range(20):
            assert c.fetch(10) == []  # nothing new: the stamps are remembered
            before = reads[0]
            assert c.fetch(10) == [] and reads[0] == before  # skipped: nothing landed
            _produce(store, i, 1)
            got = c.fetch(10)
            assert [_value(d) for d in got] == [i]
            c.acknowledge([(d.position, -1, 1) for d in got])
    finally:
        waiter.close()
        c.close()


# --------------------------------------------------------------------------- steady state
def _settled(
    store: BlobStore, clock: ManualClock, sub: str, names: list[str]
) -> list[SubscriptionConsumer]:
    """Consumers of ``names`` on subscription ``sub``, joined in that order, each having
    fetched (and acknowledged) twice after the last join: membership settled, every one
    recorded for it and scanned under it, nothing pending."""
    cs = [_consumer(store, clock, n, sub) for n in names]
    for _ in range(2):  # (the first round records for the joins; the second scans)
        for c in cs:
            got = c.fetch(100)
            if got:
                c.acknowledge([(d.position, -1, 1) for d in got])
    return cs


def _filter(c: SubscriptionConsumer) -> KeySharedFilter:
    f = KeySharedFilter(c.ml, c.state, c.lapsed)
    assert f.look() is None  # a first look cannot tell (anyone may get something)
    return f


def test_a_look_that_need_not_keep_its_entries_leaves_them_out_of_the_entry_cache(
    blob_store: BlobStore,
) -> None:
    """The push dispatcher looks with ``keep=False`` while every consumer is current: the
    look hands out the same entries, and the process's entry cache does not keep them; a
    fetch that needs them after all (a twin subscription's consumer, here) reads them and
    keeps them. A look that keeps (the default) leaves them cached."""
    clock = ManualClock()
    create_topic(blob_store, "lazy")
    _produce(blob_store, 0, 8)
    names = ["a", "b"]
    ours, twins = _settled(blob_store, clock, "s", names), _settled(blob_store, clock, "t", names)
    f = _filter(ours[0])
    ml = ours[0].ml

    def cached(new: delivery.NewEntries) -> list[bool]:
        inc = ml.state().incarnation
        peek = entry_cache.CACHE._entries.peek
        return [
            peek((ml.store.root, ml.topic_str, inc, e.ledger_id, e.entry_id)) is not None
            for e in new.entries
        ]

    _produce(blob_store, 8, 6)
    new = f.look(keep=False)
    assert new is not None and new.steady and len(new.entries) == 6
    assert cached(new) == [False] * 6
    got = sorted(_value(d) for c in ours for d in c.take_new(new, 1000) or [])
    assert got == list(range(8, 14))
    fetched = sorted(_value(d) for c in twins for d in c.fetch(100))
    assert fetched == list(range(8, 14)) and cached(new) == [True] * 6  # (read, then kept)
    _produce(blob_store, 14, 3)
    kept = f.look()
    assert kept is not None and len(kept.entries) == 3 and cached(kept) == [True] * 3
    for c in ours + twins:
        c.close()


def test_a_steady_state_hands_each_owner_its_new_entries_as_a_fetch_would(
    blob_store: BlobStore,
) -> None:
    """Three settled consumers: the entries a filter finds go to their owners with no fetch
    and no commit (the push dispatcher's fast path), each its own in position order; the
    same consumers on a twin subscription, fetching, get the same entries each."""
    clock = ManualClock()
    create_topic(blob_store, "lazy")
    _produce(blob_store, 0, 8)
    names = ["a", "b", "c"]
    ours, twins = _settled(blob_store, clock, "s", names), _settled(blob_store, clock, "t", names)
    f = _filter(ours[0])
    before, fetches = _version(blob_store), [c.fetches for c in ours]
    got: dict[str, list[int]] = {n: [] for n in names}
    for start in (8, 20, 23):
        _produce(blob_store, start, 12 if start == 8 else 3 if start == 20 else 9)
        new = f.look()
        assert new is not None and new.steady and len(new.entries) > 0
        for n, c in zip(names, ours):
            taken = c.take_new(new, 1000)
            assert taken is not None
            got[n] += [_value(d) for d in taken]
            assert c.scan_position == new.last
    assert [c.fetches for c in ours] == fetches and _version(blob_store) == before
    assert sorted(v for vs in got.values() for v in vs) == list(range(8, 32))
    fetched = {n: [_value(d) for d in c.fetch(100)] for n, c in zip(names, twins)}
    assert got == fetched
    assert sum(c.handed_directly for c in ours) == 24
    for c in ours + twins:
        c.close()


def test_entries_pending_at_their_owners_block_nobody_and_the_look_is_steady(
    blob_store: BlobStore,
) -> None:
    """Settled consumers holding what they fetched, recorded as pending by their lease
    renewals: each pending entry is at its slot's owner, so nothing waits and the next
    look is steady (each new entry named with its owner). Before, the look raised
    AttributeError on such a state (the state view asked a slot's owner before its memo
    existed), and the push dispatcher fell back to a fetch for every consumer at each look,
    logging the traceback."""
    clock = ManualClock()
    create_topic(blob_store, "lazy")
    _produce(blob_store, 0, 8)
    a, b = _settled(blob_store, clock, "s", ["a", "b"])
    f = _filter(a)
    _produce(blob_store, 8, 8)
    held = a.fetch(100) + b.fetch(100)
    assert len(held) == 8
    a.renew()
    b.renew()
    assert len(a.state().pending) == 8
    _produce(blob_store, 16, 4)
    new = f.look()
    assert new is not None and new.steady
    assert [e.entry_id for e in new.entries] == list(range(8, 20))
    assert set(new.owners) == {a.cid, b.cid}
    for c in (a, b):
        c.close()


def test_a_negative_acknowledgement_after_the_look_makes_its_consumer_fetch(
    blob_store: BlobStore,
) -> None:
    """A consumer that negatively acknowledges an entry after the filter read the state
    (its own commit is newer than the state of the look) takes nothing from that look: a
    later entry of the key would otherwise overtake the one handed back. The next look
    sees something waiting for redelivery and cannot tell (every consumer fetches), and the
    fetch keeps the key's order: the later entry waits for the redelivery."""
    clock = ManualClock()
    create_topic(blob_store, "lazy")
    (a,) = _settled(blob_store, clock, "s", ["a"])
    f = _filter(a)
    _produce(blob_store, 0, 1)
    first = a.take_new(f.look() or pytest.fail("no look"), 100)
    assert first is not None and [_value(d) for d in first] == [0]
    _produce(blob_store, 8, 1)  # same key as 0
    new = f.look()
    assert new is not None and new.steady
    a.negative_acknowledge([first[0].position], 1000)
    assert a.take_new(new, 100) is None  # fetch instead
    assert a.fetch(100) == []  # 0 waits for its redelivery, 8 behind it
    assert f.look() is None  # something waits for redelivery: anyone may get something
    clock.advance(1000)
    assert [_value(d) for d in a.fetch(100)] == [0, 8]
    a.close()


def test_a_join_or_a_delayed_entry_falls_back_to_fetching(blob_store: BlobStore) -> None:
    """A consumer joining mid-stream changes membership: the next look cannot tell, and
    until everyone recorded what it holds the state is not steady; once it is, and nothing
    is pending, new entries are handed out directly again, per key in order. An entry held
    by delayed delivery is not handed out so: its owner fetches (which records it for
    later)."""
    clock = ManualClock()
    create_topic(blob_store, "lazy")
    a, b = _settled(blob_store, clock, "s", ["a", "b"])
    f = _filter(a)
    _produce(blob_store, 0, 16)
    new = f.look()
    assert new is not None and new.steady
    held = {c.consumer_name: c.take_new(new, 100) or [] for c in (a, b)}
    assert sum(len(v) for v in held.values()) == 16
    c = _settled(blob_store, clock, "s", ["c"])[0]  # joins (nothing to fetch yet)
    _produce(blob_store, 16, 16)
    assert f.look() is None  # membership changed
    got: dict[str, list[int]] = {n: [_value(d) for d in ds] for n, ds in held.items()}
    got["c"] = []
    for x in (a, b, c):  # a and b record what they hold; c waits for them, then drains
        got[x.consumer_name] += [_value(d) for d in x.fetch(100)]
    for x, ds in zip((a, b), held.values()):
        x.acknowledge([(d.position, -1, 1) for d in ds])
    for x in (a, b, c):
        got[x.consumer_name] += [_value(d) for d in x.fetch(100)]
    new = f.look()
    assert new is None or not new.steady or not new.entries
    for x in (a, b, c):  # everything handed out is acknowledged: nothing pending any more
        got[x.consumer_name] += [_value(d) for d in x.fetch(100)]
        x.acknowledge([(p, -1, 1) for p in x._dispatcher.in_flight()])
    _produce(blob_store, 32, 16)
    f.look()  # (sees the acknowledgements: busy at the last look)
    _produce(blob_store, 48, 16)
    new = f.look()
    assert new is not None and new.steady and len(new.entries) == 16
    for x in (a, b, c):
        taken = x.take_new(new, 100)
        if taken is None:  # (behind: its last fetch did not see the entries 32..47)
            taken = x.fetch(100)
        got[x.consumer_name] += [_value(d) for d in taken]
    everything = sorted(v for vs in got.values() for v in vs)
    assert everything == list(range(64))
    for vs in got.values():  # each consumer got each of its keys in order
        for k in range(len(KEYS)):
            of_key = [v for v in vs if v % len(KEYS) == k]
            assert of_key == sorted(of_key)
    with Producer(blob_store, "lazy", batching_enabled=False) as p:
        p.send_async(b"64", partition_key=KEYS[0], deliver_after=60_000)
    new = f.look()
    assert new is not None and new.steady and len(new.entries) == 1
    owner = next(x for x in (a, b, c) if x.cid == new.owners[0])
    assert owner.take_new(new, 100) is None  # held: its owner fetches
    assert owner.fetch(100) == []  # recorded for later
    for x in (a, b, c):
        x.close()


def test_a_consumer_passed_over_while_it_owned_nothing_takes_its_entries_when_vouched(
    blob_store: BlobStore,
) -> None:
    """The dispatcher does not call a consumer that owns none of a look's entries; at the
    next look where it owns some, its scan is behind: without the dispatcher's word that
    it owned none in between it must fetch, with it it takes them directly, in order."""
    clock = ManualClock()
    create_topic(blob_store, "lazy")
    a, b = _settled(blob_store, clock, "s", ["a", "b"])
    f = _filter(a)
    got: dict[str, list[int]] = {"a": [], "b": []}
    skipped, vouched = False, 0
    for start in range(32):
        _produce(blob_store, start, 1)
        new = f.look()
        assert new is not None and new.steady
        for c in (a, b):
            mine = c.cid in new.owners
            if c is a and not mine:
                skipped = True
                continue  # passed over (still current)
            if c is a and skipped:
                assert c.take_new(new, 100) is None  # behind: cannot tell alone
                skipped = False
                vouched += 1
            taken = c.take_new(new, 100, examined=c is a)
            assert taken is not None
            got[c.consumer_name] += [_value(d) for d in taken]
    assert vouched and sorted(got["a"] + got["b"]) == list(range(32))
    for vs in got.values():
        assert vs == sorted(vs)
    a.close()
    b.close()


def test_a_look_from_before_a_join_in_this_process_hands_out_nothing_the_newcomer_owns(
    blob_store: BlobStore,
) -> None:
    """A member whose record is folded into a newcomer's registration commit must not then
    hand out, from a look taken before that commit, entries of slots the newcomer now owns:
    the fold raises the member's own committed version, which ``take_new`` checks."""
    clock = ManualClock()
    create_topic(blob_store, "lazy")
    a = _consumer(blob_store, clock, "a", together=True)
    for _ in range(2):
        a.fetch(100)
    f = _filter(a)
    _produce(blob_store, 0, 16)  # 8 keys, 2 entries each
    new = f.look()  # the push dispatcher's look: steady, every entry a's
    assert new is not None and new.steady
    # Another client of this process subscribes meanwhile (same clock: same lease group);
    # its registration commit records what a holds (nothing yet) for the new membership.
    b = _consumer(blob_store, clock, "b", together=True)
    # The dispatcher goes on handing a its share of the look it took before the join.
    by_a = {_value(d) for d in (a.take_new(new, 100) or [])}
    by_b: set[int] = set()
    for _ in range(3):  # a records whenever it is due (as housekeeping would); b fetches
        a.renew_if_due()
        by_b |= {_value(d) for d in b.fetch(100)}
    both = by_a & by_b
    assert not both, (
        f"handed to a (take_new on a look from before b joined) and to b, unacknowledged, "
        f"at once: {sorted(both)} (a took {sorted(by_a)}, b fetched {sorted(by_b)})"
    )
    a.close()
    b.close()


def test_a_look_from_before_a_join_elsewhere_hands_out_nothing_the_newcomer_owns(
    blob_store: BlobStore,
) -> None:
    """As above, the join in another process: the member's record is folded into another
    member's record commit of this process."""
    clock = ManualClock()
    create_topic(blob_store, "lazy")
    a, a2 = (
        _consumer(blob_store, clock, "a", together=True),
        _consumer(blob_store, clock, "a2", together=True),
    )
    for _ in range(2):
        a.fetch(100)
        a2.fetch(100)
    f = _filter(a)
    _produce(blob_store, 0, 16)
    new = f.look()
    assert new is not None and new.steady
    x = _consumer(blob_store, ManualClock(), "x", together=True)  # another process (another clock)
    a2.renew_if_due()  # records a2, and a folded in
    by_a = {_value(d) for d in (a.take_new(new, 100) or [])}
    by_x: set[int] = set()
    for _ in range(3):
        a.renew_if_due()
        a2.renew_if_due()
        by_x |= {_value(d) for d in x.fetch(100)}
    both = by_a & by_x
    assert not both, f"handed to a and to x at once: {sorted(both)}"
    for c in (a, a2, x):
        c.close()


def test_remembered_key_hashes_are_the_sticky_keys_murmur(monkeypatch: pytest.MonkeyPatch) -> None:
    """The filter's slot of an entry (key_hash_of, remembered per keys) is Pulsar's murmur of
    its sticky key: the ordering key if set (an empty one too), else the key (a str as Java's
    UTF-8, bytes as they are), else NONE_KEY; also when asked again, after being forgotten."""
    monkeypatch.setattr(delivery, "_MAX_KEY_HASHES", 3)
    keys = [(None, "d1"), (b"o", "d1"), (b"", "d1"), (None, b"d1"), (None, None), (None, "\ud800")]
    for _ in range(3):
        for okey, pkey in keys:
            assert key_hash_of(okey, pkey) == murmur3_32(sticky_key(okey, pkey))
    assert key_hash_of(None, "d1") != key_hash_of(b"o", "d1")
    long_key = "k" * (delivery._MAX_KEPT_KEY + 1)  # hashed each time, never kept
    delivery._KEY_HASHES.clear()
    assert key_hash_of(None, long_key) == murmur3_32(sticky_key(None, long_key))
    assert key_hash_of(b"o" * 300, None) == murmur3_32(sticky_key(b"o" * 300, None))
    assert not delivery._KEY_HASHES


def _watched_pair(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[BlobStore, ManualClock, list[SubscriptionConsumer], CommitWaiter]:
    """A topic of 8 entries, consumers a and b settled on its Key_Shared subscription s, and
    a watcher of its manifest and the subscription's state (inotify: no re-check meanwhile)."""
    monkeypatch.setenv("FILEPULSAR_WATCH_RECHECK_MS", "600000")
    store = open_blob_store(str(tmp_path / "root"))
    clock = ManualClock()
    create_topic(store, "lazy")
    _produce(store, 0, 8)
    ours = _settled(store, clock, "s", ["a", "b"])
    waiter = CommitWaiter(store, [paths.manifest_dir(T), paths.subscription_state_dir(T, "s")])
    return store, clock, ours, waiter


def test_a_look_reads_the_subscription_state_only_when_its_folder_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given the state's change stamp (the push dispatcher gives it), a look whose
    subscription state folder saw no commit since its last read reads no state (the manifest
    changed: a commit of entries); an acknowledgement's commit makes the next look read it,
    and a consumer joining makes the next look say anyone may get something."""
    store, clock, ours, waiter = _watched_pair(tmp_path, monkeypatch)
    c = ours[0]
    reads = [0]
    latest = c._store.latest

    def counted(**kw: Any) -> SubscriptionState:
        reads[0] += 1
        return latest(**kw)

    c._store.latest = counted  # type: ignore[method-assign]  # counts the real reads
    try:
        assert waiter.watched and c.state_stamp() is not None
        f = KeySharedFilter(c.ml, c.state, c.lapsed, c.state_stamp)
        assert f.look() is None  # (a first look cannot tell)
        taken: dict[SubscriptionConsumer, list[Delivery]] = {o: [] for o in ours}
        for i in range(8, 14):
            before = reads[0]
            _produce(store, i, 1)
            new = f.look()
            assert new is not None and new.steady and len(new.entries) == 1
            assert reads[0] == before  # the state's folder saw no commit
            for o in ours:
                taken[o] += o.take_new(new, 100) or []
        assert sorted(_value(d) for ds in taken.values() for d in ds) == list(range(8, 14))
        before = reads[0]
        for o, ds in taken.items():
            o.acknowledge([(d.position, -1, 1) for d in ds])
        assert f.look() is not None and reads[0] > before  # acknowledgements' commits
        newcomer = _consumer(store, clock, "z")
        assert f.look() is None  # membership moved: anyone may get something
        newcomer.close()
    finally:
        waiter.close()
        for o in ours:
            o.close()


def test_a_look_of_a_caller_that_reads_the_events_finds_each_commit_they_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The push dispatcher's filter (its state stamp taken without reading the queued events,
    which the dispatcher reads at the start of each round) takes the manifest's stamp so too:
    each commit of entries counted by a read of the events before a look is in that look, one
    new entry a look, and a look with nothing new finds none."""
    store, _, ours, waiter = _watched_pair(tmp_path, monkeypatch)
    c = ours[0]
    try:
        stamp = functools.partial(c.state_stamp, drain=False)
        f = KeySharedFilter(c.ml, c.state, c.lapsed, stamp, drained=True)
        drain_events()
        assert f.look() is None  # (a first look cannot tell)
        for i in range(8, 14):
            _produce(store, i, 1)
            drain_events()
            new = f.look()
            assert new is not None and new.steady
            assert [e.position for e in new.entries] == [Position(0, i)]
            drain_events()
            new = f.look()
            assert new is not None and new.entries == []
    finally:
        waiter.close()
        for o in ours:
            o.close()


def test_take_new_indexes_hands_out_what_take_new_does_in_every_case(
    blob_store: BlobStore,
) -> None:
    """The receiver queue's hand-over (``take_new_indexes``: indexes, no ``Delivery`` per
    entry, and whether the consumer is current after it) decides as ``take_new``, the
    spec: the same consumers on twin subscriptions, each with its filter, one side taking
    through each, get the same entries in the same order, fall back to fetching at the same
    looks (a receiver queue without room, a negative acknowledgement, a join: not steady)
    and, fetching then, get the same entries again (redeliveries included)."""
    clock = ManualClock()
    create_topic(blob_store, "lazy")
    _produce(blob_store, 0, 8)
    names = ["a", "b", "c"]
    spec, fast = _settled(blob_store, clock, "s", names), _settled(blob_store, clock, "t", names)
    fs, ft = _filter(spec[0]), _filter(fast[0])
    got: dict[str, list[list[int]]] = {"s": [], "t": []}

    def look(room: int = 1000) -> None:
        """One look on each side: what each consumer takes (a fetch where it cannot)."""
        ns, nt = fs.look(), ft.look()
        assert (ns is None) == (nt is None)
        if ns is None or nt is None:
            got["s"].append([_value(d) for c in spec for d in c.fetch(100)])
            got["t"].append([_value(d) for c in fast for d in c.fetch(100)])
            return
        assert ns.steady == nt.steady
        for cs, ct in zip(spec, fast):
            taken = cs.take_new(ns, room)
            idx, current = ct.take_new_indexes(nt, room)
            assert (taken is None) == (idx is None)
            assert current == (idx is not None and ct.current_with(nt))
            if taken is None:
                taken = cs.fetch(100)
                both = [_value(d) for d in ct.fetch(100)]
            else:
                both = [int(nt.entries[i].raw.messages().column("value")[0].as_py()) for i in idx]
            got["s"].append([_value(d) for d in taken])
            got["t"].append(both)

    _produce(blob_store, 8, 12)
    look()  # steady: each owner its entries
    _produce(blob_store, 20, 12)
    look(room=1)  # no room for them: fetch (room for 100 then)
    _produce(blob_store, 32, 3)
    look()
    # A negative acknowledgement of one of a's entries on each side: redelivered to it.
    for cs, ct in ((spec[0], fast[0]),):
        for c in (cs, ct):
            held = sorted(c._dispatcher.in_flight())
            assert held
            c.negative_acknowledge([held[0]], 1000)
    _produce(blob_store, 35, 8)
    look()  # a's own commit is newer than the look: it fetches
    look()  # something waits for redelivery: every consumer fetches
    clock.advance(1000)
    look()  # the redelivery
    # A join on each side: membership changes, then settles.
    spec.append(_settled(blob_store, clock, "s", ["d"])[0])
    fast.append(_settled(blob_store, clock, "t", ["d"])[0])
    _produce(blob_store, 43, 16)
    for _ in range(4):
        look()
        for c in spec + fast:
            c.acknowledge([(p, -1, 1) for p in c._dispatcher.in_flight()])
    _produce(blob_store, 59, 16)
    look()
    assert got["s"] == got["t"]
    assert sorted({v for vs in got["t"] for v in vs}) == list(range(8, 75))
    assert sum(c.handed_directly for c in fast) > 0
    for c in spec + fast:
        c.close()


def test_a_new_entry_acknowledged_before_the_look_makes_only_its_owner_fetch(
    blob_store: BlobStore,
) -> None:
    """An entry of a look that the state holds acknowledged (in a range after every entry
    its owner scanned: the hand-out's one-comparison test of the ranges must not pass it
    over) is not handed out by take_new: its owner fetches (None), and its fetch skips it;
    the other owners take theirs directly."""
    clock = ManualClock()
    create_topic(blob_store, "lazy")
    _produce(blob_store, 0, 8)
    names = ["a", "b", "c"]
    ours = _settled(blob_store, clock, "s", names)
    f = _filter(ours[0])
    _produce(blob_store, 8, 12)
    ms = ours[0].ml.state()
    last = ms.last_position()
    acked = Position(last.ledger_id, last.entry_id - 5)
    ours[0].acknowledge([(acked, -1, 1)])  # (not handed out to anyone yet)
    new = f.look()
    assert new is not None and new.steady and len(new.entries) == 12
    owner = new.owners[[e.position for e in new.entries].index(acked)]
    for c in ours:
        taken = c.take_new(new, 1000)
        if c.cid == owner:
            assert taken is None
            got = [d.position for d in c.fetch(100)]
            assert acked not in got and got
        else:
            assert taken is not None and all(d.position != acked for d in taken)
    for c in ours:
        c.close()


def _random_membership(kind: str, rng: random.Random) -> tuple[Any, dict[str, str]]:
    """A selector of ``kind`` after random joins and leaves (repeated names under
    consistent hashing, overlapping-free random sticky ranges with gaps), and the
    ``sel_id`` -> consumer id map of a state holding some of its members."""
    from filepulsar.dispatch.selectors import selector_for_mode
    from filepulsar.storage.cursor import _selector_remove, selector_add

    sel = selector_for_mode(
        "STICKY" if kind == "sticky" else "AUTO_SPLIT",
        use_consistent_hashing=kind == "consistent",
    )
    ids: list[tuple[str, str]] = []
    free = 0
    for i in range(rng.randrange(1, 12)):
        cid = f"c{i}"
        ranges = None
        if kind == "sticky":
            if free > 65_000:
                break
            lo = free + rng.randrange(0, 3000)
            hi = min(lo + rng.randrange(0, 9000), 65_535)
            free = hi + 1
            ranges = [(lo, hi)]
        ids.append((selector_add(sel, cid, rng.choice("abcd"), ranges), cid))
        if len(ids) > 1 and rng.random() < 0.3:
            sel_id, _ = ids.pop(rng.randrange(len(ids)))
            _selector_remove(sel, sel_id)
    of_sel = {s: c for s, c in ids if rng.random() < 0.9}
    return sel, of_sel


@pytest.mark.parametrize("kind", ["consistent", "auto_split", "sticky"])
def test_the_owner_table_is_the_selectors_owner_of_every_slot(kind: str) -> None:
    """The slot -> owner lookup a look makes (the selector's vectorised table and a list of
    its members) gives, for every slot, the consumer the selector itself gives
    (``selector_owner``, then the state's members), for random memberships."""
    from filepulsar.storage.cursor import selector_owner

    rng = random.Random(kind)
    for _ in range(4):
        sel, of_sel = _random_membership(kind, rng)
        table, ids = delivery.slot_owners(sel, of_sel)
        assert len(table) == sel.slot_limit
        for slot in range(sel.slot_limit):
            o = selector_owner(sel, slot)
            assert ids[table.item(slot)] == (None if o is None else of_sel.get(o)), slot
    table, ids = delivery.slot_owners(None, {})
    assert len(table) == 0


@pytest.mark.parametrize(
    "mode",
    [
        {},
        {"use_consistent_hashing": False},
        {"key_shared_mode": "STICKY"},
    ],
)
def test_a_look_gives_each_new_entry_its_keys_owner_under_every_selector(
    blob_store: BlobStore, mode: dict[str, Any]
) -> None:
    """The live path: the owners a look finds for entries of many keys (more than any memo
    of them) are, entry by entry, the owner the stored selector gives the slot of the
    entry's sticky key (Pulsar's murmur and slot rule), for each selector kind."""
    from filepulsar.dispatch.hashing import hash_slot
    from filepulsar.storage.cursor import selector_owner

    clock = ManualClock()
    create_topic(blob_store, "lazy")
    names = ["a", "b", "c"]
    sticky = [[(0, 30_000)], [(30_001, 50_000)], [(50_001, 65_535)]]
    cs = [
        _consumer(
            blob_store,
            clock,
            n,
            sticky_ranges=sticky[i] if mode.get("key_shared_mode") == "STICKY" else None,
            **mode,
        )
        for i, n in enumerate(names)
    ]
    for _ in range(2):
        for c in cs:
            c.fetch(100)
    f = _filter(cs[0])
    keys = [f"dev-{i}" for i in range(300)] + ["", "é-ü", "x" * 300]
    with Producer(blob_store, "lazy", batching_enabled=False) as p:
        for i, k in enumerate(keys):
            p.send_async(b"%d" % i, partition_key=k)
        p.send_async(b"o", partition_key="k", ordering_key=b"ord")
        p.send_async(b"n")
    new = f.look(1000)
    assert new is not None and len(new.entries) == len(keys) + 2
    s = cs[0].state()
    sel = delivery.selector_of(s.selector)
    of_sel = {c.sel_id: c.cid for c in s.consumers.values()}
    sticky_keys = [k.encode() for k in keys] + [b"ord", b"NONE_KEY"]
    for i, key in enumerate(sticky_keys):
        slot = hash_slot(murmur3_32(key), *sel.hash_range)
        assert new.slots[i] == slot
        assert new.owners[i] == of_sel.get(selector_owner(sel, slot) or "")
    assert {o for o in new.owners} == {c.cid for c in cs}
    for c in cs:
        c.close()
