"""One I/O thread per process serves every producer's send queue
(storage/producer/io_thread.py): timers, writes and callbacks of many producers on one
thread; a producer that fails or closes leaves the others served; a forked child gets its
own thread. Real producers on a real local store; waits are on events, not sleeps.
"""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from filepulsar.storage import Producer
from filepulsar.storage.blobstore.local import LocalBlobStore
from filepulsar.storage.errors import FilePulsarError, ProducerClosed, ProducerFenced
from filepulsar.storage.names import TopicName
from filepulsar.storage.producer.io_thread import ProducerIo, shared_io
from filepulsar.storage.producer.messages import MessageRecord, Result
from filepulsar.storage.topics import create_topic
from tests.test_send_queue import _queue

pytestmark = pytest.mark.unit

IO_THREAD = "filepulsar-producer-io"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LocalBlobStore]:
    yield LocalBlobStore(str(tmp_path))


def _producer(store: LocalBlobStore, topic: str, name: str, **kw: Any) -> Producer:
    kw.setdefault("batching_type", "KeyBased")
    kw.setdefault("batching_max_publish_delay_ms", 5)
    return Producer(store, topic, producer_name=name, **kw)


class _Answers:
    """Callbacks that record the result and the thread they ran on; ``wait`` for ``n``."""

    def __init__(self) -> None:
        self.got: list[tuple[Result, int]] = []
        self._cond = threading.Condition()

    def __call__(self, result: Result, _mid: Any) -> None:
        with self._cond:
            self.got.append((result, threading.get_ident()))
            self._cond.notify_all()

    def wait(self, n: int) -> list[Result]:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.got) >= n, 60), self.got
            return [r for r, _ in self.got]


def _io_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("filepulsar-producer")]


def test_one_thread_times_writes_and_answers_every_producer(store: LocalBlobStore) -> None:
    """Ten producers, one I/O thread: every batch is sealed by its delay and written, and
    every callback runs on that one thread (before, each producer started its own)."""
    producers = [_producer(store, f"t{i}", f"p{i}") for i in range(10)]
    answers = _Answers()
    for round_ in range(3):
        for i, p in enumerate(producers):
            p.send_async(b"x", answers, partition_key=f"k{round_}-{i}")
    assert answers.wait(30) == [Result.Ok] * 30  # no flush: the timers sealed them
    threads = {ident for _, ident in answers.got}
    assert threads == {shared_io().ident}
    assert [t.name for t in _io_threads()] == [IO_THREAD]
    for p in producers:
        p.close()


def test_a_fenced_producer_fails_alone_and_the_others_go_on(store: LocalBlobStore) -> None:
    """A producer whose commits fail (fenced by an ``ExclusiveWithFencing`` producer) hears
    of it in its own callbacks; the producers it shares the I/O thread with keep publishing."""
    victim = _producer(store, "fenced", "victim")
    other = _producer(store, "free", "other")
    victim.send(b"before")
    fencer = Producer(store, "fenced", producer_name="fencer", access_mode="ExclusiveWithFencing")
    lost, kept = _Answers(), _Answers()
    victim.send_async(b"after", lost, partition_key="k")
    assert lost.wait(1) == [Result.ProducerFenced]
    with pytest.raises(ProducerFenced):
        victim.send_async(b"more", lost)
    for i in range(5):
        other.send_async(b"y", kept, partition_key=f"k{i}")
    assert kept.wait(5) == [Result.Ok] * 5
    for p in (victim, other, fencer):
        p.close()


def test_closing_one_producer_leaves_the_others_served(store: LocalBlobStore) -> None:
    """Closing a producer takes its queue off the thread, not the thread: the others' timers
    still fire. Once the last producer closes the thread ends; the next producer starts one.
    (A producer an earlier test of this process left open would keep the thread: named here
    rather than waited for; tests/conftest.py fails the test that leaves one.)"""
    assert shared_io().serving() == [], "producers left open by an earlier test of the process"
    first = _producer(store, "a", "first")
    second = _producer(store, "b", "second")
    assert shared_io().serving() == [
        "'first' on persistent://public/default/a",
        "'second' on persistent://public/default/b",
    ]
    first.send_async(b"1", None, partition_key="k")
    first.close()
    assert shared_io().serving() == ["'second' on persistent://public/default/b"]
    answers = _Answers()
    second.send_async(b"2", answers, partition_key="k")
    assert answers.wait(1) == [Result.Ok]
    second.close()
    for t in _io_threads():
        t.join(60)
    assert _io_threads() == []
    third = _producer(store, "c", "third")
    again = _Answers()
    third.send_async(b"3", again, partition_key="k")
    assert again.wait(1) == [Result.Ok]
    third.close()


