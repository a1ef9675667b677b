"""Grouped acknowledgements (issue #27): the :class:`AckGrouper` on its own (a sink that
records its writes, a clock moved by hand), then the client consumer over a real local store,
counting the subscription's commits by its state's version (one per commit). Time is a
``ManualClock``; nothing sleeps. The SIGKILL case (pending groups redelivered, none lost) is
in test_client_procs.py.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from filepulsar.connector.client import (
    Client,
    ConsumerType,
    InitialPosition,
    Message,
    MessageId,
    Timeout,
)
from filepulsar.connector.client.ack_grouping import (
    DEFAULT_ACK_GROUPING_MAX_SIZE,
    DEFAULT_ACK_GROUPING_TIME_MS,
    DEFAULT_MARK_DELETE_RATE_LIMIT,
    AckGrouper,
    AckGrouping,
    AckItem,
    AckTimer,
)
from filepulsar.dispatch.clock import ManualClock
from filepulsar.storage import paths
from filepulsar.storage.errors import BlobStoreError, FilePulsarError, InvalidConfiguration
from filepulsar.storage.ledger import ManagedLedger, Position
from filepulsar.storage.names import TopicName
from filepulsar.storage.subscriptions import (
    SubscriptionStore,
    delete_subscription,
    subscription_backlog,
)
from filepulsar.storage.versioned.watch import CommitWaiter

pytestmark = pytest.mark.unit

E = InitialPosition.Earliest
T = "grouped"


# --------------------------------------------------------------------------- the grouper alone
class _Sink:
    """Records each write; fails while ``fail`` is set."""

    def __init__(self, name: str = "p0") -> None:
        self.topic = name
        self.writes: list[list[AckItem]] = []
        self.fail: FilePulsarError | None = None

    def acknowledge(self, items: Iterable[AckItem]) -> None:
        if self.fail is not None:
            raise self.fail
        self.writes.append(list(items))


def _item(e: int) -> AckItem:
    return (Position(0, e), -1, 1)


def _grouper(
    clock: ManualClock,
    time_ms: int = 100,
    max_size: int = 1000,
    woken: list[int] | None = None,
    rate: float = 0,
) -> AckGrouper:
    return AckGrouper(
        AckGrouping(time_ms, max_size, rate),
        clock=clock,
        name="c",
        on_pending=None if woken is None else lambda: woken.append(1),
    )


def test_a_round_with_a_budget_writes_the_groups_due_over_several_calls() -> None:
    """A housekeeping round bounded in time: past the budget no further group is started
    (the first always is), the rest stays due and the next calls write it."""
    clock = ManualClock()
    g = _grouper(clock)
    sinks = [_Sink(f"p{i}") for i in range(3)]
    for i, s in enumerate(sinks):
        g.add(s, [_item(i)])
    clock.advance(100)
    written = []
    for _ in range(3):
        assert g.due_in_ms() == 0
        g.flush_due(0)  # a budget already spent: one group per call
        written.append(sum(len(s.writes) for s in sinks))
    assert written == [1, 2, 3] and g.due_in_ms() is None
    for i, s in enumerate(sinks):
        g.add(s, [_item(10 + i)])
    clock.advance(100)
    g.flush_due(60.0)  # within the budget: every group due
    assert [len(s.writes) for s in sinks] == [2, 2, 2]


def test_groups_a_round_left_are_housekeepings_not_the_next_acknowledgements() -> None:
    """What a housekeeping round over its budget leaves is for the next round (woken at
    once), not written inline by the application's next acknowledgement: ``add`` writes no
    more than it did before rounds had a budget (it took 0.9 s after a 0.1 s round)."""
    clock = ManualClock()
    woken: list[int] = []
    g = _grouper(clock, woken=woken)
    sinks = [_Sink(f"p{i}") for i in range(5)]
    for i, s in enumerate(sinks):
        g.add(s, [_item(i)])
    clock.advance(100)
    woken.clear()
    g.flush_due(0)  # one group, four left
    woke = list(woken)
    g.add(sinks[0], [_item(10)])  # the application's next acknowledgements
    g.add(sinks[4], [_item(11)])
    assert sum(len(s.writes) for s in sinks) == 1  # nothing written inline
    assert woke == [1]  # housekeeping woken for the rest
    assert g.due_in_ms() == 0  # the next round writes them
    g.flush_due(60.0)
    assert sum(len(s.writes) for s in sinks) == 5


def test_a_timer_writes_the_groups_due_and_an_acknowledgement_only_adds() -> None:
    """With the process's timer (a push dispatcher's housekeeping): an acknowledgement adds
    to its group with no clock read once the group started and writes nothing due (the
    timer does); the timer looks at no group before the first is due, then writes each when
    due, at the rate."""
    clock = ManualClock()
    reads: list[int] = []
    woken: list[int] = []

    def counted() -> int:
        reads.append(1)
        return clock()

    timer = AckTimer(lambda: woken.append(1), monotonic=clock.monotonic)
    g = AckGrouper(AckGrouping(100, 1000, 1.0), clock=counted, name="c", timer=timer)
    looked: list[int] = []
    due_at = g._due_at

    def counted_due_at(group, now):  # type: ignore[no-untyped-def]
        looked.append(now)
        return due_at(group, now)

    g._due_at = counted_due_at  # type: ignore[method-assign]
    a, b = _Sink("a"), _Sink("b")
    g.add(a, [_item(0)])  # a's group starts: the timer is told (and woken: due sooner)
    assert woken == [1]
    n = len(reads)
    g.add(a, [_item(1)])
    g.add(a, [_item(2)])
    assert len(reads) == n and woken == [1]  # no clock read, nobody woken
    looked.clear()
    clock.advance(99)
    assert timer.flush_due() == pytest.approx(0.001) and looked == []  # nothing looked at
    clock.advance(1)
    g.add(b, [_item(3)])  # b's starts, due in 100 ms; a's is due now, not written here
    assert a.writes == [] and woken == [1]  # (due later than a's: no wake)
    g.flush_if_due()  # receive's tick: the timer's work, not the application's
    assert a.writes == []
    assert timer.flush_due() == pytest.approx(0.1)
    assert a.writes == [[_item(0), _item(1), _item(2)]] and b.writes == []
    g.add(a, [_item(4)])  # a's next group: due a second after its write (the rate)
    clock.advance(100)
    timer.flush_due()
    assert b.writes == [[_item(3)]] and len(a.writes) == 1
    clock.advance(899)
    timer.flush_due()
    assert len(a.writes) == 1
    clock.advance(1)
    assert timer.flush_due() == math.inf  # nothing pending any more
    assert a.writes[1] == [_item(4)] and g.pending() == 0


def test_acknowledgements_on_a_started_group_take_no_process_wide_lock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each group has a lock of its own: once a consumer joined a partition's group and its
    run started, an acknowledgement there takes neither the lock of the process's groups nor
    the timer's (ten consumer threads acknowledging on a process-wide lock queued behind
    whichever lost the interpreter holding it); a run that starts tells the timer."""
    from filepulsar.connector.client import ack_grouping

    clock = ManualClock()
    timer = AckTimer(lambda: None, monotonic=clock.monotonic)
    g = AckGrouper(AckGrouping(100, 1000, 0), clock=clock, name="c", timer=timer)
    a, b = _Sink("a"), _Sink("b")
    entered: list[int] = []
    real = ack_grouping._GROUPS_LOCK

    class Counted:
        def __enter__(self) -> None:
            entered.append(1)
            real.acquire()

        def __exit__(self, *exc: object) -> None:
            real.release()

    monkeypatch.setattr(ack_grouping, "_GROUPS_LOCK", Counted())
    g.add(a, [_item(0)])  # joins a's group, and its run starts: the timer is told
    g.add(b, [_item(1)])
    assert entered  # (joining and telling the timer take it)
    entered.clear()
    for e in range(2, 50):
        g.add(a if e % 2 else b, [_item(e)])
    assert entered == []
    clock.advance(100)
    timer.flush_due()
    assert [len(w) for w in a.writes + b.writes] == [25, 25]


