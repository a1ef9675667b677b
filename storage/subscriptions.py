"""The subscription store and the operations on a subscription that need no consumer.

:class:`SubscriptionStore` is the versioned state of one subscription on one managed ledger
(committed like the manifest: versioned files, put-if-absent). The functions here create, list
and delete subscriptions, move a cursor (reset, skip, expire: one versioned commit each) and
count a backlog; the admin API and the client use them, and
:class:`~storage.subscription.SubscriptionConsumer` commits through the same store.
"""

from __future__ import annotations

from collections.abc import Callable

from filepulsar.dispatch.modes import ConsumerType, InitialPosition
from filepulsar.dispatch.selectors import selector_for_mode
from filepulsar.storage import paths
from filepulsar.storage.blobstore_port import BlobStore
from filepulsar.storage.cursor import Pos, SubscriptionState
from filepulsar.storage.errors import InvalidConfiguration, SubscriptionNotFound
from filepulsar.storage.ledger import EARLIEST, ManagedLedger, Position
from filepulsar.storage.manifest import ManifestState
from filepulsar.storage.names import TopicName, validate_segment
from filepulsar.storage.versioned import VersionedStore
from filepulsar.storage.versioned_protocol import Abort


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
