"""The client consumer's housekeeping (:class:`Housekeeping`): rounds that renew leases and
write grouped acknowledgements that are due (without the consumer's lock), then do the rest
under it (ack-timeout ticks, dropping what an inactive Failover consumer queued, re-listing a
pattern's topics). A round runs on a daemon thread of the consumer's own, or, for a consumer
served by the process's push dispatcher (:mod:`.push`), on that dispatcher's housekeeping
thread (:meth:`Housekeeping.round_if_due`): no thread per consumer. What a round does is given as
callables: this module knows nothing of the consumer's state.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from filepulsar.storage.errors import FilePulsarError

log = logging.getLogger("filepulsar.connector.client.consumer")  # the Consumer's logger, as before


class Housekeeping:
    """A thread that wakes every ``interval_s`` (or sooner, when a group of acknowledgements
    falls due or :meth:`wake` is called) until :meth:`stop`.

    Parameters
    ----------
    name
        The consumer's name (the thread's name and the log's).
    interval_s
        The longest wait between two rounds (at least 20 ms).
    lock
        The consumer's lock, taken (waiting at most ``interval_s``) for ``locked``.
    due_in_ms
        Ms until the next group of acknowledgements is due (None: none pending).
    unlocked
        Run first every round, without the lock: lease renewal, acknowledgements due. Each
        handles its own errors (a lease that lapses while the application holds the lock
        hands everything the consumer holds to others).
    locked
        Run under the lock; a storage error is logged and the next round tries again.
    closed
        Whether the consumer is closed (the thread then ends).
    driven
        None: rounds run on a thread of its own (:meth:`start`). Else the rounds are driven
        by another thread calling :meth:`round_if_due` (the push dispatcher's), and
        ``driven`` is called (from any thread) when a round should run now.
    """

    def __init__(
        self,
        *,
        name: str,
        interval_s: float,
        lock: threading.RLock,
        due_in_ms: Callable[[], int | None],
        unlocked: Callable[[], None],
        locked: Callable[[], None],
        closed: Callable[[], bool],
        driven: Callable[[], None] | None = None,
    ) -> None:
        self._name = name
        self._interval = max(interval_s, 0.02)
        self._lock = lock
        self._due_in_ms = due_in_ms
        self._unlocked = unlocked
        self._locked = locked
        self._closed = closed
        self._driven = driven
        self._next_round = 0.0  # driven: when the next round is due (time.monotonic)
        self._stop = threading.Event()
        # Wakes the thread: closing, or a group of acknowledgements started.
        self._wake = threading.Event()
        self.thread = threading.Thread(
            target=self._run, name=f"filepulsar-consumer-{name}", daemon=True
        )

    def start(self) -> None:
        if self._driven is None:
            self.thread.start()

    def wake(self) -> None:
        """Start a round now."""
        self._wake.set()
        if self._driven is not None:
            self._driven()

    def due_changed(self) -> None:
        """A group of acknowledgements started: the next round may be due sooner. A thread
        of its own is woken (it runs a round and waits again until the next is due); a
        driven one only has its driver look again at when its rounds are due
        (:meth:`round_if_due` runs one once the group is due, not at once: a round renews
        leases and takes the consumer's lock, and groups start many times a second on a
        consumer of many partitions)."""
        if self._driven is None:
            self._wake.set()
        else:
            self._driven()

    def round_if_due(self) -> float:
        """Driven: run a round if one is due (woken, the interval passed, or a group of
        acknowledgements is due); seconds until the next one is due. The consumer's lock is
        only tried, never waited for (the thread serves every consumer of the process, and a
        wait for each busy one adds up on a saturated host): a busy consumer's locked work
        waits for a later round, 20 ms on."""
        now = time.monotonic()
        due = self._due_in_ms()
        if not self._wake.is_set() and now < self._next_round and (due is None or due > 0):
            return self._until(now, due)
        self._wake.clear()
        if self._stop.is_set() or self._closed():
            return self._interval
        self._next_round = now + self._interval
        self._unlocked()
        if self._lock.acquire(blocking=False):
            try:
                if not self._closed():
                    self._locked()
            except (FilePulsarError, OSError) as e:
                log.warning("consumer %s housekeeping failed: %s", self._name, e)
            finally:
                self._lock.release()
        else:
            self._next_round = now + 0.02  # busy: soon again
        return self._until(time.monotonic(), self._due_in_ms())

    def _until(self, now: float, due_ms: int | None) -> float:
        wait = self._next_round - now
        if due_ms is not None:
            wait = min(wait, max(due_ms, 1) / 1000)
        return max(wait, 0.0)

    def stop(self) -> None:
        """End the thread (it finishes a round in progress); :meth:`join` waits for it."""
        self._stop.set()
        self._wake.set()

    def join(self, timeout: float) -> None:
        if self.thread is not threading.current_thread() and self.thread.ident is not None:
            self.thread.join(timeout=timeout)

    def _run(self) -> None:
        interval = self._interval
        while True:
            wait = interval
            due = self._due_in_ms()  # a group of acknowledgements is pending
            if due is not None:
                wait = min(wait, max(due, 1) / 1000)
            self._wake.wait(wait)
            self._wake.clear()
            if self._stop.is_set() or self._closed():
                return
            self._unlocked()
            if not self._lock.acquire(timeout=interval):
                continue  # busy: the rest can wait for the next round
            try:
                if self._closed():
                    return
                self._locked()
            except (FilePulsarError, OSError) as e:
                log.warning("consumer %s housekeeping failed: %s", self._name, e)
            finally:
                self._lock.release()
