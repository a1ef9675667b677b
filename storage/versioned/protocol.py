"""The commit protocol's vocabulary and tunables (FORMAT.md, "Commit protocol").

Shared by :class:`~filepulsar.storage.versioned.VersionedStore`, its two engines and the change
functions that commit through it: :class:`VersionedState` (what a committed state provides),
:class:`Engine` (what the store asks of an engine), :class:`Abort` (a change function giving
up without writing), the protocol's constants (versions kept, GC cadence and grace, turns,
timeouts) and :class:`FlockWaiter`, the bounded ``flock`` wait of the local commit queue and
of a journal's folder lock.
"""

from __future__ import annotations

import collections
import fcntl
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from filepulsar.storage.forks import in_forked_child

log = logging.getLogger(__name__)

KEEP_VERSIONS = 64
GC_EVERY = 32
#: How long a commit keeps retrying lost races before it fails (Pulsar's producer send timeout
#: is 30 s by default; a commit that cannot win in that time reports CommitConflict).
COMMIT_TIMEOUT_MS = 30_000
#: Garbage collection never deletes a version younger than this (by the ``updated`` time of
#: the newest version it deletes, against the collecting writer's clock), so a writer paused
#: for less than it between two store calls always finds what settles its commit, and a
#: writer whose cached state is older than half of it re-reads the newest first. Four times
#: the commit timeout; clocks of writers must agree within a quarter of it (30 s).
GC_GRACE_MS = 120_000
#: Fairness: a writer that lost this many races in a row in one commit asks for a turn.
TURN_AFTER_LOSSES = 3
#: How long others leave a turn's slot to its holder (measured by each of them from when it
#: first saw the turn), so a holder that died delays the others once, by at most this.
TURN_MS = 2_000
#: How long after seeing contention (a lost race, a turn) a writer checks for turns before
#: each put; outside it a commit costs no more than 1 put + 1 GET.
CONTENDED_MS = 10_000
#: Longest wait in the local commit queue (:meth:`BlobEngine.local_queue
#: <filepulsar.storage.versioned.blob.BlobEngine.local_queue>`), ms.
LOCAL_QUEUE_WAIT_MS = 250

T = TypeVar("T")


class Abort(Exception):
    """Raised by a commit's change function to give up without writing; ``value`` is returned."""

    def __init__(self, value: Any = None):
        super().__init__("commit aborted")
        self.value = value


class NoBase(Exception):
    """A delta record folded onto a state that is not its base (another version, or another
    commit of that version): the reader folds from the last full record instead."""


class VersionedState(Protocol):
    """What a state committed by :class:`VersionedStore` provides."""

    version: int
    updated_ms: int
    commit_id: str
    prev_commit_id: str

    def encode(self) -> bytes: ...


S = TypeVar("S", bound=VersionedState)


@dataclass(slots=True)
class CommitRequest(Generic[S, T]):
    """One call of ``VersionedStore.commit``, as its engine receives it (the parameters are
    described there). Read-only by convention: nothing changes one (not ``frozen``: a frozen
    dataclass's constructor sets each field through ``object.__setattr__``, ~2 us against
    ~0.2 us, and every commit makes one)."""

    change: Callable[[S], T]
    before_write: Callable[[S], None] | None
    before_link: Callable[[], None] | None
    timeout_ms: int
    idempotent: bool
    durable_with: Sequence[tuple[str, int]]


