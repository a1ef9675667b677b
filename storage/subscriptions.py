"""The subscription store and the operations on a subscription that need no consumer.

:class:`SubscriptionStore` is the versioned state of one subscription on one managed ledger
(committed like the manifest: versioned files, put-if-absent) and its creation record, which
tells a lost state from a new subscription. The functions here create, list
and delete subscriptions, move a cursor (reset, skip, expire: one versioned commit each) and
count a backlog; the admin API and the client use them, and
:class:`~filepulsar.storage.subscription.SubscriptionConsumer` commits through the same store.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any

from filepulsar.dispatch.modes import ConsumerType, InitialPosition, KeySharedMode
from filepulsar.dispatch.selectors import selector_for_mode
from filepulsar.storage import jsontext, paths
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.cursor import SubscriptionState, T
from filepulsar.storage.errors import (
    BlobNotFound,
    DataLossError,
    InvalidConfiguration,
    SubscriptionNotFound,
    TopicNotFound,
)
from filepulsar.storage.ledger import EARLIEST, ManagedLedger, Position
from filepulsar.storage.manifest import ManifestState
from filepulsar.storage.names import TopicName, validate_segment
from filepulsar.storage.versioned import Abort, VersionedStore


class SubscriptionStore(VersionedStore[SubscriptionState]):
    """The versioned state of one subscription on one managed ledger, and its creation record.

    :meth:`create` writes the state's version 0 (atomic: a put-if-absent, or a journal segment
    linked whole) and then the creation record (``subscription.json`` beside ``state/``,
    naming the topic's incarnation). So:

    - the state is there: the subscription exists (a record missing after a crash between the
      two writes is written by the next :meth:`create` or :meth:`record_creation`);
    - the record is there and the state is not: the state was lost. :meth:`create`,
      :meth:`latest` and :meth:`commit` raise :class:`~filepulsar.storage.errors.DataLossError`
      naming both, never re-creating the subscription at its initial position;
    - neither (nothing, or a folder left by a creation that crashed before its version 0): a
      new subscription. A record of an earlier incarnation of the topic (left by a topic
      deletion cut short) does not count.

    Subscriptions created before records existed have none: their lost state is not told
    from a new subscription until a registration has written it.
    """

    share_decodes = True  # the consumers of a process read each new state once

    def __init__(
        self,
        store: BlobStore,
        topic: TopicName,
        subscription: str,
        *,
        clock: Callable[[], int] | None = None,
        ledger: ManagedLedger | None = None,
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
        self.record_key = paths.subscription_record(topic, subscription)
        #: The topic's managed ledger that tells its incarnation (a consumer's, shared by the
        #: process's consumers of the topic); None: one read for the purpose.
        self.ledger = ledger

    def create(self, initial: SubscriptionState) -> bool:
        """Create the subscription with state ``initial`` unless it exists; True if this call
        created its state. Writes the creation record either way.

        Raises
        ------
        DataLossError
            The creation record is there and the state is not (see the class docstring).
        """
        if not self.exists():
            self.raise_if_lost()
        created = super().create(initial)
        if created:
            self._write_record()  # replacing any record of an earlier topic incarnation
        else:
            self.record_creation()
        return created

    def latest(
        self, *, refresh: bool = True, strict: bool = False, hint: int = -1, drain: bool = True
    ) -> SubscriptionState:
        """:meth:`VersionedStore.latest`; DataLossError where the state was lost."""
        try:
            return super().latest(refresh=refresh, strict=strict, hint=hint, drain=drain)
        except SubscriptionNotFound:
            self.raise_if_lost()
            raise

    def commit(
        self, change: Callable[[SubscriptionState], T], **kw: Any
    ) -> tuple[SubscriptionState, T]:
        """:meth:`VersionedStore.commit`; DataLossError where the state was lost (a commit
        never re-creates a subscription)."""
        try:
            return super().commit(change, **kw)
        except SubscriptionNotFound:
            self.raise_if_lost()
            raise

    def record_creation(self) -> None:
        """Write the creation record (the state's version 0 must exist) if it is not there."""
        if not self.store.exists(self.record_key):
            self._write_record()

    def _write_record(self) -> None:
        record = {"subscription": self.subscription, "incarnation": self._incarnation()}
        self.store.put(self.record_key, jsontext.encode_framed(record))

    def known(self) -> bool:
        """Whether the subscription exists or its state was lost (its record is there)."""
        return self.exists() or self.store.exists(self.record_key)

    def raise_if_lost(self) -> None:
        """Raise DataLossError if the creation record of this incarnation of the topic is
        there (call it when the state is not)."""
        where = self.store.url(self.record_key)
        try:
            raw = self.store.get(self.record_key)
        except BlobNotFound:
            return
        record = jsontext.decode_framed(raw, where)
        if not isinstance(record, dict) or record.get("incarnation") != self._incarnation():
            return  # a record of a deleted topic: this subscription is new
        # The caller found no state before it read the record; a creator racing it may have
        # written both since (the state comes first), and an unsubscribe racing it deletes the
        # record first: look again at both before calling it a loss.
        if self.exists() or not self.store.exists(self.record_key):
            return
        raise DataLossError(
            f"subscription {self.subscription!r} on {self.topic}: its state is missing from "
            f"{self.store.url(self.folder)} although {where} records its creation (damage, "
            "not a new subscription: unsubscribe to delete what is left)"
        )

    def _incarnation(self) -> str | None:
        try:
            ml = self.ledger if self.ledger is not None else ManagedLedger(self.store, self.topic)
            return ml.state().incarnation
        except TopicNotFound:
            return None


def list_subscriptions(store: BlobStore, topic: TopicName) -> list[str]:
    """Names of the durable subscriptions of one managed ledger."""
    return store.list_dirs(paths.subscriptions_dir(topic))


def delete_subscription(store: BlobStore, topic: TopicName, subscription: str) -> None:
    """Delete a subscription: its creation record first, so that a deletion cut short leaves
    a subscription (its state), never a record whose state is missing (read as damage)."""
    store.delete(paths.subscription_record(topic, subscription))
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
    kind = ConsumerType.parse(sub_type)
    where = InitialPosition.parse(initial_position)
    ml = ManagedLedger(store, topic, clock=clock)
    subs = SubscriptionStore(store, topic, subscription, clock=clock)
    if subs.exists():
        return False
    m = ml.state()
    md = m.last_position() if where is InitialPosition.Latest else EARLIEST
    now = ml.clock()
    sel = (
        selector_for_mode(KeySharedMode.AutoSplit).to_dict()
        if kind is ConsumerType.KeyShared
        else None
    )
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


def seek_mark_delete(ml: ManagedLedger, m: ManifestState, position: Position | None) -> Position:
    """The mark-delete position that makes ``position`` the next entry delivered (None: the
    end of the managed ledger; a position before the first entry: the start)."""
    if position is None:
        return m.last_position()
    prev = EARLIEST
    cur = ml.next_position(m, EARLIEST)
    while cur is not None and cur < (position.ledger_id, position.entry_id):
        prev = cur
        cur = ml.next_position(m, cur)
    return prev


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
) -> Position:
    """Reset a subscription's cursor on one managed ledger so that ``position`` is the next
    entry delivered (None: the end, i.e. clear the backlog). One versioned commit of the
    subscription; connected consumers follow it (see :meth:`SubscriptionState.seek`). Returns
    the new mark-delete position.

    Raises
    ------
    SubscriptionNotFound, TopicNotFound
    """
    st = _existing(store, topic, subscription, clock)
    ml = ManagedLedger(store, topic, clock=clock)
    md = seek_mark_delete(ml, ml.state(), position)
    st.commit(lambda s: s.seek(md), idempotent=True)
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

    def nxt(p: Position) -> Position | None:
        return ml.next_position(m, p)

    def change(s: SubscriptionState) -> int:
        skipped = 0
        p: Position | None = s.mark_delete
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
    position: Position,
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

    def nxt(p: Position) -> Position | None:
        return ml.next_position(m, p)

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
    """Messages after the mark-delete position that are not acknowledged: the entries
    acknowledged individually beyond it (its ``acked`` ranges) and the batch indexes
    acknowledged one by one are not counted, as Pulsar's cursor subtracts its individually
    deleted messages from the backlog it reports. Where a range or the mark-delete position
    cuts a fragment, the fragment counts its share of messages (a fragment stores its messages'
    total, not each entry's), so a cut batch fragment is an estimate; with one message per
    entry the count is exact."""
    md = s.mark_delete
    total = 0.0
    ranges = s.acked
    starts = [(r[0], r[1]) for r in ranges]
    for lg in m.ledgers_from(md[0]):
        if not lg.entries:
            continue
        if lg.ledger_id > md[0]:
            # Fragments (a closed ledger's: its index blob) are read only for a ledger an
            # acknowledged range cuts: one no range touches counts whole, one a range
            # covers counts nothing.
            covered = _acked_in(ranges, starts, lg.ledger_id, 0, lg.entries - 1)
            if covered == 0:
                total += lg.messages
                continue
            if covered >= lg.entries:
                continue
        for f in ml.fragments(lg):
            last = f.first_entry + f.count - 1
            first = f.first_entry
            if lg.ledger_id == md[0]:
                if last <= md[1]:
                    continue
                first = max(first, md[1] + 1)
            entries = last - first + 1 - _acked_in(ranges, starts, lg.ledger_id, first, last)
            if entries > 0:
                total += f.messages * entries / f.count
    total -= sum(len(v) for v in s.batch_acks.values())
    return max(round(total), 0)


def _acked_in(
    ranges: list[list[int]], starts: list[tuple[int, int]], ledger: int, first: int, last: int
) -> int:
    """How many entries ``first..last`` of ``ledger`` the sorted, disjoint inclusive
    ``[l1, e1, l2, e2]`` ranges cover (``starts`` their first positions, for the search)."""
    if not ranges:
        return 0
    i = bisect.bisect_right(starts, (ledger, last))  # ranges starting after ``last`` are out
    n = 0
    while i > 0:
        i -= 1
        l1, e1, l2, e2 = ranges[i]
        if (l2, e2) < (ledger, first):
            break  # this one and every earlier one end before ``first``
        a = first if (l1, e1) < (ledger, first) else e1
        b = last if (l2, e2) > (ledger, last) else e2
        if b >= a:
            n += b - a + 1
    return n
