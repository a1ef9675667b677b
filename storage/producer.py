"""The storage-level producer: batching, compression, chunking, routing, access modes.

Shaped like pulsar-client's ``Producer`` (the client in ``connector.client`` re-exports it).
``send_async`` only appends to an in-memory batch (or, with batching off, queues a sealed
entry); a background I/O thread is woken at once, seals batches when they reach
``batching_max_publish_delay_ms``, writes every queued entry of a partition with one group
commit and then runs the callbacks (from that thread, as pulsar-client does). A successful
callback or a returned ``send`` means the message is durable and visible; any failure in the
I/O path calls every pending callback with an error result.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from filepulsar.dispatch.clock import SYSTEM, waits_of, wall_ms
from filepulsar.dispatch.modes import (
    BatchingType,
    HashingScheme,
    PartitionsRoutingMode,
    ProducerAccessMode,
)
from filepulsar.dispatch.routing import (
    MessageRouter,
    RoundRobinPartitionRouter,
    SinglePartitionRouter,
    partition_for_key,
)
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.codec import Codec, compress
from filepulsar.storage.errors import (
    FilePulsarError,
    InvalidConfiguration,
    MessageTooBig,
    NotAllowedError,
    ProducerClosed,
    ProducerQueueIsFull,
)
from filepulsar.storage.ledger import Position
from filepulsar.storage.messageid import MessageId
from filepulsar.storage.names import TopicName
from filepulsar.storage.policies import Policies, check_max_delay, effective_policies
from filepulsar.storage.producer_bulk import _BulkMixin
from filepulsar.storage.producer_leases import ProducerRegistration, _Partition
from filepulsar.storage.producer_messages import (
    _CHUNK_UUID_SUFFIX,
    MAX_PRODUCER_NAME_BYTES,
    _check_send_args,
    metadata_size,
)

# Re-exported: the public API (storage/__init__, connector/client*) imports these from here.
from filepulsar.storage.producer_messages import OutgoingMessage as OutgoingMessage
from filepulsar.storage.producer_messages import Result as Result
from filepulsar.storage.send_queue import _Batch, _SendQueueMixin
from filepulsar.storage.topics import ensure_topic
from filepulsar.storage.writer import new_session_id

log = logging.getLogger(__name__)

_wall_ms = wall_ms


class Producer(_SendQueueMixin, _BulkMixin):
    """Publishes messages to a topic (partitioned or not) stored under ``store``.

    Parameters follow pulsar-client's ``Client.create_producer``. Raises at construction:
    ``TopicNotFound`` (no topic, auto-creation off), ``ProducerBusy`` (name in use, or an
    exclusive producer asked for a topic with shared producers), ``ProducerFenced`` (a shared
    producer on a topic held exclusively), ``InvalidConfiguration`` for bad arguments.
    The closed sets (``access_mode``, ``batching_type``, ``compression_type``,
    ``message_routing_mode``, ``hashing_scheme``) take a :mod:`dispatch.modes` member or
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
        self._clock = clock or _wall_ms
        # WaitForExclusive waits on this (a ManualClock in tests). The I/O thread's publish
        # delay and lease renewal keep the system's monotonic clock: they time a real thread.
        self._waits = waits_of(clock)
        # The closed sets, parsed once (dispatch.modes); kept as their wire names.
        self.access_mode = ProducerAccessMode.parse(access_mode, "access_mode").wire
        routing = PartitionsRoutingMode.parse(message_routing_mode, "message_routing_mode").wire
        self.hashing_scheme = HashingScheme.parse(hashing_scheme, "hashing_scheme").wire
        self.batching_type = BatchingType.parse(batching_type, "batching_type").wire
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
        if routing == "CustomPartition" and message_router is None:
            raise InvalidConfiguration("message_routing_mode CustomPartition needs message_router")
        if message_router is not None:
            routing = "CustomPartition"  # as in pulsar-client: a router decides every message
        self.batching = batching_enabled
        self.max_messages = batching_max_messages
        self.max_bytes = batching_max_allowed_size_in_bytes
        self.publish_delay_ms = batching_max_publish_delay_ms
        self.chunking = chunking_enabled
        self.max_pending_bytes = max_pending_bytes
        self.block_if_queue_full = block_if_queue_full
        self.session = new_session_id()
        self.producer_name = producer_name or f"fp-{self.session[:12]}"
        #: The schema version stamped on every entry (8 bytes big-endian; empty: no schema).
        #: The client sets it once it has registered the producer's schema, before any send.
        self.schema_version = b""
        if not isinstance(self.producer_name, str) or not self.producer_name:
            raise InvalidConfiguration("producer_name must be a non-empty string")
        name_bytes = len(self.producer_name.encode())
        if name_bytes > MAX_PRODUCER_NAME_BYTES - _CHUNK_UUID_SUFFIX:
            raise InvalidConfiguration(
                f"producer_name of {name_bytes} bytes is too long: at most "
                f"{MAX_PRODUCER_NAME_BYTES - _CHUNK_UUID_SUFFIX} bytes (UTF-8)"
            )
        self.properties = dict(properties or {})

        self.num_partitions = ensure_topic(store, self.topic, auto_create=auto_create)
        self.policies: Policies = effective_policies(store, self.topic)
        self.dedup = self.policies.deduplication_enabled and self.topic.persistent
        self.max_message_size = self.policies.max_message_size
        n = self.num_partitions
        self._router: MessageRouter | None = None  # keyless routing of send_table
        self._route_keyless: Callable[[], int]
        if routing == "SinglePartition":
            single = SinglePartitionRouter(max(n, 1))
            self._route_keyless = lambda: single.choose_partition(None)
            self._router = single
        else:
            rr = RoundRobinPartitionRouter(
                max(n, 1),
                start=int(np.random.randint(0, max(n, 1))),
                batching_enabled=batching_enabled,
                hashing_scheme=self.hashing_scheme,
                clock=self._clock,
            )
            self._route_keyless = lambda: rr.choose_partition(None)
            self._router = rr
        # A message_router decides every message when given (pulsar-client calls it
        # whatever the routing mode); CustomPartition requires one.
        self._custom = message_router
        # send_async's fast path in one comparison: the largest value it takes (-1 when the
        # producer's policy sends every message the general way).
        self._fast_max_size = (
            self.max_message_size
            if batching_enabled and self.batching_type == "Default" and message_router is None
            else -1
        )

        topics = [self.topic.partition(i) for i in range(n)] if n else [self.topic]
        #: The producer's lease on each partition (registration, fencing, its removal).
        self._registration = ProducerRegistration(
            store=store,
            producer_name=self.producer_name,
            session=self.session,
            access_mode=self.access_mode,
            policies=self.policies,
            dedup=self.dedup,
            persistent=self.topic.persistent,
            clock=self._clock,
            waits=self._waits,
        )
        self._parts: list[_Partition] = []
        try:
            for t in topics:
                self._parts.append(self._registration.register(t, initial_sequence_id))
        except BaseException:
            self._unregister_all()
            raise

        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        # Held by whoever writes to the ledgers (the I/O thread or send_table); taken before
        # ``_lock`` when both are needed. Queues are drained only while holding it, so entries
        # reach a partition in the order their sequence ids were given.
        self._write_lock = threading.Lock()
        self._pending_bytes = 0
        self._tickets_issued = 0
        self._done_upto = 0  # every ticket <= this is finished
        self._done_set: set[int] = set()
        self._positions: dict[int, Position | None] = {}
        self._error: BaseException | None = None
        self._closed = False
        self._last_renew = SYSTEM.monotonic()
        # True while the I/O thread sleeps with no open batch to time (until its lease renewal
        # only): a batch opened then must wake it. Otherwise it is already timing an older
        # batch (due first) or busy, and looks at every open batch before it sleeps again, so
        # opening a batch wakes nobody (a wake-up per batch cost send_async a quarter of its
        # rate on two cores).
        self._io_untimed = False
        # Set (per thread) while send() seals its own message: the I/O thread is not woken
        # for it, as send() writes it itself when nothing else is queued (_send_wait).
        self._inline = threading.local()
        self._io = threading.Thread(
            target=self._io_loop, name=f"filepulsar-producer-{self.producer_name}", daemon=True
        )
        self._io.start()

    # ------------------------------------------------------------------ sending
    @property
    def last_sequence_id(self) -> int:
        """The highest sequence id stored by this producer, explicit ``sequence_id=`` included
        (-1 if none; after a restart with deduplication, the highest one persisted)."""
        return max(p.last_published for p in self._parts)

    def send_async(
        self,
        content: bytes | None,
        callback: Callable[[Result, MessageId | None], None] | None = None,
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
        if type(content) is not bytes:
            if content is None:  # a null value (a tombstone for compaction and table views)
                self._send_slow(
                    None,
                    callback,
                    properties,
                    partition_key,
                    ordering_key,
                    sequence_id,
                    event_timestamp,
                    deliver_at,
                    deliver_after,
                    replication_clusters,
                    disable_replication,
                )
                return
            content = self._coerce(content)
        size = len(content)
        if (
            properties is None
            and partition_key is None
            and ordering_key is None
            and sequence_id is None
            and event_timestamp is None
            and deliver_at is None
            and deliver_after is None
            and replication_clusters is None
            and disable_replication is False
            and size <= self._fast_max_size
        ):
            with self._lock:
                if self._closed or self._error is not None:
                    self._raise_state()
                if self._pending_bytes > self.max_pending_bytes:
                    self._wait_room()
                part = self._parts[self._route_keyless() if self.num_partitions else 0]
                b = part.batch
                if b is None:
                    b = part.batch = _Batch(self._clock(), part.next_seq)
                    self._batch_opened()
                elif b.seqs is not None:
                    b.seqs.append(part.next_seq)
                b.values.append(content)
                if callback is not None:
                    if b.callbacks is None:
                        b.callbacks = [None] * (len(b.values) - 1)
                    b.callbacks.append(callback)
                elif b.callbacks is not None:
                    b.callbacks.append(None)
                part.next_seq += 1
                b.nbytes += size
                self._pending_bytes += size
                if len(b.values) >= self.max_messages or b.nbytes >= self.max_bytes:
                    self._seal(part, b, None)
            return
        self._send_slow(
            content,
            callback,
            properties,
            partition_key,
            ordering_key,
            sequence_id,
            event_timestamp,
            deliver_at,
            deliver_after,
            replication_clusters,
            disable_replication,
        )

    def _check_delay(self, deliver_at: int) -> None:
        """:func:`storage.policies.check_max_delay` for this producer's topic, now."""
        check_max_delay(
            self.policies.delayed_delivery_max_delay_ms, deliver_at, self._clock(), str(self.topic)
        )

    def _coerce(self, content: Any) -> bytes:
        if isinstance(content, bytearray | memoryview):
            return bytes(content)
        raise TypeError(
            f"message content must be bytes, got {type(content).__name__} (encode str first)"
        )

    def _send_slow(
        self,
        content: bytes | None,
        callback: Any,
        properties: dict[str, str] | None,
        partition_key: str | None,
        ordering_key: bytes | str | None,
        sequence_id: int | None,
        event_timestamp: int | None,
        deliver_at: int | None,
        deliver_after: Any,
        replication_clusters: Any = None,
        disable_replication: bool = False,
    ) -> None:
        _check_send_args(
            properties,
            partition_key,
            sequence_id,
            replication_clusters,
            disable_replication,
            event_timestamp,
            deliver_at,
            deliver_after,
        )
        if isinstance(ordering_key, str):
            ordering_key = ordering_key.encode()
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
                if getattr(self._inline, "on", False):
                    raise  # send(): raised to its caller
                # send_async: pulsar-client hands the broker's refusal to the callback.
                if callback is None:
                    log.warning("send_async to %s refused: %s", self.topic, e)
                else:
                    callback(Result.NotAllowedError, None)
                return
        size = 0 if content is None else len(content)
        meta = metadata_size(properties, partition_key, ordering_key)
        limit = self.max_message_size
        too_big = size + meta > limit
        if too_big and not self.chunking and self.codec is not Codec.NONE and content is not None:
            too_big = len(compress(self.codec, content)) + meta > limit
        if too_big and (not self.chunking or meta >= limit):
            what = f"message of {size} bytes with {meta} bytes of properties and keys"
            if meta >= limit:
                raise MessageTooBig(
                    f"{what} exceeds the max message size {limit} of {self.topic}: its "
                    "properties and keys alone do not fit (chunking splits only the payload)"
                )
            raise MessageTooBig(
                f"{what} exceeds the max message size {limit} of {self.topic}; enable chunking "
                "(chunking_enabled=True, batching off) or send smaller messages"
            )
        extras = (properties, partition_key, ordering_key, event_timestamp)
        with self._lock:
            if self._closed or self._error is not None:
                self._raise_state()
            if self._pending_bytes > self.max_pending_bytes:
                self._wait_room()
            if self.num_partitions == 0:
                part = self._parts[0]
            elif self._custom is not None:
                part = self._parts[
                    self._route_custom(
                        OutgoingMessage(
                            content, properties, partition_key, ordering_key, event_timestamp
                        )
                    )
                ]
            elif partition_key is not None:
                part = self._parts[self._route_key(partition_key)]
            else:
                part = self._parts[self._route_keyless()]
            self._pending_bytes += size
            if (too_big or deliver_at is not None or not self.batching) and part.batch:
                # Pulsar flushes the open batch first, so entries stay in sequence-id order.
                self._seal(part, part.batch, None)
            seq = sequence_id
            if seq is None:
                seq = part.next_seq
                part.next_seq += 1
            if too_big:
                assert content is not None  # a null value has no bytes: never too big
                self._queue_chunks(part, content, extras, seq, callback, limit - meta)
                return
            if deliver_at is not None or not self.batching:
                single = _Batch(self._clock(), seq)
                self._append(single, content, callback, extras, 0)
                self._seal(part, single, None, batched=False, deliver_at=deliver_at or 0)
                return
            bkey: Any = None
            b: _Batch | None
            if self.batching_type == "KeyBased":
                bkey = ordering_key if ordering_key is not None else partition_key
                b = part.key_batches.get(bkey)
                if b is None:
                    b = part.key_batches[bkey] = _Batch(self._clock(), seq)
                    self._batch_opened()
            else:
                b = part.batch
                if b is None:
                    b = part.batch = _Batch(self._clock(), seq)
                    self._batch_opened()
            b.add_seq(seq)
            self._append(b, content, callback, extras, len(b.values))
            b.nbytes += size
            if bkey is not None or self.batching_type == "KeyBased":
                part.key_count += 1
                part.key_bytes += size
                if part.key_count >= self.max_messages or part.key_bytes >= self.max_bytes:
                    self._seal_keys(part)
            elif len(b.values) >= self.max_messages or b.nbytes >= self.max_bytes:
                self._seal(part, b, bkey)

    def _route_key(self, key: str) -> int:
        return partition_for_key(key, self.num_partitions, self.hashing_scheme)

    def _route_custom(self, msg: OutgoingMessage) -> int:
        assert self._custom is not None
        p = self._custom(msg, self.num_partitions)
        if isinstance(p, bool) or not isinstance(p, int | np.integer):
            raise InvalidConfiguration(
                f"message_router returned {p!r}; expected an int in 0..{self.num_partitions - 1}"
            )
        if not 0 <= p < self.num_partitions:
            raise InvalidConfiguration(
                f"message_router returned {p}; expected 0..{self.num_partitions - 1}"
            )
        return int(p)

    @staticmethod
    def _append(b: _Batch, content: bytes | None, callback: Any, extras: tuple, i: int) -> None:
        b.values.append(content)
        if callback is not None and b.callbacks is None:
            b.callbacks = [None] * i
        if b.callbacks is not None:
            b.callbacks.append(callback)
        if any(x is not None for x in extras):  # a plain message's entry stores only values
            if b.extras is None:
                b.extras = []
            b.extras.append((i, *extras))

    def _raise_state(self) -> None:
        if self._error is not None:
            raise self._error
        raise ProducerClosed(f"producer {self.producer_name!r} on {self.topic} is closed")

    def _wait_room(self) -> None:
        if not self.block_if_queue_full:
            raise ProducerQueueIsFull(
                f"producer {self.producer_name!r} has {self._pending_bytes} bytes pending "
                f"(limit {self.max_pending_bytes})"
            )
        self._cond.notify_all()
        while self._pending_bytes > self.max_pending_bytes and self._error is None:
            self._cond.wait(0.5)

    # ------------------------------------------------------------------ sync API
    def flush(self) -> None:
        """Seal open batches and wait until everything sent so far is stored.

        Raises the error that failed a pending write, if any.
        """
        with self._lock:
            self._seal_all()
            target = self._tickets_issued
            while self._done_upto < target and self._error is None:
                self._cond.wait(1.0)
            if self._error is not None:
                raise self._error

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
        box: list[Any] = []

        def done(res: Result, mid: MessageId | None) -> None:
            box.append((res, mid))

        inline = self._inline
        inline.on = True
        try:
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
            self._send_wait(done)
        except BaseException:
            # An error after some of this call's entries were sealed (a chunk that did not
            # encode, an interrupt): hand them to the I/O thread, as flush() would write them.
            self._release_claims()
            raise
        finally:
            inline.on = False
        if not box or box[0][1] is None:
            raise self._error or FilePulsarError(f"send to {self.topic} failed")
        return box[0][1]

    def _send_wait(self, done: Callable[[Result, MessageId | None], None]) -> None:
        """``flush()`` for :meth:`send`: seal, then write the sealed entry in this thread if
        it is the only one outstanding and only ``done`` waits on it (no other sender's
        callback runs here); else wake the I/O thread and wait for it."""
        work: tuple[_Partition, list[Any]] | None = None
        with self._lock:
            self._seal_all()
            target = self._tickets_issued
            if (
                self._done_upto + 1 == target
                and self._error is None
                and self._write_lock.acquire(blocking=False)
            ):
                queued = [p for p in self._parts if p.queue]
                if len(queued) == 1 and len(queued[0].queue) == 1:
                    q = queued[0].queue[0]
                    if q.ticket == target and all(
                        cb is None or cb is done for cb in q.callbacks or ()
                    ):
                        work = (queued[0], queued[0].queue)
                        queued[0].queue = []
                if work is None:
                    self._write_lock.release()
            if work is None:  # the I/O thread writes it: release the claims and wake it
                self._release_claims_locked()
        if work is not None:
            # The inline flag is still set: an error path must not wake the I/O thread for
            # nothing; _write answers the callback and marks the ticket done.
            try:
                self._write(*work)
            finally:
                self._write_lock.release()
        with self._lock:
            while self._done_upto < target and self._error is None:
                self._cond.wait(1.0)
            if self._error is not None:
                raise self._error

    def _release_claims(self) -> None:
        with self._lock:
            self._release_claims_locked()

    def _release_claims_locked(self) -> None:
        for p in self._parts:
            for q in p.queue:
                q.claimed = False
        self._cond.notify_all()

    def close(self) -> None:
        """Flush, stop the I/O thread and release this producer's registration."""
        if self._closed:
            return
        try:
            if self._error is None:
                self.flush()
        finally:
            with self._lock:
                self._closed = True
                self._cond.notify_all()
            self._io.join()
            # Left over only if a write failed (no flush then): their senders hear of it.
            self._fail_pending(
                ProducerClosed(f"producer {self.producer_name!r} on {self.topic} was closed")
            )
            self._unregister_all()

    def _unregister_all(self) -> None:
        for part in self._parts:
            self._registration.unregister(part)

    def is_connected(self) -> bool:
        return not self._closed and self._error is None

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
