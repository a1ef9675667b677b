"""The storage layer's exceptions, named after the domain condition that raised them.

Every message names the thing at fault (topic, ledger, entry, key or option) and, where it
applies, what was expected and what was found.
"""

from __future__ import annotations

# The root (and the two conditions dispatch raises) live at the bottom, in dispatch.errors:
# the same classes, re-exported here with the rest of the storage layer's.
from filepulsar.dispatch.errors import ConsumerAssignError as ConsumerAssignError
from filepulsar.dispatch.errors import FilePulsarError as FilePulsarError
from filepulsar.dispatch.errors import InvalidConfiguration as InvalidConfiguration
from filepulsar.dispatch.errors import PulsarException as PulsarException


class StorageError(FilePulsarError):
    """A blob-store operation failed (an OS or backend error); the message names the URL and
    the operation, and -- when raised while reading a topic -- the topic, ledger and entry.

    ``topic``, ``ledger_id`` and ``entry_id`` are set when the failure is located in a topic.
    """

    def __init__(
        self, message: str, *, topic: str = "", ledger_id: int = -1, entry_id: int = -1
    ) -> None:
        super().__init__(message)
        self.topic = topic
        self.ledger_id = ledger_id
        self.entry_id = entry_id


#: The blob store's name for :class:`StorageError` (``filepulsar.storage.blobstore`` re-exports it).
BlobStoreError = StorageError


class BlobNotFound(StorageError):
    """The key names no blob."""


class BlobExists(StorageError):
    """An exclusive create found the key already present."""


class BlobTruncated(StorageError):
    """A blob is shorter than a byte range read from it: bytes it held are gone."""


class InvalidTopicName(FilePulsarError, ValueError):
    """A topic, tenant or namespace name is malformed or could escape the storage root."""


class IncompatibleSchema(FilePulsarError):
    """A producer's or consumer's schema is incompatible with the topic's schemas under the
    compatibility strategy, or a value does not match the schema it is encoded with."""


class TopicNotFound(FilePulsarError):
    """The topic does not exist and auto-creation is off (or it was asked for explicitly)."""


class TopicAlreadyExists(FilePulsarError):
    """A create found the topic (or a partitioned topic of that name) already there."""


class ProducerBusy(FilePulsarError):
    """Another live producer holds the name or an exclusive access mode on the topic."""


class ProducerFenced(FilePulsarError):
    """This producer lost its right to write: an exclusive producer took the topic over."""


class ProducerClosed(FilePulsarError):
    """An operation was attempted on a producer that is closed."""


class ProducerQueueIsFull(FilePulsarError):
    """The producer's pending queue is full and ``block_if_queue_full`` is off."""


class MessageTooBig(FilePulsarError, ValueError):
    """A message is larger than the topic's max message size and chunking is off."""


class CommitConflict(FilePulsarError):
    """A metadata commit kept losing the put-if-absent race past the retry limit."""


class CommitOutcomeUnknown(CommitConflict):
    """A commit was written but whether it is committed can no longer be told (garbage
    collection removed the evidence while the writer was paused): it may or may not be."""


class CorruptDataError(FilePulsarError):
    """Stored bytes fail their checksum or cannot be parsed; the message names the location."""

    def __init__(self, message: str, *, topic: str = "", ledger_id: int = -1, entry_id: int = -1):
        super().__init__(message)
        self.topic = topic
        self.ledger_id = ledger_id
        self.entry_id = entry_id


class ChecksumError(CorruptDataError):
    """An entry's CRC32C does not match its bytes."""


class DataLossError(FilePulsarError):
    """Data a reader was asked for is gone (deleted by retention or unreadable).

    ``ledger_id``: the ledger whose index or data is gone, where one is (-1: not said). A
    reader that read the manifest before retention deleted that ledger finds it trimmed in
    the newest manifest: a race to read on after, not a loss."""

    def __init__(self, message: str, *, ledger_id: int = -1):
        super().__init__(message)
        self.ledger_id = ledger_id


class IncompatibleFormat(FilePulsarError):
    """Stored data carries a format version this code cannot read."""


class ConsumerBusy(FilePulsarError):
    """An Exclusive subscription already has a live consumer (or the types disagree)."""


class SubscriptionNotFound(FilePulsarError):
    """The subscription does not exist."""


class InvalidAckError(FilePulsarError, ValueError):
    """An acknowledgement the subscription type does not allow (e.g. cumulative on Shared)."""


class TenantNotFound(FilePulsarError):
    """The tenant has no namespaces, topics or registration under the root."""


class NamespaceNotFound(FilePulsarError):
    """The namespace has no topics and no policies under the root."""


class AlreadyExists(FilePulsarError):
    """A create found the tenant, namespace or subscription already there."""


class NotAllowedError(FilePulsarError):
    """A rule the broker enforces refuses the operation (pulsar-client's ``NotAllowedError``,
    pulsar-admin's HTTP 405): a delivery delay beyond the topic's maximum, a skip on a
    partitioned topic."""


class NotEmpty(FilePulsarError):
    """A tenant or namespace cannot be deleted while it still holds namespaces or topics."""
