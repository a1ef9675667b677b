"""The client consumer's acknowledgements: placing a message or id on its partition and
entry, acknowledging (individually, cumulatively, batch indexes with the batch tracker),
negative acknowledgement and redelivery, the ack timeout, and seeking: everything that moves
the subscription's cursor. Individual acknowledgements go to the consumer's
:class:`~filepulsar.connector.client.ack_grouping.AckGrouper`, which writes them in groups; whatever
else moves the cursor writes the groups first.

Part of :class:`~filepulsar.connector.client.consumer.Consumer` (a base class of it).
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from filepulsar.connector.client.message import Message, message_id_topic
from filepulsar.connector.client.queue import Pos, _Entry, _Part, _ReceiverQueue
from filepulsar.connector.client.types import (
    CumulativeAcknowledgementNotAllowedError,
    OperationNotSupported,
)
from filepulsar.dispatch.modes import ConsumerType
from filepulsar.dispatch.redelivery import (
    goes_to_dead_letter,
    negative_ack_delay_ms,
)
from filepulsar.storage.errors import FilePulsarError, InvalidConfiguration
from filepulsar.storage.ledger import EARLIEST, Position
from filepulsar.storage.messageid import MessageId
from filepulsar.storage.names import TopicName

log = logging.getLogger("filepulsar.connector.client.consumer")  # the Consumer's logger, as before


class _Acknowledging(_ReceiverQueue):
    """Acknowledging, redelivering and seeking."""

    if TYPE_CHECKING:

        def _try_dead_letter(self, ent: _Entry, msgs: list[Message] | None = None) -> bool: ...

    # ------------------------------------------------------------------ resolving ids
    def _part_for(self, mid: MessageId) -> _Part:
        topic = message_id_topic(mid)
        if topic is not None:
            for p in self._parts:
                if p.topic_str == topic:
                    return p
            raise InvalidConfiguration(
                f"message id {mid} is from topic {topic}, which this consumer does not "
                f"consume ({self._topic_label})"
            )
        cands = [p for p in self._parts if p.partition == mid.partition]
        if len(cands) > 1 and self._retry_topic is not None:
            retry = TopicName.parse(self._retry_topic)
            cands = [p for p in cands if p.topic.base != retry]
        if len(cands) == 1:
            return cands[0]
        # pulsar-client's error for an id without a topic on a multi-topic consumer (a
        # ValueError here too: OperationNotSupported is an InvalidConfiguration).
        raise OperationNotSupported(
            f"message id {mid} does not say which of this consumer's topics it belongs to; "
            "acknowledge the Message or an id from Message.message_id()"
        )

    def _resolve(self, item: Message | MessageId) -> tuple[_Part, Pos, int, _Entry | None]:
        if isinstance(item, Message):
            v, r = item._v, item._r
            re_ = v.row_entry
            if re_ is None:
                raise InvalidConfiguration("messages read by a Reader cannot be acknowledged")
            ent = re_[r]
            return ent.part, ent.pos, v.batch_indexes()[r], ent
        if isinstance(item, MessageId):
            part = self._part_for(item)
            pos = (item.ledger_id, item.entry_id)
            return part, pos, item.batch_index, part.unacked.get(pos)
        raise InvalidConfiguration(f"expected a Message or a MessageId, got {type(item).__name__}")

    @staticmethod
    def _items(message: Any) -> list[Any]:
        if isinstance(message, Message | MessageId):
            return [message]
        if isinstance(message, Iterable) and not isinstance(message, str | bytes):
            return list(message)
        raise InvalidConfiguration(
            f"expected a Message, a MessageId or a list of them, got {type(message).__name__}"
        )

    # ------------------------------------------------------------------ acknowledging
    def acknowledge(self, message: Message | MessageId | Iterable[Message | MessageId]) -> None:
        """Acknowledge messages (a Message, a MessageId, or a list of either).

        Grouped as Pulsar's clients group acknowledgements: written to storage (one commit per
        partition) when ``ack_grouping_max_size`` are pending or the oldest is
        ``ack_grouping_time_ms`` old, and before ``close()``, ``seek``, a cumulative
        acknowledgement and ``redeliver_unacknowledged_messages`` return. The message is
        never delivered to this consumer again meanwhile; a crash before the write delivers
        it again (at-least-once). With ``ack_grouping_time_ms=0``, durable when this
        returns. With batch-index acknowledgement off, a message of a batch entry is recorded
        locally and the entry is acknowledged in storage once all its messages are (Pulsar's
        batch tracker).

        Raises
        ------
        AlreadyClosed, InvalidConfiguration
            For a closed consumer or an id this consumer cannot place.
        BlobStoreError
            The error of an earlier group whose write failed in the background (it is
            kept and tried again; this acknowledgement was not recorded), or of a group
            written here (kept too).
        """
        items = self._items(message)
        with self._lock:
            self._check_open()
            self._acks.raise_failure()
            self._ack([self._resolve(m) for m in items])

    def _ack(self, resolved: list[tuple[_Part, Pos, int, _Entry | None]]) -> None:
        by_part: dict[int, tuple[_Part, list[tuple[Position, int, int]]]] = {}
        for part, pos, bidx, ent in resolved:
            items = by_part.setdefault(id(part), (part, []))[1]
            if ent is None:
                if bidx < 0:
                    items.append((Position(*pos), -1, 1))
                else:
                    items.append((Position(*pos), bidx, self._entry_size(part, pos)))
                continue
            if ent.nacked and not self._batch_index_ack and ent.batched:
                # The entry is coming back: remember the acknowledgement, so its redelivery
                # to this consumer brings only what is still unacknowledged.
                if bidx >= 0:
                    ent.acked.add(bidx)
                continue
            if ent.batched and ent.size > 1 and bidx >= 0:
                if bidx in ent.acked:
                    continue
                ent.acked.add(bidx)
                if len(ent.acked) >= ent.size:
                    items.append((Position(*pos), -1, 1))
                    self._forget(ent)
                elif self._batch_index_ack:
                    items.append((Position(*pos), bidx, ent.size))
                continue
            items.append((Position(*pos), -1, 1))
            items.extend((Position(*p), -1, 1) for p in ent.chunk_positions)
            self._forget(ent)
        for part, items in by_part.values():
            self._acks.add(part.sc, items)

    @staticmethod
    def _forget(ent: _Entry) -> None:
        if ent.part.unacked.get(ent.pos) is ent:
            del ent.part.unacked[ent.pos]

    @staticmethod
    def _entry_size(part: _Part, pos: Pos) -> int:
        ml = part.sc.ml
        got = ml.read_entries(ml.state(), Position(*pos), end=Position(*pos), max_entries=1)
        if not got:
            raise InvalidConfiguration(f"{part.topic} has no entry {pos[0]}:{pos[1]}")
        return got[0].raw.header.num_messages

    def acknowledge_cumulative(self, message: Message | MessageId) -> None:
        """Acknowledge every message of the message's partition up to and including it.

        Not grouped: the partition's grouped acknowledgements are written first, then this,
        durable when it returns.

        Raises
        ------
        CumulativeAcknowledgementNotAllowedError
            On Shared and Key_Shared subscriptions.
        """
        if self._sub_type in (ConsumerType.Shared, ConsumerType.KeyShared):
            raise CumulativeAcknowledgementNotAllowedError(
                f"acknowledge_cumulative is not allowed on {self._sub_type.wire} subscriptions "
                f"(subscription {self._subscription!r}); use acknowledge"
            )
        with self._lock:
            self._check_open()
            part, pos, bidx, ent = self._resolve(message)
            self._acks.flush(part.sc)
            target: Pos | None = pos
            size = (
                ent.size if ent is not None else (self._entry_size(part, pos) if bidx >= 0 else 1)
            )
            if bidx >= 0 and bidx < size - 1:
                # Up to the previous entry; the batch itself only partly.
                target = self._previous(part, pos)
                if ent is not None:
                    ent.acked.update(range(bidx + 1))
                if self._batch_index_ack:
                    part.sc.acknowledge([(Position(*pos), i, size) for i in range(bidx + 1)])
            if target is not None:
                part.sc.acknowledge_cumulative(Position(*target))
                for p in [p for p in part.unacked if p <= target]:
                    del part.unacked[p]

    @staticmethod
    def _previous(part: _Part, pos: Pos) -> Pos | None:
        if pos[1] > 0:
            return (pos[0], pos[1] - 1)
        prev = [lg for lg in part.sc.ml.state().ledgers if lg.ledger_id < pos[0] and lg.entries]
        return (prev[-1].ledger_id, prev[-1].entries - 1) if prev else None

    def negative_acknowledge(self, message: Message | MessageId) -> None:
        """Ask for redelivery of a message after the negative-ack delay.

        The delay is ``negative_ack_redelivery_backoff.next(redelivery_count)`` when a backoff
        is set, else ``negative_ack_redelivery_delay_ms`` (at least 100 ms). Without
        batch-index acknowledgement the whole batch entry comes back. On Shared and
        Key_Shared subscriptions with a dead-letter policy, a message whose redelivery count
        has reached ``max_redeliver_count`` goes to the dead-letter topic instead and is
        acknowledged.
        """
        with self._lock:
            self._check_open()
            part, pos, _, ent = self._resolve(message)
            self._acks.flush(part.sc)  # an acknowledgement of it pending here is written first
            count = ent.redelivery_count if ent is not None else 0
            if self._dlq_on_redelivery and ent is not None:
                assert self._dlq_policy is not None
                if goes_to_dead_letter(count, self._dlq_policy.max_redeliver_count):
                    only = [message] if isinstance(message, Message) else None
                    if self._try_dead_letter(ent, only):
                        return
            delay = negative_ack_delay_ms(
                count, delay_ms=self._nack_delay, backoff=self._nack_backoff
            )
            self._redeliver(part, [(pos, ent)], delay)

    def _redeliver(self, part: _Part, items: list[tuple[Pos, _Entry | None]], delay: int) -> None:
        todo = []
        marked: set[int] = set()
        for pos, ent in items:
            if ent is not None:
                if ent.nacked:
                    continue
                ent.nacked = True
                marked.add(id(ent))
            todo.append(Position(*pos))
        if marked:
            self._drop_queued(lambda e: id(e) in marked)
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

    def redeliver_unacknowledged_messages(self) -> None:
        """Redeliver every message received and not acknowledged (and drop the queue).

        The dead-letter policy applies as to negative acknowledgements: on Shared and
        Key_Shared, a message whose redelivery count reached ``max_redeliver_count`` goes to
        the dead-letter topic instead (as pulsar-client does).
        """
        with self._lock:
            self._check_open()
            self._acks.flush()
            for part in self._parts:
                ents = [e for e in part.unacked.values() if not e.nacked]
                if self._dlq_on_redelivery:
                    assert self._dlq_policy is not None
                    limit = self._dlq_policy.max_redeliver_count
                    ents = [
                        e
                        for e in ents
                        if not (
                            goes_to_dead_letter(e.redelivery_count, limit)
                            and self._try_dead_letter(e)
                        )
                    ]
                self._redeliver(part, [(e.pos, e) for e in ents], 0)
            self._queue.clear()
            self._queued = 0

    def _unacked_messages(self, ent: _Entry) -> list[Message]:
        view = ent.view
        if view is None:
            return []
        bidx = view.batch_indexes()
        return [
            Message(view, r)
            for r in range(ent.first_row, ent.first_row + ent.rows)
            if bidx[r] < 0 or bidx[r] not in ent.acked
        ]

    # ------------------------------------------------------------------ timers
    def _tick_if_due(self) -> None:
        self._acks.flush_due()
        now = self._clock()
        if now < self._next_tick:
            return
        self._next_tick = now + self._tick
        if self._ack_timeout > 0:
            self._check_ack_timeouts(now)

    def _check_ack_timeouts(self, now: int) -> None:
        for part in self._parts:
            expired = [
                e
                for e in part.unacked.values()
                if e.received_ms and not e.nacked and now - e.received_ms >= self._ack_timeout
            ]
            if not expired:
                continue
            by_delay: dict[int, list[tuple[Pos, _Entry | None]]] = {}
            for e in expired:
                if self._dlq_on_redelivery:
                    assert self._dlq_policy is not None
                    if goes_to_dead_letter(
                        e.redelivery_count, self._dlq_policy.max_redeliver_count
                    ) and self._try_dead_letter(e):
                        continue
                b = self._ack_timeout_backoff
                delay = b.next(e.redelivery_count) if b is not None else 0
                by_delay.setdefault(delay, []).append((e.pos, e))
            for delay, items in by_delay.items():
                try:
                    self._redeliver(part, items, delay)
                except (FilePulsarError, OSError):
                    # Logged, not raised: the sweep also runs in receive(); the entries stay
                    # expired and are tried again at the next tick.
                    log.exception(
                        "consumer %s (subscription %r): ack-timeout redelivery of %s on %s failed",
                        self._consumer_name,
                        self._subscription,
                        ", ".join(f"{p[0]}:{p[1]}" for p, _ in items),
                        part.topic_str,
                    )

    # ------------------------------------------------------------------ seeking
    def seek(self, target: MessageId | int | datetime.datetime) -> None:
        """Reset the subscription to a message id or a publish time (epoch ms or datetime).

        ``MessageId.earliest``/``latest`` and times apply to every topic and partition; a
        specific id to its own partition. The next message is the one after the id, or the
        id itself with ``start_message_id_inclusive=True``; with a time, the first message
        published at or after it. Grouped acknowledgements are written first; unacknowledged
        and queued messages are forgotten.

        Raises
        ------
        InvalidConfiguration
            For an id that does not belong to this consumer's topics, or a bad target.
        """
        with self._lock:
            self._check_open()
            self._acks.flush()
            if isinstance(target, datetime.datetime):
                target = int(target.timestamp() * 1000)
            if isinstance(target, bool) or not isinstance(target, int | MessageId):
                raise InvalidConfiguration(
                    f"seek takes a MessageId or a publish time in epoch ms, got {target!r}"
                )
            if isinstance(target, int):
                for part in self._parts:
                    ml = part.sc.ml
                    pos = ml.find_by_publish_time(ml.state(), target)
                    self._seek_part(part, pos, None)
                return
            if target in (MessageId.earliest, MessageId.latest):
                for part in self._parts:
                    ml = part.sc.ml
                    first = ml.next_position(ml.state(), EARLIEST)
                    self._seek_part(part, first if target == MessageId.earliest else None, None)
                return
            part = self._part_for(target)
            pos = Position(target.ledger_id, target.entry_id)
            if target.batch_index >= 0:
                skip = target.batch_index if self._seek_inclusive else target.batch_index + 1
                self._seek_part(part, pos, ((pos.ledger_id, pos.entry_id), skip))
            elif self._seek_inclusive:
                self._seek_part(part, pos, None)
            else:
                ml = part.sc.ml
                self._seek_part(part, ml.next_position(ml.state(), pos), None)

    def _seek_part(self, part: _Part, pos: Position | None, skip: tuple[Pos, int] | None) -> None:
        part.sc.seek(pos)
        self._drop_queued(lambda e: e.part is part)
        part.reset()
        part.skip = skip
