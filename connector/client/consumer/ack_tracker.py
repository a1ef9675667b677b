"""The client consumer's acknowledgements (:class:`AckTracker`): placing a message or id on its
partition and entry, acknowledging (individually, cumulatively, batch indexes with the batch
tracker), negative acknowledgement and redelivery, the ack timeout with its tick, sending to the
dead-letter topic what was redelivered too often, and seeking: everything that moves the
subscription's cursor or retires what the consumer tracks. Individual acknowledgements go to the
consumer's :class:`~filepulsar.connector.client.ack_grouping.AckGrouper`, which writes them in
groups; whatever else moves the cursor writes the groups first.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable, Iterable
from typing import Any

from filepulsar.connector.client.ack_grouping import AckGrouper
from filepulsar.connector.client.consumer.dead_letters import DeadLetters
from filepulsar.connector.client.consumer.receiver_queue import ReceiverQueue
from filepulsar.connector.client.consumer.records import Entry, Part
from filepulsar.connector.client.consumer.topics import TopicSet
from filepulsar.connector.client.message import Message
from filepulsar.dispatch.redelivery import (
    MultiplierRedeliveryBackoff,
    goes_to_dead_letter,
    negative_ack_delay_ms,
)
from filepulsar.storage.errors import DataLossError, FilePulsarError, InvalidConfiguration
from filepulsar.storage.ledger import EARLIEST, Position
from filepulsar.storage.messageid import MessageId

log = logging.getLogger("filepulsar.connector.client.consumer")  # the Consumer's logger, as before

#: (part, entry position, batch index or -1, the tracked entry if the consumer holds it)
Resolved = tuple[Part, Position, int, Entry | None]


class AckTracker:
    """What the consumer delivered and not yet acknowledged, and every way to retire it.

    Owns the ack-timeout tick; holds the entries through ``topics``' parts (``Part.unacked``)
    and drops from ``queue`` what is redelivered or sought past. Not thread-safe: the
    consumer's lock is held by every caller.

    Parameters
    ----------
    topics, queue, acks
        The consumer's topics, receiver queue and grouped acknowledgements.
    dead_letters, dead_letter_after
        With ``dead_letter_after`` set (Shared and Key_Shared with a dead-letter policy): an
        entry redelivered that many times goes to ``dead_letters`` instead of coming back.
    batch_index_ack
        Batch-index acknowledgement (else the batch tracker: a batch entry is acknowledged in
        storage once all its messages are).
    ack_timeout_ms, tick_ms, ack_timeout_backoff
        The ack timeout (0: off), how often it is checked, and its redelivery backoff.
    nack_delay_ms, nack_backoff
        The negative-acknowledgement delay and backoff.
    clock, seek_inclusive
        Epoch ms; whether a seek to an id delivers that id again.
    name, subscription
        The consumer's name and subscription, for the log.
    """

    def __init__(
        self,
        topics: TopicSet,
        queue: ReceiverQueue,
        acks: AckGrouper,
        *,
        dead_letters: DeadLetters,
        dead_letter_after: int | None,
        batch_index_ack: bool,
        ack_timeout_ms: int,
        tick_ms: int,
        ack_timeout_backoff: MultiplierRedeliveryBackoff | None,
        nack_delay_ms: int,
        nack_backoff: MultiplierRedeliveryBackoff | None,
        clock: Callable[[], int],
        seek_inclusive: bool,
        name: str,
        subscription: str,
    ) -> None:
        self._topics = topics
        self._queue = queue
        self._acks = acks
        self._dead = dead_letters
        self._dead_after = dead_letter_after
        self._batch_index_ack = batch_index_ack
        self._ack_timeout = ack_timeout_ms
        self._tick = tick_ms
        self._ack_timeout_backoff = ack_timeout_backoff
        self._nack_delay = nack_delay_ms
        self._nack_backoff = nack_backoff
        self._clock = clock
        self._seek_inclusive = seek_inclusive
        self._name = name
        self._subscription = subscription
        self._next_tick = 0

    # ------------------------------------------------------------------ resolving ids
    def resolve(self, item: Message | MessageId) -> Resolved:
        """Where a received message or an id is, and its tracked entry if held."""
        if isinstance(item, Message):
            v, r = item._v, item._r
            re_ = v.row_entry
            if re_ is None:
                raise InvalidConfiguration("messages read by a Reader cannot be acknowledged")
            ent = re_[r]
            # (a row of an entry that is not a batch has batch index -1: no column to read)
            return ent.part, ent.pos, v.batch_indexes()[r] if ent.batched else -1, ent
        if isinstance(item, MessageId):
            part = self._topics.part_for(item)
            pos = Position(item.ledger_id, item.entry_id)
            return part, pos, item.batch_index, part.unacked.get(pos)
        raise InvalidConfiguration(f"expected a Message or a MessageId, got {type(item).__name__}")

    @staticmethod
    def items_of(message: Any) -> list[Any]:
        """A Message, a MessageId or a list of them, as a list (else InvalidConfiguration)."""
        if isinstance(message, Message | MessageId):
            return [message]
        if isinstance(message, Iterable) and not isinstance(message, str | bytes):
            return list(message)
        raise InvalidConfiguration(
            f"expected a Message, a MessageId or a list of them, got {type(message).__name__}"
        )

    def acknowledge(self, message: Message | MessageId | Iterable[Message | MessageId]) -> None:
        """Acknowledge messages (grouped; see ``Consumer.acknowledge``)."""
        self.ack([self.resolve(m) for m in self.items_of(message)])

    def ack(self, resolved: list[Resolved]) -> None:
        """Acknowledge resolved messages: retire their entries (a batch entry once all its
        messages are) and hand the positions to the grouper."""
        if len(resolved) == 1:  # (most calls: no grouping by partition)
            self.ack_one(resolved[0])
            return
        by_part: dict[int, tuple[Part, list[tuple[Position, int, int]]]] = {}
        for part, pos, bidx, ent in resolved:
            self._retire(part, pos, bidx, ent, by_part.setdefault(id(part), (part, []))[1])
        for part, items in by_part.values():
            self._acks.add(part.sc, items)

    def ack_one(self, resolved: Resolved) -> None:
        """:meth:`ack` of one resolved message."""
        part, pos, bidx, ent = resolved
        items: list[tuple[Position, int, int]] = []
        self._retire(part, pos, bidx, ent, items)
        self._acks.add(part.sc, items)

    def _retire(
        self,
        part: Part,
        pos: Position,
        bidx: int,
        ent: Entry | None,
        items: list[tuple[Position, int, int]],
    ) -> None:
        """:meth:`ack` of one message: retire its entry (a batch entry once all its messages
        are) and append what the grouper is to write to ``items``."""
        if ent is None:
            if bidx < 0:
                items.append((pos, -1, 1))
            else:
                items.append((pos, bidx, self._entry_size(part, pos)))
            return
        if ent.nacked and not self._batch_index_ack and ent.batched:
            # The entry is coming back: remember the acknowledgement, so its redelivery
            # to this consumer brings only what is still unacknowledged.
            if bidx >= 0:
                ent.acked_indexes().add(bidx)
            return
        if ent.batched and ent.size > 1 and bidx >= 0:
            if bidx in ent.acked:
                return
            ent.acked_indexes().add(bidx)
            if len(ent.acked) >= ent.size:
                items.append((pos, -1, 1))
                part.forget(ent)
            elif self._batch_index_ack:
                items.append((pos, bidx, ent.size))
            return
        items.append((pos, -1, 1))
        if ent.chunk_positions:
            items.extend((p, -1, 1) for p in ent.chunk_positions)
        part.forget(ent)

    @staticmethod
    def _entry_size(part: Part, pos: Position) -> int:
        """The messages in entry ``pos`` (read for an acknowledgement of a batch index of an
        entry this consumer no longer tracks). An entry retention deleted counts as one
        message: nothing of it can be delivered again, and acknowledging it whole changes
        nothing (at or before the cursor, as Pulsar acknowledges such an id: silently)."""
        ml = part.sc.ml
        try:
            got = ml.read_entries(ml.state(), pos, end=pos, max_entries=1)
        except DataLossError as e:
            if ml.deleted_by_retention(e):
                return 1
            raise
        if not got:
            raise InvalidConfiguration(f"{part.topic} has no entry {pos[0]}:{pos[1]}")
        return got[0].header.num_messages

    def acknowledge_cumulative(self, message: Message | MessageId) -> None:
        """Acknowledge every message of the message's partition up to and including it, the
        partition's grouped acknowledgements first (durable when this returns)."""
        part, pos, bidx, ent = self.resolve(message)
        self._acks.flush(part.sc)
        target: Position | None = pos
        size = ent.size if ent is not None else (self._entry_size(part, pos) if bidx >= 0 else 1)
        if bidx >= 0 and bidx < size - 1:
            # Up to the previous entry; the batch itself only partly.
            target = self._previous(part, pos)
            if ent is not None:
                ent.acked_indexes().update(range(bidx + 1))
            if self._batch_index_ack:
                part.sc.acknowledge([(pos, i, size) for i in range(bidx + 1)])
        if target is not None:
            part.sc.acknowledge_cumulative(target)
            for ent in [e for p, e in part.unacked.items() if p <= target]:
                part.forget(ent)

    @staticmethod
    def _previous(part: Part, pos: Position) -> Position | None:
        if pos[1] > 0:
            return Position(pos[0], pos[1] - 1)
        prev = [lg for lg in part.sc.ml.state().ledgers if lg.ledger_id < pos[0] and lg.entries]
        return Position(prev[-1].ledger_id, prev[-1].entries - 1) if prev else None

    def negative_acknowledge(self, message: Message | MessageId) -> None:
        """Schedule the message's redelivery after the negative-ack delay (or dead-letter it)."""
        part, pos, _, ent = self.resolve(message)
        if self._acks.touches(part.sc, pos):
            self._acks.flush(part.sc)  # an acknowledgement of it pending here is written first
        count = ent.redelivery_count if ent is not None else 0
        if (
            self._dead_after is not None
            and ent is not None
            and goes_to_dead_letter(count, self._dead_after)
        ):
            only = [message] if isinstance(message, Message) else None
            if self._try_dead_letter(ent, only):
                return
        delay = negative_ack_delay_ms(count, delay_ms=self._nack_delay, backoff=self._nack_backoff)
        self._redeliver(part, [(pos, ent)], delay)

    def _redeliver(
        self, part: Part, items: list[tuple[Position, Entry | None]], delay: int
    ) -> None:
        todo = []
        marked: set[int] = set()
        for pos, ent in items:
            if ent is not None:
                if ent.nacked:
                    continue
                ent.nacked = True
                marked.add(id(ent))
            todo.append(pos)
        if marked:
            self._queue.drop(lambda e: id(e) in marked)
        if todo:
            try:
                part.sc.negative_acknowledge(todo, delay)
            except BaseException:
                # Nothing was scheduled: the entries stay unacknowledged and may be tried again
                # (their queued messages come back with the redelivery that eventually works).
                for _, ent in items:
                    if ent is not None and id(ent) in marked:
                        ent.nacked = False
                raise

    def redeliver_unacknowledged(self) -> None:
        """Redeliver every entry received and not acknowledged (or dead-letter it), and drop
        the receiver queue."""
        self._acks.flush()
        for part in self._topics.parts:
            ents = [e for e in part.unacked.values() if not e.nacked]
            limit = self._dead_after
            if limit is not None:
                ents = [
                    e
                    for e in ents
                    if not (
                        goes_to_dead_letter(e.redelivery_count, limit) and self._try_dead_letter(e)
                    )
                ]
            self._redeliver(part, [(e.pos, e) for e in ents], 0)
        self._queue.clear()

    def _unacked_messages(self, ent: Entry) -> list[Message]:
        view = ent.view
        if view is None:
            return []
        bidx = view.batch_indexes()
        return [
            Message(view, r)
            for r in range(ent.first_row, ent.first_row + ent.rows)
            if bidx[r] < 0 or bidx[r] not in ent.acked
        ]

    # ------------------------------------------------------------------ dead letters
    def _dead_letter(self, ent: Entry, msgs: list[Message] | None = None) -> None:
        """Send ``msgs`` of ``ent`` (default: all its unacknowledged messages, queued ones
        too) to the dead-letter topic, drop those still in the receiver queue (they must not
        be delivered again) and acknowledge them."""
        if msgs is None:
            msgs = self._unacked_messages(ent)
        self._dead.send(msgs)
        rows = {m._r for m in msgs}
        self._queue.drop(lambda e: e is ent, rows)
        self.ack([self.resolve(m) for m in msgs])

    def _try_dead_letter(self, ent: Entry, msgs: list[Message] | None = None) -> bool:
        """:meth:`_dead_letter`; on a storage error log it and return False (the caller
        redelivers the entry instead, as Pulsar's client does when the DLQ send fails)."""
        try:
            self._dead_letter(ent, msgs)
        except (FilePulsarError, OSError):
            log.exception(
                "consumer %s (subscription %r): dead-lettering entry %d:%d of %s failed; "
                "redelivering it instead",
                self._name,
                self._subscription,
                ent.pos[0],
                ent.pos[1],
                ent.part.topic_str,
            )
            return False
        return True

    # ------------------------------------------------------------------ timers
    def tick_due(self) -> bool:
        """Whether :meth:`tick_if_due` has timer work to do now."""
        return self._clock() >= self._next_tick

    def tick_if_due(self) -> None:
        """Write grouped acknowledgements that are due and, every tick, redeliver entries
        whose ack timeout expired."""
        now = self._clock()
        self._acks.flush_if_due(now)
        if now < self._next_tick:
            return
        now = self._clock()  # (after a write of a group, which takes a while)
        self._next_tick = now + self._tick
        if self._ack_timeout > 0:
            self._check_ack_timeouts(now)

    def _check_ack_timeouts(self, now: int) -> None:
        for part in self._topics.parts:
            expired = [
                e
                for e in part.unacked.values()
                if e.received_ms and not e.nacked and now - e.received_ms >= self._ack_timeout
            ]
            if not expired:
                continue
            by_delay: dict[int, list[tuple[Position, Entry | None]]] = {}
            for e in expired:
                if (
                    self._dead_after is not None
                    and goes_to_dead_letter(e.redelivery_count, self._dead_after)
                    and self._try_dead_letter(e)
                ):
                    continue
                b = self._ack_timeout_backoff
                delay = b.next(e.redelivery_count) if b is not None else 0
                by_delay.setdefault(delay, []).append((e.pos, e))
            # Batch indexes of these entries acknowledged here and not yet written go first:
            # whoever gets an entry back gets its stored acknowledged indexes, and may be
            # another consumer of this process.
            settle = self._batch_index_ack and any(e.acked for e in expired)
            for delay, items in by_delay.items():
                try:
                    if settle:
                        self._acks.flush(part.sc)
                        settle = False
                    self._redeliver(part, items, delay)
                except (FilePulsarError, OSError):
                    # Logged, not raised: the sweep also runs in receive(); the entries stay
                    # expired and are tried again at the next tick.
                    log.exception(
                        "consumer %s (subscription %r): ack-timeout redelivery of %s on %s failed",
                        self._name,
                        self._subscription,
                        ", ".join(f"{p[0]}:{p[1]}" for p, _ in items),
                        part.topic_str,
                    )

    # ------------------------------------------------------------------ seeking
    def seek(self, target: MessageId | int | datetime.datetime) -> None:
        """Move the cursor of every part (an id: of its own part) and forget what was
        delivered and queued there, the grouped acknowledgements written first: this
        consumer's, and those the process's other consumers of its subscription partitions
        hold (else their later write would undo the seek)."""
        self._acks.flush()
        for part in self._topics.parts:
            self._acks.flush(part.sc)
        if isinstance(target, datetime.datetime):
            target = int(target.timestamp() * 1000)
        if isinstance(target, bool) or not isinstance(target, int | MessageId):
            raise InvalidConfiguration(
                f"seek takes a MessageId or a publish time in epoch ms, got {target!r}"
            )
        if isinstance(target, int):
            for part in self._topics.parts:
                ml = part.sc.ml
                pos = ml.find_by_publish_time(ml.state(), target)
                self._seek_part(part, pos, None)
            return
        if target in (MessageId.earliest, MessageId.latest):
            for part in self._topics.parts:
                ml = part.sc.ml
                first = ml.next_position(ml.state(), EARLIEST)
                self._seek_part(part, first if target == MessageId.earliest else None, None)
            return
        part = self._topics.part_for(target)
        pos = Position(target.ledger_id, target.entry_id)
        if target.batch_index >= 0:
            skip = target.batch_index if self._seek_inclusive else target.batch_index + 1
            self._seek_part(part, pos, (pos, skip))
        elif self._seek_inclusive:
            self._seek_part(part, pos, None)
        else:
            ml = part.sc.ml
            self._seek_part(part, ml.next_position(ml.state(), pos), None)

    def _seek_part(
        self, part: Part, pos: Position | None, skip: tuple[Position, int] | None
    ) -> None:
        part.sc.seek(pos)
        self._queue.drop(lambda e: e.part is part)
        part.reset()
        part.skip = skip
