"""The process's push dispatcher (:class:`PushDispatcher`): one thread per store that fills the
receiver queues of the client's Key_Shared consumers, the shape of a broker's dispatcher.

Without it, every consumer's ``receive`` looks at storage itself, for every partition, every
time a commit lands anywhere in its topics, and every consumer has a housekeeping thread of
its own: the work per entry grows with the consumers of a process (issue #27). With it:

- one thread per store (its root: every client of the process on it) serves every push
  consumer on it; it sleeps until a commit lands in a watched folder (a topic
  partition's ``manifest/`` or a subscription's ``state/``, through the process's one inotify
  descriptor: :class:`~filepulsar.storage.versioned.watch.CommitWaiter` callbacks, one per
  partition, which say *which* partition changed), a consumer asks for more, or a timer is due.
  It sleeps on that descriptor itself and reads the events there
  (:class:`~filepulsar.storage.versioned.watch.Wakeup`), and at the start of each round: no
  watcher thread wakes for each commit meanwhile, and the filters' stamps of the
  subscription states are taken without a read of the events per partition;
- it looks only at the partitions that changed: a partition's
  :class:`~filepulsar.storage.delivery.KeySharedFilter` reads the new entries once (the
  process's :mod:`filepulsar.storage.entry_cache`), computes each one's slot once and names
  the consumers owning them. In a steady state (membership settled and recorded, nothing
  draining or due for redelivery, no lease seen lapsed) each new entry goes straight to its
  owner's receiver queue (:meth:`~filepulsar.storage.subscription.SubscriptionConsumer.
  take_new`): no fetch, no read of the subscription state or the manifest per consumer.
  Otherwise (membership moving, a slot draining, a redelivery, a delayed entry, a queue
  without room, a consumer behind or with a commit of its own newer than the look) the
  owners fetch, and all consumers while membership moves or anything waits: each
  consumer's own Key_Shared rules decide what it gets (the lazy claims of
  :mod:`filepulsar.storage.delivery`);
- woken (by a commit, or a consumer asking for more) while messages come densely (a round
  delivered less than :data:`DENSE_WAKES` first gathering windows ago), it lets commits
  gather before its round (:class:`Gathering`), so that one round serves the commits that
  land meanwhile in every partition (a commit's record and its mark are two events; live
  traffic over many topics commits every millisecond or so): one look per partition, one
  wake-up per consumer for what came for it, instead of a round per event. The window
  starts at ``FILEPULSAR_PUSH_COALESCE_MS`` (5 ms; 0: never gathers) and doubles with each
  gathered round that delivers and caught more than one commit, up to
  ``FILEPULSAR_PUSH_COALESCE_MAX_MS`` (40 ms; a gathered round that caught one commit sets
  it back to the first), or up to ``FILEPULSAR_PUSH_COALESCE_BUSY_MS`` (100 ms) while the
  process is short of CPU (its rounds take at least twice as long as the dispatcher's
  thread runs in them: the host's cores or the interpreter's lock are busy with other
  work, and every look saved is CPU the rest of the host gets) or its looks are sparse
  (fewer than :data:`SPARSE_LOOKS` new entries a partition looked at: most of a delivery's
  CPU is then the look; ``bench_live_app 10 20 30 1000 --keybased``, 1.3 entries a look at
  40 ms, on a quiet host: 100 ms windows 0.77x the CPU per delivery of 40 ms ones, p50
  83-97 against 44 ms): under
  steady traffic a round starts once a window after the previous one started (or the first
  window after a round longer than that), so a delivery waits up to that window more than
  a round for it, for less CPU per delivered message (``bench_live_app 10 20 30 1000``: a
  fixed 40 ms window cost 0.71x the CPU per delivery of a fixed 5 ms one and 0.39x the
  futex calls; this window against the fixed 5 ms, 0.76-1.17x in 7 pairs on a busy host,
  0.91x summed, for 13-100 ms more publish-to-receipt p50; docs/scale.md). The
  first wake-up after a quiet spell (no round delivered in the last 20 ms) is served at
  once and the window is the first again, and traffic of one commit a round never waits
  more than the first window; the consumers' threads are woken once, at the round's
  end (a round about to wait for a consumer's lock held by its application wakes those it
  already queued messages for first);
- the fetches of a round go in turns, one partition per consumer per turn: a round that
  fetches for every consumer (after a start or a membership change) serves each one's first
  partition before any one's second, so that no consumer waits for all the others' fetches,
  and after each turn that more follow wakes the consumers it queued messages for;
- flow control is the receiver queue's size (Pulsar's permits): a consumer whose queue is
  full is skipped and asks again (:meth:`PushDispatcher.kick`) once ``receive`` has taken
  half of it;
- every recheck interval (``FILEPULSAR_WATCH_RECHECK_MS``, 250 ms; the polling interval where
  folders cannot be watched) it looks at every partition as if a commit had landed there:
  redelivery and delayed delivery timers, and writes inotify cannot see (another host on a
  network filesystem); every 8th such round (2 s) fetches for every consumer, whatever the
  filters say (but where its last look found it current: it took all its entries directly
  and has examined every entry there under the current membership);
- a second thread runs each consumer's housekeeping round when due (lease renewal,
  membership records, ack-timeout ticks) and writes the consumers' groups of acknowledgements
  when due (:class:`~filepulsar.connector.client.ack_grouping.AckTimer`: one due time for the
  process, the groups looked at only once the first is due; a consumer's round comes every
  interval, not at each group due): no thread per consumer, and no commit's flush in the way
  of a delivery. Lease renewals (and the records of what
  lazy Key_Shared consumers hold after a membership change) come first: every consumer's
  before the rounds, and again between two rounds once ``_RENEW_EVERY_S`` passed, so that a
  slow round (commits on a saturated host) never holds a renewal back; they take one look
  per subscription partition for all the process's consumers of it, and wait for no busy
  consumer while another's commit can extend its lease
  (:func:`~filepulsar.storage.subscription.renew_due`); a round's own work only tries its
  consumer's lock. A pass that takes longer than ``_SLOW_PASS_S`` is logged (the thread
  cannot keep up).

``receive`` then takes from its own queue and waits on a condition the thread notifies at the
end of its round (once, for everything the round queued for it): no storage call. What the
thread's fetch raises is kept and raised by the consumer's next ``receive`` (as if the
consumer had fetched itself). A fetch that raises anything else (a defect of ours) is logged
and tried again 50 ms later, the pause doubling while it fails, up to the recheck interval:
nothing else may fetch for that consumer soon. At the interpreter's exit (consumers not
closed) both threads end, a round under way first, before the journals' finalizers close
their files (:func:`_end_at_exit`).
"""

