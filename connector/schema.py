"""Column names and types the outside world relies on (shared/DESIGN.md), in one place."""

from __future__ import annotations

from typing import Any

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


Columns = tuple[tuple[str, bool], ...]  # (name, nullable) of the columns a read emits


def typed_schemas(
    value_columns: list[tuple[str, Any, pa.DataType]], flatten: bool
) -> tuple[StructType, pa.Schema]:
    """The source's Spark and Arrow schemas of a typed read (``valueFormat`` struct or
    flatten): ``value_columns`` (name, Spark type, Arrow type) replace ``value`` (struct), or
    come first, before the other source columns (flatten).

    Raises
    ------
    ValueError
        If a flattened field has the name of a source column.
    """
    meta = [f for f in SOURCE_SCHEMA.fields if f.name != "value"]
    ameta = [f for f in SOURCE_ARROW_SCHEMA if f.name != "value"]
    if flatten:
        taken = {f.name.lower() for f in meta}
        clash = [n for n, _, _ in value_columns if n.lower() in taken]
        if clash:
            raise ValueError(
                f"valueFormat=flatten: the record's field(s) {', '.join(clash)} have the name of "
                "a source column; use valueFormat=struct (the record in a 'value' column)"
            )
        return (
            StructType([StructField(n, st, True) for n, st, _ in value_columns] + meta),
            pa.schema([pa.field(n, at) for n, _, at in value_columns] + ameta),
        )
    (_, st, at) = value_columns[0]
    return (
        StructType([StructField("value", st, True), *meta]),
        pa.schema([pa.field("value", at), *ameta]),
    )


def source_columns(
    schema: StructType | None,
    columns: tuple[str, ...] | None,
    full: StructType = SOURCE_SCHEMA,
) -> Columns:
    """The source columns a read emits, in order, with their nullability; ``()`` means every
    column, as :data:`SOURCE_SCHEMA` declares them.

    ``schema`` is the schema Spark hands the reader (the user's ``.schema(...)``, or the one
    the data source declared); ``columns`` the ``columns`` option. Each named column must be a
    source column of the source's type (nullability may differ). ``full``: the source's
    columns (a typed read's, :func:`typed_schemas`); for those the result names every column.

    Raises
    ------
    ValueError
        Naming the column that is not a source column, or has another type.
    """
    by_name = {f.name: f for f in full.fields}
    allowed = ", ".join(by_name)
    if columns is not None:
        for c in columns:
            if c not in by_name:
                raise ValueError(f"option 'columns': {c!r} is not a source column ({allowed})")
        if len(set(columns)) != len(columns):
            raise ValueError(f"option 'columns' names a column twice: {','.join(columns)}")
    if schema is None:
        if not columns:
            if full is not SOURCE_SCHEMA:
                return tuple((f.name, f.nullable) for f in full.fields)
            return ()
        return tuple((c, by_name[c].nullable) for c in columns)
    else:
        names = tuple(f.name for f in schema.fields)
        for f in schema.fields:
            ours = by_name.get(f.name)
            if ours is None:
                raise ValueError(
                    f"the schema given to the source has column {f.name!r}, which is not a "
                    f"source column ({allowed})"
                )
            if ours.dataType != f.dataType:
                raise ValueError(
                    f"the schema given to the source has {f.name} {f.dataType.simpleString()}; "
                    f"the source's {f.name} is {ours.dataType.simpleString()}"
                )
        if columns is not None and names != tuple(columns):
            raise ValueError(
                f"option 'columns' ({','.join(columns)}) and the schema given to the source "
                f"({','.join(names)}) disagree; give one of them"
            )
    if (
        full is SOURCE_SCHEMA
        and names == tuple(by_name)
        and all(f.nullable == by_name[f.name].nullable for f in schema.fields)
    ):
        return ()
    return tuple((f.name, f.nullable) for f in schema.fields)


def narrow_schema(columns: tuple[str, ...] | None, full: StructType = SOURCE_SCHEMA) -> StructType:
    """The Spark schema of a read emitting ``columns`` (None or ``()``: every column of
    ``full``)."""
    if not columns:
        return full
    by_name = {f.name: f for f in full.fields}
    return StructType([by_name[c] for c in columns])


def arrow_schema_of(columns: Columns, full: pa.Schema = SOURCE_ARROW_SCHEMA) -> pa.Schema:
    """The Arrow schema Spark expects for ``columns`` (``()``: ``full``, by default
    :data:`SOURCE_ARROW_SCHEMA`)."""
    if not columns:
        return full
    return pa.schema([full.field(n).with_nullable(nullable) for n, nullable in columns])
