"""Consumer leases judged by the observer's own monotonic clock, never by wall clocks.

A consumer's entry in a subscription state carries a renewal counter that each of its lease
renewals changes, and the lease's length (:class:`~filepulsar.storage.cursor.ConsumerInfo`). Another
process times it as a coordinator times a session:

1. Each time it reads the newest state (to dispatch, register, or tell the active Failover
   consumer) and each time it commits one, it notes, per consumer, the renewal it sees and,
   when that renewal differs from the one it noted, the time on its own monotonic clock.
2. A consumer whose renewal it has seen unchanged for longer than that consumer's lease has
   lapsed; only then may a commit remove it (what it held is redelivered), and only if the
   state that commit changes still shows that renewal. States a commit merely builds on
   (perhaps a stale copy) are judged, never noted.
3. The consumer itself takes its lease as lost once its own monotonic clock passes the lease
   since it started the last renewal that committed
   (:meth:`~filepulsar.storage.subscription.SubscriptionConsumer.lease_lapsed`); it then renews
   before handing out anything, registering again if it was removed.

An observer can only see a renewal after the renewal's commit started, and both clocks run at
the same rate, so by the time an observer judges a lease lapsed its owner already knows it
lapsed: wall clocks may be off by any amount between hosts without a live consumer losing what
it holds. A dead consumer (killed) is removed one lease after the survivors last saw it renew.
A process that has just started waits one whole lease before removing anyone it finds.

4. The consumers of one subscription partition in one process (on one clock) that renew
   together (the client's: their process renews them whatever their application does) form a
   :class:`LeaseGroup`: a commit of any of them (a renewal, a group of acknowledgements)
   extends the lease of every one of them still registered under its current registration
   whose own lease has not lapsed (point 3: a lapsed one renews itself, a Failover one by
   leaving and registering again), and credits each (:meth:`OwnLease.extended`) with the
   commit's start only once the commit that extended it is stored, and only if its lease
   did not run out meanwhile. N consumers of a
   partition in a process pay one renewal commit per third of a lease, and none while their
   acknowledgements are written (every group's commit renews them).

:func:`watch_for` gives the watch of a clock: one per process for the system clock, one per
:class:`~filepulsar.dispatch.clock.ManualClock` in tests (each plays a machine of its own).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Generic, Protocol, TypeVar

from filepulsar.dispatch.clock import SYSTEM, waits_of
from filepulsar.storage.cursor import DEFAULT_LEASE_MS, SubscriptionState
from filepulsar.storage.forks import in_forked_child

__all__ = [
    "GroupCommit",
    "LeaseCounts",
    "LeaseGroup",
    "LeaseHolder",
    "LeaseWatch",
    "OwnLease",
    "lease_counts",
    "lease_group",
    "watch_for",
]

#: Past this many watched consumers, those not seen for ``_FORGET_S`` are forgotten (seen
#: again, they are timed afresh: later removal, never an early one).
_KEEP = 4096
_FORGET_S = 3600.0
_QUIET_STATES = 256  # states LeaseWatch.observe remembers (for lapsed to find them quiet)
_NOT_QUIET = float("-inf")
_NOBODY: frozenset[str] = frozenset()


class LeaseWatch:
    """What one observer saw of consumers' lease renewals, timed on its monotonic clock.

    Thread-safe. Keyed by consumer id (random per consumer instance, so unique across
    subscriptions).

    Parameters
    ----------
    monotonic
        Seconds on a clock that never goes back (the observer's own).
    """

    def __init__(self, monotonic: Callable[[], float]) -> None:
        self._monotonic = _direct(monotonic)
        self._lock = threading.Lock()
        # consumer id -> (renewal noted, monotonic s when first noted, monotonic s when last
        # noted)
        self._seen: dict[str, tuple[tuple[int, int, int], float, float]] = {}
        # id(state) -> (state, monotonic s): the states :meth:`observe` noted (read as the
        # newest or committed: no longer changed), each with until when none of its consumers
        # can lapse, once :meth:`lapsed` found nobody lapsed in it (a dispatcher asks at every
        # look), else -inf. A commit's change asks about its private copy and then changes it:
        # never noted, never remembered quiet.
        self._states: dict[int, tuple[SubscriptionState, float]] = {}

    def observe(self, state: SubscriptionState) -> None:
        """Note the renewals in ``state``, a state just read as the newest or just committed
        (a renewal that differs from the one noted restarts that consumer's timing)."""
        now = self._monotonic()
        with self._lock:
            for cid, c in state.consumers.items():
                renewal = c.renewal()
                seen = self._seen.get(cid)
                first = now if seen is None or seen[0] != renewal else seen[1]
                self._seen[cid] = (renewal, first, now)
            if len(self._states) >= _QUIET_STATES:
                self._states.clear()
            self._states[id(state)] = (state, _NOT_QUIET)
            if len(self._seen) > _KEEP:
                self._seen = {k: v for k, v in self._seen.items() if now - v[2] < _FORGET_S}

    def lapsed(self, state: SubscriptionState) -> frozenset[str]:
        """The ids of the consumers in ``state`` whose renewal there is the one this observer
        noted, unchanged for longer than their lease since. Notes nothing (``state`` may be a
        stale copy a commit builds on; a consumer it never noted, or whose renewal differs
        from the one noted, has not lapsed)."""
        now = self._monotonic()
        quiet = self._states.get(id(state))
        if quiet is not None and quiet[0] is state and now < quiet[1]:
            return _NOBODY
        out = []
        # Until when nobody in ``state`` can lapse: a renewal noted at ``first`` lapses a lease
        # after it; one not noted (or another noted) can be noted from now on only (a noting
        # never moves ``first`` back), so it lapses a lease after now at the earliest.
        until = float("inf")
        with self._lock:
            for cid, c in state.consumers.items():
                seen = self._seen.get(cid)
                lease_s = (c.lease_ms or DEFAULT_LEASE_MS) / 1000
                if seen is not None and seen[0] == c.renewal():
                    if now - seen[1] > lease_s:
                        out.append(cid)
                    until = min(until, seen[1] + lease_s)
                else:
                    until = min(until, now + lease_s)
            noted = self._states.get(id(state))
            if not out and noted is not None and noted[0] is state:
                self._states[id(state)] = (state, until)
        return frozenset(out) if out else _NOBODY


class OwnLease:
    """A consumer's own lease, timed on its process's monotonic clock (point 3 above).

    Owned by a :class:`~filepulsar.storage.subscription.SubscriptionConsumer` and shared with its
    :class:`~filepulsar.storage.delivery.Dispatcher`, whose claim commits extend the lease too.

    Parameters
    ----------
    monotonic
        Seconds on a clock that never goes back (the process's own).
    lease_ms
        The lease's length.
    """

    def __init__(self, monotonic: Callable[[], float], lease_ms: int) -> None:
        self._monotonic = _direct(monotonic)
        self.lease_ms = lease_ms
        # Monotonic ms when the next renewal is due: a third of a lease after the last ended
        # (asked at every fetch).
        self._due_at = lease_ms // 3
        self._lease_from = 0  # monotonic ms before the commit that last extended the lease
        #: Monotonic ms from which the lease may have lapsed (:meth:`lapsed`): kept as the
        #: lease changes, so that the look at every message handed out is one clock read.
        self.lapses_at = lease_ms

    def now_ms(self) -> int:
        """Monotonic milliseconds: take it before a commit that extends the lease."""
        return int(self._monotonic() * 1000)

    def extended(self, started_ms: int) -> None:
        """A stored commit that started at ``started_ms`` (:meth:`now_ms`) extended the lease
        (the latest start counts: commits of several threads may end out of order)."""
        self._lease_from = max(self._lease_from, started_ms)
        self.lapses_at = self._lease_from + self.lease_ms
        self.touched()

    def since_extended_ms(self) -> int:
        """Ms since the start of the last commit that extended the lease."""
        return self.now_ms() - self._lease_from

    def touched(self) -> None:
        """A renewal ended (whether or not it extended the lease): the next is due a third
        of a lease from now."""
        self._due_at = int(self._monotonic() * 1000) + self.lease_ms // 3

    def due(self) -> bool:
        """Whether a third of the lease passed since the last renewal ended."""
        return int(self._monotonic() * 1000) >= self._due_at

    def lapsed(self) -> bool:
        """Whether the lease may have lapsed: a whole lease since the start of the last
        commit that extended it (no observer can have judged it lapsed before that)."""
        # (the ms, not truncated: an int floor(ms) reaches the int lapses_at when ms does)
        return self._monotonic() * 1000 >= self.lapses_at


class LeaseHolder(Protocol):
    """A consumer whose lease a :class:`LeaseGroup` renews (a
    :class:`~filepulsar.storage.subscription.SubscriptionConsumer`)."""

    #: Its id in the subscription state, and its registration's ``joined`` number there.
    cid: str
    joined: int
    lease_ms: int

    @property
    def own_lease(self) -> OwnLease:
        """Its lease, on its process's clock."""
        ...

    def foldable(self) -> bool:
        """Whether another consumer's commit may extend its lease now: open, registered, its
        own lease not lapsed (a lapsed one renews itself, point 3)."""
        ...


class Done(Protocol):
    """A request of a :class:`GroupCommit`: done once a commit has dealt with it."""

    done: bool


D = TypeVar("D", bound=Done)


class GroupCommit(Generic[D]):
    """Requests of several threads committed together: whichever thread comes while no
    commit of the group runs commits every request waiting then (its own first), in one
    commit; the others wait for it, and those that came meanwhile go in the next one.
    Thread-safe."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._waiting: list[D] = []
        self._running = False

    def waiting(self) -> int:
        """How many requests wait for the next commit."""
        with self._cond:
            return len(self._waiting)

    def run(self, request: D, commit: Callable[[list[D]], None]) -> None:
        """Have ``request`` committed, alone or with others, by ``commit(requests)``, which
        must mark every one of them done; returns once ``request`` is done."""
        with self._cond:
            self._waiting.append(request)
            while self._running and not request.done:
                self._cond.wait()
            if request.done:
                return
            self._running = True
            batch, self._waiting = self._waiting, []
        try:
            commit(batch)
        except BaseException:
            with self._cond:  # (interrupted) the others' go in the next commit
                self._waiting[:0] = [r for r in batch if r is not request and not r.done]
            raise
        finally:
            with self._cond:
                self._running = False
                self._cond.notify_all()


class LeaseGroup:
    """The consumers of one subscription partition in one process, on one clock (point 4 of
    the module docstring): a commit of any of them extends every member's lease, and their
    registrations made at once are one commit (:attr:`joins`).

    Thread-safe. Members are held weakly (a consumer that is gone leaves by itself).
    :attr:`renewing` serialises the group's renewal commits: a consumer whose renewal falls
    due takes it, then looks again whether its lease is still due (another member's commit
    may have renewed it meanwhile).
    """

    def __init__(self) -> None:
        #: Held around a renewal commit of a member (never while taking a member's lock).
        self.renewing = threading.Lock()
        #: Registrations of consumers joining the group (their subscribe calls at once).
        self.joins: GroupCommit[Any] = GroupCommit()
        #: Held around a Shared member's fetch (its read and claim commit; its holder takes
        #: other members' locks only without waiting): the members take turns instead of
        #: racing for the same entries.
        self.fetching = threading.Lock()
        self._lock = threading.Lock()
        self._members: weakref.WeakSet[LeaseHolder] = weakref.WeakSet()

    def join(self, member: LeaseHolder) -> None:
        with self._lock:
            self._members.add(member)

    def leave(self, member: LeaseHolder) -> None:
        with self._lock:
            self._members.discard(member)

    def foldable(self, *, but: LeaseHolder | None = None) -> list[LeaseHolder]:
        """The members a commit may extend now (:meth:`LeaseHolder.foldable`), ``but`` one."""
        with self._lock:
            members = list(self._members)
        return [m for m in members if m is not but and m.foldable()]

    @staticmethod
    def extend_in(
        state: SubscriptionState, members: Sequence[LeaseHolder], now: int
    ) -> list[LeaseHolder]:
        """In a commit's change: extend the lease of each of ``members`` that ``state`` holds
        under its current registration (``now``: the wall clock, for ``expires_ms``); the
        ones extended. Run again on every attempt: only the last attempt's list counts."""
        out = []
        for m in members:
            c = state.consumers.get(m.cid)
            if c is not None and c.joined == m.joined:
                c.extend(now, m.lease_ms)
                out.append(m)
        return out

    @staticmethod
    def credit(members: Sequence[LeaseHolder], started_ms: int) -> None:
        """After the commit that extended them (:meth:`extend_in`) is stored: each lease
        runs from ``started_ms``, taken before that commit started. A member whose own lease
        ran out while the commit was in flight is not credited (nor counted): an observer
        may have judged it lapsed meanwhile (a Failover one, no longer active), so it renews
        itself, as a member found lapsed before the commit does (point 3)."""
        credited = [m for m in members if not m.own_lease.lapsed()]
        for m in credited:
            m.own_lease.extended(started_ms)
        if credited:
            COUNTS.add(extended=len(credited))


_GROUPS: weakref.WeakValueDictionary[Hashable, LeaseGroup] = weakref.WeakValueDictionary()
_GROUPS_LOCK = threading.Lock()


def lease_group(key: Hashable) -> LeaseGroup:
    """The process's :class:`LeaseGroup` of ``key`` (store root, partition, subscription and
    clock: :attr:`~filepulsar.storage.subscription.SubscriptionConsumer.lease_group_key`),
    kept while a member holds it."""
    with _GROUPS_LOCK:
        g = _GROUPS.get(key)
        if g is None:
            g = _GROUPS[key] = LeaseGroup()
        return g


class LeaseCounts:
    """What this process's consumers saw of their leases, counted since it started (read
    with :func:`lease_counts`; benchmarks print them).

    - ``renewals``: renewal commits (a lease renewed by a commit of its own; not one that
      wrote nothing, its consumer found removed);
    - ``extended``: leases credited by a commit, renewal or acknowledgement group, one per
      consumer extended (``extended / renewals`` > 1: renewals folded);
    - ``late``: renewals that started more than two thirds of a lease after the last commit
      that extended the lease (due at a third: the thread renewing was held up);
    - ``lapsed``: renewals that found their own lease lapsed (point 3);
    - ``removed``: consumers this process removed from a state as lapsed (each a membership
      change);
    - ``registered_again``: consumers of this process found removed that registered again;
    - ``records``: lazy Key_Shared record commits (what consumers hold, recorded for a new
      membership), renewals that recorded included;
    - ``records_folded``: records of other consumers of the process folded into one of
      those commits, or into the commit of a consumer of the process registering or
      leaving (which moved the membership on: no record commit after it).
    """

    FIELDS = (
        "renewals",
        "extended",
        "late",
        "lapsed",
        "removed",
        "registered_again",
        "records",
        "records_folded",
    )

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(self.FIELDS, 0)

    def add(self, **counts: int) -> None:
        with self._lock:
            for k, v in counts.items():
                self._counts[k] += v

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def after_fork(self) -> None:
        """In a forked child: a new lock (a parent's thread may have held this one), the
        counts kept (the child's count on from its parent's)."""
        self._lock = threading.Lock()


COUNTS = LeaseCounts()


def lease_counts() -> dict[str, int]:
    """This process's :class:`LeaseCounts` so far, by name."""
    return COUNTS.snapshot()


_WATCHES: weakref.WeakKeyDictionary[object, LeaseWatch] = weakref.WeakKeyDictionary()
_WATCHES_LOCK = threading.Lock()


def _direct(monotonic: Callable[[], float]) -> Callable[[], float]:
    """``time.monotonic`` itself for the system clock's (asked at every fetch and commit: no
    method call in between), else ``monotonic``."""
    return time.monotonic if monotonic == SYSTEM.monotonic else monotonic


def watch_for(clock: object) -> LeaseWatch:
    """The :class:`LeaseWatch` of ``clock``'s monotonic time: the one of this process for a
    wall-clock callable or None (the system's monotonic clock), the clock's own for a whole
    :class:`~filepulsar.dispatch.clock.Clock` such as a ``ManualClock``."""
    waits = waits_of(clock)
    with _WATCHES_LOCK:
        watch = _WATCHES.get(waits)
        if watch is None:
            watch = _WATCHES[waits] = LeaseWatch(waits.monotonic)
        return watch


@in_forked_child
def _forget_after_fork() -> None:
    # A forked child inherits the parent's lease groups (whose members are the parent's
    # consumers: a child's commit would extend their leases, keeping a dead parent's
    # consumers alive while the child lives) and maybe a lock held by a parent's thread (a
    # group's ``renewing`` during a renewal commit): the child's consumers get new ones.
    # Its watches start afresh too (a process that has just started waits a whole lease).
    global _GROUPS, _GROUPS_LOCK, _WATCHES, _WATCHES_LOCK
    _GROUPS = weakref.WeakValueDictionary()
    _GROUPS_LOCK = threading.Lock()
    _WATCHES = weakref.WeakKeyDictionary()
    _WATCHES_LOCK = threading.Lock()
    COUNTS.after_fork()  # the same object: subscription.py imports it by name
