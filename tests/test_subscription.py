"""Subscription semantics on one managed ledger (several consumer objects, injected clock)."""

from __future__ import annotations

import pytest

from filepulsar.dispatch.clock import ManualClock
from filepulsar.storage import Producer, TopicName, create_topic, set_topic_policies
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.delivery import Delivery
from filepulsar.storage.errors import ConsumerBusy, InvalidAckError
from filepulsar.storage.subscription import SubscriptionConsumer
from tests.conftest import s3_once

pytestmark = pytest.mark.contract


T = TopicName.parse("subs")


def values(ds: list[Delivery]) -> list[bytes]:
    out: list[bytes] = []
    for d in ds:
        out.extend(d.entry.raw.messages().column("value").to_pylist())
    return out


def produce(store: BlobStore, n: int, *, keys: list[str] | None = None, start: int = 0) -> None:
    with Producer(store, "subs", batching_enabled=False) as p:
        for i in range(start, start + n):
            p.send_async(b"%d" % i, partition_key=keys[i % len(keys)] if keys else None)


def consumer(
    store: BlobStore, clock: ManualClock, sub_type: str, name: str, **kw
) -> SubscriptionConsumer:
    kw.setdefault("initial_position", "Earliest")
    return SubscriptionConsumer(
        store, T, "s", sub_type=sub_type, consumer_name=name, lease_ms=10_000, clock=clock, **kw
    )


def drain(c: SubscriptionConsumer, ack: bool = True) -> list[bytes]:
    got: list[bytes] = []
    while ds := c.fetch(10):
        got.extend(values(ds))
        if ack:
            c.acknowledge([(d.position, -1, 1) for d in ds])
    return got


def test_exclusive_busy_and_resume_from_cursor(blob_store: BlobStore) -> None:
    clock = ManualClock()
    create_topic(blob_store, "subs")
    produce(blob_store, 10)
    a = consumer(blob_store, clock, "Exclusive", "a")
    with pytest.raises(ConsumerBusy, match="Exclusive consumer is already connected"):
        consumer(blob_store, clock, "Exclusive", "b")
    ds = a.fetch(4)
    assert values(ds) == [b"0", b"1", b"2", b"3"]
    a.acknowledge([(ds[0].position, -1, 1), (ds[1].position, -1, 1), (ds[3].position, -1, 1)])
    a.close()
    b = consumer(blob_store, clock, "Exclusive", "b")
    assert drain(b) == [b"2"] + [b"%d" % i for i in range(4, 10)]  # 3 was acked (a hole)
    assert b.state().acked == [] and b.backlog() == 0
    with pytest.raises(InvalidAckError):
        consumer(
            blob_store, clock, "Shared", "x", initial_position="Latest"
        ) if False else SubscriptionConsumer(
            blob_store, T, "sh", sub_type="Shared", clock=clock
        ).acknowledge_cumulative(ds[0].position)


def test_failover_takeover_without_loss(blob_store: BlobStore) -> None:
    clock = ManualClock()
    create_topic(blob_store, "subs")
    produce(blob_store, 20)
    c1 = consumer(blob_store, clock, "Failover", "c1")
    c2 = consumer(blob_store, clock, "Failover", "c2")
    active, standby = (c1, c2) if c1.is_active() else (c2, c1)
    assert standby.fetch(10) == []
    ds = active.fetch(8)
    active.acknowledge([(d.position, -1, 1) for d in ds[:5]])  # 5..7 delivered, not acked
    clock.advance(6_000)
    standby.renew()
    clock.advance(5_000)  # the active consumer stopped renewing: its lease expired
    standby.renew()
    assert standby.is_active()
    assert drain(standby) == [b"%d" % i for i in range(5, 20)]


def test_shared_spreads_and_redelivers_departed_consumers_messages(blob_store: BlobStore) -> None:
    clock = ManualClock()
    create_topic(blob_store, "subs")
    produce(blob_store, 30)
    a = consumer(blob_store, clock, "Shared", "a")
    b = consumer(blob_store, clock, "Shared", "b")
    got_a = values(a.fetch(5))
    got_b = values(b.fetch(5))
    assert set(got_a).isdisjoint(got_b) and len(got_a) == len(got_b) == 5
    b.acknowledge([])  # nothing acked by b
    clock.advance(6_000)
    a.renew()
    clock.advance(5_000)  # b vanished (its lease expired); a renewed in time
    rest: list[tuple[bytes, int]] = []
    while ds := a.fetch(7):
        for d in ds:
            rest.extend((v, d.redelivery_count) for v in values([d]))
        a.acknowledge([(d.position, -1, 1) for d in ds])
    redelivered = {v for v, c in rest if c == 1}
    assert redelivered == set(got_b)
    # a's own 5 stay pending with it (a is alive); everything else reaches a exactly once.
    assert sorted(int(v) for v, _ in rest) == [i for i in range(30) if b"%d" % i not in got_a]
    assert len(rest) == 25


