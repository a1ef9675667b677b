"""Typed Spark columns from a topic's schema (source) and a topic's schema from Spark structs
(sink).

A topic's schema lives in its registry (:mod:`filepulsar.storage.schemas`): ``AVRO`` and ``JSON``
definitions are Avro schemas (records as Pulsar stores them), ``STRING`` values are UTF-8 text,
``BYTES`` values are bytes. This module maps them to Spark and Arrow types:

=============================  ===========================  ==============================
Avro                           Spark                        Arrow
=============================  ===========================  ==============================
``boolean``                    boolean                      bool
``int`` / ``long``             int / bigint                 int32 / int64
``float`` / ``double``         float / double               float32 / float64
``string`` (``uuid``)          string                       string
``bytes``, ``fixed``           binary                       binary
``decimal`` (bytes, fixed)     decimal(p, s) (p <= 38)      decimal128(p, s)
``date``                       date                         date32
``timestamp-millis/-micros``   timestamp                    timestamp[us, UTC]
``local-timestamp-*``          timestamp_ntz                timestamp[us]
``time-millis/-micros``        int / bigint (raw value)     int32 / int64
``enum``                       string (the symbol)          string
``array`` / ``map``            array / map<string, _>       list / map<string, _>
``record``                     struct                       struct
``["null", T]``                T                            T
=============================  ===========================  ==============================

A union of several non-null types and a recursive record have no Spark form: reading such a
schema typed is refused, naming the field. Every column and nested field is nullable (a
tombstone, a message of another schema version, or a value nulled by
``onCorruptValue=null`` has no fields).

Reading (:class:`~filepulsar.connector.values.decode.ValueDecoder`): each message is
decoded with the schema version that wrote it (the entry's ``schema_version``; none: the
reader's own) and projected onto the reader's version by Avro's schema resolution (fields the
writer lacks get the reader's default, or null; fields the reader lacks are dropped). Avro
payloads go through fastavro's ``schemaless_reader``, JSON payloads through :func:`json.loads`
and the same projection; the decoded values of a whole group of messages become one Arrow array
at once.

Writing (:class:`~filepulsar.connector.values.encode.ValueEncoder`): a struct is encoded
with the topic's schema (Avro binary or a JSON object);
:func:`~filepulsar.connector.values.encode.derive_avro` gives the Avro record schema of a
Spark struct for a topic that has none yet.

This module owns the option values, the Avro to Spark/Arrow type mapping (:func:`avro_types`)
and the read's value spec (:func:`plan_value_spec`); decoding lives in
:mod:`~filepulsar.connector.values.decode`, encoding and the struct checks in
:mod:`~filepulsar.connector.values.encode`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from filepulsar.storage.blobstore.port import BlobStore
from filepulsar.storage.errors import InvalidConfiguration
from filepulsar.storage.names import TopicName
from filepulsar.storage.schemas import SchemaRegistry, StoredSchema

#: ``valueFormat`` values: bytes as stored, a ``value`` struct column, or the record's fields
#: as top-level columns.
VALUE_FORMATS = ("binary", "struct", "flatten")
#: ``onCorruptValue`` values.
ON_CORRUPT = ("fail", "null")
#: Schema types a typed read understands.
TYPED = ("AVRO", "JSON", "STRING", "BYTES")

#: Avro primitive type -> its Spark and Arrow types (the decoder and encoder share it).
PRIMITIVES: dict[str, tuple[DataType, pa.DataType]] = {
    "boolean": (BooleanType(), pa.bool_()),
    "int": (IntegerType(), pa.int32()),
    "long": (LongType(), pa.int64()),
    "float": (FloatType(), pa.float32()),
    "double": (DoubleType(), pa.float64()),
    "string": (StringType(), pa.string()),
    "bytes": (BinaryType(), pa.binary()),
}
#: Logical types read as their underlying value (fastavro would make Python objects of them
#: that have no Spark column type): the annotation is removed before decoding.
_RAW_LOGICAL = ("time-millis", "time-micros", "uuid")


class SchemaMappingError(InvalidConfiguration):
    """A schema (or a struct) with no form on the other side; the message names the field."""


# ----------------------------------------------------------------------------- Avro -> Spark
def strip_raw_logical(schema: Any) -> Any:
    """``schema`` without the logical types read raw (see :data:`_RAW_LOGICAL`)."""
    if isinstance(schema, dict):
        out = {k: strip_raw_logical(v) for k, v in schema.items()}
        if out.get("logicalType") in _RAW_LOGICAL:
            del out["logicalType"]
        return out
    if isinstance(schema, list):
        return [strip_raw_logical(x) for x in schema]
    return schema


def _fullname(schema: dict[str, Any], ns: str) -> tuple[str, str]:
    name = str(schema.get("name", ""))
    space = schema.get("namespace", ns) or ""
    if "." in name:
        return name, name.rsplit(".", 1)[0]
    return (f"{space}.{name}" if space else name), space


class _Mapper:
    """Avro schema -> (Spark type, Arrow type), resolving named types."""

    def __init__(self) -> None:
        self.named: dict[str, Any] = {}
        self.stack: list[str] = []

    def map(self, schema: Any, path: str, ns: str = "") -> tuple[DataType, pa.DataType]:
        where = path or "the value"
        if isinstance(schema, str):
            if schema in PRIMITIVES:
                return PRIMITIVES[schema]
            if schema == "null":
                raise SchemaMappingError(f"{where}: an Avro null has no Spark column type")
            full = schema if "." in schema or not ns else f"{ns}.{schema}"
            target = self.named.get(full, self.named.get(schema))
            if target is None:
                raise SchemaMappingError(f"{where}: unknown Avro type {schema!r}")
            return self.map(target, path, ns)
        if isinstance(schema, list):
            branches = [b for b in schema if b != "null"]
            if len(branches) != 1:
                raise SchemaMappingError(
                    f"{where}: the union {json.dumps(schema)} has no Spark column type (only "
                    'a type or ["null", type] can be read typed; use valueFormat=binary)'
                )
            return self.map(branches[0], path, ns)
        if not isinstance(schema, dict):
            raise SchemaMappingError(f"{where}: not an Avro schema: {schema!r}")
        t = schema.get("type")
        logical = schema.get("logicalType")
        if isinstance(t, dict | list):
            return self.map(t, path, ns)
        if logical == "decimal" and t in ("bytes", "fixed"):
            p, s = int(schema.get("precision", 0)), int(schema.get("scale", 0))
            if t == "fixed":
                self._define(schema, ns)
            if not 0 < p <= 38:
                raise SchemaMappingError(f"{where}: decimal precision {p} is outside Spark's 1..38")
            return DecimalType(p, s), pa.decimal128(p, s)
        if logical == "date" and t == "int":
            return DateType(), pa.date32()
        if logical in ("timestamp-millis", "timestamp-micros") and t == "long":
            return TimestampType(), pa.timestamp("us", tz="UTC")
        if logical in ("local-timestamp-millis", "local-timestamp-micros") and t == "long":
            return TimestampNTZType(), pa.timestamp("us")
        if t in PRIMITIVES:
            return PRIMITIVES[str(t)]
        if t == "enum":
            self._define(schema, ns)
            return StringType(), pa.string()
        if t == "fixed":
            self._define(schema, ns)
            return BinaryType(), pa.binary()
        if t == "array":
            st, at = self.map(schema.get("items"), f"{path}[]", ns)
            return ArrayType(st, True), pa.list_(at)
        if t == "map":
            st, at = self.map(schema.get("values"), f"{path}{{}}", ns)
            return MapType(StringType(), st, True), pa.map_(pa.string(), at)
        if t in ("record", "error"):
            full, space = self._define(schema, ns)
            if full in self.stack:
                raise SchemaMappingError(
                    f"{where}: record {full} contains itself; a recursive record has no Spark "
                    "column type (use valueFormat=binary)"
                )
            self.stack.append(full)
            sfields, afields = [], []
            for f in schema.get("fields", []):
                name = str(f["name"])
                sub = f"{path}.{name}" if path else name
                st, at = self.map(f["type"], sub, space)
                sfields.append(StructField(name, st, True))
                afields.append(pa.field(name, at))
            self.stack.pop()
            return StructType(sfields), pa.struct(afields)
        raise SchemaMappingError(f"{where}: Avro type {t!r} has no Spark column type")

    def _define(self, schema: dict[str, Any], ns: str) -> tuple[str, str]:
        full, space = _fullname(schema, ns)
        self.named.setdefault(full, schema)
        self.named.setdefault(str(schema.get("name", "")), schema)
        return full, space


def avro_types(definition: Any) -> tuple[DataType, pa.DataType]:
    """The Spark and Arrow types of values of Avro schema ``definition``.

    Raises
    ------
    SchemaMappingError
        Naming the field whose Avro type has no Spark form.
    """
    return _Mapper().map(definition, "")


# ----------------------------------------------------------------------------- the value spec
@dataclass(frozen=True)
class ValueSpec:
    """How a typed read decodes values (picklable: the driver plans it, tasks use it).

    ``type`` and ``definition`` are the reader's schema (the topic's latest version when the
    query was planned), ``version`` its number; ``mode`` is ``struct`` or ``flatten``;
    ``on_corrupt`` is ``fail`` or ``null``.
    """

    mode: str
    type: str
    definition: str
    version: int
    on_corrupt: str = "fail"

    def parsed(self) -> Any:
        return json.loads(self.definition) if self.definition else None

    def value_type(self) -> tuple[DataType, pa.DataType]:
        """The Spark and Arrow types of one decoded value."""
        if self.type == "STRING":
            return StringType(), pa.string()
        if self.type == "BYTES":
            return BinaryType(), pa.binary()
        return avro_types(strip_raw_logical(self.parsed()))

    def columns(self) -> list[tuple[str, DataType, pa.DataType]]:
        """The columns the value becomes: ``value`` (struct mode, and any non-record value),
        or the record's fields (flatten mode), as (name, Spark type, Arrow type)."""
        st, at = self.value_type()
        if self.mode == "flatten" and isinstance(st, StructType):
            return [(f.name, f.dataType, at.field(i).type) for i, f in enumerate(st.fields)]
        return [("value", st, at)]


