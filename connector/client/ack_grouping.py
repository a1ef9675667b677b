"""Grouped acknowledgements: Pulsar's ack grouping tracker, owned by the client consumer.

Pulsar's clients do not send each acknowledgement to the broker as it is made: they group
them and send a group every ``ackGroupingTimeMs`` (100 ms) or once ``ackGroupingMaxSize``
(1,000) are pending (C++ ``ConsumerConfiguration::setAckGroupingTimeMs`` /
``setAckGroupingMaxSize``, Java ``acknowledgmentGroupTime`` / ``maxAcknowledgmentGroupSize``).
Here an acknowledgement is a durable, contended commit of the subscription's state, so a
group saves a commit per acknowledgement. The recipe, for
:class:`~filepulsar.connector.client.consumer.Consumer`, which owns one :class:`AckGrouper`:

0. A group is one subscription partition's, per process: every consumer of that
   subscription in this process adds to it (:func:`group_key`), and any of them writes it,
   so N consumers of a subscription in one process pay one commit per group window, not N.
1. :meth:`AckGrouper.add` buffers a partition's acknowledgements (the ``(position,
   batch_index, batch_size)`` items
   :meth:`filepulsar.storage.subscription.SubscriptionConsumer.acknowledge` takes). The consumer
   forgets the messages locally at once, so its ack timeout and redelivery never bring them back;
   :meth:`AckGrouper.held` lets its receiver queue drop an entry storage hands out again before the
   acknowledgement is written.
2. A partition's run is written in ONE ``acknowledge(items)`` call when it holds ``max_size``
   acknowledgements (in the acknowledging thread, as Pulsar's clients do) or its oldest is
   ``time_ms`` old (:meth:`AckGrouper.flush_due`: the consumer's housekeeping thread, woken
   by ``on_pending`` when a group starts, and the consumer's own calls; for the consumers of
   the push dispatcher, its housekeeping thread's :class:`AckTimer` alone, with one due time
   for the process), and no sooner than
   ``1 / mark_delete_rate_limit`` seconds after the group's previous write: that is where
   this process plays the broker, which applies acknowledgements to the cursor in memory at
   once and persists the cursor at most ``managedLedgerDefaultMarkDeleteRateLimit`` times a
   second (1.0). The acknowledgements are this process's at once (step 1), so a full or due
   run waiting for the rate holds nothing back here; it is written at the next slot.
3. :meth:`AckGrouper.flush` writes everything pending now (or one partition's run): the
   consumer calls it before whatever moves or reads back the cursor (a cumulative
   acknowledgement, ``seek``, ``redeliver_unacknowledged_messages``, a negative
   acknowledgement of an entry with acknowledgements pending here (:meth:`AckGrouper.touches`),
   an ack timeout handing back a batch entry with acknowledged indexes, ``unsubscribe``) and
   :meth:`AckGrouper.close` on ``close()``, which raises if the writing fails. Both write
   the whole group, the other consumers' acknowledgements in it included.
   :meth:`AckGrouper.settle` writes a partition's group, failures kept as a background
   write's, when a lazy Key_Shared consumer is about to record what it holds for a new
   membership (``SubscriptionConsumer``'s ``before_record``): the keys moving to a newcomer
   then wait for no write of this process.
4. A background write that fails keeps its run (tried again when due again), is logged
   (as the C++ client logs failed grouped acknowledgements) and is raised once by the next
   :meth:`AckGrouper.raise_failure` (the consumer's next acknowledgement).

A normal exit without ``close()`` writes every group still pending, best effort
(:func:`_write_at_exit`: 5 s at most, failures logged). What a crash costs:
acknowledgements not yet written die with the process, and their
messages are delivered again (at-least-once: a message is never lost), as in Pulsar (whose
broker redelivers the acknowledgements its rate-limited cursor had not persisted): up to
about ``max(time_ms, 1 / mark_delete_rate_limit)`` of them (1 s by default). A group time of
0 disables grouping, and the rate with it: every ``add`` is written before it returns.
"""