from __future__ import annotations

import atexit
import functools
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from filepulsar.connector.client.ack_grouping import AckTimer
from filepulsar.connector.client.consumer.records import Part
from filepulsar.dispatch.clock import SYSTEM
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.cursor import pos_key
from filepulsar.storage.delivery import KeySharedFilter, NewEntries
from filepulsar.storage.errors import FilePulsarError
from filepulsar.storage.forks import in_forked_child
from filepulsar.storage.ledger import Position
from filepulsar.storage.subscription import SubscriptionConsumer, renew_due
from filepulsar.storage.versioned.watch import (
    CommitWaiter,
    Wakeup,
    drain_events,
    env_ms,
    poll_interval_s,
    recheck_interval_s,
)

log = logging.getLogger("filepulsar.connector.client.consumer")  # the Consumer's logger

_FULL_EVERY = 8  # periodic rounds between two that fetch for every consumer
_RENEW_EVERY_S = 1.0  # housekeeping: lease renewals again between rounds once this passed
_ACK_BUDGET_S = 0.5  # housekeeping: no group of acknowledgements started after this long
_SLOW_PASS_S = 5.0  # housekeeping: a pass over every consumer this long is logged
_SLOW_LOG_S = 30.0  # ... at most once in this long
_RETRY_FIRST_S = 0.05  # a failed serve is tried again this long after, doubling while it fails
_COALESCE_MS = 5  # default of FILEPULSAR_PUSH_COALESCE_MS: the first gathering window
_COALESCE_MAX_MS = 40  # default of FILEPULSAR_PUSH_COALESCE_MAX_MS: the longest
_COALESCE_BUSY_MS = 100  # default of FILEPULSAR_PUSH_COALESCE_BUSY_MS: ... short of CPU


def coalesce_s() -> float:
    """How long the dispatcher, woken while messages come densely, lets commits gather before
    its round at first (``FILEPULSAR_PUSH_COALESCE_MS``, default 5 ms; 0: never). A value
    that is not a whole number of milliseconds >= 0 is logged and ignored."""
    return env_ms("FILEPULSAR_PUSH_COALESCE_MS", _COALESCE_MS, minimum=0)


def coalesce_max_s() -> float:
    """The longest the gathering window grows to while rounds keep delivering
    (``FILEPULSAR_PUSH_COALESCE_MAX_MS``, default 40 ms; below the first window: the first).
    A value that is not a whole number of milliseconds >= 0 is logged and ignored."""
    return env_ms("FILEPULSAR_PUSH_COALESCE_MAX_MS", _COALESCE_MAX_MS, minimum=0)


def coalesce_busy_s() -> float:
    """The longest the gathering window grows to while the process is short of CPU or its
    looks are sparse (:class:`Gathering`; ``FILEPULSAR_PUSH_COALESCE_BUSY_MS``, default
    100 ms; below the longest otherwise:
    that one, so 0 turns the rule off). A value that is not a whole number of milliseconds
    >= 0 is logged and ignored."""
    return env_ms("FILEPULSAR_PUSH_COALESCE_BUSY_MS", _COALESCE_BUSY_MS, minimum=0)


SHORT_OF_CPU = 2.0
"""The dispatcher's process is short of CPU while its rounds take this many times the CPU its
thread spends in them, or more (smoothed over rounds: :class:`Gathering`)."""

SPARSE_LOOKS = 4.0
"""A round's looks are sparse while the partitions it looks at hold fewer new entries than
this on average (smoothed over rounds: :class:`Gathering`): a look of a partition costs
about as much as several of its entries (``bench_live_app``: about 420 us a look, 80 us an
entry), so there most of a delivery's CPU is looking."""

SPARSE_DUTY = 0.1
"""... and the looks count only while the dispatcher's thread runs this share of the time
or more (its CPU in a round over the time since the round before started, smoothed): a
light stream's looks cost little however sparse, and are not made to wait for that."""

_SMOOTHING = 0.2  # the weight of the last round in the smoothed wall and CPU times


ONE_COMMIT_EVENTS = 2
"""The events one commit makes in its folder (its record, then its mark): a gathered round
that caught no more caught one commit, and its window does not grow."""

DENSE_WAKES = 4
"""A wake-up this many first gathering windows or less after a round delivered means dense
traffic."""


def gathers(woken_at: float, delivered_at: float, window_s: float) -> bool:
    """Whether the dispatcher, woken at ``woken_at`` (a round last queued messages for a
    consumer at ``delivered_at``), waits ``window_s`` for more commits before its round: only
    while messages come densely, so that a lone message after a quiet spell is delivered at
    once (commits that deliver nothing -- a consumer leaving, acknowledgements, lease
    renewals -- do not make a spell busy)."""
    return window_s > 0 and woken_at - delivered_at < DENSE_WAKES * window_s


