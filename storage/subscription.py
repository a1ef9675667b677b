"""Subscriptions: durable cursors and Pulsar's four dispatch types, with no broker.

One :class:`SubscriptionState` per (partition, subscription), committed like the manifest
(versioned files, put-if-absent), plays the broker's part:

- the cursor: ``mark_delete`` (everything at or before it is acknowledged) plus individually
  acknowledged ranges beyond it (the ack holes) and partly acknowledged batches;
- the consumers, each with a lease it renews; an expired lease is a disconnected consumer;
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
(as Pulsar's documentation advises). Leases assume loosely synchronised clocks.
"""

from __future__ import annotations

import bisect
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from filepulsar.dispatch.clock import wall_ms
from filepulsar.dispatch.delayed import should_delay
from filepulsar.dispatch.failover import active_consumer
from filepulsar.dispatch.hashing import sticky_key
from filepulsar.dispatch.modes import ConsumerType, InitialPosition, KeySharedMode
from filepulsar.dispatch.selector_base import ConsumerAssignError, StickyKeyConsumerSelector
from filepulsar.dispatch.selectors import selector_for_mode, selector_from_dict
from filepulsar.storage import paths
from filepulsar.storage.blobstore_port import BlobStore
from filepulsar.storage.cursor import (
    _END as _END,
)
from filepulsar.storage.cursor import (
    _IDLE as _IDLE,
)
from filepulsar.storage.cursor import (
    _LOST as _LOST,
)
from filepulsar.storage.cursor import (
    _RESCAN as _RESCAN,
)
from filepulsar.storage.cursor import (
    _SEL_SEP as _SEL_SEP,
)
from filepulsar.storage.cursor import (
    DEFAULT_LEASE_MS as DEFAULT_LEASE_MS,
)
from filepulsar.storage.cursor import (
    INITIAL_POSITIONS as INITIAL_POSITIONS,
)
from filepulsar.storage.cursor import (
    KEY_SHARED_MODES as KEY_SHARED_MODES,
)
from filepulsar.storage.cursor import (
    STATE_FORMAT as STATE_FORMAT,
)
from filepulsar.storage.cursor import (
    SUB_TYPES as SUB_TYPES,
)
from filepulsar.storage.cursor import (
    ConsumerInfo as ConsumerInfo,
)
from filepulsar.storage.cursor import (
    Pos as Pos,
)
from filepulsar.storage.cursor import (
    SubscriptionState as SubscriptionState,
)
from filepulsar.storage.cursor import (
    T as T,
)
from filepulsar.storage.cursor import (
    _key as _key,
)
from filepulsar.storage.cursor import (
    _prev_position as _prev_position,
)
from filepulsar.storage.cursor import (
    _selector_add as _selector_add,
)
from filepulsar.storage.cursor import (
    _selector_owner as _selector_owner,
)
from filepulsar.storage.cursor import (
    _selector_remove as _selector_remove,
)
from filepulsar.storage.cursor import (
    _unkey as _unkey,
)
from filepulsar.storage.errors import (
    BlobNotFound,
    BlobStoreError,
    ConsumerBusy,
    InvalidAckError,
    InvalidConfiguration,
    SubscriptionNotFound,
    TopicNotFound,
)
from filepulsar.storage.ledger import EARLIEST, ManagedLedger, Position, ReadEntry
from filepulsar.storage.manifest import ManifestState
from filepulsar.storage.names import TopicName, validate_segment
from filepulsar.storage.policies import effective_policies
from filepulsar.storage.versioned import VersionedStore
from filepulsar.storage.versioned_protocol import Abort

if TYPE_CHECKING:
    from filepulsar.storage.compaction import CompactedView


class SubscriptionStore(VersionedStore[SubscriptionState]):
    """The versioned state of one subscription on one managed ledger."""

    def __init__(
        self,
        store: BlobStore,
        topic: TopicName,
        subscription: str,
        *,
        clock: Callable[[], int] | None = None,
    ) -> None:
        super().__init__(
            store,
            paths.subscription_state_dir(topic, subscription),
            SubscriptionState.decode,
            what=f"subscription {subscription!r} on {topic}",
            clock=clock,
            not_found=SubscriptionNotFound,
        )
        self.topic = topic
        self.subscription = subscription


def list_subscriptions(store: BlobStore, topic: TopicName) -> list[str]:
    """Names of the durable subscriptions of one managed ledger."""
    return store.list_dirs(paths.subscriptions_dir(topic))


def delete_subscription(store: BlobStore, topic: TopicName, subscription: str) -> None:
    store.delete_prefix(paths.subscription_dir(topic, subscription))


