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

import datetime
import enum
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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
    route_rows,
)
from filepulsar.storage import batcher, bulk_columns
from filepulsar.storage.blobstore import BlobStore
from filepulsar.storage.codec import Codec, compress
from filepulsar.storage.entry import MESSAGE_SCHEMA, ChunkInfo, encode_entry_parts, numpy_to_arrow
from filepulsar.storage.errors import (
    FilePulsarError,
    InvalidConfiguration,
    MessageTooBig,
    ProducerBusy,
    ProducerClosed,
    ProducerFenced,
    ProducerQueueIsFull,
)
from filepulsar.storage.ledger import (
    LedgerWriter,
    ManagedLedger,
    PendingEntry,
    Position,
    new_session_id,
)
from filepulsar.storage.manifest import Abort, ManifestState, ProducerLease
from filepulsar.storage.messageid import DUPLICATE_MESSAGE_ID, MessageId
from filepulsar.storage.names import TopicName
from filepulsar.storage.policies import Policies, effective_policies
from filepulsar.storage.topics import ensure_topic

log = logging.getLogger(__name__)

_WAIT = "wait"
_IDS_SCHEMA = pa.schema(
    [
        pa.field("partition", pa.int32()),
        pa.field("ledger_id", pa.int64()),
        pa.field("entry_id", pa.int64()),
        pa.field("batch_index", pa.int32()),
    ]
)


class Result(enum.Enum):
    """Pulsar's result codes, with pulsar-client's names and values (its ``Result``).

    ``send_async`` callbacks get ``Ok``, ``UnknownError``, ``ProducerFenced``,
    ``AlreadyClosed`` or ``MessageTooBig``; :class:`filepulsar.asyncio.PulsarException`'s
    ``error()`` may be any of them.
    """

    Ok = 0
    UnknownError = 1
    InvalidConfiguration = 2
    Timeout = 3
    LookupError = 4
    ConnectError = 5
    ReadError = 6
    AuthenticationError = 7
    AuthorizationError = 8
    ErrorGettingAuthenticationData = 9
    BrokerMetadataError = 10
    BrokerPersistenceError = 11
    ChecksumError = 12
    ConsumerBusy = 13
    NotConnected = 14
    AlreadyClosed = 15
    InvalidMessage = 16
    ConsumerNotInitialized = 17
    ProducerNotInitialized = 18
    ProducerBusy = 19
    TooManyLookupRequestException = 20
    InvalidTopicName = 21
    InvalidUrl = 22
    ServiceUnitNotReady = 23
    OperationNotSupported = 24
    ProducerBlockedQuotaExceededError = 25
    ProducerBlockedQuotaExceededException = 26
    ProducerQueueIsFull = 27
    MessageTooBig = 28
    TopicNotFound = 29
    SubscriptionNotFound = 30
    ConsumerNotFound = 31
    UnsupportedVersionError = 32
    TopicTerminated = 33
    CryptoError = 34
    IncompatibleSchema = 35
    ConsumerAssignError = 36
    CumulativeAcknowledgementNotAllowedError = 37
    TransactionCoordinatorNotFoundError = 38
    InvalidTxnStatusError = 39
    NotAllowedError = 40
    TransactionConflict = 41
    TransactionNotFound = 42
    ProducerFenced = 43
    MemoryBufferIsFull = 44
    Interrupted = 45


_MAX_BINARY_BYTES = 2**31 - 1


_wall_ms = wall_ms


@dataclass(slots=True)
class _Batch:
    """Messages collected for one entry."""

    created_ms: int
    first_seq: int
    #: ``SYSTEM.monotonic()`` when the batch was opened: the publish delay counts from here
    #: (the injectable clock gives publish times only; it need not advance).
    opened: float = field(default_factory=SYSTEM.monotonic)
    values: list[Any] = field(default_factory=list)
    callbacks: list[Any] | None = None
    extras: list[tuple[int, Any, Any, Any, Any]] | None = None  # i, props, key, ordering key, evt
    nbytes: int = 0
    # None while message i has sequence id first_seq + i; the explicit list once not.
    seqs: list[int] | None = None

    def add_seq(self, seq: int) -> None:
        """Record the sequence id of the message about to be appended."""
        if self.seqs is None:
            if seq == self.first_seq + len(self.values):
                return
            self.seqs = list(range(self.first_seq, self.first_seq + len(self.values)))
        self.seqs.append(seq)


