"""Leases of the consumers of one subscription partition in one process renew together
(storage/consumer_leases.py, point 4): one renewal commit for all of them, and none while
their acknowledgements are written (every acknowledgement commit renews them). Counted in
the state's versions (one per commit) on a real store; time is a ManualClock, each one a
machine of its own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from filepulsar.dispatch.clock import ManualClock
from filepulsar.storage import create_topic
from filepulsar.storage.blobstore import open_blob_store
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.claims import unsynced
from filepulsar.storage.consumer_leases import lease_counts, lease_group, watch_for
from filepulsar.storage.errors import ConsumerBusy
from filepulsar.storage.names import TopicName
from filepulsar.storage.subscription import SubscriptionConsumer, renew_due
from filepulsar.storage.subscriptions import SubscriptionStore
from tests.conftest import s3_once
from tests.test_subscription import produce

T = TopicName.parse("subs")
LEASE = 9_000


def consumer(
    store: BlobStore, clock: ManualClock, sub_type: str, name: str, **kw: object
) -> SubscriptionConsumer:
    return SubscriptionConsumer(
        store,
        T,
        "s",
        sub_type=sub_type,
        consumer_name=name,
        lease_ms=LEASE,
        clock=clock,
        initial_position="Earliest",
        renew_together=kw.pop("renew_together", True),  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )


def renewals(c: SubscriptionConsumer) -> dict[str, int]:
    """Each consumer's renewal count in the newest state, by name."""
    return {i.name: i.renewals for i in c.state().consumers.values()}


