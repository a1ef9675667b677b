"""The client consumer's receiver queue (:class:`ReceiverQueue`): entries fetched from the
subscription expanded into messages (batches split, chunked messages reassembled, batch indexes
already acknowledged and messages a tag filter rejects skipped), held until ``receive`` takes
them, and dropped when they must not be delivered (a lapsed registration, a redelivery, a seek).
"""

from __future__ import annotations

import gc
import logging
from collections import deque
from collections.abc import Callable, Container, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from filepulsar.connector.client.ack_grouping import AckGrouper
from filepulsar.connector.client.consumer.records import Entry, Part
from filepulsar.connector.client.consumer.topics import TopicSet
from filepulsar.connector.client.message import Message, View, tag_filter_matches
from filepulsar.connector.client.schema.codecs import Schema
from filepulsar.storage.delivery import Delivery, NewEntries
from filepulsar.storage.entry import SMALL_ROWS
from filepulsar.storage.errors import FilePulsarError
from filepulsar.storage.ledger import Position, ReadEntry
from filepulsar.storage.reader import ChunkAssembler, MessageRows

log = logging.getLogger("filepulsar.connector.client.consumer")  # the Consumer's logger, as before

_MAX_FETCH_ENTRIES = 100
_PUSH_FETCHES = 1  # fetches from one partition per push round (more next round: every consumer
# served gets a fetch in between)
_GC_PAUSE_ROWS = 512


def _messages(view: View, rows: Sequence[int]) -> list[Message]:
    """One Message per row. Allocating many small tracked objects at once sets off repeated
    cyclic-GC passes over everything alive (more time than the allocations themselves), and
    none of these objects can form a cycle: the collector is paused while they are built."""
    if len(rows) < _GC_PAUSE_ROWS or not gc.isenabled():
        return [Message(view, r) for r in rows]
    gc.disable()
    try:
        return [Message(view, r) for r in rows]
    finally:
        gc.enable()


def _one_message(part: Part, e: ReadEntry) -> bool:
    """Whether entry ``e`` of ``part`` holds one message, unchunked, that may be queued as a
    row of its own (:meth:`ReceiverQueue._enqueue_singles`): unbatched, or a batch of one
    (what a KeyBased producer writes for a key sent alone: its row has batch index 0) whose
    message was not acknowledged here while it was negatively acknowledged
    (:meth:`ReceiverQueue._enqueue` carries such an acknowledgement over)."""
    h = e.header
    if h.num_messages != 1 or h.chunk is not None:
        return False
    if not h.batched:
        return True
    prev = part.unacked.get(e.position)
    return prev is None or not prev.acked