def test_a_run_put_back_after_a_failed_write_elsewhere_is_timed_again() -> None:
    """A write made outside the timer's thread (a flush: negative or cumulative ack, seek)
    fails while a timer pass runs: the pass found no run and forgot the group; the run put
    back is timed again and written when due (review of s28-ackpath: it waited for the next
    flush or close, the cursor lagging meanwhile)."""
    clock = ManualClock()
    timer = AckTimer(lambda: None, monotonic=clock.monotonic)
    g = AckGrouper(AckGrouping(100, 1000, 10.0), clock=clock, name="c", timer=timer)
    a = _Sink("a")
    g.add(a, [_item(0)])

    class _PassDuringWrite:
        """Fails the write, after a timer pass ran while it was in flight."""

        def __init__(self, sink: _Sink) -> None:
            self.topic = sink.topic

        def acknowledge(self, items: Iterable[AckItem]) -> None:
            clock.advance(100)
            timer.flush_due()  # finds the group flying: no run pending
            raise BlobStoreError("transient")

    real = a.acknowledge
    a.acknowledge = _PassDuringWrite(a).acknowledge  # type: ignore[method-assign]
    with pytest.raises(BlobStoreError):
        g.flush(a)
    a.acknowledge = real  # type: ignore[method-assign]
    assert g.pending(a) == 1
    g.add(a, [_item(1)])  # appended to the run put back
    for _ in range(3):
        clock.advance(100)
        timer.flush_due()
    assert a.writes == [[_item(0), _item(1)]] and g.pending(a) == 0


