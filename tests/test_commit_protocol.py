"""The commit protocol of versioned states under staleness, garbage collection and lost replies.

Deterministic reproductions (issue #10, defects 1 and 2) through the real producer, subscription
and rollover paths, then a systematic exploration of interleavings: a fault-injecting blob store
(:class:`HookedStore`) makes every store call of every actor a scheduling point, and Hypothesis
picks which actor runs next, when an extra garbage collection runs, and which conditional puts
report "lost" although they succeeded (as S3 may for a retried conditional PUT). The outcome is
checked against a model of the log. ``FILEPULSAR_LONG=1`` explores many more schedules.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from filepulsar.storage import Producer, TopicName, create_topic, set_topic_policies
from filepulsar.storage.blobstore import open_blob_store
from filepulsar.storage.blobstore.local import Appender, LocalBlobStore
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.errors import CommitConflict, CommitOutcomeUnknown, CorruptDataError
from filepulsar.storage.ledger import ManagedLedger, Position
from filepulsar.storage.subscription import SubscriptionConsumer
from filepulsar.storage.subscriptions import SubscriptionStore
from filepulsar.storage.versioned import GC_EVERY, KEEP_VERSIONS, VersionedStore, blob, store

pytestmark = pytest.mark.property

LONG = os.environ.get("FILEPULSAR_LONG") == "1"


def _files_store(root: str | Path) -> BlobStore:
    """A local folder keeping versions as one file each: the put-if-absent protocol that
    object stores use, explored here on a local disk (by default a local disk keeps them
    as journals, FORMAT.md "Journal", which these hooks do not see)."""
    return LocalBlobStore(str(root), journal=False)


# --------------------------------------------------------------------------- a hooked store
class HookedStore(BlobStore):
    """Delegates to ``inner``; calls ``before(op, key)`` ahead of every store call.

    ``lose(key)`` is asked after a conditional put that succeeded: if it returns True the
    put reports ``False`` ("lost the race") although it created the blob, as S3 may for a
    conditional PUT it retried after losing the first reply.
    """

    def __init__(
        self,
        inner: BlobStore,
        before: Callable[[str, str], None] = lambda op, key: None,
        lose: Callable[[str], bool] = lambda key: False,
    ) -> None:
        self.inner = inner
        self.root = inner.root
        self.supports_append = inner.supports_append
        self.before = before
        self.lose = lose

    def put(self, key: str, data: bytes | memoryview) -> None:
        self.before("put", key)
        self.inner.put(key, data)

    def put_if_absent(self, key: str, data: bytes | memoryview) -> bool:
        self.before("put_if_absent", key)
        won = self.inner.put_if_absent(key, data)
        return won and not self.lose(key)

    def get(self, key: str) -> bytes:
        self.before("get", key)
        return self.inner.get(key)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        self.before("get_range", key)
        return self.inner.get_range(key, start, end)

    def exists(self, key: str) -> bool:
        self.before("exists", key)
        return self.inner.exists(key)

    def size(self, key: str) -> int:
        self.before("size", key)
        return self.inner.size(key)

    def mtime_ms(self, key: str) -> int:
        self.before("mtime_ms", key)
        return self.inner.mtime_ms(key)

    def list(self, prefix: str) -> list[str]:
        self.before("list", prefix)
        return self.inner.list(prefix)

    def list_dirs(self, prefix: str) -> list[str]:
        self.before("list_dirs", prefix)
        return self.inner.list_dirs(prefix)

    def delete(self, key: str) -> None:
        self.before("delete", key)
        self.inner.delete(key)

    def delete_prefix(self, prefix: str) -> None:
        self.before("delete_prefix", prefix)
        self.inner.delete_prefix(prefix)

    def open_append(self, key: str) -> Appender:
        self.before("open_append", key)
        return self.inner.open_append(key)

    def local_path(self, key: str) -> str | None:
        return self.inner.local_path(key)


def _is_manifest_put(op: str, key: str) -> bool:
    return op == "put_if_absent" and "/manifest/" in key


class Gate:
    """Stops the thread that makes the first manifest put while armed, until released."""

    def __init__(self) -> None:
        self.armed = False
        self.reached = threading.Event()
        self.go = threading.Event()

    def before(self, op: str, key: str) -> None:
        if self.armed and _is_manifest_put(op, key):
            self.armed = False
            self.reached.set()
            assert self.go.wait(30), "gate never released"


def _values_at(store: BlobStore, topic: str, positions: list[Position]) -> list[bytes]:
    ml = ManagedLedger(store, TopicName.parse(topic))
    state = ml.state()
    out = []
    for p in positions:
        (e,) = ml.read_entries(state, p, end=p)
        out.append(e.raw.messages().column("value").to_pylist()[0])
    return out


def _all_values(store: BlobStore, topic: str) -> list[bytes]:
    ml = ManagedLedger(store, TopicName.parse(topic))
    state = ml.state()
    out: list[bytes] = []
    for e in ml.read_entries(state, Position(-1, -1)):
        out.extend(e.raw.messages().column("value").to_pylist())
    return out


# --------------------------------------------------------------------------- defect 1
STALE_BY = KEEP_VERSIONS + GC_EVERY + 8  # commits that let real GC free the stale slot


@pytest.fixture
def no_gc_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    """GC deletes versions as soon as they are below the kept ones, however young (as if
    every writer had been paused for longer than the grace): freed slots happen at once."""
    monkeypatch.setattr(store, "GC_GRACE_MS", 0)


@pytest.mark.usefixtures("no_gc_grace")
def test_idle_producer_send_after_gc_is_not_lost(tmp_path: Path) -> None:
    """A producer idle while another sends more than the kept versions: its send is kept
    under the id it was acknowledged with (it used to land on a garbage-collected slot)."""
    store = _files_store(tmp_path / "root")
    create_topic(store, "t")
    idle = Producer(store, "t", producer_name="idle", batching_enabled=False)
    busy = Producer(store, "t", producer_name="busy", batching_enabled=False)
    try:
        first = idle.send(b"idle-0")
        busy_ids = [busy.send(b"busy-%d" % i) for i in range(STALE_BY)]
        late = idle.send(b"idle-1")
    finally:
        idle.close()
        busy.close()
    ids = [first, *busy_ids, late]
    positions = [Position(m.ledger_id, m.entry_id) for m in ids]
    assert len(set(positions)) == len(positions), "two acknowledged sends share an id"
    want = [b"idle-0", *[b"busy-%d" % i for i in range(STALE_BY)], b"idle-1"]
    assert _values_at(store, "t", positions) == want
    assert sorted(_all_values(store, "t")) == sorted(want)


@pytest.mark.usefixtures("no_gc_grace")
def test_ack_by_idle_consumer_after_gc_is_not_lost(tmp_path: Path) -> None:
    """A consumer that received a message, sat idle while another consumer on the same
    subscription committed more than the kept versions, then acknowledged it: the
    acknowledgement holds (it used to be lost, and the message was handed out again)."""
    store = _files_store(tmp_path / "root")
    create_topic(store, "t")
    with Producer(store, "t", batching_enabled=False) as p:
        for i in range(STALE_BY + 1):
            p.send(b"%d" % i)
    topic = TopicName.parse("t")
    slow = SubscriptionConsumer(
        store, topic, "s", sub_type="Shared", initial_position="Earliest", lease_ms=600_000
    )
    fast = SubscriptionConsumer(
        store, topic, "s", sub_type="Shared", initial_position="Earliest", lease_ms=600_000
    )
    (held,) = slow.fetch(1)
    got = []
    while ds := fast.fetch(1):  # one commit to fetch, one to acknowledge, per message
        got.extend(ds)
        fast.acknowledge([(d.position, -1, 1) for d in ds])
    assert len(got) == STALE_BY
    slow.acknowledge([(held.position, -1, 1)])
    slow.close()  # a consumer leaving hands its unacknowledged messages to the others
    assert fast.fetch(10) == [], "an acknowledged message was delivered again"
    newest = SubscriptionStore(store, topic, "s").latest()
    assert newest.is_acked((held.position.ledger_id, held.position.entry_id))
    fast.close()


# --------------------------------------------------------------------------- defect 2
def test_racing_rollovers_keep_the_winners_index(tmp_path: Path) -> None:
    """Two producers close the same ledger at once; the loser writes its index file after the
    winner's but before the winner commits. The committed index is the winner's."""
    base = _files_store(tmp_path / "root")
    create_topic(base, "t")
    set_topic_policies(base, "t", ledger_max_entries=2)
    with Producer(base, "t", batching_enabled=False) as p:
        p.send(b"first")
    gates = {"a": Gate(), "b": Gate()}
    producers = {
        n: Producer(
            HookedStore(base, gates[n].before), "t", producer_name=n, batching_enabled=False
        )
        for n in gates
    }
    for p in producers.values():
        p._parts[0].ml.state()  # both writers start from the newest version: they race for v+1
    acked: dict[str, Any] = {}

    def send(name: str) -> None:
        acked[name] = producers[name].send(name.encode())

    threads = {n: threading.Thread(target=send, args=(n,)) for n in gates}
    try:
        for n in ("a", "b"):  # a writes its index, then b (over a's, before the fix)
            gates[n].armed = True
            threads[n].start()
            assert gates[n].reached.wait(30)
        gates["a"].go.set()  # a commits first and wins; b loses and retries
        threads["a"].join(30)
        gates["b"].go.set()
        threads["b"].join(30)
    finally:
        for g in gates.values():
            g.go.set()
        for p in producers.values():
            p.close()
    assert set(acked) == {"a", "b"}
    positions = [Position(acked[n].ledger_id, acked[n].entry_id) for n in ("a", "b")]
    assert _values_at(base, "t", positions) == [b"a", b"b"]
    assert sorted(_all_values(base, "t")) == [b"a", b"b", b"first"]


def test_corrupt_ledger_index_names_its_path(tmp_path: Path) -> None:
    """A damaged closed-ledger index is reported as CorruptDataError naming the file."""
    store = _files_store(tmp_path / "root")
    create_topic(store, "t")
    set_topic_policies(store, "t", ledger_max_entries=1)
    with Producer(store, "t", batching_enabled=False) as p:
        p.send(b"x")
    ml = ManagedLedger(store, TopicName.parse("t"))
    (lg,) = [lg for lg in ml.state().ledgers if not lg.is_open]
    assert lg.index is not None
    key = f"topics/persistent/public/default/t/{lg.index}"
    raw = store.get(key)
    tampered = raw.replace(b'"ledger":0', b'"ledger": 0')  # still valid JSON
    assert tampered != raw
    for damaged in (
        raw[: len(raw) // 2],
        raw.replace(b'"fragments"', b'"fragmentz"'),
        b"",
        tampered,
    ):
        store.put(key, damaged)
        with pytest.raises(CorruptDataError, match=lg.index):
            ManagedLedger(store, TopicName.parse("t")).fragments(lg)


# --------------------------------------------------------------------------- the model
@dataclass
class Log:
    """The test's versioned state: a list of tokens, one appended per commit."""

    items: list[str] = field(default_factory=list)
    version: int = 0
    updated_ms: int = 0
    commit_id: str = ""
    prev_commit_id: str = ""

    def encode(self) -> bytes:
        body = json.dumps(
            {
                "items": self.items,
                "version": self.version,
                "updated": self.updated_ms,
                "commitId": self.commit_id,
                "prevCommitId": self.prev_commit_id,
            },
            separators=(",", ":"),
        ).encode()
        return body + b"\ncrc32c=%08x\n" % crc32c.crc32c(body)

    @classmethod
    def decode(cls, raw: bytes, where: str) -> Log:
        body, _, tail = raw.rstrip(b"\n").rpartition(b"\ncrc32c=")
        if crc32c.crc32c(body) != int(tail, 16):
            raise CorruptDataError(f"log {where} fails its checksum")
        d = json.loads(body)
        return cls(d["items"], d["version"], d["updated"], d["commitId"], d["prevCommitId"])


