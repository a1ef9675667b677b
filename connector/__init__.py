"""The ways in and out of filepulsar: the Spark data source ``filepulsar`` (see
:mod:`filepulsar.connector.datasource`) and a Python client shaped like pulsar-client's
(:mod:`filepulsar.connector.client`), whose names are re-exported here.

The re-exports load on first use, so a Spark worker that imports only the data source does not
pay for the client's modules."""

# ruff: noqa: F405  (the names come from the star import below, for type checkers only)
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from filepulsar.connector.client import *  # noqa: F403

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


def __getattr__(name: str) -> Any:
    if name in __all__:
        from filepulsar.connector import client

        return getattr(client, name)
    raise AttributeError(f"module 'filepulsar.connector' has no attribute {name!r}")
