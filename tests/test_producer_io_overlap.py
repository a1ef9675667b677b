"""The producer I/O thread's pass runs the stores of several partitions at once (their syncs
overlap) and still answers every callback on the I/O thread, in order, after its commit."""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from filepulsar.dispatch.clock import SYSTEM
from filepulsar.storage import Producer, Reader, TopicName, open_blob_store, paths
from filepulsar.storage.blobstore.local import LocalBlobStore
from filepulsar.storage.policies import set_topic_policies
from filepulsar.storage.producer import io_thread
from filepulsar.storage.producer.io_thread import shared_io
from filepulsar.storage.producer.messages import Result
from filepulsar.storage.writer import RENEW_AFTER
from tests.test_storage_durability import _read_values

pytestmark = pytest.mark.contract


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LocalBlobStore]:
    yield LocalBlobStore(str(tmp_path))


def _producer(store: LocalBlobStore, topic: str) -> Producer:
    # One message an entry, sealed at once: each send_async asks the I/O thread to write.
    return Producer(store, topic, producer_name=f"p-{topic}", batching_max_messages=1)


class _Answers:
    """Callbacks that record (label, result, thread); ``wait`` for ``n`` of them."""

    def __init__(self) -> None:
        self.got: list[tuple[str, Result, int]] = []
        self.cond = threading.Condition()

    def cb(self, label: str, then: Any = None) -> Any:
        def answer(result: Result, _mid: Any) -> None:
            if then is not None:
                then()
            with self.cond:
                self.got.append((label, result, threading.get_ident()))
                self.cond.notify_all()

        return answer

    def wait(self, n: int) -> list[tuple[str, Result]]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.got) >= n, 120), self.got
            return [(label, r) for label, r, _ in self.got]


def _hold_io_thread(store: LocalBlobStore, answers: _Answers) -> tuple[Producer, threading.Event]:
    """Block the I/O thread in a callback (so the next sends meet in one pass); set the
    returned event to let it go."""
    gate, inside = threading.Event(), threading.Event()
    p = _producer(store, "gate")

    def block() -> None:
        inside.set()
        gate.wait()

    p.send_async(b"g", answers.cb("gate", block))
    assert inside.wait(60)
    return p, gate


