"""Enums, policy classes and exceptions of the Python client, named as in pulsar-client.

Code written for pulsar-client keeps working with an import change: the enum members and the
policy classes' parameters have pulsar-client's names. Everything here is also importable from
:mod:`connector.client`.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from filepulsar.storage.errors import FilePulsarError, InvalidAckError, InvalidConfiguration

__all__ = [
    "AlreadyClosed",
    "BatchingType",
    "CompressionType",
    "ConsumerBatchReceivePolicy",
    "ConsumerDeadLetterPolicy",
    "ConsumerKeySharedPolicy",
    "ConsumerType",
    "CumulativeAcknowledgementNotAllowedError",
    "HashingScheme",
    "InitialPosition",
    "KeySharedMode",
    "PartitionsRoutingMode",
    "ProducerAccessMode",
    "RegexSubscriptionMode",
    "Timeout",
]


class ConsumerType(enum.Enum):
    """Subscription types (pulsar-client's ``ConsumerType``)."""

    Exclusive = 0
    Shared = 1
    Failover = 2
    KeyShared = 3


class InitialPosition(enum.Enum):
    """Where a new subscription starts."""

    Latest = 0
    Earliest = 1


class CompressionType(enum.Enum):
    """Entry payload codecs (numbered as Pulsar's ``CompressionType``)."""

    NONE = 0
    LZ4 = 1
    ZLib = 2
    ZSTD = 3
    SNAPPY = 4


class PartitionsRoutingMode(enum.Enum):
    """How a producer picks the partition of a message without a key."""

    UseSinglePartition = 0
    RoundRobinDistribution = 1
    CustomPartition = 2


class HashingScheme(enum.Enum):
    """Hash of a message key for partition routing (Java client's ``HashingScheme``)."""

    JavaStringHash = 0
    Murmur3_32Hash = 1


class ProducerAccessMode(enum.Enum):
    """Who may produce to a topic alongside this producer."""

    Shared = 0
    Exclusive = 1
    WaitForExclusive = 2


class BatchingType(enum.Enum):
    """``Default`` batches messages in arrival order; ``KeyBased`` keeps one batch per key
    (use it for topics consumed by Key_Shared subscriptions)."""

    Default = 0
    KeyBased = 1


class KeySharedMode(enum.Enum):
    """Key_Shared selector family: hash ranges assigned automatically, or fixed ranges."""

    AutoSplit = 0
    Sticky = 1


class RegexSubscriptionMode(enum.Enum):
    """Which topics a pattern subscription considers."""

    PersistentOnly = 0
    NonPersistentOnly = 1
    AllTopics = 2


class Timeout(FilePulsarError):
    """``receive``/``read_next`` found no message within ``timeout_millis``."""


class AlreadyClosed(FilePulsarError):
    """The consumer, reader or client was used after ``close``."""


class CumulativeAcknowledgementNotAllowedError(InvalidAckError):
    """``acknowledge_cumulative`` on a Shared or Key_Shared subscription."""


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
        Default ``<topic>-<subscription>-DLQ``.
    initial_subscription_name
        If set, this subscription is created on the dead-letter topic (at its start) when the
        dead-letter producer is, so the messages are retained until someone reads them.
    retry_letter_topic
        Default ``<topic>-<subscription>-RETRY`` (filepulsar extension; Java's
        ``retryLetterTopic``).

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
        self._dlq = dead_letter_topic
        self._initial = initial_subscription_name
        self._retry = retry_letter_topic

    @property
    def max_redeliver_count(self) -> int:
        return self._max

    @property
    def dead_letter_topic(self) -> str | None:
        return self._dlq

    @property
    def initial_subscription_name(self) -> str | None:
        return self._initial

    @property
    def retry_letter_topic(self) -> str | None:
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
        ``KeySharedMode.AutoSplit`` (default) or ``KeySharedMode.Sticky``.
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
        key_shared_mode: KeySharedMode = KeySharedMode.AutoSplit,
        allow_out_of_order_delivery: bool = False,
        sticky_ranges: Sequence[tuple[int, int]] | None = None,
        use_consistent_hashing: bool = True,
    ) -> None:
        if not isinstance(key_shared_mode, KeySharedMode):
            raise InvalidConfiguration(
                f"key_shared_mode must be KeySharedMode.AutoSplit or KeySharedMode.Sticky, "
                f"got {key_shared_mode!r}"
            )
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
