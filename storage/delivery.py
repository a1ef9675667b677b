"""Dispatch: which entries a :class:`~filepulsar.storage.subscription.SubscriptionConsumer` gets
next, per subscription type, and the :class:`Delivery` it hands out.

- Exclusive / Failover read sequentially from the cursor (the read position kept in memory),
  through a compacted view while behind its horizon (``read_compacted``);
- Shared claims a run of undelivered entries in one commit (``dispatched`` moves past them),
  due redeliveries first;
- Key_Shared claims only entries whose sticky-key slot the consumer owns, in position order per
  slot, with draining slots blocked; a lazy consumer (the client's) hands them out by the same
  rules without a commit and records what it holds only when membership changes; in a steady
  state a :class:`KeySharedFilter` reads and slots the new entries once for all the lazy
  consumers of a process and each takes its own with no fetch (:meth:`Dispatcher.take_new_indexes`).

:class:`Dispatcher` does it for one consumer: a collaborator that a
:class:`~filepulsar.storage.subscription.SubscriptionConsumer` owns, asking it (its :class:`Seat`)
for the state and the commits and sharing its lease. The decisions (what a commit claims and how it
changes the state) are the pure functions of :mod:`filepulsar.storage.claims`; this module does the
I/O around them: reading the candidates (through the process's
:mod:`filepulsar.storage.entry_cache`), committing, extending the lease.
"""

from __future__ import annotations

import bisect
import copy
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from filepulsar.dispatch.delayed import should_delay
from filepulsar.dispatch.failover import active_consumer
from filepulsar.dispatch.hashing import hash_slot, sticky_key_hash
from filepulsar.dispatch.modes import ConsumerType
from filepulsar.dispatch.selectors import selector_from_dict
from filepulsar.dispatch.selectors.base import StickyKeyConsumerSelector
from filepulsar.storage import claims, entry_cache
from filepulsar.storage.claims import IDLE as _IDLE
from filepulsar.storage.claims import LOST as _LOST
from filepulsar.storage.claims import RESCAN as _RESCAN
from filepulsar.storage.cursor import (
    MALFORMED,
    SubscriptionState,
    T,
)
from filepulsar.storage.cursor import key_pos as _unkey
from filepulsar.storage.cursor import pos_key as _key
from filepulsar.storage.cursor import prev_position as _prev_position
from filepulsar.storage.cursor import selector_owner as _selector_owner
from filepulsar.storage.cursor import slot_table as _slot_table
from filepulsar.storage.errors import BlobNotFound, DataLossError
from filepulsar.storage.ledger import ManagedLedger, Position, ReadEntry
from filepulsar.storage.manifest import ManifestState
from filepulsar.storage.names import TopicName
from filepulsar.storage.retention_skips import RetentionSkips
from filepulsar.storage.versioned import Abort
from filepulsar.storage.versioned.watch import recheck_interval_s

if TYPE_CHECKING:
    from filepulsar.storage.compaction import CompactedView
    from filepulsar.storage.consumer_leases import LeaseWatch, OwnLease

#: No batch index acknowledged (most deliveries).
_NONE_ACKED: frozenset[int] = frozenset()

#: The subscription types whose consumers read in order from their own read position.
_SEQUENTIAL = (ConsumerType.Exclusive, ConsumerType.Failover)


@dataclass(slots=True)
class Delivery:
    """An entry handed to a consumer, with its redelivery count and the batch indexes already
    acknowledged (skip them when batch-index acknowledgement is on)."""

    entry: ReadEntry
    redelivery_count: int
    acked_indexes: frozenset[int] = frozenset()
    #: Batch indexes that are not part of what is read (messages a compacted view hides):
    #: never delivered, and counted as acknowledged.
    hidden: frozenset[int] = frozenset()

    @property
    def position(self) -> Position:
        return Position(self.entry.ledger_id, self.entry.entry_id)


def entry_key_hash(e: ReadEntry) -> int:
    """``murmur3_32`` of an entry's sticky key: the key of its first message (Key_Shared
    dispatches whole entries), read from the key columns alone, computed once per entry
    object (kept on it: the consumers of a process share the entries of
    :mod:`filepulsar.storage.entry_cache`)."""
    h = e.key_hash
    if h is not None:
        return h
    row = e.single_row()  # (a keyed one-message entry, read without pyarrow)
    if row is not None:
        # Hashed straight away, not remembered (live traffic has more keys than a memo of
        # them).
        h = sticky_key_hash(row.get("ordering_key"), row.get("key"))
    else:
        keys = e.stored(("key", "ordering_key"))
        names = keys.schema.names
        okey = (
            keys.column(names.index("ordering_key"))[0].as_py() if "ordering_key" in names else None
        )
        pkey = keys.column(names.index("key"))[0].as_py() if "key" in names else None
        h = key_hash_of(okey, pkey)
    e.key_hash = h
    return h


_KEY_HASHES: dict[tuple[bytes | None, str | bytes | None], int] = {}
_MAX_KEY_HASHES = 1 << 16
_MAX_KEPT_KEY = 256


def key_hash_of(ordering_key: bytes | None, partition_key: str | bytes | None) -> int:
    """``murmur3_32`` of the sticky key of a message with these keys, remembered for the
    last keys seen (live traffic repeats its keys: devices, customers) when short (a key of
    more than :data:`_MAX_KEPT_KEY` bytes or characters is hashed each time: the memo's size
    stays bounded)."""
    k = (ordering_key, partition_key)
    h = _KEY_HASHES.get(k)
    if h is None:
        h = sticky_key_hash(ordering_key, partition_key)
        if len(ordering_key or b"") + len(partition_key or "") > _MAX_KEPT_KEY:
            return h
        if len(_KEY_HASHES) >= _MAX_KEY_HASHES:
            _KEY_HASHES.clear()
        _KEY_HASHES[k] = h
    return h


_SELECTORS: dict[str, StickyKeyConsumerSelector] = {}
"""Selectors rebuilt from stored states, by the state's text: a consistent-hashing ring is
rebuilt once per membership, not once per fetch, for every consumer in the process."""


_LAST_SELECTOR: tuple[dict[str, Any], StickyKeyConsumerSelector] | None = None
"""The last stored form asked for and its selector: states are shared read-only between the
consumers of a process, so the same dict comes back until the state changes (its text, a
consistent-hashing ring's points, is not formed again for each fetch)."""


def selector_of(d: dict[str, Any]) -> StickyKeyConsumerSelector:
    """The selector a subscription state stores (never changed by its users: treat it as
    read-only), built once per process for each distinct stored form."""
    global _LAST_SELECTOR
    last = _LAST_SELECTOR
    if last is not None and last[0] is d:
        return last[1]
    k = repr(d)
    sel = _SELECTORS.get(k)
    if sel is None:
        sel = selector_from_dict(d)
        if len(_SELECTORS) > 1024:
            _SELECTORS.clear()
        _SELECTORS[k] = sel
    _LAST_SELECTOR = (d, sel)
    return sel


def _claim_view(s: SubscriptionState, cid: str) -> SubscriptionState:
    """A copy of ``s`` for a lazy Key_Shared claim, which is never committed: what the claim
    changes is new (``pending`` and ``redeliver``, whose values it replaces, never changes;
    consumer ``cid``'s own registration, whose lease it extends), the rest is ``s``'s, read
    only (the acknowledged ranges above all: a full copy per fetch grows with them)."""
    view = copy.copy(s)
    view.pending = dict(s.pending)
    view.redeliver = dict(s.redeliver)
    me = s.consumers.get(cid)
    if me is not None:
        view.consumers = dict(s.consumers)
        view.consumers[cid] = copy.copy(me)
    return view


