"""Typed Spark columns from a topic's schema (source) and a topic's schema from Spark structs
(sink).

A topic's schema lives in its registry (:mod:`storage.schemas`): ``AVRO`` and ``JSON``
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

Reading (:class:`ValueDecoder`): each message is decoded with the schema version that wrote it
(the entry's ``schema_version``; none: the reader's own) and projected onto the reader's
version by Avro's schema resolution (fields the writer lacks get the reader's default, or
null; fields the reader lacks are dropped). Avro payloads go through fastavro's
``schemaless_reader``, JSON payloads through :func:`json.loads` and the same projection; the
decoded values of a whole group of messages become one Arrow array at once.

Writing (:class:`ValueEncoder`): a struct is encoded with the topic's schema (Avro binary or a
JSON object); :func:`derive_avro` gives the Avro record schema of a Spark struct for a topic
that has none yet.
"""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from filepulsar.storage.blobstore_port import BlobStore
from filepulsar.storage.errors import CorruptDataError, IncompatibleSchema, InvalidConfiguration
from filepulsar.storage.names import TopicName
from filepulsar.storage.schemas import SchemaRegistry, StoredSchema

#: ``valueFormat`` values: bytes as stored, a ``value`` struct column, or the record's fields
#: as top-level columns.
VALUE_FORMATS = ("binary", "struct", "flatten")
#: ``onCorruptValue`` values.
ON_CORRUPT = ("fail", "null")
#: Schema types a typed read understands.
TYPED = ("AVRO", "JSON", "STRING", "BYTES")

