"""Grouped acknowledgements: Pulsar's ack grouping tracker, owned by the client consumer.

Pulsar's clients do not send each acknowledgement to the broker as it is made: they group
them and send a group every ``ackGroupingTimeMs`` (100 ms) or once ``ackGroupingMaxSize``
(1,000) are pending (C++ ``ConsumerConfiguration::setAckGroupingTimeMs`` /
``setAckGroupingMaxSize``, Java ``acknowledgmentGroupTime`` / ``maxAcknowledgmentGroupSize``).
Here an acknowledgement is a durable, contended commit of the subscription's state, so a
group saves a commit per acknowledgement. The recipe, for
:class:`~filepulsar.connector.client.consumer.Consumer`, which owns one :class:`AckGrouper`:

1. :meth:`AckGrouper.add` buffers a partition's acknowledgements (the ``(position,
   batch_index, batch_size)`` items
   :meth:`filepulsar.storage.subscription.SubscriptionConsumer.acknowledge` takes). The consumer
   forgets the messages locally at once, so its ack timeout and redelivery never bring them back;
   :meth:`AckGrouper.holds` lets its receiver queue drop an entry storage hands out again before the
   acknowledgement is written.
2. A partition's run is written in ONE ``acknowledge(items)`` call when it holds ``max_size``
   acknowledgements (in the acknowledging thread, as Pulsar's clients do) or its oldest is
   ``time_ms`` old (:meth:`AckGrouper.flush_due`: the consumer's housekeeping thread, woken
   by ``on_pending`` when a group starts, and the consumer's own calls).
3. :meth:`AckGrouper.flush` writes everything pending now (or one partition's run): the
   consumer calls it before whatever moves or reads back the cursor (a cumulative
   acknowledgement, ``seek``, ``redeliver_unacknowledged_messages``, a negative
   acknowledgement of a message still pending here, ``unsubscribe``) and
   :meth:`AckGrouper.close` on ``close()``, which raises if the writing fails.
4. A background write that fails keeps its run (tried again ``time_ms`` later), is logged
   (as the C++ client logs failed grouped acknowledgements) and is raised once by the next
   :meth:`AckGrouper.raise_failure` (the consumer's next acknowledgement).

What a crash costs: acknowledgements not yet written die with the process, and their
messages are delivered again (at-least-once: a message is never lost), as in Pulsar. A group
time of 0 disables grouping: every ``add`` is written before it returns.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from filepulsar.storage.errors import BlobStoreError, FilePulsarError, InvalidConfiguration
from filepulsar.storage.ledger import Position

log = logging.getLogger("filepulsar.connector.client.consumer")  # the Consumer's logger

#: Pulsar's default group time (C++ ``ackGroupingTimeMs``, Java ``acknowledgmentGroupTime``).
DEFAULT_ACK_GROUPING_TIME_MS = 100
#: Pulsar's default group size (C++ ``ackGroupingMaxSize``).
DEFAULT_ACK_GROUPING_MAX_SIZE = 1000

#: One acknowledgement: ``(position, batch_index, batch_size)``, batch index -1 for a whole
#: entry (:meth:`filepulsar.storage.subscription.SubscriptionConsumer.acknowledge`'s items).
AckItem = tuple[Position, int, int]


class AckSink(Protocol):
    """Where a partition's acknowledgements are written (a ``SubscriptionConsumer``)."""

    def acknowledge(self, items: Iterable[AckItem]) -> None:
        """Write ``items`` durably, in one commit."""
        ...


