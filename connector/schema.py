"""Column names and types the outside world relies on (shared/DESIGN.md), in one place."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

#: Columns of ``spark.read/readStream.format("filepulsar")``.
SOURCE_SCHEMA = StructType(
    [
        StructField("value", BinaryType(), True),
        StructField("key", StringType(), True),
        StructField("orderingKey", BinaryType(), True),
        StructField("topic", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("messageId", StringType(), False),
        StructField("ledgerId", LongType(), False),
        StructField("entryId", LongType(), False),
        StructField("batchIndex", IntegerType(), False),
        StructField("publishTime", TimestampType(), False),
        StructField("eventTime", TimestampType(), True),
        StructField("properties", MapType(StringType(), StringType(), True), True),
        StructField("producerName", StringType(), False),
        StructField("sequenceId", LongType(), False),
        StructField("deliverAt", TimestampType(), True),
        StructField("redeliveryCount", IntegerType(), False),
    ]
)

#: The Arrow schema a source's record batches must match exactly (PYSPARK_NOTES gotcha 3).
SOURCE_ARROW_SCHEMA = pa.schema(
    [
        pa.field("value", pa.binary()),
        pa.field("key", pa.string()),
        pa.field("orderingKey", pa.binary()),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("messageId", pa.string(), nullable=False),
        pa.field("ledgerId", pa.int64(), nullable=False),
        pa.field("entryId", pa.int64(), nullable=False),
        pa.field("batchIndex", pa.int32(), nullable=False),
        pa.field("publishTime", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("eventTime", pa.timestamp("us", tz="UTC")),
        pa.field(
            "properties",
            pa.map_(pa.field("key", pa.string(), nullable=False), pa.field("value", pa.string())),
        ),
        pa.field("producerName", pa.string(), nullable=False),
        pa.field("sequenceId", pa.int64(), nullable=False),
        pa.field("deliverAt", pa.timestamp("us", tz="UTC")),
        pa.field("redeliveryCount", pa.int32(), nullable=False),
    ]
)

#: Columns the sink understands; ``value`` is required.
SINK_COLUMNS = (
    "value",
    "key",
    "orderingKey",
    "properties",
    "eventTime",
    "deliverAt",
    "sequenceId",
    "producerName",
    "topic",
    "partition",
)
