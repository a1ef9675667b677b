"""The client's ``Consumer``: receiving, acknowledging, redelivery, retry and dead letters.

One :class:`~filepulsar.storage.subscription.SubscriptionConsumer` per managed ledger subscribed
(every partition of every topic, the retry topic too) does the dispatching; this module adds what
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

Acknowledgements are grouped as Pulsar's clients group them
(:mod:`filepulsar.connector.client.ack_grouping`, an
:class:`~filepulsar.connector.client.ack_grouping.AckGrouper` the consumer owns): one subscription
commit per partition every ``ack_grouping_time_ms`` (100 ms) or ``ack_grouping_max_size`` (1,000)
acknowledgements, and before anything that moves or reads back the cursor and on ``close()``. A
process killed before a group is written loses those acknowledgements: their messages are delivered
again (at-least-once, never a lost message). With ``ack_grouping_time_ms=0`` every acknowledgement
is durable when the call returns.

This module owns the consumer's construction, ``receive``/``batch_receive`` and its
lifecycle; the rest lives in its base classes, one concept each: the receiver queue
(:mod:`filepulsar.connector.client.queue`), acknowledgements, redelivery and seek
(:mod:`filepulsar.connector.client.acks`), dead and retry letters
(:mod:`filepulsar.connector.client.dead_letter`), its topics
(:mod:`filepulsar.connector.client.topics`) and the housekeeping and listener threads
(:mod:`filepulsar.connector.client.threads`).
"""

from __future__ import annotations

import logging
import re
import threading
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from filepulsar.connector.client.ack_grouping import AckGrouper, AckGrouping
from filepulsar.connector.client.message import Message
from filepulsar.connector.client.queue import _Part
from filepulsar.connector.client.schema.codecs import Schema
from filepulsar.connector.client.threads import _Background
from filepulsar.connector.client.topics import _REGEX_DOMAINS
from filepulsar.connector.client.types import (
    ConsumerBatchReceivePolicy,
    ConsumerDeadLetterPolicy,
    ConsumerKeySharedPolicy,
    ConsumerType,
    InitialPosition,
    Interrupted,
    RegexSubscriptionMode,
    Timeout,
    _check_type_or_none,
)
from filepulsar.dispatch.clock import waits_of, wall_ms
from filepulsar.dispatch.redelivery import (
    DEFAULT_DELAY_LEVELS,
    DEFAULT_MAX_RECONSUME_TIMES,
    MultiplierRedeliveryBackoff,
    dead_letter_topic,
    parse_delay_levels,
    retry_letter_topic,
)
from filepulsar.storage import paths
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.entry import preload_pandas
from filepulsar.storage.errors import FilePulsarError, InvalidConfiguration
from filepulsar.storage.messageid import MessageId
from filepulsar.storage.names import TopicName
from filepulsar.storage.producer import Producer as StorageProducer
from filepulsar.storage.topics import TopicPattern
from filepulsar.storage.watch import CommitWaiter

log = logging.getLogger(__name__)


class Consumer(_Background):
    """A consumer on one subscription of one or more topics (pulsar-client's ``Consumer``).

    Created by :meth:`filepulsar.connector.client.Client.subscribe`, which documents the parameters
    and holds their defaults (every one is passed here explicitly).
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
        ack_grouping: AckGrouping | None = None,
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
        self._clock = clock or wall_ms
        # Deadlines and waits on the clock when it is a whole Clock (a ManualClock in tests).
        self._waits = waits_of(clock)
        self._subscription = subscription_name
        self._sub_type = consumer_type
        self._consumer_name = consumer_name or f"fp-consumer-{uuid.uuid4().hex[:10]}"
        self._queue_size = receiver_queue_size
        self._ack_timeout = unacked_messages_timeout_ms or 0
        self._tick = tick_duration_ms
        self._ack_timeout_backoff = ack_timeout_redelivery_backoff
        self._nack_delay = negative_ack_redelivery_delay_ms
        self._nack_backoff = negative_ack_redelivery_backoff
        self._discovery_s = max(1, int(pattern_auto_discovery_period))
        self._initial = initial_position
        self._seek_inclusive = start_message_id_inclusive
        self._batch_policy = batch_receive_policy or ConsumerBatchReceivePolicy()
        ksp = key_shared_policy or ConsumerKeySharedPolicy()
        self._ks_mode = ksp.key_shared_mode
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
            ConsumerType.Shared,
            ConsumerType.KeyShared,
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
        # Wakes the housekeeping thread: closing, or a group of acknowledgements started.
        self._hk_wake = threading.Event()
        self._acks = AckGrouper(
            ack_grouping or AckGrouping(),
            clock=self._clock,
            name=self._consumer_name,
            on_pending=self._hk_wake.set,
        )

        self._pattern: TopicPattern | None = None
        self._regex_mode = regex_subscription_mode
        topics: list[str]
        if isinstance(topic, re.Pattern) or (is_pattern_topic and isinstance(topic, str)):
            raw = topic.pattern if isinstance(topic, re.Pattern) else topic
            self._topic_label = raw
            # As pulsar-client: the pattern's domain is ignored (regex_subscription_mode picks
            # the domains) and it is matched against 'tenant/namespace/topic'. A pattern of
            # the topic part alone (filepulsar's shorthand) means public/default.
            self._pattern = TopicPattern.parse(
                topic, domains=_REGEX_DOMAINS[regex_subscription_mode]
            )
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

    # ------------------------------------------------------------------ receiving
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
        deadline = (
            None if timeout_millis is None else self._waits.monotonic() + timeout_millis / 1000
        )
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
                left = deadline - self._waits.monotonic()
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
            self._waiter = CommitWaiter(self._store, folders, clock=self._waits)
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
        deadline = None if pol.timeout_ms < 0 else self._waits.monotonic() + pol.timeout_ms / 1000
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
                left = deadline - self._waits.monotonic()
                if left <= 0:
                    return out
                waiter.wait(left)
            else:
                waiter.wait()

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
        """Write the grouped acknowledgements, then leave the subscription; messages not
        acknowledged go to other consumers.

        Raises
        ------
        BlobStoreError
            If writing the grouped acknowledgements failed. The consumer is closed all the
            same, and those messages are delivered again.
        """
        failure: BaseException | None = None
        with self._lock:
            if self._closed:
                return
            try:
                self._acks.close()
            except (FilePulsarError, OSError) as e:
                failure = e
                log.error(
                    "consumer %s (subscription %r): closing, writing grouped acknowledgements "
                    "failed; those messages will be delivered again: %s",
                    self._consumer_name,
                    self._subscription,
                    e,
                )
            self._closed = True
            self._stop.set()
            self._hk_wake.set()
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
        if failure is not None:
            raise failure

    def unsubscribe(self) -> None:
        """Delete the subscription on every topic (retry topic included) and close.

        Raises
        ------
        ConsumerBusy
            If other consumers are connected to the subscription.
        """
        with self._lock:
            self._check_open()
            self._acks.flush()
            for p in self._parts:
                p.sc.unsubscribe()
        self.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