@dataclass(slots=True)
class NewEntries:
    """What a :class:`KeySharedFilter` found committed to a subscription partition since its
    last look: the entries (in position order, each read once), the consumer owning each
    under the stored selector, and whether they may be handed to their owners as they are
    (:meth:`Dispatcher.take_new_indexes`) rather than fetched.

    ``steady``: in ``state`` nothing waits for redelivery, nothing is pending but at its
    slot's owner (no slot drains), nobody's lease is seen lapsed, and every consumer recorded
    what it holds for the current membership: a fetch would then hand each owner exactly its
    new entries, in position order, with no commit
    (:meth:`Dispatcher._fetch_key_shared_lazy`'s rules on such a state).
    """

    #: The subscription state read for this look.
    state: SubscriptionState
    #: The last entry the filter had looked at before (the new ones come after it).
    after: Position
    #: The last entry looked at now (``after`` if nothing new came).
    last: Position
    entries: list[ReadEntry]
    slots: list[int]
    #: The id of the consumer owning each entry (None: a slot nobody owns).
    owners: list[str | None]
    steady: bool
    #: The indexes (in ``entries``) of each owner's entries, in position order: each
    #: consumer finds its share without going over the others'.
    by_owner: dict[str, list[int]] = field(default_factory=dict)

    def owner_ids(self) -> Collection[str]:
        """The consumers owning one of the new entries."""
        return self.by_owner.keys()


class KeySharedFilter:
    """Which of a process's lazy Key_Shared consumers of one subscription partition a commit
    may give something to, worked out once for all of them (the client's push dispatcher asks
    before fetching for each): the owners, under the stored selector, of the slots of the
    entries committed since the last call, each entry read once (through the process's entry
    cache, which keeps it unless the caller hands the entries out itself: :meth:`look`'s
    ``keep``) and its slot computed once. In a steady state (:class:`NewEntries`) the
    dispatcher hands the new entries to their owners as they are
    (:meth:`Dispatcher.take_new_indexes`), with no fetch at all.

    When membership (or what a consumer recorded for it) changed, when anything drains
    (pending at a consumer that no longer owns its slot) or waits for redelivery (negative
    acknowledgements, delayed entries) or just stopped doing so, or when too many entries
    came to look at, it cannot tell: any consumer may get something. It only
    spares fetches that would find nothing: what it does not name is fetched again on the
    dispatcher's periodic round (timers: redelivery, delays, leases).

    Parameters
    ----------
    ml
        The partition's managed ledger.
    state
        Reads the subscription's newest state.
    lapsed
        The consumers of a state whose lease this process saw lapse
        (:meth:`~filepulsar.storage.consumer_leases.LeaseWatch.lapsed`).
    state_stamp
        The subscription state's change stamp
        (:meth:`~filepulsar.storage.subscription.SubscriptionConsumer.state_stamp`), if the
        caller has one: while it stays the one taken before the last read of the state (for
        at most the watch's re-check interval, as the store's own cache), a look uses the
        state it read then and reads none. A stamp taken without reading the queued events
        (``drain=False``) will do where the caller reads them before each look (the push
        dispatcher, at the start of its round): the state used is then the newest as of
        that read.
    drained
        Whether the caller reads the process's queued events before each look: the
        manifest's look then tells whether anything landed without reading them again
        (:meth:`~filepulsar.storage.ledger.ManagedLedger.state`'s ``drain=False``; one
        system call less a look; the push dispatcher's filters, whose ``state_stamp`` is
        taken with ``drain=False`` too).
    """

    def __init__(
        self,
        ml: ManagedLedger,
        state: Callable[[], SubscriptionState],
        lapsed: Callable[[SubscriptionState], Collection[str]],
        state_stamp: Callable[[], tuple[int, int] | None] | None = None,
        drained: bool = False,
    ) -> None:
        self._drain = not drained
        self._ml = ml
        self._state = state
        self._lapsed = lapsed
        self._state_stamp = state_stamp
        self._stamped: tuple[tuple[int, int] | None, float] = (None, 0.0)
        self._recheck_s = recheck_interval_s()
        self._seen: tuple[Any, ...] | None = None
        self._pos: Position | None = None  # entries up to here looked at
        self._of: _StateView | None = None  # what the last state read says

    def look(self, limit: int = 256, *, keep: bool = True) -> NewEntries | None:
        """The entries committed since the last call and their owners; None: any consumer
        may get something (fetch for all of them). Not ``keep``: the entries read are not
        kept in the process's entry cache (the caller hands them out as they are: every
        consumer is current, so a fetch would find only them; one that needs them after all
        reads them once, and keeps them)."""
        v = self._of
        stamp = self._state_stamp() if self._state_stamp is not None else None
        now = time.monotonic()
        if (
            v is not None
            and stamp is not None
            and stamp == self._stamped[0]
            and now - self._stamped[1] < self._recheck_s
        ):
            s = v.state  # nothing landed in the state's folder since it was read
        else:
            s = self._state()
            self._stamped = (stamp, now)  # (taken before the read)
            if v is None or v.state is not s:
                v = self._of = _StateView(s)
        mstate = self._ml.state(drain=self._drain)
        last = mstate.last_position()
        before, self._pos = self._pos, last
        # Pending entries drained (the last acknowledged) unblock their slots for the new
        # owners, though no new entry came: busy now or at the last call, anyone may.
        seen = v.seen
        anyone = seen != self._seen or v.busy or v.sel is None
        self._seen = seen
        if anyone or before is None:
            return None
        steady = not v.unsynced and not self._lapsed(s)
        if last == before:
            start = None  # nothing new (the last entry ever added was looked at)
        elif last.ledger_id == before.ledger_id and last.entry_id > before.entry_id:
            start = Position(before.ledger_id, before.entry_id + 1)  # (the common case)
        else:
            start = self._ml.next_position(mstate, before)
        if start is None:
            return NewEntries(s, before, before, [], [], [], steady)
        entries = entry_cache.CACHE.read_entries(
            self._ml, mstate, start, max_entries=limit + 1, keep=keep
        )
        if len(entries) > limit:
            return None
        if entries:
            self._pos = entries[-1].position  # (the next look reads on from the last one read)
        slots, owners, by_owner = v.owners(entries)
        last = entries[-1].position if entries else before
        return NewEntries(s, before, last, entries, slots, owners, steady, by_owner)


def slot_owners(
    sel: StickyKeyConsumerSelector | None, of_sel: dict[str, str]
) -> tuple[npt.NDArray[np.int32], list[str | None]]:
    """:func:`slot_table <filepulsar.storage.cursor.slot_table>` with consumer ids for
    ``sel_id`` s (``of_sel``; None: nobody, or a member not in ``of_sel``): the id of the
    consumer owning a slot is ``ids[table.item(slot)]``; a new membership (every consumer
    that registers or leaves makes one, for each partition) costs a list of its members
    (an empty ``table`` without a selector)."""
    if sel is None:
        return np.empty(0, np.int32), [None]
    table, sel_ids = _slot_table(sel)
    return table, [None if i is None else of_sel.get(i) for i in sel_ids]