_PRIMS: dict[str, tuple[DataType, pa.DataType]] = {
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
def _strip_raw_logical(schema: Any) -> Any:
    """``schema`` without the logical types read raw (see :data:`_RAW_LOGICAL`)."""
    if isinstance(schema, dict):
        out = {k: _strip_raw_logical(v) for k, v in schema.items()}
        if out.get("logicalType") in _RAW_LOGICAL:
            del out["logicalType"]
        return out
    if isinstance(schema, list):
        return [_strip_raw_logical(x) for x in schema]
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
            if schema in _PRIMS:
                return _PRIMS[schema]
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
        if t in _PRIMS:
            return _PRIMS[str(t)]
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
        return avro_types(_strip_raw_logical(self.parsed()))

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


# ----------------------------------------------------------------------------- decoding
class _Bad(ValueError):
    """A JSON value that does not fit the reader's schema (path and what was wrong)."""


def _json_conv(schema: Any, names: dict[str, Any], ns: str, path: str) -> Callable[[Any], Any]:
    """A function turning a decoded JSON value into the Python value Arrow takes for the
    reader's Avro type ``schema`` (projecting records as Avro resolution does)."""
    where = path or "value"
    if isinstance(schema, str) and schema not in _PRIMS and schema != "null":
        full = schema if "." in schema or not ns else f"{ns}.{schema}"
        target = names.get(full, names.get(schema))
        if target is None:
            raise SchemaMappingError(f"{where}: unknown Avro type {schema!r}")
        return lambda v: _json_conv(target, names, ns, path)(v)
    if isinstance(schema, list):
        nullable = "null" in schema
        branches = [_json_conv(b, names, ns, path) for b in schema if b != "null"]

        def union(v: Any) -> Any:
            if v is None:
                if nullable:
                    return None
                raise _Bad(f"{where}: null where the schema has no null")
            last: Exception | None = None
            for b in branches:
                try:
                    return b(v)
                except _Bad as e:
                    last = e
            raise _Bad(str(last) if last else f"{where}: no union branch takes {v!r}")

        return union
    if isinstance(schema, dict) and isinstance(schema.get("type"), dict | list):
        return _json_conv(schema["type"], names, ns, path)
    t = schema.get("type") if isinstance(schema, dict) else schema
    logical = schema.get("logicalType") if isinstance(schema, dict) else None

    def need(v: Any, ok: bool, what: str) -> None:
        if not ok:
            raise _Bad(f"{where}: {what} expected, got {type(v).__name__} {v!r:.40}")

    if t == "null":
        return lambda v: need(v, v is None, "null")
    if logical == "date" and t == "int":

        def date(v: Any) -> Any:
            need(v, isinstance(v, int) and not isinstance(v, bool), "days since 1970 (int)")
            return dt.date(1970, 1, 1) + dt.timedelta(days=v)

        return date
    if (
        logical
        in (
            "timestamp-millis",
            "timestamp-micros",
            "local-timestamp-millis",
            "local-timestamp-micros",
        )
        and t == "long"
    ):
        per_s = 1000 if logical.endswith("millis") else 1_000_000
        tz = dt.UTC if logical.startswith("timestamp") else None

        def ts(v: Any) -> Any:
            need(v, isinstance(v, int) and not isinstance(v, bool), "a timestamp (long)")
            epoch = dt.datetime(1970, 1, 1, tzinfo=tz)
            return epoch + dt.timedelta(microseconds=v * (1_000_000 // per_s))

        return ts
    if logical == "decimal" and t in ("bytes", "fixed"):
        scale = int(schema.get("scale", 0))

        def dec(v: Any) -> Any:
            need(v, isinstance(v, int | float | str) and not isinstance(v, bool), "a decimal")
            try:
                return decimal.Decimal(str(v)).quantize(decimal.Decimal(1).scaleb(-scale))
            except decimal.InvalidOperation as e:
                raise _Bad(f"{where}: {v!r} is not a decimal") from e

        return dec
    if t == "boolean":

        def boolean(v: Any) -> Any:
            need(v, isinstance(v, bool), "boolean")
            return v

        return boolean
    if t in ("int", "long"):

        def integer(v: Any) -> Any:
            need(v, isinstance(v, int) and not isinstance(v, bool), t)
            return v

        return integer
    if t in ("float", "double"):

        def real(v: Any) -> Any:
            need(v, isinstance(v, int | float) and not isinstance(v, bool), t)
            return float(v)

        return real
    if t == "string":

        def string(v: Any) -> Any:
            need(v, isinstance(v, str), "string")
            return v

        return string
    if t in ("bytes", "fixed"):
        if t == "fixed":
            _define(schema, names, ns)

        def raw(v: Any) -> Any:
            # pulsar-client's JsonSchema writes bytes as their text
            need(v, isinstance(v, str), "bytes (as text)")
            return v.encode("utf-8")

        return raw
    if t == "enum":
        _define(schema, names, ns)

        def sym(v: Any) -> Any:
            # pulsar-client's JsonSchema writes an enum's Python value (a name or a number)
            need(v, isinstance(v, str | int) and not isinstance(v, bool), "an enum symbol")
            return str(v)

        return sym
    if t == "array":
        item = _json_conv(schema.get("items"), names, ns, f"{path}[]")

        def array(v: Any) -> Any:
            need(v, isinstance(v, list), "array")
            return [item(x) for x in v]

        return array
    if t == "map":
        val = _json_conv(schema.get("values"), names, ns, f"{path}{{}}")

        def mapping(v: Any) -> Any:
            need(v, isinstance(v, dict), "map (object)")
            return {str(k): val(x) for k, x in v.items()}

        return mapping
    if t in ("record", "error"):
        full, space = _define(schema, names, ns)
        plan = []
        for f in schema.get("fields", []):
            name = str(f["name"])
            sub = f"{path}.{name}" if path else name
            has_default = "default" in f
            default = f.get("default")
            plan.append((name, _json_conv(f["type"], names, space, sub), has_default, default))

        def record(v: Any) -> Any:
            need(v, isinstance(v, dict), f"record {full} (object)")
            out = {}
            for name, conv, has_default, default in plan:
                if name in v:
                    out[name] = conv(v[name])
                elif has_default and default is not None:
                    out[name] = conv(default)
                else:
                    out[name] = None
            return out

        return record
    raise SchemaMappingError(f"{where}: Avro type {t!r} has no Spark column type")


def _define(schema: dict[str, Any], names: dict[str, Any], ns: str) -> tuple[str, str]:
    full, space = _fullname(schema, ns)
    names.setdefault(full, schema)
    names.setdefault(str(schema.get("name", "")), schema)
    return full, space


def _rename_top(writer: Any, reader: Any) -> Any:
    """The writer's schema with its top-level record named as the reader's (pulsar-client reads
    a renamed record class field by field)."""
    if isinstance(writer, dict) and isinstance(reader, dict) and "name" in reader:
        w = dict(writer)
        w["name"] = reader["name"]
        if "namespace" in reader:
            w["namespace"] = reader["namespace"]
        else:
            w.pop("namespace", None)
        return w
    return writer


class ValueDecoder:
    """Decodes the values of a group of messages into Arrow arrays of the reader's types
    (executor side; one per task).

    Parameters
    ----------
    spec
        The reader's schema and mode.
    store
        Where the topics' schema registries are (writer versions are fetched once each).
    """

    def __init__(self, spec: ValueSpec, store: BlobStore) -> None:
        import fastavro

        self.spec = spec
        self.store = store
        self._fastavro = fastavro
        _, self.arrow_type = spec.value_type()
        self._reader_def = _strip_raw_logical(spec.parsed())
        self._reader = None
        if spec.type == "AVRO":
            self._reader = fastavro.parse_schema(json.loads(json.dumps(self._reader_def)))
        self._json = _json_conv(self._reader_def, {}, "", "") if spec.type == "JSON" else None
        self._writers: dict[tuple[str, int], Any] = {}
        self._registries: dict[str, SchemaRegistry] = {}

    def _writer(self, topic: TopicName, version: int) -> tuple[Any, Any]:
        """(writer, reader) for fastavro: the parsed Avro schema of ``version`` of ``topic``
        and the reader's schema, or (the reader's, None) when the message carries no version
        or its version is the reader's own schema (no resolution needed: faster)."""
        if version < 0:
            return self._reader, None
        key = (str(topic.base), version)
        hit = self._writers.get(key)
        if hit is None:
            reg = self._registries.get(key[0])
            if reg is None:
                reg = self._registries[key[0]] = SchemaRegistry(self.store, topic.base)
            stored = reg.get(version)
            if stored.type != "AVRO":
                raise IncompatibleSchema(
                    f"schema version {version} of {topic.base} is {stored.type}, not AVRO"
                )
            if stored.same_as(self.spec.type, self.spec.definition):
                hit = (self._reader, None)
            else:
                w = _rename_top(_strip_raw_logical(stored.parsed()), self._reader_def)
                hit = (self._fastavro.parse_schema(w), self._reader)
            self._writers[key] = hit
        return hit

    def decode(self, table: pa.Table, topic: TopicName) -> pa.Array:
        """One Arrow array of decoded values for the rows of ``table`` (a storage
        READ_SCHEMA table with ``value``, ``schema_version``, ``ledger_id``, ``entry_id`` and
        ``batch_index``); a null value (tombstone) decodes to null.

        Raises
        ------
        CorruptDataError
            For a value that does not decode (``onCorruptValue=fail``), naming the topic,
            ledger, entry and batch index.
        """
        col = table.column("value")
        values = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
        if self.spec.type == "BYTES":
            return values
        if self.spec.type == "STRING":
            try:
                return values.cast(pa.string())  # checks UTF-8
            except pa.ArrowInvalid:
                return self._decode_rows(values, table, topic, self._utf8)
        return self._decode_rows(values, table, topic, None)

    @staticmethod
    def _utf8(data: bytes, version: int, topic: TopicName) -> Any:
        return data.decode("utf-8")

    def _decode_rows(
        self,
        values: pa.Array,
        table: pa.Table,
        topic: TopicName,
        one: Callable[[bytes, int, TopicName], Any] | None,
    ) -> pa.Array:
        # null: written without a schema (decoded with the reader's own)
        versions = table.column("schema_version").fill_null(-1).to_numpy()
        payloads = values.to_pylist()
        out: list[Any] = [None] * len(payloads)
        decode = one or self._one
        for i, data in enumerate(payloads):
            if data is None:
                continue
            try:
                out[i] = decode(data, int(versions[i]), topic)
            except (_Bad, IncompatibleSchema, UnicodeDecodeError) as e:
                self._corrupt(table, topic, i, e)
        try:
            return to_arrow(out, self.arrow_type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
            # A decoded value Arrow cannot hold (an int above the field's range, say): find it.
            for i, v in enumerate(out):
                try:
                    pa.array([v], type=self.arrow_type)
                except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e2:
                    self._corrupt(table, topic, i, e2)
                    out[i] = None
            if self.spec.on_corrupt == "fail":
                raise CorruptDataError(f"{topic}: decoded values do not fit: {e}") from e
            return to_arrow(out, self.arrow_type)

    def _one(self, data: bytes, version: int, topic: TopicName) -> Any:
        if self._json is not None:
            try:
                d = json.loads(data)
            except ValueError as e:
                raise _Bad(f"value is not JSON: {e}") from e
            return self._json(d)
        from fastavro.read import SchemaResolutionError

        buf = io.BytesIO(data)
        try:
            v = self._fastavro.schemaless_reader(buf, *self._writer(topic, version))
        except SchemaResolutionError as e:
            raise IncompatibleSchema(f"schema version {version} does not resolve: {e}") from e
        except (EOFError, IndexError, ValueError, TypeError, KeyError, OverflowError) as e:
            raise _Bad(f"not Avro data of schema version {version}: {type(e).__name__}: {e}") from e
        if buf.tell() != len(data):
            raise _Bad(
                f"{len(data) - buf.tell()} bytes left after the Avro value of schema version "
                f"{version}"
            )
        return v

    def _corrupt(self, table: pa.Table, topic: TopicName, i: int, e: Exception) -> None:
        ledger = int(table.column("ledger_id")[i].as_py())
        entry = int(table.column("entry_id")[i].as_py())
        bidx = int(table.column("batch_index")[i].as_py())
        where = f"{topic}, ledger {ledger}, entry {entry}" + (
            f", batch index {bidx}" if bidx >= 0 else ""
        )
        if self.spec.on_corrupt == "null":
            return
        raise CorruptDataError(
            f"value of the message at {where} does not decode with the topic's "
            f"{self.spec.type} schema: {e}; set onCorruptValue=null to read it as null",
            topic=str(topic),
            ledger_id=ledger,
            entry_id=entry,
        ) from e


def to_arrow(values: list[Any], t: pa.DataType) -> pa.Array:
    """``values`` (Python values, None for null) as an Arrow array of type ``t``; a struct is
    built field by field (an order of magnitude faster than Arrow converting dicts)."""
    if not pa.types.is_struct(t):
        return pa.array(values, type=t)
    nulls = [v is None for v in values]
    has_null = any(nulls)
    children = []
    for f in t:
        name = f.name
        if has_null:
            col = [None if v is None else v.get(name) for v in values]
        else:
            try:
                col = list(map(operator.itemgetter(name), values))
            except KeyError:
                col = [v.get(name) for v in values]
        children.append(to_arrow(col, f.type))
    mask = pa.array(nulls, pa.bool_()) if has_null else None
    return pa.StructArray.from_arrays(children, fields=list(t), mask=mask)


def decode_columns(decoder: ValueDecoder, table: pa.Table, topic: TopicName) -> dict[str, pa.Array]:
    """The value columns (:meth:`ValueSpec.columns`) of ``table``'s rows."""
    arr = decoder.decode(table, topic)
    cols = decoder.spec.columns()
    if len(cols) == 1 and cols[0][0] == "value":
        return {"value": arr}
    # Flatten: a null struct (tombstone, nulled value) gives null fields.
    assert isinstance(arr, pa.StructArray)
    out = {}
    valid = arr.is_valid()
    for i, (name, _, _) in enumerate(cols):
        child = arr.field(i)
        if arr.null_count:
            child = pa.compute.if_else(valid, child, pa.scalar(None, child.type))
        out[name] = child
    return out


# ----------------------------------------------------------------------------- Spark -> Avro
def derive_avro(struct: StructType, name: str, path: str = "") -> dict[str, Any]:
    """The Avro record schema of rows of ``struct`` (a nullable field is ``["null", T]`` with
    default null; a nested struct is a record named after its field).

    Raises
    ------
    SchemaMappingError
        Naming the field whose Spark type has no Avro form here.
    """
    fields = []
    for f in struct.fields:
        sub = f"{path}.{f.name}" if path else f.name
        t = _avro_of(f.dataType, f.name, sub)
        if f.nullable:
            fields.append({"name": f.name, "type": ["null", t], "default": None})
        else:
            fields.append({"name": f.name, "type": t})
    return {"type": "record", "name": name, "fields": fields}


def _avro_of(t: DataType, name: str, path: str) -> Any:
    if isinstance(t, BooleanType):
        return "boolean"
    if isinstance(t, ByteType | ShortType | IntegerType):
        return "int"
    if isinstance(t, LongType):
        return "long"
    if isinstance(t, FloatType):
        return "float"
    if isinstance(t, DoubleType):
        return "double"
    if isinstance(t, StringType):
        return "string"
    if isinstance(t, BinaryType):
        return "bytes"
    if isinstance(t, DateType):
        return {"type": "int", "logicalType": "date"}
    if isinstance(t, TimestampType):
        return {"type": "long", "logicalType": "timestamp-micros"}
    if isinstance(t, TimestampNTZType):
        return {"type": "long", "logicalType": "local-timestamp-micros"}
    if isinstance(t, DecimalType):
        return {
            "type": "bytes",
            "logicalType": "decimal",
            "precision": t.precision,
            "scale": t.scale,
        }
    if isinstance(t, ArrayType):
        item = _avro_of(t.elementType, name, f"{path}[]")
        return {"type": "array", "items": ["null", item] if t.containsNull else item}
    if isinstance(t, MapType):
        if not isinstance(t.keyType, StringType):
            raise SchemaMappingError(
                f"field {path}: map keys are {t.keyType.simpleString()}; Avro maps have string keys"
            )
        val = _avro_of(t.valueType, name, f"{path}{{}}")
        return {"type": "map", "values": ["null", val] if t.valueContainsNull else val}
    if isinstance(t, StructType):
        rec = derive_avro(t, name, path)
        rec["namespace"] = (
            "spark." + ".".join(path.replace("[]", "").replace("{}", "").split(".")[:-1])
            if "." in path
            else "spark"
        )
        return rec
    raise SchemaMappingError(
        f"field {path}: Spark type {t.simpleString()} has no Avro form here (boolean, integer "
        "types, float, double, string, binary, date, timestamp, decimal, array, map, struct)"
    )


def _types_of(schema: Any) -> list[Any]:
    return list(schema) if isinstance(schema, list) else [schema]


def check_struct(struct: StructType, definition: Any, path: str = "") -> None:
    """Check that rows of ``struct`` can be written with the Avro record schema
    ``definition``: every struct field is a field of the record with a type the record's
    type takes, and every record field the struct lacks is nullable or has a default.

    Raises
    ------
    SchemaMappingError
        Naming the field, the struct's type and the schema's type.
    """
    _check(struct, definition, path, {}, "")


def _deref(schema: Any, names: dict[str, Any], ns: str) -> Any:
    if isinstance(schema, str) and schema not in _PRIMS and schema != "null":
        full = schema if "." in schema or not ns else f"{ns}.{schema}"
        return names.get(full, names.get(schema, schema))
    if isinstance(schema, dict):
        if isinstance(schema.get("type"), dict | list):
            return _deref(schema["type"], names, ns)
        if schema.get("type") in ("record", "enum", "fixed", "error"):
            _define(schema, names, ns)
    return schema


def _check(t: DataType, schema: Any, path: str, names: dict[str, Any], ns: str) -> None:
    where = path or "value"
    schema = _deref(schema, names, ns)
    branches = [_deref(b, names, ns) for b in _types_of(schema) if b != "null"]
    problems = []
    for b in branches:
        try:
            _check_one(t, b, path, names, ns)
            return
        except SchemaMappingError as e:
            problems.append(str(e))
    if len(problems) == 1:
        raise SchemaMappingError(problems[0])
    raise SchemaMappingError(
        f"field {where}: the struct has {t.simpleString()}, the topic's schema has {_show(schema)}"
    )


def _show(schema: Any) -> str:
    if isinstance(schema, dict):
        lt = schema.get("logicalType")
        base = schema.get("name") or schema.get("type")
        return f"{base} ({lt})" if lt else str(base)
    if isinstance(schema, list):
        return "[" + ", ".join(_show(s) for s in schema) + "]"
    return str(schema)


def _check_one(t: DataType, schema: Any, path: str, names: dict[str, Any], ns: str) -> None:
    where = path or "value"
    kind = schema.get("type") if isinstance(schema, dict) else schema
    logical = schema.get("logicalType") if isinstance(schema, dict) else None

    def bad() -> SchemaMappingError:
        return SchemaMappingError(
            f"field {where}: the struct has {t.simpleString()}, the topic's schema has "
            f"{_show(schema)}"
        )

    ok_prim = {
        "boolean": (BooleanType,),
        "int": (ByteType, ShortType, IntegerType),
        "long": (ByteType, ShortType, IntegerType, LongType),
        "float": (ByteType, ShortType, IntegerType, LongType, FloatType),
        "double": (ByteType, ShortType, IntegerType, LongType, FloatType, DoubleType),
        "string": (StringType,),
        "bytes": (BinaryType,),
        "fixed": (BinaryType,),
        "enum": (StringType,),
    }
    if logical == "date":
        if not isinstance(t, DateType):
            raise bad()
        return
    if logical in ("timestamp-millis", "timestamp-micros"):
        if not isinstance(t, TimestampType):
            raise bad()
        return
    if logical in ("local-timestamp-millis", "local-timestamp-micros"):
        if not isinstance(t, TimestampNTZType):
            raise bad()
        return
    if logical == "decimal":
        if not isinstance(t, DecimalType):
            raise bad()
        return
    if kind in ok_prim:
        if not isinstance(t, ok_prim[str(kind)]):
            raise bad()
        return
    if kind == "array":
        if not isinstance(t, ArrayType):
            raise bad()
        _check(t.elementType, schema["items"], f"{path}[]", names, ns)
        return
    if kind == "map":
        if not isinstance(t, MapType) or not isinstance(t.keyType, StringType):
            raise bad()
        _check(t.valueType, schema["values"], f"{path}{{}}", names, ns)
        return
    if kind in ("record", "error"):
        if not isinstance(t, StructType):
            raise bad()
        _, space = _define(schema, names, ns)
        rfields = {f["name"]: f for f in schema.get("fields", [])}
        for f in t.fields:
            sub = f"{path}.{f.name}" if path else f.name
            rf = rfields.get(f.name)
            if rf is None:
                raise SchemaMappingError(
                    f"field {sub}: the struct has it ({f.dataType.simpleString()}), the "
                    f"topic's schema record {schema.get('name')} has no such field (its "
                    f"fields: {', '.join(rfields)})"
                )
            _check(f.dataType, rf["type"], sub, names, space)
        given = set(t.fieldNames())
        for name, rf in rfields.items():
            if name in given or "default" in rf or "null" in _types_of(rf["type"]):
                continue
            sub = f"{path}.{name}" if path else name
            raise SchemaMappingError(
                f"field {sub}: the topic's schema requires it ({_show(rf['type'])}), the "
                "struct lacks it"
            )
        return
    raise bad()


class ValueEncoder:
    """Encodes struct rows (Python dicts from Arrow) with a topic's AVRO or JSON schema
    (executor side of the sink)."""

    def __init__(self, type_: str, definition: str) -> None:
        import fastavro

        self.type = type_
        self._fastavro = fastavro
        parsed = json.loads(definition)
        self._definition = parsed
        self._parsed: Any = (
            fastavro.parse_schema(json.loads(definition)) if type_ == "AVRO" else None
        )
        self._fill = _filler(parsed, {}, "")
        self._json = _to_json(parsed, {}, "") if type_ == "JSON" else None

    def encode(self, rows: list[Any]) -> list[bytes | None]:
        """Each row's encoded value (a null row stays null: a tombstone).

        Raises
        ------
        InvalidConfiguration
            Naming the field whose value the schema does not take.
        """
        out: list[bytes | None] = []
        for row in rows:
            if row is None:
                out.append(None)
                continue
            data = self._fill(row)
            if self._json is not None:
                out.append(json.dumps(self._json(data), separators=(",", ":")).encode("utf-8"))
                continue
            buf = io.BytesIO()
            try:
                self._fastavro.schemaless_writer(buf, self._parsed, data)
            except (ValueError, TypeError, KeyError, OverflowError) as e:
                raise InvalidConfiguration(
                    f"filepulsar sink: a row's value does not fit the topic's Avro schema: {e}"
                ) from e
            out.append(buf.getvalue())
        return out


def _filler(schema: Any, names: dict[str, Any], ns: str) -> Callable[[Any], Any]:
    """Arrow's Python values -> what fastavro writes: maps (lists of pairs) become dicts,
    record fields the struct lacks get their default (or null)."""
    schema = _deref(schema, names, ns)
    if isinstance(schema, list):
        subs = [_filler(b, names, ns) for b in schema if b != "null"]
        sub = subs[0] if len(subs) == 1 else (lambda v: v)
        return lambda v: None if v is None else sub(v)
    kind = schema.get("type") if isinstance(schema, dict) else schema
    if kind == "map":
        val = _filler(schema["values"], names, ns)
        return lambda v: (
            None if v is None else {k: val(x) for k, x in (v.items() if isinstance(v, dict) else v)}
        )
    if kind == "array":
        item = _filler(schema["items"], names, ns)
        return lambda v: None if v is None else [item(x) for x in v]
    if kind in ("record", "error"):
        _, space = _define(schema, names, ns)
        plan = [
            (f["name"], _filler(f["type"], names, space), f.get("default"))
            for f in schema.get("fields", [])
        ]

        def record(v: Any) -> Any:
            if v is None:
                return None
            return {n: (conv(v[n]) if n in v else default) for n, conv, default in plan}

        return record
    return lambda v: v


def _to_json(schema: Any, names: dict[str, Any], ns: str) -> Callable[[Any], Any]:
    """Avro-ready Python values -> JSON values as pulsar-client's JsonSchema writes them
    (bytes as their text, dates as days, timestamps as the schema's unit, decimals as text)."""
    schema = _deref(schema, names, ns)
    if isinstance(schema, list):
        subs = [_to_json(b, names, ns) for b in schema if b != "null"]
        sub = subs[0] if len(subs) == 1 else (lambda v: v)
        return lambda v: None if v is None else sub(v)
    kind = schema.get("type") if isinstance(schema, dict) else schema
    logical = schema.get("logicalType") if isinstance(schema, dict) else None
    if logical == "date":
        return lambda v: None if v is None else (v - dt.date(1970, 1, 1)).days
    if logical in (
        "timestamp-millis",
        "timestamp-micros",
        "local-timestamp-millis",
        "local-timestamp-micros",
    ):
        div = 1000 if logical.endswith("millis") else 1

        def ts(v: Any) -> Any:
            if v is None:
                return None
            epoch = dt.datetime(1970, 1, 1, tzinfo=v.tzinfo and dt.UTC)
            return ((v - epoch) // dt.timedelta(microseconds=1)) // div

        return ts
    if logical == "decimal":
        return lambda v: None if v is None else str(v)
    if kind in ("bytes", "fixed"):

        def text(v: Any) -> Any:
            if v is None:
                return None
            try:
                return bytes(v).decode("utf-8")
            except UnicodeDecodeError as e:
                raise InvalidConfiguration(
                    "filepulsar sink: a binary field is not UTF-8 text, which a JSON schema "
                    "value needs (pulsar-client writes bytes as text); use an AVRO schema"
                ) from e

        return text
    if kind == "map":
        val = _to_json(schema["values"], names, ns)
        return lambda v: None if v is None else {k: val(x) for k, x in v.items()}
    if kind == "array":
        item = _to_json(schema["items"], names, ns)
        return lambda v: None if v is None else [item(x) for x in v]
    if kind in ("record", "error"):
        _, space = _define(schema, names, ns)
        plan = [(f["name"], _to_json(f["type"], names, space)) for f in schema.get("fields", [])]
        return lambda v: None if v is None else {n: conv(v.get(n)) for n, conv in plan}
    return lambda v: v


@dataclass(frozen=True)
class SinkValueSchema:
    """The schema a typed sink writes values with (picklable): its type, definition, the
    version it has in the topic, and how the input holds the record (``struct``: the ``value``
    column; ``flatten``: the listed columns)."""

    type: str
    definition: str
    version: int
    mode: str
    fields: tuple[str, ...] = field(default_factory=tuple)

    def encoder(self) -> ValueEncoder:
        return ValueEncoder(self.type, self.definition)