@dataclass(slots=True)
class _Queued:
    """A sealed entry waiting for the I/O thread, with its callbacks."""

    entry: PendingEntry
    batched: bool
    callbacks: list[Any] | None
    ticket: int
    follows_previous: bool = False
    want_position: bool = False
    nbytes: int = 0


class _Partition:
    """Per-partition writer state, owned by the producer."""

    def __init__(self, ml: ManagedLedger, writer: LedgerWriter, next_seq: int):
        self.ml = ml
        self.writer = writer
        self.next_seq = next_seq
        self.batch: _Batch | None = None
        self.key_batches: dict[Any, _Batch] = {}
        # Key-based batching limits apply to all key batches of the partition together.
        self.key_count = 0
        self.key_bytes = 0
        self.queue: list[_Queued] = []
        #: Highest sequence id stored (or dropped as a duplicate) on this partition.
        self.last_published = next_seq - 1


#: Longest producer name: the entry header stores it with a 16-bit length.
MAX_PRODUCER_NAME_BYTES = 0xFFFF
#: Longest sequence id suffix of a chunked message's uuid (``<producer name>-<sequence id>``).
_CHUNK_UUID_SUFFIX = 21


def _binary_array(values: Sequence[Any], typ: pa.DataType | None = None) -> pa.Array:
    """``values`` (bytes, or str for ``pa.string()``; None is null) as an Arrow binary or
    string array, built from its buffers.

    ``pa.array`` on a Python list first imports pandas (pyarrow looks for pandas-like input),
    which made a process's first send take 0.25-1.2 s; building the offsets, data and
    validity buffers directly never does.
    """
    typ = pa.binary() if typ is None else typ
    n = len(values)
    mask = np.fromiter((v is None for v in values), np.bool_, n)
    has_nulls = bool(mask.any())
    if typ == pa.string():
        values = [b"" if v is None else v.encode() for v in values]
    elif has_nulls:
        values = [b"" if v is None else v for v in values]
    lengths = np.fromiter(map(len, values), dtype=np.int64, count=n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] > _MAX_BINARY_BYTES:
        return pa.array(values, typ)  # needs more than 32-bit offsets: let pyarrow chunk
    validity = pa.py_buffer(np.packbits(~mask, bitorder="little")) if has_nulls else None
    return pa.Array.from_buffers(
        typ,
        n,
        [validity, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(values))],
        null_count=int(mask.sum()),
    )


def _int64_array(values: Sequence[int | None]) -> pa.Array:
    """Python ints (None: null) as an Arrow int64 array, from its buffers (see
    :func:`_binary_array`)."""
    mask = np.fromiter((v is None for v in values), np.bool_, len(values))
    data = np.fromiter((0 if v is None else v for v in values), np.int64, len(values))
    return numpy_to_arrow(data, mask if mask.any() else None)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_send_args(
    properties: Any,
    partition_key: Any,
    sequence_id: Any,
    replication_clusters: Any,
    disable_replication: Any,
    event_timestamp: Any,
    deliver_at: Any,
    deliver_after: Any,
) -> None:
    """Refuse wrongly typed ``send`` arguments at once with ``InvalidConfiguration`` (a
    ``ValueError``, as pulsar-client raises), before anything is queued."""
    problem = None
    if properties is not None and (
        not isinstance(properties, dict)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in properties.items())
    ):
        problem = f"properties must be a dict of str to str, got {properties!r}"
    elif partition_key is not None and not isinstance(partition_key, str):
        problem = f"partition_key must be a str, got {partition_key!r}"
    elif sequence_id is not None and (not _is_int(sequence_id) or sequence_id < 0):
        problem = f"sequence_id must be an int >= 0, got {sequence_id!r}"
    elif replication_clusters is not None and not isinstance(replication_clusters, list):
        problem = f"replication_clusters must be a list of str, got {replication_clusters!r}"
    elif not isinstance(disable_replication, bool):
        problem = f"disable_replication must be a bool, got {disable_replication!r}"
    elif event_timestamp is not None and not _is_int(event_timestamp):
        problem = f"event_timestamp must be an int (epoch ms), got {event_timestamp!r}"
    elif deliver_at is not None and not _is_int(deliver_at):
        problem = f"deliver_at must be an int (epoch ms), got {deliver_at!r}"
    elif deliver_after is not None and not (
        isinstance(deliver_after, datetime.timedelta) or _is_int(deliver_after)
    ):
        problem = f"deliver_after must be a timedelta (or int ms), got {deliver_after!r}"
    if problem is not None:
        raise InvalidConfiguration(problem)