def test_negative_ack_redelivers_after_delay_with_count(blob_store: BlobStore) -> None:
    clock = ManualClock()
    create_topic(blob_store, "subs")
    produce(blob_store, 3)
    c = consumer(blob_store, clock, "Shared", "c")
    ds = c.fetch(10)
    c.acknowledge([(ds[0].position, -1, 1), (ds[2].position, -1, 1)])
    c.negative_acknowledge([ds[1].position], delay_ms=1000)
    assert c.fetch(10) == []
    clock.advance(1000)
    again = c.fetch(10)
    assert values(again) == [b"1"] and again[0].redelivery_count == 1


@pytest.mark.parametrize("lazy", [False, True])
def test_key_shared_keeps_keys_on_one_consumer_and_drains_on_join(
    blob_store: BlobStore, lazy: bool
) -> None:
    clock = ManualClock()
    create_topic(blob_store, "subs")
    keys = [f"key-{i}" for i in range(12)]
    produce(blob_store, 60, keys=keys)
    a = consumer(blob_store, clock, "Key_Shared", "a", lazy_claims=lazy)
    first = a.fetch(20)  # a owns everything; 20 pending
    owner: dict[str, str] = {}
    b = consumer(blob_store, clock, "Key_Shared", "b", lazy_claims=lazy)  # a's hashes, part
    got_b: list[tuple[str, int]] = []
    while ds := b.fetch(10):
        for d in ds:
            m = d.entry.raw.messages().to_pylist()[0]
            got_b.append((m["key"], int(m["value"])))
        b.acknowledge([(d.position, -1, 1) for d in ds])
    # While a's 20 pending messages are unacked, b gets nothing of keys a still has pending.
    pending_keys = {d.entry.raw.messages().to_pylist()[0]["key"] for d in first}
    assert not {k for k, _ in got_b} & pending_keys
    a.acknowledge([(d.position, -1, 1) for d in first])
    for c, name in ((a, "a"), (b, "b")):
        while ds := c.fetch(10):
            for d in ds:
                m = d.entry.raw.messages().to_pylist()[0]
                assert owner.setdefault(m["key"], name) == name  # one consumer per key
                if name == "b":
                    got_b.append((m["key"], int(m["value"])))
            c.acknowledge([(d.position, -1, 1) for d in ds])
    for k in {k for k, _ in got_b}:
        seq = [v for kk, v in got_b if kk == k]
        assert seq == sorted(seq)  # per-key order kept
    assert a.backlog() == 0


def test_delayed_messages_held_for_shared_not_exclusive(blob_store: BlobStore) -> None:
    clock = ManualClock()
    create_topic(blob_store, "subs")
    with Producer(blob_store, "subs", clock=clock) as p:
        p.send(b"now")
        p.send(b"later", deliver_at=clock() + 60_000)
        p.send(b"now2")
    sh = SubscriptionConsumer(
        blob_store, T, "shared", sub_type="Shared", initial_position="Earliest", clock=clock
    )
    assert drain(sh) == [b"now", b"now2"]
    clock.advance(59_500)  # within one tick (1 s) of deliverAt: Pulsar delivers it
    assert drain(sh) == [b"later"]
    ex = SubscriptionConsumer(
        blob_store, T, "excl", sub_type="Exclusive", initial_position="Earliest", clock=clock
    )
    assert drain(ex) == [b"now", b"later", b"now2"]


def test_initial_position_latest_and_ack_holes_across_ledgers(blob_store: BlobStore) -> None:
    clock = ManualClock()
    set_topic_policies(blob_store, "subs", ledger_max_entries=3)
    create_topic(blob_store, "subs")
    produce(blob_store, 5)
    c = consumer(blob_store, clock, "Exclusive", "c", initial_position="Latest")
    assert c.fetch(10) == []
    produce(blob_store, 7, start=5)
    ds = c.fetch(10)
    assert values(ds) == [b"%d" % i for i in range(5, 12)]
    c.acknowledge([(d.position, -1, 1) for d in ds[1:]])
    s = c.state()
    assert s.acked and c.backlog() > 0  # 5 is a hole
    c.acknowledge([(ds[0].position, -1, 1)])
    s = c.state()
    assert s.acked == [] and s.mark_delete == (ds[-1].entry.ledger_id, ds[-1].entry.entry_id)