class Engine(Protocol[S]):
    """How a :class:`~filepulsar.storage.versioned.VersionedStore` keeps its versions: as files
    written put-if-absent (:class:`~filepulsar.storage.versioned.blob.BlobEngine`, any store)
    or as records of a journal (:class:`~filepulsar.storage.versioned.journaled.JournalEngine`,
    a local disk). The store stamps and caches states; an engine stores, finds and commits
    them (each method is the store's method of the same name, without the cached shortcut)."""

    def create(self, initial: S) -> bool:
        """Write ``initial`` (stamped as version 0) if no version exists; whether it did."""
        ...

    def exists(self) -> bool:
        """Whether any version is stored."""
        ...

    def stored(self) -> Iterator[tuple[str, bytes]]:
        """Every stored version's bytes with where they are, oldest first."""
        ...

    def latest(self, *, strict: bool, hint: int, drain: bool = True) -> S:
        """The newest committed state, read now (see ``VersionedStore.latest``)."""
        ...

    def commit(self, req: CommitRequest[S, T]) -> tuple[S, T]:
        """Apply ``req.change`` to the newest state and commit it (``VersionedStore.commit``)."""
        ...


#: A waiting thread ends after this long without a lock to wait for (seconds).
WAITER_IDLE_S = 2.0


class _WaiterPool:
    """Threads that run blocking lock waits, kept between waits (starting a thread costs
    ~0.16 ms of CPU, and a commit behind another writer waits once per commit); a thread
    ends after :data:`WAITER_IDLE_S` without one. Each wait gets a thread of its own at once
    (a wait may block for long: it must not queue behind another)."""

    def __init__(self) -> None:
        self.cv = threading.Condition(threading.Lock())
        self.jobs: collections.deque[Callable[[], None]] = collections.deque()
        self.idle = 0  # threads waiting for a job
        self.busy = 0  # jobs handed out and not finished

    def run(self, job: Callable[[], None]) -> None:
        with self.cv:
            self.jobs.append(job)
            self.busy += 1
            if len(self.jobs) > self.idle:
                threading.Thread(target=self._work, name="commit-queue", daemon=True).start()
            else:
                self.cv.notify()

    def _work(self) -> None:
        cv = self.cv
        with cv:
            while True:
                self.idle += 1
                got = cv.wait_for(lambda: self.jobs, WAITER_IDLE_S)
                self.idle -= 1
                if not got:
                    return
                job = self.jobs.popleft()
                cv.release()
                try:
                    job()
                except Exception:  # (a wait reports its own outcome; the thread goes on)
                    log.exception("lock wait failed")
                finally:
                    cv.acquire()
                    self.busy -= 1
                    if not self.busy:
                        cv.notify_all()  # (for wait_idle)

    def wait_idle(self, timeout_s: float) -> bool:
        """Whether every wait handed out has ended (waiting at most ``timeout_s``; tests)."""
        with self.cv:
            return self.cv.wait_for(lambda: self.busy == 0, timeout_s)


_waiters = _WaiterPool()


def _forget_waiters() -> None:
    global _waiters
    _waiters = _WaiterPool()  # a forked child has none of its parent's threads


in_forked_child(_forget_waiters)


class FlockWaiter:
    """Takes an exclusive ``flock`` of ``fd`` on a waiting thread, so that a caller can give
    up after a time. A caller that gave up leaves ``fd`` to the thread, which then unlocks
    (once it got the lock) and closes it. The caller is woken through a bare lock (the
    waiting thread's last step before it waits for its next job), not an ``Event``: a commit
    behind another writer is woken once per commit, and the hand-off is on the path from
    one writer's commit to the next's."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._mutex = threading.Lock()
        self._woken = threading.Lock()
        self._woken.acquire()  # released once the wait is decided
        self._held: bool | None = None  # whether the lock was taken; None: not yet known
        self._abandoned = False
        _waiters.run(self._run)

    def _run(self) -> None:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            got = True
        except OSError:
            got = False
        with self._mutex:
            abandoned = self._abandoned
            if not abandoned:
                self._held = got
        if not abandoned:
            self._woken.release()  # (after the mutex: the caller takes it next)
            return
        if got:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)

    def wait(self, timeout_s: float) -> bool:
        """Whether the lock is held by the caller now; False: given up (or no lock)."""
        self._woken.acquire(True, max(timeout_s, 0.0))
        with self._mutex:
            if self._held is not None:
                if not self._held:
                    os.close(self.fd)
                return self._held
            self._abandoned = True
            return False
