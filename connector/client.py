"""The Python client: Pulsar's producer, consumer and reader API over a storage root.

Shaped like pulsar-client (``import pulsar`` → ``from connector import client as pulsar``)::

    from filepulsar.connector.client import Client, ConsumerType, InitialPosition

    client = Client("s3://bucket/pulsar", storage_options={...})   # or a local path
    producer = client.create_producer("orders")
    producer.send(b"hello", properties={"k": "v"}, partition_key="customer-1")
    consumer = client.subscribe("orders", "billing", consumer_type=ConsumerType.Shared,
                                initial_position=InitialPosition.Earliest)
    msg = consumer.receive(timeout_millis=1000)
    consumer.acknowledge(msg)
    client.close()

There is no broker: the ``service_url`` is the storage root (a local path, ``file://``,
``memory://name``, ``s3://bucket/prefix``, or any of them behind ``filepulsar://``), and
producers, consumers and readers in any number of processes coordinate through it. Names of
enums, policies and parameters are pulsar-client's; filepulsar's additions are keyword
arguments (``consumer_lease_ms``, ``retry_enable``, ``negative_ack_redelivery_backoff`` ...).
Where pulsar-client's behaviour needs a broker setting, the docstrings say which default
filepulsar takes. Leases assume loosely synchronised clocks between processes.
"""

from __future__ import annotations

import datetime
import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from filepulsar.connector.client_consumer import Consumer
from filepulsar.connector.client_message import Message, _View
from filepulsar.connector.client_schema import (
    Schema,
    bind_for_reading,
    check_schema_arg,
    register_for_producer,
)
from filepulsar.connector.client_tableview import TableView
from filepulsar.connector.client_types import (
    AlreadyClosed,
    AuthenticationError,
    AuthorizationError,
    BatchingType,
    BrokerMetadataError,
    BrokerPersistenceError,
    ChecksumError,
    CompressionType,
    ConnectError,
    ConsumerAssignError,
    ConsumerBatchReceivePolicy,
    ConsumerBusy,
    ConsumerCryptoFailureAction,
    ConsumerDeadLetterPolicy,
    ConsumerKeySharedPolicy,
    ConsumerNotFound,
    ConsumerNotInitialized,
    ConsumerType,
    CryptoError,
    CumulativeAcknowledgementNotAllowedError,
    ErrorGettingAuthenticationData,
    HashingScheme,
    IncompatibleSchema,
    InitialPosition,
    Interrupted,
    InvalidConfiguration,
    InvalidMessage,
    InvalidTopicName,
    InvalidTxnStatusError,
    InvalidUrl,
    KeySharedMode,
    LookupError,
    MemoryBufferIsFull,
    MessageTooBig,
    NotAllowedError,
    NotConnected,
    OperationNotSupported,
    PartitionsRoutingMode,
    ProducerAccessMode,
    ProducerBlockedQuotaExceededError,
    ProducerBlockedQuotaExceededException,
    ProducerBusy,
    ProducerFenced,
    ProducerNotInitialized,
    ProducerQueueIsFull,
    PulsarException,
    ReadError,
    RegexSubscriptionMode,
    ServiceUnitNotReady,
    SubscriptionNotFound,
    Timeout,
    TooManyLookupRequestException,
    TopicNotFound,
    TopicTerminated,
    TransactionConflict,
    TransactionCoordinatorNotFoundError,
    TransactionNotFound,
    UnknownError,
    UnsupportedVersionError,
    _check_type,
    _check_type_or_none,
)
from filepulsar.dispatch.redelivery import (
    DEFAULT_NEGATIVE_ACK_DELAY_MS,
    MultiplierRedeliveryBackoff,
)
from filepulsar.storage.blobstore import BlobStore, open_blob_store
from filepulsar.storage.cursor import DEFAULT_LEASE_MS
from filepulsar.storage.entry import preload_pandas
from filepulsar.storage.errors import FilePulsarError
from filepulsar.storage.messageid import MessageId
from filepulsar.storage.names import TopicName
from filepulsar.storage.policies import effective_policies
from filepulsar.storage.producer import OutgoingMessage, Result
from filepulsar.storage.producer import Producer as StorageProducer
from filepulsar.storage.reader import Reader as StorageReader
from filepulsar.storage.topics import ensure_topic