def test_the_application_looks_at_the_groups_only_once_one_may_be_due() -> None:
    """flush_if_due (receive's timer tick) writes what is due, as flush_due, but looks at the
    groups only from the time its last look (or an add) found the next one due."""
    clock = ManualClock()
    g = _grouper(clock)
    a = _Sink("a")
    g.add(a, [_item(0)])
    g.flush_if_due()
    clock.advance(99)
    g.flush_if_due()
    assert a.writes == []
    looked: list[int] = []
    due_groups = g._due_groups

    def counted(now: int) -> tuple[list, int]:  # type: ignore[type-arg]
        looked.append(now)
        return due_groups(now)

    g._due_groups = counted  # type: ignore[method-assign]
    g.flush_if_due()
    assert looked == []  # not due yet: no pass over the groups
    clock.advance(1)
    g.flush_if_due()
    assert a.writes == [[_item(0)]] and len(looked) == 1


def test_defaults_are_pulsars() -> None:
    assert (DEFAULT_ACK_GROUPING_TIME_MS, DEFAULT_ACK_GROUPING_MAX_SIZE) == (100, 1000)
    assert DEFAULT_MARK_DELETE_RATE_LIMIT == 1.0  # managedLedgerDefaultMarkDeleteRateLimit
    assert AckGrouping() == AckGrouping(100, 1000, 1.0) and AckGrouping().enabled
    assert AckGrouping().write_interval_ms == 1000
    assert AckGrouping(100, 1000, 0).write_interval_ms == 0  # no limit
    assert AckGrouping(100, 1000, -1).write_interval_ms == 0
    assert AckGrouping(100, 1000, 3).write_interval_ms == 334
    for bad in (float("nan"), float("inf"), True, "1"):
        with pytest.raises(InvalidConfiguration, match="mark_delete_rate_limit must be a finite"):
            AckGrouping(100, 1000, bad)  # type: ignore[arg-type]
    assert not AckGrouping(0).enabled and not AckGrouping(-1).enabled
    with pytest.raises(InvalidConfiguration, match="time_ms must be an int"):
        AckGrouping(0.1)  # type: ignore[arg-type]
    with pytest.raises(InvalidConfiguration, match="max_size must be an int"):
        AckGrouping(100, True)


def test_a_run_is_written_whole_at_the_count_per_partition() -> None:
    clock = ManualClock()
    woken: list[int] = []
    g = _grouper(clock, max_size=3, woken=woken)
    a, b = _Sink("a"), _Sink("b")
    g.add(a, [_item(0)])
    g.add(b, [_item(0)])
    g.add(a, [_item(1)])
    assert a.writes == b.writes == [] and g.pending() == 3 and len(woken) == 2
    g.add(a, [_item(2)])
    assert a.writes == [[_item(0), _item(1), _item(2)]] and b.writes == []
    assert g.pending(a) == 0 and g.pending(b) == 1


def test_a_run_is_written_when_its_oldest_is_due() -> None:
    clock = ManualClock()
    g = _grouper(clock)
    a, b = _Sink("a"), _Sink("b")
    g.add(a, [_item(0)])
    clock.advance(60)
    g.add(b, [_item(0)])
    assert g.due_in_ms() == 40
    g.flush_due()
    assert a.writes == b.writes == []
    clock.advance(40)
    assert g.due_in_ms() == 0
    g.flush_due()
    assert a.writes == [[_item(0)]] and b.writes == []  # b's oldest is 40 ms old
    g.add(b, [_item(1)])  # an add finds the due runs too
    clock.advance(60)
    g.add(b, [_item(2)])
    assert b.writes == [[_item(0), _item(1), _item(2)]] and g.due_in_ms() is None


def test_no_count_limit_and_no_grouping() -> None:
    clock = ManualClock()
    g = _grouper(clock, max_size=0)
    a = _Sink()
    g.add(a, [_item(e) for e in range(5000)])
    assert a.writes == [] and g.pending() == 5000
    off = _grouper(clock, time_ms=0)
    off.add(a, [_item(1)])
    assert a.writes == [[_item(1)]] and off.pending() == 0 and off.due_in_ms() is None


