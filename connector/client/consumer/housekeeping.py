"""The client consumer's housekeeping thread (:class:`Housekeeping`): one daemon thread that,
every round, renews leases and writes grouped acknowledgements that are due (without the
consumer's lock), then does the rest under it (ack-timeout ticks, dropping what an inactive
Failover consumer queued, re-listing a pattern's topics). What a round does is given as
callables: this module knows nothing of the consumer's state.
"""

from __future__ import annotations

import logging
import threading
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
    ) -> None:
        self._name = name
        self._interval = max(interval_s, 0.02)
        self._lock = lock
        self._due_in_ms = due_in_ms
        self._unlocked = unlocked
        self._locked = locked
        self._closed = closed
        self._stop = threading.Event()
        # Wakes the thread: closing, or a group of acknowledgements started.
        self._wake = threading.Event()
        self.thread = threading.Thread(
            target=self._run, name=f"filepulsar-consumer-{name}", daemon=True
        )

    def start(self) -> None:
        self.thread.start()

    def wake(self) -> None:
        """Start a round now (a group of acknowledgements was started)."""
        self._wake.set()

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
