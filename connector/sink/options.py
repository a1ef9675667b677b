"""The sink's configuration: Spark options and the input schema, checked once on the driver.

:func:`filepulsar.connector.sink.writers.sink_config` runs in the writer's constructor, i.e. on the
driver when ``save()`` or ``start()`` is called (and again before every micro-batch and every
streaming commit, since PySpark builds the stream writer anew for each), so a bad option, a missing
``value`` column or a column of the wrong type fails before any task writes anything. The result,
:class:`SinkConfig`, is a small frozen value that Spark pickles to the executors with the writer.

Options (names as Pulsar's Java client spells them, matched case-insensitively):

===========================  ==============================================================
``path`` / ``serviceUrl``    the storage root (``save(path)``/``start(path)`` or the option)
``storageOptions``           JSON object for fsspec (e.g. an S3 ``endpoint_url``)
``topic``                    the topic to write (a ``topic`` column is then ignored);
                             without it every row names its topic in the ``topic`` column
``producerName``             producer name of rows with no ``producerName`` column value
                             (default ``spark-<writer id>``)
``compressionType``          NONE (default), LZ4, ZLIB, ZSTD, SNAPPY
``batchingEnabled``          true (default): rows are batched into entries
``batchingMaxMessages``      1000: messages per batch entry
``batchingMaxBytes``         131072: value bytes per batch entry (the crossing message is
                             the entry's last, as Pulsar's batcher)
``batchingType``             Default or KeyBased (one batch per key/ordering key)
``chunkingEnabled``          false: values above the max message size fail the task with
                             MessageTooBig; true: they are split into chunk entries
``messageRoutingMode``       RoundRobinPartition (default), SinglePartition, CustomPartition
                             (the ``partition`` column decides)
``hashingScheme``            JavaStringHash (default) or Murmur3_32Hash
``autoCreateTopic``          true (default): a missing topic is created if the namespace
                             policy allows it; false: a missing topic is an error
``maxMessageSize``           bytes; defaults to (and may not exceed) the topic's policy
``writerId``                 the exactly-once identity (see
:mod:`filepulsar.connector.sink.writers`); default:
                             the streaming query id, or a fresh id per ``save()``
``valueFormat``              binary (``value`` is binary or string), struct (``value`` is a
                             struct, encoded with the topic's schema; the default when it
                             is one) or flatten (every column that is not a sink column is a
                             field of the record)
``valueSchemaType``          AVRO or JSON: the schema type of a topic that has none yet
                             (default AVRO); with a schema, the topic's
``valueSchema``              an Avro record schema (JSON text) to write typed values with;
                             default: the topic's latest, else derived from the struct
``valueSchemaName``          the record name of a derived schema (default ``SparkRecord``)
===========================  ==============================================================

Column types: ``value`` binary or string (struct: see ``valueFormat``); ``key``,
``producerName``, ``topic`` string; ``orderingKey`` binary or string; ``properties``
map<string,string>; ``eventTime`` and ``deliverAt`` timestamp (a timestamp without time
zone is read as UTC) or long epoch ms; ``sequenceId`` and ``partition`` any integer type.
Names match case-insensitively; any other column is an error (a column the sink would
silently drop is more likely a mistake).

Deviation from Pulsar's Java client, on purpose: chunking may be combined with batching. Only
the oversized rows become chunk entries (never batched); the rows around them are batched as
usual, so a DataFrame with a few large values does not pay one entry per message.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.types import (
    BinaryType,
    ByteType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from filepulsar.connector.options import OptionReader, storage_options, storage_root
from filepulsar.connector.schema import SINK_COLUMNS
from filepulsar.connector.values.encode import SinkValueSchema
from filepulsar.connector.values.types import VALUE_FORMATS
from filepulsar.dispatch.modes import (
    BatchingType,
    CompressionType,
    HashingScheme,
    PartitionsRoutingMode,
)
from filepulsar.storage.batcher import BatchPolicy
from filepulsar.storage.codec import Codec
from filepulsar.storage.errors import InvalidConfiguration
from filepulsar.storage.names import TopicName
from filepulsar.storage.policies import Policies

WHAT = "filepulsar sink"
#: A writer id is part of every blob name; "." separates the name's fields, so it is excluded.
_WRITER_ID = re.compile(r"^[A-Za-z0-9_\-]{1,64}$")
_INTEGRAL = (ByteType, ShortType, IntegerType, LongType)

#: Spark types accepted per sink column, and how an error describes them.
_ACCEPTED: dict[str, tuple[tuple[type[DataType], ...], str]] = {
    "value": ((BinaryType, StringType), "binary or string"),
    "key": ((StringType,), "string"),
    "orderingKey": ((BinaryType, StringType), "binary or string"),
    "properties": ((MapType,), "map<string, string>"),
    "eventTime": ((TimestampType, TimestampNTZType, *_INTEGRAL), "timestamp or long (epoch ms)"),
    "deliverAt": ((TimestampType, TimestampNTZType, *_INTEGRAL), "timestamp or long (epoch ms)"),
    "sequenceId": (_INTEGRAL, "an integer type (int or long)"),
    "producerName": ((StringType,), "string"),
    "topic": ((StringType,), "string"),
    "partition": (_INTEGRAL, "an integer type (int or long)"),
}

#: Sink column → the storage column (``filepulsar.storage.batcher``) it becomes; the rest steer the
#: write.
STORED_NAMES = {
    "value": "value",
    "key": "key",
    "orderingKey": "ordering_key",
    "properties": "properties",
    "eventTime": "event_time",
    "sequenceId": "sequence_id",
    "deliverAt": "deliver_at",
}


@dataclass(frozen=True)
class SinkConfig:
    """Everything a sink task and commit need, parsed and checked (picklable, immutable).

    ``columns`` maps each sink column present in the input (canonical name, e.g.
    ``orderingKey``) to its name in the DataFrame (matched case-insensitively).
    """

    root: str
    storage_options: Mapping[str, Any]
    topic: str | None
    producer_name: str | None
    codec: Codec
    batching_enabled: bool
    batching_max_messages: int
    batching_max_bytes: int
    batching_type: BatchingType
    chunking_enabled: bool
    routing_mode: PartitionsRoutingMode
    hashing_scheme: HashingScheme
    auto_create_topic: bool
    max_message_size: int | None
    writer_id: str | None
    checkpoint_location: str | None
    columns: Mapping[str, str] = field(default_factory=dict)
    value_format: str | None = None  # None: struct if ``value`` is a struct, else binary
    value_schema_type: str | None = None
    value_schema_text: str | None = None
    value_schema_name: str = "SparkRecord"
    #: A typed write's schema (resolved on the driver by
    #: :func:`filepulsar.connector.sink.writers.sink_config`).
    value_schema: SinkValueSchema | None = None
    #: Flatten: the input columns that are the record's fields.
    record_columns: tuple[str, ...] = ()

    def batch_policy(self, max_message_size: int) -> BatchPolicy:
        """How rows become entries (the cutter the bulk producer uses too), for a topic whose
        messages may be up to ``max_message_size`` bytes (:func:`message_size_limit`)."""
        return BatchPolicy(
            max_message_size=max_message_size,
            codec=self.codec,
            batching=self.batching_enabled,
            max_messages=self.batching_max_messages,
            max_bytes=self.batching_max_bytes,
            batching_type=self.batching_type,
            chunking=self.chunking_enabled,
        )

    def default_producer_name(self, writer_id: str) -> str:
        """The producer name of rows without one: the option, else ``spark-<writer id>``."""
        return self.producer_name or f"spark-{writer_id}"


def check_writer_id(value: str, what: str = "option 'writerId'") -> str:
    """Return ``value`` if it can be a writer id (1-64 of ``A-Z a-z 0-9 _ -``).

    Raises
    ------
    InvalidConfiguration
        Naming ``what`` and the allowed characters.
    """
    if not _WRITER_ID.match(value):
        raise InvalidConfiguration(
            f"{WHAT}: {what} is {value!r}; use 1-64 characters from A-Z a-z 0-9 _ -"
        )
    return value


def parse_options(options: Mapping[str, Any]) -> SinkConfig:
    """Parse Spark's options into a :class:`SinkConfig` (without columns).

    Raises
    ------
    InvalidConfiguration
        For an unknown option (listing the accepted ones), a value outside what is allowed
        (naming the option and the allowed values), or a missing storage root.
    """
    r = OptionReader(options, WHAT)
    root = storage_root(r)
    sopts = storage_options(r)
    topic = r.string("topic")
    if topic is not None:
        topic = str(TopicName.parse(topic))
    producer_name = r.string("producerName")
    compression = r.mode("compressionType", CompressionType, CompressionType.NONE)
    batching = r.boolean("batchingEnabled", True)
    max_messages = r.integer("batchingMaxMessages", 1000, minimum=1)
    max_bytes = r.integer("batchingMaxBytes", 128 * 1024, minimum=1)
    batching_type = r.mode("batchingType", BatchingType, BatchingType.Default)
    chunking = r.boolean("chunkingEnabled", False)
    routing = r.mode(
        "messageRoutingMode", PartitionsRoutingMode, PartitionsRoutingMode.RoundRobinDistribution
    )
    scheme = r.mode("hashingScheme", HashingScheme, HashingScheme.JavaStringHash)
    auto_create = r.boolean("autoCreateTopic", True)
    max_size = r.integer("maxMessageSize", None, minimum=1)
    writer_id = r.string("writerId")
    if writer_id is not None:
        check_writer_id(writer_id)
    checkpoint = r.string("checkpointLocation")
    value_format = r.choice("valueFormat", VALUE_FORMATS, "") or None
    schema_type = r.choice("valueSchemaType", ("AVRO", "JSON"), "") or None
    schema_text = r.string("valueSchema")
    if schema_text is not None:
        try:
            parsed = json.loads(schema_text)
        except ValueError as e:
            raise InvalidConfiguration(
                f"{WHAT}: option 'valueSchema' must be an Avro record schema as JSON: {e}"
            ) from e
        if not isinstance(parsed, dict) or parsed.get("type") != "record":
            raise InvalidConfiguration(
                f"{WHAT}: option 'valueSchema' must be an Avro record schema "
                '({"type": "record", "name": ..., "fields": [...]})'
            )
    schema_name = r.string("valueSchemaName", "SparkRecord") or "SparkRecord"
    r.check_unknown()
    assert max_messages is not None and max_bytes is not None
    return SinkConfig(
        root=root,
        storage_options=sopts,
        topic=topic,
        producer_name=producer_name,
        codec=Codec(compression.value),
        batching_enabled=batching,
        batching_max_messages=max_messages,
        batching_max_bytes=max_bytes,
        batching_type=batching_type,
        chunking_enabled=chunking,
        routing_mode=routing,
        hashing_scheme=scheme,
        auto_create_topic=auto_create,
        max_message_size=max_size,
        writer_id=writer_id,
        checkpoint_location=checkpoint,
        value_format=value_format,
        value_schema_type=schema_type,
        value_schema_text=schema_text,
        value_schema_name=schema_name,
    )


def input_columns(schema: StructType, config: SinkConfig) -> dict[str, str]:
    """Check the DataFrame's schema; return sink column → DataFrame column name.

    Column names match case-insensitively (Spark's default resolution).

    Raises
    ------
    InvalidConfiguration
        For a missing ``value``, an unknown or duplicated column, a column of the wrong type
        (naming the column, its type and the expected type), no way to pick a topic, or a
        ``partition`` column without ``messageRoutingMode=CustomPartition`` (and vice versa).
    """
    canonical = {c.lower(): c for c in SINK_COLUMNS}
    found: dict[str, str] = {}
    flatten = config.value_format == "flatten"
    for f in schema.fields:
        name = canonical.get(f.name.lower())
        if name is None:
            if flatten:
                continue  # a field of the record
            raise InvalidConfiguration(
                f"{WHAT}: unknown input column {f.name!r}; the sink writes the columns "
                f"{', '.join(SINK_COLUMNS)} (value required): drop or rename the others, "
                "or set valueFormat=flatten to write them as the fields of a record"
            )
        if name in found:
            raise InvalidConfiguration(
                f"{WHAT}: columns {found[name]!r} and {f.name!r} both mean {name!r}"
            )
        if name == "value" and flatten:
            raise InvalidConfiguration(
                f"{WHAT}: valueFormat=flatten writes the record's fields from the columns "
                "that are not sink columns; the input has a 'value' column too: drop it, or "
                "use valueFormat=struct"
            )
        if (
            name == "value"
            and config.value_format != "binary"
            and isinstance(f.dataType, StructType)
        ):
            found[name] = f.name
            continue
        if name == "value" and config.value_format == "struct":
            raise InvalidConfiguration(
                f"{WHAT}: valueFormat=struct needs a struct 'value' column; column "
                f"{f.name!r} has type {f.dataType.simpleString()}"
            )
        accepted, expected = _ACCEPTED[name]
        ok = isinstance(f.dataType, accepted)
        if ok and isinstance(f.dataType, MapType):
            ok = isinstance(f.dataType.keyType, StringType) and isinstance(
                f.dataType.valueType, StringType
            )
        if not ok:
            raise InvalidConfiguration(
                f"{WHAT}: column {f.name!r} has type {f.dataType.simpleString()}; "
                f"expected {expected}"
            )
        found[name] = f.name
    if flatten:
        if not [f for f in schema.fields if f.name.lower() not in canonical]:
            raise InvalidConfiguration(
                f"{WHAT}: valueFormat=flatten: the input has no column besides the sink "
                f"columns ({', '.join(SINK_COLUMNS)}) to be the record's fields"
            )
    elif "value" not in found:
        raise InvalidConfiguration(
            f"{WHAT}: the input needs a 'value' column (binary or string); it has "
            f"{', '.join(schema.fieldNames()) or 'no columns'}"
        )
    if config.topic is None and "topic" not in found:
        raise InvalidConfiguration(
            f"{WHAT}: no topic: set option 'topic' or give the input a 'topic' column (string)"
        )
    if config.routing_mode is PartitionsRoutingMode.CustomPartition and "partition" not in found:
        raise InvalidConfiguration(
            f"{WHAT}: messageRoutingMode CustomPartition routes by the 'partition' column "
            "(an integer), which the input lacks"
        )
    if "partition" in found and config.routing_mode is not PartitionsRoutingMode.CustomPartition:
        raise InvalidConfiguration(
            f"{WHAT}: the input has a 'partition' column; set messageRoutingMode="
            "CustomPartition to route by it, or drop it"
        )
    return found


def message_size_limit(config: SinkConfig, policies: Policies, topic: TopicName) -> int:
    """The largest message the sink writes to ``topic``: ``maxMessageSize`` if set, else the
    topic's ``max_message_size`` policy.

    Raises
    ------
    InvalidConfiguration
        If ``maxMessageSize`` exceeds the policy.
    """
    limit = policies.max_message_size
    if config.max_message_size is None:
        return limit
    if config.max_message_size > limit:
        raise InvalidConfiguration(
            f"{WHAT}: maxMessageSize {config.max_message_size} exceeds the "
            f"max_message_size policy {limit} of topic {topic}"
        )
    return config.max_message_size


def dedup_enabled(policies: Policies, topic: TopicName) -> bool:
    """Whether commits to ``topic`` deduplicate by (producer, sequence id), as the broker."""
    return policies.deduplication_enabled and topic.persistent