def test_held_are_whole_entries_pending_or_being_written() -> None:
    clock = ManualClock()
    g = _grouper(clock)
    a = _Sink()
    g.add(a, [_item(0), (Position(0, 1), 2, 5)])  # entry 1: one message of a batch of 5
    assert g.held(a, [(0, 0), (0, 1), (0, 2)]) == {(0, 0)}
    seen: list[set[tuple[int, int]]] = []
    a.acknowledge = lambda items: seen.append(g.held(a, [(0, 0)]))  # type: ignore[method-assign]
    g.flush()
    assert seen == [{(0, 0)}] and g.held(a, [(0, 0)]) == set()


def test_a_failed_background_write_is_kept_logged_and_raised_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock()
    g = _grouper(clock)
    a = _Sink()
    g.add(a, [_item(0)])
    a.fail = BlobStoreError("disk full")
    clock.advance(100)
    g.add(a, [_item(1)])  # due: written in the background path, fails, kept
    assert g.pending(a) == 2 and "writing 2 grouped acknowledgements" in caplog.text
    with pytest.raises(BlobStoreError, match="disk full"):
        g.raise_failure()
    g.raise_failure()  # once
    a.fail = None
    g.flush_due()  # due again only time_ms after the failure
    assert a.writes == []
    clock.advance(100)
    g.flush_due()
    assert a.writes == [[_item(0), _item(1)]]


def test_a_steady_stream_is_written_once_a_second_per_partition() -> None:
    """Pulsar's broker persists a cursor at most ``managedLedgerDefaultMarkDeleteRateLimit``
    times a second (1.0): one acknowledgement every 10 ms for 5 s on each of two partitions
    writes each partition's group 5 times (the first at its group time, then one a second),
    where the group time alone wrote it 50 times; nothing is lost on the way."""
    clock = ManualClock()
    for rate, writes in ((1.0, 5), (0, 50)):
        g = _grouper(clock, rate=rate)
        a, b = _Sink("a"), _Sink("b")
        for e in range(500):
            g.add(a, [_item(e)])
            g.add(b, [_item(e)])
            clock.advance(10)
            g.flush_due()  # the housekeeping thread's rounds
        assert len(a.writes) == len(b.writes) == writes
        g.close()
        assert [i for w in a.writes for i in w] == [_item(e) for e in range(500)]
        assert [i for w in b.writes for i in w] == [_item(e) for e in range(500)]


def test_the_rate_holds_a_due_or_full_group_and_says_when() -> None:
    clock = ManualClock()
    g = _grouper(clock, max_size=3, rate=2.0)  # one write per 500 ms at most
    a = _Sink()
    g.add(a, [_item(0)])
    assert g.due_in_ms() == 100
    clock.advance(100)
    g.flush_due()
    assert a.writes == [[_item(0)]]  # the first write: no earlier one to wait for
    clock.advance(50)
    g.add(a, [_item(1), _item(2), _item(3)])  # full, 50 ms after the last write
    assert len(a.writes) == 1 and g.pending(a) == 3 and g.held(a, [(0, 3)]) == {(0, 3)}
    assert g.due_in_ms() == 450
    clock.advance(449)
    g.flush_due()
    assert len(a.writes) == 1
    clock.advance(1)
    g.add(a, [_item(4)])  # an add finds it due
    assert a.writes[1] == [_item(1), _item(2), _item(3), _item(4)] and g.due_in_ms() is None
    g.add(a, [_item(5)])
    g.flush()  # flush (close, seek, cumulative ...) writes at once, whatever the rate
    assert a.writes[2] == [_item(5)] and g.pending() == 0
    g.add(a, [_item(6)])
    g.settle(a)  # so does settle (a Key_Shared consumer recording what it holds)
    assert a.writes[3] == [_item(6)]
    off = _grouper(clock, time_ms=0, rate=0.001)
    off.add(a, [_item(7)])
    off.add(a, [_item(8)])  # no grouping: no rate either, each written before add returns
    assert a.writes[4:] == [[_item(7)], [_item(8)]]


def test_flush_and_close_raise_and_close_drops() -> None:
    clock = ManualClock()
    g = _grouper(clock)
    a = _Sink()
    g.add(a, [_item(0)])
    a.fail = BlobStoreError("gone")
    with pytest.raises(BlobStoreError):
        g.flush()
    assert g.pending(a) == 1  # kept
    with pytest.raises(BlobStoreError):
        g.close()
    assert g.pending() == 0
    g.close()  # closed: nothing more