class Gathering:
    """When the dispatcher's next round starts, woken (by a commit, or a consumer asking for
    more): the gathering window, which adapts to the traffic.

    A wake-up after a quiet spell (no round delivered in the last :data:`DENSE_WAKES` first
    windows) starts the round at once, and the window goes back to the first (``first_s``).
    While messages come densely the round starts no sooner than the first window after the
    wake-up (a commit's record and its mark are two events; commits of other partitions
    land meanwhile) and no sooner than the window after the previous round started; each
    round so gathered that delivers and caught more than one commit's events
    (:data:`ONE_COMMIT_EVENTS`) doubles the window, up to ``cap_s``, and one that caught a
    single commit sets it back to the first (a message every 25 ms is not held longer for
    having come within the dense spell: gathering it bought nothing). So under steady
    traffic rounds come once a window (a round longer than that: the first window after its
    end), each serving every commit that landed meanwhile: one look per changed partition,
    one wake-up per consumer for everything queued for it, instead of a round per commit. A
    message waits at most the window plus a round for it. ``first_s`` 0: never gathers.

    While the process is short of CPU (:attr:`short`: its rounds, smoothed over the last few,
    take :data:`SHORT_OF_CPU` times the CPU the dispatcher's thread spends in them or more,
    which ``end`` is told: the thread waited for a core or for the interpreter's lock more
    than it ran), or while its looks are sparse and dear (:attr:`sparse`: the partitions a
    round looks at hold fewer than :data:`SPARSE_LOOKS` new entries each, smoothed likewise,
    while the thread runs :data:`SPARSE_DUTY` of the time or more: many partitions, each
    with a message now and then, as an application reading dozens of topics sees them),
    the window grows up to ``busy_s`` instead of ``cap_s``, and back
    under ``cap_s`` once neither holds: each look of a partition costs about as much as a
    few of its entries, so fewer and fuller looks cost less CPU per delivery, for a longer
    wait (where CPU is what every process waits for, the host gets it; a round that reads
    a remote store waits for it too: there fewer looks are fewer requests). Traffic
    concentrated on a few partitions fills its looks within the usual cap and stays under
    it."""

    __slots__ = (
        "busy_cap",
        "cap",
        "cpu",
        "delivered_at",
        "first",
        "gathered",
        "per_look",
        "period",
        "started_at",
        "wall",
        "window",
    )

    def __init__(self, first_s: float, cap_s: float, busy_s: float = 0.0) -> None:
        self.first = first_s
        self.cap = max(first_s, cap_s) if first_s > 0 else 0.0
        self.busy_cap = max(self.cap, busy_s) if first_s > 0 else 0.0
        self.window = self.first  # the window now
        self.delivered_at = -1e9  # when a round last queued messages for a consumer
        self.started_at = -1e9  # when the last round started
        self.gathered = False  # whether the round under way was gathered
        self.wall = 0.0  # the rounds' smoothed wall time (seconds)
        self.cpu = 0.0  # ... and the dispatcher thread's CPU time in them
        self.per_look = -1.0  # the rounds' smoothed new entries per look (-1: none yet)
        self.period = 0.0  # the smoothed time from one round's start to the next's (seconds)

    @property
    def short(self) -> bool:
        """Whether the process is short of CPU (see the class)."""
        return self.wall >= SHORT_OF_CPU * self.cpu > 0

    @property
    def sparse(self) -> bool:
        """Whether the rounds' looks are sparse, and dear enough to count (see the class)."""
        return 0 <= self.per_look < SPARSE_LOOKS and self.cpu >= SPARSE_DUTY * self.period > 0

    def pause(self, woken_at: float) -> float:
        """Woken at ``woken_at``: seconds to wait before the round."""
        if not gathers(woken_at, self.delivered_at, self.first):
            self.window = self.first
            self.gathered = False
            return 0.0
        self.gathered = True
        return max(self.first, self.started_at + self.window - woken_at)

    def start(self, now: float, woken: bool = True) -> None:
        """A round starts at ``now`` (``woken`` False: by a timer, gathered by nothing)."""
        if self.started_at > -1e9:  # (not the first round)
            self.period += _SMOOTHING * (now - self.started_at - self.period)
        self.started_at = now
        if not woken:
            self.gathered = False

    def end(
        self,
        now: float,
        delivered: bool,
        events: int,
        cpu_s: float | None = None,
        looks: int = 0,
        entries: int = 0,
    ) -> None:
        """The round ended at ``now``; whether it queued messages for a consumer, how many
        commit events it caught (read since the round before started), the CPU time the
        dispatcher's thread spent in it (None: not measured), and how many of its looks at
        a partition found new entries, and how many (``looks`` 0: nothing to count)."""
        if cpu_s is not None:
            self.wall += _SMOOTHING * (now - self.started_at - self.wall)
            self.cpu += _SMOOTHING * (cpu_s - self.cpu)
        if looks:
            got = entries / looks
            self.per_look = (
                got if self.per_look < 0 else self.per_look + _SMOOTHING * (got - self.per_look)
            )
        cap = self.busy_cap if self.short or self.sparse else self.cap
        if delivered:
            self.delivered_at = now
            if self.gathered:
                grow = events > ONE_COMMIT_EVENTS
                self.window = min(cap, self.window * 2) if grow else self.first
                return
        self.window = min(self.window, cap)  # (back under the usual cap once not short)