class Deadlock(AssertionError):
    pass


class Stopped(BaseException):
    """Raised in an actor when the schedule is abandoned."""


class Scheduler:
    """Runs actors in threads, one store call at a time, in an order chosen by ``choose``.

    Every store call of an actor is a scheduling point: the actor stops before it until the
    scheduler picks it. Only one actor runs at a time, so a schedule is deterministic.
    """

    def __init__(
        self, choose: Callable[[list[str]], str], lose: Callable[[], bool] = lambda: False
    ) -> None:
        self.choose = choose
        self.lose = lose  # asked (in the scheduling thread) when a conditional put is picked
        self.cond = threading.Condition()
        self.state: dict[str, str] = {}  # actor -> running | waiting | done
        self.pending: dict[str, str] = {}  # actor -> the store call it waits to make
        self.lose_reply: dict[str, bool] = {}
        self.turn: str | None = None
        self.stopped = False
        self.errors: list[BaseException] = []

    def lost(self, key: str) -> bool:
        """Whether the current actor's successful conditional put is to report "lost"."""
        return self.lose_reply.pop(threading.current_thread().name, False)

    def point(self, op: str = "start", key: str = "") -> None:
        me = threading.current_thread().name
        if me not in self.state:
            return  # the main thread (setup, final checks) runs freely
        with self.cond:
            self.state[me] = "waiting"
            self.pending[me] = op
            self.cond.notify_all()
            if not self.cond.wait_for(lambda: self.turn == me or self.stopped, timeout=30):
                raise Deadlock(f"{me} was never scheduled")
            if self.stopped:
                raise Stopped()
            self.turn = None
            self.state[me] = "running"

    def run(self, actors: dict[str, Callable[[], None]]) -> None:
        def body(name: str, fn: Callable[[], None]) -> None:
            try:
                self.point()  # start only when scheduled
                fn()
            except Stopped:
                pass
            except BaseException as e:  # reported by run()
                self.errors.append(e)
            finally:
                with self.cond:
                    self.state[name] = "done"
                    self.cond.notify_all()

        threads = []
        with self.cond:
            for name in actors:
                self.state[name] = "running"
        for name, fn in actors.items():
            t = threading.Thread(target=body, args=(name, fn), name=name, daemon=True)
            threads.append(t)
            t.start()
        try:
            self._loop()
        finally:  # also when Hypothesis stops the example mid-schedule
            with self.cond:
                self.stopped = True
                self.cond.notify_all()
            for t in threads:
                t.join(30)
        if self.errors:
            raise self.errors[0]

    def _loop(self) -> None:
        while True:
            with self.cond:
                if not self.cond.wait_for(
                    lambda: self.turn is None and all(s != "running" for s in self.state.values()),
                    timeout=30,
                ):
                    raise Deadlock(f"actors stuck: {self.state}")
                waiting = sorted(n for n, s in self.state.items() if s == "waiting")
                if not waiting:
                    break
                turn = self.choose(waiting)
                if self.pending.get(turn) == "put_if_absent":
                    self.lose_reply[turn] = self.lose()
                self.turn = turn
                self.state[turn] = "running"
                self.cond.notify_all()


