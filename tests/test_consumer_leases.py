"""The lease watch (storage/consumer_leases.py) over hand-built states and a ManualClock: a
lease lapses only after the observer has seen the same renewal for longer than the lease on
its own monotonic clock; wall-clock expiries never matter."""

from __future__ import annotations

from typing import Any

import pytest

from filepulsar.dispatch.clock import ManualClock
from filepulsar.dispatch.modes import ConsumerType
from filepulsar.storage.consumer_leases import LeaseWatch, watch_for
from filepulsar.storage.cursor import ConsumerInfo, SubscriptionState

pytestmark = pytest.mark.unit

LEASE = 3_000


def _state(**renewals: int) -> SubscriptionState:
    """Consumers named by the keywords, each at that renewal count; their wall-clock expiry
    is long past (1 ms since the epoch) whatever the count."""
    s = SubscriptionState(topic="persistent://t/n/x", name="sub", sub_type=ConsumerType.Shared)
    for i, (cid, n) in enumerate(renewals.items()):
        s.consumers[cid] = ConsumerInfo(cid, cid, 0, 1, i, cid, LEASE, n)
    return s


def test_a_lease_lapses_one_lease_after_its_renewal_was_first_seen() -> None:
    clock = ManualClock()
    watch = LeaseWatch(clock.monotonic)
    assert watch.lapsed(_state(a=1)) == frozenset()  # never seen: not lapsed
    watch.observe(_state(a=1, b=1))
    clock.advance(LEASE)
    watch.observe(_state(a=2, b=1))  # a renewed; b did not
    assert watch.lapsed(_state(a=2, b=1)) == frozenset()  # exactly one lease: not yet
    clock.advance(1)
    assert watch.lapsed(_state(a=2, b=1)) == {"b"}
    clock.advance(LEASE)
    assert watch.lapsed(_state(a=2, b=1)) == {"a", "b"}


def test_judging_notes_nothing_and_any_change_is_a_renewal() -> None:
    """A state a commit builds on may be stale: judging it records nothing, and a renewal
    other than the noted one is not lapsed. A count that went down (rewritten by older code)
    is a renewal too."""
    clock = ManualClock()
    watch = LeaseWatch(clock.monotonic)
    watch.observe(_state(a=5))
    clock.advance(LEASE + 1)
    assert watch.lapsed(_state(a=4)) == frozenset()  # a stale copy: no decision on it
    assert watch.lapsed(_state(a=5)) == {"a"}  # the noted renewal is still timed from 0
    watch.observe(_state(a=0))
    assert watch.lapsed(_state(a=0)) == frozenset()
    clock.advance(LEASE + 1)
    assert watch.lapsed(_state(a=0)) == {"a"}


def test_the_same_state_asked_again_lapses_on_time() -> None:
    """A dispatcher asks about the same state object at every look (the watch remembers
    until when nobody in it can lapse): its consumers still lapse one lease after their
    renewal was first seen, one noted only later included, and not once renewed."""
    clock = ManualClock()
    watch = LeaseWatch(clock.monotonic)
    s = _state(a=1, c=1)
    watch.observe(_state(a=1))  # c not seen yet
    assert watch.lapsed(s) == frozenset()
    clock.advance(LEASE // 2)
    watch.observe(_state(a=1, c=1))  # c first seen now
    assert watch.lapsed(s) == frozenset()
    clock.advance(LEASE // 2)
    assert watch.lapsed(s) == frozenset()  # exactly one lease for a: not yet
    clock.advance(1)
    assert watch.lapsed(s) == {"a"}
    clock.advance(LEASE // 2)
    assert watch.lapsed(s) == {"a", "c"}
    renewed = _state(b=1)
    watch.observe(renewed)
    assert watch.lapsed(renewed) == frozenset()
    watch.observe(_state(b=2))  # b renewed: the state that shows b=1 is stale
    clock.advance(LEASE + 1)
    assert watch.lapsed(renewed) == frozenset()


def test_a_state_not_noted_is_judged_afresh_each_time() -> None:
    """Only noted states (read as the newest or committed: no longer changed) are remembered
    quiet: a commit's change asks about its private copy, then changes it, and may ask again
    before the copy is committed and noted."""
    clock = ManualClock()
    watch = LeaseWatch(clock.monotonic)
    watch.observe(_state(d=1))
    clock.advance(LEASE + 1)
    private = _state()
    assert watch.lapsed(private) == frozenset()  # nobody in it: nobody can ever lapse
    private.consumers.update(_state(d=1).consumers)
    assert watch.lapsed(private) == {"d"}
    noted = _state()
    watch.observe(noted)
    assert watch.lapsed(noted) == frozenset()
    assert watch.lapsed(noted) == frozenset()  # remembered quiet: asked again, the same


def test_one_watch_per_clock() -> None:
    """The system clock's watch is the process's; each ManualClock plays a machine."""
    one, two = ManualClock(), ManualClock()
    assert watch_for(one) is watch_for(one) and watch_for(one) is not watch_for(two)
    assert watch_for(None) is watch_for(lambda: 0)  # wall-clock callables: system monotonic


def test_a_consumer_joining_in_a_commit_of_this_process_lapses_on_time(tmp_path: Any) -> None:
    """A commit's change asks who lapsed in its private copy, then adds a consumer to it, and
    that copy becomes the newest state: what was judged of it before the change must not be
    remembered (review of s22-push: the active Failover consumer that joined so, and never
    renewed, was seen lapsed only at the standby's own next renewal)."""
    from filepulsar.storage import Producer, TopicName, create_topic
    from filepulsar.storage.blobstore import open_blob_store
    from filepulsar.storage.subscription import SubscriptionConsumer

    store = open_blob_store(str(tmp_path))
    clock = ManualClock()
    create_topic(store, "fo")
    with Producer(store, "fo", batching_enabled=False) as p:
        for i in range(5):
            p.send_async(b"%d" % i)

    def consumer(name: str, lease_ms: int, prio: int) -> SubscriptionConsumer:
        return SubscriptionConsumer(
            store,
            TopicName.parse("fo"),
            "s",
            sub_type="Failover",
            consumer_name=name,
            initial_position="Earliest",
            lease_ms=lease_ms,
            clock=clock,
            priority_level=prio,
        )

    standby = consumer("z", 30_000, 1)
    dead = consumer("a", 3_000, 0)  # the active one; never renews again
    assert standby.fetch(10) == []
    clock.advance(4_000)
    s = standby.state()
    assert standby.lapsed(s.copy()) == {dead.cid}  # the rule, on an equal fresh object
    assert standby.lapsed(s) == {dead.cid}
    assert len(standby.fetch(10)) == 5  # the standby takes over now, not at 10 s