class PushTarget(Protocol):
    """A consumer served by a :class:`PushDispatcher` (the client ``Consumer``'s adapter)."""

    def push_parts(self) -> list[Part]:
        """The partitions it reads now."""
        ...

    def push_folders(self, part: Part) -> list[str]:
        """The store folders whose commits may give it something new on ``part``."""
        ...

    def push_fill(self, parts: Sequence[Part]) -> tuple[int, Sequence[Part]]:
        """Fetch from ``parts`` into its receiver queue, as much as the queue has room for:
        the messages queued, and the parts that may have more (fetched again next round)."""
        ...

    def push_new(self, part: Part, new: NewEntries, examined: bool) -> bool | None:
        """Queue its share of ``new`` (entries of ``part`` a filter found, in a steady
        state) with no fetch; None: fetch ``part`` for it instead; True: done, and it is
        current with ``new`` (it has examined every entry ``new`` shows: a fetch would give
        it nothing more); False: done, not current. ``examined``: it was current at the
        filter's last look (what came since, up to ``new.after``, was not its own)."""
        ...

    def push_wake(self) -> bool:
        """The round ended: wake its ``receive`` if :meth:`push_fill` or :meth:`push_new`
        queued messages in it (they wake nobody themselves); whether it did. Never waits for
        the consumer's lock (the wake-up has a lock of its own)."""
        ...

    def push_housekeep(self) -> float:
        """Run its housekeeping round if due; seconds until the next is due."""
        ...


class _Group:
    """One subscription partition read by push consumers of this dispatcher: one waiter on
    its folders (its callback marks the group dirty) and one filter saying which of its
    consumers a commit may give something to."""

    __slots__ = (
        "by_cid",
        "callback",
        "current",
        "dirty",
        "filter",
        "members",
        "resets",
        "waiter",
    )

    def __init__(self, waiter: CommitWaiter) -> None:
        self.waiter = waiter
        self.callback: Callable[[], None] | None = None  # the waiter's (see close)
        self.members: dict[PushTarget, Part] = {}
        self.filter: KeySharedFilter | None = None
        self.dirty = False
        #: The members that took every new entry of theirs directly at the filter's last
        #: look, in a steady state, and have examined every entry it saw, or owned none of
        #: the entries of the steady looks since: a fetch would give them nothing more (the
        #: periodic round that fetches for all passes them over), and a look whose entries
        #: are none of theirs passes them over too (no call at all).
        self.current: set[PushTarget] = set()
        self.resets = 0  # membership changes (reset() counts them)
        #: The members by their consumer id, as of the membership change counted
        #: (made again after the next).
        self.by_cid: tuple[int, dict[str, tuple[PushTarget, Part]]] = (-1, {})

    def close(self) -> None:
        """The group's last member left: its waiter's callback goes, then the waiter."""
        if self.callback is not None:
            self.waiter.remove_callback(self.callback)
        self.waiter.close()

    def reset(self) -> None:
        """Membership of the group changed: the filter starts over."""
        self.filter = None
        self.current.clear()
        self.resets += 1

    def fetches(self) -> tuple[list[tuple[PushTarget, Part]], int]:
        """After a commit: hand the new entries to their owners where the state is steady
        (:meth:`PushTarget.push_new`), and return the members to fetch for: the owners of
        the new entries' slots that could not take them so, when the filter can tell, else
        all. A lone member too: a commit of its own acknowledgements gives it nothing (no
        fetch per acknowledgement written). With them, how many new entries the look found
        (0: none, or it could not tell), which the gathering window's sparse rule counts."""
        resets = self.resets  # (before the members: a change after it makes by_cid again)
        members = list(self.members.items())
        if not members:
            return members, 0
        f = self.filter  # a local: reset() on another thread may drop it meanwhile
        if f is None:
            sc = members[0][1].sc
            # The state's stamp, and its read, without reading the queued events: the
            # dispatcher reads them at the start of each round (one read, not one per
            # partition looked at).
            stamp = functools.partial(sc.state_stamp, drain=False)
            state = functools.partial(sc.state, drain=False)
            f = self.filter = KeySharedFilter(sc.ml, state, sc.lapsed, stamp, drained=True)
        try:
            # (Every member current, the steady case: what the look finds goes to its
            # owners as it is, and the process's entry cache need not keep it. A member
            # behind fetches it later, through the cache.)
            new = f.look(keep=len(self.current) < len(members))
        except (FilePulsarError, OSError):
            new = None  # the fetches will say what is wrong
        except Exception:  # a defect of ours: every member fetches itself
            log.exception("push dispatcher: looking at new entries failed")
            new = None
        if new is None or not new.steady:
            self.current.clear()
        if new is None:
            return members, 0
        found = len(new.entries)
        if not found:
            return [], 0
        if not new.steady:
            owners = new.owner_ids()
            return [(t, p) for t, p in members if p.sc.cid in owners], found
        owners = new.by_owner
        current = self.current
        if len(current) >= len(members):
            # Every member current (the steady case): only the owners of the new entries
            # are served; those of another process are not members.
            made, by_cid = self.by_cid
            if made != resets:
                by_cid = {p.sc.cid: (t, p) for t, p in members}
                self.by_cid = (resets, by_cid)
            serve = [by_cid[c] for c in owners if c in by_cid]
        else:
            # The owners, and the members not current (their scan moves on past entries
            # none of theirs: current from then on).
            serve = [(t, p) for t, p in members if t not in current or p.sc.cid in owners]
        out = []
        for t, p in serve:
            try:
                done = t.push_new(p, new, t in current)
            except Exception:  # one consumer's failure must not stop the others
                log.exception("push dispatcher: serving a consumer failed")
                done = None
            if done:
                current.add(t)
                continue
            current.discard(t)
            if done is None:
                out.append((t, p))
        return out, found


class _Served:
    """What the dispatcher keeps of one target: its partitions' groups, those to fetch for it
    next whatever the filters say, and those whose serve failed, to try again."""

    __slots__ = ("again", "all", "failures", "groups", "keys", "retry", "retry_at")

    def __init__(self) -> None:
        self.groups: dict[tuple[str, str], Part] = {}
        self.keys: dict[int, tuple[str, str]] = {}  # id(part) -> its group's key
        self.again: set[int] = set()  # ids of parts that may have more
        self.all = True  # fetch every partition on the next round
        # (The dispatcher's thread alone reads and writes these three.)
        self.retry: set[int] = set()  # ids of parts whose serve failed
        self.retry_at = float("inf")  # when they are fetched again (time.monotonic())
        self.failures: dict[int, int] = {}  # part id -> its serves failed in a row


