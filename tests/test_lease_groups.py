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

import pytest

from filepulsar.dispatch.clock import ManualClock
from filepulsar.storage import create_topic
from filepulsar.storage.blobstore import open_blob_store
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.claims import unsynced
from filepulsar.storage.consumer_leases import lease_counts, lease_group
from filepulsar.storage.names import TopicName
from filepulsar.storage.subscription import SubscriptionConsumer
from filepulsar.storage.subscriptions import SubscriptionStore
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
@pytest.mark.parametrize("sub_type", ["Key_Shared", "Shared", "Failover"])
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
                app.send_signal(signal.SIGSTOP)
                stopped = time.monotonic()
                while time.monotonic() - stopped < 2.0:  # the watcher goes on meanwhile
                    producers[k % len(topics)].send(b"x", partition_key=f"k{k % 97}")
                    k += 1
                    try:
                        watcher.acknowledge(watcher.receive(20))
                    except Exception:
                        pass
                app.send_signal(signal.SIGCONT)
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
    """Lazy Key_Shared (issue #27): after a membership change, the first of the process's
    consumers of the partition due to record what it holds records for all of them in one
    commit (each member's own deliveries, pending at it), not one commit per consumer; then
    nobody waits for a record and the newcomer drains as Pulsar's draining says."""
    clock = ManualClock()
    create_topic(blob_store, "subs")
    produce(blob_store, 40, keys=[f"k{i}" for i in range(16)])
    cs = [consumer(blob_store, clock, "Key_Shared", f"c{i}", lazy_claims=True) for i in range(4)]
    held: dict[str, set[object]] = {c.cid: set() for c in cs}
    for _ in range(2):  # the first round records the joins, the second hands out
        for c in cs:
            held[c.cid] |= {d.position for d in c.fetch(100)}
    assert sum(len(h) for h in held.values()) == 40
    assert sum(1 for h in held.values() if h) >= 3
    newcomer = consumer(blob_store, clock, "Key_Shared", "new", lazy_claims=True)
    before = cs[0].state().version
    for c in cs:  # as their housekeeping rounds do, one after the other
        c.renew_if_due()
    s = cs[0].state()
    assert s.version == before + 1  # one record commit, not four
    assert all(i.synced == s.selector_version for i in s.consumers.values())
    recorded: dict[str, set[object]] = {}
    for k, (cid, _count, _slot) in s.pending.items():
        recorded.setdefault(cid, set()).add(k)
    assert recorded == {
        cid: {f"{p.ledger_id}:{p.entry_id}" for p in ps} for cid, ps in held.items() if ps
    }
    assert newcomer.fetch(100) == []  # its slots drain: every entry is held by another
    for c in [*cs, newcomer]:
        c.close()


@pytest.mark.contract
def test_a_busy_consumer_is_not_recorded_for_but_records_itself(blob_store: BlobStore) -> None:
    """A member whose lock another thread holds (its application fetching) is not recorded
    for by another's commit (its holdings could change meanwhile): the others wait for its
    own record, then go on."""
    clock = ManualClock()
    create_topic(blob_store, "subs")
    produce(blob_store, 24, keys=[f"k{i}" for i in range(12)])
    cs = [consumer(blob_store, clock, "Key_Shared", f"c{i}", lazy_claims=True) for i in range(3)]
    for _ in range(2):
        for c in cs:
            c.fetch(100)
    newcomer = consumer(blob_store, clock, "Key_Shared", "new", lazy_claims=True)
    taken, release = threading.Event(), threading.Event()

    def busy() -> None:
        with cs[1]._lock:
            taken.set()
            release.wait(10)

    t = threading.Thread(target=busy)
    t.start()
    taken.wait(10)
    before = cs[0].state().version
    cs[0].renew_if_due()  # records c0 and c2, not the busy c1
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
    assert all(i.synced == s.selector_version for i in s.consumers.values())
    for c in [*cs, newcomer]:
        c.close()
