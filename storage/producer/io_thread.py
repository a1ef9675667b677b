"""The producers' I/O thread: one per process, serving every producer's send queue.

Pulsar's client runs one I/O thread (``io_threads=1``) for all its producers; here one
thread per process does what each producer's own thread did before (a thread per producer
woke twice per message with cold caches, and a gateway with 30 producers had 30 of them):

1. **Work.** A queue that seals an entry (by size, by ``flush``, by its timer) calls
   :meth:`ProducerIo.work`; the thread, once awake, takes what every such queue has sealed
   (:meth:`SendQueue.take_ready
   <filepulsar.storage.producer.send_queue.SendQueue.take_ready>`, holding its ledgers) and
   stores it, a group commit per partition, all partitions at once: up to
   :data:`SYNC_HELPERS` helper threads run stores beside its own, so the syncs of different
   partitions (each an entry's ``fdatasync``, then its manifest record's) overlap instead of
   adding up (a pass over N partitions cost N commits of wall time). Each partition's store
   is the one commit it was (its entries durable before the manifest record naming them).
   Once every store ended the pass lets go of every queue's ledgers, each write left to
   answer (:meth:`ReadyWrite.park
   <filepulsar.storage.producer.send_queue.ReadyWrite.park>`), and answers the queues'
   callbacks, in order, itself; a callback (or a thread it waits for) that needs another
   queue of the pass (a ``flush()``, a ``send()``, a bulk write) takes that queue's ledgers
   and answers its write first, as if the pass had written it later.
   A queue whose ledgers another thread holds (a ``send()`` writing its own message, a
   bulk write) is skipped; that thread hands the queue back when it lets go of them.
2. **Timers.** A queue whose first batch opens calls :meth:`ProducerIo.timer` with the time
   that batch is due (``batching_max_publish_delay_ms``); the thread wakes at the earliest
   due time of all queues and seals, in every queue due then, what is due
   (:meth:`SendQueue.seal_due`), then writes it in the same pass.
3. **Leases.** Every ``renew_s`` a queue's partitions need their leases renewed when no
   commit renewed them; the thread renews them after a pass's writes, most overdue queue
   first, and leaves the rest to the next pass once entries wait or a timer is due.
4. **Isolation.** A write, renewal or seal that fails stops its own queue only
   (:meth:`SendQueue.fail`); the others go on. A user callback runs on this thread, as in
   pulsar-client: one that blocks holds back every producer of the process. A blocking call
   on a producer in a callback (``flush()``, ``send()``, ``send_async`` on a full queue with
   ``block_if_queue_full``, a bulk write) writes that producer's entries right there, as no
   other thread would while this one waits; on the producer whose write runs the callback
   it raises ``FilePulsarError`` (it would wait for itself), and ``close()`` there returns at
   once, its producer closed once the write in hand ends.

The thread starts with the first queue registered and ends once none is left (a producer
never closed keeps it: :meth:`ProducerIo.serving` names those it serves). A child
forked from this process (:func:`filepulsar.storage.forks.in_forked_child`) forgets the
parent's instance and its thread, which it does not have: its own producers get a fresh
one. Producers it inherited are not served (the parent's thread writes their queues): they
raise ``FilePulsarError`` saying so (:meth:`SendQueue.inherited
<filepulsar.storage.producer.send_queue.SendQueue.inherited>`).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable
from queue import SimpleQueue
from typing import TYPE_CHECKING, TypeVar

from filepulsar.dispatch.clock import SYSTEM
from filepulsar.storage.forks import in_forked_child

if TYPE_CHECKING:
    from filepulsar.storage.producer.send_queue import ReadyWrite, SendQueue

log = logging.getLogger(__name__)

#: Helper threads of the I/O thread: a pass that writes to N partitions runs up to this many
#: of their stores (write, sync, commit) beside its own, so their syncs overlap.
SYNC_HELPERS = 4

#: The helper threads' name (they run stores only, never a callback).
HELPER_THREAD = "filepulsar-store-helper"

T = TypeVar("T")

__all__ = ["ProducerIo", "shared_io"]


class ProducerIo:
    """One I/O thread, its helper threads (they run stores of a pass beside it, nothing
    else) and the send queues it serves (see the module docstring).

    Lock order: a queue's lock, then this object's. The thread never holds this lock while
    it calls into a queue.
    """

    def __init__(self, name: str = "filepulsar-producer-io") -> None:
        self._name = name
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._queues: set[SendQueue] = set()
        #: Queues with sealed entries to write, in the order they asked (dict as ordered set).
        self._ready: dict[SendQueue, None] = {}
        #: Each timed queue's earliest due time (system monotonic seconds).
        self._timers: dict[SendQueue, float] = {}
        #: Earliest time a queue's lease may need renewing (early is harmless: recomputed).
        self._renew_at = float("inf")
        #: When the sleeping thread wakes by itself (None: it is not sleeping).
        self._wake_at: float | None = None
        self._thread: threading.Thread | None = None
        #: The thread's id (None while none runs).
        self.ident: int | None = None
        #: Stores handed to the helper threads, and how many helpers run (they never end:
        #: daemons, idle between passes; a forked child makes its own instance).
        self._jobs: SimpleQueue[tuple[list[Callable[[], None]], threading.Semaphore]] = (
            SimpleQueue()
        )
        self._helpers = 0

    # ------------------------------------------------------------------ queues' side
    def register(self, queue: SendQueue) -> None:
        """Serve ``queue`` from now on (its leases due ``renew_s`` from now); start the
        thread if none runs."""
        with self._lock:
            self._queues.add(queue)
            self._renew_at = min(self._renew_at, queue.next_renewal())
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
                self.ident = self._thread.ident
            elif self._wake_at is not None:
                self._cond.notify()

    def unregister(self, queue: SendQueue) -> None:
        """Serve ``queue`` no more (the write in hand, if any, still finishes)."""
        with self._lock:
            self._queues.discard(queue)
            self._ready.pop(queue, None)
            self._timers.pop(queue, None)
            if not self._queues and self._wake_at is not None:
                self._cond.notify()  # the thread ends

    def serving(self) -> list[str]:
        """The producers the thread serves now, each as ``'name' on topic`` (a snapshot, for
        diagnostics): a producer never closed, even a fenced or failed one, stays here, and
        the thread with it."""
        with self._lock:
            configs = [q.config for q in self._queues]
        return sorted(f"{c.producer_name!r} on {c.topic}" for c in configs)

    def work(self, queue: SendQueue) -> None:
        """``queue`` has sealed entries to write (called under its lock)."""
        with self._lock:
            if queue not in self._queues:
                return
            self._ready[queue] = None
            if self._wake_at is not None:
                self._cond.notify()

    def timer(self, queue: SendQueue, due: float) -> None:
        """``queue`` has an open batch due at ``due`` (monotonic s) and no earlier timer
        (called under its lock). The thread is woken only if it would sleep past ``due``."""
        with self._lock:
            if queue not in self._queues:
                return
            self._timers[queue] = due
            if self._wake_at is not None and due < self._wake_at:
                self._cond.notify()

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        try:
            while self._pass():
                pass
        except BaseException as e:  # the thread ends: no pending sender may wait forever
            log.exception("producer I/O thread failed")
            with self._lock:
                queues = list(self._queues)
                self._queues.clear()
                self._ready.clear()
                self._timers.clear()
                self._thread = None
                self.ident = None
            for q in queues:
                q.fail_pending(e)

    def _pass(self) -> bool:
        """Sleep until something is due, then serve it once; False when no queue is left."""
        with self._lock:
            while True:
                if not self._queues:
                    self._thread = None
                    self.ident = None
                    return False
                now = SYSTEM.monotonic()
                due = min(self._timers.values(), default=None)
                if self._ready or (due is not None and due <= now) or self._renew_at <= now:
                    break
                wake = self._renew_at if due is None else min(due, self._renew_at)
                self._wake_at = wake
                try:
                    self._cond.wait(wake - now)
                finally:
                    self._wake_at = None
            timed = [q for q, at in self._timers.items() if at <= now]
            for q in timed:
                del self._timers[q]
            renew = self._renew_at <= now
            queues = list(self._queues) if renew else []
        for q in timed:  # seal what is due; what stays open is timed again (seal_due)
            self._guard(q, functools.partial(q.seal_due, now))
        with self._lock:
            ready = list(self._ready)
            self._ready.clear()
        if ready:
            self._write(ready)
        if renew:
            self._renew(queues)
        return True

    def _write(self, ready: list[SendQueue]) -> None:
        """Write what the ``ready`` queues have sealed: take each one's entries, run every
        lane's store (write, sync, commit) at once, up to :data:`SYNC_HELPERS` of them on
        helper threads, then answer the queues in order here."""
        writes: list[ReadyWrite] = []
        for q in ready:
            w = self._guard(q, q.take_ready)
            if w is not None:
                writes.append(w)
        if not writes:
            return
        try:
            self._overlap([job for w in writes for job in w.stores()])
        finally:
            # Every write lets go of its ledgers before any is answered: a callback (here, or
            # on a thread it waits for) that needs another queue of the pass takes its ledgers
            # and answers that queue's write first, as if the pass had written it later.
            # (Answered whatever happened: a store that never ran is answered as failed.)
            try:
                for w in writes:
                    w.park()
            finally:
                for w in writes:
                    self._guard(w.queue, w.answer)

    def _overlap(self, jobs: list[Callable[[], None]]) -> None:
        """Run ``jobs`` (none raises) at once: dealt into up to :data:`SYNC_HELPERS` + 1
        shares, one run here, the others each on a helper thread (started as needed), one
        job after another; return once all ended. Their ``fsync`` and ``fdatasync`` calls
        release the GIL, so a pass touching N partitions costs about N / (helpers + 1)
        commits of wall time, not N, and one hand-off per helper, not per partition."""
        n = min(len(jobs), SYNC_HELPERS + 1)
        if n == 1:  # (the usual pass of a quiet process: no hand-off, no switch)
            for job in jobs:
                job()
            return
        while self._helpers < n - 1:
            try:
                threading.Thread(target=self._help, name=HELPER_THREAD, daemon=True).start()
            except RuntimeError as e:  # (no thread to be had: the helpers there are do it)
                log.warning("producer I/O: could not start a helper thread (%s)", e)
                break
            self._helpers += 1
        n = min(n, self._helpers + 1)
        done = threading.Semaphore(0)
        for i in range(1, n):
            self._jobs.put((jobs[i::n], done))
        try:
            for job in jobs[0::n]:
                job()
        finally:
            for _ in range(1, n):
                done.acquire()

    def _help(self) -> None:
        """A helper thread: run the shares of stores the I/O thread hands over, for ever."""
        while True:
            share, done = self._jobs.get()
            try:
                for job in share:
                    job()
            except BaseException:  # (a store keeps its own error: this is a bug)
                log.exception("producer I/O helper: a store failed")
            finally:
                done.release()

    def _renew(self, queues: list[SendQueue]) -> None:
        """Renew the leases due, most overdue queue first; between queues, stop once entries
        wait or a timer is due (the next pass, after them, renews the rest: before, an idle
        sweep of 20 queues at 50 ms a renewal held a live producer's p99 at 782 ms)."""
        now = SYSTEM.monotonic()
        due = sorted((q for q in queues if q.next_renewal() <= now), key=lambda q: q.next_renewal())
        for i, q in enumerate(due):
            if i and self._work_due():
                break  # (writes or timers came in: the next pass, after them, renews the rest)
            self._guard(q, q.renew_due)
        with self._lock:  # (commits that renewed a lease moved its queue's renewal later)
            self._renew_at = min((q.next_renewal() for q in self._queues), default=float("inf"))

    def _work_due(self) -> bool:
        """A queue has sealed entries to write, or a timer is due."""
        with self._lock:
            if self._ready:
                return True
            due = min(self._timers.values(), default=None)
        return due is not None and due <= SYSTEM.monotonic()

    @staticmethod
    def _guard(queue: SendQueue, step: Callable[[], T]) -> T | None:
        """Run one queue's step; an unexpected error stops that queue only (None then)."""
        try:
            return step()
        except BaseException as e:
            log.exception("producer %s: I/O step failed", queue.config.producer_name)
            queue.fail_pending(e)
            return None


_SHARED: ProducerIo | None = None
_SHARED_LOCK = threading.Lock()


def shared_io() -> ProducerIo:
    """This process's producer I/O thread (created on first use)."""
    global _SHARED
    io = _SHARED
    if io is None:
        with _SHARED_LOCK:
            io = _SHARED
            if io is None:
                io = _SHARED = ProducerIo()
    return io


@in_forked_child
def _forget_after_fork() -> None:
    """A forked child has no I/O thread: its producers get a fresh :class:`ProducerIo`; those
    it inherited raise (nothing would write them)."""
    global _SHARED, _SHARED_LOCK
    if _SHARED is not None:
        # (A fork from a callback: the child's thread has the parent's I/O thread's ident,
        # and an inherited queue's checks for "on the I/O thread" must not match it.)
        _SHARED.ident = None
        for q in list(_SHARED._queues):  # (the child has one thread: nothing mutates it)
            q.inherited(os.getppid())
    _SHARED = None
    _SHARED_LOCK = threading.Lock()