class ReceiverQueue:
    """Messages fetched and not yet received, in fetch order.

    Filled lazily (:meth:`fill`, when ``receive`` finds it empty), taken from by
    :meth:`take` and dropped from by :meth:`drop`. Reads the parts and tags of ``topics``;
    gives ``acks`` (the consumer's grouper) what it must settle before another consumer may
    be handed a partition's messages. Not thread-safe: the consumer's lock is held.

    Parameters
    ----------
    topics, acks
        The consumer's topics and its grouped acknowledgements.
    schema
        The value schema messages are decoded with (None: bytes).
    batch_index_ack
        Whether batch indexes acknowledged in storage are skipped on delivery.
    clock
        Epoch ms: when a message is taken, its entry's ack-timeout clock starts ...
    track_received
        ... if this is set (an ack timeout is on).
    name, subscription
        The consumer's name and subscription, for the log.
    """

    def __init__(
        self,
        topics: TopicSet,
        acks: AckGrouper,
        *,
        schema: Schema | None,
        batch_index_ack: bool,
        clock: Callable[[], int],
        track_received: bool,
        name: str,
        subscription: str,
    ) -> None:
        self._topics = topics
        self._acks = acks
        self._schema = schema
        self._batch_index_ack = batch_index_ack
        self._clock = clock
        self._track = track_received
        self._name = name
        self._subscription = subscription
        self._queue: deque[list[Any]] = deque()  # [view, rows, next index]
        self._queued = 0
        self._rr = 0
        self._fetched = 0  # entries the last fetch gave

    def __len__(self) -> int:
        """The messages queued."""
        return self._queued

    # ------------------------------------------------------------------ filling the queue
    def fill(self, want: int) -> int:
        """Fetch from the partitions, round-robin, until ``want`` messages are queued."""
        added = 0
        n = len(self._topics.parts)
        for _ in range(n):
            free = want - self._queued
            if free <= 0:
                break
            part = self._topics.parts[self._rr % n]
            self._rr += 1
            added += self._fetch(part, free) or 0
        return added

    def fill_parts(self, parts: Sequence[Part], want: int) -> tuple[int, list[Part]]:
        """The push dispatcher's fill: fetch from ``parts`` (those where something changed),
        each until it gives nothing more or ``want`` messages are queued. The messages
        queued, and the parts that gave something at each of their fetches this round (they
        may have more: fetched again next round)."""
        added = 0
        more: list[Part] = []
        current = self._topics.parts
        for part in parts:
            if not any(p is part for p in current):
                continue  # dropped meanwhile (a pattern's topic deleted)
            for _ in range(_PUSH_FETCHES):
                free = want - self._queued
                if free <= 0:
                    return added, more
                scanned = part.sc.scan_position
                asked = self._entries(part, free)
                got = self._fetch(part, free)
                # A Key_Shared fetch whose scan moved to the end of its window, not the
                # ledger's (it passed over other consumers' entries) may find more further on.
                now = part.sc.scan_position
                further = part.sc.scan_more and now is not None and now != scanned
                if got is None:
                    if not further:
                        break
                    got = 0
                elif self._fetched < asked and not further:
                    added += got
                    break  # it gave less than asked: nothing more now (spares an empty fetch)
                added += got
            else:
                more.append(part)
        return added, more

    def take_new(
        self, part: Part, new: NewEntries, want: int, examined: bool
    ) -> tuple[int | None, bool]:
        """The push dispatcher's steady-state delivery: ``part``'s consumer's share of the
        entries its filter found (:meth:`SubscriptionConsumer.take_new_indexes`), queued as
        a fetch's would be, while ``want`` messages fit (``examined``: see
        :meth:`SubscriptionConsumer.take_new`). The messages queued (None: fetch instead),
        and whether the consumer is current with ``new`` (:meth:`SubscriptionConsumer.
        current_with`).

        Entries of one message each (a live topic's, unbatched or batches of one: see
        :func:`_one_message`), with no tag filter, seek into a batch or acknowledgement held
        here to skip, are queued as they are
        (:meth:`_enqueue_singles`): no :class:`Delivery` per entry; anything else goes the
        fetch's way (:meth:`_enqueue`)."""
        sc = part.sc
        mine, current = sc.take_new_indexes(new, want - self._queued, examined=examined)
        if mine is None:
            return None, current
        if sc.seeks_followed != part.seeks or sc.registrations != part.registration:
            self.sync_registration(part)
        if not mine:
            return 0, current
        if not self._current(part):
            return 0, current  # claimed by a registration that lapsed since: handed to others
        es = new.entries
        taken = [es[i] for i in mine]
        s = new.state
        if self._rows_fit(part, len(taken)):
            batch_acks = s.batch_acks
            for e in taken:
                if not _one_message(part, e):
                    break
                if batch_acks and sc.acked_indexes_in(s, e.position):
                    break
            else:
                held = self._acks.held(sc, [e.position for e in taken])
                if held:
                    taken = [e for e in taken if e.position not in held]
                    if not taken:
                        return 0, current
                return self._enqueue_singles(part, taken), current
        deliveries = [Delivery(e, 0, sc.acked_indexes_in(s, e.position)) for e in taken]
        return self._enqueue(part, deliveries), current

    @staticmethod
    def _entries(part: Part, free: int) -> int:
        """The entries to fetch from ``part`` for ``free`` messages of room."""
        return max(1, min(_MAX_FETCH_ENTRIES, int(free / part.avg))) if part.avg else 1

    def _fetch(self, part: Part, free: int) -> int | None:
        """One fetch from ``part`` sized for ``free`` messages: the messages queued, None if
        the fetch gave nothing."""
        deliveries = part.sc.fetch(self._entries(part, free))
        self._fetched = len(deliveries)
        self.sync_registration(part)
        if not deliveries:
            return None
        if self._current(part):
            return self._enqueue(part, deliveries)
        return 0  # claimed by a registration that lapsed since: handed to others already

    @staticmethod
    def _current(part: Part) -> bool:
        """Whether what ``part``'s consumer just handed out is still its own: not claimed by
        a registration that lapsed since, nor before a seek by another it followed since."""
        sc = part.sc
        return sc.fetch_registration == part.registration and sc.fetch_seeks == part.seeks

    def sync_registration(self, part: Part) -> None:
        """Forget what ``part`` queued under a registration that lapsed.

        A consumer whose lease lapsed and was removed has had everything it held handed to
        other consumers; it registers again. As Pulsar's client clears its receiver queue when
        it reconnects, the queued (not yet received) messages of the old registration are
        dropped, and partly assembled chunked messages with them. Received messages may
        still be acknowledged.

        Likewise after a seek by another consumer (or an admin's cursor reset) that ``part``'s
        consumer followed (:attr:`SubscriptionConsumer.seeks_followed`): Pulsar disconnects
        every consumer of the subscription then, and each clears its receiver queue; what was
        queued and delivered before is forgotten, as after this consumer's own seek, and
        everything after the new position comes again."""
        seeks = part.sc.seeks_followed
        if seeks != part.seeks:
            before = self._queued
            self.drop(lambda e: e.part is part)
            part.reset()
            part.skip = None
            part.seeks = seeks
            log.info(
                "consumer %s (subscription %r): the subscription's cursor on %s was reset "
                "(a seek); %d queued messages dropped: they are delivered again",
                self._name,
                self._subscription,
                part.topic_str,
                before - self._queued,
            )
        now = part.sc.registrations
        if now == part.registration:
            return
        before = self._queued
        self.drop(lambda e: e.part is part and e.registration != now)
        part.assembler = ChunkAssembler()
        part.chunks = {}
        part.registration = now
        log.warning(
            "consumer %s (subscription %r) lost its registration on %s (its lease lapsed); "
            "%d queued messages dropped: they are redelivered",
            self._name,
            self._subscription,
            part.topic_str,
            before - self._queued,
        )

    def check_registrations(self) -> None:
        """Before handing out queued messages: a partition whose lease may have lapsed renews
        first (another consumer may have been given what it holds), and what a lapsed
        registration queued is dropped."""
        for part in self._topics.parts:
            if part.sc.lease_lapsed():
                self._acks.flush(part.sc)  # before others may be handed what it acknowledged
                part.sc.renew()
            self.sync_registration(part)

    def next_is_current(self) -> bool:
        """Whether the next queued message may be handed out as it is, with no work of
        :meth:`check_next_registration`: its partition's lease has not lapsed, and neither its
        registration nor a followed seek changed since it was queued (no storage I/O, no
        change)."""
        if not self._queue:
            return False
        view, rows, i = self._queue[0]
        re_ = view.row_entry
        assert re_ is not None
        part = re_[rows[i]].part
        sc = part.sc
        return (
            sc.registrations == part.registration
            and sc.seeks_followed == part.seeks
            and not sc.lease_lapsed()
        )

    def check_next_registration(self) -> None:
        """:meth:`check_registrations` for the partition of the next queued message alone
        (``receive`` hands out one): the others are checked when their messages come next,
        and their leases renewed by housekeeping meanwhile, so a receive costs the same
        whatever the number of partitions. A check that drops the queue's head (a lapsed
        registration) checks the new head."""
        if self.next_is_current():
            return  # (most calls: nothing to do)
        for _ in range(len(self._topics.parts) + 1):
            if not self._queue:
                return
            head = self._queue[0]
            view, rows, i = head
            re_ = view.row_entry
            assert re_ is not None
            part = re_[rows[i]].part
            if part.sc.lease_lapsed():
                self._acks.flush(part.sc)  # before others may be handed what it acknowledged
                part.sc.renew()
            self.sync_registration(part)
            if self._queue and self._queue[0] is head:
                return

    def _rows_fit(self, part: Part, n: int) -> bool:
        """Whether ``n`` entries of ``part`` may be queued a row per entry
        (:meth:`_enqueue_singles`) as far as the queue can tell: any number (a fetch of a
        backlog as well as a look's few: each row reads its entry's already decoded columns,
        where an Arrow table of them cost a pyarrow decode per entry), no tag filter, no seek
        into a batch to skip by (each entry's own checks are the caller's)."""
        return n > 0 and not self._topics.tags and part.skip is None

    def _enqueue(self, part: Part, deliveries: list[Delivery]) -> int:
        held = self._acks.held(part.sc, (d.entry.position for d in deliveries))
        if held:
            # Acknowledged here, not yet written (a lapsed lease handed them out again): the
            # pending acknowledgement settles them; they are not delivered twice.
            deliveries = [d for d in deliveries if d.entry.position not in held]
            if not deliveries:
                return 0
        if self._rows_fit(part, len(deliveries)):
            for d in deliveries:
                if not _one_message(part, d.entry) or d.hidden or d.acked_indexes:
                    break
            else:
                return self._enqueue_singles(
                    part, [d.entry for d in deliveries], [d.redelivery_count for d in deliveries]
                )
        raw = [d.entry for d in deliveries]
        table: pa.Table | MessageRows
        if sum(e.header.num_messages for e in raw) <= SMALL_ROWS and all(
            e.header.chunk is None for e in raw
        ):
            table = MessageRows(raw, part.partition)  # a few whole messages need no table
        else:
            table = part.assembler.feed(raw, part.partition)
        entries: list[Entry] = []
        counts: list[int] = []
        auto_ack: list[tuple[Position, int, int]] = []
        nmsgs = 0
        for d in deliveries:
            e = d.entry
            h = e.header
            pos = e.position
            nmsgs += h.num_messages
            if h.chunk is not None:
                seen = part.chunks.setdefault(h.chunk.uuid, {})
                seen[h.chunk.chunk_id] = pos
                if h.chunk.chunk_id != h.chunk.num_chunks - 1:
                    continue
                del part.chunks[h.chunk.uuid]
                if len(seen) != h.chunk.num_chunks:
                    # Its first chunks are gone (before the start position): it can never be
                    # delivered whole, so it is acknowledged, as the assembler dropped it.
                    auto_ack.extend((p, -1, 1) for p in seen.values())
                    continue
                ent = Entry(part, pos, 1, False, d.redelivery_count)
                ent.chunk_positions = [p for c, p in sorted(seen.items()) if p != pos]
                rows = 1
            else:
                ent = Entry(part, pos, h.num_messages, h.batched, d.redelivery_count)
                rows = h.num_messages
                if self._batch_index_ack and d.acked_indexes:
                    ent.acked_indexes().update(d.acked_indexes)
                if d.hidden:  # hidden by a compacted view: never delivered, count as acked
                    ent.acked_indexes().update(d.hidden)
                prev = part.unacked.get(pos)
                if prev is not None and prev.batched and prev.acked:
                    # Redelivered to this consumer: what it acknowledged of the batch stays
                    # acknowledged, so a negatively acknowledged message comes back alone.
                    ent.acked_indexes().update(prev.acked)
            entries.append(ent)
            counts.append(rows)
        got = nmsgs / max(1, len(deliveries))
        part.avg = max(1.0, 0.5 * part.avg + 0.5 * got if part.avg else got)
        if sum(counts) != table.num_rows:
            raise FilePulsarError(
                f"internal error expanding entries of {part.topic}: {sum(counts)} rows expected, "
                f"{table.num_rows} decoded"
            )
        row_entry: list[Entry] = []
        entry_index: list[int] = []
        row = 0
        for i, (ent, c) in enumerate(zip(entries, counts)):
            ent.first_row = row
            ent.rows = c
            row += c
            row_entry.extend([ent] * c)
            entry_index.extend([i] * c)
        view: View[Entry] = View(table, part.topic_str, entries, row_entry, entry_index)
        view.schema = self._schema
        for ent in entries:
            ent.view = view
        deliver: Sequence[int] = range(table.num_rows)
        skipping = (
            bool(self._topics.tags) or part.skip is not None or any(ent.acked for ent in entries)
        )
        if skipping:
            deliver = self._select_rows(part, view, entries)
        for ent in entries:
            if len(ent.acked) >= ent.size:
                auto_ack.append((ent.pos, -1, 1))
                auto_ack.extend((p, -1, 1) for p in ent.chunk_positions)
            else:
                part.unacked[ent.pos] = ent
        if auto_ack:
            part.sc.acknowledge(auto_ack)
        if deliver:
            self._queue.append([view, deliver, 0])
            self._queued += len(deliver)
        return len(deliver)

    def _enqueue_singles(
        self, part: Part, raws: list[ReadEntry], counts: Sequence[int] | None = None
    ) -> int:
        """:meth:`_enqueue` of entries of one message each (:func:`_one_message`: every entry
        of a live topic whose producer does not batch, or batches by key with a key sent
        alone), with no tag filter or seek to skip by: a row per entry, all delivered.
        ``counts``: their redelivery counts (None: 0)."""
        n = len(raws)
        rows = range(n)
        # A row per entry: the entries are the rows' entries too, and row r is entry r.
        entries: list[Entry] = []
        view: View[Entry] = View(
            MessageRows(raws, part.partition, num_rows=n), part.topic_str, entries, entries, rows
        )
        view.schema = self._schema
        unacked = part.unacked
        for row, e in enumerate(raws):
            pos = e.position
            ent = Entry(part, pos, 1, e.header.batched, 0 if counts is None else counts[row])
            ent.first_row = row
            ent.rows = 1
            ent.view = view
            unacked[pos] = ent
            entries.append(ent)
        part.avg = max(1.0, 0.5 * part.avg + 0.5 if part.avg else 1.0)
        self._queue.append([view, rows, 0])
        self._queued += n
        return n

    def _select_rows(self, part: Part, view: View[Entry], entries: list[Entry]) -> list[int]:
        """Rows to deliver; rows skipped for a tag filter or a seek count as acknowledged."""
        bidx = view.batch_indexes()
        props = view.column("properties") if self._topics.tags else None
        skip = part.skip
        out: list[int] = []
        for ent in entries:
            for r in range(ent.first_row, ent.first_row + ent.rows):
                b = bidx[r]
                if b >= 0 and b in ent.acked:
                    continue
                if skip is not None and ent.pos == skip[0] and 0 <= b < skip[1]:
                    ent.acked_indexes().add(b)
                    continue
                if props is not None and not tag_filter_matches(
                    dict(props[r]) if props[r] else None, self._topics.tags
                ):
                    ent.acked_indexes().add(max(b, 0))
                    continue
                out.append(r)
            if skip is not None and ent.pos == skip[0]:
                part.skip = None
        return out

    def take(self, max_n: int, max_bytes: int) -> tuple[list[Message], int]:
        """Pop up to ``max_n`` messages and, if ``max_bytes`` >= 0, up to that many payload
        bytes (at least one message); return them and their payload bytes (0 if unlimited)."""
        out: list[Message] = []
        q = self._queue
        track = self._track
        now = self._clock() if track else 0
        budget = max_bytes
        while q and len(out) < max_n:
            chunk = q[0]
            view, rows, i = chunk[0], chunk[1], chunk[2]
            k = min(len(rows) - i, max_n - len(out))
            if budget >= 0:
                if isinstance(rows, range):  # all rows of the fetch, in order
                    sizes = view.sizes()[rows[i] : rows[i] + k]
                else:
                    sizes = view.sizes()[np.asarray(rows[i : i + k], dtype=np.int64)]
                used = np.cumsum(sizes)
                fit = int(np.searchsorted(used, budget, side="right"))
                if fit == 0 and not out:
                    fit = 1
                k = min(k, fit)
                if k == 0:
                    break
                budget -= int(used[k - 1])
            sel = rows[i : i + k]
            out.extend(_messages(view, sel))
            if track:
                ei = view.entry_index
                assert ei is not None and view.entries is not None
                for ent in view.entries[ei[sel[0]] : ei[sel[-1]] + 1]:
                    if not ent.received_ms:
                        ent.received_ms = now
            i += k
            self._queued -= k
            if i >= len(rows):
                q.popleft()
            else:
                chunk[2] = i
            if budget == 0:
                break
        return out, (max_bytes - budget if max_bytes >= 0 else 0)

    def take_one(self) -> Message:
        """Pop the next message (the queue is not empty): :meth:`take` of one, for
        ``receive``."""
        chunk = self._queue[0]
        view, rows, i = chunk[0], chunk[1], chunk[2]
        r = rows[i]
        if self._track:
            re_ = view.row_entry
            assert re_ is not None
            ent = re_[r]
            if not ent.received_ms:
                ent.received_ms = self._clock()
        i += 1
        self._queued -= 1
        if i >= len(rows):
            self._queue.popleft()
        else:
            chunk[2] = i
        return Message(view, r)

    def drop_part(self, part: Part) -> None:
        """Drop every queued message of ``part``."""
        self.drop(lambda e: e.part is part)

    def drop(self, drop: Callable[[Entry], bool], only_rows: Container[int] | None = None) -> None:
        """Remove queued (not yet received) messages whose entry ``drop`` selects (and, with
        ``only_rows``, whose row in the entry's view is one of them)."""
        kept: deque[list[Any]] = deque()
        total = 0
        for view, rows, i in self._queue:
            re_ = view.row_entry
            assert re_ is not None
            left = [
                r for r in rows[i:] if not (drop(re_[r]) and (only_rows is None or r in only_rows))
            ]
            if left:
                kept.append([view, left, 0])
                total += len(left)
        self._queue = kept
        self._queued = total

    def clear(self) -> None:
        """Drop every queued message."""
        self._queue.clear()
        self._queued = 0