class _StateView:
    """What a :class:`KeySharedFilter` works out of one subscription state, once for every
    look while the state is the newest (states are shared read-only, so the same object
    comes back until a commit changes it): its membership, whether something in it waits,
    its selector, and the owner of each slot asked about."""

    __slots__ = (
        "_hash_range",
        "_ids",
        "_of_sel",
        "_table",
        "busy",
        "seen",
        "sel",
        "state",
        "unsynced",
    )

    def __init__(self, s: SubscriptionState) -> None:
        self.state = s
        self.sel: StickyKeyConsumerSelector | None = None
        if s.selector is not None:
            try:
                self.sel = selector_of(s.selector)
            except MALFORMED:
                pass
        self._of_sel = {c.sel_id: c.cid for c in s.consumers.values()}
        # (before _busy, which asks owner()) the owner of a slot is two indexes: a new state
        # (every commit of acknowledgements makes one) asks the selector nothing, and a new
        # membership costs a list of its members (live traffic has more keys than a memo)
        self._table, self._ids = slot_owners(self.sel, self._of_sel)
        self.busy = self._busy()
        self.seen = (
            s.selector_version,
            tuple(sorted((c.cid, c.synced) for c in s.consumers.values())),
            self.busy,
        )
        self.unsynced = claims.unsynced(s)
        self._hash_range = self.sel.hash_range if self.sel is not None else (0, 0)

    def owner(self, slot: int) -> str | None:
        """The id of the consumer owning ``slot`` (None: nobody); the selector is set."""
        if 0 <= slot < len(self._table):
            return self._ids[self._table.item(slot)]
        assert self.sel is not None
        o = _selector_owner(self.sel, slot)  # (not a slot of it: raises ValueError)
        return None if o is None else self._of_sel.get(o)

    def _busy(self) -> bool:
        """Whether something in the state waits: an entry in ``redeliver`` (handed back, or
        held by delayed delivery), or one pending at a consumer that does not own its slot
        now (draining: the slot's owner waits for it). Entries pending at their slot's owner
        (a lease renewal records what a consumer holds) block nobody."""
        s = self.state
        if s.redeliver:
            return True
        if not s.pending:
            return False
        if self.sel is None:
            return True
        owner = self.owner
        return any(owner(v[2]) != v[0] for v in s.pending.values())

    def owners(
        self, entries: list[ReadEntry]
    ) -> tuple[list[int], list[str | None], dict[str, list[int]]]:
        """Each entry's slot and owner, and each owner's entries (indexes)."""
        lo, hi = self._hash_range
        at, ids = self._table.item, self._ids
        slots: list[int] = []
        owners: list[str | None] = []
        by_owner: dict[str, list[int]] = {}
        for i, e in enumerate(entries):
            h = e.key_hash
            if h is None:
                h = entry_key_hash(e)
            slot = hash_slot(h, lo, hi)
            slots.append(slot)
            o = ids[at(slot)]
            owners.append(o)
            if o is not None:
                mine = by_owner.get(o)
                if mine is None:
                    by_owner[o] = [i]
                else:
                    mine.append(i)
        return slots, owners, by_owner


class Seat(Protocol):
    """What a :class:`Dispatcher` asks of the consumer it dispatches for (a
    :class:`~filepulsar.storage.subscription.SubscriptionConsumer`): its registration and its
    commits."""

    def state(self) -> SubscriptionState:
        """The newest subscription state (its renewals noted as seen)."""
        ...

    def holds(self, s: SubscriptionState) -> bool:
        """Whether ``s`` still has the consumer under its current registration."""
        ...

    def commit(
        self, change: Callable[[SubscriptionState], T], *, idempotent: bool = False
    ) -> tuple[SubscriptionState, T]:
        """Commit ``change`` to the subscription state."""
        ...

    def renew(self) -> None:
        """Extend the lease, registering again if the consumer was removed."""
        ...

    def state_stamp(self) -> tuple[int, int] | None:
        """Changes whenever a commit of the state may have landed (None: cannot tell)."""
        ...

    def before_record(self) -> None:
        """Called before a lazy Key_Shared consumer records what it holds for a new
        membership: acknowledgements of it this process holds unwritten are written first,
        so that what the newcomers wait for (draining) is not recorded as held."""
        ...

    def folding_records(self) -> AbstractContextManager[FoldedRecords]:
        """Lazy Key_Shared: the process's other consumers of the partition whose records a
        record commit of this one folds in, each held still until the commit is stored."""
        ...

    def fetch_turn(self) -> AbstractContextManager[object]:
        """Held around a Shared fetch (its read and its claim commit): the process's
        consumers of the partition take turns."""
        ...


class FoldedRecords(Protocol):
    """Other consumers' records of what they hold, folded into one consumer's record commit
    (:meth:`Seat.folding_records`)."""

    def record_in(self, st: SubscriptionState, now: int) -> None:
        """In the commit's change (every attempt): record what each holds, for the state's
        membership, and extend its lease."""
        ...

    def stored(self, started_ms: int, *, version: int = -1) -> None:
        """The commit (started at ``started_ms``, its state at ``version``) is stored: credit
        the leases it extended; a look older than it no longer speaks for the members."""
        ...


