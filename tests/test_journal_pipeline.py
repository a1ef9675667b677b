"""Pipelined journal commits (storage/FORMAT.md, "Journal"): a writer appends its record under
the folder's lock and flushes and marks it after letting the lock go, holding the record's
first byte meanwhile; the next writer builds on a record in flight, and marks only after it.

Real processes, real SIGKILLs: a writer killed at each step of its commit while another has
built on its record; a writer whose commit fails while another has built on it; readers that
find records in flight; several writers killed at random while they commit."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from filepulsar.storage.blobstore import open_blob_store
from filepulsar.storage.versioned import VersionedStore, journal
from tests.test_journal import _Items

pytestmark = [
    pytest.mark.procs,
    pytest.mark.alone,  # (forks without Python's hooks: no pytest-xdist threads beside them)
    pytest.mark.skipif(not journal._OFD, reason="pipelined commits need Linux's OFD locks"),
]

# A writer that commits ITEM to FOLDER (its record depending on DEPS) and stops at STOP, a
# step of its commit after the folder's lock was let go, until the test kills it or lets it
# go on (a line on stdin):
#   begun          record written and its first byte held, nothing flushed
#   flushed        after the record's fdatasync
#   before-mark    everything done but the mark
#   marked         after the mark, its first byte still held
WRITER = textwrap.dedent(
    """
    import json, os, sys, types
    from filepulsar.storage import open_blob_store
    from filepulsar.storage.versioned import VersionedStore, journal, record
    from tests.test_journal import _Items

    root, folder, item, stop, deps = sys.argv[1:6]
    real_finish = journal.Journal.finish
    state = {"in": False}

    def pause(where):
        if where == stop:
            if os.environ.get("FORK_AT_PAUSE"):
                child = os.fork()
                if child == 0:  # holds whatever it inherited until the test kills it
                    __import__("time").sleep(600)
                    os._exit(0)
                print("child", child, flush=True)
            print("paused", where, flush=True)
            sys.stdin.readline()

    def finish(self, *a, **k):
        pause("begun")
        state["in"] = True
        return real_finish(self, *a, **k)

    proxy = types.SimpleNamespace(**{k: getattr(os, k) for k in dir(os) if not k.startswith("__")})

    def fdatasync(fd):
        os.fdatasync(fd)
        if state["in"]:
            pause("flushed")

    def pwrite(fd, data, offset):
        if state["in"] and data == bytes((record.MARK,)):
            pause("before-mark")
            n = os.pwrite(fd, data, offset)
            pause("marked")
            return n
        return os.pwrite(fd, data, offset)

    proxy.fdatasync, proxy.pwrite = fdatasync, pwrite
    journal.os = proxy
    journal.Journal.finish = finish
    vs = VersionedStore(open_blob_store(root), folder, _Items.decode, what=folder)
    vs.commit(lambda s: s.items.append(item), durable_with=json.loads(deps))
    print("acked", flush=True)
    """
)


def _start_writer(
    root: Path, folder: str, item: str, stop: str, deps: Any, env: dict[str, str] | None = None
) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(root), folder, item, stop, json.dumps(deps)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=None if env is None else {**os.environ, **env},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.startswith("child"):
        proc.child = int(line.split()[1])  # type: ignore[attr-defined]
        line = proc.stdout.readline()
    assert line.startswith("paused"), f"the writer did not pause: {line!r}"
    return proc


def _store(root: Path, folder: str) -> VersionedStore[_Items]:
    return VersionedStore(open_blob_store(str(root)), folder, _Items.decode, what=folder)


def _created(root: Path, folder: str) -> VersionedStore[_Items]:
    vs = _store(root, folder)
    assert vs.create(_Items([]))
    vs.commit(lambda s: s.items.append("a"))
    return vs


class _Follower:
    """A commit of ``item`` in a thread of this process, through its own store object, that
    tells when its record is written (built on whatever was newest: a record in flight) and
    counts how often its change ran."""

    def __init__(self, root: Path, folder: str, item: str) -> None:
        self.vs = _store(root, folder)
        self.runs = 0
        self.begun = threading.Event()
        self.error: BaseException | None = None
        jr = self.vs.engine.journal  # type: ignore[attr-defined]
        real_begin = jr.begin

        def begin(*a: Any, **k: Any) -> journal.Ticket:
            t = real_begin(*a, **k)
            self.begun.set()
            return t

        jr.begin = begin  # type: ignore[method-assign]

        def change(s: _Items) -> None:
            self.runs += 1
            s.items.append(item)

        def run() -> None:
            try:
                self.vs.commit(change)
            except BaseException as e:  # reported by join()
                self.error = e

        self.thread = threading.Thread(target=run)
        self.thread.start()

    def join(self) -> None:
        self.thread.join(60)
        assert not self.thread.is_alive(), "the follower's commit never returned"
        if self.error is not None:
            raise self.error


STOPS = ["begun", "flushed", "before-mark", "marked"]


@pytest.mark.parametrize("stop", STOPS)
@pytest.mark.parametrize("deps", ["present", "missing"])
def test_a_writer_killed_while_another_built_on_its_record(
    tmp_path: Path, stop: str, deps: str
) -> None:
    """Writer A (another process) is killed at a step of its commit after letting the lock
    go; writer B has built on A's record meanwhile (B's record follows A's, B waits to mark).
    B settles A: with A's dependencies there, A is committed (its writer may have been told
    so) and B after it; with them missing and A not marked, A is cancelled and B's change
    runs again on the state before A. Never B without A's effect in its base, never A twice;
    a fresh reader and a third writer agree."""
    _created(tmp_path, "f")
    (tmp_path / "blob").write_bytes(b"x" * 10)
    dep = [["blob", 10]] if deps == "present" else [["nothing-here", 10]]
    a = _start_writer(tmp_path, "f", "A", stop, dep)
    b = _Follower(tmp_path, "f", "B")
    assert b.begun.wait(30), "B did not build on A's record"
    a.send_signal(signal.SIGKILL)
    a.wait()
    b.join()
    a_committed = deps == "present" or stop == "marked"
    want = ["a", "A", "B"] if a_committed else ["a", "B"]
    assert _store(tmp_path, "f").latest().items == want
    assert b.runs == (1 if a_committed else 2)
    _store(tmp_path, "f").commit(lambda s: s.items.append("C"))
    assert _store(tmp_path, "f").latest().items == [*want, "C"]


def test_a_forked_child_does_not_keep_a_dead_writers_record_in_flight(tmp_path: Path) -> None:
    """Writer A forks while its record is in flight (a child that outlives it: a worker pool,
    a subprocess), then is killed. The child closed the journal descriptors it inherited, so
    A's record is free at once: the next writer settles it and commits well within its
    timeout (with the child holding A's lock, it would wait out the timeout and fail)."""
    _created(tmp_path, "f")
    a = _start_writer(tmp_path, "f", "A", "begun", [], env={"FORK_AT_PAUSE": "1"})
    try:
        a.send_signal(signal.SIGKILL)
        a.wait()
        _store(tmp_path, "f").commit(lambda s: s.items.append("B"), timeout_ms=10_000)
    finally:
        os.kill(a.child, signal.SIGKILL)  # type: ignore[attr-defined]
    assert _store(tmp_path, "f").latest().items == ["a", "A", "B"]


@pytest.mark.parametrize("stop", STOPS)
def test_a_reader_leaves_a_record_in_flight_alone(tmp_path: Path, stop: str) -> None:
    """A reader finding a record in flight (its writer alive, between its flush steps)
    returns the state before it and neither marks nor cancels it (the record's dependency is
    missing: settling it would cancel it); let go on, the writer's commit lands and is read."""
    _created(tmp_path, "f")
    a = _start_writer(tmp_path, "f", "A", stop, [["nothing-here", 10]])
    want_now = ["a", "A"] if stop == "marked" else ["a"]
    assert _store(tmp_path, "f").latest().items == want_now
    assert a.stdin is not None and a.stdout is not None
    a.stdin.write("\n")
    a.stdin.flush()
    assert a.stdout.readline().startswith("acked")
    a.wait()
    assert _store(tmp_path, "f").latest().items == ["a", "A"]


def test_a_failed_commit_cancels_the_commits_built_on_it(tmp_path: Path) -> None:
    """A's commit fails after its record was written (its data's fsync failed: here its
    ``before_link`` raises) while B has built on A's record: A cancels its record and
    raises; B finds A cancelled, cancels its own and commits again on the state before A.
    Nothing of A; B once. The segment is sealed at the cancelled record and a new one
    started; every reader goes on there."""
    vs_a = _created(tmp_path, "f")
    old = _store(tmp_path, "f")
    assert old.latest().items == ["a"]
    followers: list[_Follower] = []

    def fail() -> None:
        followers.append(_Follower(tmp_path, "f", "B"))
        assert followers[0].begun.wait(30)
        raise OSError(5, "injected: the data's fsync failed")

    with pytest.raises(Exception, match="injected"):
        vs_a.commit(lambda s: s.items.append("A"), before_link=fail)
    followers[0].join()
    assert followers[0].runs == 2
    assert _store(tmp_path, "f").latest().items == ["a", "B"]
    assert old.latest().items == ["a", "B"]
    assert len(list((tmp_path / "f").glob("*.journal"))) == 2
    vs_a.commit(lambda s: s.items.append("C"))
    assert _store(tmp_path, "f").latest().items == ["a", "B", "C"]


def test_a_commit_behind_a_cancelled_record_whose_segment_went_away_commits_again(
    tmp_path: Path,
) -> None:
    """B builds on A's record in flight; A's commit fails (cancelled). While B still waits
    for its data, other commits seal the segment at A's cancelled record and roll over twice,
    so A's and B's segment is deleted. B then finds A cancelled and commits again (not
    TopicNotFound for a folder that exists), once; nothing of A."""
    _created(tmp_path, "f")
    in_a, go_a, in_b, go_b = (threading.Event() for _ in range(4))
    errors: dict[str, BaseException] = {}

    def commit(name: str, before_link: Any) -> None:
        try:
            _store(tmp_path, "f").commit(lambda s: s.items.append(name), before_link=before_link)
        except BaseException as e:  # checked below
            errors[name] = e

    def fail_a() -> None:
        in_a.set()
        assert go_a.wait(30)
        raise OSError(5, "injected: the data's fsync failed")

    def wait_b() -> None:
        in_b.set()
        assert go_b.wait(30)

    a = threading.Thread(target=commit, args=("A", fail_a))
    a.start()
    assert in_a.wait(30)
    b = threading.Thread(target=commit, args=("B", wait_b))
    b.start()
    assert in_b.wait(30)  # B's record follows A's
    go_a.set()
    a.join(30)
    assert "injected" in str(errors.pop("A"))
    # Large states: a segment holds a few records (4 times its first), so these roll over.
    c = _store(tmp_path, "f")
    big = "x" * 200_000
    folder = tmp_path / "f"
    first = sorted(p.name for p in folder.glob("*.journal"))[0]
    while (folder / first).exists():
        c.commit(lambda s: s.items.append(big))
        c.commit(lambda s: s.items.remove(big))
    go_b.set()
    b.join(60)
    assert not b.is_alive() and not errors, errors
    items = _store(tmp_path, "f").latest().items
    assert items == ["a", "B"]


# A writer process that commits "<name>-<i>" for i = 0, 1, ... and prints "acked i" once
# each commit returned, until killed.
LOOPER = textwrap.dedent(
    """
    import sys
    from filepulsar.storage import open_blob_store
    from filepulsar.storage.versioned import VersionedStore, journal
    from tests.test_journal import _Items

    root, folder, name = sys.argv[1:4]
    vs = VersionedStore(open_blob_store(root), folder, _Items.decode, what=folder)
    print("ready", flush=True)
    i = 0
    while True:
        vs.commit(lambda s: s.items.append(f"{name}-{i}"))
        print("acked", i, flush=True)
        i += 1
    """
)


def test_writers_killed_at_random_lose_no_acknowledged_commit(tmp_path: Path) -> None:
    """Three writer processes commit to one folder; the test SIGKILLs one at a random moment
    and starts another in its place, six times. Every commit acknowledged to a writer is
    in the final state exactly once, each writer's commits in its order; of a killed
    writer's unacknowledged commits at most its last may be there (it was committed when the
    writer died), and nothing else."""
    _store(tmp_path, "f").create(_Items([]))
    rng = random.Random(7)
    acked: dict[str, int] = {}
    live: dict[str, tuple[subprocess.Popen, threading.Thread]] = {}
    moved = threading.Condition()

    def start(name: str) -> None:
        p = subprocess.Popen(
            [sys.executable, "-c", LOOPER, str(tmp_path), "f", name],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "ready"

        def read() -> None:
            assert p.stdout is not None
            for line in p.stdout:
                # (A writer SIGKILLed while printing leaves a cut last line: not a report.)
                if line.startswith("acked ") and line.endswith("\n"):
                    with moved:
                        acked[name] = int(line.split()[1])
                        moved.notify_all()
            with moved:  # the writer is gone
                moved.notify_all()

        t = threading.Thread(target=read)
        t.start()
        live[name] = (p, t)

    for k in range(3):
        start(f"w{k}")
    names = 3
    for _ in range(6):
        # Let the writers commit a little (each is at least a few commits in), then kill one.
        victim = rng.choice(sorted(live))
        target = acked.get(victim, -1) + 1 + rng.randrange(20)
        p, t = live[victim]

        def progressed(victim: str = victim, target: int = target, p: Any = p) -> bool:
            return acked.get(victim, -1) >= target or p.poll() is not None

        with moved:
            moved.wait_for(progressed, 60)
        assert p.poll() is None, "a writer stopped on its own"
        assert acked.get(victim, -1) >= target, "a writer made no progress for 60 s"
        live.pop(victim)
        p.send_signal(signal.SIGKILL)
        p.wait()
        t.join()
        start(f"w{names}")
        names += 1
    for p, t in live.values():
        p.send_signal(signal.SIGKILL)
        p.wait()
        t.join()
    items = _store(tmp_path, "f").latest().items
    assert len(items) == len(set(items)), "a commit is there twice"
    for k in range(names):
        mine = [int(x.split("-")[1]) for x in items if x.split("-")[0] == f"w{k}"]
        assert mine == list(range(len(mine))), f"w{k}'s commits out of order or with a gap"
        last = acked.get(f"w{k}", -1)
        assert last + 1 <= len(mine) <= last + 2, f"w{k}: acked {last + 1}, found {len(mine)}"
    _store(tmp_path, "f").commit(lambda s: s.items.append("after"))
    assert _store(tmp_path, "f").latest().items == [*items, "after"]


def test_a_child_forked_without_pythons_hooks_takes_no_lock_its_parent_holds(
    tmp_path: Path,
) -> None:
    """A child forked by C code (a library's ``fork()``: no ``os.register_at_fork`` hook runs)
    shares its parent's open folder descriptor, and so the parent's flock on it. Its own lock
    attempt must open the folder anew (its process id is not the one that opened the kept
    descriptor) and find the parent holding the lock, never write under the parent's."""
    import ctypes
    import time

    folder = tmp_path / "f"
    folder.mkdir()
    j = journal.Journal(str(folder), lambda key: None, "hookless")
    # PyDLL: fork with the GIL held, as C code called from Python does. CDLL lets the GIL go
    # for the call, and a child forked while another thread of this process held it (moto's
    # server, a reader's idle timer) waited for it forever: the test hung 1 run in 2 on a
    # loaded host (4 children of 100 in a loop beside one busy thread; none with PyDLL).
    libc = ctypes.PyDLL(None, use_errno=True)
    with j.locked(1_000):
        read, write = os.pipe()
        pid = libc.fork()
        assert pid >= 0, os.strerror(ctypes.get_errno())
        if pid == 0:  # the child: only this thread runs here; report and leave at once
            try:
                os.write(write, b"1" if j._take_lock() is not None else b"0")
            finally:
                os._exit(0)
        os.close(write)
        deadline = time.monotonic() + 60
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise AssertionError("the hookless child hung")
            time.sleep(0.01)  # (a child's exit has no event to wait on here)
        took = os.read(read, 8)
        os.close(read)
    j.close()
    assert took == b"0", "the child took the folder lock its parent holds"