class PushDispatcher:
    """Fills the receiver queues of the push consumers on one store (all clients of the
    process on its root), on one thread, and runs their housekeeping on another (both started
    with the first consumer, ended with the last)."""

    def __init__(self, store: BlobStore) -> None:
        self._store = store
        self._lock = threading.Lock()
        # (Its wait reads the inotify events of the groups' folders: no watcher thread
        # wakes for each commit while the dispatcher is busy or gathering.)
        self._wake = Wakeup()
        self._hk_wake = threading.Event()
        #: Writes the push-served consumers' groups of acknowledgements when due (on the
        #: housekeeping thread, woken when a group starts that is due sooner).
        self.ack_timer = AckTimer(self._hk_wake.set)
        self._hk_thread: threading.Thread | None = None
        self._served: dict[PushTarget, _Served] = {}
        self._groups: dict[tuple[str, str], _Group] = {}
        #: The parts whose last fetch found slots draining (entries pending at another
        #: consumer), by id: (target, part, group key). An acknowledgement of one of those
        #: entries in this process fetches for them at once (:meth:`acked`).
        self._waiting: dict[int, tuple[PushTarget, Part, tuple[str, str]]] = {}
        #: ``_waiting`` by group key, for :meth:`acked` to read without the lock (it runs at
        #: every acknowledgement, on every consumer's thread): replaced by a new dict when it
        #: changes (:meth:`_set_waiting`, under the lock), never changed in place.
        self._waiting_by_key: dict[tuple[str, str], tuple[tuple[PushTarget, Part], ...]] = {}
        self._thread: threading.Thread | None = None
        self._next_sweep = 0.0
        self._sweeps = 0
        self._delay = 0.001  # polling pause where a folder is not watched (doubling)
        self._slow_logged = -_SLOW_LOG_S  # when a slow housekeeping pass was last logged
        self._renewed = -_RENEW_EVERY_S  # when housekeeping last renewed every lease due
        self._gathering = Gathering(coalesce_s(), coalesce_max_s(), coalesce_busy_s())
        self._woken = True  # whether the next round was woken (not the sweep's timer)
        self._events = 0  # commit events read since the last round started
        self._round: list[PushTarget] = []  # the consumers of the round under way
        #: The earliest ``retry_at`` of the targets (:meth:`_retry`; the dispatcher's
        #: thread alone reads and writes it): the round's wait ends then at the latest.
        self._retry_due = float("inf")

    # ------------------------------------------------------------------ membership
    def add(self, target: PushTarget) -> None:
        """Serve ``target`` from now on (its partitions are fetched at once)."""
        with self._lock:
            self._served[target] = _Served()
            self._regroup(target)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="filepulsar-push-dispatcher", daemon=True
                )
                self._thread.start()
            if self._hk_thread is None:
                self._hk_thread = threading.Thread(
                    target=self._housekeep, name="filepulsar-push-housekeeping", daemon=True
                )
                self._hk_thread.start()
        self._wake.set()
        self._hk_wake.set()

    def remove(self, target: PushTarget) -> None:
        """Stop serving ``target`` (closed); a group's waiter closes with its last member."""
        with self._lock:
            served = self._served.pop(target, None)
            closing = []
            if served is not None:
                for key, part in served.groups.items():
                    self._set_waiting(part, None)
                    closing += self._leave(key, target)
        for g in closing:
            g.close()
        self._wake.set()
        self._hk_wake.set()

    def partitions_changed(self, target: PushTarget) -> None:
        """``target`` reads other partitions now (a pattern's topics were listed again)."""
        closing: list[_Group] = []
        with self._lock:
            if target in self._served:
                closing = self._regroup(target)
        for g in closing:
            g.close()
        self._wake.set()

    def kick(self, target: PushTarget) -> None:
        """Fetch every partition of ``target`` on the next round (its queue has room again,
        or was cleared by a seek or a redelivery)."""
        with self._lock:
            served = self._served.get(target)
            if served is not None:
                served.all = True
        self._wake.set()

    def wake(self) -> None:
        """Start a housekeeping pass now (a consumer's round is due: ``Housekeeping.wake``)."""
        self._hk_wake.set()

    def acked(self, target: PushTarget, acks: Iterable[tuple[Part, Position]]) -> None:
        """``target`` acknowledged entries (in its parts): the consumers of this process
        waiting on one of them (its slot moved to them: draining) are fetched for on the next
        round, as a broker dispatches to them once the acknowledgement arrives. Their fetch
        counts the acknowledgement before it is written (``SubscriptionConsumer.
        count_acked_here``). Takes the dispatcher's lock only for a waiter found: every
        consumer thread acknowledges, and ten of them queueing on one lock at each
        acknowledgement cost more than their deliveries (``bench_live_app 10 15 30 1000
        --keybased --behind 20``: 1.5 context switches a delivery)."""
        by_key = self._waiting_by_key  # (replaced, never changed: read without the lock)
        if not by_key:
            return
        served = self._served.get(target)
        if served is None:
            return
        found: list[tuple[PushTarget, Part]] = []
        for part, pos in acks:
            key = served.keys.get(id(part))
            waiting = by_key.get(key) if key is not None else None
            if not waiting:
                continue
            k = pos_key(pos)
            found += [(t, p) for t, p in waiting if t is not target and k in p.sc.waiting_on]
        if not found:
            return
        with self._lock:
            for t, p in found:
                other = self._served.get(t)
                if other is not None:
                    other.again.add(id(p))
        self._wake.set()

    def _set_waiting(
        self, part: Part, waiter: tuple[PushTarget, Part, tuple[str, str]] | None
    ) -> None:
        """Under ``_lock``: ``part`` waits (``waiter``: its target, itself and its group's
        key) or not (None); republishes :attr:`_waiting_by_key` for the keys it changes."""
        old = self._waiting.get(id(part))
        if waiter is None:
            if old is None:
                return
            del self._waiting[id(part)]
        else:
            if (
                old is not None
                and old[0] is waiter[0]
                and old[1] is waiter[1]
                and old[2] == waiter[2]
            ):
                return
            self._waiting[id(part)] = waiter
        by_key = dict(self._waiting_by_key)
        for key in {w[2] for w in (old, waiter) if w is not None}:
            now = tuple((t, p) for t, p, k in self._waiting.values() if k == key)
            if now:
                by_key[key] = now
            else:
                by_key.pop(key, None)
        self._waiting_by_key = by_key

    def _regroup(self, target: PushTarget) -> list[_Group]:
        """Under ``_lock``: ``target`` joins the group of each partition it reads and leaves
        the others; the groups left empty (to close outside the lock)."""
        served = self._served[target]
        now = {}
        for part in target.push_parts():
            folders = target.push_folders(part)
            now[(folders[0], folders[-1])] = (part, folders)
        closing: list[_Group] = []
        for key in [k for k in served.groups if k not in now]:
            gone = served.groups.pop(key)
            served.keys.pop(id(gone), None)
            self._set_waiting(gone, None)
            closing += self._leave(key, target)
        for key, (part, folders) in now.items():
            g = self._groups.get(key)
            if g is None:
                w = CommitWaiter(self._store, folders, clock=SYSTEM)
                g = self._groups[key] = _Group(w)
                g.callback = functools.partial(self._touched, g)
                w.add_callback(g.callback, thread=False)
            g.members[target] = part
            g.reset()  # (its first member may have changed)
            served.groups[key] = part
            served.keys[id(part)] = key
        served.all = True
        return closing

    def _leave(self, key: tuple[str, str], target: PushTarget) -> list[_Group]:
        g = self._groups.get(key)
        if g is None:
            return []
        g.members.pop(target, None)
        g.reset()
        if g.members:
            return []
        del self._groups[key]
        return [g]

    def _touched(self, group: _Group) -> None:
        """A commit landed in a group's folders (called on whichever thread read it)."""
        group.dirty = True
        self._events += 1  # (a count for the gathering window: a lost one is harmless)
        self._wake.set()

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        gathering = self._gathering
        while True:
            gathering.start(time.monotonic(), self._woken)
            cpu_at = time.thread_time()
            # Every commit marked before now is counted, and its group marked dirty (the
            # filters' state stamps, taken without reading the events, count from here).
            drain_events()
            events, self._events = self._events, 0
            with self._lock:
                if _exiting:  # (the interpreter exits: the journals are about to close)
                    self._thread = None
                    return
                if not self._served:
                    self._thread = None
                    with _HUBS_LOCK:  # the next consumer makes a new one
                        if _HUBS.get(self._store.root) is self:
                            del _HUBS[self._store.root]
                    return
                self._wake.clear()  # a wake from here on starts another round
                sweep = time.monotonic() >= self._next_sweep
                # A periodic round looks at every partition, through its filter like a
                # commit's: a timer due (a redelivery, a delayed entry) or anything pending
                # makes the filter name every consumer. Every 8th fetches for all of them
                # (a bound on what a filter could miss).
                full = False
                if sweep:
                    self._sweeps += 1
                    full = self._sweeps % _FULL_EVERY == 0
                dirty = [g for g in self._groups.values() if g.dirty or sweep]
                for g in dirty:
                    g.dirty = False
                forced: dict[PushTarget, list[Part]] = {}
                now = time.monotonic()
                retrying, self._retry_due = self._retry_due <= now, float("inf")
                for target, served in self._served.items():
                    if retrying and served.retry_at <= now:  # a failed serve's turn again
                        served.again |= served.retry
                        served.retry.clear()
                        served.retry_at = float("inf")
                    self._retry_due = min(self._retry_due, served.retry_at)
                    if served.all:
                        forced[target] = list(served.groups.values())
                    elif full or served.again:
                        # (a round for all passes over where its last look found it
                        # current: a fetch would give it nothing)
                        forced[target] = [
                            p
                            for key, p in served.groups.items()
                            if id(p) in served.again
                            or (full and target not in self._groups[key].current)
                        ]
                    served.all = False
                    served.again.clear()
                targets = list(self._served)
                unwatched = [g.waiter for g in self._groups.values() if not g.waiter.watched]
            if sweep:
                self._next_sweep = time.monotonic() + self._sweep_interval(unwatched)
            self._round = targets  # (what wake_queued wakes)
            plan: dict[PushTarget, list[Part]] = {t: list(ps) for t, ps in forced.items()}
            looks = found = 0  # the looks that found new entries, and how many
            for g in dirty:
                try:
                    fetches, got = g.fetches()
                except Exception:  # the thread serves every consumer: it must not end here
                    log.exception("push dispatcher: serving a partition failed")
                    fetches, got = list(g.members.items()), 0
                if got:
                    looks += 1
                    found += got
                for target, part in fetches:
                    planned = plan.setdefault(target, [])
                    if not any(p is part for p in planned):
                        planned.append(part)
            wait = max(0.0, self._next_sweep - time.monotonic())
            # The fetches in turns, one partition per consumer per turn: a round that fetches
            # for every consumer (the first after a start, a membership change) serves each
            # one's first partition before any one's second. Consumer by consumer, the last
            # in the order waited for all the others' fetches: 40-50 s on a saturated host
            # (10 consumers x 30 partitions, bench_iot).
            turns = [(t, plan[t]) for t in targets if plan.get(t)]
            delivered = False
            while turns:
                later = []
                for target, parts in turns:
                    one, rest = parts[:1], parts[1:]
                    try:
                        added, more = target.push_fill(one)
                        if added:
                            self._delay = 0.001  # polling: look again soon
                        if more:
                            self._again(target, more)
                        self.note_waiting(target, one)
                    except Exception:  # one consumer's failure must not stop the others
                        log.exception("push dispatcher: serving a consumer failed")
                        self._retry(target, one)
                    else:
                        self._served_ok(target, one)
                    if rest:
                        later.append((target, rest))
                turns = later
                if turns:  # (a long round: what a turn queued is not held to its end)
                    delivered = self.wake_queued() or delivered
            # The consumers' threads are woken once the round's work is done, not in it.
            for target in targets:
                try:
                    delivered = target.push_wake() or delivered
                except Exception:  # one consumer's failure must not stop the others
                    log.exception("push dispatcher: waking a consumer failed")
            gathering.end(
                time.monotonic(), delivered, events, time.thread_time() - cpu_at, looks, found
            )
            wait = min(wait, self._retry_due - time.monotonic())  # (a failed serve's retry)
            self._woken = bool(self._wake.wait(max(wait, 0.0005)) and self._served)
            if self._woken and (pause := gathering.pause(time.monotonic())):
                time.sleep(pause)  # commits landing meanwhile join the round

    def wake_queued(self) -> bool:
        """On the dispatcher's thread, about to wait for a consumer's lock held elsewhere or
        between the turns of a round's fetches: wake the consumers of this round that have
        messages queued already, so that no delivery waits for another consumer's slow call
        or the rest of a long round. Whether it woke any."""
        woke = False
        for target in self._round:
            try:
                woke = target.push_wake() or woke
            except Exception:  # one consumer's failure must not stop the others
                log.exception("push dispatcher: waking a consumer failed")
        return woke

    def _housekeep(self) -> None:
        """The housekeeping thread: the groups of acknowledgements due (:attr:`ack_timer`),
        every consumer's round when due (leases, membership records, ack timeouts), on a
        thread of its own so that a commit's flush there never holds back a delivery."""
        rounds_at = 0.0  # time.monotonic() when the next consumer's round is due
        while True:
            with self._lock:
                if not self._served or _exiting:
                    self._hk_thread = None
                    return
                woken = self._hk_wake.is_set()  # (a round asked for, membership changed...)
                self._hk_wake.clear()
                targets = list(self._served)
            start = time.monotonic()
            if start - self._renewed >= _RENEW_EVERY_S:
                self._renewed = start
                self._renew(targets)
            wait = 1.0
            try:
                # The groups of acknowledgements due (nothing looked at before the first is):
                # within a budget, lease renewals go between two passes.
                wait = min(wait, self.ack_timer.flush_due(_ACK_BUDGET_S))
            except Exception:  # the thread serves every consumer: it must not end here
                log.exception("push dispatcher: writing grouped acknowledgements failed")
            if woken or time.monotonic() >= rounds_at:
                # The consumers' rounds: only when one is due (or woken), not at every group
                # of acknowledgements written.
                rounds = 1.0
                for target in targets:
                    # Renewals first (at most every _RENEW_EVERY_S, each round renews its own
                    # consumer's too): no other commit holds them back.
                    if time.monotonic() - self._renewed >= _RENEW_EVERY_S:
                        self._renewed = time.monotonic()
                        self._renew(targets)
                    try:
                        rounds = min(rounds, target.push_housekeep())
                    except Exception:  # one consumer's failure must not stop the others
                        log.exception("push dispatcher: a consumer's housekeeping failed")
                rounds_at = time.monotonic() + rounds
            now = time.monotonic()
            wait = min(wait, rounds_at - now, self._renewed + _RENEW_EVERY_S - now)
            took = now - start
            PASSES.add(took)
            if took >= _SLOW_PASS_S and start - self._slow_logged >= _SLOW_LOG_S:
                self._slow_logged = start
                log.warning(
                    "push dispatcher: housekeeping of %d consumers took %.1f s on one thread "
                    "(commits of acknowledgements, leases, membership): it cannot keep up "
                    "(a saturated host?); lease renewals go first",
                    len(targets),
                    took,
                )
            self._hk_wake.wait(max(wait, 0.0005))

    @staticmethod
    def _renew(targets: list[PushTarget]) -> None:
        """Every target's leases due, one look per subscription partition for all of them
        (:func:`~filepulsar.storage.subscription.renew_due`: a busy consumer is not waited
        for while another's commit can extend its lease), at the states as the dispatcher's
        looks left them (it looks at every commit landing in their folders)."""
        try:
            renew_due(
                [p.sc for t in targets for p in t.push_parts()], failed=renewal_failed, look=False
            )
        except Exception:  # the thread serves every consumer: it must not end here
            log.exception("push dispatcher: renewing leases failed")

    def _sweep_interval(self, unwatched: list[CommitWaiter]) -> float:
        """Until the next round that fetches everything: the recheck interval, or where a
        folder cannot be watched, 1 ms doubling to the polling interval (back to 1 ms when
        something came), as waiters poll."""
        for w in unwatched:
            w.wait(0)  # watches a folder created since, where it can
        if not unwatched:
            return recheck_interval_s()
        interval = self._delay
        self._delay = min(self._delay * 2, poll_interval_s())
        return interval

    def note_waiting(self, target: PushTarget, parts: Sequence[Part]) -> None:
        """After a fetch for ``target`` from ``parts`` (here, or by the consumer itself):
        which of them wait on another consumer's acknowledgements (see :meth:`acked`)."""
        waiting = []
        with self._lock:
            served = self._served.get(target)
            if served is None:
                return
            for p in parts:
                key = served.keys.get(id(p))
                if key is not None and p.sc.waiting_on:
                    self._set_waiting(p, (target, p, key))
                    waiting.append(p)
                else:
                    self._set_waiting(p, None)
        # An acknowledgement that landed after the fetch computed ``waiting_on`` but before
        # the lines above registered it found no waiter in :meth:`acked`: look again now.
        again = [p for p in waiting if p.sc.waits_on_acked_here()]
        if again:
            self._again(target, again)

    def _retry(self, target: PushTarget, parts: Sequence[Part]) -> None:
        """On the dispatcher's thread: serving ``target`` from ``parts`` failed (a defect of
        ours, logged): fetch them for it again after a pause, which starts at
        :data:`_RETRY_FIRST_S` and doubles with each failure in a row up to the recheck
        interval (counted per partition: the others' serves that succeed meanwhile do not
        reset it). Nothing else may fetch for it soon (no commit in its partitions, the
        periodic round that fetches for every consumer 8 recheck intervals away), and a
        consumer whose serve failed must not wait for that; a lasting failure is not
        logged at every round either."""
        served = self._served.get(target)
        if served is None:
            return
        failures = served.failures
        n = 0
        for p in parts:
            k = failures[id(p)] = failures.get(id(p), 0) + 1
            n = max(n, k)
        pause = min(_RETRY_FIRST_S * 2 ** min(n - 1, 20), recheck_interval_s())
        served.retry.update(id(p) for p in parts)
        served.retry_at = min(served.retry_at, time.monotonic() + pause)
        self._retry_due = min(self._retry_due, served.retry_at)

    def _served_ok(self, target: PushTarget, parts: Sequence[Part]) -> None:
        """On the dispatcher's thread: a serve of ``target`` from ``parts`` succeeded (their
        failures in a row end)."""
        served = self._served.get(target)
        if served is not None and served.failures:
            for p in parts:
                served.failures.pop(id(p), None)

    def _again(self, target: PushTarget, parts: Sequence[Part]) -> None:
        """Fetch ``parts`` of ``target`` again on the next round."""
        with self._lock:
            served = self._served.get(target)
            if served is not None:
                served.again.update(id(p) for p in parts)
        self._wake.set()