def metadata_size(
    properties: dict[str, str] | None,
    partition_key: str | None,
    ordering_key: bytes | None,
) -> int:
    """Bytes a message's metadata adds to its size, as counted against the max message size.

    Pulsar counts the whole serialized message, metadata included, so properties and keys
    count: a message of 1 byte with 20 MiB of properties is too big, as in Pulsar.
    """
    n = 0
    if properties:
        for k, v in properties.items():
            n += len(k.encode()) + len(v.encode())
    if partition_key is not None:
        n += len(partition_key.encode())
    if ordering_key is not None:
        n += len(ordering_key)
    return n


class OutgoingMessage:
    """What a custom ``message_router`` is given: the message about to be sent, with the
    accessors of a received message (``data()``, ``value()``, ``properties()``,
    ``partition_key()``, ``has_key()``, ``ordering_key()``, ``event_timestamp()``)."""

    __slots__ = ("_content", "_evt", "_key", "_okey", "_props")

    def __init__(
        self,
        content: bytes | None,
        properties: dict[str, str] | None,
        partition_key: str | None,
        ordering_key: bytes | str | None,
        event_timestamp: Any,
    ) -> None:
        self._content = content
        self._props = properties
        self._key = partition_key
        self._okey = ordering_key
        self._evt = event_timestamp

    def data(self) -> bytes:
        return b"" if self._content is None else self._content

    def value(self) -> bytes:
        return self.data()

    def properties(self) -> dict[str, str]:
        return dict(self._props or {})

    def partition_key(self) -> str:
        return self._key or ""

    def has_key(self) -> bool:
        return self._key is not None

    def ordering_key(self) -> str:
        ok = self._okey
        return ok.decode(errors="replace") if isinstance(ok, bytes) else (ok or "")

    def event_timestamp(self) -> int:
        e = self._evt
        return int(e.timestamp() * 1000) if hasattr(e, "timestamp") else int(e or 0)