@dataclass
class Outcome:
    acked: dict[str, list[str]] = field(default_factory=dict)  # writer -> committed tokens
    unknown: set[str] = field(default_factory=set)  # tokens whose commit raised
    seen: dict[str, list[Log]] = field(default_factory=dict)  # reader -> states it read
    returned: list[Log] = field(default_factory=list)  # states commits returned


def _explore(
    data: st.DataObject,
    *,
    writers: int,
    commits: int,
    readers: int,
    keep: int,
    gc_every: int,
    turn_after: int = 1,
) -> None:
    root = f"memory://commit-protocol-{uuid.uuid4().hex}"
    inner = open_blob_store(root)
    folder = "log"
    sched: Scheduler
    ticks = itertools.count()

    def tick() -> int:
        return next(ticks)

    def choose(waiting: list[str]) -> str:
        return data.draw(st.sampled_from(waiting))

    def lose() -> bool:
        return data.draw(st.integers(0, 5)) == 0  # about one conditional put in six

    sched = Scheduler(choose, lose)
    hooked = HookedStore(inner, sched.point, sched.lost)

    def vstore() -> VersionedStore[Log]:
        return VersionedStore(
            hooked,
            folder,
            Log.decode,
            what="log",
            keep_versions=keep,
            gc_every=gc_every,
            gc_grace_ms=0,  # any GC at any point, however young the versions
            turn_after=turn_after,
            turn_ms=3,
            clock=tick,  # one ms per reading: turns time out after a few polls
            sleep=lambda _: None,  # the schedule, not time, decides who goes next
        )

    assert VersionedStore(inner, folder, Log.decode, what="log").create(Log())
    out = Outcome()

    def writer(name: str) -> Callable[[], None]:
        vs = vstore()

        def run() -> None:
            out.acked[name] = []
            for i in range(commits):
                token = f"{name}.{i}"

                def change(s: Log, token: str = token) -> None:
                    s.items.append(token)

                try:
                    state, _ = vs.commit(change, timeout_ms=600_000)
                except CommitConflict:
                    out.unknown.add(token)
                    continue
                out.acked[name].append(token)
                out.returned.append(state)

        return run

    def reader(name: str) -> Callable[[], None]:
        vs = vstore()

        def run() -> None:
            out.seen[name] = []
            for _ in range(commits * writers):
                out.seen[name].append(vs.latest())

        return run

    def collector() -> None:  # garbage collection run at arbitrary points
        vs = vstore()
        for _ in range(commits):
            newest = vs.latest()
            vs.engine.gc(newest.version)  # type: ignore[attr-defined]

    actors: dict[str, Callable[[], None]] = {f"w{i}": writer(f"w{i}") for i in range(writers)}
    actors.update({f"r{i}": reader(f"r{i}") for i in range(readers)})
    actors["gc"] = collector
    try:
        sched.run(actors)
        final = VersionedStore(inner, folder, Log.decode, what="log").latest()
        _check(final, out)
    finally:
        inner.delete_prefix(folder)