def test_a_blocking_send_between_async_ones_keeps_sequence_order(store: LocalBlobStore) -> None:
    """``send()`` writes its own message in the calling thread when nothing else is queued,
    else hands it to the I/O thread behind what is: either way entries keep sequence order,
    while another producer's timers run on the same thread."""
    p = _producer(store, "order", "p", batching_type="Default")
    other = _producer(store, "side", "o")
    answers, side = _Answers(), _Answers()
    ids = []
    for i in range(20):
        p.send_async(b"a%d" % i, answers)
        other.send_async(b"s", side, partition_key=f"k{i}")
        ids.append(p.send(b"s%d" % i))
    assert answers.wait(20) == [Result.Ok] * 20
    assert side.wait(20) == [Result.Ok] * 20
    assert ids == sorted(ids)
    assert p.last_sequence_id == 39
    p.close()
    other.close()


def _child_publishes(root: str, out: Any) -> None:
    store = LocalBlobStore(root)
    p = _producer(store, "child", "child")
    answers = _Answers()
    p.send_async(b"from the child", answers, partition_key="k")
    ok = answers.wait(1) == [Result.Ok]
    out.put(ok and {ident for _, ident in answers.got} == {shared_io().ident})
    p.close()


@pytest.mark.procs
def test_a_forked_child_gets_its_own_io_thread(store: LocalBlobStore, tmp_path: Path) -> None:
    """A child forked while the parent's I/O thread runs (and may hold its lock) has no such
    thread: its producers get a fresh one, and the parent's producers go on."""
    parent = _producer(store, "parent", "parent")
    answers = _Answers()
    parent.send_async(b"p", answers, partition_key="k")
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_child_publishes, args=(str(tmp_path), out))
    child.start()
    assert out.get(timeout=120) is True
    child.join(60)
    assert child.exitcode == 0
    parent.send_async(b"q", answers, partition_key="k2")
    assert answers.wait(2) == [Result.Ok, Result.Ok]
    parent.close()


def _child_uses_inherited(producer: Producer, out: Any) -> None:
    try:
        producer.send_async(b"from the child", None)
        out.put("queued")  # (before: queued, and never written nor answered)
    except FilePulsarError as e:
        out.put(str(e))
    producer.close()  # returns: nothing of the parent's to release
    out.put("closed")


@pytest.mark.procs
def test_a_producer_inherited_by_a_forked_child_raises_there(store: LocalBlobStore) -> None:
    """A forked child cannot use a producer its parent opened (the parent's I/O thread
    writes its queue, not the child's): ``send_async`` there raises saying so, and
    ``close()`` returns. The parent's producer goes on."""
    parent = _producer(store, "parent", "parent")
    parent.send(b"before the fork")
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_child_uses_inherited, args=(parent, out))
    child.start()
    said = out.get(timeout=120)
    assert "forked child cannot use it" in said, said
    assert out.get(timeout=120) == "closed"
    child.join(60)
    assert child.exitcode == 0
    answers = _Answers()
    parent.send_async(b"after", answers, partition_key="k")
    assert answers.wait(1) == [Result.Ok]
    parent.close()


def _in_callback(producer: Producer, steps: Any) -> list[Any]:
    """Send one message on ``producer`` whose callback runs ``steps()`` (on the I/O thread);
    return what it returned, or what it raised."""
    got: list[Any] = []
    done = threading.Event()

    def callback(result: Result, _mid: Any) -> None:
        try:
            got.append(steps())
        except Exception as e:  # (recorded for the test's assertions)
            got.append(e)
        finally:
            done.set()

    producer.send_async(b"first", callback, partition_key="k")
    assert done.wait(60), "the callback never returned: the I/O thread waits for itself"
    return got


def test_a_callback_may_send_on_another_producer(store: LocalBlobStore) -> None:
    """A callback runs on the one I/O thread; a blocking ``send()`` or ``flush()`` of another
    producer in it writes that producer's entries there (no other thread would: it waits),
    while one on its own producer raises instead of waiting for itself forever."""
    a = _producer(store, "a", "a")
    b = _producer(store, "b", "b")
    ids: list[Any] = []

    def steps() -> None:
        b.send_async(b"queued", None, partition_key="q")
        ids.append(b.send(b"chained", partition_key="k"))
        b.flush()
        a.flush()

    [raised] = _in_callback(a, steps)
    assert ids[0].entry_id == 1  # after the queued one, in sequence order
    assert "would wait for itself" in str(raised)
    a.close()
    b.close()


def _answered(p: Producer) -> bool:
    """``p``'s process I/O thread still answers callbacks (of a fresh producer on ``p``'s
    store)."""
    answers = _Answers()
    p.send_async(b"probe", answers, partition_key="probe")
    return answers.wait(1) == [Result.Ok]


