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
from filepulsar.storage.errors import ProducerFenced
from filepulsar.storage.producer.io_thread import shared_io
from filepulsar.storage.producer.messages import Result

pytestmark = pytest.mark.unit

IO_THREAD = "filepulsar-producer-io"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LocalBlobStore]:
    yield LocalBlobStore(str(tmp_path))


def _producer(store: LocalBlobStore, topic: str, name: str, **kw: Any) -> Producer:
    kw.setdefault("batching_type", "KeyBased")
    return Producer(store, topic, producer_name=name, batching_max_publish_delay_ms=5, **kw)


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
    still fire. Once the last producer closes the thread ends; the next producer starts one."""
    first = _producer(store, "a", "first")
    second = _producer(store, "b", "second")
    first.send_async(b"1", None, partition_key="k")
    first.close()
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
    assert done.wait(60)
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


def test_a_producer_closed_in_its_own_callback_does_not_hang(store: LocalBlobStore) -> None:
    """``close()`` in a callback of the producer's own write cannot flush (it would wait for
    itself): it raises that, yet the producer is closed and the I/O thread goes on (before,
    it waited for the ledgers its own thread held, for ever)."""
    p = _producer(store, "self", "self")
    other = _producer(store, "other", "other")
    [raised] = _in_callback(p, p.close)
    assert "would wait for itself" in str(raised) and not p.is_connected()
    answers = _Answers()
    other.send_async(b"y", answers, partition_key="k")
    assert answers.wait(1) == [Result.Ok]
    other.close()