# --------------------------------------------------------------------------- the consumer
@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def client(tmp_path: Path, clock: ManualClock) -> Iterator[Client]:
    c = Client(str(tmp_path / "root"), clock=clock)
    yield c
    c.close()


def _produce(client: Client, n: int, topic: str = T, *, start: int = 0) -> None:
    p = client.create_producer(topic, batching_enabled=False)  # one message per entry
    for i in range(start, start + n):
        p.send(str(i).encode())
    p.close()


def _store(client: Client, sub: str = "s", topic: str = T) -> SubscriptionStore:
    return SubscriptionStore(client.store, TopicName.parse(topic), sub)


def _commits(client: Client, sub: str = "s") -> int:
    """Commits of the subscription's state so far (each one bumps its version)."""
    return _store(client, sub).latest().version


def _backlog(client: Client, sub: str = "s") -> int:
    ml = ManagedLedger(client.store, TopicName.parse(T))
    return subscription_backlog(ml, ml.state(), _store(client, sub).latest())


def _receive(consumer: object, n: int) -> list[Message]:
    return [consumer.receive(1000) for _ in range(n)]  # type: ignore[attr-defined]


def _values(msgs: list[Message]) -> list[str]:
    return [m.data().decode() for m in msgs]


def test_grouped_acknowledgements_are_one_commit(client: Client, clock: ManualClock) -> None:
    _produce(client, 10)
    c = client.subscribe(T, "s", initial_position=E)  # Exclusive: receiving commits nothing
    msgs = _receive(c, 10)
    before = _commits(client)
    for m in msgs[:9]:
        c.acknowledge(m)
    assert _commits(client) == before and _backlog(client) == 10
    clock.advance(100)
    c.acknowledge(msgs[9])  # the group is 100 ms old: written with this one
    assert _commits(client) == before + 1 and _backlog(client) == 0
    c.close()
    assert _commits(client) == before + 2  # leaving: one more, nothing left to acknowledge


def test_consumers_of_a_subscription_in_one_process_share_one_group(
    client: Client, clock: ManualClock
) -> None:
    """Two Shared consumers of one subscription in one process: their acknowledgements join
    one group and one commit writes them (not one per consumer); each sees the other's
    pending acknowledgements as held; closing one writes the group, the other's included."""
    a, b = (
        client.subscribe(T, "s", consumer_type=ConsumerType.Shared, initial_position=E)
        for _ in range(2)
    )
    _produce(client, 5)
    msgs = _receive(a, 5)
    _produce(client, 5, start=5)
    msgs += _receive(b, 5)
    ids = [(m.message_id().ledger_id, m.message_id().entry_id) for m in msgs]
    before = _commits(client)
    for m in msgs[:4]:
        a.acknowledge(m)
    for m in msgs[5:9]:
        b.acknowledge(m)
    acked = lambda: sum(map(_store(client).latest().is_acked, ids))  # noqa: E731
    assert _commits(client) == before and acked() == 0
    part = b._topics.parts[0].sc  # the partition's storage consumer, to ask the group
    pos = set(ids[:4])
    assert b._acks.held(part, pos) == pos  # a's acknowledgements, seen by b
    clock.advance(100)
    b.acknowledge(msgs[9])  # b's own group time: due, written with a's
    assert _commits(client) == before + 1 and acked() == 9
    a.acknowledge(msgs[4])
    a.close()  # writes the group (one commit), then leaves (one more)
    assert _commits(client) == before + 3 and acked() == 10
    b.close()


@pytest.mark.parametrize(
    ("grouping", "group"),
    [
        # written at the count (no rate limit: test_the_rate_limits_a_steady_stream has it)
        ({"ack_grouping_max_size": 4, "mark_delete_rate_limit": 0}, 4),
        ({"ack_grouping_time_ms": 0}, 1),  # no grouping: each written at once, as before
    ],
)
def test_written_at_the_count_or_at_once(
    client: Client, grouping: dict[str, int], group: int
) -> None:
    _produce(client, 10)
    c = client.subscribe(T, "s", initial_position=E, **grouping)
    msgs = _receive(c, 10)
    before = _commits(client)
    for i, m in enumerate(msgs):
        c.acknowledge(m)
        groups = (i + 1) // group
        assert _commits(client) == before + groups and _backlog(client) == 10 - group * groups
    c.close()
    assert _backlog(client) == 0