@contextlib.contextmanager
def _manifest_locked(store: LocalBlobStore, topic: str) -> Iterator[None]:
    """Hold ``topic``'s manifest lock (as another process's commit does): its commits wait."""
    lock_dir = store.local_path(paths.manifest_dir(TopicName.parse(topic)))
    assert lock_dir is not None
    fd = os.open(lock_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def test_a_pass_commits_one_partition_while_another_waits(store: LocalBlobStore) -> None:
    """A and B sealed in one pass; A's commit waits for its manifest's lock (held here): B is
    committed meanwhile (before, the pass wrote them one after the other, and B waited for
    A's commit, which gave up after the 30 s commit timeout, failing A)."""
    answers = _Answers()
    pa, pb = _producer(store, "a"), _producer(store, "b")
    gp, gate = _hold_io_thread(store, answers)
    pa.send_async(b"a0", answers.cb("a"))
    pb.send_async(b"b0", answers.cb("b"))
    with _manifest_locked(store, "a"):
        gate.set()  # the pass takes A then B: A's commit waits for the lock
        reader = Reader(store, "b")
        rows = 0
        while not rows:  # B's entry is committed while A's commit still waits
            rows = reader.read_batch(1, timeout_ms=1000).num_rows
    got = answers.wait(3)
    # Every callback after its own commit, on the I/O thread, in the pass's order.
    assert got == [("gate", Result.Ok), ("a", Result.Ok), ("b", Result.Ok)]
    assert {ident for _, _, ident in answers.got} == {shared_io().ident}
    assert _read_values(store, "a") == [b"a0"]
    for p in (pa, pb, gp):
        p.close()


@pytest.mark.parametrize("via", ["flush", "worker-send_table", "worker-send", "worker-flush"])
def test_a_callback_may_write_another_producer_of_its_pass(store: LocalBlobStore, via: str) -> None:
    """A's callback writes to B, whose entry the same pass stored and has not answered yet:
    itself (a send and a flush on the I/O thread), or through a worker thread's bulk write it
    waits for. B's stored write is answered first, on the thread that takes B's ledgers, as
    when the pass wrote B after A; nothing raises or waits for itself (before the pass let go
    of B's ledgers once its stores ended, the worker waited for the callback that waited for
    it, and the shared I/O thread, with every producer of the process, stood still)."""
    answers = _Answers()
    pa, pb = _producer(store, "a"), _producer(store, "b")
    wrote: list[str] = []
    with ThreadPoolExecutor(1) as worker:

        def write_b() -> None:
            if via == "flush":
                pb.send_async(b"b1", answers.cb("b1"))
                pb.flush()
            elif via == "worker-send_table":
                worker.submit(pb.send_table, [b"b1"]).result(timeout=60)
            elif via == "worker-send":
                worker.submit(pb.send, b"b1").result(timeout=60)
            else:
                pb.send_async(b"b1", answers.cb("b1"))
                worker.submit(pb.flush).result(timeout=60)
            wrote.append("b1")

        gp, gate = _hold_io_thread(store, answers)
        pa.send_async(b"a0", answers.cb("a0", write_b))
        pb.send_async(b"b0", answers.cb("b0"))
        gate.set()
        b1 = [("b1", Result.Ok)] if via in ("flush", "worker-flush") else []
        got = answers.wait(3 + len(b1))
    assert wrote == ["b1"]
    # b0 (stored in the pass) and b1 answered before a0's callback ends.
    assert got == [("gate", Result.Ok), ("b0", Result.Ok), *b1, ("a0", Result.Ok)]
    assert _read_values(store, "b") == [b"b0", b"b1"]
    for p in (pa, pb, gp):
        p.close()


def test_a_lease_renewal_counts_from_its_commit_not_from_the_end_of_the_pass(
    store: LocalBlobStore,
) -> None:
    """X's commit renews its lease while Y's commit in the same pass waits for its manifest's
    lock: X's next renewal is due a third of the lease after X's commit, not after the pass
    (before, a pass whose slowest store waited long enough let X's lease run out)."""
    lease_ms = 3000  # (X renews a third of it after its commit: long after this test)
    set_topic_policies(store, "x", producer_lease_ms=lease_ms)
    answers = _Answers()
    px, py = _producer(store, "x"), _producer(store, "y")
    opened = time.time()
    gp, gate = _hold_io_thread(store, answers)
    # (past a third of the lease, so X's next commit renews it: the I/O thread, held, cannot)
    while time.time() - opened < lease_ms * RENEW_AFTER / 1000 + 0.05:
        time.sleep(0.01)
    px.send_async(b"x0", answers.cb("x0"))
    py.send_async(b"y0", answers.cb("y0"))
    with _manifest_locked(store, "y"):
        gate.set()
        reader = Reader(store, "x")
        while not reader.read_batch(1, timeout_ms=1000).num_rows:
            pass  # X's commit is done; Y's waits
        time.sleep(0.2)  # (slack: X's store returns just after its commit is seen)
        y_waits = SYSTEM.monotonic()
    assert answers.wait(3) == [("gate", Result.Ok), ("x0", Result.Ok), ("y0", Result.Ok)]
    lane = px._queue._lanes[0]
    assert lane.part.writer.lease_renewed
    assert lane.renewed_at <= y_waits  # (before: when the pass answered, after Y's commit)
    for p in (px, py, gp):
        p.close()


def _helpers_cannot_start(monkeypatch: pytest.MonkeyPatch, error: BaseException) -> None:
    """A fresh I/O thread (no helper started yet) whose helper threads fail to start."""
    monkeypatch.setattr(io_thread, "_SHARED", io_thread.ProducerIo())
    start = threading.Thread.start

    def start_or_fail(thread: threading.Thread) -> None:
        if thread.name == io_thread.HELPER_THREAD:
            raise error
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", start_or_fail)


@pytest.mark.parametrize("error", [RuntimeError("can't start new thread"), MemoryError()])
def test_a_helper_thread_that_cannot_start(
    store: LocalBlobStore, monkeypatch: pytest.MonkeyPatch, error: BaseException
) -> None:
    """No thread to be had for a helper (a pids limit, RuntimeError): the pass runs its
    stores on the threads it has, and every producer goes on (before, the error failed the
    pass's writes and stopped the I/O thread, failing every producer of the process). Any
    other error out of the pass itself (MemoryError): every write the pass took is answered
    with it, none left parked with its callbacks never run."""
    _helpers_cannot_start(monkeypatch, error)
    answers = _Answers()
    pa, pb = _producer(store, "a"), _producer(store, "b")
    gp, gate = _hold_io_thread(store, answers)
    pa.send_async(b"a0", answers.cb("a0"))
    pb.send_async(b"b0", answers.cb("b0"))
    gate.set()
    got = answers.wait(3)
    if isinstance(error, RuntimeError):
        assert got == [("gate", Result.Ok), ("a0", Result.Ok), ("b0", Result.Ok)]
        pc = _producer(store, "c")
        pc.send(b"c0")
        assert [_read_values(store, t) for t in ("a", "b", "c")] == [[b"a0"], [b"b0"], [b"c0"]]
        pc.close()
    else:
        assert got[0] == ("gate", Result.Ok)
        assert sorted(got[1:]) == [("a0", Result.UnknownError), ("b0", Result.UnknownError)]
    for p in (pa, pb, gp):
        p.close()


KILLED_SCRIPT = textwrap.dedent(
    """
    import sys, threading
    from filepulsar.storage import Producer, open_blob_store
    from filepulsar.storage.producer.io_thread import HELPER_THREAD
    store = open_blob_store(sys.argv[1])
    topics = int(sys.argv[2])
    ps = [Producer(store, f"t{t}", producer_name=f"p{t}", batching_type="KeyBased",
                   batching_max_publish_delay_ms=2) for t in range(topics)]
    out = threading.Lock()
    def acked(res, mid, t, i):
        if mid is not None:
            helpers = sum(th.name == HELPER_THREAD for th in threading.enumerate())
            with out:
                sys.stdout.write(f"{t} {i} {helpers}\\n")
                sys.stdout.flush()
    print("ready", flush=True)
    i = 0
    while True:
        for t, p in enumerate(ps):
            p.send_async(b"m-%08d" % i, lambda r, m, t=t, i=i: acked(r, m, t, i),
                         partition_key=str(i % 7))
        i += 1
        if i % 200 == 0:
            for p in ps:
                p.flush()
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("round_", range(3))
@pytest.mark.procs
def test_sigkill_during_overlapped_stores_loses_no_acknowledged_message(
    tmp_path: Path, round_: int
) -> None:
    """A process writing 8 topics, its passes storing several partitions at once on helper
    threads, is killed: on every topic each acknowledged message is there, nothing is
    partial, out of order or unreadable (a callback fired only after its commit, and no
    manifest names bytes that are not there), and the topics take new writes."""
    root = str(tmp_path / "root")
    topics = 8
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_SCRIPT, root, str(topics)],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    acked: dict[int, set[int]] = {t: set() for t in range(topics)}
    target = random.Random(round_).randint(1500, 6000)
    helpers = 0
    try:  # (the child is killed whatever happens here: it writes for ever)
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        for n, line in enumerate(proc.stdout, 1):
            t, i, h = map(int, line.split())
            acked[t].add(i)
            helpers = max(helpers, h)
            if n >= target and helpers:
                break
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert helpers > 0  # the stores did overlap
    store = open_blob_store(root)
    for t in range(topics):
        values = _read_values(store, f"t{t}")
        # (KeyBased batches of one pass may reach a topic in sequence order, not send order:
        # each message once, every acknowledged one there)
        got = sorted(int(v[2:]) for v in values)
        assert got == list(range(len(got))), t
        assert acked[t] <= set(got), t
    with Producer(store, "t0") as p:
        p.send(b"after-crash")
    assert _read_values(store, "t0")[-1] == b"after-crash"