class Dispatcher:
    """What a consumer gets next, per subscription type: the read side of a
    :class:`~filepulsar.storage.subscription.SubscriptionConsumer`, which owns one and serialises
    its calls.

    It keeps the consumer's read positions (Exclusive/Failover: the last entry delivered;
    Key_Shared: how far entries were examined) and the compacted view it reads; it asks the
    :class:`Seat` for states and commits, and extends the shared :class:`OwnLease` when a
    claim commit renews the lease.
    """

    def __init__(
        self,
        seat: Seat,
        *,
        sub_type: ConsumerType,
        ml: ManagedLedger,
        cid: str,
        lease: OwnLease,
        watch: LeaseWatch,
        read_compacted: bool,
        delayed_enabled: bool,
        tick_ms: int,
        lazy: bool = False,
    ) -> None:
        self.seat = seat
        #: Key_Shared: record what is handed out only when membership changes (see
        #: :meth:`_fetch_key_shared_lazy`), not in a claim commit per fetch.
        self.lazy = lazy and sub_type is ConsumerType.KeyShared
        #: Lazy Key_Shared: what this consumer handed out and that is not known acknowledged,
        #: position -> (slot, redelivery count).
        self._inflight: dict[Position, tuple[int, int]] = {}
        #: Lazy Key_Shared: the state ``_inflight`` was last pruned by (states are shared
        #: read-only: the same object comes back until a commit changes it, and nothing
        #: handed out since is acknowledged in it).
        self._pruned_by: SubscriptionState | None = None
        #: Lazy Key_Shared: the (manifest, state) change stamps before the last fetch that
        #: found nothing after the scan position and nothing to redeliver, and when (system
        #: monotonic s): the same stamps soon after say a fetch would find nothing again.
        self._idle: tuple[object, float] | None = None
        #: Lazy Key_Shared: those of some positions that this process has acknowledged and
        #: not yet written (the client's grouped acknowledgements; None: none are kept).
        #: A fetch counts them acknowledged: another consumer's entry of a slot this one now
        #: owns stops blocking it (draining) when acknowledged here, not when written, as a
        #: broker ends draining on the acknowledgement it received, before it persists it.
        self.acked_here: Callable[[Iterable[Position]], Collection[Position]] | None = None
        #: Lazy Key_Shared: the entries pending at other consumers whose slots this one owns
        #: now, as of its last fetch (``"ledger:entry"`` keys): it waits on their
        #: acknowledgement (draining).
        self.waiting_on: frozenset[str] = frozenset()
        #: Key_Shared: whether the last fetch's scan stopped at its window's end with entries
        #: after it (a fetch giving less than asked may still find more at once).
        self.scan_more = False
        #: Lazy Key_Shared: entries handed out by :meth:`take_new_indexes` (no fetch), and fetches.
        self.handed_directly = 0
        self.fetches = 0
        self._prune_at = 256  # take_new forgets acknowledged entries past this many held
        self.sub_type = sub_type
        self.ml = ml
        self.topic: TopicName = ml.topic
        self.clock = ml.clock
        self.cid = cid
        self.lease = lease
        self.lease_ms = lease.lease_ms
        self.watch = watch
        self.read_compacted = read_compacted
        self.delayed_enabled = delayed_enabled
        self.tick_ms = tick_ms
        self._read_pos: Position | None = None  # Exclusive/Failover: last delivered
        self._scan_pos: Position | None = None  # Key_Shared: entries up to here examined
        self._seek_seen = -1  # Exclusive/Failover: selector_version when _read_pos was set
        self._epoch: int | None = None  # the subscription's seek epoch last seen (None: none)
        #: How many seeks (or cursor resets) by others this consumer followed: what its client
        #: had queued and tracked from before one must go (:meth:`follow_seek`).
        self.seeks_followed = 0
        self._scan_version = -1
        self._was_active = False
        self._view: CompactedView | None = None
        # Whether ``_view`` is loaded (None: the topic had no view then). Loaded once, and
        # again when the read position restarts (seek, reset) or a newer compaction deleted it.
        self._view_loaded = False
        #: A non-durable consumer's loss to retention (None: durable, whose cursor holds
        #: retention back): what retention deleted past its read frontier before it got it.
        self.skips: RetentionSkips | None = None
        self._counted_to: Position | None = None  # the frontier ``skips`` has counted up to

    @property
    def scan_position(self) -> Position | None:
        """Key_Shared: the last entry examined (None: the next fetch starts at the cursor)."""
        return self._scan_pos

    def restart(self) -> None:
        """Forget the read positions: the next fetch starts from the cursor (after a seek, or
        a registration that lapsed and was made again)."""
        self._read_pos = None
        self._was_active = False
        self._scan_pos = None
        self._inflight.clear()
        if self.skips is not None:
            self.count_from_cursor()

    def seeked(self, s: SubscriptionState) -> None:
        """This consumer's own seek committed ``s``: restart, and do not follow it again."""
        self.restart()
        self._epoch = s.seek_epoch

    def follow_seek(self, s: SubscriptionState) -> bool:
        """Whether ``s`` shows a seek (or cursor reset) newer than this consumer has seen;
        if so it restarts as its own seek would: what it handed out is forgotten (it is not
        pending at it in ``s``: the seek cleared that) and its reads start at the cursor. As
        Pulsar's broker disconnects every consumer of the subscription on a seek, and they
        clear their receiver queues: its client learns it from :attr:`seeks_followed`. Safe
        in a commit's change (``s`` the newest state): it only forgets."""
        e = s.seek_epoch
        if self._epoch is None or e < self._epoch:
            if self._epoch is None:
                self._epoch = e
            return False
        if e == self._epoch:
            return False
        self._epoch = e
        self._read_pos = None
        self._was_active = False
        self._scan_pos = None
        self._inflight.clear()
        self._idle = None
        if self.skips is not None:
            self._counted_to = None  # the next fetch counts from the cursor
        self.seeks_followed += 1
        return True

    def count_from_cursor(self) -> None:
        """Non-durable: retention's skips count from the cursor as it is now (a start, a
        seek, a restart); what retention deleted before is not this consumer's loss."""
        assert self.skips is not None
        s = self.seat.state()
        self._counted_to = self._frontier(s)
        self.skips.start_at(self.ml.state(), self._counted_to)

    # ------------------------------------------------------------------ fetching
    def is_active(self, state: SubscriptionState | None = None) -> bool:
        """Exclusive: always; Failover: whether this consumer is the active one now, among the
        registered consumers whose lease this process has not seen lapse (this one counts
        while registered: it renews before fetching)."""
        if self.sub_type is not ConsumerType.Failover:
            return True
        s = state or self.seat.state()
        if not self.seat.holds(s):
            return False
        live = s.connected(self.watch.lapsed(s) - {self.cid})
        names = [(c.name, c.priority) for c in live]
        winner = active_consumer(names, self.topic.partition_index, str(self.topic))
        first = next(c for c in live if c.name == winner)
        return first.cid == self.cid

    def fetch(self, max_entries: int = 100) -> list[Delivery]:
        """Up to ``max_entries`` entries for this consumer, per the subscription type.

        Returns an empty list when nothing is available (or, Failover, when not active).

        A fetch reads the manifest, then the ledgers it names. Retention may delete one of
        them in between (another consumer of the subscription acknowledged the rest of it,
        and every subscription is past it): the read finds its index or data gone, and the
        newest manifest has the ledger trimmed. That is a race, not a loss: the fetch starts
        again from the subscription's newest state, as if it had begun after the deletion
        (each race moves the trimmed point on; a third in one fetch is raised).
        """
        self.fetches += 1
        races = 0
        while True:
            try:
                if self.skips is not None:
                    self._pass_retention()
                if self.sub_type in _SEQUENTIAL:
                    return self._fetch_sequential(max_entries)
                if self.sub_type is ConsumerType.Shared:
                    return self._fetch_shared(max_entries)
                return self._fetch_key_shared(max_entries)
            except DataLossError as e:
                races += 1
                if races == 3 or not self.ml.deleted_by_retention(e):
                    raise  # missing, not deleted by retention: damage (or an endless race)

    # ------------------------------------------------------------------ retention (non-durable)
    def _frontier(self, s: SubscriptionState) -> Position:
        """How far this consumer has read: Exclusive/Failover the last entry delivered,
        Shared the last dispatched, Key_Shared the last examined (else the cursor)."""
        if self.sub_type is ConsumerType.Shared:
            return s.dispatched
        p = self._scan_pos if self.sub_type is ConsumerType.KeyShared else self._read_pos
        return s.mark_delete if p is None else p

    def _counted(self, mstate: ManifestState, entries: list[ReadEntry], frontier: Position) -> None:
        """The frontier moved to ``frontier`` past ``entries`` (in order): count them."""
        if self.skips is not None and self._counted_to is not None:
            passed = [e for e in entries if self._counted_to < e.position <= frontier]
            self.skips.read(mstate, passed)
            self._counted_to = frontier

    def _pass_retention(self) -> None:
        """A non-durable consumer holds back no retention: if retention deleted entries past
        its frontier that it had not got, count and log them once (:class:`RetentionSkips`)
        and move on after them: the cursor (and what was pending or acknowledged) to the
        last deleted entry, the frontier with it."""
        assert self.skips is not None
        s = self.seat.state()
        mstate = self.ml.state()
        frontier = self._frontier(s)
        if frontier != self._counted_to:
            # Moved by a start, a seek or a restart at the cursor: count from there.
            self.skips.start_at(mstate, frontier)
            self._counted_to = frontier
        trimmed = self.skips.passed(mstate, frontier)
        if trimmed is None:
            if mstate.trimmed_last > s.mark_delete:
                self._drop_trimmed(mstate)  # delivered, then deleted: nothing to redeliver
            return
        to = trimmed
        self._drop_trimmed(mstate)
        if self.sub_type in _SEQUENTIAL:
            self._read_pos = to if self._read_pos is not None else None
        elif self.sub_type is ConsumerType.KeyShared and self._scan_pos is not None:
            self._scan_pos = max(self._scan_pos, to)
        self._counted_to = self._frontier(self.seat.state())

    def _drop_trimmed(self, mstate: ManifestState) -> None:
        """Move the cursor past what retention deleted (``trimmedLast``): acknowledged as
        gone, with its pending and due redeliveries (they cannot be read again)."""
        to = mstate.trimmed_last

        def nxt(p: Position) -> Position | None:
            return self.ml.next_position(mstate, p)

        def change(st: SubscriptionState) -> bool:
            moved = st.ack_cumulative(to, nxt)
            if st.dispatched < to:
                st.dispatched = to
                moved = True
            if not moved:
                raise Abort(False)
            return True

        self.seat.commit(change)

    def _read_one(self, mstate: ManifestState, p: Position) -> ReadEntry | None:
        got = entry_cache.CACHE.read_entries(self.ml, mstate, p, max_entries=1)
        return got[0] if got and got[0].position == p else None

    def _fetch_sequential(self, max_entries: int) -> list[Delivery]:
        s = self.seat.state()
        self.follow_seek(s)
        if not self.is_active(s):
            self._was_active = False
            self._read_pos = None
            return []
        if self._read_pos is not None and s.selector_version != self._seek_seen:
            # The cursor was reset by someone else (an admin reset-cursor, skip or
            # clear-backlog; Pulsar's broker disconnects the consumers then): restart at it.
            self._read_pos = None
        if not self._was_active or self._read_pos is None:
            self._was_active = True
            self._read_pos = s.mark_delete
            self._seek_seen = s.selector_version
            self._view_loaded = False  # a restart (or a seek) looks for the newest view
        mstate = self.ml.state()
        now = self.clock()
        out: list[Delivery] = []
        redo = claims.due_redeliveries(s, now)
        if redo:
            taken = redo[:max_entries]

            def take(st: SubscriptionState) -> bool:
                if not self.seat.holds(st):
                    raise Abort(False)  # removed meanwhile: the next fetch registers again
                claims.take_redeliveries(st, taken)
                return True

            if not self.seat.commit(take)[1]:
                return []
            for p in taken:
                if s.is_acked(p):
                    continue
                hidden: frozenset[int] = frozenset()
                e: ReadEntry | None
                in_view = self._view_entry(mstate, p) if self.read_compacted else None
                if in_view is not None:
                    e, hidden = in_view
                else:
                    e = self._read_one(mstate, p)
                if e is not None:
                    # Pulsar tracks redelivery counts on Shared and Key_Shared only (its
                    # single-active-consumer dispatcher has the tracker disabled): always 0.
                    out.append(Delivery(e, 0, self._acked_idx(s, p), hidden))
        if self.read_compacted and len(out) < max_entries:
            self._fetch_view(s, mstate, out, max_entries)
        start = self.ml.next_position(mstate, self._read_pos)
        if start is None or len(out) >= max_entries:
            return out
        passed: list[ReadEntry] = []
        for e in self.ml.iter_entries(mstate, start, max_entries=(max_entries - len(out)) * 2):
            p = e.position
            self._read_pos = p
            passed.append(e)
            if claims.passed_over(s, p):
                continue
            out.append(Delivery(e, 0, self._acked_idx(s, p)))
            if len(out) >= max_entries:
                break
        self._counted(mstate, passed, self._read_pos)
        return out

    # ------------------------------------------------------------------ compacted reads
    def _current_view(self, mstate: ManifestState) -> CompactedView | None:
        from filepulsar.storage.compaction import load_view

        if not self._view_loaded:
            self._view = load_view(self.ml.store, self.topic, mstate.incarnation)
            self._view_loaded = True
        return self._view

    def _view_entry(
        self, mstate: ManifestState, p: Position
    ) -> tuple[ReadEntry, frozenset[int]] | None:
        view = self._current_view(mstate)
        if view is None or p > view.horizon:
            return None
        try:
            return view.entry_at(p)
        except BlobNotFound:
            self._view_loaded = False  # replaced by a newer compaction: reload next time
            return None

    def _fetch_view(
        self, s: SubscriptionState, mstate: ManifestState, out: list[Delivery], limit: int
    ) -> None:
        """Deliveries from the compacted view while the cursor is behind its horizon; the
        read position then jumps to the horizon (the topic is read after it)."""
        assert self._read_pos is not None
        view = self._current_view(mstate)
        if view is None or self._read_pos >= view.horizon:
            return
        for ve in view.index[bisect.bisect_right(view.positions, self._read_pos) :]:
            p = ve.position
            if claims.passed_over(s, p):
                self._read_pos = p
                continue
            try:
                e = view.read(ve)
            except BlobNotFound:
                self._view_loaded = False  # replaced by a newer compaction: reload next time
                return
            self._read_pos = p
            out.append(Delivery(e, 0, self._acked_idx(s, p), ve.obscured))
            if len(out) >= limit:
                return
        self._read_pos = max(self._read_pos, view.horizon)

    def with_view_gaps(
        self, mstate: ManifestState, items: list[Position]
    ) -> list[tuple[Position, Position]]:
        """For acknowledgements of compacted-view entries: the ranges of topic entries the view
        hides between each and the view entry before it (wholly obscured; acknowledged with
        it, so the cursor does not stall on entries no consumer will ever see)."""
        view = self._view
        if view is None:
            return []
        ranges = []
        for p in items:
            if p > view.horizon:
                continue
            gap = view.gap_before(p)
            if gap is None:
                continue
            a = self.ml.next_position(mstate, gap)
            b = _prev_position(mstate, p)
            if a is not None and b is not None and a <= b:
                ranges.append((a, b))
        return ranges

    @staticmethod
    def _acked_idx(s: SubscriptionState, p: Position) -> frozenset[int]:
        if not s.batch_acks:
            return _NONE_ACKED
        return frozenset(s.batch_acks.get(_key(p), ()))

    def _held(self, e: ReadEntry, now: int) -> bool:
        dat = e.header.deliver_at
        return bool(dat and self.delayed_enabled and should_delay(dat, now, tick_ms=self.tick_ms))

    def _due_at(self, e: ReadEntry) -> int:
        """When a held entry becomes deliverable: Pulsar's cutoff is now + tick, so at
        ``deliverAt - tick`` (see dispatch.delayed.should_delay)."""
        return e.header.deliver_at - self.tick_ms

    def _fetch_shared(self, max_entries: int) -> list[Delivery]:
        """Shared: claim the entries after ``dispatched`` (and redeliveries due) in a commit.
        The process's consumers of the partition fetch in turn (:meth:`Seat.fetch_turn`):
        racing, each read the same entries after ``dispatched`` and all but the first claim
        commit found them taken, a read and a commit for nothing (Pulsar's broker hands a
        Shared subscription's entries out from one dispatcher)."""
        with self.seat.fetch_turn():
            return self._fetch_shared_turn(max_entries)

    def _fetch_shared_turn(self, max_entries: int) -> list[Delivery]:
        s = self.seat.state()
        self.follow_seek(s)
        mstate = self.ml.state()
        now = self.clock()
        start = self.ml.next_position(mstate, s.dispatched)
        fresh: list[ReadEntry] = []
        if start is not None:
            # (Through the process's entry cache: the consumers of a process racing for the
            # same entries read and verify them once.)
            fresh = entry_cache.CACHE.read_entries(self.ml, mstate, start, max_entries=max_entries)
        if not fresh and not claims.due_redeliveries(s, now) and not self.watch.lapsed(s):
            return []  # a commit would change nothing: spare it (idle polls stay cheap)
        cid = self.cid
        started = self.lease.now_ms()
        candidates = [e.position for e in fresh]
        held = {e.position: self._due_at(e) for e in fresh if self._held(e, now)}

        def change(st: SubscriptionState) -> list[tuple[Position, int]]:
            if cid in st.consumers and not self.seat.holds(st):
                raise Abort(_LOST)
            return claims.claim_shared(
                st,
                cid=cid,
                now=self.clock(),
                lease_ms=self.lease_ms,
                lapsed=self.watch.lapsed(st),
                candidates=candidates,
                held=held,
                max_entries=max_entries,
            )

        st, claimed = self.seat.commit(change)
        if claimed is _LOST:
            self.seat.renew()  # registers again
            return []
        if claimed is _IDLE:
            return []  # aborted: the lease was not extended either
        self.lease.extended(started)
        self._counted(mstate, fresh, st.dispatched)
        by_pos = dict(zip(candidates, fresh))
        out = []
        for p, count in claimed:
            e = by_pos.get(p) or self._read_one(mstate, p)
            if e is not None:
                out.append(Delivery(e, count, self._acked_idx(st, p)))
        return out

    @staticmethod
    def _slot_of(e: ReadEntry, sel: StickyKeyConsumerSelector) -> int:
        return hash_slot(entry_key_hash(e), *sel.hash_range)

    # ------------------------------------------------------------------ lazy Key_Shared
    def in_flight(
        self, s: SubscriptionState | None = None, *, shared: bool = True
    ) -> dict[Position, tuple[int, int]]:
        """Lazy Key_Shared: what this consumer handed out and holds, position -> (slot,
        redelivery count); those ``s`` holds acknowledged are forgotten first, and all when
        ``s`` shows a seek this consumer has not followed yet (:meth:`follow_seek`).
        ``shared``: ``s`` is a state as read (shared, never changed), not one a commit's
        change is making."""
        if s is not None:
            self.follow_seek(s)
        if s is not None and self._inflight and (not shared or s is not self._pruned_by):
            # (Once per state, not per fetch: a consumer's acknowledgements are written in
            # groups, so many fetches see the same state while what it holds runs to
            # thousands.)
            for p in [p for p in self._inflight if s.is_acked(p)]:
                del self._inflight[p]
            if shared:
                self._pruned_by = s
        return self._inflight

    def handed_back(self, p: Position) -> tuple[int, int] | None:
        """Lazy Key_Shared: forget ``p`` (negatively acknowledged: ``redeliver`` has it now);
        its (slot, redelivery count) if this consumer held it."""
        return self._inflight.pop(p, None)

    def record(self, st: SubscriptionState) -> None:
        """Lazy Key_Shared, in a commit's change: record what this consumer holds as pending
        for the state's membership (:func:`storage.claims.record_in_flight`). Any consumer
        (a renewal): a seek in ``st`` not followed yet is followed (:meth:`follow_seek`)."""
        self.follow_seek(st)
        if self.lazy:
            claims.record_in_flight(st, self.cid, self.in_flight(st, shared=False))

    def sync_due(self, s: SubscriptionState) -> bool:
        """Lazy Key_Shared: whether membership changed since this consumer last recorded
        what it holds (the others wait for that), or a consumer's lease lapsed."""
        c = s.consumers.get(self.cid)
        return self.lazy and (
            (c is not None and c.synced != s.selector_version)
            or bool(self.watch.lapsed(s) - {self.cid})
        )

    def sync(self) -> SubscriptionState | None:
        """Lazy Key_Shared: one commit that removes the consumers whose lease lapsed, records
        what this consumer holds for the membership and renews its lease, and does the same
        for the process's other consumers of the partition that are due to record and not
        busy (:meth:`Seat.folding_records`): one record commit per partition and process
        after a membership change, not one per consumer. The new state, or None when this
        consumer was removed (it registers again)."""
        cid = self.cid
        self.seat.before_record()
        with self.seat.folding_records() as others:
            started = self.lease.now_ms()

            def change(st: SubscriptionState) -> bool:
                now = self.clock()
                st.purge(self.watch.lapsed(st), now, keep=cid)
                if not self.seat.holds(st):
                    raise Abort(False)
                claims.record_in_flight(st, cid, self.in_flight(st))
                st.consumers[cid].extend(now, self.lease_ms)
                others.record_in(st, now)
                st.last_active_ms = now
                return True

            st, ok = self.seat.commit(change, idempotent=True)
            if ok:
                others.stored(started, version=st.version)
        if not ok:
            self.seat.renew()
            return None
        self.lease.extended(started)
        return st

    def _fetch_key_shared_lazy(self, max_entries: int) -> list[Delivery]:
        """Key_Shared without a commit per fetch (Pulsar's dispatcher keeps what it handed out
        in memory, too): with stable membership a consumer hands out the entries of the slots
        the stored selector gives it, in position order per slot, and remembers them. When
        membership changes (``selector_version``), every such consumer records what it holds
        as ``pending`` (:meth:`sync`), and nobody hands out anything new until all have
        (:func:`storage.claims.unsynced`); then a slot that moved stays blocked for its new
        owner while its previous owner's entries of it are pending (draining). A consumer
        whose lease lapsed is removed first: what it held unrecorded is unacknowledged, and its
        slots' new owners read it again from the cursor. What a fetch hands out is decided by
        :func:`storage.claims.claim_key_shared` on a private copy of the state (its own
        deliveries marked pending there), so the rules are the claiming consumers' rules; a
        delayed entry to hold is recorded by a claim commit (:meth:`_fetch_key_shared`)."""
        self.scan_more = False
        stamps = (self.ml.manifest.change_stamp(), self.seat.state_stamp())
        idle, self._idle = self._idle, None
        if (
            idle is not None
            and None not in stamps
            and idle[0] == stamps
            and time.monotonic() - idle[1] < recheck_interval_s()
        ):
            # Nothing committed to the partition or the subscription since a fetch that found
            # nothing: the consumers of a process woken by one topic's entry skip the others.
            self._idle = idle
            return []
        s = self.seat.state()
        self.follow_seek(s)
        if not self.seat.holds(s):
            self.seat.renew()
            return []
        if self.sync_due(s):
            got = self.sync()
            if got is None:
                return []
            s = got
        if claims.unsynced(s, self.watch.lapsed(s)):
            return []  # another consumer has not recorded its deliveries yet: wait for it
        now = self.clock()
        inflight = self.in_flight(s)
        sel, entries, slots, scanned_to, mstate, win = self._candidates(
            s, now, max_entries, inflight, own_only=True
        )
        if not entries and scanned_to is None:
            if not s.redeliver:
                self._idle = (stamps, time.monotonic())
            return []
        cid = self.cid
        if not inflight and claims.nothing_to_claim_key_shared(
            s, cid=cid, selector=sel, slots=slots
        ):
            self._scan_pos = self._next_scan(entries, None, scanned_to, win)
            self._count_scanned(mstate, win)
            self.waiting_on = frozenset()
            return []
        held = {p: self._due_at(e) for p, e in entries.items() if self._held(e, now)}
        view = _claim_view(s, cid)
        # What this consumer holds counts as pending at it: none of it is handed out again
        # and it leaves ``redeliver``. Only the candidates among it and what ``redeliver``
        # holds matter to the claim (the rest is its own, which blocks nothing): the work
        # does not grow with what it holds.
        if view.redeliver:
            for k in [k for k in view.redeliver if _unkey(k) in inflight]:
                del view.redeliver[k]
        for p in [p for p in slots if p in inflight]:
            slot, count = inflight[p]
            view.pending.setdefault(_key(p), [cid, count, slot])
        if self.acked_here is not None:
            self._count_acked_here(view, slots)
        try:
            claimed, first_unclaimed = claims.claim_key_shared(
                view,
                cid=cid,
                now=now,
                lease_ms=self.lease_ms,
                lapsed=(),
                scan_version=s.selector_version,
                selector=sel,
                slots=slots,
                held=held,
                max_entries=max_entries,
            )
        except Abort as a:
            if not isinstance(a.value, tuple):
                self._scan_pos = None  # _RESCAN: scan again
                return []
            claimed, first_unclaimed = [], a.value[1]
        held_now = {k: view.redeliver[k] for k in view.redeliver.keys() - s.redeliver.keys()}
        if held_now and not self._hold(held_now):
            return []  # removed meanwhile: registered again
        self._scan_pos = self._next_scan(entries, first_unclaimed, scanned_to, win)
        self._count_scanned(mstate, win)
        for p, c in claimed:
            inflight[p] = (slots[p], c)
        self.waiting_on = self._draining(view, sel) if view.pending else frozenset()
        return [Delivery(entries[p], c, self._acked_idx(s, p)) for p, c in claimed]

    def take_new_indexes(
        self, new: NewEntries, max_messages: int, *, examined: bool = False
    ) -> list[int] | None:
        """Lazy Key_Shared, in a steady state (:class:`NewEntries`): hand out this
        consumer's share of the entries a :class:`KeySharedFilter` found (read and slotted
        once for every consumer of the process), with no read of the state, the manifest or
        the entries again, and no claim on a copy of the state: the indexes (in
        ``new.entries``) of the entries handed out, with no object per entry. What a fetch
        would hand out on ``new.state`` (:meth:`_fetch_key_shared_lazy`): the entries of its
        slots after its scan position, in position order, redelivery count 0, their
        acknowledged batch indexes ``new.state``'s (:meth:`acked_indexes_in`); each is
        recorded in flight and the scan moves to ``new.last``. An empty list when it owns
        none of them (its scan moves on too if it was at ``new.after`` or beyond).
        ``examined``: the caller vouches that every entry up to ``new.after`` that this
        consumer's scan has not reached was another's, in steady looks under this
        membership (the dispatcher passes over a consumer that owns none of a look's
        entries): its scan starts at ``new.after``.

        None when a fetch must decide: the state is not steady; this consumer is not
        registered in it as it is now, or scanned under another membership, or is behind
        (has not examined the entries up to ``new.after``) and owns one of them; one of its
        entries is acknowledged, already handed out or held by delayed delivery; or they
        hold more than ``max_messages`` messages (its receiver queue's room). The caller
        (holding the consumer's lock, with no newer state of its own commits than
        ``new.state``) then fetches."""
        if not new.steady or not self.lazy or self.skips is not None:
            return None
        s = new.state
        if self._epoch is None or s.seek_epoch != self._epoch:
            self.follow_seek(s)
            return None  # a seek: a fetch restarts (an older state: a fetch decides)
        cid = self.cid
        scan = self._scan_pos
        if (
            examined
            and scan is not None
            and scan < new.after
            and self._scan_version == s.selector_version
        ):
            scan = self._scan_pos = new.after
        if (
            scan is None
            or self._scan_version != s.selector_version
            or not self.seat.holds(s)
            or scan < new.after
        ):
            return None if cid in new.by_owner else []
        entries = new.entries
        ids = new.by_owner.get(cid)
        if ids is None:
            mine = []
        elif scan == new.after:
            mine = ids  # (the common case: every one of them comes after the scan)
        else:
            mine = [i for i in ids if entries[i].position > scan]
        if not mine:
            if new.last > scan:
                self._scan_pos = new.last
            return []
        inflight = self._inflight
        if len(inflight) > self._prune_at:
            # (Fetches forget what a state shows acknowledged; with none, this does it.)
            self.in_flight(s)
            self._prune_at = 2 * len(inflight) + 256
        now = -1
        messages = 0
        pending = s.pending
        is_acked = s.is_acked
        delayed = self.delayed_enabled
        # Past the last acknowledged entry (where every entry of a live look is), no entry
        # is acknowledged: one comparison, no search of the ranges.
        acked = s.acked
        top = (acked[-1][2], acked[-1][3]) if acked else s.mark_delete
        for i in mine:
            e = entries[i]
            p = e.position
            if p in inflight or (p <= top and is_acked(p)) or (pending and _key(p) in pending):
                return None
            h = e.header
            if h.deliver_at and delayed:
                if now < 0:
                    now = self.clock()
                if self._held(e, now):
                    return None
            messages += h.num_messages
        if messages > max_messages:
            return None
        self._idle = None
        self.scan_more = False
        self.waiting_on = frozenset()
        self._scan_pos = new.last
        slots = new.slots
        for i in mine:
            inflight[entries[i].position] = (slots[i], 0)
        self.handed_directly += len(mine)
        return mine

    def acked_indexes_in(self, s: SubscriptionState, p: Position) -> frozenset[int]:
        """The batch indexes of entry ``p`` that ``s`` holds acknowledged."""
        return self._acked_idx(s, p)

    def current_with(self, new: NewEntries) -> bool:
        """Lazy Key_Shared: whether this consumer has examined every entry ``new`` shows,
        under the membership of ``new.state``: a fetch on that state would give it nothing
        more (every entry of its slots is handed out)."""
        scan = self._scan_pos
        return (
            self.lazy
            and scan is not None
            and self._scan_version == new.state.selector_version
            and scan >= new.last
        )

    def _count_acked_here(self, view: SubscriptionState, slots: dict[Position, int]) -> None:
        """Lazy Key_Shared, before a claim on ``view`` (a private copy): what this process
        acknowledged and has not written yet counts as acknowledged. Such an entry pending at
        another consumer no longer blocks its slot, and no candidate of it is handed out."""
        assert self.acked_here is not None
        cid = self.cid
        others = [k for k, v in view.pending.items() if v[0] != cid]
        asked: list[Position] = [_unkey(k) for k in others]
        asked.extend(slots)
        if not asked:
            return
        done = self.acked_here(asked)
        for p in done:
            slots.pop(p, None)
            k = _key(p)
            v = view.pending.get(k)
            if v is not None and v[0] != cid:
                del view.pending[k]

    def drains_in(self, s: SubscriptionState) -> bool:
        """Key_Shared: whether entries pending at other consumers in ``s`` hold back slots
        this consumer owns there (draining): it gets those slots' later entries only once
        they are acknowledged (or their consumer leaves)."""
        if self.sub_type is not ConsumerType.KeyShared or not s.pending or s.selector is None:
            return False
        try:
            sel = selector_of(s.selector)
        except MALFORMED:
            return False
        return bool(self._draining(s, sel))

    def _draining(self, view: SubscriptionState, sel: StickyKeyConsumerSelector) -> frozenset[str]:
        """The entries pending at other consumers in ``view`` whose slots this consumer owns
        under ``sel``: what it waits on (draining)."""
        me = view.consumers.get(self.cid)
        if me is None:
            return frozenset()
        own = me.sel_id
        owners: dict[int, str | None] = {}
        out = []
        for k, v in view.pending.items():
            if v[0] == self.cid:
                continue
            slot = v[2]
            o = owners.get(slot, "")
            if o == "":
                o = owners[slot] = _selector_owner(sel, slot)
            if o == own:
                out.append(k)
        return frozenset(out)

    def _hold(self, held: dict[str, Sequence[int]]) -> bool:
        """Lazy Key_Shared: record delayed entries of this consumer's slots in ``redeliver``
        (``[0, due ms, slot]`` each), so that the scan may move past them: they come back
        from there when due, to whoever owns their slot then. False if this consumer was
        removed (it registers again)."""

        def change(st: SubscriptionState) -> bool:
            if not self.seat.holds(st):
                raise Abort(False)
            for k, v in held.items():
                if k not in st.redeliver and k not in st.pending and not st.is_acked(_unkey(k)):
                    st.redeliver[k] = list(v)
            return True

        if self.seat.commit(change)[1]:
            return True
        self.seat.renew()
        return False

    def _fetch_key_shared(self, max_entries: int) -> list[Delivery]:
        if self.lazy:
            return self._fetch_key_shared_lazy(max_entries)
        return self._fetch_key_shared_claiming(max_entries)

    def _candidates(
        self,
        s: SubscriptionState,
        now: int,
        max_entries: int,
        skip: Collection[Position] = (),
        *,
        own_only: bool = False,
    ) -> tuple[
        StickyKeyConsumerSelector,
        dict[Position, ReadEntry],
        dict[Position, int],
        Position | None,
        ManifestState,
        entry_cache.Window | None,
    ]:
        """Key_Shared: the stored selector, the entries to decide on (those scanned from the
        scan position, which restarts at the cursor when ``selector_version`` moved, plus
        the redeliveries due at ``now`` but those in ``skip``), their slots, the last entry
        scanned (None if none), the manifest state read and the window scanned.

        The window is read and slotted once per process and selector for all the consumers
        of the subscription (:data:`entry_cache.RUNS`). ``own_only``: of the entries scanned,
        only those of the slots this consumer owns in ``s`` are candidates (the others'
        would be passed over: the work per entry does not grow with the consumers)."""
        if s.selector_version != self._scan_version or self._scan_pos is None:
            self._scan_version = s.selector_version
            self._scan_pos = s.mark_delete
        assert s.selector is not None
        try:
            sel = selector_of(s.selector)
        except MALFORMED as bad:
            raise s.malformed_selector(bad) from bad
        entries: dict[Position, ReadEntry] = {}
        slots: dict[Position, int] = {}
        # A consumer owns about 1/n of the slots: a window n times what it may take gives it
        # about that much (its fetch's own costs, the state's read and the claim, are paid
        # per fetch, not per entry), at least 4 times.
        window = max(max_entries * max(4, len(s.consumers)), 64)
        me = s.consumers.get(self.cid)
        owner = me.sel_id if me is not None else None

        lo, hi = sel.hash_range

        def slot_of(e: ReadEntry) -> int:
            # (:meth:`_slot_of`, with the selector's range taken once: a window slots every
            # entry it reads.)
            return hash_slot(entry_key_hash(e), lo, hi)

        win = None
        if self.skips is None:
            # Behind (a full window after the scan position is slotted already, by this
            # consumer or another): the manifest as last read in this process shows it; a
            # newer one would add entries only after it. No manifest read per fetch.
            mstate = self.ml.state(refresh=False)
            start = self.ml.next_position(mstate, self._scan_pos)
            if start is not None:
                win = entry_cache.RUNS.window(
                    self.ml, mstate, start, window, sel, slot_of, owner, read=False
                )
                if win is not None and len(win) < window:
                    win = None
        if win is None:
            mstate = self.ml.state()
            start = self.ml.next_position(mstate, self._scan_pos)
            if start is not None:
                win = entry_cache.RUNS.window(self.ml, mstate, start, window, sel, slot_of, owner)
        if win is not None:
            es, ss = win.entries, win.slots
            for i in win.own if own_only else range(win.lo, win.hi):
                got = es[i]
                p = got.position
                entries[p] = got
                slots[p] = ss[i]
        self.scan_more = win is not None and len(win) >= window
        for p in claims.due_redeliveries(s, now):
            if p not in entries and p not in skip:
                e = self._read_one(mstate, p)
                if e is not None:
                    entries[p] = e
                    slots[p] = self._slot_of(e, sel)
        scanned_to = win.last if win is not None else None
        return sel, entries, slots, scanned_to, mstate, win

    def _next_scan(
        self,
        candidates: Iterable[Position],
        first_unclaimed: Position | None,
        scanned_to: Position | None,
        win: entry_cache.Window | None,
    ) -> Position | None:
        """:func:`claims.next_scan_pos` over every entry of ``win`` and the ``candidates``
        (those of ``win`` may be only this consumer's: see :meth:`_candidates`)."""
        if first_unclaimed is None or win is None:
            return claims.next_scan_pos(candidates, first_unclaimed, scanned_to, self._scan_pos)
        before = [p for p in candidates if p < first_unclaimed]
        b = win.before(first_unclaimed)
        if b is not None:
            before.append(b)
        return max(before) if before else self._scan_pos

    def _count_scanned(self, mstate: ManifestState, win: entry_cache.Window | None) -> None:
        """Non-durable: count what the scan moved past (retention's skips)."""
        if self.skips is not None and self._scan_pos is not None and win is not None:
            self._counted(mstate, win.scanned(), self._scan_pos)

    def _fetch_key_shared_claiming(self, max_entries: int) -> list[Delivery]:
        s = self.seat.state()
        self.follow_seek(s)
        now = self.clock()
        sel, entries, slots, scanned_to, mstate, win = self._candidates(s, now, max_entries)
        lapsed = self.watch.lapsed(s)
        if not entries and not lapsed:
            return []  # nothing to claim and nobody to purge
        cid = self.cid
        started = self.lease.now_ms()
        if (
            not lapsed
            and self.seat.holds(s)
            and claims.nothing_to_claim_key_shared(s, cid=cid, selector=sel, slots=slots)
        ):
            # Every candidate is another consumer's (or acknowledged, or ours in flight): the
            # claim would abort as idle. Spare the commit; the scan moves past them as then
            # (a selector change since this state resets the scan).
            self._scan_pos = self._next_scan(entries, None, scanned_to, win)
            self._count_scanned(mstate, win)
            return []
        held = {p: self._due_at(e) for p, e in entries.items() if self._held(e, now)}

        def change(st: SubscriptionState) -> tuple[list[tuple[Position, int]], Position | None]:
            if cid in st.consumers and not self.seat.holds(st):
                raise Abort(_LOST)
            return claims.claim_key_shared(
                st,
                cid=cid,
                now=self.clock(),
                lease_ms=self.lease_ms,
                lapsed=self.watch.lapsed(st),
                scan_version=scan_version,
                selector=sel,
                slots=slots,
                held=held,
                max_entries=max_entries,
            )

        scan_version = s.selector_version
        st, result = self.seat.commit(change)
        if result is _LOST:
            self.seat.renew()
            return []
        if result is _RESCAN:
            self._scan_pos = None
            return []
        claimed, first_unclaimed = result
        if claimed is _IDLE:
            claimed = []  # aborted: the lease was not extended either
        else:
            self.lease.extended(started)
        self._scan_pos = self._next_scan(entries, first_unclaimed, scanned_to, win)
        self._count_scanned(mstate, win)
        return [Delivery(entries[p], c, self._acked_idx(st, p)) for p, c in claimed]