__all__ = [
    "AlreadyClosed",
    "AuthenticationError",
    "AuthorizationError",
    "BatchingType",
    "BrokerMetadataError",
    "BrokerPersistenceError",
    "ChecksumError",
    "Client",
    "CompressionType",
    "ConnectError",
    "Consumer",
    "ConsumerAssignError",
    "ConsumerBatchReceivePolicy",
    "ConsumerBusy",
    "ConsumerCryptoFailureAction",
    "ConsumerDeadLetterPolicy",
    "ConsumerKeySharedPolicy",
    "ConsumerNotFound",
    "ConsumerNotInitialized",
    "ConsumerType",
    "CryptoError",
    "CumulativeAcknowledgementNotAllowedError",
    "ErrorGettingAuthenticationData",
    "HashingScheme",
    "IncompatibleSchema",
    "InitialPosition",
    "Interrupted",
    "InvalidConfiguration",
    "InvalidMessage",
    "InvalidTopicName",
    "InvalidTxnStatusError",
    "InvalidUrl",
    "KeySharedMode",
    "LookupError",
    "MemoryBufferIsFull",
    "Message",
    "MessageId",
    "MessageTooBig",
    "MultiplierRedeliveryBackoff",
    "NotAllowedError",
    "NotConnected",
    "OperationNotSupported",
    "OutgoingMessage",
    "PartitionsRoutingMode",
    "Producer",
    "ProducerAccessMode",
    "ProducerBlockedQuotaExceededError",
    "ProducerBlockedQuotaExceededException",
    "ProducerBusy",
    "ProducerFenced",
    "ProducerNotInitialized",
    "ProducerQueueIsFull",
    "PulsarException",
    "ReadError",
    "Reader",
    "RegexSubscriptionMode",
    "Result",
    "ServiceUnitNotReady",
    "SubscriptionNotFound",
    "TableView",
    "Timeout",
    "TooManyLookupRequestException",
    "TopicNotFound",
    "TopicTerminated",
    "TransactionConflict",
    "TransactionCoordinatorNotFoundError",
    "TransactionNotFound",
    "UnknownError",
    "UnsupportedVersionError",
]

_SCHEME = "filepulsar://"


def _root_of(service_url: str) -> str:
    if not isinstance(service_url, str) or not service_url:
        raise InvalidConfiguration(
            "service_url must be a storage root: a local path, file://..., memory://name, "
            f"s3://bucket/prefix (optionally behind {_SCHEME}), got {service_url!r}"
        )
    if service_url.startswith(("pulsar://", "pulsar+ssl://", "http://", "https://")):
        raise InvalidUrl(
            f"service_url {service_url!r} names a broker; filepulsar has none: pass the "
            "storage root instead (a local path, memory://name, s3://bucket/prefix ...)"
        )
    if service_url.startswith(_SCHEME):
        service_url = service_url[len(_SCHEME) :]
        if not service_url:
            raise InvalidConfiguration(f"{_SCHEME} needs a root after it")
    return service_url


