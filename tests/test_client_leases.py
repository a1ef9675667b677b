"""Consumer leases under a slow or late consumer (the load failures of tests/test_client_procs).

Injected clocks (``ManualClock``: wall and monotonic time) decide when a lease lapses, so
nothing here sleeps for time to pass; a short ``receive`` timeout only proves that nothing is
deliverable. Two clients with their own clocks play two machines: one whose consumer fell
silent past its lease, one that sees it lapsed. A lease lapses for an observer when it has seen
the lease unrenewed for longer than the lease on its own monotonic clock; wall clocks (which
may be off between machines) never decide it.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from filepulsar.asyncio import Client as AsyncClient
from filepulsar.connector import client as client_module
from filepulsar.connector.client import Client, ConsumerType, InitialPosition, Timeout
from filepulsar.dispatch.clock import ManualClock
from filepulsar.storage import set_namespace_policies
from filepulsar.storage.blobstore.local import LocalBlobStore
from filepulsar.storage.names import TopicName
from filepulsar.storage.subscriptions import SubscriptionStore

pytestmark = pytest.mark.unit

LEASE = 60_000  # the housekeeping thread looks every second; the clocks jump past leases
TOPIC = "persistent://public/default/work"
START = 1_700_000_000_000


def _client(root: Path, clock: ManualClock) -> Client:
    c = Client(str(root), clock=clock)
    set_namespace_policies(c.store, "public", "default", producer_lease_ms=3_600_000)
    return c


def _produce(client: Client, n: int) -> None:
    p = client.create_producer("work", batching_enabled=False)
    for i in range(n):
        p.send(str(i).encode(), partition_key=f"k{i}")
    p.close()


def _subscribe(client: Client, typ: ConsumerType, **kw: Any) -> Any:
    # Every acknowledgement written at once: these tests read the subscription's state
    # between calls, and one holds up an acknowledgement's store call.
    kw.setdefault("ack_grouping_time_ms", 0)
    return client.subscribe(
        "work",
        "s",
        consumer_type=typ,
        initial_position=InitialPosition.Earliest,
        consumer_lease_ms=LEASE,
        **kw,
    )


def _drain(consumer: Any) -> list[tuple[str, int]]:
    """(value, redelivery count) of everything deliverable, acknowledged as received."""
    out = []
    while True:
        try:
            m = consumer.receive(50)
        except Timeout:
            return out
        out.append((m.data().decode(), m.redelivery_count()))
        consumer.acknowledge(m)


def _state(client: Client) -> Any:
    return SubscriptionStore(client.store, TopicName.parse(TOPIC), "s").latest()


@pytest.mark.parametrize("typ", [ConsumerType.Shared, ConsumerType.KeyShared])
def test_a_lapsed_consumer_does_not_deliver_what_it_queued(tmp_path: Path, typ: Any) -> None:
    """Its queued messages were handed to another consumer: as Pulsar's client clears its
    receiver queue when it reconnects, they are dropped, not delivered a second time."""
    clock_a, clock_b = ManualClock(START), ManualClock(START)
    ca, cb = _client(tmp_path, clock_a), _client(tmp_path, clock_b)
    _produce(ca, 10)
    a = _subscribe(ca, typ, receiver_queue_size=5, consumer_name="a")
    received = [a.receive(1000), a.receive(1000)]  # a's application got two of them
    b = _subscribe(cb, typ, consumer_name="b")  # b's machine sees a's lease from now on
    # a's housekeeping tick (its thread does it within a second): Key_Shared, a records
    # what it handed out now that membership changed; Shared recorded it when claiming.
    a._topics.parts[0].sc.renew_if_due()
    held = {int(k.split(":")[1]) for k in _state(ca).pending}  # one entry per message
    assert len(held) > 2  # the rest wait in a's receiver queue
    got_b = _drain(b)  # what a does not hold
    assert not {v for v, _ in got_b} & {str(i) for i in held}
    clock_b.advance(LEASE + 1)  # b saw a's lease unrenewed for longer than the lease
    got_b += _drain(b)  # b's first commit removes a
    assert sorted(int(v) for v, _ in got_b) == list(range(10))
    assert {v for v, rc in got_b if rc == 1} == {str(i) for i in held}  # a's, once more
    clock_a.advance(LEASE + 1)  # a's own clock passes its lease too
    assert _drain(a) == []  # old code: the rest of a's receiver queue, a second time
    for m in received:
        a.acknowledge(m)  # acknowledging what b acknowledged already is harmless
    assert not _state(ca).pending and not _state(ca).redeliver
    b.close()
    a.close()
    ca.close()
    cb.close()


@pytest.mark.parametrize("typ", [ConsumerType.Shared, ConsumerType.KeyShared])
def test_an_asyncio_consumer_whose_lease_lapsed_does_not_deliver_what_it_queued(
    tmp_path: Path, typ: Any
) -> None:
    """The same through the asyncio client, whose ``receive`` takes an already queued message
    on the event loop's thread without a worker: that path too checks the message's
    registration first (old code handed out the lapsed registration's queue a second time)."""
    clock_a, clock_b = ManualClock(START), ManualClock(START)
    cb = _client(tmp_path, clock_b)
    _produce(cb, 10)

    async def main() -> None:
        ca = AsyncClient(str(tmp_path), clock=clock_a)
        a = await ca.subscribe(
            "work",
            "s",
            consumer_type=typ,
            initial_position=InitialPosition.Earliest,
            consumer_lease_ms=LEASE,
            receiver_queue_size=5,
            consumer_name="a",
            ack_grouping_time_ms=0,
            # The consumer's timer tick also sends a receive to the slow path; with the
            # default 1 s tick that narrows the window to a second after the lapse, where
            # another process may already have taken the messages over.
            tick_duration_ms=10 * LEASE,
        )
        received = [await a.receive(), await a.receive()]
        b = _subscribe(cb, typ, consumer_name="b")
        sync_a = a._consumer
        sync_a._topics.parts[0].sc.renew_if_due()  # a's housekeeping tick, as above
        held = {int(k.split(":")[1]) for k in _state(cb).pending}
        assert len(held) > 2
        got_b = _drain(b)
        clock_b.advance(LEASE + 1)
        got_b += _drain(b)  # b's first commit removes a; a's messages come to b
        assert sorted(int(v) for v, _ in got_b) == list(range(10))
        clock_a.advance(LEASE + 1)
        assert len(sync_a._queue)  # a still has queued messages b took over
        with pytest.raises(asyncio.TimeoutError):
            again = await asyncio.wait_for(a.receive(), 0.5)
            pytest.fail(f"a delivered {again.data()!r} that b received and acknowledged")
        for m in received:
            await a.acknowledge(m)
        await a.close()
        b.close()
        await ca.close()

    asyncio.run(main())
    st = _state(cb)
    assert not st.pending and not st.redeliver
    cb.close()


@pytest.mark.parametrize(
    "typ", [ConsumerType.Shared, ConsumerType.KeyShared, ConsumerType.Exclusive]
)
def test_a_late_renewal_nobody_acted_on_keeps_what_it_holds(tmp_path: Path, typ: Any) -> None:
    """A consumer past its lease that nobody removed yet still holds its messages: renewing
    keeps them (old code removed itself and had them all redelivered, the received one too)."""
    clock = ManualClock(START)
    c = _client(tmp_path, clock)
    _produce(c, 2)
    a = _subscribe(c, typ, consumer_name="a")
    m0 = a.receive(1000)
    clock.advance(LEASE + 1)  # a was silent past its lease; no other consumer came by
    rest = _drain(a)
    a.acknowledge(m0)
    assert [(m0.data().decode(), m0.redelivery_count()), *rest] == [("0", 0), ("1", 0)]
    st = _state(c)
    assert list(st.consumers) == [a._topics.parts[0].sc.cid] and not st.pending and not st.redeliver
    a.close()
    c.close()


def test_a_key_shared_consumer_that_finds_nothing_to_claim_still_renews(tmp_path: Path) -> None:
    """A fetch that claims nothing writes nothing, so it must not count as a renewal (old
    code did: a consumer polling slots that were still draining let its lease lapse)."""
    clock = ManualClock(START)
    c = _client(tmp_path, clock)
    _produce(c, 20)
    a = _subscribe(c, ConsumerType.KeyShared, consumer_name="a", receiver_queue_size=100)
    a.receive(1000)
    a.receive(1000)
    b = _subscribe(c, ConsumerType.KeyShared, consumer_name="b")
    a._topics.parts[0].sc.renew_if_due()  # a's housekeeping tick: records what it holds
    assert len(_state(c).pending) == 20  # a holds every key
    b_id = b._topics.parts[0].sc.cid
    _produce(c, 20)  # the same keys again: b's wait behind a's pending ones
    for _quarter in (1, 2, 3):  # b's keys are draining at a: b polls and finds nothing
        clock.advance(LEASE // 4)
        with pytest.raises(Timeout):
            b.receive(20)
    assert _state(c).consumers[b_id].expires_ms > START + LEASE  # renewed on the way
    a.close()
    b.close()
    c.close()


def test_a_consumer_busy_in_storage_still_renews_its_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An acknowledgement stuck in a slow store call must not stop the lease renewals (old
    code renewed under the consumer's lock, which the acknowledgement holds). On a store
    whose commits are store calls (versions as files, as on object stores: on a local disk's
    journal, commits to one subscription are one at a time by design, and a renewal waits
    for the commit before it as long as that commit's own flush takes)."""
    clock = ManualClock(START)
    monkeypatch.setattr(
        client_module, "open_blob_store", lambda root, **kw: LocalBlobStore(root, journal=False)
    )
    c = _client(tmp_path, clock)
    _produce(c, 1)
    a = _subscribe(c, ConsumerType.Shared, consumer_name="a")
    m = a.receive(1000)
    store = c.store
    inner = store.put_if_absent
    stuck, release, renewed = threading.Event(), threading.Event(), threading.Event()

    def put_if_absent(key: str, data: Any) -> bool:
        me = threading.current_thread().name
        if me == "acker":
            stuck.set()
            assert release.wait(60)  # a store call that takes long (bounded: never hangs)
        won = inner(key, data)
        if me.startswith("filepulsar-consumer-") and "/subscriptions/" in key and won:
            renewed.set()
        return won

    monkeypatch.setattr(store, "put_if_absent", put_if_absent)
    acker = threading.Thread(target=a.acknowledge, args=(m,), name="acker")
    acker.start()
    try:
        assert stuck.wait(30)
        clock.advance(LEASE // 2)  # a renewal is due (every third of the lease)
        assert renewed.wait(30), "the lease was not renewed while an acknowledgement was slow"
        assert _state(c).consumers[a._topics.parts[0].sc.cid].expires_ms == clock() + LEASE
    finally:
        release.set()
        acker.join(60)
    assert not _state(c).pending  # the slow acknowledgement went through
    a.close()
    c.close()


@pytest.mark.parametrize("typ", [ConsumerType.Shared, ConsumerType.KeyShared])
def test_wall_clocks_minutes_apart_take_nothing_from_a_live_consumer(
    tmp_path: Path, typ: Any
) -> None:
    """a's machine is 10 leases behind b's (wall clocks). While a renews, b takes nothing a
    holds, however long b looks (wall-clock leases: b removed a at once, as a's expiry was
    long past on b's clock); once a falls silent, b takes over one lease after it last saw a
    renew, and a, back, finds itself removed and drops what it had queued."""
    clock_a, clock_b = ManualClock(START - 10 * LEASE), ManualClock(START)
    ca, cb = _client(tmp_path, clock_a), _client(tmp_path, clock_b)
    _produce(cb, 10)
    a = _subscribe(ca, typ, receiver_queue_size=5, consumer_name="a")
    a.receive(1000)
    b = _subscribe(cb, typ, consumer_name="b")
    a._topics.parts[
        0
    ].sc.renew_if_due()  # a's housekeeping tick (Key_Shared: records what it holds)
    held = {int(k.split(":")[1]) for k in _state(ca).pending}
    got_b = _drain(b)
    for _ in range(6):  # both machines' time moves on; a renews (its housekeeping), b looks
        clock_a.advance(LEASE // 2)
        clock_b.advance(LEASE // 2)
        a._topics.parts[0].sc.renew_if_due()
        got_b += _drain(b)
    assert not {v for v, _ in got_b} & {str(i) for i in held}  # nothing of a's taken
    assert a._topics.parts[0].sc.cid in _state(cb).consumers
    clock_b.advance(LEASE + 1)  # a fell silent: b saw no renewal for longer than the lease
    got_b += _drain(b)
    assert sorted(int(v) for v, _ in got_b) == list(range(10))
    assert {v for v, rc in got_b if rc == 1} == {str(i) for i in held}
    clock_a.advance(LEASE + 1)
    assert _drain(a) == []  # a registers again; what it queued went to b
    b.close()
    a.close()
    ca.close()
    cb.close()


def test_client_instances_of_one_process_share_a_topic_s_ledger(tmp_path: Path) -> None:
    """Several client instances on one root in a process (Pulsar's IoT scenario: an
    application's clients) follow each topic's manifest once, as one client's consumers do:
    they share the managed ledger (old code keyed it by the store object, and each client
    opens its own: every manifest version was read and folded once per client)."""
    clock = ManualClock(START)
    c1, c2 = _client(tmp_path, clock), _client(tmp_path, clock)
    _produce(c1, 4)
    a = _subscribe(c1, ConsumerType.KeyShared, consumer_name="a")
    b = _subscribe(c2, ConsumerType.KeyShared, consumer_name="b")
    assert c1.store is not c2.store
    assert a._topics.parts[0].sc.ml is b._topics.parts[0].sc.ml
    got = sorted(v for v, _ in _drain(a) + _drain(b))
    assert got == ["0", "1", "2", "3"]
    a.close()
    b.close()
    other = _client(tmp_path, ManualClock(START))  # a clock of its own: a machine of its own
    o = _subscribe(other, ConsumerType.KeyShared, consumer_name="o")
    assert o._topics.parts[0].sc.ml is not a._topics.parts[0].sc.ml
    o.close()
    for c in (c1, c2, other):
        c.close()