@pytest.mark.contract
@s3_once("sub_type", ["Key_Shared", "Shared", "Failover"])  # the renewal commit is one for all
def test_the_consumers_of_a_partition_in_a_process_renew_in_one_commit(
    blob_store: BlobStore, sub_type: str
) -> None:
    clock = ManualClock()
    create_topic(blob_store, "subs")
    cs = [consumer(blob_store, clock, sub_type, f"c{i}") for i in range(5)]
    before, counted = cs[0].state().version, renewals(cs[0])
    clock.advance(LEASE // 3 + 1)  # every lease due
    for c in cs:  # as their housekeeping rounds do, one after the other
        c.renew_if_due()
    after = renewals(cs[0])
    assert cs[0].state().version == before + 1  # one commit, not five
    assert all(after[n] == counted[n] + 1 for n in counted)  # every lease extended
    assert not any(c.own_lease.due() for c in cs)
    clock.advance(LEASE - LEASE // 3 - 2)  # a lease since registration: each was renewed
    assert not any(c.lease_lapsed() for c in cs)
    for c in cs:
        c.close()


@pytest.mark.contract
def test_an_acknowledgement_commit_renews_every_consumer_of_the_partition(
    blob_store: BlobStore,
) -> None:
    clock = ManualClock()
    create_topic(blob_store, "subs")
    produce(blob_store, 10, keys=[f"k{i}" for i in range(10)])
    cs = [consumer(blob_store, clock, "Key_Shared", f"c{i}", lazy_claims=True) for i in range(3)]
    got = [d for c in cs for d in c.fetch(10)]
    assert got
    counted = renewals(cs[0])
    clock.advance(LEASE - 1_000)  # due for long, not renewed
    before = cs[0].state().version
    cs[1].acknowledge([(got[0].position, -1, 1)])  # a group of acknowledgements, written
    assert cs[0].state().version == before + 1
    after = renewals(cs[0])
    assert all(after[n] == counted[n] + 1 for n in counted)
    assert not any(c.own_lease.due() for c in cs)  # no renewal commit needed now
    clock.advance(2_000)  # past a lease since registration, within one since the ack
    assert not any(c.lease_lapsed() for c in cs)
    for c in cs:
        c.renew_if_due()
    assert cs[0].state().version == before + 1  # nothing was due
    for c in cs:
        c.close()


@pytest.mark.contract
def test_a_consumer_whose_own_lease_lapsed_is_not_renewed_by_the_others(
    blob_store: BlobStore,
) -> None:
    """Failover's rejoin rule holds: a consumer past its own lease may have lost the active
    role meanwhile, so another's commit does not extend it (here it removes it: the process
    saw it lapse); it registers again."""
    clock = ManualClock()
    create_topic(blob_store, "subs")
    produce(blob_store, 4)
    old = consumer(blob_store, clock, "Failover", "old")
    clock.advance(LEASE // 2)
    young = consumer(blob_store, clock, "Failover", "young")
    clock.advance(LEASE // 2 + 500)  # old's own lease lapsed, young's not
    assert old.lease_lapsed() and not young.lease_lapsed()
    counted = renewals(young)
    young.renew()  # not extended but removed: this process saw old's lease lapse too
    assert renewals(young) == {"young": counted["young"] + 1}
    assert old.lease_lapsed()
    registrations = old.registrations
    old.renew()  # it renews itself: leaves and registers again
    assert old.registrations == registrations + 1 and not old.lease_lapsed()
    old.close()
    young.close()


class _SlowCommits(ManualClock):
    """A ManualClock on which the next commit takes ``during`` ms: its first wall-clock
    read (a commit's change reads it; deciding which leases to extend, and the commit's
    start, read the monotonic clock before) moves time on."""

    during = 0

    def __call__(self) -> int:
        if self.during:
            ms, self.during = self.during, 0
            self.advance(ms)
        return super().__call__()


@pytest.mark.contract
def test_a_member_whose_lease_ran_out_during_anothers_commit_is_not_credited(
    blob_store: BlobStore,
) -> None:
    """Whether a member may be extended is decided before a commit; one whose own lease runs
    out while the commit is in flight (an observer may have judged it lapsed, and taken
    another Failover consumer as the active one) is not credited when it lands: it renews
    itself, leaving and registering again."""
    clock = _SlowCommits()
    create_topic(blob_store, "subs")
    produce(blob_store, 4)
    old = consumer(blob_store, clock, "Failover", "old")
    got = old.fetch(10)
    assert got
    clock.advance(LEASE // 2)
    young = consumer(blob_store, clock, "Failover", "young")
    clock.advance(LEASE // 2 - 100)  # old's lease runs out in 100 ms
    assert not old.lease_lapsed()
    extended = lease_counts()["extended"]
    clock.during = 300  # young's acknowledgement commit lands 300 ms on
    young.acknowledge([(got[0].position, -1, 1)])
    assert old.lease_lapsed() and not young.lease_lapsed()  # young credited, old not
    assert lease_counts()["extended"] == extended + 1
    registrations = old.registrations
    old.renew()  # it renews itself: leaves and registers again
    assert old.registrations == registrations + 1 and not old.lease_lapsed()
    old.close()
    young.close()


@pytest.mark.contract
def test_a_renewal_that_finds_its_consumer_removed_is_not_counted(blob_store: BlobStore) -> None:
    """``renewals`` counts renewal commits: a renewal that finds its consumer removed writes
    nothing (it registers again, counted as such)."""
    clock = ManualClock()
    create_topic(blob_store, "subs")
    old = consumer(blob_store, clock, "Shared", "old")
    clock.advance(LEASE // 2)
    young = consumer(blob_store, clock, "Shared", "young")
    clock.advance(LEASE // 2 + 500)  # old's lease lapsed, young's not
    young.renew()  # removes old
    before = lease_counts()
    old.renew()
    after = lease_counts()
    assert after["renewals"] == before["renewals"]
    assert after["registered_again"] == before["registered_again"] + 1
    old.close()
    young.close()


@pytest.mark.contract
def test_a_late_renewal_says_what_it_measured(
    blob_store: BlobStore, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The log line of a late renewal names what its figure is: the time since the last
    commit that extended the lease started (not since the last renewal)."""
    from filepulsar.storage import subscription

    monkeypatch.setattr(subscription, "_late_logged", [float("-inf")])  # not rate-limited
    clock = ManualClock()
    create_topic(blob_store, "subs")
    c = consumer(blob_store, clock, "Shared", "c")
    clock.advance(LEASE * 3 // 4)
    with caplog.at_level("WARNING", logger="filepulsar.storage.subscription"):
        c.renew_if_due()
    assert "the last commit that extended the lease" in caplog.text
    assert f"{LEASE * 3 // 4} ms" in caplog.text
    c.close()


@pytest.mark.contract
def test_consumers_that_do_not_renew_together_renew_alone(blob_store: BlobStore) -> None:
    """The Spark source's consumers renew as their query runs: not with the others."""
    clock = ManualClock()
    create_topic(blob_store, "subs")
    a = consumer(blob_store, clock, "Shared", "a", renew_together=False)
    b = consumer(blob_store, clock, "Shared", "b", renew_together=False)
    c = consumer(blob_store, clock, "Shared", "c")
    counted = renewals(a)
    clock.advance(LEASE // 3 + 1)
    a.renew_if_due()
    assert renewals(a) == {**counted, "a": counted["a"] + 1}
    c.renew_if_due()
    assert renewals(a) == {**counted, "a": counted["a"] + 1, "c": counted["c"] + 1}
    for x in (a, b, c):
        x.close()


@pytest.mark.contract
def test_consumers_on_other_clocks_are_other_machines(blob_store: BlobStore) -> None:
    """Consumers on different ManualClocks play different machines: no folding between them
    (one may die while the other renews)."""
    one, two = ManualClock(), ManualClock()
    create_topic(blob_store, "subs")
    a = consumer(blob_store, one, "Shared", "a")
    b = consumer(blob_store, two, "Shared", "b")
    counted = renewals(a)
    one.advance(LEASE // 3 + 1)
    a.renew_if_due()
    after = renewals(a)
    assert after["a"] == counted["a"] + 1 and after["b"] == counted["b"]
    a.close()
    b.close()


def _in_child(body: Callable[[], None]) -> int:
    """Run ``body`` in a forked child of this process (killed by SIGALRM after 20 s if it
    hangs); its exit code (0: ``body`` returned)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            signal.alarm(20)
            body()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.mark.procs
def test_a_forked_childs_commits_do_not_renew_its_parents_consumers(tmp_path: Path) -> None:
    """A child forked from a process with consumers (multiprocessing's fork start method)
    does not inherit their lease group: its consumer's renewal extends its own lease only,
    so the parent's consumers, the parent killed, lapse while the child lives."""
    store = open_blob_store(str(tmp_path))
    clock = ManualClock()
    create_topic(store, "subs")
    parent = consumer(store, clock, "Shared", "parent")
    counted = renewals(parent)

    def child() -> None:
        c = consumer(store, clock, "Shared", "child")
        c.renew()

    assert _in_child(child) == 0
    after = renewals(parent)
    assert after["parent"] == counted["parent"]  # extended by nobody
    assert after["child"] > 0
    parent.close()


@pytest.mark.procs
def test_a_child_forked_while_a_renewal_is_in_flight_renews_its_own(tmp_path: Path) -> None:
    """A child forked while a thread of its parent held the group's renewal lock (its
    housekeeping thread in a renewal commit) renews its own consumers: no lock of the
    parent's stays held in it (it hung in ``renew_if_due``)."""
    store = open_blob_store(str(tmp_path))
    clock = ManualClock()
    create_topic(store, "subs")
    parent = consumer(store, clock, "Shared", "parent")
    group = lease_group(parent.lease_group_key)

    def child() -> None:
        c = consumer(store, clock, "Shared", "child")
        renewed = c.own_lease.since_extended_ms()
        clock.advance(LEASE // 3 + 1)  # due
        c.renew_if_due()
        assert c.own_lease.since_extended_ms() < renewed + LEASE // 3 + 1

    with group.renewing:  # as the housekeeping thread during a renewal commit
        code = _in_child(child)
    assert code == 0  # (hung: -SIGALRM)
    parent.close()


_APP = textwrap.dedent(
    """
    import json, sys, threading, time
    from filepulsar import Client, ConsumerType, InitialPosition
    from filepulsar.storage.consumer_leases import lease_counts, lease_group
    root, topics = sys.argv[1], sys.argv[2].split(",")
    lease_ms, seconds = int(sys.argv[3]), float(sys.argv[4])
    client = Client(root)
    consumers = [
        client.subscribe(topics, "app", consumer_type=ConsumerType.KeyShared,
                         consumer_name=f"c{i}", initial_position=InitialPosition.Earliest,
                         consumer_lease_ms=lease_ms)
        for i in range(int(sys.argv[5]))
    ]
    print("ready", flush=True)
    got = [0]
    stop = threading.Event()
    def consume(c):
        while not stop.is_set():
            try:
                m = c.receive(100)
            except Exception:
                continue
            c.acknowledge(m)
            got[0] += 1
    threads = [threading.Thread(target=consume, args=(c,)) for c in consumers]
    for t in threads:
        t.start()
    time.sleep(seconds)  # the parent stops and continues this process meanwhile
    stop.set()
    while any(t.is_alive() for t in threads):
        threads[0].join(0.1)
        threads = [t for t in threads if t.is_alive()]
    client.close()  # and its consumers
    print(json.dumps({"got": got[0], **lease_counts()}), flush=True)
    """
)


@pytest.mark.procs
@pytest.mark.slow
def test_a_process_stopped_for_less_than_its_lease_keeps_its_membership(tmp_path: Path) -> None:
    """A real process with 8 Key_Shared consumers over 6 topics (lease 6 s), once settled
    stopped with SIGSTOP for 2 s (a third of the lease) three times, 3 s apart, while a
    process beside it consumes the same subscription: nobody's lease lapses, membership
    never changes (the selector's version stays), no consumer registers again. (Stopped
    more often than it runs, its commits in flight hold up every commit of the folder's
    journal, its own too: a different matter.)"""
    from filepulsar import Client, ConsumerType, InitialPosition

    root = str(tmp_path / "store")
    topics = [f"stop-{i}" for i in range(6)]
    lease_ms = 6_000
    store = open_blob_store(root)

    def selector_versions() -> dict[str, int]:
        return {
            t: SubscriptionStore(store, TopicName.parse(t), "app").latest().selector_version
            for t in topics
        }

    with Client(root) as client:
        for t in topics:
            client.create_producer(t, batching_enabled=False).close()
        watcher = client.subscribe(  # a consumer beside it: it would remove a lapsed one
            topics,
            "app",
            consumer_type=ConsumerType.KeyShared,
            consumer_name="watcher",
            initial_position=InitialPosition.Earliest,
            consumer_lease_ms=lease_ms,
        )
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        app = subprocess.Popen(
            [sys.executable, "-c", _APP, root, ",".join(topics), str(lease_ms), "20", "8"],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            assert app.stdout is not None
            assert app.stdout.readline().strip() == "ready"
            before = lease_counts()
            versions = selector_versions()
            producers = [client.create_producer(t, batching_enabled=False) for t in topics]
            k, settled = 0, time.monotonic() + 3  # it records its first membership first
            while time.monotonic() < settled:
                producers[k % len(topics)].send(b"x", partition_key=f"k{k % 97}")
                k += 1
            for _ in range(3):
                # Continued by a timer: this thread's sends and receives may wait meanwhile
                # for a record the stopped process has in flight (the stop must not last as
                # long as such a wait).
                resume = threading.Timer(2.0, app.send_signal, (signal.SIGCONT,))
                app.send_signal(signal.SIGSTOP)
                stopped = time.monotonic()
                resume.start()
                while time.monotonic() - stopped < 2.0:  # the watcher goes on meanwhile
                    producers[k % len(topics)].send(b"x", partition_key=f"k{k % 97}")
                    k += 1
                    try:
                        watcher.acknowledge(watcher.receive(20))
                    except Exception:
                        pass
                resume.join()
                time.sleep(3.0)  # it runs a while before the next stop
            out = json.loads(app.communicate(timeout=60)[0].strip().splitlines()[-1])
        finally:
            if app.poll() is None:
                app.send_signal(signal.SIGCONT)
                app.kill()
        after = selector_versions()
        counts = lease_counts()
        watcher.close()
    assert out["registered_again"] == 0 and out["lapsed"] == 0, out
    assert counts["removed"] - before["removed"] == 0
    assert counts["registered_again"] - before["registered_again"] == 0
    # The app's consumers closed at its end: those are the only changes after our reading.
    assert all(after[t] - versions[t] == 8 for t in versions), (versions, after)


@pytest.mark.contract
def test_a_join_makes_one_record_commit_for_the_processs_consumers_of_the_partition(
    blob_store: BlobStore,
) -> None:
    """Lazy Key_Shared (issue #27): after a membership change made elsewhere (a consumer of
    another process: another clock), the first of the process's consumers of the partition
    due to record what it holds records for all of them in one commit (each member's own
    deliveries, pending at it), not one commit per consumer; then nobody waits for a record
    and the newcomer drains as Pulsar's draining says."""
    clock = ManualClock()
    create_topic(blob_store, "subs")
    produce(blob_store, 40, keys=[f"k{i}" for i in range(16)])
    cs = [consumer(blob_store, clock, "Key_Shared", f"c{i}", lazy_claims=True) for i in range(4)]
    held: dict[str, set[object]] = {c.cid: set() for c in cs}
    for c in cs:  # (each join recorded the others: nobody waits)
        held[c.cid] |= {d.position for d in c.fetch(100)}
    assert sum(len(h) for h in held.values()) == 40
    assert sum(1 for h in held.values() if h) >= 3
    newcomer = consumer(blob_store, ManualClock(), "Key_Shared", "new", lazy_claims=True)
    before = cs[0].state().version
    for c in cs:  # as their housekeeping rounds do, one after the other
        c.renew_if_due()
    s = cs[0].state()
    assert s.version == before + 1  # one record commit, not four
    assert all(i.synced == s.selector_version for i in s.consumers.values())
    _assert_pending_is_held(s, held)
    assert newcomer.fetch(100) == []  # its slots drain: every entry is held by another
    for c in [*cs, newcomer]:
        c.close()


def _fetching(blob_store: BlobStore, clock: ManualClock) -> list[SubscriptionConsumer]:
    """Three lazy Key_Shared consumers of this process holding what one fetch gave each (24
    entries of 12 keys)."""
    create_topic(blob_store, "subs")
    produce(blob_store, 24, keys=[f"k{i}" for i in range(12)])
    cs = [consumer(blob_store, clock, "Key_Shared", f"c{i}", lazy_claims=True) for i in range(3)]
    for c in cs:
        c.fetch(100)
    return cs


def _hold(c: SubscriptionConsumer, seconds: float) -> tuple[threading.Thread, threading.Event]:
    """Another thread holds ``c`` (its application fetching) until the event is set or
    ``seconds`` passed."""
    taken, release = threading.Event(), threading.Event()

    def busy() -> None:
        with c._lock:
            taken.set()
            release.wait(seconds)

    t = threading.Thread(target=busy)
    t.start()
    taken.wait(10)
    return t, release


def _no_failure(sc: SubscriptionConsumer, e: Exception) -> None:
    raise AssertionError(f"{sc.consumer_name}: {e}")


@pytest.mark.contract
@pytest.mark.parametrize("joins", ["elsewhere", "here"])
def test_a_busy_consumer_is_not_recorded_for_but_records_itself(
    blob_store: BlobStore, joins: str
) -> None:
    """A member whose lock another thread holds (its application fetching) is not recorded
    for by another's commit (its holdings could change meanwhile), be it a record commit
    after a join elsewhere (another process: another clock) or the registration of a
    consumer of its own process: the others wait for its own record, then go on."""
    clock = ManualClock()
    cs = _fetching(blob_store, clock)
    t, release = _hold(cs[1], 10)
    before = cs[0].state().version
    newcomer = consumer(
        blob_store,
        clock if joins == "here" else ManualClock(),
        "Key_Shared",
        "new",
        lazy_claims=True,
    )
    if joins == "elsewhere":
        cs[0].renew_if_due()  # records c0 and c2, not the busy c1
        before += 1
    s = cs[0].state()
    assert s.version == before + 1
    synced = {i.name for i in s.consumers.values() if i.synced == s.selector_version}
    assert synced == {"c0", "c2", "new"}
    assert unsynced(s)  # nobody hands out anything new: all wait for c1's record
    release.set()
    t.join()
    cs[1].renew_if_due()
    s = cs[0].state()
    assert s.version == before + 2
    assert not unsynced(s)
    for c in [*cs, newcomer]:
        c.close()


@pytest.mark.contract
def test_a_join_records_the_processs_consumers_of_the_partition_in_its_own_commit(
    blob_store: BlobStore,
) -> None:
    """Lazy Key_Shared (issue #27): a consumer joining moves the membership on, and in its
    registration commit the process's other consumers of the partition record what they hold
    for it (each member's own deliveries, pending at it): no record commit after it (nobody
    may hand out anything until every consumer has recorded), and the newcomer drains as
    Pulsar's draining says."""
    clock = ManualClock()
    create_topic(blob_store, "subs")
    produce(blob_store, 40, keys=[f"k{i}" for i in range(16)])
    cs: list[SubscriptionConsumer] = []
    for i in range(4):
        before = cs[0].state().version if cs else 0
        cs.append(consumer(blob_store, clock, "Key_Shared", f"c{i}", lazy_claims=True))
        s = cs[0].state()
        assert s.version == before + 1  # the registration alone, the others recorded in it
        assert not unsynced(s)
    held: dict[str, set[object]] = {c.cid: {d.position for d in c.fetch(100)} for c in cs}
    assert sum(len(h) for h in held.values()) == 40  # nobody waited for a record
    assert sum(1 for h in held.values() if h) >= 3
    before = cs[0].state().version
    counted = renewals(cs[0])
    newcomer = consumer(blob_store, clock, "Key_Shared", "new", lazy_claims=True)
    s = cs[0].state()
    assert s.version == before + 1
    assert all(i.synced == s.selector_version for i in s.consumers.values())
    _assert_pending_is_held(s, held)
    after = renewals(cs[0])  # the commit extended the leases of those it recorded for
    assert all(after[c.consumer_name] == counted[c.consumer_name] + 1 for c in cs)
    for c in cs:
        c.renew_if_due()
    assert cs[0].state().version == before + 1  # nothing left to record
    assert newcomer.fetch(100) == []  # its slots drain: every entry is held by another
    for c in [*cs, newcomer]:
        c.close()


@pytest.mark.contract
def test_a_leave_records_the_processs_consumers_of_the_partition_in_its_own_commit(
    blob_store: BlobStore,
) -> None:
    """Lazy Key_Shared (issue #27): a consumer leaving moves the membership on; the others of
    the process record what they hold in its leaving commit, and what it held goes to them
    (its redelivery count + 1), handed out at once."""
    clock = ManualClock()
    create_topic(blob_store, "subs")
    produce(blob_store, 30, keys=[f"k{i}" for i in range(12)])
    cs = [consumer(blob_store, clock, "Key_Shared", f"c{i}", lazy_claims=True) for i in range(3)]
    held = {c.cid: {d.position for d in c.fetch(100)} for c in cs}
    assert sum(len(h) for h in held.values()) == 30
    leaving = next(c for c in cs if held[c.cid])
    stay = [c for c in cs if c is not leaving]
    before = stay[0].state().version
    leaving.close()
    s = stay[0].state()
    assert s.version == before + 1  # the leave alone, the others recorded in it
    assert not unsynced(s)
    again = [d for c in stay for d in c.fetch(100)]
    assert {d.position for d in again} == held[leaving.cid]
    assert all(d.redelivery_count == 1 for d in again)
    for c in stay:
        c.close()


@pytest.mark.contract
def test_housekeeping_renews_a_partitions_group_in_one_commit_past_a_busy_member(
    blob_store: BlobStore,
) -> None:
    """A housekeeping pass (issue #27) does not wait for a member another thread holds while
    another member's renewal can extend its lease: one commit renews them all, busy one
    included, and the pass is not held up meanwhile."""
    clock = ManualClock()
    create_topic(blob_store, "subs")
    cs = [consumer(blob_store, clock, "Key_Shared", f"c{i}", lazy_claims=True) for i in range(4)]
    before, counted = cs[0].state().version, renewals(cs[0])
    clock.advance(LEASE // 3 + 1)  # every lease due, none half gone
    t, release = _hold(cs[0], 30)
    started = time.monotonic()
    renew_due(cs, failed=_no_failure)
    took = time.monotonic() - started
    release.set()
    t.join()
    assert took < 10  # (held for 30 s)
    after = renewals(cs[0])
    assert cs[0].state().version == before + 1
    assert all(after[n] == counted[n] + 1 for n in counted)  # the busy one's too
    assert not any(c.own_lease.due() for c in cs)
    for c in cs:
        c.close()


@pytest.mark.contract
def test_housekeeping_waits_for_a_busy_consumer_past_half_its_lease(
    blob_store: BlobStore,
) -> None:
    """Past half its lease, a busy consumer that nobody else renews is waited for: its
    renewal is never put off until it lapses."""
    clock = ManualClock()
    create_topic(blob_store, "subs")
    c = consumer(blob_store, clock, "Shared", "alone")
    counted = renewals(c)
    clock.advance(LEASE // 2 + 1)
    t, _ = _hold(c, 0.3)  # (released by itself)
    renew_due([c], failed=_no_failure)
    t.join()
    assert renewals(c)["alone"] == counted["alone"] + 1
    assert not c.own_lease.due()
    c.close()


@pytest.mark.contract
def test_housekeeping_records_a_partitions_group_once_after_a_join_elsewhere(
    blob_store: BlobStore,
) -> None:
    """After a consumer of another process joined, one housekeeping pass makes one record
    commit for the process's consumers of the partition (one look at the state for all)."""
    clock = ManualClock()
    cs = _fetching(blob_store, clock)
    newcomer = consumer(blob_store, ManualClock(), "Key_Shared", "new", lazy_claims=True)
    before = cs[0].state().version
    renew_due(cs, failed=_no_failure)
    s = cs[0].state()
    assert s.version == before + 1
    assert not unsynced(s)
    renew_due(cs, failed=_no_failure)
    assert cs[0].state().version == before + 1  # nothing due
    for c in [*cs, newcomer]:
        c.close()


@pytest.mark.contract
def test_housekeeping_records_at_the_state_last_read_without_a_look_of_its_own(
    blob_store: BlobStore,
) -> None:
    """The push dispatcher's pass (``look=False``) goes by each partition's state as the
    process last read it: after a join elsewhere that the process has read, one record commit
    for the partition's consumers; before it read the join, none (its dispatcher's look at
    the commit comes first)."""
    clock = ManualClock()
    cs = _fetching(blob_store, clock)
    newcomer = consumer(blob_store, ManualClock(), "Key_Shared", "new", lazy_claims=True)
    store = cs[0]._store
    before = store.latest(refresh=False).version
    renew_due(cs, failed=_no_failure, look=False)
    assert store.latest(refresh=False).version == before  # the join not read here yet
    s = cs[0].state()  # (the dispatcher's look)
    assert s.version == before + 1 and unsynced(s)
    renew_due(cs, failed=_no_failure, look=False)
    s = cs[0].state()
    assert s.version == before + 2
    assert not unsynced(s)
    renew_due(cs, failed=_no_failure, look=False)
    assert cs[0].state().version == before + 2  # nothing due
    for c in [*cs, newcomer]:
        c.close()


class _Held:
    """A request of a group's registrations that holds them (its commit waits) until let go:
    the registrations that come meanwhile wait, and are committed together next."""

    def __init__(self) -> None:
        self.done = False
        self.running, self.release = threading.Event(), threading.Event()

    def commit(self, batch: list[object]) -> None:
        self.running.set()
        self.release.wait(30)
        self.done = True


def _registering_at_once(
    blob_store: BlobStore, clock: ManualClock, kinds: list[str]
) -> tuple[list[SubscriptionConsumer | BaseException], int]:
    """Consumers of these types registering on the partition at once (each on a thread of
    its own, while the group's registrations are held); each consumer or its error, and the
    commits they made."""
    held = _Held()
    group = lease_group((blob_store.root, str(T), "s", id(watch_for(clock))))
    holder = threading.Thread(target=group.joins.run, args=(held, held.commit))
    holder.start()
    held.running.wait(10)
    before = SubscriptionStore(blob_store, T, "s").latest().version
    out: list[SubscriptionConsumer | BaseException | None] = [None] * len(kinds)

    def register(i: int) -> None:
        try:
            out[i] = consumer(blob_store, clock, kinds[i], f"j{i}", lazy_claims=True)
        except BaseException as e:
            out[i] = e

    threads = [threading.Thread(target=register, args=(i,)) for i in range(len(kinds))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while group.joins.waiting() < len(kinds) and time.monotonic() < deadline:
        time.sleep(0.01)  # every one waits behind the held commit
    held.release.set()
    for t in [holder, *threads]:
        t.join(30)
    after = SubscriptionStore(blob_store, T, "s").latest().version
    return [o for o in out if o is not None], after - before


@pytest.mark.contract
def test_registrations_of_a_process_made_at_once_are_one_commit(blob_store: BlobStore) -> None:
    """Consumers of a process subscribing to a partition at once (issue #27) register in one
    commit, each as if alone: distinct registrations, every one in the selector and synced
    with the membership it ends in, the process's earlier consumer recorded in it too."""
    clock = ManualClock()
    create_topic(blob_store, "subs")
    produce(blob_store, 24, keys=[f"k{i}" for i in range(12)])
    first = consumer(blob_store, clock, "Key_Shared", "first", lazy_claims=True)
    got, commits = _registering_at_once(blob_store, clock, ["Key_Shared"] * 6)
    assert commits == 1
    cs = [c for c in got if isinstance(c, SubscriptionConsumer)]
    assert len(cs) == 6
    s = first.state()
    assert {i.name for i in s.consumers.values()} == {"first"} | {f"j{i}" for i in range(6)}
    assert len({c.joined for c in [first, *cs]}) == 7
    assert all(c.holds(s) for c in [first, *cs])
    assert not unsynced(s)
    assert sum(len(c.fetch(100)) for c in [first, *cs]) == 24  # nobody waits for a record
    for c in [first, *cs]:
        c.close()


@pytest.mark.contract
def test_a_refused_registration_among_others_at_once_changes_nothing(
    blob_store: BlobStore,
) -> None:
    """In a commit of registrations made at once, one the subscription refuses (a Shared
    consumer on a Key_Shared subscription with consumers) gets its error, as alone, and the
    others register."""
    clock = ManualClock()
    create_topic(blob_store, "subs")
    first = consumer(blob_store, clock, "Key_Shared", "first", lazy_claims=True)
    got, commits = _registering_at_once(blob_store, clock, ["Key_Shared", "Shared", "Key_Shared"])
    assert commits == 1
    errors = [e for e in got if isinstance(e, BaseException)]
    assert len(errors) == 1 and isinstance(errors[0], ConsumerBusy)
    assert "is of type Key_Shared and has consumers" in str(errors[0])
    s = first.state()
    assert s.sub_type.wire == "Key_Shared"
    assert {i.name for i in s.consumers.values()} == {"first", "j0", "j2"}
    for c in [first, *[c for c in got if isinstance(c, SubscriptionConsumer)]]:
        c.close()


def _assert_pending_is_held(s: Any, held: dict[str, set[Any]]) -> None:
    """The state's ``pending`` records at each consumer exactly the entries it holds."""
    recorded: dict[str, set[object]] = {}
    for k, (cid, _count, _slot) in s.pending.items():
        recorded.setdefault(cid, set()).add(k)
    assert recorded == {
        cid: {f"{p.ledger_id}:{p.entry_id}" for p in ps} for cid, ps in held.items() if ps
    }