def test_batch_index_ack_redelivers_only_unacked(blob_store: BlobStore) -> None:
    clock = ManualClock()
    create_topic(blob_store, "subs")
    with Producer(blob_store, "subs", batching_max_publish_delay_ms=1000) as p:
        for i in range(4):
            p.send_async(b"%d" % i)
    c = consumer(blob_store, clock, "Exclusive", "c")
    (d,) = c.fetch(10)
    c.acknowledge([(d.position, 0, 4), (d.position, 2, 4)])
    c.close()
    c2 = consumer(blob_store, clock, "Exclusive", "c2")
    (d2,) = c2.fetch(10)
    assert d2.acked_indexes == frozenset({0, 2})
    c2.acknowledge([(d2.position, 1, 4), (d2.position, 3, 4)])
    assert c2.backlog() == 0 and c2.state().batch_acks == {}


def test_close_after_the_subscription_was_deleted(blob_store: BlobStore) -> None:
    from filepulsar.storage.subscriptions import delete_subscription

    clock = ManualClock()
    create_topic(blob_store, "subs")
    c = consumer(blob_store, clock, "Shared", "c")
    delete_subscription(blob_store, T, "s")  # e.g. expired by retention
    c.close()  # no error: nothing left to unregister from


def test_acknowledging_again_writes_no_new_version(blob_store: BlobStore) -> None:
    """An idle query re-acknowledges its last offset on every poll: that must not commit."""
    clock = ManualClock()
    create_topic(blob_store, "subs")
    produce(blob_store, 3)
    c = consumer(blob_store, clock, "Exclusive", "c")
    ds = c.fetch(10)
    c.acknowledge_cumulative(ds[-1].position)
    c.acknowledge([(ds[0].position, -1, 1)])
    version = c.state().version
    for _ in range(5):
        c.acknowledge_cumulative(ds[-1].position)
        c.acknowledge([(ds[1].position, -1, 1), (ds[1].position, 0, 3)])
    assert c.state().version == version


def test_key_shared_places_consumers_by_name_as_pulsar(blob_store: BlobStore) -> None:
    """Consistent hashing puts a consumer's ring points at the hashes of its *name* (PULSAR_RULES):
    keys go where Pulsar's selector sends them, and a consumer that comes back under its name
    gets the same keys; two live consumers sharing a name are told apart by name index."""
    from filepulsar.dispatch.hashing import sticky_key
    from filepulsar.dispatch.selectors.consistent import ConsistentHashingSelector

    clock = ManualClock()
    create_topic(blob_store, "subs")
    keys = [f"order-{i}" for i in range(40)]
    produce(blob_store, 80, keys=keys)
    ref = ConsistentHashingSelector()
    ref.add_consumer("east")
    ref.add_consumer("west")
    expect = {k: ref.select(sticky_key(None, k)) for k in keys}
    assert set(expect.values()) == {"east", "west"}

    def keys_of(c: SubscriptionConsumer, n: int | None = None) -> set[str]:
        got: set[str] = set()
        while (n is None or len(got) < n) and (ds := c.fetch(10)):
            got.update(d.entry.raw.messages().column("key")[0].as_py() for d in ds)
            c.acknowledge([(d.position, -1, 1) for d in ds])
        return got

    east = consumer(blob_store, clock, "Key_Shared", "east")
    west = consumer(blob_store, clock, "Key_Shared", "west")
    got_east, got_west = keys_of(east, 5), keys_of(west, 5)
    assert all(expect[k] == "east" for k in got_east)
    assert all(expect[k] == "west" for k in got_west)
    # "east" leaves and a new instance with the same name joins: same hash ranges again.
    east.close()
    produce(blob_store, 80, keys=keys, start=80)
    east2 = consumer(blob_store, clock, "Key_Shared", "east")
    got_e2, got_w2 = keys_of(east2), keys_of(west)
    assert got_e2 and all(expect[k] == "east" for k in got_e2)
    assert all(expect[k] == "west" for k in got_w2)
    assert got_e2 | got_w2 == set(keys)
    # A second live "east" gets its own points (name index 1), as Pulsar's nameIndex.
    twin = consumer(blob_store, clock, "Key_Shared", "east")
    sel_ids = sorted(c.sel_id for c in twin.state().consumers.values())
    assert sel_ids == ["east\x000", "east\x001", "west\x000"]


@pytest.mark.parametrize("lazy", [False, True])
def test_key_shared_goes_on_at_once_after_a_consumer_expires(
    blob_store: BlobStore, lazy: bool
) -> None:
    """The purge of a consumer whose lease lapsed moves hashes; it is committed by the first
    fetch that sees it, and the next fetch delivers (it used to abort every fetch until a
    lease renewal, up to a third of the lease later)."""
    clock = ManualClock()
    create_topic(blob_store, "subs")
    produce(blob_store, 40, keys=[f"k{i}" for i in range(8)])
    a = consumer(blob_store, clock, "Key_Shared", "a", lazy_claims=lazy)
    b = consumer(blob_store, clock, "Key_Shared", "b", lazy_claims=lazy)
    clock.advance(9_000)
    b.renew()
    clock.advance(1_500)  # a's lease (10 s) lapsed; b renewed too recently to renew again
    got = b.fetch(10) or b.fetch(10)  # the first may only commit the purge and rescan
    assert len(got) == 10
    assert "a" not in {c.name for c in b.state().consumers.values()}
    a.close()


