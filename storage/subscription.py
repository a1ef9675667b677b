"""Subscriptions: durable cursors and Pulsar's four dispatch types, with no broker.

One :class:`SubscriptionState` per (partition, subscription), committed like the manifest
(versioned files, put-if-absent), plays the broker's part:

- the cursor: ``mark_delete`` (everything at or before it is acknowledged) plus individually
  acknowledged ranges beyond it (the ack holes) and partly acknowledged batches;
- the consumers, each with a lease it renews; a lapsed lease is a disconnected consumer,
  judged by each observer's own monotonic clock from when it last saw the lease renewed
  (:mod:`filepulsar.storage.consumer_leases`), so wall clocks may differ between hosts;
- Exclusive / Failover: the one active consumer reads sequentially from the cursor and keeps
  its read position in memory; when another consumer becomes active it starts from the cursor,
  so whatever was not acknowledged is delivered again;
- Shared: a consumer claims a run of undelivered entries in one commit (``dispatched`` moves
  past them) and records them as ``pending`` under its id; acks free them; an expired lease or
  a negative ack moves them to ``redeliver`` with the redelivery count + 1;
- Key_Shared: the subscription stores the sticky-key selector; a consumer claims only entries
  whose slot it owns, in position order per slot, and a slot that still has pending entries of
  another consumer is blocked until they drain (Pulsar 4's draining hashes).

The dispatch unit is the entry; for Key_Shared the sticky key of an entry is the one of its
first message, so producers feeding Key_Shared subscriptions should use key-based batching
(as Pulsar's documentation advises).

Where it lives: this module holds :class:`SubscriptionConsumer` (registration, leases,
acknowledgements, seek, close); :mod:`filepulsar.storage.delivery` holds what a fetch hands out
(:class:`~filepulsar.storage.delivery.Delivery`) and the per-type
:class:`~filepulsar.storage.delivery.Dispatcher` the consumer owns (its read positions);
:mod:`filepulsar.storage.consumer_leases` holds the lease timing
(:class:`~filepulsar.storage.consumer_leases.OwnLease`, shared by the two);
:mod:`filepulsar.storage.subscriptions` holds the subscription store and the operations on a
subscription without a consumer (create, list, delete, reset, skip, expire, backlog);
:mod:`filepulsar.storage.cursor` holds the state and its cursor algebra.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext

from filepulsar.dispatch.clock import waits_of, wall_ms
from filepulsar.dispatch.modes import ConsumerType, InitialPosition, KeySharedMode
from filepulsar.dispatch.selectors import selector_for_mode
from filepulsar.dispatch.selectors.base import ConsumerAssignError, StickyKeyConsumerSelector
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.consumer_leases import (
    COUNTS,
    LeaseGroup,
    LeaseHolder,
    OwnLease,
    lease_group,
    watch_for,
)
from filepulsar.storage.cursor import (
    DEFAULT_LEASE_MS,
    ConsumerInfo,
    SubscriptionState,
    T,
    key_pos,
)
from filepulsar.storage.cursor import pos_key as _key
from filepulsar.storage.cursor import selector_add as _selector_add
from filepulsar.storage.delivery import Delivery, Dispatcher, NewEntries
from filepulsar.storage.errors import (
    BlobNotFound,
    BlobStoreError,
    ConsumerBusy,
    FilePulsarError,
    InvalidAckError,
    InvalidConfiguration,
    SubscriptionNotFound,
    TopicNotFound,
)
from filepulsar.storage.forks import in_forked_child
from filepulsar.storage.ledger import EARLIEST, ManagedLedger, Position
from filepulsar.storage.manifest import ManifestState
from filepulsar.storage.names import TopicName, validate_segment
from filepulsar.storage.policies import effective_policies
from filepulsar.storage.retention_skips import RetentionSkips
from filepulsar.storage.subscriptions import (
    SubscriptionStore,
    delete_subscription,
    seek_mark_delete,
    subscription_backlog,
)
from filepulsar.storage.versioned import Abort

_wall_ms = wall_ms


#: Reading only the entries asked for out of large fragments is ManagedLedger's own
#: behaviour now; the name is kept for code written against it.
RangeReadingLedger = ManagedLedger

_LEDGERS: weakref.WeakValueDictionary[tuple[str, str, str, int], ManagedLedger] = (
    weakref.WeakValueDictionary()
)
_LEDGERS_LOCK = threading.Lock()


@in_forked_child
def _fresh_ledgers_lock() -> None:
    """A forked child gets a lock of its own (the shared ledgers are kept): the parent's copy
    may have been held by one of its threads at the fork, and would stay held in the child
    for ever."""
    global _LEDGERS_LOCK
    _LEDGERS_LOCK = threading.Lock()


#: The subscription types that may read a compacted view (as Pulsar's).
_READS_COMPACTED = (ConsumerType.Exclusive, ConsumerType.Failover)


log = logging.getLogger("filepulsar.storage.subscription")

#: How often, at most, this process logs that its lease renewals run late (s).
_LATE_LOG_S = 30.0
_late_logged = [-_LATE_LOG_S]

#: How long :meth:`SubscriptionConsumer.renew_if_due` trusts an unchanged state (ms).
_SYNC_RECHECK_MS = 250
#: How long :meth:`SubscriptionConsumer.state` does not note the same state object again (ms).
_REOBSERVE_MS = 10_000


def shared_ledger(
    store: BlobStore, topic: TopicName, clock: Callable[[], int] | None
) -> ManagedLedger:
    """The process's managed ledger of ``topic`` on ``store``'s root (and the same clock),
    shared by the consumers that read it: one read of each new manifest version per process,
    not one per consumer (a live topic changes its manifest with every entry). Keyed by the
    store's kind and root, not the store object: an application whose client instances each
    open the root (Pulsar's IoT scenario: several clients in one process) shares it too, as
    it shares the process's entry cache, acknowledgement groups and lease groups. Kept while a
    consumer holds it; it holds the clock (``ml.clock``), so its id names it."""
    key = (type(store).__name__, store.root, str(topic), id(clock))
    with _LEDGERS_LOCK:
        ml = _LEDGERS.get(key)
        if ml is None:
            ml = _LEDGERS[key] = RangeReadingLedger(store, topic, clock=clock)
        return ml


class RecordFold:
    """Other consumers of a process whose records of what they hold one consumer's lazy
    Key_Shared record commit folds in (:meth:`SubscriptionConsumer.folding_records`, each
    locked meanwhile): after a membership change, the process's consumers of a partition
    record in one commit, not one each. Each record is the member's own (what its
    dispatcher handed out and holds), so the others still wait for every holder's record
    (Pulsar's draining waits for the previous owner's acknowledgements)."""

    def __init__(self) -> None:
        self.members: list[SubscriptionConsumer] = []
        #: The members the committed attempt recorded for (the last attempt's).
        self.recorded: list[SubscriptionConsumer] = []

    def record_in(self, st: SubscriptionState, now: int, *, extend: bool = True) -> None:
        """In the commit's change (every attempt): record what each member still registered
        under its registration, and not recorded for this membership yet, holds, and extend
        its lease (``extend``: not when the commit extends it already, as a renewal does)."""
        self.recorded = []
        for m in self.members:
            c = st.consumers.get(m.cid)
            if c is None or c.joined != m.joined or c.synced == st.selector_version:
                continue
            m.record_in(st)
            if extend:
                c.extend(now, m.lease_ms)
            self.recorded.append(m)

    def stored(
        self, started_ms: int, *, credit: bool = True, record: bool = True, version: int = -1
    ) -> None:
        """The commit that started at ``started_ms`` is stored: the members' leases run from
        then (``credit``: not when the commit credits them already), counted: one record
        commit (``record``: not a registration or a leaving), the records folded into it."""
        if credit:
            LeaseGroup.credit(self.recorded, started_ms)
        for m in self.recorded:  # a look older than this commit no longer speaks for them
            m._committed = max(m._committed, version)
        COUNTS.add(records=int(record), records_folded=len(self.recorded))


class _Join:
    """One consumer's registration, committed by :func:`_commit_joins` alone or with others
    of its process on the same subscription partition; what came of it."""

    __slots__ = ("done", "error", "joined", "sc", "started")

    def __init__(self, sc: SubscriptionConsumer) -> None:
        self.sc = sc
        self.done = False
        self.joined = -1
        self.error: BaseException | None = None
        self.started = 0  # lease ms before the commit that registered it


def _commit_joins(batch: list[_Join]) -> None:
    """Register every consumer of ``batch`` (the process's, on one subscription partition)
    in one commit, in order, as if each had committed alone: one the state refuses
    (ConsumerBusy, InvalidConfiguration) gets that error and changes nothing, the others
    register. A lazy Key_Shared registration moves the membership on: the newcomers hold
    nothing (recorded as synced with the membership they end in), and the process's other
    consumers of the partition record what they hold in the same commit, not in a record
    commit after it (during which nobody may hand out anything). Marks each done, with its
    ``joined`` number or its error (a storage error: every one's)."""
    lead = batch[0].sc
    cids = {j.sc.cid for j in batch}
    joining = lead.sub_type is ConsumerType.KeyShared and lead._dispatcher.lazy
    fold = RecordFold()

    def change(s: SubscriptionState) -> None:
        fold.recorded = []
        now = lead.clock()
        s.purge(lead._watch.lapsed(s) - cids, now)
        for j in batch:
            if len(batch) == 1:
                j.joined = j.sc._join_in(s, now)  # its refusal is the commit's
                continue
            before = s.copy()
            try:
                j.joined, j.error = j.sc._join_in(s, now), None
            except (ConsumerBusy, InvalidConfiguration) as e:
                j.joined, j.error = -1, e
                for f in dataclasses.fields(s):  # as if it had never tried
                    setattr(s, f.name, getattr(before, f.name))
        if all(j.error is not None for j in batch):
            raise Abort()
        for j in batch:
            if j.error is None and j.sc._dispatcher.lazy:
                s.consumers[j.sc.cid].synced = s.selector_version  # holds nothing yet
        fold.record_in(s, now)  # the others' records, for the membership they joined
        s.last_active_ms = now

    try:
        with lead.folding_records(joining=True) if joining else nullcontext(fold) as fold:
            started = lead._lease.now_ms()
            st, _ = lead.commit(change, idempotent=True)
            if fold.recorded:
                fold.stored(started, record=False, version=st.version)
    except Exception as e:  # a storage error, or the refusal of a lone registration
        for j in batch:
            j.error, j.done = e, True
        return
    for j in batch:
        j.sc._committed = max(j.sc._committed, st.version)
        j.started, j.done = started, True


class SubscriptionConsumer:
    """One consumer on one managed ledger's subscription (storage level).

    The client's ``Consumer`` holds one per partition. Construction registers the consumer
    (creating the subscription at ``initial_position`` if needed). :meth:`fetch`,
    :meth:`renew`, :meth:`renew_if_due`, :meth:`seek` and :meth:`close` are serialised, so a
    housekeeping thread may renew the lease while another thread fetches or acknowledges.

    ``lazy_claims`` (Key_Shared): record what is handed out only when membership changes,
    not in a claim commit per fetch (:meth:`~storage.delivery.Dispatcher._fetch_key_shared_lazy`):
    a delivery then costs no commit with stable membership. A consumer killed meanwhile had
    its deliveries since the last change unrecorded: they are delivered again with the
    redelivery count they had (a recorded one's count grows, as a claim's does). The client
    uses it when no dead-letter policy counts redeliveries; the Spark source claims.

    ``subscription_properties`` are stored when the subscription is created and fixed from
    then on (a consumer passing none uses the stored ones). ``use_consistent_hashing`` is
    Pulsar's broker setting ``subscriptionKeySharedUseConsistentHashing``: with AUTO_SPLIT,
    consistent hashing (default) or auto-split hash ranges; the subscription keeps the
    selector it was created with.

    ``before_record`` (lazy Key_Shared) is called with this consumer before it records what
    it holds for a new membership: the client writes there the acknowledgements it holds
    back (grouped, rate-limited), so that the keys moving to a newcomer wait for no write
    of them.

    ``renew_together`` (durable only): this consumer's lease and those of the process's other
    such consumers of the subscription partition (on the same clock) renew together
    (:class:`~filepulsar.storage.consumer_leases.LeaseGroup`): a renewal or acknowledgement
    commit of one extends them all, so liveness is the process's. The client's consumers use
    it (their process renews them whatever their application does); the Spark source's do
    not (a query's consumer renews as its query runs).

    ``durable=False`` keeps the cursor in this process only and holds back no retention (as
    Pulsar's non-durable cursors): what retention deletes past the consumer before it got it
    is skipped, counted (:attr:`skipped_by_retention`) and reported once per skip through
    ``report_skip`` (default: a warning in the log; if it raises, the fetch raises and
    nothing is skipped).

    Raises
    ------
    ConsumerBusy
        Exclusive subscription with another live consumer, or a different type while other
        consumers are connected.
    InvalidConfiguration
        For a bad type, initial position or Key_Shared mode / ranges, or subscription
        properties that differ from the ones the subscription was created with.
    TopicNotFound
        If the managed ledger does not exist.
    DataLossError
        If the subscription's state is missing although it was created (its creation record
        is there): damage, never a new subscription at ``initial_position``.
    """

    def __init__(
        self,
        store: BlobStore,
        topic: TopicName,
        subscription: str,
        *,
        sub_type: ConsumerType | str = "Exclusive",
        consumer_name: str | None = None,
        initial_position: InitialPosition | str = "Latest",
        priority_level: int = 0,
        key_shared_mode: KeySharedMode | str = "AUTO_SPLIT",
        sticky_ranges: Sequence[tuple[int, int]] | None = None,
        durable: bool = True,
        lease_ms: int = DEFAULT_LEASE_MS,
        start_position: Position | None = None,
        subscription_properties: Mapping[str, str] | None = None,
        use_consistent_hashing: bool = True,
        clock: Callable[[], int] | None = None,
        read_compacted: bool = False,
        lazy_claims: bool = False,
        report_skip: Callable[[str], None] | None = None,
        before_record: Callable[[SubscriptionConsumer], None] | None = None,
        renew_together: bool = False,
    ) -> None:
        validate_segment(subscription, "subscription name")
        self.sub_type = ConsumerType.parse(sub_type)
        if read_compacted and (self.sub_type not in _READS_COMPACTED or not durable):
            raise InvalidConfiguration(
                "read compacted can only be used with Exclusive or Failover persistent "
                f"subscriptions, not {self.sub_type.wire}"
            )
        #: Read a compacted view (storage.compaction) while behind its horizon.
        self.read_compacted = read_compacted
        self.initial_position = InitialPosition.parse(initial_position)
        self.key_shared_mode = KeySharedMode.parse(key_shared_mode)
        if lease_ms <= 0:
            raise InvalidConfiguration(f"lease_ms must be > 0, got {lease_ms}")
        self.topic = topic
        self.subscription = subscription
        self.ml: ManagedLedger = shared_ledger(store, topic, clock)
        self.clock = self.ml.clock
        self.durable = durable
        self.lease_ms = lease_ms
        self.cid = uuid.uuid4().hex[:16]
        self.consumer_name = consumer_name or f"consumer-{self.cid[:8]}"
        self.priority = priority_level
        self.sticky_ranges = list(sticky_ranges) if sticky_ranges else None
        props = dict(subscription_properties or {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in props.items()):
            raise InvalidConfiguration("subscription_properties must map str to str")
        self.requested_properties = props
        self.use_consistent_hashing = bool(use_consistent_hashing)
        if self.key_shared_mode is KeySharedMode.Sticky and not self.sticky_ranges:
            raise InvalidConfiguration("Key_Shared STICKY mode needs sticky hash ranges")
        pol = effective_policies(store, topic)
        self.delayed_enabled = pol.delayed_delivery_enabled and topic.persistent
        self.tick_ms = pol.delayed_delivery_tick_ms
        self.max_ack_ranges = pol.max_unacked_ranges_to_persist
        self._store = SubscriptionStore(store, topic, subscription, clock=clock, ledger=self.ml)
        self._local: SubscriptionState | None = None  # non-durable state
        # Serialises fetches, renewals, seeks and close: the client renews from its
        # housekeeping thread while its application fetches or acknowledges.
        self._lock = threading.RLock()
        # Lease timing, on this process's monotonic clock (ms): wall clocks never decide it.
        self._watch = watch_for(clock)  # others' leases, as this process saw them renewed
        self._lease = OwnLease(waits_of(clock).monotonic, lease_ms)  # this consumer's own
        #: The registration's fencing token: its ``joined`` number in the state. A commit
        #: that claims, renews or negatively acknowledges is this consumer's only while the
        #: state holds it under this number (else it was removed and registers again).
        self.joined = -1
        #: Counts this consumer's registrations: it changes when a lapsed lease was removed
        #: (what it held was handed to others) and the consumer registered again.
        self.registrations = 0
        #: ``registrations`` when the last :meth:`fetch` claimed what it returned.
        self.fetch_registration = 0
        #: :attr:`seeks_followed` when the last :meth:`fetch` handed out what it returned.
        self.fetch_seeks = 0
        #: What this consumer gets next (its read positions), per the subscription type.
        self._dispatcher = Dispatcher(
            self,
            sub_type=self.sub_type,
            ml=self.ml,
            cid=self.cid,
            lease=self._lease,
            watch=self._watch,
            read_compacted=read_compacted,
            delayed_enabled=self.delayed_enabled,
            tick_ms=self.tick_ms,
            lazy=lazy_claims,
        )
        if not durable:
            self._dispatcher.skips = RetentionSkips(
                self.ml, f"non-durable subscription {subscription!r} of {topic}", report_skip
            )
        self._start_position = start_position
        self._before_record = before_record
        self._closed = False
        #: Lazy Key_Shared: the state's change stamp and the lease clock's ms when
        #: :meth:`renew_if_due` last looked whether a record was due.
        self._sync_checked: tuple[tuple[int, int] | None, int] = (None, 0)
        #: The state :meth:`state` last had the lease watch observe, and when (lease ms).
        self._observed: tuple[SubscriptionState | None, int] = (None, 0)
        #: The newest version of the state a commit of this consumer returned.
        self._committed = -1
        #: The process's consumers of this subscription partition on this clock, whose
        #: leases renew together (None: not ``renew_together``, or non-durable; joined once
        #: registered: the registration folds the others' records, :meth:`_register`).
        self._leases: LeaseGroup | None = None
        if durable and renew_together:
            self._leases = lease_group(self.lease_group_key)
        self._register()
        if not durable:
            self._dispatcher.count_from_cursor()
        if self._leases is not None:
            self._leases.join(self)

    @functools.cached_property
    def ack_group_key(self) -> tuple[str, str, str, str] | None:
        """Which process-wide group of pending acknowledgements this consumer's join (the
        client's :class:`~filepulsar.connector.client.ack_grouping.AckGrouper`): one per
        store, partition and subscription, so the consumers of a subscription in one process
        write their grouped acknowledgements in one commit. None (a group of its own) when
        its acknowledgements are its own: non-durable, or reading a compacted view (they
        acknowledge the entries the view hides too)."""
        if not self.durable or self.read_compacted:
            return None
        return ("subscription", self.ml.store.root, str(self.topic), self.subscription)

    @property
    def lease_group_key(self) -> tuple[str, str, str, int]:
        """Which consumers' leases renew together with this one's
        (:class:`~filepulsar.storage.consumer_leases.LeaseGroup`): this process's on the
        same store root, partition and subscription, timed on the same clock (a
        ``ManualClock`` plays a machine of its own)."""
        return (self.ml.store.root, str(self.topic), self.subscription, id(self._watch))

    @property
    def own_lease(self) -> OwnLease:
        """This consumer's lease, on its process's clock (shared with its dispatcher)."""
        return self._lease

    def foldable(self) -> bool:
        """Whether a commit of another consumer of this process may extend this one's lease
        now: open, registered, and its own lease not lapsed (then it renews itself: a
        Failover consumer by leaving and registering again)."""
        return not self._closed and self.joined >= 0 and not self._lease.lapsed()

    def fetch_turn(self) -> AbstractContextManager[object]:
        """A Shared fetch's turn among the process's consumers of this subscription
        partition (:meth:`~filepulsar.storage.delivery.Dispatcher._fetch_shared`): the
        lease group's lock, or none without a group."""
        return self._leases.fetching if self._leases is not None else nullcontext()

    @contextmanager
    def folding_records(self, *, joining: bool = False) -> Iterator[RecordFold]:
        """Lazy Key_Shared: the process's other consumers of this subscription partition
        (its :class:`~filepulsar.storage.consumer_leases.LeaseGroup`) whose record of what
        they hold a record commit of this one folds in (:class:`RecordFold`): lazy, their
        lease foldable, and due to record (the newest state holds them under their
        registration with a membership they have not recorded for; ``joining``: this
        consumer's registration commit changes the membership, so every one of them is due
        in it). Each is locked (tried, never waited for: a busy one records for itself, as
        before) and its ``before_record`` called, and stays locked until the commit is
        stored: what is recorded for it is what it holds, and it hands out nothing
        meanwhile."""
        fold = RecordFold()
        locked: list[SubscriptionConsumer] = []
        try:
            if self._leases is not None and self._dispatcher.lazy:
                s = self.state()
                for m in self._leases.foldable(but=self):
                    if not isinstance(m, SubscriptionConsumer) or not m._dispatcher.lazy:
                        continue
                    c = s.consumers.get(m.cid)
                    if c is None or c.joined != m.joined:
                        continue
                    if c.synced == s.selector_version and not joining:
                        continue
                    if not m._lock.acquire(blocking=False):
                        continue  # busy (perhaps recording for itself): it records alone
                    locked.append(m)
                    if m.foldable():  # (closed, or its lease lapsed, meanwhile: not it)
                        m.before_record()
                        fold.members.append(m)
            yield fold
        finally:
            for m in locked:
                m._lock.release()

    # ------------------------------------------------------------------ state plumbing
    def before_record(self) -> None:
        """Before a lazy Key_Shared record of what this consumer holds: ``before_record``'s
        call (see the class)."""
        if self._before_record is not None:
            self._before_record(self)

    def record_in(self, st: SubscriptionState) -> None:
        """Lazy Key_Shared, in a commit's change, under this consumer's lock: record what it
        holds for the state's membership (:meth:`Dispatcher.record`)."""
        self._dispatcher.record(st)

    def holds(self, s: SubscriptionState) -> bool:
        """Whether ``s`` still has this consumer registered under its current registration
        (:attr:`joined`): the fencing check of its commits."""
        c = s.consumers.get(self.cid)
        return c is not None and c.joined == self.joined

    def _manifest(self) -> ManifestState:
        return self.ml.state()

    def _next_fn(self, mstate: ManifestState) -> Callable[[Position], Position | None]:
        def nxt(p: Position) -> Position | None:
            return self.ml.next_position(mstate, p)

        return nxt

    def commit(
        self,
        change: Callable[[SubscriptionState], T],
        *,
        idempotent: bool = False,
        acks_only: bool = False,
    ) -> tuple[SubscriptionState, T]:
        """Commit ``change`` (to the local state if non-durable). ``idempotent``: applying it
        again to a state that holds it changes nothing (see :meth:`VersionedStore.commit`).
        ``acks_only``: it only acknowledges (hands nothing back, moves no consumer), so
        :meth:`take_new` may still go by an older state.
        Storage-level: the claims, acknowledgements and registrations of this consumer."""
        removed = [0]  # the other consumers the committed attempt removed (lease counts)

        def counted(s: SubscriptionState) -> T:
            removed[0] = 0
            before = len(s.consumers) - (self.cid in s.consumers)
            result = change(s)
            removed[0] = before - len(s.consumers) + (self.cid in s.consumers)
            return result

        if not self.durable:
            assert self._local is not None
            copy = SubscriptionState.decode(self._local.encode(), "local")
            try:
                result = change(copy)
            except Abort as a:
                return self._local, a.value
            self._local = copy
            self._watch.observe(copy)
            return copy, result
        try:
            done = self._store.commit(counted, idempotent=idempotent)
            self._watch.observe(done[0])  # the newest state now: its renewals seen
            if not acks_only:
                self._committed = max(self._committed, done[0].version)
            if removed[0] > 0:
                COUNTS.add(removed=removed[0])
            return done
        except BlobNotFound:
            raise
        except BlobStoreError as e:  # a full disk, a failing object store...
            raise BlobStoreError(
                f"{self._store.what}: storing the change (an acknowledgement, a delivery, a "
                f"consumer joining or leaving) failed: {e}"
            ) from e

    def state_stamp(self, *, drain: bool = True) -> tuple[int, int] | None:
        """A value that changes whenever a commit of the subscription's state may have landed
        (None: this process cannot tell); see :meth:`VersionedStore.change_stamp` (and its
        ``drain``)."""
        return self._store.change_stamp(drain=drain) if self.durable else None

    def state(self, *, drain: bool = True) -> SubscriptionState:
        """The newest subscription state (read-only); the renewals in it are noted as seen
        (:meth:`~filepulsar.storage.consumer_leases.LeaseWatch.observe`). ``drain``: as
        :meth:`~filepulsar.storage.versioned.VersionedStore.latest`'s (False: for a caller
        that reads the process's queued events itself before it looks, as the push
        dispatcher does at the start of each round)."""
        if not self.durable:
            assert self._local is not None
            return self._local
        s = self._store.latest(drain=drain)
        seen, at = self._observed
        now = self._lease.now_ms()
        if s is not seen or now - at >= _REOBSERVE_MS:
            # (The same state read again holds the same renewals: noted once.)
            self._watch.observe(s)
            self._observed = (s, now)
        return s

    def _initial_state(self) -> SubscriptionState:
        m = self._manifest()
        now = self.clock()
        if self._start_position is not None:
            sp = self._start_position
            md = Position(sp.ledger_id, sp.entry_id - 1) if sp.entry_id > 0 else EARLIEST
            if sp.entry_id == 0:
                # the entry before (ledger, 0) is the last of an earlier ledger, or nothing
                prev = [lg for lg in m.ledgers if lg.ledger_id < sp.ledger_id and lg.entries]
                md = Position(prev[-1].ledger_id, prev[-1].entries - 1) if prev else EARLIEST
        elif self.initial_position is InitialPosition.Latest:
            md = m.last_position()
        else:
            md = EARLIEST
        sel = None
        if self.sub_type is ConsumerType.KeyShared:
            sel = self._new_selector().to_dict()
        return SubscriptionState(
            topic=str(self.topic),
            name=self.subscription,
            sub_type=self.sub_type,
            created_ms=now,
            last_active_ms=now,
            mark_delete=md,
            dispatched=md,
            key_shared_mode=self.key_shared_mode,
            selector=sel,
            properties=dict(self.requested_properties),
        )

    def _new_selector(self) -> StickyKeyConsumerSelector:
        return selector_for_mode(
            self.key_shared_mode, use_consistent_hashing=self.use_consistent_hashing
        )

    @property
    def subscription_properties(self) -> dict[str, str]:
        """The properties the subscription was created with. They are fixed at creation, so
        the newest state this consumer has seen (its registration's at least) has them: no
        look at the store while the store's cache holds a state (it reads one when its cache
        is empty: the subscription's folder found gone, a cancelled commit)."""
        if not self.durable:
            assert self._local is not None
            return dict(self._local.properties)
        return dict(self._store.latest(refresh=False).properties)

    def _register(self) -> None:
        if not self.ml.manifest.exists():
            raise TopicNotFound(f"topic {self.topic} does not exist")
        if self.durable:
            if not self._store.exists():
                # DataLossError where the subscription's state was lost (never re-created)
                self._store.create(self._initial_state())
            else:
                self._store.record_creation()  # a creation cut short before its record
            self.state()  # the renewals of the consumers there, seen from now on
        else:
            self._local = self._initial_state()
        req = _Join(self)
        if self._leases is None:
            _commit_joins([req])
        else:
            # With the others of the process registering on this partition meanwhile (their
            # subscribe calls at once): one commit for all of them.
            self._leases.joins.run(req, _commit_joins)
        if req.error is not None:
            raise req.error
        self.joined = req.joined
        self.registrations += 1
        self._lease.extended(req.started)

    def _join_in(self, s: SubscriptionState, now: int) -> int:
        """In a registration commit's change (:func:`_commit_joins`): register this consumer
        in ``s``; its ``joined`` number there. Raises ConsumerBusy or InvalidConfiguration
        when ``s`` refuses it."""
        cid, name, prio, mode = self.cid, self.consumer_name, self.priority, self.sub_type
        if cid in s.consumers:  # applied already (an attempt whose outcome was unknown)
            s.consumers[cid].extend(now, self.lease_ms)
            s.last_active_ms = now
            return s.consumers[cid].joined
        live = s.connected()
        wanted = self.requested_properties
        if wanted and wanted != s.properties:
            raise InvalidConfiguration(
                f"subscription {self.subscription!r} on {self.topic} was created with "
                f"properties {s.properties}; they are fixed at creation, so {wanted} cannot "
                "be applied (unsubscribe and subscribe again to change them)"
            )
        if s.sub_type != mode:
            if live:
                raise ConsumerBusy(
                    f"subscription {self.subscription!r} on {self.topic} is of type "
                    f"{s.sub_type.wire} and has consumers; cannot attach a {mode.wire} "
                    "consumer"
                )
            s.sub_type = mode
            if mode is ConsumerType.KeyShared:
                s.selector = self._new_selector().to_dict()
                s.key_shared_mode = self.key_shared_mode
        if mode is ConsumerType.Exclusive and live:
            raise ConsumerBusy(
                f"Exclusive consumer is already connected to subscription "
                f"{self.subscription!r} on {self.topic} ({live[0].name})"
            )
        sel_id = cid
        if mode is ConsumerType.KeyShared:
            if s.key_shared_mode != self.key_shared_mode:
                if live:
                    raise ConsumerBusy(
                        f"subscription {self.subscription!r} uses Key_Shared mode "
                        f"{s.key_shared_mode.wire}; this consumer asked for "
                        f"{self.key_shared_mode.wire}"
                    )
                s.key_shared_mode = self.key_shared_mode
                s.selector = self._new_selector().to_dict()
            sel = s.selector_state() if s.selector else self._new_selector()
            try:
                sel_id = _selector_add(sel, cid, name, self.sticky_ranges)
            except ConsumerAssignError as e:
                raise InvalidConfiguration(
                    f"Key_Shared consumer {name!r} refused on {self.topic}: {e}"
                ) from e
            s.selector = sel.to_dict()
            s.selector_version += 1
        s.join_seq += 1
        info = ConsumerInfo(cid, name, prio, now, s.join_seq, sel_id)
        info.extend(now, self.lease_ms)
        if self._dispatcher.lazy:
            info.synced = s.selector_version  # holds nothing yet
        s.consumers[cid] = info
        s.last_active_ms = now
        return s.join_seq

    def renew_if_due(self) -> None:
        """Renew this consumer's lease when a third of it has passed (cheap otherwise). A
        lazy Key_Shared consumer (``lazy_claims``) also records what it holds when membership
        changed (the others wait for it), even while its application fetches nothing."""
        with self._lock:
            if self._closed:
                return
            if self._lease.due():
                self._renew_due()
            elif self._dispatcher.lazy:
                # The state is read again only when a commit may have landed, or a quarter
                # of a second on (a lease lapsing is a matter of time): housekeeping rounds
                # come at every group of acknowledgements due, for every partition.
                stamp = self.state_stamp()
                now = self._lease.now_ms()
                last = self._sync_checked
                if stamp is None or stamp != last[0] or now - last[1] >= _SYNC_RECHECK_MS:
                    self._sync_checked = (stamp, now)
                    if self._dispatcher.sync_due(self.state()):
                        self._dispatcher.sync()

    def _renew_if_free(self) -> None:
        """:meth:`renew_if_due`'s renewal for :func:`renew_due`: passed over while another
        thread holds this consumer (a fetch, another member's record commit) and half its
        lease is left, since another member's commit may extend it meanwhile; waited for
        after that."""
        urgent = self._lease.since_extended_ms() * 2 >= self.lease_ms
        if not self._lock.acquire(blocking=urgent):
            return
        try:
            if not self._closed and self._lease.due():
                self._renew_due()
        finally:
            self._lock.release()

    def lease_lapsed(self) -> bool:
        """Whether this consumer's lease may have lapsed: a lease since the start of its last
        renewal that committed, on this process's monotonic clock (no observer can have judged
        it lapsed before that), so that another consumer may have removed it: renew before
        handing out what it holds."""
        return self._lease.lapsed()

    def _renew_due(self) -> None:
        """Renew a lease found due (under :attr:`_lock`): one renewal of the process's group
        of this partition at a time, and none if another member's commit renewed this one
        meanwhile (that commit extended every member's lease)."""
        group = self._leases
        if group is None:
            self.renew()
            return
        with group.renewing:
            if self._lease.due():
                self.renew()

    def renew(self) -> None:
        """Extend the lease, and in the same commit the leases of the process's other
        consumers of this subscription partition (on the same clock) that may be extended
        (:meth:`foldable`): one renewal commit per partition and process, not one per
        consumer (:class:`~filepulsar.storage.consumer_leases.LeaseGroup`).

        A lease that lapsed but that nobody acted on yet (this consumer is still registered)
        is simply extended: nothing it holds went to anyone else. Failover excepted: another
        consumer may have been the active one meanwhile, so a Failover consumer past its lease
        (:meth:`lease_lapsed`) leaves and registers again, restarting from the cursor. A
        consumer that was removed registers again, as Pulsar's client resubscribes after a
        disconnect (what it had pending was already handed back, and :attr:`registrations`
        changes); an Exclusive one then fails with ConsumerBusy if another took over. Does
        nothing once closed.
        """
        cid = self.cid
        others = [] if self._leases is None else self._leases.foldable(but=self)
        extended: list[LeaseHolder] = []  # the others the committed attempt extended
        aborted = [False]  # the last attempt wrote nothing (this consumer was removed)

        def change(s: SubscriptionState) -> bool:
            extended.clear()
            now = self.clock()
            s.purge(self._watch.lapsed(s), now, keep=cid)
            aborted[0] = not self.holds(s)
            if aborted[0]:
                raise Abort(False)
            extended.extend(LeaseGroup.extend_in(s, others, now))
            if rejoin:
                s.remove_consumer(cid, now)
                return False
            self._dispatcher.record(s)  # lazy Key_Shared: what it holds, for this membership
            fold.record_in(s, now, extend=False)  # and the others' (extended above)
            s.consumers[cid].extend(now, self.lease_ms)
            s.last_active_ms = now
            return True

        with self._lock:
            if self._closed:
                return
            records = self._dispatcher.lazy and self._dispatcher.sync_due(self.state())
            if records:
                self.before_record()  # this renewal records what it holds for a new membership
            lapsed = self.lease_lapsed()
            rejoin = self.sub_type is ConsumerType.Failover and lapsed
            with self.folding_records() if records else nullcontext(RecordFold()) as fold:
                started = self._lease.now_ms()
                self._note_late(started, lapsed)
                st_, ok = self.commit(change, idempotent=True)
                if ok and records:
                    fold.stored(started, credit=False, version=st_.version)
            if not aborted[0]:
                COUNTS.add(renewals=1)
            LeaseGroup.credit(extended, started)
            if ok:  # its own renewal: credited even though its lease had lapsed
                self._lease.extended(started)
                COUNTS.add(extended=1)
            else:
                self._dispatcher.restart()
                self._register()
                COUNTS.add(registered_again=1)
            self._lease.touched()

    def _note_late(self, started: int, lapsed: bool) -> None:
        """Count a renewal that starts late (due at a third of the lease, started past two
        thirds) or past the lease, and say so in the log (once per ``_LATE_LOG_S``): the
        thread renewing cannot keep up, and leases may lapse."""
        since = self._lease.since_extended_ms()
        if lapsed:
            COUNTS.add(lapsed=1)
        if since * 3 < self.lease_ms * 2:
            return
        COUNTS.add(late=1)
        now = time.monotonic()
        if now - _late_logged[0] >= _LATE_LOG_S:
            _late_logged[0] = now
            log.warning(
                "consumer %s on %s: lease renewal starting %d ms after the start of the last "
                "commit that extended the lease (lease %d ms, due at a third)%s: the thread "
                "renewing leases cannot keep up (a saturated host?)",
                self.consumer_name,
                self.topic,
                since,
                self.lease_ms,
                "; the lease lapsed" if lapsed else "",
            )

    # ------------------------------------------------------------------ fetching
    def fetch(self, max_entries: int = 100) -> list[Delivery]:
        """Up to ``max_entries`` entries for this consumer, per the subscription type
        (:class:`~filepulsar.storage.delivery.Dispatcher`), the lease renewed first when due.

        Returns an empty list when nothing is available (or, Failover, when not active).
        """
        with self._lock:
            if not self._closed and self._lease.due():
                self._renew_due()
            out = self._dispatcher.fetch(max_entries)
            self.fetch_registration = self.registrations
            self.fetch_seeks = self._dispatcher.seeks_followed
            return out

    def take_new(
        self, new: NewEntries, max_messages: int, *, examined: bool = False
    ) -> list[Delivery] | None:
        """Lazy Key_Shared: this consumer's share of the entries a
        :class:`~filepulsar.storage.delivery.KeySharedFilter` found, handed out as a fetch
        on ``new.state`` would, with no storage read
        (:meth:`~filepulsar.storage.delivery.Dispatcher.take_new_indexes`). None: fetch instead
        (the state is not steady, this consumer committed a newer state since (a negative
        acknowledgement, a record of what it holds), its lease is due for renewal, ...).
        ``examined``: see the dispatcher's ``take_new_indexes``."""
        mine, _ = self.take_new_indexes(new, max_messages, examined=examined)
        if mine is None:
            return None
        s, es = new.state, new.entries
        return [Delivery(es[i], 0, self.acked_indexes_in(s, es[i].position)) for i in mine]

    def take_new_indexes(
        self, new: NewEntries, max_messages: int, *, examined: bool = False
    ) -> tuple[list[int] | None, bool]:
        """:meth:`take_new` as the indexes (in ``new.entries``) of the entries handed out
        (:meth:`~filepulsar.storage.delivery.Dispatcher.take_new_indexes`: read only, no
        object per entry), and whether this consumer is then current with ``new``
        (:meth:`current_with`), under one hold of its lock."""
        with self._lock:
            if self._closed or self._committed > new.state.version or self._lease.due():
                out: list[int] | None = None if self.cid in new.by_owner else []
            else:
                d = self._dispatcher
                out = d.take_new_indexes(new, max_messages, examined=examined)
                if out:
                    self.fetch_registration = self.registrations
                    self.fetch_seeks = d.seeks_followed
                    return out, True  # (its scan moved to new.last, under new's membership)
            return out, out is not None and self._dispatcher.current_with(new)

    def acked_indexes_in(self, s: SubscriptionState, p: Position) -> frozenset[int]:
        """The batch indexes of entry ``p`` that ``s`` holds acknowledged (what
        :meth:`take_new` hands out with it)."""
        return self._dispatcher.acked_indexes_in(s, p)

    @property
    def seeks_followed(self) -> int:
        """How many seeks or cursor resets by others (another consumer, another process,
        an admin) this consumer followed: its client drops what it queued and tracks from
        before one, as Pulsar's client clears its receiver queue when the seek disconnects it
        (:meth:`~filepulsar.storage.delivery.Dispatcher.follow_seek`)."""
        return self._dispatcher.seeks_followed

    def current_with(self, new: NewEntries) -> bool:
        """Lazy Key_Shared: whether this consumer has examined, under the membership of
        ``new.state``, every entry ``new`` shows (a fetch on that state would give it
        nothing more)."""
        with self._lock:
            return self._dispatcher.current_with(new)

    def lapsed(self, s: SubscriptionState) -> frozenset[str]:
        """The consumers of ``s`` whose lease this process has seen lapse."""
        return self._watch.lapsed(s)

    @property
    def handed_directly(self) -> int:
        """Lazy Key_Shared: entries handed out by :meth:`take_new` (no fetch)."""
        return self._dispatcher.handed_directly

    @property
    def fetches(self) -> int:
        """Fetches made (:meth:`fetch`)."""
        return self._dispatcher.fetches

    @property
    def scan_position(self) -> Position | None:
        """Key_Shared: how far this consumer has examined entries (None: from the cursor on
        its next fetch). A fetch that returned nothing but moved it may find more at once."""
        return self._dispatcher.scan_position

    @property
    def scan_more(self) -> bool:
        """Key_Shared: whether the last fetch's scan stopped at the end of its window with
        entries after it: a fetch that gave less than asked may find more at once."""
        return self._dispatcher.scan_more

    @property
    def waiting_on(self) -> frozenset[str]:
        """Lazy Key_Shared: the entries (``"ledger:entry"`` keys) pending at other consumers
        whose slots this consumer owns now, as of its last fetch: the acknowledgements it
        waits on before it gets more of those slots (draining)."""
        return self._dispatcher.waiting_on

    def drains_in(self, s: SubscriptionState) -> bool:
        """Key_Shared: whether, in ``s``, entries pending at other consumers hold back slots
        this consumer owns (draining; :meth:`~filepulsar.storage.delivery.Dispatcher.drains_in`):
        a fetch that gave nothing may give more once they are acknowledged."""
        return self._dispatcher.drains_in(s)

    def waits_on_acked_here(self) -> bool:
        """Lazy Key_Shared: whether this process has acknowledged (not yet written) one of
        the entries :attr:`waiting_on` names, by :meth:`count_acked_here`'s callback: a fetch
        now may give more (its acknowledgement landed after the last fetch looked)."""
        acked, waiting = self._dispatcher.acked_here, self._dispatcher.waiting_on
        if acked is None or not waiting:
            return False
        return bool(acked([key_pos(k) for k in waiting]))

    def count_acked_here(
        self, acked: Callable[[Iterable[Position]], Collection[Position]] | None
    ) -> None:
        """Lazy Key_Shared: ``acked(positions)`` says which of them this process has
        acknowledged and not yet written (the client's grouped acknowledgements, shared by
        its consumers of this subscription partition); fetches count those acknowledged, so
        that the draining of a slot ends when its previous owner acknowledges, as a broker's
        does, not when the acknowledgement is stored. Across processes the stored state stays
        the rule."""
        self._dispatcher.acked_here = acked

    @property
    def skipped_by_retention(self) -> int:
        """Non-durable: messages retention deleted past this consumer's read frontier before
        it got them (its cursor holds no retention back, as in Pulsar). Each skip is logged
        once as a warning (:attr:`retention_warning` is the last line); the consumer goes on
        at the first message that remains. Always 0 for a durable subscription."""
        skips = self._dispatcher.skips
        return 0 if skips is None else skips.skipped

    @property
    def retention_warning(self) -> str | None:
        """The last skip's log line (see :attr:`skipped_by_retention`)."""
        skips = self._dispatcher.skips
        return None if skips is None else skips.last_warning

    def is_active(self, state: SubscriptionState | None = None) -> bool:
        """Whether this consumer is the one delivering: always but Failover, where it is the
        active one among the connected consumers (see :meth:`Dispatcher.is_active`)."""
        return self._dispatcher.is_active(state)

    # ------------------------------------------------------------------ acknowledging
    def acknowledge(self, items: Iterable[tuple[Position, int, int]]) -> None:
        """Acknowledge messages: ``(position, batch_index, batch_size)`` each (batch index -1
        acknowledges the whole entry). Durable when this returns; acknowledging what is
        already acknowledged writes nothing. The commit renews the leases of the process's
        consumers of this subscription partition (this one's included, :meth:`foldable`):
        while acknowledgements are written no renewal commit is due."""
        items = list(items)
        if not items:
            return
        members = [] if self._leases is None else self._leases.foldable()
        extended: list[LeaseHolder] = []  # the leases the committed attempt extended
        started = self._lease.now_ms()
        # The manifest as this process last read it, no look: every entry acknowledged here
        # was in a state it read (the positions that follow one another there are exact),
        # and one it never read (an id from elsewhere) only folds into the cursor later.
        mstate = self._manifest() if self.read_compacted else self.ml.state(refresh=False)
        nxt = self._next_fn(mstate)
        gaps = (
            self._dispatcher.with_view_gaps(
                mstate, [Position(pos.ledger_id, pos.entry_id) for pos, _, _ in items]
            )
            if self.read_compacted
            else []
        )

        # Whole entries in one pass (a group of acknowledgements folds once), then the batch
        # indexes: an index completing its batch acknowledges the entry then. A Position (what
        # the client passes) is taken as it is; another pair of ids (a MessageId) is made one.
        whole = [
            p if p.__class__ is Position else Position(p.ledger_id, p.entry_id)
            for p, idx, size in items
            if idx < 0 or size <= 1
        ]
        indexes = (
            []
            if len(whole) == len(items)
            else [
                (Position(p.ledger_id, p.entry_id), idx, size)
                for p, idx, size in items
                if idx >= 0 and size > 1
            ]
        )

        def change(s: SubscriptionState) -> bool:
            extended.clear()
            changed = False
            for a, b in gaps:
                changed |= s.ack_range(a, b, nxt)
            changed |= s.ack_all(whole, nxt)
            for p, idx, size in indexes:
                changed |= s.ack_batch_index(p, idx, size, nxt)
            s.cap_ack_ranges(self.max_ack_ranges)
            if not changed:
                raise Abort()  # nothing new: no version written
            now = self.clock()
            s.last_active_ms = now
            extended.extend(LeaseGroup.extend_in(s, members, now))
            return True

        if self.commit(change, idempotent=True, acks_only=True)[1]:
            LeaseGroup.credit(extended, started)

    def acknowledge_cumulative(self, position: Position) -> None:
        """Acknowledge every entry up to and including ``position`` (Exclusive/Failover only).

        Raises
        ------
        InvalidAckError
            On Shared and Key_Shared subscriptions, as Pulsar refuses it.
        """
        if self.sub_type in (ConsumerType.Shared, ConsumerType.KeyShared):
            raise InvalidAckError(
                f"cumulative acknowledgement is not allowed on {self.sub_type.wire} subscriptions "
                "(use acknowledge)"
            )
        nxt = self._next_fn(self._manifest())
        p = Position(position.ledger_id, position.entry_id)

        def change(s: SubscriptionState) -> None:
            if not s.ack_cumulative(p, nxt):
                raise Abort()  # already acknowledged: no version written

        self.commit(change, idempotent=True, acks_only=True)

    def negative_acknowledge(self, positions: Iterable[Position], delay_ms: int) -> None:
        """Redeliver these entries after ``delay_ms`` with their redelivery count + 1.

        Ignored once this consumer's registration was removed (its lease lapsed): what it held
        was handed back already, as Pulsar's broker ignores a redelivery request for messages
        the consumer no longer holds."""
        ps = [Position(p.ledger_id, p.entry_id) for p in positions]
        if not ps:
            return
        cid = self.cid
        held = self._dispatcher.in_flight()  # lazy Key_Shared: handed out, unrecorded

        def change(s: SubscriptionState) -> None:
            if not self.holds(s):
                raise Abort()
            t = self.clock()
            for p in ps:
                k = _key(p)
                if s.is_acked(p):
                    continue
                cur = s.pending.pop(k, None)
                if cur is not None and cur[0] != cid:
                    s.pending[k] = cur  # not ours any more
                    continue
                old = s.redeliver.get(k)
                mine = held.get(p)
                if cur is None and mine is not None:
                    cur = [cid, mine[1], mine[0]]
                count = (cur[1] if cur else old[0] if old else 0) + 1
                slot = cur[2] if cur else -1
                s.redeliver[k] = [count, t + delay_ms, slot]

        with self._lock:
            self.commit(change)
            for p in ps:
                self._dispatcher.handed_back(p)

    def seek(self, position: Position | None) -> None:
        """Reset the cursor so the next message is ``position`` (None: the end).

        Pending and scheduled redeliveries are cleared, as Pulsar's seek does.
        """
        md = seek_mark_delete(self.ml, self._manifest(), position)
        with self._lock:
            st, _ = self.commit(lambda s: s.seek(md), idempotent=True)
            self._dispatcher.seeked(st)

    def close(self) -> None:
        """Unregister; what this consumer had pending is redelivered to others."""
        with self._lock:  # after a renewal in progress, which then cannot register again
            if self._closed:
                return
            self._closed = True
            if self._leases is not None:
                self._leases.leave(self)
            cid = self.cid
            # Leaving moves a lazy Key_Shared membership on: the process's other consumers of
            # the partition record what they hold for it in this commit (as a registration).
            leaving = self.sub_type is ConsumerType.KeyShared and self._dispatcher.lazy
            fold = RecordFold()

            def leave(s: SubscriptionState) -> None:
                fold.recorded = []
                if not self.holds(s):
                    s.remove_consumer(cid, self.clock())
                    return
                self._dispatcher.record(s)  # lazy Key_Shared: handed back, count + 1
                now = self.clock()
                s.remove_consumer(cid, now)
                fold.record_in(s, now)

            try:
                with self.folding_records(joining=True) if leaving else nullcontext(fold) as fold:
                    started = self._lease.now_ms()
                    st_, _ = self.commit(leave, idempotent=True)
                    if fold.recorded:
                        fold.stored(started, record=False, version=st_.version)
            except (SubscriptionNotFound, TopicNotFound):
                pass  # the subscription (or topic) is gone already: nothing to unregister from

    def unsubscribe(self) -> None:
        """Delete the subscription (refused while other consumers are connected)."""
        s = self.state()
        others = [c.name for c in s.connected(self._watch.lapsed(s)) if c.cid != self.cid]
        if others:
            raise ConsumerBusy(
                f"subscription {self.subscription!r} on {self.topic} has other connected "
                f"consumers {others}"
            )
        self._closed = True
        if self.durable:
            delete_subscription(self.ml.store, self.topic, self.subscription)

    def backlog(self) -> int:
        """Messages not yet acknowledged (entries beyond the cursor, counted by messages)."""
        s = self.state()
        return subscription_backlog(self.ml, self.ml.state(), s)


def renew_due(
    consumers: Iterable[SubscriptionConsumer],
    failed: Callable[[SubscriptionConsumer, Exception], None],
    *,
    look: bool = True,
) -> None:
    """A housekeeping pass over many consumers: :meth:`SubscriptionConsumer.renew_if_due`'s
    work, once per :class:`~filepulsar.storage.consumer_leases.LeaseGroup` (the process's
    consumers of one subscription partition), and never waiting long on a busy consumer:

    - leases: a member whose lease is due renews the group's (its commit extends every
      member that may be extended, so the next member is not due any more); a member another
      thread holds (fetching, or recorded for by another's commit) is passed over while half
      its lease is left (:meth:`SubscriptionConsumer._renew_if_free`);
    - lazy Key_Shared records: one look at the partition's state for the whole group (when a
      commit may have landed, or a quarter of a second on), and a member due to record what
      it holds for a new membership records, folding in the others due
      (:meth:`~filepulsar.storage.delivery.Dispatcher.sync`); a busy one is passed over (its
      own fetch records, or the next look).

    ``look=False``: the records' look takes each partition's state as this process last
    read or committed it (no look of its own): for consumers whose dispatcher looks at every
    commit landing in their subscription's folders and at every partition each recheck
    interval (the push dispatcher's), so that a pass a second adds no look per partition.

    A storage error is handed to ``failed`` with the consumer it is about (the others go
    on)."""
    groups: dict[int, list[SubscriptionConsumer]] = {}
    for sc in consumers:
        groups.setdefault(id(sc._leases) if sc._leases is not None else id(sc), []).append(sc)
    for members in groups.values():
        for m in members:
            if not m._closed and m._lease.due():
                try:
                    m._renew_if_free()
                except (FilePulsarError, OSError) as e:
                    failed(m, e)
        lazy = [m for m in members if m._dispatcher.lazy and not m._closed]
        if lazy:
            try:
                _records_if_due(lazy, look)
            except (FilePulsarError, OSError) as e:
                failed(lazy[0], e)


def _records_if_due(lazy: list[SubscriptionConsumer], look: bool = True) -> None:
    """:func:`renew_due`'s look for records due, for lazy Key_Shared consumers of one
    subscription partition in this process (``look``: see there)."""
    first = lazy[0]
    if not look:
        _records_due_in(
            lazy, first._store.latest(refresh=False) if first.durable else first.state()
        )
        return
    stamp = first.state_stamp()
    now = first._lease.now_ms()
    last = first._sync_checked
    if stamp is not None and stamp == last[0] and now - last[1] < _SYNC_RECHECK_MS:
        return
    passed = _records_due_in(lazy, first.state())
    for m in lazy:
        m._sync_checked = (None, 0) if passed else (stamp, now)


def _records_due_in(lazy: list[SubscriptionConsumer], s: SubscriptionState) -> bool:
    """The members of ``lazy`` due to record in ``s`` record (one commit folds in the others
    due and not busy); whether one was passed over, busy."""
    first = lazy[0]
    passed = False
    for m in lazy:
        if m._closed or not m._dispatcher.sync_due(s):
            continue
        if not m._lock.acquire(blocking=False):
            passed = True  # busy: its fetch records, else the next look
            continue
        try:
            if not m._closed and m._dispatcher.sync_due(m.state()):
                m._dispatcher.sync()  # folds in the other members due and not busy
        finally:
            m._lock.release()
        s = first.state()
    return passed
