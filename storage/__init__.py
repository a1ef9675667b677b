"""The managed ledger on a filesystem: topics as ledger/entry files on any fsspec backend.

Public surface (everything else is internal)::

    open_blob_store(root)                      local path, file://, memory://, s3://
    TopicName, MessageId, Codec, Policies
    create_topic / ensure_topic / list_topics / delete_topic / partitions_of
    set_namespace_policies / set_topic_policies / effective_policies
    Producer, Result                            writing
    Reader, ManagedLedger, entries_to_table     reading
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from storage.blobstore import BlobStore, open_blob_store
    from storage.codec import Codec
    from storage.errors import (
        ChecksumError,
        CommitConflict,
        ConsumerBusy,
        CorruptDataError,
        DataLossError,
        FilePulsarError,
        IncompatibleFormat,
        InvalidAckError,
        InvalidConfiguration,
        InvalidTopicName,
        MessageTooBig,
        ProducerBusy,
        ProducerClosed,
        ProducerFenced,
        ProducerQueueIsFull,
        SubscriptionNotFound,
        TopicAlreadyExists,
        TopicNotFound,
    )
    from storage.ledger import ManagedLedger, Position
    from storage.messageid import MessageId
    from storage.names import TopicName
    from storage.policies import (
        Policies,
        effective_policies,
        namespace_policies,
        set_namespace_policies,
        set_topic_policies,
    )
    from storage.producer import Producer, Result
    from storage.reader import READ_SCHEMA, ChunkAssembler, Reader, entries_to_table
    from storage.topics import (
        TopicInfo,
        create_topic,
        delete_topic,
        ensure_topic,
        list_namespaces,
        list_topics,
        partitions_of,
    )

#: Where each public name lives; modules load on first use (Spark workers import little).
_LAZY = {
    "BlobStore": "storage.blobstore",
    "ChecksumError": "storage.errors",
    "ChunkAssembler": "storage.reader",
    "Codec": "storage.codec",
    "CommitConflict": "storage.errors",
    "ConsumerBusy": "storage.errors",
    "CorruptDataError": "storage.errors",
    "DataLossError": "storage.errors",
    "FilePulsarError": "storage.errors",
    "IncompatibleFormat": "storage.errors",
    "InvalidAckError": "storage.errors",
    "InvalidConfiguration": "storage.errors",
    "InvalidTopicName": "storage.errors",
    "ManagedLedger": "storage.ledger",
    "MessageId": "storage.messageid",
    "MessageTooBig": "storage.errors",
    "Policies": "storage.policies",
    "Position": "storage.ledger",
    "Producer": "storage.producer",
    "ProducerBusy": "storage.errors",
    "ProducerClosed": "storage.errors",
    "ProducerFenced": "storage.errors",
    "ProducerQueueIsFull": "storage.errors",
    "READ_SCHEMA": "storage.reader",
    "Reader": "storage.reader",
    "Result": "storage.producer",
    "SubscriptionNotFound": "storage.errors",
    "TopicAlreadyExists": "storage.errors",
    "TopicInfo": "storage.topics",
    "TopicName": "storage.names",
    "TopicNotFound": "storage.errors",
    "create_topic": "storage.topics",
    "delete_topic": "storage.topics",
    "effective_policies": "storage.policies",
    "ensure_topic": "storage.topics",
    "entries_to_table": "storage.reader",
    "list_namespaces": "storage.topics",
    "list_topics": "storage.topics",
    "namespace_policies": "storage.policies",
    "open_blob_store": "storage.blobstore",
    "partitions_of": "storage.topics",
    "set_namespace_policies": "storage.policies",
    "set_topic_policies": "storage.policies",
}

__all__ = [
    "READ_SCHEMA",
    "BlobStore",
    "ChecksumError",
    "ChunkAssembler",
    "Codec",
    "CommitConflict",
    "ConsumerBusy",
    "CorruptDataError",
    "DataLossError",
    "FilePulsarError",
    "IncompatibleFormat",
    "InvalidAckError",
    "InvalidConfiguration",
    "InvalidTopicName",
    "ManagedLedger",
    "MessageId",
    "MessageTooBig",
    "Policies",
    "Position",
    "Producer",
    "ProducerBusy",
    "ProducerClosed",
    "ProducerFenced",
    "ProducerQueueIsFull",
    "Reader",
    "Result",
    "SubscriptionNotFound",
    "TopicAlreadyExists",
    "TopicInfo",
    "TopicName",
    "TopicNotFound",
    "create_topic",
    "delete_topic",
    "effective_policies",
    "ensure_topic",
    "entries_to_table",
    "list_namespaces",
    "list_topics",
    "namespace_policies",
    "open_blob_store",
    "partitions_of",
    "set_namespace_policies",
    "set_topic_policies",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