def _check(final: Log, out: Outcome) -> None:
    items = final.items
    assert final.version == len(items)
    assert len(set(items)) == len(items), f"a commit is in the newest state twice: {items}"
    for name, tokens in out.acked.items():
        mine = [t for t in items if t.startswith(name + ".")]
        kept = [t for t in mine if t not in out.unknown]
        assert kept == tokens, f"{name}: acknowledged {tokens}, newest state holds {kept}"
    for s in out.returned:
        assert items[: len(s.items)] == s.items, f"commit returned a dead state {s}"
    for name, states in out.seen.items():
        versions = [s.version for s in states]
        assert versions == sorted(versions), f"{name} went backwards: {versions}"
        for s in states:
            assert s.version == len(s.items)
            assert items[: len(s.items)] == s.items, f"{name} read a dead-branch state {s}"


_EXAMPLES = 2000 if LONG else 150


@settings(
    max_examples=_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    data=st.data(),
    keep=st.integers(1, 3),
    gc_every=st.integers(1, 2),
    turn_after=st.integers(1, 3),
)
def test_interleavings_two_writers_and_a_reader(
    data: st.DataObject, keep: int, gc_every: int, turn_after: int
) -> None:
    """Any schedule, any GC, lost replies; writers take commit turns after 1-3 losses."""
    _explore(
        data,
        writers=2,
        commits=4,
        readers=1,
        keep=keep,
        gc_every=gc_every,
        turn_after=turn_after,
    )