def test_a_callback_sending_on_a_full_producer_writes_it_there(store: LocalBlobStore) -> None:
    """``send_async`` in a callback on another producer over ``max_pending_bytes`` (blocking
    when full) writes that producer's entries on the I/O thread, then queues the message
    (before, it waited for the I/O thread, which was itself: every producer hung)."""
    a = _producer(store, "a", "a")
    b = _producer(store, "b", "b", max_pending_bytes=100_000)
    answers = _Answers()

    def steps() -> None:
        for _ in range(3):
            b.send_async(b"x" * 80_000, answers)  # the 2nd and 3rd find b full

    assert _in_callback(a, steps) == [None]
    b.flush()
    assert answers.wait(3) == [Result.Ok] * 3
    assert _answered(a)
    a.close()
    b.close()


def test_a_producer_closed_while_a_callback_makes_room_refuses_the_message(
    store: LocalBlobStore,
) -> None:
    """A callback's ``send_async`` on a full producer B writes B's entries first; if one of
    B's callbacks closes B meanwhile, the message is refused with ``ProducerClosed`` (before,
    it went into the closed producer's open batch: never written, never answered)."""
    a = _producer(store, "a", "a")
    b = _producer(store, "b", "b", max_pending_bytes=100_000, batching_max_publish_delay_ms=60_000)
    b.send_async(b"x" * 60_000, lambda _r, _m: b.close(), partition_key="k")
    b.send_async(b"x" * 60_000, None, partition_key="k")  # one open batch, over the limit

    def steps() -> None:
        b.send_async(b"y", None, partition_key="k")

    [raised] = _in_callback(a, steps)
    assert isinstance(raised, ProducerClosed), raised
    assert not b.is_connected() and b.last_sequence_id == 1
    a.close()


def test_a_full_producer_in_its_own_callback_raises(store: LocalBlobStore) -> None:
    """On the producer whose write runs the callback, a full queue cannot be drained there:
    ``send_async`` raises instead of waiting for itself."""
    a = _producer(store, "a", "a", max_pending_bytes=100_000)

    queued: list[int] = []

    def steps() -> None:
        for i in range(3):
            a.send_async(b"x" * 80_000, None)
            queued.append(i)

    [raised] = _in_callback(a, steps)
    assert isinstance(raised, FilePulsarError) and "would wait for itself" in str(raised)
    assert queued == [0, 1]  # the third found more pending than the limit
    a.flush()
    assert a.last_sequence_id == 2  # "first" and the two queued
    a.close()


@pytest.mark.parametrize("call", ["flush", "send", "close"])
def test_a_blocking_call_in_a_callback_run_by_a_flush_on_the_io_thread(
    store: LocalBlobStore, call: str
) -> None:
    """A's callback flushes B, whose entries are written there; one of B's callbacks, run
    inside that write, calls B's ``flush()`` or ``send()`` (raises: it would wait for
    itself) or ``close()`` (returns; B closes after the write). Before, the thread waited
    for B's ledgers, which it held itself."""
    a = _producer(store, "a", "a")
    b = _producer(store, "b", "b", batching_max_publish_delay_ms=60_000)
    got: list[Any] = []

    def b_callback(result: Result, _mid: Any) -> None:
        got.append(result)
        try:
            {"flush": b.flush, "send": lambda: b.send(b"again"), "close": b.close}[call]()
            got.append("returned")
        except FilePulsarError as e:
            got.append(str(e))

    b.send_async(b"queued on b", b_callback, partition_key="k")
    assert _in_callback(a, b.flush) == [None]
    assert got[0] == Result.Ok
    if call == "close":
        assert got[1] == "returned" and not b.is_connected()
    else:
        assert "would wait for itself" in got[1]
    assert _answered(a)
    a.close()
    b.close()


def test_a_bulk_write_in_its_own_callback_raises(store: LocalBlobStore) -> None:
    """``send_table`` in a callback of the producer's own write raises, as ``send()`` does
    (before, it waited for the ledgers its own thread held: every producer hung)."""
    a = _producer(store, "a", "a")
    [raised] = _in_callback(a, lambda: a.send_table([b"r1", b"r2"]))
    assert isinstance(raised, FilePulsarError) and "would wait for itself" in str(raised)
    assert _answered(a)
    a.close()


def test_a_producer_closed_in_its_own_callback_writes_what_was_sent(
    store: LocalBlobStore,
) -> None:
    """``close()`` in a callback of the producer's own write returns at once: the write in
    hand goes on (every lane it took), then what was sent before ``close()`` is written,
    then the leases are released (before, releasing them first failed the rest of the write
    as fenced). The I/O thread goes on serving the others."""
    create_topic(store, "parted", partitions=2)
    p = Producer(
        store,
        "parted",
        producer_name="p",
        batching_max_publish_delay_ms=60_000,
        batching_max_messages=2,
    )
    other = _producer(store, "other", "other")
    answers = _Answers()
    closed: list[Any] = []

    def callback(result: Result, mid: Any) -> None:
        if not closed:
            p.close()
            closed.append("returned")
        answers(result, mid)

    for i in range(4):  # two full batches, one on each partition, in one write_ready
        p.send_async(b"m%d" % i, callback, partition_key=f"k{i}")
    p.send_async(b"open", answers)  # still open when close() runs: sealed and written by it
    assert answers.wait(5) == [Result.Ok] * 5
    assert closed == ["returned"] and not p.is_connected() and p.error is None
    assert _answered(other)
    other.close()