@dataclass(frozen=True)
class AckGrouping:
    """How acknowledgements are grouped (Pulsar's two settings).

    Parameters
    ----------
    time_ms
        A group is written when its oldest acknowledgement is this old; 0 (or less) writes
        every acknowledgement before ``acknowledge`` returns (Pulsar: no grouping).
    max_size
        A partition's group is written when it holds this many acknowledgements; 0 (or
        less): no count limit, as in Pulsar's C++ client.

    Raises
    ------
    InvalidConfiguration
        If either is not an int.
    """

    time_ms: int = DEFAULT_ACK_GROUPING_TIME_MS
    max_size: int = DEFAULT_ACK_GROUPING_MAX_SIZE

    def __post_init__(self) -> None:
        for name in ("time_ms", "max_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise InvalidConfiguration(f"ack grouping {name} must be an int, got {v!r}")

    @property
    def enabled(self) -> bool:
        """Whether acknowledgements are grouped at all."""
        return self.time_ms > 0


class _Run:
    """One partition's pending acknowledgements."""

    __slots__ = ("first_ms", "items", "whole")

    def __init__(self, first_ms: int) -> None:
        self.first_ms = first_ms  # clock ms of the oldest (of the last failure, after one)
        self.items: list[AckItem] = []
        self.whole: set[tuple[int, int]] = set()  # entries acknowledged whole

    def extend(self, items: list[AckItem]) -> None:
        self.items.extend(items)
        self.whole.update(
            (p.ledger_id, p.entry_id) for p, idx, size in items if idx < 0 or size <= 1
        )


class AckGrouper:
    """Pending acknowledgements per partition, written as one commit per group.

    Thread-safe: ``add`` and ``flush`` run in the application's threads (under the
    consumer's lock), ``flush_due`` also in the consumer's housekeeping thread (without it).
    Writes are serialised by a lock of their own, so a ``flush`` returns only after a write
    another thread started has ended.

    Parameters
    ----------
    policy
        The group time and size.
    clock
        Wall-clock ms (the consumer's clock: a ManualClock in tests moves the group time).
    name
        Names the consumer in log lines and errors.
    on_pending
        Called (without the grouper's locks) when a partition's group starts, so a timer
        that sleeps can wake up before the group is due.
    """

    def __init__(
        self,
        policy: AckGrouping,
        *,
        clock: Callable[[], int],
        name: str,
        on_pending: Callable[[], None] | None = None,
    ) -> None:
        self.policy = policy
        self._clock = clock
        self._name = name
        self._on_pending = on_pending
        self._lock = threading.Lock()  # the runs (never held while writing)
        self._writing = threading.Lock()  # one write at a time
        self._runs: dict[AckSink, _Run] = {}
        self._in_flight: dict[AckSink, set[tuple[int, int]]] = {}
        self._failure: BaseException | None = None
        self._failing = False  # a streak of failed background writes (logged once)
        self._closed = False

    # ------------------------------------------------------------------ adding
    def add(self, sink: AckSink, items: list[AckItem]) -> None:
        """Acknowledge ``items`` on ``sink``: buffered, or written now when grouping is off or
        the run reaches ``max_size`` (or the oldest pending run is due).

        Raises
        ------
        BlobStoreError
            If a write made here fails (the run stays pending; its cause is the sink's
            error); with grouping off, what ``sink.acknowledge`` raises.
        """
        if not items:
            return
        if not self.policy.enabled:
            sink.acknowledge(items)
            return
        now = self._clock()
        started = False
        with self._lock:
            run = self._runs.get(sink)
            if run is None:
                run = self._runs[sink] = _Run(now)
                started = True
            run.extend(items)
            full = 0 < self.policy.max_size <= len(run.items)
        if full:
            self._write([sink], raising=True)
        elif self._due(now):
            self.flush_due()
        if started and self._on_pending is not None:
            self._on_pending()

    def held(self, sink: AckSink, positions: Iterable[tuple[int, int]]) -> set[tuple[int, int]]:
        """Those of ``positions`` whose whole entry is acknowledged here and not yet written
        (or being written)."""
        with self._lock:
            run = self._runs.get(sink)
            flying = self._in_flight.get(sink)
            if run is None and flying is None:
                return set()
            return {
                p
                for p in positions
                if (run is not None and p in run.whole) or (flying is not None and p in flying)
            }

    def pending(self, sink: AckSink | None = None) -> int:
        """Acknowledgements not yet written (of ``sink``, or of every partition)."""
        with self._lock:
            if sink is not None:
                run = self._runs.get(sink)
                return len(run.items) if run is not None else 0
            return sum(len(r.items) for r in self._runs.values())

    # ------------------------------------------------------------------ writing
    def _due(self, now: int) -> bool:
        with self._lock:
            return any(now - r.first_ms >= self.policy.time_ms for r in self._runs.values())

    def due_in_ms(self) -> int | None:
        """Ms until the oldest pending run is due (<= 0: due now); None if nothing is pending."""
        with self._lock:
            if not self._runs:
                return None
            first = min(r.first_ms for r in self._runs.values())
        return first + self.policy.time_ms - self._clock()

    def flush_due(self) -> None:
        """Write every run whose oldest acknowledgement is ``time_ms`` old. A failure is
        logged and kept for :meth:`raise_failure`; its run stays pending."""
        if not self.policy.enabled or self._closed:
            return
        now = self._clock()
        with self._lock:
            due = [s for s, r in self._runs.items() if now - r.first_ms >= self.policy.time_ms]
        if due:
            self._write(due, raising=False)

    def flush(self, sink: AckSink | None = None) -> None:
        """Write what is pending (``sink``'s run, or every run) before returning, after any
        write in progress.

        Raises
        ------
        BlobStoreError
            If a write fails (its cause is the sink's error): the rest stays pending.
        """
        while True:
            with self._lock:
                sinks = list(self._runs) if sink is None else [sink] if sink in self._runs else []
                flying = bool(self._in_flight) if sink is None else sink in self._in_flight
            if sinks:
                self._write(sinks, raising=True)
                return
            if not flying:
                return
            with self._writing:  # another thread's write ends first; if it failed, its
                pass  # run is back, and written here

    def _write(self, sinks: list[AckSink], *, raising: bool) -> None:
        with self._writing:
            for sink in sinks:
                with self._lock:
                    run = self._runs.pop(sink, None)
                    if run is None:
                        continue  # written by another thread meanwhile
                    self._in_flight[sink] = run.whole
                try:
                    sink.acknowledge(run.items)
                except (FilePulsarError, OSError) as e:
                    self._put_back(sink, run)
                    err = BlobStoreError(
                        f"consumer {self._name}: writing {len(run.items)} grouped "
                        f"acknowledgements on {getattr(sink, 'topic', sink)} failed: {e}"
                    )
                    if raising:
                        raise err from e
                    err.__cause__ = e
                    self._failed(sink, run, err)
                    continue
                finally:
                    with self._lock:
                        self._in_flight.pop(sink, None)
                if self._failing:
                    self._failing = False
                    log.info("consumer %s: grouped acknowledgements written again", self._name)

    def _put_back(self, sink: AckSink, run: _Run) -> None:
        """Return a run whose write failed, ahead of what was added meanwhile; it is due again
        ``time_ms`` from now."""
        with self._lock:
            newer = self._runs.get(sink)
            if newer is not None:
                run.extend(newer.items)
            run.first_ms = self._clock()
            self._runs[sink] = run

    def _failed(self, sink: AckSink, run: _Run, e: BaseException) -> None:
        self._failure = e
        if not self._failing:
            self._failing = True
            log.warning(
                "%s (kept, tried again every %d ms; a crash meanwhile redelivers those messages)",
                e,
                self.policy.time_ms,
            )

    def raise_failure(self) -> None:
        """Raise (once) the error of a background write that failed since the last call.

        Raises
        ------
        BlobStoreError
            That error; its acknowledgements are still pending and tried again.
        """
        e, self._failure = self._failure, None
        if e is not None:
            raise e

    def discard(self, sink: AckSink) -> int:
        """Drop ``sink``'s pending run (its partition is gone); return how many were dropped."""
        with self._lock:
            run = self._runs.pop(sink, None)
        return len(run.items) if run is not None else 0

    def close(self) -> None:
        """Write everything pending; later calls of :meth:`flush_due` do nothing.

        Raises
        ------
        BlobStoreError
            If a write fails: what is left pending is dropped (its messages are delivered
            again), and the caller must say so.
        """
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._closed = True
            with self._lock:
                self._runs.clear()
