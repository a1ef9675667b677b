"""The producer I/O thread's pass runs the stores of several partitions at once (their syncs
overlap) and still answers every callback on the I/O thread, in order, after its commit."""

from __future__ import annotations

import fcntl
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from filepulsar.storage import Producer, Reader, TopicName, open_blob_store, paths
from filepulsar.storage.blobstore.local import LocalBlobStore
from filepulsar.storage.producer.io_thread import shared_io
from filepulsar.storage.producer.messages import Result
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


def test_a_pass_commits_one_partition_while_another_waits(store: LocalBlobStore) -> None:
    """A and B sealed in one pass; A's commit waits for its manifest's lock (held here): B is
    committed meanwhile (before, the pass wrote them one after the other, and B waited for
    A's commit, which gave up after the 30 s commit timeout, failing A)."""
    answers = _Answers()
    pa, pb = _producer(store, "a"), _producer(store, "b")
    gp, gate = _hold_io_thread(store, answers)
    pa.send_async(b"a0", answers.cb("a"))
    pb.send_async(b"b0", answers.cb("b"))
    lock_dir = store.local_path(paths.manifest_dir(TopicName.parse("a")))
    assert lock_dir is not None
    fd = os.open(lock_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        gate.set()  # the pass takes A then B: A's commit waits for the lock
        reader = Reader(store, "b")
        rows = 0
        while not rows:  # B's entry is committed while A's commit still waits
            rows = reader.read_batch(1, timeout_ms=1000).num_rows
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    got = answers.wait(3)
    # Every callback after its own commit, on the I/O thread, in the pass's order.
    assert got == [("gate", Result.Ok), ("a", Result.Ok), ("b", Result.Ok)]
    assert {ident for _, _, ident in answers.got} == {shared_io().ident}
    assert _read_values(store, "a") == [b"a0"]
    for p in (pa, pb, gp):
        p.close()


def test_a_callback_may_flush_another_producer_of_its_pass(store: LocalBlobStore) -> None:
    """A's callback sends on B and flushes it, B's entry taken by the same pass and not yet
    answered: B's write is answered first (its callback runs before the flush returns), as
    when the pass wrote B after A; the flush neither raises nor waits for itself."""
    answers = _Answers()
    pa, pb = _producer(store, "a"), _producer(store, "b")
    flushed: list[str] = []

    def flush_b() -> None:
        pb.send_async(b"b1", answers.cb("b1"))
        pb.flush()
        flushed.append("done")

    gp, gate = _hold_io_thread(store, answers)
    pa.send_async(b"a0", answers.cb("a0", flush_b))
    pb.send_async(b"b0", answers.cb("b0"))
    gate.set()
    got = answers.wait(4)
    assert flushed == ["done"]
    # b0 (stored in the pass) and b1 (written by the flush) answered before a0's callback ends.
    assert got == [("gate", Result.Ok), ("b0", Result.Ok), ("b1", Result.Ok), ("a0", Result.Ok)]
    assert _read_values(store, "b") == [b"b0", b"b1"]
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
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    acked: dict[int, set[int]] = {t: set() for t in range(topics)}
    target = random.Random(round_).randint(1500, 6000)
    helpers = 0
    for n, line in enumerate(proc.stdout, 1):
        t, i, h = map(int, line.split())
        acked[t].add(i)
        helpers = max(helpers, h)
        if n >= target and helpers:
            break
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
