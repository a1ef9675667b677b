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
filepulsar takes. Producer leases assume loosely synchronised clocks between processes;
consumer leases are timed by each process's monotonic clock (storage/consumer_leases.py).

This module owns :class:`Client`'s construction and lifecycle and the public names (it
re-exports the client's whole vocabulary, listed in ``__all__``); its factories live in its
base classes: ``create_producer`` and :class:`Producer`
(:mod:`filepulsar.connector.client.producer`), ``subscribe``
(:mod:`filepulsar.connector.client.subscribe`), ``create_reader``/``create_table_view`` and
:class:`Reader` (:mod:`filepulsar.connector.client.reader`), their shared state
(:mod:`filepulsar.connector.client.base`).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from filepulsar.connector.client.base import ClientCore
from filepulsar.connector.client.consumer import Consumer
from filepulsar.connector.client.message import Message
from filepulsar.connector.client.producer import Producer, ProducerFactory
from filepulsar.connector.client.reader import Reader, ReaderFactory
from filepulsar.connector.client.subscribe import ConsumerFactory
from filepulsar.connector.client.tableview import TableView
from filepulsar.connector.client.types import (
    AlreadyClosed,
    AuthenticationError,
    AuthorizationError,
    BatchingType,
    BrokerMetadataError,
    BrokerPersistenceError,
    ChecksumError,
    CompressionType,
    ConnectError,
    ConsoleLogger,
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
    CryptoKeyReader,
    CumulativeAcknowledgementNotAllowedError,
    ErrorGettingAuthenticationData,
    FileLogger,
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
    LoggerLevel,
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
    check_type,
    check_type_or_none,
)
from filepulsar.dispatch.redelivery import (
    MultiplierRedeliveryBackoff,
)
from filepulsar.storage.blobstore import open_blob_store
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.errors import FilePulsarError
from filepulsar.storage.messageid import MessageId
from filepulsar.storage.names import TopicName
from filepulsar.storage.producer import OutgoingMessage, Result
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
    "ConsoleLogger",
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
    "CryptoKeyReader",
    "CumulativeAcknowledgementNotAllowedError",
    "ErrorGettingAuthenticationData",
    "FileLogger",
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
    "LoggerLevel",
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


class Client(ProducerFactory, ConsumerFactory, ReaderFactory):
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
        permissions, S3 credentials in ``storage_options``). ``logger`` is the exception:
        a :class:`ConsoleLogger` or :class:`FileLogger` adds a handler at its level to the
        ``filepulsar`` logger while the client is open (a ``logging.Logger`` is accepted
        and changes nothing: filepulsar logs through Python's logging already).
    storage_options
        fsspec options for the root (for S3: ``endpoint_url``, ``key``, ``secret`` ...).
    clock
        Wall-clock milliseconds used for publish times, producer leases, delays and timeouts
        (tests inject one); defaults to the system clock. A whole
        :class:`~filepulsar.dispatch.clock.Clock` (a ``ManualClock`` in tests) also times the
        waits of ``receive``, ``batch_receive`` and ``read_next`` (so nothing waits for real)
        and consumer leases, which are judged by monotonic time (the system's otherwise).

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
            check_type(int, value, name)
        for name, value in (
            ("use_tls", use_tls),
            ("tls_allow_insecure_connection", tls_allow_insecure_connection),
            ("tls_validate_hostname", tls_validate_hostname),
        ):
            check_type(bool, value, name)
        for name, text in (
            ("log_conf_file_path", log_conf_file_path),
            ("tls_trust_certs_file_path", tls_trust_certs_file_path),
            ("listener_name", listener_name),
            ("tls_private_key_file_path", tls_private_key_file_path),
            ("tls_certificate_file_path", tls_certificate_file_path),
        ):
            check_type_or_none(str, text, name)
        if authentication is not None and isinstance(
            authentication, str | bytes | int | float | list | tuple | dict
        ):
            # pulsar-client takes only an Authentication object here; a plain value is
            # always a mistake, even though authentication has no effect without a broker.
            raise InvalidConfiguration(
                "authentication must be an authentication object (pulsar-client's "
                f"Authentication...; unused here) or None, got {authentication!r}"
            )
        if logger is not None and not isinstance(
            logger, logging.Logger | ConsoleLogger | FileLogger
        ):
            raise InvalidConfiguration(
                "Logger is expected to be either None, logging.Logger, ConsoleLogger or "
                f"FileLogger, got {logger!r}"
            )
        check_type_or_none(dict, storage_options, "storage_options")
        root = _root_of(service_url)
        try:
            store = open_blob_store(root, storage_options=storage_options)
        except ValueError as e:
            raise InvalidConfiguration(f"cannot open storage root {service_url!r}: {e}") from e
        self._core = ClientCore(store, clock)
        self._log_handler = _log_handler(logger)

    @property
    def store(self) -> BlobStore:
        """The blob store under the root (for admin functions of :mod:`storage`)."""
        return self._core.store

    def get_topic_partitions(self, topic: str) -> list[str]:
        """Partition names of a partitioned topic, or ``[topic]`` for a non-partitioned one.

        A missing topic is auto-created per the namespace policies first, as Pulsar's
        lookup does.

        Raises
        ------
        TopicNotFound
            If the topic does not exist and auto-creation is off.
        """
        check_type(str, topic, "topic")
        t = TopicName.parse(topic)
        n = ensure_topic(self._core.store, t, auto_create=True)
        return [str(t.partition(i)) for i in range(n)] if n else [str(t)]

    def close(self) -> None:
        """Close every producer (flushing it), consumer and reader this client created."""
        errors = self._core.close_handles()
        if self._log_handler is not None:
            logging.getLogger("filepulsar").removeHandler(self._log_handler)
            self._log_handler.close()
            self._log_handler = None
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


def _log_handler(logger: object) -> logging.Handler | None:
    """pulsar-client's :class:`ConsoleLogger` / :class:`FileLogger` as a handler on the
    ``filepulsar`` logger at the logger's level (the ``filepulsar`` logger's own level, as
    Python's logging sets it, still decides what reaches it); None for anything else."""
    handler: logging.Handler
    if isinstance(logger, ConsoleLogger):
        handler = logging.StreamHandler(sys.stdout)
    elif isinstance(logger, FileLogger):
        handler = logging.FileHandler(logger.log_file)
    else:
        return None
    handler.setLevel(logger.log_level.logging_level)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger("filepulsar").addHandler(handler)
    return handler
