"""The client's ``Consumer``: receiving, acknowledging, redelivery, retry and dead letters.

One :class:`~storage.subscription.SubscriptionConsumer` per managed ledger subscribed (every
partition of every topic, the retry topic too) does the dispatching; this module adds what
Pulsar's client does on top of its broker:

- a receiver queue filled lazily when ``receive``/``batch_receive`` find it empty (fetches
  are sized in entries from the queue's free room; nothing is claimed in the background);
- entries expanded into messages (batch entries into their messages, chunked messages
  reassembled), skipping batch indexes already acknowledged when batch-index
  acknowledgement is on, and dropping (and acknowledging) messages a tag filter rejects;
- the batch tracker: with batch-index acknowledgement off, a batch entry is acknowledged in
  storage once every message of it is acknowledged;
- negative acknowledgement with a fixed delay or a :class:`MultiplierRedeliveryBackoff`, the
  ack timeout (``unacked_messages_timeout_ms``, checked every ``tick_duration_ms``), the
  dead-letter topic for Shared and Key_Shared subscriptions and ``reconsume_later`` with the
  retry-letter topic, with Pulsar's counts (shared/reference/PULSAR_RULES.md);
- a housekeeping thread that renews the consumer's leases, applies ack timeouts and
  re-lists the topics of a pattern subscription.

Every acknowledgement is durable when the call returns (one subscription commit per call and
managed ledger), so a process killed at any instant loses no acknowledged progress.
"""

from __future__ import annotations

import datetime
import gc
import logging
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Container, Iterable, Sequence
from typing import Any

import numpy as np

from filepulsar.connector.client_message import Message, _View, message_id_topic, tag_filter_matches
from filepulsar.connector.client_schema import Schema, bind_for_reading
from filepulsar.connector.client_types import (
    AlreadyClosed,
    ConsumerBatchReceivePolicy,
    ConsumerDeadLetterPolicy,
    ConsumerKeySharedPolicy,
    ConsumerType,
    CumulativeAcknowledgementNotAllowedError,
    InitialPosition,
    Interrupted,
    KeySharedMode,
    OperationNotSupported,
    RegexSubscriptionMode,
    Timeout,
    _check_type_or_none,
)
from filepulsar.dispatch.redelivery import (
    DEFAULT_DELAY_LEVELS,
    DEFAULT_MAX_RECONSUME_TIMES,
    PROPERTY_DELAY_TIME,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RECONSUME_TIMES,
    MultiplierRedeliveryBackoff,
    dead_letter_topic,
    delay_of_level,
    goes_to_dead_letter,
    negative_ack_delay_ms,
    parse_delay_levels,
    retry_goes_to_dead_letter,
    retry_letter_topic,
)
from filepulsar.storage import paths
from filepulsar.storage.blobstore import BlobStore
from filepulsar.storage.delivery import Delivery
from filepulsar.storage.entry import preload_pandas
from filepulsar.storage.errors import FilePulsarError, InvalidConfiguration
from filepulsar.storage.ledger import EARLIEST, Position
from filepulsar.storage.messageid import MessageId
from filepulsar.storage.names import DOMAINS, TopicName
from filepulsar.storage.policies import effective_policies
from filepulsar.storage.producer import Producer as StorageProducer
from filepulsar.storage.reader import ChunkAssembler
from filepulsar.storage.subscription import SubscriptionConsumer
from filepulsar.storage.subscriptions import ensure_subscription
from filepulsar.storage.topics import ensure_topic, list_topics, partitions_of
from filepulsar.storage.watch import CommitWaiter

log = logging.getLogger(__name__)

Pos = tuple[int, int]
_MAX_FETCH_ENTRIES = 100
_LISTENER_MIN_PAUSE_S = 0.1  # after a failed receive in the listener thread, doubling ...
_LISTENER_MAX_PAUSE_S = 5.0  # ... up to this
_GC_PAUSE_ROWS = 512
_SUB_TYPES = {
    ConsumerType.Exclusive: "Exclusive",
    ConsumerType.Shared: "Shared",
    ConsumerType.Failover: "Failover",
    ConsumerType.KeyShared: "Key_Shared",
}


class _Entry:
    """What the consumer tracks of one delivered entry until it is acknowledged."""

    __slots__ = (
        "acked",
        "batched",
        "chunk_positions",
        "first_row",
        "nacked",
        "part",
        "pos",
        "received_ms",
        "redelivery_count",
        "registration",
        "rows",
        "size",
        "view",
    )

    def __init__(self, part: _Part, pos: Pos, size: int, batched: bool, count: int) -> None:
        self.part = part
        self.registration = part.registration  # the consumer's registration that claimed it
        self.pos = pos
        self.size = size
        self.batched = batched
        self.redelivery_count = count
        self.acked: set[int] = set()
        self.view: _View | None = None
        self.first_row = 0
        self.rows = 0
        self.received_ms = 0
        self.nacked = False
        self.chunk_positions: list[Pos] = []


class _Part:
    """One subscribed managed ledger (a partition or a non-partitioned topic)."""

    def __init__(self, sc: SubscriptionConsumer, topic: TopicName) -> None:
        self.sc = sc
        self.topic = topic
        self.topic_str = str(topic)
        self.partition = topic.partition_index
        self.assembler = ChunkAssembler()
        self.chunks: dict[str, dict[int, Pos]] = {}
        self.unacked: dict[Pos, _Entry] = {}
        self.avg = 0.0  # messages per entry, to size fetches (0: not known yet)
        self.skip: tuple[Pos, int] | None = None  # seek into a batch: skip indexes < n
        self.registration = sc.registrations  # what the queue holds was claimed under it

    def reset(self) -> None:
        self.assembler = ChunkAssembler()
        self.chunks = {}
        self.unacked = {}


