"""Enums, policy classes and exceptions of the Python client, named as in pulsar-client.

Code written for pulsar-client keeps working with an import change: the enum members and the
policy classes' parameters have pulsar-client's names. The closed sets (``ConsumerType``,
``PartitionsRoutingMode`` ...) are :mod:`filepulsar.dispatch.modes`' enums, re-exported here; each
also parses the wire spelling (``ConsumerType.parse("Key_Shared")``). Everything here is also
importable from :mod:`filepulsar.connector.client`.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Sequence
from typing import Any

from filepulsar.dispatch.modes import (
    BatchingType,
    CompressionType,
    ConsumerType,
    HashingScheme,
    InitialPosition,
    KeySharedMode,
    PartitionsRoutingMode,
    ProducerAccessMode,
)
from filepulsar.storage.errors import (
    ChecksumError,
    ConsumerAssignError,
    ConsumerBusy,
    FilePulsarError,
    IncompatibleFormat,
    IncompatibleSchema,
    InvalidAckError,
    InvalidConfiguration,
    InvalidTopicName,
    MessageTooBig,
    NotAllowedError,
    ProducerBusy,
    ProducerFenced,
    ProducerQueueIsFull,
    PulsarException,
    SubscriptionNotFound,
    TopicNotFound,
)

__all__ = [
    "AlreadyClosed",
    "AuthenticationError",
    "AuthorizationError",
    "BatchingType",
    "BrokerMetadataError",
    "BrokerPersistenceError",
    "ChecksumError",
    "CompressionType",
    "ConnectError",
    "ConsoleLogger",
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
    "MessageTooBig",
    "NotAllowedError",
    "NotConnected",
    "OperationNotSupported",
    "PartitionsRoutingMode",
    "ProducerAccessMode",
    "ProducerBlockedQuotaExceededError",
    "ProducerBlockedQuotaExceededException",
    "ProducerBusy",
    "ProducerFenced",
    "ProducerNotInitialized",
    "ProducerQueueIsFull",
    "PulsarException",
    "ReadError",
    "RegexSubscriptionMode",
    "ServiceUnitNotReady",
    "SubscriptionNotFound",
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


class RegexSubscriptionMode(enum.Enum):
    """Which topics a pattern subscription considers."""

    PersistentOnly = 0
    NonPersistentOnly = 1
    AllTopics = 2


class LoggerLevel(enum.Enum):
    """The level of a :class:`ConsoleLogger` or :class:`FileLogger` (pulsar-client's enum)."""

    Debug = 0
    Info = 1
    Warn = 2
    Error = 3

    @property
    def logging_level(self) -> int:
        """The matching level of Python's :mod:`logging`."""
        return (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR)[self.value]


class ConsoleLogger:
    """A logger that writes the client's log on standard output (pulsar-client's class):
    ``Client(url, logger=ConsoleLogger(LoggerLevel.Warn))``.

    Here it is a :class:`logging.StreamHandler` on the ``filepulsar`` logger, at
    ``log_level``, added while the client is open.
    """

    def __init__(self, log_level: LoggerLevel = LoggerLevel.Info) -> None:
        check_type(LoggerLevel, log_level, "log_level")
        self.log_level = log_level


class FileLogger:
    """A logger that writes the client's log to ``log_file`` (pulsar-client's class).

    Here it is a :class:`logging.FileHandler` on the ``filepulsar`` logger, at
    ``log_level``, added while the client is open.
    """

    def __init__(self, log_level: LoggerLevel, log_file: str) -> None:
        check_type(LoggerLevel, log_level, "log_level")
        check_type(str, log_file, "log_file")
        self.log_level = log_level
        self.log_file = log_file


class CryptoKeyReader:
    """pulsar-client's default crypto key reader: the paths of a public and a private key.

    filepulsar does not encrypt messages end to end: a producer or consumer given one is
    refused with :class:`OperationNotSupported` at ``create_producer`` / ``subscribe`` /
    ``create_reader``, the error pulsar-client raises for a feature its build lacks. Making
    one works, so code that builds it before deciding whether to use it runs.
    """

    def __init__(self, public_key_path: str, private_key_path: str) -> None:
        check_type(str, public_key_path, "public_key_path")
        check_type(str, private_key_path, "private_key_path")
        self.public_key_path = public_key_path
        self.private_key_path = private_key_path


class ConsumerCryptoFailureAction(enum.Enum):
    """What a consumer does with a message it cannot decrypt (pulsar-client's enum; no
    message is encrypted here, so it never applies)."""

    FAIL = 0
    DISCARD = 1
    CONSUME = 2


# ---------------------------------------------------------------------------- exceptions
# pulsar-client's exception names (its ``pulsar.exceptions``), mapped onto filepulsar's tree:
# the root is FilePulsarError; conditions filepulsar already has keep their storage class
# (the same object under pulsar-client's name); the rest are defined here. Those marked
# "never raised" name broker, network, authentication, schema, encryption or transaction
# conditions that do not exist without a broker; they exist so ``except`` clauses of
# pulsar-client code keep working.

#: Stored data of a format version this code cannot read.
UnsupportedVersionError = IncompatibleFormat


class Timeout(FilePulsarError):
    """``receive``/``read_next`` found no message within ``timeout_millis``."""


class AlreadyClosed(FilePulsarError):
    """The consumer, reader or client was used after ``close``."""


class CumulativeAcknowledgementNotAllowedError(InvalidAckError):
    """``acknowledge_cumulative`` on a Shared or Key_Shared subscription."""


class Interrupted(FilePulsarError):
    """A blocking ``receive``/``batch_receive``/``read_next`` was interrupted (Ctrl-C)."""


class InvalidUrl(InvalidConfiguration):
    """The service URL is not a storage root (e.g. a broker's ``pulsar://`` URL)."""


class OperationNotSupported(InvalidConfiguration):
    """An option or operation filepulsar does not support (schemas, encryption ...)."""


class UnknownError(FilePulsarError):
    """An unexpected failure (e.g. a ``send_async`` whose write failed)."""


class ConnectError(FilePulsarError):
    """The storage root cannot be reached."""


class NotConnected(FilePulsarError):
    """Never raised: no connection to lose."""


class LookupError(FilePulsarError):  # pulsar-client's name (shadows the builtin here)
    """Never raised: no topic lookup."""


class ReadError(FilePulsarError):
    """Never raised: storage read failures are CorruptDataError or DataLossError."""


class AuthenticationError(FilePulsarError):
    """Never raised: no broker authentication."""


class AuthorizationError(FilePulsarError):
    """Never raised: no broker authorization."""


class ErrorGettingAuthenticationData(FilePulsarError):
    """Never raised: no broker authentication."""


class BrokerMetadataError(FilePulsarError):
    """Never raised: no broker."""


class BrokerPersistenceError(FilePulsarError):
    """Never raised: no broker."""


class InvalidMessage(FilePulsarError):
    """Never raised."""


class ConsumerNotInitialized(FilePulsarError):
    """Never raised: a consumer is ready when ``subscribe`` returns."""


class ProducerNotInitialized(FilePulsarError):
    """Never raised: a producer is ready when ``create_producer`` returns."""


class TooManyLookupRequestException(FilePulsarError):
    """Never raised: no lookups."""


class ServiceUnitNotReady(FilePulsarError):
    """Never raised: no broker bundles."""


class ProducerBlockedQuotaExceededError(FilePulsarError):
    """Never raised: no backlog quotas."""


class ProducerBlockedQuotaExceededException(FilePulsarError):
    """Never raised: no backlog quotas."""


class ConsumerNotFound(FilePulsarError):
    """Never raised."""


class TopicTerminated(FilePulsarError):
    """Never raised: topics cannot be terminated."""


class CryptoError(FilePulsarError):
    """Never raised: encryption is not supported."""


class TransactionCoordinatorNotFoundError(FilePulsarError):
    """Never raised: no transactions."""


class InvalidTxnStatusError(FilePulsarError):
    """Never raised: no transactions."""


class TransactionConflict(FilePulsarError):
    """Never raised: no transactions."""


class TransactionNotFound(FilePulsarError):
    """Never raised: no transactions."""


class MemoryBufferIsFull(FilePulsarError):
    """Never raised: the producer queue's limit is ProducerQueueIsFull."""


def check_type(kind: Any, value: object, name: str) -> None:
    """pulsar-client's argument check: a ``ValueError`` (InvalidConfiguration) naming the
    argument ``name`` unless ``value`` is a ``kind`` (a bool is not an ``int`` here)."""
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise InvalidConfiguration(
            f"Argument {name} is expected to be of type '{kind.__name__}' and not "
            f"'{type(value).__name__}'"
        )


def check_type_or_none(kind: Any, value: object, name: str) -> None:
    """pulsar-client's argument check of an optional argument (None passes)."""
    if value is not None:
        check_type(kind, value, name)


def _positive_int(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidConfiguration(f"{what} must be an integer >= 1, got {value!r}")
    return value


class ConsumerDeadLetterPolicy:
    """Dead-letter (and retry-letter) configuration of a consumer.

    Parameters
    ----------
    max_redeliver_count
        Deliveries an application may fail: it sees redelivery counts ``0 .. max``; when the
        delivery with count ``max`` is negatively acknowledged or times out (Shared and
        Key_Shared), the message goes to the dead-letter topic. Also the most
        ``reconsume_later`` retries of a message. Must be >= 1.
    dead_letter_topic
        Default ``""``: ``<topic>-<subscription>-DLQ``.
    initial_subscription_name
        If set, this subscription is created on the dead-letter topic (at its start) when the
        dead-letter producer is, so the messages are retained until someone reads them.
    retry_letter_topic
        Default ``""``: ``<topic>-<subscription>-RETRY`` (filepulsar extension; Java's
        ``retryLetterTopic``).

    Unset names read as ``""``, as in pulsar-client.

    Raises
    ------
    InvalidConfiguration
        If ``max_redeliver_count`` is not an integer >= 1.
    """

    def __init__(
        self,
        max_redeliver_count: int,
        dead_letter_topic: str | None = None,
        initial_subscription_name: str | None = None,
        retry_letter_topic: str | None = None,
    ) -> None:
        self._max = _positive_int(max_redeliver_count, "max_redeliver_count")
        for name, value in (
            ("dead_letter_topic", dead_letter_topic),
            ("initial_subscription_name", initial_subscription_name),
            ("retry_letter_topic", retry_letter_topic),
        ):
            check_type_or_none(str, value, name)
        self._dlq = dead_letter_topic or ""
        self._initial = initial_subscription_name or ""
        self._retry = retry_letter_topic or ""

    @property
    def max_redeliver_count(self) -> int:
        return self._max

    @property
    def dead_letter_topic(self) -> str:
        return self._dlq

    @property
    def initial_subscription_name(self) -> str:
        return self._initial

    @property
    def retry_letter_topic(self) -> str:
        return self._retry

    def __repr__(self) -> str:
        return (
            f"ConsumerDeadLetterPolicy(max_redeliver_count={self._max}, "
            f"dead_letter_topic={self._dlq!r}, initial_subscription_name={self._initial!r}, "
            f"retry_letter_topic={self._retry!r})"
        )


class ConsumerKeySharedPolicy:
    """Key_Shared configuration of a consumer.

    Parameters
    ----------
    key_shared_mode
        ``KeySharedMode.AutoSplit`` (default) or ``KeySharedMode.Sticky``, or either's
        spelling (``"AUTO_SPLIT"``, ``"Sticky"``; :func:`filepulsar.dispatch.modes.parse_mode`).
    allow_out_of_order_delivery
        Accepted for compatibility; ordering per key is always kept (a hash moving to another
        consumer waits until the previous owner's pending messages of it are acknowledged).
    sticky_ranges
        Sticky mode only: inclusive ``(start, end)`` hash ranges within ``[0, 65535]``.
    use_consistent_hashing
        AutoSplit only (filepulsar extension; Pulsar's broker setting
        ``subscriptionKeySharedUseConsistentHashing``): consistent hashing (default) or
        auto-split hash ranges. Fixed by the first consumer of the subscription.

    Raises
    ------
    InvalidConfiguration
        If Sticky mode has no ranges, ranges are given for AutoSplit, or a range is outside
        ``[0, 65535]`` or reversed.
    """

    def __init__(
        self,
        key_shared_mode: KeySharedMode | str = KeySharedMode.AutoSplit,
        allow_out_of_order_delivery: bool = False,
        sticky_ranges: Sequence[tuple[int, int]] | None = None,
        use_consistent_hashing: bool = True,
    ) -> None:
        key_shared_mode = KeySharedMode.parse(key_shared_mode, "key_shared_mode")
        if key_shared_mode is KeySharedMode.Sticky and not sticky_ranges:
            raise InvalidConfiguration(
                "key_shared_mode Sticky needs sticky_ranges, e.g. [(0, 32767)]"
            )
        if key_shared_mode is KeySharedMode.AutoSplit and sticky_ranges:
            raise InvalidConfiguration("sticky_ranges apply to key_shared_mode Sticky only")
        ranges = [(int(s), int(e)) for s, e in sticky_ranges or ()]
        for s, e in ranges:
            if not 0 <= s <= e <= 65535:
                raise InvalidConfiguration(
                    f"sticky range ({s}, {e}) is invalid: need 0 <= start <= end <= 65535"
                )
        self._mode = key_shared_mode
        self._ooo = bool(allow_out_of_order_delivery)
        self._ranges = ranges
        self._consistent = bool(use_consistent_hashing)

    @property
    def key_shared_mode(self) -> KeySharedMode:
        return self._mode

    @property
    def allow_out_of_order_delivery(self) -> bool:
        return self._ooo

    @property
    def sticky_ranges(self) -> list[tuple[int, int]]:
        return list(self._ranges)

    @property
    def use_consistent_hashing(self) -> bool:
        return self._consistent


class ConsumerBatchReceivePolicy:
    """Limits of one ``batch_receive``: it returns once ``max_num_message`` messages or
    ``max_num_bytes`` bytes are collected, or ``timeout_ms`` has passed (then with what it
    has, possibly nothing). A negative value means no limit; at least one limit must be set.

    Raises
    ------
    InvalidConfiguration
        If all three are negative.
    """

    def __init__(
        self,
        max_num_message: int = -1,
        max_num_bytes: int = 10 * 1024 * 1024,
        timeout_ms: int = 100,
    ) -> None:
        if max_num_message < 0 and max_num_bytes < 0 and timeout_ms < 0:
            raise InvalidConfiguration(
                "batch receive policy needs at least one of max_num_message, max_num_bytes, "
                "timeout_ms to be >= 0"
            )
        if max_num_message == 0 or max_num_bytes == 0:
            raise InvalidConfiguration("max_num_message and max_num_bytes must not be 0")
        self.max_num_message = int(max_num_message)
        self.max_num_bytes = int(max_num_bytes)
        self.timeout_ms = int(timeout_ms)

    def __repr__(self) -> str:
        return (
            f"ConsumerBatchReceivePolicy({self.max_num_message}, {self.max_num_bytes}, "
            f"{self.timeout_ms})"
        )
