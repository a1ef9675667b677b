"""The storage-level producer: batching, compression, chunking, routing, access modes.

Shaped like pulsar-client's ``Producer`` (the client in ``connector.client`` re-exports it).
``send_async`` only appends to an in-memory batch (or, with batching off, queues a sealed
entry); the process's one producer I/O thread (:mod:`.io_thread`, serving every producer,
as pulsar-client's ``io_threads=1``) seals batches when they reach
``batching_max_publish_delay_ms``, writes every queued entry of a partition with one group
commit and then runs the callbacks (from that thread, as pulsar-client does). A successful
callback or a returned ``send`` means the message is durable and visible; any failure in the
I/O path calls every pending callback with an error result.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from filepulsar.dispatch.clock import waits_of, wall_ms
from filepulsar.dispatch.modes import (
    BatchingType,
    HashingScheme,
    PartitionsRoutingMode,
    ProducerAccessMode,
)
from filepulsar.storage import batcher
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.codec import Codec
from filepulsar.storage.errors import (
    FilePulsarError,
    InvalidConfiguration,
    NotAllowedError,
)
from filepulsar.storage.messageid import MessageId
from filepulsar.storage.names import TopicName
from filepulsar.storage.policies import Policies, check_max_delay, effective_policies
from filepulsar.storage.producer import bulk
from filepulsar.storage.producer.leases import PartitionLeases
from filepulsar.storage.producer.messages import (
    CHUNK_UUID_SUFFIX,
    MAX_PRODUCER_NAME_BYTES,
    MessageRecord,
    Result,
    check_send_args,
    metadata_size,
)
from filepulsar.storage.producer.routing import Routing
from filepulsar.storage.producer.send_queue import Callback, QueueConfig, SendQueue, message_row
from filepulsar.storage.topics import ensure_topic
from filepulsar.storage.writer import new_session_id

log = logging.getLogger(__name__)


class Producer:
    """Publishes messages to a topic (partitioned or not) stored under ``store``.

    Parameters follow pulsar-client's ``Client.create_producer``. Raises at construction:
    ``TopicNotFound`` (no topic, auto-creation off), ``ProducerBusy`` (name in use, or an
    exclusive producer asked for a topic with shared producers), ``ProducerFenced`` (a shared
    producer on a topic held exclusively), ``InvalidConfiguration`` for bad arguments.
    The closed sets (``access_mode``, ``batching_type``, ``compression_type``,
    ``message_routing_mode``, ``hashing_scheme``) take a :mod:`filepulsar.dispatch.modes` member or
    either spelling of one (``"RoundRobinPartition"`` or ``"RoundRobinDistribution"``).
    """

    def __init__(
        self,
        store: BlobStore,
        topic: str,
        *,
        producer_name: str | None = None,
        access_mode: ProducerAccessMode | str = "Shared",
        batching_enabled: bool = True,
        batching_max_messages: int = 1000,
        batching_max_allowed_size_in_bytes: int = 128 * 1024,
        batching_max_publish_delay_ms: int = 10,
        batching_type: BatchingType | str = "Default",
        compression_type: Any = Codec.NONE,
        chunking_enabled: bool = False,
        message_routing_mode: PartitionsRoutingMode | str = "RoundRobinPartition",
        hashing_scheme: HashingScheme | str = "JavaStringHash",
        message_router: Callable[[Any, int], int] | None = None,
        initial_sequence_id: int | None = None,
        max_pending_bytes: int = 64 * 1024 * 1024,
        block_if_queue_full: bool = True,
        auto_create: bool = True,
        properties: dict[str, str] | None = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self.topic = TopicName.parse(topic)
        self.store = store
        self._clock = clock or wall_ms
        # The closed sets, parsed once (dispatch.modes); the attributes keep the members.
        access = ProducerAccessMode.parse(access_mode, "access_mode")
        routing = PartitionsRoutingMode.parse(message_routing_mode, "message_routing_mode")
        hashing = HashingScheme.parse(hashing_scheme, "hashing_scheme")
        btype = BatchingType.parse(batching_type, "batching_type")
        self.access_mode = access
        self.hashing_scheme = hashing
        self.batching_type = btype
        self.codec = Codec.parse(compression_type)
        for name, v in (
            ("batching_max_messages", batching_max_messages),
            ("batching_max_allowed_size_in_bytes", batching_max_allowed_size_in_bytes),
            ("max_pending_bytes", max_pending_bytes),
        ):
            if not isinstance(v, int) or v <= 0:
                raise InvalidConfiguration(f"{name} must be a positive integer, got {v!r}")
        if not isinstance(batching_max_publish_delay_ms, int | float) or (
            batching_max_publish_delay_ms < 0
        ):
            raise InvalidConfiguration(
                f"batching_max_publish_delay_ms must be >= 0, got {batching_max_publish_delay_ms!r}"
            )
        if chunking_enabled and batching_enabled:
            raise InvalidConfiguration(
                "chunking_enabled requires batching_enabled=False (Pulsar does not batch chunks)"
            )
        if chunking_enabled and not self.topic.persistent:
            raise InvalidConfiguration("chunking is only supported on persistent topics")
        if routing is PartitionsRoutingMode.CustomPartition and message_router is None:
            raise InvalidConfiguration("message_routing_mode CustomPartition needs message_router")
        self.batching = batching_enabled
        self.max_messages = batching_max_messages
        self.max_bytes = batching_max_allowed_size_in_bytes
        self.publish_delay_ms = batching_max_publish_delay_ms
        self.chunking = chunking_enabled
        self.max_pending_bytes = max_pending_bytes
        self.block_if_queue_full = block_if_queue_full
        self.session = new_session_id()
        self.producer_name = producer_name or f"fp-{self.session[:12]}"
        if not isinstance(self.producer_name, str) or not self.producer_name:
            raise InvalidConfiguration("producer_name must be a non-empty string")
        name_bytes = len(self.producer_name.encode())
        if name_bytes > MAX_PRODUCER_NAME_BYTES - CHUNK_UUID_SUFFIX:
            raise InvalidConfiguration(
                f"producer_name of {name_bytes} bytes is too long: at most "
                f"{MAX_PRODUCER_NAME_BYTES - CHUNK_UUID_SUFFIX} bytes (UTF-8)"
            )
        self.properties = dict(properties or {})

        self.num_partitions = ensure_topic(store, self.topic, auto_create=auto_create)
        self.policies: Policies = effective_policies(store, self.topic)
        self.dedup = self.policies.deduplication_enabled and self.topic.persistent
        self.max_message_size = self.policies.max_message_size
        n = self.num_partitions
        self._routing = Routing(
            n,
            mode=routing,
            hashing_scheme=hashing,
            message_router=message_router,
            batching=batching_enabled,
            clock=self._clock,
        )
        # send_async's fast path in one comparison: the largest value it takes (-1 when the
        # producer's policy sends every message the general way).
        self._fast_max_size = (
            self.max_message_size
            if batching_enabled and btype is BatchingType.Default and message_router is None
            else -1
        )
        self._policy = batcher.BatchPolicy(
            max_message_size=self.max_message_size,
            codec=self.codec,
            batching=batching_enabled,
            max_messages=batching_max_messages,
            max_bytes=batching_max_allowed_size_in_bytes,
            batching_type=btype,
            chunking=chunking_enabled,
        )

        #: The producer's lease on each partition (registration, fencing, its removal).
        self._leases = PartitionLeases(
            store=store,
            producer_name=self.producer_name,
            session=self.session,
            access_mode=self.access_mode,
            policies=self.policies,
            dedup=self.dedup,
            persistent=self.topic.persistent,
            clock=self._clock,
            # WaitForExclusive waits on this (a ManualClock in tests).
            waits=waits_of(clock),
        )
        topics = [self.topic.partition(i) for i in range(n)] if n else [self.topic]
        self._parts = self._leases.register_all(topics, initial_sequence_id)
        parts = self._parts
        self._queue = SendQueue(
            parts,
            QueueConfig(
                topic=self.topic,
                producer_name=self.producer_name,
                codec=self.codec,
                key_based=batching_enabled and btype is BatchingType.KeyBased,
                max_messages=batching_max_messages,
                max_bytes=batching_max_allowed_size_in_bytes,
                publish_delay_ms=batching_max_publish_delay_ms,
                max_pending_bytes=max_pending_bytes,
                block_if_queue_full=block_if_queue_full,
                dedup=self.dedup,
                renew_s=self.policies.producer_lease_ms / 3000,
                max_message_size=self.max_message_size,
            ),
            clock=self._clock,
            renew=lambda part: part.writer.renew_lease(),
        )
        self._closed = False

    @property
    def schema_version(self) -> bytes:
        """The schema version stamped on every entry (8 bytes big-endian; empty: no schema).
        The client sets it once it has registered the producer's schema, before any send."""
        return self._queue.schema_version

    @schema_version.setter
    def schema_version(self, version: bytes) -> None:
        self._queue.schema_version = version

    @property
    def error(self) -> BaseException | None:
        """The error that failed a write (every later send raises it), or None."""
        return self._queue.error

    # ------------------------------------------------------------------ sending
    @property
    def last_sequence_id(self) -> int:
        """The highest sequence id stored by this producer, explicit ``sequence_id=`` included
        (-1 if none; after a restart with deduplication, the highest one persisted)."""
        return self._queue.last_published

    def send_async(
        self,
        content: bytes | None,
        callback: Callback | None = None,
        properties: dict[str, str] | None = None,
        partition_key: str | None = None,
        ordering_key: bytes | str | None = None,
        sequence_id: int | None = None,
        replication_clusters: Any = None,
        disable_replication: bool = False,
        event_timestamp: int | None = None,
        deliver_at: int | None = None,
        deliver_after: Any = None,
    ) -> None:
        """Queue a message; ``callback(result, message_id)`` runs once it is stored.

        ``deliver_at`` is epoch ms; ``deliver_after`` is a ``timedelta`` or ms. A message with
        a delivery time is never batched. ``content`` None sends a null value (Pulsar's
        null-value message: a tombstone for compaction and table views; ``b""`` is an empty
        value, not a null one). Raises ``ProducerClosed``, ``MessageTooBig``,
        ``ProducerQueueIsFull``, ``TypeError`` (content not bytes) or ``InvalidConfiguration``
        (a ``ValueError``: a wrongly typed argument, as pulsar-client) at once.

        A delivery time further than the topic's ``delayed_delivery_max_delay_ms`` ahead is
        not queued: ``callback(Result.NotAllowedError, None)`` runs at once in the calling
        thread (pulsar-client's callback gets the broker's ``NotAllowedError``; ``send``
        raises ``NotAllowedError``).
        """
        if type(content) is not bytes and content is not None:
            content = _coerce(content)
        if (
            content is not None
            and properties is None
            and partition_key is None
            and ordering_key is None
            and sequence_id is None
            and event_timestamp is None
            and deliver_at is None
            and deliver_after is None
            and replication_clusters is None
            and disable_replication is False
            and len(content) <= self._fast_max_size
        ):
            self._queue.add_plain(self._routing.keyless, content, callback)
            return
        check_send_args(
            properties,
            partition_key,
            sequence_id,
            replication_clusters,
            disable_replication,
            event_timestamp,
            deliver_at,
            deliver_after,
        )
        if deliver_after is not None:
            ms = (
                deliver_after.total_seconds() * 1000
                if hasattr(deliver_after, "total_seconds")
                else deliver_after
            )
            deliver_at = self._clock() + int(ms)
        if deliver_at is not None:
            try:
                self._check_delay(deliver_at)
            except NotAllowedError as e:
                if self._queue.in_send():
                    raise  # send(): raised to its caller
                # send_async: pulsar-client hands the broker's refusal to the callback.
                if callback is None:
                    log.warning("send_async to %s refused: %s", self.topic, e)
                else:
                    callback(Result.NotAllowedError, None)
                return
        record = MessageRecord(
            content=content,
            properties=properties,
            partition_key=partition_key,
            ordering_key=ordering_key.encode() if isinstance(ordering_key, str) else ordering_key,
            event_timestamp=event_timestamp,
            sequence_id=sequence_id,
            deliver_at=deliver_at or 0,
        )
        self._queue.add(
            self._routing.of(record),
            record,
            callback,
            alone=deliver_at is not None or not self.batching,
            chunk_row=self._chunk_row(record),
        )

    def _check_delay(self, deliver_at: int) -> None:
        """:func:`filepulsar.storage.policies.check_max_delay` for this producer's topic, now."""
        check_max_delay(
            self.policies.delayed_delivery_max_delay_ms, deliver_at, self._clock(), str(self.topic)
        )

    def _chunk_row(self, record: MessageRecord) -> pa.RecordBatch | None:
        """None if ``record`` fits one entry; else its stored row, to be cut into chunks.

        The size rule is the cutter's (:func:`filepulsar.storage.batcher.too_big`, the value
        after compression plus key, ordering key and property bytes); like the cutter it
        looks closer only when the raw value plus those bytes is above the limit.

        Raises
        ------
        MessageTooBig
            If it does not fit and chunking is off.
        """
        content = record.content
        size = 0 if content is None else len(content)
        meta = metadata_size(record.properties, record.partition_key, record.ordering_key)
        if size + meta <= self.max_message_size:
            return None
        row = message_row(record)
        big = batcher.check_size(
            row,
            self._policy,
            where=f"send to {self.topic}",
            hint="; enable chunking (chunking_enabled=True, batching off) or send smaller messages",
            single=True,
        )
        return None if big is None else row

    # ------------------------------------------------------------------ sync API
    def flush(self) -> None:
        """Seal open batches and wait until everything sent so far is stored.

        Raises the error that failed a pending write, if any.
        """
        self._queue.flush()

    def send(
        self,
        content: bytes | None,
        properties: dict[str, str] | None = None,
        partition_key: str | None = None,
        ordering_key: bytes | str | None = None,
        sequence_id: int | None = None,
        replication_clusters: Any = None,
        disable_replication: bool = False,
        event_timestamp: int | None = None,
        deliver_at: int | None = None,
        deliver_after: Any = None,
    ) -> MessageId:
        """Send one message and wait until it is stored; returns its id (``-1:-1:-1`` for a
        duplicate dropped by deduplication).

        When nothing else is queued or being written, the message is written and committed in
        the calling thread (no hand-off to the I/O thread and back); otherwise the I/O thread
        writes it with what is queued before it. Either way entries reach the partition in
        sequence-id order (queues are drained only under ``_write_lock``)."""
        box: list[tuple[Result, MessageId | None]] = []

        def done(res: Result, mid: MessageId | None) -> None:
            box.append((res, mid))

        with self._queue.inline():
            self.send_async(
                content,
                done,
                properties,
                partition_key,
                ordering_key,
                sequence_id,
                replication_clusters,
                disable_replication,
                event_timestamp,
                deliver_at,
                deliver_after,
            )
            self._queue.wait_inline(done)
        if not box or box[0][1] is None:
            raise self._queue.error or FilePulsarError(f"send to {self.topic} failed")
        return box[0][1]

    def send_table(self, data: pa.Table | pa.RecordBatch | Sequence[Any]) -> pa.Table:
        """Publish many messages at once and wait until they are stored.

        ``data``: a table with ``value`` and any of ``key``, ``ordering_key``, ``properties``,
        ``event_time``, ``sequence_id``, ``deliver_at``
        (:func:`filepulsar.storage.bulk_columns.normalize`), or a list of bytes. Rows are routed
        (``dispatch.routing``: keyed rows by hash, keyless rows round robin one partition per
        batch, or per row with batching off) and cut into entries by
        :func:`filepulsar.storage.batcher.cut` under the producer's batch policy, the cutter
        the Spark sink uses too: batches by the batching limits (per ordering key, else key,
        with ``KeyBased`` batching), delayed rows alone, chunks for messages above the max
        message size when chunking is on; all without a per-message Python loop. Returns a
        table of ``partition``, ``ledger_id``, ``entry_id``, ``batch_index`` aligned with the
        input rows (``-1`` ids for dropped duplicates; a chunked message has its last chunk's
        id).

        Raises
        ------
        InvalidConfiguration
            For a missing or mistyped column, or a custom router's bad answer (nothing is
            written).
        MessageTooBig
            If a message is above the max message size (its value after compression plus its
            key, ordering key and properties, :func:`filepulsar.storage.batcher.too_big`) and
            chunking is off (nothing is written).
        NotAllowedError
            If a ``deliver_at`` is further past now than the topic's
            ``delayed_delivery_max_delay_ms`` (nothing is written).
        """
        return bulk.send_table(
            data,
            queue=self._queue,
            partitions=self._parts,
            routing=self._routing,
            policy=self._policy,
            clock=self._clock,
            check_delay=self._check_delay,
        )

    def close(self) -> None:
        """Flush, leave the process's I/O thread and release this producer's registration.

        In a callback of this producer's own write (on the I/O thread) it returns at once:
        what was sent before is written once the write in hand ends, and the registration is
        released after that (a ``flush()`` there would wait for itself).
        """
        if self._closed:
            return
        try:
            if self._queue.error is None and not self._queue.writing_here():
                self.flush()
        finally:
            self._closed = True
            # Left over only if a write failed (no flush then): their senders hear of it.
            self._queue.close(after=lambda: self._leases.unregister_all(self._parts))

    def is_connected(self) -> bool:
        return not self._closed and self._queue.connected

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _coerce(content: Any) -> bytes:
    if isinstance(content, bytearray | memoryview):
        return bytes(content)
    raise TypeError(
        f"message content must be bytes, got {type(content).__name__} (encode str first)"
    )