def _ms(value: int | float | datetime.timedelta, what: str) -> int:
    if isinstance(value, datetime.timedelta):
        return int(value.total_seconds() * 1000)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise InvalidConfiguration(f"{what} must be >= 0 ms or a timedelta, got {value!r}")
    return int(value)


def _wall_ms() -> int:
    return int(time.time() * 1000)


def _messages(view: _View, rows: Sequence[int]) -> list[Message]:
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


class Consumer:
    """A consumer on one subscription of one or more topics (pulsar-client's ``Consumer``).

    Created by :meth:`connector.client.Client.subscribe`, which documents the parameters and
    holds their defaults (every one is passed here explicitly).
    Thread-safe: every method takes the consumer's lock (waits in ``receive`` release it).
    """

    def __init__(
        self,
        store: BlobStore,
        topic: str | Sequence[str] | re.Pattern[str],
        subscription_name: str,
        *,
        consumer_type: ConsumerType,
        receiver_queue_size: int,
        consumer_name: str | None,
        unacked_messages_timeout_ms: int | None,
        tick_duration_ms: int,
        ack_timeout_redelivery_backoff: MultiplierRedeliveryBackoff | None,
        negative_ack_redelivery_delay_ms: int,
        negative_ack_redelivery_backoff: MultiplierRedeliveryBackoff | None,
        pattern_auto_discovery_period: int,
        initial_position: InitialPosition,
        start_message_id_inclusive: bool,
        batch_receive_policy: ConsumerBatchReceivePolicy | None,
        key_shared_policy: ConsumerKeySharedPolicy | None,
        batch_index_ack_enabled: bool,
        regex_subscription_mode: RegexSubscriptionMode,
        dead_letter_policy: ConsumerDeadLetterPolicy | None,
        retry_enable: bool,
        subscription_properties: dict[str, str] | None,
        priority_level: int,
        consumer_lease_ms: int,
        message_listener: Callable[[Consumer, Message], None] | None,
        is_pattern_topic: bool,
        clock: Callable[[], int] | None,
        schema: Schema | None = None,
        retry_delay_levels: str | Sequence[int] | None = None,
        is_read_compacted: bool = False,
    ) -> None:
        #: The value schema messages are decoded with (None: bytes).
        self._schema = schema
        self._read_compacted = is_read_compacted
        if not isinstance(subscription_name, str) or not subscription_name:
            raise InvalidConfiguration("subscription_name must be a non-empty string")
        if not isinstance(consumer_type, ConsumerType):
            raise InvalidConfiguration(
                f"consumer_type must be a ConsumerType (Exclusive, Shared, Failover, KeyShared), "
                f"got {consumer_type!r}"
            )
        if not isinstance(initial_position, InitialPosition):
            raise InvalidConfiguration(
                f"initial_position must be InitialPosition.Earliest or .Latest, "
                f"got {initial_position!r}"
            )
        if not isinstance(receiver_queue_size, int) or receiver_queue_size < 0:
            raise InvalidConfiguration(
                f"receiver_queue_size must be an integer >= 0, got {receiver_queue_size!r}"
            )
        if unacked_messages_timeout_ms is not None and unacked_messages_timeout_ms < 0:
            raise InvalidConfiguration(
                "unacked_messages_timeout_ms must be >= 0 (None or 0 disables it), "
                f"got {unacked_messages_timeout_ms!r}"
            )
        if tick_duration_ms < 1:
            raise InvalidConfiguration(f"tick_duration_ms must be >= 1, got {tick_duration_ms}")
        if negative_ack_redelivery_delay_ms < 0:
            raise InvalidConfiguration(
                "negative_ack_redelivery_delay_ms must be >= 0, "
                f"got {negative_ack_redelivery_delay_ms}"
            )
        if consumer_type is not ConsumerType.KeyShared and key_shared_policy is not None:
            raise InvalidConfiguration("key_shared_policy applies to ConsumerType.KeyShared only")
        self._store = store
        preload_pandas()  # off the first message's path
        self._clock = clock or _wall_ms
        self._subscription = subscription_name
        self._type = consumer_type
        self._sub_type = _SUB_TYPES[consumer_type]
        self._consumer_name = consumer_name or f"fp-consumer-{uuid.uuid4().hex[:10]}"
        self._queue_size = receiver_queue_size
        self._ack_timeout = unacked_messages_timeout_ms or 0
        self._tick = tick_duration_ms
        self._ack_timeout_backoff = ack_timeout_redelivery_backoff
        self._nack_delay = negative_ack_redelivery_delay_ms
        self._nack_backoff = negative_ack_redelivery_backoff
        self._discovery_s = max(1, int(pattern_auto_discovery_period))
        self._initial = "Earliest" if initial_position is InitialPosition.Earliest else "Latest"
        self._seek_inclusive = start_message_id_inclusive
        self._batch_policy = batch_receive_policy or ConsumerBatchReceivePolicy()
        ksp = key_shared_policy or ConsumerKeySharedPolicy()
        self._ks_mode = "STICKY" if ksp.key_shared_mode is KeySharedMode.Sticky else "AUTO_SPLIT"
        self._ks_ranges = ksp.sticky_ranges or None
        self._ks_consistent = ksp.use_consistent_hashing
        self._batch_index_ack = batch_index_ack_enabled
        self._priority = priority_level
        self._lease_ms = consumer_lease_ms
        self._sub_props = dict(subscription_properties or {})
        self._retry_enable = retry_enable
        try:
            self._delay_levels = parse_delay_levels(
                DEFAULT_DELAY_LEVELS if retry_delay_levels is None else retry_delay_levels
            )
        except ValueError as e:
            raise InvalidConfiguration(str(e)) from e
        if retry_enable and dead_letter_policy is None:
            dead_letter_policy = ConsumerDeadLetterPolicy(DEFAULT_MAX_RECONSUME_TIMES)
        self._dlq_policy = dead_letter_policy
        self._dlq_on_redelivery = dead_letter_policy is not None and self._sub_type in (
            "Shared",
            "Key_Shared",
        )
        self._lock = threading.RLock()
        self._closed = False
        self._parts: list[_Part] = []
        self._queue: deque[list[Any]] = deque()  # [view, rows, next index]
        self._queued = 0
        self._rr = 0
        self._tags: frozenset[str] = frozenset()
        self._dlq_producer: StorageProducer | None = None
        self._retry_producer: StorageProducer | None = None
        self._next_tick = 0
        self._next_discovery = 0.0
        self._waiter: CommitWaiter | None = None
        self._waiter_key: tuple[str, ...] = ()

        self._pattern: re.Pattern[str] | None = None
        self._pattern_ns: tuple[str, str] = ("public", "default")
        self._regex_mode = regex_subscription_mode
        topics: list[str]
        if isinstance(topic, re.Pattern) or (is_pattern_topic and isinstance(topic, str)):
            raw = topic.pattern if isinstance(topic, re.Pattern) else topic
            self._topic_label = raw
            # As pulsar-client: the pattern's domain is ignored (regex_subscription_mode picks
            # the domains) and it is matched against 'tenant/namespace/topic'. A pattern of
            # the topic part alone (filepulsar's shorthand) means public/default.
            body = raw.split("://", 1)[1] if "://" in raw else raw
            if "/" not in body:
                body = "public/default/(?:" + body + ")"
            self._pattern_ns = _pattern_namespace("persistent://" + body)
            flags = topic.flags if isinstance(topic, re.Pattern) else 0
            self._pattern = re.compile(body, flags)
            topics = self._discover()
        elif isinstance(topic, str):
            topics = [topic]
            self._topic_label = str(TopicName.parse(topic))
        elif isinstance(topic, Sequence) and topic and all(isinstance(t, str) for t in topic):
            topics = list(topic)
            self._topic_label = ",".join(str(TopicName.parse(t)) for t in topics)
        else:
            raise InvalidConfiguration(
                "topic must be a topic name, a non-empty list of topic names or a compiled "
                f"regular expression, got {topic!r}"
            )
        self._retry_topic: str | None = None
        self._dlq_topic: str | None = None
        if dead_letter_policy is not None:
            if self._pattern is not None and (
                not dead_letter_policy.dead_letter_topic
                or (retry_enable and not dead_letter_policy.retry_letter_topic)
            ):
                raise InvalidConfiguration(
                    "a pattern subscription with a dead-letter policy or retry needs explicit "
                    "dead_letter_topic (and retry_letter_topic) in the ConsumerDeadLetterPolicy"
                )
            # As Pulsar's client: default names derive from the first topic subscribed.
            base = str(TopicName.parse(topics[0]).base) if topics else ""
            dlq = dead_letter_policy.dead_letter_topic or dead_letter_topic(base, subscription_name)
            self._dlq_topic = str(TopicName.parse(dlq))
            if retry_enable:
                retry = dead_letter_policy.retry_letter_topic or retry_letter_topic(
                    base, subscription_name
                )
                self._retry_topic = str(TopicName.parse(retry))
        try:
            for t in topics:
                self._add_topic(t)
            if self._retry_topic is not None:
                self._add_topic(self._retry_topic)
        except BaseException:
            self._close_parts()
            raise
        self._listener = message_listener
        self._stop = threading.Event()
        # Set while the listener may deliver; cleared by pause_message_listener().
        self._listening = threading.Event()
        self._listening.set()
        self._hk = threading.Thread(
            target=self._housekeeping,
            name=f"filepulsar-consumer-{self._consumer_name}",
            daemon=True,
        )
        self._hk.start()
        self._listener_thread: threading.Thread | None = None
        if message_listener is not None:
            self._listener_thread = threading.Thread(
                target=self._listen, name=f"filepulsar-listener-{self._consumer_name}", daemon=True
            )
            self._listener_thread.start()

    # ------------------------------------------------------------------ topics
    def _discover(self) -> list[str]:
        assert self._pattern is not None
        tenant, namespace = self._pattern_ns
        domains = {
            RegexSubscriptionMode.PersistentOnly: ("persistent",),
            RegexSubscriptionMode.NonPersistentOnly: ("non-persistent",),
            RegexSubscriptionMode.AllTopics: DOMAINS,
        }[self._regex_mode]
        out = []
        for dom in domains:
            for info in list_topics(self._store, tenant, namespace, dom):
                n = info.name
                if self._pattern.fullmatch(f"{n.tenant}/{n.namespace}/{n.local_name}"):
                    out.append(str(info.name))
        return out

    def _add_topic(self, topic: str) -> None:
        t = TopicName.parse(topic)
        n = ensure_topic(self._store, t)
        bind_for_reading(self._store, t, self._schema, effective_policies(self._store, t))
        names = [t.partition(i) for i in range(n)] if n else [t]
        have = {p.topic for p in self._parts}
        for name in names:
            if name in have:
                continue
            sc = SubscriptionConsumer(
                self._store,
                name,
                self._subscription,
                sub_type=self._sub_type,
                consumer_name=self._consumer_name,
                initial_position=self._initial,
                priority_level=self._priority,
                key_shared_mode=self._ks_mode,
                sticky_ranges=self._ks_ranges,
                lease_ms=self._lease_ms,
                subscription_properties=self._sub_props,
                use_consistent_hashing=self._ks_consistent,
                clock=self._clock,
                read_compacted=self._read_compacted and str(t) != self._retry_topic,
            )
            self._parts.append(_Part(sc, name))
            tags = frozenset(sc.subscription_properties)
            if self._tags and tags != self._tags:
                log.warning(
                    "subscription %r on %s has tags %s, other topics have %s",
                    self._subscription,
                    name,
                    sorted(tags),
                    sorted(self._tags),
                )
            self._tags = self._tags | tags

    def _rediscover(self) -> None:
        assert self._pattern is not None
        current = set(self._discover())
        known = {p.topic.base for p in self._parts}
        for t in sorted(current):
            if TopicName.parse(t) not in known:
                try:
                    self._add_topic(t)
                    log.info("pattern consumer %s picked up %s", self._consumer_name, t)
                except FilePulsarError as e:
                    log.warning("pattern consumer could not subscribe to %s: %s", t, e)
        wanted = {TopicName.parse(t) for t in current}
        if self._retry_topic is not None:
            wanted.add(TopicName.parse(self._retry_topic))
        for p in [p for p in self._parts if p.topic.base not in wanted]:
            if partitions_of(self._store, p.topic.base) is None:  # the topic was deleted
                self._drop_part_queue(p)
                self._parts.remove(p)
                try:
                    p.sc.close()
                except FilePulsarError:
                    pass

    # ------------------------------------------------------------------ filling the queue
    def _fill(self, want: int) -> int:
        """Fetch from the partitions, round-robin, until ``want`` messages are queued."""
        added = 0
        n = len(self._parts)
        for _ in range(n):
            free = want - self._queued
            if free <= 0:
                break
            part = self._parts[self._rr % n]
            self._rr += 1
            entries = max(1, min(_MAX_FETCH_ENTRIES, int(free / part.avg))) if part.avg else 1
            deliveries = part.sc.fetch(entries)
            self._sync_registration(part)
            if deliveries and part.sc.fetch_registration == part.registration:
                added += self._enqueue(part, deliveries)
            # else claimed by a registration that lapsed since: handed to others already
        return added

    def _sync_registration(self, part: _Part) -> None:
        """Forget what ``part`` queued under a registration that lapsed.

        A consumer whose lease lapsed and was removed has had everything it held handed to
        other consumers; it registers again. As Pulsar's client clears its receiver queue when
        it reconnects, the queued (not yet received) messages of the old registration are
        dropped, and partly assembled chunked messages with them. Received messages may
        still be acknowledged."""
        now = part.sc.registrations
        if now == part.registration:
            return
        before = self._queued
        self._drop_queued(lambda e: e.part is part and e.registration != now)
        part.assembler = ChunkAssembler()
        part.chunks = {}
        part.registration = now
        log.warning(
            "consumer %s (subscription %r) lost its registration on %s (its lease lapsed); "
            "%d queued messages dropped: they are redelivered",
            self._consumer_name,
            self._subscription,
            part.topic_str,
            before - self._queued,
        )

    def _check_registrations(self) -> None:
        """Before handing out queued messages: a partition whose lease may have lapsed renews
        first (another consumer may have been given what it holds), and what a lapsed
        registration queued is dropped."""
        for part in self._parts:
            if part.sc.lease_lapsed():
                part.sc.renew()
            self._sync_registration(part)

    def _enqueue(self, part: _Part, deliveries: list[Delivery]) -> int:
        raw = [d.entry for d in deliveries]
        table = part.assembler.feed(raw, part.partition)
        entries: list[_Entry] = []
        counts: list[int] = []
        auto_ack: list[tuple[Position, int, int]] = []
        nmsgs = 0
        for d in deliveries:
            e = d.entry
            h = e.raw.header
            pos = (e.ledger_id, e.entry_id)
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
                    auto_ack.extend((Position(*p), -1, 1) for p in seen.values())
                    continue
                ent = _Entry(part, pos, 1, False, d.redelivery_count)
                ent.chunk_positions = [p for c, p in sorted(seen.items()) if p != pos]
                rows = 1
            else:
                ent = _Entry(part, pos, h.num_messages, h.batched, d.redelivery_count)
                rows = h.num_messages
                if self._batch_index_ack and d.acked_indexes:
                    ent.acked.update(d.acked_indexes)
                if d.hidden:  # hidden by a compacted view: never delivered, count as acked
                    ent.acked.update(d.hidden)
                prev = part.unacked.get(pos)
                if prev is not None and prev.batched and prev.acked:
                    # Redelivered to this consumer: what it acknowledged of the batch stays
                    # acknowledged, so a negatively acknowledged message comes back alone.
                    ent.acked.update(prev.acked)
            entries.append(ent)
            counts.append(rows)
        got = nmsgs / max(1, len(deliveries))
        part.avg = max(1.0, 0.5 * part.avg + 0.5 * got if part.avg else got)
        if sum(counts) != table.num_rows:
            raise FilePulsarError(
                f"internal error expanding entries of {part.topic}: {sum(counts)} rows expected, "
                f"{table.num_rows} decoded"
            )
        row_entry: list[_Entry] = []
        entry_index: list[int] = []
        row = 0
        for i, (ent, c) in enumerate(zip(entries, counts)):
            ent.first_row = row
            ent.rows = c
            row += c
            row_entry.extend([ent] * c)
            entry_index.extend([i] * c)
        view = _View(table, part.topic_str, entries, row_entry, entry_index)
        view.schema = self._schema
        for ent in entries:
            ent.view = view
        deliver: Sequence[int] = range(table.num_rows)
        skipping = bool(self._tags) or part.skip is not None or any(ent.acked for ent in entries)
        if skipping:
            deliver = self._select_rows(part, view, entries)
        for ent in entries:
            if len(ent.acked) >= ent.size:
                auto_ack.append((Position(*ent.pos), -1, 1))
                auto_ack.extend((Position(*p), -1, 1) for p in ent.chunk_positions)
            else:
                part.unacked[ent.pos] = ent
        if auto_ack:
            part.sc.acknowledge(auto_ack)
        if deliver:
            self._queue.append([view, deliver, 0])
            self._queued += len(deliver)
        return len(deliver)

    def _select_rows(self, part: _Part, view: _View, entries: list[_Entry]) -> list[int]:
        """Rows to deliver; rows skipped for a tag filter or a seek count as acknowledged."""
        bidx = view.batch_indexes()
        props = view.column("properties") if self._tags else None
        skip = part.skip
        out: list[int] = []
        for ent in entries:
            for r in range(ent.first_row, ent.first_row + ent.rows):
                b = bidx[r]
                if b >= 0 and b in ent.acked:
                    continue
                if skip is not None and ent.pos == skip[0] and 0 <= b < skip[1]:
                    ent.acked.add(b)
                    continue
                if props is not None and not tag_filter_matches(
                    dict(props[r]) if props[r] else None, self._tags
                ):
                    ent.acked.add(max(b, 0))
                    continue
                out.append(r)
            if skip is not None and ent.pos == skip[0]:
                part.skip = None
        return out

    def _take(self, max_n: int, max_bytes: int) -> tuple[list[Message], int]:
        """Pop up to ``max_n`` messages and, if ``max_bytes`` >= 0, up to that many payload
        bytes (at least one message); return them and their payload bytes (0 if unlimited)."""
        out: list[Message] = []
        q = self._queue
        track = self._ack_timeout > 0
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

    def _drop_part_queue(self, part: _Part) -> None:
        self._drop_queued(lambda e: e.part is part)

    def _drop_queued(
        self, drop: Callable[[_Entry], bool], only_rows: Container[int] | None = None
    ) -> None:
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

    # ------------------------------------------------------------------ receiving
    def _check_open(self) -> None:
        if self._closed:
            raise AlreadyClosed(
                f"consumer {self._consumer_name!r} of subscription {self._subscription!r} is closed"
            )

    def receive(self, timeout_millis: int | None = None) -> Message:
        """Receive one message, waiting up to ``timeout_millis`` (None: forever).

        Raises
        ------
        Timeout
            If no message arrived in time.
        AlreadyClosed
            If the consumer is closed.
        InvalidConfiguration
            If the consumer has a ``message_listener`` (messages go there), or
            ``timeout_millis`` is not an int.
        Interrupted
            If Ctrl-C (SIGINT) interrupted the wait.
        """
        if self._listener is not None:
            raise InvalidConfiguration("receive() is not allowed on a consumer with a listener")
        _check_type_or_none(int, timeout_millis, "timeout_millis")
        try:
            return self._receive(timeout_millis)
        except KeyboardInterrupt as e:
            raise Interrupted(f"receive on {self._topic_label} was interrupted") from e

    def _receive(self, timeout_millis: int | None) -> Message:
        deadline = None if timeout_millis is None else time.monotonic() + timeout_millis / 1000
        first = True
        while True:
            with self._lock:
                self._check_open()
                waiter = self._commit_waiter(restart=first)
                first = False
                self._tick_if_due()
                if not self._queued:
                    self._fill(max(1, self._queue_size))
                if self._queued:
                    self._check_registrations()  # the fill itself may have been slow
                if self._queued:
                    return self._take(1, -1)[0][0]
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Timeout(
                        f"no message on {self._topic_label} (subscription "
                        f"{self._subscription!r}) within {timeout_millis} ms"
                    )
                waiter.wait(left)
            else:
                waiter.wait()

    def _commit_waiter(self, *, restart: bool) -> CommitWaiter:
        """The waiter woken by commits to this consumer's topics and subscription state
        (made again when the topics change; lock held). Made before the look that precedes
        a wait, so a commit landing in between is not missed."""
        key = tuple(p.topic_str for p in self._parts)
        if self._waiter is None or self._waiter_key != key:
            if self._waiter is not None:
                self._waiter.close()
            folders = [paths.manifest_dir(p.topic) for p in self._parts]
            folders += [
                paths.subscription_state_dir(p.topic, self._subscription)
                for p in self._parts
                if p.sc.durable
            ]
            self._waiter = CommitWaiter(self._store, folders)
            self._waiter_key = key
        if restart:
            self._waiter.restart()
        return self._waiter

    def _receive_queued(self) -> Message | None:
        """A message already in the receiver queue, taken as ``receive`` would but without
        waiting or storage I/O: None if the queue is empty, the consumer's lock is busy or a
        timer tick is due (``receive`` then does the work). For the asyncio client, which
        calls it on the event loop's thread."""
        if self._listener is not None or not self._lock.acquire(blocking=False):
            return None
        try:
            if self._closed or not self._queued or self._clock() >= self._next_tick:
                return None
            return self._take(1, -1)[0][0]
        finally:
            self._lock.release()

    def batch_receive(self) -> list[Message]:
        """Receive messages as the ``batch_receive_policy`` allows (see
        :class:`ConsumerBatchReceivePolicy`); may return an empty list after the timeout.

        Raises
        ------
        AlreadyClosed
            If the consumer is closed.
        InvalidConfiguration
            If the consumer has a ``message_listener`` (messages go there).
        Interrupted
            If Ctrl-C (SIGINT) interrupted the wait.
        """
        if self._listener is not None:
            raise InvalidConfiguration(
                "batch_receive() is not allowed on a consumer with a listener"
            )
        try:
            return self._batch_receive()
        except KeyboardInterrupt as e:
            raise Interrupted(f"batch_receive on {self._topic_label} was interrupted") from e

    def _batch_receive(self) -> list[Message]:
        pol = self._batch_policy
        max_n = pol.max_num_message if pol.max_num_message > 0 else 1 << 62
        max_bytes = pol.max_num_bytes if pol.max_num_bytes > 0 else -1
        deadline = None if pol.timeout_ms < 0 else time.monotonic() + pol.timeout_ms / 1000
        out: list[Message] = []
        nbytes = 0
        first = True
        while True:
            with self._lock:
                self._check_open()
                waiter = self._commit_waiter(restart=first)
                first = False
                self._tick_if_due()
                want = max_n - len(out)
                if self._queued < want:
                    self._fill(max(self._queue_size, 1, min(want, 1 << 20)))
                if self._queued:
                    self._check_registrations()
                if self._queued:
                    got, used = self._take(want, max_bytes - nbytes if max_bytes > 0 else -1)
                    nbytes += used
                    out.extend(got)
                if len(out) >= max_n or (max_bytes > 0 and nbytes >= max_bytes):
                    return out
                if max_n >= 1 << 62 and max_bytes < 0 and out and not self._queued:
                    return out  # no count or size limit: what was there
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return out
                waiter.wait(left)
            else:
                waiter.wait()

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

        Durable when this returns. With batch-index acknowledgement off, a message of a batch
        entry is recorded locally and the entry is acknowledged in storage once all its
        messages are (Pulsar's batch tracker).

        Raises
        ------
        AlreadyClosed, InvalidConfiguration
            For a closed consumer or an id this consumer cannot place.
        """
        items = self._items(message)
        with self._lock:
            self._check_open()
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
            if items:
                part.sc.acknowledge(items)

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

        Raises
        ------
        CumulativeAcknowledgementNotAllowedError
            On Shared and Key_Shared subscriptions.
        """
        if self._sub_type in ("Shared", "Key_Shared"):
            raise CumulativeAcknowledgementNotAllowedError(
                f"acknowledge_cumulative is not allowed on {self._sub_type} subscriptions "
                f"(subscription {self._subscription!r}); use acknowledge"
            )
        with self._lock:
            self._check_open()
            part, pos, bidx, ent = self._resolve(message)
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

    # ------------------------------------------------------------------ dead and retry letters
    def _dead_letter(self, ent: _Entry, msgs: list[Message] | None = None) -> None:
        """Send ``msgs`` of ``ent`` (default: all its unacknowledged messages, queued ones
        too) to the dead-letter topic, drop those still in the receiver queue (they must not
        be delivered again) and acknowledge them."""
        if msgs is None:
            msgs = self._unacked_messages(ent)
        self._to_dead_letter(msgs)
        rows = {m._r for m in msgs}
        self._drop_queued(lambda e: e is ent, rows)
        self._ack([self._resolve(m) for m in msgs])

    def _try_dead_letter(self, ent: _Entry, msgs: list[Message] | None = None) -> bool:
        """:meth:`_dead_letter`; on a storage error log it and return False (the caller
        redelivers the entry instead, as Pulsar's client does when the DLQ send fails)."""
        try:
            self._dead_letter(ent, msgs)
        except (FilePulsarError, OSError):
            log.exception(
                "consumer %s (subscription %r): dead-lettering entry %d:%d of %s failed; "
                "redelivering it instead",
                self._consumer_name,
                self._subscription,
                ent.pos[0],
                ent.pos[1],
                ent.part.topic_str,
            )
            return False
        return True

    def _producer(self, topic: str, kind: str) -> StorageProducer:
        # Copies of chunked messages are as large as the reassembled message: chunking on
        # (which needs batching off; storage chunks persistent topics only).
        p = StorageProducer(
            self._store,
            topic,
            producer_name=f"{self._subscription}-{self._consumer_name}-{uuid.uuid4().hex[:8]}-{kind}",
            batching_enabled=False,
            chunking_enabled=TopicName.parse(topic).persistent,
            clock=self._clock,
        )
        return p

    def _dlq(self) -> StorageProducer:
        if self._dlq_producer is None:
            assert self._dlq_topic is not None and self._dlq_policy is not None
            self._dlq_producer = self._producer(self._dlq_topic, "DLQ")
            initial = self._dlq_policy.initial_subscription_name
            if initial:
                t = TopicName.parse(self._dlq_topic)
                n = partitions_of(self._store, t) or 0
                for name in [t.partition(i) for i in range(n)] if n else [t]:
                    ensure_subscription(self._store, name, initial, clock=self._clock)
        return self._dlq_producer

    @staticmethod
    def _send_copy(
        p: StorageProducer, m: Message, props: dict[str, str], deliver_after: int | None = None
    ) -> None:
        p.send(
            m.data(),
            properties=props,
            partition_key=m.partition_key() or None,
            ordering_key=m._v.column("ordering_key")[m._r] or None,  # the stored bytes
            event_timestamp=m.event_timestamp() or None,
            deliver_after=deliver_after,
        )

    def _to_dead_letter(self, msgs: list[Message]) -> None:
        p = self._dlq()
        for m in msgs:
            props = m.properties()
            props.setdefault(PROPERTY_REAL_TOPIC, m.topic_name())
            props.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, str(m.message_id()))
            self._send_copy(p, m, props)
            log.info(
                "message %s of %s went to dead-letter topic %s",
                m.message_id(),
                m.topic_name(),
                self._dlq_topic,
            )

    def reconsume_later(
        self,
        message: Message,
        delay_ms: int | datetime.timedelta | None = None,
        properties: dict[str, str] | None = None,
        *,
        delay_level: int | None = None,
    ) -> None:
        """Retry a message later through the retry-letter topic (Pulsar's reconsumeLater).

        The copy's properties gain ``REAL_TOPIC`` and ``ORIGIN_MESSAGE_ID`` (unless present),
        ``RECONSUMETIMES`` (1 on the first retry, then +1) and ``DELAY_TIME``; ``properties``
        are merged in. If ``RECONSUMETIMES`` exceeds the dead-letter policy's
        ``max_redeliver_count`` (16 without a policy) the copy goes to the dead-letter topic,
        else to the retry topic, delivered after the delay (Shared and Key_Shared
        subscriptions hold it; Exclusive and Failover deliver it at once, as Pulsar does).
        The original is acknowledged once the copy is stored.

        The delay is one of (the vendor guide's three modes): ``delay_ms`` (ms or a
        timedelta); ``delay_level=k``, the k-th of the consumer's ``retry_delay_levels``
        (default ``"1s 5s 10s 30s 1m 2m ... 1h 2h"``: level 1 is 1 s, level 3 10 s); or
        neither, increasing levels: the n-th retry of a message waits level n (1 s, 5 s,
        10 s, ..., then the last level).

        Raises
        ------
        InvalidConfiguration
            If the consumer was not subscribed with ``retry_enable=True``, for a bad delay or
            level, or both ``delay_ms`` and ``delay_level``.
        """
        if not self._retry_enable:
            raise InvalidConfiguration(
                "reconsume_later needs subscribe(..., retry_enable=True) (the consumer then "
                "also subscribes to the retry-letter topic)"
            )
        if not isinstance(message, Message):
            raise InvalidConfiguration("reconsume_later takes a received Message")
        if delay_ms is not None and delay_level is not None:
            raise InvalidConfiguration("reconsume_later takes delay_ms or delay_level, not both")
        delay = _ms(delay_ms, "delay_ms") if delay_ms is not None else -1
        if delay_level is not None:
            try:
                delay = delay_of_level(self._delay_levels, delay_level)
            except ValueError as e:
                raise InvalidConfiguration(str(e)) from e
        with self._lock:
            self._check_open()
            props = message.properties()
            if properties:
                props.update(properties)
            if PROPERTY_RECONSUME_TIMES in props:
                times = int(props[PROPERTY_RECONSUME_TIMES]) + 1
            else:
                times = 1
            if delay < 0:  # increasing levels: the n-th retry waits level n
                delay = delay_of_level(self._delay_levels, times)
            props.setdefault(PROPERTY_REAL_TOPIC, message.topic_name())
            props.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, str(message.message_id()))
            props[PROPERTY_RECONSUME_TIMES] = str(times)
            props[PROPERTY_DELAY_TIME] = str(delay)
            assert self._dlq_policy is not None and self._retry_topic is not None
            if retry_goes_to_dead_letter(times, self._dlq_policy.max_redeliver_count):
                self._send_copy(self._dlq(), message, props)
            else:
                if self._retry_producer is None:
                    self._retry_producer = self._producer(self._retry_topic, "RETRY")
                self._send_copy(self._retry_producer, message, props, deliver_after=delay)
            self._ack([self._resolve(message)])

    # ------------------------------------------------------------------ timers
    def _tick_if_due(self) -> None:
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

    def _housekeeping(self) -> None:
        interval = min(self._lease_ms / 6000, 1.0)
        if self._ack_timeout > 0:
            interval = min(interval, self._tick / 1000)
        interval = max(interval, 0.02)
        while not self._stop.wait(interval):
            if self._closed:
                return
            # Leases first, without the consumer's lock: the application may hold it for a
            # long storage call (a contended acknowledgement, a slow first read), and a lease
            # that lapses meanwhile hands everything the consumer holds to others.
            for part in list(self._parts):
                try:
                    part.sc.renew_if_due()
                except (FilePulsarError, OSError) as e:
                    log.warning("consumer %s lease renewal failed: %s", self._consumer_name, e)
            if not self._lock.acquire(timeout=interval):
                continue  # busy: the rest can wait for the next round
            try:
                if self._closed:
                    return
                self._housekeep()
            except (FilePulsarError, OSError) as e:
                log.warning("consumer %s housekeeping failed: %s", self._consumer_name, e)
            finally:
                self._lock.release()

    def _housekeep(self) -> None:
        for part in self._parts:
            self._sync_registration(part)
        self._tick_if_due()
        if self._sub_type == "Failover" and self._queued:
            inactive = {id(p) for p in self._parts if not p.sc.is_active()}
            if inactive:
                self._drop_queued(lambda e: id(e.part) in inactive)
        if self._pattern is not None and time.monotonic() >= self._next_discovery:
            self._next_discovery = time.monotonic() + self._discovery_s
            self._rediscover()

    def _listen(self) -> None:
        assert self._listener is not None
        pause = _LISTENER_MIN_PAUSE_S
        while not self._stop.is_set():
            if not self._listening.is_set():
                self._listening.wait()
                continue
            try:
                msg = self._receive(100)
            except Timeout:
                continue
            except AlreadyClosed:
                return
            except Exception:  # a storage hiccup must not end delivery for good
                if self._closed:
                    return
                log.exception(
                    "message listener of %s (topic %s, subscription %r): receive failed; "
                    "retrying in %.1f s",
                    self._consumer_name,
                    self._topic_label,
                    self._subscription,
                    pause,
                )
                self._stop.wait(pause)
                pause = min(pause * 2, _LISTENER_MAX_PAUSE_S)
                continue
            pause = _LISTENER_MIN_PAUSE_S
            # Paused while this message was being taken: hold it until the resume, so no
            # listener call starts after pause_message_listener() returned.
            self._listening.wait()
            if self._stop.is_set():
                return  # closing: the message is redelivered as every unacknowledged one
            try:
                self._listener(self, msg)
            except Exception:  # a listener's failure must not stop delivery
                log.exception("message listener of %s raised", self._consumer_name)

    def pause_message_listener(self) -> None:
        """Stop handing messages to the ``message_listener`` until
        :meth:`resume_message_listener`. Messages keep arriving into the receiver queue (up
        to ``receiver_queue_size``) and are delivered after the resume, in order. No listener
        call starts after this returns (one already running finishes). No effect on a
        consumer without a listener."""
        self._listening.clear()

    def resume_message_listener(self) -> None:
        """Deliver messages to the ``message_listener`` again, starting with those that
        arrived while it was paused."""
        self._listening.set()

    # ------------------------------------------------------------------ seeking
    def seek(self, target: MessageId | int | datetime.datetime) -> None:
        """Reset the subscription to a message id or a publish time (epoch ms or datetime).

        ``MessageId.earliest``/``latest`` and times apply to every topic and partition; a
        specific id to its own partition. The next message is the one after the id, or the
        id itself with ``start_message_id_inclusive=True``; with a time, the first message
        published at or after it. Unacknowledged and queued messages are forgotten.

        Raises
        ------
        InvalidConfiguration
            For an id that does not belong to this consumer's topics, or a bad target.
        """
        with self._lock:
            self._check_open()
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

    # ------------------------------------------------------------------ lifecycle
    def topic(self) -> str:
        """The topic (comma-separated topics, or the pattern) this consumer reads."""
        return self._topic_label

    def subscription_name(self) -> str:
        return self._subscription

    def consumer_name(self) -> str:
        return self._consumer_name

    def is_connected(self) -> bool:
        return not self._closed

    def get_last_message_id(self) -> MessageId:
        """The id of the last message stored in this consumer's (only) topic partition.

        Raises
        ------
        InvalidConfiguration
            If the consumer reads more than one partition.
        """
        with self._lock:
            parts = [p for p in self._parts if str(p.topic.base) != self._retry_topic]
            if len(parts) != 1:
                raise InvalidConfiguration(
                    "get_last_message_id needs a consumer of one non-partitioned topic"
                )
            lid, eid = parts[0].sc.ml.state().last_position()
            return MessageId(parts[0].partition, lid, eid)

    def _close_parts(self) -> None:
        for p in self._parts:
            try:
                p.sc.close()
            except FilePulsarError as e:
                log.warning("closing %s on %s failed: %s", self._consumer_name, p.topic, e)

    def close(self) -> None:
        """Leave the subscription; messages not acknowledged go to other consumers."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._stop.set()
            self._listening.set()  # a paused listener thread wakes and sees the stop
            self._close_parts()
            if self._waiter is not None:
                self._waiter.close()
            for prod in (self._dlq_producer, self._retry_producer):
                if prod is not None:
                    prod.close()
            self._queue.clear()
            self._queued = 0
        for th in (self._hk, self._listener_thread):
            if th is not None and th is not threading.current_thread():
                th.join(timeout=5)

    def unsubscribe(self) -> None:
        """Delete the subscription on every topic (retry topic included) and close.

        Raises
        ------
        ConsumerBusy
            If other consumers are connected to the subscription.
        """
        with self._lock:
            self._check_open()
            for p in self._parts:
                p.sc.unsubscribe()
        self.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _pattern_namespace(pattern: str) -> tuple[str, str]:
    """``(tenant, namespace)`` a topic pattern lists topics in."""
    if "://" in pattern:
        rest = pattern.split("://", 1)[1]
        parts = rest.split("/")
        if len(parts) >= 3 and all(re.fullmatch(r"[A-Za-z0-9_\-=:.%]+", s) for s in parts[:2]):
            return parts[0], parts[1]
        raise InvalidConfiguration(
            f"topic pattern {pattern!r} must name its tenant and namespace literally, e.g. "
            "'persistent://public/default/orders-.*'"
        )
    return ("public", "default")