def test_the_renewal_sweep_yields_to_work_that_comes_in(store: LocalBlobStore) -> None:
    """Between queues of a lease-renewal sweep the thread writes what came in, and renews
    the rest after (before, an idle sweep renewed every queue due first: 20 queues at 50 ms a
    renewal held a live producer's messages back 782 ms at p99)."""
    io = ProducerIo(name="sweep-test-io")
    order: list[str] = []
    written, started = threading.Event(), threading.Event()
    live, _ = _queue(store, topic=TopicName.parse("live"), io=io)

    def live_written(result: Result, _mid: Any) -> None:
        order.append("write")
        written.set()

    def renew(name: str) -> None:
        if not started.is_set():  # idle0's first renewal, alone: wait for the others
            assert started.wait(60)
            return
        if not order:  # the first renewal of a sweep of all three: a message comes in
            live.add(lambda: 0, MessageRecord(content=b"x"), live_written, alone=True)
        order.append(name)

    idle = [  # due on every pass (renew_s 0), in the order they were made
        _queue(
            store,
            topic=TopicName.parse(f"idle{i}"),
            io=io,
            renew_s=0.0,
            renew=lambda _p, i=i: renew(f"renew{i}"),
        )[0]
        for i in range(3)
    ]
    started.set()
    assert written.wait(60)
    for q in [live, *idle]:
        q.close()
    assert order[:2] == ["renew0", "write"], order  # (before: renew0, renew1, renew2, write)


@pytest.mark.parametrize("call", ["flush", "send", "full"])
def test_a_callback_run_by_a_bulk_write_on_the_users_thread_raises_instead_of_waiting(
    store: LocalBlobStore, call: str
) -> None:
    """``send_table`` writes the earlier ``send_async`` entries on the caller's thread, and
    their callbacks run there: a ``flush()``, ``send()`` or a ``send_async`` on the full
    producer in one of them would wait for the write its own thread is doing. It raises
    (before: the thread waited for itself for ever)."""
    a = _producer(
        store,
        "a",
        "a",
        batching_max_publish_delay_ms=60_000,
        max_pending_bytes=50 if call == "full" else 64 << 20,
    )
    got: list[Any] = []

    def callback(_result: Result, _mid: Any) -> None:
        try:
            if call == "flush":
                a.flush()
            elif call == "send":
                a.send(b"y")
            else:
                a.send_async(b"z" * 100, None)
            got.append("returned")
        except FilePulsarError as e:
            got.append(e)

    a.send_async(b"x" * 100, callback)  # its batch open for a minute: send_table seals it
    writer = threading.Thread(target=lambda: got.append(a.send_table([b"r1"]).num_rows))
    writer.start()
    writer.join(60)
    assert not writer.is_alive(), "send_table's thread waits for itself"
    assert "would wait for itself" in str(got[0])
    assert got[1] == 1
    a.close()


@pytest.mark.procs
def test_a_child_forked_in_a_callback_writes_nothing_of_its_parent(
    store: LocalBlobStore,
) -> None:
    """A child forked by a callback (on the I/O thread: the child's one thread has that
    thread's ident) refuses to write its parent's inherited producer (before, its
    ``flush()`` appended the parent's unwritten messages under the parent's lease, and the
    parent's own write of them then failed)."""
    import os

    a = _producer(store, "a", "a", batching_max_publish_delay_ms=3_000)
    c = _producer(store, "c", "c", batching_max_publish_delay_ms=0)
    answers = _Answers()
    a.send_async(b"m1", answers, partition_key="k")
    a.send_async(b"m2", answers, partition_key="k")
    children: list[int] = []
    forked = threading.Event()

    def fork(_result: Result, _mid: Any) -> None:
        pid = os.fork()
        if pid == 0:  # the child: its inherited producer must raise before writing
            try:
                a.flush()
            except FilePulsarError:
                os._exit(0)
            os._exit(1)
        children.append(pid)
        forked.set()

    c.send_async(b"go", fork, partition_key="k")
    assert forked.wait(60)
    _, status = os.waitpid(children[0], 0)
    assert os.waitstatus_to_exitcode(status) == 0
    a.flush()
    assert answers.wait(2) == [Result.Ok, Result.Ok]
    a.close()
    c.close()