def test_written_at_the_time_by_the_housekeeping_thread(client: Client, clock: ManualClock) -> None:
    """The application waits in receive() (or elsewhere): the consumer's own thread writes
    the group once it is due, woken when the group started."""
    _produce(client, 3)
    c = client.subscribe(T, "s", initial_position=E)
    msgs = _receive(c, 3)
    # On the system's clock: woken by the commit, or a real half second at most per round.
    waiter = CommitWaiter(client.store, [paths.subscription_state_dir(TopicName.parse(T), "s")])
    try:
        before = _commits(client)
        for m in msgs:
            c.acknowledge(m)
        clock.advance(100)
        for _ in range(100):  # woken by the commit; bounded, should the thread never write
            if _commits(client) != before:
                break
            waiter.wait(0.5)
        assert _commits(client) == before + 1 and _backlog(client) == 0
    finally:
        waiter.close()
        c.close()


def test_written_on_close_so_the_next_consumer_gets_nothing_again(client: Client) -> None:
    _produce(client, 5)
    c = client.subscribe(T, "s", consumer_type=ConsumerType.Shared, initial_position=E)
    for m in _receive(c, 5):
        c.acknowledge(m)
    assert _backlog(client) == 5
    c.close()
    assert _backlog(client) == 0
    c2 = client.subscribe(T, "s", consumer_type=ConsumerType.Shared)
    with pytest.raises(Timeout):
        c2.receive(1000)


def test_cumulative_after_grouped_individual_acknowledgements_is_exact(client: Client) -> None:
    _produce(client, 8)
    c = client.subscribe(T, "s", initial_position=E)
    msgs = _receive(c, 8)
    for i in (0, 1, 5):
        c.acknowledge(msgs[i])
    before = _commits(client)
    c.acknowledge_cumulative(msgs[3])  # the group (0, 1, 5) first, then up to 3
    assert _commits(client) == before + 2
    state = _store(client).latest()
    m3 = msgs[3].message_id()
    assert state.mark_delete == (m3.ledger_id(), m3.entry_id())
    assert state.is_acked((msgs[5].message_id().ledger_id(), msgs[5].message_id().entry_id()))
    assert _backlog(client) == 3  # 4, 6 and 7 (5, acknowledged, is subtracted, as Pulsar does)
    c.close()
    c2 = client.subscribe(T, "s", initial_position=E)
    assert _values(_receive(c2, 3)) == ["4", "6", "7"]


def test_acknowledged_but_not_written_never_comes_back_to_this_consumer(
    client: Client, clock: ManualClock
) -> None:
    """Its own redelivery paths write the group first (or never had the message)."""
    _produce(client, 6)
    c = client.subscribe(
        T,
        "s",
        consumer_type=ConsumerType.Shared,
        initial_position=E,
        unacked_messages_timeout_ms=1000,
        tick_duration_ms=100,
        negative_ack_redelivery_delay_ms=0,
    )
    msgs = _receive(c, 6)
    for m in msgs[:4]:
        c.acknowledge(m)
    c.negative_acknowledge(msgs[0])  # acknowledged first: nothing to redeliver
    c.redeliver_unacknowledged_messages()  # 4 and 5 only
    again = _receive(c, 2)
    assert sorted(_values(again)) == ["4", "5"]
    c.acknowledge(again[0])
    clock.advance(5000)  # past the ack timeout of the other one
    got = _receive(c, 1)
    assert _values(got) == _values(again[1:])
    c.acknowledge(got[0])
    with pytest.raises(Timeout):
        c.receive(1000)
    c.close()


def test_seek_writes_the_group_first(client: Client) -> None:
    _produce(client, 4)
    c = client.subscribe(T, "s", initial_position=E)
    msgs = _receive(c, 4)
    c.acknowledge(msgs[2])
    c.seek(msgs[0].message_id())  # next: message 1; 2 was acknowledged before the seek
    before = _commits(client)
    got = _receive(c, 2)
    assert _values(got) == ["1", "2"]  # a seek clears individual acknowledgements past it
    assert _commits(client) == before


def test_a_lapsed_lease_does_not_hand_a_pending_acknowledgement_back(
    client: Client, clock: ManualClock
) -> None:
    """Another consumer removes this one's lapsed lease, so storage hands out again what it
    had claimed, to this consumer too once it registers again: what it acknowledged meanwhile
    (pending here) is not delivered twice."""
    _produce(client, 3)
    shared = ConsumerType.Shared
    c = client.subscribe(
        T,
        "s",
        consumer_type=shared,
        initial_position=E,
        consumer_lease_ms=1000,
        ack_grouping_time_ms=60_000,
    )
    for m in _receive(c, 3):
        c.acknowledge(m)
    clock.advance(5000)  # the lease lapsed; the group is not due
    other = client.subscribe(T, "s", consumer_type=shared)  # removes c: 0, 1, 2 handed back
    _produce(client, 1, start=3)
    assert _values(_receive(c, 1)) == ["3"]
    other.close()
    c.close()
    assert _backlog(client) == 1