def ensure_subscription(
    store: BlobStore,
    topic: TopicName,
    subscription: str,
    *,
    sub_type: ConsumerType | str = "Shared",
    initial_position: InitialPosition | str = "Earliest",
    clock: Callable[[], int] | None = None,
) -> bool:
    """Create a durable subscription with no consumers if it does not exist yet.

    Used for a dead-letter topic's initial subscription (so retention keeps its messages
    until someone consumes them). Returns True if this call created it.

    Raises
    ------
    TopicNotFound
        If the managed ledger does not exist.
    InvalidConfiguration
        For a bad type or initial position.
    """
    validate_segment(subscription, "subscription name")
    kind = ConsumerType.parse(sub_type).wire
    where = InitialPosition.parse(initial_position).wire
    ml = ManagedLedger(store, topic, clock=clock)
    subs = SubscriptionStore(store, topic, subscription, clock=clock)
    if subs.exists():
        return False
    m = ml.state()
    md = m.last_position() if where == "Latest" else (-1, -1)
    now = ml.clock()
    sel = selector_for_mode("AUTO_SPLIT").to_dict() if kind == "Key_Shared" else None
    return subs.create(
        SubscriptionState(
            topic=str(topic),
            name=subscription,
            sub_type=kind,
            created_ms=now,
            last_active_ms=now,
            mark_delete=md,
            dispatched=md,
            selector=sel,
        )
    )


def seek_mark_delete(ml: ManagedLedger, m: ManifestState, position: Position | None) -> Pos:
    """The mark-delete position that makes ``position`` the next entry delivered (None: the
    end of the managed ledger; a position before the first entry: the start)."""
    if position is None:
        return m.last_position()
    prev: Pos = (-1, -1)
    cur: Position | None = ml.next_position(m, EARLIEST)
    while cur is not None and (cur.ledger_id, cur.entry_id) < (
        position.ledger_id,
        position.entry_id,
    ):
        prev = (cur.ledger_id, cur.entry_id)
        cur = ml.next_position(m, cur)
    return prev


def _apply_seek(s: SubscriptionState, md: Pos) -> None:
    """Move the cursor to ``md`` and forget acknowledgement holes and deliveries in flight,
    as Pulsar's seek and reset-cursor do. ``selector_version`` grows, so that connected
    consumers (Key_Shared ones rescan; Exclusive and Failover ones re-read from the cursor)
    follow the reset."""
    s.mark_delete = md
    s.dispatched = md
    s.acked = []
    s.batch_acks = {}
    s.pending = {}
    s.redeliver = {}
    s.selector_version += 1


def _existing(
    store: BlobStore, topic: TopicName, subscription: str, clock: Callable[[], int] | None
) -> SubscriptionStore:
    st = SubscriptionStore(store, topic, subscription, clock=clock)
    st.latest()  # SubscriptionNotFound if it does not exist (a commit would re-create it)
    return st


def reset_subscription(
    store: BlobStore,
    topic: TopicName,
    subscription: str,
    position: Position | None,
    *,
    clock: Callable[[], int] | None = None,
) -> Pos:
    """Reset a subscription's cursor on one managed ledger so that ``position`` is the next
    entry delivered (None: the end, i.e. clear the backlog). One versioned commit of the
    subscription; connected consumers follow it (see :func:`_apply_seek`). Returns the new
    mark-delete position.

    Raises
    ------
    SubscriptionNotFound, TopicNotFound
    """
    st = _existing(store, topic, subscription, clock)
    ml = ManagedLedger(store, topic, clock=clock)
    md = seek_mark_delete(ml, ml.state(), position)
    st.commit(lambda s: _apply_seek(s, md), idempotent=True)
    return md


def skip_entries(
    store: BlobStore,
    topic: TopicName,
    subscription: str,
    count: int,
    *,
    clock: Callable[[], int] | None = None,
) -> int:
    """Acknowledge the next ``count`` unacknowledged entries after the cursor (Pulsar's
    ``skip``: the broker skips entries, which are messages unless the producer batched;
    entries acknowledged individually already are not counted). One versioned commit.
    Returns how many entries were skipped (fewer at the end of the topic).

    Raises
    ------
    SubscriptionNotFound, TopicNotFound, InvalidConfiguration
    """
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise InvalidConfiguration(f"the number of messages to skip must be >= 0, got {count!r}")
    st = _existing(store, topic, subscription, clock)
    ml = ManagedLedger(store, topic, clock=clock)
    m = ml.state()

    def nxt(p: Pos) -> Pos | None:
        q = ml.next_position(m, Position(*p))
        return None if q is None else (q.ledger_id, q.entry_id)

    def change(s: SubscriptionState) -> int:
        skipped = 0
        p: Pos | None = s.mark_delete
        while skipped < count and p is not None:
            p = nxt(p)
            if p is None:
                break
            if s.is_acked(p):
                continue
            s.ack(p, nxt)
            skipped += 1
        if skipped == 0:
            raise Abort(0)
        if s.dispatched < s.mark_delete:
            s.dispatched = s.mark_delete
        s.selector_version += 1  # sequential consumers re-read from the cursor
        return skipped

    return st.commit(change)[1]


