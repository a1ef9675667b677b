"""Retention, TTL and subscription expiry (storage.retention.enforce_retention)."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from filepulsar.storage import Producer, Reader, create_topic, set_topic_policies
from filepulsar.storage.blobstore import open_blob_store
from filepulsar.storage.blobstore.local import LocalBlobStore
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.errors import DataLossError, TopicNotFound
from filepulsar.storage.ledger import ManagedLedger, Position
from filepulsar.storage.messageid import MessageId
from filepulsar.storage.names import TopicName
from filepulsar.storage.retention import enforce_retention
from filepulsar.storage.subscription import SubscriptionConsumer
from filepulsar.storage.subscriptions import SubscriptionStore

pytestmark = pytest.mark.contract

T0 = 1_700_000_000_000
MIN = 60_000


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


def produce(
    store: BlobStore, topic: str, n: int, clock: Clock, *, size: int = 10, start: int = 0
) -> None:
    """Messages ``start..start+n-1`` (padded to ``size`` bytes), one commit each, so ledgers
    roll over per the policy."""
    with Producer(store, topic, batching_enabled=False, clock=clock) as p:
        for i in range(start, start + n):
            p.send(b"%d" % i + b"." * max(0, size - 3))


def consumer(store: BlobStore, topic: str, sub: str, clock: Clock, **kw: Any) -> Any:
    return SubscriptionConsumer(
        store,
        TopicName.parse(topic),
        sub,
        initial_position="Earliest",
        clock=clock,
        lease_ms=kw.pop("lease_ms", 10 * MIN),
        **kw,
    )


def ack_through(c: Any, n: int) -> None:
    """Acknowledge the first ``n`` entries (one message each)."""
    done = 0
    while done < n:
        ds = c.fetch(min(10, n - done))
        assert ds
        c.acknowledge([(d.position, -1, 1) for d in ds])
        done += len(ds)


def files(root: Path, topic: str, folder: str) -> list[str]:
    d = root / "topics/persistent/public/default" / topic / folder
    return sorted(os.listdir(d)) if d.exists() else []


def test_ledgers_consumed_by_every_subscription_are_deleted_from_disk(tmp_path: Path) -> None:
    root = tmp_path / "root"
    store = open_blob_store(str(root))
    clock = Clock()
    set_topic_policies(store, "r", ledger_max_entries=5)  # retention 0/0 (default)
    create_topic(store, "r")
    a = consumer(store, "r", "a", clock)
    b = consumer(store, "r", "b", clock)
    produce(store, "r", 23, clock)  # ledgers 0..3 closed (5 entries each), 4 open (3)
    ack_through(a, 23)
    ack_through(b, 12)
    before_blobs = files(root, "r", "data")
    assert len(files(root, "r", "ledgers")) >= 4
    report = enforce_retention(store, "r", now=clock.now + 1)
    assert [d.ledger_id for d in report.deleted_ledgers] == [0, 1]  # b is in ledger 2
    assert report.deleted_messages == 10 and report.deleted_files >= 3
    m = ManagedLedger(store, TopicName.parse("r")).state()
    assert m.trimmed_before == 2 and m.trimmed_messages == 10 and m.total_messages == 23
    assert [lg.ledger_id for lg in m.ledgers] == [2, 3, 4]
    assert len(files(root, "r", "data")) < len(before_blobs)
    assert not [f for f in files(root, "r", "ledgers") if f.startswith(("0" * 20, "0" * 19 + "1"))]
    # A reader asking for a deleted ledger is told so; from the start it gets what is left.
    with pytest.raises(DataLossError, match="deleted by retention"):
        ManagedLedger(store, TopicName.parse("r")).read_entries(m, Position(0, 0))
    r = Reader(store, "r", MessageId.earliest)
    assert r.read_batch(100).column("value")[0].as_py().startswith(b"10")
    ack_through(b, 11)
    report = enforce_retention(store, "r", now=clock.now + 1)
    assert [d.ledger_id for d in report.deleted_ledgers] == [2, 3]  # never the open ledger 4
    m = ManagedLedger(store, TopicName.parse("r")).state()
    assert [lg.ledger_id for lg in m.ledgers] == [4] and m.trimmed_messages == 20
    assert enforce_retention(store, "r", now=clock.now + 1).deleted_ledgers == []


def test_retention_on_every_backend(blob_store: BlobStore) -> None:
    clock = Clock()
    set_topic_policies(blob_store, "rb", ledger_max_entries=2)
    create_topic(blob_store, "rb")
    c = consumer(blob_store, "rb", "s", clock)
    produce(blob_store, "rb", 5, clock)
    ack_through(c, 5)
    report = enforce_retention(blob_store, now=clock.now + 1)  # every topic
    assert [d.ledger_id for d in report.deleted_ledgers] == [0, 1]
    assert report.failures == [] and report.managed_ledgers == 1
    t = TopicName.parse("rb")
    assert not [k for k in blob_store.list("topics/persistent/public/default/rb/ledgers")]
    m = ManagedLedger(blob_store, t).state()
    assert len(blob_store.list("topics/persistent/public/default/rb/data")) == len(
        {f.blob for lg in m.ledgers for f in ManagedLedger(blob_store, t).fragments(lg)}
    )


def test_time_and_size_limits(tmp_path: Path) -> None:
    store = open_blob_store(str(tmp_path / "root"))
    clock = Clock()
    set_topic_policies(
        store, "ts", ledger_max_entries=1, retention_time_minutes=60, retention_size_mb=-1
    )
    create_topic(store, "ts")
    produce(store, "ts", 8, clock, size=300 * 1024)  # no subscription: all consumed
    assert enforce_retention(store, "ts", now=clock.now + 59 * MIN).deleted_ledgers == []
    report = enforce_retention(store, "ts", now=clock.now + 61 * MIN)
    assert len(report.deleted_ledgers) == 8  # all closed (one entry each) and old enough

    set_topic_policies(
        store, "sz", ledger_max_entries=1, retention_time_minutes=-1, retention_size_mb=1
    )
    create_topic(store, "sz")
    produce(store, "sz", 8, clock, size=300 * 1024)
    report = enforce_retention(store, "sz", now=clock.now + 10**9)
    # Deleted while the size left after deleting stays >= 1 MB: 8 x 300 KB → 4 deleted.
    assert [d.ledger_id for d in report.deleted_ledgers] == [0, 1, 2, 3]

    set_topic_policies(store, "inf", retention_time_minutes=-1, retention_size_mb=-1)
    set_topic_policies(store, "inf", ledger_max_entries=1)
    create_topic(store, "inf")
    produce(store, "inf", 3, clock)
    assert enforce_retention(store, "inf", now=clock.now + 10**9).deleted_ledgers == []


def test_ttl_acknowledges_expired_messages(tmp_path: Path) -> None:
    store = open_blob_store(str(tmp_path / "root"))
    clock = Clock()
    set_topic_policies(store, "ttl", message_ttl_seconds=60, retention_time_minutes=-1)
    create_topic(store, "ttl")
    c = consumer(store, "ttl", "s", clock, sub_type="Shared")
    produce(store, "ttl", 3, clock)
    clock.now += 30_000
    produce(store, "ttl", 2, clock, start=3)
    report = enforce_retention(store, "ttl", now=T0 + 61_000)  # the first 3 are older than 60 s
    assert [(t.subscription, t.entry_id) for t in report.ttl_acknowledged] == [("s", 2)]
    st = SubscriptionStore(store, TopicName.parse("ttl"), "s").latest()
    assert st.mark_delete == (0, 2) and st.dispatched >= st.mark_delete
    got = [d.entry.raw.messages().column("value")[0].as_py() for d in c.fetch(10)]
    assert [v.rstrip(b".") for v in got] == [b"3", b"4"]  # only the unexpired ones remain
    assert enforce_retention(store, "ttl", now=T0 + 61_000).ttl_acknowledged == []


def test_inactive_subscriptions_expire(tmp_path: Path) -> None:
    store = open_blob_store(str(tmp_path / "root"))
    clock = Clock()
    set_topic_policies(store, "ex", subscription_expiration_minutes=10, ledger_max_entries=2)
    create_topic(store, "ex")
    idle = consumer(store, "ex", "idle", clock)
    idle.close()
    live = consumer(store, "ex", "live", clock, lease_ms=60 * MIN)
    produce(store, "ex", 4, clock)
    ack_through(live, 4)
    report = enforce_retention(store, "ex", now=T0 + 9 * MIN)
    assert report.expired_subscriptions == [] and report.deleted_ledgers == []  # idle holds
    report = enforce_retention(store, "ex", now=T0 + 11 * MIN)
    assert [e.subscription for e in report.expired_subscriptions] == ["idle"]
    assert [d.ledger_id for d in report.deleted_ledgers] == [0, 1]  # nothing holds them now
    assert not SubscriptionStore(store, TopicName.parse("ex"), "idle").exists()
    assert SubscriptionStore(store, TopicName.parse("ex"), "live").exists()


def test_partitioned_topics_and_errors(tmp_path: Path) -> None:
    store = open_blob_store(str(tmp_path / "root"))
    clock = Clock()
    set_topic_policies(store, "pt", ledger_max_entries=1)
    create_topic(store, "pt", partitions=2)
    produce(store, "pt", 6, clock)
    report = enforce_retention(store, "pt", now=clock.now + 1)
    assert report.managed_ledgers == 2 and report.deleted_messages >= 4
    assert {d.topic for d in report.deleted_ledgers} == {
        f"persistent://public/default/pt-partition-{i}" for i in range(2)
    }
    with pytest.raises(TopicNotFound):
        enforce_retention(store, "missing")
    assert "deleted_bytes" in report.to_dict()


def test_sweep_orphans_deletes_only_old_unreferenced_files(tmp_path: Path) -> None:
    """Files a dead writer left (a staged sink blob never committed, a stray index) go once
    they are old enough; committed data, young files and foreign files stay."""
    from filepulsar.storage import paths
    from filepulsar.storage.commit import PendingEntry
    from filepulsar.storage.retention import sweep_orphans
    from filepulsar.storage.staged import stage

    store = open_blob_store(str(tmp_path))
    clock = Clock()
    set_topic_policies(store, "sw", ledger_max_entries=5)  # closed ledgers have index files
    produce(store, "sw", 12, clock)
    t = TopicName.parse("sw")
    ml = ManagedLedger(store, t)
    with Producer(store, "sw-src", batching_enabled=False) as p:
        p.send(b"staged")
    src = ManagedLedger(store, TopicName.parse("sw-src"))
    raw = src.read_entries(src.state(), Position(0, 0))[0].raw
    data = bytes(store.get(paths.data_blob(src.topic, src.state().ledgers[0].fragments[0].blob)))
    entry = PendingEntry(
        parts=[data[raw.offset : raw.offset + raw.size]],
        size=raw.size,
        num_messages=1,
        publish_time=raw.header.publish_time,
        producer_name="sink",
        sequence_id=0,
        highest_sequence_id=0,
    )
    staged = stage(ml, [entry], "q1-b7-t0-a0")  # a Spark task whose batch never committed
    stray_index = paths.ledger_index(t, 999, 1, "deadbeef")  # e.g. a losing writer's
    store.put(stray_index, b"{}")
    foreign = f"{paths.data_dir(t)}/notes.txt"
    store.put(foreign, b"keep me")
    orphan_keys = {paths.data_blob(t, staged.blob), stray_index}

    young = sweep_orphans(store, "sw")  # just written: too young to judge
    assert not young.deleted and young.kept_young == 2
    later = int(os.stat(store.local_path(stray_index) or "").st_mtime * 1000) + 25 * 3600_000
    dry = sweep_orphans(store, "sw", now=later, dry_run=True)
    assert {k for k, _ in dry.deleted} == orphan_keys
    assert all(store.exists(k) for k in orphan_keys)
    done = sweep_orphans(store, "sw", now=later)
    assert {k for k, _ in done.deleted} == orphan_keys and done.deleted_bytes > 0
    assert not any(store.exists(k) for k in orphan_keys) and store.exists(foreign)
    # Every committed message is still readable; the other topic was swept too (nothing to do).
    values = Reader(store, "sw", MessageId.earliest).read_batch(100).column("value")
    assert [v[: v.index(b".")] for v in values.to_pylist()] == [b"%d" % i for i in range(12)]
    assert not sweep_orphans(store, now=later).deleted


def _count_calls(store: BlobStore, methods: tuple[str, ...]) -> list[tuple[str, str]]:
    """Record ``(method, key)`` of every call to ``methods`` on this store instance."""
    calls: list[tuple[str, str]] = []
    for name in methods:
        orig = getattr(store, name)

        def wrapper(key: str, *a: Any, _orig: Any = orig, _name: str = name, **kw: Any) -> Any:
            calls.append((_name, key))
            return _orig(key, *a, **kw)

        setattr(store, name, wrapper)
    return calls


def test_one_run_reads_each_subscription_once_and_lists_ledgers_once(tmp_path: Path) -> None:
    """Expiry, TTL and trimming share one read of each subscription and of the manifest, and
    the ledgers/ folder is listed once however many ledgers are deleted. (Counted as an
    object store serves them: versions as files, not a local disk's journal.)"""
    store = LocalBlobStore(str(tmp_path / "root"), journal=False)
    clock = Clock()
    set_topic_policies(
        store,
        "rd",
        ledger_max_entries=2,
        message_ttl_seconds=60,
        subscription_expiration_minutes=600,
    )
    create_topic(store, "rd")
    a = consumer(store, "rd", "a", clock)
    consumer(store, "rd", "b", clock)
    produce(store, "rd", 7, clock)  # ledgers 0..2 closed, 3 open
    ack_through(a, 2)
    calls = _count_calls(store, ("get", "list", "exists"))
    report = enforce_retention(store, "rd", now=T0 + 61_000)  # TTL expires all 7 entries
    assert sorted(t.subscription for t in report.ttl_acknowledged) == ["a", "b"]
    assert [d.ledger_id for d in report.deleted_ledgers] == [0, 1, 2]
    t = TopicName.parse("rd")
    for sub in ("a", "b"):
        state_dir = SubscriptionStore(store, t, sub).folder
        # One read, plus the TTL commit's check of its base version (the commit protocol).
        assert len([c for c in calls if c[0] == "get" and c[1].startswith(state_dir)]) == 2
    manifest = ManagedLedger(store, t).manifest.folder
    assert len([c for c in calls if c[0] == "get" and c[1].startswith(manifest)]) == 2  # idem
    assert not [c for c in calls if c[0] == "exists" and c[1].startswith(manifest)]
    ledgers = [c for c in calls if c[0] == "list" and c[1].endswith("/ledgers")]
    assert len(ledgers) == 1
    # The TTL-moved cursors are what trimming used: every closed ledger went.
    assert SubscriptionStore(store, t, "b").latest().mark_delete == (3, 0)


def test_ttl_does_not_recreate_a_subscription_deleted_during_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import filepulsar.storage.retention as retention
    from filepulsar.storage.subscriptions import delete_subscription

    store = open_blob_store(str(tmp_path / "root"))
    clock = Clock()
    set_topic_policies(store, "gone", message_ttl_seconds=60, retention_time_minutes=-1)
    create_topic(store, "gone")
    consumer(store, "gone", "keep", clock)
    consumer(store, "gone", "drop", clock)
    produce(store, "gone", 3, clock)
    t = TopicName.parse("gone")
    real = retention._last_expired

    def unsubscribe_then_scan(*args: Any) -> Any:  # runs after the subscriptions are loaded
        delete_subscription(store, t, "drop")
        return real(*args)

    monkeypatch.setattr(retention, "_last_expired", unsubscribe_then_scan)
    report = enforce_retention(store, "gone", now=T0 + 61_000)
    assert [a.subscription for a in report.ttl_acknowledged] == ["keep"]
    assert not SubscriptionStore(store, t, "drop").exists()


def test_sweep_orphans_rejects_a_negative_min_age(tmp_path: Path) -> None:
    from filepulsar.storage.retention import sweep_orphans

    store = open_blob_store(str(tmp_path / "root"))
    create_topic(store, "neg")
    with pytest.raises(ValueError, match=r"min_age_ms must be >= 0.*-5"):
        sweep_orphans(store, "neg", min_age_ms=-5)
    assert sweep_orphans(store, "neg", min_age_ms=0).deleted == []


def test_managed_ledgers_of_a_topic(tmp_path: Path) -> None:
    from filepulsar.storage.topics import delete_topic, managed_ledgers

    store = open_blob_store(str(tmp_path / "root"))
    create_topic(store, "parts", partitions=3)
    create_topic(store, "single")
    parts = TopicName.parse("parts")
    assert managed_ledgers(store, "parts") == [parts.partition(i) for i in range(3)]
    assert managed_ledgers(store, parts.partition(1)) == [parts.partition(1)]
    assert managed_ledgers(store, "single") == [TopicName.parse("single")]
    with pytest.raises(TopicNotFound, match="persistent://public/default/nope does not exist"):
        managed_ledgers(store, "nope")
    with pytest.raises(TopicNotFound, match="does not exist"):
        delete_topic(store, "nope")
    delete_topic(store, "parts")
    with pytest.raises(TopicNotFound):
        managed_ledgers(store, "parts")


# ------------------------------------------------------------------ two runs at once (#31)
class _PausedAtIndex(LocalBlobStore):
    """A real local store that stops once, before its first read of a closed ledger's index
    file, until :attr:`go` is set: the run using it has read the manifest, and the other run
    (on a plain store, in the test's thread) works meanwhile."""

    def __init__(self, directory: str) -> None:
        super().__init__(directory)
        self.paused = threading.Event()
        self.go = threading.Event()

    def get(self, key: str) -> bytes:
        if "/ledgers/" in key and key.endswith(".index") and not self.paused.is_set():
            self.paused.set()
            assert self.go.wait(30)
        return super().get(key)


def _race(root: Path, paused_run: Any, other_run: Any) -> Any:
    """``paused_run(store)`` in a thread, stopped at its first index read while
    ``other_run(store)`` runs whole; its result (or its error, raised here)."""
    slow = _PausedAtIndex(str(root))
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = paused_run(slow)
        except BaseException as e:  # handed to the test's thread
            out["error"] = e

    th = threading.Thread(target=run)
    th.start()
    try:
        assert slow.paused.wait(30), "the paused run never read a ledger index"
        other_run(open_blob_store(str(root)))
    finally:
        slow.go.set()
        th.join(30)
    if "error" in out:
        raise out["error"]
    return out["result"]


def _nine_in_ledgers_of_two(tmp_path: Path) -> tuple[Path, BlobStore]:
    """Topic ``race``: 9 messages in ledgers of 2 (4 closed, the last one open)."""
    root = tmp_path / "root"
    store = open_blob_store(str(root))
    set_topic_policies(store, "race", ledger_max_entries=2)
    create_topic(store, "race")
    produce(store, "race", 9, Clock())
    return root, store


def _closed_ledgers(store: BlobStore, topic: str) -> set[int]:
    m = ManagedLedger(store, TopicName.parse(topic)).state()
    return {lg.ledger_id for lg in m.ledgers if not lg.is_open}


def test_a_ledger_the_other_retention_run_deleted_counts_as_done(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two retention runs read the same manifest; one deletes the ledgers while the other
    is about to read their index files: the second finds them gone, which is done, not a
    warning (was: "ledger 0 ... has no readable index: ... is gone")."""
    root, store = _nine_in_ledgers_of_two(tmp_path)
    closed = _closed_ledgers(store, "race")
    assert len(closed) == 4
    caplog.set_level(logging.WARNING, logger="filepulsar")
    first: list[Any] = []
    second = _race(
        root,
        lambda s: enforce_retention(s, "race", now=T0),
        lambda s: first.append(enforce_retention(s, "race", now=T0)),
    )
    assert {d.ledger_id for d in first[0].deleted_ledgers} == closed
    assert second.deleted_ledgers == [] and second.failures == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert files(root, "race", "ledgers") == []
    assert [int(v[:1]) for v in _read_all(store, "race")] == [8]


def test_an_orphan_sweep_racing_retention_skips_the_ledgers_it_deleted(tmp_path: Path) -> None:
    """A sweep that read the manifest before a retention run deleted ledgers reads their
    index files after: gone, which is done (was: DataLossError 'index of ledger 0 ... is
    gone', the sweep of that topic failed)."""
    from filepulsar.storage.retention import sweep_orphans

    root, store = _nine_in_ledgers_of_two(tmp_path)
    report = _race(
        root,
        lambda s: sweep_orphans(s, "race", min_age_ms=0),
        lambda s: enforce_retention(s, "race", now=T0),
    )
    assert report.failures == []
    assert [int(v[:1]) for v in _read_all(store, "race")] == [8]  # nothing live swept


def test_ttl_racing_retention_goes_on_past_a_ledger_deleted_under_its_scan(
    tmp_path: Path,
) -> None:
    """TTL scans the ledger where expiry stops, entry by entry; another run deletes that
    ledger meanwhile (its subscription acknowledged it): the scan counts the ledger as gone
    and goes on (was: DataLossError 'index of ledger 1 ... is gone')."""
    root = tmp_path / "root"
    store = open_blob_store(str(root))
    clock = Clock()
    set_topic_policies(store, "race", ledger_max_entries=4, message_ttl_seconds=60)
    create_topic(store, "race")
    c = consumer(store, "race", "s", clock, sub_type="Shared")
    for i in range(10):  # one message every 10 s: ledgers 0 (0-3), 1 (4-7), 2 (8-9, open)
        produce(store, "race", 1, clock, start=i)
        clock.now += 10_000
    cutoff_in_ledger_1 = T0 + 60_000 + 55_000  # messages 0-5 expired, 6 not

    def other(s: BlobStore) -> None:
        ack_through(c, 8)  # the subscription consumed ledgers 0 and 1: retention deletes them
        r = enforce_retention(s, "race", now=T0)
        assert {d.ledger_id for d in r.deleted_ledgers} == {0, 1}

    report = _race(root, lambda s: enforce_retention(s, "race", now=cutoff_in_ledger_1), other)
    assert report.failures == []
    st = SubscriptionStore(store, TopicName.parse("race"), "s").latest()
    assert st.mark_delete == (1, 3)
    c.close()


def _read_all(store: BlobStore, topic: str) -> list[bytes]:
    r = Reader(store, topic)
    out: list[bytes] = []
    try:
        while (t := r.read_batch(100)).num_rows:
            out += t.column("value").to_pylist()
    finally:
        r.close()
    return out