def _spec_of(s: StoredSchema, mode: str, on_corrupt: str, topic: str) -> ValueSpec:
    if s.type not in TYPED:
        raise InvalidConfiguration(
            f"filepulsar source: topic {topic} has a {s.type} schema (version {s.version}); "
            f"valueFormat={mode} reads {', '.join(TYPED)} schemas: use valueFormat=binary"
        )
    spec = ValueSpec(mode, s.type, s.definition, s.version, on_corrupt)
    spec.value_type()  # refuse a schema with no Spark form now, naming the field
    return spec


def plan_value_spec(
    store: BlobStore,
    bases: list[TopicName],
    mode: str,
    on_corrupt: str,
    expect: Callable[[ValueSpec], bool] | None = None,
) -> ValueSpec:
    """The reader's value spec of a typed read of ``bases`` (partitioned or plain topics): the
    latest schema version, which every topic read must share (same type and definition).

    ``expect`` (a reader built from a schema fixed at ``load()``): the newest version for which
    it holds, so a version added between ``load()`` and the start still reads as planned.

    Raises
    ------
    InvalidConfiguration
        If no topic is read, a topic has no schema, the topics' schemas differ, the schema's
        type cannot be read typed, or (``expect``) no version gives the expected columns.
    """
    if not bases:
        raise InvalidConfiguration(
            f"filepulsar source: valueFormat={mode} takes its columns from the topics' schema, "
            "but no topic matches yet; create the topic (with a schema) first"
        )
    first: tuple[str, StoredSchema] | None = None
    for t in sorted(set(bases), key=str):
        reg = SchemaRegistry(store, t)
        latest = reg.latest()
        if latest is None:
            raise InvalidConfiguration(
                f"filepulsar source: valueFormat={mode} needs a schema, and topic {t} has none "
                "(a producer with a schema, or Admin.schemas().create_schema, adds one); read "
                "it with valueFormat=binary"
            )
        if first is None:
            first = (str(t), latest)
        elif not first[1].same_as(latest.type, latest.definition):
            raise InvalidConfiguration(
                f"filepulsar source: valueFormat={mode} reads several topics only when they "
                f"share one schema; {first[0]} has {first[1].type} version {first[1].version} "
                f"and {t} has another ({latest.type} version {latest.version}); read them "
                "in separate queries"
            )
    assert first is not None
    spec = _spec_of(first[1], mode, on_corrupt, first[0])
    if expect is None or expect(spec):
        return spec
    reg = SchemaRegistry(store, TopicName.parse(first[0]))
    for s in reversed(reg.versions()):
        try:
            older = _spec_of(s, mode, on_corrupt, first[0])
        except InvalidConfiguration:
            continue
        if expect(older):
            return older
    raise InvalidConfiguration(
        f"filepulsar source: the schema given to the source matches no schema version of "
        f"{first[0]}; drop .schema(...) to use the topic's latest version"
    )


def define_name(schema: dict[str, Any], names: dict[str, Any], ns: str) -> tuple[str, str]:
    """Record the named Avro type ``schema`` in ``names`` under its full and short name
    (the first definition wins) and return ``(full name, its namespace)``; ``ns`` is the
    enclosing namespace."""
    full, space = _fullname(schema, ns)
    names.setdefault(full, schema)
    names.setdefault(str(schema.get("name", "")), schema)
    return full, space