class Producer:
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

        topics = [self.topic.partition(i) for i in range(n)] if n else [self.topic]
        self._parts: list[_Partition] = []
        try:
            for t in topics:
                self._parts.append(self._register(t, initial_sequence_id))
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
        self._io = threading.Thread(
            target=self._io_loop, name=f"filepulsar-producer-{self.producer_name}", daemon=True
        )
        self._io.start()

    # ------------------------------------------------------------------ registration
    def _register(self, topic: TopicName, initial_sequence_id: int | None) -> _Partition:
        ml = ManagedLedger(self.store, topic, clock=self._clock)
        mode = self.access_mode
        lease_ms = self.policies.producer_lease_ms
        name, session = self.producer_name, self.session

        def change(state: ManifestState) -> int:
            now = self._clock()
            for k in [k for k, p in state.producers.items() if p.expires_ms <= now]:
                del state.producers[k]
            mine = state.producers.get(name)
            if mine is not None and mine.session != session:
                raise ProducerBusy(f"producer with name {name!r} is already connected to {topic}")
            others = [p for k, p in state.producers.items() if k != name]
            exclusive = [p.name for p in others if p.access_mode != "Shared"]
            if mode == "Shared":
                if exclusive:
                    raise ProducerFenced(
                        f"topic {topic} has an existing exclusive producer: {exclusive[0]}"
                    )
                epoch = state.topic_epoch
            elif mode == "ExclusiveWithFencing":
                # Pulsar's fencing mode: every other producer loses its registration (its next
                # write fails with ProducerFenced) and this one becomes the exclusive producer.
                for k in [k for k in state.producers if k != name]:
                    del state.producers[k]
                state.topic_epoch += 1
                epoch = state.topic_epoch
            else:
                if others:
                    if mode == "WaitForExclusive":
                        raise Abort(_WAIT)
                    if exclusive:
                        raise ProducerFenced(
                            f"topic {topic} has an existing exclusive producer: {exclusive[0]}"
                        )
                    raise ProducerBusy(f"topic {topic} has existing shared producers")
                state.topic_epoch += 1
                epoch = state.topic_epoch
            state.producers[name] = ProducerLease(name, session, mode, epoch, now + lease_ms)
            return state.dedup.get(name, -1)

        while True:
            _, last = ml.manifest.commit(change)
            if last != _WAIT:
                break
            self._waits.sleep(min(0.2, lease_ms / 10000))
        next_seq = initial_sequence_id + 1 if initial_sequence_id is not None else 0
        if self.dedup and isinstance(last, int):
            next_seq = max(next_seq, last + 1)
        writer = LedgerWriter(
            ml,
            producer_name=name,
            session=session,
            policies=self.policies,
            durable=self.topic.persistent,
        )
        return _Partition(ml, writer, next_seq)

    def _unregister_all(self) -> None:
        for p in self._parts:
            self._unregister(p)

    def _unregister(self, part: _Partition) -> None:
        name, session = self.producer_name, self.session

        def change(state: ManifestState) -> None:
            lease = state.producers.get(name)
            if lease is None or lease.session != session:
                raise Abort()
            del state.producers[name]

        try:
            part.ml.manifest.commit(change)
        except FilePulsarError as e:
            log.warning("could not unregister %s from %s: %s", name, part.ml.topic, e)
        part.writer.close()

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
            and self.batching
            and self.batching_type == "Default"
            and size <= self.max_message_size
            and self._custom is None
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
                    self._cond.notify_all()  # the I/O thread times the publish delay
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
                    self._cond.notify_all()  # the I/O thread times the publish delay
            else:
                b = part.batch
                if b is None:
                    b = part.batch = _Batch(self._clock(), seq)
                    self._cond.notify_all()  # the I/O thread times the publish delay
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

    # ------------------------------------------------------------------ sealing (lock held)
    def _columns(self, b: _Batch) -> tuple[pa.RecordBatch, int | None]:
        """The stored columns of a batch, and its first sequence id if they are contiguous
        (then no sequence_id column is stored)."""
        n = len(b.values)
        cols = [_binary_array(b.values)]
        names = ["value"]
        first_seq = b.first_seq if b.seqs is None else None
        if not b.extras and first_seq is not None:
            return pa.RecordBatch.from_arrays(cols, names=names), first_seq
        props: list[Any] = [None] * n
        keys: list[Any] = [None] * n
        okeys: list[Any] = [None] * n
        evts: list[Any] = [None] * n
        for i, p, k, ok, evt in b.extras or ():
            props[i], keys[i], okeys[i], evts[i] = p, k, ok, evt
        for name, vals in (
            ("key", keys),
            ("ordering_key", okeys),
            ("properties", props),
            ("event_time", evts),
        ):
            if all(v is None for v in vals):
                continue
            typ = MESSAGE_SCHEMA.field(name).type
            if name == "properties":
                vals = [list(v.items()) if v is not None else None for v in vals]
                cols.append(pa.array(vals, typ))
            elif name == "event_time":
                cols.append(_int64_array(vals))
            else:
                cols.append(_binary_array(vals, typ))
            names.append(name)
        if b.seqs is not None:
            cols.append(_int64_array(b.seqs))
            names.append("sequence_id")
        schema = pa.schema([MESSAGE_SCHEMA.field(nm) for nm in names])
        return pa.RecordBatch.from_arrays(cols, schema=schema), first_seq

    def _seal(
        self, part: _Partition, b: _Batch, bkey: Any, *, batched: bool = True, deliver_at: int = 0
    ) -> None:
        key_based = False
        if part.batch is b:
            part.batch = None
        elif part.key_batches.get(bkey) is b:
            part.key_batches.pop(bkey)
            key_based = True
        if b.seqs is None:
            first, hi = b.first_seq, b.first_seq + len(b.values) - 1
        else:
            first, hi = b.seqs[0], max(b.seqs)
        if key_based:
            first = hi
        try:
            rb, first_seq = self._columns(b)
            data = encode_entry_parts(
                rb,
                producer_name=self.producer_name,
                publish_time=b.created_ms,
                codec=self.codec,
                batched=batched,
                schema_version=self.schema_version,
                deliver_at=deliver_at,
                first_sequence_id=first_seq,
                header_sequence_id=hi if key_based else None,
            )
        except Exception as e:  # the batch is out of every queue: answer its senders here
            err = FilePulsarError(f"cannot encode an entry for {self.topic}: {e}")
            self._answer([b.callbacks], err)
            self._pending_bytes -= b.nbytes or sum(len(v) for v in b.values if v is not None)
            raise err from e
        self._enqueue(
            part,
            PendingEntry.of(data, len(b.values), b.created_ms, self.producer_name, first, hi),
            batched,
            b.callbacks,
            b.nbytes or sum(len(v) for v in b.values if v is not None),
        )

    def _queue_chunks(
        self,
        part: _Partition,
        content: bytes,
        extras: tuple,
        seq: int,
        callback: Any,
        step: int,
    ) -> None:
        size = len(content)
        num = (size + step - 1) // step
        uuid = f"{self.producer_name}-{seq}"
        now = self._clock()
        props, key, okey, evt = extras
        for cid in range(num):
            piece = content[cid * step : (cid + 1) * step]
            b = _Batch(now, seq)
            self._append(b, piece, callback if cid == num - 1 else None, (props, key, okey, evt), 0)
            try:
                rb, first_seq = self._columns(b)
                data = encode_entry_parts(
                    rb,
                    producer_name=self.producer_name,
                    publish_time=now,
                    codec=self.codec,
                    batched=False,
                    schema_version=self.schema_version,
                    chunk=ChunkInfo(uuid, cid, num, size),
                    first_sequence_id=first_seq,
                )
            except Exception as e:
                err = FilePulsarError(f"cannot encode chunk {cid} for {self.topic}: {e}")
                self._answer([[callback]], err)
                self._pending_bytes -= size
                raise err from e
            self._enqueue(
                part,
                PendingEntry.of(data, 1, now, self.producer_name, seq, seq),
                False,
                b.callbacks,
                len(piece) if cid == num - 1 else 0,
                follows_previous=cid > 0,
            )
        self._pending_bytes -= size - len(content[(num - 1) * step :])

    def _enqueue(
        self,
        part: _Partition,
        entry: PendingEntry,
        batched: bool,
        callbacks: list[Any] | None,
        nbytes: int,
        *,
        follows_previous: bool = False,
        want_position: bool = False,
    ) -> None:
        self._tickets_issued += 1
        q = _Queued(
            entry, batched, callbacks, self._tickets_issued, follows_previous, want_position, nbytes
        )
        part.queue.append(q)
        self._cond.notify_all()

    def _seal_all(self, older_than_ms: int | None = None) -> None:
        for part in self._parts:
            b = part.batch
            if b is not None and (older_than_ms is None or b.created_ms <= older_than_ms):
                self._seal(part, b, None)
            if part.key_batches and (
                older_than_ms is None
                or min(kb.created_ms for kb in part.key_batches.values()) <= older_than_ms
            ):
                self._seal_keys(part)

    def _seal_keys(self, part: _Partition) -> None:
        """Seal every key batch of ``part`` in order of their highest sequence id.

        With ``header_sequence_id`` = highest, that order lets Pulsar's dedup accept every
        key batch although their sequence ids interleave.
        """

        def highest(item: tuple[Any, _Batch]) -> int:
            b = item[1]
            return max(b.seqs) if b.seqs else b.first_seq + len(b.values) - 1

        for k, kb in sorted(part.key_batches.items(), key=highest):
            self._seal(part, kb, k)
        part.key_count = part.key_bytes = 0

    # ------------------------------------------------------------------ I/O thread
    def _io_loop(self) -> None:
        try:
            self._io_run()
        except BaseException as e:  # the thread ends: no pending sender may wait forever
            log.exception("producer %s I/O thread failed", self.producer_name)
            self._fail_pending(e)

    def _next_due(self) -> float | None:
        """Monotonic time the oldest open batch reaches its publish delay (None: none open)."""
        due: float | None = None
        for p in self._parts:
            b = p.batch
            if b is not None and (due is None or b.opened < due):
                due = b.opened
            for kb in p.key_batches.values():
                if due is None or kb.opened < due:
                    due = kb.opened
        return None if due is None else due + self.publish_delay_ms / 1000

    def _io_run(self) -> None:
        renew_s = self.policies.producer_lease_ms / 3000
        delay_s = self.publish_delay_ms / 1000
        while True:
            with self._lock:
                # Woken by every new batch and every sealed entry; otherwise sleeps until the
                # oldest open batch is due or the producer's leases need renewing.
                while not any(p.queue for p in self._parts):
                    if self._closed:
                        return
                    now = SYSTEM.monotonic()
                    due = self._next_due()
                    if due is not None and due <= now:
                        self._seal_opened_before(now - delay_s)
                        continue
                    renew_at = self._last_renew + renew_s
                    if renew_at <= now:
                        break
                    self._cond.wait((renew_at if due is None else min(due, renew_at)) - now)
                has_work = any(p.queue for p in self._parts)
            if not has_work:
                self._renew_if_due()
                continue
            with self._write_lock:
                with self._lock:
                    work = [(p, p.queue) for p in self._parts if p.queue]
                    for p in self._parts:
                        p.queue = []
                for part, queued in work:
                    self._write(part, queued)

    def _seal_opened_before(self, when: float) -> None:
        for part in self._parts:
            b = part.batch
            if b is not None and b.opened <= when:
                self._seal(part, b, None)
            if part.key_batches and min(kb.opened for kb in part.key_batches.values()) <= when:
                self._seal_keys(part)

    def _fail_pending(self, e: BaseException) -> None:
        """Answer every message not yet stored with an error (queued and open batches)."""
        err = (
            e
            if isinstance(e, FilePulsarError)
            else FilePulsarError(f"producer {self.producer_name!r} on {self.topic} failed: {e!r}")
        )
        with self._lock:
            if self._error is None and not isinstance(err, ProducerClosed):
                self._error = err
            queued: list[_Queued] = []
            batches: list[_Batch] = []
            for p in self._parts:
                queued.extend(p.queue)
                p.queue = []
                if p.batch is not None:
                    batches.append(p.batch)
                    p.batch = None
                batches.extend(p.key_batches.values())
                p.key_batches.clear()
                p.key_count = p.key_bytes = 0
            for q in queued:
                self._pending_bytes -= q.nbytes
                self._mark_done(q.ticket)
            for b in batches:
                self._pending_bytes -= b.nbytes
            self._cond.notify_all()
        self._answer([q.callbacks for q in queued] + [b.callbacks for b in batches], err)

    @staticmethod
    def _answer(callback_lists: list[list[Any] | None], e: BaseException) -> None:
        result = Result.ProducerFenced if isinstance(e, ProducerFenced) else Result.UnknownError
        if isinstance(e, ProducerClosed):
            result = Result.AlreadyClosed
        for cbs in callback_lists:
            for cb in cbs or ():
                if cb is not None:
                    try:
                        cb(result, None)
                    except BaseException:  # a user callback must not stop the others
                        log.exception("send_async callback raised")

    def _renew_if_due(self) -> None:
        if SYSTEM.monotonic() - self._last_renew < self.policies.producer_lease_ms / 3000:
            return
        self._last_renew = SYSTEM.monotonic()
        for p in self._parts:
            try:
                p.writer.renew_lease()
            except FilePulsarError as e:
                self._fail(e)
                return

    def _write(self, part: _Partition, queued: list[_Queued]) -> None:
        try:
            positions = part.writer.append(
                [q.entry for q in queued],
                dedup=self.dedup,
                follows=[q.follows_previous for q in queued],
            )
        except BaseException as e:  # reported to every waiting sender
            self._fail(e, queued)
            return
        self._last_renew = SYSTEM.monotonic()
        pidx = part.ml.partition
        part.last_published = max(
            part.last_published, max(q.entry.highest_sequence_id for q in queued)
        )
        for q, pos in zip(queued, positions):
            cbs = q.callbacks
            if cbs is None:
                continue
            for i, cb in enumerate(cbs):
                if cb is None:
                    continue
                mid = self._message_id(pos, pidx, i if q.batched else -1)
                try:
                    cb(Result.Ok, mid)
                except BaseException:  # a user callback must not kill the I/O thread
                    log.exception("send_async callback raised")
        with self._lock:
            for q, pos in zip(queued, positions):
                self._pending_bytes -= q.nbytes
                if q.want_position:
                    self._positions[q.ticket] = pos
                self._mark_done(q.ticket)
            self._cond.notify_all()

    @staticmethod
    def _message_id(pos: Position | None, partition: int, batch_index: int) -> MessageId:
        if pos is None:
            return DUPLICATE_MESSAGE_ID
        return MessageId(partition, pos.ledger_id, pos.entry_id, batch_index)

    def _mark_done(self, ticket: int) -> None:
        self._done_set.add(ticket)
        while self._done_upto + 1 in self._done_set:
            self._done_upto += 1
            self._done_set.discard(self._done_upto)

    def _fail(self, e: BaseException, queued: list[_Queued] | None = None) -> None:
        if not isinstance(e, FilePulsarError):
            e = FilePulsarError(f"write to {self.topic} failed: {e!r}").with_traceback(
                e.__traceback__
            )
        self._answer([q.callbacks for q in queued or ()], e)
        with self._lock:
            self._error = e
            for q in queued or []:
                self._pending_bytes -= q.nbytes
                self._mark_done(q.ticket)
            self._cond.notify_all()

    # ------------------------------------------------------------------ bulk API
    def send_table(self, data: pa.Table | pa.RecordBatch | Sequence[Any]) -> pa.Table:
        """Publish many messages at once and wait until they are stored.

        ``data``: a table with ``value`` and any of ``key``, ``ordering_key``, ``properties``,
        ``event_time``, ``sequence_id``, ``deliver_at`` (:func:`storage.bulk_columns.normalize`),
        or a list of bytes. Rows are routed (``dispatch.routing``: keyed rows by hash, keyless
        rows round robin one partition per batch, or per row with batching off) and cut into
        entries by :func:`storage.batcher.cut` under the producer's batch policy, the cutter
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
            key, ordering key and properties, :func:`storage.batcher.too_big`) and chunking is
            off (nothing is written).
        """
        table = bulk_columns.normalize(data)
        n_rows = table.num_rows
        if n_rows == 0:
            return _IDS_SCHEMA.empty_table()
        policy = self._batch_policy()
        big = batcher.check_size(
            table,
            policy,
            where=f"send_table to {self.topic}",
            hint="; enable chunking (chunking_enabled=True, batching off) or send smaller "
            "messages; nothing was sent",
        )
        plan: list[tuple[_Partition, pa.Table, Any, np.ndarray | None]] = []
        if self.num_partitions <= 1:
            plan.append((self._parts[0], table, None, big))
        else:
            parts = self._bulk_partitions(table)
            order = np.argsort(parts, kind="stable")
            for p in range(self.num_partitions):
                rows = order[parts[order] == p]
                if len(rows):
                    sub_big = big[rows] if big is not None else None
                    plan.append((self._parts[p], table.take(pa.array(rows)), rows, sub_big))
        explicit_seq = "sequence_id" in table.column_names
        name = self.producer_name
        results: list[tuple[Any, bool, int, Position | None]] = []
        with self._write_lock:
            with self._lock:
                if self._closed or self._error is not None:
                    self._raise_state()
                now = self._clock()
                work = []
                for part, sub, rows, sub_big in plan:
                    if part.batch:
                        self._seal(part, part.batch, None)
                    if part.key_batches:
                        self._seal_keys(part)
                    taken, part.queue = part.queue, []
                    seq_base: int | None = None
                    if not explicit_seq:
                        seq_base = part.next_seq
                        part.next_seq += sub.num_rows
                    work.append((part, sub, rows, sub_big, taken, seq_base))
            for part, sub, part_rows, sub_big, taken, base in work:
                if taken:  # earlier messages of this producer go first
                    self._write(part, taken)
                if self._error is not None:
                    raise self._error
                specs = batcher.cut(
                    sub, policy, big=sub_big, seq_base=base, chunk_uuid=lambda s: f"{name}-{s}"
                )
                groups = batcher.encode(
                    specs,
                    producer_name=name,
                    publish_time=now,
                    codec=self.codec,
                    schema_version=self.schema_version,
                )
                try:
                    positions = part.writer.append_stream(groups, dedup=self.dedup)
                except BaseException:
                    part.writer.close()
                    raise
                for spec, pos in zip(specs, positions):
                    if len(spec.rows) == 0:
                        continue  # a chunk before the last: its message has the last's id
                    rows_ = spec.rows
                    if part_rows is not None:
                        rows_ = (
                            part_rows[rows_.start : rows_.stop]
                            if isinstance(rows_, range)
                            else part_rows[rows_]
                        )
                    results.append((rows_, spec.batched, part.ml.partition, pos))
        return self._ids_table(results, n_rows)

    def _batch_policy(self) -> batcher.BatchPolicy:
        """The producer's settings that shape entries, for the bulk cutter."""
        return batcher.BatchPolicy(
            max_message_size=self.max_message_size,
            codec=self.codec,
            batching=self.batching,
            max_messages=self.max_messages,
            max_bytes=self.max_bytes,
            batching_type=self.batching_type,
            chunking=self.chunking,
        )

    @staticmethod
    def _ids_table(results: list[tuple[Any, bool, int, Position | None]], n_rows: int) -> pa.Table:
        # Built with Arrow's run-end decoding: its memory pool keeps pages warm, where large
        # numpy temporaries pay fresh page faults on every call.
        counts = np.array([len(r[0]) for r in results], np.int64)
        run_ends = pa.array(np.cumsum(counts), pa.int64())

        def spread(values: list[Any], typ: pa.DataType) -> pa.Array:
            ree = pa.RunEndEncodedArray.from_arrays(run_ends, pa.array(values, typ))
            return pc.run_end_decode(ree)

        ok = [r[3] is not None for r in results]
        par = spread([r[2] if r[3] else -1 for r in results], pa.int32())
        led = spread([r[3].ledger_id if r[3] else -1 for r in results], pa.int64())
        ent = spread([r[3].entry_id if r[3] else -1 for r in results], pa.int64())
        starts = spread((np.cumsum(counts) - counts).tolist(), pa.int32())
        within = pc.subtract(pa.array(np.arange(n_rows, dtype=np.int32)), starts)
        batched = spread([b and o for (_, b, _, _), o in zip(results, ok)], pa.bool_())
        bidx = pc.if_else(batched, within, pa.scalar(-1, pa.int32()))
        cols = [par, led, ent, bidx]
        if not all(isinstance(r[0], range) for r in results):
            order = np.concatenate([np.asarray(r[0]) for r in results])
            inverse = np.empty(n_rows, np.int64)
            inverse[order] = np.arange(n_rows)
            cols = [c.take(pa.array(inverse)) for c in cols]
        return pa.table(cols, schema=_IDS_SCHEMA)

    def _bulk_partitions(self, table: pa.Table) -> np.ndarray:
        """Partition of every row (``dispatch.routing``'s rules, as ``send_async`` routes)."""
        n = self.num_partitions
        rows = table.num_rows
        keys = table.column("key") if "key" in table.column_names else None
        if self._custom is not None:
            cols = {c: table.column(c).to_pylist() for c in table.column_names}
            none = [None] * rows
            props = [dict(p) if p is not None else None for p in cols.get("properties", none)]
            out = np.empty(rows, np.int64)
            for i, (v, k, ok, evt) in enumerate(
                zip(
                    cols["value"],
                    cols.get("key", none),
                    cols.get("ordering_key", none),
                    cols.get("event_time", none),
                )
            ):
                out[i] = self._route_custom(OutgoingMessage(v, props[i], k, ok, evt))
            return out
        router = self._router
        assert router is not None
        batch = self.max_messages if self.batching else 1
        return route_rows(
            keys, rows, n, self.hashing_scheme, lambda c: router.keyless_partitions(c, batch)
        )

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
        duplicate dropped by deduplication)."""
        box: list[Any] = []

        def done(res: Result, mid: MessageId | None) -> None:
            box.append((res, mid))

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
        self.flush()
        if not box or box[0][1] is None:
            raise self._error or FilePulsarError(f"send to {self.topic} failed")
        return box[0][1]

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

    def is_connected(self) -> bool:
        return not self._closed and self._error is None

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