def test_a_failed_write_surfaces_and_close_raises(
    client: Client, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    _produce(client, 2)
    c = client.subscribe(T, "s", initial_position=E)
    msgs = _receive(c, 2)
    c.acknowledge(msgs[0])
    delete_subscription(client.store, TopicName.parse(T), "s")  # by an admin, meanwhile
    clock.advance(100)
    c.acknowledge(msgs[1])  # the group is due: writing it fails, kept and logged
    assert "writing 2 grouped acknowledgements" in caplog.text
    with pytest.raises(FilePulsarError, match="grouped acknowledgements"):
        c.acknowledge(msgs[1])  # the failure surfaces on the next call
    with pytest.raises(FilePulsarError, match="grouped acknowledgements"):
        c.close()  # never silently: the group could not be written
    assert not c.is_connected()


def test_asyncio_consumer_groups_and_writes_on_close(tmp_path: Path) -> None:
    from filepulsar.asyncio import Client as AsyncClient

    root = str(tmp_path / "root")
    sync = Client(root)
    _produce(sync, 5)

    async def run() -> int:
        client = AsyncClient(root)
        c = await client.subscribe(T, "s", initial_position=E, ack_grouping_time_ms=60_000)
        for _ in range(5):
            await c.acknowledge(await c.receive())
        pending = _backlog(sync)
        await c.close()
        await client.close()
        return pending

    assert asyncio.run(run()) == 5  # grouped: none written before the close
    assert _backlog(sync) == 0
    sync.close()


# --------------------------------------------------------------------------- the rate limit
def test_a_steady_stream_is_one_commit_a_second_and_close_writes_the_rest(
    client: Client, clock: ManualClock
) -> None:
    """Issue #27: the process plays the broker, which persists a cursor once a second
    (``mark_delete_rate_limit``, Pulsar's ``managedLedgerDefaultMarkDeleteRateLimit``): one
    acknowledgement every 50 ms for 2 s is 2 commits (at 100 ms, then 1 s later), where
    groups of 100 ms were 20; close() writes the rest, none is lost."""
    _produce(client, 40)
    c = client.subscribe(T, "s", initial_position=E)  # Exclusive: receiving commits nothing
    msgs = _receive(c, 40)
    before = _commits(client)
    for m in msgs:
        c.acknowledge(m)
        clock.advance(50)
    # The second write is due when the clock reaches 1,100 ms: the consumer's housekeeping
    # thread may write it then (22 acknowledged, the 23rd made at 1,100 ms not yet), or the
    # application's own acknowledge at 1,100 ms (23): either way 2 writes in 2 s.
    assert _commits(client) == before + 2 and _backlog(client) in (40 - 23, 40 - 22)
    c.close()  # the last group, then leaving
    assert _commits(client) == before + 4 and _backlog(client) == 0


@pytest.mark.parametrize("records_in", ["fetch", "renewal"])
def test_a_key_shared_consumer_writes_its_held_acknowledgements_before_recording(
    client: Client, clock: ManualClock, records_in: str
) -> None:
    """When a Key_Shared consumer joins, the others record what they hold (the newcomer's
    keys wait for it: draining), in their next fetch or lease renewal. Acknowledgements
    this process holds back (for the rate, or the group time) are written first, so they
    are not recorded as held and nobody waits for them."""
    kw = {"consumer_type": ConsumerType.KeyShared, "initial_position": E}
    a = client.subscribe(T, "s", consumer_name="a", ack_grouping_time_ms=60_000, **kw)
    p = client.create_producer(T, batching_enabled=False)
    for i in range(20):
        p.send(str(i).encode(), partition_key=f"k{i % 8}")
    p.close()
    for m in _receive(a, 20):
        a.acknowledge(m)  # held back (by the group time here; the rate holds them alike)
    assert _backlog(client) == 20
    b = client.subscribe(T, "s", consumer_name="b", **kw)
    if records_in == "fetch":
        with pytest.raises(Timeout):
            a.receive(50)  # a's fetch sees the new membership and records what it holds
    else:
        a._topics.parts[0].sc.renew()  # as its housekeeping thread renews the lease
    state = _store(client).latest()
    assert _backlog(client) == 0 and state.pending == {}
    b.close()
    a.close()


def test_a_negative_acknowledgement_writes_the_group_only_for_its_own_entry(
    client: Client, clock: ManualClock
) -> None:
    """A negative acknowledgement writes the partition's group first only when the group
    holds an acknowledgement of the same entry (a batch's other message): nacking another
    message does not cut the rate's window short, and a batch's acknowledged message never
    comes back with its negatively acknowledged neighbour."""
    _produce(client, 3)
    p = client.create_producer(T, batching_enabled=True, batching_max_publish_delay_ms=10_000)
    for i in range(3, 6):
        p.send_async(str(i).encode(), None)
    p.flush()
    p.close()
    c = client.subscribe(
        T,
        "s",
        consumer_type=ConsumerType.Shared,
        initial_position=E,
        batch_index_ack_enabled=True,
        negative_ack_redelivery_delay_ms=0,
        ack_grouping_time_ms=60_000,
    )
    msgs = _receive(c, 6)
    c.acknowledge(msgs[0])
    before = _commits(client)
    c.negative_acknowledge(msgs[1])  # another entry: only the negative acknowledgement
    assert _commits(client) == before + 1 and _backlog(client) == 6
    assert _values(_receive(c, 1)) == ["1"]
    c.acknowledge(msgs[3])  # the batch's first message
    before = _commits(client)
    c.negative_acknowledge(msgs[4])  # its neighbour: the group goes first
    assert _commits(client) == before + 2
    assert _values(_receive(c, 1)) == ["4"]  # not "3"
    c.close()


def test_a_backward_wall_clock_step_does_not_hold_a_group() -> None:
    """The group and rate times are wall-clock ms (the consumer's clock): after a write, a
    step back of an hour must not hold the next group for an hour; it is written at its
    group time (the rate cannot tell how long it has been: it lets it go)."""
    now = [1_700_000_000_000]
    g = AckGrouper(AckGrouping(100, 3, 1.0), clock=lambda: now[0], name="c")
    a = _Sink()
    g.add(a, [_item(0)])
    now[0] += 100
    g.flush_due()
    assert len(a.writes) == 1
    now[0] -= 3_600_000  # NTP steps the clock back an hour
    g.add(a, [_item(1)])
    assert g.due_in_ms() == 100
    now[0] += 100
    g.flush_due()
    assert a.writes[1] == [_item(1)]
    g.add(a, [_item(2), _item(3), _item(4)])  # full, the rate's second not over: held
    assert len(a.writes) == 2
    now[0] -= 3_600_000  # back again while a run is pending (started an hour "later")
    assert g.due_in_ms() is not None and g.due_in_ms() <= 0  # type: ignore[operator]
    g.flush_due()
    assert a.writes[2] == [_item(2), _item(3), _item(4)]
    g.close()


_EXIT_SCRIPT = """
import sys
from filepulsar.connector.client import Client, ConsumerType, InitialPosition
client = Client(sys.argv[1])
c = client.subscribe(sys.argv[2], "s", consumer_type=ConsumerType.Shared,
                     initial_position=InitialPosition.Earliest,
                     ack_grouping_time_ms=3_600_000, ack_grouping_max_size=0)
for _ in range(int(sys.argv[3])):
    c.acknowledge(c.receive(30_000))
print("acked", flush=True)
# no close(): a normal exit
"""


@pytest.mark.procs
def test_a_normal_exit_without_close_writes_the_held_acknowledgements(client: Client) -> None:
    """A process that acknowledges and exits normally without close() (its housekeeping
    thread is a daemon) still writes its pending groups, at exit: the next consumer gets
    none of those messages again."""
    import subprocess
    import sys

    _produce(client, 5)
    out = subprocess.run(
        [sys.executable, "-c", _EXIT_SCRIPT, client.store.root, T, "5"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and "acked" in out.stdout, out.stderr
    assert _backlog(client) == 0


def test_seek_writes_the_other_consumers_groups_of_its_subscription_first(
    client: Client,
) -> None:
    """Two consumers of one subscription in a process; only the first acknowledges (held in
    the process's group). The second, which never acknowledged, seeks to the earliest: the
    first's acknowledgements are written before the seek, which then resets them (as
    Pulsar's broker drops its in-memory acknowledgements on a reset), not after it."""
    _produce(client, 4)
    c1 = client.subscribe(T, "s", consumer_type=ConsumerType.Shared, initial_position=E)
    c2 = client.subscribe(T, "s", consumer_type=ConsumerType.Shared, initial_position=E)
    for m in _receive(c1, 2):
        c1.acknowledge(m)
    c2.seek(MessageId.earliest)
    c1.close()  # (nothing of its left to write)
    assert _backlog(client) == 4
    c2.close()
