"""The managed ledger on a filesystem: topics as ledger/entry files on any fsspec backend.

Public surface (everything else is internal)::

    open_blob_store(root)                      local path, file://, memory://, s3://
    TopicName, MessageId, Codec, Policies
    create_topic / ensure_topic / list_topics / delete_topic / partitions_of /
    update_partitioned_topic
    set_namespace_policies / set_topic_policies / effective_policies
    Producer, Result                            writing
    Reader, ManagedLedger, entries_to_table     reading
"""

from filepulsar.storage.blobstore import open_blob_store
from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.codec import Codec
from filepulsar.storage.errors import (
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
    PulsarException,
    StorageError,
    SubscriptionNotFound,
    TopicAlreadyExists,
    TopicNotFound,
)
from filepulsar.storage.ledger import ManagedLedger, Position
from filepulsar.storage.messageid import MessageId
from filepulsar.storage.names import TopicName
from filepulsar.storage.policies import (
    Policies,
    effective_policies,
    namespace_policies,
    set_namespace_policies,
    set_topic_policies,
)
from filepulsar.storage.producer import Producer, Result
from filepulsar.storage.reader import READ_SCHEMA, ChunkAssembler, Reader, entries_to_table
from filepulsar.storage.topics import (
    TopicInfo,
    create_topic,
    delete_topic,
    ensure_topic,
    list_namespaces,
    list_topics,
    partitions_of,
    update_partitioned_topic,
)

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
    "PulsarException",
    "Reader",
    "Result",
    "StorageError",
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
    "update_partitioned_topic",
]
