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
- a housekeeping round that renews the consumer's leases, applies ack timeouts and
  re-lists the topics of a pattern subscription.

Key_Shared consumers (without a dead-letter policy, on the system clock, with a receiver
queue and grouped acknowledgements) are served by the process's push dispatcher
(:mod:`.push`): one thread per store fetches what changed for every such consumer and fills
their receiver queues (up to ``receiver_queue_size``, Pulsar's permits), another runs their
housekeeping; ``receive`` takes from the queue and waits on a condition, with no storage call
(or fetches itself when the queue is empty and the last fetch left more: a backlog). The
others fill their queue when ``receive`` finds it empty and have a housekeeping thread each.

Acknowledgements are grouped as Pulsar's clients group them
(:mod:`filepulsar.connector.client.ack_grouping`, an
:class:`~filepulsar.connector.client.ack_grouping.AckGrouper` the consumer owns): one subscription
commit per partition every ``ack_grouping_time_ms`` (100 ms) or ``ack_grouping_max_size`` (1,000)
acknowledgements, at most ``mark_delete_rate_limit`` times a second (1.0, a broker's cursor
persistence rate), and before anything that moves or reads back the cursor and on ``close()``. A
process killed before a group is written loses those acknowledgements (up to about a second of
them): their messages are delivered again (at-least-once, never a lost message). With
``ack_grouping_time_ms=0`` every acknowledgement is durable when the call returns.

``Consumer`` is a facade: it checks the arguments, builds its collaborators, takes its lock and
delegates. Each collaborator has its own state and module in this package: the topics
(:class:`~.topics.TopicSet`), the receiver queue (:class:`~.receiver_queue.ReceiverQueue`),
acknowledgements, redelivery, the ack timeout and seek (:class:`~.ack_tracker.AckTracker`), dead
and retry letters (:class:`~.dead_letters.DeadLetters`), the housekeeping thread
(:class:`~.housekeeping.Housekeeping`) and the listener thread (:class:`~.listener.Listener`).
"""

from __future__ import annotations

import datetime
import functools
import logging
import os
import re
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import cast

from filepulsar.connector.client.ack_grouping import AckGrouper, AckGrouping
from filepulsar.connector.client.consumer.ack_tracker import AckTracker
from filepulsar.connector.client.consumer.dead_letters import DeadLetters
from filepulsar.connector.client.consumer.housekeeping import Housekeeping
from filepulsar.connector.client.consumer.listener import Listener
from filepulsar.connector.client.consumer.push import (
    PushDispatcher,
    dispatcher_for,
    renewal_failed,
)
from filepulsar.connector.client.consumer.receiver_queue import ReceiverQueue
from filepulsar.connector.client.consumer.records import Part
from filepulsar.connector.client.consumer.topics import REGEX_DOMAINS, TopicSet, pattern_topics
from filepulsar.connector.client.message import Message
from filepulsar.connector.client.schema.codecs import Schema
from filepulsar.connector.client.types import (
    AlreadyClosed,
    ConsumerBatchReceivePolicy,
    ConsumerDeadLetterPolicy,
    ConsumerKeySharedPolicy,
    ConsumerType,
    CumulativeAcknowledgementNotAllowedError,
    InitialPosition,
    Interrupted,
    RegexSubscriptionMode,
    Timeout,
    check_type_or_none,
)
from filepulsar.dispatch.clock import SYSTEM, waits_of, wall_ms
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
from filepulsar.storage.delivery import NewEntries
from filepulsar.storage.entry import preload_pandas
from filepulsar.storage.errors import FilePulsarError, InvalidConfiguration
from filepulsar.storage.ledger import Position
from filepulsar.storage.messageid import MessageId
from filepulsar.storage.names import TopicName
from filepulsar.storage.subscription import SubscriptionConsumer, renew_due
from filepulsar.storage.topics import TopicPattern
from filepulsar.storage.versioned.watch import CommitWaiter

log = logging.getLogger("filepulsar.connector.client.consumer")  # as before the package


#: A housekeeping round starts no write of a group of acknowledgements after this long (the
#: rest waits for the next round, and lease renewals go between the two).
_ROUND_BUDGET_S = 0.5


def _none_due() -> None:
    """A push-served consumer's rounds wait for no group of acknowledgements (the push
    dispatcher's :class:`~filepulsar.connector.client.ack_grouping.AckTimer` writes them)."""
    return None


def push_enabled() -> bool:
    """Whether eligible consumers are served by the push dispatcher: on unless
    ``FILEPULSAR_PUSH`` is ``0`` (or ``false``, ``no``, ``off``), which has every consumer
    fetch in its own ``receive``."""
    return os.environ.get("FILEPULSAR_PUSH", "1").strip().lower() not in ("0", "false", "no", "off")


class _PushSeat:
    """What the push dispatcher sees of a consumer (:class:`~.push.PushTarget`)."""

    __slots__ = ("consumer",)

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer

    def push_parts(self) -> list[Part]:
        return list(self.consumer._topics.parts)

    def push_folders(self, part: Part) -> list[str]:
        return [
            paths.manifest_dir(part.topic),
            paths.subscription_state_dir(part.topic, self.consumer._subscription),
        ]

    def push_fill(self, parts: Sequence[Part]) -> tuple[int, Sequence[Part]]:
        return self.consumer._push_fill(parts)

    def push_new(self, part: Part, new: NewEntries, examined: bool) -> bool | None:
        return self.consumer._push_new(part, new, examined)

    def push_housekeep(self) -> float:
        return self.consumer._hk.round_if_due()

    def push_wake(self) -> bool:
        return self.consumer._push_wake()


class Consumer:
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
        preload_pandas()  # off the first message's path
        self._clock = clock or wall_ms
        # Deadlines and waits on the clock when it is a whole Clock (a ManualClock in tests).
        self._waits = waits_of(clock)
        self._store = store
        self._subscription = subscription_name
        self._sub_type = consumer_type
        self._consumer_name = consumer_name or f"fp-consumer-{uuid.uuid4().hex[:10]}"
        self._queue_size = receiver_queue_size
        self._batch_policy = batch_receive_policy or ConsumerBatchReceivePolicy()
        self._retry_enable = retry_enable
        try:
            delay_levels = parse_delay_levels(
                DEFAULT_DELAY_LEVELS if retry_delay_levels is None else retry_delay_levels
            )
        except ValueError as e:
            raise InvalidConfiguration(str(e)) from e
        if retry_enable and dead_letter_policy is None:
            dead_letter_policy = ConsumerDeadLetterPolicy(DEFAULT_MAX_RECONSUME_TIMES)
        self._lock = threading.RLock()
        #: Push-served: notified (:meth:`_wake_receivers`) when messages were queued, an error
        #: was kept or the consumer closed. On a lock of its own, never held for long: a
        #: ``receive`` woken, or timing out, does not wait for :attr:`_lock`, which the
        #: dispatcher holds while it fetches for this consumer (storage I/O that may wait for
        #: another process's commit).
        self._arrived = threading.Condition(threading.Lock())
        self._wakes = 0  # notifications of _arrived so far (under its lock)
        #: Push-served: the dispatcher's round queued messages here and has not woken
        #: ``receive`` yet (it does once, at the round's end: :meth:`_push_wake`).
        self._push_queued = False
        #: Push-served: the threads waiting in ``receive`` for the dispatcher (counted up
        #: under both locks, down under ``_arrived``'s; a round's end wakes nobody when none
        #: waits).
        self._sleepers = 0
        self._closed = False
        self._waiter: CommitWaiter | None = None
        self._waiter_key: tuple[str, ...] = ()

        pattern: TopicPattern | None = None
        topics: list[str]
        if isinstance(topic, re.Pattern) or (is_pattern_topic and isinstance(topic, str)):
            raw = topic.pattern if isinstance(topic, re.Pattern) else topic
            self._topic_label = raw
            # As pulsar-client: the pattern's domain is ignored (regex_subscription_mode picks
            # the domains) and it is matched against 'tenant/namespace/topic'. A pattern of
            # the topic part alone (filepulsar's shorthand) means public/default.
            pattern = TopicPattern.parse(topic, domains=REGEX_DOMAINS[regex_subscription_mode])
            topics = pattern_topics(store, pattern)
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
        retry_topic: str | None = None
        dlq_topic: str | None = None
        if dead_letter_policy is not None:
            if pattern is not None and (
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
            dlq_topic = str(TopicName.parse(dlq))
            if retry_enable:
                retry = dead_letter_policy.retry_letter_topic or retry_letter_topic(
                    base, subscription_name
                )
                retry_topic = str(TopicName.parse(retry))
        self._retry_topic = retry_topic

        ksp = key_shared_policy or ConsumerKeySharedPolicy()
        sub_props = dict(subscription_properties or {})

        def subscribe(name: TopicName, t: TopicName) -> SubscriptionConsumer:
            sc = SubscriptionConsumer(
                store,
                name,
                subscription_name,
                sub_type=consumer_type,
                consumer_name=self._consumer_name,
                initial_position=initial_position,
                priority_level=priority_level,
                key_shared_mode=ksp.key_shared_mode,
                sticky_ranges=ksp.sticky_ranges or None,
                lease_ms=consumer_lease_ms,
                subscription_properties=sub_props,
                use_consistent_hashing=ksp.use_consistent_hashing,
                clock=self._clock,
                read_compacted=is_read_compacted and str(t) != retry_topic,
                # Key_Shared without a claim commit per delivery, unless a dead-letter policy
                # counts redeliveries (a crash must count for the messages it held).
                lazy_claims=dead_letter_policy is None,
                # What a consumer holds is recorded for a new membership: the process's
                # acknowledgements of it go first (else the newcomers wait for their write).
                before_record=lambda sc: self._acks.settle(sc),
                # The process renews every consumer whatever its application does: one
                # renewal commit per partition for all of them, and none beside their acks.
                renew_together=True,
            )
            # What this process acknowledged and has not written ends draining at once.
            sc.count_acked_here(functools.partial(self._acks.held, sc))
            return sc

        self._topics = TopicSet(
            store,
            schema=schema,
            clock=self._clock,
            waits=self._waits,
            subscribe=subscribe,
            pattern=pattern,
            retry_topic=retry_topic,
            label=self._topic_label,
            discovery_s=max(1, int(pattern_auto_discovery_period)),
        )
        ack_timeout = unacked_messages_timeout_ms or 0
        self._push: PushDispatcher | None = None
        if (
            consumer_type is ConsumerType.KeyShared
            and dead_letter_policy is None
            and self._waits is SYSTEM
            and receiver_queue_size > 0
            # Acknowledgements written one by one (no grouping) are commits the dispatcher
            # would look at one by one, for nothing: such a consumer fetches itself.
            and (ack_grouping or AckGrouping()).enabled
            and push_enabled()
        ):
            self._push = dispatcher_for(store)
        self._seat = _PushSeat(self)
        self._push_error: BaseException | None = None
        self._push_starved = False  # the dispatcher found the queue full: ask when it has room
        self._push_want = 0  # a batch_receive waiting for more than the queue size
        #: Push-served: the parts whose last fetch gave all it was asked (they may have more
        #: now): a receive that finds the queue empty fetches them itself rather than wait
        #: for the dispatcher's next round (a backlog drains on every consumer's thread).
        self._push_more: list[Part] = []
        interval = min(consumer_lease_ms / 6000, 1.0)
        if ack_timeout > 0:
            interval = min(interval, tick_duration_ms / 1000)
        self._hk = Housekeeping(
            name=self._consumer_name,
            interval_s=interval,
            lock=self._lock,
            # (push-served: the dispatcher's AckTimer writes the groups, not the rounds)
            due_in_ms=(lambda: self._acks.due_in_ms()) if self._push is None else _none_due,
            unlocked=self._housekeep_unlocked,
            locked=self._housekeep,
            closed=lambda: self._closed,
            driven=None if self._push is None else self._push.wake,
        )
        self._acks = AckGrouper(
            ack_grouping or AckGrouping(),
            clock=self._clock,
            name=self._consumer_name,
            on_pending=self._hk.due_changed,
            timer=None if self._push is None else self._push.ack_timer,
        )
        self._queue = ReceiverQueue(
            self._topics,
            self._acks,
            schema=schema,
            batch_index_ack=batch_index_ack_enabled,
            clock=self._clock,
            track_received=ack_timeout > 0,
            name=self._consumer_name,
            subscription=subscription_name,
        )
        self._dead_letters = DeadLetters(
            store,
            policy=dead_letter_policy,
            dlq_topic=dlq_topic,
            retry_topic=retry_topic,
            delay_levels=delay_levels,
            clock=self._clock,
            name=self._consumer_name,
            subscription=subscription_name,
        )
        dead_after = None
        if dead_letter_policy is not None and consumer_type in (
            ConsumerType.Shared,
            ConsumerType.KeyShared,
        ):
            dead_after = dead_letter_policy.max_redeliver_count
        self._tracker = AckTracker(
            self._topics,
            self._queue,
            self._acks,
            dead_letters=self._dead_letters,
            dead_letter_after=dead_after,
            batch_index_ack=batch_index_ack_enabled,
            ack_timeout_ms=ack_timeout,
            tick_ms=tick_duration_ms,
            ack_timeout_backoff=ack_timeout_redelivery_backoff,
            nack_delay_ms=negative_ack_redelivery_delay_ms,
            nack_backoff=negative_ack_redelivery_backoff,
            clock=self._clock,
            seek_inclusive=start_message_id_inclusive,
            name=self._consumer_name,
            subscription=subscription_name,
        )
        try:
            # Every partition at once (Pulsar's multi-topic consumer subscribes to each topic
            # concurrently): a registration is a durable commit of its own.
            self._topics.add_all(topics + ([retry_topic] if retry_topic is not None else []))
        except BaseException:
            self._topics.close(self._consumer_name)
            raise
        self._hk.start()
        if self._push is not None:
            self._push.add(self._seat)
        self._listener: Listener | None = None
        if message_listener is not None:
            listener = message_listener
            self._listener = Listener(
                receive=lambda timeout: self._receive(timeout),
                deliver=lambda msg: listener(self, msg),
                closed=lambda: self._closed,
                name=self._consumer_name,
                what=f"topic {self._topic_label}, subscription {subscription_name!r}",
            )
            self._listener.start()

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
        if timeout_millis is not None and type(timeout_millis) is not int:
            check_type_or_none(int, timeout_millis, "timeout_millis")  # (raises, or a subclass)
        try:
            return self._receive(timeout_millis)
        except KeyboardInterrupt as e:
            raise Interrupted(f"receive on {self._topic_label} was interrupted") from e

    def _receive(self, timeout_millis: int | None) -> Message:
        # Push-served, a message queued and current (most calls under traffic): taken at once,
        # no clock read, nothing else looked at (what the loop below does otherwise). The
        # timeout counts from the call: the clock is read first if the lock must be waited for.
        deadline = None
        if self._push is not None:
            if not self._lock.acquire(blocking=False):
                deadline = self._deadline(timeout_millis)
                if not self._lock_until(deadline):
                    raise self._timed_out(timeout_millis)
            try:
                if not self._closed and self._push_error is None and self._queue.next_is_current():
                    return self._take_one()
            finally:
                self._lock.release()
        if deadline is None:  # (not read above: the lock was free, or no timeout)
            deadline = self._deadline(timeout_millis)
        first = True
        while True:
            if not self._lock_until(deadline):
                raise self._timed_out(timeout_millis)
            pause = None
            try:
                self._check_open()
                waiter = self._look_starts(restart=first)
                first = False
                if waiter is not None:  # (push-served: the housekeeping rounds tick)
                    self._tracker.tick_if_due()
                queue = self._queue
                if not len(queue):
                    if waiter is not None:
                        queue.fill(max(1, self._queue_size))
                    elif self._push_more:
                        self._fill_pushed(max(1, self._queue_size))
                if len(queue):
                    queue.check_next_registration()  # the fill itself may have been slow
                if len(queue):
                    return self._take_one()
                if waiter is None:
                    pause = self._pause_starts(deadline)
            finally:
                self._lock.release()
            if pause is not None:
                self._pause_pushed(*pause)
                continue
            if deadline is not None:
                left = deadline - self._waits.monotonic()
                if left <= 0:
                    raise self._timed_out(timeout_millis)
                assert waiter is not None
                waiter.wait(left)
            else:
                assert waiter is not None
                waiter.wait()

    def _deadline(self, timeout_millis: int | None) -> float | None:
        """When a wait of ``timeout_millis`` starting now ends (None: it does not)."""
        return None if timeout_millis is None else self._waits.monotonic() + timeout_millis / 1000

    def _timed_out(self, timeout_millis: int | None) -> Timeout:
        return Timeout(
            f"no message on {self._topic_label} (subscription {self._subscription!r}) "
            f"within {timeout_millis} ms"
        )

    def _lock_until(self, deadline: float | None) -> bool:
        """Take this consumer's lock, waiting at most until ``deadline`` (None: as long as it
        takes); whether taken. The push dispatcher holds it while it fetches for this
        consumer, which may wait for storage (a record another process has in flight, a
        stopped process's for as long as it is stopped): a ``receive`` still returns at its
        timeout, as Pulsar's returns whatever its broker is doing."""
        if deadline is None:
            return self._lock.acquire()
        if self._lock.acquire(blocking=False):
            return True
        left = deadline - self._waits.monotonic()
        return left > 0 and self._lock.acquire(timeout=left)

    def _look_starts(self, *, restart: bool) -> CommitWaiter | None:
        """Before a look at the queue (lock held): a pulling consumer's commit waiter (see
        :meth:`_commit_waiter`); None for a push-served one, which raises here what the
        dispatcher's last fetch for it raised."""
        if self._push is None:
            return self._commit_waiter(restart=restart)
        err, self._push_error = self._push_error, None
        if err is not None:
            raise err
        return None

    def _fill_pushed(self, want: int) -> None:
        """Push-served, lock held, queue empty: fetch on this thread from the parts the last
        fetch left with more to give (a backlog), as a pulling consumer would."""
        assert self._push is not None
        parts, self._push_more = self._push_more, []
        _, self._push_more = self._queue.fill_parts(parts, want)
        self._push.note_waiting(self._seat, parts)

    def _pause_starts(self, deadline: float | None) -> tuple[int, float] | None:
        """Push-served, lock held, queue empty: count this thread among those waiting for
        the dispatcher; what :meth:`_pause_pushed` (called once the lock is let go) waits
        with. None when ``deadline`` has passed (nothing to wait for)."""
        assert self._push is not None
        if self._push_starved:
            # The dispatcher found the queue full: it has room now, ask for a look.
            self._push_starved = False
            self._push.kick(self._seat)
        left = 1.0
        if deadline is not None:
            left = deadline - self._waits.monotonic()
            if left <= 0:
                return None
        with self._arrived:  # (before the lock is let go: a queueing after it wakes us)
            self._sleepers += 1
            return self._wakes, left

    def _pause_pushed(self, wakes: int, left: float) -> None:
        """Lock not held: wait (at most ``left`` s) until the dispatcher queues something
        (or closing, or an error) unless it did since :meth:`_pause_starts` (``wakes``)."""
        with self._arrived:
            try:
                if self._wakes == wakes:
                    self._arrived.wait(left)
            finally:
                self._sleepers -= 1

    def _wake_receivers(self) -> None:
        """Wake the threads waiting in ``receive`` for the dispatcher (any thread, no other
        lock needed)."""
        with self._arrived:
            self._wakes += 1
            self._arrived.notify_all()

    def _take(self, max_n: int, max_bytes: int) -> tuple[list[Message], int]:
        """Take from the queue (lock held), then :meth:`_took`."""
        got = self._queue.take(max_n, max_bytes)
        self._took()
        return got

    def _take_one(self) -> Message:
        """:meth:`_take` of one message (the queue is not empty)."""
        got = self._queue.take_one()
        self._took()
        return got

    def _took(self) -> None:
        """After a take: a push-served consumer whose queue the dispatcher found full asks
        for more once half of it is taken (Pulsar's permits)."""
        if (
            self._push_starved
            and self._push is not None
            and len(self._queue) <= max(self._queue_size, self._push_want) // 2
        ):
            self._push_starved = False
            self._push.kick(self._seat)

    def _push_fill(self, parts: Sequence[Part]) -> tuple[int, list[Part]]:
        """The push dispatcher's round for this consumer: fetch from ``parts`` while the
        receiver queue has room, and wake ``receive``. An error is kept for the next
        ``receive`` (and logged)."""
        with self._push_locked():
            if self._closed:
                return 0, []
            want = max(1, self._queue_size, self._push_want)
            if len(self._queue) >= want:
                self._push_starved = True
                return 0, []
            try:
                added, more = self._queue.fill_parts(parts, want)
            except (FilePulsarError, OSError) as e:
                self._push_failed("fetching", e)
                return 0, []
            if len(self._queue) >= want:
                self._push_starved = True  # full: ask again when half of it is taken
            # (the dispatcher fills one partition at a time: what others left stays)
            self._push_more = [p for p in self._push_more if all(p is not q for q in parts)]
            self._push_more += more
            if added:
                self._push_queued = True  # receive is woken at the round's end
            return added, more

    def _push_new(self, part: Part, new: NewEntries, examined: bool) -> bool | None:
        """The push dispatcher's steady-state delivery to this consumer: its share of the
        new entries of ``part`` its filter found, queued with no fetch
        (:meth:`ReceiverQueue.take_new`; ``receive`` is woken at the round's end). None:
        fetch for it instead; True: done, and it is current with ``new``
        (:meth:`SubscriptionConsumer.current_with`); False: done, not current (an error
        is kept for the next ``receive``, as a fetch's)."""
        self._push_lock()  # (not _push_locked: this runs for every look at new entries)
        try:
            if self._closed:
                return False
            want = max(1, self._queue_size, self._push_want)
            try:
                added, current = self._queue.take_new(part, new, want, examined)
            except (FilePulsarError, OSError) as e:
                self._push_failed("delivering", e)
                return False
            if added is None:
                return None
            if added:
                self._push_queued = True  # receive is woken at the round's end
            return current
        finally:
            self._lock.release()

    def _push_wake(self) -> bool:
        """The end of the push dispatcher's round: wake ``receive`` if the round queued
        messages here. Once per round, after its work: a consumer thread woken in the
        middle of it contends with the dispatcher for the interpreter while it serves the
        others (and is woken again by its next partition's entries); whether it woke it.
        Takes no lock of the consumer's but ``_arrived``'s (never held for long)."""
        if not self._push_queued:  # (set on the dispatcher's thread only: this one)
            return False
        self._push_queued = False
        if self._sleepers:
            # (Nobody waits in receive otherwise: a thread about to wait counts itself under
            # the lock, before the queueing that set _push_queued took it. The next receive
            # finds the messages, and a Condition's notify costs as much as the delivery.)
            self._wake_receivers()
        return True

    @contextmanager
    def _push_locked(self) -> Iterator[None]:
        """This consumer's lock, taken by the push dispatcher's round. Held elsewhere (a
        ``close``, a ``seek``, a group of acknowledgements written in the application's
        call), the round first wakes the consumers it already queued messages for, so that
        they do not wait for this one (:meth:`PushDispatcher.wake_queued`)."""
        self._push_lock()
        try:
            yield
        finally:
            self._lock.release()

    def _push_lock(self) -> None:
        """Take this consumer's lock on the push dispatcher's thread (see
        :meth:`_push_locked`)."""
        if not self._lock.acquire(blocking=False):
            if self._push is not None:
                self._push.wake_queued()
            self._lock.acquire()

    def _push_failed(self, what: str, e: BaseException) -> None:
        """Lock held: what the dispatcher's work for this consumer raised is logged and kept
        for its next ``receive`` (which is woken to raise it)."""
        log.warning(
            "consumer %s (subscription %r): %s failed: %s",
            self._consumer_name,
            self._subscription,
            what,
            e,
        )
        self._push_error = e
        self._wake_receivers()

    def _commit_waiter(self, *, restart: bool) -> CommitWaiter:
        """The waiter woken by commits to this consumer's topics and subscription state
        (made again when the topics change; lock held). Made before the look that precedes
        a wait, so a commit landing in between is not missed."""
        parts = self._topics.parts
        key = tuple(p.topic_str for p in parts)
        if self._waiter is None or self._waiter_key != key:
            if self._waiter is not None:
                self._waiter.close()
            folders = [paths.manifest_dir(p.topic) for p in parts]
            folders += [
                paths.subscription_state_dir(p.topic, self._subscription)
                for p in parts
                if p.sc.durable
            ]
            self._waiter = CommitWaiter(self._store, folders, clock=self._waits)
            self._waiter_key = key
        if restart:
            self._waiter.restart()
        return self._waiter

    def _receive_queued(self) -> Message | None:
        """A message already in the receiver queue, taken as ``receive`` would but without
        waiting or storage I/O: None if the queue is empty, the consumer's lock is busy, a
        timer tick is due (not push-served: its housekeeping rounds tick) or the message's
        registration needs a look (a lapsed lease, a lost
        registration, a followed seek: ``receive`` then does the work). For the asyncio
        client, which calls it on the event loop's thread."""
        if self._listener is not None or not self._lock.acquire(blocking=False):
            return None
        try:
            if (
                self._closed
                or not len(self._queue)
                or (self._push is None and self._tracker.tick_due())  # (push: rounds tick)
                or not self._queue.next_is_current()
            ):
                return None
            return self._take_one()
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
        deadline = self._deadline(None if pol.timeout_ms < 0 else pol.timeout_ms)
        out: list[Message] = []
        nbytes = 0
        first = True
        while True:
            if not self._lock_until(deadline):
                self._push_want = 0  # (read by the dispatcher under the lock: one int)
                return out
            pause = None
            try:
                self._check_open()
                waiter = self._look_starts(restart=first)
                first = False
                if waiter is not None:  # (push-served: the housekeeping rounds tick)
                    self._tracker.tick_if_due()
                queue = self._queue
                want = max_n - len(out)
                if len(queue) < want:
                    size = max(self._queue_size, 1, min(want, 1 << 20))
                    if waiter is not None:
                        queue.fill(size)
                    elif not len(queue) and self._push_more:
                        self._fill_pushed(size)
                    elif size > max(self._queue_size, self._push_want):
                        self._push_want = size  # the dispatcher fills up to it
                        self._push_starved = True  # (asked for below)
                if len(queue):
                    queue.check_registrations()
                if len(queue):
                    got, used = self._take(want, max_bytes - nbytes if max_bytes > 0 else -1)
                    nbytes += used
                    out.extend(got)
                if len(out) >= max_n or (max_bytes > 0 and nbytes >= max_bytes):
                    self._push_want = 0
                    return out
                if max_n >= 1 << 62 and max_bytes < 0 and out and not len(queue):
                    self._push_want = 0
                    return out  # no count or size limit: what was there
                if waiter is None:
                    pause = self._pause_starts(deadline)
                    if pause is None:
                        self._push_want = 0
                        return out
            finally:
                self._lock.release()
            if pause is not None:
                self._pause_pushed(*pause)
                continue
            assert waiter is not None  # (push-served: paused above, or returned)
            if deadline is not None:
                left = deadline - self._waits.monotonic()
                if left <= 0:
                    return out
                waiter.wait(left)
            else:
                waiter.wait()

    def _check_open(self) -> None:
        if self._closed:
            raise AlreadyClosed(
                f"consumer {self._consumer_name!r} of subscription {self._subscription!r} is closed"
            )

    # ------------------------------------------------------------------ acknowledging
    def acknowledge(self, message: Message | MessageId | Iterable[Message | MessageId]) -> None:
        """Acknowledge messages (a Message, a MessageId, or a list of either).

        Grouped as Pulsar's clients group acknowledgements: written to storage (one commit per
        partition) when ``ack_grouping_max_size`` are pending or the oldest is
        ``ack_grouping_time_ms`` old, no sooner than ``1 / mark_delete_rate_limit`` s after
        the partition's previous write, and before ``close()``, ``seek``, a cumulative
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
        # (one Message, most calls: no list made)
        items = None if type(message) is Message else AckTracker.items_of(message)
        with self._lock:
            self._check_open()
            self._acks.raise_failure()
            tracker = self._tracker
            acked: Iterable[tuple[Part, Position]]
            if items is None:
                r = tracker.resolve(cast(Message, message))
                tracker.ack_one(r)
                acked = ((r[0], r[1]),)
            else:
                resolved = [tracker.resolve(m) for m in items]
                tracker.ack(resolved)
                acked = ((r[0], r[1]) for r in resolved)
            if self._push is not None:
                self._push.acked(self._seat, acked)

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
            self._tracker.acknowledge_cumulative(message)

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
            self._tracker.negative_acknowledge(message)
            self._kick()

    def redeliver_unacknowledged_messages(self) -> None:
        """Redeliver every message received and not acknowledged (and drop the queue).

        The dead-letter policy applies as to negative acknowledgements: on Shared and
        Key_Shared, a message whose redelivery count reached ``max_redeliver_count`` goes to
        the dead-letter topic instead (as pulsar-client does).
        """
        with self._lock:
            self._check_open()
            self._tracker.redeliver_unacknowledged()
            self._kick()

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
            self._tracker.seek(target)
            self._kick()

    def _kick(self) -> None:
        """Push-served: fetch every partition on the dispatcher's next round (after what
        cleared the queue or changed what is due)."""
        if self._push is not None:
            self._push.kick(self._seat)

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
        delay = self._dead_letters.retry_delay(delay_ms, delay_level)
        with self._lock:
            self._check_open()
            self._dead_letters.retry(message, delay, properties)
            self._tracker.ack([self._tracker.resolve(message)])

    # ------------------------------------------------------------------ background threads
    def _housekeep_unlocked(self) -> None:
        """Leases first, without the consumer's lock: the application may hold it for a long
        storage call (a contended acknowledgement, a slow first read), and a lease that lapses
        meanwhile hands everything the consumer holds to others (a push-served consumer's
        are renewed by the dispatcher's housekeeping thread, for every consumer of the
        process at once: ``PushDispatcher``). Then grouped acknowledgements, also without the
        consumer's lock (the grouper has its own): an application blocked in receive() must
        not hold them back; no group is started after ``_ROUND_BUDGET_S`` (the next round
        comes at once, lease renewals before it). A failure is logged and raised by the next
        acknowledge(). A push-served consumer's groups are the dispatcher's ``AckTimer``'s:
        its rounds only come every ``interval_s`` (or when woken)."""
        if self._push is None:
            self._renew_leases()
            self._acks.flush_due(_ROUND_BUDGET_S)

    def _renew_leases(self) -> None:
        """Renew the leases that are due (one commit per partition for every consumer of
        this process on it: ``SubscriptionConsumer.renew``), without the consumer's lock. A
        failure is logged (the next round tries again)."""
        if self._closed:
            return
        renew_due([p.sc for p in self._topics.parts], failed=renewal_failed)

    def _housekeep(self) -> None:
        """The housekeeping round's work under the lock."""
        queue = self._queue
        for part in self._topics.parts:
            queue.sync_registration(part)
        self._tracker.tick_if_due()
        if self._sub_type is ConsumerType.Failover and len(queue):
            inactive = {id(p) for p in self._topics.parts if not p.sc.is_active()}
            if inactive:
                queue.drop(lambda e: id(e.part) in inactive)
        if self._topics.rediscovery_due():
            before = [id(p) for p in self._topics.parts]
            self._topics.rediscover(self._consumer_name, self._forget_part)
            if self._push is not None and before != [id(p) for p in self._topics.parts]:
                self._push.partitions_changed(self._seat)

    def _forget_part(self, part: Part) -> None:
        """A pattern's topic was deleted: its pending acknowledgements and queue go."""
        self._acks.discard(part.sc)
        self._queue.drop_part(part)

    def pause_message_listener(self) -> None:
        """Stop handing messages to the ``message_listener`` until
        :meth:`resume_message_listener`. Messages keep arriving into the receiver queue (up
        to ``receiver_queue_size``) and are delivered after the resume, in order. No listener
        call starts after this returns (one already running finishes). No effect on a
        consumer without a listener."""
        if self._listener is not None:
            self._listener.pause()

    def resume_message_listener(self) -> None:
        """Deliver messages to the ``message_listener`` again, starting with those that
        arrived while it was paused."""
        if self._listener is not None:
            self._listener.resume()

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
            parts = [p for p in self._topics.parts if str(p.topic.base) != self._retry_topic]
            if len(parts) != 1:
                raise InvalidConfiguration(
                    "get_last_message_id needs a consumer of one non-partitioned topic"
                )
            lid, eid = parts[0].sc.ml.state().last_position()
            return MessageId(parts[0].partition, lid, eid)

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
            self._hk.stop()
            if self._push is not None:
                self._push.remove(self._seat)
                self._wake_receivers()
            if self._listener is not None:
                self._listener.stop()
            self._topics.close(self._consumer_name)
            if self._waiter is not None:
                self._waiter.close()
            self._dead_letters.close()
            self._queue.clear()
        self._hk.join(timeout=5)
        if self._listener is not None:
            self._listener.join(timeout=5)
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
            for p in self._topics.parts:
                p.sc.unsubscribe()
        self.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