@settings(
    max_examples=_EXAMPLES // 3,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_interleavings_three_writers(data: st.DataObject) -> None:
    _explore(data, writers=3, commits=3, readers=1, keep=1, gc_every=1)


def test_stale_writer_far_behind_commits_on_the_live_chain() -> None:
    """A fixed schedule: one writer's cache falls far behind with GC after every commit."""
    inner = open_blob_store(f"memory://commit-protocol-{uuid.uuid4().hex}")
    try:
        mk = lambda: VersionedStore(  # noqa: E731
            inner, "log", Log.decode, what="log", keep_versions=2, gc_every=1, gc_grace_ms=0
        )
        stale, busy = mk(), mk()
        assert stale.create(Log())

        def add(token: str) -> Callable[[Log], None]:
            return lambda s: s.items.append(token)

        stale.commit(add("s0"))
        for i in range(10):
            busy.commit(add(f"b{i}"))
        state, _ = stale.commit(add("s1"))
        final = mk().latest()
        assert final.items == ["s0", *[f"b{i}" for i in range(10)], "s1"]
        assert state.items == final.items
    finally:
        inner.delete_prefix("log")


# --------------------------------------------------------------------------- paused writers
@pytest.fixture
def short_queue_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """The paused writer holds the local commit queue (a ``flock`` of the folder), so each of
    the others' commits waits the queue's bound and then commits without it, as in production.
    The bound shrinks from 250 ms to 2 ms: about 200 commits wait it here (52 s per test)."""
    monkeypatch.setattr(blob, "LOCAL_QUEUE_WAIT_MS", 2)


class PauseAfterPut:
    """Stops the thread that made the first conditional put into ``folder`` (while armed) at
    its next store call, i.e. between its put and the checks that settle it, until released."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.armed = False
        self.put_done = False
        self.reached = threading.Event()
        self.go = threading.Event()

    def before(self, op: str, key: str) -> None:
        if self.put_done:
            self.put_done = False
            self.reached.set()
            assert self.go.wait(60), "pause never released"
        elif self.armed and op == "put_if_absent" and key.startswith(self.folder + "/"):
            self.armed = False
            self.put_done = True


def _acking_run(
    store: BlobStore, paused_store: BlobStore, gate: PauseAfterPut, *, idle_first: bool
) -> tuple[SubscriptionConsumer, Position, list[BaseException]]:
    """A consumer on ``paused_store`` acknowledges one message; it is paused between its put
    and its settling checks while another consumer fetches and acknowledges (one commit each)
    well over ``KEEP_VERSIONS`` + ``GC_EVERY`` times, with real garbage collection. With
    ``idle_first`` the paused consumer first sits idle while the others commit that many
    versions (its cached state is then far behind: its put may land in a freed slot)."""
    n = STALE_BY
    create_topic(store, "t")
    with Producer(store, "t", batching_enabled=False) as p:
        for i in range(3 * n + 2):
            p.send(b"%d" % i)
    topic = TopicName.parse("t")
    paused = SubscriptionConsumer(
        paused_store,
        topic,
        "s",
        sub_type="Shared",
        initial_position="Earliest",
        lease_ms=600_000,
    )
    busy = SubscriptionConsumer(
        store, topic, "s", sub_type="Shared", initial_position="Earliest", lease_ms=600_000
    )
    (held,) = paused.fetch(1)

    def ack_some(k: int) -> None:
        for _ in range(k):
            ds = busy.fetch(1)
            busy.acknowledge([(d.position, -1, 1) for d in ds])

    if idle_first:
        ack_some(n)
    errors: list[BaseException] = []

    def ack_held() -> None:
        try:
            paused.acknowledge([(held.position, -1, 1)])
        except BaseException as e:  # reported to the test
            errors.append(e)

    gate.armed = True
    t = threading.Thread(target=ack_held)
    t.start()
    try:
        assert gate.reached.wait(30), "the acknowledgement never made its put"
        ack_some(n)  # > KEEP_VERSIONS + 2 commits while the paused writer holds its put
    finally:
        gate.go.set()
        t.join(60)
    busy.close()
    return paused, held.position, errors


@pytest.mark.usefixtures("short_queue_wait")
@pytest.mark.parametrize("idle_first", [False, True], ids=["fresh", "idle-behind"])
def test_writer_paused_between_put_and_settle_keeps_its_evidence(
    tmp_path: Path, idle_first: bool
) -> None:
    """CI failure of the concurrency suite (CommitOutcomeUnknown on a consumer's ack): a writer
    paused right after its put while others commit more than the kept versions. Versions
    younger than the GC grace are kept, so the paused writer settles its commit (it used to
    find its base, its version and the next one all deleted and raise)."""
    store = _files_store(tmp_path / "root")
    folder = "topics/persistent/public/default/t/subscriptions/s/state"
    gate = PauseAfterPut(folder)
    paused, pos, errors = _acking_run(
        store, HookedStore(store, gate.before), gate, idle_first=idle_first
    )
    assert errors == []
    paused.close()
    newest = SubscriptionStore(store, TopicName.parse("t"), "s").latest()
    assert newest.is_acked((pos.ledger_id, pos.entry_id)), "the acknowledgement was lost"


@pytest.mark.usefixtures("no_gc_grace", "short_queue_wait")
@pytest.mark.parametrize("idle_first", [False, True], ids=["fresh", "idle-behind"])
def test_ack_paused_longer_than_the_grace_is_applied_again(
    tmp_path: Path, idle_first: bool
) -> None:
    """The same pause, longer than the GC grace (grace 0 here): the evidence is gone and the
    outcome of the put cannot be told. An acknowledgement is idempotent, so it is applied
    again to the newest state and holds (it used to raise CommitOutcomeUnknown)."""
    store = _files_store(tmp_path / "root")
    folder = "topics/persistent/public/default/t/subscriptions/s/state"
    gate = PauseAfterPut(folder)
    paused, pos, errors = _acking_run(
        store, HookedStore(store, gate.before), gate, idle_first=idle_first
    )
    assert errors == []
    paused.close()
    newest = SubscriptionStore(store, TopicName.parse("t"), "s").latest()
    assert newest.is_acked((pos.ledger_id, pos.entry_id)), "the acknowledgement was lost"


@pytest.mark.usefixtures("short_queue_wait")
def test_non_idempotent_commit_paused_longer_than_the_grace_raises(tmp_path: Path) -> None:
    """A change that is not idempotent (appending to the log) still reports that its outcome
    is unknown when the pause outlived the grace and GC removed the evidence."""
    inner = _files_store(tmp_path / "root")
    gate = PauseAfterPut("log")

    def mk(store: BlobStore) -> VersionedStore[Log]:
        return VersionedStore(store, "log", Log.decode, what="log", gc_grace_ms=0)

    paused, busy = mk(HookedStore(inner, gate.before)), mk(inner)
    assert busy.create(Log())
    paused.latest()
    errors: list[BaseException] = []

    def append() -> None:
        try:
            paused.commit(lambda s: s.items.append("paused"))
        except BaseException as e:  # reported to the test
            errors.append(e)

    gate.armed = True
    t = threading.Thread(target=append)
    t.start()
    try:
        assert gate.reached.wait(30)
        for i in range(STALE_BY):
            busy.commit(lambda s, i=i: s.items.append(f"b{i}"))
    finally:
        gate.go.set()
        t.join(60)
    assert len(errors) == 1 and isinstance(errors[0], CommitOutcomeUnknown), errors


# --------------------------------------------------------------------------- fairness
def _round_robin() -> Callable[[list[str]], str]:
    """A scheduler policy: the waiting actors take one store call each in turn (all store
    calls equally fast), which is how a writer that starts from a fresh cache outpaces one
    that has to walk to the newest version after each lost race."""
    last: list[str] = []

    def choose(waiting: list[str]) -> str:
        after = [n for n in waiting if last and n > last[0]]
        pick = (after or waiting)[0]
        last[:] = [pick]
        return pick

    return choose


@pytest.mark.parametrize("gc_every", [4, GC_EVERY])
def test_writer_losing_every_race_gets_a_turn(gc_every: int) -> None:
    """Writer ``busy`` commits back to back from its fresh cache; ``late`` starts once
    ``busy`` is under way and has to walk forward after each lost race. With equally fast
    store calls, ``late`` used to lose every race until ``busy`` stopped (its commit landed
    after all of ``busy``'s). After a few losses it takes a turn: ``busy`` sees the turn
    files at its next GC listing, checks turns before its puts, and leaves ``late`` a slot."""
    inner = open_blob_store(f"memory://commit-fair-{uuid.uuid4().hex}")
    ticks = itertools.count()
    sched = Scheduler(_round_robin())
    hooked = HookedStore(inner, sched.point)

    def mk() -> VersionedStore[Log]:
        return VersionedStore(
            hooked,
            "log",
            Log.decode,
            what="log",
            gc_every=gc_every,
            clock=lambda: next(ticks),  # a turn is left to its holder for 2000 readings
            sleep=lambda _: None,
        )

    busy, late = mk(), mk()
    assert VersionedStore(inner, "log", Log.decode, what="log").create(Log())
    n = 6 * gc_every + 20
    started = threading.Event()

    def run_busy() -> None:
        for i in range(n):
            busy.commit(lambda s, i=i: s.items.append(f"b{i}"))
            started.set()

    def run_late() -> None:
        late.latest()
        late.commit(lambda s: s.items.append("late"), timeout_ms=600_000)

    try:
        sched.run({"busy": run_busy, "late": run_late})
        items = VersionedStore(inner, "log", Log.decode, what="log").latest().items
    finally:
        inner.delete_prefix("log")
    assert sorted(items) == sorted(["late", *[f"b{i}" for i in range(n)]])
    where = items.index("late")
    # Not after all of busy's commits: within the versions busy commits while late loses its
    # first races (a walk of a few versions each), plus a GC period until busy lists the turn.
    # (``late`` asks after 3 losses; each costs it a walk of about 4 versions.)
    assert where <= gc_every + 20, (where, n, items)