class Producer:
    """A producer (pulsar-client's ``Producer``) around :class:`storage.producer.Producer`.

    ``send``, ``send_async``, ``flush`` and ``send_table`` are the storage producer's own
    bound methods, so the client adds nothing to the hot path. ``send_async``'s callback is
    called ``callback(result, message_id)`` from the producer's I/O thread once the message is
    durable. ``send_table`` (filepulsar's bulk path) publishes an Arrow table at once.
    """

    def __init__(self, inner: StorageProducer, schema: Schema | None = None) -> None:
        self._inner = inner
        self._closed = False
        self._schema = schema
        self.send: Callable[..., MessageId] = inner.send
        self.send_async: Callable[..., None] = inner.send_async
        self.flush: Callable[[], None] = inner.flush
        self.send_table: Callable[..., pa.Table] = inner.send_table
        if schema is not None:
            encode = schema.encode
            send, send_async = inner.send, inner.send_async

            # None is a null value (a tombstone), sent as it is.
            def send_with_schema(content: Any, *args: Any, **kwargs: Any) -> MessageId:
                return send(None if content is None else encode(content), *args, **kwargs)

            def send_async_with_schema(content: Any, *args: Any, **kwargs: Any) -> None:
                send_async(None if content is None else encode(content), *args, **kwargs)

            self.send = send_with_schema
            self.send_async = send_async_with_schema

    def schema(self) -> Schema | None:
        """The producer's value schema (None: bytes)."""
        return self._schema

    def topic(self) -> str:
        return str(self._inner.topic)

    def producer_name(self) -> str:
        return self._inner.producer_name

    def last_sequence_id(self) -> int:
        """The highest sequence id stored by this producer (-1 if none), explicit
        ``sequence_id=`` values included."""
        return self._inner.last_sequence_id

    def is_connected(self) -> bool:
        return self._inner.is_connected()

    def close(self) -> None:
        """Flush what is pending and release the producer's registration."""
        try:
            self._inner.close()
        finally:
            self._closed = True  # the storage producer is closed even if its flush failed

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Reader:
    """A reader (pulsar-client's ``Reader``): reads a topic from a position, no subscription.

    Nothing is acknowledged and no cursor is stored; it holds back no retention.
    """

    def __init__(
        self,
        store: BlobStore,
        topic: str,
        start_message_id: MessageId,
        *,
        receiver_queue_size: int,
        start_message_id_inclusive: bool,
        clock: Callable[[], int] | None,
        schema: Schema | None = None,
        read_compacted: bool = False,
    ) -> None:
        preload_pandas()  # off the first message's path
        self._topic = TopicName.parse(topic)
        self._reader = StorageReader(
            store,
            self._topic,
            start_message_id,
            start_message_id_inclusive=start_message_id_inclusive,
            clock=clock,
            auto_create=True,
            read_compacted=read_compacted,
        )
        self._n = ensure_topic(store, self._topic, auto_create=False)
        self._schema = schema
        try:
            bind_for_reading(
                store, self._topic, schema, effective_policies(store, self._topic), role="reader"
            )
        except BaseException:
            self._reader.close()
            raise
        self._entries = max(1, receiver_queue_size // 100)
        self._buf: deque[Message] = deque()
        self._lock = threading.Lock()
        self._closed = False

    def topic(self) -> str:
        return str(self._topic)

    def _load(self, timeout_ms: int) -> None:
        table = self._reader.read_batch(self._entries, timeout_ms=timeout_ms)
        if not table.num_rows:
            return
        p = table.column("partition")[0].as_py()
        topic = str(self._topic.partition(p)) if self._n else str(self._topic)
        view = _View(table, topic)
        view.schema = self._schema
        self._buf.extend(Message(view, r) for r in range(table.num_rows))

    def read_next(self, timeout_millis: int | None = None) -> Message:
        """The next message, waiting up to ``timeout_millis`` (None: forever).

        Raises
        ------
        Timeout
            If nothing arrived in time.
        AlreadyClosed
            If the reader is closed.
        Interrupted
            If Ctrl-C (SIGINT) interrupted the wait.
        """
        _check_type_or_none(int, timeout_millis, "timeout_millis")
        try:
            return self._read_next(timeout_millis)
        except KeyboardInterrupt as e:
            raise Interrupted(f"read_next on {self._topic} was interrupted") from e

    def _read_next(self, timeout_millis: int | None) -> Message:
        deadline = None if timeout_millis is None else time.monotonic() + timeout_millis / 1000
        self._reader.restart_wait()
        while True:
            # One non-blocking look at a time, the lock released while waiting, so close()
            # (and Client.close()) never wait for a message to arrive.
            with self._lock:
                if self._closed:
                    raise AlreadyClosed(f"reader of {self._topic} is closed")
                if not self._buf:
                    self._load(0)
                if self._buf:
                    return self._buf.popleft()
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Timeout(f"no message on {self._topic} within {timeout_millis} ms")
                self._reader.wait(left)
            else:
                self._reader.wait()

    def _read_buffered(self) -> Message | None:
        """A message already read ahead, taken without waiting or storage I/O: None if there
        is none or the reader's lock is busy. For the asyncio client's event loop thread."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            return self._buf.popleft() if self._buf and not self._closed else None
        finally:
            self._lock.release()

    def has_message_available(self) -> bool:
        with self._lock:
            return bool(self._buf) or self._reader.has_message_available()

    def seek(self, target: MessageId | int | datetime.datetime) -> None:
        """Move to a message id or to the first message published at or after a time (epoch
        ms or datetime). The message at the id is read again only if the reader was created
        with ``start_message_id_inclusive=True`` (as in pulsar-client).

        Raises
        ------
        InvalidConfiguration
            (a ``ValueError``) If ``target`` is of another type.
        """
        if isinstance(target, datetime.datetime):
            target = int(target.timestamp() * 1000)
        if not isinstance(target, MessageId | int) or isinstance(target, bool):
            raise InvalidConfiguration(
                f"seek needs a MessageId, epoch milliseconds (int) or a datetime, "
                f"got {type(target).__name__}"
            )
        with self._lock:
            self._buf.clear()
            self._reader.seek(target)

    def is_connected(self) -> bool:
        return not self._closed

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._buf.clear()
            self._reader.close()

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_unsupported(**given: Any) -> None:
    for name, value in given.items():
        if value not in (None, False) and value is not ConsumerCryptoFailureAction.FAIL:
            raise OperationNotSupported(f"{name} is not supported by filepulsar (got {value!r})")


class Client:
    """Entry point (pulsar-client's ``Client``) over a storage root.

    Parameters
    ----------
    service_url
        The storage root: a local path or ``file://`` URL, ``memory://name`` (this process
        only), ``s3://bucket/prefix``; ``filepulsar://<root>`` is accepted too.
    storage_options
        fsspec options for the root (for S3: ``endpoint_url``, ``key``, ``secret`` ...).
    authentication, operation_timeout_seconds, io_threads, message_listener_threads, \
    concurrent_lookup_requests, log_conf_file_path, stats_interval_in_seconds, use_tls, \
    tls_trust_certs_file_path, tls_allow_insecure_connection, tls_validate_hostname, logger, \
    connection_timeout_ms, listener_name, tls_private_key_file_path, tls_certificate_file_path
        pulsar-client's connection settings, in its order and with its defaults. They are
        type-checked as pulsar-client does (``ValueError``) and otherwise have no effect:
        there is no broker to authenticate to, connect to or look topics up on, and no
        connection pool or lookup threads. Access control is the storage's own (file
        permissions, S3 credentials in ``storage_options``).
    storage_options
        fsspec options for the root (for S3: ``endpoint_url``, ``key``, ``secret`` ...).
    clock
        Wall-clock milliseconds used for publish times, leases, delays and timeouts (tests
        inject one); defaults to the system clock.

    Raises
    ------
    InvalidConfiguration
        (a ``ValueError``) If ``service_url`` is a broker URL, empty or not a string, or an
        argument has the wrong type.
    """

    def __init__(
        self,
        service_url: str,
        authentication: Any = None,
        operation_timeout_seconds: int = 30,
        io_threads: int = 1,
        message_listener_threads: int = 1,
        concurrent_lookup_requests: int = 50000,
        log_conf_file_path: str | None = None,
        stats_interval_in_seconds: int = 600,
        use_tls: bool = False,
        tls_trust_certs_file_path: str | None = None,
        tls_allow_insecure_connection: bool = False,
        tls_validate_hostname: bool = False,
        logger: Any = None,
        connection_timeout_ms: int = 10000,
        listener_name: str | None = None,
        tls_private_key_file_path: str | None = None,
        tls_certificate_file_path: str | None = None,
        *,
        storage_options: dict[str, Any] | None = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        for name, value in (
            ("operation_timeout_seconds", operation_timeout_seconds),
            ("io_threads", io_threads),
            ("message_listener_threads", message_listener_threads),
            ("concurrent_lookup_requests", concurrent_lookup_requests),
            ("stats_interval_in_seconds", stats_interval_in_seconds),
            ("connection_timeout_ms", connection_timeout_ms),
        ):
            _check_type(int, value, name)
        for name, value in (
            ("use_tls", use_tls),
            ("tls_allow_insecure_connection", tls_allow_insecure_connection),
            ("tls_validate_hostname", tls_validate_hostname),
        ):
            _check_type(bool, value, name)
        for name, text in (
            ("log_conf_file_path", log_conf_file_path),
            ("tls_trust_certs_file_path", tls_trust_certs_file_path),
            ("listener_name", listener_name),
            ("tls_private_key_file_path", tls_private_key_file_path),
            ("tls_certificate_file_path", tls_certificate_file_path),
        ):
            _check_type_or_none(str, text, name)
        if authentication is not None and isinstance(
            authentication, str | bytes | int | float | list | tuple | dict
        ):
            # pulsar-client takes only an Authentication object here; a plain value is
            # always a mistake, even though authentication has no effect without a broker.
            raise InvalidConfiguration(
                "authentication must be an authentication object (pulsar-client's "
                f"Authentication...; unused here) or None, got {authentication!r}"
            )
        if logger is not None and not isinstance(logger, logging.Logger):
            raise InvalidConfiguration(
                f"Logger is expected to be either None or a logging.Logger, got {logger!r}"
            )
        _check_type_or_none(dict, storage_options, "storage_options")
        root = _root_of(service_url)
        try:
            self._store = open_blob_store(root, storage_options=storage_options)
        except ValueError as e:
            raise InvalidConfiguration(f"cannot open storage root {service_url!r}: {e}") from e
        self._clock = clock
        self._handles: list[Producer | Consumer | Reader | TableView] = []
        self._lock = threading.Lock()
        self._closed = False

    @property
    def store(self) -> BlobStore:
        """The blob store under the root (for admin functions of :mod:`storage`)."""
        return self._store

    def _track(self, h: Producer | Consumer | Reader | TableView) -> None:
        with self._lock:
            if self._closed:
                h.close()
                raise AlreadyClosed("client is closed")
            # Closed handles only: a producer that failed is not connected, yet still holds
            # its registration until close() releases it (which Client.close() must do).
            self._handles = [x for x in self._handles if not x._closed]
            self._handles.append(h)

    def create_producer(
        self,
        topic: str,
        producer_name: str | None = None,
        schema: Any = None,
        initial_sequence_id: int | None = None,
        send_timeout_millis: int = 30000,
        compression_type: CompressionType | str = CompressionType.NONE,
        max_pending_messages: int = 1000,
        max_pending_messages_across_partitions: int = 50000,
        block_if_queue_full: bool = False,
        batching_enabled: bool = False,
        batching_max_messages: int = 1000,
        batching_max_allowed_size_in_bytes: int = 128 * 1024,
        batching_max_publish_delay_ms: int = 10,
        chunking_enabled: bool = False,
        message_routing_mode: PartitionsRoutingMode
        | str = PartitionsRoutingMode.RoundRobinDistribution,
        lazy_start_partitioned_producers: bool = False,
        properties: dict[str, str] | None = None,
        batching_type: BatchingType | str = BatchingType.Default,
        encryption_key: str | None = None,
        crypto_key_reader: Any = None,
        access_mode: ProducerAccessMode | str = ProducerAccessMode.Shared,
        message_router: Callable[[Any, int], int] | None = None,
        hashing_scheme: HashingScheme | str = HashingScheme.JavaStringHash,
        max_pending_bytes: int = 64 * 1024 * 1024,
    ) -> Producer:
        """Create a producer on ``topic`` (auto-created per the namespace policies).

        Parameters and defaults are pulsar-client's (batching and ``block_if_queue_full``
        off; ``batching_max_publish_delay_ms`` 10). With batching off every message is its
        own entry, written as soon as the producer's I/O thread is free; turn batching on for
        throughput. The queue is bounded by ``max_pending_bytes`` (filepulsar's), so
        ``max_pending_messages*`` and ``send_timeout_millis`` are accepted and unused, as is
        ``lazy_start_partitioned_producers``. A ``message_router(msg, num_partitions)``
        decides the partition of every message of a partitioned topic, whatever
        ``message_routing_mode`` says (as in pulsar-client); ``msg`` has ``data()``,
        ``value()``, ``properties()``, ``partition_key()`` .... ``hashing_scheme`` (Java
        client's option) hashes keys for routing. The closed sets (``compression_type``,
        ``message_routing_mode``, ``batching_type``, ``access_mode``, ``hashing_scheme``) also
        take either spelling of a member as a string (``"RoundRobinPartition"`` or
        ``"RoundRobinDistribution"``; :mod:`dispatch.modes`). ``chunking_enabled`` needs
        batching off.
        The max message size counts the payload, properties and keys. A ``schema``
        (:mod:`filepulsar.schema`) encodes what ``send`` is given and is registered in the
        topic's schema registry (``BytesSchema()`` registers the ``BYTES`` type; ``None``, the
        default, writes plain bytes and registers nothing).

        Raises
        ------
        ProducerBusy, ProducerFenced
            Per ``access_mode`` (see :class:`storage.producer.Producer`).
        TopicNotFound
            If the topic does not exist and may not be auto-created.
        InvalidConfiguration
            (a ``ValueError``) For bad or unsupported arguments (a schema that is not a
            :mod:`filepulsar.schema` schema, encryption, a producer name over 65,514 bytes,
            batching with chunking).
        IncompatibleSchema
            If the topic's schema registry refuses the schema (compatibility strategy,
            ``is_allow_auto_update_schema``, ``schema_validation_enforced``).
        """
        _check_type(str, topic, "topic")
        _check_type_or_none(str, producer_name, "producer_name")
        _check_type_or_none(int, initial_sequence_id, "initial_sequence_id")
        for name, value in (
            ("send_timeout_millis", send_timeout_millis),
            ("max_pending_messages", max_pending_messages),
            ("max_pending_messages_across_partitions", max_pending_messages_across_partitions),
            ("batching_max_messages", batching_max_messages),
            ("batching_max_allowed_size_in_bytes", batching_max_allowed_size_in_bytes),
            ("batching_max_publish_delay_ms", batching_max_publish_delay_ms),
        ):
            _check_type(int, value, name)
        for name, value in (
            ("block_if_queue_full", block_if_queue_full),
            ("batching_enabled", batching_enabled),
            ("chunking_enabled", chunking_enabled),
            ("lazy_start_partitioned_producers", lazy_start_partitioned_producers),
        ):
            _check_type(bool, value, name)
        # The closed sets: a member, or either spelling of one (dispatch.modes).
        compression_type = CompressionType.parse(compression_type, "compression_type")
        batching_type = BatchingType.parse(batching_type, "batching_type")
        access_mode = ProducerAccessMode.parse(access_mode, "access_mode")
        message_routing_mode = PartitionsRoutingMode.parse(
            message_routing_mode, "message_routing_mode"
        )
        hashing_scheme = HashingScheme.parse(hashing_scheme, "hashing_scheme")
        _check_type_or_none(dict, properties, "properties")
        if message_router is not None and not callable(message_router):
            raise InvalidConfiguration(
                f"Argument message_router is expected to be callable, got {message_router!r}"
            )
        if batching_enabled and chunking_enabled:
            raise InvalidConfiguration(
                "Batching and chunking of messages can't be enabled together: "
                "set batching_enabled=False to use chunking_enabled=True"
            )
        value_schema = check_schema_arg(schema, producer=True)
        _check_unsupported(encryption_key=encryption_key, crypto_key_reader=crypto_key_reader)
        inner = StorageProducer(
            self._store,
            topic,
            producer_name=producer_name,
            access_mode=access_mode,
            batching_enabled=batching_enabled,
            batching_max_messages=batching_max_messages,
            batching_max_allowed_size_in_bytes=batching_max_allowed_size_in_bytes,
            batching_max_publish_delay_ms=batching_max_publish_delay_ms,
            batching_type=batching_type,
            compression_type=compression_type,
            chunking_enabled=chunking_enabled,
            message_routing_mode=message_routing_mode,
            hashing_scheme=hashing_scheme,
            message_router=message_router,
            initial_sequence_id=initial_sequence_id,
            max_pending_bytes=max_pending_bytes,
            block_if_queue_full=block_if_queue_full,
            properties=properties,
            clock=self._clock,
        )
        try:
            inner.schema_version, value_schema = register_for_producer(
                self._store, inner.topic, value_schema, inner.policies
            )
        except BaseException:
            inner.close()
            raise
        p = Producer(inner, value_schema)
        self._track(p)
        return p

    def subscribe(
        self,
        topic: str | Sequence[str] | re.Pattern[str],
        subscription_name: str,
        consumer_type: ConsumerType | str = ConsumerType.Exclusive,
        schema: Any = None,
        message_listener: Callable[[Consumer, Message], None] | None = None,
        receiver_queue_size: int = 1000,
        max_total_receiver_queue_size_across_partitions: int = 50000,
        consumer_name: str | None = None,
        unacked_messages_timeout_ms: int | None = None,
        broker_consumer_stats_cache_time_ms: int = 30000,
        negative_ack_redelivery_delay_ms: int = DEFAULT_NEGATIVE_ACK_DELAY_MS,
        is_read_compacted: bool = False,
        properties: dict[str, str] | None = None,
        pattern_auto_discovery_period: int = 60,
        initial_position: InitialPosition | str = InitialPosition.Latest,
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
        crypto_failure_action: Any = ConsumerCryptoFailureAction.FAIL,
        is_pattern_topic: bool = False,
        *,
        subscription_properties: dict[str, str] | None = None,
        retry_enable: bool = False,
        negative_ack_redelivery_backoff: MultiplierRedeliveryBackoff | None = None,
        ack_timeout_redelivery_backoff: MultiplierRedeliveryBackoff | None = None,
        tick_duration_ms: int = 1000,
        priority_level: int = 0,
        consumer_lease_ms: int = DEFAULT_LEASE_MS,
        retry_delay_levels: str | Sequence[int] | None = None,
    ) -> Consumer:
        """Subscribe to a topic, a list of topics or a regex pattern of one namespace.

        Parameters are pulsar-client's; the keyword-only ones after ``is_pattern_topic`` are
        filepulsar's. ``consumer_type`` and ``initial_position`` also take either spelling of
        a member as a string (``"Key_Shared"`` or ``"KeyShared"``; :mod:`dispatch.modes`).

        Parameters
        ----------
        topic
            ``"t"``, ``["t1", "t2"]`` or ``re.compile("persistent://public/default/t-.*")``
            (re-listed every ``pattern_auto_discovery_period`` seconds; new topics are
            picked up, deleted ones dropped). Missing topics are auto-created.
        consumer_type
            ``ConsumerType.Exclusive`` (default; a second consumer gets ConsumerBusy),
            ``Failover``, ``Shared`` or ``KeyShared``.
        receiver_queue_size
            Messages fetched ahead of ``receive`` (claimed for this consumer on Shared).
        unacked_messages_timeout_ms
            Ack timeout (None/0: off): a message not acknowledged this long after it was
            received is redelivered, between the timeout and timeout + ``tick_duration_ms``.
        negative_ack_redelivery_delay_ms, negative_ack_redelivery_backoff
            Delay of a negatively acknowledged message (fixed, at least 100 ms; or
            ``backoff.next(redelivery_count)``).
        initial_position
            Where a new subscription starts (default Latest, as in Pulsar).
        start_message_id_inclusive
            Whether ``seek(message_id)`` delivers that message again.
        batch_receive_policy
            Limits of ``batch_receive``.
        key_shared_policy
            Selector mode and ranges for KeyShared.
        batch_index_ack_enabled
            Acknowledge single messages of a batch entry in storage (a redelivered batch
            then brings only its unacknowledged messages); off: the batch tracker acks the
            entry when all of it is acknowledged.
        dead_letter_policy
            Dead-letter topic for Shared/KeyShared (max redeliveries) and the limit of
            ``reconsume_later``.
        subscription_properties
            Stored when the subscription is created and fixed from then on. Keys are tags:
            a message whose properties carry tags (keys with value ``"TAGS"``) is delivered
            only if one of them is subscribed; others are acknowledged without delivery;
            messages without tags are always delivered (the vendor guide's tag filter).
        retry_enable
            Enable ``reconsume_later``: the consumer also subscribes to the retry-letter
            topic (``<topic>-<subscription>-RETRY``); max 16 retries without a policy.
        ack_timeout_redelivery_backoff
            Delay of ack-timeout redeliveries (default: at once).
        priority_level
            Failover: consumers of the best (lowest) level are eligible.
        consumer_lease_ms
            Lease this consumer renews; when it expires (the process died) other consumers
            take over its partitions and unacknowledged messages.
        retry_delay_levels
            The delay levels of ``reconsume_later(msg, delay_level=k)`` and of its
            increasing-level mode (the vendor guide's ``MESSAGE_DELAYLEVEL``; default
            ``"1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"``), or ms values.

        A ``schema`` decodes ``Message.value()`` and must be able to read the topic's schema
        (else :class:`IncompatibleSchema`). Encryption, compaction and replication options are
        refused when set; stats and chunk-queue tuning options are accepted and unused, and so is
        ``properties`` (Pulsar's consumer metadata, shown in broker stats; there is no broker
        here). It is not ``subscription_properties``, which has an effect (tags, above).

        Raises
        ------
        ConsumerBusy
            Exclusive subscription already in use, or a different type while consumers are
            connected.
        InvalidConfiguration
            (a ``ValueError``) For bad arguments or subscription properties that differ from
            the stored ones.
        """
        if not isinstance(topic, str | list | tuple | re.Pattern):
            raise InvalidConfiguration(
                "Argument 'topic' is expected to be of a type between (str, list, re.pattern), "
                f"got {type(topic).__name__}"
            )
        _check_type(str, subscription_name, "subscription_name")
        consumer_type = ConsumerType.parse(consumer_type, "consumer_type")
        for name, value in (
            ("receiver_queue_size", receiver_queue_size),
            (
                "max_total_receiver_queue_size_across_partitions",
                max_total_receiver_queue_size_across_partitions,
            ),
            ("broker_consumer_stats_cache_time_ms", broker_consumer_stats_cache_time_ms),
            ("negative_ack_redelivery_delay_ms", negative_ack_redelivery_delay_ms),
            ("pattern_auto_discovery_period", pattern_auto_discovery_period),
            ("max_pending_chunked_message", max_pending_chunked_message),
        ):
            _check_type(int, value, name)
        _check_type_or_none(str, consumer_name, "consumer_name")
        _check_type_or_none(int, unacked_messages_timeout_ms, "unacked_messages_timeout_ms")
        _check_type_or_none(dict, properties, "properties")
        initial_position = InitialPosition.parse(initial_position, "initial_position")
        for name, value in (
            ("is_read_compacted", is_read_compacted),
            (
                "auto_ack_oldest_chunked_message_on_queue_full",
                auto_ack_oldest_chunked_message_on_queue_full,
            ),
            ("start_message_id_inclusive", start_message_id_inclusive),
            ("batch_index_ack_enabled", batch_index_ack_enabled),
        ):
            _check_type(bool, value, name)
        _check_type_or_none(
            ConsumerBatchReceivePolicy, batch_receive_policy, "batch_receive_policy"
        )
        _check_type_or_none(ConsumerKeySharedPolicy, key_shared_policy, "key_shared_policy")
        _check_type(RegexSubscriptionMode, regex_subscription_mode, "regex_subscription_mode")
        _check_type_or_none(ConsumerDeadLetterPolicy, dead_letter_policy, "dead_letter_policy")
        value_schema = check_schema_arg(schema, producer=False)
        _check_unsupported(
            crypto_key_reader=crypto_key_reader,
            replicate_subscription_state_enabled=replicate_subscription_state_enabled,
            crypto_failure_action=crypto_failure_action,
        )
        c = Consumer(
            self._store,
            topic,
            subscription_name,
            consumer_type=consumer_type,
            receiver_queue_size=receiver_queue_size,
            consumer_name=consumer_name,
            unacked_messages_timeout_ms=unacked_messages_timeout_ms,
            tick_duration_ms=tick_duration_ms,
            ack_timeout_redelivery_backoff=ack_timeout_redelivery_backoff,
            negative_ack_redelivery_delay_ms=negative_ack_redelivery_delay_ms,
            negative_ack_redelivery_backoff=negative_ack_redelivery_backoff,
            pattern_auto_discovery_period=pattern_auto_discovery_period,
            initial_position=initial_position,
            start_message_id_inclusive=start_message_id_inclusive,
            batch_receive_policy=batch_receive_policy,
            key_shared_policy=key_shared_policy,
            batch_index_ack_enabled=batch_index_ack_enabled,
            regex_subscription_mode=regex_subscription_mode,
            dead_letter_policy=dead_letter_policy,
            retry_enable=retry_enable,
            subscription_properties=subscription_properties,
            priority_level=priority_level,
            consumer_lease_ms=consumer_lease_ms,
            retry_delay_levels=retry_delay_levels,
            is_read_compacted=is_read_compacted,
            message_listener=message_listener,
            is_pattern_topic=is_pattern_topic,
            clock=self._clock,
            schema=value_schema,
        )
        self._track(c)
        return c

    def create_reader(
        self,
        topic: str,
        start_message_id: MessageId,
        schema: Any = None,
        reader_listener: Any = None,
        receiver_queue_size: int = 1000,
        reader_name: str | None = None,
        subscription_role_prefix: str | None = None,
        is_read_compacted: bool = False,
        crypto_key_reader: Any = None,
        start_message_id_inclusive: bool = False,
        crypto_failure_action: Any = ConsumerCryptoFailureAction.FAIL,
    ) -> Reader:
        """Create a reader of ``topic`` starting at ``start_message_id``
        (``MessageId.earliest``, ``MessageId.latest`` or an id; exclusive unless
        ``start_message_id_inclusive``). A missing topic is auto-created per the namespace
        policies, as Pulsar does.

        Raises
        ------
        TopicNotFound
            If the topic does not exist and auto-creation is off.
        InvalidConfiguration
            (a ``ValueError``) For a wrongly typed argument or unsupported options
            (listener, encryption, compaction), or a schema that is not a
            :mod:`filepulsar.schema` schema.
        IncompatibleSchema
            If ``schema`` cannot read the topic's schema.
        """
        _check_type(str, topic, "topic")
        _check_type(int, receiver_queue_size, "receiver_queue_size")
        _check_type_or_none(str, reader_name, "reader_name")
        _check_type_or_none(str, subscription_role_prefix, "subscription_role_prefix")
        _check_type(bool, is_read_compacted, "is_read_compacted")
        _check_type(bool, start_message_id_inclusive, "start_message_id_inclusive")
        value_schema = check_schema_arg(schema, producer=False)
        _check_unsupported(
            reader_listener=reader_listener,
            crypto_key_reader=crypto_key_reader,
            crypto_failure_action=crypto_failure_action,
        )
        if not isinstance(start_message_id, MessageId):
            raise InvalidConfiguration(
                f"start_message_id must be a MessageId (MessageId.earliest, MessageId.latest "
                f"or a received id), got {start_message_id!r}"
            )
        r = Reader(
            self._store,
            topic,
            start_message_id,
            receiver_queue_size=receiver_queue_size,
            start_message_id_inclusive=start_message_id_inclusive,
            clock=self._clock,
            schema=value_schema,
            read_compacted=is_read_compacted,
        )
        self._track(r)
        return r

    def create_table_view(
        self,
        topic: str,
        subscription_name: str | None = None,
        schema: Any = None,
    ) -> TableView:
        """A table view of ``topic``: the latest value of every key, kept up to date (see
        :class:`~filepulsar.connector.client_tableview.TableView`). Returns once everything
        stored now is loaded. ``subscription_name`` is accepted as pulsar-client's and unused:
        the view reads without a subscription and holds back no retention.

        Raises
        ------
        InvalidConfiguration
            (a ``ValueError``) For a wrongly typed argument.
        """
        _check_type(str, topic, "topic")
        _check_type_or_none(str, subscription_name, "subscription_name")
        tv = TableView(self._store, topic, subscription_name, schema, clock=self._clock)
        self._track(tv)
        return tv

    def get_topic_partitions(self, topic: str) -> list[str]:
        """Partition names of a partitioned topic, or ``[topic]`` for a non-partitioned one.

        A missing topic is auto-created per the namespace policies first, as Pulsar's
        lookup does.

        Raises
        ------
        TopicNotFound
            If the topic does not exist and auto-creation is off.
        """
        _check_type(str, topic, "topic")
        t = TopicName.parse(topic)
        n = ensure_topic(self._store, t, auto_create=True)
        return [str(t.partition(i)) for i in range(n)] if n else [str(t)]

    def close(self) -> None:
        """Close every producer (flushing it), consumer and reader this client created."""
        with self._lock:
            self._closed = True
            handles, self._handles = self._handles, []
        errors: list[BaseException] = []
        for h in handles:
            try:
                h.close()
            except FilePulsarError as e:
                errors.append(e)
        if errors:
            raise errors[0]

    def shutdown(self) -> None:
        """Close without raising (pulsar-client's immediate shutdown)."""
        try:
            self.close()
        except FilePulsarError:
            pass

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