class HousekeepingPasses:
    """How long this process's push housekeeping passes took (each over every push consumer
    of a store), since it started: read with :meth:`snapshot` (benchmarks print it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._total_s = 0.0
        self._max_s = 0.0
        self._over_1s = 0

    def add(self, took_s: float) -> None:
        with self._lock:
            self._count += 1
            self._total_s += took_s
            self._max_s = max(self._max_s, took_s)
            self._over_1s += took_s >= 1.0

    def snapshot(self) -> dict[str, float]:
        """``passes``, ``total_s``, ``max_s`` and ``over_1s`` (passes of a second or more)."""
        with self._lock:
            return {
                "passes": self._count,
                "total_s": self._total_s,
                "max_s": self._max_s,
                "over_1s": self._over_1s,
            }

    def after_fork(self) -> None:
        """In a forked child: a new lock (a parent's thread may have held this one)."""
        self._lock = threading.Lock()


PASSES = HousekeepingPasses()


def renewal_failed(sc: SubscriptionConsumer, e: Exception) -> None:
    """A lease renewal or record of ``sc`` failed in housekeeping: logged (the next round
    tries again)."""
    log.warning("consumer %s lease renewal failed on %s: %s", sc.consumer_name, sc.topic, e)


_HUBS: dict[str, PushDispatcher] = {}
_HUBS_LOCK = threading.Lock()
_exiting = False  # the interpreter is exiting: the dispatchers' threads end (_end_at_exit)
_EXIT_WAIT_S = 2.0  # ... and the exit waits this long at most for their rounds under way


def _end_at_exit() -> None:
    """At the interpreter's exit, with consumers not closed: end every dispatcher's threads
    (a round under way first ends) before the finalizers close the journals they read.
    Before, a daemon thread still reading them logged a failed fetch per consumer ("Bad
    file descriptor"). The acknowledgements held in groups were written before
    (:func:`~filepulsar.connector.client.ack_grouping._write_at_exit`, registered later,
    runs first)."""
    global _exiting
    _exiting = True
    with _HUBS_LOCK:
        hubs = list(_HUBS.values())
    for hub in hubs:
        hub._wake.set()
        hub._hk_wake.set()
    deadline = time.monotonic() + _EXIT_WAIT_S
    for hub in hubs:
        for t in (hub._thread, hub._hk_thread):
            if t is not None and t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))


# Exit functions run last registered first, and every weakref.finalize runs from one exit
# function, registered with the first finalizer made: one made here (a no-op) registers it
# now if nothing did, so that _end_at_exit, registered after it, runs before the journals'.
weakref.finalize(_end_at_exit, lambda: None)
atexit.register(_end_at_exit)


def dispatcher_for(store: BlobStore) -> PushDispatcher:
    """The process's push dispatcher of the store at ``store.root`` (made on first use):
    the consumers of every client of a process on one store share it, and its filters."""
    with _HUBS_LOCK:
        hub = _HUBS.get(store.root)
        if hub is None:
            hub = _HUBS[store.root] = PushDispatcher(store)
        return hub


@in_forked_child
def _forget_after_fork() -> None:
    # A forked child (multiprocessing's fork start method) inherits the parent's dispatchers,
    # whose threads do not run in it, and maybe a lock held by one of them: its consumers get
    # new ones.
    global _HUBS, _HUBS_LOCK
    _HUBS = {}
    _HUBS_LOCK = threading.Lock()
    PASSES.after_fork()
