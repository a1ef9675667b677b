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

:func:`watch_for` gives the watch of a clock: one per process for the system clock, one per
:class:`~filepulsar.dispatch.clock.ManualClock` in tests (each plays a machine of its own).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable

from filepulsar.dispatch.clock import waits_of
from filepulsar.storage.cursor import DEFAULT_LEASE_MS, SubscriptionState

__all__ = ["LeaseWatch", "OwnLease", "watch_for"]

#: Past this many watched consumers, those not seen for ``_FORGET_S`` are forgotten (seen
#: again, they are timed afresh: later removal, never an early one).
_KEEP = 4096
_FORGET_S = 3600.0


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
        self._monotonic = monotonic
        self._lock = threading.Lock()
        # consumer id -> (renewal noted, monotonic s when first noted, monotonic s when last
        # noted)
        self._seen: dict[str, tuple[tuple[int, int, int], float, float]] = {}

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
            if len(self._seen) > _KEEP:
                self._seen = {k: v for k, v in self._seen.items() if now - v[2] < _FORGET_S}

    def lapsed(self, state: SubscriptionState) -> frozenset[str]:
        """The ids of the consumers in ``state`` whose renewal there is the one this observer
        noted, unchanged for longer than their lease since. Notes nothing (``state`` may be a
        stale copy a commit builds on; a consumer it never noted, or whose renewal differs
        from the one noted, has not lapsed)."""
        now = self._monotonic()
        out = []
        with self._lock:
            for cid, c in state.consumers.items():
                seen = self._seen.get(cid)
                lease_s = (c.lease_ms or DEFAULT_LEASE_MS) / 1000
                if seen is not None and seen[0] == c.renewal() and now - seen[1] > lease_s:
                    out.append(cid)
        return frozenset(out)


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
        self._monotonic = monotonic
        self.lease_ms = lease_ms
        self._renewed_at = 0  # monotonic ms when the last renewal ended
        self._lease_from = 0  # monotonic ms before the commit that last extended the lease

    def now_ms(self) -> int:
        """Monotonic milliseconds: take it before a commit that extends the lease."""
        return int(self._monotonic() * 1000)

    def extended(self, started_ms: int) -> None:
        """A commit that started at ``started_ms`` (:meth:`now_ms`) extended the lease."""
        self._lease_from = started_ms
        self.touched()

    def touched(self) -> None:
        """A renewal ended (whether or not it extended the lease): the next is due a third
        of a lease from now."""
        self._renewed_at = self.now_ms()

    def due(self) -> bool:
        """Whether a third of the lease passed since the last renewal ended."""
        return self.now_ms() - self._renewed_at >= self.lease_ms // 3

    def lapsed(self) -> bool:
        """Whether the lease may have lapsed: a whole lease since the start of the last
        commit that extended it (no observer can have judged it lapsed before that)."""
        return self.now_ms() >= self._lease_from + self.lease_ms


_WATCHES: weakref.WeakKeyDictionary[object, LeaseWatch] = weakref.WeakKeyDictionary()
_WATCHES_LOCK = threading.Lock()


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