def acknowledge_up_to(
    store: BlobStore,
    topic: TopicName,
    subscription: str,
    position: Pos,
    *,
    clock: Callable[[], int] | None = None,
) -> bool:
    """Acknowledge, cumulatively, every entry up to ``position`` (expire-messages). One
    versioned commit; returns whether the cursor moved.

    Raises
    ------
    SubscriptionNotFound, TopicNotFound
    """
    st = _existing(store, topic, subscription, clock)
    ml = ManagedLedger(store, topic, clock=clock)
    m = ml.state()

    def nxt(p: Pos) -> Pos | None:
        q = ml.next_position(m, Position(*p))
        return None if q is None else (q.ledger_id, q.entry_id)

    def change(s: SubscriptionState) -> bool:
        if s.mark_delete >= position:
            raise Abort(False)
        s.ack_cumulative(position, nxt)
        if s.dispatched < s.mark_delete:
            s.dispatched = s.mark_delete
        s.selector_version += 1
        return True

    return st.commit(change, idempotent=True)[1]


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


_wall_ms = wall_ms


#: Reading only the entries asked for out of large fragments is ManagedLedger's own
#: behaviour now; the name is kept for code written against it.
RangeReadingLedger = ManagedLedger


class SubscriptionConsumer:
    """One consumer on one managed ledger's subscription (storage level).

    The client's ``Consumer`` holds one per partition. Construction registers the consumer
    (creating the subscription at ``initial_position`` if needed). :meth:`fetch`,
    :meth:`renew`, :meth:`renew_if_due`, :meth:`seek` and :meth:`close` are serialised, so a
    housekeeping thread may renew the lease while another thread fetches or acknowledges.

    ``subscription_properties`` are stored when the subscription is created and fixed from
    then on (a consumer passing none uses the stored ones). ``use_consistent_hashing`` is
    Pulsar's broker setting ``subscriptionKeySharedUseConsistentHashing``: with AUTO_SPLIT,
    consistent hashing (default) or auto-split hash ranges; the subscription keeps the
    selector it was created with.

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
    ) -> None:
        validate_segment(subscription, "subscription name")
        self.sub_type = ConsumerType.parse(sub_type).wire
        if read_compacted and (self.sub_type not in ("Exclusive", "Failover") or not durable):
            raise InvalidConfiguration(
                "read compacted can only be used with Exclusive or Failover persistent "
                f"subscriptions, not {self.sub_type}"
            )
        #: Read a compacted view (storage.compaction) while behind its horizon.
        self.read_compacted = read_compacted
        self._view: CompactedView | None = None
        # Whether ``_view`` is loaded (None: the topic had no view then). Loaded once, and
        # again when the read position restarts (seek, reset) or a newer compaction deleted it.
        self._view_loaded = False
        self.initial_position = InitialPosition.parse(initial_position).wire
        self.key_shared_mode = KeySharedMode.parse(key_shared_mode).wire
        if lease_ms <= 0:
            raise InvalidConfiguration(f"lease_ms must be > 0, got {lease_ms}")
        self.topic = topic
        self.subscription = subscription
        self.ml: ManagedLedger = RangeReadingLedger(store, topic, clock=clock)
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
        if self.key_shared_mode == "STICKY" and not self.sticky_ranges:
            raise InvalidConfiguration("Key_Shared STICKY mode needs sticky hash ranges")
        pol = effective_policies(store, topic)
        self.delayed_enabled = pol.delayed_delivery_enabled and topic.persistent
        self.tick_ms = pol.delayed_delivery_tick_ms
        self.max_ack_ranges = pol.max_unacked_ranges_to_persist
        self._store = SubscriptionStore(store, topic, subscription, clock=clock)
        self._local: SubscriptionState | None = None  # non-durable state
        # Serialises fetches, renewals, seeks and close: the client renews from its
        # housekeeping thread while its application fetches or acknowledges.
        self._lock = threading.RLock()
        self._read_pos: Pos | None = None  # Exclusive/Failover: last delivered
        self._scan_pos: Pos | None = None  # Key_Shared: entries up to here examined
        self._seek_seen = -1  # Exclusive/Failover: selector_version when _read_pos was set
        self._scan_version = -1
        self._slots: dict[Pos, int] = {}
        self._renewed_at = 0  # clock ms of the last lease renewal
        self._lease_from = 0  # clock ms before the commit that last extended the lease
        #: Counts this consumer's registrations: it changes when a lapsed lease was removed
        #: (what it held was handed to others) and the consumer registered again.
        self.registrations = 0
        #: ``registrations`` when the last :meth:`fetch` claimed what it returned.
        self.fetch_registration = 0
        self._was_active = False
        self._start_position = start_position
        self._closed = False
        self._register()

    # ------------------------------------------------------------------ state plumbing
    def _manifest(self) -> ManifestState:
        return self.ml.state()

    def _next_fn(self, mstate: ManifestState) -> Callable[[Pos], Pos | None]:
        def nxt(p: Pos) -> Pos | None:
            q = self.ml.next_position(mstate, Position(*p))
            return None if q is None else (q.ledger_id, q.entry_id)

        return nxt

    def _commit(
        self, change: Callable[[SubscriptionState], T], *, idempotent: bool = False
    ) -> tuple[SubscriptionState, T]:
        """Commit ``change`` (to the local state if non-durable). ``idempotent``: applying it
        again to a state that holds it changes nothing (see :meth:`VersionedStore.commit`)."""
        if not self.durable:
            assert self._local is not None
            copy = SubscriptionState.decode(self._local.encode(), "local")
            try:
                result = change(copy)
            except Abort as a:
                return self._local, a.value
            self._local = copy
            return copy, result
        try:
            return self._store.commit(change, idempotent=idempotent)
        except BlobNotFound:
            raise
        except BlobStoreError as e:  # a full disk, a failing object store...
            raise BlobStoreError(
                f"{self._store.what}: storing the change (an acknowledgement, a delivery, a "
                f"consumer joining or leaving) failed: {e}"
            ) from e

    def state(self) -> SubscriptionState:
        """The newest subscription state (read-only)."""
        if not self.durable:
            assert self._local is not None
            return self._local
        return self._store.latest()

    def _initial_state(self) -> SubscriptionState:
        m = self._manifest()
        now = self.clock()
        if self._start_position is not None:
            sp = self._start_position
            md: Pos = (sp.ledger_id, sp.entry_id - 1) if sp.entry_id > 0 else (-1, -1)
            if sp.entry_id == 0:
                # the entry before (ledger, 0) is the last of an earlier ledger, or nothing
                prev = [lg for lg in m.ledgers if lg.ledger_id < sp.ledger_id and lg.entries]
                md = (prev[-1].ledger_id, prev[-1].entries - 1) if prev else (-1, -1)
        elif self.initial_position == "Latest":
            md = m.last_position()
        else:
            md = (-1, -1)
        sel = None
        if self.sub_type == "Key_Shared":
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
        """The properties the subscription was created with (read from its newest state)."""
        return dict(self.state().properties)

    def _register(self) -> None:
        if not self.ml.manifest.exists():
            raise TopicNotFound(f"topic {self.topic} does not exist")
        if self.durable:
            if not self._store.exists():
                self._store.create(self._initial_state())
        else:
            self._local = self._initial_state()
        cid, name, prio, mode = self.cid, self.consumer_name, self.priority, self.sub_type

        started = self.clock()

        def change(s: SubscriptionState) -> None:
            now = self.clock()
            s.purge_expired(now)
            if cid in s.consumers:  # applied already (an attempt whose outcome was unknown)
                s.consumers[cid].expires_ms = now + self.lease_ms
                s.last_active_ms = now
                return
            live = s.live_consumers(now)
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
                        f"{s.sub_type} and has consumers; cannot attach a {mode} consumer"
                    )
                s.sub_type = mode
                if mode == "Key_Shared":
                    s.selector = self._new_selector().to_dict()
                    s.key_shared_mode = self.key_shared_mode
            if mode == "Exclusive" and live:
                raise ConsumerBusy(
                    f"Exclusive consumer is already connected to subscription "
                    f"{self.subscription!r} on {self.topic} ({live[0].name})"
                )
            sel_id = cid
            if mode == "Key_Shared":
                if s.key_shared_mode != self.key_shared_mode:
                    if live:
                        raise ConsumerBusy(
                            f"subscription {self.subscription!r} uses Key_Shared mode "
                            f"{s.key_shared_mode}; this consumer asked for {self.key_shared_mode}"
                        )
                    s.key_shared_mode = self.key_shared_mode
                    s.selector = self._new_selector().to_dict()
                sel = selector_from_dict(s.selector) if s.selector else self._new_selector()
                try:
                    sel_id = _selector_add(sel, cid, name, self.sticky_ranges)
                except ConsumerAssignError as e:
                    raise InvalidConfiguration(
                        f"Key_Shared consumer {name!r} refused on {self.topic}: {e}"
                    ) from e
                s.selector = sel.to_dict()
                s.selector_version += 1
            s.join_seq += 1
            s.consumers[cid] = ConsumerInfo(
                cid, name, prio, now + self.lease_ms, s.join_seq, sel_id
            )
            s.last_active_ms = now

        self._commit(change, idempotent=True)
        self.registrations += 1
        self._lease_from = started
        self._renewed_at = self.clock()

    def renew_if_due(self) -> None:
        """Renew this consumer's lease when a third of it has passed (cheap otherwise)."""
        with self._lock:
            if not self._closed and self.clock() - self._renewed_at >= self.lease_ms // 3:
                self.renew()

    def lease_lapsed(self) -> bool:
        """Whether this consumer's lease may have expired (by this machine's clock), so that
        another consumer may have removed it: renew before handing out what it holds."""
        return self.clock() >= self._lease_from + self.lease_ms

    def renew(self) -> None:
        """Extend the lease.

        A lease that expired but that nobody acted on yet (this consumer is still registered)
        is simply extended: nothing it holds went to anyone else. Failover excepted: another
        consumer may have been the active one meanwhile, so a Failover consumer past its lease
        registers again and restarts from the cursor. A consumer that was removed registers
        again, as Pulsar's client resubscribes after a disconnect (what it had pending was
        already handed back, and :attr:`registrations` changes); an Exclusive one then fails
        with ConsumerBusy if another took over. Does nothing once closed.
        """
        cid = self.cid
        keep = None if self.sub_type == "Failover" else cid

        def change(s: SubscriptionState) -> bool:
            now = self.clock()
            s.purge_expired(now, keep=keep)
            c = s.consumers.get(cid)
            if c is None:
                raise Abort(False)
            c.expires_ms = now + self.lease_ms
            s.last_active_ms = now
            return True

        with self._lock:
            if self._closed:
                return
            started = self.clock()
            _, ok = self._commit(change, idempotent=True)
            if ok:
                self._lease_from = started
            else:
                self._read_pos = None
                self._was_active = False
                self._scan_pos = None
                self._register()
            self._renewed_at = self.clock()

    # ------------------------------------------------------------------ fetching
    def is_active(self, state: SubscriptionState | None = None) -> bool:
        """Exclusive: always; Failover: whether this consumer is the active one now."""
        if self.sub_type == "Exclusive":
            return True
        if self.sub_type != "Failover":
            return True
        s = state or self.state()
        live = s.live_consumers(self.clock())
        if not live:
            return False
        names = [(c.name, c.priority) for c in live]
        winner = active_consumer(names, self.topic.partition_index, str(self.topic))
        first = next(c for c in live if c.name == winner)
        return first.cid == self.cid

    def fetch(self, max_entries: int = 100) -> list[Delivery]:
        """Up to ``max_entries`` entries for this consumer, per the subscription type.

        Returns an empty list when nothing is available (or, Failover, when not active).
        """
        with self._lock:
            self.renew_if_due()
            if self.sub_type in ("Exclusive", "Failover"):
                out = self._fetch_sequential(max_entries)
            elif self.sub_type == "Shared":
                out = self._fetch_shared(max_entries)
            else:
                out = self._fetch_key_shared(max_entries)
            self.fetch_registration = self.registrations
            return out

    def _due_redeliveries(self, s: SubscriptionState, now: int) -> list[Pos]:
        return sorted(_unkey(k) for k, v in s.redeliver.items() if v[1] <= now)

    def _read_one(self, mstate: ManifestState, p: Pos) -> ReadEntry | None:
        got = self.ml.read_entries(mstate, Position(*p), end=Position(*p), max_entries=1)
        return got[0] if got else None

    def _fetch_sequential(self, max_entries: int) -> list[Delivery]:
        s = self.state()
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
        mstate = self._manifest()
        now = self.clock()
        out: list[Delivery] = []
        redo = self._due_redeliveries(s, now)
        if redo:
            taken = redo[:max_entries]

            def take(st: SubscriptionState) -> None:
                for p in taken:
                    st.redeliver.pop(_key(p), None)

            self._commit(take)
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
        start = self.ml.next_position(mstate, Position(*self._read_pos))
        if start is None or len(out) >= max_entries:
            return out
        for e in self.ml.iter_entries(mstate, start, max_entries=(max_entries - len(out)) * 2):
            p = (e.ledger_id, e.entry_id)
            self._read_pos = p
            if s.is_acked(p) or _key(p) in s.redeliver:
                continue
            out.append(Delivery(e, 0, self._acked_idx(s, p)))
            if len(out) >= max_entries:
                break
        return out

    # ------------------------------------------------------------------ compacted reads
    def _current_view(self, mstate: ManifestState) -> CompactedView | None:
        from filepulsar.storage.compaction import load_view

        if not self._view_loaded:
            self._view = load_view(self.ml.store, self.topic, mstate.incarnation)
            self._view_loaded = True
        return self._view

    def _view_entry(self, mstate: ManifestState, p: Pos) -> tuple[ReadEntry, frozenset[int]] | None:
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
            if s.is_acked(p) or _key(p) in s.redeliver:
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

    def _with_view_gaps(self, mstate: ManifestState, items: list[Pos]) -> list[tuple[Pos, Pos]]:
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
            a = self.ml.next_position(mstate, Position(*gap))
            b = _prev_position(mstate, p)
            if a is not None and b is not None and (a.ledger_id, a.entry_id) <= b:
                ranges.append(((a.ledger_id, a.entry_id), b))
        return ranges

    @staticmethod
    def _acked_idx(s: SubscriptionState, p: Pos) -> frozenset[int]:
        return frozenset(s.batch_acks.get(_key(p), ()))

    def _held(self, e: ReadEntry, now: int) -> bool:
        dat = e.raw.header.deliver_at
        return bool(dat and self.delayed_enabled and should_delay(dat, now, tick_ms=self.tick_ms))

    def _due_at(self, e: ReadEntry) -> int:
        """When a held entry becomes deliverable: Pulsar's cutoff is now + tick, so at
        ``deliverAt - tick`` (see dispatch.delayed.should_delay)."""
        return e.raw.header.deliver_at - self.tick_ms

    def _fetch_shared(self, max_entries: int) -> list[Delivery]:
        s = self.state()
        mstate = self._manifest()
        now = self.clock()
        start = self.ml.next_position(mstate, Position(*s.dispatched))
        fresh: list[ReadEntry] = []
        if start is not None:
            fresh = self.ml.read_entries(mstate, start, max_entries=max_entries)
        if not fresh and not self._due_redeliveries(s, now) and _nobody_expired(s, now):
            return []  # a commit would change nothing: spare it (idle polls stay cheap)
        cid = self.cid
        held = {(e.ledger_id, e.entry_id): self._due_at(e) for e in fresh if self._held(e, now)}

        def change(st: SubscriptionState) -> list[tuple[Pos, int]]:
            t = self.clock()
            st.purge_expired(t, keep=cid)
            if cid not in st.consumers:
                raise Abort(_LOST)
            st.consumers[cid].expires_ms = t + self.lease_ms
            claimed: list[tuple[Pos, int]] = []
            was_dispatched = st.dispatched
            for p in self._due_redeliveries(st, t):
                if len(claimed) >= max_entries:
                    break
                count, _, slot = st.redeliver.pop(_key(p))
                if st.is_acked(p):
                    continue
                st.pending[_key(p)] = [cid, count, slot]
                claimed.append((p, count))
            for e in fresh:
                p = (e.ledger_id, e.entry_id)
                if p <= st.dispatched:
                    continue
                if len(claimed) >= max_entries:
                    break
                st.dispatched = p
                if st.is_acked(p):
                    continue
                if _key(p) in st.pending or _key(p) in st.redeliver:
                    continue  # dispatch moved back over it (cap_ack_ranges): already out
                if p in held:
                    st.redeliver[_key(p)] = [0, held[p], -1]
                    continue
                st.pending[_key(p)] = [cid, 0, -1]
                claimed.append((p, 0))
            if not claimed and st.dispatched == was_dispatched:
                raise Abort(_IDLE)  # nothing changed (passing held entries is a change to keep)
            return claimed

        st, claimed = self._commit(change)
        if claimed is _LOST:
            self.renew()  # registers again
            return []
        if claimed is _IDLE:
            return []  # aborted: the lease was not extended either
        self._lease_from = now
        self._renewed_at = self.clock()
        by_pos = {(e.ledger_id, e.entry_id): e for e in fresh}
        out = []
        for p, count in claimed:
            e = by_pos.get(p) or self._read_one(mstate, p)
            if e is not None:
                out.append(Delivery(e, count, self._acked_idx(st, p)))
        return out

    def _slot_of(self, e: ReadEntry, sel: StickyKeyConsumerSelector) -> int:
        p = (e.ledger_id, e.entry_id)
        slot = self._slots.get(p)
        if slot is None:
            msgs = e.messages()
            okey = msgs.column("ordering_key")[0].as_py()
            pkey = msgs.column("key")[0].as_py()
            slot = sel.slot(sticky_key(okey, pkey))
            if len(self._slots) > 200_000:
                self._slots.clear()
            self._slots[p] = slot
        return slot

    def _fetch_key_shared(self, max_entries: int) -> list[Delivery]:
        s = self.state()
        mstate = self._manifest()
        now = self.clock()
        if s.selector_version != self._scan_version or self._scan_pos is None:
            self._scan_version = s.selector_version
            self._scan_pos = s.mark_delete
        assert s.selector is not None
        sel = selector_from_dict(s.selector)
        start = self.ml.next_position(mstate, Position(*self._scan_pos))
        scanned: list[ReadEntry] = []
        if start is not None:
            scanned = self.ml.read_entries(mstate, start, max_entries=max(max_entries * 4, 64))
        slots = {(e.ledger_id, e.entry_id): self._slot_of(e, sel) for e in scanned}
        entries = {(e.ledger_id, e.entry_id): e for e in scanned}
        for p in self._due_redeliveries(s, now):
            if p not in entries:
                e = self._read_one(mstate, p)
                if e is not None:
                    entries[p] = e
                    slots[p] = self._slot_of(e, sel)
        if not entries and _nobody_expired(s, now):
            return []  # nothing to claim and nobody to purge
        cid = self.cid
        scanned_to = (scanned[-1].ledger_id, scanned[-1].entry_id) if scanned else None
        held = {p: self._due_at(e) for p, e in entries.items() if self._held(e, now)}

        def change(st: SubscriptionState) -> tuple[list[tuple[Pos, int]], Pos | None]:
            t = self.clock()
            if st.selector_version != scan_version:
                # Hashes moved since this consumer scanned: its candidates may miss older
                # entries of slots it now owns. Scan again rather than claim out of order.
                raise Abort(_RESCAN)
            st.purge_expired(t, keep=cid)
            if cid not in st.consumers:
                raise Abort(_LOST)
            st.consumers[cid].expires_ms = t + self.lease_ms
            assert st.selector is not None
            if st.selector_version != scan_version:
                # The purge of a departed consumer moved hashes: commit the purge (every
                # consumer would otherwise redo it and abort, until a lease renewal), then
                # scan again.
                return _RESCAN
            fsel = sel
            own = st.consumers[cid].sel_id
            blocked: set[int] = set()
            # Draining: a slot with entries pending at another consumer stays blocked.
            for v in st.pending.values():
                if v[0] != cid:
                    blocked.add(v[2])
            for k, v in st.redeliver.items():
                if v[1] > t or _unkey(k) not in entries:
                    # An earlier entry of the slot waits (not yet due, or handed back after
                    # this consumer read its candidates): keep the slot's order.
                    blocked.add(v[2])
            claimed: list[tuple[Pos, int]] = []
            first_unclaimed: Pos | None = None
            held_recorded = False
            for p in sorted(entries):
                slot = slots[p]
                if _selector_owner(fsel, slot) != own or st.is_acked(p):
                    continue
                k = _key(p)
                if k in st.pending:
                    continue
                if p in held and k not in st.redeliver:
                    st.redeliver[k] = [0, held[p], slot]
                    blocked.add(slot)
                    held_recorded = True
                    continue
                if slot in blocked or len(claimed) >= max_entries:
                    blocked.add(slot)
                    if first_unclaimed is None and k not in st.redeliver:
                        first_unclaimed = p
                    continue
                count = 0
                if k in st.redeliver:
                    count = st.redeliver.pop(k)[0]
                st.pending[k] = [cid, count, slot]
                claimed.append((p, count))
            if not claimed and not held_recorded:
                raise Abort((_IDLE, first_unclaimed))
            return claimed, first_unclaimed

        scan_version = s.selector_version
        st, result = self._commit(change)
        if result is _LOST:
            self.renew()
            return []
        if result is _RESCAN:
            self._scan_pos = None
            return []
        claimed, first_unclaimed = result
        if claimed is _IDLE:
            claimed = []  # aborted: the lease was not extended either
        else:
            self._lease_from = now
            self._renewed_at = self.clock()
        if first_unclaimed is not None:
            prev = [p for p in sorted(entries) if p < first_unclaimed]
            self._scan_pos = prev[-1] if prev else self._scan_pos
        elif scanned_to is not None:
            self._scan_pos = scanned_to
        return [Delivery(entries[p], c, self._acked_idx(st, p)) for p, c in claimed]

    # ------------------------------------------------------------------ acknowledging
    def acknowledge(self, items: Iterable[tuple[Position, int, int]]) -> None:
        """Acknowledge messages: ``(position, batch_index, batch_size)`` each (batch index -1
        acknowledges the whole entry). Durable when this returns; acknowledging what is
        already acknowledged writes nothing."""
        items = list(items)
        if not items:
            return
        mstate = self._manifest()
        nxt = self._next_fn(mstate)
        gaps = (
            self._with_view_gaps(mstate, [(pos.ledger_id, pos.entry_id) for pos, _, _ in items])
            if self.read_compacted
            else []
        )

        def change(s: SubscriptionState) -> None:
            changed = False
            for a, b in gaps:
                changed |= s.ack_range(a, b, nxt)
            for pos, idx, size in items:
                p = (pos.ledger_id, pos.entry_id)
                if idx < 0 or size <= 1:
                    changed |= s.ack(p, nxt)
                else:
                    changed |= s.ack_batch_index(p, idx, size, nxt)
            s.cap_ack_ranges(self.max_ack_ranges)
            if not changed:
                raise Abort()  # nothing new: no version written
            s.last_active_ms = self.clock()

        self._commit(change, idempotent=True)

    def acknowledge_cumulative(self, position: Position) -> None:
        """Acknowledge every entry up to and including ``position`` (Exclusive/Failover only).

        Raises
        ------
        InvalidAckError
            On Shared and Key_Shared subscriptions, as Pulsar refuses it.
        """
        if self.sub_type in ("Shared", "Key_Shared"):
            raise InvalidAckError(
                f"cumulative acknowledgement is not allowed on {self.sub_type} subscriptions "
                "(use acknowledge)"
            )
        nxt = self._next_fn(self._manifest())
        p = (position.ledger_id, position.entry_id)

        def change(s: SubscriptionState) -> None:
            if not s.ack_cumulative(p, nxt):
                raise Abort()  # already acknowledged: no version written

        self._commit(change, idempotent=True)

    def negative_acknowledge(self, positions: Iterable[Position], delay_ms: int) -> None:
        """Redeliver these entries after ``delay_ms`` with their redelivery count + 1."""
        ps = [(p.ledger_id, p.entry_id) for p in positions]
        if not ps:
            return
        cid = self.cid

        def change(s: SubscriptionState) -> None:
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
                count = (cur[1] if cur else old[0] if old else 0) + 1
                slot = cur[2] if cur else -1
                s.redeliver[k] = [count, t + delay_ms, slot]

        self._commit(change)

    def seek(self, position: Position | None) -> None:
        """Reset the cursor so the next message is ``position`` (None: the end).

        Pending and scheduled redeliveries are cleared, as Pulsar's seek does.
        """
        md = seek_mark_delete(self.ml, self._manifest(), position)
        with self._lock:
            self._commit(lambda s: _apply_seek(s, md), idempotent=True)
            self._read_pos = None
            self._was_active = False
            self._scan_pos = None

    def close(self) -> None:
        """Unregister; what this consumer had pending is redelivered to others."""
        with self._lock:  # after a renewal in progress, which then cannot register again
            if self._closed:
                return
            self._closed = True
            cid = self.cid
            try:
                self._commit(lambda s: s.remove_consumer(cid, self.clock()), idempotent=True)
            except (SubscriptionNotFound, TopicNotFound):
                pass  # the subscription (or topic) is gone already: nothing to unregister from

    def unsubscribe(self) -> None:
        """Delete the subscription (refused while other consumers are connected)."""
        s = self.state()
        others = [c.name for c in s.live_consumers(self.clock()) if c.cid != self.cid]
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


def subscription_backlog(ml: ManagedLedger, m: ManifestState, s: SubscriptionState) -> int:
    """Messages after the mark-delete position (individually acked ranges not subtracted when
    they cross fragment boundaries; an upper bound good for metrics)."""
    md = s.mark_delete
    total = 0
    for lg in m.ledgers_from(md[0]):
        if not lg.entries:
            continue
        if lg.ledger_id > md[0]:
            total += lg.messages
            continue
        for f in ml.fragments(lg):
            if f.first_entry > md[1]:
                total += f.messages
            elif f.first_entry + f.count - 1 > md[1]:
                after = f.first_entry + f.count - 1 - md[1]
                total += round(f.messages * after / f.count)
    total -= sum(len(v) for v in s.batch_acks.values())
    return max(total, 0)


def _nobody_expired(s: SubscriptionState, now: int) -> bool:
    return all(c.expires_ms > now for c in s.consumers.values())