def test_a_missing_subscription_is_subscription_not_found(blob_store: BlobStore) -> None:
    """A deleted or never-created subscription is SubscriptionNotFound, not TopicNotFound, so
    callers can tell it from a deleted topic."""
    from filepulsar.storage.errors import SubscriptionNotFound, TopicNotFound
    from filepulsar.storage.subscriptions import SubscriptionStore

    clock = ManualClock()
    create_topic(blob_store, "subs")
    with pytest.raises(SubscriptionNotFound, match=r"subscription 'nope' on .* does not exist"):
        SubscriptionStore(blob_store, T, "nope").latest()
    a = consumer(blob_store, clock, "Shared", "a")
    a.unsubscribe()
    with pytest.raises(SubscriptionNotFound) as info:
        a.state()
    assert not isinstance(info.value, TopicNotFound)


@s3_once("sub_type", ["Shared", "Exclusive", "Key_Shared"])  # the holes: one state commit
def test_ack_holes_beyond_the_cap_are_not_stored_and_those_messages_come_again(
    blob_store: BlobStore, sub_type: str
) -> None:
    """Pulsar's managedLedgerMaxUnackedRangesToPersist: at most N individually acknowledged
    ranges are stored; acknowledgements in ranges beyond them are dropped and those messages
    delivered again (never lost). Fails on the old code, which stored every range."""
    clock = ManualClock()
    create_topic(blob_store, "subs")
    set_topic_policies(blob_store, "subs", max_unacked_ranges_to_persist=3)
    produce(blob_store, 12, keys=["k"] if sub_type == "Key_Shared" else None)
    c = consumer(blob_store, clock, sub_type, "a")
    got = []
    while len(got) < 12:
        ds = c.fetch(12)
        assert ds
        got.extend(ds)
    by_value = {values([d])[0]: d for d in got}
    # Ack 1, 3, 5, 7, 9: five separate holes (0 is unacknowledged, so nothing folds).
    c.acknowledge([(by_value[b"%d" % i].position, -1, 1) for i in (1, 3, 5, 7, 9)])
    st = c.state()
    assert len(st.acked) == 3  # 1, 3, 5 kept; 7 and 9 dropped
    again = values(c.fetch(12))
    assert b"7" in again and b"9" in again
    assert not {b"1", b"3", b"5"} & set(again)
    # Nothing is lost: acknowledging everything delivered drains the subscription.
    c.acknowledge([(d.position, -1, 1) for d in got])
    assert drain(c) == [] and c.state().mark_delete == (got[-1].position.ledger_id, 11)


def test_acknowledging_positions_or_other_ids_stores_the_same_state(
    blob_store: BlobStore,
) -> None:
    """acknowledge takes a Position as it is (what the client passes: no copy per message)
    and makes one of another pair of ids (a MessageId): both groups, each with whole
    entries, holes and batch indexes, store the same acknowledgements."""
    from filepulsar.storage.messageid import MessageId
    from filepulsar.storage.position import Position

    clock = ManualClock()
    create_topic(blob_store, "subs")
    produce(blob_store, 12)
    with Producer(blob_store, "subs", batching_max_publish_delay_ms=1000) as p:
        for i in range(3):
            p.send_async(b"b%d" % i)
    states = []
    for sub, as_id in (("pos", False), ("ids", True)):
        c = SubscriptionConsumer(
            blob_store,
            T,
            sub,
            sub_type="Shared",
            consumer_name="c",
            clock=clock,
            initial_position="Earliest",
        )
        ds = c.fetch(100)
        items = [(d.position, -1, 1) for i, d in enumerate(ds[:-1]) if i not in (3, 7)]
        items.append((ds[-1].position, 1, 3))
        if as_id:
            items = [
                (MessageId(ledger_id=p.ledger_id, entry_id=p.entry_id, batch_index=i), i, n)
                for p, i, n in items
            ]
            assert all(type(p) is not Position for p, _, _ in items)
        c.acknowledge(items)
        s = c.state()
        states.append((s.mark_delete, s.acked, s.batch_acks))
        c.close()
    assert states[0] == states[1]
    assert states[0][1] and states[0][2]  # (holes and a partly acknowledged batch)