from __future__ import annotations

import atexit
import logging
import math
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Protocol, cast

from filepulsar.storage.errors import BlobStoreError, FilePulsarError, InvalidConfiguration
from filepulsar.storage.forks import in_forked_child
from filepulsar.storage.ledger import Position

log = logging.getLogger("filepulsar.connector.client.consumer")  # the Consumer's logger

#: Pulsar's default group time (C++ ``ackGroupingTimeMs``, Java ``acknowledgmentGroupTime``).
DEFAULT_ACK_GROUPING_TIME_MS = 100
#: Pulsar's default group size (C++ ``ackGroupingMaxSize``).
DEFAULT_ACK_GROUPING_MAX_SIZE = 1000
#: Pulsar's default cursor persistence rate, per second (broker.conf
#: ``managedLedgerDefaultMarkDeleteRateLimit``).
DEFAULT_MARK_DELETE_RATE_LIMIT = 1.0

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
    """How acknowledgements are grouped (the client's two settings) and how often a group
    is persisted (the broker's).

    Parameters
    ----------
    time_ms
        A group is written when its oldest acknowledgement is this old; 0 (or less) writes
        every acknowledgement before ``acknowledge`` returns (Pulsar: no grouping).
    max_size
        A partition's group is written when it holds this many acknowledgements; 0 (or
        less): no count limit, as in Pulsar's C++ client.
    mark_delete_rate_limit
        Writes per second of one subscription partition's group, at most (Pulsar's broker
        setting ``managedLedgerDefaultMarkDeleteRateLimit``, 1.0; the namespace's
        ``managedLedgerMaxMarkDeleteRate``): a group due or full sooner after the previous
        write waits for ``1 / rate`` seconds to pass. 0 (or less): no limit, a group is
        written as soon as it is due or full.

    Raises
    ------
    InvalidConfiguration
        If ``time_ms`` or ``max_size`` is not an int, or the rate not a finite number.
    """

    time_ms: int = DEFAULT_ACK_GROUPING_TIME_MS
    max_size: int = DEFAULT_ACK_GROUPING_MAX_SIZE
    mark_delete_rate_limit: float = DEFAULT_MARK_DELETE_RATE_LIMIT

    def __post_init__(self) -> None:
        for name in ("time_ms", "max_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise InvalidConfiguration(f"ack grouping {name} must be an int, got {v!r}")
        r = self.mark_delete_rate_limit
        if isinstance(r, bool) or not isinstance(r, int | float) or not math.isfinite(r):
            raise InvalidConfiguration(
                f"mark_delete_rate_limit must be a finite number of writes per second, got {r!r}"
            )

    @property
    def enabled(self) -> bool:
        """Whether acknowledgements are grouped at all."""
        return self.time_ms > 0

    @property
    def write_interval_ms(self) -> int:
        """The least ms between two writes of a group (0: no rate limit)."""
        r = self.mark_delete_rate_limit
        return math.ceil(1000 / r) if r > 0 else 0


_NONE: frozenset[Position] = frozenset()


class _Run:
    """One group's pending acknowledgements: the items in the order they came, and the
    entries acknowledged whole (what :meth:`AckGrouper.held` asks about at every delivery)."""

    __slots__ = ("first_ms", "items", "whole")

    def __init__(self, first_ms: int) -> None:
        self.first_ms = first_ms  # clock ms of the oldest (of the last failure, after one)
        self.items: list[AckItem] = []
        self.whole: set[Position] = set()  # entries acknowledged whole

    def extend(self, items: list[AckItem]) -> None:
        self.items.extend(items)
        whole = self.whole
        for p, idx, size in items:
            if idx < 0 or size <= 1:
                whole.add(p)

    def touches(self, position: Position) -> bool:
        """Whether an item of the run acknowledges ``position``'s entry (whole or an index)."""
        return position in self.whole or any(p == position for p, _, _ in self.items)


class _Group:
    """The acknowledgements of one subscription partition pending in this process, shared
    by every consumer of it here (see :func:`group_key`). ``lock`` guards what every
    acknowledgement changes (``run``, ``flying``, ``sink``, ``written_ms``): a lock per
    group, so that consumer threads acknowledging on different partitions do not queue on
    one lock (ten consumers' threads on the process's one lock queued behind whichever
    lost the interpreter holding it). Taken after ``_GROUPS_LOCK`` where both are, never
    before; what reads those fields under ``_GROUPS_LOCK`` alone reads a reference or a
    length, whole. ``_GROUPS_LOCK`` guards ``users``; ``writing`` serialises its
    writes."""

    __slots__ = ("flying", "key", "lock", "run", "sink", "users", "writing", "written_ms")

    def __init__(self, key: Hashable) -> None:
        self.key = key
        self.run: _Run | None = None
        self.written_ms: int | None = None  # clock ms the last write started (the rate's)
        self.flying: set[Position] | None = None  # entries of the write in progress
        self.sink: AckSink | None = None  # the newest contributor's: writes the run
        self.users = 0  # groupers that joined it
        self.writing = threading.Lock()
        self.lock = threading.Lock()


#: The groups of this process by key, and the lock of that map, of the groupers' maps of
#: them and of the timer (never held while writing).
_GROUPS: dict[Hashable, _Group] = {}
_GROUPS_LOCK = threading.Lock()


@in_forked_child
def _forget_after_fork() -> None:
    # A forked child inherits the parent's groups (its acknowledgements, which the parent
    # writes) and maybe their lock held by a parent's thread: the child starts with none.
    global _GROUPS, _GROUPS_LOCK
    _GROUPS = {}
    _GROUPS_LOCK = threading.Lock()


#: How long the interpreter's exit may spend writing the groups left pending, at most.
EXIT_WRITE_BUDGET_S = 5.0


def _write_at_exit(budget_s: float = EXIT_WRITE_BUDGET_S) -> None:
    """Best effort at a normal interpreter exit: write every group with a pending run (a
    consumer left open: its housekeeping thread is a daemon and dies with the process), for
    ``budget_s`` seconds at most; what cannot be written is logged (its messages are
    delivered again, as after a crash)."""
    with _GROUPS_LOCK:
        groups = [g for g in _GROUPS.values() if g.run is not None and g.sink is not None]
    end = time.monotonic() + budget_s
    for g in groups:
        if not g.writing.acquire(timeout=max(0.0, end - time.monotonic())):
            log.warning("exit: a write of grouped acknowledgements did not end; some are lost")
            break
        try:
            with g.lock:
                run, sink = g.run, g.sink
                g.run = None
            if run is None or sink is None:
                continue
            try:
                sink.acknowledge(run.items)
            except Exception as e:  # best effort: the process is ending
                log.warning(
                    "exit: writing %d grouped acknowledgements on %s failed (their messages "
                    "are delivered again): %s",
                    len(run.items),
                    getattr(sink, "topic", sink),
                    e,
                    exc_info=True,
                )
        finally:
            g.writing.release()


_exit_hook = False  # _write_at_exit registered (with the first group)


def _new_group(key: Hashable) -> _Group:
    """A new group of this process. Under ``_GROUPS_LOCK``. The first registers
    :func:`_write_at_exit` with ``atexit``: after the stores' ``weakref.finalize`` hook (the
    sink's journal made one when it opened), so that it runs before it (``atexit`` calls the
    newest first), while the journals are still open."""
    global _exit_hook
    if not _exit_hook:
        _exit_hook = True
        atexit.register(_write_at_exit)
    return _Group(key)


def group_key(sink: AckSink) -> Hashable:
    """Which group a sink's acknowledgements join: the sink's ``ack_group_key`` (a
    ``SubscriptionConsumer`` names its store, partition and subscription, so that the
    consumers of one subscription partition in a process share one group and one commit per
    group window), else the sink itself (a group of its own)."""
    key: Hashable = getattr(sink, "ack_group_key", None)
    return cast(Hashable, sink) if key is None else key


class AckTimer:
    """The timer of the grouped acknowledgements of the consumers one housekeeping thread
    serves together (the push dispatcher's, :mod:`~filepulsar.connector.client.consumer.push`),
    as Pulsar's client writes its groups from a timer: an acknowledgement only adds to its
    group (no clock read, no look at other groups); a group that starts tells the timer when
    it is due, and the housekeeping thread's :meth:`flush_due` writes the groups due, looking
    at them only once the first is due: one due time for the process, not a pass over every
    consumer's partitions at every round.

    Thread-safe (its state is guarded by the groups' lock).

    Parameters
    ----------
    wake
        Called (without the groups' lock) when a group starts, or becomes full, due before
        the time the timer was last at: the housekeeping thread then looks again at once.
    monotonic
        Seconds on the housekeeping thread's clock (the system's monotonic clock; a
        ``ManualClock``'s in tests): a group's due time on its consumer's clock is kept as
        the time left from now on this one.
    """

    def __init__(
        self, wake: Callable[[], None], monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self._wake = wake
        self._monotonic = monotonic
        # The groups that may have a run pending, each with the grouper whose clock and
        # policy time it (the last to start or fill it): dropped by the pass that finds
        # them empty.
        self._pending: dict[_Group, AckGrouper] = {}
        self._next_ms: float = math.inf  # monotonic ms when the first is due (or sooner)

    def _due(self, g: _Group, grouper: AckGrouper) -> bool:
        """``g`` (a run of it started or filled, timed by ``grouper``) is pending: whether its
        due time comes before the timer's (then the caller wakes it). Under ``_GROUPS_LOCK``."""
        self._pending[g] = grouper
        now = grouper._clock()
        at = grouper._due_at(g, now)
        if at is None:
            return False
        when = self._now_ms() + max(at - now, 0)
        if when >= self._next_ms:
            return False
        self._next_ms = when
        return True

    def _now_ms(self) -> int:
        return round(self._monotonic() * 1000)

    def due_in_s(self) -> float:
        """Seconds until the first pending group is due (<= 0: due now; inf: none pending)."""
        return (self._next_ms - self._now_ms()) / 1000

    def flush_due(self, budget_s: float | None = None) -> float:
        """Write every pending group that is due (its oldest acknowledgement ``time_ms`` old,
        or ``max_size`` pending, and ``1 / mark_delete_rate_limit`` s past its last write),
        each by the grouper timing it (a failure is logged and kept for its
        :meth:`AckGrouper.raise_failure`; the run stays pending). Nothing is looked at before
        the first is due. ``budget_s``: after the first group, none is started once that many
        seconds passed (the rest is due at once, for the next call: lease renewals go
        between the two). Seconds until the next call is due (inf: nothing pending)."""
        start = self._now_ms()
        if start < self._next_ms:
            return (self._next_ms - start) / 1000
        due: list[tuple[_Group, AckGrouper]] = []
        nxt: float = math.inf
        with _GROUPS_LOCK:
            for g, grouper in list(self._pending.items()):
                now = grouper._clock()
                at = grouper._due_at(g, now)
                if at is None:
                    del self._pending[g]
                elif at <= now:
                    due.append((g, grouper))
                else:
                    nxt = min(nxt, start + at - now)
            self._next_ms = nxt
        for i, (g, grouper) in enumerate(due):
            if i and budget_s is not None and self._now_ms() - start >= budget_s * 1000:
                with _GROUPS_LOCK:
                    self._next_ms = 0  # the rest: the next call, at once
                break
            grouper._write([g], raising=False)
            with _GROUPS_LOCK:
                if g.run is not None:  # started while written, or put back after a failure
                    self._due(g, self._pending.get(g, grouper))
        return max(self._next_ms - self._now_ms(), 0) / 1000


class AckGrouper:
    """One consumer's view of the pending acknowledgements of its partitions, written as one
    commit per group.

    The groups are the process's: every consumer of a subscription partition in this process
    adds to the same group (:func:`group_key`), and whichever consumer finds it due or full,
    flushes or closes writes all of it through its own sink (acknowledgements commit the same
    whoever writes them). So N consumers of a subscription in one process pay one commit per
    group window, not N. A consumer's :meth:`flush` and :meth:`close` write the groups it
    added to, the other consumers' acknowledgements in them included.

    Thread-safe: ``add`` and ``flush`` run in the application's threads (under the
    consumer's lock), ``flush_due`` also in the consumer's housekeeping thread (without it).
    Each group's writes are serialised by a lock of their own, so a ``flush`` returns only
    after a write another thread (or consumer) started has ended.

    Parameters
    ----------
    policy
        The group time and size (each consumer's own: it writes a shared group when the group
        is due or full by its policy).
    clock
        Wall-clock ms (the consumer's clock: a ManualClock in tests moves the group time).
    name
        Names the consumer in log lines and errors.
    on_pending
        Called (without the grouper's locks) when a group this consumer adds to starts, so a
        timer that sleeps can wake up before the group is due.
    timer
        The process's :class:`AckTimer` that writes this consumer's due groups (its
        housekeeping thread's): then :meth:`add` reads no clock and writes only a full
        group, :meth:`flush_if_due` does nothing and ``on_pending`` is not called (the timer
        wakes its own thread). None: the consumer's own calls and its housekeeping
        (:meth:`flush_due`, :meth:`due_in_ms`) write them.
    """

    def __init__(
        self,
        policy: AckGrouping,
        *,
        clock: Callable[[], int],
        name: str,
        on_pending: Callable[[], None] | None = None,
        timer: AckTimer | None = None,
    ) -> None:
        self.policy = policy
        self._enabled = policy.enabled  # (looked at for every acknowledgement)
        self._timer = timer
        self._interval = policy.write_interval_ms  # (looked at for every group, often)
        self._clock = clock
        self._name = name
        self._on_pending = on_pending
        self._groups: dict[Hashable, _Group] = {}  # the groups this consumer joined
        self._of_sink: dict[AckSink, _Group] = {}  # the same by sink (no key to make)
        self._failure: BaseException | None = None
        self._failing = False  # a streak of failed background writes (logged once)
        self._closed = False
        # Clock ms before which no group of this consumer's is due (as of the last look): an
        # add looks for due groups only from then on (the housekeeping thread writes them
        # anyway, at due_in_ms), instead of going over every group at every acknowledgement.
        self._check_at = 0

    def _group(self, sink: AckSink) -> _Group:
        """The group of ``sink``, joined on first use. Under ``_GROUPS_LOCK``."""
        g = self._of_sink.get(sink)
        if g is not None:
            return g
        key = group_key(sink)
        g = self._groups.get(key)
        if g is None:
            g = _GROUPS.get(key)
            if g is None:
                g = _GROUPS[key] = _new_group(key)
            g.users += 1
            self._groups[key] = g
        self._of_sink[sink] = g
        return g

    def _joined(self, sink: AckSink) -> _Group | None:
        return self._groups.get(group_key(sink))

    # ------------------------------------------------------------------ adding
    def add(self, sink: AckSink, items: list[AckItem]) -> None:
        """Acknowledge ``items`` on ``sink``: buffered in its group, or written now when
        grouping is off or the group reaches ``max_size`` (or a group of this consumer's is
        due).

        Raises
        ------
        BlobStoreError
            If a write made here fails (the run stays pending; its cause is the sink's
            error); with grouping off, what ``sink.acknowledge`` raises.
        """
        if not items:
            return
        if not self._enabled:
            sink.acknowledge(items)
            return
        timer = self._timer
        if timer is not None:
            # Timed by the process's timer: one append under one lock, no clock read (but
            # when the group starts or fills), no look at the other groups.
            wake = full = tell = False
            g = self._of_sink.get(sink)
            if g is None:
                with _GROUPS_LOCK:
                    g = self._group(sink)
            with g.lock:
                run = g.run
                if run is None:
                    run = g.run = _Run(self._clock())
                    run.extend(items)
                    g.sink = sink
                    tell = True
                else:
                    n = len(run.items)
                    run.extend(items)
                    g.sink = sink
                    size = self.policy.max_size
                    if 0 < size <= len(run.items) and (n < size or not n % size):
                        # (full now, or again by a whole group: no look at every one past)
                        if self._rate_allows(g, self._clock()):
                            full = True  # written here, now (as Pulsar's clients do)
                        else:
                            tell = True  # due when the rate allows
            if tell:  # (a pass of the timer meanwhile saw the run, or finds it pending now)
                with _GROUPS_LOCK:
                    wake = timer._due(g, self)
            if full:
                self._write([g], raising=True)
            elif wake:
                timer._wake()
            return
        now = self._clock()
        started = False
        g = self._of_sink.get(sink)
        if g is None:
            with _GROUPS_LOCK:
                g = self._group(sink)
        with g.lock:
            if g.run is None:
                g.run = _Run(now)
                started = True
            g.run.extend(items)
            g.sink = sink
            full = 0 < self.policy.max_size <= len(g.run.items) and self._rate_allows(g, now)
            if started:
                self._check_at = min(self._check_at, self._due_at(g, now) or now)
        if full:
            self._write([g], raising=True)
        elif now >= self._check_at:
            self.flush_due()
        if started and self._on_pending is not None:
            self._on_pending()

    def held(self, sink: AckSink, positions: Iterable[Position]) -> AbstractSet[Position]:
        """Those of ``positions`` whose whole entry is acknowledged in ``sink``'s group (by
        any consumer of this process) and not yet written (or being written)."""
        # Without the groups' lock (asked at every delivery, while every consumer adds): the
        # run, then the write in flight. A write sets ``flying`` before it takes the run and
        # clears it once written, so a run not found here was either never there or is
        # being written (``flying``) or written (durable).
        g = _GROUPS.get(group_key(sink))
        if g is None:
            return _NONE
        run = g.run
        in_flight = g.flying
        whole: AbstractSet[Position] = run.whole if run is not None else _NONE
        flying: AbstractSet[Position] = _NONE if in_flight is None else in_flight
        if not whole and not flying:
            return _NONE
        out: set[Position] | None = None  # (none made for what holds nothing: most)
        for p in positions:
            if p in whole or p in flying:
                if out is None:
                    out = set()
                out.add(p)
        return _NONE if out is None else out

    def touches(self, sink: AckSink, position: Position) -> bool:
        """Whether ``sink``'s group has an acknowledgement of ``position``'s entry (whole or
        a batch index) not yet written, or a write in progress (which may have one)."""
        with _GROUPS_LOCK:
            g = _GROUPS.get(group_key(sink))
        if g is None:
            return False
        with g.lock:
            return g.flying is not None or (g.run is not None and g.run.touches(position))

    def pending(self, sink: AckSink | None = None) -> int:
        """Acknowledgements not yet written (in ``sink``'s group, or in the groups this
        consumer added to)."""
        with _GROUPS_LOCK:
            if sink is not None:
                g = _GROUPS.get(group_key(sink))
                return len(g.run.items) if g is not None and g.run is not None else 0
            return sum(len(g.run.items) for g in self._groups.values() if g.run is not None)

    # ------------------------------------------------------------------ writing
    def _rate_allows(self, g: _Group, now: int) -> bool:
        """Whether ``g`` may be written at ``now`` by the rate limit. Under ``_GROUPS_LOCK``."""
        last = g.written_ms
        # (now < last: the wall clock stepped back; the rate holds nothing then)
        return last is None or now < last or now - last >= self._interval

    def _due_at(self, g: _Group, now: int) -> int | None:
        """Clock ms when ``g``'s run is due: its oldest ``time_ms`` old (or, full, at once),
        and the rate's interval since the last write. None if nothing is pending. A time
        after ``now`` (the wall clock stepped back since) counts as ``now``, so that a
        backward step holds a group no longer than ``time_ms``. Under ``_GROUPS_LOCK``."""
        run = g.run
        if run is None:
            return None
        first = min(run.first_ms, now)
        full = 0 < self.policy.max_size <= len(run.items)
        at = first if full else first + self.policy.time_ms
        if g.written_ms is not None and g.written_ms <= now:
            at = max(at, g.written_ms + self._interval)
        return at

    def _due_groups(self, now: int) -> tuple[list[_Group], int]:
        """The groups of this consumer's due at ``now``, and when the next of the others is
        due (``now + time_ms`` if none is pending)."""
        due: list[_Group] = []
        after: int | None = None
        with _GROUPS_LOCK:
            for g in self._groups.values():
                at = self._due_at(g, now)
                if at is None:
                    continue
                if at <= now:
                    due.append(g)
                elif after is None or at < after:
                    after = at
        return due, now + self.policy.time_ms if after is None else after

    def due_in_ms(self) -> int | None:
        """Ms until the first pending run of this consumer's groups is due (<= 0: due now),
        the rate limit included; None if nothing is pending."""
        now = self._clock()
        with _GROUPS_LOCK:
            ats = [at for g in self._groups.values() if (at := self._due_at(g, now)) is not None]
        if not ats:
            return None
        return min(ats) - now

    def flush_due(self, budget_s: float | None = None) -> None:
        """Write every group of this consumer's that is due: its oldest acknowledgement
        ``time_ms`` old (or ``max_size`` pending) and ``1 / mark_delete_rate_limit`` s past
        its last write. A failure is logged and kept for :meth:`raise_failure`; its run stays
        pending. ``budget_s``: after the first group, none is started once that many seconds
        passed (a housekeeping round bounded in time, so that lease renewals come between
        two): the rest stays due, for housekeeping's next round (woken through
        ``on_pending``), not for the application's next :meth:`add`, which looks again only
        when the next of the groups that were not yet due is due, as without a budget."""
        if not self.policy.enabled or self._closed:
            return
        due, self._check_at = self._due_groups(self._clock())
        if budget_s is None:
            if due:
                self._write(due, raising=False)
            return
        end = time.monotonic() + budget_s
        for i, g in enumerate(due):
            if i and time.monotonic() >= end:
                if self._on_pending is not None:
                    self._on_pending()  # the rest: the next round, at once
                break
            self._write([g], raising=False)

    def flush_if_due(self, now: int | None = None) -> None:
        """:meth:`flush_due` for the application's calls (``receive``'s timer tick): it looks
        at the groups only once the time it found for the next of them to be due has come,
        as :meth:`add` does (the housekeeping thread writes what is due meanwhile, woken when
        a group starts), so that a call costs a clock read (none given ``now``, the clock's
        time the caller just read), not a pass over the groups of every partition. Nothing
        with a :class:`AckTimer` (its thread writes them)."""
        if self._timer is None and (self._clock() if now is None else now) >= self._check_at:
            self.flush_due()

    def flush(self, sink: AckSink | None = None) -> None:
        """Write what is pending (``sink``'s group, or every group this consumer added to)
        before returning, after any write in progress.

        Raises
        ------
        BlobStoreError
            If a write fails (its cause is the sink's error): the rest stays pending.
        """
        with _GROUPS_LOCK:
            if sink is None:
                groups = list(self._groups.values())
            else:
                g = _GROUPS.get(group_key(sink))
                groups = [] if g is None else [g]
        for g in groups:
            while True:
                with _GROUPS_LOCK:
                    pending, flying = g.run is not None, g.flying is not None
                if pending:
                    self._write([g], raising=True)
                    break
                if not flying:
                    break
                with g.writing:  # another thread's write ends first; if it failed, its
                    pass  # run is back, and written here

    def settle(self, sink: AckSink) -> None:
        """Write ``sink``'s group now if anything is pending, whatever the rate limit (its
        consumer is about to record what it holds for a new membership: a newcomer waits for
        these acknowledgements). A failure is logged and kept for :meth:`raise_failure`, as
        a background write's."""
        if self._closed:
            return
        with _GROUPS_LOCK:
            g = _GROUPS.get(group_key(sink))
            pending = g is not None and g.run is not None
        if pending:
            assert g is not None
            self._write([g], raising=False)

    def _write(self, groups: list[_Group], *, raising: bool) -> None:
        for g in groups:
            with g.writing:
                with g.lock:
                    run, sink = g.run, g.sink
                    if run is None or sink is None:
                        continue  # written by another thread meanwhile
                    g.flying = run.whole  # (first: held looks without the lock)
                    g.run = None
                    g.written_ms = self._clock()
                try:
                    sink.acknowledge(run.items)
                except (FilePulsarError, OSError) as e:
                    self._put_back(g, run)
                    err = BlobStoreError(
                        f"consumer {self._name}: writing {len(run.items)} grouped "
                        f"acknowledgements on {getattr(sink, 'topic', sink)} failed: {e}"
                    )
                    if raising:
                        raise err from e
                    err.__cause__ = e
                    self._failed(err)
                    continue
                finally:
                    with g.lock:
                        g.flying = None
                if self._failing:
                    self._failing = False
                    log.info("consumer %s: grouped acknowledgements written again", self._name)

    def _put_back(self, g: _Group, run: _Run) -> None:
        """Return a run whose write failed, ahead of what was added meanwhile; it is due again
        ``time_ms`` from now (and the rate's interval from the failed write). With a timer,
        the timer is told again: a pass that ran while the write was in flight found no run
        and forgot the group (an acknowledgement added to a run does not tell it)."""
        wake = False
        with _GROUPS_LOCK:
            with g.lock:
                if g.run is not None:
                    run.extend(g.run.items)
                run.first_ms = self._clock()
                g.run = run
            if self._timer is not None:
                wake = self._timer._due(g, self)
        if wake:
            self._timer._wake()  # type: ignore[union-attr]

    def _failed(self, e: BaseException) -> None:
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
        """Drop ``sink``'s pending group (its partition is gone); return how many were
        dropped."""
        with _GROUPS_LOCK:
            self._of_sink.pop(sink, None)
            g = _GROUPS.get(group_key(sink))
            run = None
            if g is not None:
                with g.lock:
                    run, g.run = g.run, None
        return len(run.items) if run is not None else 0

    def close(self) -> None:
        """Write every group this consumer added to (the other consumers' acknowledgements in
        them included), then leave them; later calls of :meth:`flush_due` do nothing.

        Raises
        ------
        BlobStoreError
            If a write fails: what is left pending in this consumer's groups is dropped when
            no other consumer of the process shares them (their messages are delivered
            again), and the caller must say so.
        """
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._closed = True
            with _GROUPS_LOCK:
                for key, g in self._groups.items():
                    g.users -= 1
                    if g.users <= 0:
                        with g.lock:
                            g.run = None
                        if _GROUPS.get(key) is g:
                            del _GROUPS[key]
                self._groups.clear()
                self._of_sink.clear()
