"""The asyncio client (pulsar-client's ``pulsar.asyncio``): ``Client``, ``Producer``,
``Consumer``, ``Reader`` and ``PulsarException``, built on the synchronous client.

Shaped like pulsar-client's asyncio module (``from pulsar.asyncio import Client`` becomes
``from filepulsar.asyncio import Client``; the service URL is the storage root)::

    client = Client("/data/pulsar")
    producer = await client.create_producer("orders")
    msg_id = await producer.send(b"hello")
    consumer = await client.subscribe("orders", "billing")
    msg = await consumer.receive()
    await consumer.acknowledge(msg)
    await client.close()

How it maps onto the synchronous client (:mod:`filepulsar.connector.client`):

- ``Producer.send`` queues the message with the producer's ``send_async`` on the calling
  thread and completes a future from its callback (``loop.call_soon_threadsafe``), so the
  event loop never waits for storage. As in pulsar-client's asyncio API, batching is on by
  default, so messages sent together share entries.
- Everything else that touches storage (``subscribe``, ``acknowledge``, ``seek``, ``flush``,
  ``close`` ...) runs on a thread pool owned by the client (``max_blocking_threads``
  workers), never on the loop's default executor.
- ``Consumer.receive`` and ``Reader.read_next`` do not hold a worker while they wait: a
  message already fetched into the receiver queue is taken on the loop's thread (in-memory,
  never waiting on the consumer's lock); otherwise each look for a message is one short job
  on the pool, and between looks the coroutine sleeps on the loop until a commit lands on the
  topic (the synchronous client's wake-ups, ``filepulsar.storage.versioned.watch``; re-checking
  every 250 ms), or, where nothing can be watched, for 1 ms doubling to the poll interval
  (50 ms). Any number of consumers may wait at once without starving each other or
  ``subscribe``.
- Cancelling a ``receive`` (``asyncio.wait_for`` timing out, a task cancelled) loses no
  message: a look that had not started is cancelled and takes nothing; a look already running
  when the caller went away hands what it took to the next ``receive`` of that consumer, in
  order.
- ``close()`` of a consumer or reader (and of the client) wakes receives waiting on it: they
  raise ``PulsarException`` with ``Result.AlreadyClosed``.

Errors are :class:`PulsarException` (a :class:`~filepulsar.storage.errors.FilePulsarError`)
whose ``error()`` is the :class:`~filepulsar.storage.producer.Result` code of the failure; the
synchronous client's exception is its ``__cause__``. Errors caused by a bad argument are also
``ValueError`` s, as pulsar-client raises ``ValueError`` for those.

This module owns the :class:`Client` (its thread pool and every factory); the handles and
errors it re-exports live in :mod:`filepulsar.connector.client.asyncio.producer`
(:class:`Producer`), :mod:`filepulsar.connector.client.asyncio.receive` (:class:`Consumer`,
:class:`Reader`, the wait without a worker) and :mod:`filepulsar.connector.client.asyncio.errors`
(:class:`PulsarException`, result codes).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import re
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from filepulsar.connector.client import Client as SyncClient
from filepulsar.connector.client.ack_grouping import (
    DEFAULT_ACK_GROUPING_MAX_SIZE,
    DEFAULT_ACK_GROUPING_TIME_MS,
    DEFAULT_MARK_DELETE_RATE_LIMIT,
)
from filepulsar.connector.client.asyncio.errors import (
    PulsarException,
    to_pulsar_exception,
)
from filepulsar.connector.client.asyncio.producer import Producer
from filepulsar.connector.client.asyncio.receive import (
    Consumer,
    Reader,
    Receiving,
)
from filepulsar.connector.client.types import (
    BatchingType,
    CompressionType,
    ConsumerBatchReceivePolicy,
    ConsumerCryptoFailureAction,
    ConsumerDeadLetterPolicy,
    ConsumerKeySharedPolicy,
    ConsumerType,
    HashingScheme,
    InitialPosition,
    PartitionsRoutingMode,
    ProducerAccessMode,
    RegexSubscriptionMode,
)
from filepulsar.dispatch.redelivery import MultiplierRedeliveryBackoff
from filepulsar.storage.cursor import DEFAULT_LEASE_MS
from filepulsar.storage.errors import FilePulsarError
from filepulsar.storage.messageid import MessageId
from filepulsar.storage.producer import Result

__all__ = ["Client", "Consumer", "Producer", "PulsarException", "Reader"]

T = TypeVar("T")
DEFAULT_BLOCKING_THREADS = 16


class Client:
    """The asyncio client (pulsar-client's ``pulsar.asyncio.Client``) over a storage root.

    Parameters
    ----------
    service_url
        The storage root (see :class:`filepulsar.connector.client.Client`).
    max_blocking_threads
        Workers of the client's own thread pool, which runs the storage work of every call
        (filepulsar's; waiting receives hold none).
    **kwargs
        The synchronous ``Client``'s keyword arguments (``storage_options``, pulsar-client's
        connection settings, which have no effect, ...).
    """

    def __init__(
        self,
        service_url: str,
        *,
        max_blocking_threads: int = DEFAULT_BLOCKING_THREADS,
        **kwargs: Any,
    ) -> None:
        if (
            not isinstance(max_blocking_threads, int)
            or isinstance(max_blocking_threads, bool)
            or max_blocking_threads < 1
        ):
            raise ValueError(
                f"max_blocking_threads must be an integer >= 1, got {max_blocking_threads!r}"
            )
        self._client = SyncClient(service_url, **kwargs)
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=max_blocking_threads, thread_name_prefix="filepulsar-asyncio"
        )
        self._receivers: list[Receiving] = []
        self._lock = threading.Lock()
        self._closed = False

    # ------------------------------------------------------------------ plumbing
    def _submit(self, fn: Callable[..., T], *args: Any) -> concurrent.futures.Future[T]:
        with self._lock:
            if self._closed:
                raise PulsarException(Result.AlreadyClosed, "client is closed")
            return self._pool.submit(fn, *args)

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on the client's pool; its errors as PulsarException."""
        cf = self._submit(functools.partial(fn, *args, **kwargs))
        try:
            return await asyncio.wrap_future(cf)
        except FilePulsarError as e:
            raise to_pulsar_exception(e) from e

    def _keep(self, r: Receiving) -> None:
        with self._lock:
            self._receivers = [x for x in self._receivers if not x._waiting.closing]
            self._receivers.append(r)

    def _wake_all(self) -> None:
        with self._lock:
            receivers, self._receivers = self._receivers, []
        for r in receivers:
            r._waiting.wake()

    # ------------------------------------------------------------------ API
    async def create_producer(
        self,
        topic: str,
        producer_name: str | None = None,
        schema: Any = None,
        initial_sequence_id: int | None = None,
        send_timeout_millis: int = 30000,
        compression_type: CompressionType = CompressionType.NONE,
        max_pending_messages: int = 1000,
        max_pending_messages_across_partitions: int = 50000,
        block_if_queue_full: bool = False,
        batching_enabled: bool = True,
        batching_max_messages: int = 1000,
        batching_max_allowed_size_in_bytes: int = 128 * 1024,
        batching_max_publish_delay_ms: int = 10,
        chunking_enabled: bool = False,
        message_routing_mode: PartitionsRoutingMode = PartitionsRoutingMode.RoundRobinDistribution,
        lazy_start_partitioned_producers: bool = False,
        properties: dict[str, str] | None = None,
        batching_type: BatchingType = BatchingType.Default,
        encryption_key: str | None = None,
        crypto_key_reader: Any = None,
        access_mode: ProducerAccessMode = ProducerAccessMode.Shared,
        message_router: Callable[[Any, int], int] | None = None,
        *,
        hashing_scheme: HashingScheme = HashingScheme.JavaStringHash,
        max_pending_bytes: int = 64 * 1024 * 1024,
    ) -> Producer:
        """Create a producer on ``topic``.

        Parameters and defaults are pulsar-client's asyncio ``create_producer``'s, which
        differ from the synchronous one in one point: batching is on by default. See
        :meth:`filepulsar.connector.client.Client.create_producer` for what each means here; the
        keyword-only ones are filepulsar's.

        Raises
        ------
        ValueError
            If batching and chunking are both enabled, or an argument is wrong.
        PulsarException
            ``TopicNotFound`` (missing topic, no auto-creation), ``ProducerBusy``,
            ``ProducerFenced`` ...
        """
        if batching_enabled and chunking_enabled:
            raise ValueError("Batching and chunking of messages can't be enabled together.")
        sync = await self._run(
            self._client.create_producer,
            topic,
            producer_name=producer_name,
            schema=schema,
            initial_sequence_id=initial_sequence_id,
            send_timeout_millis=send_timeout_millis,
            compression_type=compression_type,
            max_pending_messages=max_pending_messages,
            max_pending_messages_across_partitions=max_pending_messages_across_partitions,
            block_if_queue_full=block_if_queue_full,
            batching_enabled=batching_enabled,
            batching_max_messages=batching_max_messages,
            batching_max_allowed_size_in_bytes=batching_max_allowed_size_in_bytes,
            batching_max_publish_delay_ms=batching_max_publish_delay_ms,
            chunking_enabled=chunking_enabled,
            message_routing_mode=message_routing_mode,
            lazy_start_partitioned_producers=lazy_start_partitioned_producers,
            properties=properties,
            batching_type=batching_type,
            encryption_key=encryption_key,
            crypto_key_reader=crypto_key_reader,
            access_mode=access_mode,
            message_router=message_router,
            hashing_scheme=hashing_scheme,
            max_pending_bytes=max_pending_bytes,
        )
        return Producer(sync, self)

    async def subscribe(
        self,
        topic: str | list[str] | re.Pattern[str],
        subscription_name: str,
        consumer_type: ConsumerType = ConsumerType.Exclusive,
        schema: Any = None,
        receiver_queue_size: int = 1000,
        max_total_receiver_queue_size_across_partitions: int = 50000,
        consumer_name: str | None = None,
        unacked_messages_timeout_ms: int | None = None,
        broker_consumer_stats_cache_time_ms: int = 30000,
        negative_ack_redelivery_delay_ms: int = 60000,
        is_read_compacted: bool = False,
        properties: dict[str, str] | None = None,
        initial_position: InitialPosition = InitialPosition.Latest,
        crypto_key_reader: Any = None,
        replicate_subscription_state_enabled: bool = False,
        max_pending_chunked_message: int = 10,
        auto_ack_oldest_chunked_message_on_queue_full: bool = False,
        start_message_id_inclusive: bool = False,
        batch_receive_policy: ConsumerBatchReceivePolicy | None = None,
        key_shared_policy: ConsumerKeySharedPolicy | None = None,
        batch_index_ack_enabled: bool = False,
        regex_subscription_mode: RegexSubscriptionMode = RegexSubscriptionMode.PersistentOnly,
        dead_letter_policy: ConsumerDeadLetterPolicy | None = None,
        crypto_failure_action: ConsumerCryptoFailureAction = ConsumerCryptoFailureAction.FAIL,
        is_pattern_topic: bool = False,
        *,
        pattern_auto_discovery_period: int = 60,
        subscription_properties: dict[str, str] | None = None,
        retry_enable: bool = False,
        negative_ack_redelivery_backoff: MultiplierRedeliveryBackoff | None = None,
        ack_timeout_redelivery_backoff: MultiplierRedeliveryBackoff | None = None,
        tick_duration_ms: int = 1000,
        priority_level: int = 0,
        consumer_lease_ms: int = DEFAULT_LEASE_MS,
        ack_grouping_time_ms: int = DEFAULT_ACK_GROUPING_TIME_MS,
        ack_grouping_max_size: int = DEFAULT_ACK_GROUPING_MAX_SIZE,
        mark_delete_rate_limit: float = DEFAULT_MARK_DELETE_RATE_LIMIT,
    ) -> Consumer:
        """Subscribe to a topic, a list of topics, or (``is_pattern_topic=True``) a regex.

        Parameters and defaults are pulsar-client's asyncio ``subscribe``'s; see
        :meth:`filepulsar.connector.client.Client.subscribe` for what each means here. The
        keyword-only ones are filepulsar's.

        Raises
        ------
        ValueError
            If ``topic`` is a list with ``is_pattern_topic``, not a str or list, or another
            argument is wrong.
        PulsarException
            ``ConsumerBusy`` (Exclusive subscription in use) ...
        """
        if isinstance(topic, list | tuple):
            if is_pattern_topic:
                raise ValueError(
                    "Argument 'topic' must be a string when 'is_pattern_topic' is True; "
                    "lists of topics do not support pattern subscriptions"
                )
        elif not isinstance(topic, str | re.Pattern):
            raise ValueError("Argument 'topic' is expected to be of type 'str' or 'list'")
        sync = await self._run(
            self._client.subscribe,
            topic,
            subscription_name,
            consumer_type=consumer_type,
            schema=schema,
            receiver_queue_size=receiver_queue_size,
            max_total_receiver_queue_size_across_partitions=(
                max_total_receiver_queue_size_across_partitions
            ),
            consumer_name=consumer_name,
            unacked_messages_timeout_ms=unacked_messages_timeout_ms,
            broker_consumer_stats_cache_time_ms=broker_consumer_stats_cache_time_ms,
            negative_ack_redelivery_delay_ms=negative_ack_redelivery_delay_ms,
            is_read_compacted=is_read_compacted,
            properties=properties,
            pattern_auto_discovery_period=pattern_auto_discovery_period,
            initial_position=initial_position,
            crypto_key_reader=crypto_key_reader,
            replicate_subscription_state_enabled=replicate_subscription_state_enabled,
            max_pending_chunked_message=max_pending_chunked_message,
            auto_ack_oldest_chunked_message_on_queue_full=(
                auto_ack_oldest_chunked_message_on_queue_full
            ),
            start_message_id_inclusive=start_message_id_inclusive,
            batch_receive_policy=batch_receive_policy,
            key_shared_policy=key_shared_policy,
            batch_index_ack_enabled=batch_index_ack_enabled,
            regex_subscription_mode=regex_subscription_mode,
            dead_letter_policy=dead_letter_policy,
            crypto_failure_action=crypto_failure_action,
            is_pattern_topic=is_pattern_topic,
            subscription_properties=subscription_properties,
            retry_enable=retry_enable,
            negative_ack_redelivery_backoff=negative_ack_redelivery_backoff,
            ack_timeout_redelivery_backoff=ack_timeout_redelivery_backoff,
            tick_duration_ms=tick_duration_ms,
            priority_level=priority_level,
            consumer_lease_ms=consumer_lease_ms,
            ack_grouping_time_ms=ack_grouping_time_ms,
            ack_grouping_max_size=ack_grouping_max_size,
            mark_delete_rate_limit=mark_delete_rate_limit,
        )
        consumer = Consumer(sync, self)
        self._keep(consumer)
        return consumer

    async def create_reader(
        self,
        topic: str,
        start_message_id: MessageId,
        schema: Any = None,
        receiver_queue_size: int = 1000,
        reader_name: str | None = None,
        subscription_role_prefix: str | None = None,
        is_read_compacted: bool = False,
        crypto_key_reader: Any = None,
        start_message_id_inclusive: bool = False,
        crypto_failure_action: ConsumerCryptoFailureAction = ConsumerCryptoFailureAction.FAIL,
    ) -> Reader:
        """Create a reader of ``topic`` from ``start_message_id`` (``MessageId.earliest``,
        ``MessageId.latest`` or an id; exclusive unless ``start_message_id_inclusive``).

        Raises
        ------
        ValueError
            If ``start_message_id`` is not a MessageId, or another argument is wrong.
        PulsarException
            ``TopicNotFound`` (missing topic, no auto-creation) ...
        """
        if not isinstance(start_message_id, MessageId):
            raise ValueError(
                "Argument start_message_id is expected to be of type 'MessageId' and not "
                f"'{type(start_message_id).__name__}'"
            )
        sync = await self._run(
            self._client.create_reader,
            topic,
            start_message_id,
            schema=schema,
            receiver_queue_size=receiver_queue_size,
            reader_name=reader_name,
            subscription_role_prefix=subscription_role_prefix,
            is_read_compacted=is_read_compacted,
            crypto_key_reader=crypto_key_reader,
            start_message_id_inclusive=start_message_id_inclusive,
            crypto_failure_action=crypto_failure_action,
        )
        reader = Reader(sync, self)
        self._keep(reader)
        return reader

    async def get_topic_partitions(self, topic: str) -> list[str]:
        """Partition names of a partitioned topic, or ``[topic]`` for a non-partitioned one
        (a missing topic is auto-created per the namespace policies)."""
        if not isinstance(topic, str):
            raise ValueError(
                f"Argument topic is expected to be of type 'str' and not '{type(topic).__name__}'"
            )
        return await self._run(self._client.get_topic_partitions, topic)

    def shutdown(self) -> None:
        """Close every producer, consumer and reader now, without raising (blocks the
        calling thread while producers flush)."""
        self._wake_all()
        with self._lock:
            self._closed = True
        self._client.shutdown()
        self._pool.shutdown(wait=False)

    async def close(self) -> None:
        """Close every producer (flushing it), consumer and reader of this client.

        Raises
        ------
        PulsarException
            If closing one of them failed (the others are closed nevertheless).

        Closing a closed (or shut down) client does nothing.
        """
        with self._lock:
            if self._closed:
                return
        self._wake_all()
        try:
            await self._run(self._client.close)
        finally:
            with self._lock:
                self._closed = True
            self._pool.shutdown(wait=False)
